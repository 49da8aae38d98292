"""Where the extender's knowledge comes from: four Reflectors, or a fixed value.

- Nodes and bound pods feed the `ClusterCache` (the node model). Pods are
  watched with kube-scheduler's own field selector for assigned pods
  (`spec.nodeName!=`, not Succeeded/Failed): pending pods cost nothing, and
  a pod getting bound arrives as an ADDED event, which is the signal that
  ends its assumption.
- GpuPolicies and Namespaces build the `ClusterView` used to pick the packing
  strategy and typeFit products, rebuilt lazily after a change (never per
  request).

A policy the model refuses is skipped and logged (the validating webhook
keeps new ones out; older objects may predate it).
"""

from __future__ import annotations

import functools
import gc
import logging
import threading
from typing import Any, Protocol

from extender.cache import ClusterCache
from gpupolicy.cluster import ClusterView, view_from_objects
from gpupolicy.model import GROUP, PLURAL, VERSION, Mode

log = logging.getLogger(__name__)

ASSIGNED_PODS = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"


class ViewSource(Protocol):
    def current(self) -> ClusterView: ...

    def ready(self) -> bool: ...


class StaticSource:
    """A fixed policy view and a cache fed by hand: tests and `--no-watch`."""

    def __init__(self, view: ClusterView | None = None) -> None:
        self._view = view or ClusterView()

    def current(self) -> ClusterView:
        return self._view

    def ready(self) -> bool:
        return True

    def set_view(self, view: ClusterView) -> None:
        self._view = view




class ClusterWatch:
    """Reflectors on nodes, assigned pods, GpuPolicies and Namespaces; a ViewSource for the policies."""

    def __init__(self, api_client: Any, cache: ClusterCache, *, default_mode: Mode = Mode.RECOMMEND,
                 watch_timeout: int = 300) -> None:
        from kubernetes import client

        from kube.reflector import Reflector, custom_objects_lister

        core = client.CoreV1Api(api_client)
        self.cache = cache
        self._default_mode = default_mode
        self._lock = threading.Lock()
        self._dirty = True
        self._view = ClusterView(default_mode=default_mode)
        t = watch_timeout
        self.nodes = Reflector(core.list_node, on_change=cache.on_node, name="nodes", timeout_seconds=t)
        self.pods = Reflector(functools.partial(core.list_pod_for_all_namespaces, field_selector=ASSIGNED_PODS),
                              on_change=cache.on_pod, name="pods", timeout_seconds=t)
        self.policies = Reflector(custom_objects_lister(api_client, GROUP, VERSION, PLURAL),
                                  on_change=self._changed, name="gpupolicies", timeout_seconds=t)
        self.namespaces = Reflector(core.list_namespace, on_change=self._changed, name="namespaces",
                                    timeout_seconds=t)
        self._reflectors = (self.nodes, self.pods, self.policies, self.namespaces)

    def start(self) -> ClusterWatch:
        for reflector in self._reflectors:
            reflector.start()
        threading.Thread(target=self._freeze_after_sync, name="gc-freeze", daemon=True).start()
        return self

    def _freeze_after_sync(self) -> None:
        """Move the initial lists (most of the process's objects) out of the collector's sight.

        A full collection walks every object: with 5,000 nodes and their pods
        that is tens of milliseconds inside some unlucky request. The cached
        objects live as long as the process, so the collector gains nothing
        from them.
        """
        if all(r.wait_for_sync(600) for r in self._reflectors):
            gc.collect()
            gc.freeze()
            log.info("caches synced; %d objects frozen out of garbage collection", gc.get_freeze_count())

    def stop(self) -> None:
        for reflector in self._reflectors:
            reflector.stop()

    def ready(self) -> bool:
        return all(r.has_synced() for r in self._reflectors)

    def _changed(self, _event: str, _obj: dict[str, Any]) -> None:
        self._dirty = True

    def current(self) -> ClusterView:
        if not self._dirty:
            return self._view
        with self._lock:
            if self._dirty:
                self._dirty = False  # cleared first: an event during the rebuild marks it again
                self._view, invalid = view_from_objects(
                    self.policies.snapshot().values(), self.namespaces.snapshot().values(),
                    default_mode=self._default_mode)
                for name, error in invalid:
                    log.warning("ignoring invalid GpuPolicy %s: %s", name, error)
            return self._view
