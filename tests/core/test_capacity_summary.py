"""The cluster summary the controller reports to the hub (gpupolicy/capacity/summary.py), on plain data.

Real: the layout planner's node reading, the packaged instance catalog, the summary as it goes on the wire
(checked against hub/openapi.yaml). Faked: nothing; nodes and pods are built as the API server returns them.
"""

from __future__ import annotations

from typing import Any

import pytest

from controller.capacity.reconciler import DEFAULT_INSTANCES
from gpupolicy.capacity.instances import load_instances
from gpupolicy.capacity.layout import read_nodes
from gpupolicy.capacity.summary import (
    HOURS_PER_MONTH,
    AppliedSaving,
    GpuSample,
    allocated_gpus,
    idle_gpus,
    pending_gpu_pods,
    summarize,
)
from hub import contract
from tests.cluster.objects import make_node, make_pod

CATALOG = load_instances(str(DEFAULT_INSTANCES))


def bound(name: str, node: str, gpus: int = 1, resource: str = "nvidia.com/gpu") -> dict[str, Any]:
    pod = make_pod(name, gpus=gpus, gpu_resource=resource)
    pod["spec"]["nodeName"] = node
    pod["status"] = {"phase": "Running"}
    return pod


def pending(name: str, gpus: int = 1) -> dict[str, Any]:
    pod = make_pod(name, gpus=gpus)
    pod["status"] = {"phase": "Pending"}
    return pod


def test_gpus_by_model_and_layout_allocated_pending_and_cost() -> None:
    nodes = [make_node("a10-0", "NVIDIA-A10G", 4, instance_type="g5.12xlarge"),
             make_node("a10-1", "NVIDIA-A10G", 4),  # no instance type: priced by model, cheapest per GPU
             make_node("l4-0", "NVIDIA-L4", 1, shared_replicas=4, instance_type="g6.xlarge"),
             make_node("cpu-0", None, 0)]
    pods = [bound("w1", "a10-0", 2), bound("w2", "a10-1"), bound("s1", "l4-0", 1, "nvidia.com/gpu.shared"),
            pending("p1"), pending("p2"), make_pod("cpu-only")]
    summary = summarize("r1", 1_800_000_000.0, read_nodes(nodes, pods, {}), pending_gpu_pods(pods), CATALOG, None, [])
    assert contract.problem("ClusterSummary", summary) is None
    assert (summary["gpuNodes"], summary["gpus"], summary["allocatedGpus"], summary["pendingGpuPods"]) == (3, 9, 4, 2)
    assert summary["idleGpus"] is None, "not measured without Prometheus, which is not 0"
    groups = {(g["model"], g["layout"]): (g["nodes"], g["gpus"], g["allocated"]) for g in summary["byModel"]}
    assert groups == {("NVIDIA-A10G", "whole GPUs"): (2, 8, 3), ("NVIDIA-L4", "time-slicing 4 replicas"): (1, 1, 1)}
    per_a10g = min(t.price_per_gpu_hour for t in CATALOG if t.model == "NVIDIA-A10G")
    assert summary["costPerHour"] == pytest.approx(5.672 + 4 * per_a10g + 0.8048, abs=1e-3)
    assert summary["unpricedNodes"] == 0


def test_a_node_no_catalog_prices_is_counted_apart() -> None:
    nodes = read_nodes([make_node("t4-0", "Tesla-T4", 2)], [], {})
    summary = summarize("r", 0.0, nodes, 0, CATALOG, None, [])
    assert summary["costPerHour"] == 0 and summary["unpricedNodes"] == 1 and summary["gpus"] == 2


@pytest.mark.parametrize(("held", "expected"), [(0, 0), (1, 1), (4, 1), (5, 2), (8, 2)], ids=lambda v: str(v))
def test_a_time_sliced_gpu_counts_once_its_shares_are_held(held: int, expected: int) -> None:
    pods = [bound(f"s{i}", "ts", 1, "nvidia.com/gpu.shared") for i in range(held)]
    node = read_nodes([make_node("ts", "NVIDIA-L4", 2, shared_replicas=4)], pods, {})[0]
    assert allocated_gpus(node) == expected


def test_idle_counts_each_gpu_of_a_gpu_node_under_the_threshold_once() -> None:
    nodes = read_nodes([make_node("a", "NVIDIA-L4", 2), make_node("b", "NVIDIA-L4", 1)], [], {})
    samples = [GpuSample("a", "0", 0.0), GpuSample("a", "0", 1.0), GpuSample("a", "1", 80.0),
               GpuSample("b", "0", 4.9), GpuSample("elsewhere", "0", 0.0)]
    assert idle_gpus(samples, nodes) == 2


def test_savings_price_the_applied_actions_gpu_hours() -> None:
    nodes = read_nodes([make_node("a10-0", "NVIDIA-A10G", 4, instance_type="g5.12xlarge")], [], {})
    applied = [AppliedSaving("share", "Deployment/ml/llm", 146.0), AppliedSaving("layout", "Node/a10-0", 0.0)]
    summary = summarize("r", 0.0, nodes, 0, CATALOG, None, applied)
    assert summary["pricePerGpuHour"] == pytest.approx(5.672 / 4, abs=1e-4)
    assert summary["savings"] == {"actionsApplied": 2, "gpuHoursPerMonth": 146.0,
                                  "perHour": round(146.0 / HOURS_PER_MONTH * 5.672 / 4, 4)}
