"""The openb replay procedure (the paper's simulator) and its metrics.

Procedure (vendor/openb/README.md): seed a generator; sort pods by
name and shuffle; tune the workload to `tune` x cluster GPU capacity by
appending pods resampled with replacement (stopping before the one that
would overshoot); schedule one pod at a time, no departures, no retries.
The node tie order is a per-seed random rank, as the paper's simulator
prefixes node names with one. Metrics: GPU allocation % at the first point
where the arrived GPU demand reaches 100% of capacity, and at the end.

numpy's generator differs from Go's math/rand, so single seeds do not match
the paper; means over seeds 42..51 do.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from gpupolicy.packing.engine import commit, decide, get_strategy
from gpupolicy.packing.nodemodel import NodeSpec, NodeState, PodDemand
from gpupolicy.packing.placement import PackingContext, Strategy
from gpupolicy.packing.typicalmix import TypicalMix

# The largest `tune`: arrivals are appended until demand reaches tune x capacity, so an unbounded (or
# infinite) one never ends; the paper's runs stop at 1.3, and 100 already replays tens of times the trace.
MAX_TUNE = 100.0


def tune_problem(tune: float) -> str | None:
    """Why `tune` cannot be used (a sentence naming --tune), or None."""
    if not 0 < tune <= MAX_TUNE:  # NaN fails too
        return f"--tune must be positive and at most {MAX_TUNE:g}, got {tune}"
    return None


@dataclass(frozen=True)
class Arrival:
    """One arrival: where it went (node None when not placed)."""

    seq: int
    pod: PodDemand
    node: str | None
    gpu_indices: tuple[int, ...]


@dataclass
class ReplayResult:
    strategy: str
    seed: int
    pods: int
    alloc_pct_at_100: float | None
    alloc_pct_at_end: float
    seconds: float
    placements: list[Arrival] = field(default_factory=list)

    def summary(self) -> dict[str, object]:
        """The CLI's JSON line."""
        at100 = None if self.alloc_pct_at_100 is None else round(self.alloc_pct_at_100, 4)
        return {
            "strategy": self.strategy,
            "seed": self.seed,
            "pods": self.pods,
            "alloc_pct_at_100": at100,
            "alloc_pct_at_end": round(self.alloc_pct_at_end, 4),
            "unallocated_pct_at_100": None if at100 is None else round(100.0 - at100, 4),
            "seconds": round(self.seconds, 3),
        }


def arrival_order(pods: Sequence[PodDemand], capacity_milli: int, tune: float,
                  rng: np.random.Generator) -> list[PodDemand]:
    """Sort by name, shuffle, then append resampled pods up to `tune` x capacity."""
    problem = tune_problem(tune)
    if problem:
        raise ValueError(problem)
    ordered = sorted(pods, key=lambda p: p.name)
    shuffled = [ordered[i] for i in rng.permutation(len(ordered))]
    target = tune * capacity_milli
    total = sum(p.gpu_total_milli for p in shuffled)
    if not ordered or not any(p.gpu_total_milli for p in ordered):
        return shuffled
    while total < target:
        pod = ordered[int(rng.integers(len(ordered)))]
        if total + pod.gpu_total_milli > target:
            break
        shuffled.append(pod)
        total += pod.gpu_total_milli
    return shuffled


def interleave(arrivals: list[PodDemand], extra: Sequence[PodDemand], rng: np.random.Generator) -> list[PodDemand]:
    """`arrivals` with each of `extra` inserted at a uniformly drawn position (order within each kept)."""
    if not extra:
        return arrivals
    slots = np.sort(rng.integers(0, len(arrivals) + 1, size=len(extra)))
    out: list[PodDemand] = []
    j = 0
    for i, pod in enumerate(arrivals):
        while j < len(extra) and slots[j] <= i:
            out.append(extra[j])
            j += 1
        out.append(pod)
    out.extend(extra[j:])
    return out


def replay(
    nodes: Sequence[NodeSpec],
    pods: Sequence[PodDemand],
    strategy_name: str | Strategy | None = None,
    seed: int = 42,
    tune: float = 1.3,
    keep_placements: bool = False,
    mix_coverage: float = 1.0,
    progress: Callable[[list[PodDemand]], Iterable[PodDemand]] | None = None,
    extra: Sequence[PodDemand] = (),
) -> ReplayResult:
    """Run one replay (a strategy name or object); raises `UnknownStrategyError` for a bad name.

    The context carries the workload's full typical mix (`mix_coverage` 1.0);
    each strategy cuts it (FGD to the paper's 95%). `extra`: pods that arrive
    besides the trace's (bench/robustness.py's CPU-only pods), each at a
    position drawn from its own generator, so the trace's arrivals stay those
    of the plain replay; they are part of the workload's mix.
    `progress` wraps the arrivals (the CLI passes a tqdm bar on a terminal).
    """
    strategy = (strategy_name if strategy_name is not None and not isinstance(strategy_name, str)
                else get_strategy(strategy_name))
    started = time.perf_counter()
    rng = np.random.default_rng(seed)
    by_name = sorted(nodes, key=lambda s: s.name)
    state = NodeState.build(by_name)
    tie_rank = rng.permutation(len(by_name)).astype(np.int64)
    arrivals = interleave(arrival_order(pods, state.gpu_capacity_milli, tune, rng), extra,
                          np.random.default_rng([seed, 2]))
    ctx = PackingContext(mix=TypicalMix.from_pods([*pods, *extra], mix_coverage), rng=rng, tie_rank=tie_rank)

    capacity = float(state.gpu_capacity_milli) or 1.0
    arrived = 0
    allocated = 0
    at100: float | None = None
    placements: list[Arrival] = []
    for seq, pod in enumerate(progress(arrivals) if progress else arrivals):
        decision = decide(state, pod, strategy, ctx)
        arrived += pod.gpu_total_milli
        if decision.node is not None:
            commit(state, pod, decision)
            allocated += pod.gpu_total_milli
        if keep_placements:
            placements.append(Arrival(seq, pod, None if decision.node is None else state.names[decision.node],
                                        decision.gpu_indices))
        if at100 is None and arrived >= capacity:
            at100 = 100.0 * allocated / capacity
    return ReplayResult(
        strategy=strategy.name,
        seed=seed,
        pods=len(arrivals),
        alloc_pct_at_100=at100,
        alloc_pct_at_end=100.0 * allocated / capacity,
        seconds=time.perf_counter() - started,
        placements=placements,
    )
