"""The extender's node model at a cluster's size under churn, without a cluster: CPU per scheduling request,
and what a node joining costs the next request.

    python bench/extender_churn.py [--nodes 5000] [--pods 50000] [--requests 300] [--join-every 50]

The nodes and pods are bench/cluster_scale.py's (`Workload`), fed to the extender's own model
(extender.cache.ClusterCache) as its watches deliver them; the requests go to its own service
(extender.service.ExtenderService: /filter over every node, then the prioritize decision for the names
that passed), as kube-scheduler asks for a GPU pod. Between two requests one GPU pod ends and the pod
asked about is bound where the extender put it (bench/cluster_scale.py's churn); every `--join-every`
requests a node joins (Karpenter, a node group). Run twice: as shipped, and with a rebuilt model's rows
occupied again instead of copied (`NodeState.take_rows` switched off by a monkeypatch; the product code
untouched), the limit the copy is measured against. Prints per arm the request CPU p50 / p99 and the
mean of the requests right after a join; the last line is one JSON object. Bad arguments: exit 2.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.cluster_replay import NAMESPACE, node_object  # noqa: E402
from bench.cluster_scale import Workload  # noqa: E402
from extender.cache import ClusterCache  # noqa: E402
from extender.service import ExtenderService  # noqa: E402
from gpupolicy.packing.nodemodel import NodeState  # noqa: E402
from kube.views import StaticView  # noqa: E402


def is_gpu(pod: dict[str, Any]) -> bool:
    return any(k.startswith("nvidia.com/") for c in pod["spec"]["containers"]
               for k in (c.get("resources", {}).get("requests") or {}))


def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Workload(args)
    clock = [0.0]
    cache = ClusterCache(clock=lambda: clock[0])
    for node in work.node_objects():
        cache.on_node("ADDED", node)
    gpu_pods = []
    for i, (pod, node_name) in enumerate(work.place()):
        pod["metadata"].update(uid=f"pod-{i}", resourceVersion=str(i + 1), namespace=NAMESPACE)
        pod["spec"]["nodeName"] = node_name
        pod["status"] = {"phase": "Running"}
        cache.on_pod("ADDED", pod)
        if is_gpu(pod):
            gpu_pods.append(pod)
    service = ExtenderService(cache, StaticView())
    names = list(work.trace.names)
    rng = random.Random(args.seed)
    cpu, after_join = [], []
    for step in range(args.requests + 1):
        clock[0] += 0.2  # 5 pods a second
        joined = step % args.join_every == args.join_every // 2
        if joined:
            spec = work.trace.nodes[step % len(work.trace.nodes)]
            cache.on_node("ADDED", node_object(spec, f"joined-{step}", work.trace.replicas))
            names = [*names, f"joined-{step}"]  # a new list: kube-scheduler sends a new body
        ended = gpu_pods.pop(rng.randrange(len(gpu_pods)))
        cache.on_pod("DELETED", ended)
        pod = copy.deepcopy(ended)
        pod["metadata"].update(name=f"churn-{step}", uid=f"churn-{step}", resourceVersion=f"c{step}")
        del pod["spec"]["nodeName"], pod["status"]
        started = time.thread_time()
        outcome = service.filter(pod, names)
        passed = list(outcome.passed)
        chosen = passed[0] if len(passed) == 1 else None
        if len(passed) > 1:
            service.ahead(outcome)
            chosen = service.prioritize(pod, passed).chosen
        if step:  # the first request builds the model from nothing
            (after_join if joined else cpu).append(time.thread_time() - started)
        if chosen:
            pod["spec"]["nodeName"], pod["status"] = chosen, {"phase": "Running"}
            cache.on_pod("ADDED", pod)
            gpu_pods.append(pod)
    cpu.sort()
    return {"p50_ms": round(1000 * statistics.median(cpu), 2),
            "p99_ms": round(1000 * cpu[int(0.99 * (len(cpu) - 1))], 2),
            "after_join_ms": round(1000 * statistics.mean(after_join), 2), "joins": len(after_join),
            "rebuilds": cache.rebuilds, "rows_copied": cache.rows_copied}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=50000)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--join-every", type=int, default=50)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args(argv)
    for flag, value in (("--nodes", args.nodes), ("--pods", args.pods), ("--requests", args.requests),
                        ("--join-every", args.join_every - 1)):
        if value <= 0:
            print(f"error: {flag} is too small", file=sys.stderr)
            return 2
    args.gpu_fill, args.scheduled_share = 0.8, 0.0
    shipped = run(args)
    take_rows = NodeState.take_rows
    NodeState.take_rows = lambda self, other, names: False  # type: ignore[method-assign,assignment]
    try:
        occupied = run(args)
    finally:
        NodeState.take_rows = take_rows  # type: ignore[method-assign]
    for arm, row in (("rows copied (shipped)", shipped), ("rows occupied again", occupied)):
        print(f"{arm}: request CPU p50 {row['p50_ms']} ms, p99 {row['p99_ms']} ms; after a node joined "
              f"{row['after_join_ms']} ms ({row['joins']} joins)", file=sys.stderr)
    print(json.dumps({"nodes": args.nodes, "pods": args.pods, "shipped": shipped, "rows_occupied_again": occupied,
                      "after_join_ratio": round(shipped["after_join_ms"] / occupied["after_join_ms"], 3)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
