"""The scheduler extender's own decisions around the packing engine. Pure.

The packing engine (`packing.py`, `placement.py`) answers "which node, and
why not the others" for one `PodDemand`. What the live extender adds, and
keeps here so it is testable without HTTP:

- `plan_for_pod`: which packing strategy scores a pod (the highest-priority
  matching GpuPolicy with `packing:`, by mode) and which GPU products it may
  use (`typeFit.allowedModels` of the matching policy, in Automatic mode).
  Modes for packing: Automatic scores with the policy's strategy; Recommend
  and Approve (unless the pod's owner is approved) score with the install's
  default strategy and only *report* what the policy's strategy would pick
  (`Plan.recommended`), so a Recommend policy never changes placements.
  typeFit in Recommend/Approve is reported, not enforced.
- `unresolvable`: whether a rejection is one preemption cannot fix (wrong
  GPU product, node cordoned or draining, the node's capacity is below the
  request), which the extender returns in `FailedAndUnresolvableNodes`.
- MIG and time-sliced pods are no special case here: the engine's `decide`
  packs them by count for every policy (`placement.with_device_counts`).
- `extender_scores`: the 0..10 prioritize scores: the engine's chosen node
  (and nodes identical to it) 10, the other feasible nodes 0..9 by score,
  infeasible ones 0; with the chart's extender weight a one-point lead beats
  every stock plugin (docs/designs/extender.md, "Profile").
- A pending time-sliced share pod is sized against the cluster
  (`kubemodel.cluster_share_basis`) in `screen` and `choose` alike.

An adapter request is three steps: parse the wire pod once (`PodRequest.parse`),
call one of the two decisions below, write the answer:
- `screen` (/filter): the plan, the pod's constrained demand, every node's
  fit verdict and whether preemption could cure its rejection;
- `choose` (/prioritize): the plan, the engine's decision over the nodes
  asked about, their 0..10 points, and, when asked, the node a Recommend
  policy's strategy would have picked. The explanation (per-node reasons and
  scores) is `Choice.explanation()`, worked out only when logged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from gpupolicy.catalog import DEFAULT_CATALOG, Catalog, normalise_product_label
from gpupolicy.cluster import ClusterView
from gpupolicy.k8s.owners import is_approved, pod_owner
from gpupolicy.matching import winning_policies
from gpupolicy.model import GpuPolicy, Mode, PolicyKind
from gpupolicy.packing.dradevices import is_claim_based
from gpupolicy.packing.engine import STRATEGIES, NodeVerdict, Placement, decide, explain, get_strategy
from gpupolicy.packing.kubemodel import cluster_share_basis, pending_claim_demand, resolve_share
from gpupolicy.packing.nodemodel import BoolArray, IntArray, NodeState, PodDemand
from gpupolicy.packing.placement import (
    REASON_BY_CODE,
    FitResult,
    PackingContext,
    RejectReason,
    fit,
    rows_to_work_on,
    sorted_rows,
)
from gpupolicy.packing.typicalmix import TypicalMix

MAX_EXTENDER_SCORE = 10  # upstream MaxExtenderPriority
SPEC_DEFAULT = "default"  # PackingSpec.strategy meaning "the install's default policy"

# Rejections no eviction can cure, whatever runs on the node.
ALWAYS_UNRESOLVABLE = frozenset({
    RejectReason.UNSCHEDULABLE, RejectReason.GPU_MODEL, RejectReason.NO_GPU,
    RejectReason.INSUFFICIENT_GPU_MEMORY, RejectReason.UNKNOWN_NODE,
})


_CODE = {r: i for i, r in enumerate(REASON_BY_CODE)}
_ALWAYS_BY_CODE: BoolArray = np.array([r in ALWAYS_UNRESOLVABLE for r in REASON_BY_CODE], dtype=bool)


@dataclass(frozen=True)
class Plan:
    """How one pod is scheduled: the strategy that scores it and the products it may use.

    `strategy`: a name in `packing.STRATEGIES`.
    `recommended`: the strategy a Recommend/Approve packing policy would use
    (logged, not applied). `allowed_models`: products allowed by an enforced
    typeFit policy (None: no policy constraint). `preferred_models`: products
    an enforced typeFit policy prefers: tried first, the others only when no
    preferred one can take the pod (None: no preference). `notes`: why, for logs.
    """

    strategy: str
    source: str = "default"
    recommended: str | None = None
    allowed_models: frozenset[str] | None = None
    notes: tuple[str, ...] = ()
    preferred_models: frozenset[str] | None = None


def expand_models(names: Iterable[str], catalog: Catalog = DEFAULT_CATALOG) -> frozenset[str]:
    """Product names as the node model spells them: the given names plus their catalog aliases."""
    out: set[str] = set()
    for name in names:
        out.add(normalise_product_label(name))
        product = catalog.product(name)
        if product is not None:
            out.add(product.product)
            out.update(product.aliases)
    return frozenset(out)


def pod_key(pod: Mapping[str, Any]) -> str:
    """`namespace/name`: how a pod is known to the extender's assumptions and the watch (the API's own key)."""
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name') or ''}"


@dataclass(frozen=True)
class PodRequest:
    """A pod as kube-scheduler sends it, read once: who it is, what it asks, what policies match it by.

    `key`: the assumptions' and the watch's key (`pod_key`); `uid`: the
    pod's uid (else `name`), which ties a /prioritize to the /filter before
    it; `name`: `namespace/name` (or generateName) for logs; `owner`: the
    workload an approval names (`owners.pod_owner`).
    """

    key: str
    uid: str
    name: str
    namespace: str
    labels: Mapping[str, str]
    owner: str
    demand: PodDemand
    claimed: bool = False  # its GPU comes through claims of ours (templates, shared): the allocation picks devices

    @classmethod
    def parse(cls, pod: Mapping[str, Any], allocated: Callable[[str], bool] = lambda claim: False) -> PodRequest:
        """Raises `kubemodel.ObjectError` naming the field the model cannot read. `allocated`: whether a
        shared claim (`namespace/name`) is allocated already; the pod then asks for no GPU of its own
        (`kubemodel.pending_claim_demand`)."""
        demand = pending_claim_demand(pod, allocated)
        meta = pod.get("metadata") or {}
        namespace = str(meta.get("namespace") or "default")
        name = f"{namespace}/{meta.get('name') or meta.get('generateName') or '?'}"
        labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
        return cls(pod_key(pod), str(meta.get("uid") or name), name, namespace, labels,
                   pod_owner(pod, namespace), demand, is_claim_based(pod))


def _applies(policy: GpuPolicy, view: ClusterView, request: PodRequest) -> bool:
    mode = view.mode_of(policy).mode
    if mode is Mode.AUTOMATIC:
        return True
    return mode is Mode.APPROVE and is_approved(policy.spec.approvals, request.owner)


def resolve_strategy(name: str | None, default_strategy: str) -> str:
    """A PackingSpec strategy as a registered policy name; 'default', empty or unknown -> the default."""
    if not name or name == SPEC_DEFAULT or name not in STRATEGIES:
        return default_strategy
    return name


def plan_for_pod(view: ClusterView, request: PodRequest, default_strategy: str,
                 catalog: Catalog = DEFAULT_CATALOG) -> Plan:
    """The strategy and product constraint for a pod from the matching GpuPolicies. Pure."""
    winners = winning_policies(view, request.namespace, request.labels)
    strategy, source, recommended = default_strategy, "default", None
    notes: list[str] = []
    packing = winners.get(PolicyKind.PACKING)
    if packing is not None and packing.spec.packing is not None:
        wanted = packing.spec.packing.strategy
        resolved = resolve_strategy(wanted, default_strategy)
        if wanted not in (SPEC_DEFAULT, "") and wanted not in STRATEGIES:
            notes.append(f"GpuPolicy {packing.name}: unknown packing strategy {wanted!r}, using {resolved}")
        if _applies(packing, view, request):
            strategy, source = resolved, packing.name
        else:
            recommended = resolved
            notes.append(f"GpuPolicy {packing.name} ({view.mode_of(packing).mode.value}) "
                         f"would score with {resolved}")
    allowed = preferred = None
    type_fit = winners.get(PolicyKind.TYPE_FIT)
    spec = type_fit.spec.type_fit if type_fit is not None else None
    if type_fit is not None and spec is not None:
        applies = _applies(type_fit, view, request)
        would = f"GpuPolicy {type_fit.name} ({view.mode_of(type_fit).mode.value}) would"
        if spec.allowed_models:
            if applies:
                allowed = expand_models(spec.allowed_models, catalog)
            else:
                notes.append(f"{would} allow only {', '.join(sorted(spec.allowed_models))}")
        if spec.preferred_models:
            if applies:
                preferred = expand_models(spec.preferred_models, catalog)
            else:
                notes.append(f"{would} prefer {', '.join(sorted(spec.preferred_models))}")
    return Plan(strategy, source, recommended, allowed, tuple(notes), preferred)


def preferred_rows(state: NodeState, plan: Plan, rows: IntArray, fitted: FitResult) -> IntArray:
    """`rows` narrowed to the feasible nodes of the plan's preferred products; all of `rows` when the plan
    prefers none or none of those can take the pod (a preference never makes a pod unschedulable)."""
    if plan.preferred_models is None:
        return rows
    codes = fitted.codes_of(rows)
    if codes is None:  # `fitted` does not cover `rows`
        raise ValueError("preferred_rows: the fit verdicts do not cover the rows")
    vocab = np.array([m in plan.preferred_models for m in state.models], dtype=bool)
    keep = (codes == 0) & vocab[state.model_idx[rows]] if len(state.models) else np.zeros(len(rows), dtype=bool)
    return rows[keep] if bool(keep.any()) else rows


def constrain(demand: PodDemand, allowed: frozenset[str] | None) -> PodDemand:
    """The demand with the policy's products intersected with the pod's own (affinity/nodeSelector)."""
    if allowed is None:
        return demand
    own = demand.allowed_models
    return replace(demand, allowed_models=allowed if own is None else own & allowed)


def unresolvable_mask(state: NodeState, demand: PodDemand, codes: np.ndarray[Any, Any],
                      nodes: IntArray | None = None) -> BoolArray:
    """Per node: True when its rejection (`codes`, from `placement.fit`) is one evicting pods cannot cure.

    Always for a wrong product, cordon/drain, no GPUs or too little GPU
    memory; for a resource shortfall, when the node's capacity (not just
    what is free) is below the request. Vectorised over every node, or over
    `nodes` (then `codes[i]` is `nodes[i]`'s, as `fit(..., nodes)` gives them).
    """
    at = slice(None) if nodes is None else nodes
    n = len(state) if nodes is None else len(nodes)
    out: BoolArray = _ALWAYS_BY_CODE[codes]
    code = _CODE
    out |= (codes == code[RejectReason.INSUFFICIENT_CPU]) & (state.cpu_cap[at] < demand.cpu_milli)
    out |= (codes == code[RejectReason.INSUFFICIENT_MEMORY]) & (state.mem_cap[at] < demand.memory_mib)
    short_gpus = state.gpu_count[at] < max(demand.num_gpu, 1)
    out |= (codes == code[RejectReason.INSUFFICIENT_WHOLE_GPUS]) & short_gpus
    out |= (codes == code[RejectReason.INSUFFICIENT_GPU_SHARE]) & short_gpus
    if demand.mig:
        short_mig = np.zeros(n, dtype=bool)
        for resource, count in demand.mig.items():
            cap = (state.mig_cap[at, state.mig_resources.index(resource)] if resource in state.mig_resources
                   else np.zeros(n, dtype=np.int64))
            short_mig |= cap < count
        out |= (codes == code[RejectReason.INSUFFICIENT_MIG]) & short_mig
    out |= (codes == code[RejectReason.INSUFFICIENT_SHARED]) & (state.shared_cap[at] < demand.shared)
    return out


def unresolvable(state: NodeState, demand: PodDemand, node: int, reason: RejectReason) -> bool:
    """`unresolvable_mask` for one node and reason."""
    codes = np.zeros(len(state), dtype=np.int8)
    codes[node] = REASON_BY_CODE.index(reason) if reason in REASON_BY_CODE else 0
    if reason is RejectReason.UNKNOWN_NODE:
        return True
    return bool(unresolvable_mask(state, demand, codes)[node])


def used_first_rank(state: NodeState) -> IntArray:
    """Tie order for live nodes: nodes holding GPU work first, then the fixed row order.

    A fixed order makes equal-scored pods fill one node after another (the
    effect the paper's simulator gets from its per-seed order). Live, that
    breaks where kube-scheduler chooses: nodes identical to the engine's
    pick get 10 too and it takes one at random, so with the row order alone
    the next pod's lowest-ranked tie is another empty node and GPU pods
    spread one per node (the 100-node CI replay: 94.22 against 97.16 at
    seed 44). Putting nodes that hold GPU pods (whole GPUs, shares, MIG
    devices) first follows the node kube-scheduler took. CPU-only pods do
    not count: those the webhook does not route here (routing switched off,
    DaemonSet pods, namespaces no policy matches) are spread by the
    cluster's default-scheduler over the emptiest nodes, and following them
    spread GPU pods after them (full trace, docs/benchmarks/history/packing.md "Packing
    through kube-scheduler").
    """
    rows = np.arange(len(state), dtype=np.int64)
    return _used_first(state, rows)


def _used_first(state: NodeState, rows: IntArray) -> IntArray:
    """`used_first_rank` of `rows`: only the order matters (the lowest rank wins a tie), so the row
    index, offset past every row when the node holds no GPU work."""
    st = state
    used = ((st.gpu_free_total[rows] < st.gpu_count[rows] * 1000) | (st.shared_free[rows] < st.shared_cap[rows])
            | (st.mig_free[rows] < st.mig_cap[rows]).any(axis=1))
    rank: IntArray = rows + np.where(used, 0, len(state))
    return rank


class UsedFirstRank:
    """`used_first_rank` of one state, kept up to date for the rows whose `row_version` moved.

    The same array `used_first_rank` returns, without re-deriving "used" for
    every node per request (a sixth of a /prioritize's engine time at 15,000 nodes).
    """

    def __init__(self, state: NodeState) -> None:
        self.state = state
        self.rank = used_first_rank(state)
        self.seen = state.row_version.copy()

    def sync(self, rows: IntArray | None = None) -> IntArray:
        """The ranks, up to date for every row, or for `rows` alone (the only ones the caller reads)."""
        st = self.state
        if rows is None:
            dirty = np.flatnonzero(st.row_version != self.seen)
        else:
            dirty = rows[st.row_version[rows] != self.seen[rows]]
        if dirty.size:
            self.rank[dirty] = _used_first(st, dirty)
            self.seen[dirty] = st.row_version[dirty]
        return self.rank


def identical_to(state: NodeState, node: int, nodes: IntArray, keys: RowKeys | None = None) -> BoolArray:
    """Per node in `nodes`: same GPU model, same free CPU, memory, GPUs (as a multiset), MIG and replicas.

    `keys`: this state's `RowKeys` (the same answer from one id per row, kept up to date incrementally).
    """
    if keys is not None:
        few = rows_to_work_on(len(state), nodes)
        ids = keys.sync(None if few is None else np.append(few, node))
        same_id: BoolArray = ids[nodes] == ids[node]
        return same_id
    same = ((state.model_idx[nodes] == state.model_idx[node]) & (state.cpu_free[nodes] == state.cpu_free[node])
            & (state.mem_free[nodes] == state.mem_free[node]) & (state.shared_free[nodes] == state.shared_free[node])
            & (state.cpu_cap[nodes] == state.cpu_cap[node]) & (state.mem_cap[nodes] == state.mem_cap[node]))
    same &= (state.mig_free[nodes] == state.mig_free[node]).all(axis=1)
    rows = np.sort(state.gpu_free[nodes], axis=1)
    same &= (rows == np.sort(state.gpu_free[node])).all(axis=1)
    out: BoolArray = same
    return out


class RowKeys:
    """Per row of one state, an id that two rows share exactly when `identical_to` calls them identical.

    At 15,000 nodes comparing every node with the pick (a sort of every
    node's GPUs included) was a quarter of a /prioritize; the ids change only
    for rows whose `NodeState.row_version` moved (one or two per request in
    the extender), so a request compares one integer per node. An id is the
    position of the row's exact values (model, free and total CPU and memory,
    replicas, MIG, sorted GPUs) in a table of those seen, so equal ids mean
    equal values, never a hash collision. The table is started again when it
    holds many values no row has any more.
    """

    def __init__(self, state: NodeState) -> None:
        self.state = state
        self.seen = np.full(len(state), -1, dtype=np.int64)
        self.ids = np.zeros(len(state), dtype=np.int64)
        self._table: dict[bytes, int] = {}

    def sync(self, rows: IntArray | None = None) -> IntArray:
        """The ids, after re-keying the rows that changed since they were last keyed: every row, or `rows`
        alone (ids of other rows may then be stale: compare only ids of rows synced)."""
        st = self.state
        if rows is None:
            dirty = np.flatnonzero(st.row_version != self.seen)
        else:
            dirty = rows[st.row_version[rows] != self.seen[rows]]
        if dirty.size == 0:
            return self.ids
        if len(self._table) > 4 * len(st) + 1024:  # rare: every row keyed again against a new table
            self._table.clear()
            self.seen[:] = -1
            dirty = np.arange(len(st))
        values = np.ascontiguousarray(np.column_stack((
            st.model_idx[dirty], st.cpu_free[dirty], st.mem_free[dirty], st.shared_free[dirty], st.cpu_cap[dirty],
            st.mem_cap[dirty], st.mig_free[dirty], np.sort(st.gpu_free[dirty], axis=1))).astype(np.int64))
        table = self._table
        ids = [table.setdefault(row, len(table)) for row in map(bytes, values)]
        self.ids[dirty] = ids
        self.seen[dirty] = st.row_version[dirty]
        return self.ids


def extender_scores(decision: Placement, nodes: IntArray, state: NodeState | None = None,
                    keys: RowKeys | None = None) -> IntArray:
    """0..10 per node in `nodes`: the decided node 10, other feasible nodes 0..9, infeasible 0.

    With `state`, nodes identical to the pick (`identical_to`) get 10 too:
    identical nodes get equal scores, and kube-scheduler's random tie-break
    chooses among them. Nodes that merely score alike do not: the engine's
    tie order (nodes holding GPU work first, then a fixed order) is what fills one node
    after another, and kube-scheduler's spreading plugins would undo it.
    `keys`: the state's `RowKeys`, for the same answer at a fraction of the cost.
    """
    raw = decision.scores_of(nodes)
    out = np.zeros(len(nodes), dtype=np.int64)
    finite = np.isfinite(raw)
    chosen = nodes == decision.node if decision.node is not None else np.zeros(len(nodes), dtype=bool)
    if decision.node is not None and state is not None:
        chosen = chosen | (finite & identical_to(state, decision.node, nodes, keys))
    others = finite & ~chosen
    if others.any():
        lo, hi = raw[others].min(), raw[others].max()
        top = MAX_EXTENDER_SCORE - 1
        if hi > lo:
            out[others] = np.floor((raw[others] - lo) / (hi - lo) * top).astype(np.int64)
        else:
            out[others] = top
    out[chosen] = MAX_EXTENDER_SCORE
    return out


def pending_demand(state: NodeState, demand: PodDemand, plan: Plan) -> PodDemand:
    """A pending pod's demand: the plan's products, a share sized against the cluster."""
    return resolve_share(constrain(demand, plan.allowed_models), *cluster_share_basis(state))


@dataclass(frozen=True)
class Screening:
    """/filter's verdict on every node of `state`: `fitted` (reason codes), `hopeless` (preemption cannot help)."""

    plan: Plan
    demand: PodDemand  # the pod's demand, constrained by the plan's products
    state: NodeState
    fitted: FitResult  # every node's, or the rows screened (`fitted.nodes`)
    hopeless: BoolArray  # aligned with `fitted.codes`

    def verdicts(self, rows: IntArray) -> tuple[np.ndarray[Any, Any], BoolArray]:
        """(codes, hopeless) of the screened `rows`, in their order."""
        if self.fitted.nodes is None:
            return self.fitted.codes[rows], self.hopeless[rows]
        pos = np.searchsorted(self.fitted.nodes, rows)
        return self.fitted.codes[pos], self.hopeless[pos]


def screen(view: ClusterView, state: NodeState, request: PodRequest, default_strategy: str,
           rows: IntArray | None = None) -> Screening:
    """Which nodes (every one, or the `rows` asked about) can take the pod, and for the others whether
    evicting pods could change that."""
    plan = plan_for_pod(view, request, default_strategy)
    demand = pending_demand(state, request.demand, plan)
    few = rows_to_work_on(len(state), rows)
    nodes = None if few is None else sorted_rows(few)
    fitted = fit(state, demand, nodes)
    return Screening(plan, demand, state, fitted, unresolvable_mask(state, demand, fitted.codes, nodes))


@dataclass(frozen=True)
class Choice:
    """/prioritize's verdict on the nodes asked about (`rows`; < 0: unknown, 0 points).

    `points[i]`: 0..10 for `rows[i]`; `node`: the engine's pick (None when
    nothing fits), with 10 (as are nodes identical to it); `would`: with `compare`, the node
    the Recommend/Approve policy's strategy (`plan.recommended`) would pick.
    """

    plan: Plan
    demand: PodDemand
    decision: Placement
    state: NodeState
    known: IntArray  # the known rows, in input order: what the engine scored
    points: IntArray
    node: str | None
    would: str | None = None

    def explanation(self) -> list[NodeVerdict]:
        """Per scored node, best first: its rejection reason or its score (for logs and dry-run)."""
        return explain(self.state, self.decision, self.known.tolist())


def choose(view: ClusterView, state: NodeState, ctx: PackingContext, mix: TypicalMix | None,
           request: PodRequest, rows: IntArray, default_strategy: str, *,
           screened: Screening | None = None, compare: bool = False) -> Choice:
    """The engine's decision for the pod over `rows`, as 0..10 points. Mutates only `ctx` (its caches).

    `mix`: the typical pod mix learned so far (None or empty: the pod alone).
    `screened`: this pod's /filter verdict on this very state, if the caller
    has it; its fit verdicts are reused when its demand is this one. Ties go
    to nodes holding GPU work first (`used_first_rank`).
    """
    plan = plan_for_pod(view, request, default_strategy)
    demand = pending_demand(state, request.demand, plan)
    fitted = screened.fitted if (screened is not None and screened.state is state
                                 and screened.demand == demand) else None
    known_mask = rows >= 0
    known = rows if bool(known_mask.all()) else rows[known_mask]
    ctx.mix = mix if mix is not None and len(mix) else TypicalMix.from_pods([demand])
    # the tie order and the ids of identical rows, brought up to date for the rows asked about alone
    few = rows_to_work_on(len(state), known)  # None: so many rows that whole arrays cost less
    ctx.tie_rank = ctx.derived("used-first-rank", (state,), lambda: UsedFirstRank(state)).sync(few)
    asked = known if few is None else sorted_rows(few)
    if fitted is None or (fitted.nodes is not None if few is None else fitted.codes_of(asked) is None):
        fitted = fit(state, demand, None if few is None else asked)  # once: the decision and the explanation
    scored = asked if plan.preferred_models is None else preferred_rows(state, plan, asked, fitted)
    decision = decide(state, demand, get_strategy(plan.strategy), ctx, restrict=scored, fitted=fitted)
    points = np.zeros(len(rows), dtype=np.int64)
    keys = ctx.derived("row-keys", (state,), lambda: RowKeys(state))
    points[known_mask] = extender_scores(decision, known, state, keys)
    node = state.names[decision.node] if decision.node is not None else None
    would = None
    if compare and plan.recommended:
        other = decide(state, demand, get_strategy(plan.recommended), ctx, restrict=asked, fitted=decision.fit)
        would = state.names[other.node] if other.node is not None else None
    return Choice(plan, demand, decision, state, known, points, node, would)
