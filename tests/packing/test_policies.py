"""Each scoring policy on small hand-worked node states: the expected winner and why.

Real: the packing engine (fit rules, policies, decide). Faked: nothing; the
node states are built by hand with the builders.
"""

from __future__ import annotations

import numpy as np
import pytest

from gpupolicy.packing.engine import (
    DEFAULT_STRATEGY,
    STRATEGIES,
    UnknownStrategyError,
    commit,
    decide,
    explain,
    get_strategy,
)
from gpupolicy.packing.fragmentation import sigmoid_score
from gpupolicy.packing.placement import PackingContext, RejectReason
from gpupolicy.packing.scheduling import used_first_rank
from tests.packing.builders import make_ctx, make_pod, make_state


def test_registry_order_and_default() -> None:
    assert list(STRATEGIES)[:6] == ["kubeon", "fgd", "bestfit", "packing", "dotprod", "random"]
    assert DEFAULT_STRATEGY == "kubeon"
    assert get_strategy(None).name == "kubeon"
    with pytest.raises(UnknownStrategyError, match="nope"):
        get_strategy("nope")


def test_bestfit_picks_node_left_with_least_free() -> None:
    # A has 2 free GPUs and 32 cores; B is empty (8 GPUs, 96 cores). A 1-GPU pod leaves A with
    # 1 GPU + 28 cores (score 100*(1 - .5*28/128 - .5*1/8) = 82) and B with 7 GPUs + 92 cores (20).
    state = make_state([("A", 32000, 65536, [0] * 6 + [1000] * 2, "G2"),
                        ("B", 96000, 65536, [1000] * 8, "G2")])
    d = decide(state, make_pod(gpus=1, cpu=4000), get_strategy("bestfit"), make_ctx())
    assert state.names[d.node] == "A"
    assert d.scores.tolist() == [82.0, 20.0]
    assert d.gpu_indices == (6,)  # lowest-indexed fully free GPU


def test_packing_prefers_partly_used_gpu_over_empty_node() -> None:
    # Sharing pod of 500m: A has a GPU with 600m free (case 1: 100 - 60/10 = 94);
    # B is empty with 8 GPUs (case 3: 33 - 8 = 25).
    state = make_state([("A", 8000, 8192, [600, 1000], "T4"), ("B", 8000, 8192, [1000] * 8, "T4")])
    d = decide(state, make_pod(gpus=1, milli=500), get_strategy("packing"), make_ctx())
    assert state.names[d.node] == "A" and d.gpu_indices == (0,)
    assert d.scores.tolist() == [94.0, 25.0]


def test_fgd_fills_the_sliver_that_typical_pods_cannot_use() -> None:
    # Typical mix: whole 1-GPU pods only. A = [1000, 1000] has no fragment; B = [600, 1000]
    # has 600m of fragment (a 1-GPU pod cannot use it). A 500m pod on B's GPU 0 shrinks
    # B's fragment to 100m: delta +500 -> int(100*sigmoid(0.5)) = 62. On A it creates a
    # 500m fragment: delta -500 -> 37. On B's GPU 1 it also creates one: 37. Winner B, GPU 0.
    mix = [make_pod(gpus=1, cpu=0)]
    state = make_state([("A", 8000, 8192, [1000, 1000], "T4"), ("B", 8000, 8192, [600, 1000], "T4")])
    d = decide(state, make_pod(gpus=1, milli=500, cpu=0), get_strategy("fgd"), make_ctx(mix))
    assert state.names[d.node] == "B" and d.gpu_indices == (0,)
    assert d.scores.tolist() == [37.0, 62.0]
    assert sigmoid_score(np.array([500.0, -500.0])).tolist() == [62.0, 37.0]


def test_fgd_ties_go_to_the_lowest_tie_rank() -> None:
    # Two identical empty nodes score the same; the fixed order (tie_rank) decides.
    mix = [make_pod(gpus=1, cpu=0)]
    state = make_state([("A", 8000, 8192, [1000, 1000], "T4"), ("B", 8000, 8192, [1000, 1000], "T4")])
    ctx = make_ctx(mix)
    ctx.tie_rank = np.array([1, 0])
    d = decide(state, make_pod(gpus=1, cpu=0), get_strategy("fgd"), ctx)
    assert state.names[d.node] == "B"


def test_dotprod_prefers_node_whose_free_vector_is_least_aligned() -> None:
    # A CPU-heavy pod: A has its CPU free (aligned, large dot product), B has little CPU left.
    state = make_state([("A", 64000, 65536, [0, 0], "T4"), ("B", 8000, 65536, [0, 0], "T4")])
    state.cpu_cap[:] = 64000
    d = decide(state, make_pod(gpus=0, cpu=8000), get_strategy("dotprod"), make_ctx())
    assert state.names[d.node] == "B"


def test_random_policy_is_seeded() -> None:
    state = make_state([(f"n{i}", 8000, 8192, [1000], "T4") for i in range(20)])
    pod = make_pod(gpus=1)
    a = decide(state, pod, get_strategy("random"), make_ctx(seed=1)).node
    b = decide(state, pod, get_strategy("random"), make_ctx(seed=1)).node
    picks = {decide(state, pod, get_strategy("random"), make_ctx(seed=s)).node for s in range(10)}
    assert a == b and len(picks) > 1


def test_live_ties_go_to_the_fuller_node() -> None:
    # Mix of CPU-only pods: every idle GPU is fragment, so a 1-GPU pod lowers F by 1000 on
    # any node: the strategies tie. In the simulator's per-seed order (B first) FGD takes B.
    # Live, the extender's tie order (scheduling.used_first_rank) puts nodes in use first:
    # kubeon takes A, which is already in use, and keeps the untouched B whole for a 4-GPU
    # pod. (kubeon's own used-first tie-break, the same rule a second time, did not earn its
    # keep on the default trace: docs/benchmarks/history/packing.md.)
    mix = [make_pod(gpus=0, cpu=1000)]
    state = make_state([("A", 8000, 8192, [0, 0, 1000, 1000], "T4"), ("B", 8000, 8192, [1000] * 4, "T4")])
    ctx = make_ctx(mix)
    ctx.tie_rank = np.array([1, 0])
    assert state.names[decide(state, make_pod(gpus=1), get_strategy("fgd"), ctx).node] == "B"
    ctx.tie_rank = used_first_rank(state)
    assert state.names[decide(state, make_pod(gpus=1), get_strategy("kubeon"), ctx).node] == "A"


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_every_policy_respects_fit_and_explains(name: str) -> None:
    # C is the only node with a T4 and enough CPU: every policy must choose it.
    state = make_state([("A", 1000, 8192, [1000], "T4"), ("B", 8000, 8192, [1000], "P100"),
                        ("C", 8000, 8192, [1000], "T4")])
    pod = make_pod(gpus=1, cpu=4000, spec="T4")
    ctx = make_ctx([pod])
    d = decide(state, pod, get_strategy(name), ctx)
    assert state.names[d.node] == "C"
    verdicts = {v.node: v for v in explain(state, d)}
    assert verdicts["A"].reason is RejectReason.INSUFFICIENT_CPU and verdicts["A"].score is None
    assert verdicts["B"].reason is RejectReason.GPU_MODEL
    assert verdicts["C"].feasible
    commit(state, pod, d)
    assert decide(state, pod, get_strategy(name), ctx).node is None


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_every_policy_sends_a_cpu_only_pod_to_a_node_without_gpus_first(name: str) -> None:
    # "busy" holds GPU work with cores to spare, ranked first in the tie order (as live); "cpu" has no
    # GPUs. A CPU-only pod goes to "cpu" whatever the strategy (without the engine's rule FGD, kubeon,
    # GpuPacking and DotProd took "busy"). A pod "cpu" cannot hold still packs the GPU nodes.
    state = make_state([("busy", 64000, 262144, [0, 0, 1000, 1000], "T4"),
                        ("empty", 64000, 262144, [1000] * 4, "T4"), ("cpu", 16000, 65536, [], "")])
    ctx = make_ctx([make_pod(gpus=1, cpu=8000), make_pod(cpu=2000)])
    ctx.tie_rank = used_first_rank(state)
    assert state.names[decide(state, make_pod(cpu=4000, mem=8192), get_strategy(name), ctx).node] == "cpu"
    wide = decide(state, make_pod(cpu=32000, mem=8192), get_strategy(name), ctx)
    assert wide.node is not None and state.names[wide.node] != "cpu"
    assert decide(state, make_pod(gpus=1), get_strategy(name), ctx).node != state.index["cpu"]


def test_a_cpu_only_pod_asked_about_a_few_nodes_takes_the_one_without_gpus() -> None:
    # The extender's request-restricted path (a few rows of a larger state: placement.rows_to_work_on).
    state = make_state([*[(f"gpu-{i}", 64000, 262144, [0, 0, 1000, 1000], "T4") for i in range(10)],
                        ("cpu", 16000, 65536, [], "")])
    ctx = make_ctx([make_pod(gpus=1, cpu=8000), make_pod(cpu=2000)])
    ctx.tie_rank = used_first_rank(state)
    rows = np.array([state.index["gpu-3"], state.index["cpu"]])
    got = decide(state, make_pod(cpu=4000, mem=8192), get_strategy("kubeon"), ctx, restrict=rows)
    assert got.nodes is not None  # the restricted path was taken
    assert got.node == state.index["cpu"]


def test_fgd_needs_a_mix() -> None:
    state = make_state([("A", 8000, 8192, [1000], "T4")])
    with pytest.raises(ValueError, match="typical pod mix"):
        decide(state, make_pod(gpus=1), get_strategy("fgd"), PackingContext())


def test_scores_for_5000_nodes_are_vectorised_and_normalised() -> None:
    from gpupolicy.packing.engine import normalise_scores

    rng = np.random.default_rng(3)
    nodes = [(f"n{i}", 64000, 262144, list(rng.choice([0, 300, 700, 1000], size=8)), "G2") for i in range(5000)]
    state = make_state(nodes)
    pod = make_pod(gpus=1, milli=300, cpu=2000)
    d = decide(state, pod, get_strategy("kubeon"), make_ctx([pod, make_pod(gpus=1)]))
    assert d.node is not None and np.isfinite(d.scores).sum() == np.count_nonzero(d.fit.feasible)
    top = normalise_scores(d.scores)
    assert top[d.node] == 10 and top.min() >= 0 and top.max() == 10
