"""openb benchmark: strategies x traces x seeds, our means beside the paper's published ones.

    python bench/openb.py [--strategies kubeon,fgd,bestfit] [--traces default,cpu050]
                          [--seeds 42-51] [--jobs 2] [--out bench/results/openb-results.csv]
                          [--data vendor/openb | ../shared/data/openb for the ten held-out traces]
                          [--plot FILE.png]

Writes a CSV of every run and prints a markdown table (mean alloc % at 100%
arrival, sd, published mean, difference) per trace and strategy. `--plot`
also draws GPU allocated against arrived GPU demand (both % of capacity)
for each strategy on the first trace and seed, the FGD paper's figure.
"""

from __future__ import annotations

import argparse
import csv
import multiprocessing
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpupolicy.packing.engine import STRATEGIES
from simulator.replay import replay
from simulator.trace import load_nodes, load_pods

DATA = Path(__file__).resolve().parent.parent / "vendor" / "openb"  # the default trace; --data for the others
TRACES = ("default", "cpu050", "cpu100", "cpu200", "cpu250", "gpushare40", "gpushare60", "gpushare80",
          "gpushare100", "gpuspec10", "gpuspec20")
PAPER_NAMES = {"bestfit": "BestFit", "fgd": "FGD", "packing": "GpuPacking", "dotprod": "DotProd",
               "random": "Random"}


def parse_seeds(text: str) -> list[int]:
    if "-" in text:
        lo, hi = text.split("-", 1)
        return list(range(int(lo), int(hi) + 1))
    return [int(s) for s in text.split(",") if s]


def parse_strategies(text: str) -> list[str]:
    """A comma list of packing strategies; ValueError names the first unknown one and the choices."""
    strategies = [s for s in text.split(",") if s]
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown:
        raise ValueError(f"unknown strategy {unknown[0]!r}; choose from {', '.join(STRATEGIES)}")
    return strategies


def run_one(job: tuple[str, str, int, str]) -> dict[str, object]:
    trace, strategy, seed, data = job
    nodes = load_nodes(Path(data) / "openb_node_list_gpu_node.csv")
    pods = load_pods(Path(data) / f"openb_pod_list_{trace}.csv")
    result = replay(nodes, pods, strategy, seed)
    row: dict[str, object] = {"trace": trace}
    row.update(result.summary())
    return row


def load_anchors(data: Path) -> dict[tuple[str, str], tuple[float, float]]:
    out = {}
    with (data / "anchors.csv").open() as fh:
        for row in csv.DictReader(fh):
            out[(row["trace"], row["policy"])] = (float(row["alloc_pct_at_100"]), float(row["sd_at_100"]))
    return out


def table(rows: list[dict[str, object]], anchors: dict[tuple[str, str], tuple[float, float]]) -> str:
    groups: dict[tuple[str, str], list[float]] = {}
    secs: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        key = (str(r["trace"]), str(r["strategy"]))
        groups.setdefault(key, []).append(float(r["alloc_pct_at_100"]))  # type: ignore[arg-type]
        secs.setdefault(key, []).append(float(r["seconds"]))  # type: ignore[arg-type]
    best_fgd = {t: anchors.get((t, "FGD"), (float("nan"), 0.0))[0] for t, _ in groups}
    lines = ["| trace | strategy | seeds | ours (mean alloc % at 100%) | sd | published | ours - published "
             "| vs published FGD | s/replay |",
             "|---|---|---|---|---|---|---|---|---|"]
    order = {p: i for i, p in enumerate(STRATEGIES)}
    for (trace, strategy) in sorted(groups, key=lambda k: (TRACES.index(k[0]) if k[0] in TRACES else 99,
                                                         order.get(k[1], 99))):
        vals = groups[(trace, strategy)]
        mean = statistics.fmean(vals)
        sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
        pub = anchors.get((trace, PAPER_NAMES.get(strategy, "")))
        pub_txt = f"{pub[0]:.2f}" if pub else "-"
        diff = f"{mean - pub[0]:+.2f}" if pub else "-"
        vs_fgd = f"{mean - best_fgd[trace]:+.2f}"
        lines.append(f"| {trace} | {strategy} | {len(vals)} | {mean:.2f} | {sd:.2f} | {pub_txt} | {diff} | {vs_fgd} "
                     f"| {statistics.fmean(secs[(trace, strategy)]):.1f} |")
    return "\n".join(lines)


def curve(nodes_csv: Path, pods_csv: Path, policy: str, seed: int) -> tuple[list[float], list[float]]:
    """(arrived %, allocated %) after each arrival of one replay."""
    nodes = load_nodes(nodes_csv)
    result = replay(nodes, load_pods(pods_csv), policy, seed, keep_placements=True)
    capacity = sum(n.gpu_count for n in nodes) * 1000.0 or 1.0
    arrived = allocated = 0
    xs, ys = [], []
    for placement in result.placements:
        arrived += placement.pod.gpu_total_milli
        if placement.node is not None:
            allocated += placement.pod.gpu_total_milli
        xs.append(100.0 * arrived / capacity)
        ys.append(100.0 * allocated / capacity)
    return xs, ys


def plot(path: str, data: Path, trace: str, seed: int, policies: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for policy in policies:
        xs, ys = curve(data / "openb_node_list_gpu_node.csv", data / f"openb_pod_list_{trace}.csv", policy, seed)
        ax.plot(xs, ys, label=PAPER_NAMES.get(policy, policy), linewidth=1.2)
    ax.plot([0, 100], [0, 100], color="grey", linestyle=":", linewidth=0.8)
    ax.set_xlabel("arrived GPU demand (% of capacity)")
    ax.set_ylabel("GPU allocated (% of capacity)")
    ax.set_title(f"openb {trace}, seed {seed}")
    ax.set_xlim(60, 130)
    ax.set_ylim(60, 100)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--strategies", "--policies", dest="strategies",
                        default="kubeon,fgd,bestfit,packing,dotprod,random",
                        help="packing strategies, comma-separated (--policies: the old name)")
    parser.add_argument("--traces", default=None,
                        help="comma list (default: every trace whose pod list is in --data; vendor/openb "
                             "holds only `default`, --data ../shared/data/openb holds all 11)")
    parser.add_argument("--seeds", default="42-51")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--data", default=str(DATA))
    parser.add_argument("--out", default="bench/results/openb-results.csv")
    parser.add_argument("--plot", metavar="FILE.png", help="draw allocated vs arrived for the first trace and seed")
    args = parser.parse_args(argv)
    try:
        strategies = parse_strategies(args.strategies)
    except ValueError as exc:
        print(f"error: --strategies: {exc}", file=sys.stderr)
        return 2
    traces = ([t for t in args.traces.split(",") if t] if args.traces is not None else
              [t for t in TRACES if (Path(args.data) / f"openb_pod_list_{t}.csv").is_file()])
    jobs = [(t, p, s, args.data) for t in traces for p in strategies for s in parse_seeds(args.seeds)]
    started = time.time()
    with multiprocessing.Pool(args.jobs) as pool:
        rows = []
        for row in pool.imap_unordered(run_one, jobs):
            rows.append(row)
            print(f"[{len(rows)}/{len(jobs)}] {row['trace']} {row['strategy']} seed {row['seed']}: "
                  f"{row['alloc_pct_at_100']} ({row['seconds']} s)", file=sys.stderr, flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(sorted(rows, key=lambda r: (str(r["trace"]), str(r["strategy"]), int(r["seed"]))))  # type: ignore[call-overload]
    print(table(rows, load_anchors(Path(args.data))))
    print(f"\n{len(jobs)} replays in {time.time() - started:.0f} s wall, {args.jobs} processes")
    if args.plot:
        plot(args.plot, Path(args.data), traces[0], parse_seeds(args.seeds)[0], strategies)
        print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
