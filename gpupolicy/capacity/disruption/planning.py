"""One planning call's working state, shared by the methods in their order, and the `Method` protocol.

What a method may take is decided here once: a row is a candidate when it is
schedulable, not blocked and not pinned by a pod at its eviction cap; a busy
candidate (one with pods) also has settled (`settle_seconds` since its pods
last changed) and, with `min_pod_age_seconds`, holds only pods that old.
Rows with `schedulable` False are neither candidates nor destinations; an
empty row that a pending pod fits is awaited, no candidate.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import Protocol

import numpy as np

from gpupolicy.capacity.disruption.inputs import Disruption, DisruptionInputs
from gpupolicy.packing.engine import get_strategy
from gpupolicy.packing.nodemodel import MILLI, NodeState, PodDemand
from gpupolicy.packing.placement import PackingContext, Strategy, fit
from gpupolicy.packing.typicalmix import TypicalMix

NEVER = -float("inf")


class Method(Protocol):
    """One way to disrupt nodes (Karpenter's disruption.Method): it adds what it plans to `run`."""

    name: str
    ends_pass: bool  # an action of this method is the last of the call: the next call sees its result

    def plan(self, run: Planning) -> None: ...


def awaited_rows(state: NodeState, pods_on: Mapping[int, object], pending: Sequence[PodDemand]) -> set[int]:
    """Empty schedulable rows a pending pod fits, one per pod (the first that fits, in row order): the
    scheduler is about to bind it there, as Karpenter nominates one node per pod it launched for."""
    empty = [n for n in range(len(state)) if state.schedulable[n] and not pods_on.get(n)]
    out: set[int] = set()
    for demand in pending:
        free = np.array([n for n in empty if n not in out], dtype=np.int64)
        if not len(free):
            break
        fits = free[fit(state, demand, free).feasible]
        if len(fits):
            out.add(int(fits[0]))
    return out


class Planning:
    """The disruptions planned so far in one call, the rows they took, the re-placement simulations spent."""

    def __init__(self, ask: DisruptionInputs) -> None:
        self.ask = ask
        self.out: list[Disruption] = []
        self.taken: set[int] = set()
        self.trials = 0
        state, pods_on, limit = ask.state, ask.pods_on, ask.rules.max_evictions_per_pod
        # a limit of 0 pins every node with a pod, evicted before or not (no pod moves at all)
        pinned = set() if limit is None or (limit > 0 and not ask.evictions) else {
            n for n, pods in pods_on.items() if any(ask.evictions.get(key, 0) >= limit for key, _ in pods)}
        awaited = awaited_rows(state, pods_on, ask.pending)
        self.eligible = [n for n in range(len(state))
                         if state.schedulable[n] and n not in ask.blocked and n not in pinned and n not in awaited]

    def room(self) -> int:
        """Nodes the budget still allows: `max_disrupted_nodes` less those in progress and those planned."""
        return self.ask.rules.max_disrupted_nodes - self.ask.in_progress - len(self.out)

    def may_simulate(self) -> bool:
        return self.trials < self.ask.max_trials

    @cached_property
    def strategy(self) -> Strategy:
        return self.ask.strategy or get_strategy(None)

    @cached_property
    def ctx(self) -> PackingContext:
        if self.ask.ctx is not None:
            return self.ask.ctx
        return PackingContext(mix=TypicalMix.from_pods([d for pods in self.ask.pods_on.values() for _, d in pods], 1.0))

    @cached_property
    def base(self) -> NodeState:
        """Where moves are simulated: the state with the rows taken so far cordoned; a method that commits
        moves replaces it with the state after them (the next candidate re-places around those moves).
        Built when the first pod-moving method asks, after the empty nodes are taken."""
        base = self.ask.state.copy()
        base.schedulable[list(self.taken)] = False
        return base

    def add(self, nodes: Sequence[int], method: str, moves: dict[str, int], usage: str = "") -> None:
        savings = float(sum(self.ask.price_per_hour[n] for n in nodes))
        self.out.append(Disruption(tuple(nodes), method, moves, savings,
                                   self.explain(nodes, moves, usage, savings)))
        self.taken.update(nodes)

    def explain(self, nodes: Sequence[int], moves: dict[str, int], usage: str, savings: float) -> str:
        state = self.ask.state
        names = ", ".join(state.names[n] for n in nodes)
        count = sum(len(self.ask.pods_on.get(n, ())) for n in nodes)
        dest = sorted({state.names[d] for d in moves.values()})
        gpus = int(sum(int(state.gpu_count[n]) for n in nodes))
        pods = "1 pod" if count == 1 else f"{count} pods"
        they = "it fits" if count == 1 else "they fit"
        where = f"; {they} on {', '.join(dest)}" if dest else ""
        return f"{names}: {pods}{usage}{where}; frees {gpus} GPUs, about ${savings:.2f}/h"

    def busy(self) -> list[int]:
        """Candidates with pods, not taken, settled, and (with a minimum pod age) of old pods only."""
        ask, old = self.ask, self.ask.rules.min_pod_age_seconds
        return [n for n in self.eligible if ask.pods_on.get(n) and n not in self.taken
                and ask.now - ask.changed_at.get(n, NEVER) >= ask.rules.settle_seconds
                and (not old or all(ask.now - ask.started_at.get(key, NEVER) >= old for key, _ in ask.pods_on[n]))]

    def cheapest_to_move(self) -> list[int]:
        """Busy candidates, least GPU used per unit of price first: what is cheapest to move for what it saves."""
        price = self.ask.price_per_hour
        return sorted(self.busy(), key=lambda n: (self.used_milli(n) / max(price[n], 1e-9),
                                                  len(self.ask.pods_on[n]), n))

    def used_milli(self, n: int) -> int:
        return int(self.ask.state.gpu_count[n]) * MILLI - int(self.ask.state.gpu_free_total[n])

    @cached_property
    def empties(self) -> list[int]:
        """Rows with no pods that no method took: worked out once, when the first pod-moving method asks
        (after emptiness; the later methods take only rows with pods)."""
        return [n for n in range(len(self.ask.state)) if not self.ask.pods_on.get(n) and n not in self.taken]

    def free_gpu(self) -> int:
        """Free GPU (milli) that moves may fill: schedulable nodes with pods."""
        open_rows = self.base.schedulable.copy()
        open_rows[self.empties] = False
        return int(self.base.gpu_free_total[open_rows].sum())

    def refused(self, group: Sequence[int]) -> list[int]:
        """Rows the pods of `group` may not be moved onto (the engine may still pick them: then no plan).

        Dearer per GPU than the dearest node they leave (it would keep the dearer
        node alive: a 1-GPU pod beside the free GPUs of an 8-GPU node whose big
        pod left); with a minimum pod age, nodes holding young pods (a pod moved
        beside pods about to leave moves again when they have); empty nodes
        (moving pods onto one keeps a node alive to free another).
        """
        unit = self.price_per_gpu
        top = max(unit[n] for n in group)
        return [n for n in range(len(unit)) if unit[n] > top + 1e-9] + self.young + self.empties

    @cached_property
    def price_per_gpu(self) -> list[float]:
        ask = self.ask
        return [ask.price_per_hour[n] / max(int(ask.state.gpu_count[n]), 1) for n in range(len(ask.state))]

    @cached_property
    def young(self) -> list[int]:
        """Nodes holding a pod younger than `min_pod_age_seconds` (none without that rule)."""
        ask, old = self.ask, self.ask.rules.min_pod_age_seconds
        return [n for n in range(len(ask.state)) if old and ask.pods_on.get(n)
                and any(ask.now - ask.started_at.get(key, NEVER) < old for key, _ in ask.pods_on[n])]
