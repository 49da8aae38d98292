"""The webhook and the layout agree: a pod is rewritten only to a slice some node offers or is told to offer."""

from __future__ import annotations

from gpupolicy.admission.mutate import mutate_pod
from gpupolicy.catalog import WANTED_RESOURCE_ANNOTATION
from gpupolicy.cluster import ClusterView, NodeInfo
from gpupolicy.model import GpuPolicy, GpuPolicyStatus, Proposal, ProposalState
from tests.core.builders import apply, limits, make_node, make_pod, make_policy

MIG = make_policy("mig", sharing={"strategy": "MIG", "migProfile": "1g.10gb"})
SHARE = make_policy("share", sharing={"strategy": "TimeSlicing", "replicas": 4})
WHOLE = make_node("whole", offers_slices=False)


def rewrite(policy: GpuPolicy, *nodes: NodeInfo) -> tuple[dict[str, str], dict[str, str], list[str], str]:
    result = mutate_pod(make_pod(), ClusterView(policies=(policy,), nodes=nodes, metrics_configured=True))
    pod = apply(make_pod(), result.patch)
    return limits(pod), pod["metadata"].get("annotations") or {}, result.warnings, result.decisions[0].reason


def test_a_slice_no_node_offers_leaves_the_pod_whole_with_a_warning_and_marks_what_it_wanted() -> None:
    got, annotations, warnings, _ = rewrite(MIG, WHOLE)
    assert got == {"cpu": "1", "nvidia.com/gpu": "1"}
    assert warnings == ["kubeon-gpu mig: no node offers nvidia.com/mig-1g.10gb yet: pod left on whole GPUs"]
    assert annotations[WANTED_RESOURCE_ANNOTATION] == "nvidia.com/mig-1g.10gb"


def test_a_node_told_to_offer_it_is_enough_before_allocatable_shows() -> None:
    told = make_node("told", offers_slices=False, **{"nvidia.com/mig.config": "all-1g.10gb"})
    got, annotations, warnings, _ = rewrite(MIG, WHOLE, told)
    assert got == {"cpu": "1", "nvidia.com/mig-1g.10gb": "1"} and warnings == []
    assert WANTED_RESOURCE_ANNOTATION not in annotations


def test_a_layout_the_planner_will_apply_counts_one_it_only_proposes_does_not() -> None:
    for state, rewritten in ((ProposalState.APPROVED, True), (ProposalState.PROPOSED, False)):
        policy = MIG.model_copy(update={"status": GpuPolicyStatus(proposals=[Proposal(
            id="x", target="Node/whole", action="layout MIG all-1g.10gb", state=state,
            resource="nvidia.com/mig-1g.10gb")])})
        got, _, _, _ = rewrite(policy, WHOLE)
        assert ("nvidia.com/mig-1g.10gb" in got) is rewritten, state


def test_a_share_is_one_over_the_replicas_the_nodes_run() -> None:
    sliced = NodeInfo("ts", {"nvidia.com/gpu.product": "NVIDIA-L4-SHARED", "nvidia.com/gpu.replicas": "8",
                             "nvidia.com/device-plugin.config": "kubeon-ts-r8-x"}, {"nvidia.com/gpu.shared": "8"})
    got, _, _, reason = rewrite(SHARE, sliced)
    assert got == {"cpu": "1", "nvidia.com/gpu.shared": "1"}
    assert reason.endswith("time-sliced share (1/8 of a GPU)")
    _, _, warnings, _ = rewrite(SHARE, WHOLE)
    assert warnings == ["kubeon-gpu share: no node offers nvidia.com/gpu.shared yet: pod left on whole GPUs"]
