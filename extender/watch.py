"""Where the extender's knowledge comes from: the shared watch cache (`kube.views`) plus two feeds.

- Nodes and bound pods feed the `ClusterCache` (the node model); so do ResourceSlices and ResourceClaims
  (`resource.k8s.io/v1`, when the API serves it): the devices NVIDIA's DRA driver publishes per node and
  the ones the scheduler allocated to each claim (docs/designs/dra.md, "The live model"). Pods are
  watched with kube-scheduler's own field selector for assigned pods
  (`spec.nodeName!=`, not Succeeded/Failed): pending pods cost nothing, and
  a pod getting bound arrives as an ADDED event, which is the signal that
  ends its assumption.
- GpuPolicies and Namespaces build the `ClusterView` used to pick the packing
  strategy and typeFit products (`kube.views.WatchedView`, the webhook's
  mechanism too), rebuilt lazily after a change (never per request).

Garbage collection. The initial lists are frozen out of the collector once
synced (`WatchedView.start(freeze_after_sync=True)`), but a watch event that
changes what is kept replaces a frozen object with a new one, which the
collector promotes to its oldest generation. Before kube.reflector wrote a
heartbeat's resourceVersion into the object held, kubelets' status reports
replaced every node within 5 minutes, and a full collection walked the whole
cluster again (207 ms at 15,000 nodes, inside whichever request triggered
it; docs/benchmarks/history/extender.md, issue 16 fourth round); pods bound and deleted still
do so for theirs. Those objects live until the next event for the same
object and form no reference cycles (the full collections measured in the
worker collected nothing), so while the watch runs the oldest generation is
never collected automatically; the young ones still are.

The young generations need help too: the collector counts allocations
minus deallocations, and a watch event frees the object it replaces, so
events alone never trigger a young collection while each that changes what
is kept leaves a new object in the youngest generation. After a quiet time
for the scheduler (no requests) the first request paid for all of them: a
gen0 and a gen1 collection of 180 ms each after 18,000 node reports (when
heartbeats still replaced objects). A thread collects the young generations
every `YOUNG_SECONDS` instead (a second of events: under a millisecond at 50
reports a second).

Settling. The same holds for the model itself: a pod event only marks its
node's row dirty, and the next request recomputed every dirty row, some 250
us each. A scheduler that sent nothing while pods were bound directly, or
the first request after start-up, paid for all of them: a second at 5,000
nodes (docs/benchmarks.md, issue 47). A settle thread builds the model once
the lists are synced, rebuilds it after a node joins or changes capacity (at
most every `REBUILD_SECONDS`), and recomputes dirty rows every
`SETTLE_SECONDS`, `SETTLE_ROWS` per hold of the lock, so a request finds the
rows of the last moment at most.

The interpreter. The watch and settle threads run Python too, and a request
thread that wakes while one of them holds the interpreter waited up to its
switch interval, 5 ms by default: the size of the whole budget of a request
(issue 47). While the watch runs the interval is `SWITCH_SECONDS`.
"""

from __future__ import annotations

import gc
import sys
import threading
import time
from typing import Any

from extender.cache import ClusterCache
from gpupolicy.model import Mode
from kube.views import WatchedView

ASSIGNED_PODS = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"
NEVER = 1 << 30  # gen1 collections before a full one: never, in practice (module doc)
YOUNG_SECONDS = 1.0  # the young generations collected at least this often while the watch runs
SETTLE_SECONDS = 0.1  # dirty rows recomputed at least this often, between requests (module doc)
REBUILD_SECONDS = 1.0  # the settle thread rebuilds a changed node list at most this often
SWITCH_SECONDS = 0.0005  # how long a request waits for the interpreter behind another thread (module doc)


class ClusterWatch(WatchedView):
    """The policy view plus Reflectors on nodes and assigned pods feeding `cache`; `start()` freezes the lists."""

    def __init__(self, api_client: Any, cache: ClusterCache, *, default_mode: Mode = Mode.RECOMMEND,
                 watch_timeout: int = 300) -> None:
        from kube import rest
        from kube.claims import DRA_API, serves_dra
        from kube.reflector import Reflector
        from kube.trim import claim_fields, node_fields, pod_fields

        t = watch_timeout
        self.cache = cache
        self._thresholds, self._switch = gc.get_threshold(), sys.getswitchinterval()
        self._stopped = threading.Event()
        self.pods = Reflector(rest.lister(api_client, "/api/v1/pods", fieldSelector=ASSIGNED_PODS),
                              on_change=cache.on_pod, transform=pod_fields, name="pods", timeout_seconds=t)
        self.node_feed = Reflector(rest.lister(api_client, "/api/v1/nodes"), on_change=cache.on_node,
                                   transform=node_fields, name="nodes", timeout_seconds=t)
        self.dra_feeds = tuple(
            Reflector(rest.lister(api_client, f"{DRA_API}/{plural}"), on_change=on_change, transform=transform,
                      name=plural, timeout_seconds=t)
            for plural, on_change, transform in (("resourceslices", cache.on_slice, None),
                                                 ("resourceclaims", cache.on_claim, claim_fields))
        ) if serves_dra(api_client) else ()
        super().__init__(api_client, default_mode=default_mode, feeds=(self.node_feed, self.pods, *self.dra_feeds),
                         watch_timeout=t, ignored=cache.ignored)

    def start(self, *, freeze_after_sync: bool = True) -> ClusterWatch:
        """Start the Reflectors; `freeze_after_sync`: keep the cluster's objects out of full collections."""
        self._thresholds, self._switch = gc.get_threshold(), sys.getswitchinterval()
        sys.setswitchinterval(SWITCH_SECONDS)
        if freeze_after_sync:
            gc.set_threshold(self._thresholds[0], self._thresholds[1], NEVER)
            threading.Thread(target=self._collect_young, name="gc-young", daemon=True).start()
        super().start(freeze_after_sync=freeze_after_sync)
        threading.Thread(target=self._settle, name="model-settle", daemon=True).start()
        return self

    def _settle(self) -> None:
        """Keep the model applied between requests (module doc, "Settling")."""
        feeds = (self.node_feed, self.pods, *self.dra_feeds)
        while not all(f.wait_for_sync(SETTLE_SECONDS) for f in feeds):
            if self._stopped.is_set():
                return
        rebuilt = -REBUILD_SECONDS
        while not self._stopped.wait(SETTLE_SECONDS):
            if time.monotonic() - rebuilt >= REBUILD_SECONDS:
                self.cache.rebuild()
                rebuilt = time.monotonic()
            while self.cache.settle() and not self._stopped.wait(0.001):  # a waiting request takes the lock
                pass

    def _collect_young(self) -> None:
        while not self._stopped.wait(YOUNG_SECONDS):
            gc.collect(1)

    def stop(self) -> None:
        self._stopped.set()
        super().stop()
        gc.set_threshold(*self._thresholds)
        sys.setswitchinterval(self._switch)
