"""The controller's watch-fed view of Nodes, Pods, PodDisruptionBudgets and workloads, one per process.

Why: the capacity, layout and right-sizing passes read the whole cluster on
every pass. Listed each time, that is every Node and every Pod as JSON per
pass per reconciler (at 15,000 nodes and 150,000 pods, gigabytes a minute
through the API server and the controller's memory); kube-scheduler,
kube-controller-manager and Karpenter keep informer caches instead and so do
we: one `Reflector` per kind (kube/reflector.py: list once, then watch; a
relist only when a watch's resourceVersion expired, 410), shared by every
reconciler of the process through `ControllerContext.cluster()`.

What a cache cannot give is a read of one's own write: a pass that labelled
a node and reads nodes again must see the label, or it would undo what it
just did (the layout's ConfigMap clean-up). `wrote(obj)` puts the object the
API server answered a write with into the cache at once (client-go's
MutationCache does the same); the watch event that follows carries the same
or a newer resourceVersion and replaces it.

Kept: whole objects but managedFields and kubectl's last-applied copy (the
passes read labels, annotations, taints, owners, containers, status; trimming
more would tie this cache to every field each reconciler reads).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubernetes import client

from kube import rest
from kube.claims import DRA_API, serves_dra
from kube.reflector import JsonObject, OnChange, Reflector
from kube.stoppable import Stopping
from kube.trim import LAST_APPLIED
from kube.workloads import PLURALS

SYNC_TIMEOUT_SECONDS = 120.0


def slim(obj: JsonObject) -> JsonObject:
    """`obj` without managedFields and kubectl's last-applied annotation (what no pass reads)."""
    metadata = obj.get("metadata")
    if not isinstance(metadata, Mapping) or not ("managedFields" in metadata or LAST_APPLIED in
                                                  (metadata.get("annotations") or {})):
        return obj
    kept = {k: v for k, v in metadata.items() if k != "managedFields"}
    annotations = metadata.get("annotations")
    if isinstance(annotations, Mapping) and LAST_APPLIED in annotations:
        kept["annotations"] = {k: v for k, v in annotations.items() if k != LAST_APPLIED}
    return {**obj, "metadata": kept}


class ClusterCache:
    """Nodes, Pods, PodDisruptionBudgets, Deployments and StatefulSets as watch-fed caches. Objects are
    shared: read-only."""

    def __init__(self, api: client.ApiClient, on_pod: OnChange | None = None) -> None:
        """`on_pod(event, pod)`: told each pod change (the watch thread; keep it short)."""
        def feed(path: str, name: str, on_change: OnChange | None = None) -> Reflector:
            return Reflector(rest.lister(api, path), transform=slim, name=name, on_change=on_change)

        self.node_feed = feed("/api/v1/nodes", "controller-nodes")
        self.pod_feed = feed("/api/v1/pods", "controller-pods", on_pod)
        self.budget_feed = feed("/apis/policy/v1/poddisruptionbudgets", "controller-pdbs")
        self.workload_feeds = {kind: feed(f"/apis/apps/v1/{plural}", f"controller-{plural}")
                               for kind, plural in PLURALS.items()}
        # DRA (Kubernetes 1.34+): the devices each node's driver publishes, for the capacity planner
        self.slice_feed = feed(f"{DRA_API}/resourceslices", "controller-resourceslices") if serves_dra(api) else None
        self.feeds = (self.node_feed, self.pod_feed, self.budget_feed, *self.workload_feeds.values(),
                      *([self.slice_feed] if self.slice_feed is not None else []))

    def start(self) -> ClusterCache:
        for feed in self.feeds:
            feed.start()
        return self

    def stop(self) -> None:
        for feed in self.feeds:
            feed.stop(timeout=0.2)

    def wait_for_sync(self, timeout: float = SYNC_TIMEOUT_SECONDS) -> None:
        """Block until every kind was listed once; TimeoutError naming the ones that were not, or `Stopping`
        at once when the process stops first (a feed's client refused its list: it will never sync)."""
        late = [f for f in self.feeds if not f.wait_for_sync(timeout)]
        if any(f.ended for f in late):
            raise Stopping("the controller is stopping (caches not synced)")
        if late:
            raise TimeoutError(f"caches not synced after {timeout:.0f}s: {', '.join(f.name for f in late)}")

    @property
    def relists(self) -> int:
        """Lists made since start (one per kind at start-up; more only after a watch expired)."""
        return sum(f.relists for f in self.feeds)

    def nodes(self) -> list[JsonObject]:
        """Every Node, in name order (the order a LIST returns)."""
        return _sorted(self.node_feed)

    def pods(self, namespace: str | None = None, labels: Mapping[str, str] | None = None) -> list[JsonObject]:
        """Pods in `namespace/name` order (a LIST's), of one namespace and matching `labels` if given."""
        pods = _sorted(self.pod_feed)
        if namespace is not None:
            pods = [p for p in pods if p["metadata"].get("namespace") == namespace]
        if labels:
            pods = [p for p in pods if _has_labels(p, labels)]
        return pods

    def budgets(self) -> list[JsonObject]:
        return _sorted(self.budget_feed)

    def slices(self) -> list[JsonObject]:
        """Every ResourceSlice ([] where the API serves no DRA)."""
        return _sorted(self.slice_feed) if self.slice_feed is not None else []

    def workloads(self) -> list[JsonObject]:
        """Every Deployment, then every StatefulSet (each with its `kind`), each kind in key order."""
        return [obj for feed in self.workload_feeds.values() for obj in _sorted(feed)]

    def wrote(self, obj: Mapping[str, Any]) -> None:
        """Remember what a write of ours returned (a Node or a Pod), until the watch brings it."""
        kind = obj.get("kind")
        feed = self.node_feed if kind == "Node" else self.pod_feed if kind == "Pod" else None
        if feed is not None:
            feed.remember(dict(obj))


def _sorted(feed: Reflector) -> list[JsonObject]:
    return feed.in_key_order()


def _has_labels(obj: JsonObject, wanted: Mapping[str, str]) -> bool:
    labels = obj["metadata"].get("labels") or {}
    return all(labels.get(k) == v for k, v in wanted.items())
