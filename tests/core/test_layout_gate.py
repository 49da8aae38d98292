"""The webhook and the layout agree: a pod is rewritten only to a slice some node offers or is told to offer."""

from __future__ import annotations

from gpupolicy.admission.mutate import mutate_pod
from gpupolicy.capacity.timeslicing import KEY_PREFIX, config_key, is_our_key, sharing_config
from gpupolicy.catalog import SHARED_GPU_RESOURCE, WANTED_RESOURCE_ANNOTATION
from gpupolicy.cluster import OWN_PLUGIN_CONFIG_PREFIX, ClusterView, NodeInfo
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


def layout_labels(strategy: str) -> dict[str, str]:
    return {"nvidia.com/mig.config": "all-1g.10gb", "nvidia.com/mig.strategy": strategy}


def test_under_the_single_mig_strategy_a_mig_layout_label_offers_no_per_profile_resource() -> None:
    # single: the MIG devices are advertised as nvidia.com/gpu, nothing offers nvidia.com/mig-1g.10gb
    for told in (make_node("told", offers_slices=False, **layout_labels("single")),
                 NodeInfo("applied", {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb",
                                      "nvidia.com/mig.config.state": "success", **layout_labels("single")},
                          {"nvidia.com/gpu": "56"}),
                 make_node("none", offers_slices=False, **layout_labels("none"))):
        got, annotations, warnings, _ = rewrite(MIG, told)
        assert got == {"cpu": "1", "nvidia.com/gpu": "1"}, told.name
        assert warnings == ["kubeon-gpu mig: no node offers nvidia.com/mig-1g.10gb yet: pod left on whole GPUs"]
        assert annotations[WANTED_RESOURCE_ANNOTATION] == "nvidia.com/mig-1g.10gb"


def test_under_the_mixed_mig_strategy_a_node_being_re_laid_offers_its_layout_at_once() -> None:
    told = make_node("told", offers_slices=False, **layout_labels("mixed"))
    got, annotations, warnings, _ = rewrite(MIG, WHOLE, told)
    assert got == {"cpu": "1", "nvidia.com/mig-1g.10gb": "1"} and warnings == []
    assert WANTED_RESOURCE_ANNOTATION not in annotations
    # a node already advertising MIG devices per profile runs mixed, whatever its strategy label lags at
    moving = NodeInfo("moving", {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", **layout_labels("none")},
                      {"nvidia.com/mig-3g.40gb": "16"})
    assert "nvidia.com/mig-1g.10gb" in rewrite(MIG, moving)[0]


def test_an_approved_mig_layout_for_a_single_strategy_node_offers_nothing() -> None:
    single = make_node("single", offers_slices=False, **{"nvidia.com/mig.strategy": "single"})
    policy = MIG.model_copy(update={"status": GpuPolicyStatus(proposals=[Proposal(
        id="x", target="Node/single", action="layout MIG all-1g.10gb", state=ProposalState.APPROVED,
        resource="nvidia.com/mig-1g.10gb")])})
    got, _, _, _ = rewrite(policy, single)
    assert got == {"cpu": "1", "nvidia.com/gpu": "1"}


def test_an_operators_time_slicing_key_offers_a_share_only_where_allocatable_shows_it() -> None:
    # renameByDefault: false (the plugin's default): GFD labels the node time-sliced, shares are nvidia.com/gpu
    gfd = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB-SHARED", "nvidia.com/device-plugin.config": "time-sliced-4",
           "nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.sharing-strategy": "time-slicing"}
    got, annotations, warnings, _ = rewrite(SHARE, NodeInfo("theirs", gfd, {"nvidia.com/gpu": "32"}))
    assert got == {"cpu": "1", "nvidia.com/gpu": "1"}
    assert warnings == ["kubeon-gpu share: no node offers nvidia.com/gpu.shared yet: pod left on whole GPUs"]
    assert annotations[WANTED_RESOURCE_ANNOTATION] == "nvidia.com/gpu.shared"
    # the same key with renameByDefault: true, once the device plugin advertises it
    got, _, _, reason = rewrite(SHARE, NodeInfo("theirs", gfd, {"nvidia.com/gpu.shared": "32"}))
    assert got == {"cpu": "1", "nvidia.com/gpu.shared": "1"}
    assert reason.endswith("time-sliced share (1/4 of a GPU)")


def test_a_node_labelled_with_our_time_slicing_key_offers_a_share_before_allocatable_shows() -> None:
    ours = make_node("ours", offers_slices=False, **{"nvidia.com/device-plugin.config": config_key(4)})
    got, annotations, warnings, _ = rewrite(SHARE, WHOLE, ours)
    assert got == {"cpu": "1", "nvidia.com/gpu.shared": "1"} and warnings == []
    assert WANTED_RESOURCE_ANNOTATION not in annotations


def test_our_keys_are_the_ones_the_view_trusts_and_they_rename_shares() -> None:
    assert OWN_PLUGIN_CONFIG_PREFIX == KEY_PREFIX and is_our_key(config_key(4))
    assert sharing_config(4)["sharing"]["timeSlicing"]["renameByDefault"] is True
    view = ClusterView(nodes=(make_node("ours", offers_slices=False,
                                        **{"nvidia.com/device-plugin.config": config_key(4)}),))
    assert view.told_to_offer(view.nodes[0]) == {SHARED_GPU_RESOURCE}
