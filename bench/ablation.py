"""Ablation of the default packing strategy: each part of `Kubeon` removed alone, on the tuning trace.

    python bench/ablation.py [--parts all|slivers,copies] [--seeds 42-51] [--trace default]
                             [--out bench/out/ablation.csv]

The evaluation protocol (docs/benchmarks.md): parts and weights are chosen
on the default openb trace, seeds 42..51, only; a part whose removal costs
less than 0.05 points there goes. Runs every replay in this one process
(the trace is read once), prints one markdown row per variant: mean GPU
allocation % at the 100% arrival point, and the mean per-seed difference
against the full strategy on the same seeds.
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

from gpupolicy.packing.strategies.kubeon import Kubeon  # noqa: E402
from simulator.replay import replay  # noqa: E402
from simulator.trace import load_nodes, load_pods  # noqa: E402

DATA = ROOT / "vendor" / "openb"


def parse_seeds(text: str) -> list[int]:
    if "-" in text:
        lo, hi = text.split("-", 1)
        return list(range(int(lo), int(hi) + 1))
    return [int(s) for s in text.split(",") if s]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default="all", help=f"comma-separated, from {', '.join(Kubeon.PARTS)}; "
                                                       "'none': the full strategy only")
    parser.add_argument("--seeds", default="42-51")
    parser.add_argument("--trace", default="default")
    parser.add_argument("--data", default=str(DATA), help="folder with the node list and openb_pod_list_TRACE.csv")
    parser.add_argument("--out", default="bench/out/ablation.csv")
    args = parser.parse_args(argv)
    names = {"all": list(Kubeon.PARTS), "none": []}.get(args.parts, [p for p in args.parts.split(",") if p])
    try:
        variants = {"full": Kubeon(), **{f"without {p}": Kubeon().without(p) for p in names}}
    except ValueError as exc:
        print(f"error: --parts: {exc}", file=sys.stderr)
        return 2
    nodes = load_nodes(Path(args.data) / "openb_node_list_gpu_node.csv")
    pods = load_pods(Path(args.data) / f"openb_pod_list_{args.trace}.csv")
    seeds = parse_seeds(args.seeds)
    results: dict[str, dict[int, float]] = {}
    rows = []
    for label, strategy in variants.items():
        for seed in seeds:
            started = time.perf_counter()
            result = replay(nodes, pods, strategy, seed)
            alloc = float(result.alloc_pct_at_100 or 0.0)
            results.setdefault(label, {})[seed] = alloc
            rows.append({"variant": label, "seed": seed, "alloc_pct_at_100": round(alloc, 4),
                         "seconds": round(time.perf_counter() - started, 1)})
            print(f"{label} seed {seed}: {alloc:.4f} ({rows[-1]['seconds']} s)", file=sys.stderr, flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    full = results["full"]
    print(f"| variant ({args.trace}, seeds {args.seeds}) | mean alloc % at 100% | change vs full |")
    print("|---|---|---|")
    for label, by_seed in results.items():
        change = statistics.fmean(by_seed[s] - full[s] for s in seeds)
        print(f"| {label} | {statistics.fmean(by_seed.values()):.2f} | {change:+.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
