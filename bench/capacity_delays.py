"""kubeon alone over several provisioning delays: how a consolidation rule is compared (issue 19).

    python bench/capacity_delays.py [--compress 50,5300] [--delays 160,170,180,190,200]
                                    [--set field=value ...] [--events FILE] [--label NAME]

kubeon takes no seed, and one run moves with any detail (a provisioning delay
of 170 instead of 180 s moves F=50 from 1.17 to 1.24), so rules are compared
as means over provisioning delays (docs/benchmarks.md, Capacity). Each
`--set` overrides one field of the benchmark's `ConsolidationRules`
(simulator/capacity_kubeon.py RULES), e.g. `--set min_pod_age_seconds=43200`.
Runs one after another (one process). Prints per delay and the mean: GPU-node-
hours and cost over the lower bound, evictions, max evictions per pod, p95
pending, pods never placed, CPU seconds. `--events FILE` writes the events of
the run at the first delay of the first compression.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.capacity import add_trace_arguments
from gpupolicy.capacity.instances import load_instances
from simulator.capacity import EVENT_COLUMNS, run
from simulator.capacity_baselines import lower_bound
from simulator.capacity_kubeon import RULES, Kubeon
from simulator.capacity_trace import load_timed_pods
from simulator.trace import load_nodes


def parse_set(items: list[str]) -> dict[str, object]:
    fields = {f.name: f for f in dataclasses.fields(RULES)}
    out: dict[str, object] = {}
    for item in items:
        name, _, text = item.partition("=")
        if name not in fields:
            raise SystemExit(f"unknown rule {name!r}; fields: {', '.join(fields)}")
        current = getattr(RULES, name)
        out[name] = None if text == "None" else (
            type(current)(text) if current is not None and not isinstance(current, bool) else
            (text == "true" if isinstance(current, bool) else float(text) if "." in text else int(text)))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_trace_arguments(parser)
    parser.add_argument("--compress", default="50,5300")
    parser.add_argument("--delays", default="160,170,180,190,200")
    parser.add_argument("--set", action="append", default=[], dest="sets", metavar="FIELD=VALUE")
    parser.add_argument("--events", help="CSV of the events of the first run")
    parser.add_argument("--label", default="")
    args = parser.parse_args()
    rules = dataclasses.replace(RULES, **parse_set(args.sets))  # type: ignore[arg-type]
    types = load_instances(args.instances)
    max_gpus = sum(n.gpu_count for n in load_nodes(args.nodes))
    delays = [float(d) for d in args.delays.split(",") if d]
    label = args.label or (" ".join(args.sets) or "base")
    first = True
    for compress in (float(c) for c in args.compress.split(",") if c):
        pods = load_timed_pods(args.pods, compress)
        lb = lower_bound(pods, types)
        rows = []
        for delay in delays:
            events: list[tuple[object, ...]] | None = [] if (first and args.events) else None
            cpu = time.process_time()
            f = run(pods, types, Kubeon(pods, types, max_gpus=max_gpus, rules=rules), delay=delay, events=events)
            cpu = time.process_time() - cpu
            if events is not None:
                with open(args.events, "w", newline="") as fh:
                    out = csv.writer(fh)
                    out.writerow(EVENT_COLUMNS)
                    out.writerows(events)
            first = False
            row = (f.gpu_node_hours / lb.gpu_node_hours, f.cost / lb.cost, f.evictions, f.max_evictions_per_pod,
                   f.pending_seconds_p95, f.pods_never_placed, cpu)
            rows.append(row)
            print(f"{label} | F={compress:g} delay={delay:g}: hours {row[0]:.3f} cost {row[1]:.3f} evictions {row[2]} "
                  f"max {row[3]} p95 {row[4]:.0f} never {row[5]} cpu {row[6]:.0f}", flush=True)
        hours = [r[0] for r in rows]
        print(f"{label} | F={compress:g} MEAN: hours {statistics.fmean(hours):.3f} ({min(hours):.3f}-{max(hours):.3f}) "
              f"cost {statistics.fmean(r[1] for r in rows):.3f} evictions {statistics.fmean(r[2] for r in rows):.0f} "
              f"max {max(r[3] for r in rows)} p95 {max(r[4] for r in rows):.0f} never {max(r[5] for r in rows)} "
              f"cpu {statistics.fmean(r[6] for r in rows):.0f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
