"""`kubeon-gpu simulate --capacity`: GPU-node-hours and cost of four capacity strategies, one JSON line.

Bad input (missing file or column, bad value) prints one line naming the
file, row and field on stderr and exits 2.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys

from gpupolicy.capacity.instances import load_instances
from serving.flags import positive_int
from simulator.capacity import EVENT_COLUMNS, EVICTED_WORK, MAX_DELAY, delay_problem
from simulator.capacity_compare import STRATEGIES, compare
from simulator.capacity_trace import compress_problem, load_timed_pods
from simulator.trace import TraceError, load_nodes

EPILOG = """\
--capacity: replay the pods with arrivals and departures from zero nodes, buying nodes from --instances;
output: one JSON line {"compress", "delay", "seed", "evicted_work", "pods", "max_gpus", "strategies": {name: ...}} for
cluster-autoscaler, karpenter, lower-bound and kubeon, each with gpu_node_hours, node_hours, cost,
pending_seconds_p50/p95 (arrival to first bind), evictions, max_evictions_per_pod, peak_nodes,
pods_never_placed (and wall/cpu seconds). --nodes gives the GPU limit (its GPU count). Rules:
docs/designs/capacity.md. --events writes kubeon's run as CSV time,event,node,instance_type,pod,gpus.
Bounds: --compress 0.001..1000000, --delay 0..86400; trace times 0..1e10 s, a run at most 1e8 s.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = (parser.epilog or "") + "\n" + EPILOG
    group = parser.add_argument_group("capacity benchmark (--capacity)")
    group.add_argument("--capacity", action="store_true", help="run the capacity benchmark (docs/designs/capacity.md)")
    group.add_argument("--instances", metavar="CSV", help="instance catalog (vendor/openb/instances.csv)")
    group.add_argument("--compress", type=float, default=1.0, metavar="F",
                       help="arrivals at creation_time / F, F from 0.001 to 1000000; run times kept (default 1)")
    group.add_argument("--delay", type=float, default=180.0,
                       help=f"seconds from node request to ready, 0 to {MAX_DELAY:.0f} (default 180)")
    group.add_argument("--events", metavar="CSV", help="write kubeon's events to this CSV")
    group.add_argument("--evicted-work", choices=EVICTED_WORK, default="resume",
                       help="an evicted pod later runs what it had left (resume, the default: issue 19's rule) "
                            "or its whole duration again (restart: a pod without checkpoints, as Deployments "
                            "and Jobs on the real cluster)")
    group.add_argument("--workers", type=positive_int, default=2,
                       help=f"processes for the strategies (default 2; at most {len(STRATEGIES)} are used)")


def run_capacity(args: argparse.Namespace) -> int:
    if not args.instances:
        print("error: --capacity needs --instances CSV", file=sys.stderr)
        return 2
    problem = compress_problem(args.compress) or delay_problem(args.delay)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    seed = 0 if args.seed is None else args.seed
    try:
        max_gpus = sum(n.gpu_count for n in load_nodes(args.nodes))
        instance_types = load_instances(args.instances)
        pods = load_timed_pods(args.pods, args.compress)
        figures, events = compare(pods, instance_types, max_gpus=max_gpus, seed=seed, delay=args.delay,
                                  keep_events=bool(args.events), evicted_work=args.evicted_work,
                                  workers=min(len(STRATEGIES), args.workers))
    except (TraceError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.events and events is not None:
        try:
            with open(args.events, "w", newline="") as fh:
                out = csv.writer(fh)
                out.writerow(EVENT_COLUMNS)
                out.writerows(events)
        except OSError as exc:
            print(f"error: --events {args.events}: {exc.strerror or exc}", file=sys.stderr)
            return 2
    print(json.dumps({"compress": args.compress, "delay": args.delay, "seed": seed,
                      "evicted_work": args.evicted_work, "pods": len(pods),
                      "max_gpus": max_gpus, "strategies": {n: _finite(f.summary()) for n, f in figures.items()}},
                     allow_nan=False))
    return 0


def _finite(figures: dict[str, float | int]) -> dict[str, float | int | None]:
    """JSON has no NaN: a figure that is no number (lower-bound's cost when no instance type holds some GPU
    pod) is null."""
    return {k: v if math.isfinite(v) else None for k, v in figures.items()}
