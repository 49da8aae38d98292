"""A revoked cluster token stops everything, the policies created in the cluster as well as the hub's.

The hub's rule (docs/hub-api.md, controller/hubsync.py): once the hub answers 401/403 the controller
labels its policies hub=Disconnected, and one policy so labelled cuts the whole cluster off
(`gpupolicy.cluster.hub_cut_off`): the webhook admits pods unchanged, the extender stays neutral, every
policy's status says Recommend, and every writer of the controller is paused (`ctx.is_leader()` is false
while the lease is still held) until a working token is read. A policy someone created directly in the
cluster is not the hub's and is never labelled, so only that rule keeps it from acting.

Real: the hub process (`kubeon-gpu hub serve`) and its database, the controller frame
(`controller.command.build` with HubSync, PolicySync, ScaleToZeroReconciler and leader election), the
webhook's watched view and Flask app, the extender's cluster watch, service and Flask app, the test API
server. Faked: the clock the reconcilers read (the hub keeps the real one) and the GPU metrics (every
workload reads idle, no wake demand), so a scale to zero is always due.
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
from tests.controller.conftest import FakeClock, make_deployment
from tests.extender.payloads import wire_pod
from tests.hub.conftest import HubProcess, start_hub
from tests.hub.test_optimizer_sync import PARK, SHARE, _controller, _metric, _policies, _poll, _put, _replicas, _token
from tests.loopback import wait_for
from tests.webhook.payloads import api_pod, review

GPU_NODES = ["a100-0", "a100-1", "t4-0"]
LOCAL_SHARE = {"mode": "Automatic", "selector": {"namespaces": ["research"]}, "sharing": {"strategy": "TimeSlicing"}}
LOCAL_PARK = {**PARK, "scaleToZero": {**PARK["scaleToZero"], "namespaces": ["batch"]}}


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[HubProcess]:
    process = start_hub(f"sqlite:///{tmp_path}/hub.db")
    yield process
    process.stop()


@pytest.fixture
def api() -> Iterator[client.ApiClient]:
    from tests.kubeapi import ApiServer
    from tests.cluster.objects import make_node

    crd = Path(__file__).resolve().parents[2] / "manifests" / "crd" / "gpupolicies.gpu.kubeon.io.yaml"
    server = ApiServer.start(crd_files=[str(crd)])
    api = server.api_client()
    core = client.CoreV1Api(api)
    for ns in ("kubeon-gpu", "inference", "research", "batch"):
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    core.create_node(make_node("a100-0", "NVIDIA-A100-SXM4-80GB", 8))
    core.create_node(make_node("a100-1", "NVIDIA-A100-SXM4-80GB", 8))
    # time-sliced shares: the webhook rewrites a pod only to a slice some node offers
    core.create_node(make_node("t4-0", "Tesla-T4", 2, shared_replicas=4))
    yield api
    server.stop()


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
def replica(hub: HubProcess, api: client.ApiClient, tmp_path: Path) -> Iterator[Replica]:
    from controller.hubsync import HubSync

    token_file = tmp_path / "token"
    token_file.write_text(_token(hub, "create"))
    clock = FakeClock(time.time())
    process = _controller(api, hub, token_file, clock)
    yield Replica(process, clock, token_file)
    process.stop()
    for reconciler in process.runner.reconcilers:  # its keep-alive connection, else the hub's stop waits it out
        if isinstance(reconciler, HubSync):
            reconciler.client.session.close()


def test_a_revoked_token_stops_the_policies_created_in_the_cluster_too(hub: HubProcess, api: client.ApiClient,
                                                                       replica: Replica) -> None:
    """Only the hub's policies are labelled Disconnected; the rule that one such label cuts everything off
    is what keeps a policy created in the cluster (a sharing one, a scale to zero) from going on acting
    after the hub refused the cluster."""
    from extender.app import create_app as extender_app
    from extender.cache import ClusterCache
    from extender.service import ExtenderService
    from extender.watch import ClusterWatch
    from kube.views import WatchedView
    from webhook.app import create_app as webhook_app

    _put(hub, "share-inference", SHARE)
    _local_policy(api, "share-research", LOCAL_SHARE)
    _local_policy(api, "park-batch", LOCAL_PARK)
    replica.process.runner.run_all()
    assert _hub_states(api) == {"share-inference": "Connected", "share-research": None, "park-batch": None}

    view = WatchedView(api, default_mode=Mode.RECOMMEND, own_namespace="kubeon-gpu", with_nodes=True,
                       metrics_configured=True).start()  # the webhook run with --prometheus-url
    watch = ClusterWatch(api, ClusterCache(), watch_timeout=2).start(freeze_after_sync=False)
    try:
        webhook = webhook_app(view).test_client()
        extender = extender_app(ExtenderService(watch.cache, watch)).test_client()
        pod = wire_pod("p", "research", gpus=1)

        def rewritten(namespace: str) -> bool:
            answer = webhook.post("/mutate", json=review(api_pod(), namespace=namespace)).get_json()["response"]
            assert answer["allowed"] is True
            return "patch" in answer

        def scores() -> dict[str, int]:
            answer = extender.post("/prioritize", json={"Pod": pod, "Nodes": None, "NodeNames": GPU_NODES})
            assert answer.status_code == 200
            return {entry["Host"]: entry["Score"] for entry in answer.get_json()}

        def seen_disconnected(objects: dict[Any, dict[str, Any]]) -> bool:
            return any((o["metadata"].get("labels") or {}).get("gpu.kubeon.io/hub") == "Disconnected"
                       for o in objects.values())

        wait_for(lambda: rewritten("research") and rewritten("inference"),
                 what="the webhook to rewrite pods under the local and the hub's sharing policy")
        wait_for(lambda: watch.ready() and max(scores().values()) > 0, what="the extender to score the GPU nodes")

        assert hub.cli("token", "revoke", "--cluster", "prod").returncode == 0
        client.AppsV1Api(api).create_namespaced_deployment("batch", make_deployment("trainer", "batch", replicas=2))
        replica.poll(120)  # the local scale to zero of `trainer` is due now
        assert _metric(replica.process, "kubeon_gpu_hub_connected") == 0
        # the hub's policy says it is cut off; the ones created in the cluster carry no hub label
        assert _hub_states(api) == {"share-inference": "Disconnected", "share-research": None, "park-batch": None}

        # once the watches have seen the label, nothing acts, on any policy
        wait_for(lambda: seen_disconnected(view.policies.snapshot()), what="the webhook's watch to see the label")
        wait_for(lambda: seen_disconnected(watch.policies.snapshot()), what="the extender's watch to see the label")
        assert not rewritten("inference")
        assert not rewritten("research"), "a policy created in the cluster still rewrote pods after revocation"
        assert set(scores().values()) == {0}, "the extender kept an opinion after revocation"
        passed = extender.post("/filter", json={"Pod": pod, "Nodes": None, "NodeNames": GPU_NODES}).get_json()
        assert passed["NodeNames"] == GPU_NODES and not passed["FailedNodes"]

        # every policy's status, the local ones' too, says what runs: Recommend, degraded by the hub
        for name, obj in _policies(api).items():
            assert obj["status"]["effectiveMode"] == "Recommend", name
            assert obj["status"]["requestedMode"] == "Automatic", name
            degraded = next(c for c in obj["status"]["conditions"] if c["type"] == "Degraded")
            assert (degraded["status"], degraded["reason"]) == ("True", "HubDisconnected"), name
        replica.poll()
        replica.poll()
        assert _replicas_in(api, "batch", "trainer") == 2, "a revoked cluster scaled a workload to zero"
    finally:
        watch.stop()
        view.stop()


def test_a_refused_token_pauses_the_writers_while_the_lease_is_still_held(hub: HubProcess, api: client.ApiClient,
                                                                          replica: Replica) -> None:
    """A 401 pauses every writer of the replica that holds the lease: `ctx.is_leader()`, which each writer
    checks right before each write, is false until a poll succeeds again. A scale to zero that is due does
    not happen, whatever mode its policy asks for; once reconnected it does."""
    _put(hub, "idle-research", PARK)
    replica.process.runner.run_all()
    assert _hub_states(api) == {"idle-research": "Connected"}
    assert replica.process.ctx.is_leader() is True

    assert hub.cli("token", "revoke", "--cluster", "prod").returncode == 0
    client.AppsV1Api(api).create_namespaced_deployment("research", make_deployment("trainer", "research", replicas=2))
    for _ in range(3):
        replica.poll(120)  # the scale to zero of `trainer` is due from the first of these
    assert _metric(replica.process, "kubeon_gpu_hub_polls_total", result="unauthorized") >= 1
    assert _replicas(api, "trainer") == 2, "a workload was scaled to zero after the hub refused the token"
    assert replica.process.elector.is_leader() is True, "the replica still holds the lease"
    assert replica.process.ctx.is_leader() is False, "the writers must be paused while the hub refuses the token"
    proposals = _policies(api)["idle-research"]["status"].get("proposals") or []
    assert not [p for p in proposals if p["state"] == "Applied"]

    replica.reconnect(hub)
    assert replica.process.ctx.is_leader() is True
    replica.poll()
    assert _replicas(api, "trainer") == 0  # it was due all along: only the refused token held it back


def _replicas_in(api: client.ApiClient, namespace: str, name: str) -> int:
    return int(client.AppsV1Api(api).read_namespaced_deployment(name, namespace).spec.replicas)
