"""A node joining, leaving or changing capacity builds the extender's node model anew: the rows of the other
nodes are copied from the last model (`NodeState.take_rows`) and must be what taking every pod off them again
gives. Real: `extender.cache.ClusterCache` fed the objects its watches deliver, the engine's NodeState.
Faked: the objects are literal dicts shaped like the API server's."""

from __future__ import annotations

from typing import Any

import numpy as np

from extender.cache import ClusterCache
from gpupolicy.packing.nodemodel import NodeState, PodDemand
from tests.cluster.objects import make_node, make_pod
from tests.extender.payloads import args

LOAD = ("cpu_free", "mem_free", "gpu_free", "mig_held", "mig_free", "shared_free", "full_count", "max_partial",
        "gpu_free_total", "schedulable")


def bound(name: str, node: str, **kw: Any) -> dict[str, Any]:
    pod = make_pod(name, "ml", **kw)
    pod["metadata"]["uid"] = f"uid-{name}"
    pod["spec"]["nodeName"] = node
    pod["status"] = {"phase": "Running"}
    return pod


def fed(nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> ClusterCache:
    cache = ClusterCache(clock=lambda: 0.0)
    for node in nodes:
        cache.on_node("ADDED", node)
    for pod in pods:
        cache.on_pod("ADDED", pod)
    return cache


def state(cache: ClusterCache) -> NodeState:
    with cache.lock:
        return cache.fresh_state()


def test_a_node_joining_copies_the_rows_that_did_not_change_and_they_equal_a_model_built_from_scratch() -> None:
    nodes = [make_node("a", gpus=8), make_node("b", gpus=8), make_node("ts", "NVIDIA-L4", gpus=1, shared_replicas=4),
             make_node("mig", gpus=1, mig={"1g.10gb": 7})]
    pods = [bound("p1", "a", gpus=2), bound("p2", "a", gpus=1, cpu="10"), bound("p3", "b", gpus=3),
            bound("s1", "ts", gpus=1, gpu_resource="nvidia.com/gpu.shared"),
            bound("m1", "mig", gpus=1, gpu_resource="nvidia.com/mig-1g.10gb")]
    cache = fed(nodes, pods)
    state(cache)
    cache.assume("ml/next", "b", PodDemand(name="next", cpu_milli=1000, memory_mib=1024, num_gpu=1, gpu_milli=1000),
                 (5,))
    # between two requests: a node joins, a pod on `a` ends, node `b` changes capacity
    joined = make_node("c", gpus=4)
    cache.on_node("ADDED", joined)
    cache.on_pod("DELETED", pods[1])
    bigger = make_node("b", gpus=8, cpu="128")
    cache.on_node("MODIFIED", bigger)
    rebuilds, copied = cache.rebuilds, cache.rows_copied
    kept = state(cache)
    assert cache.rebuilds == rebuilds + 1
    assert cache.rows_copied - copied == 2, "ts and mig copied; a (a pod ended), b (capacity) and c occupied"

    scratch = fed([nodes[0], bigger, nodes[2], nodes[3], joined], [p for p in pods if p is not pods[1]])
    scratch.assume("ml/next", "b", PodDemand(name="next", cpu_milli=1000, memory_mib=1024, num_gpu=1,
                                             gpu_milli=1000), (5,))
    fresh = state(scratch)
    assert kept.names == fresh.names
    for key in LOAD:
        assert np.array_equal(getattr(kept, key), getattr(fresh, key)), key


def test_metrics_say_how_the_model_was_kept() -> None:
    from extender.app import create_app
    from extender.service import ExtenderService
    from kube.views import StaticView

    cache = fed([make_node("a", gpus=8), make_node("b", gpus=8)], [bound("p1", "a", gpus=2)])
    http = create_app(ExtenderService(cache, StaticView())).test_client()
    state(cache)
    cache.on_node("ADDED", make_node("c", gpus=8))
    state(cache)
    pod = make_pod("next", "ml", gpus=1)
    pod["metadata"]["uid"] = "uid-next"
    assert http.post("/filter", json=args(pod, ["a", "b", "c"])).status_code == 200
    metrics = http.get("/metrics").get_data(as_text=True)
    assert "kubeon_extender_model_rebuilds_total 2.0" in metrics  # the first model, then c joined
    # the answering thread's CPU beside the latency, one observation per request
    assert 'kubeon_extender_http_request_cpu_seconds_count{route="/filter"} 1.0' in metrics
    assert 'kubeon_extender_model_rows_total{how="copied"} 2.0' in metrics
    assert 'kubeon_extender_model_rows_total{how="occupied"} 3.0' in metrics


def test_a_request_that_waited_for_the_model_says_how_long() -> None:
    """`kubeon_extender_model_lock_wait_seconds`: of a slow answer, the part spent waiting for the node model
    (a watch event, the settle thread or the work ahead for /prioritize held it), apart from its CPU."""
    import threading

    from prometheus_client.parser import text_string_to_metric_families

    from extender.app import create_app
    from extender.service import ExtenderService
    from kube.views import StaticView

    def sample(text: str, name: str, **labels: str) -> float:
        return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
                   if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))

    cache = fed([make_node("a", gpus=8), make_node("b", gpus=8)], [])
    http = create_app(ExtenderService(cache, StaticView())).test_client()
    state(cache)
    pod = make_pod("next", "ml", gpus=1)
    pod["metadata"]["uid"] = "uid-next"
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with cache.lock:
            held.set()
            release.wait(5)
    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(5)
    threading.Timer(0.2, release.set).start()
    assert http.post("/filter", json=args(pod, ["a", "b"])).status_code == 200
    holder.join()
    metrics = http.get("/metrics").get_data(as_text=True)
    assert sample(metrics, "kubeon_extender_model_lock_wait_seconds_count", verb="filter") == 1.0
    assert sample(metrics, "kubeon_extender_model_lock_wait_seconds_sum", verb="filter") >= 0.15
    assert sample(metrics, "kubeon_extender_http_request_cpu_seconds_sum", route="/filter") < 0.15


def test_rows_settled_between_requests_equal_a_model_built_from_scratch_and_leave_the_request_nothing() -> None:
    """The settle thread's step (`ClusterCache.settle`): a few dirty rows per call, until none is left; the
    next request then recomputes nothing, and what it reads equals a model fed the same objects at once."""
    nodes = [make_node(name, gpus=8) for name in "abcdefg"]
    pods = [bound(f"p{i}", "abcdefg"[i % 7], gpus=1 + i % 3) for i in range(14)]
    cache = fed(nodes, pods[:7])
    state(cache)
    for pod in pods[7:]:
        cache.on_pod("ADDED", pod)  # bound directly: no request comes
    cache.on_pod("DELETED", pods[0])
    assert cache.dirty_rows == 7
    assert cache.settle(max_rows=3) == 4 and cache.settle(max_rows=3) == 1 and cache.settle(max_rows=3) == 0
    assert cache.rows_settled == 7
    before = cache.row_updates
    settled = state(cache)
    assert cache.row_updates == before, "the request found every row applied"
    fresh = state(fed(nodes, pods[1:]))
    for key in LOAD:
        assert np.array_equal(getattr(settled, key), getattr(fresh, key)), key
