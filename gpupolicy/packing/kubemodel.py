"""Kubernetes Node and Pod objects (plain dicts, as the API returns them) to the packing model. Pure.

The extender calls these with what its reflector cached; nothing here talks
to the API. What is modelled (docs/designs/packing.md, "Live nodes"):
- Whole GPUs (`nvidia.com/gpu`): the device plugin picks the devices, so
  only the count of free GPUs is real. The model puts that count on the
  first GPU slots at 1000 milli and 0 on the rest.
- Time-sliced replicas (`nvidia.com/gpu.shared`) and MIG devices
  (`nvidia.com/mig-<profile>`): node-level free counts, fitted by count.
- GPU product from the GFD label `nvidia.com/gpu.product` (normalised, so
  `-SHARED` and `-MIG-...` suffixes do not split a model), per-GPU memory
  from `nvidia.com/gpu.memory` (MiB).
- Nodes cordoned (`spec.unschedulable`) or marked for consolidation
  (label or taint `gpu.kubeon.io/draining`) are kept but unschedulable.
- Pods count against their node unless they finished (Succeeded/Failed).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any

import numpy as np

from gpupolicy.catalog import (
    GPU_RESOURCE,
    MIG_RESOURCE_PREFIX,
    PRODUCT_LABEL,
    SHARED_GPU_RESOURCE,
    normalise_product_label,
)
from gpupolicy.matching import pod_allowed_products as allowed_products
from gpupolicy.packing.nodemodel import MILLI, NodeSpec, NodeState, PodDemand
from gpupolicy.quantity import QuantityError, parse_bytes_mib, parse_quantity, shown

DRAINING_KEY = "gpu.kubeon.io/draining"
GPU_MEMORY_ANNOTATION = "gpu.kubeon.io/gpu-memory"
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"
FINISHED_PHASES = ("Succeeded", "Failed")

Obj = Mapping[str, Any]


class ObjectError(ValueError):
    """A Node or Pod dict the model cannot use; the message names the field."""


def _get(obj: Obj, *path: str) -> Any:
    cur: Any = obj
    for key in path:
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(key)
    return cur


def _quantity(value: Any, field: str) -> Decimal:
    try:
        return parse_quantity(value)
    except (QuantityError, ValueError, TypeError) as exc:
        raise ObjectError(f"{field}: not a quantity: {shown(value)}") from exc


def _milli(value: Any, field: str) -> int:
    return int(_quantity(value, field) * 1000)


def _mib(value: Any, field: str) -> int:
    try:
        return int(parse_bytes_mib(value))
    except (QuantityError, ValueError, TypeError) as exc:
        raise ObjectError(f"{field}: not a memory quantity: {shown(value)}") from exc


def _count(value: Any, field: str) -> int:
    return int(_quantity(value, field))


def _container_requests(container: Obj, where: str) -> dict[str, Any]:
    """Requests, with limits standing in for extended resources that only set limits."""
    resources = container.get("resources") or {}
    requests = dict(resources.get("requests") or {})
    for name, value in (resources.get("limits") or {}).items():
        if name not in requests and (name.startswith("nvidia.com/") or name in ("cpu", "memory")):
            requests[name] = value
    return requests


def pod_requests(pod: Obj) -> dict[str, Decimal]:
    """Effective requests: sum over containers, at least the largest init container (per resource)."""
    spec = pod.get("spec") or {}
    total: dict[str, Decimal] = {}
    for i, c in enumerate(spec.get("containers") or []):
        for name, value in _container_requests(c, f"spec.containers[{i}]").items():
            total[name] = total.get(name, Decimal(0)) + _quantity(value, f"spec.containers[{i}].resources.{name}")
    for i, c in enumerate(spec.get("initContainers") or []):
        for name, value in _container_requests(c, f"spec.initContainers[{i}]").items():
            q = _quantity(value, f"spec.initContainers[{i}].resources.{name}")
            total[name] = max(total.get(name, Decimal(0)), q)
    return total


def demand_from_pod(pod: Obj) -> PodDemand:
    """A Kubernetes Pod dict as a PodDemand. Raises ObjectError naming the bad field."""
    if not isinstance(pod, Mapping) or not isinstance(pod.get("spec"), Mapping):
        raise ObjectError("pod: missing spec")
    req = pod_requests(pod)
    gpus = int(req.get(GPU_RESOURCE, 0))
    mig = {name: int(v) for name, v in req.items() if name.startswith(MIG_RESOURCE_PREFIX) and v > 0}
    annotations = _get(pod, "metadata", "annotations") or {}
    gpu_mem = annotations.get(GPU_MEMORY_ANNOTATION)
    meta = pod.get("metadata") or {}
    try:
        return PodDemand(
            cpu_milli=int(req.get("cpu", Decimal(0)) * 1000),
            memory_mib=int(req.get("memory", Decimal(0)) / (1024 * 1024)),
            num_gpu=gpus,
            gpu_milli=MILLI if gpus else 0,
            allowed_models=allowed_products(pod),
            mig=mig,
            shared=int(req.get(SHARED_GPU_RESOURCE, 0)),
            gpu_memory_mib=_mib(gpu_mem, f"metadata.annotations.{GPU_MEMORY_ANNOTATION}") if gpu_mem else 0,
            name=f"{meta.get('namespace', '')}/{meta.get('name', '')}",
        )
    except ValueError as exc:
        raise ObjectError(f"pod: {exc}") from exc


def node_spec(node: Obj) -> NodeSpec:
    """A Kubernetes Node dict's allocatable capacity as a NodeSpec."""
    name = _get(node, "metadata", "name")
    if not name:
        raise ObjectError("node: missing metadata.name")
    alloc = _get(node, "status", "allocatable") or {}
    labels = _get(node, "metadata", "labels") or {}
    mig = {k: _count(v, f"status.allocatable.{k}") for k, v in alloc.items() if k.startswith(MIG_RESOURCE_PREFIX)}
    gpu_mem = labels.get(GPU_MEMORY_LABEL)
    return NodeSpec(
        name=str(name),
        cpu_milli=_milli(alloc.get("cpu", 0), "status.allocatable.cpu"),
        memory_mib=_mib(alloc.get("memory", 0), "status.allocatable.memory"),
        gpu_count=_count(alloc.get(GPU_RESOURCE, 0), f"status.allocatable.{GPU_RESOURCE}"),
        model=normalise_product_label(labels.get(PRODUCT_LABEL, "")),
        gpu_memory_mib=int(gpu_mem) if gpu_mem and str(gpu_mem).isdigit() else 0,
        mig={k: v for k, v in mig.items() if v > 0},
        shared=_count(alloc.get(SHARED_GPU_RESOURCE, 0), f"status.allocatable.{SHARED_GPU_RESOURCE}"),
    )


def node_schedulable(node: Obj) -> bool:
    """False when cordoned or marked for consolidation (label or taint gpu.kubeon.io/draining)."""
    if _get(node, "spec", "unschedulable"):
        return False
    labels = _get(node, "metadata", "labels") or {}
    if str(labels.get(DRAINING_KEY, "")).lower() in ("true", "1", "yes"):
        return False
    return not any((t or {}).get("key") == DRAINING_KEY for t in _get(node, "spec", "taints") or [])


def occupy(state: NodeState, node: int, demand: PodDemand) -> None:
    """Count a running pod against its node, clamping at zero instead of failing.

    The API is the truth: a node may already be over-committed (e.g. capacity
    shrank under running pods), and the model must still load. Whole GPUs
    come off the first free slots.
    """
    state.cpu_free[node] = max(0, state.cpu_free[node] - demand.cpu_milli)
    state.mem_free[node] = max(0, state.mem_free[node] - demand.memory_mib)
    if demand.needs_gpu:
        row = state.gpu_free[node]
        if demand.is_sharing:
            fits = np.flatnonzero(row >= demand.gpu_milli)
            if fits.size:
                row[fits[0]] -= demand.gpu_milli
        else:
            for g in np.flatnonzero(row == MILLI)[: demand.num_gpu]:
                row[g] = 0
    for resource, count in demand.mig.items():
        if resource in state.mig_resources:
            r = state.mig_resources.index(resource)
            state.mig_free[node, r] = max(0, state.mig_free[node, r] - count)
    state.shared_free[node] = max(0, state.shared_free[node] - demand.shared)
    state.refresh(node)


def state_from_kubernetes(nodes: Iterable[Obj], pods: Iterable[Obj]) -> NodeState:
    """A NodeState from Node dicts and the Pod dicts bound to them (others are ignored). Pure."""
    node_list = list(nodes)
    state = NodeState.build(node_spec(n) for n in node_list)
    for i, n in enumerate(node_list):
        state.schedulable[i] = node_schedulable(n)
    for pod in pods:
        node_name = _get(pod, "spec", "nodeName")
        if not node_name or node_name not in state.index:
            continue
        if _get(pod, "status", "phase") in FINISHED_PHASES:
            continue
        occupy(state, state.index[node_name], demand_from_pod(pod))
    return state
