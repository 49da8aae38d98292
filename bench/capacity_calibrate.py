"""Our Karpenter model against the real Karpenter, from a live run's files (issue 40's calibration).

    python bench/capacity_calibrate.py [--dir bench/results/capacity-live-m30] [--seeds 0-2]
                                       [--evicted-work restart] [--ties 8] [--decisions | --at T]

Reads what `bench/capacity_live.py --events DIR/seedS --scenario DIR/scenarioS.csv` wrote (the
real Karpenter arm's events `seedS-karpenter.csv`, the scenario as an openb pod list) and the
catalog `DIR/catalog.csv`, runs the model on the same scenario as bench/capacity_live.py's
`simulated` line does (its delay, GPU limit, 1 s loop, the live batch windows and allocatable;
Karpenter's expireAfter the live NodePool's 720 h) under `--ties` tie-break seeds, and prints per seed
and on the mean, model against real:
- GPU-node-hours, cost and evictions (the issue's 10 % is on the first two), recomputed from the
  events (a NodeClaim still there at the end counts to the last event);
- cost by instance type;
- drained nodes by type and by the pods on them, and where evicted pods went next (by type).
Both runs' events are in `simulate --capacity --events`' format, so the same counting reads both.

`--at SECONDS` (one seed) asks the other question: given the real cluster as its events show it at
that time (nodes, their readiness, the pods bound and pending), what would the model's disruption
pass do (`Karpenter._compute`)? It prints the nodes and the model's command; the real Karpenter's
next disruption is in the events right after. A different command on the same state is a difference
in Karpenter's rules, not in where kube-scheduler put the pods. `--decisions` asks it for every
real drain, on the state when that drain was computed (`decisions`), and counts the agreements.
"""

from __future__ import annotations

import argparse
import collections
import csv
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.capacity import parse_seeds
from bench.capacity_live import DAY_FACTOR, LIVE_KARPENTER, LIVE_LOOP, REAL_DELAY, live_types
from gpupolicy.capacity.instances import InstanceType
from simulator.capacity import EVICTED_WORK, Cluster, PodRun
from simulator.capacity_baselines import Karpenter, first_gpus
from simulator.capacity_compare import run_one
from simulator.capacity_trace import TimedPod, load_timed_pods

DIR = Path(__file__).resolve().parent / "results" / "capacity-live-m30"
# a disruption command acts this long after Karpenter computed it: its 15 s validation delay
# (disruption/consolidation.go) and about half a second of its simulations and the events' polling
VALIDATION_LAG = 15.5
Events = list[tuple[str, ...]]


def counts(events: Events, types: list[InstanceType]) -> dict[str, object]:
    """Figures and patterns of one run's events (time, event, node, instance_type, pod, gpus)."""
    prices = {t.name: t.price_per_hour for t in types}
    gpus = {t.name: t.gpus for t in types}
    launched: dict[str, float] = {}
    cost: dict[str, float] = collections.defaultdict(float)
    gpu_hours = 0.0
    evicted_on: dict[str, set[str]] = collections.defaultdict(set)  # node -> the pods evicted from it
    kind_of: dict[str, str] = {}
    moved_from: dict[str, str] = {}  # an evicted pod -> the type it left
    moves: collections.Counter[str] = collections.Counter()
    t = 0.0
    for time, event, node, kind, pod, _ in events:
        t, pod = float(time), pod.split("/")[0]  # live pods are namespace/name: the replica is the name's stem
        kind_of[node] = kind
        if event == "launch":
            launched[node] = t
        elif event == "delete":
            hours = (t - launched.pop(node)) / 3600
            cost[kind] += prices[kind] * hours
            gpu_hours += gpus[kind] * hours
        elif event == "evict":
            evicted_on[node].add(pod)
            moved_from[pod] = kind
        elif event == "place" and pod in moved_from:
            moves[f"{moved_from.pop(pod)} -> {kind}"] += 1
    for node, start in launched.items():  # a NodeClaim left at the end: charged to the last event, as measured
        cost[kind_of[node]] += prices[kind_of[node]] * (t - start) / 3600
        gpu_hours += gpus[kind_of[node]] * (t - start) / 3600
    drains = collections.Counter(f"{kind_of[n]} with {len(p)}" for n, p in evicted_on.items())
    return {"gpu_node_hours": round(gpu_hours, 3), "cost": round(sum(cost.values()), 3),
            "evictions": sum(len(p) for p in evicted_on.values()),
            "cost_by_type": {k: round(v, 2) for k, v in sorted(cost.items())},
            "drained_nodes": dict(sorted(drains.items())), "evicted_pods_went_to": dict(sorted(moves.items()))}


def real_state(events: Events, pods: dict[str, TimedPod], types: list[InstanceType],
               at: float) -> tuple[Cluster, dict[int, str]]:
    """The real cluster at `at` from its events, as the simulator's `Cluster` (and each row's node name)."""
    cluster = Cluster(types, REAL_DELAY / DAY_FACTOR, None)
    kinds = {t.name: t for t in types}
    rows: dict[str, int] = {}
    runs: dict[str, PodRun] = {}
    done: set[str] = set()
    for time, event, node, kind, name, _ in events:
        t, pod = float(time), name.split("/")[0]
        if t >= at:
            break
        if event == "launch":
            rows[node] = cluster.launch(kinds[kind], t)
        elif event == "ready":
            cluster.make_ready(rows[node], t)
        elif event == "delete":
            cluster.delete(rows.pop(node), t)
        elif event == "place":
            run = runs.setdefault(pod, PodRun(pods[pod], pods[pod].duration))
            if run.row is not None:  # the replica's new pod, seen bound before its evicted one was seen gone
                cluster.unbind(run, t, "evict")
            cluster.bind(run, rows[node], first_gpus(cluster.state, rows[node], run.pod.demand), t)
        elif event in ("evict", "finish") and runs[pod].row is not None and runs[pod].row == rows.get(node):
            cluster.unbind(runs[pod], t, event)
            if event == "evict" and not cluster.cordoned[rows[node]]:
                cluster.cordon(rows[node])  # a drained node is tainted until it goes
            if event == "finish":
                done.add(pod)
    for key, p in pods.items():
        if p.arrival < at and key not in done and (key not in runs or runs[key].row is None):
            cluster.pending[key] = runs.get(key) or PodRun(p, p.duration)
    return cluster, {row: node for node, row in rows.items()}


def model_at(events: Events, pods: list[TimedPod], types: list[InstanceType], seed: int, max_gpus: int,
             at: float) -> dict[str, object]:
    """The model's disruption command on the real state at `at`, beside that state."""
    cluster, names = real_state(events, {p.key: p for p in pods}, types, at)
    command = Karpenter(seed=seed, instance_types=types, max_gpus=max_gpus)._compute(cluster, at, set())
    nodes = {names[r]: {"type": cluster.kind[r].name, "ready": cluster.ready[r], "pods": sorted(cluster.pods_on[r]),
                        "free_gpus": int((cluster.state.gpu_free[r] == 1000).sum()),
                        "free_cpu_milli": int(cluster.state.cpu_free[r])} for r in cluster.live_rows()}
    said = None if command is None else {"method": command.method, "nodes": [names[r] for r in command.rows],
                                         "replacement": command.replacement.name if command.replacement else None}
    return {"at": at, "pending": sorted(cluster.pending), "nodes": nodes, "model_command": said}


def decisions(events: Events, pods: list[TimedPod], types: list[InstanceType], seed: int, max_gpus: int
              ) -> dict[str, object]:
    """Each drain of the real Karpenter beside the model's command on the real state when the real one was
    computed: `VALIDATION_LAG` before its eviction (a deletion) or before its replacement's launch (a node
    that became ready at most 5 s before the eviction and took none of its pods before it), and not
    before the previous drain (the disruption loop computes its next command once one has run). A
    difference is then in Karpenter's rules, not in the states the two met."""
    drains: dict[float, set[str]] = collections.defaultdict(set)
    launched: dict[str, float] = {}
    ready: list[tuple[float, str]] = []
    first_place: dict[str, float] = {}
    for time, event, node, _, _, _ in events:
        t = float(time)
        if event == "evict":
            drains[t].add(node)
        elif event == "launch":
            launched[node] = t
        elif event == "ready":
            ready.append((t, node))
        elif event == "place":
            first_place.setdefault(node, t)
    verdicts: collections.Counter[str] = collections.Counter()
    differ = []
    for t, nodes in sorted(drains.items()):
        replacement = next((n for r, n in ready if t - 5 <= r <= t and first_place.get(n, math.inf) >= t), None)
        acted = launched[replacement] if replacement else t
        computed = max([acted - VALIDATION_LAG] + [d + 0.02 for d in drains if d < acted - 0.01])
        command = model_at(events, pods, types, seed, max_gpus, computed)["model_command"]
        said = set(command["nodes"]) if command else set()  # type: ignore[index]
        verdict = "same" if said == nodes else "overlapping" if said & nodes else "none" if not said else "other"
        verdicts[verdict] += 1
        if verdict != "same":
            differ.append({"at": round(t, 3), "real": sorted(nodes), "model": command})
    return {"drains": sum(verdicts.values()), **dict(sorted(verdicts.items())), "differ": differ}


def model_counts(pods: list[TimedPod], types: list[InstanceType], seed: int, args: argparse.Namespace
                 ) -> dict[str, object]:
    """The model's figures on one scenario as the mean over `args.ties` tie-break seeds of its scheduler
    and node order (seed x 1000 + i: the model is random where kube-scheduler and node names are), their
    cost range, and the first run's patterns."""
    runs = []
    for i in range(args.ties):
        _, events = run_one("karpenter", pods, types, args.max_gpus, seed * 1000 + i, REAL_DELAY / DAY_FACTOR, True,
                            args.evicted_work, LIVE_KARPENTER, LIVE_LOOP)
        runs.append(counts([tuple(str(x) for x in e) for e in events or []], types))
    out = dict(runs[0])
    for key in ("gpu_node_hours", "cost", "evictions"):
        out[key] = round(sum(float(r[key]) for r in runs) / len(runs), 3)  # type: ignore[arg-type]
    out["cost_range"] = [min(float(r["cost"]) for r in runs), max(float(r["cost"]) for r in runs)]  # type: ignore[arg-type]
    out["ties"] = args.ties
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=DIR)
    parser.add_argument("--seeds", default="0-2")
    parser.add_argument("--max-gpus", type=int, default=64, help="the live run's --max-gpus (default 64)")
    parser.add_argument("--evicted-work", choices=EVICTED_WORK, default="restart",
                        help="the model's rule (default restart: the live replicas restart)")
    parser.add_argument("--at", type=float, help="seconds into the run: the model's command on the real state then")
    parser.add_argument("--decisions", action="store_true",
                        help="each real drain against the model's command on the real state it was computed on")
    parser.add_argument("--ties", type=int, default=8,
                        help="tie-break seeds of the model per scenario, figures averaged (default 8)")
    args = parser.parse_args()
    if args.ties < 1:
        print(f"error: --ties must be at least 1, got {args.ties}", file=sys.stderr)
        return 2
    try:
        seeds = parse_seeds(args.seeds)
        types = live_types(args.dir / "catalog.csv")
    except (ValueError, OSError) as exc:
        print(f"error: --seeds or --dir: {exc}", file=sys.stderr)
        return 2
    means: dict[str, dict[str, float]] = {arm: collections.defaultdict(float) for arm in ("model", "real")}
    for seed in seeds:
        try:
            pods = load_timed_pods(args.dir / f"scenario{seed}.csv", 1.0)
            with open(args.dir / f"seed{seed}-karpenter.csv", newline="") as fh:
                real: Events = [tuple(row) for row in list(csv.reader(fh))[1:]]
        except (ValueError, OSError) as exc:
            print(f"error: seed {seed} in {args.dir}: {exc}", file=sys.stderr)
            return 2
        if args.at is not None:
            print(json.dumps(model_at(real, pods, types, seed, args.max_gpus, args.at)))
            continue
        if args.decisions:
            print(json.dumps({"seed": seed, **decisions(real, pods, types, seed, args.max_gpus)}))
            continue
        arms = {"model": model_counts(pods, types, seed, args), "real": counts(real, types)}
        for arm, figures in arms.items():
            for key in ("gpu_node_hours", "cost", "evictions"):
                means[arm][key] += float(figures[key]) / len(seeds)  # type: ignore[arg-type]
        print(json.dumps({"seed": seed, "evicted_work": args.evicted_work, **arms}))
    if args.at is not None or args.decisions:
        return 0
    ratio = {k: round(means["model"][k] / means["real"][k] - 1, 3) for k in means["model"] if means["real"][k]}
    print(json.dumps({"mean": {arm: {k: round(v, 3) for k, v in c.items()} for arm, c in means.items()},
                      "model_against_real": ratio}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
