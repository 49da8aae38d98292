"""The typical mix from GPU pods only: learned from bound and pending GPU pods, shown on /debug/mix and /metrics.

Real: ClusterCache, the extender's Flask app (its /filter learning pending
pods, /debug/mix, /metrics). Faked: the watch (bound pods are fed by hand).
"""

from __future__ import annotations

from typing import Any

from extender.app import create_app
from extender.cache import MIN_MIX_PODS, ClusterCache
from extender.service import ExtenderService
from gpupolicy.packing.kubemodel import demand_from_pod
from kube.views import StaticView
from tests.cluster.objects import make_node
from tests.extender.payloads import args, bound, wire_pod

A100 = "NVIDIA-A100-SXM4-80GB"
GPU_TYPES = [(1, "4"), (2, "8"), (4, "16"), (8, "32")]  # (GPUs, CPU cores)


def gpu_pod(name: str, gpus: int, cpu: str) -> dict[str, Any]:
    return wire_pod(name, "ml", gpus=gpus, cpu=cpu)


def test_with_20_cpu_only_pods_per_gpu_pod_the_mix_covers_the_gpu_pod_types() -> None:
    cache = ClusterCache(clock=lambda: 0.0)
    cache.on_node("ADDED", make_node("n", A100, 8))
    seq = 0
    for round_ in range(10):
        for gpus, cpu in GPU_TYPES:
            cache.on_pod("ADDED", bound(gpu_pod(f"g{round_}-{gpus}", gpus, cpu), "n"))
            for _ in range(20):
                seq += 1
                cache.on_pod("ADDED", bound(wire_pod(f"cpu-{seq}", "batch", cpu=f"{100 + seq % 37}m"), "n"))
    mix = cache.mix_in_force()
    assert mix is not None
    types = {(int(mix.num_gpu[i]), int(mix.cpu_milli[i])) for i in range(len(mix))}
    assert types == {(g, int(c) * 1000) for g, c in GPU_TYPES}
    assert cache.gpu_pods_learned == 40


def test_pending_pods_are_learned_once_and_the_mix_is_visible() -> None:
    cache = ClusterCache(clock=lambda: 0.0)
    cache.on_node("ADDED", make_node("n", A100, 8))
    http = create_app(ExtenderService(cache, StaticView())).test_client()
    pod = gpu_pod("p", 2, "8")
    http.post("/filter", json=args(pod, ["n"]))
    http.post("/prioritize", json=args(pod, ["n"]))
    cache.on_pod("ADDED", bound(pod, "n"))  # the same pod, now bound: not learned twice
    assert cache.gpu_pods_learned == 1
    debug = http.get("/debug/mix").get_json()
    assert debug["gpu_pods_learned"] == 1
    assert debug["types"] == [{"cpu_milli": 8000, "gpu_milli": 1000, "num_gpu": 2, "gpu_spec": "", "weight": 1.0}]
    metrics = http.get("/metrics").get_data(as_text=True)
    assert 'kubeon_extender_mix_weight{cpu_milli="8000",gpu_milli="1000",gpu_spec="",num_gpu="2"} 1.0' in metrics
    assert "kubeon_extender_mix_gpu_pods 1.0" in metrics


def test_below_the_minimum_the_pod_being_scheduled_joins_the_mix() -> None:
    cache = ClusterCache(clock=lambda: 0.0)
    cache.on_node("ADDED", make_node("n", A100, 8))
    cache.on_pod("ADDED", bound(gpu_pod("first", 1, "4"), "n"))
    fallback = demand_from_pod(gpu_pod("next", 4, "16"))
    mix = cache.mix(fallback)
    assert mix is not None and sorted(mix.num_gpu.tolist()) == [1, 4]
    assert MIN_MIX_PODS > 1
