"""The packing engine: one solver for the extender, the simulator and the consolidation planner. Pure.

`decide(state, demand, strategy, ctx)` fits the pod against every node, asks
the strategy to score the feasible ones, and returns a `Placement` (node, GPU
indices, and per-node scores and reasons for explanations). MIG and
time-sliced demands are packed by count for every strategy here
(`placement.with_device_counts`; MIG devices on GPU rows go to the fullest
cut GPU first), so the extender, the simulator and the consolidation planner
share that rule too; strategies only see milli-GPUs. A pod that asks no GPU goes
to a feasible node without GPUs first, whatever the strategy
(`placement.with_gpu_less_nodes_first`: GPU nodes' CPU and memory stay for GPU
pods; openb, GPU nodes only, is unchanged). It never
mutates the state: the caller commits with `commit(state, demand, decision)`
(Solve, then Record). Ties in score go to the lowest `ctx.tie_rank`.

`STRATEGIES` is the one ordered registry of scoring strategies, selectable by
name (`get_strategy`); there is no separate strategy for MIG/time-sliced pods
(the count term above applies to all). Order: the project's default first
(what `--strategy` and the extender fall back to), then the paper's strategies
from strongest to weakest, then ablations.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpupolicy.packing.fragmentation import Fgd
from gpupolicy.packing.nodemodel import IntArray, NodeState, PodDemand
from gpupolicy.packing.placement import (
    REASON_BY_CODE,
    FitResult,
    FloatArray,
    PackingContext,
    RejectReason,
    Strategy,
    fit,
    rows_to_work_on,
    sorted_rows,
    to_gpu_indices,
    with_device_counts,
    with_gpu_less_nodes_first,
)
from gpupolicy.packing.strategies.baselines import BestFit, DotProd, GpuPacking, Random
from gpupolicy.packing.strategies.kubeon import Kubeon

# Order: default first (the fallback of --strategy and the extender), then the paper's strategies
# strongest to weakest, then ablations. Every entry gets the engine's count term for MIG and
# time-sliced demands in `decide` (placement.with_device_counts).
STRATEGIES: dict[str, Strategy] = {
    p.name: p
    for p in (
        Kubeon(),  # default: FGD's fragment + named, weighted parts (strategies/kubeon.py)
        Fgd(),  # the paper's best published strategy
        BestFit(),
        GpuPacking(),
        DotProd(),
        Random(),
        Fgd(name="fgd-exact", description="FGD without the integer rounding (ablation)", exact=True),
    )
}
DEFAULT_STRATEGY = next(iter(STRATEGIES))


class UnknownStrategyError(ValueError):
    """A strategy name not in `STRATEGIES`."""


def get_strategy(name: str | None) -> Strategy:
    """The strategy registered under `name` (the default when None or empty)."""
    key = name or DEFAULT_STRATEGY
    if key not in STRATEGIES:
        raise UnknownStrategyError(f"unknown strategy {key!r}; choose from {', '.join(STRATEGIES)}")
    return STRATEGIES[key]


@dataclass(frozen=True)
class Placement:
    """The solver's answer for one pod: where it goes (`node` None when no node fits).

    `scores` holds the strategy's score per node (-inf where infeasible) for
    every node of the state, or, after a decision restricted to some nodes,
    for `nodes` (sorted) alone, position i being `nodes[i]`'s (`scores_of`).
    `fit` says why a node was rejected, for every node or at least for
    `nodes` (`reason`). `gpu_indices`: the GPUs the pod takes on the chosen
    node.
    """

    node: int | None
    gpu_indices: tuple[int, ...]
    scores: FloatArray
    fit: FitResult
    strategy: str
    nodes: IntArray | None = None

    def reason(self, node: int) -> RejectReason:
        return self.fit.reason(node)

    def scores_of(self, nodes: IntArray) -> FloatArray:
        """The scores of `nodes` (any order); -inf for a node the decision did not consider."""
        if self.nodes is None:
            out: FloatArray = self.scores[nodes]
            return out
        pos = np.searchsorted(self.nodes, nodes)
        inside = pos < len(self.nodes)
        pos = np.where(inside, pos, 0)
        known = inside & (self.nodes[pos] == nodes) if len(self.nodes) else inside
        return np.where(known, self.scores[pos] if len(self.nodes) else -np.inf, -np.inf)


def decide(
    state: NodeState,
    demand: PodDemand,
    strategy: Strategy,
    ctx: PackingContext,
    restrict: IntArray | None = None,
    fitted: FitResult | None = None,
) -> Placement:
    """Score `demand` against all nodes (or only the rows `restrict`) and pick the best. Does not mutate.

    `fitted`: `fit(state, demand)` (or `fit(..., nodes)` covering `restrict`)
    when the caller already has it for this very state and demand (the
    extender's /filter for the same pod), to skip checking the fit rules
    twice. With `restrict` given as rows (fewer than a quarter of the state:
    `rows_to_work_on`), the work is on those rows alone (the extender's few
    hundred of a cluster's thousands of nodes) and the Placement's
    `scores`/`fit` cover them (`Placement.nodes`); the chosen node is the same
    as over all nodes with the others made infeasible.
    """
    if restrict is not None and restrict.dtype == np.bool_:
        restrict = np.flatnonzero(restrict)
    few = rows_to_work_on(len(state), restrict)
    nodes: IntArray | None = None if few is None else sorted_rows(few)
    if nodes is None:
        if fitted is None or fitted.nodes is not None:
            fitted = fit(state, demand)
        feasible = fitted.feasible
        if restrict is not None:
            allowed = np.zeros(len(state), dtype=bool)
            allowed[restrict] = True
            feasible = feasible & allowed
        candidates = np.flatnonzero(feasible)
        scores = np.full(len(state), -np.inf)
    else:  # the candidates' order is the row order, as over all nodes
        codes = fitted.codes_of(nodes) if fitted is not None else None
        if fitted is None or codes is None:
            fitted = fit(state, demand, nodes)
            codes = fitted.codes
        feasible = codes == 0
        candidates = nodes[feasible]
        scores = np.full(len(nodes), -np.inf)
    if candidates.size == 0:
        return Placement(None, (), scores, fitted, strategy.name, nodes)
    scored = with_device_counts(state, demand, candidates, strategy.score(state, demand, candidates, ctx))
    scored = with_gpu_less_nodes_first(state, demand, candidates, scored)
    if nodes is None:
        scores[candidates] = scored.scores
    else:
        scores[feasible] = scored.scores
    rank = ctx.rank(state)[candidates]
    top = scored.scores == scored.scores.max()
    pick = np.flatnonzero(top)
    if scored.tiebreak is not None and pick.size > 1:
        tb = scored.tiebreak[pick]
        pick = pick[tb == tb.max()]
    best = int(pick[np.argmin(rank[pick])])
    node = int(candidates[best])
    chosen_gpu = int(scored.gpu[best]) if scored.gpu is not None else -1
    return Placement(node, to_gpu_indices(state, node, demand, chosen_gpu), scores, fitted, strategy.name, nodes)


def commit(state: NodeState, demand: PodDemand, decision: Placement) -> None:
    """Apply a decision to the state (the caller that acts does this, not the solver)."""
    if decision.node is not None:
        state.place(decision.node, demand, decision.gpu_indices)


@dataclass(frozen=True)
class NodeVerdict:
    """One node's line in an explanation."""

    node: str
    feasible: bool
    reason: RejectReason
    score: float | None


def explain(state: NodeState, decision: Placement, nodes: Sequence[int] | None = None) -> list[NodeVerdict]:
    """Per-node scores and rejection reasons of a decision, best first, for logs and dry-run."""
    idx = np.arange(len(state)) if nodes is None else np.asarray(nodes, dtype=np.int64)
    codes = decision.fit.codes_of(idx)
    if codes is None:
        raise ValueError("explain: nodes outside the decision's")
    out = []
    for n, code, score in zip(idx.tolist(), codes.tolist(), decision.scores_of(idx).tolist(), strict=True):
        out.append(NodeVerdict(state.names[n], code == 0, REASON_BY_CODE[code],
                               score if np.isfinite(score) else None))
    out.sort(key=lambda v: (not v.feasible, -(v.score if v.score is not None else 0.0)))
    return out


def normalise_scores(scores: FloatArray, top: int = 10) -> IntArray:
    """Map strategy scores of feasible nodes to 0..top (the extender's prioritize range)."""
    finite = np.isfinite(scores)
    out = np.zeros(len(scores), dtype=np.int64)
    if not finite.any():
        return out
    lo, hi = scores[finite].min(), scores[finite].max()
    if hi > lo:
        out[finite] = np.round((scores[finite] - lo) / (hi - lo) * top).astype(np.int64)
    else:
        out[finite] = top
    return out
