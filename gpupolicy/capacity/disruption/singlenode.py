"""Single-node: the first cheapest-to-move candidate whose pods all re-place elsewhere (a deletion) or, given
`instance_types`, on the other nodes plus new nodes that cost less than it (a replacement: `launches`,
launched and ready before the drain; savings are the difference in price). Karpenter's
singlenodeconsolidation.go: each candidate tries the deletion first, then the replacement.

A replacement is only simulated when nodes of one type holding the pods' summed CPU, memory and GPUs cost
less than the node (`may_replace`, a bound that skips hopeless ones; several nodes may replace one).
"""

from __future__ import annotations

from gpupolicy.capacity.disruption.inputs import SINGLE_NODE, Disruption
from gpupolicy.capacity.disruption.planning import Planning
from gpupolicy.capacity.disruption.replay import may_replace, replace_pods, replace_with_launches


class SingleNode:
    name = SINGLE_NODE
    ends_pass = True  # one action per call: the next call sees where the pods went

    def plan(self, run: Planning) -> None:
        free_gpu = run.free_gpu()
        for n in run.cheapest_to_move():
            if not run.may_simulate():
                return
            if run.used_milli(n) <= free_gpu - int(run.base.gpu_free_total[n]):
                run.trials += 1
                moves = replace_pods(run.base, [n], run.ask.pods_on[n], run.strategy, run.ctx, run.refused([n]))
                if moves is not None:
                    run.add([n], SINGLE_NODE, moves)
                    return
            if self._replace(run, n):
                return

    @staticmethod
    def _replace(run: Planning, n: int) -> bool:
        """Plan `n`'s replacement by cheaper new nodes, if one saves money (counts a trial when simulated)."""
        ask = run.ask
        if not ask.instance_types or not run.may_simulate() or not may_replace(ask.pods_on[n], ask.price_per_hour[n],
                                                                              ask.instance_types):
            return False
        run.trials += 1
        replaced = replace_with_launches(run.base, n, ask.pods_on[n], ask.instance_types, run.strategy, run.ctx,
                                         run.refused([n]))
        if replaced is None:
            return False
        moves, launches = replaced
        savings = ask.price_per_hour[n] - sum(t.price_per_hour for t in launches)
        if savings <= 0:
            return False
        kept = {k: d for k, d in moves.items() if d < len(ask.state)}
        names = ", ".join(t.name for t in launches)
        run.out.append(Disruption((n,), SINGLE_NODE, moves, savings,
                                  run.explain([n], kept, f"; replaced by {names}", savings), launches))
        return True
