"""The capacity benchmark's comparison: the four strategies of issue 19 on one trace, one seed.

`compare` runs `cluster-autoscaler`, `karpenter` and `kubeon` through the
same engine (simulator/capacity.py) and adds `lower-bound`; the strategies
run in parallel processes (they share nothing), and each reports its own CPU
seconds so a loaded machine does not hide the cost. `max_gpus` is the GPUs
of the node list (`--nodes`): the NodePool limit every strategy gets.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor

from gpupolicy.capacity.disruption import ConsolidationRules
from gpupolicy.capacity.instances import InstanceType
from simulator.capacity import DEFAULT_DELAY, LOOP, Controller, Figures, run
from simulator.capacity_baselines import (
    KARPENTER_EXPIRE_AFTER,
    ClusterAutoscaler,
    Karpenter,
    KarpenterOptions,
    lower_bound,
)
from simulator.capacity_kubeon import RESTART_RULES, RULES, Kubeon
from simulator.capacity_trace import TimedPod

STRATEGIES = ("cluster-autoscaler", "karpenter", "lower-bound", "kubeon")


def controller(name: str, pods: Sequence[TimedPod], instance_types: Sequence[InstanceType],
               max_gpus: int | None, seed: int, evicted_work: str = "resume",
               karpenter: KarpenterOptions = KarpenterOptions(), kubeon: ConsolidationRules | None = None
               ) -> Controller:
    """One strategy's controller. `karpenter.expire_after`: Karpenter's NodePool `expireAfter` (math.inf:
    Never); None is 720 h, or Never when evicted work restarts: a forceful expiry every 720 h restarts a pod
    longer than that forever (openb has pods of ~3,480 h), and a user whose pods run that long without
    checkpoints sets Never. `kubeon`: its consolidation rules; None is `RULES`, or `RESTART_RULES` (no pod
    moved) when evicted work restarts, what that user sets for kubeon."""
    if name == "kubeon":
        rules = kubeon or (RESTART_RULES if evicted_work == "restart" else RULES)
        return Kubeon(pods, instance_types, max_gpus=max_gpus, rules=rules)
    if name == "karpenter":
        expire_after = karpenter.expire_after
        if expire_after is None:
            expire_after = math.inf if evicted_work == "restart" else KARPENTER_EXPIRE_AFTER
        return Karpenter(seed=seed, instance_types=instance_types, max_gpus=max_gpus, expire_after=expire_after,
                         batch_idle=karpenter.batch_idle, batch_max=karpenter.batch_max)
    if name == "cluster-autoscaler":
        return ClusterAutoscaler(seed=seed, instance_types=instance_types, max_gpus=max_gpus)
    raise ValueError(f"unknown capacity strategy {name!r}; choose from {', '.join(STRATEGIES)}")


def run_one(name: str, pods: Sequence[TimedPod], instance_types: Sequence[InstanceType], max_gpus: int | None,
            seed: int, delay: float, keep_events: bool, evicted_work: str = "resume",
            karpenter: KarpenterOptions = KarpenterOptions(), loop: float = LOOP,
            kubeon: ConsolidationRules | None = None) -> tuple[Figures, list[tuple[object, ...]] | None]:
    """One strategy's figures (with its wall and CPU seconds), and its events when asked; `loop`: the seconds
    between controller loops (simulator/capacity.py `run`)."""
    if name == "lower-bound":
        return lower_bound(pods, instance_types), None
    events: list[tuple[object, ...]] | None = [] if keep_events else None
    wall, cpu = time.perf_counter(), time.process_time()
    model = controller(name, pods, instance_types, max_gpus, seed, evicted_work, karpenter, kubeon)
    figures = run(pods, instance_types, model, delay=delay, events=events, evicted_work=evicted_work, loop=loop)
    figures.extra = {"wall_seconds": time.perf_counter() - wall, "cpu_seconds": time.process_time() - cpu}
    return figures, events


def compare(pods: Sequence[TimedPod], instance_types: Sequence[InstanceType], *, max_gpus: int | None,
            seed: int = 0, delay: float = DEFAULT_DELAY, keep_events: bool = False, workers: int = 2,
            strategies: Sequence[str] = STRATEGIES, evicted_work: str = "resume",
            karpenter: KarpenterOptions = KarpenterOptions(), loop: float = LOOP,
            kubeon: ConsolidationRules | None = None) -> tuple[dict[str, Figures], list[tuple[object, ...]] | None]:
    """Figures per strategy (in `strategies` order) and kubeon's events (when `keep_events`); `evicted_work`:
    simulator/capacity.py's rule for an evicted pod's work (the lower bound evicts nothing); `karpenter`: the
    modelled Karpenter's settings and `kubeon` kubeon's rules (`controller`); `loop`: `run_one`'s."""
    for name in strategies:
        if name not in STRATEGIES:
            raise ValueError(f"unknown capacity strategy {name!r}; choose from {', '.join(STRATEGIES)}")
    # slowest first, so two workers finish together
    order = sorted(strategies, key=lambda n: ("karpenter", "kubeon", "cluster-autoscaler", "lower-bound").index(n))
    args = [(n, pods, instance_types, max_gpus, seed, delay, keep_events and n == "kubeon", evicted_work,
             karpenter, loop, kubeon) for n in order]
    if workers <= 1:
        results = [run_one(*a) for a in args]
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            results = list(pool.map(run_one, *zip(*args, strict=True)))
    by_name = dict(zip(order, results, strict=True))
    return {n: by_name[n][0] for n in strategies}, by_name.get("kubeon", (None, None))[1]
