"""GPU fragmentation of nodes against a typical pod mix, and the FGD strategy built on it. Pure.

Fragment of node n for typical pod type m, F_n(m) (README "FGD in brief"):
if m needs no GPU, or n cannot host m (model, CPU, or fewer than k_m GPUs
with free milli >= gpu_milli_m), all of n's free GPU milli is fragment;
otherwise only the free milli on GPUs whose free milli is below gpu_milli_m.
F_n = sum_m p_m F_n(m). FGD places a pod where F grows least:
score = int(100 * sigmoid((F_before - F_after) / 1000)), and a sharing pod
takes the GPU with the best score (first index on ties).

Vectorisation: per node and type we keep `ge[n, m]` (GPUs with free >=
gpu_milli_m) and `small[n, m]` (free milli on the GPUs below it). Placing a
pod changes them in closed form: a whole-GPU pod turns k fully free GPUs to
0 (ge -= k, small unchanged); a sharing pod moves one GPU from f to f - d
(ge and small change by indicator terms). So F_after for every candidate
node (and every candidate GPU of a sharing pod) is a few (candidates x M)
array operations; the per-node terms are recomputed only for rows whose
`NodeState.row_version` moved.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from gpupolicy.packing.nodemodel import MILLI, BoolArray, IntArray, NodeState, PodDemand
from gpupolicy.packing.placement import FloatArray, PackingContext, Scored, rows_to_work_on
from gpupolicy.packing.typicalmix import COVERAGE, TypicalMix

SHAPES_KEPT = 32  # whole-GPU/CPU-only pod shapes whose F_after per node is kept (FragModel._after_by_node)


class FragModel:
    """Per-node fragmentation terms for one state and one mix, kept in step incrementally."""

    def __init__(self, state: NodeState, mix: TypicalMix, use_memory: bool = False, copies: bool = False,
                 copies_weight: float = 1.0) -> None:
        self.state = state
        self.copies_weight = copies_weight
        self.mix = mix
        self.copies = copies
        self.use_memory = use_memory and mix.memory_mib is not None
        self.mem = mix.memory_mib if mix.memory_mib is not None else np.zeros(len(mix), dtype=np.int64)
        self.gm = mix.gpu_milli  # (M,)
        self.k = mix.num_gpu
        self.cpu = mix.cpu_milli
        self.p = mix.weight
        self.gpu_type = self.gm > 0
        allowed = mix.allowed_matrix(state.models)  # (M, models)
        self.model_ok: BoolArray = allowed[:, state.model_idx].T if len(state.models) else np.zeros(
            (len(state), len(mix)), dtype=bool)  # (N, M)
        self.static_ok: BoolArray = self.model_ok & self.gpu_type[None, :]  # (N, M)
        # per-type constants of the copies term, computed once instead of per call
        self.per_copy = (self.k * self.gm).astype(np.float64)  # (M,)
        self.cpu_div = np.maximum(self.cpu, 1).astype(np.float64)
        self.mem_div = np.maximum(self.mem, 1).astype(np.float64)
        self.cpu_free_types = np.flatnonzero(self.cpu <= 0)  # their CPU never limits copies (inf)
        self.mem_free_types = np.flatnonzero(self.mem <= 0)
        # inf * 0 is NaN (then 0 after nan_to_num): only types needing no CPU/memory and no GPU
        self.cpu_nan_types = np.flatnonzero((self.cpu <= 0) & (self.per_copy == 0))
        self.mem_nan_types = np.flatnonzero((self.mem <= 0) & (self.per_copy == 0))
        with np.errstate(invalid="ignore"):  # the NaN is meant: cleared below, after the minimum
            self.cpu_free_caps = np.inf * self.per_copy[self.cpu_free_types]
            self.mem_free_caps = np.inf * self.per_copy[self.mem_free_types]
        n, m = len(state), len(mix)
        self.ge = np.zeros((n, m), dtype=np.int64)
        self.small = np.zeros((n, m), dtype=np.int64)
        self.frag = np.zeros(n, dtype=np.float64)
        self.seen = np.full(n, -1, dtype=np.int64)
        self._slots: IntArray | None = None
        # F_after per node for each recent whole-GPU/CPU-only pod shape, valid while the row's version holds
        self._after_by_shape: OrderedDict[tuple[int, int, int], tuple[FloatArray, IntArray]] = OrderedDict()
        self.sync()

    def fork(self, state: NodeState) -> FragModel:
        """This model for `state`, a copy of (or a copy's copy of) this model's state (`NodeState.copy`).

        Row versions are unique across states (`nodemodel.next_versions`), so
        every row the copies still share keeps its terms; `sync` recomputes
        the rest. Consolidation simulates on copies: this spares a rebuild per
        simulation.
        """
        other = object.__new__(FragModel)
        other.__dict__.update(self.__dict__)
        other.state = state
        other.ge, other.small = self.ge.copy(), self.small.copy()
        other.frag, other.seen = self.frag.copy(), self.seen.copy()
        other._after_by_shape = OrderedDict((k, (v.copy(), ver.copy())) for k, (v, ver) in self._after_by_shape.items())
        return other

    def sync(self, rows: IntArray | None = None) -> None:
        """Recompute the rows of nodes that changed since they were last computed: every such row, or those
        among `rows` (the candidates a decision reads; the others catch up when they are read)."""
        if rows is None:
            dirty = np.flatnonzero(self.state.row_version != self.seen)
        else:
            dirty = rows[self.state.row_version[rows] != self.seen[rows]]
        if dirty.size == 0:
            return
        free = self.state.gpu_free[dirty]  # (D, G); absent GPUs hold 0
        present = self.state.gpu_present[dirty]
        at_least = (free[:, :, None] >= self.gm[None, None, :]) & present[:, :, None]  # (D, G, M)
        self.ge[dirty] = at_least.sum(axis=1)
        self.small[dirty] = np.where(at_least, 0, free[:, :, None]).sum(axis=1)
        self.frag[dirty] = self.fragment(
            dirty, self.state.cpu_free[dirty], self.state.mem_free[dirty], self.state.gpu_free_total[dirty],
            self.ge[dirty], self.small[dirty])
        self.seen[dirty] = self.state.row_version[dirty]

    def fragment(self, nodes: IntArray, cpu_free: IntArray, mem_free: IntArray, total: IntArray, ge: IntArray,
                 small: IntArray, need: IntArray | None = None) -> FloatArray:
        """F for hypothetical node rows (candidates x M inputs) -> (candidates,).

        `need`: GPUs (>= gpu_milli) a type needs in `ge` (default its count `k`);
        a whole-GPU pod passes `k` plus its own GPUs instead of lowering `ge`.

        The hot path of every decision (candidates x M, once per pod): the
        temporaries are reused in place and per-type constants precomputed;
        every element equals the plain formula's, so scores are bit-identical.
        """
        host = self.static_ok[nodes]
        tmp = np.greater_equal(cpu_free[:, None], self.cpu[None, :])
        host &= tmp
        host &= np.greater_equal(ge, (self.k if need is None else need)[None, :], out=tmp)
        if self.use_memory:
            host &= np.greater_equal(mem_free[:, None], self.mem[None, :], out=tmp)
        # where(host, small, total) as total - host * (total - small): exact on these integers, and
        # without where's data-dependent branches (the host mask is irregular)
        total_col = total.astype(np.float64)[:, None]
        masked = np.subtract(total_col, small)  # float64: total - small
        masked *= host  # where(host, total - small, 0)
        out: FloatArray
        if not self.copies:
            out = np.subtract(total_col, masked, out=masked) @ self.p
            return out
        plain = np.subtract(total_col, masked) if self.copies_weight < 1.0 else None
        # CPU/memory-limited copies: a node with 8 free GPUs and CPU for 2 typical pods strands 6
        # usable = min(where(host, total - small, 0), cpu copies * per copy, memory copies * per copy)
        usable = masked
        cap = np.divide(cpu_free.astype(np.float64)[:, None], self.cpu_div[None, :])
        np.floor(cap, out=cap)
        cap *= self.per_copy[None, :]
        if self.cpu_free_types.size:
            cap[:, self.cpu_free_types] = self.cpu_free_caps
        np.minimum(usable, cap, out=usable)
        if self.use_memory:
            np.divide(mem_free.astype(np.float64)[:, None], self.mem_div[None, :], out=cap)
            np.floor(cap, out=cap)
            cap *= self.per_copy[None, :]
            if self.mem_free_types.size:
                cap[:, self.mem_free_types] = self.mem_free_caps
            np.minimum(usable, cap, out=usable)
        # NaN only in the inf * 0 columns; every cap is finite elsewhere, so usable never holds +-inf
        for cols in (self.cpu_nan_types, self.mem_nan_types if self.use_memory else self.mem_nan_types[:0]):
            if cols.size:
                usable[:, cols] = np.nan_to_num(usable[:, cols], nan=0.0, posinf=0.0)
        stranded = np.subtract(total_col, usable, out=usable)
        out = stranded @ self.p
        if plain is not None:  # blend with FGD's fragment
            out = self.copies_weight * out + (1.0 - self.copies_weight) * (plain @ self.p)
        return out

    def _gpu_slots(self, g: int) -> IntArray:
        """0..g-1 as a row, cached (GPU slot index)."""
        slots = self._slots
        if slots is None or slots.shape[1] != g:
            slots = self._slots = np.arange(g, dtype=np.int64)[None, :]
        return slots

    def after(self, demand: PodDemand, nodes: IntArray) -> tuple[FloatArray, IntArray, IntArray]:
        """Candidate placements: (F_after, node position in `nodes`, GPU index or -1).

        Whole-GPU and CPU-only pods: one candidate per node. Sharing pods: one
        per usable GPU, except that a node's fully free GPUs are all alike and
        only the lowest-indexed one is tried.
        """
        st = self.state
        if not demand.is_sharing:
            return self._after_by_node(demand, nodes), np.arange(len(nodes)), np.full(len(nodes), -1, dtype=np.int64)
        cpu_after = st.cpu_free[nodes] - demand.cpu_milli
        mem_after = st.mem_free[nodes] - demand.memory_mib
        d = demand.gpu_milli
        free = st.gpu_free[nodes]
        usable = st.gpu_present[nodes] & (free >= d)
        full = free == MILLI
        # drop every fully free GPU but the row's first (argmax: first True; cheaper than a row cumsum)
        usable &= ~full | (self._gpu_slots(full.shape[1]) == full.argmax(axis=1)[:, None])
        pos, gpu = np.nonzero(usable)  # row-major: sorted by node, then GPU index
        f = free[pos, gpu][:, None]
        f2 = f - d
        gm = self.gm[None, :]
        rows = nodes[pos]
        # d > 0, so f2 < f: the GPU leaves ge[m] exactly when f2 < gm_m <= f; indicator products, not where
        below = f < gm
        below2 = f2 < gm
        ge = self.ge[rows]
        ge -= below2 > below  # ge - (f >= gm) + (f2 >= gm)
        small = self.small[rows]
        small -= f * below  # - where(f < gm, f, 0)
        small += f2 * below2  # + where(f2 < gm, f2, 0)
        total = st.gpu_free_total[rows] - d
        f_after = self.fragment(rows, cpu_after[pos], mem_after[pos], total, ge, small)
        return f_after, pos, gpu.astype(np.int64)

    def _after_by_node(self, demand: PodDemand, nodes: IntArray) -> FloatArray:
        """F_after of a whole-GPU or CPU-only pod on each of `nodes`, recomputed only for changed rows.

        Such a pod's F_after on node n depends on n's row and the pod's shape
        (CPU, memory, GPU count) alone, and a live cluster schedules the same
        few shapes (replicas of one workload) over nodes of which one changes
        per pod: keeping the last values per shape turns the (candidates x M)
        work of every decision into work on the rows that moved.
        """
        st = self.state
        k = demand.num_gpu if demand.needs_gpu else 0
        shape = (demand.cpu_milli, demand.memory_mib, k)
        cached = self._after_by_shape.get(shape)
        if cached is None:
            cached = (np.zeros(len(st), dtype=np.float64), np.full(len(st), -1, dtype=np.int64))
            self._after_by_shape[shape] = cached
            while len(self._after_by_shape) > SHAPES_KEPT:
                self._after_by_shape.popitem(last=False)
        else:
            self._after_by_shape.move_to_end(shape)
        values, versions = cached
        stale = nodes[versions[nodes] != st.row_version[nodes]]
        if stale.size:
            total = st.gpu_free_total[stale] - k * MILLI
            # ge - k >= k_m as ge >= k_m + k (types without GPU never host: static_ok)
            need = self.k + np.where(self.gpu_type, k, 0)
            values[stale] = self.fragment(stale, st.cpu_free[stale] - demand.cpu_milli,
                                          st.mem_free[stale] - demand.memory_mib, total, self.ge[stale],
                                          self.small[stale], need)
            versions[stale] = st.row_version[stale]
        out: FloatArray = values[nodes]
        return out


def frag_model(state: NodeState, ctx: PackingContext, mix: TypicalMix | None = None,
               key: str = "frag", use_memory: bool = False, copies: bool = False,
               copies_weight: float = 1.0, rows: IntArray | None = None) -> FragModel:
    """The context's FragModel for this state and mix (default: `ctx.mix`), built once, then synced (every
    row, or the `rows` the caller reads: a decision's candidates)."""
    mix = mix if mix is not None else ctx.mix
    if mix is None:
        raise ValueError("this strategy needs a typical pod mix (PackingContext.mix)")
    model = ctx.caches.get(key)
    flags = (use_memory and mix.memory_mib is not None, copies, copies_weight)
    if (not isinstance(model, FragModel) or model.mix.key != mix.key
            or (model.use_memory, model.copies, model.copies_weight) != flags):
        model = FragModel(state, mix, use_memory, copies, copies_weight)
        ctx.caches[key] = model
    elif model.state is not state:
        # a copy of the model's state shares its names tuple and layout: fork; another state: build
        same = model.state.names is state.names and len(model.state) == len(state)
        model = model.fork(state) if same else FragModel(state, mix, use_memory, copies, copies_weight)
        ctx.caches[key] = model
    model.sync(rows_to_work_on(len(state), rows))
    return model


def sigmoid_score(delta: FloatArray, temperature: float = 1000.0, levels: float = 100.0) -> FloatArray:
    """The paper's integer score int(100 * sigmoid(delta / 1000)), 0..100 (defaults)."""
    out: FloatArray = np.floor(levels / (1.0 + np.exp(-delta / temperature)))
    return out


def best_per_node(n: int, pos: IntArray, gpu: IntArray, value: FloatArray) -> tuple[FloatArray, IntArray]:
    """Per node position: max value and the GPU reaching it (first GPU on ties). `pos` sorted."""
    best = np.full(n, -np.inf)
    np.maximum.at(best, pos, value)
    hit = value == best[pos]
    choice = np.full(n, -1, dtype=np.int64)
    # reversed assignment leaves the first (lowest GPU index) hit per node
    hp, hg = pos[hit][::-1], gpu[hit][::-1]
    choice[hp] = hg
    return best, choice


@dataclass(frozen=True)
class Fgd:
    """Fragmentation Gradient Descent (Weng et al., ATC'23), exactly as the README specifies."""

    name: str = "fgd"
    description: str = "FGD: least growth of fragmentation against the typical mix, rounded sigmoid score"
    exact: bool = False  # True: raw (F_before - F_after) without the integer rounding (ablation)
    coverage: float = COVERAGE  # the paper keeps the most common types covering 95% of pods

    def score(self, state: NodeState, demand: PodDemand, candidates: IntArray, ctx: PackingContext) -> Scored:
        if ctx.mix is None:
            raise ValueError("this strategy needs a typical pod mix (PackingContext.mix)")
        mix = ctx.mix
        cut = ctx.derived(f"fgd-mix-{self.coverage}", (mix,), lambda: mix.truncated(self.coverage))
        model = frag_model(state, ctx, cut, rows=candidates)
        f_after, pos, gpu = model.after(demand, candidates)
        delta = model.frag[candidates][pos] - f_after
        value = delta if self.exact else sigmoid_score(delta)
        scores, choice = best_per_node(len(candidates), pos, gpu, value)
        return Scored(scores=scores, gpu=choice)
