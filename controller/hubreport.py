"""The cluster summary sent to the hub on every poll: read the cluster, let gpupolicy/capacity/summary.py decide.

I/O only: the nodes and pods (the controller's watch cache, as the layout reconciler
makes), DCGM utilisation where Prometheus is set, the instance catalog the
capacity reconciler prices nodes with, and the proposals in the policies'
status that say what an applied action frees.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from controller.capacity.reconciler import DEFAULT_INSTANCES, INSTANCES_ENV
from controller.metrics_source import MetricsError, gpu_host
from gpupolicy.capacity.instances import InstanceType, load_instances
from gpupolicy.capacity.layout import GpuNode, read_nodes
from gpupolicy.capacity.summary import IDLE_QUERY, AppliedSaving, GpuSample, idle_gpus, pending_gpu_pods, summarize

if TYPE_CHECKING:
    from controller.context import ControllerContext

log = logging.getLogger(__name__)


def instance_catalog() -> list[InstanceType]:
    """The catalog the capacity reconciler reads ($KUBEON_GPU_INSTANCE_TYPES, else the packaged AWS one)."""
    return load_instances(os.environ.get(INSTANCES_ENV) or str(DEFAULT_INSTANCES))


def measured_idle(ctx: ControllerContext, nodes: list[GpuNode]) -> int | None:
    """GPUs idle by DCGM; None without Prometheus or when it does not answer (not measured is not 0)."""
    if not ctx.prometheus_configured or ctx.metrics is None:
        return None
    try:
        samples = ctx.metrics.query(IDLE_QUERY)
    except MetricsError as exc:
        log.warning("hub summary: idle GPUs not measured: %s", exc)
        return None
    found = [GpuSample(host, str(s.labels.get("gpu", "")), s.value) for s in samples
             if (host := gpu_host(s.labels)) is not None]
    return idle_gpus(found, nodes)


def savings_of(ctx: ControllerContext, applied: Iterable[tuple[str, str]]) -> list[AppliedSaving]:
    """Each applied (policy, target) with the GPU-hours per month its proposal in the policy's status estimates
    (0 when the action had no proposal: a cordon, a launch)."""
    estimates: dict[tuple[str, str], float] = {}
    for entry in ctx.policies.entries():
        for proposal in entry.raw_status.get("proposals") or []:
            key = (entry.name, str(proposal.get("target")))
            value = _number(proposal.get("estimatedGpuHoursPerMonth"))
            estimates[key] = max(estimates.get(key, 0.0), value)
    return [AppliedSaving(policy, target, estimates.get((policy, target), 0.0)) for policy, target in applied]


def _number(value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return 0.0
    return number if number == number and number >= 0 else 0.0  # NaN and negatives count as no estimate


class SummaryReport:
    """HubSync's `summary`: this poll's `ClusterSummary` (hub/openapi.yaml), the catalog read once."""

    def __init__(self, instances: list[InstanceType] | None = None) -> None:
        self.instances = instances if instances is not None else instance_catalog()

    def __call__(self, ctx: ControllerContext, now: float, applied: list[tuple[str, str]]) -> dict[str, Any]:
        cluster = ctx.cluster()
        pods = cluster.pods()
        nodes = read_nodes(cluster.nodes(), pods, {})
        return summarize(uuid.uuid4().hex, now, nodes, pending_gpu_pods(pods), self.instances,
                         measured_idle(ctx, nodes), savings_of(ctx, applied))
