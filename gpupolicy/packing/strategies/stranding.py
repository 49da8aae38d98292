"""Free GPU that a node's free CPU and memory can no longer feed. Pure.

FGD's host test is binary (a node can host a typical pod or not), so a
node whose free CPU feeds half of its free GPUs looks as good as one that
feeds them all. The typical GPU pod of openb's default trace asks ~11 cores
per GPU and a G2 node has 12 per GPU: a sharing pod asking 11.9 cores for
470m of a GPU (a common type) leaves a node short of CPU for the rest.

`stranded(n)` = the node's free GPU milli beyond what its free CPU (and
memory) can feed at the mix's mean rate (GPU milli per CPU milli, per MiB,
over the GPU types, weighted as in the mix). It is 0 on every node that is
not short, so where no node is short it changes no score and FGD's ties,
and the fixed-order packing they give, survive. Kubeon adds
`weight x (stranded before - stranded after)` to FGD's fragment change
(why: docs/designs/packing.md, "The default strategy").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpupolicy.packing.nodemodel import IntArray, NodeState, PodDemand
from gpupolicy.packing.placement import FloatArray
from gpupolicy.packing.typicalmix import TypicalMix


@dataclass(frozen=True)
class FeedRate:
    """GPU milli the mix's GPU pods ask per CPU milli and per MiB of memory (inf: that resource never limits)."""

    per_cpu: float
    per_mib: float

    @classmethod
    def of(cls, mix: TypicalMix, use_memory: bool = True) -> FeedRate:
        gpu_type = mix.gpu_milli > 0
        p = np.where(gpu_type, mix.weight, 0.0)
        gpu = float((p * mix.gpu_milli * mix.num_gpu).sum())
        cpu = float((p * mix.cpu_milli).sum())
        mem = float((p * mix.memory_mib).sum()) if (use_memory and mix.memory_mib is not None) else 0.0
        return cls(gpu / cpu if cpu > 0 else np.inf, gpu / mem if mem > 0 else np.inf)

    def stranded(self, gpu_free: IntArray, cpu_free: IntArray, mem_free: IntArray) -> FloatArray:
        """Free GPU milli beyond what free CPU and memory feed, per row (>= 0)."""
        feed = np.full(len(gpu_free), np.inf)
        if np.isfinite(self.per_cpu):
            feed = np.minimum(feed, np.maximum(cpu_free, 0) * self.per_cpu)
        if np.isfinite(self.per_mib):
            feed = np.minimum(feed, np.maximum(mem_free, 0) * self.per_mib)
        out: FloatArray = np.maximum(gpu_free - feed, 0.0)
        return out


def stranding_relief(state: NodeState, demand: PodDemand, rows: IntArray, rate: FeedRate) -> FloatArray:
    """Stranded milli before minus after placing `demand` on each of `rows` (positive: it relieves)."""
    before = rate.stranded(state.gpu_free_total[rows], state.cpu_free[rows], state.mem_free[rows])
    after = rate.stranded(state.gpu_free_total[rows] - demand.gpu_total_milli,
                          state.cpu_free[rows] - demand.cpu_milli, state.mem_free[rows] - demand.memory_mib)
    out: FloatArray = before - after
    return out
