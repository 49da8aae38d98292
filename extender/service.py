"""Filter and prioritize for one pod: parse once, one core decision, the answer. A thin adapter.

Each request: `PodRequest.parse` reads the wire pod into the core's types
once; under the cache lock, `ClusterCache.fresh_state(forget=...)` drops the
pod's old assumption and returns the node model; one core call
(`scheduling.screen` for /filter, `scheduling.choose` for /prioritize)
returns the decision with its explanation; `ClusterCache.assume` records
the pick (the cache is where assumptions live, in one place); the answer is
written from per-node fragments (`AnswerWriter`).

The hot path is array-based (docs/benchmarks/extender.md): NodeNames map to
rows through `NodeNameRows` (the same list for consecutive pods is found,
not re-mapped), verdicts and scores stay numpy arrays per input name.
/prioritize of the pod /filter just saw (same uid, model version unchanged)
hands the filter's verdict to `choose`, which reuses its fit when the
demand is the same. Scores are computed in /prioritize only: kube-scheduler
skips it when a single node passes, and the per-pod total is the same
either way.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from extender.answers import REASONS, UNKNOWN, AnswerWriter, score_reach
from extender.cache import ClusterCache
from extender.nodenames import NodeNameRows
from gpupolicy.packing.engine import DEFAULT_STRATEGY, decide, get_strategy
from gpupolicy.packing.kubemodel import GPU_INDEX_ANNOTATION, cluster_share_basis, resolve_share
from gpupolicy.packing.nodemodel import BoolArray, IntArray, NodeState, PodDemand
from gpupolicy.packing.scheduling import Plan, PodRequest, Screening, choose, screen, used_first_rank
from kube.views import ViewSource

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
    """`points[i]`: 0..10 for input name i; `chosen`: the engine's node (None when nothing fits);
    `reach`: how far below the top a listed host may score (`answers.score_reach`)."""

    names: list[str]
    rows: IntArray
    points: IntArray
    chosen: str | None
    plan: Plan
    writer: AnswerWriter
    reach: int | None = None

    @property
    def scores(self) -> list[tuple[str, int]]:
        return list(zip(self.names, self.points.tolist(), strict=True))

    def body(self) -> bytes:
        """The HostPriorityList JSON."""
        return self.writer.prioritize_answer(self.names, self.rows, self.points, self.reach)


@dataclass(frozen=True)
class BindOutcome:
    """What /bind did: the node, the GPU indices recorded on the pod, `error` (empty: bound)."""

    node: str
    gpus: tuple[int, ...]
    error: str


class Binder(Protocol):
    """Records annotations on a pod, then binds it (kube/binding.py against the API)."""

    def bind(self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]) -> None: ...


PENDING_REMEMBERED = 1024  # prioritized pods kept for /bind (kube-scheduler binds right after)


@dataclass(frozen=True)
class _Memo:
    """The last /filter's verdict, valid for the same pod (uid) and model version."""

    uid: str
    version: int
    screened: Screening


class ExtenderService:
    """The extender's decisions; thread-safe (one lock around the node model and the lookups).

    `scheduler_weight`: this extender's `weight` in kube-scheduler's profile (0: not told). Known, a
    prioritize answer lists only the hosts that can still be placed (`answers.listed_scores`).
    """

    def __init__(self, cache: ClusterCache, source: ViewSource, default_strategy: str = DEFAULT_STRATEGY,
                 binder: Binder | None = None, scheduler_weight: int = 0) -> None:
        get_strategy(default_strategy)  # raises UnknownStrategyError naming the choices
        self.reach = score_reach(scheduler_weight)
        self.cache = cache
        self.binder = binder
        self._prioritized: dict[str, tuple[str, PodDemand, Plan]] = {}  # uid -> (key, demand, plan), for /bind
        self.source = source
        self.default_strategy = default_strategy
        self.rows = NodeNameRows()
        self._writer = AnswerWriter(())
        self._memo: _Memo | None = None

    def ready(self) -> bool:
        return self.source.ready()

    def _writer_for(self, state: NodeState) -> AnswerWriter:
        if self._writer.names is not state.names:
            self._writer = AnswerWriter(state.names)
        return self._writer

    def filter(self, pod: Mapping[str, Any], names: list[str]) -> FilterOutcome:
        """Which of `names` can take the pod, and why not the others (all of them while hub-disconnected)."""
        request = PodRequest.parse(pod)  # ObjectError names the field
        with self.cache.lock:
            state = self.cache.fresh_state(forget=request.key)  # scheduled again: an old assumption is stale
            view = self.source.current()
            rows = self.rows.rows(state, names)
            known = rows >= 0
            asked = rows[known]
            # only the nodes asked about are checked: the work follows the request, not the cluster
            verdict = screen(view, state, request, self.default_strategy, rows=asked)
            self.cache.observe(request.key, verdict.demand)  # pending GPU pods are learned into the mix
            codes = np.full(len(names), UNKNOWN, dtype=np.int64)
            hopeless = np.zeros(len(names), dtype=bool)
            codes[known], hopeless[known] = verdict.verdicts(asked)
            if view.hub_disconnected:  # the hub refused the token: no opinion, kube-scheduler decides alone
                codes = np.where(known, 0, UNKNOWN).astype(codes.dtype)
                hopeless = np.zeros(len(names), dtype=bool)
            passed = np.flatnonzero(codes == 0)
            passed_names = self.rows.pick(names, passed)
            if passed_names:  # what /prioritize will send next: remember its rows
                self.rows.remember(state, passed_names, rows[passed])
            self._memo = _Memo(request.uid, self.cache.version, verdict)
            if len(passed_names) == 1:  # kube-scheduler skips /prioritize and binds at once: /bind needs the pod
                self._remember(request, verdict.demand, verdict.plan)
            outcome = FilterOutcome(names, rows, codes, hopeless, verdict.plan, self._writer_for(state),
                                    passed_names)
        _log_notes(request, verdict.plan)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("filter %s (%s): %d passed, failed %s, unresolvable %s", request.name,
                      verdict.plan.strategy, len(passed_names), outcome.failed, outcome.unresolvable)
        return outcome

    def prioritize(self, pod: Mapping[str, Any], names: list[str]) -> PrioritizeOutcome:
        """0..10 for every name (unknown or infeasible: 0); the engine's pick alone gets 10 and is assumed."""
        request = PodRequest.parse(pod)
        with self.cache.lock:
            state = self.cache.fresh_state(forget=request.key)
            rows = self.rows.rows(state, names)
            memo = self._memo
            screened = (memo.screened if memo is not None and memo.uid == request.uid
                        and memo.version == self.cache.version else None)
            view = self.source.current()
            fallback = resolve_share(request.demand, *cluster_share_basis(state))
            choice = choose(view, state, self.cache.ctx, self.cache.mix(fallback), request, rows,
                            self.default_strategy, screened=screened, compare=log.isEnabledFor(logging.INFO))
            points, node = choice.points, choice.node
            if view.hub_disconnected:  # neutral: every node 0, nothing assumed
                points, node = np.zeros_like(points), None
            if node is not None:
                self.cache.assume(request.key, node, choice.demand, choice.decision.gpu_indices)
                self._remember(request, choice.demand, choice.plan)
            outcome = PrioritizeOutcome(names, rows, points, node, choice.plan, self._writer_for(state), self.reach)
        _log_notes(request, choice.plan)
        if choice.plan.recommended:
            log.info("%s: scored with %s -> %s; %s would pick %s", request.name, choice.plan.strategy,
                     choice.node, choice.plan.recommended, choice.would)
        if log.isEnabledFor(logging.DEBUG):
            for verdict in choice.explanation():
                log.debug("prioritize %s %s: %s score=%s", request.name, verdict.node, verdict.reason.value,
                          verdict.score)
        if len(choice.known) < len(names):
            log.info("prioritize %s: unknown nodes scored 0: %s", request.name,
                     [n for n, r in zip(names, rows.tolist(), strict=True) if r < 0][:10])
        return outcome


    def _remember(self, request: PodRequest, demand: PodDemand, plan: Plan) -> None:
        self._prioritized[request.uid] = (request.key, demand, plan)
        while len(self._prioritized) > PENDING_REMEMBERED:
            del self._prioritized[next(iter(self._prioritized))]

    def bind(self, namespace: str, name: str, uid: str, node: str) -> BindOutcome:
        """kube-scheduler's bindVerb: pick the GPUs on the node it chose, record them on the pod, bind.

        The node is kube-scheduler's choice, not necessarily the engine's:
        the assumption moves to it at once (never a phantom on the engine's
        pick), with the GPU indices the engine picks on that node.
        """
        if self.binder is None:
            return BindOutcome(node, (), "kubeon-gpu extender: bind verb used but no API access configured")
        key = f"{namespace}/{name}"
        remembered = self._prioritized.pop(uid or key, None)
        gpus: tuple[int, ...] = ()
        if remembered is not None:
            key, demand, plan = remembered
            with self.cache.lock:
                state = self.cache.fresh_state(forget=key)  # decide on the node without this very pod on it
                row = state.index.get(node)
                if row is not None and (demand.needs_gpu or demand.mig):  # GPU rows: whole, share or MIG slice
                    ctx = self.cache.ctx
                    ctx.mix = self.cache.mix(demand)
                    ctx.tie_rank = used_first_rank(state)
                    decision = decide(state, demand, get_strategy(plan.strategy), ctx,
                                      restrict=np.array([row], dtype=np.int64))
                    gpus = decision.gpu_indices if decision.node == row else ()
                self.cache.assume(key, node, demand, gpus)
        annotations = {GPU_INDEX_ANNOTATION: ",".join(str(g) for g in gpus)} if gpus else {}
        try:
            self.binder.bind(namespace, name, uid, node, annotations)
        except Exception as exc:  # the API refused: kube-scheduler retries the pod; nothing stays assumed
            self.cache.forget(key)
            log.info("bind %s to %s failed: %s", key, node, exc)
            return BindOutcome(node, gpus, f"binding {key} to {node}: {exc}")
        return BindOutcome(node, gpus, "")


def _log_notes(request: PodRequest, plan: Plan) -> None:
    for note in plan.notes:
        log.info("%s: %s", request.name, note)
