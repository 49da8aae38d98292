"""MIG devices and time-sliced replicas in the engine: every registered policy packs them by count.

Real: NodeState (MIG rows included), fit, decide, every policy in STRATEGIES,
NodeState.reset_row, capacity.nodes.with_rows. Faked: nothing; the node states
are built by hand.

Why these winners: node-level free counts are what the device plugin fits by,
so `decide` ranks count pods by the fewest free units of the requested
resources left (partly used nodes fill first), whatever the policy; the
policy's own order only breaks ties among equal counts. Where a node's GPUs
are rows cut by its MIG layout, a MIG device goes first to the fullest cut GPU
with room (the least free milli left), then by count.
"""

from __future__ import annotations

import numpy as np
import pytest

from gpupolicy.capacity.nodes import with_rows
from gpupolicy.packing.engine import STRATEGIES, decide, get_strategy
from gpupolicy.packing.nodemodel import NodeSpec, NodeState, PodDemand
from gpupolicy.packing.placement import PackingContext, lexicographic
from tests.packing.builders import make_ctx, make_pod

MIG = "nvidia.com/mig-1g.10gb"
MIG3 = "nvidia.com/mig-3g.40gb"


def mig_shared_state() -> NodeState:
    # fresh-mig: 7 free 1g slices; used-mig: 2 free (5 taken); ts-fresh: 4 replicas; ts-used: 1 free.
    state = NodeState.build([
        NodeSpec("fresh-mig", 64000, 262144, 0, "A100", mig={MIG: 7}),
        NodeSpec("used-mig", 64000, 262144, 0, "A100", mig={MIG: 7, MIG3: 1}),
        NodeSpec("ts-fresh", 32000, 131072, 0, "Tesla-T4", shared=4),
        NodeSpec("ts-used", 32000, 131072, 0, "Tesla-T4", shared=4),
        NodeSpec("gpu", 32000, 131072, 4, "A100"),
    ])
    state.place(1, PodDemand(cpu_milli=1000, mig={MIG: 5}))
    state.place(3, PodDemand(cpu_milli=1000, shared=3))
    return state


def ctx_for(pod: PodDemand) -> PackingContext:
    return make_ctx([pod])  # FGD-style policies need a mix; the pod itself, as the extender's fallback


@pytest.mark.parametrize("policy", list(STRATEGIES))
def test_every_policy_packs_mig_pods_onto_the_partly_used_node(policy: str) -> None:
    pod = PodDemand(cpu_milli=1000, memory_mib=1024, mig={MIG: 1})
    d = decide(mig_shared_state(), pod, get_strategy(policy), ctx_for(pod))
    assert d.node == 1, "used-mig is left with 1 free slice, fresh-mig with 6"
    assert d.scores.tolist()[:2] == [-6.0, -1.0]
    assert not np.isfinite(d.scores[2:]).any()  # time-sliced and whole-GPU nodes have no MIG slices


@pytest.mark.parametrize("policy", list(STRATEGIES))
def test_every_policy_packs_time_sliced_pods_by_replica_count(policy: str) -> None:
    pod = PodDemand(cpu_milli=500, memory_mib=512, shared=1)
    d = decide(mig_shared_state(), pod, get_strategy(policy), ctx_for(pod))
    assert d.node == 3, "ts-used keeps 0 free replicas, ts-fresh 3"
    assert d.scores[2] == -3.0 and d.scores[3] == 0.0


def test_equal_counts_go_by_the_policy_score() -> None:
    # Two fresh time-sliced nodes (4 replicas each) leave equal counts; BestFit then prefers the
    # node left with less CPU (A: 8 of 16 cores taken already), though B is first in tie order.
    state = NodeState.build([NodeSpec("B", 16000, 65536, 0, "T4", shared=4),
                             NodeSpec("A", 16000, 65536, 0, "T4", shared=4)])
    state.place(1, PodDemand(cpu_milli=8000))
    pod = PodDemand(cpu_milli=1000, shared=1)
    assert decide(state, pod, get_strategy("bestfit"), make_ctx()).node == 1
    # with the same CPU left, the fixed tie order (rank) decides: B first
    state.remove(1, PodDemand(cpu_milli=8000))
    assert decide(state, pod, get_strategy("bestfit"), make_ctx()).node == 0


def test_whole_gpu_pod_with_shared_replicas_keeps_the_policy_score_first() -> None:
    # BestFit on whole GPUs decides (X is left with fewer GPUs); replicas only break ties.
    state = NodeState.build([NodeSpec("X", 16000, 65536, 2, "T4", shared=8),
                             NodeSpec("Y", 16000, 65536, 8, "T4", shared=1)])
    pod = PodDemand(cpu_milli=1000, num_gpu=1, gpu_milli=1000, shared=1)
    d = decide(state, pod, get_strategy("bestfit"), make_ctx())
    assert d.node == 0 and d.gpu_indices == (0,)


def test_milli_gpu_pods_are_untouched_by_the_count_term() -> None:
    state = NodeState.build([NodeSpec("A", 8000, 8192, 2, "T4", shared=4), NodeSpec("B", 8000, 8192, 8, "T4")])
    pod = make_pod(gpus=1, cpu=1000)
    d = decide(state, pod, get_strategy("bestfit"), make_ctx())
    assert d.scores.tolist() == [
        np.trunc((1 - (0.5 * 7000 / 128000 + 0.5 * 1000 / 8000)) * 100),
        np.trunc((1 - (0.5 * 7000 / 128000 + 0.5 * 7000 / 8000)) * 100)]


def test_lexicographic_orders_like_the_pair() -> None:
    first = np.array([1.0, 1.0, 2.0, 0.5])
    then = np.array([-100.0, 3.0, -7.0, 1e9])
    key = lexicographic(first, then)
    assert np.argsort(-key, kind="stable").tolist() == [2, 1, 0, 3]
    assert lexicographic(first, None) is first


def test_reset_row_restores_capacity_and_checks_the_layout() -> None:
    spec = NodeSpec("m", 8000, 8192, 2, "A100", mig={MIG: 3}, shared=2)
    state = NodeState.build([spec])
    state.place(0, PodDemand(cpu_milli=500, memory_mib=100, num_gpu=1, gpu_milli=1000, mig={MIG: 2}, shared=1),
                (0,))
    version = int(state.row_version[0])
    state.reset_row(0, spec, schedulable=False)
    assert (state.cpu_free[0], state.mem_free[0], state.full_count[0], state.gpu_free_total[0]) == (8000, 8192, 2, 2000)
    assert state.mig_free[0].tolist() == [3] and state.shared_free[0] == 2
    assert not state.schedulable[0] and state.row_version[0] > version
    with pytest.raises(ValueError, match="capacity or layout changed"):
        state.reset_row(0, NodeSpec("m", 16000, 8192, 2, "A100", mig={MIG: 3}, shared=2))


# ---------------------------------------------------------------- MIG devices on GPU rows

def mig_rows_state() -> NodeState:
    """cut: 2 GPUs all-1g.10gb, 4 devices held on GPU 0 (10 free in all); whole: 1 untouched GPU
    (7 free). The count best fit alone would start the untouched GPU (6 left against 9)."""
    state = NodeState.build([
        NodeSpec("cut", 64000, 262144, 2, "A100", mig={MIG: 14}, exclusive=False, mig_per_gpu={MIG: 7}),
        NodeSpec("whole", 64000, 262144, 1, "A100", mig={MIG: 7}, exclusive=False, mig_per_gpu={MIG: 7}),
    ])
    for _ in range(4):
        state.place(0, PodDemand(cpu_milli=1000, mig={MIG: 1}), (0,))
    return state


@pytest.mark.parametrize("policy", list(STRATEGIES))
def test_every_policy_puts_a_mig_slice_on_the_fullest_cut_gpu_before_an_untouched_one(policy: str) -> None:
    state = mig_rows_state()
    assert state.gpu_free.tolist() == [[428, 1000], [1000, 0]]  # 1000 * (7 - 4) // 7
    pod = PodDemand(cpu_milli=1000, memory_mib=1024, mig={MIG: 1})
    d = decide(state, pod, get_strategy(policy), ctx_for(pod))
    assert (d.node, d.gpu_indices) == (0, (0,))


def test_mig_devices_are_held_and_given_back_per_gpu() -> None:
    state = mig_rows_state()
    two = PodDemand(cpu_milli=1000, memory_mib=512, mig={MIG: 2})
    d = decide(state, two, get_strategy("kubeon"), ctx_for(two))
    assert (d.node, d.gpu_indices) == (0, (0, 0))  # both on GPU 0: three of its seven are free
    state.place(0, two, d.gpu_indices)
    assert state.gpu_free[0].tolist() == [142, 1000] and state.mig_free[0].tolist() == [8]
    state.remove(0, two, d.gpu_indices)
    assert state.gpu_free[0].tolist() == [428, 1000] and state.mig_free[0].tolist() == [10]
    with pytest.raises(ValueError, match="one per MIG device"):
        state.place(0, two, (0,))
    for _ in range(3):
        state.place(0, PodDemand(mig={MIG: 1}), (0,))
    assert state.gpu_free[0].tolist() == [0, 1000]  # every device of GPU 0 held: exactly 0 left
    with pytest.raises(ValueError, match=r"has no nvidia\.com/mig-1g\.10gb free"):
        state.place(0, PodDemand(mig={MIG: 1}), (0,))


def test_gpus_cut_by_mig_take_no_whole_gpu_or_share_and_rows_survive_new_nodes() -> None:
    state = mig_rows_state()
    for pod in (PodDemand(num_gpu=1, gpu_milli=1000), PodDemand(num_gpu=1, gpu_milli=100, shared=0)):
        assert decide(state, pod, get_strategy("kubeon"), ctx_for(pod)).node is None
    grown = with_rows(state, [NodeSpec("new", 8000, 8192, 4, "A100")])
    assert grown.gpu_free[:2, :2].tolist() == state.gpu_free.tolist()
    assert grown.mig_held[0, 0].tolist() == [4] and grown.mig_layout.tolist() == [7, 7, 0]
    grown.remove(0, PodDemand(cpu_milli=1000, mig={MIG: 1}), (0,))
    assert grown.gpu_free[0, 0] == 571
