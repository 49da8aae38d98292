"""The typical pod mix FGD measures fragmentation against, from a trace or learned online. Pure.

FGD (README "FGD in brief") groups pods by (cpu_milli, gpu_milli, num_gpu,
gpu_spec), sorts groups by count (the paper's simulator breaks count ties by
the larger resource tuple first), keeps the most common groups until they
cover >= 95% of pods and uses their normalised counts as weights p_m.
`OnlineMix` does the same from the pods an extender has seen, with
exponential forgetting so the mix follows the workload.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gpupolicy.packing.nodemodel import PodDemand

COVERAGE = 0.95  # FGD's cut; contexts carry the full mix (coverage 1.0) and FGD truncates

PodKey = tuple[int, int, int, frozenset[str] | None]


def pod_key(demand: PodDemand) -> PodKey:
    """The grouping key of a pod (memory is not part of it, as in the paper)."""
    gpu_milli = demand.gpu_milli if demand.num_gpu else 0
    return (demand.cpu_milli, gpu_milli, demand.num_gpu if gpu_milli else 0, demand.allowed_models)


@dataclass(frozen=True)
class TypicalMix:
    """M typical pod types as arrays, with weights summing to 1."""

    cpu_milli: npt.NDArray[np.int64]
    gpu_milli: npt.NDArray[np.int64]
    num_gpu: npt.NDArray[np.int64]
    allowed: tuple[frozenset[str] | None, ...]
    weight: npt.NDArray[np.float64]
    memory_mib: npt.NDArray[np.int64] | None = None  # mean memory of each group (not part of the key)

    def __len__(self) -> int:
        return len(self.weight)

    @property
    def key(self) -> tuple[object, ...]:
        """Identity for caches: same types and weights give the same key."""
        mem = b"" if self.memory_mib is None else self.memory_mib.tobytes()
        return (self.cpu_milli.tobytes(), self.gpu_milli.tobytes(), self.num_gpu.tobytes(),
                self.allowed, self.weight.tobytes(), mem)

    def allowed_matrix(self, models: tuple[str, ...]) -> npt.NDArray[np.bool_]:
        """(M x number of models): may type m run on a GPU of that model."""
        out = np.ones((len(self), len(models)), dtype=bool)
        for m, allowed in enumerate(self.allowed):
            if allowed is not None:
                out[m] = [model in allowed for model in models]
        return out

    def select(self, keep: npt.NDArray[np.bool_]) -> TypicalMix:
        """The types where `keep` is true, weights renormalised."""
        w = self.weight[keep]
        return TypicalMix(self.cpu_milli[keep], self.gpu_milli[keep], self.num_gpu[keep],
                          tuple(a for a, k in zip(self.allowed, keep, strict=True) if k), w / w.sum(),
                          None if self.memory_mib is None else self.memory_mib[keep])

    def prefix_for(self, coverage: float) -> int:
        """How many of the most common types cover `coverage` of pods."""
        cum = np.cumsum(self.weight)
        return min(int(np.searchsorted(cum, coverage - 1e-9, side="left")) + 1, len(self))

    def truncated(self, coverage: float) -> TypicalMix:
        """The most common types covering `coverage` of pods, renormalised (FGD's 95% cut).

        Types are stored most common first, so this is a prefix: the same
        groups `from_pods(pods, coverage)` keeps.
        """
        if len(self) == 0:
            return self
        keep = self.prefix_for(coverage)
        if keep == len(self):
            return self
        w = self.weight[:keep]
        return TypicalMix(self.cpu_milli[:keep], self.gpu_milli[:keep], self.num_gpu[:keep], self.allowed[:keep],
                          w / w.sum(), None if self.memory_mib is None else self.memory_mib[:keep])

    @classmethod
    def from_counts(cls, counts: dict[PodKey, float], coverage: float = COVERAGE,
                    memory: dict[PodKey, float] | None = None) -> TypicalMix:
        """Keep the most common keys until `coverage` of the total; weights renormalised.

        `memory`: summed memory per key (same units as counts), for the mean per group.
        """
        if not counts:
            return cls.empty()
        total = float(sum(counts.values()))

        def order(item: tuple[PodKey, float]) -> tuple[float, int, int, int, str]:
            (cpu, gm, ng, allowed), cnt = item
            spec = "|".join(sorted(allowed)) if allowed else ""
            return (-cnt, -cpu, -gm, -ng, spec)

        kept: list[tuple[PodKey, float]] = []
        covered = 0.0
        for key, cnt in sorted(counts.items(), key=order):
            if covered >= coverage * total:
                break
            kept.append((key, cnt))
            covered += cnt
        weights = np.array([c for _, c in kept], dtype=np.float64)
        return cls(
            cpu_milli=np.array([k[0] for k, _ in kept], dtype=np.int64),
            gpu_milli=np.array([k[1] for k, _ in kept], dtype=np.int64),
            num_gpu=np.array([k[2] for k, _ in kept], dtype=np.int64),
            allowed=tuple(k[3] for k, _ in kept),
            weight=weights / weights.sum(),
            memory_mib=None if memory is None else np.array(
                [round(memory.get(k, 0.0) / c) if c else 0 for k, c in kept], dtype=np.int64),
        )

    @classmethod
    def from_pods(cls, pods: Iterable[PodDemand], coverage: float = COVERAGE) -> TypicalMix:
        """The mix of a trace's pods (CPU-only pods included)."""
        counts: dict[PodKey, float] = {}
        memory: dict[PodKey, float] = {}
        for pod in pods:
            key = pod_key(pod)
            counts[key] = counts.get(key, 0.0) + 1.0
            memory[key] = memory.get(key, 0.0) + pod.memory_mib
        return cls.from_counts(counts, coverage, memory)

    @classmethod
    def empty(cls) -> TypicalMix:
        z = np.zeros(0, dtype=np.int64)
        return cls(z, z.copy(), z.copy(), (), np.zeros(0, dtype=np.float64), z.copy())


class OnlineMix:
    """Learn the typical mix from pods as they arrive (the live extender has no trace).

    Each observed pod adds 1 to its key; every count decays by `decay` per
    observation, so a pod seen `1 / (1 - decay)` pods ago weighs about 1/e.
    `mix()` is cached until the next observation.
    """

    def __init__(self, decay: float = 0.999, coverage: float = 1.0, seed: TypicalMix | None = None) -> None:
        if not 0.0 < decay <= 1.0:
            raise ValueError("decay must be in (0, 1]")
        self.decay = decay
        self.coverage = coverage
        self._scale = 1.0  # counts are stored divided by the running decay factor
        self._counts: dict[PodKey, float] = {}
        self._memory: dict[PodKey, float] = {}
        self._cached: TypicalMix | None = seed

    def observe(self, pod: PodDemand) -> None:
        self._scale /= self.decay
        key = pod_key(pod)
        self._counts[key] = self._counts.get(key, 0.0) + self._scale
        self._memory[key] = self._memory.get(key, 0.0) + self._scale * pod.memory_mib
        if self._scale > 1e100:  # renormalise before float overflow
            self._counts = {k: v / self._scale for k, v in self._counts.items()}
            self._memory = {k: v / self._scale for k, v in self._memory.items()}
            self._scale = 1.0
        self._cached = None

    @property
    def observed(self) -> int:
        return len(self._counts)

    def mix(self) -> TypicalMix:
        if self._cached is None:
            self._cached = TypicalMix.from_counts(dict(self._counts), self.coverage, dict(self._memory))
        return self._cached
