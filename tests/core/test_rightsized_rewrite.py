"""The policy status is the single source of truth for a right-sized workload's pods.

Real: gpupolicy.admission.mutate_pod / dryrun over a real parsed GpuPolicy
carrying a status with proposals (as the controller writes it and the
webhook's watch delivers it), the real catalog, gpupolicy.admission.validation for the
`rollout: Restart` rule, controller.workload_access.write_namespaces (pure: ScaleToZero namespaces only).
Faked: nothing (objects are built in memory); patches are applied with the
independent `jsonpatch` library.
"""

from __future__ import annotations

from typing import Any

import pytest

from controller.workload_access import write_namespaces
from gpupolicy.admission.mutate import Action, mutate_pod
from gpupolicy.admission.validation import check_policy
from gpupolicy.catalog import DEFAULT_CATALOG
from gpupolicy.model import GpuPolicy, Mode, parse_policy
from gpupolicy.proposals import make_proposal
from tests.core.builders import apply, limits, make_node, make_pod, make_view, owner_ref

OWNER = "Deployment/ml/llm"
ACTION = "nvidia.com/gpu=1 → nvidia.com/mig-1g.10gb"


def policy_with_status(state: str = "Applied", *, mode: str = "Automatic", target: str = OWNER,
                       resource: str | None = "nvidia.com/mig-1g.10gb", gpu_memory: str = "30Gi",
                       strategy: str = "MIG", approvals: list[str] | None = None) -> GpuPolicy:
    proposal = make_proposal("share", target, ACTION, "peak 7.1 GiB", 625.7, resource=resource)
    wire = proposal.model_dump(by_alias=True, exclude_none=True, mode="json")
    wire["state"] = state
    spec: dict[str, Any] = {"mode": mode, "selector": {"namespaces": ["ml"]},
                            "sharing": {"strategy": strategy, "gpuMemory": gpu_memory}}
    if approvals is not None:
        spec["approvals"] = approvals
    return parse_policy({"apiVersion": "gpu.kubeon.io/v1alpha1", "kind": "GpuPolicy", "metadata": {"name": "share"},
                         "spec": spec, "status": {"effectiveMode": mode, "proposals": [wire]}})


def view_of(policy: GpuPolicy):  # type: ignore[no-untyped-def]
    """A cluster of A100-80GB nodes (auto sizing then picks among A100-80GB profiles)."""
    return make_view(policy, nodes=(make_node(),))


def llm_pod(**kwargs: Any) -> dict[str, Any]:
    pod = make_pod(1, name="llm-7f9c5d-x2k4q", owner=owner_ref("ReplicaSet", "llm-7f9c5d"), **kwargs)
    pod["metadata"]["labels"] = {"pod-template-hash": "7f9c5d"}
    return pod


def test_applied_proposal_resource_wins_over_gpu_memory_sizing() -> None:
    view = view_of(policy_with_status())  # gpuMemory 30Gi alone would choose 3g.40gb
    pod = llm_pod()
    result = mutate_pod(pod, view)
    after = apply(pod, result.patch)
    assert limits(after) == {"cpu": "1", "nvidia.com/mig-1g.10gb": "1"}
    [decision] = result.decisions
    assert decision.applied and decision.action is Action.USE_MIG
    assert "right-sized from measured peak" in decision.reason
    assert after["metadata"]["annotations"]["gpu.kubeon.io/rewritten-from"]
    assert mutate_pod(after, view).patch == [], "idempotent"


def test_applied_resource_also_beats_the_pod_annotation() -> None:
    pod = llm_pod(annotations={"gpu.kubeon.io/gpu-memory": "35Gi"})
    after = apply(pod, mutate_pod(pod, view_of(policy_with_status())).patch)
    assert "nvidia.com/mig-1g.10gb" in limits(after)


@pytest.mark.parametrize("state", ["Proposed", "Approved", "Dismissed"])
def test_only_applied_proposals_count(state: str) -> None:
    pod = llm_pod()
    after = apply(pod, mutate_pod(pod, view_of(policy_with_status(state))).patch)
    assert "nvidia.com/mig-3g.40gb" in limits(after), "own sizing from gpuMemory 30Gi"


def test_another_workloads_proposal_does_not_count() -> None:
    pod = llm_pod()
    after = apply(pod, mutate_pod(pod, view_of(policy_with_status(target="Deployment/ml/other"))).patch)
    assert "nvidia.com/mig-3g.40gb" in limits(after)


def test_a_proposal_without_resource_or_with_a_whole_gpu_is_ignored() -> None:
    for resource in (None, "nvidia.com/gpu", "cpu"):
        pod = llm_pod()
        after = apply(pod, mutate_pod(pod, view_of(policy_with_status(resource=resource))).patch)
        assert "nvidia.com/mig-3g.40gb" in limits(after), resource


def test_time_slicing_proposal_resource_is_used() -> None:
    pod = llm_pod()
    view = view_of(policy_with_status(strategy="TimeSlicing", resource="nvidia.com/gpu.shared"))
    after = apply(pod, mutate_pod(pod, view).patch)
    assert "nvidia.com/gpu.shared" in limits(after)


def test_mode_still_gates_the_rewrite() -> None:
    """A policy switched back to Recommend stops rewriting, even with an Applied proposal (the undo path)."""
    pod = llm_pod()
    result = mutate_pod(pod, view_of(policy_with_status(mode="Recommend")))
    assert result.patch == []
    assert "mig-1g.10gb" in result.warnings[0]


def test_approve_with_applied_and_approved_target_rewrites() -> None:
    pod = llm_pod()
    view = view_of(policy_with_status(mode="Approve", approvals=[OWNER]))
    assert "nvidia.com/mig-1g.10gb" in limits(apply(pod, mutate_pod(pod, view).patch))


# -- rollout: Restart must name its namespaces -----------------------------------------------------
def _policy(spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "gpu.kubeon.io/v1alpha1", "kind": "GpuPolicy", "metadata": {"name": "p"}, "spec": spec}


def test_restart_without_namespaces_is_refused_naming_the_rollout_field() -> None:
    _, errors = check_policy(_policy({"sharing": {"strategy": "MIG", "rollout": "Restart"}}), DEFAULT_CATALOG)
    assert len(errors) == 1
    assert errors[0].startswith("spec.sharing.rollout: ")
    assert "selector.namespaces" in errors[0] and "named namespaces" in errors[0]
    _, errors = check_policy(_policy({"selector": {"namespaceSelector": {"matchLabels": {"a": "b"}}},
                                      "sharing": {"strategy": "MIG", "rollout": "Restart"}}), DEFAULT_CATALOG)
    assert errors and errors[0].startswith("spec.sharing.rollout: ")


def test_restart_with_namespaces_and_no_restart_without_them_pass() -> None:
    for spec in ({"selector": {"namespaces": ["ml"]}, "sharing": {"strategy": "MIG", "rollout": "Restart"}},
                 {"sharing": {"strategy": "MIG"}}):
        parsed, errors = check_policy(_policy(spec), DEFAULT_CATALOG)
        assert errors == [] and parsed is not None


def test_write_namespaces_are_acting_scale_to_zero_namespaces_only() -> None:
    """The guide's scaler Role goes only where a ScaleToZero policy acts; Restart evicts, it needs none."""
    def make(name: str, mode: str | None, spec: dict[str, Any]) -> GpuPolicy:
        body = {**spec, **({"mode": mode} if mode else {})}
        return parse_policy({"apiVersion": "gpu.kubeon.io/v1alpha1", "kind": "GpuPolicy",
                             "metadata": {"name": name}, "spec": body})

    policies = [
        make("park", "Automatic", {"scaleToZero": {"namespaces": ["research"]}}),
        make("park-rec", "Recommend", {"scaleToZero": {"namespaces": ["quiet"]}}),
        make("restart", "Approve", {"selector": {"namespaces": ["inference", "batch"]},
                                    "sharing": {"strategy": "MIG", "rollout": "Restart"}}),
        make("restart-rec", None, {"selector": {"namespaces": ["staging"]},
                                   "sharing": {"strategy": "MIG", "rollout": "Restart"}}),
        make("no-restart", "Automatic", {"selector": {"namespaces": ["web"]}, "sharing": {"strategy": "MIG"}}),
    ]
    assert write_namespaces(policies, Mode.RECOMMEND, True) == {"research"}
    assert write_namespaces(policies, Mode.AUTOMATIC, True) == {"research"}
    policies.append(make("park-default", None, {"scaleToZero": {"namespaces": ["batch"]}}))
    assert write_namespaces(policies, Mode.RECOMMEND, True) == {"research"}
    assert write_namespaces(policies, Mode.AUTOMATIC, True) == {"research", "batch"}
    assert write_namespaces(policies, Mode.AUTOMATIC, False) == set(), "no Prometheus: all stay Recommend"
