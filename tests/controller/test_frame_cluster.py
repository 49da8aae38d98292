"""The controller frame against the test API server: lease election, policy sync and status, mode gating.

Real: the test API server (tests/kubeapi) with the generated GpuPolicy CRD, the
kubernetes client, the controller's Lease loop, policy store, status writer,
recorder (Events) and the right-sizing reconciler. Faked: the clock
(`FakeClock`, so lease expiry is exact) and the metrics source
(`ScriptedMetrics`, scripted DCGM series; the real Prometheus path is covered
by the scale-to-zero tests with tests/promharness).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
from kubernetes import client

from controller.command import ControllerProcess, build
from controller.leader import LeaderElector
from controller.policysync import PolicySync
from controller.rightsizing import RightSizingReconciler
from gpupolicy.model import Mode
from gpupolicy.modes import parse_components
from kube.leases import LeaseConflict, get_lease, replace_lease
from tests.controller.conftest import FakeClock, ScriptedMetrics, make_deployment, make_node, make_policy

DAY = 86400.0
GIB = 1024.0
LEASE = "kubeon-gpu-optimizer"


# -- helpers ------------------------------------------------------------------------
def create(api: client.ApiClient, obj: dict[str, Any]) -> dict[str, Any]:
    kind = obj["kind"]
    if kind == "GpuPolicy":
        return client.CustomObjectsApi(api).create_cluster_custom_object(  # type: ignore[no-any-return]
            "gpu.kubeon.io", "v1alpha1", "gpupolicies", obj)
    if kind == "Node":
        return api.sanitize_for_serialization(client.CoreV1Api(api).create_node(obj))  # type: ignore[no-any-return]
    ns = obj["metadata"]["namespace"]
    apps = client.AppsV1Api(api)
    made = (apps.create_namespaced_deployment(ns, obj) if kind == "Deployment"
            else apps.create_namespaced_stateful_set(ns, obj))
    return api.sanitize_for_serialization(made)  # type: ignore[no-any-return]


def policy_status(api: client.ApiClient, name: str) -> dict[str, Any]:
    obj = client.CustomObjectsApi(api).get_cluster_custom_object("gpu.kubeon.io", "v1alpha1", "gpupolicies", name)
    return obj.get("status") or {}


def invalid_events(api: client.ApiClient) -> list[client.CoreV1Event]:
    return [e for e in client.CoreV1Api(api).list_namespaced_event("kubeon-gpu").items
            if e.reason == "InvalidSpec" and e.involved_object.name == "broken" and e.type == "Warning"]


def deployment(api: client.ApiClient, name: str, ns: str = "inference") -> dict[str, Any]:
    return api.sanitize_for_serialization(  # type: ignore[no-any-return]
        client.AppsV1Api(api).read_namespaced_deployment(name, ns))


def pod_of(api: client.ApiClient, deployment_name: str, suffix: str = "a1b2c", ns: str = "inference") -> str:
    """A running pod of the Deployment (its selector's labels, whole GPU), as its ReplicaSet would make."""
    name = f"{deployment_name}-7d9f6c8b5-{suffix}"
    client.CoreV1Api(api).create_namespaced_pod(ns, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": deployment_name}},
        "spec": {"containers": [{"name": "main", "image": "vllm/vllm-openai:latest",
                                 "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}})
    return name


def pod_names(api: client.ApiClient, deployment_name: str, ns: str = "inference") -> set[str]:
    pods = client.CoreV1Api(api).list_namespaced_pod(ns, label_selector=f"app={deployment_name}").items
    return {p.metadata.name for p in pods}


def scaler_binding_namespaces(api: client.ApiClient) -> set[str]:
    bindings = client.RbacAuthorizationV1Api(api).list_role_binding_for_all_namespaces().items
    return {b.metadata.namespace for b in bindings if b.metadata.name == "kubeon-gpu-optimizer-scaler"}


def condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in status.get("conditions", []) if c["type"] == kind)


def script_usage(metrics: ScriptedMetrics, clock: FakeClock, deploy: str, peak_mib: float,
                 days: float = 7.0, util: float = 12.0) -> None:
    """A week of DCGM series for one pod of `deploy` on node gpu-1, with one memory peak."""
    end = clock.now()
    start = end - days * DAY
    labels = {"namespace": "inference", "pod": f"{deploy}-7f9c5d-x2k4q", "Hostname": "gpu-1",
              "modelName": "NVIDIA A100-SXM4-80GB"}
    peak_at = end - 2 * DAY
    metrics.add("DCGM_FI_DEV_FB_USED", labels,
                lambda t: peak_mib if abs(t - peak_at) < 300 else peak_mib / 3, start, end, every=600)
    metrics.add("DCGM_FI_DEV_GPU_UTIL", labels, lambda t: util, start, end, every=600)


def run_passes(r: ControllerProcess, clock: FakeClock, passes: int, seconds: float) -> None:
    """`passes` rounds of: campaign for the lease, run every due reconcile, let `seconds` pass."""
    for _ in range(passes):
        r.elector.step()
        r.runner.run_all()
        clock.advance(seconds)


def replica(api: client.ApiClient, clock: FakeClock, metrics: ScriptedMetrics | None, identity: str,
            lost: list[str] | None = None, mode: Mode = Mode.RECOMMEND) -> ControllerProcess:
    return build(
        api, identity=identity, clock=clock, metrics=metrics, default_mode=mode,
        prometheus_url="http://prometheus.test" if metrics is not None else None,
        on_lost=(lambda reason: (lost.append(reason) if lost is not None else None)),
        reconcilers=[PolicySync(), RightSizingReconciler()],
    )


@pytest.fixture
def api(frame_api: Any) -> client.ApiClient:
    return frame_api.api  # type: ignore[no-any-return]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


# -- leader election ---------------------------------------------------------------
def elector(api: client.ApiClient, clock: FakeClock, identity: str, lost: list[str]) -> LeaderElector:
    return LeaderElector(api, "kubeon-gpu", LEASE, identity, clock, lease_duration=15, renew_interval=5,
                         on_lost=lost.append)


def test_two_replicas_exactly_one_leads(api: client.ApiClient, clock: FakeClock) -> None:
    lost: list[str] = []
    a, b = elector(api, clock, "a", lost), elector(api, clock, "b", lost)
    assert a.step() is True
    assert b.step() is False
    clock.advance(5)
    assert a.step() is True and b.step() is False
    lease = get_lease(api, "kubeon-gpu", LEASE)
    assert lease is not None and lease.holder == "a" and lease.transitions == 0
    assert lease.lease_duration_seconds == 15
    assert lease.renew_time == pytest.approx(clock.now(), abs=1e-3)
    assert [a.is_leader(), b.is_leader()] == [True, False] and not lost


def test_expired_lease_is_taken_over_and_the_old_holder_stops(api: client.ApiClient, clock: FakeClock) -> None:
    lost: list[str] = []
    a, b = elector(api, clock, "a", lost), elector(api, clock, "b", lost)
    assert a.step()
    clock.advance(10)
    assert not b.step(), "a lease renewed 10 s ago (duration 15 s) is not free"
    clock.advance(6)  # a failed to renew: 16 s since its last renewal
    assert a.is_leader() is False, "a must stop acting once its own lease has expired"
    assert lost and "expired" in lost[0]
    assert b.step() is True
    lease = get_lease(api, "kubeon-gpu", LEASE)
    assert lease is not None and lease.holder == "b" and lease.transitions == 1
    assert lease.acquire_time == pytest.approx(clock.now(), abs=1e-3)
    assert a.step() is False, "a replica that lost the lease does not quietly resume"


def test_a_replica_whose_lease_is_stolen_stops(api: client.ApiClient, clock: FakeClock) -> None:
    lost: list[str] = []
    a = elector(api, clock, "a", lost)
    assert a.step()
    current = get_lease(api, "kubeon-gpu", LEASE)
    assert current is not None
    replace_lease(api, current, "intruder", 15, clock.now(), clock.now(), current.transitions + 1)
    clock.advance(5)
    assert a.step() is False
    assert a.is_leader() is False
    assert lost == ["lease now held by intruder"]


def test_lease_writes_are_conditional_on_resource_version(api: client.ApiClient, clock: FakeClock) -> None:
    lost: list[str] = []
    assert elector(api, clock, "a", lost).step()
    stale = get_lease(api, "kubeon-gpu", LEASE)
    assert stale is not None
    replace_lease(api, stale, "a", 15, clock.now(), clock.now() + 1, 0)
    with pytest.raises(LeaseConflict):
        replace_lease(api, stale, "b", 15, clock.now(), clock.now() + 2, 1)


def test_only_the_leader_reconciles(api: client.ApiClient, clock: FakeClock) -> None:
    metrics = ScriptedMetrics()
    create(api, make_node("gpu-1"))
    create(api, make_deployment("llm"))
    create(api, make_policy("share", {"sharing": {"strategy": "MIG", "rollout": "Restart"}}, mode="Automatic"))
    script_usage(metrics, clock, "llm", 7.1 * GIB)
    old_pod = pod_of(api, "llm")
    version = deployment(api, "llm")["metadata"]["resourceVersion"]
    lost: list[str] = []
    one, two = replica(api, clock, metrics, "one", lost), replica(api, clock, metrics, "two", lost)
    for _ in range(3):
        for r in (one, two):
            r.elector.step()
            r.runner.run_all()
        clock.advance(5)
    leaders = [r for r in (one, two) if r.elector.is_leader()]
    assert len(leaders) == 1 and leaders[0] is one
    assert two.runner.passes == {}, "the standby replica must not reconcile"
    # one apply (pass 1: status says Applied), then one restart (pass 2, after that status was read back)
    assert [a["action"] for a in one.ctx.recorder.applied_log] == [
        "nvidia.com/gpu=1 → nvidia.com/mig-1g.10gb", "restart for nvidia.com/gpu=1 → nvidia.com/mig-1g.10gb"]
    assert not two.ctx.recorder.applied_log
    assert old_pod not in pod_names(api, "llm"), "the restart evicts the running pod (Eviction API)"
    assert deployment(api, "llm")["metadata"]["resourceVersion"] == version, "the workload is never written"
    record = policy_status(api, "share")["restarts"]["Deployment/inference/llm"]
    assert record["pods"] and record["proposal"] == policy_status(api, "share")["proposals"][0]["id"]


# -- policy sync and status ----------------------------------------------------------
def test_status_has_stable_proposals_and_is_written_only_on_change(
    api: client.ApiClient, clock: FakeClock, caplog: pytest.LogCaptureFixture,
) -> None:
    metrics = ScriptedMetrics()
    create(api, make_node("gpu-1"))
    create(api, make_deployment("llm", replicas=2))
    create(api, make_policy("share", {"sharing": {"strategy": "MIG"}}))
    create(api, make_policy("guard", {"guardrail": {"maxGpusPerPod": 4}}))
    # Two bodies: a CEL rule of the CRD refuses it, which the test API server does not evaluate
    # (a policy stored before the rule, or past a webhook that was down).
    create(api, make_policy("broken", {"guardrail": {}, "packing": {}}))
    script_usage(metrics, clock, "llm", 7.1 * GIB)
    r = replica(api, clock, metrics, "one")
    assert r.elector.step()
    with caplog.at_level(logging.INFO, logger="controller.policysync"):
        r.runner.run_all()
    assert "policies read count=3" in caplog.text and "source of truth" in caplog.text
    assert "policies synced" not in caplog.text, "nothing was pulled from a hub"
    status = policy_status(api, "share")
    assert status["effectiveMode"] == "Recommend"
    assert status["observedGeneration"] == 1
    assert condition(status, "Valid")["status"] == "True"
    assert condition(status, "Ready")["status"] == "True"
    assert condition(status, "Degraded")["status"] == "False"
    [proposal] = status["proposals"]
    assert proposal["target"] == "Deployment/inference/llm"
    assert proposal["action"] == "nvidia.com/gpu=1 → nvidia.com/mig-1g.10gb"
    assert "(A100-80GB, peak 7.1 GiB, p95 util 12%)" in proposal["reason"]
    assert proposal["estimatedGpuHoursPerMonth"] == pytest.approx(round(2 * 6 / 7 * 730, 1))
    assert proposal["state"] == "Proposed"
    broken = policy_status(api, "broken")
    assert condition(broken, "Valid")["status"] == "False"
    assert "exactly one of" in condition(broken, "Valid")["message"]
    assert condition(status, "Valid")["status"] == "True", "only the broken policy is reported"
    assert [e.message for e in invalid_events(api)] == [
        "policy skipped, fix the spec: spec: Value error, exactly one of sharing, scaleToZero, packing, "
        "typeFit, capacity, guardrail must be set (found: packing, guardrail)"]
    writes = r.metrics.status_writes._value.get()

    clock.advance(600)
    r.elector.step()
    r.runner.run_all()
    assert r.metrics.status_writes._value.get() == writes, "an unchanged status must not be rewritten"
    assert len(invalid_events(api)) == 1, "one Event per error, not one per resync"

    restarted = replica(api, clock, metrics, "one")  # a new process, same identity: ids survive
    restarted.elector.step()
    restarted.runner.run_all()
    assert policy_status(api, "share")["proposals"][0]["id"] == proposal["id"]


def test_without_prometheus_metric_policies_stay_recommend(api: client.ApiClient, clock: FakeClock) -> None:
    create(api, make_deployment("llm"))
    create(api, make_policy("share", {"sharing": {"strategy": "MIG"}}, mode="Automatic"))
    before = deployment(api, "llm")["metadata"]["resourceVersion"]
    r = replica(api, clock, None, "one")
    r.elector.step()
    r.runner.run_all()
    status = policy_status(api, "share")
    assert status["effectiveMode"] == "Recommend"
    degraded = condition(status, "Degraded")
    assert degraded["status"] == "True" and "--prometheus-url" in degraded["message"]
    assert deployment(api, "llm")["metadata"]["resourceVersion"] == before


def test_status_shows_requested_and_effective_mode(api: client.ApiClient, clock: FakeClock) -> None:
    """`kubectl get gpupolicies` MODE is status.effectiveMode, REQUESTED status.requestedMode."""
    create(api, make_policy("share", {"sharing": {"strategy": "MIG"}}, mode="Automatic"))
    create(api, make_policy("guard", {"guardrail": {"maxGpusPerPod": 4}}))
    r = replica(api, clock, None, "one", mode=Mode.APPROVE)
    r.elector.step()
    r.runner.run_all()
    share = policy_status(api, "share")
    assert (share["requestedMode"], share["effectiveMode"]) == ("Automatic", "Recommend")
    assert condition(share, "Degraded")["reason"] == "PrometheusNotConfigured"
    guard = policy_status(api, "guard")
    assert (guard["requestedMode"], guard["effectiveMode"]) == ("Approve", "Approve")
    assert condition(guard, "Degraded")["status"] == "False"


CAPACITY = {"capacity": {"nodePool": "gpu", "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass",
                                                               "name": "gpu"}}}


def test_kinds_nothing_acts_on_are_not_ready(api: client.ApiClient, clock: FakeClock) -> None:
    """A capacity policy under a provider no controller of this version implements (managed node
    groups) and a packing policy without the extender say so: Ready=False with NotImplemented /
    ControllerDisabled, never Reconciled."""
    create(api, make_policy("grow", CAPACITY))
    create(api, make_policy("pack", {"packing": {"strategy": "bestfit"}}))
    create(api, make_policy("guard", {"guardrail": {"maxGpusPerPod": 4}}))
    r = build(api, identity="one", clock=clock, reconcilers=[PolicySync()],
              components=parse_components("webhook"), capacity_provider="eks-nodegroups")
    r.elector.step()
    r.runner.run_all()
    grow = condition(policy_status(api, "grow"), "Ready")
    assert (grow["status"], grow["reason"]) == ("False", "NotImplemented")
    assert "capacity.provider=eks-nodegroups is accepted but not implemented" in grow["message"]
    pack = condition(policy_status(api, "pack"), "Ready")
    assert (pack["status"], pack["reason"]) == ("False", "ControllerDisabled") and "extender" in pack["message"]
    guard = condition(policy_status(api, "guard"), "Ready")
    assert (guard["status"], guard["reason"]) == ("True", "Reconciled") and "webhook" in guard["message"]


def test_a_capacity_policy_under_karpenter_is_handled_by_the_controller(api: client.ApiClient,
                                                                       clock: FakeClock) -> None:
    create(api, make_policy("grow", CAPACITY))
    r = build(api, identity="one", clock=clock, reconcilers=[PolicySync()], components=parse_components("webhook"))
    r.elector.step()
    r.runner.run_all()
    grow = condition(policy_status(api, "grow"), "Ready")
    assert (grow["status"], grow["reason"]) == ("True", "Reconciled") and "controller" in grow["message"]


def test_no_data_for_the_whole_window_means_no_proposal(api: client.ApiClient, clock: FakeClock) -> None:
    metrics = ScriptedMetrics()
    create(api, make_node("gpu-1"))
    create(api, make_deployment("llm"))
    create(api, make_policy("share", {"sharing": {"strategy": "MIG"}}, mode="Automatic"))
    script_usage(metrics, clock, "llm", 7.1 * GIB, days=2)
    r = replica(api, clock, metrics, "one")
    r.elector.step()
    r.runner.run_all()
    status = policy_status(api, "share")
    assert status.get("proposals", []) == []
    rs = condition(status, "RightSizing")
    assert rs["status"] == "False" and rs["reason"] == "InsufficientData"
    assert "start of the window" in rs["message"]
    assert not r.ctx.recorder.applied_log


# -- mode gating -----------------------------------------------------------------------
def _three_workloads(api: client.ApiClient, metrics: ScriptedMetrics, clock: FakeClock) -> dict[str, str]:
    create(api, make_node("gpu-1"))
    for name in ("llm", "embed", "rerank"):
        create(api, make_deployment(name))
        script_usage(metrics, clock, name, 7.1 * GIB)
    return {n: deployment(api, n)["metadata"]["resourceVersion"] for n in ("llm", "embed", "rerank")}


def test_recommend_writes_nothing_to_any_workload(api: client.ApiClient, clock: FakeClock) -> None:
    metrics = ScriptedMetrics()
    versions = _three_workloads(api, metrics, clock)
    create(api, make_policy("share", {"sharing": {"strategy": "MIG", "rollout": "Restart"}}, mode="Recommend",
                            approvals=["Deployment/inference/llm"]))
    r = replica(api, clock, metrics, "one")
    run_passes(r, clock, passes=2, seconds=60)
    assert {n: deployment(api, n)["metadata"]["resourceVersion"] for n in versions} == versions
    states = {p["target"]: p["state"] for p in policy_status(api, "share")["proposals"]}
    assert states == {"Deployment/inference/llm": "Approved", "Deployment/inference/embed": "Proposed",
                      "Deployment/inference/rerank": "Proposed"}
    assert not r.ctx.recorder.applied_log
    assert scaler_binding_namespaces(api) == set(), "Recommend never writes, so it is granted nothing"


def test_automatic_without_restart_never_writes_the_workload(api: client.ApiClient, clock: FakeClock) -> None:
    """Without rollout: Restart the webhook does the change on new pods; the controller only records it."""
    metrics = ScriptedMetrics()
    versions = _three_workloads(api, metrics, clock)
    create(api, make_policy("share", {"sharing": {"strategy": "MIG"}}, mode="Automatic"))
    r = replica(api, clock, metrics, "one")
    run_passes(r, clock, passes=3, seconds=600)
    assert {n: deployment(api, n)["metadata"]["resourceVersion"] for n in versions} == versions
    proposals = policy_status(api, "share")["proposals"]
    assert {(p["state"], p["resource"]) for p in proposals} == {("Applied", "nvidia.com/mig-1g.10gb")}
    assert scaler_binding_namespaces(api) == set(), "no Restart: no workload write access needed"
    assert len(r.ctx.recorder.applied_log) == 3, "one applied action per workload, never repeated"
    events = client.CoreV1Api(api).list_namespaced_event("kubeon-gpu").items
    assert {e.message.split(":")[0] for e in events if e.reason == "GpuPolicyApplied"} == {
        f"Deployment/inference/{n}" for n in versions}


def test_approve_applies_only_approved_targets_once(api: client.ApiClient, clock: FakeClock, frame_api: Any) -> None:
    metrics = ScriptedMetrics()
    versions = _three_workloads(api, metrics, clock)
    create(api, make_policy("share", {"sharing": {"strategy": "MIG", "rollout": "Restart"}}, mode="Approve",
                            approvals=["Deployment/inference/llm"]))
    old_pods = {pod_of(api, "llm", "aaaaa"), pod_of(api, "llm", "bbbbb")}
    other_pod = pod_of(api, "embed")
    setup_writes = len(frame_api.writes)  # the test's own creates
    r = replica(api, clock, metrics, "one")
    r.elector.step()
    r.runner.run_all()
    # pass 1: status first (Applied, with the resource the webhook will use); no workload written yet
    assert {n: deployment(api, n)["metadata"]["resourceVersion"] for n in versions} == versions
    first = {p["target"]: p for p in policy_status(api, "share")["proposals"]}
    assert first["Deployment/inference/llm"]["state"] == "Applied"
    assert first["Deployment/inference/llm"]["resource"] == "nvidia.com/mig-1g.10gb"
    assert first["Deployment/inference/embed"]["resource"] == "nvidia.com/mig-1g.10gb"
    assert pod_names(api, "llm") == old_pods, "nothing evicted before the status was read back Applied"
    assert scaler_binding_namespaces(api) == set(), "Restart evicts through the Eviction API: no workload write"
    # pass 2: the status was read back Applied: now the one restart (replicas 1: one eviction per pass)
    clock.advance(600)
    r.elector.step()
    r.runner.run_all()
    after = {n: deployment(api, n)["metadata"]["resourceVersion"] for n in versions}
    assert after == versions, "the restart never writes a workload"
    assert len(pod_names(api, "llm") & old_pods) == 1 and other_pod in pod_names(api, "embed")
    record = policy_status(api, "share")["restarts"]["Deployment/inference/llm"]
    assert record["undo"]["restartedAt"] == record["startedAt"]
    restarting = next(c for c in policy_status(api, "share")["conditions"] if c["type"] == "RightSizing")
    assert "restart in progress, 1 pod(s)" in restarting["message"]
    new_pod = pod_of(api, "llm", "ccccc")  # the ReplicaSet's replacement (sized by the webhook)
    states = {p["target"]: p["state"] for p in policy_status(api, "share")["proposals"]}
    assert states["Deployment/inference/llm"] == "Applied"
    assert states["Deployment/inference/embed"] == "Proposed"

    # a new process (crash after the record, before anything else) finishes the same restart, never a second
    clock.advance(3600)
    again = replica(api, clock, metrics, "one")
    again.elector.step()
    again.runner.run_all()
    assert pod_names(api, "llm") == {new_pod}, "the last old pod goes; the replacement stays"
    assert policy_status(api, "share")["restarts"]["Deployment/inference/llm"] == record
    assert not again.ctx.recorder.applied_log
    clock.advance(3600)
    again.elector.step()
    again.runner.run_all()
    assert pod_names(api, "llm") == {new_pod}
    assert {n: deployment(api, n)["metadata"]["resourceVersion"] for n in versions} == versions
    writes = [w for w in frame_api.writes[setup_writes:] if "/pods/llm-7d9f6c8b5-ccccc" not in w[1]
              and not w[1].endswith("/inference/pods")]  # less the test's stand-in for the ReplicaSet
    assert [w for w in writes if w[1].startswith("/apis/apps/")] == [], "no write on any workload"
    evictions = [p for m, p in writes if p.endswith("/eviction")]
    assert [(m, p) for m, p in writes if p.endswith("/eviction")] == [("POST", p) for p in evictions]
    assert sorted(p.split("/")[-2] for p in evictions) == sorted(old_pods), "each old pod evicted once"

    assert client.CoreV1Api(api).list_namespaced_event("inference").items == [], "no Event RBAC there"
    policy_events = client.CoreV1Api(api).list_namespaced_event("kubeon-gpu").items
    assert any(e.involved_object.kind == "GpuPolicy" and e.involved_object.name == "share"
               and e.message.startswith("Deployment/inference/llm: ") for e in policy_events)
    assert r.metrics.actions.labels(policy="share", action="rightsize")._value.get() == 1


# -- prompt, safe stop (SIGTERM) ------------------------------------------------------
class _Slow:
    """A reconciler still writing when the stop comes: it must find its lease valid throughout."""

    name = "slow"
    period_seconds = 60.0

    def __init__(self, seconds: float) -> None:
        import threading

        self.seconds = seconds
        self.started = threading.Event()
        self.leader_after: bool | None = None

    def reconcile(self, ctx: Any) -> None:
        self.started.set()
        time.sleep(self.seconds)
        self.leader_after = ctx.is_leader()


class _StopsTheProcess:
    name = "first"
    period_seconds = 60.0

    def __init__(self) -> None:
        self.process: ControllerProcess | None = None

    def reconcile(self, ctx: Any) -> None:
        assert self.process is not None
        self.process.request_stop()  # a SIGTERM arriving during this reconciler


class _Records:
    name = "second"
    period_seconds = 60.0
    ran = False

    def reconcile(self, ctx: Any) -> None:
        self.ran = True


def test_the_lease_is_renewed_until_the_last_pass_ends(api: client.ApiClient) -> None:
    """Stop during a pass longer than the lease: the lease loop keeps renewing until the reconcile loop
    has ended (before: it stopped at once, the pass found the lease expired and the process exited 1)."""
    slow = _Slow(seconds=2.5)
    lost: list[str] = []
    process = build(api, identity="stopper", lease_duration=2, renew_interval=0.2, on_lost=lost.append,
                    reconcilers=[slow])
    process.start(watch_policies=False)
    process.run_in_thread()
    assert slow.started.wait(20)
    process.stop(release=True)
    assert lost == [] and slow.leader_after is True
    lease = get_lease(api, "kubeon-gpu", "kubeon-gpu-optimizer")
    assert lease is not None and not lease.holder, "released after the pass"


def test_a_stop_during_a_pass_runs_no_further_reconciler(api: client.ApiClient) -> None:
    first, second = _StopsTheProcess(), _Records()
    process = build(api, identity="stopper", reconcilers=[first, second], on_lost=lambda _: None)
    first.process = process
    process.start(watch_policies=False)
    wait_until = time.monotonic() + 20
    while not process.elector.is_leader() and time.monotonic() < wait_until:
        time.sleep(0.05)
    process.run()  # returns once the stop is seen
    process.stop()
    assert not second.ran, "the reconciler after the stop must not run"
