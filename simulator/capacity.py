"""The capacity benchmark's event-driven cluster: nodes bought from a catalog, pods arriving and leaving.

`run(pods, instance_types, controller, ...)` replays timed pods (simulator/
capacity_trace.py) from zero nodes against one `Controller` (who places
pods, which nodes to launch, which to give back) and returns its figures.
The rules (issue 19, docs/designs/capacity.md):
- a pod arrives at its (compressed) arrival, is placed at once if a ready
  node holds it, else waits; once bound it runs its remaining time, then
  leaves; an evicted pod goes back to the queue and later runs what it had
  left (`evicted_work="resume"`, issue 19's rule: its work survives the
  eviction, as with a checkpoint taken at that instant), or its whole
  duration again (`"restart"`: what a Deployment's or a Job's new pod does
  without checkpoints, and what the live bench measured of the real
  Karpenter, issue 40);
- a node requested at t counts as capacity at once, is ready at t + delay,
  and costs price x hours (GPUs x hours for `gpu_node_hours`) from the
  request until its deletion;
- controllers act every `loop` seconds of simulated time (`LOOP`, 10 s, by
  default; the calibration against the live cluster runs 1 s, as the real
  kube-scheduler and Karpenter's provisioner react within a second there);
  loops in which nothing changed and no timer is due are skipped (their
  outcome is known).
Metrics are kept from the events, which `events` (when a list is given)
receives as CSV rows `time,event,node,instance_type,pod,gpus`.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from gpupolicy.capacity.instances import InstanceType
from gpupolicy.capacity.nodes import with_rows
from gpupolicy.packing.nodemodel import NodeState, PodDemand
from simulator.capacity_trace import MAX_RUN_SECONDS, TimedPod

LOOP = 10.0  # seconds between controller loops
DEFAULT_DELAY = 180.0  # seconds from a node's request to its readiness
# at most a day (nodes take minutes); past Karpenter's 30-day expiry a node would be replaced before it is
# ready, forever
MAX_DELAY = 86400.0
EVICTED_WORK = ("resume", "restart")  # what an evicted pod's work becomes (module docstring)
# A run still going this many longest pod durations after the last arrival never ends: with restarted work a
# controller can evict a pod before it finishes forever (Karpenter's 720 h expiry and a longer pod).
HORIZON_RUNS = 10
EVENT_COLUMNS = ("time", "event", "node", "instance_type", "pod", "gpus")


def delay_problem(delay: float) -> str | None:
    """Why `delay` cannot be used (a sentence naming --delay), or None."""
    if not 0 <= delay <= MAX_DELAY:  # NaN fails too
        return f"--delay must be from 0 to {MAX_DELAY:.0f} seconds, got {delay}"
    return None


def loop_problem(loop: float) -> str | None:
    """Why `loop` cannot be the seconds between controller loops (a sentence naming --loop), or None."""
    if not 0.1 <= loop <= 3600:  # NaN fails too
        return f"--loop must be from 0.1 to 3600 seconds, got {loop}"
    return None


def evicted_work_problem(rule: str) -> str | None:
    """Why `rule` is no `EVICTED_WORK` rule (a sentence naming --evicted-work), or None."""
    if rule not in EVICTED_WORK:
        return f"--evicted-work must be one of {', '.join(EVICTED_WORK)}, got {rule!r}"
    return None


@dataclass
class PodRun:
    """A pod's progress: time left to run, first bind, evictions, where it is now."""

    pod: TimedPod
    left: float
    first_bind: float | None = None
    evictions: int = 0
    row: int | None = None
    gpus: tuple[int, ...] = ()
    bound_at: float = 0.0
    epoch: int = 0  # bumped per bind, so a stale finish event is ignored


@dataclass
class Drain:
    """Nodes to empty and delete; `replacements` are launched first and the drain waits until they are ready."""

    rows: tuple[int, ...]
    replacements: tuple[InstanceType, ...] = ()
    wait_for: tuple[int, ...] = ()  # the replacements' rows, set by the engine


class Cluster:
    """Nodes (rows of one growing `NodeState`), the pods on them and the cost meters."""

    def __init__(self, instance_types: Sequence[InstanceType], delay: float,
                 events: list[tuple[object, ...]] | None) -> None:
        self.types = list(instance_types)
        self.delay = delay
        self.state = NodeState.build([])
        self.kind: list[InstanceType] = []
        self.alive: list[bool] = []
        self.ready: list[bool] = []
        self.cordoned: list[bool] = []
        self.requested_at: list[float] = []
        self.node_name: list[str] = []
        self.pods_on: list[dict[str, PodRun]] = []
        self.free_rows: dict[str, list[int]] = {}
        self.serial = 0
        self.events = events
        self.gpu_hours = self.node_hours = self.cost = 0.0
        self.nodes_now = self.peak_nodes = 0
        self.version = 0  # bumped on every change a controller could react to
        self.changed_at: dict[int, float] = {}  # row -> when a pod last came or left
        self.pending: dict[str, PodRun] = {}  # arrived or evicted, not bound: what controllers may read

    def log(self, now: float, event: str, row: int, pod: str = "", gpus: str = "") -> None:
        if self.events is not None:
            self.events.append((f"{now:.3f}", event, self.node_name[row], self.kind[row].name, pod, gpus))

    # ---- nodes -------------------------------------------------------------------------
    def _grow(self, kind: InstanceType) -> None:
        count = max(4, sum(1 for k in self.kind if k is kind))
        start = len(self.kind)
        self.state = with_rows(self.state, [kind.spec(f"row-{start + i}") for i in range(count)])
        self.state.schedulable[start:] = False
        for _ in range(count):
            self.kind.append(kind)
            self.alive.append(False)
            self.ready.append(False)
            self.cordoned.append(False)
            self.requested_at.append(0.0)
            self.node_name.append("")
            self.pods_on.append({})
        self.free_rows.setdefault(kind.name, []).extend(range(start + count - 1, start - 1, -1))

    def launch(self, kind: InstanceType, now: float) -> int:
        if not self.free_rows.get(kind.name):
            self._grow(kind)
        row = self.free_rows[kind.name].pop()
        self.serial += 1
        self.node_name[row] = f"{kind.name}-{self.serial}"
        self.alive[row], self.ready[row], self.cordoned[row] = True, False, False
        self.requested_at[row] = now
        self.state.schedulable[row] = True
        self.nodes_now += 1
        self.peak_nodes = max(self.peak_nodes, self.nodes_now)
        self.version += 1
        self.log(now, "launch", row)
        return row

    def make_ready(self, row: int, now: float) -> None:
        self.ready[row] = True
        self.version += 1
        self.log(now, "ready", row)

    def cordon(self, row: int) -> None:
        self.cordoned[row] = True
        self.state.schedulable[row] = False
        self.version += 1

    def delete(self, row: int, now: float) -> None:
        if self.pods_on[row]:
            raise RuntimeError(f"node {self.node_name[row]} deleted with pods on it")
        hours = (now - self.requested_at[row]) / 3600.0
        kind = self.kind[row]
        self.gpu_hours += kind.gpus * hours
        self.node_hours += hours
        self.cost += kind.price_per_hour * hours
        self.log(now, "delete", row)
        self.alive[row] = self.ready[row] = False
        self.state.schedulable[row] = False
        self.free_rows[kind.name].append(row)
        self.nodes_now -= 1
        self.version += 1

    def live_rows(self) -> list[int]:
        return [r for r, a in enumerate(self.alive) if a]

    def ready_rows(self) -> np.ndarray:
        return np.array([r for r, (a, ok, c) in enumerate(zip(self.alive, self.ready, self.cordoned, strict=True))
                         if a and ok and not c], dtype=np.int64)

    # ---- pods --------------------------------------------------------------------------
    def bind(self, run: PodRun, row: int, gpus: tuple[int, ...], now: float) -> None:
        self.state.place(row, run.pod.demand, gpus)
        run.row, run.gpus, run.bound_at = row, gpus, now
        run.epoch += 1
        if run.first_bind is None:
            run.first_bind = now
        self.pods_on[row][run.pod.key] = run
        self.changed_at[row] = now
        self.version += 1
        self.log(now, "place", row, run.pod.key, "|".join(f"{g}:{run.pod.demand.gpu_milli}" for g in gpus))

    def unbind(self, run: PodRun, now: float, event: str) -> None:
        assert run.row is not None
        row = run.row
        self.state.remove(row, run.pod.demand, run.gpus)
        del self.pods_on[row][run.pod.key]
        self.changed_at[row] = now
        run.left = max(0.0, run.left - (now - run.bound_at))
        run.row, run.gpus = None, ()
        self.version += 1
        self.log(now, event, row, run.pod.key)


class Controller(Protocol):
    """One strategy under test: its scheduler, provisioner and disruption rules."""

    name: str

    def place(self, cluster: Cluster, demand: PodDemand, ready: np.ndarray) -> tuple[int, tuple[int, ...]] | None:
        """Where the scheduler binds `demand` among the `ready` rows (None: stays pending)."""
        ...

    def provision(self, cluster: Cluster, pending: Sequence[PodRun], now: float) -> list[InstanceType]:
        """The nodes to request now for the pending pods."""
        ...

    def launched(self, rows: Sequence[int]) -> None:
        """The rows the engine launched for the last `provision`'s answer, in its order."""
        ...

    def disrupt(self, cluster: Cluster, now: float) -> list[Drain]:
        """Nodes to empty and delete now (the engine cordons, evicts and deletes)."""
        ...

    def next_timer(self, cluster: Cluster, now: float) -> float:
        """When `disrupt` may act next without any change in the cluster (inf: never)."""
        ...


@dataclass
class Figures:
    """One strategy's line in the benchmark's JSON."""

    gpu_node_hours: float
    node_hours: float
    cost: float
    pending_seconds_p50: float
    pending_seconds_p95: float
    evictions: int
    max_evictions_per_pod: int
    peak_nodes: int
    pods_never_placed: int
    extra: dict[str, float] = field(default_factory=dict)

    def summary(self) -> dict[str, float | int]:
        return {
            "gpu_node_hours": round(self.gpu_node_hours, 1),
            "node_hours": round(self.node_hours, 1),
            "cost": round(self.cost, 1),
            "pending_seconds_p50": round(self.pending_seconds_p50, 1),
            "pending_seconds_p95": round(self.pending_seconds_p95, 1),
            "evictions": self.evictions,
            "max_evictions_per_pod": self.max_evictions_per_pod,
            "peak_nodes": self.peak_nodes,
            "pods_never_placed": self.pods_never_placed,
            **{k: round(v, 3) for k, v in self.extra.items()},
        }


ARRIVE, FINISH, READY = 0, 1, 2


def run(pods: Sequence[TimedPod], instance_types: Sequence[InstanceType], controller: Controller, *,
        delay: float = DEFAULT_DELAY, events: list[tuple[object, ...]] | None = None,
        evicted_work: str = "resume", loop: float = LOOP) -> Figures:
    """Replay `pods` against `controller` from zero nodes; the figures (module docstring: rules). `loop`:
    the seconds between controller loops."""
    problem = delay_problem(delay) or evicted_work_problem(evicted_work) or loop_problem(loop)
    if problem:
        raise ValueError(problem)
    restart = evicted_work == "restart"
    horizon = max((p.arrival for p in pods), default=0.0) + HORIZON_RUNS * MAX_RUN_SECONDS
    cluster = Cluster(instance_types, delay, events)
    runs = {p.key: PodRun(p, p.duration) for p in pods}
    heap: list[tuple[float, int, int, str, int]] = []  # (time, kind, seq, pod key / row, epoch)
    seq = 0
    for p in pods:
        heapq.heappush(heap, (p.arrival, ARRIVE, seq, p.key, 0))
        seq += 1
    pending = cluster.pending
    drains: list[Drain] = []
    done_pods = 0

    def try_bind(run_: PodRun, now: float, ready: np.ndarray) -> bool:
        nonlocal seq
        spot = controller.place(cluster, run_.pod.demand, ready) if ready.size else None
        if spot is None:
            return False
        cluster.bind(run_, spot[0], spot[1], now)
        heapq.heappush(heap, (now + run_.left, FINISH, seq, run_.pod.key, run_.epoch))
        seq += 1
        return True

    def launch(kind: InstanceType, now: float) -> int:
        nonlocal seq
        row = cluster.launch(kind, now)
        heapq.heappush(heap, (now + delay, READY, seq, str(row), 0))
        seq += 1
        return row

    def schedule(now: float) -> None:
        ready = cluster.ready_rows()
        if not ready.size:
            return
        failed: set[tuple[object, ...]] = set()
        for key in list(pending):
            d = pending[key].pod.demand
            shape = (d.cpu_milli, d.memory_mib, d.num_gpu, d.gpu_milli, d.allowed_models)
            if shape in failed:
                continue
            if try_bind(pending[key], now, ready):
                del pending[key]
            else:
                failed.add(shape)

    now = 0.0
    tick = -loop  # the first loop runs at 0
    seen_version = -1
    while True:
        # next loop: the next tick at or after the next event, or a due timer, or now if anything changed
        next_event = heap[0][0] if heap else math.inf
        timer = controller.next_timer(cluster, tick)
        if drains:
            timer = tick + loop
        wake = tick + loop if cluster.version != seen_version else min(next_event, timer)
        if wake == math.inf:
            break  # no event, no timer, nothing changed: the rest of time looks the same
        tick = max(tick + loop, math.ceil(wake / loop) * loop)
        if tick > horizon:
            raise ValueError(f"the run did not end {HORIZON_RUNS:g} x {MAX_RUN_SECONDS:g} s after the last arrival: "
                             "pods are evicted before they finish, again and again (evicted work restarts, and a "
                             "node expiry is shorter than a pod's duration?)")
        # events up to this loop, in time order
        while heap and heap[0][0] <= tick:
            t, kind, _, key, epoch = heapq.heappop(heap)
            now = t
            if kind == ARRIVE:
                r = runs[key]
                if not try_bind(r, t, cluster.ready_rows()):
                    pending[key] = r
            elif kind == FINISH:
                r = runs[key]
                if r.row is None or r.epoch != epoch:
                    continue
                cluster.unbind(r, t, "finish")
                done_pods += 1
            else:
                row = int(key)
                if cluster.alive[row] and cluster.requested_at[row] + delay == t:
                    cluster.make_ready(row, t)
        now = tick
        if done_pods == len(runs) and cluster.nodes_now == 0:
            break
        seen_version = cluster.version
        schedule(now)
        # drains whose replacement is ready: evict and delete
        still: list[Drain] = []
        for drain in drains:
            if not all(cluster.ready[r] for r in drain.wait_for):
                still.append(drain)
                continue
            for row in drain.rows:
                for r in list(cluster.pods_on[row].values()):
                    cluster.unbind(r, now, "evict")
                    r.evictions += 1
                    if restart:
                        r.left = r.pod.duration
                    pending[r.pod.key] = r
                cluster.delete(row, now)
        drains = still
        controller.launched([launch(instance, now) for instance in controller.provision(
            cluster, list(pending.values()), now)])
        for drain in controller.disrupt(cluster, now):
            for row in drain.rows:
                cluster.cordon(row)
            drain.wait_for = tuple(launch(kind, now) for kind in drain.replacements)
            drains.append(drain)
        schedule(now)
    for row in cluster.live_rows():
        for r in list(cluster.pods_on[row].values()):
            cluster.unbind(r, now, "finish")
        cluster.delete(row, now)
    waits = np.array([r.first_bind - r.pod.arrival for r in runs.values() if r.first_bind is not None])
    return Figures(
        gpu_node_hours=cluster.gpu_hours,
        node_hours=cluster.node_hours,
        cost=cluster.cost,
        pending_seconds_p50=float(np.percentile(waits, 50)) if waits.size else 0.0,
        pending_seconds_p95=float(np.percentile(waits, 95)) if waits.size else 0.0,
        evictions=sum(r.evictions for r in runs.values()),
        max_evictions_per_pod=max((r.evictions for r in runs.values()), default=0),
        peak_nodes=cluster.peak_nodes,
        pods_never_placed=sum(1 for r in runs.values() if r.first_bind is None),
    )
