"""GPU capacity against the real Karpenter on the loopback cluster (issue 40): kubeon with Karpenter
against Karpenter alone, on the same seeded scenario.

    nice -n 5 python3 bench/capacity_live.py --minutes 30 --seed 0 --events /tmp/live --scenario /tmp/live.csv

The scenario: workloads drawn (seeded) from the openb default trace's GPU pods, with their GPU counts,
CPU and memory (a pod with a GPU share asks for one whole GPU: neither arm shares GPUs here, and the
trace names no GPU model, so none is asked for), each of 1 to 4 replicas. Arrivals fill
`--minutes`: a burst (a quarter of the workloads in the first tenth), a steady part (half, to 60%) and
a tail (the rest, to 80%); each runs a duration drawn from the trace's, scaled to the run (10% to 50% of
it). KWOK finishes a Job's pod as soon as it runs (its pod-complete stage has no delay), so a Job
could not hold a GPU for a duration: each replica is a Deployment of its own (`w003-1`: workload w003's
second replica) that the bench deletes once its pod has been bound for the workload's duration (an eviction
starts that count again). Replicas run apart, as the simulator runs the scenario's rows: one Deployment
of several replicas, deleted when all had run, would be a gang that holds the GPUs of its bound replicas
while the others wait, and under a GPU limit below demand such gangs deadlock.

Time scale: a run of M minutes stands for 10 M minutes of a real day (the openb trace compressed to a
working day), so the 180 s a cloud takes to provision a GPU node (`simulate --capacity`'s default
--delay) becomes the KWOKNodeClass nodeRegistrationDelay 18 s, and the kubeon policy's
consolidation rules (the simulator's tuned ones, simulator/capacity_kubeon.py RULES: 2 h underused,
24 h minimum pod age, 4 nodes at once; 1 m empty, which the simulator's 0 s would make a race with the
pods' own binding) shrink the same way. The JSON's `delay` is that
registration delay: the `--delay` of `simulate --capacity --compress 1` on the `--scenario` file.

Arms, each on a fresh cluster: `karpenter` (a NodePool over the catalog, WhenEmptyOrUnderutilized,
consolidateAfter 0s, the default scheduler, no kubeon) and `kubeon` (the chart's webhook, extender,
second scheduler and controller, the controller reading the same catalog, with a capacity policy in
Automatic that declares its own NodePool, `wholeGpus: Optimizer`: the controller launches the nodes by
price and Karpenter, its NodePool's GPU limit 0, launches none itself). Output: one JSON line per arm
(bench/capacity_live_record.py says how each figure is read back) and one for the simulator's karpenter
and kubeon strategies on the same scenario (calibration), run with `--evicted-work restart` as the
replicas here restart.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("PYTHONWARNINGS", "ignore")

from bench.capacity_live_record import KARPENTER, Recorder
from gpupolicy.capacity.instances import InstanceType, load_instances
from simulator.capacity_baselines import KARPENTER_EXPIRE_AFTER, KarpenterOptions
from simulator.capacity_compare import compare
from simulator.capacity_kubeon import RULES
from simulator.capacity_trace import load_timed_pods
from tests.cluster.cluster import Cluster
from tests.cluster.karpenter import (
    BATCH_IDLE_SECONDS,
    BATCH_MAX_SECONDS,
    INSTANCES,
    KWOK_RESERVED_CPU_MILLI,
    KWOK_RESERVED_MEMORY_MIB,
    node_class_ref,
)
from tests.cluster.loops import read_items
from tests.cluster.objects import make_deployment

REPO = Path(__file__).resolve().parents[1]
PODS_CSV = REPO / "vendor" / "openb" / "openb_pod_list_default.csv"
ARMS = ("karpenter", "kubeon")
REAL_DELAY = 180.0  # seconds to provision a GPU node in a real cloud (simulate --capacity's default)
DAY_FACTOR = 10.0  # a run of M minutes stands for 10 M minutes
WINDOW = 3.0  # a run of M minutes ends by 3 M minutes: what is not placed by then never ran in full (drive)
TOLERATE_GPU = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
NAMESPACE = "live"
# The simulator as the live cluster runs (its `simulated` line, bench/capacity_calibrate.py): kube-scheduler
# binds and Karpenter's provisioner closes its batches within a second here, so the simulator loops every
# second, not every 10 s (a 10 s loop launches up to a loop late and batches pods a real pass splits);
# Karpenter's batch windows and expireAfter are the live ones
LIVE_LOOP = 1.0
LIVE_KARPENTER = KarpenterOptions(expire_after=KARPENTER_EXPIRE_AFTER, batch_idle=BATCH_IDLE_SECONDS,
                                  batch_max=BATCH_MAX_SECONDS)


@dataclass(frozen=True)
class Workload:
    name: str
    replicas: int
    gpus: int
    cpu_milli: int
    memory_mib: int
    arrival: float  # seconds from the start of the run
    duration: float


def scenario(seed: int, minutes: float, count: int, catalog: Path) -> list[Workload]:
    """`count` workloads of the trace's GPU pod shapes that fit some instance type of `catalog`."""
    rng = np.random.default_rng(seed)
    types = load_instances(catalog)
    with open(PODS_CSV, newline="") as fh:
        trace = list(csv.DictReader(fh))
    rows = [r for r in trace if int(r["num_gpu"]) > 0
            and any(t.gpus >= int(r["num_gpu"]) and t.cpu_milli >= int(r["cpu_milli"])
                    and t.memory_mib >= int(r["memory_mib"]) for t in types)]
    span = minutes * 60
    runs = np.array([max(1.0, float(r["deletion_time"]) - float(r["creation_time"])) for r in rows])
    scale = 0.3 * span / float(np.median(runs))  # the trace's median run becomes 30% of the run
    burst, steady = count // 4, count // 2
    arrivals = np.sort(np.concatenate([rng.uniform(0, 0.1 * span, burst), rng.uniform(0.1 * span, 0.6 * span, steady),
                                       rng.uniform(0.6 * span, 0.8 * span, count - burst - steady)]))
    out = []
    for i, at in enumerate(arrivals):
        r = rows[int(rng.integers(len(rows)))]
        run = float(np.clip(runs[rows.index(r)] * scale, 0.1 * span, 0.5 * span))
        out.append(Workload(f"w{i:03d}", int(rng.choice([1, 1, 1, 2, 4])), int(r["num_gpu"]), int(r["cpu_milli"]),
                            int(r["memory_mib"]), round(float(at), 1), round(run, 1)))
    return out


def independent(workloads: list[Workload]) -> list[Workload]:
    """Each replica as a workload of its own (`<workload>-<k>`, one replica), arriving and running as its workload."""
    return [replace(w, name=f"{w.name}-{k}", replicas=1) for w in workloads for k in range(w.replicas)]


def write_scenario(path: Path, workloads: list[Workload]) -> None:
    """The scenario as an openb pod list for `simulate --capacity --compress 1`: a row per replica, named as its
    Deployment, whole GPUs."""
    with open(path, "w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(["name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec", "qos", "pod_phase",
                      "creation_time", "deletion_time", "scheduled_time"])
        for w in independent(workloads):
            out.writerow([w.name, w.cpu_milli, w.memory_mib, w.gpus, 1000, "", "LS", "Running",
                          w.arrival, round(w.arrival + w.duration, 1), w.arrival])


def seconds(x: float) -> str:
    return f"{max(1, round(x))}s"


def karpenter_pool(minutes: float) -> dict:
    return {"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "gpu"}, "spec": {
        "template": {"spec": {"nodeClassRef": node_class_ref(), "taints": [
            {"key": "nvidia.com/gpu", "effect": "NoSchedule"}], "requirements": [
            {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]}]}},
        "disruption": {"consolidationPolicy": "WhenEmptyOrUnderutilized", "consolidateAfter": "0s"}}}


def capacity_policy(minutes: float, max_gpus: int) -> dict:
    """The simulator's kubeon rules (simulator/capacity_kubeon.py RULES, tuned there), on the run's time scale."""
    k = 1 / DAY_FACTOR  # real seconds -> run seconds
    return {"apiVersion": "gpu.kubeon.io/v1alpha1", "kind": "GpuPolicy", "metadata": {"name": "gpu-capacity"},
            "spec": {"mode": "Automatic", "selector": {"namespaces": [NAMESPACE]}, "capacity": {
                "nodePool": "gpu", "nodeClassRef": node_class_ref(), "maxGpus": max_gpus, "wholeGpus": "Optimizer",
                "consolidation": {"underusedBelowPercent": RULES.underused_below_percent,
                                  "for": seconds(RULES.window_seconds * k),
                                  "maxDisruptedNodes": RULES.max_disrupted_nodes,
                                  "emptyFor": seconds(max(RULES.empty_grace_seconds, 60.0) * k),
                                  "drainTimeout": seconds(300 * k),
                                  "minPodAge": seconds(RULES.min_pod_age_seconds * k)}}}}


def start_arm(arm: str, root: Path, catalog: Path, minutes: float, max_gpus: int) -> Cluster:
    delay = seconds(REAL_DELAY / DAY_FACTOR)
    if arm == "karpenter":
        cluster = Cluster(root, karpenter=True, karpenter_instances=catalog, node_registration_delay=delay).start()
        cluster.ensure_namespace(NAMESPACE)
        pool = karpenter_pool(minutes)
        pool["spec"]["limits"] = {"nvidia.com/gpu": str(max_gpus)}
        cluster.create(pool)
        return cluster
    os.environ["KUBEON_GPU_INSTANCE_TYPES"] = str(catalog)  # the controller's catalog: what Karpenter sells
    cluster = Cluster(root, kubeon=True, karpenter=True, karpenter_instances=catalog, node_registration_delay=delay,
                      kubeon_sets=("prometheus.url=http://127.0.0.1:9",)).start()
    cluster.ensure_namespace(NAMESPACE)
    cluster.create(capacity_policy(minutes, max_gpus))
    return cluster


def deployment(w: Workload, arm: str) -> dict:
    scheduler = "default-scheduler" if arm == "karpenter" else None
    body = make_deployment(w.name, NAMESPACE, w.replicas, gpus=w.gpus, cpu=f"{w.cpu_milli}m",
                           memory=f"{w.memory_mib}Mi", tolerations=TOLERATE_GPU,
                           **({"scheduler_name": scheduler} if scheduler else {}))
    return body


def drive(cluster: Cluster, rec: Recorder, workloads: list[Workload], arm: str, minutes: float) -> None:
    """Create each workload at its arrival, delete it once its replicas have all run its duration, then wait
    (at most a third of the run) for the capacity to go; whatever is left is deleted and counted."""
    todo = list(workloads)
    live: dict[str, Workload] = {}
    since: dict[str, float] = {}
    # an eviction starts a workload's count again, so one evicted late runs past the scenario's end (the last
    # arrival at 80% plus the longest run, 50%): it has until three times the run, then it never ran in full
    end_by = rec.t0 + minutes * 60 * WINDOW + REAL_DELAY / DAY_FACTOR + 60
    while time.time() < end_by or (time.time() < end_by + max(120.0, minutes * 12) and not todo and not live):
        now = time.time() - rec.t0
        while todo and todo[0].arrival <= now:
            w = todo.pop(0)
            cluster.create(deployment(w, arm))
            live[w.name] = w
        rec.poll()
        for name, w in list(live.items()):
            pods = [p for p in rec.pods.values() if p.workload == name and p.gone is None]
            bound = [p.bound_seen for p in pods if p.bound_seen is not None]
            if len(bound) < w.replicas:
                since.pop(name, None)
                continue
            since[name] = max(since.get(name, 0.0), max(bound))  # a re-placed replica starts the count again
            if time.time() - since[name] >= w.duration:
                rec.ended[name] = time.time()
                cluster.apps.delete_namespaced_deployment(name, NAMESPACE, propagation_policy="Background")
                del live[name]
        if not todo and not live and not any(c.deleted is None for c in rec.claims.values()):
            break
        if time.time() >= end_by and (todo or live):
            break
        time.sleep(1.0)
    for name in live:  # never (fully) placed in time
        rec.ended[name] = time.time()
        cluster.apps.delete_namespaced_deployment(name, NAMESPACE, propagation_policy="Background")
    rec.poll()


def run_arm(arm: str, workloads: list[Workload], catalog: Path, minutes: float, max_gpus: int,
            events: str | None) -> dict:
    types = {t.name: (t.gpus, t.price_per_hour) for t in load_instances(catalog)}
    with tempfile.TemporaryDirectory(prefix=f"capacity-live-{arm}-") as tmp:
        cluster = start_arm(arm, Path(tmp), catalog, minutes, max_gpus)
        try:
            rec = Recorder(cluster.custom, cluster.core, NAMESPACE, types,
                           replicas={w.name: w.replicas for w in workloads})
            drive(cluster, rec, workloads, arm, minutes)
            figures = rec.figures()
            figures["nodeclaims_left"] = len(read_items(cluster.custom.list_cluster_custom_object(
                *KARPENTER, "nodeclaims", _preload_content=False)))
            if events:
                with open(f"{events}-{arm}.csv", "w", newline="") as fh:
                    out = csv.writer(fh)
                    out.writerow(["time", "event", "node", "instance_type", "pod", "gpus"])
                    out.writerows(rec.events())
                # Karpenter's own account of its decisions (KUBEON_KARPENTER_LOG_LEVEL=debug for its
                # candidates and abandoned commands), to read beside the events (bench/capacity_calibrate.py)
                shutil.copyfile(cluster.plane.children.get("karpenter").log, f"{events}-{arm}-karpenter.log")
        finally:
            cluster.stop()
    return {"arm": arm, **figures}


def gpu_hours_asked(workloads: list[Workload]) -> float:
    """The GPU-hours the scenario's replicas run, each for its workload's duration (the run's clock)."""
    return sum(w.replicas * w.gpus * w.duration for w in workloads) / 3600


def live_types(catalog: Path) -> list[InstanceType]:
    """The catalog as the live cluster's nodes offer it: CPU and memory less what the KWOK provider reserves
    (a pod asking a P100 x1's whole 8 CPUs fits none of them, and the real Karpenter buys none for it)."""
    return [replace(t, cpu_milli=t.cpu_milli - KWOK_RESERVED_CPU_MILLI,
                    memory_mib=t.memory_mib - KWOK_RESERVED_MEMORY_MIB) for t in load_instances(catalog)]


def simulated(scenario_csv: Path, catalog: Path, max_gpus: int, seed: int) -> dict:
    """The simulator on the same scenario as the live cluster runs it (`LIVE_LOOP`, `LIVE_KARPENTER`,
    `live_types`; kubeon with the live policy's rules, `RULES`), an evicted pod restarting its work as the
    live replicas do, Karpenter's expireAfter the
    live NodePool's default 720 h (never reached in a run this short, but its disruption cost orders
    candidates by the nodes' remaining life)."""
    pods = load_timed_pods(scenario_csv, 1.0)
    figures, _ = compare(pods, live_types(catalog), max_gpus=max_gpus, seed=seed, evicted_work="restart",
                         karpenter=LIVE_KARPENTER, loop=LIVE_LOOP, kubeon=RULES, delay=REAL_DELAY / DAY_FACTOR,
                         strategies=("karpenter", "kubeon"), workers=1)
    precise = ("gpu_node_hours", "node_hours", "cost")  # summary() keeps one decimal: too coarse for a short run
    return {"arm": "simulator", "evicted_work": "restart",
            "strategies": {n: {**f.summary(), **{k: round(getattr(f, k), 3) for k in precise}}
                           for n, f in figures.items()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=30.0, help="length of the scenario (default 30)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workloads", type=int, help="how many workloads (default 4 per minute)")
    parser.add_argument("--instances", default=str(INSTANCES), help="instance catalog CSV both arms buy from")
    parser.add_argument("--max-gpus", type=int, default=64, help="the NodePool's GPU limit (default 64)")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma list of {', '.join(ARMS)}")
    parser.add_argument("--events", metavar="PREFIX", help="write each arm's run to PREFIX-<arm>.csv")
    parser.add_argument("--scenario", metavar="FILE", help="write the scenario as an openb pod list")
    parser.add_argument("--parallel", action="store_true",
                        help="run the arms at the same time, each on its own cluster (CI: half the wall time; the "
                             "arms then share the machine's cores, so timings move, costs little)")
    args = parser.parse_args(argv)
    arms = [a for a in args.arms.split(",") if a]
    bad = [a for a in arms if a not in ARMS]
    if bad or not 1 <= args.minutes <= 600 or args.seed < 0 or args.max_gpus < 1 or not Path(args.instances).is_file():
        print(f"error: --arms from {', '.join(ARMS)}, --minutes 1..600, --seed >= 0, --max-gpus >= 1 and an "
              f"existing --instances file (got arms {bad or arms}, {args.minutes}, {args.seed}, {args.max_gpus}, "
              f"{args.instances})", file=sys.stderr)
        return 2
    catalog = Path(args.instances)
    workloads = scenario(args.seed, args.minutes, args.workloads or math.ceil(4 * args.minutes), catalog)
    asked = gpu_hours_asked(workloads)
    if asked > args.max_gpus * WINDOW * args.minutes / 60:
        # demand grows with the square of --minutes (workloads and their durations both scale with it), the
        # limit's GPU-hours only linearly: a scenario the limit cannot serve would leave pods unplaced in both
        # arms by construction, after 3 M minutes of machine time
        print(f"error: --max-gpus {args.max_gpus}: the scenario (--minutes {args.minutes:g}, --seed {args.seed}) "
              f"asks {asked:.1f} GPU-hours, more than {args.max_gpus} GPUs hold in the run's {WINDOW * args.minutes:g} "
              f"minutes ({args.max_gpus * WINDOW * args.minutes / 60:.1f}); use --max-gpus "
              f"{math.ceil(asked * 60 / (WINDOW * args.minutes))} or more", file=sys.stderr)
        return 2
    scenario_csv = Path(args.scenario) if args.scenario else Path(tempfile.mkstemp(suffix=".csv")[1])
    write_scenario(scenario_csv, workloads)
    replicas = independent(workloads)
    common = {"minutes": args.minutes, "seed": args.seed, "workloads": len(workloads),
              "pods": sum(w.replicas for w in workloads), "gpus_asked": sum(w.replicas * w.gpus for w in workloads),
              "gpu_hours_asked": round(asked, 3), "max_gpus": args.max_gpus, "delay": REAL_DELAY / DAY_FACTOR,
              "real_delay": REAL_DELAY}
    def one(arm: str) -> dict:
        return {**common, **run_arm(arm, replicas, catalog, args.minutes, args.max_gpus, args.events)}

    if args.parallel:
        with ThreadPoolExecutor(max_workers=len(arms)) as pool:
            lines = list(pool.map(one, arms))
        for line in lines:
            print(json.dumps(line), flush=True)
    else:
        for arm in arms:
            print(json.dumps(one(arm)), flush=True)
    print(json.dumps({**common, **simulated(scenario_csv, catalog, args.max_gpus, args.seed)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
