"""GPU capacity through Karpenter: the NodePool, NodeClaims for shared GPUs, usage-aware consolidation (issue 19).

One pass (every 10 s, as Karpenter's disruption loop), capacity policies
highest priority first, under `--capacity-provider karpenter` (managed node
groups, eks-nodegroups, gke-nodepools and aks-nodepools, act through the
same steps with their provider: docs/designs/nodegroups.md):

0. Eviction counts a crash left pending are settled (status.evictions).
1. Drains in flight (node annotation `gpu.kubeon.io/draining`) move one step
   each (gpupolicy/capacity/drain.py): evict through the Eviction API, delete
   the NodeClaim once empty, or undo past the deadline. They are carried on
   whatever the policies say now, so no node stays cordoned. Replacements in
   flight (`gpu.kubeon.io/replacing`) start their drain once the new nodes
   are up, or are undone.
2. The NodePool is kept in the declared shape by server-side apply
   (gpupolicy/capacity/nodepool.py; a field another manager owns is a 409,
   reported as condition NodePool=False, never forced); its GPU limit is
   maxGpus less what Karpenter's own count cannot see.
3. Provisioning: pending pods on `nvidia.com/gpu.shared` / `nvidia.com/mig-*`
   that nothing can serve, counting launching NodeClaims
   (gpupolicy/capacity/demand.py), are planned onto new nodes by
   `plan_launches`; each launch is a NodeClaim booting the sharing layout.
   Whole-GPU pods are Karpenter's own: it provisions them from the NodePool.
4. Consolidation: `plan_disruptions` on every GPU node (the packing engine
   re-places the pods of candidates first) with each node's DCGM utilisation
   over `consolidation.for`, eviction counts, pod ages and the instance types
   a replacement may launch; do-not-disrupt on node or pod, drains and
   replacements under way or recently undone, and nodes pending pods wait
   for are blocked.
The steps are the modules of this package: eviction_counts (0), drain and
replacement (1 and their writes), pool (2), provision (3), consolidation (4,
with usage: the utilisation it reads), over state (what the pass read, the
provider, the mode gate).
Mode gating (gpupolicy/proposals.py): every write is a proposal first
(target `NodePool/<pool>` for the pool and launches, `Node/<name>` for a
disruption); Recommend writes nothing; Approve applies the targets listed in
spec.approvals; Automatic applies. A usage-aware disruption needs Prometheus
(gpupolicy/modes.disruption_mode); request-based ones keep the policy's mode.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from importlib.resources import files

from controller import crashpoints
from controller.capacity import eviction_counts, replacement
from controller.capacity.consolidation import EmptyTracker, NodePodsMemo, consolidate
from controller.capacity.drain import advance_drains
from controller.capacity.pool import keep_pool
from controller.capacity.provision import plan_group, provision
from controller.capacity.state import SOURCE, Pass, Seen
from controller.capacity.usage import usage
from controller.context import ControllerContext
from controller.crashpoints import Checkpoint
from gpupolicy.capacity.allocatable import Allocatable, observed, offered
from gpupolicy.capacity.disruption import Disruption
from gpupolicy.capacity.failed_launches import FailedLaunches
from gpupolicy.capacity.instances import InstanceType, load_instances
from gpupolicy.capacity.provider import (
    AKS_NODEPOOLS,
    EKS_NODEGROUPS,
    GKE_NODEPOOLS,
    IMPLEMENTED,
    CapacityProvider,
    ProviderError,
)
from gpupolicy.capacity.provisioning import Launch
from gpupolicy.model import Condition, GpuPolicy, PolicyKind
from gpupolicy.modes import effective_mode
from gpupolicy.packing.kubestate import StateMemo
from kube import karpenter as kk

log = logging.getLogger(__name__)

__all__ = ["CHECKPOINTS", "SOURCE", "CapacityReconciler"]

# The instance catalog (gpupolicy/capacity/instances.py CSV) of the provider's cloud (AWS unless named here);
# KUBEON_GPU_INSTANCE_TYPES names another file.
DEFAULT_INSTANCES = files("gpupolicy.capacity") / "data" / "aws-gpu-instances.csv"
CATALOGS = {GKE_NODEPOOLS: files("gpupolicy.capacity") / "data" / "gcp-gpu-instances.csv",
            AKS_NODEPOOLS: files("gpupolicy.capacity") / "data" / "azure-gpu-instances.csv"}
INSTANCES_ENV = "KUBEON_GPU_INSTANCE_TYPES"
# after each write: KUBEON_GPU_CRASH_AT=capacity:<one of these> crashes there (controller/crashpoints.py)
CHECKPOINTS = ("cordoned", "evicted", "deleted", "launched", "replacing")
# (context, catalog products: type -> (GPU product, GPUs, $/h)) -> the pass's provider; tests pass their own
ProviderFactory = Callable[[ControllerContext, Mapping[str, tuple[str, int, float]]], "CapacityProvider"]
class CapacityReconciler:
    """Reconciler `capacity` in controller/loop.py's registry."""

    name = SOURCE
    _plan_group = staticmethod(plan_group)  # launches for pods waiting on one resource (provision.py)

    def __init__(self, period_seconds: float = 10.0, *, instances: list[InstanceType] | None = None,
                 step_seconds: float = 60.0, checkpoint: Checkpoint | None = None,
                 provider_factory: ProviderFactory | None = None) -> None:
        self.provider_factory: ProviderFactory = provider_factory or make_provider
        self.period_seconds = period_seconds
        self._instances = instances  # None: the catalog of the install's cloud, read by the first pass
        self.step_seconds = step_seconds
        self.checkpoint = checkpoint or crashpoints.from_env(SOURCE, CHECKPOINTS)
        self.empty = EmptyTracker()
        self.failed = FailedLaunches()
        self.states = StateMemo()  # the GPU nodes' packing state between passes (consolidation)
        self.node_pods = NodePodsMemo()  # what consolidation read of each GPU node's pods, between passes
        self.allocatable: dict[str, Allocatable] = {}  # per instance type, what its launched nodes offer
        self.last_launches: list[Launch] = []
        self.last_disruptions: list[Disruption] = []

    @property
    def instances(self) -> list[InstanceType]:
        return self.catalog("")

    def catalog(self, provider: str) -> list[InstanceType]:
        """The instance types new nodes are planned from: the file KUBEON_GPU_INSTANCE_TYPES names, else the
        catalog of `provider`'s cloud (read once; a controller runs one provider)."""
        if self._instances is None:
            source = os.environ.get(INSTANCES_ENV) or str(CATALOGS.get(provider, DEFAULT_INSTANCES))
            self._instances = load_instances(source)
        return self._instances

    @property
    def products(self) -> dict[str, tuple[str, int, float]]:
        return {t.name: (t.model, t.gpus, t.price_per_hour) for t in self.instances}

    def reconcile(self, ctx: ControllerContext) -> None:
        policies = ctx.policies.valid(PolicyKind.CAPACITY)
        if ctx.capacity_provider not in IMPLEMENTED:
            return  # the status says NotImplemented (gpupolicy/modes.handling); nothing to act with
        self.catalog(ctx.capacity_provider)
        cluster = ctx.cluster()
        nodes = cluster.nodes()
        # recorded work is carried on whatever the policies say now: a drain, and a replacement whose new
        # NodeClaims would otherwise keep running (advanced or undone by replacement.advance)
        if not policies and not any(replacement.disrupting(n) for n in nodes):
            return
        try:
            provider = self.provider_factory(ctx, self.products)
            seen = Seen(nodes, cluster.pods(), provider.nodes(), groups=provider.groups(), slices=cluster.slices())
            self._pass(ctx, provider, seen, policies)
        except ProviderError as exc:  # the cloud refused: its words in every policy's status, nothing more done
            log.warning("capacity: %s refused: %s", ctx.capacity_provider, exc)
            for policy in policies:
                ctx.policies.publish(policy.name, SOURCE, [], [Condition(
                    type="Provider", status="False", reason=exc.reason,
                    message=f"{ctx.capacity_provider}: {exc.message}"[:1000])])

    def _pass(self, ctx: ControllerContext, provider: CapacityProvider, seen: Seen, policies: list[GpuPolicy]) -> None:
        now = ctx.clock.now()
        if seen.groups is None:  # a node group's launch is its desired size, re-read each pass: nothing to time out
            for claim, kind in self.failed.observe(seen.claims, now):
                log.warning("capacity: NodeClaim %s (%s) went before its node registered: new launches leave %s "
                            "out for %.0fs", claim, kind, kind, self.failed.ttl)
        # kept for types none of which is up now
        self.allocatable.update(observed(seen.nodes, seen.claims, {t.name for t in self.instances}))
        p = Pass(ctx, provider, seen, offered(self.instances, self.allocatable), self.checkpoint, failed=self.failed,
                 unavailable=self.failed.unavailable(now), states=self.states)
        eviction_counts.settle(p, policies)  # what a crash between an eviction and its count left
        by_name = {policy.name: policy for policy in policies}
        shown = advance_drains(p, by_name)
        for name, more in replacement.advance(p, by_name).items():
            shown.setdefault(name, []).extend(more)
        evictions = eviction_counts.per_pod(p, policies)
        self.node_pods.keep({str(n["metadata"]["name"]) for n in seen.nodes})  # forget nodes gone
        windows = {policy.spec.capacity.consolidation.window_seconds for policy in policies if policy.spec.capacity}
        names = [str(n["metadata"]["name"]) for n in p.seen.nodes]
        used = {window: usage(ctx, names, window, self.step_seconds) for window in sorted(windows)}
        claimed: set[str] = set()  # a pending pod is provisioned for by the first policy covering it
        self.last_launches, self.last_disruptions = [], []
        for policy in policies:
            spec = policy.spec.capacity
            assert spec is not None
            mode = effective_mode(policy, ctx.default_mode, ctx.prometheus_configured).mode
            proposals = list(shown.get(policy.name, []))
            conditions: list[Condition] = []
            pool_ok = keep_pool(p, policy, spec, mode, proposals, conditions)
            self.last_launches += provision(p, policy, spec, mode, pool_ok, proposals, conditions, claimed)
            window = used[spec.consolidation.window_seconds]
            self.last_disruptions += consolidate(p, policy, spec, mode, window, self.empty, self.node_pods, evictions,
                                                 proposals, conditions)
            ctx.policies.publish(policy.name, SOURCE, proposals, conditions)


def make_provider(ctx: ControllerContext, products: Mapping[str, tuple[str, int, float]]) -> CapacityProvider:
    """The install's `capacity.provider` over this pass's clients (a cloud SDK imported only when it is asked for)."""
    if ctx.capacity_provider == EKS_NODEGROUPS:
        try:
            from kube.eks import EksNodeGroups
        except ImportError as exc:
            raise ProviderError("MissingDependency", f"{exc}: install kubeon-gpu-optimizer[eks]") from exc
        return EksNodeGroups(ctx.api, products, cluster=ctx.cloud.get("cluster", ""),
                             node_list=ctx.cluster().nodes, region=ctx.cloud.get("region") or None)
    if ctx.capacity_provider == GKE_NODEPOOLS:
        try:
            from kube.gke import GkeNodePools
        except ImportError as exc:
            raise ProviderError("MissingDependency", f"{exc}: install kubeon-gpu-optimizer[gke]") from exc
        return GkeNodePools(products, project=ctx.cloud.get("project", ""), location=ctx.cloud.get("location", ""),
                            cluster=ctx.cloud.get("cluster", ""), node_list=ctx.cluster().nodes)
    if ctx.capacity_provider == AKS_NODEPOOLS:
        try:
            from kube.aks import AksNodePools
        except ImportError as exc:
            raise ProviderError("MissingDependency", f"{exc}: install kubeon-gpu-optimizer[aks]") from exc
        return AksNodePools(products, subscription=ctx.cloud.get("subscription", ""),
                            resource_group=ctx.cloud.get("resourceGroup", ""), cluster=ctx.cloud.get("cluster", ""),
                            node_list=ctx.cluster().nodes)
    return kk.KarpenterProvider(ctx.api, products)

