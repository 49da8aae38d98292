"""The optimizer against a real hub (`kubeon-gpu hub serve`, over HTTP and HTTPS) and the real control plane.

Real: the hub process and its database, the controller frame (`controller.command.build` with its
HubSync, PolicySync, ScaleToZeroReconciler, leader election) authenticated as the chart's controller
ServiceAccount, the webhook's watched view (as the chart's webhook ServiceAccount) and Flask app,
kube-apiserver with the GpuPolicy CRD (CEL, status subresource), kube-controller-manager running the
Deployments. Faked: the clock the reconcilers read (the hub keeps the real one) and the GPU metrics
(every workload reads idle at 0 %, with no wake demand), so a scale to zero is always due.
Each test has its own namespaces (`Site`); the GpuPolicies and the lease it leaves are deleted after it.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
from kubernetes import client

from controller.command import ControllerProcess, build
from controller.hubsync import HubSettings
from controller.policysync import PolicySync
from controller.scaletozero import ScaleToZeroReconciler
from gpupolicy.model import GROUP, PLURAL, VERSION, Mode
from gpupolicy.scaling.metrics import Sample, Series
from kube.config import load_api_client
from tests.cluster.cache import CaughtUpCache
from tests.cluster.cluster import Cluster
from tests.cluster.kubeon import NAMESPACE, RELEASE
from tests.cluster.objects import make_node, make_pod
from tests.controller.conftest import FakeClock, make_deployment
from tests.hub.conftest import HubProcess, start_hub
from tests.loopback import wait_for
from tests.webhook.payloads import api_pod, review

# the chart's CRDs, ServiceAccounts and RBAC; the optimizer's parts run in the test
CLUSTER = {"kubeon": True, "kubeon_components": ()}


def share(namespace: str) -> dict[str, Any]:
    return {"mode": "Automatic", "selector": {"namespaces": [namespace]}, "sharing": {"strategy": "TimeSlicing"}}


def park(namespace: str) -> dict[str, Any]:
    return {"mode": "Automatic", "scaleToZero": {"namespaces": [namespace], "idleFor": "60s", "idleBelowPercent": 5,
                                                 "wake": {"prometheusQuery": "sum(queue_depth)", "above": 0}}}


class IdleGpus:
    """Every workload's GPUs read 0 % over any window; the wake query reads 0 (no demand)."""

    def query_range(self, promql: str, start: float, end: float, step: float) -> list[Series]:
        points, t = [], start
        while t <= end:
            points.append((t, 0.0))
            t += step
        return [Series({}, points)]

    def query(self, promql: str) -> list[Sample]:
        return [Sample({}, 0.0)]


@pytest.fixture(params=["http", "https"])
def hub(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[HubProcess]:
    process = start_hub(f"sqlite:///{tmp_path}/hub.db", tls=request.param == "https")
    yield process
    process.stop()


@dataclass
class Site:
    """The cluster as one test sees it: the admin's client (what kubectl shows), the controller's, the
    webhook's and the extender's (the chart's ServiceAccounts), the test's namespaces and its T4 node."""

    admin: client.ApiClient
    controller: client.ApiClient
    webhook: client.ApiClient
    extender: client.ApiClient
    inference: str
    research: str
    batch: str
    node: str


@pytest.fixture
def site(kube_cluster: Cluster, namespace: str) -> Iterator[Site]:
    assert kube_cluster.kubeon is not None
    names = [kube_cluster.ensure_namespace(f"{namespace}-{suffix}") for suffix in ("inf", "res", "bat")]
    # a node that offers time-sliced shares: the webhook rewrites only to a slice some node offers
    node = f"{namespace}-t4-0"
    kube_cluster.create_node(make_node(node, "Tesla-T4", 2, shared_replicas=4))
    kubeon, admin = kube_cluster.kubeon, kube_cluster.api_client
    controller = load_api_client(str(kubeon.kubeconfig_of(admin, RELEASE)))
    webhook = load_api_client(str(kubeon.kubeconfig_of(admin, f"{RELEASE}-webhook")))
    extender = load_api_client(str(kubeon.kubeconfig_of(admin, f"{RELEASE}-extender")))
    yield Site(admin, controller, webhook, extender, *names, node)
    for api in (controller, webhook, extender):
        api.close()
    objects = client.CustomObjectsApi(admin)
    for item in objects.list_cluster_custom_object(GROUP, VERSION, PLURAL)["items"]:
        objects.delete_cluster_custom_object(GROUP, VERSION, PLURAL, item["metadata"]["name"])
    client.CoordinationV1Api(admin).delete_collection_namespaced_lease(NAMESPACE)
    kube_cluster.core.delete_node(node)
    for name in names:
        kube_cluster.delete_namespace(name)


def _token(hub: HubProcess, verb: str, cluster: str = "prod") -> str:
    done = hub.cli("token", verb, "--cluster", cluster)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def _put(hub: HubProcess, name: str, spec: dict[str, Any], cluster: str = "prod") -> None:
    assert hub.client().admin("PUT", f"/clusters/{cluster}/policies/{name}", json={"spec": spec}).status_code == 200


_CACHES: list[CaughtUpCache] = []


def _cache(api: client.ApiClient, admin: client.ApiClient) -> CaughtUpCache:
    cache = CaughtUpCache(api, admin).start()
    _CACHES.append(cache)
    return cache


@pytest.fixture(autouse=True)
def stop_caches() -> Iterator[None]:
    yield
    while _CACHES:
        _CACHES.pop().stop()


def _controller(api: client.ApiClient, admin: client.ApiClient, hub: HubProcess, token_file: Path,
                clock: FakeClock) -> ControllerProcess:
    settings = HubSettings(hub.url, "prod", str(token_file), poll_interval=60.0, ca_file=hub.ca_file)
    process = build(api, identity="one", clock=clock, metrics=IdleGpus(), prometheus_url="http://prometheus.test",
                    default_mode=Mode.RECOMMEND, on_lost=lambda _reason: None, hub=settings,
                    reconcilers=[PolicySync(), ScaleToZeroReconciler()])
    assert process.elector.step()
    process.ctx.cache = _cache(api, admin)  # its passes run right after the test's writes
    return process


def _policies(api: client.ApiClient) -> dict[str, dict[str, Any]]:
    items = client.CustomObjectsApi(api).list_cluster_custom_object(GROUP, VERSION, PLURAL)["items"]
    return {o["metadata"]["name"]: o for o in items}


def _advance(process: ControllerProcess, clock: FakeClock, seconds: float) -> None:
    """Move the clock, renewing the lease on the way as the lease thread would."""
    while seconds > 0:
        clock.advance(min(5.0, seconds))
        seconds -= 5.0
        assert process.elector.step()


def _poll(process: ControllerProcess, clock: FakeClock, seconds: float = 70) -> None:
    """Let one poll interval pass and run what is due (the hub sync first)."""
    _advance(process, clock, seconds)
    process.runner.run_due()


def _replicas(api: client.ApiClient, namespace: str, name: str) -> int:
    return int(client.AppsV1Api(api).read_namespaced_deployment(name, namespace).spec.replicas)


def _metric(process: ControllerProcess, name: str, **labels: str) -> float:
    return float(process.metrics.registry.get_sample_value(name, labels) or 0.0)


def test_sync_edit_overwrite_304_rotation_and_revocation(hub: HubProcess, site: Site, tmp_path: Path,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    api = site.admin
    token_file = tmp_path / "token"
    token_file.write_text(_token(hub, "create"))
    _put(hub, "share-inference", {**share(site.inference), "mode": "Recommend"})
    clock = FakeClock(time.time())
    process = _controller(site.controller, site.admin, hub, token_file, clock)

    with caplog.at_level(logging.INFO):
        process.runner.run_all()
    assert "policies synced count=1 revision=1" in caplog.text
    synced = _policies(api)["share-inference"]
    assert synced["metadata"]["labels"]["gpu.kubeon.io/managed-by"] == "hub"
    assert synced["metadata"]["labels"]["gpu.kubeon.io/hub"] == "Connected"
    assert synced["metadata"]["annotations"]["gpu.kubeon.io/hub-revision"] == "1"
    assert synced["spec"]["mode"] == "Recommend"

    # an edit in the hub reaches the cluster within one poll
    _put(hub, "share-inference", share(site.inference))
    _put(hub, "idle-research", {**park(site.research), "mode": "Recommend"})
    _poll(process, clock)
    assert _policies(api)["share-inference"]["spec"]["mode"] == "Automatic"
    assert set(_policies(api)) == {"share-inference", "idle-research"}

    # a direct edit is overwritten on the next sync; nothing changed in the hub: 304, counted, no "synced" line
    objects = client.CustomObjectsApi(api)
    objects.patch_cluster_custom_object(GROUP, VERSION, PLURAL, "share-inference", {"spec": {"mode": "Recommend"}})
    caplog.clear()
    with caplog.at_level(logging.INFO):
        _poll(process, clock)
    assert _policies(api)["share-inference"]["spec"]["mode"] == "Automatic"
    assert "policies synced" not in caplog.text
    assert _metric(process, "kubeon_gpu_hub_polls_total", result="not_modified") == 1

    # objects the hub no longer lists are deleted
    assert hub.client().admin("DELETE", "/clusters/prod/policies/idle-research").status_code == 200
    _poll(process, clock)
    assert set(_policies(api)) == {"share-inference"}

    # rotation: the old token works until the new one is used; the Secret's file is re-read, no restart
    old = token_file.read_text()
    new = _token(hub, "rotate")
    assert requests.get(f"{hub.url}/api/v1/clusters/prod/policies", headers={"Authorization": f"Bearer {old}"},
                        verify=hub.ca_file or True, timeout=5).status_code == 200
    token_file.write_text(new)
    os.utime(token_file, ns=(time.time_ns() + 10**9, time.time_ns() + 10**9))
    _poll(process, clock)
    assert _metric(process, "kubeon_gpu_hub_connected") == 1
    assert requests.get(f"{hub.url}/api/v1/clusters/prod/policies", headers={"Authorization": f"Bearer {old}"},
                        verify=hub.ca_file or True, timeout=5).status_code == 401

    # revocation: within one poll every writer stops; the webhook admits unchanged; the hub shows disconnected
    from kube.views import WatchedView
    from webhook.app import create_app

    _put(hub, "idle-research", park(site.research))
    client.AppsV1Api(api).create_namespaced_deployment(site.research,
                                                       make_deployment("trainer", site.research, replicas=2))
    view = WatchedView(site.webhook, default_mode=Mode.RECOMMEND, own_namespace="kubeon-gpu", with_nodes=True,
                       metrics_configured=True).start()  # the webhook run with --prometheus-url
    webhook = create_app(view).test_client()

    def mutated() -> bool:
        answer = webhook.post("/mutate", json=review(api_pod(), namespace=site.inference)).get_json()["response"]
        return "patch" in answer

    wait_for(mutated, what="the webhook to rewrite a pod under the hub's sharing policy")
    assert hub.cli("token", "revoke", "--cluster", "prod").returncode == 0
    _poll(process, clock, 120)  # the scale to zero of `trainer` is due now (idle for the whole window)
    assert _replicas(api, site.research, "trainer") == 2, "a revoked cluster scaled a workload to zero"
    assert _metric(process, "kubeon_gpu_hub_connected") == 0
    assert {o["metadata"]["labels"]["gpu.kubeon.io/hub"] for o in _policies(api).values()} == {"Disconnected"}
    for obj in _policies(api).values():
        hub_condition = next(c for c in obj["status"]["conditions"] if c["type"] == "HubConnected")
        assert hub_condition["status"] == "False" and hub_condition["reason"] == "Disconnected"
        # what `kubectl get gpupolicies` shows (its Mode column) is what runs: nothing acts
        assert obj["status"]["effectiveMode"] == "Recommend", obj["metadata"]["name"]
        degraded = next(c for c in obj["status"]["conditions"] if c["type"] == "Degraded")
        assert degraded["status"] == "True" and degraded["reason"] == "HubDisconnected"
    assert {o["status"]["requestedMode"] for o in _policies(api).values()} != {"Recommend"}
    wait_for(lambda: not mutated(), what="the webhook to admit pods unchanged once disconnected")
    pod = api_pod()
    answer = webhook.post("/mutate", json=review(pod, namespace=site.inference)).get_json()["response"]
    assert "patch" not in answer and answer["allowed"] is True
    for _ in range(3):
        _poll(process, clock)
    assert _replicas(api, site.research, "trainer") == 2
    clusters = hub.client().admin("GET", "/clusters").json()["clusters"]
    assert clusters[0]["state"] == "disconnected"

    # a working token resumes: the writers act again (the due scale to zero happens)
    token_file.write_text(_token(hub, "create"))
    os.utime(token_file, ns=(time.time_ns() + 2 * 10**9, time.time_ns() + 2 * 10**9))
    _poll(process, clock)
    assert _metric(process, "kubeon_gpu_hub_connected") == 1
    assert {o["metadata"]["labels"]["gpu.kubeon.io/hub"] for o in _policies(api).values()} == {"Connected"}
    _poll(process, clock)
    assert {next(c["status"] for c in o["status"]["conditions"] if c["type"] == "HubConnected")
            for o in _policies(api).values()} == {"True"}
    assert all(o["status"]["effectiveMode"] == o["status"]["requestedMode"] for o in _policies(api).values())
    assert _replicas(api, site.research, "trainer") == 0
    wait_for(mutated, what="the webhook to rewrite pods again after reconnecting")
    view.stop()
    actions = hub.client().admin("GET", "/clusters/prod/actions").json()["actions"]
    assert [a["result"] for a in actions if a["target"] == f"Deployment/{site.research}/trainer"] == ["applied"]


def test_hub_down_for_several_polls(site: Site, tmp_path: Path) -> None:
    api = site.admin
    from tests.loopback import free_port

    port = free_port()
    db = f"sqlite:///{tmp_path}/hub.db"
    hub = start_hub(db, port=port)
    token_file = tmp_path / "token"
    token_file.write_text(_token(hub, "create"))
    _put(hub, "idle-research", park(site.research))
    clock = FakeClock(time.time())
    process = _controller(site.controller, site.admin, hub, token_file, clock)
    process.runner.run_all()
    assert set(_policies(api)) == {"idle-research"}
    hub.stop()

    client.AppsV1Api(api).create_namespaced_deployment(site.research,
                                                       make_deployment("trainer", site.research, replicas=2))
    for _ in range(4):
        _poll(process, clock, 700)
    assert set(_policies(api)) == {"idle-research"}, "an outage leaves the policies in force"
    assert _replicas(api, site.research, "trainer") == 0, "the policies in the cluster keep acting during an outage"
    assert _metric(process, "kubeon_gpu_hub_polls_total", result="error") >= 3
    assert _metric(process, "kubeon_gpu_hub_actions_queued") >= 1
    assert process.runner.reconcilers[0].period_seconds > 60 * 1.1, "errors back off"

    hub = start_hub(db, port=port)
    try:
        _poll(process, clock, 700)
        _poll(process, clock, 700)
        actions = hub.client().admin("GET", "/clusters/prod/actions").json()["actions"]
        applied = [a for a in actions if a["result"] == "applied"]
        assert len(applied) == 1 and applied[0]["target"] == f"Deployment/{site.research}/trainer"
        assert _metric(process, "kubeon_gpu_hub_actions_queued") == 0
    finally:
        hub.stop()


def test_a_policy_change_wakes_the_reconcilers_but_not_the_hub_poll(site: Site, tmp_path: Path) -> None:
    """The GpuPolicy watch (controller.command._policy_watch) wakes the reconcilers that read the policies
    when a spec changes. Not the hub poll: the sync's own writes change specs (its overwrite of a direct
    edit, below), and each would set off another poll; the hub is read at its interval."""
    from controller.command import _policy_watch

    api = site.admin
    hub = start_hub(f"sqlite:///{tmp_path}/hub.db")
    watch = None
    try:
        token_file = tmp_path / "token"
        token_file.write_text(_token(hub, "create"))
        _put(hub, "idle-research", park(site.research))
        clock = FakeClock(time.time())
        process = _controller(site.controller, site.admin, hub, token_file, clock)
        watch = _policy_watch(site.controller, process.runner)
        assert watch is not None and watch.wait_for_sync(30)
        process.runner.run_all()
        assert _policies(api)["idle-research"]["spec"]["mode"] == "Automatic"
        runs = dict(process.runner.passes)

        client.CustomObjectsApi(api).patch_cluster_custom_object(GROUP, VERSION, PLURAL, "idle-research",
                                                                 {"spec": {"mode": "Recommend"}})
        wait_for(lambda: process.runner.run_due() > 0, timeout=30, what="the watch to wake the reconcilers")
        assert process.runner.passes["policies"] > runs["policies"]
        assert process.runner.passes["hub"] == runs["hub"], "a spec change is no reason to poll the hub"
        assert _metric(process, "kubeon_gpu_hub_polls_total", result="synced") == 1

        _poll(process, clock)  # the interval: the hub's spec wins over the direct edit
        assert process.runner.passes["hub"] == runs["hub"] + 1
        assert _policies(api)["idle-research"]["spec"]["mode"] == "Automatic"
    finally:
        if watch is not None:
            watch.stop()
        hub.stop()


def test_another_clusters_token_is_refused_and_disconnects(site: Site, tmp_path: Path) -> None:
    hub = start_hub(f"sqlite:///{tmp_path}/hub.db")
    try:
        _token(hub, "create")
        token_file = tmp_path / "token"
        token_file.write_text(_token(hub, "create", cluster="staging"))
        _put(hub, "share-inference", share(site.inference))
        process = _controller(site.controller, site.admin, hub, token_file, FakeClock(time.time()))
        process.runner.run_all()
        assert _metric(process, "kubeon_gpu_hub_polls_total", result="unauthorized") == 1
        assert _metric(process, "kubeon_gpu_hub_connected") == 0
        assert _policies(site.admin) == {}
    finally:
        hub.stop()


def test_approve_mode_applies_only_live_hub_approvals(site: Site, tmp_path: Path) -> None:
    api = site.admin
    hub = start_hub(f"sqlite:///{tmp_path}/hub.db")
    try:
        token_file = tmp_path / "token"
        token_file.write_text(_token(hub, "create"))
        _put(hub, "idle-research", {**park(site.research), "mode": "Approve"})
        for name in ("kept", "withdrawn", "expired", "unapproved"):
            client.AppsV1Api(api).create_namespaced_deployment(site.research,
                                                               make_deployment(name, site.research, replicas=1))
        admin = hub.client()

        def approve(name: str, expires: float | None = None) -> str:
            body: dict[str, Any] = {"policy": "idle-research", "target": f"Deployment/{site.research}/{name}"}
            if expires is not None:
                body["expiresInSeconds"] = expires
            answer = admin.admin("POST", "/clusters/prod/approvals", json=body)
            assert answer.status_code == 201
            return str(answer.json()["id"])

        approve("kept")
        withdrawn = approve("withdrawn")
        approve("expired", expires=1)
        assert admin.admin("DELETE", f"/clusters/prod/approvals/{withdrawn}").status_code == 200
        time.sleep(1.5)
        clock = FakeClock(time.time())
        process = _controller(site.controller, site.admin, hub, token_file, clock)
        process.runner.run_all()
        _poll(process, clock)
        assert _policies(api)["idle-research"]["spec"]["approvals"] == [f"Deployment/{site.research}/kept"]
        assert {n: _replicas(api, site.research, n) for n in ("kept", "withdrawn", "expired", "unapproved")} == {
            "kept": 0, "withdrawn": 1, "expired": 1, "unapproved": 1}
        # proposals shown for the others reach the hub once each, for the console's Approve buttons
        _poll(process, clock)
        _poll(process, clock)
        proposed = [a for a in admin.admin("GET", "/clusters/prod/actions").json()["actions"]
                    if a["result"] == "proposed"]
        assert sorted(a["target"] for a in proposed) == [
            f"Deployment/{site.research}/{name}" for name in ("expired", "unapproved", "withdrawn")]
    finally:
        hub.stop()


class DcgmIdle(IdleGpus):
    """IdleGpus, and DCGM's per-GPU utilisation for the summary: the given node's GPU 0 at 0 %."""

    def __init__(self, node: str) -> None:
        self.node = node

    def query(self, promql: str) -> list[Sample]:
        if "DCGM_FI_DEV_GPU_UTIL" in promql:
            return [Sample({"Hostname": self.node, "gpu": "0"}, 0.0), Sample({"Hostname": self.node, "gpu": "1"}, 70.0)]
        return super().query(promql)


def test_every_poll_reports_a_cluster_summary(kube_cluster: Cluster, site: Site, tmp_path: Path) -> None:
    """GPUs by model and layout, allocated, idle by DCGM, pending GPU pods, cost from the instance catalog, and
    the actions applied since the last report, as the hub stores them."""
    api = site.admin
    node = f"{site.node}-l4"
    kube_cluster.create_node(make_node(node, "NVIDIA-L4", 1, instance_type="g6.xlarge"))
    hub = start_hub(f"sqlite:///{tmp_path}/hub.db")
    try:
        token_file = tmp_path / "token"
        token_file.write_text(_token(hub, "create"))
        _put(hub, "idle-research", park(site.research))
        waiting = make_pod("waits", site.batch, gpus=1, node_selector={"gpu.kubeon.io/no-such-node": "x"},
                           scheduler_name=None)
        client.CoreV1Api(api).create_namespaced_pod(site.batch, waiting)
        clock = FakeClock(time.time())
        settings = HubSettings(hub.url, "prod", str(token_file), poll_interval=60.0)
        process = build(site.controller, identity="one", clock=clock, metrics=DcgmIdle(node),
                        prometheus_url="http://prometheus.test", default_mode=Mode.RECOMMEND,
                        on_lost=lambda _reason: None, hub=settings,
                        reconcilers=[PolicySync(), ScaleToZeroReconciler()])
        process.ctx.cache = _cache(site.controller, api)  # its passes run right after our writes
        assert process.elector.step()
        process.runner.run_all()
        first = hub.client().admin("GET", "/clusters/prod/summaries").json()
        latest = first["latest"]
        groups = {(g["model"], g["layout"]): g for g in latest["byModel"]}
        assert groups.get(("NVIDIA-L4", "whole GPUs"), {}).get("gpus", 0) >= 1, latest["byModel"]
        assert sum(g["gpus"] for (model, _), g in groups.items() if model == "Tesla-T4") >= 2, latest["byModel"]
        assert latest["idleGpus"] == 1, "the L4 node's GPU 0 reads 0 %, its GPU 1 70 %"
        assert latest["pendingGpuPods"] >= 1
        assert latest["costPerHour"] >= 0.8048 - 1e-6, "the L4 node priced as its g6.xlarge instance type"
        assert latest["unpricedNodes"] >= 1, "no catalog entry prices a Tesla T4"
        assert latest["savings"]["actionsApplied"] == 0

        client.AppsV1Api(api).create_namespaced_deployment(site.research,
                                                           make_deployment("trainer", site.research, replicas=1))
        _poll(process, clock, 700)
        _poll(process, clock)
        assert _replicas(api, site.research, "trainer") == 0
        history = hub.client().admin("GET", "/clusters/prod/summaries").json()
        points = history["points"]
        assert len(points) == 3, "one report per poll"
        # the hub sync runs first in a pass: the scale to zero of the second pass is in the third pass's report
        assert [p["actionsApplied"] for p in points] == [0, 0, 1]
        # its proposal freed 1 GPU for a month (730 GPU-hours): per hour, one GPU-hour at the cluster's price
        last = history["latest"]
        assert last["savings"] == {"actionsApplied": 1, "gpuHoursPerMonth": 730.0, "perHour": last["pricePerGpuHour"]}
        assert last["pricePerGpuHour"] > 0 and points[2]["savingsPerHour"] == last["pricePerGpuHour"]
        assert points[0]["time"] < points[1]["time"] < points[2]["time"]
        assert _metric(process, "kubeon_gpu_hub_summaries_reported_total") == 3
    finally:
        hub.stop()
        kube_cluster.core.delete_node(node)


def test_an_approval_that_expires_between_polls_is_dropped_locally() -> None:
    from controller.hubsync import desired_objects

    body = {"revision": 3, "policies": [{"name": "p", "spec": {"mode": "Approve", "packing": {}}}],
            "approvals": [{"policy": "p", "target": "Deployment/a/b", "id": "1", "expires": "2030-01-01T00:00:00Z"}]}
    before = desired_objects(body, 1_893_455_000.0)["p"]
    after = desired_objects(body, 1_893_456_001.0)["p"]
    assert before["spec"]["approvals"] == ["Deployment/a/b"]
    assert "approvals" not in after["spec"]
