"""Scale to zero end to end: real Prometheus + the real API server + the frame's runner and context.

Real: /usr/bin/prometheus scraping the scripted DCGM exporter every 1 s, with
idle/busy history backfilled by promtool (so a 60 s idleFor window is full at
once); the control plane (tests/cluster) with the chart's GpuPolicy CRD, RBAC
and ServiceAccounts and the KEDA ScaledObject CRD, kube-controller-manager
running the Deployments; the frame's PolicySync, PolicyStore, Recorder and
ReconcileRunner and the ScaleToZeroReconciler, authenticated as the chart's
controller ServiceAccount, so each scale goes through the scaler RoleBinding
the controller made itself (RBAC delegation by `bind`). Applied actions are
also checked as the core/v1 Events read back from the API server (on the
GpuPolicy in `default`, where the API server keeps a cluster-scoped object's),
and its writes in the API server's audit log. Faked: the GPUs (scripted
series), leadership (always leader), KEDA's operator (the test scales a paused
target itself), and a crash (a checkpoint hook raising after a write).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client

from controller.loop import ReconcileRunner
from controller.policysync import PolicySync
from controller.scaletozero import ScaleToZeroReconciler
from gpupolicy.scaling import scaletozero as core
from kube import scale as kscale
from tests.cluster.cluster import Cluster
from tests.controller.conftest import CONTROLLER_CLUSTER, KEDA_CRD, Scene, install_crds, make_deployment
from tests.controller.conftest_scale import scale_context
from tests.promharness import DcgmExporter, PrometheusServer, constant, gpu_labels, replay

# keda.enabled=true: these tests drive KEDA ScaledObjects (the context runs as `--keda`); the chart then
# grants the controller list/watch on them and the scaler their writes.
CLUSTER = {**CONTROLLER_CLUSTER, "kubeon_sets": ("keda.enabled=true",)}
UTIL = "DCGM_FI_DEV_GPU_UTIL"
WAKE_QUERY = 'sum(queue_depth{service="llm"})'
POLICY_EVENT_NAMESPACE = "default"  # Events about cluster-scoped objects: the API server keeps them only here
OURS = "kubeon-gpu-controller"  # the Events' source component


@pytest.fixture(scope="module", autouse=True)
def keda_crd(kube_cluster: Cluster) -> None:
    install_crds(kube_cluster, KEDA_CRD)


@pytest.fixture
def ml(scene: Scene) -> Iterator[str]:
    """A second namespace for the test."""
    name = scene.cluster.ensure_namespace(f"{scene.namespace}-ml")
    yield name
    scene.cluster.delete_namespace(name)


# -- builders -------------------------------------------------------------------------
def policy(name: str = "idle-gpus", mode: str = "Automatic", *, namespaces: tuple[str, ...], wake: bool = True,
           approvals: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"namespaces": list(namespaces), "idleBelowPercent": 5, "idleFor": "60s", **extra}
    if wake:
        body["wake"] = {"prometheusQuery": WAKE_QUERY, "above": 0}
    spec: dict[str, Any] = {"mode": mode, "scaleToZero": body}
    if approvals is not None:
        spec["approvals"] = approvals
    return {"apiVersion": "gpu.kubeon.io/v1alpha1", "kind": "GpuPolicy", "metadata": {"name": name}, "spec": spec}


def create(api: client.ApiClient, obj: dict[str, Any]) -> None:
    """Create as the caller `api` (the tests: an admin; a user sets the scene)."""
    if obj["kind"] == "GpuPolicy":
        client.CustomObjectsApi(api).create_cluster_custom_object("gpu.kubeon.io", "v1alpha1", "gpupolicies", obj)
    elif obj["kind"] == "ScaledObject":
        kscale.create_scaled_object(api, obj)
    else:
        apps = client.AppsV1Api(api)
        ns = obj["metadata"]["namespace"]
        if obj["kind"] == "Deployment":
            apps.create_namespaced_deployment(ns, obj)
        else:
            apps.create_namespaced_stateful_set(ns, obj)


def workload(api: client.ApiClient, name: str, ns: str) -> dict[str, Any]:
    return api.sanitize_for_serialization(  # type: ignore[no-any-return]
        client.AppsV1Api(api).read_namespaced_deployment(name, ns))


def generation(api: client.ApiClient, name: str, ns: str) -> int:
    """metadata.generation: moves on each write of the spec (replicas through /scale included), never on
    the status kube-controller-manager keeps writing."""
    return int(workload(api, name, ns)["metadata"]["generation"])


def annotations(obj: dict[str, Any]) -> dict[str, str]:
    return dict(obj["metadata"].get("annotations") or {})


def deploy(api: client.ApiClient, name: str, replicas: int = 3, *, ns: str, **annotations: str) -> None:
    obj = make_deployment(name, namespace=ns, replicas=replicas)
    if annotations:
        obj["metadata"]["annotations"] = dict(annotations)  # type: ignore[index]
    create(api, obj)


def pod(name: str) -> str:
    return f"{name}-7d9f6c8b5-x2b4z"


def script_gpu(exporter: DcgmExporter, name: str, script: Any, *, ns: str) -> None:
    exporter.put(UTIL, gpu_labels(namespace=ns, pod=pod(name)), script)


def policy_status(api: client.ApiClient, name: str = "idle-gpus") -> dict[str, Any]:
    obj = client.CustomObjectsApi(api).get_cluster_custom_object("gpu.kubeon.io", "v1alpha1", "gpupolicies", name)
    return dict(obj.get("status") or {})


def runner_for(scene: Scene, prom: PrometheusServer | None, **kw: Any) -> ReconcileRunner:
    ctx = scale_context(scene.controller, scene.admin, prom.url if prom else None)
    return ReconcileRunner(ctx, [PolicySync(), ScaleToZeroReconciler(step_seconds=2, max_gap_seconds=6, **kw)])


def parked_record(api: client.ApiClient, name: str, ns: str, policy_name: str = "idle-gpus",
                  kind: str = "Deployment") -> dict[str, Any] | None:
    """The policy's park record for a workload (status.parked), or None."""
    return (policy_status(api, policy_name).get("parked") or {}).get(f"{kind}/{ns}/{name}")


def ours_on(obj: dict[str, Any]) -> list[str]:
    """gpu.kubeon.io/ annotations the optimizer could have written on a workload (it writes none)."""
    return [k for k in annotations(obj) if k.startswith("gpu.kubeon.io/") and k != core.WAKE
            and k != core.DO_NOT_SCALE]


def workload_writes(scene: Scene) -> list[tuple[str, str]]:
    """The controller's writes to Deployments/StatefulSets, from the API server's audit log (the tests' own
    creates and a user's annotations are the admin's): the install guide grants it only their /scale."""
    return [(m, p) for m, p in scene.writes() if p.startswith("/apis/apps/")]


def bindings(api: client.ApiClient, *namespaces: str) -> set[str]:
    """Which of the test's `namespaces` have the scaler RoleBinding (an earlier test's namespace may still be
    terminating, its binding with it)."""
    return set(kscale.list_scaler_bindings(api)) & set(namespaces)


def policy_uid(api: client.ApiClient, name: str) -> str:
    obj = client.CustomObjectsApi(api).get_cluster_custom_object("gpu.kubeon.io", "v1alpha1", "gpupolicies", name)
    return str(obj["metadata"]["uid"])


def events_about(api: client.ApiClient, namespace: str, kind: str, name: str,
                 uid: str | None = None) -> list[tuple[str, str, str]]:
    """(reason, message, involvedObject.uid) of the optimizer's Events in `namespace` about `kind/name`
    (`uid`: that object only; kube-controller-manager's own Events on a Deployment are not ours)."""
    items = client.CoreV1Api(api).list_namespaced_event(namespace).items
    return [(e.reason, e.message, e.involved_object.uid) for e in items
            if e.involved_object.kind == kind and e.involved_object.name == name
            and (uid is None or e.involved_object.uid == uid) and e.source.component == OURS]


def messages(api: client.ApiClient, name: str, ns: str, policy_name: str = "idle-gpus") -> list[str]:
    """Messages of the policy's Events about Deployment `ns/name` (they start with its key)."""
    return [m for _, m, _ in events_about(api, POLICY_EVENT_NAMESPACE, "GpuPolicy", policy_name,
                                          policy_uid(api, policy_name))
            if m.startswith(f"Deployment/{ns}/{name}: ")]


def assert_applied_events(api: client.ApiClient, deployment: dict[str, Any], policy_name: str,
                          actions: list[str]) -> None:
    """Exactly one GpuPolicyApplied Event per action on the policy, naming the Deployment, and none of ours
    on the Deployment (its namespace is not the optimizer's: no Event RBAC there).

    Compared as multisets: two Events written in the same second have no defined list order.
    """
    meta = deployment["metadata"]
    key = f"Deployment/{meta['namespace']}/{meta['name']}"
    uid = policy_uid(api, policy_name)
    on_target = events_about(api, meta["namespace"], "Deployment", meta["name"])
    on_policy = [e for e in events_about(api, POLICY_EVENT_NAMESPACE, "GpuPolicy", policy_name, uid)
                 if e[1].startswith(f"{key}: ")]
    assert on_target == []
    for found, prefix in ((on_policy, f"{key}: "),):
        assert {reason for reason, _, _ in found} == {"GpuPolicyApplied"}, found
        assert all(message.startswith(prefix) for _, message, _ in found), found
        named = sorted(message[len(prefix):].split(": ", 1)[0] for _, message, _ in found)
        assert named == sorted(actions), found
        assert all(f": {key} " in message for _, message, _ in found), found


def settled(api: client.ApiClient, ns: str) -> None:
    """Wait until kube-controller-manager has caught up with every workload in `ns` (status at the spec's
    generation and replica count). Its status writes move the resourceVersion the controller's scale
    patch is conditional on: a pass overlapping one gets 409 and leaves the write to its next pass, as
    it should; a test that expects the write in this pass lets the workload settle first."""
    apps = client.AppsV1Api(api)

    def caught_up() -> bool:  # a StatefulSet makes its pods one by one, each once the last is Ready: no count
        deployments, sets = apps.list_namespaced_deployment(ns).items, apps.list_namespaced_stateful_set(ns).items
        return all(w.status is not None and w.status.observed_generation == w.metadata.generation
                   for w in [*deployments, *sets]) and all((d.status.replicas or 0) == d.spec.replicas
                                                           for d in deployments)

    deadline = time.monotonic() + 60
    while not caught_up():
        assert time.monotonic() < deadline, f"the workloads in {ns} did not settle"
        time.sleep(0.1)


def run_pass(runner: ReconcileRunner, api: client.ApiClient, *namespaces: str) -> None:
    """One controller pass once the workloads it may scale have settled."""
    for ns in namespaces:
        settled(api, ns)
    runner.run_all()


# -- tests ----------------------------------------------------------------------------
def test_idle_goes_to_zero_then_wakes_by_query(
    scene: Scene, dcgm_exporter: DcgmExporter, prometheus_factory: Callable[..., PrometheusServer],
) -> None:
    api, ns = scene.admin, scene.namespace
    deploy(api, "llm", 3, ns=ns)
    deploy(api, "nodata", 2, ns=ns)  # no series at all: no data is never idle
    create(api, policy(namespaces=(ns,)))
    script_gpu(dcgm_exporter, "llm", constant(1), ns=ns)
    dcgm_exporter.put("queue_depth", {"service": "llm"}, constant(0))
    prom = prometheus_factory(history=120)
    runner = runner_for(scene, prom)
    run_pass(runner, api, ns)

    parked = workload(api, "llm", ns)
    assert parked["spec"]["replicas"] == 0
    record = parked_record(api, "llm", ns)
    assert record is not None and record["replicas"] == 3
    assert record["scaledAt"] and record["undo"]["restoreReplicas"] == 3
    assert record["uid"] == parked["metadata"]["uid"]
    assert ours_on(parked) == [], "the park record is in the policy status, never on the workload"
    assert workload(api, "nodata", ns)["spec"]["replicas"] == 2
    assert parked_record(api, "nodata", ns) is None
    assert bindings(api, ns) == {ns}
    assert [e["action"].split(":")[0] for e in runner.ctx.recorder.applied_log] == ["ScaleToZero"]
    assert_applied_events(api, parked, "idle-gpus", ["ScaleToZero"])
    assert any(": ScaleToZero: " in m and " from 3 to 0 replicas" in m for m in messages(api, "llm", ns))
    status = policy_status(api)
    assert any(p["target"] == f"Deployment/{ns}/llm" and p["state"] == "Applied" for p in status["proposals"])

    run_pass(runner, api, ns)  # parked, no demand: nothing changes, never parked twice
    assert generation(api, "llm", ns) == parked["metadata"]["generation"]

    dcgm_exporter.put("queue_depth", {"service": "llm"}, constant(7))
    prom.wait_for(f"{WAKE_QUERY} > 0")
    run_pass(runner, api, ns)
    woken = workload(api, "llm", ns)
    assert woken["spec"]["replicas"] == 3
    assert parked_record(api, "llm", ns) is None and ours_on(woken) == []
    assert "Wake" in runner.ctx.recorder.applied_log[-1]["action"]
    assert_applied_events(api, woken, "idle-gpus", ["ScaleToZero", "Wake"])
    assert any(": Wake: " in m and " to 3 replicas" in m for m in messages(api, "llm", ns))
    assert events_about(api, ns, "Deployment", "nodata") == []
    scale = f"/apis/apps/v1/namespaces/{ns}/deployments/llm/scale"
    writes = scene.cluster.wait_for(lambda: len(w := workload_writes(scene)) >= 2 and w, timeout=10,
                                    message="the two scale writes in the audit log")
    assert writes == [("PATCH", scale)] * 2, "park and wake: the scale subresource only (deployments/scale patch)"


def test_wake_by_annotation_and_policy_without_wake_signal_warns(
    scene: Scene, dcgm_exporter: DcgmExporter, prometheus_factory: Callable[..., PrometheusServer],
) -> None:
    api, ns = scene.admin, scene.namespace
    deploy(api, "llm", 2, ns=ns)
    create(api, policy(wake=False, namespaces=(ns,)))
    script_gpu(dcgm_exporter, "llm", constant(0), ns=ns)
    prom = prometheus_factory(history=120, wait_scrape=False)
    runner = runner_for(scene, prom)
    run_pass(runner, api, ns)
    assert workload(api, "llm", ns)["spec"]["replicas"] == 0
    wake_condition = next(c for c in policy_status(api)["conditions"] if c["type"] == "WakeSignal")
    assert wake_condition["status"] == "False" and "annotation" in wake_condition["message"]

    client.AppsV1Api(api).patch_namespaced_deployment("llm", ns, {"metadata": {"annotations": {core.WAKE: "true"}}})
    run_pass(runner, api, ns)
    woken = workload(api, "llm", ns)
    assert woken["spec"]["replicas"] == 2
    assert parked_record(api, "llm", ns) is None and ours_on(woken) == []
    assert annotations(woken)[core.WAKE] == "true", "the user's annotation: the optimizer cannot remove it"
    assert_applied_events(api, woken, "idle-gpus", ["ScaleToZero", "Wake"])
    assert any(": Wake: " in m and " to 2 replicas" in m for m in messages(api, "llm", ns))
    run_pass(runner, api, ns)  # still idle, but held awake while the annotation is there
    assert workload(api, "llm", ns)["spec"]["replicas"] == 2
    client.AppsV1Api(api).patch_namespaced_deployment("llm", ns, {"metadata": {"annotations": {core.WAKE: None}}})
    run_pass(runner, api, ns)  # annotation removed: idle again, parked again
    assert workload(api, "llm", ns)["spec"]["replicas"] == 0 and (parked_record(api, "llm", ns) or {})["replicas"] == 2


def test_bursty_real_trace_is_not_idle_and_do_not_scale_is_skipped(
    scene: Scene, dcgm_exporter: DcgmExporter, prometheus_factory: Callable[..., PrometheusServer],
) -> None:
    api, ns = scene.admin, scene.namespace
    deploy(api, "bursty", 2, ns=ns)
    deploy(api, "pinned", 2, ns=ns, **{core.DO_NOT_SCALE: "true"})
    create(api, policy(namespaces=(ns,)))
    script_gpu(dcgm_exporter, "bursty", replay("bursty", time.time() - 600), ns=ns)
    script_gpu(dcgm_exporter, "pinned", constant(0), ns=ns)
    prom = prometheus_factory(history=120, wait_scrape=False)
    runner = runner_for(scene, prom)
    before = {n: generation(api, n, ns) for n in ("bursty", "pinned")}
    run_pass(runner, api, ns)
    assert {n: generation(api, n, ns) for n in ("bursty", "pinned")} == before
    assert workload_writes(scene) == []
    reconciler = runner.reconcilers[1]
    assert isinstance(reconciler, ScaleToZeroReconciler)
    assert reconciler.last_decisions[f"Deployment/{ns}/bursty"].reason is core.Reason.BUSY
    assert reconciler.last_decisions[f"Deployment/{ns}/pinned"].reason is core.Reason.DO_NOT_SCALE


def test_recommend_writes_nothing_approve_only_approved(
    scene: Scene, ml: str, dcgm_exporter: DcgmExporter, prometheus_factory: Callable[..., PrometheusServer],
) -> None:
    api, ns = scene.admin, scene.namespace
    for name in ("a", "b"):
        deploy(api, name, 2, ns=ns)
        deploy(api, name, 2, ns=ml)
        script_gpu(dcgm_exporter, name, constant(0), ns=ns)
        script_gpu(dcgm_exporter, name, constant(0), ns=ml)
    create(api, policy("rec", "Recommend", namespaces=(ml,)))
    create(api, policy("appr", "Approve", namespaces=(ns,), approvals=[f"Deployment/{ns}/a"]))
    prom = prometheus_factory(history=120, wait_scrape=False)
    runner = runner_for(scene, prom)
    before = {(n, w): generation(api, w, n) for n in (ns, ml) for w in "ab"}
    run_pass(runner, api, ns, ml)
    after = {(n, w): generation(api, w, n) for n in (ns, ml) for w in "ab"}
    changed = {key for key in before if before[key] != after[key]}
    assert changed == {(ns, "a")}
    assert workload(api, "a", ns)["spec"]["replicas"] == 0
    assert {p for _, p in workload_writes(scene)} == {f"/apis/apps/v1/namespaces/{ns}/deployments/a/scale"}
    assert bindings(api, ns, ml) == {ns}  # Recommend policies get no scale permissions
    rec = {p["target"]: p["state"] for p in policy_status(api, "rec")["proposals"]}
    assert rec == {f"Deployment/{ml}/a": "Proposed", f"Deployment/{ml}/b": "Proposed"}
    appr = {p["target"]: p["state"] for p in policy_status(api, "appr")["proposals"]}
    assert appr == {f"Deployment/{ns}/a": "Applied", f"Deployment/{ns}/b": "Proposed"}


def test_a_statefulset_parks_and_wakes_through_its_scale_subresource(
    scene: Scene, dcgm_exporter: DcgmExporter, prometheus_factory: Callable[..., PrometheusServer],
) -> None:
    """The scaler's other grant, statefulsets/scale patch, as the chart's ServiceAccount."""
    api, ns = scene.admin, scene.namespace
    create(api, make_deployment("db", namespace=ns, replicas=2, kind="StatefulSet"))
    create(api, policy(wake=False, namespaces=(ns,)))
    dcgm_exporter.put(UTIL, gpu_labels(namespace=ns, pod="db-0"), constant(0))
    prom = prometheus_factory(history=120, wait_scrape=False)
    runner = runner_for(scene, prom)
    apps = client.AppsV1Api(api)
    run_pass(runner, api, ns)
    assert apps.read_namespaced_stateful_set("db", ns).spec.replicas == 0
    assert (parked_record(api, "db", ns, kind="StatefulSet") or {})["replicas"] == 2
    apps.patch_namespaced_stateful_set("db", ns, {"metadata": {"annotations": {core.WAKE: "true"}}})
    run_pass(runner, api, ns)
    assert apps.read_namespaced_stateful_set("db", ns).spec.replicas == 2
    assert parked_record(api, "db", ns, kind="StatefulSet") is None
    scale = f"/apis/apps/v1/namespaces/{ns}/statefulsets/db/scale"
    writes = scene.cluster.wait_for(lambda: len(w := workload_writes(scene)) >= 2 and w, timeout=10,
                                    message="the two scale writes in the audit log")
    assert writes == [("PATCH", scale)] * 2


def test_a_scale_the_api_server_forbids_is_left_to_a_later_pass(
    scene: Scene, dcgm_exporter: DcgmExporter, prometheus_factory: Callable[..., PrometheusServer],
) -> None:
    """A scale refused with 403 (the scaler binding not in force yet on the API server that answered, or
    a grant an administrator narrowed) ends neither the pass nor the policy's status: the park record,
    written first, stays, the proposal shows Approved, and a pass after the grant is back parks it."""
    api, ns = scene.admin, scene.namespace
    rbac = client.RbacAuthorizationV1Api(api)
    scaler = "kubeon-gpu-optimizer-scaler"
    granted = api.sanitize_for_serialization(rbac.read_cluster_role(scaler))["rules"]
    deploy(api, "llm", 3, ns=ns)
    create(api, policy(wake=False, namespaces=(ns,)))
    script_gpu(dcgm_exporter, "llm", constant(0), ns=ns)
    prom = prometheus_factory(history=120, wait_scrape=False)
    runner = runner_for(scene, prom)
    rbac.patch_cluster_role(scaler, {"rules": [r for r in granted if "apps" not in r["apiGroups"]]},
                            _content_type="application/merge-patch+json")
    try:
        run_pass(runner, api, ns)
        assert workload(api, "llm", ns)["spec"]["replicas"] == 3
        assert (parked_record(api, "llm", ns) or {})["replicas"] == 3, "the record, written before the scale"
        states = [p["state"] for p in policy_status(api)["proposals"] if p["target"] == f"Deployment/{ns}/llm"]
        assert states == ["Approved"], "the pass went on to publish the status"
        scale = f"/apis/apps/v1/namespaces/{ns}/deployments/llm/scale"
        assert ("PATCH", scale, 403) in scene.cluster.wait_for(lambda: scene.answered(), timeout=10)
    finally:
        rbac.patch_cluster_role(scaler, {"rules": granted}, _content_type="application/merge-patch+json")

    def parked() -> bool:
        run_pass(runner, api, ns)
        return workload(api, "llm", ns)["spec"]["replicas"] == 0

    scene.cluster.wait_for(parked, timeout=60, message="parked once the grant is back")
    assert (parked_record(api, "llm", ns) or {})["replicas"] == 3


class Crash(RuntimeError):
    pass


def crash_once_at(step: str) -> Callable[[str], None]:
    """A checkpoint hook that raises the first time the reconciler reaches `step`."""
    fired: list[str] = []

    def hook(at: str) -> None:
        if at == step and not fired:
            fired.append(at)
            raise Crash(at)
    return hook


def keda_operator_pauses(api: client.ApiClient, name: str, ns: str) -> None:
    """What KEDA does with `paused-replicas: "0"`: scale the target to 0 (no KEDA runs here)."""
    client.AppsV1Api(api).patch_namespaced_deployment_scale(name, ns, {"spec": {"replicas": 0}})


def reconciler(step: str | None = None) -> ScaleToZeroReconciler:
    return ScaleToZeroReconciler(step_seconds=2, max_gap_seconds=6,
                                 checkpoint=crash_once_at(step) if step else None)


def scaled_object(name: str, ns: str) -> dict[str, Any]:
    return {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"name": name, "namespace": ns},
            "spec": {"scaleTargetRef": {"name": name}, "triggers": [{"type": "cpu", "metadata": {"value": "50"}}]}}


def test_crash_after_each_write_converges_without_losing_the_count(
    scene: Scene, dcgm_exporter: DcgmExporter, prometheus_factory: Callable[..., PrometheusServer],
) -> None:
    api, ns = scene.admin, scene.namespace
    deploy(api, "kedad", 5, ns=ns)
    deploy(api, "llm", 4, ns=ns)
    create(api, scaled_object("kedad", ns))
    create(api, policy(namespaces=(ns,)))
    script_gpu(dcgm_exporter, "llm", constant(0), ns=ns)
    script_gpu(dcgm_exporter, "kedad", constant(0), ns=ns)
    dcgm_exporter.put("queue_depth", {"service": "llm"}, constant(0))
    prom = prometheus_factory(history=120, wait_scrape=False)
    ctx = scale_context(scene.controller, scene.admin, prom.url)
    PolicySync().reconcile(ctx)

    # Crash 1: the KEDA target is recorded, its ScaledObject not yet paused.
    with pytest.raises(Crash):
        settled(api, ns)
        reconciler("recorded").reconcile(ctx)
    keda_half = workload(api, "kedad", ns)
    assert (parked_record(api, "kedad", ns) or {})["replicas"] == 5 and keda_half["spec"]["replicas"] == 5
    assert not kscale.is_paused_at_zero(kscale.list_scaled_objects(api, ns)[0])
    # Crash 2 (a restarted controller): the plain target's one patch landed, nothing after it ran.
    with pytest.raises(Crash):
        settled(api, ns)
        reconciler("parked").reconcile(ctx)
    assert workload(api, "llm", ns)["spec"]["replicas"] == 0
    assert (parked_record(api, "llm", ns) or {})["replicas"] == 4
    assert kscale.is_paused_at_zero(kscale.list_scaled_objects(api, ns)[0])
    assert (parked_record(api, "kedad", ns) or {})["replicas"] == 5
    assert workload(api, "kedad", ns)["spec"]["replicas"] == 5  # KEDA, not us, takes it to 0

    keda_operator_pauses(api, "kedad", ns)
    fresh = reconciler()  # restart again: converged, writes nothing, counts intact
    versions = {n: generation(api, n, ns) for n in ("llm", "kedad")}
    records = policy_status(api)["parked"]
    writes = len(scene.writes())
    fresh.reconcile(ctx)
    fresh.reconcile(ctx)
    assert versions == {n: generation(api, n, ns) for n in ("llm", "kedad")}
    assert policy_status(api)["parked"] == records
    assert [p for _, p in scene.writes()[writes:] if "/apis/apps/" in p or "scaledobjects" in p] == []

    assert all(p.endswith("/scale") for _, p in workload_writes(scene)), workload_writes(scene)

    # Wake both; crash right after unpausing KEDA; the restart finishes with the recorded counts.
    for name in ("llm", "kedad"):
        client.AppsV1Api(api).patch_namespaced_deployment(name, ns, {"metadata": {"annotations": {core.WAKE: "true"}}})
    mark = len(workload_writes(scene))
    with pytest.raises(Crash):
        settled(api, ns)
        reconciler("unpaused").reconcile(ctx)
    assert workload(api, "kedad", ns)["spec"]["replicas"] == 0 and parked_record(api, "kedad", ns) is not None
    settled(api, ns)
    reconciler().reconcile(ctx)
    assert workload(api, "llm", ns)["spec"]["replicas"] == 4
    assert workload(api, "kedad", ns)["spec"]["replicas"] == 5
    assert not kscale.is_paused_at_zero(kscale.list_scaled_objects(api, ns)[0])
    assert parked_record(api, "kedad", ns) is None and parked_record(api, "llm", ns) is None
    assert ours_on(workload(api, "kedad", ns)) == [] and ours_on(workload(api, "llm", ns)) == []
    woke = scene.cluster.wait_for(lambda: workload_writes(scene)[mark:], timeout=10, message="the wake's writes")
    assert all(m == "PATCH" and p.endswith("/scale") for m, p in woke), woke


def test_scaler_rolebindings_follow_policy_namespaces(scene: Scene, ml: str) -> None:
    api, ns = scene.admin, scene.namespace
    create(api, policy(namespaces=(ns, ml)))
    # Acting modes need a configured source; nothing listens there (the wake query fails soft).
    ctx = scale_context(scene.controller, scene.admin, "http://127.0.0.1:9")
    runner = ReconcileRunner(ctx, [PolicySync(), ScaleToZeroReconciler()])
    run_pass(runner, api, ns)
    assert bindings(api, ns, ml) == {ns, ml}
    made = kscale.list_scaler_bindings(api)[ns]
    assert made["roleRef"]["name"] == "kubeon-gpu-optimizer-scaler"
    assert made["subjects"] == [{"kind": "ServiceAccount", "name": "kubeon-gpu-optimizer", "namespace": "kubeon-gpu"}]
    client.CustomObjectsApi(api).patch_cluster_custom_object(
        "gpu.kubeon.io", "v1alpha1", "gpupolicies", "idle-gpus", {"spec": {"scaleToZero": {"namespaces": [ml]}}},
        _content_type="application/merge-patch+json")
    run_pass(runner, api, ns)
    assert bindings(api, ns, ml) == {ml}
    client.CustomObjectsApi(api).delete_cluster_custom_object("gpu.kubeon.io", "v1alpha1", "gpupolicies", "idle-gpus")
    run_pass(runner, api, ns)
    assert bindings(api, ns, ml) == set()
