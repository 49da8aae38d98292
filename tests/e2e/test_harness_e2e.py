"""The end-to-end harness itself: chart rewiring, and the hooks for the extender and controller.

Real: `helm template` of the chart, the
`kubeon-gpu extender` and `kubeon-gpu controller` processes when their
packages exist (the fixtures skip with the reason otherwise), the test
cluster and its scheduler stand-in calling the extender over HTTP.
Faked: nothing beyond the test cluster's own stand-ins.
"""

from __future__ import annotations

import base64

import requests

from tests.e2e.conftest import (
    RELEASE_NAMESPACE,
    Process,
    render_chart,
    scheduler_extender_config,
    webhook_configurations,
)
from tests.kubeapi.cluster import Cluster
from tests.cluster.objects import make_pod


def test_chart_webhooks_are_pointed_at_the_local_url_with_the_ca() -> None:
    configs = webhook_configurations(render_chart("certificates.mode=external"), "https://127.0.0.1:9", b"PEM")
    hooks = [hook for config in configs for hook in config["webhooks"]]
    assert {h["clientConfig"]["url"] for h in hooks} == {"https://127.0.0.1:9/mutate", "https://127.0.0.1:9/validate"}
    assert all("service" not in h["clientConfig"] for h in hooks)
    assert all(base64.b64decode(h["clientConfig"]["caBundle"]) == b"PEM" for h in hooks)
    assert all(h["failurePolicy"] == "Fail" for h in hooks)


def test_chart_scheduler_config_becomes_the_stand_in_extender_config() -> None:
    config = scheduler_extender_config(render_chart("certificates.mode=external"), "http://127.0.0.1:9")
    assert config.url_prefix == "http://127.0.0.1:9"
    assert config.node_cache_capable
    assert config.managed_resources == ()  # the extender is asked about every pod the profile schedules
    assert config.weight >= 1


def test_scheduler_stand_in_places_gpu_pods_through_the_real_extender(e2e_cluster: Cluster,
                                                                       extender: Process) -> None:
    e2e_cluster.use_extenders([extender.config])
    e2e_cluster.ensure_namespace("e2e-extender")
    e2e_cluster.create(make_pod("placed", "e2e-extender", gpus=1))
    [pod] = e2e_cluster.wait_for(lambda: e2e_cluster.pods("e2e-extender", bound=True), timeout=20,
                                 message="pod bound through the extender")
    assert pod["spec"]["nodeName"] == "a100-whole-0"
    assert any(verb == "filter" for verb, _ in e2e_cluster.scheduler.extenders[0].calls)


def test_controller_runs_against_the_cluster(e2e_cluster: Cluster, controller: Process) -> None:
    """It takes the Lease as the identity it was given and says so on /metrics."""
    from kubernetes import client

    def holder() -> str | None:
        try:
            lease = client.CoordinationV1Api(e2e_cluster.api_client).read_namespaced_lease("kubeon-gpu-optimizer",
                                                                                    RELEASE_NAMESPACE)
        except client.ApiException:
            return None
        return lease.spec.holder_identity if lease.spec else None

    e2e_cluster.wait_for(lambda: holder() == "e2e", timeout=30, message="the controller holding its Lease")
    e2e_cluster.wait_for(lambda: "kubeon_gpu_leader 1.0" in requests.get(f"{controller.url}/metrics", timeout=5).text,
                         timeout=30, message="kubeon_gpu_leader 1.0 on /metrics")
    assert controller.popen.poll() is None, controller.log_tail()
