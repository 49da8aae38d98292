"""Which GPU nodes to give back, method by method in a fixed order; and keeping PDB-held nodes out. Pure.

At most `max_disrupted_nodes - in_progress` nodes in all, and at most one
multi- or single-node action per call (the next call sees the result).
`plan_around` keeps `held` rows (row -> why: a PodDisruptionBudget that
allows no disruption, gpupolicy/capacity/budgets.py) out of the plan while
saying which of them the plan would have disrupted: it plans with them as
candidates, notes a held row a disruption takes, with its reason, and plans
again without it, so the next candidate gets its turn (at most `max_replans`
times, then every held row is blocked).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Set

from gpupolicy.capacity.disruption.emptiness import Emptiness
from gpupolicy.capacity.disruption.inputs import Disruption, DisruptionInputs
from gpupolicy.capacity.disruption.multinode import MultiNode
from gpupolicy.capacity.disruption.planning import Method, Planning
from gpupolicy.capacity.disruption.singlenode import SingleNode
from gpupolicy.capacity.disruption.underused import Underused

METHODS: tuple[Method, ...] = (
    # empty nodes first: deleting them moves no pod and needs no simulation (Karpenter's order too)
    Emptiness(),
    # then nodes the metrics call idle, dearest first: the user asked for them by a threshold; they go before
    # the packing-driven methods so those simulate around the moves already planned
    Underused(),
    # then several nodes at once: one drain that frees more than any single node (Karpenter: multi before single)
    MultiNode(),
    # last one node, deleted or replaced by cheaper ones: the smallest step, taken when nothing larger fits
    SingleNode(),
)


def plan_disruptions(ask: DisruptionInputs, methods: tuple[Method, ...] = METHODS) -> list[Disruption]:
    """The disruptions to make now, in the methods' order, within the budget."""
    run = Planning(ask)
    for method in methods:
        if run.room() <= 0:
            break
        before = len(run.out)
        method.plan(run)
        if method.ends_pass and len(run.out) > before:
            break
    return run.out


def plan_around(plan: Callable[[Set[int]], list[Disruption]], blocked: Set[int], held: Mapping[int, str],
                max_replans: int = 3) -> tuple[list[Disruption], dict[int, tuple[Disruption, str]]]:
    """`plan(blocked rows)` with no `held` row disrupted; the held rows a plan would have disrupted, with the
    disruption and the reason (module docstring)."""
    noted: dict[int, tuple[Disruption, str]] = {}
    for _ in range(max_replans + 1):
        out = plan(set(blocked) | set(noted))
        hit = {n: (d, held[n]) for d in out for n in d.nodes if n in held}
        if not hit:
            return out, noted
        noted.update(hit)
    return plan(set(blocked) | set(held)), noted
