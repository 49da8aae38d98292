"""The referees of the capacity benchmark: Karpenter's and Cluster Autoscaler's documented rules, the lower bound.

They are not the product (kubeon's rules are gpupolicy/capacity); they are
what the product is measured against, from the upstream documentation and
code (cited in docs/designs/capacity.md):
- `default_place`: kube-scheduler's default scoring, NodeResourcesFit
  LeastAllocated over cpu and memory (weights 1, 1) plus
  NodeResourcesBalancedAllocation over cpu and memory, integer scores
  0..100 each, ties broken at random (selectHost). Extended resources such
  as nvidia.com/gpu are filtered on but not scored by default.
- `Karpenter`: as v1.9.0's code runs it (docs/designs/capacity.md). Provisioning:
  when a batch window closes (`Batcher`), one pass schedules every pending
  pod and the pods of deleting nodes, largest CPU and memory first, onto the
  existing nodes (initialized first, then by name) and then onto new
  NodeClaims, each the cheapest type still holding its pods. Disruption,
  every loop, in order: Emptiness (consolidateAfter 0), Expiration (expireAfter
  720h, forceful), multi-node consolidation (the longest prefix of candidates
  by disruption cost that can be deleted or replaced by ONE cheaper node, found
  by binary search, at most 100), single-node consolidation (the first
  candidate that can be deleted or replaced by a cheaper node); a loop that
  finds nothing looks again 10 s later. Scheduling simulation: the pending
  pods and the candidates' pods in one queue, largest first, as provisioning
  places them; a candidate's pod on a node not yet initialized fails it.
  Budget: 10% of the nodes (rounded up) disrupted at once. A replacement is
  launched first and the candidates are drained once it is ready.
- `ClusterAutoscaler`: scale-up for pods no node or upcoming node holds:
  per node group (instance type) a first-fit-decreasing estimate of the new
  nodes, the least-waste expander (least unused CPU and memory, averaged)
  picks one group per loop; a group one node of which would exceed the GPU
  limit is skipped before the estimate (scaleup/orchestrator
  `filterValidScaleUpNodeGroups`, `IsNodeGroupResourceExceeded`), and the
  count is capped to what the limit leaves. Scale-down: a node whose GPU requests are below
  50% of its GPUs and whose pods fit elsewhere is unneeded; after 10
  minutes unneeded it goes, empty ones in bulk (up to 10), a non-empty one
  per loop; no scale-down within 10 minutes of a scale-up. A node whose
  pods the simulation could not re-place is not simulated again for 5
  minutes (unremovable-node-recheck-timeout; core/scaledown/unremovable,
  eligibility.go `IsRecent`).
- `lower_bound`: the GPU-hours the pods request (shares as fractions) and
  their cost at the cheapest price per GPU of an allowed type that holds
  the pod.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from gpupolicy.capacity.instances import InstanceType
from gpupolicy.packing.nodemodel import MILLI, NodeState, PodDemand, model_mask, next_versions
from gpupolicy.packing.placement import fit, gpu_fit_mask
from simulator.capacity import Cluster, Drain, Figures, PodRun
from simulator.capacity_trace import TimedPod

MAX_NODE_SCORE = 100
KARPENTER_BUDGET_PERCENT = 10
KARPENTER_EXPIRE_AFTER = 720 * 3600.0
KARPENTER_MULTI_NODE_MAX = 100
KARPENTER_VALIDATION_DELAY = 15.0  # disruption/consolidation.go commandValidationDelay
KARPENTER_POLLING = 10.0  # disruption/controller.go pollingPeriod: the loop's wait after finding nothing
BATCH_IDLE_SECONDS = 1.0  # Karpenter's provisioning batch window (`Batcher`)
BATCH_MAX_SECONDS = 10.0
EMPTINESS, CONSOLIDATION = "emptiness", "consolidation"
CA_UTILISATION_THRESHOLD = 0.5
CA_UNNEEDED_TIME = 600.0
CA_DELAY_AFTER_ADD = 600.0
CA_MAX_EMPTY_BULK_DELETE = 10
CA_UNREMOVABLE_RECHECK = 300.0  # --unremovable-node-recheck-timeout (FAQ, "What are the parameters to CA?")


def first_gpus(state: NodeState, row: int, demand: PodDemand) -> tuple[int, ...]:
    """The device plugin's pick: the lowest-indexed GPUs that hold the demand."""
    if not demand.needs_gpu:
        return ()
    free = state.gpu_free[row]
    present = state.gpu_present[row]
    if demand.is_sharing:
        return (int(np.flatnonzero(present & (free >= demand.gpu_milli))[0]),)
    return tuple(int(g) for g in np.flatnonzero(present & (free == MILLI))[: demand.num_gpu])


def default_scores(state: NodeState, demand: PodDemand, rows: np.ndarray) -> np.ndarray:
    """kube-scheduler's LeastAllocated + BalancedAllocation (cpu, memory) for `rows`."""
    cap_cpu, cap_mem = state.cpu_cap[rows], state.mem_cap[rows]
    req_cpu = cap_cpu - state.cpu_free[rows] + demand.cpu_milli
    req_mem = cap_mem - state.mem_free[rows] + demand.memory_mib
    least = ((cap_cpu - req_cpu) * MAX_NODE_SCORE // cap_cpu + (cap_mem - req_mem) * MAX_NODE_SCORE // cap_mem) // 2
    f_cpu = np.minimum(req_cpu / cap_cpu, 1.0)
    f_mem = np.minimum(req_mem / cap_mem, 1.0)
    balanced = ((1.0 - np.abs(f_cpu - f_mem) / 2.0) * MAX_NODE_SCORE).astype(np.int64)
    out: np.ndarray = least + balanced
    return out


@dataclass
class DefaultScheduler:
    """kube-scheduler with its default scoring (the scheduler both baselines run beside)."""

    seed: int = 0
    rng: np.random.Generator = field(init=False)

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.seed)

    def place(self, cluster: Cluster, demand: PodDemand, ready: np.ndarray) -> tuple[int, tuple[int, ...]] | None:
        state = cluster.state
        rows = ready[fit(state, demand).feasible[ready]]
        if not rows.size:
            return None
        scores = default_scores(state, demand, rows)
        top = rows[scores == scores.max()]
        row = int(top[self.rng.integers(top.size)]) if top.size > 1 else int(top[0])
        return row, first_gpus(state, row, demand)

    def launched(self, rows: Sequence[int]) -> None:
        """Nothing to remember: the referees re-plan from the cluster at every loop."""


# ---- bin packing on new nodes, shared by the two baselines' estimates ------------------------
def _most(options: Sequence[InstanceType]) -> tuple[int, int, int]:
    return (max((t.cpu_milli for t in options), default=0), max((t.memory_mib for t in options), default=0),
            max((t.gpus for t in options), default=0))


@dataclass
class NewNode:
    """A node not yet launched in a simulation: the types still possible and the pods on it."""

    options: list[InstanceType]
    cpu: int = 0
    mem: int = 0
    gpus: list[int] = field(default_factory=list)  # milli used per GPU, as many as the smallest option has
    pods: list[PodDemand] = field(default_factory=list)
    most: tuple[int, int, int] = field(init=False)  # the largest CPU, memory and GPUs among the options

    def __post_init__(self) -> None:
        self.most = _most(self.options)

    def _fits(self, kind: InstanceType, demand: PodDemand, gpus: list[int]) -> bool:
        if not kind.holds(demand) or self.cpu + demand.cpu_milli > kind.cpu_milli:
            return False
        return self.mem + demand.memory_mib <= kind.memory_mib and len(gpus) <= kind.gpus

    def add(self, demand: PodDemand) -> bool:
        whole = demand.num_gpu if demand.needs_gpu and not demand.is_sharing else 0
        if (self.cpu + demand.cpu_milli > self.most[0] or self.mem + demand.memory_mib > self.most[1]
                or len(self.gpus) + whole > self.most[2]):
            return False  # no option is that large: most nodes of a large simulation stop here
        gpus = list(self.gpus)
        if demand.needs_gpu:
            if demand.is_sharing:
                room = [g for g, u in enumerate(gpus) if MILLI - u >= demand.gpu_milli]
                if room:
                    gpus[room[0]] += demand.gpu_milli
                else:
                    gpus.append(demand.gpu_milli)
            else:
                gpus.extend([MILLI] * demand.num_gpu)
        left = [k for k in self.options if self._fits(k, demand, gpus)]
        if not left:
            return False
        self.options, self.gpus = left, gpus
        self.most = _most(left)
        self.cpu += demand.cpu_milli
        self.mem += demand.memory_mib
        self.pods.append(demand)
        return True

    def cheapest(self) -> InstanceType:
        return cheapest(self.options)


def cheapest(types: Sequence[InstanceType]) -> InstanceType:
    """The type Karpenter launches among `types`: the lowest price (ties by name)."""
    return min(types, key=lambda t: (t.price_per_hour, t.name))


def within_limit(nodes: Sequence[NewNode], left: float) -> tuple[list[list[InstanceType]], list[PodDemand]]:
    """The types each new NodeClaim may be with `left` GPUs left under the NodePool's limit, in order (each
    claim counts its largest option, scheduler.go `subtractMax`), and the pods of the claims none fits."""
    kept: list[list[InstanceType]] = []
    dropped: list[PodDemand] = []
    for node in nodes:
        options = [t for t in node.options if t.gpus <= left]
        if options:
            left -= max(t.gpus for t in options)
            kept.append(options)
        else:
            dropped.extend(node.pods)
    return kept, dropped


@dataclass
class Batcher:
    """Karpenter's provisioning batcher (pkg/controllers/provisioning/batcher.go; options
    BATCH_IDLE_DURATION, BATCH_MAX_DURATION): the first pod event opens a window, which closes once no
    event came for `idle` seconds or `longest` seconds after it opened; each close runs one provisioning
    pass over every pod pending then, at the first loop at or after it. Without windows, the simulator's
    loop batched pods a real Karpenter launches for apart (bench/capacity_live.py: the model bought a 4-GPU
    node for a 2-GPU and a 1-GPU workload 8 s apart, where real Karpenter bought two 2-GPU nodes); running
    a pass at the loop before its window closes splits the batches the real one makes (on the live cluster
    the model then bought fewer of the 4-GPU nodes that three 1-GPU pods of one batch lead to)."""

    idle: float
    longest: float
    opened: float | None = None
    last: float = -math.inf

    def closes(self, events: Sequence[float], now: float) -> list[float]:
        """The times (at most `now`, in order) at which windows closed, given the new events' times."""
        out: list[float] = []
        for t in sorted(events):
            if self.opened is not None and (t - self.last > self.idle or t - self.opened > self.longest):
                out.append(self.close_at())
                self.opened = None
            if self.opened is None:
                self.opened = t
            self.last = max(self.last, t)
        if self.opened is not None and now >= self.close_at():
            out.append(self.close_at())
            self.opened = None
        return out

    def close_at(self) -> float:
        assert self.opened is not None
        return min(self.last + self.idle, self.opened + self.longest)


def pack_new(pods: Sequence[PodDemand], types: Sequence[InstanceType]) -> tuple[list[NewNode], list[PodDemand]]:
    """Karpenter's packing of pods onto new NodeClaims (pods in the given order); the pods no type holds."""
    nodes: list[NewNode] = []
    unfit: list[PodDemand] = []
    for demand in pods:
        # scheduler.go `add`: the new NodeClaims are tried fewest pods first
        if any(n.add(demand) for n in sorted(nodes, key=lambda n: len(n.pods))):
            continue
        node = NewNode([t for t in types if t.holds(demand)])
        if node.options and node.add(demand):
            nodes.append(node)
        else:
            unfit.append(demand)
    return nodes, unfit


def estimate(pods: Sequence[PodDemand], kind: InstanceType) -> tuple[int, int, int]:
    """`pack_new(pods, [kind])` as numbers: how many new nodes, and the CPU and memory packed on them.

    Cluster Autoscaler's binpacking estimate per node group, once per group
    and loop: the same first fit as `NewNode.add` on one type, on plain
    numbers (pods `kind` cannot hold are skipped, as `pack_new` leaves them
    unfit).
    """
    cpu: list[int] = []
    mem: list[int] = []
    used: list[list[int]] = []  # per node, milli used per GPU taken so far
    for d in pods:
        if not kind.holds(d):
            continue
        whole = d.num_gpu if d.needs_gpu and not d.is_sharing else 0
        for i in range(len(cpu)):
            if cpu[i] + d.cpu_milli > kind.cpu_milli or mem[i] + d.memory_mib > kind.memory_mib:
                continue
            gpus = used[i]
            if d.is_sharing:
                g = next((g for g, u in enumerate(gpus) if MILLI - u >= d.gpu_milli), -1)
                if g < 0 and len(gpus) + 1 > kind.gpus:
                    continue
                if g < 0:
                    gpus.append(d.gpu_milli)
                else:
                    gpus[g] += d.gpu_milli
            elif whole:
                if len(gpus) + whole > kind.gpus:
                    continue
                gpus.extend([MILLI] * whole)
            cpu[i] += d.cpu_milli
            mem[i] += d.memory_mib
            break
        else:
            if d.cpu_milli > kind.cpu_milli or d.memory_mib > kind.memory_mib:
                continue
            cpu.append(d.cpu_milli)
            mem.append(d.memory_mib)
            used.append([d.gpu_milli] if d.is_sharing else [MILLI] * whole)
    return len(cpu), sum(cpu), sum(mem)


def by_size(d: PodDemand) -> tuple[int, int, int]:
    return (-d.cpu_milli, -d.memory_mib, -d.gpu_total_milli)


def fits(state: NodeState, d: PodDemand) -> np.ndarray:
    """The engine's fit rules for the trace's demands (no MIG, replicas or GPU memory), without reasons."""
    ok: np.ndarray = state.schedulable & (state.cpu_free >= d.cpu_milli) & (state.mem_free >= d.memory_mib)
    if d.allowed_models is not None:
        ok &= model_mask(state, d.allowed_models)
    if d.needs_gpu:
        ok &= gpu_fit_mask(state, d) & (state.gpu_count > 0)
    return ok


def _take(state: NodeState, row: int, d: PodDemand, gpus: tuple[int, ...]) -> None:
    """`state.place` without its range checks, for a throwaway trial whose fit was just checked.

    The same arrays change in the same way (`NodeState._apply`, `refresh`) on
    plain Python numbers: the referees' simulations place millions of pods.
    """
    state.cpu_free[row] -= d.cpu_milli
    state.mem_free[row] -= d.memory_mib
    state.row_version[row] = next_versions(1)[0]
    if not gpus:
        return
    free = state.gpu_free[row]
    for g in gpus:
        free[g] -= d.gpu_milli
    values = free[: int(state.gpu_count[row])].tolist()
    partial = [v for v in values if v < MILLI]
    state.full_count[row] = len(values) - len(partial)
    state.max_partial[row] = max(partial) if partial else 0
    state.gpu_free_total[row] = sum(values)


def _first_gpus_of(free: list[int], d: PodDemand) -> tuple[int, ...]:
    """`first_gpus` on one row's free milli (present GPUs only) as a list."""
    if d.is_sharing:
        return (next(g for g, v in enumerate(free) if v >= d.gpu_milli),)
    return tuple([g for g, v in enumerate(free) if v == MILLI][: d.num_gpu])


class RowUndo:
    """The mutable fields of the rows a trial changes, saved before their first change, to be put back.

    Cluster Autoscaler's scale-down check simulates one node after another on
    one state and keeps only the simulations that succeed: undoing the few
    rows a failed one touched costs what it touched, not a copy of the state.
    """

    def __init__(self, state: NodeState) -> None:
        self.state = state
        self.saved: dict[int, tuple[int, int, np.ndarray, int, int, int, int, np.ndarray, int]] = {}

    def mark(self, row: int) -> None:
        if row in self.saved:
            return
        s = self.state
        self.saved[row] = (int(s.cpu_free[row]), int(s.mem_free[row]), s.gpu_free[row].copy(), int(s.full_count[row]),
                           int(s.max_partial[row]), int(s.gpu_free_total[row]), int(s.row_version[row]),
                           s.mig_free[row].copy(), int(s.shared_free[row]))

    def restore(self) -> None:
        s = self.state
        for row, (cpu, mem, gpu, full, partial, total, version, mig, shared) in self.saved.items():
            s.cpu_free[row], s.mem_free[row], s.gpu_free[row], s.full_count[row] = cpu, mem, gpu, full
            s.max_partial[row], s.gpu_free_total[row], s.row_version[row] = partial, total, version
            s.mig_free[row], s.shared_free[row] = mig, shared
        self.saved.clear()


def _room(state: NodeState, d: PodDemand, allowed: np.ndarray, models: dict[frozenset[str], np.ndarray]
          ) -> np.ndarray:
    """The rows of `allowed` that hold `d` now (`models`: model masks already built, by allowed set)."""
    if d.mig or d.shared or d.gpu_memory_mib:
        out: np.ndarray = fit(state, d).feasible & allowed
        return out
    mask = allowed & (state.cpu_free >= d.cpu_milli)
    mask &= state.mem_free >= d.memory_mib
    if d.allowed_models is not None:
        if d.allowed_models not in models:
            models[d.allowed_models] = model_mask(state, d.allowed_models)
        mask &= models[d.allowed_models]
    if d.needs_gpu:
        mask &= state.gpu_count > 0
        if d.is_sharing:
            mask &= (state.max_partial >= d.gpu_milli) | (state.full_count >= 1)
        else:
            mask &= state.full_count >= d.num_gpu
    return mask


def _put(state: NodeState, row: int, d: PodDemand, undo: RowUndo | None) -> None:
    """Place `d` on `row` (which holds it) on the device plugin's GPUs."""
    if undo is not None:
        undo.mark(row)
    if d.mig or d.shared or d.gpu_memory_mib:
        state.place(row, d, first_gpus(state, row, d))
        return
    gpus = _first_gpus_of(state.gpu_free[row, : int(state.gpu_count[row])].tolist(), d) if d.needs_gpu else ()
    _take(state, row, d, gpus)


def first_fit(state: NodeState, pods: Sequence[PodDemand], rows: np.ndarray, *, undo: RowUndo | None = None,
              stop_at_miss: bool = False) -> list[PodDemand]:
    """Place `pods` first-fit (row order) on `rows` of `state` (mutated); the pods that found no room.

    `undo` records every row before its first change; `stop_at_miss` returns
    at the first pod with no room (callers that only ask whether all fit).
    """
    left: list[PodDemand] = []
    if not len(state):
        return list(pods)
    allowed = np.zeros(len(state), dtype=bool)
    allowed[rows] = True
    allowed &= state.schedulable
    models: dict[frozenset[str], np.ndarray] = {}
    for d in pods:
        mask = _room(state, d, allowed, models)
        row = int(mask.argmax())
        if not mask[row]:
            left.append(d)
            if stop_at_miss:
                return left
            continue
        _put(state, row, d, undo)
    return left


def place_in_order(state: NodeState, d: PodDemand, order: np.ndarray) -> int:
    """Place `d` on the first row of `order` that holds it (mutating `state`); that row, or -1.

    Karpenter's scheduling simulation tries existing nodes in its own order
    (`sortExistingNodes`), not the model's row order.
    """
    if not order.size:
        return -1
    mask = _room(state, d, state.schedulable, {})[order]
    i = int(mask.argmax())
    if not mask[i]:
        return -1
    row = int(order[i])
    _put(state, row, d, None)
    return row


def _pending_left(cluster: Cluster, pending: Sequence[PodRun]) -> list[PodDemand]:
    """Pending pods (largest first) that no live, schedulable node (ready or in flight) holds."""
    trial = cluster.state.copy()
    rows = np.array([r for r in cluster.live_rows() if not cluster.cordoned[r]], dtype=np.int64)
    return first_fit(trial, sorted((r.pod.demand for r in pending), key=by_size), rows)


class Landed:
    """Where the pending pods (in queue order) land when every schedulable node is there (`rows`, -1: none
    holds it), and the states after the first j of them (`state`, cached): what each consolidation attempt
    of one pass starts from. At a burst's hundreds of pending pods, re-placing them in each of a pass's
    hundred attempts was most of a run's time."""

    def __init__(self, state: NodeState, pods: Sequence[PodDemand], rows: list[int]) -> None:
        self.pods, self.rows = list(pods), rows
        self.keys = [by_size(d) for d in pods]
        self.states: dict[int, NodeState] = {0: state.copy()}

    def prefix(self, first: tuple[int, int, int], gone: set[int]) -> int:
        """How many leading pending pods an attempt can take as landed: those queued before its first pod
        (`first`: that pod's key; pending pods go first on ties), up to the first on a node of `gone`."""
        end = bisect.bisect_right(self.keys, first)
        return next((i for i in range(end) if self.rows[i] in gone), end)

    def state(self, j: int) -> NodeState:
        """A copy of the state with the first `j` pending pods landed."""
        if j not in self.states:
            start = max(k for k in self.states if k < j)
            state = self.states[start].copy()
            for d, row in zip(self.pods[start:j], self.rows[start:j], strict=True):
                if row >= 0:
                    _put(state, row, d, None)
            self.states[j] = state
        return self.states[j].copy()


@dataclass(frozen=True)
class KarpenterOptions:
    """The settings of the Karpenter a run models: the NodePool's expireAfter (None: 720 h, or Never when
    evicted work restarts, `simulator.capacity_compare.controller`) and the provisioner's batch windows
    (Karpenter's defaults; the live bench's Karpenter runs shorter ones, tests/cluster/karpenter.py)."""

    expire_after: float | None = None
    batch_idle: float = BATCH_IDLE_SECONDS
    batch_max: float = BATCH_MAX_SECONDS


@dataclass(frozen=True)
class Command:
    """A disruption Karpenter computed and validates `KARPENTER_VALIDATION_DELAY` later before acting."""

    method: str
    rows: tuple[int, ...]
    replacement: InstanceType | None
    due: float


@dataclass
class Karpenter(DefaultScheduler):
    """Karpenter v1's provisioning and disruption beside kube-scheduler's default scoring."""

    instance_types: Sequence[InstanceType] = ()
    max_gpus: int | None = None
    name: str = "karpenter"
    expire_after: float = KARPENTER_EXPIRE_AFTER  # the NodePool's expireAfter (math.inf: Never)
    batch_idle: float = BATCH_IDLE_SECONDS  # BATCH_IDLE_DURATION
    batch_max: float = BATCH_MAX_SECONDS  # BATCH_MAX_DURATION

    def __post_init__(self) -> None:
        super().__post_init__()
        self.since: dict[tuple[str, bool], float] = {}  # (pod, pending?) -> when provisioning saw it come
        self.deleted_seen = 0
        self.batcher = Batcher(self.batch_idle, self.batch_max)
        self.quiet_version = -1
        self.validating: Command | None = None  # a command waiting out its validation delay
        self.nominated_until: dict[int, float] = {}  # rows a provisioning pass placed pending pods on
        self.validations = [0, 0]  # passed, failed
        self.names = np.random.default_rng(self.seed + 1)  # node names' order (`_order`), apart from scheduling's
        self.name_keys: dict[str, float] = {}
        self.poll_at = -math.inf  # when the disruption loop looks next after finding nothing
        self.packs: dict[tuple[int, ...], tuple[list[NewNode], list[PodDemand]]] = {}  # one pass's (_new_claims)

    def provision(self, cluster: Cluster, pending: Sequence[PodRun], now: float) -> list[InstanceType]:
        """The NodeClaims of the provisioning passes whose batch windows closed by `now`.

        Each pass (provisioner.go `Schedule`) schedules every pod pending by
        its close, and the pods of nodes being deleted, largest CPU and memory
        first, onto the existing nodes (in-flight ones included, `_order`),
        then onto new NodeClaims, each bought as the cheapest type left within
        the NodePool's GPU limit. A later pass re-places the pods of earlier
        ones: a larger pod can take an in-flight node's room and send a
        smaller one to a new NodeClaim with others.
        """
        runs = list(pending) + [p for r in cluster.live_rows() if cluster.cordoned[r]
                                for p in cluster.pods_on[r].values()]
        # a pod event: a pod arrived, was evicted (its new pod), or is on a node being deleted
        keys = [(r.pod.key, r.row is None) for r in runs]
        since = {k: self.since.get(k, r.pod.arrival if r.first_bind is None else now)
                 for k, r in zip(keys, runs, strict=True)}
        events = [t for k, t in since.items() if k not in self.since]
        self.since = since
        deleted = cluster.serial - cluster.nodes_now
        if deleted != self.deleted_seen:  # a node went: its capacity with it (provisioning's node trigger)
            self.deleted_seen = deleted
            events.append(now)
        out: list[InstanceType] = []
        order = np.array(self._order(cluster, [r for r in cluster.live_rows() if not cluster.cordoned[r]]),
                         dtype=np.int64)
        trial = cluster.state
        for close in self.batcher.closes(events, now):
            pods = [r.pod.demand for k, r in zip(keys, runs, strict=True) if since[k] <= close]
            trial = self._pass(cluster, pods, order, out)
        # nodes a pass scheduled pending pods onto are nominated (scheduling/scheduler.go): no candidates
        for r in np.flatnonzero(trial.row_version != cluster.state.row_version).tolist():
            self.nominated_until[r] = now + max(2 * self.batch_max, 10.0)  # state/statenode.go nominationWindow
        return out

    def _pass(self, cluster: Cluster, pods: Sequence[PodDemand], order: np.ndarray,
              bought: list[InstanceType]) -> NodeState:
        """One provisioning pass; appends its NodeClaims' types to `bought` (earlier passes' claims of this
        call are in flight: tried after the existing nodes). The trial state of the existing nodes."""
        trial = cluster.state.copy()
        in_flight = [NewNode([kind]) for kind in bought]
        new: list[PodDemand] = []
        for d in sorted(pods, key=by_size):
            if place_in_order(trial, d, order) < 0 and not any(n.add(d) for n in in_flight):
                new.append(d)
        left = math.inf
        if self.max_gpus is not None:
            left = self.max_gpus - sum(cluster.kind[r].gpus for r in order.tolist()) - sum(k.gpus for k in bought)
        kept, _ = within_limit(pack_new(new, self.instance_types)[0], left)
        bought.extend(cheapest(options) for options in kept)
        return trial

    def _consolidate(self, cluster: Cluster, group: Sequence[int], order: np.ndarray,
                     waiting: Sequence[tuple[PodDemand, bool]], landed: Landed) -> tuple[bool, InstanceType | None]:
        """Can `group` go: (True, None) delete, (True, type) replace by one cheaper node, (False, None) no.

        Karpenter's `SimulateScheduling` (disruption/helpers.go) and
        `computeConsolidation` (consolidation.go): the pending pods and the
        group's pods in ONE queue, largest CPU and memory first (queue.go), each
        on the first existing node of `order` that holds it, else on new
        NodeClaims. A group pod that lands on a node not yet initialized fails
        the simulation; a pending pod that finds no room anywhere does not. No
        new NodeClaim: delete; exactly one, cheaper than the group (and, for
        several nodes, cheaper than any of the group's types it could be,
        `filterOutSameInstanceType`): replace.
        """
        moving = sorted(((p.pod.demand, True, True) for r in group for p in cluster.pods_on[r].values()),
                        key=lambda x: by_size(x[0]))
        new: list[PodDemand] = []
        ours: set[int] = set()  # ids of the group's pods among `new`
        start = landed.prefix(by_size(moving[0][0]), set(group)) if moving else 0
        new.extend(d for (d, _), row in zip(waiting[:start], landed.rows[:start], strict=True) if row < 0)
        trial = landed.state(start)
        # (pod, may some node hold it, of the group?), both lists sorted: one queue, pending pods first on ties
        pending = ((d, may_fit, False) for d, may_fit in waiting[start:])
        for d, may_fit, of_group in heapq.merge(pending, moving, key=lambda x: by_size(x[0])):
            row = place_in_order(trial, d, order) if may_fit else -1
            if row < 0:
                new.append(d)
                if of_group:
                    ours.add(id(d))
            elif of_group and not cluster.ready[row]:
                return False, None  # UninitializedNodeError
        nodes, unplaced = self._new_claims(cluster, group, new)
        if any(id(d) in ours for d in unplaced):
            return False, None
        if not nodes:
            return True, None
        if len(nodes) > 1:
            return False, None
        price = sum(cluster.kind[r].price_per_hour for r in group)
        options = [t for t in nodes[0] if t.price_per_hour < price]
        if len(group) > 1:
            same = [cluster.kind[r].price_per_hour for r in group if cluster.kind[r] in options]
            options = [t for t in options if not same or t.price_per_hour < min(same)]
        if not options:
            return False, None
        return True, cheapest(options)

    def _new_claims(self, cluster: Cluster, group: Sequence[int], pods: Sequence[PodDemand]
                    ) -> tuple[list[list[InstanceType]], list[PodDemand]]:
        """The types each new NodeClaim the simulation opens for `pods` may be, within the NodePool's GPU
        limit (the group's and the deleting nodes' GPUs freed; each claim counts its largest option,
        scheduler.go `subtractMax`), and the pods left with none. The packing of the same pods is
        reused within a pass (`packs`): most attempts leave the same pending pods to new NodeClaims."""
        key = tuple(id(d) for d in pods)
        if key not in self.packs:
            self.packs[key] = pack_new(pods, self.instance_types)
        nodes, unfit = self.packs[key]
        left = math.inf
        if self.max_gpus is not None:
            gone = set(group)
            left = self.max_gpus - sum(cluster.kind[r].gpus for r in cluster.live_rows()
                                       if not cluster.cordoned[r] and r not in gone)
        kept, dropped = within_limit(nodes, left)
        return kept, unfit + dropped

    def disrupt(self, cluster: Cluster, now: float) -> list[Drain]:
        live = cluster.live_rows()
        out: list[Drain] = []
        expired = [r for r in live if not cluster.cordoned[r] and now - cluster.requested_at[r]
                   >= self.expire_after]
        out.extend(Drain((r,)) for r in expired)  # forceful: no budget, no replacement first
        if self.validating is not None:
            waiting = self.validating
            if now < waiting.due:
                return out  # the disruption loop waits out the validation delay (it blocks)
            self.validating = None
            valid = self._validate(cluster, waiting, now, set(expired))
            if valid is not None:
                self.validations[0] += 1
                out.append(valid)
                return out
            self.validations[1] += 1  # failed: recompute at once, as the next method of the same pass would
        elif cluster.version == self.quiet_version or now < self.poll_at:
            return out
        command = self._compute(cluster, now, set(expired))
        if command is None:
            self.quiet_version = cluster.version
            self.poll_at = now + KARPENTER_POLLING  # the disruption loop found nothing: it looks again in 10 s
        else:
            self.validating = command
        return out

    def _budget(self, cluster: Cluster, live: Sequence[int]) -> int:
        return math.ceil(len(live) * KARPENTER_BUDGET_PERCENT / 100) - sum(1 for r in live if cluster.cordoned[r])

    def _candidates(self, cluster: Cluster, now: float, expired: set[int]) -> list[int]:
        """Disruptable nodes: ready (initialized), not being disrupted or expired, not nominated."""
        return [r for r in cluster.live_rows() if cluster.ready[r] and not cluster.cordoned[r] and r not in expired
                and self.nominated_until.get(r, -math.inf) <= now]

    def _compute(self, cluster: Cluster, now: float, expired: set[int]) -> Command | None:
        """The first method that finds something: Emptiness, multi-node, single-node consolidation."""
        live = cluster.live_rows()
        budget = self._budget(cluster, live)
        if budget <= 0:
            return None
        ready = self._candidates(cluster, now, expired)
        empty = [r for r in ready if not cluster.pods_on[r]]
        if empty:
            return Command(EMPTINESS, tuple(empty[:budget]), None, now + KARPENTER_VALIDATION_DELAY)

        def cost(r: int) -> tuple[float, float]:
            remaining = max(0.0, 1.0 - (now - cluster.requested_at[r]) / self.expire_after)
            return (len(cluster.pods_on[r]) * remaining, self._name_key(cluster, r))

        candidates = sorted((r for r in ready if cluster.pods_on[r]), key=cost)
        attempt = self._simulation(cluster, expired)
        # multi-node: sizes 2..n (single nodes are the next method's), n = candidates within the budget
        lo, hi = 2, min(len(candidates), budget, KARPENTER_MULTI_NODE_MAX)
        best: tuple[list[int], InstanceType | None] | None = None
        while lo <= hi:
            mid = (lo + hi) // 2
            ok, kind = attempt(candidates[:mid])
            if ok:
                best, lo = (candidates[:mid], kind), mid + 1
            else:
                hi = mid - 1
        if best is None:
            for r in candidates:
                ok, kind = attempt([r])
                if ok:
                    best = ([r], kind)
                    break
        if best is None:
            return None
        return Command(CONSOLIDATION, tuple(best[0]), best[1], now + KARPENTER_VALIDATION_DELAY)

    def _simulation(self, cluster: Cluster, expired: set[int]
                    ) -> Callable[[Sequence[int]], tuple[bool, InstanceType | None]]:
        """`attempt(group)`: whether `group` can be deleted or replaced now (`_consolidate`)."""
        schedulable = [r for r in cluster.live_rows() if not cluster.cordoned[r] and r not in expired]
        order = self._order(cluster, schedulable)
        self.packs = {}
        # the pending pods in queue order, each with whether any schedulable node holds it now: one that
        # none does holds on none in any attempt either (an attempt only removes nodes and adds pods)
        allowed = np.zeros(len(cluster.state), dtype=bool)
        allowed[schedulable] = True
        allowed &= cluster.state.schedulable
        models: dict[frozenset[str], np.ndarray] = {}
        waiting = [(d, bool(_room(cluster.state, d, allowed, models).any()))
                   for d in sorted((r.pod.demand for r in cluster.pending.values()), key=by_size)]
        # where each pending pod lands with every schedulable node there: an attempt keeps the placements of
        # the pending pods queued before its first pod, up to the first that landed on one of its nodes
        # (first fit on fewer nodes picks the same node when no removed one was picked)
        base = cluster.state.copy()
        full = np.array(order, dtype=np.int64)
        landed = Landed(cluster.state, [d for d, _ in waiting],
                        [place_in_order(base, d, full) if may_fit else -1 for d, may_fit in waiting])

        def attempt(group: Sequence[int]) -> tuple[bool, InstanceType | None]:
            gone = set(group)
            return self._consolidate(cluster, group, np.array([r for r in order if r not in gone], dtype=np.int64),
                                     waiting, landed)

        return attempt

    def _order(self, cluster: Cluster, rows: Sequence[int]) -> list[int]:
        """Existing nodes as Karpenter's scheduler tries them: initialized first, then by name
        (scheduling/scheduler.go `sortExistingNodes`). Real node names are random (`gpu-x8glr`), so each
        node gets a random key, drawn once."""
        return sorted(rows, key=lambda r: (not cluster.ready[r], self._name_key(cluster, r)))

    def _name_key(self, cluster: Cluster, row: int) -> float:
        name = cluster.node_name[row]
        if name not in self.name_keys:
            self.name_keys[name] = float(self.names.random())
        return self.name_keys[name]

    def _validate(self, cluster: Cluster, command: Command, now: float, expired: set[int]) -> Drain | None:
        """Karpenter's validation after `commandValidationDelay` (disruption/validation.go), or None.

        The candidates must all still be candidates (alive, not disrupted, not
        nominated; Emptiness keeps those still empty), within the budget, and
        a consolidation's simulation must give the same kind of result: a
        deletion again, or again one cheaper replacement.
        """
        still = set(self._candidates(cluster, now, expired))
        budget = self._budget(cluster, cluster.live_rows())
        if command.method == EMPTINESS:
            rows = [r for r in command.rows if r in still and not cluster.pods_on[r]][:max(budget, 0)]
            return Drain(tuple(rows)) if rows else None
        if not all(r in still and cluster.pods_on[r] for r in command.rows) or len(command.rows) > budget:
            return None
        ok, kind = self._simulation(cluster, expired)(command.rows)
        if not ok or (kind is None) != (command.replacement is None):
            return None
        return Drain(command.rows, (kind,) if kind is not None else ())

    def next_timer(self, cluster: Cluster, now: float) -> float:
        ages = [cluster.requested_at[r] + self.expire_after for r in cluster.live_rows()]
        if self.validating is not None:
            ages.append(self.validating.due)
        if self.poll_at > now and cluster.version != self.quiet_version:
            ages.append(self.poll_at)
        if self.batcher.opened is not None:
            ages.append(self.batcher.close_at())
        return min(ages, default=math.inf)


@dataclass
class ClusterAutoscaler(DefaultScheduler):
    """Cluster Autoscaler's documented scale-up and scale-down beside kube-scheduler's default scoring."""

    instance_types: Sequence[InstanceType] = ()
    max_gpus: int | None = None
    name: str = "cluster-autoscaler"

    def __post_init__(self) -> None:
        super().__post_init__()
        self.unneeded_since: dict[int, float] = {}
        self.unremovable_until: dict[str, float] = {}  # node name -> when it may be simulated again
        self.last_scale_up = -math.inf
        self.quiet_version = -1

    def provision(self, cluster: Cluster, pending: Sequence[PodRun], now: float) -> list[InstanceType]:
        left = _pending_left(cluster, pending)
        if not left:
            return []
        best: tuple[float, float, InstanceType, int] | None = None
        gpus = sum(cluster.kind[r].gpus for r in cluster.live_rows())
        for kind in self.instance_types:
            if self.max_gpus is not None and gpus + kind.gpus > self.max_gpus:
                continue  # a group one more node of which exceeds the GPU limit is skipped before estimating
            fitting = [d for d in left if kind.holds(d)]
            if not fitting:
                continue
            count, cpu_used, mem_used = estimate(fitting, kind)
            cpu = cpu_used / (kind.cpu_milli * count)
            mem = mem_used / (kind.memory_mib * count)
            waste = ((1 - cpu) + (1 - mem)) / 2
            key = (waste, float(self.rng.random()), kind, count)
            if best is None or key[:2] < best[:2]:
                best = key
        if best is None:
            return []
        kind, count = best[2], best[3]
        if self.max_gpus is not None and kind.gpus:
            count = min(count, max(0, (self.max_gpus - gpus) // kind.gpus))
        if count:
            self.last_scale_up = now
        return [kind] * count

    def disrupt(self, cluster: Cluster, now: float) -> list[Drain]:
        live = cluster.live_rows()
        if now - self.last_scale_up < CA_DELAY_AFTER_ADD:
            return []
        if any(cluster.cordoned[r] for r in live):
            return []  # a drain is under way: one non-empty node at a time
        ready = [r for r in live if cluster.ready[r]]
        if cluster.version != self.quiet_version:
            self.quiet_version = cluster.version
            self.unremovable_until = {n: t for n, t in self.unremovable_until.items() if t > now}
            trial = cluster.state.copy()
            unneeded: list[int] = []
            destination = np.zeros(len(cluster.state), dtype=bool)  # ready, not (yet) unneeded
            destination[ready] = True
            for r in ready:
                gpus = cluster.kind[r].gpus
                used = (gpus * MILLI - int(trial.gpu_free_total[r])) / (gpus * MILLI) if gpus else 0.0
                if used >= CA_UTILISATION_THRESHOLD or cluster.node_name[r] in self.unremovable_until:
                    continue
                destination[r] = False
                others = np.flatnonzero(destination)
                destination[r] = True
                pods = [p.pod.demand for p in cluster.pods_on[r].values()]
                if pods:  # simulated on `trial` itself; a failed simulation is undone, a good one kept
                    undo = RowUndo(trial)
                    undo.mark(r)
                    for p in cluster.pods_on[r].values():
                        trial.remove(r, p.pod.demand, p.gpus)
                    if first_fit(trial, sorted(pods, key=by_size), others, undo=undo, stop_at_miss=True):
                        undo.restore()
                        self.unremovable_until[cluster.node_name[r]] = now + CA_UNREMOVABLE_RECHECK
                        continue
                unneeded.append(r)
                destination[r] = False
            self.unneeded_since = {r: self.unneeded_since.get(r, now) for r in unneeded}
        due = [r for r, t in self.unneeded_since.items() if now - t >= CA_UNNEEDED_TIME]
        empty = [r for r in due if not cluster.pods_on[r]][:CA_MAX_EMPTY_BULK_DELETE]
        if empty:
            for r in empty:
                del self.unneeded_since[r]
            return [Drain((r,)) for r in empty]
        busy = [r for r in due if cluster.pods_on[r]]
        if busy:
            del self.unneeded_since[busy[0]]
            return [Drain((busy[0],))]
        return []

    def next_timer(self, cluster: Cluster, now: float) -> float:
        due = [t + CA_UNNEEDED_TIME for t in self.unneeded_since.values()]
        after_add = self.last_scale_up + CA_DELAY_AFTER_ADD
        if due and after_add > now:
            due.append(after_add)
        return min(due, default=math.inf)


def lower_bound(pods: Sequence[TimedPod], instance_types: Sequence[InstanceType]) -> Figures:
    """GPU-hours requested and their cost at the cheapest per-GPU price of an allowed type that holds each pod."""
    gpu_hours = cost = 0.0
    for p in pods:
        d = p.demand
        if not d.needs_gpu:
            continue
        gpus = d.gpu_total_milli / MILLI
        hours = p.duration / 3600.0
        prices = [t.price_per_gpu_hour for t in instance_types if t.holds(d) and t.gpus]
        gpu_hours += gpus * hours
        cost += gpus * hours * min(prices, default=math.nan)
    return Figures(gpu_hours, 0.0, cost, 0.0, 0.0, 0, 0, 0, 0)
