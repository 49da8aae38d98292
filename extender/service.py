"""Filter and prioritize for one pod: the cache's node model, the pod's plan, the packing engine.

Solve, then record: the engine (`packing.decide`, `placement.fit`) decides
without side effects; only `prioritize` records an assumption (the pod on
the node the engine chose) so the next pod sees that capacity as taken.
Every per-node verdict comes from the engine's `RejectReason` enum, which is
what `FailedNodes` carries and what is logged at debug level.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import repeat
from typing import Any

import numpy as np

from extender.cache import ClusterCache
from extender.watch import ViewSource
from gpupolicy.kubemodel import demand_from_pod
from gpupolicy.nodemodel import NodeState, PodDemand
from gpupolicy.packing import DEFAULT_POLICY, Decision, decide, explain, get_policy
from gpupolicy.placement import REASON_BY_CODE, RejectReason, fit
from gpupolicy.scheduling import (
    Plan,
    constrain,
    extender_scores,
    plan_for_pod,
    unresolvable_mask,
    used_first_rank,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FilterOutcome:
    passed: list[str]
    failed: dict[str, str]
    unresolvable: dict[str, str]
    plan: Plan


@dataclass(frozen=True)
class PrioritizeOutcome:
    scores: list[tuple[str, int]]
    chosen: str | None
    plan: Plan


def _reason(reason: RejectReason) -> str:
    return f"kubeon-gpu: {reason.value}"


UNKNOWN = -1  # code for a name the model does not know; REASONS[-1] is its message
REASONS: tuple[str, ...] = (*(_reason(r) for r in REASON_BY_CODE), _reason(RejectReason.UNKNOWN_NODE))


class ExtenderService:
    """The extender's decisions; thread-safe (one lock around the node model)."""

    def __init__(self, cache: ClusterCache, source: ViewSource, default_policy: str = DEFAULT_POLICY) -> None:
        get_policy(default_policy)  # raises UnknownPolicyError naming the choices
        self.cache = cache
        self.source = source
        self.default_policy = default_policy

    def ready(self) -> bool:
        return self.source.ready()

    def _demand(self, pod: Mapping[str, Any]) -> tuple[PodDemand, Plan]:
        plan = plan_for_pod(self.source.current(), pod, self.default_policy)
        for note in plan.notes:
            log.info("%s: %s", _pod_name(pod), note)
        demand = constrain(demand_from_pod(pod), plan.allowed_models)  # ObjectError names the field
        return demand, plan

    def filter(self, pod: Mapping[str, Any], names: list[str]) -> FilterOutcome:
        """Which of `names` can take the pod, and why not the others."""
        demand, plan = self._demand(pod)
        self.cache.forget_assumption(pod)  # scheduled again: an old assumption is stale
        with self.cache.lock:
            state = self.cache.fresh_state()
            codes = fit(state, demand).codes
            hopeless_mask = unresolvable_mask(state, demand, codes)
            get = state.index.get
            idx = np.fromiter(map(get, names, repeat(-1)), dtype=np.int64, count=len(names))  # C loop
        known = idx >= 0
        safe = np.where(known, idx, 0)
        node_codes = np.where(known, codes[safe], UNKNOWN).tolist()
        node_hopeless = (known & hopeless_mask[safe]).tolist()
        passed = [n for n, c in zip(names, node_codes, strict=True) if c == 0]
        failed = {n: REASONS[c] for n, c, h in zip(names, node_codes, node_hopeless, strict=True) if c and not h}
        hopeless = {n: REASONS[c] for n, c, h in zip(names, node_codes, node_hopeless, strict=True) if c and h}
        if log.isEnabledFor(logging.DEBUG):
            log.debug("filter %s (%s): %d passed, failed %s, unresolvable %s", _pod_name(pod), plan.strategy,
                      len(passed), failed, hopeless)
        return FilterOutcome(passed, failed, hopeless, plan)

    def prioritize(self, pod: Mapping[str, Any], names: list[str]) -> PrioritizeOutcome:
        """0..10 for every name (unknown or infeasible: 0); the engine's pick alone gets 10 and is assumed."""
        demand, plan = self._demand(pod)
        self.cache.forget_assumption(pod)
        with self.cache.lock:
            state = self.cache.fresh_state()
            get = state.index.get
            all_idx = np.fromiter(map(get, names, repeat(-1)), dtype=np.int64, count=len(names))  # C loop
            known = all_idx >= 0
            idx = all_idx[known]
            decision = self._decide(state, demand, plan.strategy, idx)
            scores = np.zeros(len(names), dtype=np.int64)
            scores[known] = extender_scores(decision, idx)
            chosen = state.names[decision.node] if decision.node is not None else None
            if plan.recommended and log.isEnabledFor(logging.INFO):
                would = self._decide(state, demand, plan.recommended, idx)
                log.info("%s: scored with %s -> %s; %s would pick %s", _pod_name(pod), plan.strategy, chosen,
                         plan.recommended, state.names[would.node] if would.node is not None else None)
            if log.isEnabledFor(logging.DEBUG):
                for verdict in explain(state, decision, idx.tolist()):
                    log.debug("prioritize %s %s: %s score=%s", _pod_name(pod), verdict.node, verdict.reason.value,
                              verdict.score)
            if chosen is not None:
                self.cache.assume(pod, chosen, demand)
        if not known.all():
            log.info("prioritize %s: unknown nodes scored 0: %s", _pod_name(pod),
                     [n for n, k in zip(names, known.tolist(), strict=True) if not k][:10])
        return PrioritizeOutcome(list(zip(names, scores.tolist(), strict=True)), chosen, plan)

    def _decide(self, state: NodeState, demand: PodDemand, strategy: str, idx: np.ndarray[Any, Any]) -> Decision:
        ctx = self.cache.ctx
        ctx.mix = self.cache.mix(fallback=demand)
        ctx.tie_rank = used_first_rank(state)
        return decide(state, demand, get_policy(strategy), ctx, restrict=idx)


def _pod_name(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name') or meta.get('generateName') or '?'}"
