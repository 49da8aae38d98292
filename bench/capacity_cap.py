"""Karpenter's rules under the issue's eviction cap: where our Karpenter model's GPU-node-hours come from (issue 40).

    python bench/capacity_cap.py [--compress 50,5300] [--seeds 0-2] [--cap 3]

Issue 40 asks kubeon for GPU-node-hours at most our Karpenter model's, and
issue 19 for no pod evicted more than 3 times. The model reaches its hours by
evicting some pods dozens of times (47-55 at F=50). This runs the same model
(`simulator.capacity_baselines.Karpenter`, unchanged) three ways on the same
trace and seed, and kubeon beside them:

- `uncapped`: as the capacity benchmark runs it;
- `do-not-disrupt`: a pod evicted `--cap` times gets what a Karpenter user
  would give it to stop further moves, `karpenter.sh/do-not-disrupt`: its
  node is no longer a consolidation candidate (the model's `_candidates`).
  Expiration (`expireAfter` 720 h) stays forceful, as in Karpenter v1, so a
  pod can still be evicted past the cap there;
- `strict`: the same with `expireAfter: Never`, so no pod moves more than
  `--cap` times, as the issue's goal requires;
- `kubeon`: our strategy as `bench/capacity.py` runs it (it takes no seed).

Prints one JSON line per run (GPU-node-hours and cost over the lower bound,
evictions, the most of one pod, p95 pending, pods never placed, CPU seconds)
and `interrupted`: the GPU-hours of work the evictions interrupted (each
evicted pod's run time on its node times its GPUs) over the lower bound.
Issue 19's rule lets a pod resume its work across evictions, so these hours
are not in the figures; a pod without checkpoints would redo them.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.capacity import add_trace_arguments, parse_seeds
from gpupolicy.capacity.instances import load_instances
from simulator.capacity import Figures, run
from simulator.capacity_baselines import KARPENTER_EXPIRE_AFTER, Karpenter, lower_bound
from simulator.capacity_kubeon import Kubeon
from simulator.capacity_trace import load_timed_pods
from simulator.trace import load_nodes

VARIANTS = ("uncapped", "do-not-disrupt", "strict", "kubeon")


@dataclass
class DoNotDisrupt(Karpenter):
    """The model, with `karpenter.sh/do-not-disrupt` on every pod evicted `cap` times."""

    cap: int = 3

    def _candidates(self, cluster, now, expired):  # type: ignore[no-untyped-def]
        return [r for r in super()._candidates(cluster, now, expired)
                if all(p.evictions < self.cap for p in cluster.pods_on[r].values())]


def one(variant: str, pods: list, types: list, max_gpus: int, seed: int, cap: int, lb: Figures) -> dict:
    expire = math.inf if variant == "strict" else KARPENTER_EXPIRE_AFTER  # strict: expireAfter Never
    model = (Kubeon(pods, types, max_gpus=max_gpus) if variant == "kubeon" else
             Karpenter(seed=seed, instance_types=types, max_gpus=max_gpus) if variant == "uncapped" else
             DoNotDisrupt(seed=seed, instance_types=types, max_gpus=max_gpus, cap=cap, expire_after=expire))
    events: list[tuple[object, ...]] = []
    cpu = time.process_time()
    f = run(pods, types, model, events=events)
    cpu = time.process_time() - cpu
    return {"variant": variant, "seed": seed, "hours": round(f.gpu_node_hours / lb.gpu_node_hours, 3),
            "cost": round(f.cost / lb.cost, 3), "evictions": f.evictions, "max_per_pod": f.max_evictions_per_pod,
            "pending_p95_s": round(f.pending_seconds_p95), "never_placed": f.pods_never_placed,
            "interrupted": round(interrupted_gpu_hours(events) / lb.gpu_node_hours, 3), "cpu_s": round(cpu, 1)}


def interrupted_gpu_hours(events: list[tuple[object, ...]]) -> float:
    """Work in progress the evictions stopped: each evicted pod's time on its node times its GPUs (milli / 1000)."""
    placed: dict[str, tuple[float, float]] = {}
    total = 0.0
    for when, event, _node, _kind, pod, gpus in events:
        if event == "place":
            entries = [e for e in str(gpus).split("|") if e]
            placed[str(pod)] = (float(str(when)), sum(int(e.split(":")[1]) for e in entries) / 1000)
        elif event == "evict":
            start, used = placed[str(pod)]
            total += (float(str(when)) - start) * used / 3600
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_trace_arguments(parser)
    parser.add_argument("--compress", default="50,5300")
    parser.add_argument("--seeds", default="0-2")
    parser.add_argument("--cap", type=int, default=3, help="evictions after which a pod is do-not-disrupt")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    args = parser.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    try:
        compressions = [float(c) for c in args.compress.split(",") if c]
        seeds = parse_seeds(args.seeds)
    except ValueError:
        compressions, seeds = [], []
    if args.cap < 0 or not variants or set(variants) - set(VARIANTS) or not compressions or not seeds \
            or min(compressions) <= 0 or min(seeds) < 0:
        print(f"error: --cap >= 0, --variants from {', '.join(VARIANTS)}, --compress positive numbers and --seeds "
              f"N, N-M or N,M,... (got {args.cap}, {args.variants}, {args.compress}, {args.seeds})", file=sys.stderr)
        return 2
    types = load_instances(args.instances)
    max_gpus = sum(n.gpu_count for n in load_nodes(args.nodes))
    for compress in compressions:
        pods = load_timed_pods(args.pods, compress)
        lb = lower_bound(pods, types)  # the same for every variant and seed
        for seed in seeds:
            for variant in variants:
                print(json.dumps({"compress": compress, "cap": args.cap,
                                  **one(variant, pods, types, max_gpus, seed, args.cap, lb)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
