"""The cluster summary the controller reports to the hub on every poll (docs/hub-api.md, `ClusterSummary`). Pure.

From what the controller already reads (GPU nodes as the layout planner sees
them, the pods, the instance catalog, DCGM samples where Prometheus is set,
the actions it applied) it says: GPUs by model and sharing layout, how many
are allocated and how many sit idle, pending GPU pods, the GPU nodes, what
they cost per hour, and what the actions applied since the last report save.
The hub stores the answer as it is; the console charts it.

Estimates, and why they are the ones we can stand behind:
- allocated GPUs: whole GPUs held by bound pods; a time-sliced GPU counts
  once its node's shares are held (ceil(shares held / replicas)); a MIG
  node counts the share of its slices held, rounded up, of its GPUs.
- idle GPUs: GPUs whose DCGM utilisation (`DCGM_FI_DEV_GPU_UTIL`, averaged
  over the last `IDLE_WINDOW`) is under `IDLE_BELOW_PERCENT`; None (not 0)
  without Prometheus, so nobody reads "no idle GPU" into "not measured".
- cost per hour: a node's instance type (`node.kubernetes.io/instance-type`)
  priced from the catalog; a node without one is priced at the cheapest
  per-GPU price of its GPU model; a node neither prices is counted in
  `unpricedNodes` and adds nothing.
- savings: each applied action's proposal carries the GPU-hours per month it
  frees (`estimatedGpuHoursPerMonth`: a scale to zero its parked GPUs, a
  right-sizing the share it saves, a consolidation the node's GPUs); at the
  cluster's mean price per GPU-hour, per hour that is
  gpu_hours / HOURS_PER_MONTH * price. It is counted once, when applied: a
  workload woken later, or a node removed after its pods were parked, is not
  subtracted or told apart (an estimate, said so wherever it is shown).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpupolicy.capacity.instances import InstanceType
from gpupolicy.capacity.layout import MIG, WHOLE, GpuNode
from gpupolicy.capacity.nodepool import INSTANCE_TYPE_LABEL
from gpupolicy.catalog import (
    GPU_REPLICAS_LABEL,
    GPU_RESOURCE,
    MIG_RESOURCE_PREFIX,
    PRODUCT_LABEL,
    SHARED_GPU_RESOURCE,
    normalise_product_label,
)
from gpupolicy.packing.kubemodel import ObjectError, pod_requests
from gpupolicy.scaling.rightsizing import HOURS_PER_MONTH  # the month the proposals' GPU-hours are counted in

SUMMARY_VERSION = 1
IDLE_BELOW_PERCENT = 5.0
IDLE_WINDOW = "10m"
# One sample per GPU: its mean utilisation over the window (dcgm-exporter labels: Hostname or hostname, gpu).
IDLE_QUERY = f"avg_over_time(DCGM_FI_DEV_GPU_UTIL[{IDLE_WINDOW}])"
UNKNOWN_MODEL = "unknown"
SHARING_STRATEGY_LABEL = "nvidia.com/gpu.sharing-strategy"  # GPU feature discovery's: none, time-slicing, mps


@dataclass(frozen=True)
class AppliedSaving:
    """One action applied since the last report, and the GPU-hours per month its proposal said it frees."""

    policy: str
    target: str
    gpu_hours_per_month: float


@dataclass(frozen=True)
class GpuSample:
    """One GPU's DCGM utilisation (percent) on a node."""

    node: str
    gpu: str
    percent: float


def sharing(node: GpuNode) -> tuple[str, int]:
    """The node's layout as shown (`whole GPUs`, `time-slicing 4 replicas`, `MIG all-1g.10gb`) and its time-sliced
    replicas per GPU: the layout its labels ask for, else what GPU feature discovery says it runs."""
    if node.layout.kind != WHOLE:
        return node.layout.describe(), node.layout.replicas
    replicas = _whole_number(node.labels.get(GPU_REPLICAS_LABEL))
    if node.labels.get(SHARING_STRATEGY_LABEL) == "time-slicing" and replicas > 1:
        return f"time-slicing {replicas} replicas", replicas
    return node.layout.describe(), 1


def _whole_number(text: str | None) -> int:
    try:
        return max(int(text or "1"), 1)
    except ValueError:
        return 1


def allocated_gpus(node: GpuNode) -> int:
    """GPUs of `node` that bound pods hold (see the module docstring for shared layouts)."""
    held = math.ceil(node.busy.get(GPU_RESOURCE, 0.0))
    held += math.ceil(node.busy.get(SHARED_GPU_RESOURCE, 0.0) / sharing(node)[1])
    slices = {k: v for k, v in node.offers.items() if k.startswith(MIG_RESOURCE_PREFIX)}
    offered = sum(slices.values())
    if node.layout.kind == MIG and offered > 0:
        held += math.ceil(node.gpus * sum(node.busy.get(k, 0.0) for k in slices) / offered)
    return max(0, min(node.gpus, held))


def node_price(node: GpuNode, instance_types: Sequence[InstanceType]) -> float | None:
    """What `node` costs per hour from the catalog: by its instance type, else by its GPU model; None if neither."""
    by_name = {t.name: t for t in instance_types}
    kind = by_name.get(node.labels.get(INSTANCE_TYPE_LABEL, ""))
    if kind is not None:
        return kind.price_per_hour
    model = _model(node)
    per_gpu = [t.price_per_gpu_hour for t in instance_types
               if t.gpus > 0 and normalise_product_label(t.model) == model]
    return min(per_gpu) * node.gpus if per_gpu and node.gpus > 0 else None


def _model(node: GpuNode) -> str:
    if node.product is not None:
        return node.product.product
    label = node.labels.get(PRODUCT_LABEL)
    return normalise_product_label(label) if label else UNKNOWN_MODEL


def pending_gpu_pods(pods: Iterable[Mapping[str, Any]]) -> int:
    """Pods asking for a GPU device that no node holds yet (phase Pending, not bound, not being deleted)."""
    count = 0
    for pod in pods:
        if (pod.get("status") or {}).get("phase") != "Pending" or (pod.get("spec") or {}).get("nodeName"):
            continue
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            continue
        try:
            asks = pod_requests(pod)
        except ObjectError:
            continue
        if any(name.startswith("nvidia.com/") and value > 0 for name, value in asks.items()):
            count += 1
    return count


def idle_gpus(samples: Iterable[GpuSample], nodes: Iterable[GpuNode]) -> int:
    """GPUs of `nodes` whose DCGM utilisation is under IDLE_BELOW_PERCENT (one count per node and GPU)."""
    names = {n.name for n in nodes}
    idle = {(s.node, s.gpu) for s in samples if s.node in names and s.percent < IDLE_BELOW_PERCENT}
    return len(idle)


def summarize(report_id: str, now: float, nodes: Sequence[GpuNode], pending: int,
              instance_types: Sequence[InstanceType], idle: int | None,
              applied: Sequence[AppliedSaving]) -> dict[str, Any]:
    """The `ClusterSummary` wire body (hub/openapi.yaml) for this poll."""
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    cost, unpriced, gpus, allocated = 0.0, 0, 0, 0
    for node in nodes:
        held = allocated_gpus(node)
        layout = sharing(node)[0]
        group = groups.setdefault((_model(node), layout),
                                  {"model": _model(node), "layout": layout,
                                   "nodes": 0, "gpus": 0, "allocated": 0})
        group["nodes"] += 1
        group["gpus"] += node.gpus
        group["allocated"] += held
        gpus += node.gpus
        allocated += held
        price = node_price(node, instance_types)
        if price is None:
            unpriced += 1
        else:
            cost += price
    priced_gpus = sum(n.gpus for n in nodes if node_price(n, instance_types) is not None)
    per_gpu_hour = cost / priced_gpus if priced_gpus else _catalog_mean_gpu_price(instance_types)
    gpu_hours = sum(max(a.gpu_hours_per_month, 0.0) for a in applied)
    return {
        "version": SUMMARY_VERSION,
        "id": report_id,
        "time": now,
        "gpuNodes": len(nodes),
        "gpus": gpus,
        "allocatedGpus": allocated,
        "idleGpus": idle,
        "pendingGpuPods": pending,
        "byModel": [groups[k] for k in sorted(groups)],
        "costPerHour": round(cost, 4),
        "unpricedNodes": unpriced,
        "pricePerGpuHour": round(per_gpu_hour, 4),
        "savings": {"actionsApplied": len(applied), "gpuHoursPerMonth": round(gpu_hours, 3),
                    "perHour": round(gpu_hours / HOURS_PER_MONTH * per_gpu_hour, 4)},
    }


def _catalog_mean_gpu_price(instance_types: Sequence[InstanceType]) -> float:
    """With no priced node, a GPU-hour at the catalog's mean per-GPU price (0 for an empty catalog)."""
    prices = [t.price_per_gpu_hour for t in instance_types if t.gpus > 0]
    return sum(prices) / len(prices) if prices else 0.0
