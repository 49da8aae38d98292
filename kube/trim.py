"""What the watch caches keep of a Node or a bound Pod: the fields the core reads, nothing else.

A real Node is 5-20 KiB of JSON: `status.images` lists every image the
kubelet pulled, plus conditions, addresses, nodeInfo and managedFields. The
core reads a node's name, labels and allocatable resources
(`gpupolicy.cluster.node_from_object`, for admission) and its spec's taints
and unschedulable flag (`gpupolicy.packing.kubemodel.node_spec` and
`node_schedulable`, for packing). Kept whole, every gunicorn worker of the
webhook and the extender holds the whole cluster's status (15,000 nodes:
gigabytes against the chart's 256-512 MiB limits), and every full garbage
collection walks it (207 ms at 15,000 of the benchmark's 1.1 KiB nodes,
docs/benchmarks/history/extender.md). client-go's informers drop such fields the same way
(SetTransform). The extender's cache of bound pods is the same story, ten
pods per node: of a pod the core reads its name, namespace, annotations
(gpu.kubeon.io/ ones; all are kept but kubectl's last-applied copy), the
containers' resources, the scheduling fields of its spec (nodeName,
nodeSelector, affinity) and its phase
(`gpupolicy.packing.kubemodel.demand_from_pod`, the cache's `on_pod`); env,
volumes, probes, managedFields, kubectl's last-applied copy and the status
beyond the phase go. tests/extender/test_trim.py checks that the core reads
the same from a trimmed object as from the whole one.
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


_POD_METADATA = ("name", "namespace", "uid", "resourceVersion", "labels", "annotations")
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"  # the whole manifest again
_CONTAINER_LISTS = ("containers", "initContainers")
_CONTAINER_FIELDS = ("name", "resources", "restartPolicy")
_SPEC_DROPPED = ("volumes", "ephemeralContainers")


def pod_fields(obj: JsonObject) -> JsonObject:
    """The Pod as the extender's cache keeps it (module doc). A value of the wrong type is kept as it came
    (the core names the field)."""
    metadata, spec, status = obj.get("metadata"), obj.get("spec"), obj.get("status")
    if not isinstance(metadata, Mapping) or not isinstance(spec, Mapping):
        return obj
    kept: JsonObject = {k: obj[k] for k in ("kind", "apiVersion") if k in obj}
    meta = kept["metadata"] = {k: metadata[k] for k in _POD_METADATA if k in metadata}
    annotations = meta.get("annotations")
    if isinstance(annotations, Mapping) and LAST_APPLIED in annotations:
        meta["annotations"] = {k: v for k, v in annotations.items() if k != LAST_APPLIED}
    kept["spec"] = {k: ([_container(c) for c in v] if k in _CONTAINER_LISTS and isinstance(v, list) else v)
                    for k, v in spec.items() if k not in _SPEC_DROPPED}
    if isinstance(status, Mapping):
        kept["status"] = {"phase": status["phase"]} if "phase" in status else {}
    elif "status" in obj:
        kept["status"] = status
    return kept


def _container(container: Any) -> Any:
    if not isinstance(container, Mapping):
        return container
    return {k: container[k] for k in _CONTAINER_FIELDS if k in container}


def claim_fields(obj: JsonObject) -> JsonObject:
    """A ResourceClaim as the extender's cache keeps it: its name and its allocation (what the model reads:
    `gpupolicy.packing.dradevices.allocation`), not its spec or reservedFor list."""
    metadata, status = obj.get("metadata"), obj.get("status")
    if not isinstance(metadata, Mapping):
        return obj
    kept: JsonObject = {k: obj[k] for k in ("kind", "apiVersion") if k in obj}
    kept["metadata"] = {k: metadata[k] for k in ("name", "namespace", "uid", "resourceVersion") if k in metadata}
    if isinstance(status, Mapping) and "allocation" in status:
        kept["status"] = {"allocation": status["allocation"]}
    return kept
