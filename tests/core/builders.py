"""Builders for pods, workloads, nodes, policies and views used by the core and webhook tests."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch

from gpupolicy.catalog import DEFAULT_CATALOG
from gpupolicy.cluster import ClusterView, NodeInfo
from gpupolicy.model import GpuPolicy, Mode, parse_policy


def make_pod(
    gpus: int | str | None = 1,
    *,
    name: str = "p",
    namespace: str = "ml",
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    resource: str = "nvidia.com/gpu",
    containers: int = 1,
    requests: bool = False,
    owner: dict[str, Any] | None = None,
    tolerations: list[dict[str, Any]] | None = None,
    scheduler: str | None = None,
    init_gpus: int | None = None,
) -> dict[str, Any]:
    """A Pod as the API server sends it in an AdmissionReview (strings for quantities)."""
    spec: dict[str, Any] = {"containers": []}
    for i in range(containers):
        resources: dict[str, Any] = {"limits": {"cpu": "1"}}
        if gpus is not None:
            resources["limits"][resource] = str(gpus)
            if requests:
                resources["requests"] = {resource: str(gpus), "cpu": "1"}
        spec["containers"].append({"name": f"c{i}", "image": "busybox", "resources": resources})
    if init_gpus is not None:
        spec["initContainers"] = [{"name": "init", "image": "busybox",
                                   "resources": {"limits": {"nvidia.com/gpu": str(init_gpus)}}}]
    if tolerations is not None:
        spec["tolerations"] = tolerations
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if labels:
        metadata["labels"] = dict(labels)
    if annotations:
        metadata["annotations"] = dict(annotations)
    if owner:
        metadata["ownerReferences"] = [owner]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def owner_ref(kind: str, name: str, api_version: str = "apps/v1") -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": kind, "name": name, "uid": "u-" + name, "controller": True,
            "blockOwnerDeletion": True}


def make_policy(
    name: str = "share",
    *,
    mode: str | None = "Automatic",
    priority: int = 0,
    selector: dict[str, Any] | None = None,
    approvals: list[str] | None = None,
    tolerations: list[dict[str, Any]] | None = None,
    scheduler: str | None = None,
    **body: Any,
) -> GpuPolicy:
    """A GpuPolicy; the body is one keyword (`sharing={...}`, `guardrail={...}`); default MIG auto 8Gi."""
    spec: dict[str, Any] = {"priority": priority}
    if mode is not None:
        spec["mode"] = mode
    if selector is not None:
        spec["selector"] = selector
    if approvals is not None:
        spec["approvals"] = approvals
    if tolerations is not None:
        spec["tolerations"] = tolerations
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    spec.update(body or {"sharing": {"strategy": "MIG", "gpuMemory": "8Gi"}})
    return parse_policy({"apiVersion": "gpu.kubeon.io/v1alpha1", "kind": "GpuPolicy",
                         "metadata": {"name": name}, "spec": spec})


def slice_offers(product: str) -> dict[str, str]:
    """Allocatable of a cluster whose layout already offers every slice of `product` (and shares)."""
    known = DEFAULT_CATALOG.product(product)
    offers = {p.resource_name: "1" for p in known.profiles} if known else {}
    return {"nvidia.com/gpu": "8", "nvidia.com/gpu.shared": "8", **offers}


def make_node(name: str = "n1", product: str = "NVIDIA-A100-SXM4-80GB", *, offers_slices: bool = True,
              **labels: str) -> NodeInfo:
    """A GPU node; by default it offers every slice of its product, so sizing tests are not about the
    layout gate (ClusterView.offers); `offers_slices=False` is whole GPUs only."""
    allocatable = slice_offers(product) if offers_slices else {"nvidia.com/gpu": "8"}
    return NodeInfo(name, {"nvidia.com/gpu.product": product, **labels}, allocatable)


def make_view(*policies: GpuPolicy, nodes: tuple[NodeInfo, ...] = (), default_mode: Mode = Mode.RECOMMEND,
              namespaces: dict[str, dict[str, str]] | None = None, metrics: bool = True) -> ClusterView:
    """A view of a cluster with GPU metrics configured (`metrics=False`: no --prometheus-url)."""
    return ClusterView(policies=policies, nodes=nodes, default_mode=default_mode,
                       namespace_labels=namespaces or {}, metrics_configured=metrics)


def apply(obj: dict[str, Any], patch: list[dict[str, Any]]) -> dict[str, Any]:
    """Apply a JSON Patch with the jsonpatch library (an independent RFC 6902 implementation)."""
    return jsonpatch.apply_patch(copy.deepcopy(obj), patch)


def limits(obj: dict[str, Any], i: int = 0) -> dict[str, str]:
    return obj["spec"]["containers"][i]["resources"]["limits"]
