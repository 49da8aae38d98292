"""A revoked cluster token stops everything, the policies created in the cluster as well as the hub's.

The hub's rule (docs/hub-api.md, controller/hubsync.py): once the hub answers 401/403 the controller
labels its policies hub=Disconnected, and one policy so labelled cuts the whole cluster off
(`gpupolicy.cluster.hub_cut_off`): the webhook admits pods unchanged, the extender stays neutral, every
policy's status says Recommend, and every writer of the controller is paused (`ctx.is_leader()` is false
while the lease is still held) until a working token is read. A policy someone created directly in the
cluster is not the hub's and is never labelled, so only that rule keeps it from acting.

Real: the hub process (`kubeon-gpu hub serve`) and its database, the controller frame
(`controller.command.build` with HubSync, PolicySync, ScaleToZeroReconciler and leader election), the
webhook's watched view and Flask app, the extender's cluster watch, service and Flask app, each as its
chart ServiceAccount, and the real control plane (tests/cluster: kube-apiserver with the GpuPolicy CRD,
kube-controller-manager running the Deployments, KWOK nodes). Faked: the clock the reconcilers read (the
hub keeps the real one) and the GPU metrics (every workload reads idle, no wake demand), so a scale to
zero is always due.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from controller.command import ControllerProcess
from gpupolicy.model import GROUP, PLURAL, VERSION, Mode
from tests.cluster.cluster import Cluster
from tests.cluster.objects import make_node
from tests.controller.conftest import FakeClock, make_deployment
from tests.extender.payloads import wire_pod
from tests.hub.conftest import HubProcess, start_hub
from tests.hub.test_optimizer_sync import (
    Site,
    _controller,
    _metric,
    _policies,
    _poll,
    _put,
    _replicas,
    _token,
    park,
    share,
    site,  # noqa: F401 - the fixture behind `site`
)
from tests.loopback import wait_for
from tests.webhook.payloads import api_pod, review

# the chart's CRDs, ServiceAccounts and RBAC; the optimizer's parts run in the test
CLUSTER = {"kubeon": True, "kubeon_components": ()}


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[HubProcess]:
    process = start_hub(f"sqlite:///{tmp_path}/hub.db")
    yield process
    process.stop()


@pytest.fixture
def nodes(kube_cluster: Cluster, site: Site) -> Iterator[list[str]]:  # noqa: F811
    """The GPU nodes the extender scores: two A100 nodes besides the site's time-sliced T4."""
    names = [f"{site.inference}-a100-{i}" for i in range(2)]
    for name in names:
        kube_cluster.create_node(make_node(name, "NVIDIA-A100-SXM4-80GB", 8))
    yield [*names, site.node]
    for name in names:
        kube_cluster.core.delete_node(name)


def _local_policy(api: client.ApiClient, name: str, spec: dict[str, Any]) -> None:
    """A GpuPolicy created directly in the cluster (kubectl apply), not through the hub."""
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "GpuPolicy", "metadata": {"name": name}, "spec": spec}
    client.CustomObjectsApi(api).create_cluster_custom_object(GROUP, VERSION, PLURAL, body)


def _hub_states(api: client.ApiClient) -> dict[str, str | None]:
    return {n: (o["metadata"].get("labels") or {}).get("gpu.kubeon.io/hub") for n, o in _policies(api).items()}


@dataclass
class Replica:
    """The controller replica under test: it holds the lease; its token file is the mounted Secret's."""

    process: ControllerProcess
    clock: FakeClock
    token_file: Path

    def poll(self, seconds: float = 70) -> None:
        _poll(self.process, self.clock, seconds)

    def reconnect(self, hub: HubProcess) -> None:
        """A new token in the Secret: the next poll succeeds and the writers resume."""
        self.token_file.write_text(_token(hub, "create"))
        os.utime(self.token_file, ns=(time.time_ns() + 10**9, time.time_ns() + 10**9))
        self.poll()
        assert _metric(self.process, "kubeon_gpu_hub_connected") == 1


@pytest.fixture
def replica(hub: HubProcess, site: Site, tmp_path: Path) -> Iterator[Replica]:  # noqa: F811
    from controller.hubsync import HubSync

    token_file = tmp_path / "token"
    token_file.write_text(_token(hub, "create"))
    clock = FakeClock(time.time())
    process = _controller(site.controller, site.admin, hub, token_file, clock)
    yield Replica(process, clock, token_file)
    process.stop()
    for reconciler in process.runner.reconcilers:  # its keep-alive connection, else the hub's stop waits it out
        if isinstance(reconciler, HubSync):
            reconciler.client.session.close()


def test_a_revoked_token_stops_the_policies_created_in_the_cluster_too(hub: HubProcess, site: Site,  # noqa: F811
                                                                       nodes: list[str], replica: Replica) -> None:
    """Only the hub's policies are labelled Disconnected; the rule that one such label cuts everything off
    is what keeps a policy created in the cluster (a sharing one, a scale to zero) from going on acting
    after the hub refused the cluster."""
    from extender.app import create_app as extender_app
    from extender.cache import ClusterCache
    from extender.service import ExtenderService
    from extender.watch import ClusterWatch
    from kube.views import WatchedView
    from webhook.app import create_app as webhook_app

    api = site.admin
    _put(hub, "share-inference", share(site.inference))
    _local_policy(api, "share-research", share(site.research))
    _local_policy(api, "park-batch", park(site.batch))
    replica.process.runner.run_all()
    assert _hub_states(api) == {"share-inference": "Connected", "share-research": None, "park-batch": None}

    view = WatchedView(site.webhook, default_mode=Mode.RECOMMEND, own_namespace="kubeon-gpu", with_nodes=True,
                       metrics_configured=True).start()  # the webhook run with --prometheus-url
    watch = ClusterWatch(site.extender, ClusterCache(), watch_timeout=2).start(freeze_after_sync=False)
    try:
        webhook = webhook_app(view).test_client()
        extender = extender_app(ExtenderService(watch.cache, watch)).test_client()
        pod = wire_pod("p", site.research, gpus=1)

        def rewritten(namespace: str) -> bool:
            answer = webhook.post("/mutate", json=review(api_pod(), namespace=namespace)).get_json()["response"]
            assert answer["allowed"] is True
            return "patch" in answer

        def scores() -> dict[str, int]:
            answer = extender.post("/prioritize", json={"Pod": pod, "Nodes": None, "NodeNames": nodes})
            assert answer.status_code == 200
            return {entry["Host"]: entry["Score"] for entry in answer.get_json()}

        def seen_disconnected(objects: dict[Any, dict[str, Any]]) -> bool:
            return any((o["metadata"].get("labels") or {}).get("gpu.kubeon.io/hub") == "Disconnected"
                       for o in objects.values())

        wait_for(lambda: rewritten(site.research) and rewritten(site.inference),
                 what="the webhook to rewrite pods under the local and the hub's sharing policy")
        wait_for(lambda: watch.ready() and max(scores().values()) > 0, what="the extender to score the GPU nodes")

        assert hub.cli("token", "revoke", "--cluster", "prod").returncode == 0
        client.AppsV1Api(api).create_namespaced_deployment(site.batch,
                                                           make_deployment("trainer", site.batch, replicas=2))
        replica.poll(120)  # the local scale to zero of `trainer` is due now
        assert _metric(replica.process, "kubeon_gpu_hub_connected") == 0
        # the hub's policy says it is cut off; the ones created in the cluster carry no hub label
        assert _hub_states(api) == {"share-inference": "Disconnected", "share-research": None, "park-batch": None}

        # once the watches have seen the label, nothing acts, on any policy
        wait_for(lambda: seen_disconnected(view.policies.snapshot()), what="the webhook's watch to see the label")
        wait_for(lambda: seen_disconnected(watch.policies.snapshot()), what="the extender's watch to see the label")
        assert not rewritten(site.inference)
        assert not rewritten(site.research), "a policy created in the cluster still rewrote pods after revocation"
        assert set(scores().values()) == {0}, "the extender kept an opinion after revocation"
        passed = extender.post("/filter", json={"Pod": pod, "Nodes": None, "NodeNames": nodes}).get_json()
        assert passed["NodeNames"] == nodes and not passed["FailedNodes"]

        # every policy's status, the local ones' too, says what runs: Recommend, degraded by the hub
        for name, obj in _policies(api).items():
            assert obj["status"]["effectiveMode"] == "Recommend", name
            assert obj["status"]["requestedMode"] == "Automatic", name
            degraded = next(c for c in obj["status"]["conditions"] if c["type"] == "Degraded")
            assert (degraded["status"], degraded["reason"]) == ("True", "HubDisconnected"), name
        replica.poll()
        replica.poll()
        assert _replicas(api, site.batch, "trainer") == 2, "a revoked cluster scaled a workload to zero"
    finally:
        watch.stop()
        view.stop()


def test_a_refused_token_pauses_the_writers_while_the_lease_is_still_held(hub: HubProcess,
                                                                          site: Site,  # noqa: F811
                                                                          replica: Replica) -> None:
    """A 401 pauses every writer of the replica that holds the lease: `ctx.is_leader()`, which each writer
    checks right before each write, is false until a poll succeeds again. A scale to zero that is due does
    not happen, whatever mode its policy asks for; once reconnected it does."""
    api = site.admin
    _put(hub, "idle-research", park(site.research))
    replica.process.runner.run_all()
    assert _hub_states(api) == {"idle-research": "Connected"}
    assert replica.process.ctx.is_leader() is True

    assert hub.cli("token", "revoke", "--cluster", "prod").returncode == 0
    client.AppsV1Api(api).create_namespaced_deployment(site.research,
                                                       make_deployment("trainer", site.research, replicas=2))
    for _ in range(3):
        replica.poll(120)  # the scale to zero of `trainer` is due from the first of these
    assert _metric(replica.process, "kubeon_gpu_hub_polls_total", result="unauthorized") >= 1
    assert _replicas(api, site.research, "trainer") == 2, "a workload was scaled to zero after the token was refused"
    assert replica.process.elector.is_leader() is True, "the replica still holds the lease"
    assert replica.process.ctx.is_leader() is False, "the writers must be paused while the hub refuses the token"
    proposals = _policies(api)["idle-research"]["status"].get("proposals") or []
    assert not [p for p in proposals if p["state"] == "Applied"]

    replica.reconnect(hub)
    assert replica.process.ctx.is_leader() is True
    replica.poll()
    assert _replicas(api, site.research, "trainer") == 0  # it was due all along: only the refused token held it back

