"""The controller's cluster cache (kube/informers.py) on the real API server: listed once, then fed by its
watches; a watch that expired (kube-apiserver restarted mid-churn while another writer wrote to etcd: its watch
cache starts at the version it listed, so a watch from before answers 410 Gone) costs one relist per kind, and
the cache converges.

Real: etcd, kube-apiserver, kube-controller-manager, the default kube-scheduler and KWOK (tests/cluster).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import urllib3
from kubernetes.client.exceptions import ApiException

from kube import rest
from kube.informers import ClusterCache
from kube.reflector import object_key
from tests.cluster.cluster import Cluster
from tests.cluster.fixtures import start_cluster
from tests.cluster.objects import make_node, make_pod

NS = "churn"


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    c = start_cluster(gpu_operator=False)
    try:
        yield c
    finally:
        c.stop()


def listed(c: Cluster, path: str) -> dict[str, str]:
    return {object_key(o): o["metadata"]["resourceVersion"] for o in rest.call(c.api_client, "GET", path)["items"]}


def held(feed_snapshot: dict[str, dict]) -> dict[str, str]:
    return {k: o["metadata"]["resourceVersion"] for k, o in feed_snapshot.items()}


def test_a_watch_expired_mid_churn_relists_once_and_converges(cluster: Cluster) -> None:
    for i in range(3):
        cluster.create(make_node(f"churn-n{i}", gpus=8))
    cluster.ensure_namespace(NS)
    cache = ClusterCache(cluster.api_client).start()
    stop = threading.Event()

    def churn() -> None:
        """A pod created and one deleted every 0.1 s; while kube-apiserver restarts, the same step again."""
        i = 0
        while not stop.is_set():
            pod = make_pod(f"p{i}", NS, gpus=1)
            pod["spec"]["nodeName"] = f"churn-n{i % 3}"
            try:
                if not any(p["metadata"]["name"] == f"p{i}" for p in cluster.pods(NS)):
                    cluster.create(pod)
                if i >= 5 and any(p["metadata"]["name"] == f"p{i - 5}" for p in cluster.pods(NS)):
                    cluster.core.delete_namespaced_pod(f"p{i - 5}", NS, grace_period_seconds=0)
            except (ApiException, urllib3.exceptions.HTTPError):
                time.sleep(0.2)
                continue
            i += 1
            time.sleep(0.1)

    try:
        cache.wait_for_sync(60)
        # nodes, pods, budgets, deployments, statefulsets and resourceslices (the API serves DRA): once each
        assert cache.relists == len(cache.feeds) == 6
        writer = threading.Thread(target=churn, daemon=True)
        writer.start()
        time.sleep(2)
        cluster.plane.restart_apiserver(written_meanwhile=True)
        time.sleep(3)
        stop.set()
        writer.join(timeout=30)

        def converged() -> bool:
            return (held(cache.pod_feed.snapshot()) == listed(cluster, "/api/v1/pods")
                    and held(cache.node_feed.snapshot()) == listed(cluster, "/api/v1/nodes"))
        cluster.wait_for(converged, timeout=90, message="the cache holding what the API server holds")
        assert cache.pod_feed.relists == 2 and cache.node_feed.relists == 2, (cache.pod_feed.relists,
                                                                              cache.node_feed.relists)
        assert [p["metadata"]["name"] for p in cache.pods(NS)] == sorted(
            k.split("/")[1] for k in listed(cluster, f"/api/v1/namespaces/{NS}/pods"))
    finally:
        stop.set()
        cache.stop()
