"""Decisions over the nodes asked about equal decisions over the whole cluster, restricted to them.

Issue 16: the extender's work per request follows the request (the few
hundred nodes kube-scheduler samples), not the cluster: `fit(..., nodes)`,
`unresolvable_mask(..., nodes)`, `decide(restrict=rows)` and the per-state
caches synced for the rows read (`FragModel.sync(rows)`,
`UsedFirstRank.sync(rows)`, `RowKeys.sync(rows)`). The reference is the same
code over every node (a fresh context each time, every cache synced in
full). Real: the engine, its strategies and caches on random states that
change between decisions; nothing is faked.
"""

from __future__ import annotations

import numpy as np
import pytest

from gpupolicy.packing import scheduling
from gpupolicy.packing.engine import decide, get_strategy
from gpupolicy.packing.nodemodel import NodeState, PodDemand
from gpupolicy.packing.placement import FitResult, PackingContext, fit
from gpupolicy.packing.typicalmix import TypicalMix
from tests.packing.test_incremental_decisions import random_state

DEMANDS = (
    PodDemand(cpu_milli=4000, memory_mib=16384, num_gpu=1, gpu_milli=1000),
    PodDemand(cpu_milli=8000, memory_mib=32768, num_gpu=2, gpu_milli=1000),
    PodDemand(cpu_milli=2000, memory_mib=4096, num_gpu=1, gpu_milli=300),
    PodDemand(cpu_milli=1000, memory_mib=2048),
    PodDemand(cpu_milli=1000, memory_mib=2048, mig={"nvidia.com/mig-1g.10gb": 2}),
    PodDemand(cpu_milli=1000, memory_mib=2048, shared=2),
    PodDemand(cpu_milli=2000, memory_mib=4096, num_gpu=1, gpu_milli=1000, allowed_models=frozenset({"A100"})),
    PodDemand(cpu_milli=2000, memory_mib=4096, num_gpu=1, gpu_milli=500, gpu_memory_mib=30000),
)
MIX = TypicalMix.from_pods([d for d in DEMANDS[:4]])


def masked(state: NodeState, demand: PodDemand, rows: np.ndarray) -> FitResult:
    """The whole-cluster fit with every node outside `rows` made infeasible: the old restricted decision."""
    codes = fit(state, demand).codes.copy()
    outside = np.ones(len(state), dtype=bool)
    outside[rows] = False
    codes[outside & (codes == 0)] = 1
    return FitResult(codes)


def change(state: NodeState, rng: np.random.Generator) -> None:
    """A few pods placed where they fit (rows move as in a live cluster between two requests)."""
    for _ in range(3):
        demand = DEMANDS[int(rng.integers(4))]
        feasible = np.flatnonzero(fit(state, demand).feasible)
        if feasible.size:
            node = int(rng.choice(feasible))
            gpus = tuple(int(g) for g in np.flatnonzero(state.gpu_free[node] >= demand.gpu_milli)[:demand.num_gpu])
            state.place(node, demand, gpus)


@pytest.mark.parametrize("strategy", ["kubeon", "fgd", "bestfit"])
def test_restricted_work_gives_the_whole_clusters_answers_for_the_rows_asked(strategy: str) -> None:
    rng = np.random.default_rng(11)
    state = random_state(rng, n=120)
    ctx = PackingContext(mix=MIX)  # kept across decisions: its caches sync only the rows read
    keys, rank = scheduling.RowKeys(state), scheduling.UsedFirstRank(state)
    picked = 0
    for step in range(150):
        change(state, rng)
        demand = DEMANDS[step % len(DEMANDS)]
        rows = rng.choice(len(state), size=int(rng.integers(1, 40)), replace=False).astype(np.int64)
        nodes = np.unique(rows)
        full = fit(state, demand)
        part = fit(state, demand, nodes)
        assert np.array_equal(part.codes, full.codes[nodes]) and np.array_equal(part.nodes, nodes)
        assert np.array_equal(part.codes_of(rows), full.codes[rows])
        assert np.array_equal(scheduling.unresolvable_mask(state, demand, part.codes, nodes),
                              scheduling.unresolvable_mask(state, demand, full.codes)[nodes])
        ctx.tie_rank = rank.sync(rows)
        fresh = PackingContext(mix=MIX, tie_rank=scheduling.used_first_rank(state))
        got = decide(state, demand, get_strategy(strategy), ctx, restrict=rows)
        want = decide(state, demand, get_strategy(strategy), fresh, fitted=masked(state, demand, rows))
        assert (got.node, got.gpu_indices) == (want.node, want.gpu_indices)
        assert np.array_equal(got.scores_of(rows), want.scores[rows])
        assert [got.reason(int(r)) for r in rows] == [want.reason(int(r)) for r in rows]
        if got.node is not None:
            picked += 1
            assert np.array_equal(scheduling.identical_to(state, got.node, rows, keys),
                                  scheduling.identical_to(state, got.node, rows))
    assert picked > 60


def test_a_restricted_fit_answers_only_for_the_rows_it_checked() -> None:
    state = random_state(np.random.default_rng(5), n=20)
    part = fit(state, DEMANDS[0], np.array([2, 5, 9], dtype=np.int64))
    assert part.codes_of(np.array([9, 2], dtype=np.int64)) is not None
    assert part.codes_of(np.array([3], dtype=np.int64)) is None
    assert part.codes_of(np.array([19], dtype=np.int64)) is None
    with pytest.raises(KeyError):
        part.reason(4)
