"""Fit rules, rejection reasons and the values a scoring strategy returns. Pure.

The fit rules are the openb simulator's (README step 5), extended with the
resources a real node has: a node fits a pod when it is schedulable, its GPU
model is allowed, its free CPU and memory cover the request, it has
`num_gpu` GPUs each with free milli >= `gpu_milli` (a sharing pod needs one
GPU with enough free milli, a whole-GPU pod needs fully free GPUs), its GPU
memory covers the declared need, and its free MIG devices and time-sliced
replicas cover the counts asked for (GPUs cut by MIG take MIG devices only). Every node gets one reason from
`RejectReason`, the first rule it breaks, so callers (extender FailedNodes,
dry-run, logs) explain decisions with the same words.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum
from typing import Any, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from gpupolicy.packing import migdevices
from gpupolicy.packing.nodemodel import MILLI, BoolArray, IntArray, NodeState, PodDemand, model_mask

FloatArray = npt.NDArray[np.float64]


class RejectReason(StrEnum):
    """Why a node cannot take a pod. The order is the order the rules are checked."""

    FITS = "fits"
    UNSCHEDULABLE = "node cordoned or draining"
    GPU_MODEL = "GPU model not allowed by the pod"
    INSUFFICIENT_CPU = "insufficient cpu"
    INSUFFICIENT_MEMORY = "insufficient memory"
    NO_GPU = "node has no GPUs"
    INSUFFICIENT_WHOLE_GPUS = "not enough fully free GPUs"
    INSUFFICIENT_GPU_SHARE = "no GPU with enough free share"
    INSUFFICIENT_GPU_MEMORY = "GPU memory below the pod's declared need"
    INSUFFICIENT_MIG = "not enough free MIG devices of the requested profile"
    INSUFFICIENT_SHARED = "not enough free nvidia.com/gpu.shared replicas"
    UNKNOWN_NODE = "node not known to the optimizer"


class _Code(IntEnum):
    """Dense codes of `RejectReason` for numpy arrays (same order)."""

    FITS = 0
    UNSCHEDULABLE = 1
    GPU_MODEL = 2
    INSUFFICIENT_CPU = 3
    INSUFFICIENT_MEMORY = 4
    NO_GPU = 5
    INSUFFICIENT_WHOLE_GPUS = 6
    INSUFFICIENT_GPU_SHARE = 7
    INSUFFICIENT_GPU_MEMORY = 8
    INSUFFICIENT_MIG = 9
    INSUFFICIENT_SHARED = 10


REASON_BY_CODE: tuple[RejectReason, ...] = tuple(RejectReason[c.name] for c in _Code)


@dataclass(frozen=True)
class FitResult:
    """Per-node verdicts: `codes[i] == 0` when the node fits; else an index into `REASON_BY_CODE`.

    `nodes` None: `codes[n]` is node n's, for every node of the state. Else
    the verdicts cover only `nodes` (sorted, unique: `fit(..., nodes=...)`),
    `codes[i]` being `nodes[i]`'s: the extender checks the few hundred nodes
    kube-scheduler asks about, not the whole cluster.
    """

    codes: npt.NDArray[np.int8]
    nodes: IntArray | None = None

    @property
    def feasible(self) -> BoolArray:
        out: BoolArray = self.codes == 0
        return out

    def codes_of(self, nodes: IntArray) -> npt.NDArray[np.int8] | None:
        """The codes of `nodes` (any order); None when this result does not cover one of them."""
        if self.nodes is None:
            return self.codes[nodes]
        pos = np.searchsorted(self.nodes, nodes)
        if pos.size and (int(pos.max()) >= len(self.nodes) or not np.array_equal(self.nodes[pos], nodes)):
            return None
        return self.codes[pos]

    def reason(self, node: int) -> RejectReason:
        codes = self.codes_of(np.array([node], dtype=np.int64))
        if codes is None:
            raise KeyError(f"node row {node} was not checked")
        return REASON_BY_CODE[int(codes[0])]


def gpu_fit_mask(state: NodeState, demand: PodDemand, nodes: IntArray | None = None) -> BoolArray:
    """Nodes (all, or `nodes`) with enough GPU capacity for the milli part of the demand. O(N) on cached
    summaries."""
    at = slice(None) if nodes is None else nodes
    if not demand.needs_gpu:
        return np.ones(len(state) if nodes is None else len(nodes), dtype=bool)
    out: BoolArray
    if demand.is_sharing:
        out = (state.max_partial[at] >= demand.gpu_milli) | (state.full_count[at] >= 1)
    else:
        out = state.full_count[at] >= demand.num_gpu
    return out


SMALL_REQUEST = 4  # work on the rows asked about when they are under 1/SMALL_REQUEST of the state


def rows_to_work_on(size: int, rows: IntArray | None) -> IntArray | None:
    """`rows`, or None (work on every row) when there are none or they cover a quarter of the state's
    `size` or more: whole-array operations then cost less than gathering that many rows (and sorting
    them), and the work is proportional to the request either way."""
    if rows is None or SMALL_REQUEST * len(rows) >= size:
        return None
    return rows


def sorted_rows(rows: IntArray) -> IntArray:
    """`rows` sorted, each once (`np.unique`, without its hashing: a tenth of the time on a few hundred)."""
    if rows.size < 2 or bool((rows[1:] > rows[:-1]).all()):
        return rows
    out = np.sort(rows)
    keep = np.empty(out.size, dtype=bool)
    keep[0] = True
    np.not_equal(out[1:], out[:-1], out=keep[1:])
    return out if bool(keep.all()) else out[keep]


def _model_ok(state: NodeState, allowed: frozenset[str], at: slice | IntArray) -> BoolArray:
    """`model_mask(state, allowed)[at]`, without a pass over the nodes not asked about."""
    if isinstance(at, slice):
        return model_mask(state, allowed)
    if not state.models:
        return np.zeros(len(at), dtype=bool)
    vocab = np.array([m in allowed for m in state.models], dtype=bool)
    out: BoolArray = vocab[state.model_idx[at]]
    return out


def fit(state: NodeState, demand: PodDemand, nodes: IntArray | None = None) -> FitResult:
    """Check every node (or only `nodes`, sorted and unique) against every rule; vectorised (a handful of
    array operations over the nodes checked)."""
    at = slice(None) if nodes is None else nodes
    n = len(state) if nodes is None else len(nodes)
    codes = np.zeros(n, dtype=np.int8)

    def mark(bad: BoolArray, code: _Code) -> None:
        codes[(codes == 0) & bad] = code

    mark(~state.schedulable[at], _Code.UNSCHEDULABLE)
    if demand.allowed_models is not None:
        mark(~_model_ok(state, demand.allowed_models, at), _Code.GPU_MODEL)
    mark(state.cpu_free[at] < demand.cpu_milli, _Code.INSUFFICIENT_CPU)
    mark(state.mem_free[at] < demand.memory_mib, _Code.INSUFFICIENT_MEMORY)
    if demand.needs_gpu:
        mark(state.gpu_count[at] == 0, _Code.NO_GPU)
        if not demand.is_sharing:  # a time-sliced node advertises replicas only: no whole GPUs there
            mark(~state.exclusive[at], _Code.NO_GPU)
        if state.mig_resources:  # GPUs cut by MIG take MIG devices only, no whole GPU or share
            mark(state.mig_layout[at] > 0, _Code.NO_GPU)
        code = _Code.INSUFFICIENT_GPU_SHARE if demand.is_sharing else _Code.INSUFFICIENT_WHOLE_GPUS
        mark(~gpu_fit_mask(state, demand, nodes), code)
        if demand.gpu_memory_mib:
            memory = state.gpu_memory_mib[at]
            mark((memory > 0) & (memory < demand.gpu_memory_mib), _Code.INSUFFICIENT_GPU_MEMORY)
    for resource, count in demand.mig.items():
        if resource in state.mig_resources:
            free = state.mig_free[at, state.mig_resources.index(resource)]
        else:
            free = np.zeros(n, dtype=np.int64)
        mark(free < count, _Code.INSUFFICIENT_MIG)
    if demand.shared:
        mark(state.shared_free[at] < demand.shared, _Code.INSUFFICIENT_SHARED)
    return FitResult(codes, nodes)


def first_full_gpus(state: NodeState, node: int, count: int) -> tuple[int, ...]:
    """The `count` lowest-indexed fully free GPUs of `node` (the paper's exclusive allocation)."""
    idx = np.flatnonzero(state.gpu_free[node] == MILLI)[:count]
    if len(idx) < count:
        raise ValueError(f"node {state.names[node]} has {len(idx)} free GPUs, needs {count}")
    return tuple(int(i) for i in idx)


def best_fit_gpu(state: NodeState, nodes: IntArray, milli: int) -> IntArray:
    """Per node, the GPU with the least free milli that still holds `milli` (first index on ties)."""
    free = state.gpu_free[nodes]
    ok = state.gpu_present[nodes] & (free >= milli)
    key = np.where(ok, free, MILLI + 1)
    out: IntArray = np.argmin(key, axis=1).astype(np.int64)
    return out


@dataclass
class Scored:
    """A strategy's answer for the candidate nodes (feasible ones, in `candidates` order).

    `scores`: higher is better. `gpu`: the GPU index a sharing pod would take
    on that node (-1: use the default rule, best-fit GPU for sharing pods and
    the lowest-indexed free GPUs for whole-GPU pods). `tiebreak`: optional
    secondary key (higher is better) consulted before the fixed node order.
    """

    scores: FloatArray
    gpu: IntArray | None = None
    tiebreak: FloatArray | None = None


T = TypeVar("T")


@dataclass
class PackingContext:
    """What a strategy may read besides the state: the typical mix, randomness, tie order, caches.

    `tie_rank[n]`: nodes with equal scores go to the lowest rank (the paper's
    simulator: node names prefixed with a per-seed random rank; the extender:
    the order of the node list). `rng` feeds the `random` strategy only.
    `caches` holds per-state derived arrays (e.g. fragmentation terms), kept
    in step with the state through `NodeState.row_version`.
    """

    mix: Any = None  # gpupolicy.packing.typicalmix.TypicalMix; Any keeps this module free of that import
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0))
    tie_rank: IntArray | None = None
    caches: dict[str, Any] = field(default_factory=dict)

    def derived(self, key: str, inputs: tuple[object, ...], build: Callable[[], T]) -> T:
        """`build()`'s value, kept under `key` until one of `inputs` is another object.

        For what a strategy works out once per mix or state (a cut mix, feed
        rates, per-model pressure): a decision must not redo it, and a new
        mix or state must not see an old one. Knobs the value depends on go in
        `key`.
        """
        entry = self.caches.get(key)
        if (entry is None or len(entry[0]) != len(inputs)
                or any(a is not b for a, b in zip(entry[0], inputs, strict=True))):
            entry = (inputs, build())
            self.caches[key] = entry
        value: T = entry[1]
        return value

    def rank(self, state: NodeState) -> IntArray:
        if self.tie_rank is None or len(self.tie_rank) != len(state):
            self.tie_rank = np.arange(len(state), dtype=np.int64)
        return self.tie_rank


class Strategy(Protocol):
    """A scoring strategy. `score` is pure apart from reading/updating `ctx.caches` and `ctx.rng`."""

    @property
    def name(self) -> str: ...

    @property
    def description(self) -> str: ...

    def score(self, state: NodeState, demand: PodDemand, candidates: IntArray, ctx: PackingContext) -> Scored:
        ...


def uses_devices(demand: PodDemand) -> bool:
    """The pod asks for MIG devices and/or time-sliced replicas (fitted and packed by count)."""
    return bool(demand.mig) or demand.shared > 0


def device_count_left(state: NodeState, demand: PodDemand, nodes: IntArray) -> IntArray:
    """Free units of the demand's MIG/shared resources left on `nodes` after placing it."""
    left = np.zeros(len(nodes), dtype=np.int64)
    for resource, count in demand.mig.items():
        if resource in state.mig_resources:
            left += state.mig_free[nodes, state.mig_resources.index(resource)] - count
    if demand.shared:
        left += state.shared_free[nodes] - demand.shared
    return left


def lexicographic(first: FloatArray, then: FloatArray | None) -> FloatArray:
    """One array ordering like the pair (first, then), higher better; exact (dense ranks, not weights)."""
    if then is None:
        return first
    _, r1 = np.unique(first, return_inverse=True)
    _, r2 = np.unique(then, return_inverse=True)
    out: FloatArray = (r1.astype(np.float64) * (float(r2.max()) + 1.0) + r2).reshape(first.shape)
    return out


def with_device_counts(state: NodeState, demand: PodDemand, candidates: IntArray, scored: Scored) -> Scored:
    """Add the count-based best-fit term for MIG and time-sliced demands to any strategy's answer.

    The milli-GPU strategies see MIG devices (`nvidia.com/mig-<profile>`) and
    time-sliced replicas (`nvidia.com/gpu.shared`) not at all: node-level
    free counts are all that is real for them (the device plugin picks the
    device), so the engine packs them by count for every strategy, in
    `packing.decide`:
    - a pod asking only for such devices: the node left with the fewest free
      units of the requested resources wins (fills partly used nodes before
      fresh ones); the strategy's own order (score, then its tie-break) breaks
      ties among equal counts;
    - a pod asking for whole GPUs too: the strategy's score stays first, the
      count best fit breaks its ties, then the strategy's tie-break.
    Other demands pass through unchanged (the simulator's milli-GPU pods).

    MIG devices on nodes whose GPUs are rows (migdevices.py) go first to the
    fullest GPU: the node whose chosen GPU is left with the least free milli
    wins, then the count best fit, then the strategy. So a MIG pod takes a
    free slice of a GPU already cut and in use before it starts an untouched
    GPU or node, which stays whole for a re-layout (the layout planner changes
    only nodes without GPU pods).
    """
    if not uses_devices(demand):
        return scored
    by_count = -device_count_left(state, demand, candidates).astype(np.float64)
    if demand.mig and not demand.needs_gpu and bool((state.mig_layout[candidates] > 0).any()):
        left = migdevices.left_after(state, demand, candidates)
        neutral = MILLI * sum(demand.mig.values())  # nodes without MIG rows: as if every GPU were untouched
        by_gpu = -np.where(left < 0, neutral, left).astype(np.float64)
        return Scored(scores=lexicographic(by_gpu, by_count), gpu=scored.gpu,
                      tiebreak=lexicographic(scored.scores, scored.tiebreak))
    if not demand.needs_gpu:
        return Scored(scores=by_count, gpu=scored.gpu,
                      tiebreak=lexicographic(scored.scores, scored.tiebreak))
    return Scored(scores=scored.scores, gpu=scored.gpu, tiebreak=lexicographic(by_count, scored.tiebreak))


def without_gpus(state: NodeState) -> BoolArray:
    """Per node: it has no GPU of any kind (no GPU rows, MIG devices or time-sliced replicas)."""
    def build() -> BoolArray:
        out: BoolArray = (state.gpu_count == 0) & (state.shared_cap == 0) & ~(state.mig_cap > 0).any(axis=1)
        return out
    return state.static("without-gpus", build)


def with_gpu_less_nodes_first(state: NodeState, demand: PodDemand, candidates: IntArray, scored: Scored) -> Scored:
    """For a pod that asks no GPU of any kind: the nodes without GPUs first, then any strategy's order.

    A CPU-only pod that kube-scheduler's profile routes here (it tolerates
    the GPU taint) fits on a node without GPUs and on a GPU node alike; on
    the GPU node it takes CPU and memory the next GPU pods there need, which
    is not what an operator who keeps GPU nodes for GPU work expects. The
    strategies cannot see that: placing the pod on a node without GPUs
    changes no fragment (score 50 in FGD's rounding), and neither does
    placing it on a GPU node with cores to spare, so the tie order decided,
    and live it puts nodes holding GPU work first. So, as for device counts,
    the engine orders for every strategy in `packing.decide`: the feasible
    nodes without GPUs win, then the strategy's score (its order among
    either kind unchanged), then its tie-break. When all candidates are of
    one kind (openb: GPU nodes only) the answer passes through unchanged.
    """
    if demand.needs_gpu or uses_devices(demand):
        return scored
    gpu_less = without_gpus(state)[candidates]
    if bool(gpu_less.all()) or not bool(gpu_less.any()):
        return scored
    return Scored(scores=lexicographic(gpu_less.astype(np.float64), scored.scores), gpu=scored.gpu,
                  tiebreak=scored.tiebreak)


def to_gpu_indices(state: NodeState, node: int, demand: PodDemand, chosen_gpu: int) -> tuple[int, ...]:
    """The GPU indices a placement on `node` uses, given a strategy's choice for sharing pods; then, on a
    node with MIG rows, one GPU per MIG device (`NodeState.split_indices` has the order)."""
    mig = mig_gpus(state, node, demand)
    if not demand.needs_gpu:
        return mig
    if demand.is_sharing:
        if chosen_gpu < 0:
            chosen_gpu = int(best_fit_gpu(state, np.array([node]), demand.gpu_milli)[0])
        return (chosen_gpu, *mig)
    return (*first_full_gpus(state, node, demand.num_gpu), *mig)


def mig_gpus(state: NodeState, node: int, demand: PodDemand) -> tuple[int, ...]:
    """The GPU of each of the demand's MIG devices on `node` (fullest with room); () without MIG rows."""
    if not demand.mig or state.mig_layout[node] <= 0:
        return ()
    gpus = migdevices.pick(state, node, state.mig_devices(demand.mig))
    if gpus is None:
        raise ValueError(f"node {state.names[node]}: no GPU whose MIG layout has room for pod {demand.name!r}")
    return tuple(gpus)
