"""What the watch caches keep of a Node: the fields the core reads, nothing else.

A real Node is 5-20 KiB of JSON: `status.images` lists every image the
kubelet pulled, plus conditions, addresses, nodeInfo and managedFields. The
core reads a node's name, labels and allocatable resources
(`gpupolicy.cluster.node_from_object`, for admission) and its spec's taints
and unschedulable flag (`gpupolicy.packing.kubemodel.node_spec` and
`node_schedulable`, for packing). Kept whole, every gunicorn worker of the
webhook and the extender holds the whole cluster's status (15,000 nodes:
gigabytes against the chart's 256-512 MiB limits), and every full garbage
collection walks it (207 ms at 15,000 of the benchmark's 1.1 KiB nodes,
docs/benchmarks.md). client-go's informers drop such fields the same way
(SetTransform). tests/extender/test_trim.py checks that the core reads the
same from a trimmed node as from the whole one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

JsonObject = dict[str, Any]
_METADATA = ("name", "uid", "resourceVersion", "labels")  # the key and the relist's comparison need name, rv


def node_fields(obj: JsonObject) -> JsonObject:
    """The Node as the caches keep it: kind, apiVersion, metadata (name, uid, resourceVersion, labels),
    spec, status.allocatable. A value of the wrong type is kept as it came (the core names the field)."""
    metadata, status = obj.get("metadata"), obj.get("status")
    if not isinstance(metadata, Mapping):
        return obj
    kept: JsonObject = {k: obj[k] for k in ("kind", "apiVersion", "spec") if k in obj}
    kept["metadata"] = {k: metadata[k] for k in _METADATA if k in metadata}
    if isinstance(status, Mapping):
        kept["status"] = {"allocatable": status["allocatable"]} if "allocatable" in status else {}
    elif "status" in obj:
        kept["status"] = status
    return kept
