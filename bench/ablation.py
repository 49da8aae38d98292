"""Ablation of the default packing strategy: each part of `Kubeon` removed alone, on the tuning traces.

    python bench/ablation.py [--parts all|slivers,copies] [--seeds 42-51] [--traces default,gpuspec20]
                             [--out bench/out/ablation.csv]

The evaluation protocol (docs/benchmarks.md): parts and weights are chosen
on the two tuning traces, default and gpuspec20 (both in vendor/openb),
seeds 42..51, only. A part earns its place by at least 0.05 points on
either tuning trace without losing more than 0.02 on the other (`verdict`).
Runs every replay in this one process (each trace read once), prints one
markdown row per variant and a column pair per trace: mean GPU allocation %
at the 100% arrival point, and the mean per-seed difference against the
full strategy on the same seeds.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.parts import PARTS, without  # noqa: E402
from gpupolicy.packing.strategies.kubeon import Kubeon  # noqa: E402
from simulator.replay import replay  # noqa: E402
from simulator.trace import load_nodes, load_pods  # noqa: E402

DATA = ROOT / "vendor" / "openb"
TUNING = "default,gpuspec20"
EARNS, MAY_LOSE = 0.05, 0.02  # the protocol's rule, in points


def parse_seeds(text: str) -> list[int]:
    if "-" in text:
        lo, hi = text.split("-", 1)
        return list(range(int(lo), int(hi) + 1))
    return [int(s) for s in text.split(",") if s]


def verdict(costs: list[float]) -> str:
    """Whether a part earns its place from what its removal costs per trace (positive: removal loses)."""
    if any(c >= EARNS for c in costs) and all(c >= -MAY_LOSE for c in costs):
        return "earns"
    return "goes"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default="all", help=f"comma-separated, from {', '.join(PARTS)}; "
                                                       "'none': the full strategy only")
    parser.add_argument("--seeds", default="42-51")
    parser.add_argument("--traces", default=TUNING, help="comma-separated pod lists (openb_pod_list_TRACE.csv)")
    parser.add_argument("--data", default=str(DATA), help="folder with the node list and the pod lists")
    parser.add_argument("--out", default="bench/out/ablation.csv")
    args = parser.parse_args(argv)
    names = {"all": list(PARTS), "none": []}.get(args.parts, [p for p in args.parts.split(",") if p])
    try:
        variants = {"full": Kubeon(), **{f"without {p}": without(Kubeon(), p) for p in names}}
    except ValueError as exc:
        print(f"error: --parts: {exc}", file=sys.stderr)
        return 2
    traces = [t for t in args.traces.split(",") if t]
    missing = [t for t in traces if not (Path(args.data) / f"openb_pod_list_{t}.csv").is_file()]
    if missing:
        print(f"error: --traces: no openb_pod_list_{missing[0]}.csv in {args.data}", file=sys.stderr)
        return 2
    nodes = load_nodes(Path(args.data) / "openb_node_list_gpu_node.csv")
    seeds = parse_seeds(args.seeds)
    results: dict[tuple[str, str], dict[int, float]] = {}
    rows = []
    for trace in traces:
        pods = load_pods(Path(args.data) / f"openb_pod_list_{trace}.csv")
        for label, strategy in variants.items():
            for seed in seeds:
                started = time.perf_counter()
                alloc = float(replay(nodes, pods, strategy, seed).alloc_pct_at_100 or 0.0)
                results.setdefault((trace, label), {})[seed] = alloc
                rows.append({"trace": trace, "variant": label, "seed": seed, "alloc_pct_at_100": round(alloc, 4),
                             "seconds": round(time.perf_counter() - started, 1)})
                print(f"{trace} {label} seed {seed}: {alloc:.4f} ({rows[-1]['seconds']} s)", file=sys.stderr,
                      flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"| variant (seeds {args.seeds}) | " + " | ".join(f"{t} mean % | {t} change" for t in traces)
          + " | verdict |")
    print("|---|" + "---|---|" * len(traces) + "---|")
    for label in variants:
        cells, costs = [], []
        for trace in traces:
            by_seed, full = results[(trace, label)], results[(trace, "full")]
            change = statistics.fmean(by_seed[s] - full[s] for s in seeds)
            costs.append(-change)
            cells.append(f"{statistics.fmean(by_seed.values()):.2f} | {change:+.3f}")
        print(f"| {label} | " + " | ".join(cells) + f" | {'' if label == 'full' else verdict(costs)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
