"""Multi-node: the largest set (2 or more) of the cheapest-to-move candidates whose pods all re-place on the
remaining nodes at once (Karpenter's multinodeconsolidation.go). The set is a prefix of the candidates in
that order, its size found by halving between 2 and the budget's room.
"""

from __future__ import annotations

from gpupolicy.capacity.disruption.inputs import MULTI_NODE
from gpupolicy.capacity.disruption.planning import Planning
from gpupolicy.capacity.disruption.replay import replace_pods


class MultiNode:
    name = MULTI_NODE
    ends_pass = True  # one action per call: the next call sees where the pods went

    def plan(self, run: Planning) -> None:
        ask, base = run.ask, run.base
        candidates = run.cheapest_to_move()
        free_gpu = run.free_gpu()
        lo, hi = 2, min(run.room(), len(candidates))
        best: tuple[list[int], dict[str, int]] | None = None
        while lo <= hi and run.may_simulate():
            mid = (lo + hi) // 2
            group = candidates[:mid]
            need = sum(run.used_milli(n) for n in group)
            moves = None
            if need <= free_gpu - sum(int(base.gpu_free_total[n]) for n in group):
                run.trials += 1
                pods = [p for n in group for p in ask.pods_on[n]]
                moves = replace_pods(base, group, pods, run.strategy, run.ctx, run.refused(group))
            if moves is not None:
                best, lo = (group, moves), mid + 1
            else:
                hi = mid - 1
        if best is not None:
            run.add(best[0], MULTI_NODE, best[1])
