"""What every reconciler is handed: the frame's shared services, passed in, never global.

The frame (leader election, policy sync, the reconcile runner) builds one
`ControllerContext` per process; reconcilers read policies and metrics from it,
publish proposals into policy status through `policies`, and record applied
actions through `recorder`. Tests build one with a fake clock and a scripted
metrics source.

Contract for reconcilers (`Reconciler` in controller/loop.py):
- every pass is idempotent and safe to repeat after a crash at any point;
- check `ctx.is_leader()` right before every write to the cluster (false while the hub refuses the
  cluster's token: revocation pauses every writer at once);
- never write to a workload when the policy's effective mode is Recommend.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import kubernetes.client

from controller.policies import PolicyStore
from controller.recorder import Recorder
from controller.sources import Clock, MetricsSource, SystemClock
from gpupolicy.model import Mode
from gpupolicy.modes import ALL_COMPONENTS, Component
from gpupolicy.packing.health import DEFAULT_ERROR_RATIO
from gpupolicy.packing.kubemodel import ParseMemo
from gpupolicy.scaling.metrics import Sample, Series
from kube.informers import ClusterCache
from kube.layout import patch_node

__all__ = ["Clock", "ControllerContext", "MetricsSource", "Sample", "Series", "SystemClock"]


@dataclass
class ControllerContext:
    """The shared services of one controller process."""

    api: kubernetes.client.ApiClient
    namespace: str
    default_mode: Mode
    prometheus_url: str | None
    metrics: MetricsSource | None
    clock: Clock
    recorder: Recorder
    policies: PolicyStore
    # True only while this replica may write: it holds the lease and, with a hub, the hub accepts the
    # cluster token (controller/hubsync.py). Every writer checks it right before each write.
    is_leader: Callable[[], bool]
    # Which parts of the install run (--components): a policy kind none of them handles is not Ready.
    components: frozenset[Component] = ALL_COMPONENTS
    # --keda (chart keda.enabled): write and pause KEDA ScaledObjects. Off, the guide's RBAC has no
    # KEDA rule: ScaledObjects are offered as YAML in the policy status and none is read.
    keda: bool = False
    # The lease alone (the hub poll runs on it while writers are paused); None: same as is_leader.
    holds_lease: Callable[[], bool] | None = None
    hub_configured: bool = False
    # --capacity-provider (chart capacity.provider): who adds and removes GPU nodes: karpenter, eks-nodegroups,
    # gke-nodepools or aks-nodepools.
    capacity_provider: str = "karpenter"
    # the cloud the provider calls (chart capacity.eks: region, cluster; capacity.gke: project, location, cluster;
    # capacity.aks: subscription, resourceGroup, cluster);
    # credentials: the SDK's default chain
    cloud: Mapping[str, str] = field(default_factory=dict)
    # --extender-url (the chart: the extender's Service): where controller/extenderhealth.py reads the
    # extender's counters; None: not read. `failing`: the running components failing open now (component ->
    # why), which the policies they serve show as Ready=False (gpupolicy.modes.handling).
    extender_url: str | None = None
    extender_error_ratio: float = DEFAULT_ERROR_RATIO
    failing: dict[Component, str] = field(default_factory=dict)
    # The watch-fed Nodes, Pods, PodDisruptionBudgets and workloads the reconcilers read (kube/informers.py),
    # started by the first pass that asks (`cluster()`); the process stops it.
    cache: ClusterCache | None = None
    # Told each pod change the cache's watch sees (controller/pendingbatch.py wakes the capacity pass).
    on_pod: Callable[[str, dict[str, Any]], None] | None = None
    # Pods parsed, by version (gpupolicy/packing/kubemodel.py ParseMemo): the runner's passes parse a pod
    # again only when it changed.
    parse_memo: ParseMemo = field(default_factory=ParseMemo)

    def cluster(self) -> ClusterCache:
        """The process's cluster cache, started and synced on first use (a pass waits for the first lists)."""
        if self.cache is None:
            self.cache = ClusterCache(self.api, self.on_pod).start()
        self.cache.wait_for_sync()
        return self.cache

    def lease_held(self) -> bool:
        return self.holds_lease() if self.holds_lease is not None else self.is_leader()

    def patch_node(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        """Merge-patch a node and hold the answer in the cluster cache: the next read sees our write (a
        drain record, a label) even before its watch event comes."""
        node = patch_node(self.api, name, patch)
        if self.cache is not None:
            self.cache.wrote(node)
        return node

    @property
    def prometheus_configured(self) -> bool:
        """Metric-driven kinds (sharing, scaleToZero) act only with a metrics source."""
        return self.metrics is not None and bool(self.prometheus_url)

    def write_status(self) -> int:
        """Write every policy status that changed (the runner calls this after each pass). Returns writes."""
        return self.policies.write_status(self.api, default_mode=self.default_mode,
                                          prometheus_configured=self.prometheus_configured, clock=self.clock,
                                          is_leader=self.is_leader, metrics=self.recorder.metrics,
                                          components=self.components, capacity_provider=self.capacity_provider,
                                          failing=self.failing)
