"""The extender's node model following the real kube-apiserver's watches.

Real: kube-apiserver and etcd (tests/cluster), the kubernetes client,
`kube.reflector.Reflector` inside `ClusterWatch` (list, watch from the
resourceVersion, relist on 410) authenticated as the chart's extender
ServiceAccount, `ClusterCache` and the engine's NodeState; KWOK nodes, pods
bound through the real `binding` subresource. The watches go through
tests/cluster/faultproxy.py, which holds them back while changes are made and
kube-apiserver restarts: its watch cache starts over above what the watch saw,
and answers it 410 Gone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from extender.cache import ClusterCache
from extender.service import ExtenderService
from extender.watch import ClusterWatch
from gpupolicy.packing.nodemodel import NodeState
from gpupolicy.packing.scheduling import pod_key
from kube.config import load_api_client
from tests.cluster.cluster import Cluster
from tests.cluster.faultproxy import FaultProxy
from tests.cluster.kubeon import RELEASE
from tests.cluster.objects import make_node, make_pod
from tests.loopback import wait_for

# the chart's CRDs, ServiceAccounts and RBAC; none of the optimizer's processes (the test runs the watch)
CLUSTER = {"kubeon": True, "kubeon_components": ()}
A100 = "NVIDIA-A100-SXM4-80GB"


@dataclass
class Watched:
    watch: ClusterWatch
    cache: ClusterCache
    core: client.CoreV1Api
    namespace: str
    proxy: FaultProxy

    def node(self, suffix: str) -> str:
        """A node name of this test (nodes are cluster-wide)."""
        return f"{self.namespace}-{suffix}"


@pytest.fixture
def watched(kube_cluster: Cluster, namespace: str, tmp_path: Path) -> Iterator[Watched]:
    assert kube_cluster.kubeon is not None
    core = kube_cluster.core
    a = f"{namespace}-a"
    kube_cluster.create_node(make_node(a, A100, 8))
    identity = kube_cluster.kubeon.kubeconfig_of(kube_cluster.api_client, f"{RELEASE}-extender")
    with FaultProxy(kube_cluster.plane, tmp_path, identity=identity) as proxy:
        api = load_api_client(str(proxy.kubeconfig))
        cache = ClusterCache()
        w = ClusterWatch(api, cache, watch_timeout=2).start()
        try:
            wait(w.ready, "reflectors synced")
            # the freeze's own full collection runs on its thread after the sync: a test counting full
            # collections must start after it (it landed inside one under load: 45 == 44, the old flake)
            wait(w.frozen.is_set, "synced caches frozen")
            yield Watched(w, cache, core, namespace, proxy)
        finally:
            w.stop()
            api.close()
            for node in core.list_node().items:  # this test's nodes
                if node.metadata.name.startswith(f"{namespace}-"):
                    core.delete_node(node.metadata.name)


def wait(predicate: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    return wait_for(predicate, timeout, what, interval=0.02)  # watch events land within milliseconds


def state(cache: ClusterCache) -> NodeState:
    with cache.lock:
        return cache.fresh_state()


def free_gpus(cache: ClusterCache, node: str) -> int:
    st = state(cache)
    return int(st.full_count[st.index[node]]) if node in st.index else -1


def bind(w: Watched, name: str, node: str) -> None:
    body = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name, "namespace": w.namespace},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
    w.core.create_namespaced_pod_binding(name, w.namespace, body, _preload_content=False)


def create_pod(w: Watched, pod: dict[str, Any]) -> None:
    w.core.create_namespaced_pod(w.namespace, pod, _preload_content=False)


def test_node_added_pod_bound_and_deleted(kube_cluster: Cluster, watched: Watched) -> None:
    w, cache, core = watched, watched.cache, watched.core
    a, b = w.node("a"), w.node("b")
    assert free_gpus(cache, a) == 8
    kube_cluster.create_node(make_node(b, A100, 4))
    wait(lambda: free_gpus(cache, b) == 4, "node b in the model")
    create_pod(w, make_pod("p", w.namespace, gpus=3))  # the optimizer's scheduler, not run here: pending
    marker = make_pod("marker", w.namespace, gpus=1)  # created after p, bound at creation: once it counts, p was seen
    marker["spec"]["nodeName"] = a
    create_pod(w, marker)
    wait(lambda: free_gpus(cache, a) == 7, "the pod created after the pending one counted")
    assert free_gpus(cache, b) == 4  # pending pods do not count
    bind(w, "p", b)
    wait(lambda: free_gpus(cache, b) == 1, "bound pod counted")
    core.delete_namespaced_pod("p", w.namespace, _preload_content=False)
    wait(lambda: free_gpus(cache, b) == 4, "deleted pod given back")
    core.patch_node(b, {"spec": {"unschedulable": True}}, _preload_content=False)
    wait(lambda: not state(cache).schedulable[state(cache).index[b]], "cordon seen")
    core.delete_node(b, _preload_content=False)
    wait(lambda: free_gpus(cache, b) == -1, "node b gone")


def test_bound_pod_ends_its_assumption(watched: Watched) -> None:
    w, cache = watched, watched.cache
    a = w.node("a")
    pod = make_pod("q", w.namespace, gpus=2)
    create_pod(w, pod)
    from gpupolicy.packing.kubemodel import demand_from_pod

    cache.assume(pod_key(pod), a, demand_from_pod(pod))
    assert free_gpus(cache, a) == 6 and cache.assumed == {f"{w.namespace}/q": a}
    bind(w, "q", a)
    wait(lambda: not cache.assumed, "assumption replaced by the binding")
    assert free_gpus(cache, a) == 6  # counted once, not twice


def test_issue_37_a_huge_cpu_pod_bound_directly_does_not_poison_the_extender(kube_cluster: Cluster,
                                                                          watched: Watched) -> None:
    """The issue's watch reproducer: a GPU pod asking `cpu: 10P`, bound with spec.nodeName (it never reaches
    /filter), comes in through the Reflector; past the mix refresh, /filter and /prioritize still answer a
    valid pod on the model the watch keeps. It fills its node's CPU (the truth) and stays out of the mix."""
    w, cache = watched, watched.cache
    a, b = w.node("a"), w.node("b")
    kube_cluster.create_node(make_node(b, A100, 4))
    huge = make_pod("huge", w.namespace, gpus=1, cpu="10P")
    huge["spec"]["nodeName"] = a
    create_pod(w, huge)
    wait(lambda: a in state(cache).index and int(state(cache).cpu_free[state(cache).index[a]]) == 0
         and free_gpus(cache, b) == 4, "the huge pod and node b in the model")
    service = ExtenderService(cache, w.watch)
    cache.mix_refresh_seconds = 0.0  # every request refreshes the mix, as one does every 30 s
    valid = make_pod("valid", w.namespace, gpus=1)
    valid["metadata"]["uid"] = "valid-uid"
    for _ in range(3):
        outcome = service.filter(valid, [a, b])
        assert outcome.passed == [b] and outcome.failed == {a: "kubeon-gpu: insufficient cpu"}
        assert service.prioritize(valid, [b]).chosen == b
    assert cache.ignored.current("pod") == {
        f"{w.namespace}/huge": "asks more than any node has: not learned into the typical mix"}


def test_410_relist_catches_up_with_missed_changes(kube_cluster: Cluster, watched: Watched) -> None:
    """Pods created and bound while no watch sees them, then kube-apiserver restarted: its watch cache
    starts at the version it lists on start, so the watches resuming from before answer 410 Gone, and
    the relist brings the missed pods in."""
    w, cache = watched, watched.cache
    a = w.node("a")
    before = w.watch.pods.relists
    created = [f"r{i}" for i in range(5)]
    with w.proxy.holding_watches():
        for name in created:
            create_pod(w, make_pod(name, w.namespace, gpus=0, cpu="10m"))
            bind(w, name, a)
        kube_cluster.plane.restart_apiserver()
    wait(lambda: w.watch.pods.relists > before, "a relist", timeout=60)
    wait(lambda: set(cache.node_pods(a)) == {f"{w.namespace}/{n}" for n in created}, "the missed pods")
    # a change after the relist, and the cache matches the API exactly
    w.core.delete_namespaced_pod(created[0], w.namespace, _preload_content=False)
    expected_cpu = 96_000 - 10 * (len(created) - 1)
    wait(lambda: int(state(cache).cpu_free[state(cache).index[a]]) == expected_cpu,
         f"cpu_free {expected_cpu} after relist")
    assert set(cache.node_pods(a)) == {f"{w.namespace}/{n}" for n in created[1:]}


def test_objects_the_watch_replaces_are_never_walked_by_a_full_collection(watched: Watched) -> None:
    """Watch events replace frozen objects with new ones, which age into the oldest generation: while the
    watch runs no automatic full collection walks them (207 ms at 15,000 nodes); the young generations are
    collected, by allocations and at least every YOUNG_SECONDS (events alone would let them grow); stopping
    the watch gives the process its collector settings back."""
    import gc

    w, core, a = watched.watch, watched.core, watched.node("a")
    full_before = gc.get_stats()[2]["collections"]
    young_before = gc.get_stats()[0]["collections"]
    for i in range(20):  # status reports: MODIFIED events, each a new object in the reflector's cache
        version = core.patch_node_status(a, {"status": {"conditions": [{"type": "Ready", "status": "True",
                                                                         "message": f"heartbeat {i}"}]}}
                                         ).metadata.resource_version
    wait(lambda: int((w.node_feed.get(a) or {}).get("metadata", {}).get("resourceVersion") or 0) >= int(version),
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


def test_pods_bound_while_no_request_comes_are_counted_before_the_next_request(watched: Watched) -> None:
    """The model is built once the lists sync, and rows that pods bound directly dirtied are recomputed by the
    settle thread, not by the next scheduling request (at 5,000 nodes that request used to take a second)."""
    w, cache = watched, watched.cache
    a = w.node("a")
    wait(lambda: cache.rebuilds >= 1, "the model built after the sync, before any request")
    settled = cache.rows_settled
    for i in range(3):
        pod = make_pod(f"direct-{i}", w.namespace, gpus=2)
        pod["spec"]["nodeName"] = a  # bound at creation: no scheduler, no extender request
        create_pod(w, pod)
    wait(lambda: len(cache.node_pods(a)) == 3 and cache.dirty_rows == 0, "the pods seen and their row settled")
    assert cache.rows_settled > settled
    in_requests = cache.row_updates - cache.rows_settled
    assert free_gpus(cache, a) == 2  # a request's view: the three pods counted ...
    assert cache.row_updates - cache.rows_settled == in_requests  # ... and nothing left for it to recompute


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
