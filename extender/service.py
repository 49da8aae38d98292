"""Filter and prioritize for one pod: the cache's node model, the pod's plan, the packing engine.

Solve, then record: the engine (`packing.decide`, `placement.fit`) decides
without side effects; only `prioritize` records an assumption (the pod on
the node the engine chose) so the next pod sees that capacity as taken.
Every per-node verdict comes from the engine's `RejectReason` enum, which is
what `FailedNodes` carries and what is logged at debug level.

The hot path is array-based (docs/benchmarks/extender.md): NodeNames map to
rows through `NodeNameRows` (the same list for consecutive pods is found,
not re-mapped), verdicts and scores stay numpy arrays per input name, and
`AnswerWriter` turns them into the JSON answer from per-node fragments.
/prioritize of the pod /filter just saw (same uid and demand, model version
unchanged) reuses the filter's fit verdicts and the rows of the names it
passed. Scores are computed in /prioritize only: kube-scheduler skips it
when a single node passes, and the per-pod total is the same either way.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from extender.answers import REASONS, UNKNOWN, AnswerWriter
from extender.cache import ClusterCache
from extender.nodenames import NodeNameRows
from extender.watch import ViewSource
from gpupolicy.packing.engine import DEFAULT_POLICY, Decision, decide, explain, get_policy
from gpupolicy.packing.kubemodel import GPU_INDEX_ANNOTATION, cluster_share_basis, demand_from_pod, resolve_share
from gpupolicy.packing.nodemodel import BoolArray, IntArray, NodeState, PodDemand
from gpupolicy.packing.placement import FitResult, fit
from gpupolicy.packing.scheduling import (
    Plan,
    constrain,
    extender_scores,
    plan_for_pod,
    unresolvable_mask,
    used_first_rank,
)

log = logging.getLogger(__name__)

__all__ = ["REASONS", "UNKNOWN", "ExtenderService", "FilterOutcome", "PrioritizeOutcome"]


@dataclass(frozen=True)
class FilterOutcome:
    """Per input name (in order): `codes` (0 passes, else a reason code; `UNKNOWN` for unknown names),
    `hopeless` (preemption cannot help), `rows` in the state. Answers and dicts are built on demand."""

    names: list[str]
    rows: IntArray
    codes: npt.NDArray[np.int64]
    hopeless: BoolArray
    plan: Plan
    writer: AnswerWriter
    passed: list[str]  # the names that pass, in order: one list object, remembered with its rows

    @property
    def any_passed(self) -> bool:
        return bool(self.passed)

    @property
    def knows_none(self) -> bool:
        """No input name is a node of the model (a model not synced yet, or nodes it does not watch)."""
        return bool((self.rows < 0).all())

    def _reasons(self, mask: BoolArray) -> dict[str, str]:
        return {self.names[i]: REASONS[int(self.codes[i])] for i in np.flatnonzero(mask).tolist()}

    @property
    def failed(self) -> dict[str, str]:
        return self._reasons((self.codes != 0) & ~self.hopeless)

    @property
    def unresolvable(self) -> dict[str, str]:
        return self._reasons((self.codes != 0) & self.hopeless)

    def body(self) -> bytes:
        """The ExtenderFilterResult JSON (NodeNames form)."""
        return self.writer.filter_answer(self.names, self.rows, self.codes, self.hopeless)


@dataclass(frozen=True)
class PrioritizeOutcome:
    """`points[i]`: 0..10 for input name i; `chosen`: the engine's node (None when nothing fits)."""

    names: list[str]
    rows: IntArray
    points: IntArray
    chosen: str | None
    plan: Plan
    writer: AnswerWriter

    @property
    def scores(self) -> list[tuple[str, int]]:
        return list(zip(self.names, self.points.tolist(), strict=True))

    def body(self) -> bytes:
        """The HostPriorityList JSON."""
        return self.writer.prioritize_answer(self.names, self.rows, self.points)


@dataclass(frozen=True)
class BindOutcome:
    """What /bind did: the node, the GPU indices recorded on the pod, `error` (empty: bound)."""

    node: str
    gpus: tuple[int, ...]
    error: str


class Binder(Protocol):
    """Records annotations on a pod, then binds it (kube/binding.py against the API; tests fake the API)."""

    def bind(self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]) -> None: ...


PENDING_REMEMBERED = 1024  # prioritized pods kept for /bind (kube-scheduler binds right after)


@dataclass(frozen=True)
class _FitMemo:
    """The last /filter's fit verdicts, valid for the same pod, demand, state object and model version."""

    pod: str
    demand: PodDemand
    state: NodeState
    version: int
    fitted: FitResult


class ExtenderService:
    """The extender's decisions; thread-safe (one lock around the node model and the lookups)."""

    def __init__(self, cache: ClusterCache, source: ViewSource, default_policy: str = DEFAULT_POLICY,
                 binder: Binder | None = None) -> None:
        get_policy(default_policy)  # raises UnknownPolicyError naming the choices
        self.cache = cache
        self.binder = binder
        self._pending_pods: dict[str, tuple[Mapping[str, Any], PodDemand, Plan]] = {}
        self.source = source
        self.default_policy = default_policy
        self.rows = NodeNameRows()
        self._writer = AnswerWriter(())
        self._memo: _FitMemo | None = None

    def ready(self) -> bool:
        return self.source.ready()

    def _demand(self, pod: Mapping[str, Any]) -> tuple[PodDemand, Plan]:
        plan = plan_for_pod(self.source.current(), pod, self.default_policy)
        for note in plan.notes:
            log.info("%s: %s", _pod_name(pod), note)
        demand = constrain(demand_from_pod(pod), plan.allowed_models)  # ObjectError names the field
        return demand, plan

    def _writer_for(self, state: NodeState) -> AnswerWriter:
        if self._writer.names is not state.names:
            self._writer = AnswerWriter(state.names)
        return self._writer

    def filter(self, pod: Mapping[str, Any], names: list[str]) -> FilterOutcome:
        """Which of `names` can take the pod, and why not the others."""
        demand, plan = self._demand(pod)
        self.cache.forget_assumption(pod)  # scheduled again: an old assumption is stale
        with self.cache.lock:
            state = self.cache.fresh_state()
            demand = self._pending(pod, state, demand)
            fitted = fit(state, demand)
            rows = self.rows.rows(state, names)
            known = rows >= 0
            safe = np.where(known, rows, 0)
            codes = np.where(known, fitted.codes[safe], UNKNOWN)
            hopeless = known & unresolvable_mask(state, demand, fitted.codes)[safe]
            passed = np.flatnonzero(codes == 0)
            passed_names = self.rows.pick(names, passed)
            if passed_names:  # what /prioritize will send next: remember its rows
                self.rows.remember(state, passed_names, rows[passed])
            self._memo = _FitMemo(_pod_key(pod), demand, state, self.cache.version, fitted)
            outcome = FilterOutcome(names, rows, codes, hopeless, plan, self._writer_for(state), passed_names)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("filter %s (%s): %d passed, failed %s, unresolvable %s", _pod_name(pod), plan.strategy,
                      len(passed_names), outcome.failed, outcome.unresolvable)
        return outcome

    def prioritize(self, pod: Mapping[str, Any], names: list[str]) -> PrioritizeOutcome:
        """0..10 for every name (unknown or infeasible: 0); the engine's pick alone gets 10 and is assumed."""
        demand, plan = self._demand(pod)
        self.cache.forget_assumption(pod)
        key = _pod_key(pod)
        with self.cache.lock:
            state = self.cache.fresh_state()
            demand = self._pending(pod, state, demand)
            rows = self.rows.rows(state, names)
            known = rows >= 0
            all_known = bool(known.all())
            idx = rows if all_known else rows[known]
            memo = self._memo
            fitted = (memo.fitted if memo is not None and memo.pod == key and memo.state is state
                      and memo.version == self.cache.version and memo.demand == demand else None)
            decision = self._decide(state, demand, plan.strategy, idx, fitted)
            points = np.zeros(len(names), dtype=np.int64)
            points[known] = extender_scores(decision, idx, state)
            chosen = state.names[decision.node] if decision.node is not None else None
            if plan.recommended and log.isEnabledFor(logging.INFO):
                would = self._decide(state, demand, plan.recommended, idx, decision.fit)
                log.info("%s: scored with %s -> %s; %s would pick %s", _pod_name(pod), plan.strategy, chosen,
                         plan.recommended, state.names[would.node] if would.node is not None else None)
            if log.isEnabledFor(logging.DEBUG):
                for verdict in explain(state, decision, idx.tolist()):
                    log.debug("prioritize %s %s: %s score=%s", _pod_name(pod), verdict.node, verdict.reason.value,
                              verdict.score)
            if chosen is not None:
                self.cache.assume(pod, chosen, demand, decision.gpu_indices)
            self._remember(pod, demand, plan)
            outcome = PrioritizeOutcome(names, rows, points, chosen, plan, self._writer_for(state))
        if not all_known:
            log.info("prioritize %s: unknown nodes scored 0: %s", _pod_name(pod),
                     [n for n, k in zip(names, known.tolist(), strict=True) if not k][:10])
        return outcome

    def _pending(self, pod: Mapping[str, Any], state: NodeState, demand: PodDemand) -> PodDemand:
        """A pending pod's demand with its share resolved (cluster basis), learned into the mix."""
        demand = resolve_share(demand, *cluster_share_basis(state))
        self.cache.observe(_pod_name(pod), demand)
        return demand

    def _remember(self, pod: Mapping[str, Any], demand: PodDemand, plan: Plan) -> None:
        self._pending_pods[_pod_key(pod)] = (pod, demand, plan)
        while len(self._pending_pods) > PENDING_REMEMBERED:
            del self._pending_pods[next(iter(self._pending_pods))]

    def bind(self, namespace: str, name: str, uid: str, node: str) -> BindOutcome:
        """kube-scheduler's bindVerb: pick the GPUs on the node it chose, record them on the pod, bind.

        The node is kube-scheduler's choice, not necessarily the engine's:
        the assumption moves to it at once (never a phantom on the engine's
        pick), with the GPU indices the engine picks on that node.
        """
        if self.binder is None:
            return BindOutcome(node, (), "kubeon-gpu extender: bind verb used but no API access configured")
        remembered = self._pending_pods.pop(uid, None) or self._pending_pods.pop(f"{namespace}/{name}", None)
        gpus: tuple[int, ...] = ()
        pod: Mapping[str, Any] = {"metadata": {"name": name, "namespace": namespace, "uid": uid}}
        if remembered is not None:
            pod, demand, plan = remembered
            with self.cache.lock:
                self.cache.forget_assumption(pod)  # decide on the node without this very pod on it
                state = self.cache.fresh_state()
                row = state.index.get(node)
                if row is not None and demand.needs_gpu:
                    decision = self._decide(state, demand, plan.strategy, np.array([row], dtype=np.int64))
                    gpus = decision.gpu_indices if decision.node == row else ()
                self.cache.assume(pod, node, demand, gpus)
        annotations = {GPU_INDEX_ANNOTATION: ",".join(str(g) for g in gpus)} if gpus else {}
        try:
            self.binder.bind(namespace, name, uid, node, annotations)
        except Exception as exc:  # the API refused: kube-scheduler retries the pod; nothing stays assumed
            self.cache.forget_assumption(pod)
            log.info("bind %s/%s to %s failed: %s", namespace, name, node, exc)
            return BindOutcome(node, gpus, f"binding {namespace}/{name} to {node}: {exc}")
        return BindOutcome(node, gpus, "")

    def _decide(self, state: NodeState, demand: PodDemand, strategy: str, idx: IntArray,
                fitted: FitResult | None = None) -> Decision:
        ctx = self.cache.ctx
        ctx.mix = self.cache.mix(fallback=demand)
        ctx.tie_rank = used_first_rank(state)
        return decide(state, demand, get_policy(strategy), ctx, restrict=idx, fitted=fitted)


def _pod_key(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return str(meta.get("uid") or _pod_name(pod))


def _pod_name(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name') or meta.get('generateName') or '?'}"
