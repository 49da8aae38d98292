"""The controller frame against the real API server: lease election, policy sync and status, mode gating.

Real: the control plane (tests/cluster): kube-apiserver with the chart's GpuPolicy CRD (its CEL rules
enforced), ServiceAccounts and RBAC; kube-controller-manager's ReplicaSets making the Deployments' pods;
the default scheduler and KWOK running them on a GPU node; the Eviction API. The controller's Lease
loop, policy store, status writer, recorder (Events) and the right-sizing reconciler run in this
process, authenticated as the chart's controller ServiceAccount; the API server's audit log says
which writes it sent. Faked: the clock (`FakeClock`, so lease expiry is exact) and the metrics source
(`ScriptedMetrics`, scripted DCGM series; the real Prometheus path is covered by the scale-to-zero
tests with tests/promharness).
"""

from __future__ import annotations

import copy
import logging
import time
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from controller.command import ControllerProcess, build
from controller.leader import LeaderElector
from controller.policysync import PolicySync
from controller.rightsizing import RightSizingReconciler
from gpupolicy.model import Mode
from gpupolicy.modes import parse_components
from kube.leases import LeaseConflict, get_lease, replace_lease
from tests.cluster.objects import make_pdb
from tests.controller.conftest import (
    CONTROLLER_CLUSTER,
    POLICY_CRD,
    FakeClock,
    Scene,
    ScriptedMetrics,
    make_deployment,
    make_policy,
)

CLUSTER = CONTROLLER_CLUSTER
DAY = 86400.0
GIB = 1024.0
LEASE = "kubeon-gpu-optimizer"
EVENTS = "default"  # Events about GpuPolicies (cluster-scoped) live here, where the API server keeps them
CRD_NAME = POLICY_CRD.name.removesuffix(".yaml")


# -- helpers ------------------------------------------------------------------------
def policy(scene: Scene, name: str, body: dict[str, Any], mode: str | None = None,
           approvals: list[str] | None = None) -> dict[str, Any]:
    """A GpuPolicy selecting only the test's namespace, created."""
    return scene.create(make_policy(name, body, mode=mode, approvals=approvals,
                                    selector={"namespaces": [scene.namespace]}))


def deploy(scene: Scene, name: str, replicas: int = 1) -> dict[str, Any]:
    return scene.create(make_deployment(name, scene.namespace, replicas=replicas))


def policy_object(scene: Scene, name: str) -> dict[str, Any]:
    return dict(client.CustomObjectsApi(scene.admin).get_cluster_custom_object(
        "gpu.kubeon.io", "v1alpha1", "gpupolicies", name))


def policy_status(scene: Scene, name: str) -> dict[str, Any]:
    return dict(policy_object(scene, name).get("status") or {})


def policy_events(scene: Scene, name: str, reason: str | None = None) -> list[dict[str, Any]]:
    """Events about this test's GpuPolicy `name` (by uid: an earlier test's policy may have had its name)."""
    uid = policy_object(scene, name)["metadata"]["uid"]
    return [e for e in scene.cluster.events(EVENTS, reason)
            if e["involvedObject"].get("kind") == "GpuPolicy" and e["involvedObject"].get("uid") == uid]


def invalid_events(scene: Scene) -> list[dict[str, Any]]:
    return [e for e in policy_events(scene, "broken", "InvalidSpec") if e["type"] == "Warning"]


def generations(scene: Scene, names: Any) -> dict[str, int]:
    """metadata.generation of the scene's Deployments: it moves only when something writes their spec
    (their status, which kube-controller-manager keeps writing, does not move it)."""
    apps = client.AppsV1Api(scene.admin)
    return {n: apps.read_namespaced_deployment(n, scene.namespace).metadata.generation for n in names}


def workload_writes(scene: Scene) -> list[tuple[str, str]]:
    """The controller's writes to Deployments/StatefulSets (and their subresources), from the audit log."""
    return [w for w in scene.writes() if w[1].startswith("/apis/apps/")]


def pods(scene: Scene, app: str) -> set[str]:
    """Names of the app's pods not being deleted."""
    return {p["metadata"]["name"] for p in scene.cluster.pods(scene.namespace, f"app={app}")}


def running(scene: Scene, app: str, count: int) -> set[str]:
    """Wait until `count` pods of the app run (its ReplicaSet made them, KWOK runs them); their names."""
    def ready() -> set[str] | None:
        names = {p["metadata"]["name"] for p in scene.cluster.pods(scene.namespace, f"app={app}", ready=True)}
        return names if len(names) == count and len(pods(scene, app)) == count else None

    return set(scene.cluster.wait_for(ready, timeout=60, message=f"{count} running pod(s) of {app}"))


def scaler_binding_namespaces(scene: Scene) -> set[str]:
    bindings = client.RbacAuthorizationV1Api(scene.admin).list_role_binding_for_all_namespaces().items
    return {b.metadata.namespace for b in bindings if b.metadata.name == "kubeon-gpu-optimizer-scaler"}


def condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in status.get("conditions", []) if c["type"] == kind)


def script_usage(metrics: ScriptedMetrics, clock: FakeClock, namespace: str, deploy_name: str, peak_mib: float,
                 host: str, days: float = 7.0, util: float = 12.0) -> None:
    """A week of DCGM series for one pod of `deploy_name` on node `host`, with one memory peak."""
    end = clock.now()
    start = end - days * DAY
    labels = {"namespace": namespace, "pod": f"{deploy_name}-7f9c5d-x2k4q", "Hostname": host,
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


def replica(scene: Scene, clock: FakeClock, metrics: ScriptedMetrics | None, identity: str,
            lost: list[str] | None = None, mode: Mode = Mode.RECOMMEND) -> ControllerProcess:
    """One controller replica in this process, as the chart's ServiceAccount."""
    return build(
        scene.controller, identity=identity, clock=clock, metrics=metrics, default_mode=mode,
        prometheus_url="http://prometheus.test" if metrics is not None else None,
        on_lost=(lambda reason: (lost.append(reason) if lost is not None else None)),
        reconcilers=[PolicySync(), RightSizingReconciler()],
    )


def stored_before_the_rule(scene: Scene, obj: dict[str, Any]) -> None:
    """Store a policy the CRD's CEL rule on spec refuses, as one stored before that rule existed: the
    CRD without the rule, the policy created, the CRD as the chart ships it again (the API server keeps
    what it stored; it checks rules on writes only)."""
    ext = client.ApiextensionsV1Api(scene.admin)
    shipped = scene.admin.sanitize_for_serialization(ext.read_custom_resource_definition(CRD_NAME))
    older = copy.deepcopy(shipped)
    spec_schema = older["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    del spec_schema["x-kubernetes-validations"]
    ext.replace_custom_resource_definition(CRD_NAME, older)
    custom = client.CustomObjectsApi(scene.admin)

    def created() -> bool:
        try:
            custom.create_cluster_custom_object("gpu.kubeon.io", "v1alpha1", "gpupolicies", obj)
            return True
        except ApiException as error:
            if error.status != 422:  # the API server may still serve the old schema for a moment
                raise
            return False

    try:
        scene.cluster.wait_for(created, timeout=30, message="the policy stored without the rule")
    finally:
        current = ext.read_custom_resource_definition(CRD_NAME)
        shipped["metadata"] = {"name": CRD_NAME, "resourceVersion": current.metadata.resource_version}
        ext.replace_custom_resource_definition(CRD_NAME, shipped)

    def refused_again() -> bool:
        probe = {**obj, "metadata": {"name": f"{obj['metadata']['name']}-probe"}}
        try:
            custom.create_cluster_custom_object("gpu.kubeon.io", "v1alpha1", "gpupolicies", probe, dry_run="All")
            return False
        except ApiException as error:
            return error.status == 422

    scene.cluster.wait_for(refused_again, timeout=30, message="the CRD's rule back")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


# -- leader election ---------------------------------------------------------------
def elector(scene: Scene, clock: FakeClock, identity: str, lost: list[str]) -> LeaderElector:
    return LeaderElector(scene.controller, "kubeon-gpu", LEASE, identity, clock, lease_duration=15, renew_interval=5,
                         on_lost=lost.append)


def test_two_replicas_exactly_one_leads(scene: Scene, clock: FakeClock) -> None:
    lost: list[str] = []
    a, b = elector(scene, clock, "a", lost), elector(scene, clock, "b", lost)
    assert a.step() is True
    assert b.step() is False
    clock.advance(5)
    assert a.step() is True and b.step() is False
    lease = get_lease(scene.admin, "kubeon-gpu", LEASE)
    assert lease is not None and lease.holder == "a" and lease.transitions == 0
    assert lease.lease_duration_seconds == 15
    assert lease.renew_time == pytest.approx(clock.now(), abs=1e-3)
    assert [a.is_leader(), b.is_leader()] == [True, False] and not lost


def test_expired_lease_is_taken_over_and_the_old_holder_stops(scene: Scene, clock: FakeClock) -> None:
    lost: list[str] = []
    a, b = elector(scene, clock, "a", lost), elector(scene, clock, "b", lost)
    assert a.step()
    clock.advance(10)
    assert not b.step(), "a lease renewed 10 s ago (duration 15 s) is not free"
    clock.advance(6)  # a failed to renew: 16 s since its last renewal
    assert a.is_leader() is False, "a must stop acting once its own lease has expired"
    assert lost and "expired" in lost[0]
    assert b.step() is True
    lease = get_lease(scene.admin, "kubeon-gpu", LEASE)
    assert lease is not None and lease.holder == "b" and lease.transitions == 1
    assert lease.acquire_time == pytest.approx(clock.now(), abs=1e-3)
    assert a.step() is False, "a replica that lost the lease does not quietly resume"


def test_a_replica_whose_lease_is_stolen_stops(scene: Scene, clock: FakeClock) -> None:
    lost: list[str] = []
    a = elector(scene, clock, "a", lost)
    assert a.step()
    current = get_lease(scene.admin, "kubeon-gpu", LEASE)
    assert current is not None
    replace_lease(scene.admin, current, "intruder", 15, clock.now(), clock.now(), current.transitions + 1)
    clock.advance(5)
    assert a.step() is False
    assert a.is_leader() is False
    assert lost == ["lease now held by intruder"]


def test_lease_writes_are_conditional_on_resource_version(scene: Scene, clock: FakeClock) -> None:
    lost: list[str] = []
    assert elector(scene, clock, "a", lost).step()
    stale = get_lease(scene.controller, "kubeon-gpu", LEASE)
    assert stale is not None
    replace_lease(scene.controller, stale, "a", 15, clock.now(), clock.now() + 1, 0)
    with pytest.raises(LeaseConflict):
        replace_lease(scene.controller, stale, "b", 15, clock.now(), clock.now() + 2, 1)


def test_only_the_leader_reconciles(scene: Scene, clock: FakeClock) -> None:
    metrics = ScriptedMetrics()
    node = scene.node("gpu-1")
    deploy(scene, "llm")
    policy(scene, "share", {"sharing": {"strategy": "MIG", "rollout": "Restart"}}, mode="Automatic")
    script_usage(metrics, clock, scene.namespace, "llm", 7.1 * GIB, node)
    (old_pod,) = running(scene, "llm", 1)
    before = generations(scene, ["llm"])
    lost: list[str] = []
    one, two = replica(scene, clock, metrics, "one", lost), replica(scene, clock, metrics, "two", lost)
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
    scene.cluster.wait_for(lambda: old_pod not in pods(scene, "llm"), timeout=30,
                           message="the restart evicting the running pod (Eviction API)")
    assert generations(scene, ["llm"]) == before and workload_writes(scene) == [], "the workload is never written"
    record = policy_status(scene, "share")["restarts"][f"Deployment/{scene.namespace}/llm"]
    assert record["pods"] and record["proposal"] == policy_status(scene, "share")["proposals"][0]["id"]


# -- policy sync and status ----------------------------------------------------------
def test_status_has_stable_proposals_and_is_written_only_on_change(
    scene: Scene, clock: FakeClock, caplog: pytest.LogCaptureFixture,
) -> None:
    metrics = ScriptedMetrics()
    node = scene.node("gpu-1")
    deploy(scene, "llm", replicas=2)
    policy(scene, "share", {"sharing": {"strategy": "MIG"}})
    policy(scene, "guard", {"guardrail": {"maxGpusPerPod": 4}})
    # Two bodies: the CRD's CEL rule refuses it today; one stored before the rule (an upgrade from a
    # version without it) is still there, and the controller must say so rather than act on it.
    stored_before_the_rule(scene, make_policy("broken", {"guardrail": {}, "packing": {}},
                                              selector={"namespaces": [scene.namespace]}))
    script_usage(metrics, clock, scene.namespace, "llm", 7.1 * GIB, node)
    r = replica(scene, clock, metrics, "one")
    assert r.elector.step()
    with caplog.at_level(logging.INFO, logger="controller.policysync"):
        r.runner.run_all()
    assert "policies read count=3" in caplog.text and "source of truth" in caplog.text
    assert "policies synced" not in caplog.text, "nothing was pulled from a hub"
    status = policy_status(scene, "share")
    assert status["effectiveMode"] == "Recommend"
    assert status["observedGeneration"] == 1
    assert condition(status, "Valid")["status"] == "True"
    assert condition(status, "Ready")["status"] == "True"
    assert condition(status, "Degraded")["status"] == "False"
    [proposal] = status["proposals"]
    assert proposal["target"] == f"Deployment/{scene.namespace}/llm"
    assert proposal["action"] == "nvidia.com/gpu=1 → nvidia.com/mig-1g.10gb"
    assert "(A100-80GB, peak 7.1 GiB, p95 util 12%)" in proposal["reason"]
    assert proposal["estimatedGpuHoursPerMonth"] == pytest.approx(round(2 * 6 / 7 * 730, 1))
    assert proposal["state"] == "Proposed"
    broken = policy_status(scene, "broken")
    assert condition(broken, "Valid")["status"] == "False"
    assert "exactly one of" in condition(broken, "Valid")["message"]
    assert condition(status, "Valid")["status"] == "True", "only the broken policy is reported"
    assert [e["message"] for e in invalid_events(scene)] == [
        "policy skipped, fix the spec: spec: Value error, exactly one of sharing, scaleToZero, packing, "
        "typeFit, capacity, guardrail must be set (found: packing, guardrail)"]
    writes = r.metrics.status_writes._value.get()

    clock.advance(600)
    r.elector.step()
    r.runner.run_all()
    assert r.metrics.status_writes._value.get() == writes, "an unchanged status must not be rewritten"
    assert len(invalid_events(scene)) == 1, "one Event per error, not one per resync"

    restarted = replica(scene, clock, metrics, "one")  # a new process, same identity: ids survive
    restarted.elector.step()
    restarted.runner.run_all()
    assert policy_status(scene, "share")["proposals"][0]["id"] == proposal["id"]


def test_without_prometheus_metric_policies_stay_recommend(scene: Scene, clock: FakeClock) -> None:
    deploy(scene, "llm")
    policy(scene, "share", {"sharing": {"strategy": "MIG"}}, mode="Automatic")
    before = generations(scene, ["llm"])
    r = replica(scene, clock, None, "one")
    r.elector.step()
    r.runner.run_all()
    status = policy_status(scene, "share")
    assert status["effectiveMode"] == "Recommend"
    degraded = condition(status, "Degraded")
    assert degraded["status"] == "True" and "--prometheus-url" in degraded["message"]
    assert generations(scene, ["llm"]) == before and workload_writes(scene) == []


def test_status_shows_requested_and_effective_mode(scene: Scene, clock: FakeClock) -> None:
    """`kubectl get gpupolicies` MODE is status.effectiveMode, REQUESTED status.requestedMode."""
    policy(scene, "share", {"sharing": {"strategy": "MIG"}}, mode="Automatic")
    policy(scene, "guard", {"guardrail": {"maxGpusPerPod": 4}})
    r = replica(scene, clock, None, "one", mode=Mode.APPROVE)
    r.elector.step()
    r.runner.run_all()
    share = policy_status(scene, "share")
    assert (share["requestedMode"], share["effectiveMode"]) == ("Automatic", "Recommend")
    assert condition(share, "Degraded")["reason"] == "PrometheusNotConfigured"
    guard = policy_status(scene, "guard")
    assert (guard["requestedMode"], guard["effectiveMode"]) == ("Approve", "Approve")
    assert condition(guard, "Degraded")["status"] == "False"
    columns = scene.cluster.kubectl("get", "gpupolicies", "share", "--no-headers").stdout.split()
    assert columns[:3] == ["share", "Recommend", "Automatic"], columns


CAPACITY = {"capacity": {"nodePool": "gpu", "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass",
                                                               "name": "gpu"}}}


def test_kinds_nothing_acts_on_are_not_ready(scene: Scene, clock: FakeClock) -> None:
    """A packing policy without the extender says so: Ready=False with ControllerDisabled, never
    Reconciled (every capacity.provider the chart accepts is implemented: gpupolicy/modes.py)."""
    policy(scene, "pack", {"packing": {"strategy": "bestfit"}})
    policy(scene, "guard", {"guardrail": {"maxGpusPerPod": 4}})
    r = build(scene.controller, identity="one", clock=clock, reconcilers=[PolicySync()],
              components=parse_components("webhook"), capacity_provider="aks-nodepools")
    r.elector.step()
    r.runner.run_all()
    pack = condition(policy_status(scene, "pack"), "Ready")
    assert (pack["status"], pack["reason"]) == ("False", "ControllerDisabled") and "extender" in pack["message"]
    guard = condition(policy_status(scene, "guard"), "Ready")
    assert (guard["status"], guard["reason"]) == ("True", "Reconciled") and "webhook" in guard["message"]


def test_a_capacity_policy_under_karpenter_is_handled_by_the_controller(scene: Scene, clock: FakeClock) -> None:
    policy(scene, "grow", CAPACITY)
    r = build(scene.controller, identity="one", clock=clock, reconcilers=[PolicySync()],
              components=parse_components("webhook"))
    r.elector.step()
    r.runner.run_all()
    grow = condition(policy_status(scene, "grow"), "Ready")
    assert (grow["status"], grow["reason"]) == ("True", "Reconciled") and "controller" in grow["message"]


def test_no_data_for_the_whole_window_means_no_proposal(scene: Scene, clock: FakeClock) -> None:
    metrics = ScriptedMetrics()
    node = scene.node("gpu-1")
    deploy(scene, "llm")
    policy(scene, "share", {"sharing": {"strategy": "MIG"}}, mode="Automatic")
    script_usage(metrics, clock, scene.namespace, "llm", 7.1 * GIB, node, days=2)
    r = replica(scene, clock, metrics, "one")
    r.elector.step()
    r.runner.run_all()
    status = policy_status(scene, "share")
    assert status.get("proposals", []) == []
    rs = condition(status, "RightSizing")
    assert rs["status"] == "False" and rs["reason"] == "InsufficientData"
    assert "start of the window" in rs["message"]
    assert not r.ctx.recorder.applied_log


# -- mode gating -----------------------------------------------------------------------
WORKLOADS = ("llm", "embed", "rerank")


def _three_workloads(scene: Scene, metrics: ScriptedMetrics, clock: FakeClock) -> dict[str, int]:
    node = scene.node("gpu-1")
    for name in WORKLOADS:
        deploy(scene, name)
        script_usage(metrics, clock, scene.namespace, name, 7.1 * GIB, node)
    return generations(scene, WORKLOADS)


def test_recommend_writes_nothing_to_any_workload(scene: Scene, clock: FakeClock) -> None:
    metrics = ScriptedMetrics()
    versions = _three_workloads(scene, metrics, clock)
    ns = scene.namespace
    policy(scene, "share", {"sharing": {"strategy": "MIG", "rollout": "Restart"}}, mode="Recommend",
           approvals=[f"Deployment/{ns}/llm"])
    r = replica(scene, clock, metrics, "one")
    run_passes(r, clock, passes=2, seconds=60)
    assert generations(scene, WORKLOADS) == versions and workload_writes(scene) == []
    states = {p["target"]: p["state"] for p in policy_status(scene, "share")["proposals"]}
    assert states == {f"Deployment/{ns}/llm": "Approved", f"Deployment/{ns}/embed": "Proposed",
                      f"Deployment/{ns}/rerank": "Proposed"}
    assert not r.ctx.recorder.applied_log
    assert scaler_binding_namespaces(scene) == set(), "Recommend never writes, so it is granted nothing"
    assert [w for w in scene.writes() if "/eviction" in w[1]] == []


def test_automatic_without_restart_never_writes_the_workload(scene: Scene, clock: FakeClock) -> None:
    """Without rollout: Restart the webhook does the change on new pods; the controller only records it."""
    metrics = ScriptedMetrics()
    versions = _three_workloads(scene, metrics, clock)
    policy(scene, "share", {"sharing": {"strategy": "MIG"}}, mode="Automatic")
    r = replica(scene, clock, metrics, "one")
    run_passes(r, clock, passes=3, seconds=600)
    assert generations(scene, WORKLOADS) == versions and workload_writes(scene) == []
    proposals = policy_status(scene, "share")["proposals"]
    assert {(p["state"], p["resource"]) for p in proposals} == {("Applied", "nvidia.com/mig-1g.10gb")}
    assert scaler_binding_namespaces(scene) == set(), "no Restart: no workload write access needed"
    assert len(r.ctx.recorder.applied_log) == 3, "one applied action per workload, never repeated"
    applied = policy_events(scene, "share", "GpuPolicyApplied")
    assert sorted(e["message"].split(":")[0] for e in applied) == sorted(
        f"Deployment/{scene.namespace}/{n}" for n in versions), "one Event per applied action"


def test_approve_applies_only_approved_targets_once(scene: Scene, clock: FakeClock) -> None:
    metrics = ScriptedMetrics()
    ns = scene.namespace
    node = scene.node("gpu-1")
    for name, replicas in (("llm", 2), ("embed", 1), ("rerank", 1)):
        deploy(scene, name, replicas)
        script_usage(metrics, clock, ns, name, 7.1 * GIB, node)
    versions = generations(scene, WORKLOADS)
    policy(scene, "share", {"sharing": {"strategy": "MIG", "rollout": "Restart"}}, mode="Approve",
           approvals=[f"Deployment/{ns}/llm"])
    old_pods = running(scene, "llm", 2)
    (other_pod,) = running(scene, "embed", 1)
    r = replica(scene, clock, metrics, "one")
    r.elector.step()
    r.runner.run_all()
    # pass 1: status first (Applied, with the resource the webhook will use); no workload written yet
    first = {p["target"]: p for p in policy_status(scene, "share")["proposals"]}
    assert first[f"Deployment/{ns}/llm"]["state"] == "Applied"
    assert first[f"Deployment/{ns}/llm"]["resource"] == "nvidia.com/mig-1g.10gb"
    assert first[f"Deployment/{ns}/embed"]["resource"] == "nvidia.com/mig-1g.10gb"
    assert [w for w in scene.writes() if "/eviction" in w[1]] == [], "nothing evicted before the status was read back"
    assert pods(scene, "llm") == old_pods
    assert scaler_binding_namespaces(scene) == set(), "Restart evicts through the Eviction API: no workload write"
    # pass 2: the status was read back Applied: now the one restart (2 replicas: one eviction per pass)
    clock.advance(600)
    r.elector.step()
    r.runner.run_all()
    assert generations(scene, WORKLOADS) == versions, "the restart never writes a workload"
    scene.cluster.wait_for(lambda: len(pods(scene, "llm") & old_pods) == 1, timeout=30, message="one old pod gone")
    assert other_pod in pods(scene, "embed")
    record = policy_status(scene, "share")["restarts"][f"Deployment/{ns}/llm"]
    assert record["undo"]["restartedAt"] == record["startedAt"]
    restarting = condition(policy_status(scene, "share"), "RightSizing")
    assert "restart in progress, 1 pod(s)" in restarting["message"]
    states = {p["target"]: p["state"] for p in policy_status(scene, "share")["proposals"]}
    assert states[f"Deployment/{ns}/llm"] == "Applied"
    assert states[f"Deployment/{ns}/embed"] == "Proposed"
    replacement = running(scene, "llm", 2) - old_pods  # the ReplicaSet's (the webhook would size it)
    assert len(replacement) == 1

    # a new process (crash after the record, before anything else) finishes the same restart, never a second
    clock.advance(3600)
    again = replica(scene, clock, metrics, "one")
    again.elector.step()
    again.runner.run_all()
    scene.cluster.wait_for(lambda: not pods(scene, "llm") & old_pods, timeout=30, message="the last old pod gone")
    assert replacement <= pods(scene, "llm"), "the replacement stays"
    assert policy_status(scene, "share")["restarts"][f"Deployment/{ns}/llm"] == record
    assert not again.ctx.recorder.applied_log
    settled = running(scene, "llm", 2)
    clock.advance(3600)
    again.elector.step()
    again.runner.run_all()
    assert pods(scene, "llm") == settled, "no pod made after the restart began is evicted"
    assert generations(scene, WORKLOADS) == versions
    assert workload_writes(scene) == [], "no write on any workload"
    evictions = [(m, p) for m, p in scene.writes() if p.endswith("/eviction")]
    assert {m for m, _ in evictions} == {"POST"}
    assert sorted(p.split("/")[-2] for _, p in evictions) == sorted(old_pods), "each old pod evicted once"

    assert [w for w in scene.writes() if w[1].startswith(f"/api/v1/namespaces/{ns}/events")] == [], (
        "no Event written in the workload's namespace (no Event RBAC there)")
    assert any(e["message"].startswith(f"Deployment/{ns}/llm: ")
               for e in policy_events(scene, "share", "GpuPolicyApplied"))
    assert r.metrics.actions.labels(policy="share", action="rightsize")._value.get() == 1


def evictions(scene: Scene, at_least: int = 0) -> list[tuple[str, int]]:
    """(pod, status code) of each eviction the controller asked for, from the audit log (kube-apiserver
    writes a request's line as its answer goes out: wait for `at_least` of them)."""
    def found() -> tuple[list[tuple[str, int]]] | None:
        asked = [(path.split("/")[-2], code) for verb, path, code in scene.answered()
                 if verb == "POST" and path.endswith("/eviction")]
        return (asked,) if len(asked) >= at_least else None

    return list(scene.cluster.wait_for(found, timeout=10, message=f"{at_least} eviction(s) in the audit log")[0])


def pdb_allows(scene: Scene, name: str, allowed: int) -> None:
    """Wait until the disruption controller has computed the budget (status at the PDB's generation)."""
    def computed() -> bool:
        pdb = scene.admin.sanitize_for_serialization(
            client.PolicyV1Api(scene.admin).read_namespaced_pod_disruption_budget(name, scene.namespace))
        status = pdb.get("status") or {}
        return (status.get("observedGeneration") == pdb["metadata"]["generation"]
                and status.get("disruptionsAllowed") == allowed)
    scene.cluster.wait_for(computed, timeout=60, message=f"PDB {name} allowing {allowed} disruption(s)")


def test_a_restart_a_pdb_blocks_waits_on_its_429s_and_finishes_once_the_budget_allows(
    scene: Scene, clock: FakeClock,
) -> None:
    """rollout: Restart through the Eviction API against the real disruption controller: while the budget
    allows nothing, each pass asks once, gets 429 and stops (never a second ask in the same pass, never a
    pod deleted around the budget); once it allows one disruption at a time, one old pod goes per pass, the
    next only when the ReplicaSet's replacement is Ready again, until none of them is left."""
    metrics = ScriptedMetrics()
    ns = scene.namespace
    node = scene.node("gpu-1")
    deploy(scene, "llm", 2)
    script_usage(metrics, clock, ns, "llm", 7.1 * GIB, node)
    scene.create(make_pdb("llm", ns, match_labels={"app": "llm"}, max_unavailable=0))
    policy(scene, "share", {"sharing": {"strategy": "MIG", "rollout": "Restart"}}, mode="Automatic")
    old = running(scene, "llm", 2)
    pdb_allows(scene, "llm", 0)
    r = replica(scene, clock, metrics, "one")
    for passes in range(1, 4):  # 1: Applied; 2: the record, then the first ask; 3: the second ask
        run_passes(r, clock, passes=1, seconds=600)
        asked = evictions(scene, at_least=passes - 1)
        assert len(asked) == passes - 1, f"one ask per pass, stopped by the first refusal: {asked}"
    assert evictions(scene) == [(sorted(old)[0], 429)] * 2
    assert pods(scene, "llm") == old, "nothing evicted around the budget"
    assert "restart in progress, 2 pod(s)" in condition(policy_status(scene, "share"), "RightSizing")["message"]

    client.PolicyV1Api(scene.admin).patch_namespaced_pod_disruption_budget(
        "llm", ns, {"spec": {"maxUnavailable": 1}}, _content_type="application/merge-patch+json")
    pdb_allows(scene, "llm", 1)

    def restarted() -> bool:
        run_passes(r, clock, passes=1, seconds=600)
        ready = {p["metadata"]["name"] for p in scene.cluster.pods(ns, "app=llm", ready=True)}
        return not pods(scene, "llm") & old and len(ready) == 2

    scene.cluster.wait_for(restarted, timeout=120, message="every old pod replaced")
    accepted = [pod for pod, code in evictions(scene, at_least=4) if code == 201]
    assert sorted(accepted) == sorted(old), "each old pod evicted once, when the budget allowed it"
    assert {code for _, code in evictions(scene)} <= {201, 429}
    assert workload_writes(scene) == [], "the restart never writes the workload"


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


def test_the_lease_is_renewed_until_the_last_pass_ends(scene: Scene) -> None:
    """Stop during a pass longer than the lease: the lease loop keeps renewing until the reconcile loop
    has ended (before: it stopped at once, the pass found the lease expired and the process exited 1)."""
    slow = _Slow(seconds=2.5)
    lost: list[str] = []
    process = build(scene.controller, identity="stopper", lease_duration=2, renew_interval=0.2, on_lost=lost.append,
                    reconcilers=[slow])
    process.start(watch_policies=False)
    process.run_in_thread()
    assert slow.started.wait(20)
    process.stop(release=True)
    assert lost == [] and slow.leader_after is True
    lease = get_lease(scene.admin, "kubeon-gpu", "kubeon-gpu-optimizer")
    assert lease is not None and not lease.holder, "released after the pass"


def test_a_stop_during_a_pass_runs_no_further_reconciler(scene: Scene) -> None:
    first, second = _StopsTheProcess(), _Records()
    process = build(scene.controller, identity="stopper", reconcilers=[first, second], on_lost=lambda _: None)
    first.process = process
    process.start(watch_policies=False)
    wait_until = time.monotonic() + 20
    while not process.elector.is_leader() and time.monotonic() < wait_until:
        time.sleep(0.05)
    process.run()  # returns once the stop is seen
    process.stop()
    assert not second.ran, "the reconciler after the stop must not run"
