"""The extender's node model following the test API server's watches.

Real: the test API server over HTTP (tests/kubeapi), the kubernetes client,
`kube.reflector.Reflector` inside `ClusterWatch` (list, watch from the
resourceVersion, relist on 410), `ClusterCache` and the engine's NodeState.
Faked: nothing; bindings are made through the real `binding` subresource.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from extender.cache import ClusterCache
from extender.service import ExtenderService
from extender.watch import ClusterWatch
from gpupolicy.packing.nodemodel import NodeState
from gpupolicy.packing.scheduling import pod_key
from tests.cluster.objects import make_node, make_pod
from tests.kubeapi.pytest_fixtures import kube_api  # noqa: F401 - the fixture behind `api`
from tests.kubeapi.server import ApiServer
from tests.loopback import wait_for

A100 = "NVIDIA-A100-SXM4-80GB"
CRD = Path(__file__).resolve().parents[2] / "manifests" / "crd" / "gpupolicies.gpu.kubeon.io.yaml"


@pytest.fixture
def api(kube_api: ApiServer) -> ApiServer:  # noqa: F811
    return kube_api


@pytest.fixture
def watched(api: ApiServer) -> Iterator[tuple[ClusterWatch, ClusterCache, client.CoreV1Api]]:
    api.install_crd(CRD)
    core = client.CoreV1Api(api.api_client())
    core.create_node(make_node("a", A100, 8), _preload_content=False)
    cache = ClusterCache()
    w = ClusterWatch(api.api_client(), cache, watch_timeout=2).start()
    try:
        wait(w.ready, "reflectors synced")
        # the freeze's own full collection runs on its thread after the sync: a test counting full
        # collections must start after it (it landed inside one under load: 45 == 44, the old flake)
        wait(w.frozen.is_set, "synced caches frozen")
        yield w, cache, core
    finally:
        w.stop()


def wait(predicate: Callable[[], Any], what: str, timeout: float = 20.0) -> Any:
    return wait_for(predicate, timeout, what, interval=0.02)  # watch events land within milliseconds


def state(cache: ClusterCache) -> NodeState:
    with cache.lock:
        return cache.fresh_state()


def free_gpus(cache: ClusterCache, node: str) -> int:
    st = state(cache)
    return int(st.full_count[st.index[node]]) if node in st.index else -1


def bind(core: client.CoreV1Api, name: str, node: str) -> None:
    body = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name, "namespace": "default"},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
    core.create_namespaced_pod_binding(name, "default", body, _preload_content=False)


def test_node_added_pod_bound_and_deleted(watched: tuple[ClusterWatch, ClusterCache, client.CoreV1Api]) -> None:
    _, cache, core = watched
    assert free_gpus(cache, "a") == 8
    core.create_node(make_node("b", A100, 4), _preload_content=False)
    wait(lambda: free_gpus(cache, "b") == 4, "node b in the model")
    core.create_namespaced_pod("default", make_pod("p", gpus=3), _preload_content=False)
    marker = make_pod("marker", gpus=1)  # created after p, bound at creation: once it counts, p was seen
    marker["spec"]["nodeName"] = "a"
    core.create_namespaced_pod("default", marker, _preload_content=False)
    wait(lambda: free_gpus(cache, "a") == 7, "the pod created after the pending one counted")
    assert free_gpus(cache, "b") == 4  # pending pods do not count
    bind(core, "p", "b")
    wait(lambda: free_gpus(cache, "b") == 1, "bound pod counted")
    core.delete_namespaced_pod("p", "default", _preload_content=False)
    wait(lambda: free_gpus(cache, "b") == 4, "deleted pod given back")
    core.patch_node("b", {"spec": {"unschedulable": True}}, _preload_content=False)
    wait(lambda: not state(cache).schedulable[state(cache).index["b"]], "cordon seen")
    core.delete_node("b", _preload_content=False)
    wait(lambda: free_gpus(cache, "b") == -1, "node b gone")


def test_bound_pod_ends_its_assumption(watched: tuple[ClusterWatch, ClusterCache, client.CoreV1Api]) -> None:
    _, cache, core = watched
    pod = make_pod("q", gpus=2)
    core.create_namespaced_pod("default", pod, _preload_content=False)
    from gpupolicy.packing.kubemodel import demand_from_pod

    cache.assume(pod_key(pod), "a", demand_from_pod(pod))
    assert free_gpus(cache, "a") == 6 and cache.assumed == {"default/q": "a"}
    bind(core, "q", "a")
    wait(lambda: not cache.assumed, "assumption replaced by the binding")
    assert free_gpus(cache, "a") == 6  # counted once, not twice


def test_issue_37_a_huge_cpu_pod_bound_directly_does_not_poison_the_extender(
        watched: tuple[ClusterWatch, ClusterCache, client.CoreV1Api]) -> None:
    """The issue's watch reproducer: a GPU pod asking `cpu: 10P`, bound with spec.nodeName (it never reaches
    /filter), comes in through the Reflector; past the mix refresh, /filter and /prioritize still answer a
    valid pod on the model the watch keeps. It fills its node's CPU (the truth) and stays out of the mix."""
    w, cache, core = watched
    core.create_node(make_node("b", A100, 4), _preload_content=False)
    huge = make_pod("huge", gpus=1, cpu="10P")
    huge["spec"]["nodeName"] = "a"
    core.create_namespaced_pod("default", huge, _preload_content=False)
    wait(lambda: int(state(cache).cpu_free[state(cache).index["a"]]) == 0 and free_gpus(cache, "b") == 4,
         "the huge pod and node b in the model")
    service = ExtenderService(cache, w)
    cache.mix_refresh_seconds = 0.0  # every request refreshes the mix, as one does every 30 s
    valid = make_pod("valid", gpus=1)
    valid["metadata"]["uid"] = "valid-uid"
    for _ in range(3):
        outcome = service.filter(valid, ["a", "b"])
        assert outcome.passed == ["b"] and outcome.failed == {"a": "kubeon-gpu: insufficient cpu"}
        assert service.prioritize(valid, ["b"]).chosen == "b"
    assert cache.ignored.current("pod") == {
        "default/huge": "asks more than any node has: not learned into the typical mix"}


def test_410_relist_catches_up_with_missed_changes(
        api: ApiServer, watched: tuple[ClusterWatch, ClusterCache, client.CoreV1Api]) -> None:
    w, cache, core = watched
    before = w.pods.relists
    created = []
    # Write and compact until a watch resumes from a compacted resourceVersion (410 Gone -> relist).
    # How many rounds that takes depends on when the watch falls behind (100 and more were seen):
    # 10m pods keep the node's CPU from running out however many it takes (1-CPU pods overflowed
    # the 96-core node after 96 rounds and the expected free CPU went negative: the old flake).
    deadline = time.monotonic() + 15
    i = 0
    while w.pods.relists == before and time.monotonic() < deadline:
        name = f"r{i}"
        core.create_namespaced_pod("default", make_pod(name, gpus=0, cpu="10m"), _preload_content=False)
        bind(core, name, "a")
        created.append(name)
        api.compact()
        i += 1
        time.sleep(0.05)
    assert w.pods.relists > before, "no relist happened"
    # a change after the relist, and the cache matches the API exactly
    core.delete_namespaced_pod(created[0], "default", _preload_content=False)
    expected_cpu = 96_000 - 10 * (len(created) - 1)
    wait(lambda: int(state(cache).cpu_free[state(cache).index["a"]]) == expected_cpu,
         f"cpu_free {expected_cpu} after relist")
    assert set(cache.node_pods("a")) == {f"default/{n}" for n in created[1:]}


def test_objects_the_watch_replaces_are_never_walked_by_a_full_collection(
        watched: tuple[ClusterWatch, ClusterCache, client.CoreV1Api]) -> None:
    """Watch events replace frozen objects with new ones, which age into the oldest generation: while the
    watch runs no automatic full collection walks them (207 ms at 15,000 nodes); the young generations are
    collected, by allocations and at least every YOUNG_SECONDS (events alone would let them grow); stopping
    the watch gives the process its collector settings back."""
    import gc

    w, _, core = watched
    full_before = gc.get_stats()[2]["collections"]
    young_before = gc.get_stats()[0]["collections"]
    for i in range(20):  # status reports: MODIFIED events, each a new object in the reflector's cache
        version = core.patch_node_status("a", {"status": {"conditions": [{"type": "Ready", "status": "True",
                                                                           "message": f"heartbeat {i}"}]}}
                                         ).metadata.resource_version
    wait(lambda: (w.node_feed.get("a") or {}).get("metadata", {}).get("resourceVersion") == version,
         "the last report (kept trimmed: kube/trim.py)")
    survivors = [[i] for i in range(400_000)]  # long-lived objects promoted through both young generations
    assert gc.get_stats()[0]["collections"] > young_before
    assert gc.get_stats()[2]["collections"] == full_before
    del survivors
    # events free what they replace, so they never trigger a young collection themselves: the watch does
    middle = gc.get_stats()[1]["collections"]
    wait(lambda: gc.get_stats()[1]["collections"] > middle, "a young collection while nothing allocates")
    saved = w._thresholds
    w.stop()
    assert gc.get_threshold() == saved


def test_status_reports_that_change_nothing_the_model_reads_are_skipped_and_changes_still_land() -> None:
    """Heartbeats (conditions, lastHeartbeatTime) leave the model as it is, at no cost; a cordon, a new
    label or new allocatable resources arriving after them are still applied."""
    import copy

    cache = ClusterCache(clock=lambda: 0.0)
    node = make_node("a", A100, 8)
    cache.on_node("ADDED", node)
    before = state(cache)
    version, rebuilds = cache.version, cache.rebuilds
    for i in range(3):
        report = copy.deepcopy(node)
        report["status"]["conditions"] = [{"type": "Ready", "status": "True", "message": f"heartbeat {i}"}]
        cache.on_node("MODIFIED", report)
    assert state(cache) is before and (cache.version, cache.rebuilds) == (version, rebuilds)
    cordoned = copy.deepcopy(node)
    cordoned["spec"]["unschedulable"] = True
    cache.on_node("MODIFIED", cordoned)
    assert not state(cache).schedulable[state(cache).index["a"]]
    relabelled = copy.deepcopy(cordoned)
    relabelled["metadata"]["labels"]["nvidia.com/gpu.product"] = "NVIDIA-H100-80GB-HBM3"
    cache.on_node("MODIFIED", relabelled)
    assert state(cache).models[state(cache).model_idx[state(cache).index["a"]]] != before.models[0]
    smaller = copy.deepcopy(relabelled)
    smaller["status"]["allocatable"]["nvidia.com/gpu"] = "4"
    cache.on_node("MODIFIED", smaller)
    assert int(state(cache).gpu_count[state(cache).index["a"]]) == 4
