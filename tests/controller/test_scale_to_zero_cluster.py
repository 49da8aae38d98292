"""Scale to zero end to end: real Prometheus + the test API server + the frame's runner and context.

Real: /usr/bin/prometheus scraping the scripted DCGM exporter every 1 s, with
idle/busy history backfilled by promtool (so a 60 s idleFor window is full at
once); the test API server (tests/kubeapi) with the GpuPolicy and KEDA CRDs;
the frame's PolicySync, PolicyStore, Recorder and ReconcileRunner; the
ScaleToZeroReconciler. Applied actions are also checked as the core/v1 Events
read back from the API server (on the Deployment in its namespace, on the
GpuPolicy in `default`, where kubectl looks for a cluster-scoped object's).
Faked: the GPUs (scripted series), leadership (always leader), and a crash (a
checkpoint hook raising after a write).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client

from controller.loop import ReconcileRunner
from controller.policysync import PolicySync
from controller.scaletozero import ScaleToZeroReconciler
from gpupolicy.scaling import scaletozero as core
from kube import scale as kscale
from tests.controller.conftest import make_deployment
from tests.controller.conftest_scale import scale_context
from tests.promharness import DcgmExporter, PrometheusServer, constant, gpu_labels, replay

UTIL = "DCGM_FI_DEV_GPU_UTIL"
NS = "research"
WAKE_QUERY = 'sum(queue_depth{service="llm"})'


# -- builders -------------------------------------------------------------------------
def policy(name: str = "idle-gpus", mode: str = "Automatic", *, wake: bool = True, namespaces: tuple[str, ...] = (NS,),
           approvals: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"namespaces": list(namespaces), "idleBelowPercent": 5, "idleFor": "60s", **extra}
    if wake:
        body["wake"] = {"prometheusQuery": WAKE_QUERY, "above": 0}
    spec: dict[str, Any] = {"mode": mode, "scaleToZero": body}
    if approvals is not None:
        spec["approvals"] = approvals
    return {"apiVersion": "gpu.kubeon.io/v1alpha1", "kind": "GpuPolicy", "metadata": {"name": name}, "spec": spec}


def create(api: client.ApiClient, obj: dict[str, Any]) -> None:
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


def workload(api: client.ApiClient, name: str, ns: str = NS) -> dict[str, Any]:
    return api.sanitize_for_serialization(  # type: ignore[no-any-return]
        client.AppsV1Api(api).read_namespaced_deployment(name, ns))


def annotations(obj: dict[str, Any]) -> dict[str, str]:
    return dict(obj["metadata"].get("annotations") or {})


def deploy(api: client.ApiClient, name: str, replicas: int = 3, ns: str = NS, **annotations: str) -> None:
    obj = make_deployment(name, namespace=ns, replicas=replicas)
    if annotations:
        obj["metadata"]["annotations"] = dict(annotations)  # type: ignore[index]
    create(api, obj)


def pod(name: str) -> str:
    return f"{name}-7d9f6c8b5-x2b4z"


def script_gpu(exporter: DcgmExporter, name: str, script: Any, ns: str = NS) -> None:
    exporter.put(UTIL, gpu_labels(namespace=ns, pod=pod(name)), script)


def policy_status(api: client.ApiClient, name: str = "idle-gpus") -> dict[str, Any]:
    obj = client.CustomObjectsApi(api).get_cluster_custom_object("gpu.kubeon.io", "v1alpha1", "gpupolicies", name)
    return dict(obj.get("status") or {})


def runner_for(api: client.ApiClient, prom: PrometheusServer | None, **kw: Any) -> ReconcileRunner:
    ctx = scale_context(api, prom.url if prom else None)
    return ReconcileRunner(ctx, [PolicySync(), ScaleToZeroReconciler(step_seconds=2, max_gap_seconds=6, **kw)])


def parked_record(api: client.ApiClient, name: str, ns: str = NS, policy_name: str = "idle-gpus",
                  kind: str = "Deployment") -> dict[str, Any] | None:
    """The policy's park record for a workload (status.parked), or None."""
    return (policy_status(api, policy_name).get("parked") or {}).get(f"{kind}/{ns}/{name}")


def ours_on(obj: dict[str, Any]) -> list[str]:
    """gpu.kubeon.io/ annotations the optimizer could have written on a workload (it writes none)."""
    return [k for k in annotations(obj) if k.startswith("gpu.kubeon.io/") and k != core.WAKE
            and k != core.DO_NOT_SCALE]


def workload_writes(server: Any) -> list[tuple[str, str]]:
    """Writes to Deployments/StatefulSets the API server saw but the tests' own creates (POST to the
    collection) and annotations (a user's wake): the install guide grants the optimizer only their /scale."""
    return [(m, p) for m, p in server.writes if p.startswith("/apis/apps/") and m != "POST"]


def bindings(api: client.ApiClient) -> set[str]:
    return set(kscale.list_scaler_bindings(api))


POLICY_EVENT_NAMESPACE = "kubeon-gpu"  # the optimizer's own namespace: the only one its RBAC writes Events in


def events_about(api: client.ApiClient, namespace: str, kind: str, name: str) -> list[tuple[str, str, str]]:
    """(reason, message, involvedObject.uid) of the Events in `namespace` about `kind/name`."""
    items = client.CoreV1Api(api).list_namespaced_event(namespace).items
    return [(e.reason, e.message, e.involved_object.uid) for e in items
            if e.involved_object.kind == kind and e.involved_object.name == name]


def messages(api: client.ApiClient, name: str, ns: str = NS) -> list[str]:
    """Messages of the policy Events about Deployment `ns/name` (they start with its key)."""
    items = client.CoreV1Api(api).list_namespaced_event(POLICY_EVENT_NAMESPACE).items
    return [e.message for e in items
            if e.involved_object.kind == "GpuPolicy" and e.message.startswith(f"Deployment/{ns}/{name}: ")]


def assert_applied_events(api: client.ApiClient, deployment: dict[str, Any], policy_name: str,
                          actions: list[str]) -> None:
    """Exactly one GpuPolicyApplied Event per action on the policy, naming the Deployment, and none on
    the Deployment (its namespace is not the optimizer's: no Event RBAC there).

    Compared as multisets: two Events written in the same second have no defined list order.
    """
    meta = deployment["metadata"]
    key = f"Deployment/{meta['namespace']}/{meta['name']}"
    policy_uid = client.CustomObjectsApi(api).get_cluster_custom_object(
        "gpu.kubeon.io", "v1alpha1", "gpupolicies", policy_name)["metadata"]["uid"]
    on_target = events_about(api, meta["namespace"], "Deployment", meta["name"])
    on_policy = [e for e in events_about(api, POLICY_EVENT_NAMESPACE, "GpuPolicy", policy_name)
                 if e[1].startswith(f"{key}: ")]
    assert on_target == []
    for found, prefix, uid in ((on_policy, f"{key}: ", policy_uid),):
        assert {reason for reason, _, _ in found} == {"GpuPolicyApplied"}, found
        assert all(message.startswith(prefix) for _, message, _ in found), found
        assert all(found_uid == uid for _, _, found_uid in found), found
        named = sorted(message[len(prefix):].split(": ", 1)[0] for _, message, _ in found)
        assert named == sorted(actions), found
        assert all(f": {key} " in message for _, message, _ in found), found


# -- tests ----------------------------------------------------------------------------
def test_idle_goes_to_zero_then_wakes_by_query(
    scale_api: Any, dcgm_exporter: DcgmExporter, prometheus_factory: Callable[..., PrometheusServer],
) -> None:
    api = scale_api.api
    deploy(api, "llm", 3)
    deploy(api, "nodata", 2)  # no series at all: no data is never idle
    create(api, policy())
    script_gpu(dcgm_exporter, "llm", constant(1))
    dcgm_exporter.put("queue_depth", {"service": "llm"}, constant(0))
    prom = prometheus_factory(history=120)
    runner = runner_for(api, prom)
    runner.run_all()

    parked = workload(api, "llm")
    assert parked["spec"]["replicas"] == 0
    record = parked_record(api, "llm")
    assert record is not None and record["replicas"] == 3
    assert record["scaledAt"] and record["undo"]["restoreReplicas"] == 3
    assert record["uid"] == parked["metadata"]["uid"]
    assert ours_on(parked) == [], "the park record is in the policy status, never on the workload"
    assert workload(api, "nodata")["spec"]["replicas"] == 2
    assert parked_record(api, "nodata") is None
    assert bindings(api) == {NS}
    assert [e["action"].split(":")[0] for e in runner.ctx.recorder.applied_log] == ["ScaleToZero"]
    assert_applied_events(api, parked, "idle-gpus", ["ScaleToZero"])
    assert any(": ScaleToZero: " in m and " from 3 to 0 replicas" in m for m in messages(api, "llm"))
    status = policy_status(api)
    assert any(p["target"] == f"Deployment/{NS}/llm" and p["state"] == "Applied" for p in status["proposals"])

    runner.run_all()  # parked, no demand: nothing changes, never parked twice
    assert workload(api, "llm")["metadata"]["resourceVersion"] == parked["metadata"]["resourceVersion"]

    dcgm_exporter.put("queue_depth", {"service": "llm"}, constant(7))
    prom.wait_for(f"{WAKE_QUERY} > 0")
    runner.run_all()
    woken = workload(api, "llm")
    assert woken["spec"]["replicas"] == 3
    assert parked_record(api, "llm") is None and ours_on(woken) == []
    assert "Wake" in runner.ctx.recorder.applied_log[-1]["action"]
    assert_applied_events(api, woken, "idle-gpus", ["ScaleToZero", "Wake"])
    assert any(": Wake: " in m and " to 3 replicas" in m for m in messages(api, "llm"))
    assert events_about(api, NS, "Deployment", "nodata") == []
    writes = workload_writes(scale_api)
    assert writes == [("PATCH", f"/apis/apps/v1/namespaces/{NS}/deployments/llm/scale")] * 2, (
        "park and wake: the scale subresource only (the guide's deployments/scale get, patch)")


def test_wake_by_annotation_and_policy_without_wake_signal_warns(
    scale_api: Any, dcgm_exporter: DcgmExporter, prometheus_factory: Callable[..., PrometheusServer],
) -> None:
    api = scale_api.api
    deploy(api, "llm", 2)
    create(api, policy(wake=False))
    script_gpu(dcgm_exporter, "llm", constant(0))
    prom = prometheus_factory(history=120, wait_scrape=False)
    runner = runner_for(api, prom)
    runner.run_all()
    assert workload(api, "llm")["spec"]["replicas"] == 0
    wake_condition = next(c for c in policy_status(api)["conditions"] if c["type"] == "WakeSignal")
    assert wake_condition["status"] == "False" and "annotation" in wake_condition["message"]

    client.AppsV1Api(api).patch_namespaced_deployment(
        "llm", NS, {"metadata": {"annotations": {core.WAKE: "true"}}})
    runner.run_all()
    woken = workload(api, "llm")
    assert woken["spec"]["replicas"] == 2
    assert parked_record(api, "llm") is None and ours_on(woken) == []
    assert annotations(woken)[core.WAKE] == "true", "the user's annotation: the optimizer cannot remove it"
    assert_applied_events(api, woken, "idle-gpus", ["ScaleToZero", "Wake"])
    assert any(": Wake: " in m and " to 2 replicas" in m for m in messages(api, "llm"))
    runner.run_all()  # still idle, but held awake while the annotation is there
    assert workload(api, "llm")["spec"]["replicas"] == 2
    client.AppsV1Api(api).patch_namespaced_deployment("llm", NS, {"metadata": {"annotations": {core.WAKE: None}}})
    runner.run_all()  # annotation removed: idle again, parked again
    assert workload(api, "llm")["spec"]["replicas"] == 0 and (parked_record(api, "llm") or {})["replicas"] == 2


def test_bursty_real_trace_is_not_idle_and_do_not_scale_is_skipped(
    scale_api: Any, dcgm_exporter: DcgmExporter, prometheus_factory: Callable[..., PrometheusServer],
) -> None:
    api = scale_api.api
    deploy(api, "bursty", 2)
    deploy(api, "pinned", 2, **{core.DO_NOT_SCALE: "true"})
    create(api, policy())
    script_gpu(dcgm_exporter, "bursty", replay("bursty", time.time() - 600))
    script_gpu(dcgm_exporter, "pinned", constant(0))
    prom = prometheus_factory(history=120, wait_scrape=False)
    runner = runner_for(api, prom)
    before = {n: workload(api, n)["metadata"]["resourceVersion"] for n in ("bursty", "pinned")}
    runner.run_all()
    after = {n: workload(api, n)["metadata"]["resourceVersion"] for n in ("bursty", "pinned")}
    assert after == before
    reconciler = runner.reconcilers[1]
    assert isinstance(reconciler, ScaleToZeroReconciler)
    assert reconciler.last_decisions[f"Deployment/{NS}/bursty"].reason is core.Reason.BUSY
    assert reconciler.last_decisions[f"Deployment/{NS}/pinned"].reason is core.Reason.DO_NOT_SCALE


def test_recommend_writes_nothing_approve_only_approved(
    scale_api: Any, dcgm_exporter: DcgmExporter, prometheus_factory: Callable[..., PrometheusServer],
) -> None:
    api = scale_api.api
    for name in ("a", "b"):
        deploy(api, name, 2, ns=NS)
        deploy(api, name, 2, ns="ml")
        script_gpu(dcgm_exporter, name, constant(0), ns=NS)
        script_gpu(dcgm_exporter, name, constant(0), ns="ml")
    create(api, policy("rec", "Recommend", namespaces=("ml",)))
    create(api, policy("appr", "Approve", approvals=[f"Deployment/{NS}/a"]))
    prom = prometheus_factory(history=120, wait_scrape=False)
    runner = runner_for(api, prom)
    before = {(ns, n): workload(api, n, ns)["metadata"]["resourceVersion"] for ns in (NS, "ml") for n in "ab"}
    runner.run_all()
    after = {(ns, n): workload(api, n, ns)["metadata"]["resourceVersion"] for ns in (NS, "ml") for n in "ab"}
    changed = {key for key in before if before[key] != after[key]}
    assert changed == {(NS, "a")}
    assert workload(api, "a", NS)["spec"]["replicas"] == 0
    assert bindings(api) == {NS}  # Recommend policies get no scale permissions
    rec = {p["target"]: p["state"] for p in policy_status(api, "rec")["proposals"]}
    assert rec == {"Deployment/ml/a": "Proposed", "Deployment/ml/b": "Proposed"}
    appr = {p["target"]: p["state"] for p in policy_status(api, "appr")["proposals"]}
    assert appr == {f"Deployment/{NS}/a": "Applied", f"Deployment/{NS}/b": "Proposed"}


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


def keda_operator_pauses(api: client.ApiClient, name: str) -> None:
    """What KEDA does with `paused-replicas: "0"`: scale the target to 0 (no KEDA runs here)."""
    client.AppsV1Api(api).patch_namespaced_deployment_scale(name, NS, {"spec": {"replicas": 0}})


def reconciler(step: str | None = None) -> ScaleToZeroReconciler:
    return ScaleToZeroReconciler(step_seconds=2, max_gap_seconds=6,
                                 checkpoint=crash_once_at(step) if step else None)


def test_crash_after_each_write_converges_without_losing_the_count(
    scale_api: Any, dcgm_exporter: DcgmExporter, prometheus_factory: Callable[..., PrometheusServer],
) -> None:
    api = scale_api.api
    deploy(api, "kedad", 5)
    deploy(api, "llm", 4)
    create(api, {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
                 "metadata": {"name": "kedad", "namespace": NS},
                 "spec": {"scaleTargetRef": {"name": "kedad"},
                          "triggers": [{"type": "cpu", "metadata": {"value": "50"}}]}})
    create(api, policy())
    script_gpu(dcgm_exporter, "llm", constant(0))
    script_gpu(dcgm_exporter, "kedad", constant(0))
    dcgm_exporter.put("queue_depth", {"service": "llm"}, constant(0))
    prom = prometheus_factory(history=120, wait_scrape=False)
    ctx = scale_context(api, prom.url)
    PolicySync().reconcile(ctx)

    # Crash 1: the KEDA target is recorded, its ScaledObject not yet paused.
    with pytest.raises(Crash):
        reconciler("recorded").reconcile(ctx)
    keda_half = workload(api, "kedad")
    assert (parked_record(api, "kedad") or {})["replicas"] == 5 and keda_half["spec"]["replicas"] == 5
    assert not kscale.is_paused_at_zero(kscale.list_scaled_objects(api, NS)[0])
    # Crash 2 (a restarted controller): the plain target's one patch landed, nothing after it ran.
    with pytest.raises(Crash):
        reconciler("parked").reconcile(ctx)
    assert workload(api, "llm")["spec"]["replicas"] == 0
    assert (parked_record(api, "llm") or {})["replicas"] == 4
    assert kscale.is_paused_at_zero(kscale.list_scaled_objects(api, NS)[0])
    assert (parked_record(api, "kedad") or {})["replicas"] == 5
    assert workload(api, "kedad")["spec"]["replicas"] == 5  # KEDA, not us, takes it to 0

    keda_operator_pauses(api, "kedad")
    fresh = reconciler()  # restart again: converged, writes nothing, counts intact
    versions = {n: workload(api, n)["metadata"]["resourceVersion"] for n in ("llm", "kedad")}
    records = policy_status(api)["parked"]
    fresh.reconcile(ctx)
    fresh.reconcile(ctx)
    assert versions == {n: workload(api, n)["metadata"]["resourceVersion"] for n in ("llm", "kedad")}
    assert policy_status(api)["parked"] == records

    assert all(p.endswith("/scale") for _, p in workload_writes(scale_api)), workload_writes(scale_api)

    # Wake both; crash right after unpausing KEDA; the restart finishes with the recorded counts.
    for name in ("llm", "kedad"):
        client.AppsV1Api(api).patch_namespaced_deployment(name, NS, {"metadata": {"annotations": {core.WAKE: "true"}}})
    mark = len(workload_writes(scale_api))  # the user's annotations above are not the optimizer's writes
    with pytest.raises(Crash):
        reconciler("unpaused").reconcile(ctx)
    assert workload(api, "kedad")["spec"]["replicas"] == 0 and parked_record(api, "kedad") is not None
    reconciler().reconcile(ctx)
    assert workload(api, "llm")["spec"]["replicas"] == 4
    assert workload(api, "kedad")["spec"]["replicas"] == 5
    assert not kscale.is_paused_at_zero(kscale.list_scaled_objects(api, NS)[0])
    assert parked_record(api, "kedad") is None and parked_record(api, "llm") is None
    assert ours_on(workload(api, "kedad")) == [] and ours_on(workload(api, "llm")) == []
    woke = workload_writes(scale_api)[mark:]
    assert woke and all(m == "PATCH" and p.endswith("/scale") for m, p in woke), woke


def test_scaler_rolebindings_follow_policy_namespaces(scale_api: Any) -> None:
    api = scale_api.api
    create(api, policy(namespaces=(NS, "ml")))
    # Acting modes need a configured source; nothing listens there (the wake query fails soft).
    ctx = scale_context(api, "http://127.0.0.1:9")
    runner = ReconcileRunner(ctx, [PolicySync(), ScaleToZeroReconciler()])
    runner.run_all()
    assert bindings(api) == {NS, "ml"}
    made = kscale.list_scaler_bindings(api)[NS]
    assert made["roleRef"]["name"] == "kubeon-gpu-optimizer-scaler"
    assert made["subjects"] == [{"kind": "ServiceAccount", "name": "kubeon-gpu-optimizer", "namespace": "kubeon-gpu"}]
    client.CustomObjectsApi(api).patch_cluster_custom_object(
        "gpu.kubeon.io", "v1alpha1", "gpupolicies", "idle-gpus", {"spec": {"scaleToZero": {"namespaces": ["ml"]}}},
        _content_type="application/merge-patch+json")
    runner.run_all()
    assert bindings(api) == {"ml"}
    client.CustomObjectsApi(api).delete_cluster_custom_object("gpu.kubeon.io", "v1alpha1", "gpupolicies", "idle-gpus")
    runner.run_all()
    assert bindings(api) == set()
