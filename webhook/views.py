"""Where the webhook's ClusterView comes from: a static value, or watches kept fresh in the background.

The admission path only calls `current()`, which returns an immutable
ClusterView built at most once per change: no API call, no parsing per
request. In-cluster (or with a kubeconfig) three Reflectors watch GpuPolicy
objects, Namespaces and Nodes; a policy the model refuses is skipped and
logged (the validating webhook keeps new ones out, but older objects may
predate it).
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Protocol

from gpupolicy.cluster import ClusterView, view_from_objects
from gpupolicy.model import GROUP, PLURAL, VERSION, Mode

log = logging.getLogger(__name__)


class ViewSource(Protocol):
    def current(self) -> ClusterView: ...

    def ready(self) -> bool: ...


class StaticView:
    """A fixed view: tests, `--no-watch`, and `--policies FILE` without a cluster."""

    def __init__(self, view: ClusterView) -> None:
        self._view = view

    def current(self) -> ClusterView:
        return self._view

    def ready(self) -> bool:
        return True



class WatchedView:
    """A view assembled from three Reflectors; rebuilt lazily after any watch event."""

    def __init__(self, api_client: Any, *, default_mode: Mode, own_namespace: str,
                 metrics_configured: bool = False) -> None:
        from kubernetes import client

        from kube.reflector import Reflector, custom_objects_lister

        self._default_mode = default_mode
        self._own_namespace = own_namespace
        self._metrics_configured = metrics_configured
        self._lock = threading.Lock()
        self._dirty = True
        self._view = ClusterView(default_mode=default_mode, own_namespace=own_namespace,
                                 metrics_configured=metrics_configured)
        core = client.CoreV1Api(api_client)
        self.policies = Reflector(custom_objects_lister(api_client, GROUP, VERSION, PLURAL),
                                  on_change=self._changed, name="gpupolicies")
        self.namespaces = Reflector(core.list_namespace, on_change=self._changed, name="namespaces")
        self.nodes = Reflector(core.list_node, on_change=self._changed, name="nodes")
        self._reflectors = (self.policies, self.namespaces, self.nodes)

    def start(self) -> WatchedView:
        for reflector in self._reflectors:
            reflector.start()
        return self

    def stop(self) -> None:
        for reflector in self._reflectors:
            reflector.stop()

    def _changed(self, _event: str, _obj: dict[str, Any]) -> None:
        self._dirty = True

    def ready(self) -> bool:
        return all(r.has_synced() for r in self._reflectors)

    def current(self) -> ClusterView:
        if not self._dirty:
            return self._view
        with self._lock:
            if self._dirty:
                self._dirty = False  # cleared first: an event during the rebuild marks it again
                self._view, invalid = view_from_objects(
                    self.policies.snapshot().values(), self.namespaces.snapshot().values(),
                    self.nodes.snapshot().values(), default_mode=self._default_mode,
                    own_namespace=self._own_namespace, metrics_configured=self._metrics_configured)
                for name, error in invalid:
                    log.warning("ignoring invalid GpuPolicy %s: %s", name, error)
            return self._view
