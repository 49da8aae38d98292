"""The one list-watch cache of GpuPolicies (and what they are read against), for every adapter.

The admission webhook and the scheduler extender both answer from a
`ClusterView` (policies, namespace labels, optionally nodes) and must not call
the API server on the hot path. `WatchedView` keeps one Reflector per kind
(`kube.reflector`) and rebuilds the immutable view lazily, at most once per
change: `current()` costs a flag check between changes. A policy the model
refuses, and a policy, namespace or node whose shape the core cannot read
(`gpupolicy.admission.shape`: `labels: [a]`, `metadata: "x"`), is left out of
the view and said once (`kube.ignored`: a warning and
`kubeon_gpu_objects_ignored_total{reason}`), so it affects only the answers
about itself, never the rebuild of the view for everyone (the validating
webhook keeps new bad policies out; older objects may predate it). Namespaces
and nodes are checked once per event, policies (a handful) at each rebuild.

`feeds` are further Reflectors an adapter needs beside the view (the
extender's nodes and bound pods, which feed its node model, not the view):
they start, stop and count towards `ready()` with the view's own, so an
adapter has one watch object to manage. `StaticView` is the same interface
over a fixed view: tests, `--no-watch`, `--policies FILE`.
"""

from __future__ import annotations

import gc
import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any, Protocol

from gpupolicy.admission.shape import NAMESPACE, NODE, POLICY, Spec, check
from gpupolicy.cluster import DEFAULT_NAMESPACE, ClusterView, view_from_objects
from gpupolicy.model import GROUP, PLURAL, VERSION, Mode
from kube import rest
from kube.ignored import IgnoredObjects
from kube.reflector import Reflector, custom_objects_lister, object_key
from kube.shares import SharedClaimPods
from kube.trim import node_fields

log = logging.getLogger(__name__)


class ViewSource(Protocol):
    """What an adapter reads its policies from."""

    def current(self) -> ClusterView: ...

    def ready(self) -> bool: ...

    def note_share(self, namespace: str, claim: str) -> None: ...


class StaticView:
    """A fixed view: tests, `--no-watch`, and `--policies FILE` without a cluster."""

    def __init__(self, view: ClusterView | None = None) -> None:
        self._view = view or ClusterView()

    def current(self) -> ClusterView:
        return self._view

    def ready(self) -> bool:
        return True

    def note_share(self, namespace: str, claim: str) -> None:
        """Nothing: a fixed view counts no shared-claim pods."""


class WatchedView:
    """A view from Reflectors on GpuPolicies, Namespaces (and Nodes, `with_nodes`); rebuilt, at the next
    `current()`, after any event that changes what the view holds (a Node's status heartbeat does not)."""

    def __init__(self, api_client: Any, *, default_mode: Mode = Mode.RECOMMEND,
                 own_namespace: str = DEFAULT_NAMESPACE, with_nodes: bool = False,
                 feeds: Sequence[Reflector] = (), watch_timeout: int = 300,
                 metrics_configured: bool = False, route_cpu_pods: bool = True,
                 ignored: IgnoredObjects | None = None, with_shares: bool = False) -> None:
        self.ignored = ignored or IgnoredObjects()  # objects left out of the view, said once (module doc)
        self._unreadable: dict[str, set[str]] = {"Namespace": set(), "Node": set()}  # keys failing the shape
        self._default_mode = default_mode
        self._route_cpu_pods = route_cpu_pods  # --route-cpu-pods-on-gpu-nodes (admission.mutate)
        self._own_namespace = own_namespace
        self._metrics_configured = metrics_configured  # --prometheus-url given (gpupolicy.modes)
        self._lock = threading.Lock()
        self._dirty = True
        self.frozen = threading.Event()  # set once the synced caches are frozen (`start(freeze_after_sync=True)`)
        self._view = ClusterView(default_mode=default_mode, own_namespace=own_namespace,
                                 metrics_configured=metrics_configured, route_cpu_pods=route_cpu_pods)
        t = watch_timeout
        self.policies = Reflector(custom_objects_lister(api_client, GROUP, VERSION, PLURAL),
                                  on_change=self._changed, name="gpupolicies", timeout_seconds=t)
        self.namespaces = Reflector(rest.lister(api_client, "/api/v1/namespaces"),
                                    on_change=self._checking("Namespace", NAMESPACE), name="namespaces",
                                    timeout_seconds=t)
        self.rebuilds = 0  # views built since start (docs and tests: a heartbeat must not rebuild)
        # trimmed to what the view reads (kube/trim.py), so the Reflector tells of a Node only when its
        # name, labels, spec or allocatable changed, never of a kubelet's status heartbeat
        self.nodes = (Reflector(rest.lister(api_client, "/api/v1/nodes"), on_change=self._checking("Node", NODE),
                                transform=node_fields, name="nodes", timeout_seconds=t) if with_nodes else None)
        # the webhook's pods per shared claim (kube/shares.py): a change rebuilds the view, as a node's does
        # (its events and the webhook's admissions only recount: the view is copied with the new counts)
        self._recount = False
        self.shares = SharedClaimPods(api_client, self._counts_changed, timeout_seconds=t) if with_shares else None
        own = ((self.policies, self.namespaces) + ((self.nodes,) if self.nodes is not None else ())
               + ((self.shares.reflector,) if self.shares is not None else ()))
        self._reflectors: tuple[Reflector, ...] = own + tuple(feeds)

    def start(self, *, freeze_after_sync: bool = False) -> WatchedView:
        """Start every Reflector; `freeze_after_sync`: move the initial lists out of the collector's sight.

        A full garbage collection walks every object: with 5,000 nodes and
        their pods that is tens of milliseconds inside some unlucky request.
        Cached objects live as long as the process, so the collector gains
        nothing from them.
        """
        for reflector in self._reflectors:
            reflector.start()
        if freeze_after_sync:
            threading.Thread(target=self._freeze_after_sync, name="gc-freeze", daemon=True).start()
        return self

    def _freeze_after_sync(self) -> None:
        if all(r.wait_for_sync(600) for r in self._reflectors):
            gc.collect()
            gc.freeze()
            self.frozen.set()
            log.info("caches synced; %d objects frozen out of garbage collection", gc.get_freeze_count())

    def stop(self) -> None:
        for reflector in self._reflectors:
            reflector.stop()

    def ready(self) -> bool:
        return all(r.has_synced() for r in self._reflectors)

    def _changed(self, _event: str, _obj: dict[str, Any]) -> None:
        self._dirty = True

    def _counts_changed(self, _event: str, _obj: dict[str, Any]) -> None:
        self._recount = True

    def note_share(self, namespace: str, claim: str) -> None:
        """A pod just admitted naming a shared claim: counted from the next view on (kube/shares.py)."""
        if self.shares is not None:
            self.shares.note(namespace, claim)
            self._recount = True

    def _checking(self, kind: str, spec: Spec) -> Callable[[str, dict[str, Any]], None]:
        """An on_change that checks each event's object against the shape the view reads: one that fails is
        left out of the next view until an event brings a readable one (or deletes it)."""
        unreadable = self._unreadable[kind]

        def changed(event: str, obj: dict[str, Any]) -> None:
            key = object_key(obj)
            problem = "" if event == "DELETED" else check(obj, spec, kind.lower())
            if problem:
                unreadable.add(key)
                self.ignored.left_out(kind, key, "malformed", problem)
            else:
                unreadable.discard(key)
                self.ignored.taken(kind, key)
            self._dirty = True

        return changed

    def _readable(self, kind: str, items: dict[str, dict[str, Any]]) -> Iterable[dict[str, Any]]:
        bad = self._unreadable[kind]
        return items.values() if not bad else (obj for key, obj in items.items() if key not in bad)

    def _policies(self) -> tuple[list[dict[str, Any]], dict[str, tuple[str, str]]]:
        """The GpuPolicies whose shape the view can read, and the problem of each of the others."""
        readable, problems = [], {}
        for key, obj in self.policies.snapshot().items():
            problem = check(obj, POLICY, "gpupolicy")
            if problem:
                problems[key] = ("malformed", problem)
            else:
                readable.append(obj)
        return readable, problems

    def current(self) -> ClusterView:
        if not self._dirty and not self._recount:
            return self._view
        with self._lock:
            if self._recount and not self._dirty and self.shares is not None:
                self._recount = False  # only the counts changed: the same view with new counts, nothing re-read
                self._view = replace(self._view, shared_claim_pods=self.shares.counts())
            if self._dirty:
                self._dirty = self._recount = False  # cleared first: an event during the rebuild marks it again
                self.rebuilds += 1
                nodes = self._readable("Node", self.nodes.snapshot()) if self.nodes is not None else ()
                policies, problems = self._policies()
                self._view, invalid = view_from_objects(
                    policies, self._readable("Namespace", self.namespaces.snapshot()), nodes,
                    default_mode=self._default_mode, own_namespace=self._own_namespace,
                    metrics_configured=self._metrics_configured, route_cpu_pods=self._route_cpu_pods)
                if self.shares is not None:
                    self._view = replace(self._view, shared_claim_pods=self.shares.counts())
                self.ignored.only("GpuPolicy", {**problems,
                                                **{name: ("invalid-policy", error) for name, error in invalid}})
            return self._view
