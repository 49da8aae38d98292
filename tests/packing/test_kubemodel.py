"""Kubernetes Node/Pod dicts to the packing model (the extender's input path).

Real: gpupolicy.packing.kubemodel parsing and the packing engine. Faked: the API
objects are literal dicts shaped like `kubectl get -o json` output.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpupolicy.packing.engine import decide, get_strategy
from gpupolicy.packing.kubemodel import ObjectError, demand_from_pod, state_from_kubernetes
from gpupolicy.packing.placement import PackingContext, RejectReason
from gpupolicy.packing.typicalmix import TypicalMix


def node(name: str, gpus: int = 4, product: str = "NVIDIA-A100-SXM4-80GB", **extra: Any) -> dict[str, Any]:
    alloc = {"cpu": "32", "memory": "128Gi", "nvidia.com/gpu": str(gpus), **extra.pop("alloc", {})}
    return {"metadata": {"name": name, "labels": {"nvidia.com/gpu.product": product,
                                                    "nvidia.com/gpu.memory": "81920", **extra.pop("labels", {})}},
            "spec": extra.pop("spec", {}), "status": {"allocatable": alloc}}


def pod(name: str, gpus: int = 1, cpu: str = "2", node_name: str | None = None, **extra: Any) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": str(gpus), **extra.pop("limits", {})} if gpus or extra.get("limits") else {}
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu, "memory": "4Gi"},
                                                                      "limits": limits}}]}
    if node_name:
        spec["nodeName"] = node_name
    spec.update(extra.pop("spec", {}))
    return {"metadata": {"name": name, "namespace": "ml", **extra.pop("metadata", {})}, "spec": spec,
            "status": extra.pop("status", {"phase": "Running"})}


def test_demand_from_pod_reads_requests_limits_and_affinity() -> None:
    p = pod("a", gpus=2, cpu="1500m", spec={"affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-H100-80GB-HBM3-SHARED"]}]}]}}}},
        metadata={"annotations": {"gpu.kubeon.io/gpu-memory": "20Gi"}})
    d = demand_from_pod(p)
    assert (d.cpu_milli, d.memory_mib, d.num_gpu, d.gpu_milli) == (1500, 4096, 2, 1000)
    assert d.allowed_models == frozenset({"NVIDIA-H100-80GB-HBM3"})
    assert d.gpu_memory_mib == 20480 and d.name == "ml/a"


def test_mig_and_shared_requests() -> None:
    d = demand_from_pod(pod("m", gpus=0, limits={"nvidia.com/mig-1g.10gb": "2", "nvidia.com/gpu.shared": "1"}))
    assert d.mig == {"nvidia.com/mig-1g.10gb": 2} and d.shared == 1 and d.num_gpu == 0


def test_bad_quantity_names_the_field() -> None:
    with pytest.raises(ObjectError, match=r"spec.containers\[0\].resources.cpu"):
        demand_from_pod(pod("bad", cpu="lots"))


def test_state_counts_bound_pods_and_excludes_cordoned_and_draining() -> None:
    nodes = [node("n1"), node("n2", spec={"unschedulable": True}),
             node("n3", labels={"gpu.kubeon.io/draining": "true"}), node("n4", gpus=2)]
    pods = [pod("r1", gpus=3, node_name="n1"), pod("done", gpus=4, node_name="n4", status={"phase": "Succeeded"}),
            pod("pending", gpus=4)]
    state = state_from_kubernetes(nodes, pods)
    assert state.full_count.tolist() == [1, 4, 4, 2]
    assert state.cpu_free[0] == 30000 and state.models == ("NVIDIA-A100-SXM4-80GB",)
    assert state.gpu_memory_mib[0] == 81920
    ctx = PackingContext(mix=TypicalMix.empty())
    d = decide(state, demand_from_pod(pod("new", gpus=2)), get_strategy("bestfit"), ctx)
    # n1 has one free GPU, n2/n3 are excluded: n4 is the only fit.
    assert state.names[d.node] == "n4"
    assert d.reason(0) is RejectReason.INSUFFICIENT_WHOLE_GPUS
    assert d.reason(1) is RejectReason.UNSCHEDULABLE and d.reason(2) is RejectReason.UNSCHEDULABLE
