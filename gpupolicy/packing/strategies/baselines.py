"""The paper's baseline scoring strategies: BestFit, GpuPacking, DotProd, Random. Pure, vectorised.

Each mirrors the openb artifact's score plugin, including its integer
truncation, because integer scores create ties and ties (broken by the fixed
node order) change results. Sharing pods take the best-fit GPU (least free
milli that holds the pod), whole-GPU pods the lowest-indexed free GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpupolicy.packing.nodemodel import MILLI, IntArray, NodeState, PodDemand
from gpupolicy.packing.placement import PackingContext, Scored

MAX_SPEC_CPU = 128_000.0  # milli-CPU: normalisation of BestFit (128 cores)
MAX_SPEC_GPU = 8_000.0  # milli-GPU: 8 GPUs


@dataclass(frozen=True)
class BestFit:
    """Prefer the node left with the least free CPU and GPU (equal weights, normalised)."""

    name: str = "bestfit"
    description: str = "BestFit: least free CPU+GPU left after placing (0.5/128 cores + 0.5/8 GPUs)"

    def score(self, state: NodeState, demand: PodDemand, candidates: IntArray, ctx: PackingContext) -> Scored:
        cpu_left = (state.cpu_free[candidates] - demand.cpu_milli) / MAX_SPEC_CPU
        gpu_left = (state.gpu_free_total[candidates] - demand.gpu_total_milli) / MAX_SPEC_GPU
        raw = (1.0 - (0.5 * cpu_left + 0.5 * gpu_left)) * 100.0
        return Scored(scores=np.trunc(raw))


@dataclass(frozen=True)
class GpuPacking:
    """GpuPacking: partly used GPUs first, then free GPUs on used nodes, then empty nodes."""

    name: str = "packing"
    description: str = "GpuPacking: shared GPUs > free GPUs on used nodes > empty nodes"

    def score(self, state: NodeState, demand: PodDemand, candidates: IntArray, ctx: PackingContext) -> Scored:
        n = len(candidates)
        if not demand.needs_gpu:
            return Scored(scores=np.zeros(n))
        full = state.full_count[candidates]
        count = state.gpu_count[candidates]
        empty_node = full == count
        # case 3: every GPU free
        case3 = np.maximum(100 // 3 - full, full).astype(np.float64)
        if demand.is_sharing:
            # the best-fit GPU is the one the artifact's ascending walk takes
            d = demand.gpu_milli
            partial_ok = state.max_partial[candidates] >= d
            free = state.gpu_free[candidates]
            key = np.where(state.gpu_present[candidates] & (free >= d), free, MILLI + 1)
            least = key.min(axis=1)
            case1 = np.maximum(100 - (least * 100 // MILLI) // 10, 100 // 2).astype(np.float64)
            case2 = np.full(n, max(100 // 2 - 1, 100 // 3), dtype=np.float64)
            used = np.where(partial_ok, case1, case2)
        else:
            used = np.full(n, max(100 // 2 - demand.num_gpu, 100 // 3), dtype=np.float64)
        return Scored(scores=np.where(empty_node, case3, used))


@dataclass(frozen=True)
class DotProd:
    """Tetris-style alignment: prefer nodes whose free (CPU, GPU) vector aligns least with the pod's.

    Vectors normalised by the node's capacity; score = 100 * (1 - dot / 2),
    truncated. Sharing pods compare against the chosen GPU's free share.
    """

    name: str = "dotprod"
    description: str = "DotProd: 1 - <free, request> on capacity-normalised (CPU, GPU) vectors"

    def score(self, state: NodeState, demand: PodDemand, candidates: IntArray, ctx: PackingContext) -> Scored:
        cap_cpu = np.maximum(state.cpu_cap[candidates], 1)
        cap_gpu = np.maximum(state.gpu_count[candidates] * MILLI, 1)
        cpu = (state.cpu_free[candidates] / cap_cpu) * (demand.cpu_milli / cap_cpu)
        gpu = (state.gpu_free_total[candidates] / cap_gpu) * (demand.gpu_total_milli / cap_gpu)
        return Scored(scores=np.trunc(100.0 * (1.0 - (cpu + gpu) / 2.0)))


@dataclass(frozen=True)
class Random:
    """One feasible node, drawn uniformly from the seeded generator, scores 100; the others 0.

    (As the artifact's RandomScore plugin. Random integer scores per node would
    not be random placement: their many ties go to the fixed order and pack.)
    """

    name: str = "random"
    description: str = "Random: a uniformly drawn feasible node"

    def score(self, state: NodeState, demand: PodDemand, candidates: IntArray, ctx: PackingContext) -> Scored:
        scores = np.zeros(len(candidates))
        scores[int(ctx.rng.integers(len(candidates)))] = 100.0
        return Scored(scores=scores)
