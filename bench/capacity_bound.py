"""Where the capacity benchmark's GPU-hours go: a bound no strategy can beat, and idle GPU-hours by time.

    python bench/capacity_bound.py --compress 50                       # the bound on the trace
    python bench/capacity_bound.py --events kubeon.csv [--windows 0,24,72,1000]   # a run's schedule

The issue's lower bound counts a 0.46-GPU share as 0.46 of a GPU. A node
holds whole GPUs, so at every instant the running pods need at least as
many GPUs as the shares can be packed into (whole-GPU pods one each,
shares summing to at most 1000 milli per GPU), on any node shapes (the
catalog has 1-GPU types), even moving pods at will and with no delay
before a node is ready. This script integrates, over time, the
Martello-Toth L2 lower bound on that packing (a proof: no packing needs
fewer) and first-fit decreasing (one packing that exists) for:
- the trace with every pod running from its arrival (`--compress F`), or
- the pods as they ran in one strategy's run (`--events FILE`, the
  benchmark's CSV), with alive GPUs minus used GPUs per time window.
Prints GPU-hours and the ratio to the GPU-hours the pods use. Pure
arithmetic on the files: nothing of the simulator is imported.
"""

from __future__ import annotations

import argparse
import csv
from collections import Counter
from pathlib import Path

MILLI = 1000
DATA = Path(__file__).resolve().parent.parent / "vendor" / "openb"


def l2_bound(shares: Counter[int]) -> int:
    """Martello-Toth L2: the fewest bins of capacity 1000 any packing of `shares` (milli sizes) needs."""
    items = list(shares.elements())
    best = -(-sum(items) // MILLI)
    for k in sorted({0, *(m for m in items if m <= MILLI // 2)}):
        big = [w for w in items if w > MILLI - k]
        mid = [w for w in items if MILLI // 2 < w <= MILLI - k]
        small = sum(w for w in items if k <= w <= MILLI // 2)
        best = max(best, len(big) + len(mid) + max(0, -(-(small - (len(mid) * MILLI - sum(mid))) // MILLI)))
    return best


def ffd(shares: Counter[int]) -> int:
    """First-fit decreasing: GPUs of one packing of `shares` that exists."""
    bins: list[int] = []
    for m in sorted(shares.elements(), reverse=True):
        for i, used in enumerate(bins):
            if used + m <= MILLI:
                bins[i] += m
                break
        else:
            bins.append(m)
    return len(bins)


def integrate(changes: list[tuple[float, int, int, int]]) -> tuple[float, float, float]:
    """(time, +1/-1, GPUs, milli per GPU) changes -> (L2 GPU-hours, FFD GPU-hours, used GPU-hours)."""
    changes.sort(key=lambda c: (c[0], c[1]))  # departures before arrivals at the same instant
    whole, shares = 0, Counter[int]()
    low = high = used = 0.0
    last, cur_low, cur_high, cur_used = 0.0, 0, 0, 0.0
    for t, sign, gpus, milli in changes:
        hours = (t - last) / 3600.0
        low, high, used = low + cur_low * hours, high + cur_high * hours, used + cur_used * hours
        last = t
        if milli >= MILLI:
            whole += sign * gpus
        else:
            shares[milli] += sign
            if shares[milli] == 0:
                del shares[milli]
        cur_used += sign * gpus * milli / MILLI
        cur_low, cur_high = whole + l2_bound(shares), whole + ffd(shares)
    return low, high, used


def from_trace(path: Path, compress: float) -> list[tuple[float, int, int, int]]:
    out = []
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            gpus, milli = int(row["num_gpu"]), int(row["gpu_milli"])
            if not gpus or not milli:
                continue
            start = float(row["creation_time"]) / compress
            end = start + max(1.0, float(row["deletion_time"]) - float(row["creation_time"]))
            out += [(start, 1, gpus, milli), (end, -1, gpus, milli)]
    return out


def from_events(path: Path, windows: list[float], instances: Path) -> list[tuple[float, int, int, int]]:
    """The pods' runs of an events file; prints its idle GPU-hours (alive - used) per window of hours."""
    size = {r["instance_type"]: int(r["gpus"]) for r in csv.DictReader(instances.open(newline=""))}
    out: list[tuple[float, int, int, int]] = []
    running: dict[str, tuple[int, int]] = {}
    alive, used, last = 0, 0.0, 0.0
    idle = [0.0] * len(windows)
    edges = [w * 3600 for w in windows] + [float("inf")]
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            t = float(row["time"])
            for i in range(len(windows)):
                span = max(0.0, min(t, edges[i + 1]) - max(last, edges[i]))
                idle[i] += (alive - used) * span / 3600.0
            last = t
            event = row["event"]
            if event == "launch":
                alive += size[row["instance_type"]]
            elif event == "delete":
                alive -= size[row["instance_type"]]
            elif event == "place":
                picks = [g for g in row["gpus"].split("|") if g]
                if picks:
                    running[row["pod"]] = (len(picks), int(picks[0].split(":")[1]))
                    gpus, milli = running[row["pod"]]
                    used += gpus * milli / MILLI
                    out.append((t, 1, gpus, milli))
            elif event in ("finish", "evict") and row["pod"] in running:
                gpus, milli = running.pop(row["pod"])
                used -= gpus * milli / MILLI
                out.append((t, -1, gpus, milli))
    for i, w in enumerate(windows):
        upper = f"{windows[i + 1]:g} h" if i + 1 < len(windows) else "end"
        print(f"idle GPU-hours {w:g} h .. {upper}: {idle[i]:,.0f}")
    print(f"idle GPU-hours in all: {sum(idle):,.0f}")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pods", default=str(DATA / "openb_pod_list_default.csv"))
    parser.add_argument("--instances", default=str(DATA / "instances.csv"))
    parser.add_argument("--compress", type=float, default=50.0)
    parser.add_argument("--events", help="a run's events CSV (kubeon-gpu simulate --capacity --events)")
    parser.add_argument("--windows", default="0,24,72,200,1000,2000", help="hours where idle windows start")
    args = parser.parse_args()
    if args.events:
        windows = [float(w) for w in args.windows.split(",")]
        changes = from_events(Path(args.events), windows, Path(args.instances))
    else:
        changes = from_trace(Path(args.pods), args.compress)
    low, high, used = integrate(changes)
    print(f"GPU-hours the pods use {used:,.0f}; whole-GPU packing at every instant, pods moved at will: "
          f"at least {low:,.0f} ({low / used:.4f}x, L2 bound), first-fit decreasing {high:,.0f} ({high / used:.4f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
