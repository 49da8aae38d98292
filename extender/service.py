"""Filter and prioritize for one pod: parse once, one core decision, the answer. A thin adapter.

Each request: `PodRequest.parse` reads the wire pod into the core's types
once; under the cache lock, `ClusterCache.fresh_state(forget=...)` drops the
pod's old assumption and returns the node model; one core call
(`scheduling.screen` for /filter, `scheduling.choose` for /prioritize)
returns the decision with its explanation; `ClusterCache.assume` records
the pick (the cache is where assumptions live, in one place); the answer is
written from per-node fragments (`AnswerWriter`).

The hot path is array-based (docs/benchmarks/history/extender-latency.md): NodeNames map to
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
import time
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
from gpupolicy.packing.scheduling import Choice, Plan, PodRequest, Screening, choose, screen, used_first_rank
from gpupolicy.packing.typicalmix import TypicalMix
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
    request: PodRequest | None = None  # the pod, for `ExtenderService.ahead`
    lock_wait: float = 0.0  # seconds this request waited for the node model's lock (a watch, settle or ahead held it)

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
    ahead_cpu: float = 0.0  # CPU seconds spent on this decision after /filter's answer (`ExtenderService.ahead`)
    lock_wait: float = 0.0  # seconds this request waited for the node model's lock

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
class _FilterVerdict:
    """The last /filter's verdict, valid for the same pod (uid) and model version."""

    uid: str
    version: int
    screened: Screening


@dataclass(frozen=True)
class _Ahead:
    """/prioritize's decision for /filter's pod and passed names, worked out after /filter's answer went out;
    valid while nothing it read has changed (`ExtenderService.prioritize` checks)."""

    request: PodRequest
    names: list[str]
    version: int
    view: object
    mix: TypicalMix | None
    compare: bool
    choice: Choice
    cpu_seconds: float


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
        # uid -> (key, demand, plan) of the pods placed, for /bind; oldest dropped past PENDING_REMEMBERED
        self._placed_for_bind: dict[str, tuple[str, PodDemand, Plan, bool]] = {}
        self.source = source
        self.default_strategy = default_strategy
        self.rows = NodeNameRows()
        self._writer = AnswerWriter(())
        self._last_filter: _FilterVerdict | None = None  # replaced by the next /filter (docs/designs/caches.md)
        self._last_pod: tuple[Mapping[str, Any], PodRequest] | None = None  # the last Pod object parsed
        self._prioritize_ahead: _Ahead | None = None  # taken (and dropped) by the next /prioritize

    def _request(self, pod: Mapping[str, Any]) -> PodRequest:
        """`PodRequest.parse(pod)`, once per Pod object: /prioritize gets the very object /filter read
        (`ArgsReader` does not parse a pod's bytes twice; parsed bodies are never modified)."""
        last = self._last_pod
        if last is not None and last[0] is pod:
            return last[1]
        request = PodRequest.parse(pod, self.cache.claim_allocated)  # ObjectError names the field
        self._last_pod = (pod, request)
        return request

    def ready(self) -> bool:
        return self.source.ready()

    def _writer_for(self, state: NodeState) -> AnswerWriter:
        if self._writer.names is not state.names:
            self._writer = AnswerWriter(state.names)
        return self._writer

    def filter(self, pod: Mapping[str, Any], names: list[str]) -> FilterOutcome:
        """Which of `names` can take the pod, and why not the others (all of them while hub-disconnected)."""
        request = self._request(pod)  # ObjectError names the field
        asked_at = time.perf_counter()
        with self.cache.lock:
            lock_wait = time.perf_counter() - asked_at
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
            self._last_filter = _FilterVerdict(request.uid, self.cache.version, verdict)
            if len(passed_names) == 1:
                # kube-scheduler skips /prioritize and binds at once, asynchronously: it schedules the next pods
                # before /bind arrives, so the pod is assumed on that node now, as /prioritize assumes its pick
                # (else the next pod's /filter sees its GPU free; issue 39,
                # docs/benchmarks/history/real-control-plane.md)
                self._remember(request, verdict.demand, verdict.plan)
                node, row = passed_names[0], int(rows[passed[0]])
                self.cache.assume(request.key, node, verdict.demand,
                                  self._gpus_on(state, verdict.demand, verdict.plan, row) or ())
            outcome = FilterOutcome(names, rows, codes, hopeless, verdict.plan, self._writer_for(state),
                                    passed_names, request, lock_wait)
        _log_notes(request, verdict.plan)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("filter %s (%s): %d passed, failed %s, unresolvable %s", request.name,
                      verdict.plan.strategy, len(passed_names), outcome.failed, outcome.unresolvable)
        return outcome

    def ahead(self, outcome: FilterOutcome) -> None:
        """Work out /prioritize's decision for the names `outcome` passed, once /filter's answer has gone out.

        kube-scheduler runs its own score plugins between the two calls, and
        /prioritize sends back the names /filter passed: the decision made
        meanwhile is the one /prioritize would make, kept while nothing it
        read changes (the model's version, the policies, the mix, the pod,
        the names). Nothing is assumed here; /prioritize does that. Skipped
        when fewer than two names passed: kube-scheduler then does not ask;
        and when this runs late, after /prioritize (on a loaded machine): the
        pod is placed then, and its assumption is left alone (dropping it let
        the next pod onto the same GPU).
        """
        request = outcome.request
        if request is None or len(outcome.passed) < 2:
            return
        started = time.thread_time()
        with self.cache.lock:
            if self.cache.placed(request.key):
                return
            state = self.cache.fresh_state()
            rows = self.rows.rows(state, outcome.passed)
            view, mix, compare = self._inputs(request, state)
            choice = self._choose(request, state, rows, view, mix, compare)
            self._prioritize_ahead = _Ahead(request, outcome.passed, self.cache.version, view, mix, compare, choice,
                                 time.thread_time() - started)

    def _inputs(self, request: PodRequest, state: NodeState) -> tuple[Any, TypicalMix | None, bool]:
        fallback = resolve_share(request.demand, *cluster_share_basis(state))
        return self.source.current(), self.cache.mix(fallback), log.isEnabledFor(logging.INFO)

    def _choose(self, request: PodRequest, state: NodeState, rows: IntArray, view: Any, mix: TypicalMix | None,
                compare: bool) -> Choice:
        memo = self._last_filter
        screened = (memo.screened if memo is not None and memo.uid == request.uid
                    and memo.version == self.cache.version else None)
        return choose(view, state, self.cache.ctx, mix, request, rows, self.default_strategy, screened=screened,
                      compare=compare)

    def prioritize(self, pod: Mapping[str, Any], names: list[str]) -> PrioritizeOutcome:
        """0..10 for every name (unknown or infeasible: 0); the engine's pick alone gets 10 and is assumed."""
        request = self._request(pod)
        asked_at = time.perf_counter()
        with self.cache.lock:
            lock_wait = time.perf_counter() - asked_at
            state = self.cache.fresh_state(forget=request.key)
            rows = self.rows.rows(state, names)
            view, mix, compare = self._inputs(request, state)
            ahead, self._prioritize_ahead = self._prioritize_ahead, None
            if (ahead is not None and ahead.version == self.cache.version and ahead.view is view
                    and _same_mix(ahead.mix, mix) and ahead.compare == compare and ahead.request == request
                    and (ahead.names is names or ahead.names == names)):
                choice, ahead_cpu = ahead.choice, ahead.cpu_seconds
            else:
                choice, ahead_cpu = self._choose(request, state, rows, view, mix, compare), 0.0
            points, node = choice.points, choice.node
            if view.hub_disconnected:  # neutral: every node 0, nothing assumed
                points, node = np.zeros_like(points), None
            if node is not None:
                self.cache.assume(request.key, node, choice.demand, choice.decision.gpu_indices)
                self._remember(request, choice.demand, choice.plan)
            outcome = PrioritizeOutcome(names, rows, points, node, choice.plan, self._writer_for(state), self.reach,
                                        ahead_cpu, lock_wait)
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


    def _gpus_on(self, state: NodeState, demand: PodDemand, plan: Plan, row: int) -> tuple[int, ...] | None:
        """The GPU indices the engine picks for `demand` on node `row` (empty for a pod holding no GPU row),
        None when it does not fit there. Call with the cache lock held."""
        if not (demand.needs_gpu or demand.mig):  # GPU rows: whole, share or MIG slice
            return ()
        ctx = self.cache.ctx
        ctx.mix = self.cache.mix(demand)
        ctx.tie_rank = used_first_rank(state)
        decision = decide(state, demand, get_strategy(plan.strategy), ctx, restrict=np.array([row], dtype=np.int64))
        return decision.gpu_indices if decision.node == row else None

    def _remember(self, request: PodRequest, demand: PodDemand, plan: Plan) -> None:
        self._placed_for_bind[request.uid] = (request.key, demand, plan, request.claimed)
        while len(self._placed_for_bind) > PENDING_REMEMBERED:
            del self._placed_for_bind[next(iter(self._placed_for_bind))]

    def bind(self, namespace: str, name: str, uid: str, node: str) -> BindOutcome:
        """kube-scheduler's bindVerb: pick the GPUs on the node it chose, record them on the pod, bind.

        The node is kube-scheduler's choice, not necessarily the engine's:
        the assumption moves to it at once (never a phantom on the engine's
        pick), with the GPU indices the engine picks on that node.
        """
        if self.binder is None:
            return BindOutcome(node, (), "kubeon-gpu extender: bind verb used but no API access configured")
        key = f"{namespace}/{name}"
        remembered = self._placed_for_bind.pop(uid or key, None)
        gpus: tuple[int, ...] = ()
        claimed = False
        if remembered is not None:
            key, demand, plan, claimed = remembered
            with self.cache.lock:
                state = self.cache.fresh_state(forget=key)  # decide on the node without this very pod on it
                row = state.index.get(node)
                placed = None if row is None else self._gpus_on(state, demand, plan, row)
                if placed is None and row is not None:
                    # the pods decided since took its room (kube-scheduler bound it to a node identical to the
                    # engine's pick, which the next pods saw free). Refusing would not help: the chart's
                    # extender is ignorable, so kube-scheduler binds the pod itself (extendersBinding)
                    log.info("bind %s to %s: no room left there in the model; bound without a GPU index", key, node)
                gpus = placed or ()
                self.cache.assume(key, node, demand, gpus, binding=True)
        # a claim-based pod's devices are the ones its claims' allocation names (the model reads them there):
        # no index to record on it
        annotations = {GPU_INDEX_ANNOTATION: ",".join(str(g) for g in gpus)} if gpus and not claimed else {}
        try:
            self.binder.bind(namespace, name, uid, node, annotations)
        except Exception as exc:  # the API refused: kube-scheduler retries the pod; nothing stays assumed
            self.cache.forget(key)
            log.info("bind %s to %s failed: %s", key, node, exc)
            return BindOutcome(node, gpus, f"binding {key} to {node}: {exc}")
        self.cache.confirm(key)
        return BindOutcome(node, gpus, "")


def _same_mix(a: TypicalMix | None, b: TypicalMix | None) -> bool:
    """The same mix for a decision: the same object, or the same types and weights (a mix built from the
    first few pods is a new object per call)."""
    return a is b or (a is not None and b is not None and a.key == b.key)


def _log_notes(request: PodRequest, plan: Plan) -> None:
    for note in plan.notes:
        log.info("%s: %s", request.name, note)
