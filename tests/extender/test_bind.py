"""The bind verb: the GPU index recorded on the pod, the binding made, the assumption where kube-scheduler put it.

Real: the extender's Flask app and node model, `kube.binding.ApiBinder` over
the `kubernetes` client against the test API server (tests/kubeapi), which
stores the annotation and performs the binding subresource. Faked: the watch
(the test feeds the cache the pod as the API now holds it).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from extender.app import create_app
from extender.cache import ClusterCache
from extender.service import ExtenderService
from kube.binding import ApiBinder
from kube.views import StaticView
from tests.extender.payloads import args
from tests.cluster.objects import make_node, make_pod
from tests.kubeapi.server import ApiServer

A100 = "NVIDIA-A100-SXM4-80GB"


@pytest.fixture
def api() -> Iterator[ApiServer]:
    with ApiServer.start() as server:
        yield server


def setup(api: ApiServer) -> tuple[Any, ClusterCache, client.CoreV1Api]:
    core = client.CoreV1Api(api.api_client())
    cache = ClusterCache(clock=lambda: 0.0)
    for node in (make_node("a", A100, 2, shared_replicas=4), make_node("b", A100, 2, shared_replicas=4)):
        core.create_node(node, _preload_content=False)
        cache.on_node("ADDED", node)
    service = ExtenderService(cache, StaticView(), binder=ApiBinder(api.api_client()))
    return create_app(service).test_client(), cache, core


def share_pod(core: client.CoreV1Api, name: str) -> dict[str, Any]:
    pod = make_pod(name, "default", annotations={"gpu.kubeon.io/gpu-share": "400"}, gpus=1,
                   gpu_resource="nvidia.com/gpu.shared")
    return json.loads(core.create_namespaced_pod("default", pod, _preload_content=False).data)


def test_bind_records_the_gpu_index_and_binds_through_the_api(api: ApiServer) -> None:
    http, cache, core = setup(api)
    pod = share_pod(core, "s1")
    scores = {e["Host"]: e["Score"] for e in http.post("/prioritize", json=args(pod, ["a", "b"])).get_json()}
    assert max(scores.values()) == 10
    answer = http.post("/bind", json={"PodName": "s1", "PodNamespace": "default",
                                      "PodUID": pod["metadata"]["uid"], "Node": "b"}).get_json()
    assert answer == {"Error": ""}
    stored = json.loads(core.read_namespaced_pod("s1", "default", _preload_content=False).data)
    assert stored["spec"]["nodeName"] == "b"
    assert stored["metadata"]["annotations"]["gpu.kubeon.io/gpu-index"] in ("0", "1")
    cache.on_pod("ADDED", stored)  # the watch event of the binding: the model reads the index back
    with cache.lock:
        state = cache.fresh_state()
        row = state.gpu_free[state.index["b"]]
    assert sorted(row.tolist()[:2]) == [600, 1000]


def test_an_assumption_kube_scheduler_did_not_follow_is_dropped_at_bind(api: ApiServer) -> None:
    http, cache, core = setup(api)
    pod = share_pod(core, "s2")
    http.post("/prioritize", json=args(pod, ["a", "b"]))
    picked = cache.assumed["default/s2"]
    other = "b" if picked == "a" else "a"
    http.post("/bind", json={"PodName": "s2", "PodNamespace": "default", "PodUID": pod["metadata"]["uid"],
                             "Node": other})
    assert cache.assumed["default/s2"] == other  # moved at once, not left on the engine's pick
    with cache.lock:
        state = cache.fresh_state()
        assert int(state.gpu_free_total[state.index[picked]]) == 2000  # the pick is free again


def test_a_refused_binding_leaves_no_assumption(api: ApiServer) -> None:
    http, cache, core = setup(api)
    pod = share_pod(core, "s3")
    http.post("/prioritize", json=args(pod, ["a", "b"]))
    body = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "s3", "namespace": "default"},
            "target": {"apiVersion": "v1", "kind": "Node", "name": "a"}}
    core.create_namespaced_pod_binding("s3", "default", body, _preload_content=False)  # someone else bound it
    answer = http.post("/bind", json={"PodName": "s3", "PodNamespace": "default", "PodUID": pod["metadata"]["uid"],
                                      "Node": "b"}).get_json()
    assert "409" in answer["Error"]
    assert "default/s3" not in cache.assumed


def test_a_pod_that_passed_the_filter_on_one_node_is_bound_with_its_gpu_index(api: ApiServer) -> None:
    # One feasible node: kube-scheduler skips /prioritize and binds at once (upstream schedule_one);
    # the bind still records the GPU the share is accounted on, from what /filter read.
    http, _cache, core = setup(api)
    pod = share_pod(core, "s3")
    assert http.post("/filter", json=args(pod, ["b"])).get_json()["NodeNames"] == ["b"]
    answer = http.post("/bind", json={"PodName": "s3", "PodNamespace": "default",
                                      "PodUID": pod["metadata"]["uid"], "Node": "b"}).get_json()
    assert answer == {"Error": ""}
    stored = json.loads(core.read_namespaced_pod("s3", "default", _preload_content=False).data)
    assert stored["spec"]["nodeName"] == "b"
    assert stored["metadata"]["annotations"]["gpu.kubeon.io/gpu-index"] in ("0", "1")


def test_bind_records_the_gpu_of_a_mig_slice(api: ApiServer) -> None:
    """A MIG pod's slice is accounted on one GPU of the node, as a share is: the bind verb records the
    fullest GPU whose layout has a free device of the profile (GPU 1, which holds a slice already)."""
    core = client.CoreV1Api(api.api_client())
    cache = ClusterCache(clock=lambda: 0.0)
    node = make_node("m", A100, 2, mig={"1g.10gb": 7})
    core.create_node(node, _preload_content=False)
    cache.on_node("ADDED", node)
    slice_ = {"gpus": 1, "gpu_resource": "nvidia.com/mig-1g.10gb"}
    held = make_pod("held", "default", annotations={"gpu.kubeon.io/gpu-index": "1"}, **slice_)
    held["spec"]["nodeName"] = "m"
    cache.on_pod("ADDED", json.loads(core.create_namespaced_pod("default", held, _preload_content=False).data))
    http = create_app(ExtenderService(cache, StaticView(), binder=ApiBinder(api.api_client()))).test_client()
    pod = json.loads(core.create_namespaced_pod("default", make_pod("m1", "default", **slice_),
                                                _preload_content=False).data)
    assert http.post("/filter", json=args(pod, ["m"])).get_json()["NodeNames"] == ["m"]
    answer = http.post("/bind", json={"PodName": "m1", "PodNamespace": "default",
                                      "PodUID": pod["metadata"]["uid"], "Node": "m"}).get_json()
    assert answer == {"Error": ""}
    stored = json.loads(core.read_namespaced_pod("m1", "default", _preload_content=False).data)
    assert stored["spec"]["nodeName"] == "m"
    assert stored["metadata"]["annotations"]["gpu.kubeon.io/gpu-index"] == "1"
    cache.on_pod("ADDED", stored)
    with cache.lock:
        state = cache.fresh_state()
    assert state.gpu_free[state.index["m"]].tolist()[:2] == [1000, 714]  # two 1g of 7 on GPU 1
