"""The webhook down, or not trusted, under the chart's failurePolicy: what kube-apiserver does then.

docs/install.md and docs/designs/install.md promise: `webhook.failurePolicy: Ignore` (the default)
"a broken optimizer must never stop the cluster creating pods": they are admitted unchanged, also
"until the caBundle is patched"; `Fail` refuses them instead. The namespaceSelector leaves
kube-system and the release namespace out, so the webhook's own pods can always come back.

Real: kube-apiserver v1.35 calling the chart's webhook configurations (rendered with the value
under test) at a port where the webhook process has been stopped (connection refused), or at a
live webhook whose certificate it cannot verify; the pods it admits are what it stores.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster.cluster import Cluster
from tests.cluster.kubeon import apply_objects, render_chart, webhook_configurations
from tests.cluster.objects import make_pod
from tests.e2e.conftest import RELEASE_NAMESPACE, group_nodes, in_group, wait_for_policy

SETS = ("prometheus.url=http://127.0.0.1:9",)
CLUSTER = {"kubeon": True, "kubeon_components": ("webhook",), "kubeon_sets": SETS}
MIG_RESOURCE = "nvidia.com/mig-1g.10gb"


def share_policy(name: str, namespace: str) -> dict[str, Any]:
    return {"apiVersion": "gpu.kubeon.io/v1alpha1", "kind": "GpuPolicy", "metadata": {"name": name},
            "spec": {"mode": "Automatic", "selector": {"namespaces": [namespace]},
                     "sharing": {"strategy": "MIG", "migProfile": "1g.10gb",
                                 "gpuModels": ["NVIDIA-A100-SXM4-80GB"]}}}


def user_pod(name: str, namespace: str, **kwargs: Any) -> dict[str, Any]:
    return make_pod(name, namespace, scheduler_name=None, node_selector=in_group(namespace), **kwargs)


def limits(pod: dict[str, Any]) -> dict[str, str]:
    return dict(pod["spec"]["containers"][0]["resources"].get("limits") or {})


def create(cluster: Cluster, obj: dict[str, Any], check: bool = True) -> Any:
    return cluster.kubectl("create", "-f", "-", input=json.dumps(obj), check=check, timeout=90)


def stored_pod(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    return dict(json.loads(cluster.kubectl("get", "pod", "-n", namespace, name, "-o", "json").stdout))


def apply_chart_webhooks(cluster: Cluster, *sets: str, ca_bundle: bool = True) -> None:
    """The webhook configurations as `helm upgrade --set <sets>` renders them, at the webhook's URL."""
    assert cluster.kubeon is not None
    ca = (cluster.kubeon.tls / "ca.crt").read_bytes()
    configurations = webhook_configurations(render_chart("certificates.mode=external", *SETS, *sets),
                                            cluster.kubeon.webhook_url, ca)
    if not ca_bundle:
        for config in configurations:
            for hook in config["webhooks"]:
                del hook["clientConfig"]["caBundle"]
    apply_objects(cluster.api_client, configurations)
    if not ca_bundle:  # server-side apply keeps a field only another manager owns: none does here
        stored = cluster.kubectl("get", "mutatingwebhookconfiguration", "kubeon-gpu-optimizer", "-o", "json").stdout
        assert all("caBundle" not in h["clientConfig"] for h in json.loads(stored)["webhooks"])


@pytest.fixture
def sharing(kube_cluster: Cluster, namespace: str) -> Iterator[str]:
    """This test's nodes and an Automatic MIG policy the running webhook has seen; afterwards the
    webhook runs again behind the chart's own configurations (failurePolicy Ignore, caBundle set)."""
    group_nodes(kube_cluster, namespace)
    create(kube_cluster, share_policy(f"{namespace}-share", namespace))
    wait_for_policy(kube_cluster, f"{namespace}-share", user_pod("probe", namespace, gpus=1))
    yield namespace
    assert kube_cluster.kubeon is not None
    if not kube_cluster.plane.children.get("webhook").alive():
        kube_cluster.kubeon.start_webhook(kube_cluster.api_client)
    apply_chart_webhooks(kube_cluster)


def stop_webhook(cluster: Cluster) -> None:
    assert cluster.kubeon is not None
    cluster.kubeon.stop_component("webhook")


def test_ignore_admits_gpu_pods_unchanged_while_the_webhook_is_down(kube_cluster: Cluster, sharing: str) -> None:
    c, namespace = kube_cluster, sharing
    create(c, user_pod("before", namespace, gpus=1))
    assert limits(stored_pod(c, namespace, "before")) == {MIG_RESOURCE: "1"}, "the control: rewritten while up"

    stop_webhook(c)
    create(c, user_pod("during", namespace, gpus=1))
    during = stored_pod(c, namespace, "during")
    assert limits(during) == {"nvidia.com/gpu": "1"}, "admitted unchanged"
    assert "gpu.kubeon.io/policy" not in (during["metadata"].get("annotations") or {})
    node = c.wait_for(lambda: c.core.read_namespaced_pod("during", namespace).spec.node_name, timeout=60,
                      message="the unchanged pod scheduled")
    assert node == f"{namespace}-whole", "it runs on a whole GPU, as it asked"


def test_fail_refuses_pods_while_the_webhook_is_down_but_not_in_its_own_namespace(
        kube_cluster: Cluster, sharing: str) -> None:
    c, namespace = kube_cluster, sharing
    apply_chart_webhooks(c, "webhook.failurePolicy=Fail")
    create(c, user_pod("before", namespace, gpus=1))
    assert limits(stored_pod(c, namespace, "before")) == {MIG_RESOURCE: "1"}, "the control: rewritten while up"

    stop_webhook(c)
    refused = create(c, user_pod("during", namespace, gpus=1), check=False)
    assert refused.returncode != 0
    assert 'failed calling webhook "pods.mutate.gpu.kubeon.io"' in refused.stderr, refused.stderr
    assert c.kubectl("get", "pod", "-n", namespace, "during", check=False).returncode != 0, "nothing stored"
    cpu = create(c, user_pod("cpu-only", namespace), check=False)
    assert cpu.returncode != 0, "Fail refuses every pod the webhook would have seen, GPU or not"
    policy = create(c, share_policy(f"{namespace}-later", namespace), check=False)
    assert policy.returncode != 0 and "gpupolicies.mutate.gpu.kubeon.io" in policy.stderr, policy.stderr

    # the release namespace is outside the namespaceSelector: the webhook's own pods still come back
    own = make_pod(f"webhook-{namespace}"[:63], RELEASE_NAMESPACE, scheduler_name=None)
    create(c, own)
    c.kubectl("delete", "pod", "-n", RELEASE_NAMESPACE, own["metadata"]["name"], "--wait=false")


def test_ignore_admits_pods_unchanged_until_the_ca_bundle_is_patched(kube_cluster: Cluster, sharing: str) -> None:
    """The webhook is up but kube-apiserver cannot verify its certificate (no caBundle, as the
    rendered manifests are before `kubeon-gpu certs patch-cabundle`)."""
    c, namespace = kube_cluster, sharing
    apply_chart_webhooks(c, ca_bundle=False)
    create(c, user_pod("unpatched", namespace, gpus=1))
    assert limits(stored_pod(c, namespace, "unpatched")) == {"nvidia.com/gpu": "1"}, "admitted unchanged"

    apply_chart_webhooks(c)  # what patch-cabundle does: the CA in every webhook
    create(c, user_pod("patched", namespace, gpus=1))
    assert limits(stored_pod(c, namespace, "patched")) == {MIG_RESOURCE: "1"}
