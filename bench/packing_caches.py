"""What the packing caches save: the same work with each cache switched off, CPU seconds (issue 45).

    python bench/packing_caches.py [--variants base,no-after,no-waste-table] [--repeat 3] [--capacity]

Variants (each in a fresh process, interleaved `--repeat` times; the medians are printed):
- `base`: the code as it is.
- `no-after`: `FragModel._after_by_node` forgets every pod shape before each call, so every row asked is
  recomputed (docs/designs/caches.md, "Packing").
- `no-waste-table`: `slivers.waste_table` without its lru_cache.
Work per variant, each with its decisions printed so that a variant that decides otherwise shows:
- `replay <trace>`: the openb replay `bench/openb.py --strategies kubeon --seeds 42` runs (default and
  gpuspec20);
- `extender`: the extender's pattern at 15,000 nodes (the openb nodes repeated): 600 pods of six shapes
  of the default trace (four whole-GPU, two sharing), each decided over the 750 rows kube-scheduler's
  sampling would send (5%, rotating) and committed;
- `capacity` (with `--capacity`): kubeon's capacity run at F=50 (`simulate --capacity`'s kubeon).
CPU seconds (`time.process_time`), not wall: the 2-core VM is shared.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DATA = ROOT / "vendor/openb"
VARIANTS = ("base", "no-after", "no-waste-table")


def switch_off(variant: str) -> None:
    """Disable the variant's cache in this process (a monkeypatch: the product code is untouched)."""
    from gpupolicy.packing import fragmentation
    from gpupolicy.packing.strategies import slivers

    if variant == "no-after":
        original = fragmentation.FragModel._after_by_node

        def forgetting(self: Any, demand: Any, nodes: Any) -> Any:
            self._after_by_shape.clear()
            return original(self, demand, nodes)

        fragmentation.FragModel._after_by_node = forgetting  # type: ignore[method-assign]
    if variant == "no-waste-table":
        slivers.waste_table = slivers.waste_table.__wrapped__  # type: ignore[attr-defined]


def measure(variant: str, capacity: bool) -> dict[str, tuple[float, str]]:
    """Per work: (CPU seconds, what was decided)."""
    import numpy as np

    from gpupolicy.packing.engine import commit, decide, get_strategy
    from gpupolicy.packing.nodemodel import NodeState
    from gpupolicy.packing.placement import PackingContext
    from gpupolicy.packing.typicalmix import TypicalMix
    from simulator.replay import replay
    from simulator.trace import load_nodes, load_pods

    switch_off(variant)
    out: dict[str, tuple[float, str]] = {}
    nodes = load_nodes(DATA / "openb_node_list_gpu_node.csv")
    for trace in ("default", "gpuspec20"):
        pods = load_pods(DATA / f"openb_pod_list_{trace}.csv")
        t = time.process_time()
        r = replay(nodes, pods, "kubeon", 42)
        out[f"replay {trace}"] = (time.process_time() - t, f"{r.alloc_pct_at_100:.4f}/{r.alloc_pct_at_end:.4f}")

    big = [dataclasses.replace(n, name=f"{n.name}-{i}") for i in range(13) for n in nodes][:15000]
    state = NodeState.build(sorted(big, key=lambda s: s.name))
    pods = load_pods(DATA / "openb_pod_list_default.csv")
    ctx = PackingContext(mix=TypicalMix.from_pods(pods, 1.0), rng=np.random.default_rng(0),
                         tie_rank=np.arange(len(state), dtype=np.int64))
    strategy = get_strategy("kubeon")
    shapes = [p for p in pods if not p.is_sharing and p.needs_gpu][:4] + [p for p in pods if p.is_sharing][:2]
    picks = []
    t = time.process_time()
    for i in range(600):
        pod = shapes[i % len(shapes)]
        rows = (np.arange(750, dtype=np.int64) + 750 * i) % len(state)
        decision = decide(state, pod, strategy, ctx, restrict=rows)
        if decision.node is not None:
            commit(state, pod, decision)
        picks.append(decision.node)
    out["extender"] = (time.process_time() - t, hashlib.sha1(repr(picks).encode()).hexdigest()[:8])

    if capacity:
        from gpupolicy.capacity.instances import load_instances
        from simulator.capacity import run
        from simulator.capacity_kubeon import Kubeon
        from simulator.capacity_trace import load_timed_pods

        max_gpus = sum(n.gpu_count for n in nodes)
        types = load_instances(DATA / "instances.csv")
        timed = load_timed_pods(DATA / "openb_pod_list_default.csv", 50.0)
        t = time.process_time()
        s = run(timed, types, Kubeon(timed, types, max_gpus=max_gpus)).summary()
        out["capacity F=50"] = (time.process_time() - t, f"{s['gpu_node_hours']}/{s['evictions']}")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--capacity", action="store_true", help="also kubeon's capacity run at F=50")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child process: one variant, JSON out
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one, args.capacity)))
        return 0
    variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        print(f"error: unknown variant {unknown[0]!r}; choose from {', '.join(VARIANTS)}", file=sys.stderr)
        return 2
    seconds: dict[tuple[str, str], list[float]] = {}
    decided: dict[str, set[str]] = {}
    for _ in range(args.repeat):
        for v in variants:
            cmd = [sys.executable, __file__, "--one", v] + (["--capacity"] if args.capacity else [])
            child = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
            for work, (cpu, what) in child.items():
                seconds.setdefault((work, v), []).append(cpu)
                decided.setdefault(work, set()).add(what)
                print(f"{v:15} {work:18} cpu {cpu:7.2f} s  decided {what}", flush=True)
    works = list(dict.fromkeys(w for w, _ in seconds))
    print("\n| work | " + " | ".join(variants) + " | same decisions |")
    print("|---|" + "---|" * (len(variants) + 1))
    for w in works:
        cells = [f"{statistics.median(seconds[(w, v)]):.2f}" for v in variants]
        print(f"| {w} | " + " | ".join(cells) + f" | {'yes' if len(decided[w]) == 1 else 'NO'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
