"""The bind verb: the GPU index recorded on the pod, the binding made, the assumption where kube-scheduler put it.

Real: the extender's Flask app and node model, `kube.binding.ApiBinder` over
the `kubernetes` client against the real kube-apiserver (tests/cluster),
authenticated as the chart's extender ServiceAccount (so the chart's RBAC is
what lets it create the binding that carries the record), KWOK nodes running what
is bound. Faked: the watch (the test feeds the cache the pod as the API now
holds it). Nothing else schedules the pods: they name the optimizer's
scheduler, which this cluster does not run.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from kubernetes import client

from extender.app import create_app
from extender.cache import ClusterCache
from extender.service import ExtenderService
from kube.binding import ApiBinder
from kube.config import load_api_client
from kube.views import StaticView
from tests.cluster.cluster import Cluster
from tests.cluster.kubeon import RELEASE
from tests.cluster.objects import make_node, make_pod
from tests.extender.payloads import args

# the chart's CRDs, ServiceAccounts and RBAC; none of the optimizer's processes (the test plays them)
CLUSTER = {"kubeon": True, "kubeon_components": ()}
A100 = "NVIDIA-A100-SXM4-80GB"


@dataclass
class Bed:
    """The extender's app and cache, the admin's client, the test's namespace and node names."""

    http: Any
    cache: ClusterCache
    core: client.CoreV1Api
    namespace: str
    a: str = ""
    b: str = ""
    clock: list[float] = field(default_factory=lambda: [0.0])  # the cache's clock (seconds): tests move it
    service: ExtenderService | None = None  # what the app serves (a test calls what runs after an answer)


def binder(cluster: Cluster) -> ApiBinder:
    """The binder as the extender runs it: with the chart's extender ServiceAccount."""
    assert cluster.kubeon is not None
    return ApiBinder(load_api_client(str(cluster.kubeon.kubeconfig_of(cluster.api_client, f"{RELEASE}-extender"))))


@pytest.fixture
def bed(kube_cluster: Cluster, namespace: str) -> Iterator[Bed]:
    clock = [0.0]
    cache = ClusterCache(clock=lambda: clock[0])
    a, b = f"{namespace}-a", f"{namespace}-b"
    for name in (a, b):
        cache.on_node("ADDED", kube_cluster.create_node(make_node(name, A100, 2, shared_replicas=4)))
    service = ExtenderService(cache, StaticView(), binder=binder(kube_cluster))
    yield Bed(create_app(service).test_client(), cache, kube_cluster.core, namespace, a, b, clock, service)
    for name in (a, b):
        kube_cluster.core.delete_node(name)


def share_pod(bed: Bed, name: str) -> dict[str, Any]:
    pod = make_pod(name, bed.namespace, annotations={"gpu.kubeon.io/gpu-share": "400"}, gpus=1,
                   gpu_resource="nvidia.com/gpu.shared")
    return json.loads(bed.core.create_namespaced_pod(bed.namespace, pod, _preload_content=False).data)


def bind(bed: Bed, pod: dict[str, Any], node: str) -> dict[str, Any]:
    return bed.http.post("/bind", json={"PodName": pod["metadata"]["name"], "PodNamespace": bed.namespace,
                                        "PodUID": pod["metadata"]["uid"], "Node": node}).get_json()


def stored(bed: Bed, name: str) -> dict[str, Any]:
    return json.loads(bed.core.read_namespaced_pod(name, bed.namespace, _preload_content=False).data)


def test_bind_records_the_gpu_index_and_binds_through_the_api(bed: Bed) -> None:
    pod = share_pod(bed, "s1")
    scores = {e["Host"]: e["Score"] for e in bed.http.post("/prioritize", json=args(pod, [bed.a, bed.b])).get_json()}
    assert max(scores.values()) == 10
    assert bind(bed, pod, bed.b) == {"Error": ""}
    held = stored(bed, "s1")
    assert held["spec"]["nodeName"] == bed.b
    assert held["metadata"]["annotations"]["gpu.kubeon.io/gpu-index"] in ("0", "1")
    bed.cache.on_pod("ADDED", held)  # the watch event of the binding: the model reads the index back
    with bed.cache.lock:
        state = bed.cache.fresh_state()
        row = state.gpu_free[state.index[bed.b]]
    assert sorted(row.tolist()[:2]) == [600, 1000]


def test_a_bound_pod_counts_on_its_node_until_the_watch_shows_it_however_late(bed: Bed) -> None:
    """The API accepted the binding, so the pod holds its GPU share whatever the watch's delay: past the
    assumption's expiry the share is still taken (a late watch must not let a second pod onto that GPU)."""
    pod = share_pod(bed, "late")
    bed.http.post("/prioritize", json=args(pod, [bed.a, bed.b]))
    picked = bed.cache.assumed[f"{bed.namespace}/late"]
    assert bind(bed, pod, picked) == {"Error": ""}
    bed.clock[0] += bed.cache.assume_seconds + 60
    with bed.cache.lock:
        state = bed.cache.fresh_state()
        assert int(state.gpu_free_total[state.index[picked]]) == 1600
    bed.cache.on_pod("ADDED", stored(bed, "late"))  # the watch, at last: the pod itself holds the share
    assert f"{bed.namespace}/late" not in bed.cache.assumed
    with bed.cache.lock:
        state = bed.cache.fresh_state()
        assert int(state.gpu_free_total[state.index[picked]]) == 1600


def test_an_assumption_kube_scheduler_did_not_follow_is_dropped_at_bind(bed: Bed) -> None:
    pod = share_pod(bed, "s2")
    bed.http.post("/prioritize", json=args(pod, [bed.a, bed.b]))
    key = f"{bed.namespace}/s2"
    picked = bed.cache.assumed[key]
    other = bed.b if picked == bed.a else bed.a
    bind(bed, pod, other)
    assert bed.cache.assumed[key] == other  # moved at once, not left on the engine's pick
    with bed.cache.lock:
        state = bed.cache.fresh_state()
        assert int(state.gpu_free_total[state.index[picked]]) == 2000  # the pick is free again


def test_work_that_runs_late_leaves_a_pod_being_bound_on_its_gpu(bed: Bed) -> None:
    """On a loaded machine the decision prepared after /filter's answer (`ahead`) may run only after
    /prioritize and /bind, and kube-scheduler may give up on a slow /prioritize and bind meanwhile. Neither
    may free or move what the binding holds: the next pod would get the same GPU (seen in the openb replay
    through the real kube-scheduler: two whole-GPU pods recorded on GPU 6 of one node)."""
    assert bed.service is not None
    key = f"{bed.namespace}/s4"
    pod = share_pod(bed, "s4")
    filtered = bed.service.filter(pod, [bed.a, bed.b])  # what the /filter handler answers from
    assert sorted(filtered.passed) == sorted([bed.a, bed.b])
    bed.http.post("/prioritize", json=args(pod, [bed.a, bed.b]))
    picked = bed.cache.assumed[key]
    other = bed.b if picked == bed.a else bed.a
    assert bind(bed, pod, other) == {"Error": ""}  # kube-scheduler's node, not the engine's pick
    bed.service.ahead(filtered)  # the work after /filter's answer, late
    bed.http.post("/prioritize", json=args(pod, [bed.a, bed.b]))  # a /prioritize answered after the bind
    assert bed.cache.assumed[key] == other
    index = int(stored(bed, "s4")["metadata"]["annotations"]["gpu.kubeon.io/gpu-index"])
    with bed.cache.lock:
        state = bed.cache.fresh_state()
        assert int(state.gpu_free[state.index[other]][index]) == 600  # the recorded GPU holds the share
        assert int(state.gpu_free_total[state.index[picked]]) == 2000


def test_a_refused_binding_leaves_no_assumption_and_no_record(bed: Bed) -> None:
    pod = share_pod(bed, "s3")
    bed.http.post("/prioritize", json=args(pod, [bed.a, bed.b]))
    body = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "s3", "namespace": bed.namespace},
            "target": {"apiVersion": "v1", "kind": "Node", "name": bed.a}}
    bed.core.create_namespaced_pod_binding("s3", bed.namespace, body, _preload_content=False)  # someone else bound it
    answer = bind(bed, pod, bed.b)
    assert "409" in answer["Error"]
    assert f"{bed.namespace}/s3" not in bed.cache.assumed
    # no record of GPUs decided for a binding that did not happen: it would double-book them
    assert "gpu.kubeon.io/gpu-index" not in (stored(bed, "s3")["metadata"].get("annotations") or {})


def test_a_pod_that_passed_the_filter_on_one_node_is_bound_with_its_gpu_index(bed: Bed) -> None:
    # One feasible node: kube-scheduler skips /prioritize and binds at once (upstream schedule_one);
    # the bind still records the GPU the share is accounted on, from what /filter read.
    pod = share_pod(bed, "s3")
    assert bed.http.post("/filter", json=args(pod, [bed.b])).get_json()["NodeNames"] == [bed.b]
    assert bind(bed, pod, bed.b) == {"Error": ""}
    held = stored(bed, "s3")
    assert held["spec"]["nodeName"] == bed.b
    assert held["metadata"]["annotations"]["gpu.kubeon.io/gpu-index"] in ("0", "1")


def test_bind_records_the_gpu_of_a_mig_slice(kube_cluster: Cluster, namespace: str) -> None:
    """A MIG pod's slice is accounted on one GPU of the node, as a share is: the bind verb records the
    fullest GPU whose layout has a free device of the profile (GPU 1, which holds a slice already)."""
    core = kube_cluster.core
    cache = ClusterCache(clock=lambda: 0.0)
    node = f"{namespace}-m"
    cache.on_node("ADDED", kube_cluster.create_node(make_node(node, A100, 2, mig={"1g.10gb": 7})))
    try:
        slice_ = {"gpus": 1, "gpu_resource": "nvidia.com/mig-1g.10gb"}
        held = make_pod("held", namespace, annotations={"gpu.kubeon.io/gpu-index": "1"}, **slice_)
        held["spec"]["nodeName"] = node
        cache.on_pod("ADDED", json.loads(core.create_namespaced_pod(namespace, held, _preload_content=False).data))
        bed = Bed(create_app(ExtenderService(cache, StaticView(), binder=binder(kube_cluster))).test_client(),
                  cache, core, namespace)
        pod = json.loads(core.create_namespaced_pod(namespace, make_pod("m1", namespace, **slice_),
                                                    _preload_content=False).data)
        assert bed.http.post("/filter", json=args(pod, [node])).get_json()["NodeNames"] == [node]
        assert bind(bed, pod, node) == {"Error": ""}
        bound = stored(bed, "m1")
        assert bound["spec"]["nodeName"] == node
        assert bound["metadata"]["annotations"]["gpu.kubeon.io/gpu-index"] == "1"
        cache.on_pod("ADDED", bound)
        with cache.lock:
            state = cache.fresh_state()
        assert state.gpu_free[state.index[node]].tolist()[:2] == [1000, 714]  # two 1g of 7 on GPU 1
    finally:
        core.delete_node(node)
