"""`python -m tests.cluster demo autoscaling [--plot FILE.png]`: the GPU autoscaling chain
(tests/cluster/chain.py) on a fresh loopback cluster, its timeline printed as it runs; the last line
is one JSON object `{"steps": [{"name", "seconds"}...], "final": {...}}`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.cluster.chain import CHAIN_CLUSTER, Chain
from tests.cluster.cluster import Cluster
from tests.promharness import DcgmExporter, PrometheusServer

NAMESPACE = "demo"
COLUMNS = ("t", "replicas", "pending", "ready", "gpu_nodes", "gpus_allocated", "cost")


def autoscaling(plot: Path | None = None) -> int:
    exporter = DcgmExporter()
    with Cluster(**CHAIN_CLUSTER) as cluster:
        cluster.ensure_namespace(NAMESPACE)
        prometheus = PrometheusServer(exporter)
        chain = Chain(cluster, NAMESPACE, exporter, prometheus, log=print)
        try:
            result = chain.run()
        finally:
            chain.close()
            prometheus.stop()
            exporter.stop()
    print(" ".join(f"{c:>14}" for c in COLUMNS))
    for row in result["timeline"]:
        print(" ".join(f"{row[c]:>14}" for c in COLUMNS))
    for actor, writes in result["writes"].items():
        print(f"scale writes by {actor}: {len(writes)} at {[w['at'] for w in writes]}")
    if plot:
        draw(result, plot)
        print(f"plot written to {plot}")
    print(json.dumps({"steps": result["steps"], "final": result["final"]}))
    return 0


def draw(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["timeline"]
    t = [r["t"] for r in rows]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    for key in ("replicas", "pending", "gpu_nodes", "gpus_allocated"):
        top.step(t, [r[key] for r in rows], where="post", label=key)
    for name, at in result["step_times"]:
        top.axvline(at, color="grey", lw=0.5)
        top.text(at, top.get_ylim()[1] * 0.95, name, rotation=90, fontsize=6, va="top")
    top.set_ylabel("count")
    top.legend(loc="upper right", fontsize=7)
    bottom.plot(t, [r["cost"] for r in rows], color="black")
    bottom.set_ylabel("cost so far ($)")
    bottom.set_xlabel("seconds")
    fig.suptitle("GPU autoscaling chain: DCGM -> KEDA -> HPA -> Karpenter -> scale to zero")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
