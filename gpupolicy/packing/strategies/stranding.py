"""Free GPU that a node's free CPU and memory can no longer feed. Pure.

FGD's host test is binary (a node can host a typical pod or not), so a
node whose free CPU feeds half of its free GPUs looks as good as one that
feeds them all. The typical GPU pod of openb's default trace asks ~11 cores
per GPU and a G2 node has 12 per GPU: a sharing pod asking 11.9 cores for
470m of a GPU (a common type) leaves a node short of CPU for the rest.

`stranded(n)` = the node's free GPU milli beyond what its free CPU can
feed at the mix's mean rate (GPU milli per CPU milli over the GPU types,
weighted as in the mix). It is 0 on every node that is
not short, so where no node is short it changes no score and FGD's ties,
and the fixed-order packing they give, survive. Kubeon adds
`weight x (stranded before - stranded after)` to FGD's fragment change
(docs/designs/packing.md, third round).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpupolicy.packing.nodemodel import IntArray, NodeState, PodDemand
from gpupolicy.packing.placement import FloatArray
from gpupolicy.packing.typicalmix import TypicalMix


@dataclass(frozen=True)
class FeedRate:
    """GPU milli the mix's GPU pods ask per CPU milli (inf: CPU never limits)."""

    per_cpu: float

    @classmethod
    def of(cls, mix: TypicalMix) -> FeedRate:
        gpu_type = mix.gpu_milli > 0
        p = np.where(gpu_type, mix.weight, 0.0)
        gpu = float((p * mix.gpu_milli * mix.num_gpu).sum())
        cpu = float((p * mix.cpu_milli).sum())
        return cls(gpu / cpu if cpu > 0 else np.inf)

    def stranded(self, gpu_free: IntArray, cpu_free: IntArray) -> FloatArray:
        """Free GPU milli beyond what free CPU feeds, per row (>= 0)."""
        if not np.isfinite(self.per_cpu):
            return np.zeros(len(gpu_free), dtype=np.float64)
        out: FloatArray = np.maximum(gpu_free - np.maximum(cpu_free, 0) * self.per_cpu, 0.0)
        return out


def stranding_relief(state: NodeState, demand: PodDemand, rows: IntArray, rate: FeedRate) -> FloatArray:
    """Stranded milli before minus after placing `demand` on each of `rows` (positive: it relieves)."""
    before = rate.stranded(state.gpu_free_total[rows], state.cpu_free[rows])
    after = rate.stranded(state.gpu_free_total[rows] - demand.gpu_total_milli, state.cpu_free[rows] - demand.cpu_milli)
    out: FloatArray = before - after
    return out
