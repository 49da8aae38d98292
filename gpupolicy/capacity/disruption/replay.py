"""Re-placing a candidate's pods as the scheduler will once they are evicted: the packing engine on a copy. Pure.

The engine (the extender's solver) runs with the candidates cordoned, over
every other schedulable node: the controller cannot steer evicted pods. A
move is planned only if the engine's own pick for every pod is a
destination the rules accept (`refuse` rows stay open to the engine, as
they are to the scheduler, and a pick there makes the move no plan).
Excluding refused nodes from the simulation instead planned moves the
scheduler then did not make: at F=50 the evicted pods went onto the refused
nodes (an 8-GPU node kept for weeks by 1-GPU pods at their eviction cap).
"""

from __future__ import annotations

from collections.abc import Sequence

from gpupolicy.capacity.disruption.inputs import Pods
from gpupolicy.capacity.instances import InstanceType
from gpupolicy.capacity.provisioning import plan_launches
from gpupolicy.packing.engine import commit, decide
from gpupolicy.packing.nodemodel import MILLI, NodeState
from gpupolicy.packing.placement import PackingContext, Strategy, fit


def replace_pods(state: NodeState, nodes: Sequence[int], pods: Pods, strategy: Strategy, ctx: PackingContext,
                 refuse: Sequence[int] = ()) -> dict[str, int] | None:
    """Where the packing engine puts `pods` once `nodes` are gone (None: one does not fit, or lands on `refuse`)."""
    done = replace_on_copy(state, nodes, pods, strategy, ctx, refuse)
    return None if done is None else done[0]


def replace_on_copy(state: NodeState, nodes: Sequence[int], pods: Pods, strategy: Strategy, ctx: PackingContext,
                    refuse: Sequence[int] = ()) -> tuple[dict[str, int], NodeState] | None:
    """`replace_pods` and the copy with the moves committed (the next candidate re-places around them)."""
    trial = state.copy()
    trial.schedulable[list(nodes)] = False
    refused = set(refuse)
    moves: dict[str, int] = {}
    for key, demand in sorted(pods, key=lambda kd: (-kd[1].gpu_total_milli, -kd[1].cpu_milli, kd[0])):
        fitted = fit(trial, demand)
        if not fitted.feasible.any():
            return None
        decision = decide(trial, demand, strategy, ctx, fitted=fitted)
        if decision.node is None or decision.node in refused:
            return None
        commit(trial, demand, decision)
        moves[key] = decision.node
    return moves, trial


def replace_with_launches(state: NodeState, node: int, pods: Pods, instance_types: Sequence[InstanceType],
                          strategy: Strategy, ctx: PackingContext, exclude: Sequence[int] = ()
                          ) -> tuple[dict[str, int], tuple[InstanceType, ...]] | None:
    """Moves and new nodes for `node`'s pods: the remaining nodes (not `exclude`) first, then cheapest new ones.

    A move to row len(state) + i means the i-th launch. None when no launch is
    needed (a deletion, not a replacement) or the pods do not all re-place.
    """
    trial = state.copy()
    trial.schedulable[node] = False
    trial.schedulable[list(exclude)] = False
    launches = plan_launches(pods, trial, [], instance_types, strategy=strategy, ctx=ctx)
    on_new = {key: len(state) + i for i, launch in enumerate(launches) for key in launch.pods}
    if not launches:
        return None
    rest = [(k, d) for k, d in pods if k not in on_new]
    moves = replace_pods(trial, [node], rest, strategy, ctx) if rest else {}
    if moves is None or len(on_new) + len(moves) != len(pods):
        return None
    return {**moves, **on_new}, tuple(launch.instance_type for launch in launches)


def may_replace(pods: Pods, price: float, instance_types: Sequence[InstanceType]) -> bool:
    """A quick bound: nodes of one type, enough for the pods' summed CPU, memory and GPUs, cost less than `price`.

    Several nodes may replace one (an 8-GPU node kept by five 1-GPU pods: two
    4-GPU nodes); pods of one type only is a heuristic bound, not a proof: it
    skips hopeless simulations.
    """
    cpu = sum(d.cpu_milli for _, d in pods)
    mem = sum(d.memory_mib for _, d in pods)
    gpus = -(-sum(d.gpu_total_milli for _, d in pods) // MILLI)

    def count(t: InstanceType) -> int:
        by_gpu = -(-gpus // t.gpus) if t.gpus else (10**9 if gpus else 0)
        return max(1, -(-cpu // t.cpu_milli), -(-mem // t.memory_mib), by_gpu)

    return any(t.price_per_hour * count(t) < price for t in instance_types)
