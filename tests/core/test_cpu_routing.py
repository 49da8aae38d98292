"""CPU-only pods that may land on kubeon's GPU nodes are routed to kubeon's scheduler (issue 17).

kubeon's GPU nodes carry `nvidia.com/gpu:NoSchedule`; a CPU-only pod that
tolerates it gets the schedulerName of the policies it matches, and nothing
else, unless it is a DaemonSet's pod, already on a node, names a scheduler,
or the install switched routing off.

Real: gpupolicy.admission.mutate_pod / validate_pod / dry_run with the real
policy model; patches applied with the independent `jsonpatch` library.
Faked: nothing (pods, policies and views are built in memory).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from gpupolicy.admission.dryrun import dry_run
from gpupolicy.admission.mutate import Action, mutate_pod, validate_pod
from tests.core.builders import apply, make_pod, make_policy, make_view, owner_ref

SCHEDULER = "kubeon-gpu-scheduler"
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
# what the API server adds to every pod (DefaultTolerationSeconds): tolerates no GPU taint
DEFAULT_TOLERATIONS = [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
                        "tolerationSeconds": 300}]


def cpu_pod(tolerations: list[dict[str, Any]] | None = None, **kwargs: Any) -> dict[str, Any]:
    return make_pod(None, tolerations=DEFAULT_TOLERATIONS + (tolerations or []), **kwargs)


def packing_view(mode: str = "Automatic", **policy: Any):
    """A packing policy for namespace ml that routes its pods to kubeon's scheduler (and adds a toleration,
    which only GPU pods may get)."""
    return make_view(make_policy("pack", mode=mode, selector={"namespaces": ["ml"]}, scheduler=SCHEDULER,
                                 tolerations=[{"key": "dedicated", "operator": "Exists"}],
                                 packing={"strategy": "default"}, **policy))


@pytest.mark.parametrize("toleration", [
    GPU_TOLERATION,
    {"key": "nvidia.com/gpu", "operator": "Exists"},  # any effect
    {"key": "nvidia.com/gpu", "operator": "Equal", "value": "", "effect": "NoSchedule"},
    {"operator": "Exists"},  # tolerates every taint
], ids=["exists-noschedule", "exists-any-effect", "equal-empty-value", "tolerates-everything"])
def test_a_cpu_only_pod_tolerating_the_gpu_taint_gets_the_scheduler_and_nothing_else(toleration) -> None:
    pod = cpu_pod([toleration])
    result = mutate_pod(pod, packing_view())
    after = apply(pod, result.patch)
    assert after == result.object
    assert after["spec"]["schedulerName"] == SCHEDULER
    assert after["spec"]["tolerations"] == pod["spec"]["tolerations"]  # the policy's toleration is not added
    assert after["spec"]["containers"] == pod["spec"]["containers"]
    assert after["metadata"]["annotations"] == {"gpu.kubeon.io/policy": "pack"}
    assert [(d.action, d.applied) for d in result.decisions] == [(Action.INJECT, True)]
    assert result.warnings == []
    assert mutate_pod(after, packing_view()).patch == [], "idempotent"


@pytest.mark.parametrize(("pod", "why"), [
    (cpu_pod(), "tolerates no GPU taint"),
    (cpu_pod([{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}]), "another effect"),
    (cpu_pod([{"key": "nvidia.com/gpu", "operator": "Equal", "value": "yes", "effect": "NoSchedule"}]),
     "another value"),
    (cpu_pod([GPU_TOLERATION], owner=owner_ref("DaemonSet", "node-exporter")), "a DaemonSet's pod"),
    (cpu_pod([GPU_TOLERATION], scheduler="volcano"), "names another scheduler"),
], ids=["no-toleration", "other-effect", "other-value", "daemonset", "own-scheduler"])
def test_other_cpu_only_pods_are_left_alone(pod: dict[str, Any], why: str) -> None:
    result = mutate_pod(pod, packing_view())
    assert result.patch == [] and result.decisions == [], why
    assert result.note == "pod asks for no GPU", why


def test_a_pod_already_on_a_node_is_left_alone() -> None:
    pod = cpu_pod([GPU_TOLERATION])
    pod["spec"]["nodeName"] = "gpu-node-1"  # no scheduler binds it (mirror pods, pods placed by hand)
    assert mutate_pod(pod, packing_view()).patch == []


def test_the_default_scheduler_named_explicitly_is_routed() -> None:
    pod = cpu_pod([GPU_TOLERATION], scheduler="default-scheduler")  # what the API server defaults
    assert apply(pod, mutate_pod(pod, packing_view()).patch)["spec"]["schedulerName"] == SCHEDULER


def test_the_install_switch_turns_routing_off() -> None:
    """webhook --route-cpu-pods-on-gpu-nodes=false (the chart's webhook.routeCpuPodsOnGpuNodes)."""
    view = replace(packing_view(), route_cpu_pods=False)
    pod = cpu_pod([GPU_TOLERATION])
    assert mutate_pod(pod, view).patch == []
    gpu_pod = make_pod(1, tolerations=[GPU_TOLERATION])  # GPU pods are routed either way
    assert apply(gpu_pod, mutate_pod(gpu_pod, view).patch)["spec"]["schedulerName"] == SCHEDULER


def test_only_policies_in_scope_route() -> None:
    pod = cpu_pod([GPU_TOLERATION], namespace="web")
    result = mutate_pod(pod, packing_view())
    assert result.patch == [] and result.note == "no policy matches"


@pytest.mark.parametrize("mode", ["Recommend", "Approve"])
def test_modes_that_do_not_act_record_the_decision_without_a_warning(mode: str) -> None:
    """Recommend (and Approve for owners not approved) change nothing; the CPU-only pod's author has
    nothing to act on, so no warning (the pod's workload is answered without any either)."""
    result = mutate_pod(cpu_pod([GPU_TOLERATION]), packing_view(mode))
    assert result.patch == [] and result.warnings == []
    assert [(d.action, d.applied) for d in result.decisions] == [(Action.INJECT, False)]


def test_approve_routes_approved_owners() -> None:
    pod = cpu_pod([GPU_TOLERATION], owner=owner_ref("Job", "etl", "batch/v1"))
    result = mutate_pod(pod, packing_view("Approve", approvals=["Job/ml/etl"]))
    assert apply(pod, result.patch)["spec"]["schedulerName"] == SCHEDULER


def test_sharing_and_guardrails_do_not_apply_to_a_routed_cpu_only_pod() -> None:
    share = make_policy("share", selector={"namespaces": ["ml"]}, scheduler=SCHEDULER,
                        sharing={"strategy": "TimeSlicing"})
    guard = make_policy("guard", selector={"namespaces": ["ml"]}, guardrail={"maxGpusPerPod": 0})
    view = make_view(share, guard)
    pod = cpu_pod([GPU_TOLERATION])
    result = mutate_pod(pod, view)
    assert [(d.policy, d.action) for d in result.decisions] == [("share", Action.INJECT)]
    assert validate_pod(result.object, view).decisions == []
    assert validate_pod(result.object, view).note == "pod asks for no GPU"


def test_dry_run_shows_the_routing() -> None:
    pod = cpu_pod([GPU_TOLERATION])
    shown = dry_run(pod, packing_view())
    assert shown.object["spec"]["schedulerName"] == SCHEDULER
