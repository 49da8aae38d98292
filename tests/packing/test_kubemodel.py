"""Kubernetes Node/Pod dicts to the packing model (the extender's input path).

Real: gpupolicy.packing.kubemodel parsing and the packing engine. Faked: the API
objects are literal dicts shaped like `kubectl get -o json` output.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpupolicy.packing.engine import decide, get_strategy
from gpupolicy.packing.kubemodel import ObjectError, demand_from_pod, node_spec, state_from_kubernetes
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


# ---------------------------------------------------------------- GPU shares per GPU

def share_pod(name: str, node_name: str | None = None, share: str | None = None, memory: str | None = None,
              gpu_index: str | None = None) -> dict[str, Any]:
    annotations = {k: v for k, v in (("gpu.kubeon.io/gpu-share", share), ("gpu.kubeon.io/gpu-memory", memory),
                                     ("gpu.kubeon.io/gpu-index", gpu_index)) if v is not None}
    return pod(name, gpus=0, node_name=node_name, limits={"nvidia.com/gpu.shared": "1"},
               metadata={"annotations": annotations})


def test_two_shares_on_one_gpu_and_a_whole_gpu_on_another_from_objects_alone() -> None:
    n = node("n1", gpus=4, alloc={"nvidia.com/gpu.shared": "16"})  # 4 GPUs, 4 replicas each, both offered
    pods = [share_pod("s1", "n1", share="300", gpu_index="2"), share_pod("s2", "n1", share="450", gpu_index="2"),
            {**pod("w", gpus=1, node_name="n1"),
             "metadata": {"name": "w", "namespace": "ml", "annotations": {"gpu.kubeon.io/gpu-index": "0"}}}]
    state = state_from_kubernetes([n], pods)
    assert state.gpu_free[0].tolist() == [0, 1000, 250, 1000]
    assert int(state.shared_free[0]) == 14 and int(state.full_count[0]) == 2 and int(state.max_partial[0]) == 250


def test_share_fraction_from_share_then_memory_then_replicas() -> None:
    n = node("n1", gpus=2, alloc={"nvidia.com/gpu.shared": "8"})  # 80 GiB GPUs, 4 replicas each
    pods = [share_pod("declared", "n1", share="100"), share_pod("by-memory", "n1", memory="20Gi"),
            share_pod("by-replicas", "n1")]
    state = state_from_kubernetes([n], pods)
    # fullest GPU that fits first: 100 + 250 (20 GiB of 80) + 250 (1/4) all land on GPU 0
    assert state.gpu_free[0].tolist() == [400, 1000]
    assert demand_from_pod(share_pod("x", share="100")).gpu_milli == 100
    with pytest.raises(ObjectError, match=r"gpu\.kubeon\.io/gpu-share"):
        demand_from_pod(share_pod("bad", share="1500"))


def test_time_sliced_node_keeps_its_gpus_and_takes_no_whole_gpu_pods() -> None:
    sliced = node("ts", gpus=0, alloc={"nvidia.com/gpu.shared": "8"}, labels={"nvidia.com/gpu.replicas": "4"})
    state = state_from_kubernetes([sliced, node("whole", gpus=1)], [share_pod("s", "ts", share="500")])
    ts = state.index["ts"]
    assert int(state.gpu_count[ts]) == 2 and sorted(state.gpu_free[ts].tolist()[:2]) == [500, 1000]
    whole = demand_from_pod(pod("w", gpus=1))
    d = decide(state, whole, get_strategy("kubeon"), PackingContext(mix=TypicalMix.from_pods([whole])))
    assert d.node == state.index["whole"] and d.fit.reason(ts) is RejectReason.NO_GPU


# ---------------------------------------------------------------- MIG slices per GPU

BALANCED = {"nvidia.com/mig-1g.10gb": 2, "nvidia.com/mig-2g.20gb": 1, "nvidia.com/mig-3g.40gb": 1}


def mig_node(name: str, gpus: int, layout: str, per_gpu: dict[str, int], count_label: bool = True,
             advertised: dict[str, int] | None = None) -> dict[str, Any]:
    """A MIG node as GFD and the device plugin (mixed strategy) show it: no nvidia.com/gpu, the
    devices in allocatable, the physical GPU count and the layout the GPU Operator was told."""
    n = node(name, gpus=0, alloc=advertised if advertised is not None else {r: str(c * gpus) for r, c in
                                                                            per_gpu.items()},
             labels={"nvidia.com/mig.config": layout, "nvidia.com/mig.strategy": "mixed",
                     **({"nvidia.com/gpu.count": str(gpus)} if count_label else {})})
    del n["status"]["allocatable"]["nvidia.com/gpu"]
    return n


def mig_pod(name: str, profile: str, node_name: str | None = None, gpu_index: str | None = None) -> dict[str, Any]:
    annotations = {"gpu.kubeon.io/gpu-index": gpu_index} if gpu_index is not None else {}
    return pod(name, gpus=0, node_name=node_name, limits={f"nvidia.com/mig-{profile}": "1"},
               metadata={"annotations": annotations})


def test_two_mig_slices_on_one_gpu_and_one_on_another_from_objects_alone() -> None:
    """The MIG mirror of the time-sliced test above: 4 A100s cut all-balanced (2 x 1g.10gb, 2g.20gb,
    3g.40gb each: 7 compute slices). A 1g and a 3g recorded on GPU 2, a 2g on GPU 0, and a 1g bound
    by another scheduler (no index), which takes the fullest GPU with a free 1g: GPU 2."""
    n = mig_node("m", 4, "all-balanced", BALANCED)
    pods = [mig_pod("s1", "1g.10gb", "m", "2"), mig_pod("s2", "3g.40gb", "m", "2"),
            mig_pod("w", "2g.20gb", "m", "0"), mig_pod("u", "1g.10gb", "m")]
    state = state_from_kubernetes([n], pods)
    # free milli = 1000 * (7 - compute slices held) // 7: GPU 2 holds 1 + 3 + 1, GPU 0 holds 2
    assert state.gpu_free[0].tolist() == [714, 1000, 285, 1000]
    assert int(state.gpu_count[0]) == 4 and not state.exclusive[0]
    assert dict(zip(state.mig_resources, state.mig_free[0].tolist(), strict=True)) == {
        "nvidia.com/mig-1g.10gb": 6, "nvidia.com/mig-2g.20gb": 3, "nvidia.com/mig-3g.40gb": 3}
    ctx = PackingContext(mix=TypicalMix.empty())
    one_g = demand_from_pod(mig_pod("next", "1g.10gb"))
    # GPU 2's two 1g devices are both held: the next 1g goes to the fullest GPU that still has one
    assert decide(state, one_g, get_strategy("kubeon"), ctx).gpu_indices == (0,)
    for other in (pod("whole", gpus=1), share_pod("share", share="100")):
        d = decide(state, demand_from_pod(other), get_strategy("kubeon"), ctx)
        assert d.node is None and d.reason(0) is RejectReason.NO_GPU  # cut GPUs take MIG devices only


def test_a_recorded_index_whose_gpu_has_no_room_falls_back_to_the_fullest_gpu() -> None:
    n = mig_node("m", 2, "all-3g.40gb", {"nvidia.com/mig-3g.40gb": 2})
    pods = [mig_pod(f"p{i}", "3g.40gb", "m", "0") for i in range(3)]  # GPU 0 holds two 3g at most
    state = state_from_kubernetes([n], pods)
    assert state.gpu_free[0].tolist() == [0, 500]  # a 3g of all-3g.40gb is half its GPU
    assert state.mig_free[0].tolist() == [1]


def test_mig_layout_from_the_gpu_operator_label_else_the_devices_spread_over_the_gpus() -> None:
    one_g = "nvidia.com/mig-1g.10gb"
    known = node_spec(mig_node("known", 8, "all-1g.10gb", {one_g: 7}))
    assert (known.gpu_count, dict(known.mig_per_gpu), known.exclusive) == (8, {one_g: 7}, False)
    # no nvidia.com/gpu.count: the default layout says how many GPUs hold what is advertised
    assert node_spec(mig_node("uncounted", 8, "all-1g.10gb", {one_g: 7}, count_label=False)).gpu_count == 8
    # a custom mig-parted config: the advertised devices over GFD's GPU count
    custom = node_spec(mig_node("custom", 2, "custom", {one_g: 3, "nvidia.com/mig-4g.40gb": 1}))
    assert dict(custom.mig_per_gpu) == {one_g: 3, "nvidia.com/mig-4g.40gb": 1} and custom.gpu_count == 2
    # a re-layout under way: the label names the new layout, allocatable still shows the old devices
    moving = node_spec(mig_node("moving", 8, "all-3g.40gb", {one_g: 7}))
    assert dict(moving.mig_per_gpu) == {one_g: 7}
    # neither a GPU count nor a known layout: MIG devices by count only, as before
    bare = node_spec(mig_node("bare", 2, "custom", {one_g: 7}, count_label=False))
    assert (bare.gpu_count, dict(bare.mig_per_gpu), dict(bare.mig)) == (0, {}, {one_g: 14})
