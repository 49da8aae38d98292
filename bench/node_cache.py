"""What a Node watch cache costs per gunicorn worker, whole nodes against trimmed ones (not a timed test).

Builds N nodes as tests/cluster/objects.py builds them (the openb node list, repeated)
plus what a kubelet adds to a real one (--images entries of status.images,
addresses, managedFields: real nodes are 5-20 KiB of JSON), parses them as
the watch does (JSON bytes -> dicts), and keeps them whole (the caches
before kube/trim.py) or as `kube.trim.node_fields` keeps them. Prints, for
each: the JSON size per node, the memory the kept dicts hold (tracemalloc),
and the time of a full garbage collection with them alive (the pause a
request meets when the collector walks the cache), best of 5.

    python bench/node_cache.py --nodes 15000 --images 40
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.extender_load import cluster_nodes  # noqa: E402
from kube.trim import node_fields  # noqa: E402


def with_kubelet_bulk(node: dict[str, Any], images: int) -> dict[str, Any]:
    name = node["metadata"]["name"]
    node["metadata"].update({"uid": f"uid-{name}", "resourceVersion": "1", "annotations": {
        "node.alpha.kubernetes.io/ttl": "0", "volumes.kubernetes.io/controller-managed-attach-detach": "true"},
        "managedFields": [{"manager": m, "operation": "Update", "apiVersion": "v1", "time": "2026-12-03T10:00:00Z",
                           "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {"f:conditions": {}}}}
                          for m in ("kubelet", "kube-controller-manager", "gpu-feature-discovery")]})
    node["status"]["images"] = [{"names": [f"registry.example/team/image-{i}@sha256:{i:064x}",
                                           f"registry.example/team/image-{i}:v{i}"], "sizeBytes": 10**9 + i}
                                for i in range(images)]
    node["status"]["addresses"] = [{"type": "InternalIP", "address": "10.0.0.1"}, {"type": "Hostname",
                                                                                    "address": name}]
    return node


def measure(raw: list[bytes], keep: Any) -> tuple[float, float]:
    """(MiB held by the kept objects, best full-collection seconds)."""
    gc.collect()
    tracemalloc.start()
    kept = [keep(json.loads(b)) for b in raw]
    held = tracemalloc.get_traced_memory()[0] / 2**20
    tracemalloc.stop()
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        gc.collect()
        best = min(best, time.perf_counter() - started)
    del kept
    return held, best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=15000)
    parser.add_argument("--images", type=int, default=40, help="status.images entries per node")
    args = parser.parse_args()
    raw = [json.dumps(with_kubelet_bulk(n, args.images)).encode() for n in cluster_nodes(args.nodes)]
    trimmed_size = sum(len(json.dumps(node_fields(json.loads(b)))) for b in raw) / len(raw)
    print(f"{args.nodes} nodes, {sum(map(len, raw)) / len(raw) / 1024:.1f} KiB of JSON each "
          f"({trimmed_size / 1024:.2f} KiB trimmed); memory held and a full collection's pause (best of 5)")
    whole = measure(raw, lambda obj: obj)
    trimmed = measure(raw, node_fields)
    for label, (mib, pause) in (("whole", whole), ("trimmed", trimmed)):
        print(f"  {label:8s} {mib:8.1f} MiB held, full collection {pause * 1000:7.1f} ms")
    print(f"  trimmed / whole: memory {trimmed[0] / whole[0]:.3f}, full collection {trimmed[1] / whole[1]:.3f}")


if __name__ == "__main__":
    main()
