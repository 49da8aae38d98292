"""An independent checker of the capacity benchmark's `--events` CSV (imports nothing of the simulator).

`check(events_csv, pods_csv, instances_csv, compress)` replays the events and
raises `AssertionError` when a rule is broken: a node over its CPU, memory
or per-GPU capacity, a pod placed on a node before it is ready or after it
was deleted, a node deleted with pods on it, a pod that does not run its
full duration (`max(1, deletion_time - creation_time)`: across evictions
with `evicted_work="resume"`, in its last run alone with `"restart"`).
It returns the figures recomputed from the events alone, which a test
compares with the JSON line.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

TOLERANCE = 1e-3  # seconds; event times are written with three decimals


@dataclass
class _Node:
    kind: str
    launched: float
    ready: float | None = None
    cpu: int = 0
    mem: int = 0
    gpu: dict[int, int] = field(default_factory=dict)
    pods: set[str] = field(default_factory=set)


def _percentile(values: list[float], q: float) -> float:
    """numpy's default (linear) percentile, written out."""
    if not values:
        return 0.0
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def check(events_csv: str | Path, pods_csv: str | Path, instances_csv: str | Path, compress: float,
          evicted_work: str = "resume") -> dict[str, float]:
    with open(instances_csv, newline="") as fh:
        types = {r["instance_type"]: r for r in csv.DictReader(fh)}
    with open(pods_csv, newline="") as fh:
        pods = {r["name"]: r for r in csv.DictReader(fh)}
    with open(events_csv, newline="") as fh:
        rows = list(csv.DictReader(fh))
    nodes: dict[str, _Node] = {}
    gone: set[str] = set()
    ran: dict[str, float] = {p: 0.0 for p in pods}
    since: dict[str, tuple[str, float, list[tuple[int, int]]]] = {}
    first: dict[str, float] = {}
    evictions: dict[str, int] = {}
    finished: set[str] = set()
    gpu_hours = node_hours = cost = 0.0
    alive = peak = 0
    last = 0.0
    for line, e in enumerate(rows, start=2):
        t = float(e["time"])
        assert t + TOLERANCE >= last, f"line {line}: time goes back"
        last = t
        name, kind, event, pod = e["node"], e["instance_type"], e["event"], e["pod"]
        spec = types[kind]
        if event == "launch":
            assert name not in nodes and name not in gone, f"line {line}: node {name} launched twice"
            nodes[name] = _Node(kind, t)
            alive += 1
            peak = max(peak, alive)
            continue
        node = nodes[name]
        if event == "ready":
            node.ready = t
        elif event == "delete":
            assert not node.pods, f"line {line}: node {name} deleted with pods {sorted(node.pods)}"
            hours = (t - node.launched) / 3600.0
            gpu_hours += int(spec["gpus"]) * hours
            node_hours += hours
            cost += float(spec["price_per_hour"]) * hours
            del nodes[name]
            gone.add(name)
            alive -= 1
        elif event == "place":
            assert node.ready is not None and node.ready <= t + TOLERANCE, f"line {line}: {pod} on {name} before ready"
            assert pod not in since, f"line {line}: {pod} placed twice"
            p = pods[pod]
            gpus = [(int(g), int(m)) for g, m in (x.split(":") for x in e["gpus"].split("|") if x)]
            num_gpu = int(p["num_gpu"]) if int(p["gpu_milli"] or 0) else 0
            assert len(gpus) == num_gpu, f"line {line}: {pod} got {len(gpus)} GPUs, asks {num_gpu}"
            assert all(m == int(p["gpu_milli"]) for _, m in gpus), f"line {line}: {pod} GPU share differs"
            node.cpu += int(p["cpu_milli"])
            node.mem += int(p["memory_mib"])
            for g, m in gpus:
                assert 0 <= g < int(spec["gpus"]), f"line {line}: {name} has no GPU {g}"
                node.gpu[g] = node.gpu.get(g, 0) + m
                assert node.gpu[g] <= 1000, f"line {line}: GPU {g} of {name} over capacity"
            assert node.cpu <= int(spec["cpu_milli"]), f"line {line}: {name} over its CPU"
            assert node.mem <= int(spec["memory_mib"]), f"line {line}: {name} over its memory"
            node.pods.add(pod)
            since[pod] = (name, t, gpus)
            first.setdefault(pod, t)
        elif event in ("evict", "finish"):
            where, start, gpus = since.pop(pod)
            assert where == name, f"line {line}: {pod} leaves {name} but is on {where}"
            p = pods[pod]
            node.cpu -= int(p["cpu_milli"])
            node.mem -= int(p["memory_mib"])
            for g, m in gpus:
                node.gpu[g] -= m
            node.pods.discard(pod)
            ran[pod] += t - start
            if event == "evict":
                evictions[pod] = evictions.get(pod, 0) + 1
                if evicted_work == "restart":
                    ran[pod] = 0.0  # its work is lost: the next run starts over
            else:
                finished.add(pod)
        else:
            raise AssertionError(f"line {line}: unknown event {event!r}")
    assert not nodes, f"nodes never deleted: {sorted(nodes)}"
    for pod in finished:
        p = pods[pod]
        want = max(1.0, float(p["deletion_time"]) - float(p["creation_time"]))
        assert abs(ran[pod] - want) <= 0.01, f"{pod} ran {ran[pod]} s, its duration is {want} s"
    waits = [first[p] - float(pods[p]["creation_time"]) / compress for p in first]
    return {
        "gpu_node_hours": gpu_hours,
        "node_hours": node_hours,
        "cost": cost,
        "pending_seconds_p50": _percentile(waits, 50),
        "pending_seconds_p95": _percentile(waits, 95),
        "evictions": sum(evictions.values()),
        "max_evictions_per_pod": max(evictions.values(), default=0),
        "peak_nodes": peak,
        "pods_never_placed": sum(1 for p in pods if p not in first),
        "pods_finished": len(finished),
    }
