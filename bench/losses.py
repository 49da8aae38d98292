"""Where a strategy loses GPU allocation at the 100% arrival point of an openb replay.

    python bench/losses.py [--strategies kubeon,fgd] [--seeds 42] [--trace default] [--top 8]
                           [--data vendor/openb]

The metric is the GPU allocated when arrived GPU demand first reaches 100%
of capacity; what it misses is the GPU milli left free at that point, which
the pods that failed before it could not use. This says which, so a
hypothesis starts from the loss and not from a guess (docs/benchmarks/history/packing.md,
"Robustness, second round: where kubeon loses on the tuning trace"):
- failed pods by shape (whole GPUs, a share, CPU-only) and why, on the state
  each met: no node had the GPU room, or some did but lacked the CPU or the
  memory;
- the free GPU milli at the 100% point by GPU model: whole free GPUs, and
  slices of used GPUs;
- the slices left, by the share sizes holding their GPU (810m alone leaves
  190m), largest total first.
It runs the production replay (`simulator.replay.replay`, placements kept)
and re-applies its placements in order to read the states; it decides
nothing itself.
"""

from __future__ import annotations

import argparse
import collections
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.openb import parse_seeds, parse_strategies
from gpupolicy.packing.nodemodel import MILLI, NodeState, PodDemand
from gpupolicy.packing.placement import gpu_fit_mask
from simulator.replay import replay
from simulator.trace import load_nodes, load_pods

DATA = Path(__file__).resolve().parent.parent / "vendor" / "openb"


def shape(pod: PodDemand) -> str:
    if pod.is_sharing:
        return "share"
    return f"{pod.num_gpu} GPU" if pod.needs_gpu else "CPU-only"


def why_failed(state: NodeState, pod: PodDemand) -> str:
    """Why no node took `pod` on this state: the first resource no node with the GPU room had."""
    room = gpu_fit_mask(state, pod)
    if not room.any():
        return "no GPU room"
    if not (room & (state.cpu_free >= pod.cpu_milli)).any():
        return "GPU room, short of CPU"
    if not (room & (state.cpu_free >= pod.cpu_milli) & (state.mem_free >= pod.memory_mib)).any():
        return "GPU room, short of memory"
    return "other rule"


@dataclass
class Losses:
    """One replay at its 100% arrival point: what failed before it and what was left free then."""

    strategy: str
    seed: int
    alloc_pct_at_100: float
    capacity_milli: int
    failed: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)  # milli
    failed_pods: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)
    free_by_model: dict[str, tuple[int, int]] = field(default_factory=dict)  # (whole GPUs, slices) in milli
    slices: collections.Counter[tuple[tuple[int, ...], int]] = field(default_factory=collections.Counter)

    @property
    def free_milli(self) -> int:
        return sum(whole + sliced for whole, sliced in self.free_by_model.values())


def measure(nodes_csv: Path, pods_csv: Path, strategy: str, seed: int) -> Losses:
    """Replay (production code), then re-apply its placements up to the 100% arrival point."""
    nodes, pods = load_nodes(nodes_csv), load_pods(pods_csv)
    result = replay(nodes, pods, strategy, seed, keep_placements=True)
    state = NodeState.build(sorted(nodes, key=lambda s: s.name))
    out = Losses(strategy, seed, float(result.alloc_pct_at_100 or 0.0), state.gpu_capacity_milli)
    shares: dict[tuple[int, int], list[int]] = collections.defaultdict(list)
    arrived = 0
    for arrival in result.placements:
        pod = arrival.pod
        arrived += pod.gpu_total_milli
        if arrival.node is None:
            key = (shape(pod), why_failed(state, pod))
            out.failed[key] += pod.gpu_total_milli
            out.failed_pods[key] += 1
        else:
            node = state.index[arrival.node]
            state.place(node, pod, arrival.gpu_indices)
            if pod.is_sharing:
                shares[(node, arrival.gpu_indices[0])].append(pod.gpu_milli)
        if arrived >= out.capacity_milli:
            break
    free = state.gpu_free * state.gpu_present
    whole = (free == MILLI).sum(axis=1) * MILLI
    sliced = (free * (free < MILLI)).sum(axis=1)
    for m, model in enumerate(state.models):
        rows = state.model_idx == m
        if rows.any():
            out.free_by_model[model] = (int(whole[rows].sum()), int(sliced[rows].sum()))
    for sizes in shares.values():
        if sum(sizes) < MILLI:
            out.slices[(tuple(sorted(sizes, reverse=True)), MILLI - sum(sizes))] += 1
    return out


def render(losses: Losses, top: int) -> list[str]:
    """Markdown tables of one replay's losses."""
    out = [f"### {losses.strategy}, seed {losses.seed}: {losses.alloc_pct_at_100:.4f}% allocated at 100% arrival "
           f"({losses.free_milli} of {losses.capacity_milli} GPU milli free)",
           "", "| failed before 100% | why | pods | GPU milli |", "|---|---|---|---|"]
    out += [f"| {s} | {w} | {losses.failed_pods[(s, w)]} | {m} |" for (s, w), m in losses.failed.most_common()]
    out += [f"| all | | {sum(losses.failed_pods.values())} | {sum(losses.failed.values())} |", "",
            "| GPU model | free whole GPUs (milli) | free slices of used GPUs (milli) |", "|---|---|---|"]
    out += [f"| {model} | {whole} | {sliced} |" for model, (whole, sliced) in losses.free_by_model.items()]
    out += ["", "| shares on the GPU | slice left | GPUs | milli |", "|---|---|---|---|"]
    ranked = sorted(losses.slices.items(), key=lambda kv: -kv[1] * kv[0][1])
    out += [f"| {' + '.join(f'{s}m' for s in sizes)} | {left}m | {n} | {n * left} |"
            for (sizes, left), n in ranked[:top]]
    return [*out, ""]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--strategies", default="kubeon,fgd")
    parser.add_argument("--seeds", default="42")
    parser.add_argument("--trace", default="default")
    parser.add_argument("--top", type=int, default=8, help="slice kinds listed (largest total first)")
    parser.add_argument("--data", default=str(DATA))
    args = parser.parse_args(argv)
    try:
        strategies = parse_strategies(args.strategies)
    except ValueError as exc:
        print(f"error: --strategies: {exc}", file=sys.stderr)
        return 2
    try:
        seeds = parse_seeds(args.seeds)
    except ValueError:
        print(f"error: --seeds: expected N-M or a comma-separated list, got {args.seeds!r}", file=sys.stderr)
        return 2
    nodes_csv = Path(args.data) / "openb_node_list_gpu_node.csv"
    pods_csv = Path(args.data) / f"openb_pod_list_{args.trace}.csv"
    for path in (nodes_csv, pods_csv):
        if not path.is_file():
            print(f"error: {path}: no such file (--data, --trace)", file=sys.stderr)
            return 2
    for seed in seeds:
        for strategy in strategies:
            print("\n".join(render(measure(nodes_csv, pods_csv, strategy, seed), args.top)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
