"""ClusterView: everything an admission decision may know about the cluster, as one value.

The webhook keeps it fresh from watches (policies, namespaces, nodes) and hands
a snapshot to the core; the dry-run builds one from files. Decisions never
call the API server: whatever is not in the view does not exist for them.
Pure: construction from API objects is plain dict reading.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, TypeVar

from gpupolicy.catalog import (
    DEFAULT_CATALOG,
    DISABLED_LAYOUT,
    GPU_REPLICAS_LABEL,
    MIG_CONFIG_LABEL,
    MIG_RESOURCE_PREFIX,
    PLUGIN_CONFIG_LABEL,
    PRODUCT_LABEL,
    SHARED_GPU_RESOURCE,
    Catalog,
    GpuProduct,
)
from gpupolicy.model import HUB_DISCONNECTED, HUB_STATE_LABEL, GpuPolicy, Mode, ProposalState, parse_valid_policies
from gpupolicy.modes import EffectiveMode, effective_mode

DEFAULT_NAMESPACE = "kubeon-gpu"
PROTECTED_NAMESPACES = frozenset({"kube-system"})

# GFD's label for the GPU Operator's MIG strategy: only `mixed` advertises a MIG device as
# `nvidia.com/mig-<profile>`; `single` advertises it as `nvidia.com/gpu`, `none` not at all.
MIG_STRATEGY_LABEL = "nvidia.com/mig.strategy"
MIXED_MIG_STRATEGY = "mixed"
# The prefix of the time-slicing ConfigMap keys the controller writes (gpupolicy.capacity.timeslicing names
# its keys with it). Every such key holds a config with `renameByDefault: true`, so a node running one
# advertises `nvidia.com/gpu.shared`.
OWN_PLUGIN_CONFIG_PREFIX = "kubeon-ts-"


T = TypeVar("T")


def names_mig_per_profile(labels: Mapping[str, str], allocatable: Iterable[str]) -> bool:
    """Whether a node's device plugin advertises MIG devices as `nvidia.com/mig-<profile>`: GFD's
    `nvidia.com/mig.strategy` is `mixed`, or the node already advertises some `nvidia.com/mig-*` (only
    `mixed` does), or the label is unset (nothing says otherwise). The webhook's offers and the layout
    planner both read it here."""
    strategy = labels.get(MIG_STRATEGY_LABEL)
    if strategy is None:
        return True
    return strategy == MIXED_MIG_STRATEGY or any(str(name).startswith(MIG_RESOURCE_PREFIX) for name in allocatable)


def names_shares_apart(key: str) -> bool:
    """Whether a node running time-slicing config `key` advertises `nvidia.com/gpu.shared`: only kubeon's
    own keys are known to (`renameByDefault: true`); an operator's may advertise the shares as
    `nvidia.com/gpu`, so for it only the node's allocatable tells."""
    return key.startswith(OWN_PLUGIN_CONFIG_PREFIX)


@dataclass(frozen=True)
class NodeInfo:
    """The parts of a Node the admission core reads: GPU labels and allocatable resources."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    allocatable: Mapping[str, str] = field(default_factory=dict)

    @property
    def gpu_product(self) -> str | None:
        return self.labels.get(PRODUCT_LABEL)


def node_from_object(obj: Mapping[str, Any]) -> NodeInfo:
    """Read a core/v1 Node (as a dict) into a NodeInfo, keeping only GPU-relevant parts."""
    metadata = obj.get("metadata") or {}
    status = obj.get("status") or {}
    labels = {str(k): str(v) for k, v in (metadata.get("labels") or {}).items()}
    allocatable = {str(k): str(v) for k, v in (status.get("allocatable") or {}).items()}
    return NodeInfo(name=str(metadata.get("name", "")), labels=labels, allocatable=allocatable)


@dataclass(frozen=True)
class ClusterView:
    """A consistent snapshot for one decision; cheap to share between threads (immutable)."""

    policies: tuple[GpuPolicy, ...] = ()
    namespace_labels: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    nodes: tuple[NodeInfo, ...] = ()
    default_mode: Mode = Mode.RECOMMEND
    own_namespace: str = DEFAULT_NAMESPACE
    catalog: Catalog = DEFAULT_CATALOG
    # The hub refused this cluster's token (policies labelled Disconnected): nothing may act.
    hub_disconnected: bool = False
    # Whether GPU metrics (--prometheus-url) are configured: without them sharing and
    # scaleToZero stay Recommend (gpupolicy.modes.effective_mode).
    metrics_configured: bool = False
    # CPU-only pods that tolerate the GPU taint get the schedulerName of the policies they match
    # (admission.mutate.routes_cpu_pod; the chart's webhook.routeCpuPodsOnGpuNodes).
    route_cpu_pods: bool = True
    # (namespace, claim) -> pods naming that shared claim (`kubeon-ts-...`) that have not ended, as the
    # webhook's watch and its own recent admissions count them (gpupolicy.admission.sharedclaims)
    shared_claim_pods: Mapping[tuple[str, str], int] = field(default_factory=dict)

    def mode_of(self, policy: GpuPolicy) -> EffectiveMode:
        """The mode `policy` runs in here: the one function every component uses (once per policy and view)."""
        return self.remembered(("mode",), policy, lambda: effective_mode(
            policy, self.default_mode, self.metrics_configured, not self.hub_disconnected))

    @cached_property
    def ordered_policies(self) -> tuple[GpuPolicy, ...]:
        """Policies by priority (highest first), then name: sorted once per view, not per review."""
        return tuple(sorted(self.policies, key=lambda p: (-p.spec.priority, p.name)))

    def labels_of_namespace(self, namespace: str) -> Mapping[str, str]:
        """Labels of a namespace; unknown namespaces still carry the automatic name label."""
        labels = dict(self.namespace_labels.get(namespace, {}))
        labels.setdefault("kubernetes.io/metadata.name", namespace)
        return labels

    def is_protected(self, namespace: str) -> bool:
        """kube-system and the optimizer's own namespace are never touched."""
        return namespace in PROTECTED_NAMESPACES or namespace == self.own_namespace

    def node_products(self) -> list[GpuProduct]:
        """Catalog products seen on nodes (GFD product label), in first-seen order, no repeats."""
        return list(self._node_products)

    @cached_property
    def _node_products(self) -> tuple[GpuProduct, ...]:
        """Worked out once per view: each admission asks, and a view can hold thousands of nodes."""
        seen: dict[str, GpuProduct] = {}
        for node in self.nodes:
            label = node.gpu_product
            product = self.catalog.product(label) if label else None
            if product is not None and product.product not in seen:
                seen[product.product] = product
        return tuple(seen.values())

    @cached_property
    def view_answers(self) -> dict[Any, Any]:
        """Answers that depend on this view alone (not on the pod), worked out on first use and dropped
        with the view (docs/designs/caches.md lists them). Views are immutable, so an entry never goes
        stale; concurrent writers compute the same value."""
        return {}

    def remembered(self, key: Hashable, owner: object, build: Callable[[], T]) -> T:
        """`build()` once per view for `key` and `owner` (a policy or spec object, named by its id): the
        owner is kept beside the answer, so an id a collected object left behind never returns its answer."""
        full = (key, id(owner))
        found = self.view_answers.get(full)
        if found is None or found[0] is not owner:
            found = (owner, build())
            self.view_answers[full] = found
        value: T = found[1]
        return value

    def labels_for_product(self, product: GpuProduct) -> Mapping[str, str]:
        """Labels of the first node carrying `product` (where GFD `.memory` labels live), else empty."""
        for node in self.nodes:
            label = node.gpu_product
            if label and self.catalog.product(label) == product:
                return node.labels
        return {}

    def told_to_offer(self, node: NodeInfo) -> set[str]:
        """Resources the node's GPU Operator labels promise before its allocatable shows them: what
        the controller's layout applied, so a node being re-laid counts at once (the planner's
        `Layout.offers` is the same promise, made by the controller itself).

        - `nvidia.com/mig.config=<layout>` (not `all-disabled`): the layout's `nvidia.com/mig-<profile>`
          devices, but only where the device plugin names them per profile: GFD's
          `nvidia.com/mig.strategy` is `mixed`, or the node already advertises some `nvidia.com/mig-*`
          (only `mixed` does), or the label is unset (nothing says otherwise: a view from hand-written
          files). Under `single` MIG devices are `nvidia.com/gpu` and under `none` they are not
          advertised: the layout label promises nothing new.
        - `nvidia.com/device-plugin.config=<key>`: `nvidia.com/gpu.shared` only for a key of ours
          (`kubeon-ts-...`, whose config sets `renameByDefault: true`). An operator's key may as well
          keep `renameByDefault: false` (the plugin's default, NVIDIA's examples), which advertises the
          shares as `nvidia.com/gpu`: for it only the node's allocatable says `nvidia.com/gpu.shared`.
          GFD's `gpu.replicas`, `gpu.sharing-strategy` and `-SHARED` product suffix say the node is
          time-sliced, never under which name, so they promise nothing here either.
        """
        mig = node.labels.get(MIG_CONFIG_LABEL)
        if mig and mig != DISABLED_LAYOUT:
            if not self._names_mig_per_profile(node):
                return set()
            product = self.catalog.product(node.gpu_product or "")
            layout = product.mig_layout(mig) if product else None
            return set(layout.resources(1)) if layout else set()
        key = node.labels.get(PLUGIN_CONFIG_LABEL, "")
        return {SHARED_GPU_RESOURCE} if names_shares_apart(key) else set()

    @staticmethod
    def _names_mig_per_profile(node: NodeInfo) -> bool:
        return names_mig_per_profile(node.labels, node.allocatable)

    @cached_property
    def _node_offers(self) -> tuple[frozenset[str], ...]:
        """Per node (in `nodes` order): what its allocatable advertises (above zero) and its labels
        promise (`told_to_offer`). Worked out once per view."""
        found = []
        for node in self.nodes:
            names = set(self.told_to_offer(node))
            for name, value in node.allocatable.items():
                try:
                    if float(value) > 0:
                        names.add(name)
                except ValueError:
                    continue
            found.append(frozenset(names))
        return tuple(found)

    @cached_property
    def offered(self) -> frozenset[str]:
        """Resources some node offers (allocatable), was told to offer (`told_to_offer`), or an
        applied/approved node layout proposal (the controller's planner, in a policy status) offers;
        a MIG proposal for a node whose MIG strategy does not name devices per profile (`single`)
        offers nothing. Worked out once per view."""
        found: set[str] = set().union(*self._node_offers)
        by_name = {node.name: node for node in self.nodes}
        going = (ProposalState.APPROVED, ProposalState.APPLIED)
        for policy in self.policies:
            for p in policy.status.proposals if policy.status else ():
                if not (p.resource and p.target.startswith("Node/") and p.state in going):
                    continue
                node = by_name.get(p.target.removeprefix("Node/"))
                if (p.resource.startswith(MIG_RESOURCE_PREFIX) and node is not None
                        and not self._names_mig_per_profile(node)):
                    continue
                found.add(p.resource)
        return frozenset(found)

    def offering(self, resource: str) -> list[NodeInfo]:
        """The nodes that advertise `resource` or are told to (`told_to_offer`), in `nodes` order."""
        return [node for node, names in zip(self.nodes, self._node_offers, strict=True) if resource in names]

    def offers(self, resource: str) -> bool:
        """Whether `resource` is in `offered`. A view that knows no nodes cannot tell and says yes
        (a dry-run without nodes)."""
        return not self.nodes or resource in self.offered

    def shared_replicas(self) -> int | None:
        """Shares per GPU on the nodes offering `nvidia.com/gpu.shared` (GFD's `nvidia.com/gpu.replicas`,
        from the time-slicing ConfigMap key they run): the fewest, None when no node offers shares."""
        return self._shared_replicas

    @cached_property
    def _shared_replicas(self) -> int | None:
        found = [int(n.labels[GPU_REPLICAS_LABEL]) for n, names in zip(self.nodes, self._node_offers, strict=True)
                 if SHARED_GPU_RESOURCE in names and n.labels.get(GPU_REPLICAS_LABEL, "").isdigit()
                 and int(n.labels[GPU_REPLICAS_LABEL]) > 1]
        return min(found) if found else None

    def with_policies(self, policies: Iterable[GpuPolicy]) -> ClusterView:
        return replace(self, policies=tuple(policies))

    def with_nodes(self, nodes: Iterable[NodeInfo]) -> ClusterView:
        return replace(self, nodes=tuple(nodes))

    def with_namespace(self, name: str, labels: Mapping[str, str]) -> ClusterView:
        return replace(self, namespace_labels={**self.namespace_labels, name: dict(labels)})


def in_force(obj: Mapping[str, Any]) -> bool:
    """False for a policy the controller labelled hub-Disconnected: its cluster token was refused, so
    nothing acts on it (the webhook admits pods unchanged, the extender stays neutral). Pure."""
    meta = obj.get("metadata")
    labels = meta.get("labels") if isinstance(meta, Mapping) else None  # any stored object: read loosely
    return not isinstance(labels, Mapping) or labels.get(HUB_STATE_LABEL) != HUB_DISCONNECTED


def hub_cut_off(policies: Iterable[Mapping[str, Any]]) -> bool:
    """Whether the hub refused this cluster's token, as the policies record it (any labelled
    Disconnected): then nothing acts, on any policy. The webhook's and extender's view and the
    controller's policy status read it here, so what `kubectl get gpupolicies` shows is what runs. Pure."""
    return any(not in_force(p) for p in policies)


def view_from_objects(
    policies: Iterable[Mapping[str, Any]],
    namespaces: Iterable[Mapping[str, Any]],
    nodes: Iterable[Mapping[str, Any]] = (),
    *,
    default_mode: Mode = Mode.RECOMMEND,
    own_namespace: str = DEFAULT_NAMESPACE,
    metrics_configured: bool = False,
    route_cpu_pods: bool = True,
) -> tuple[ClusterView, list[tuple[str, str]]]:
    """Assemble a view from watch-cache objects (plain API dicts). Pure.

    Returns the view and the (name, error) of each GpuPolicy the model refused,
    for the caller to log: one invalid policy never hides the others.
    """
    policies = list(policies)
    valid, invalid = parse_valid_policies(p for p in policies if in_force(p))
    labels: dict[str, dict[str, str]] = {}
    for obj in namespaces:
        meta = obj.get("metadata") or {}
        labels[str(meta.get("name"))] = dict(meta.get("labels") or {})
    view = ClusterView(
        policies=tuple(valid), namespace_labels=labels, nodes=tuple(node_from_object(n) for n in nodes),
        default_mode=default_mode, own_namespace=own_namespace, metrics_configured=metrics_configured,
        hub_disconnected=hub_cut_off(policies), route_cpu_pods=route_cpu_pods,
    )
    return view, invalid
