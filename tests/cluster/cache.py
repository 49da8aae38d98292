"""The controller's cluster cache (kube/informers.py) with its reads made current, for tests that run
passes by hand.

A test writes a pod and runs a pass at once, and runs passes back to back; a controller in a cluster
runs them seconds apart, by which time its watches have brought every change. `CaughtUpCache` is the
product's ClusterCache (the same lists and watches, as the controller's identity) whose every read first
waits until its watches hold what the API server holds now: the keys and resourceVersions of a LIST
made as the admin (not as the controller: the audit log and kube-apiserver's counts of the
controller's requests stay its own).
"""

from __future__ import annotations

import time
from typing import Any

from kubernetes import client

from kube import rest
from kube.informers import ClusterCache
from kube.reflector import JsonObject, Reflector, object_key
from kube.workloads import PLURALS


class CaughtUpCache(ClusterCache):
    def __init__(self, api: client.ApiClient, admin: client.ApiClient, timeout: float = 30.0) -> None:
        super().__init__(api)
        self.admin, self.timeout = admin, timeout

    def nodes(self) -> list[JsonObject]:
        self._catch_up(self.node_feed, "/api/v1/nodes")
        return super().nodes()

    def pods(self, namespace: str | None = None, labels: Any = None) -> list[JsonObject]:
        self._catch_up(self.pod_feed, "/api/v1/pods")
        return super().pods(namespace, labels)

    def budgets(self) -> list[JsonObject]:
        self._catch_up(self.budget_feed, "/apis/policy/v1/poddisruptionbudgets")
        return super().budgets()

    def slices(self) -> list[JsonObject]:
        if self.slice_feed is not None:
            self._catch_up(self.slice_feed, "/apis/resource.k8s.io/v1/resourceslices")
        return super().slices()

    def workloads(self) -> list[JsonObject]:
        for kind, feed in self.workload_feeds.items():
            self._catch_up(feed, f"/apis/apps/v1/{PLURALS[kind]}")
        return super().workloads()

    def _catch_up(self, feed: Reflector, path: str) -> None:
        self.wait_for_sync()
        deadline = time.monotonic() + self.timeout
        while True:
            listed = {object_key(o): _rv(o) for o in rest.call(self.admin, "GET", path).get("items") or []}
            held = {k: _rv(o) for k, o in feed.snapshot().items()}
            if held.keys() == listed.keys() and all(held[k] >= rv for k, rv in listed.items()):
                return
            if time.monotonic() > deadline:
                missing = sorted(listed.keys() - held.keys())[:5]
                raise AssertionError(f"{feed.name} did not catch up in {self.timeout}s (missing {missing})")
            time.sleep(0.02)


def _rv(obj: JsonObject) -> int:
    return int(obj["metadata"]["resourceVersion"])
