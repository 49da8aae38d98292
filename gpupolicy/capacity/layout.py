"""The sharing layout planner: which nodes offer whole GPUs, time-sliced shares or which MIG layout. Pure.

Pods rewritten onto `nvidia.com/gpu.shared` or `nvidia.com/mig-*` wait until
a node offers that resource; nodes offer it only once the GPU Operator is
told to (labels `nvidia.com/device-plugin.config`, `nvidia.com/mig.config`).
This module decides those labels from plain data: the sharing policies, the
GPU pods (pending, bound, and those the webhook left on whole GPUs because
nothing offered their slice: `gpu.kubeon.io/wanted-resource`) and the nodes.

The rule, in order:
1. Demand that what nodes offer (or were told to offer) can hold is not
   demand for a change: it is matched there first, and a node that holds any
   of it is left alone. A time-sliced share matches only a node sliced into
   the replicas its policy asks for: an edited policy moves empty nodes to
   a new key, and nodes with running pods keep theirs.
2. Only a node with no GPU pod is changed (no running pod is disturbed, and
   the MIG manager needs the GPUs empty), never one that is cordoned by
   someone else or in the middle of a re-layout.
3. Greedily, the change that serves the most waiting pods is made first, so
   the demand is served with the fewest node changes; ties go to the layout
   whose devices are most of the kinds asked for, then to the smaller node.
Every chosen change carries its reason ("node gpu-7: MIG all-1g.10gb serves
7 pending 1g.10gb pods; node is empty").
"""

from __future__ import annotations

import math
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpupolicy.capacity.timeslicing import config_key, own_key_replicas
from gpupolicy.catalog import (
    DEFAULT_CATALOG,
    DISABLED_LAYOUT,
    GPU_REPLICAS_LABEL,
    GPU_RESOURCE,
    MIG_CONFIG_LABEL,
    MIG_RESOURCE_PREFIX,
    PLUGIN_CONFIG_LABEL,
    PRODUCT_LABEL,
    SHARED_GPU_RESOURCE,
    WANTED_RESOURCE_ANNOTATION,
    Catalog,
    GpuProduct,
    normalise_product_label,
)
from gpupolicy.cluster import names_mig_per_profile, names_shares_apart
from gpupolicy.model import GpuPolicy, SharingStrategy
from gpupolicy.packing.dradevices import (
    NodeDevices,
    claims_demand,
    device_counts,
    node_devices,
    shared_claim_takers,
    shared_claims,
)
from gpupolicy.packing.kubemodel import ObjectError, memoised, pod_requests

GPU_COUNT_LABEL = "nvidia.com/gpu.count"
POLICY_ANNOTATION = "gpu.kubeon.io/policy"
WANTED_ANNOTATION = WANTED_RESOURCE_ANNOTATION
RELAYOUT_ANNOTATION = "gpu.kubeon.io/mig-relayout"
# What `nvidia.com/mig.config` was before the optimizer's first re-layout of the node ("" for none):
# written with that first step and kept, so an uninstall can put the node's layout label back.
MIG_CONFIG_FROM_ANNOTATION = "gpu.kubeon.io/mig-config-from"

WHOLE, TIME_SLICING, MIG = "whole", "time-slicing", "mig"


@dataclass(frozen=True)
class Layout:
    """How a node's GPUs are offered: whole, time-sliced into `replicas`, or the MIG layout `mig`."""

    kind: str = WHOLE
    replicas: int = 1
    mig: str = DISABLED_LAYOUT

    def describe(self) -> str:
        if self.kind == TIME_SLICING:
            return f"time-slicing {self.replicas} replicas"
        return f"MIG {self.mig}" if self.kind == MIG else "whole GPUs"

    @property
    def key(self) -> str | None:
        """The time-slicing ConfigMap key this layout runs with."""
        return config_key(self.replicas) if self.kind == TIME_SLICING else None

    def offers(self, product: GpuProduct | None, gpus: int) -> dict[str, int] | None:
        """Devices a node of `product` with `gpus` GPUs advertises; None for a MIG layout not in the catalog."""
        if self.kind == TIME_SLICING:
            return {SHARED_GPU_RESOURCE: gpus * self.replicas}
        if self.kind == MIG:
            layout = product.mig_layout(self.mig) if product else None
            return layout.resources(gpus) if layout else None
        return {GPU_RESOURCE: gpus}

    def labels(self, current: Layout) -> dict[str, str | None]:
        """Node labels that move a node from `current` to this layout (None removes a label)."""
        out: dict[str, str | None] = {}
        if self.kind == TIME_SLICING:
            out[PLUGIN_CONFIG_LABEL] = self.key
        elif current.kind == TIME_SLICING:
            out[PLUGIN_CONFIG_LABEL] = None
        if self.kind == MIG:
            out[MIG_CONFIG_LABEL] = self.mig
        elif current.kind == MIG:
            out[MIG_CONFIG_LABEL] = DISABLED_LAYOUT
        return out


@dataclass(frozen=True)
class GpuNode:
    """One GPU node as the planner sees it."""

    name: str
    product: GpuProduct | None
    gpus: int
    labels: Mapping[str, str]
    layout: Layout
    offers: Mapping[str, float]  # what it advertises, or was told to advertise
    busy: Mapping[str, float] = field(default_factory=dict)  # GPU devices bound pods hold
    gpu_pods: int = 0
    unschedulable: bool = False
    relayout_in_flight: bool = False

    def free(self, resource: str) -> float:
        return self.offers.get(resource, 0.0) - self.busy.get(resource, 0.0)


@dataclass(frozen=True)
class Demand:
    """One pod waiting for a GPU device it has no node for (pending, or left whole and wanting a slice)."""

    pod: str  # namespace/name
    resource: str
    count: float
    policy: str | None
    replicas: int  # time-sliced shares per GPU its policy asks for
    node_selector: Mapping[str, str]
    pending: bool
    products: frozenset[str] | None = None  # the pod's or policy's allowed products (None: any)


@dataclass(frozen=True)
class NodeTarget:
    """A node change the planner chose, with the policy it serves and why."""

    node: str
    policy: str
    current: Layout
    target: Layout
    served: Mapping[str, int]  # resource -> pods served
    reason: str

    @property
    def target_ref(self) -> str:
        """The proposal target and the spec.approvals entry that approves it."""
        return f"Node/{self.node}"

    @property
    def action(self) -> str:
        return f"layout {self.target.describe()}"

    @property
    def labels(self) -> dict[str, str | None]:
        return self.target.labels(self.current)

    @property
    def resource(self) -> str:
        """The resource this change offers to most of the pods it serves (the webhook reads it)."""
        return max(sorted(self.served), key=lambda r: self.served[r])


@dataclass(frozen=True)
class LayoutPlan:
    targets: tuple[NodeTarget, ...]
    matched: int  # waiting pods that what nodes already offer holds
    unserved: tuple[tuple[str, str], ...]  # (pod, why)

    def keys(self) -> dict[str, int]:
        """Time-slicing keys the targets need (key -> replicas)."""
        return {t.target.key: t.target.replicas for t in self.targets if t.target.key}


# -- reading nodes and pods -------------------------------------------------------------
class _EveryPod:
    """As `takers`: every pod counts its shared claims' GPU."""

    def __contains__(self, item: object) -> bool:
        return True


@dataclass(frozen=True, slots=True)
class _Reading:
    """What `read_nodes` and `read_demand` read of one pod version before anything else (`_reading`)."""

    asks: bool  # asks for a GPU (a resource, a claim) or waits for a slice: the only pods they count
    live: bool  # not terminating, not finished
    node: str  # spec.nodeName; "" while pending
    wanted: bool  # annotation WANTED_ANNOTATION set
    fixed: dict[str, float] | None  # its GPU resources (read-only); None when a shared claim makes them depend
    #                                 on the other pods (`shared_claim_takers`)


def _reading(pod: Mapping[str, Any]) -> _Reading:
    """The pod's reading, remembered per pod version (`memoised`): a capacity or layout pass reads every pod
    of the cluster, most bound and wanting nothing more, and between two passes few change
    (controller/capacity/consolidation.py `pod_facts` says what both saved)."""
    return memoised("gpu-reading", _read, pod)


def _read(pod: Mapping[str, Any]) -> _Reading:
    every = _gpu_requests(pod, _EveryPod())
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    wanted = WANTED_ANNOTATION in annotations
    node = str((pod.get("spec") or {}).get("nodeName") or "")
    return _Reading(asks=bool(every) or wanted, live=_is_live(pod), node=node, wanted=wanted,
                    fixed=None if shared_claims(pod) else every)


def _requests_of(pod: Mapping[str, Any], reading: _Reading, takers: Container[str]) -> dict[str, float]:
    """`_gpu_requests(pod, takers)`, from the reading where no shared claim makes it depend on `takers`."""
    return reading.fixed if reading.fixed is not None else _gpu_requests(pod, takers)


def _gpu_requests(pod: Mapping[str, Any], takers: Container[str]) -> dict[str, float]:
    """The pod's GPU resources, with what its claims on our templates ask for as the device plugin's names
    (a claim-based pod needs the same devices, published as ResourceSlices: `dradevices`); a shared claim's
    GPU only on the one pod of `takers` that counts it (`shared_claim_takers`)."""
    try:
        requests = pod_requests(pod)
    except ObjectError:
        return {}
    found = {name: float(v) for name, v in requests.items() if name.startswith("nvidia.com/") and v > 0}
    meta = pod.get("metadata") or {}
    gpus, mig = claims_demand(pod, f"{meta.get('namespace') or 'default'}/{meta.get('name', '')}" in takers)
    for name, count in [*([(GPU_RESOURCE, gpus)] if gpus else []), *mig.items()]:
        found[name] = found.get(name, 0.0) + count
    return found


def _is_live(pod: Mapping[str, Any]) -> bool:
    meta = pod.get("metadata") or {}
    return not meta.get("deletionTimestamp") and (pod.get("status") or {}).get("phase") not in (
        "Succeeded", "Failed")


def _number(text: Any) -> float:
    """A label's or quantity's number; 0 (unknown) for text that is no finite number ("1e400", "NaN"),
    which a node's labels may carry and which no count can be."""
    try:
        value = float(str(text))
    except ValueError:
        return 0.0
    return value if math.isfinite(value) else 0.0


def current_layout(labels: Mapping[str, str], key_replicas: Mapping[str, int]) -> Layout:
    """The layout a node's labels ask the GPU Operator for: replicas from the ConfigMap key it names, as read
    (`key_replicas`), else as our key's name says, else GFD's label."""
    mig = labels.get(MIG_CONFIG_LABEL)
    if mig and mig != DISABLED_LAYOUT:
        return Layout(MIG, mig=mig)
    key = labels.get(PLUGIN_CONFIG_LABEL)
    if key:
        replicas = (key_replicas.get(key) or own_key_replicas(key)
                    or int(_number(labels.get(GPU_REPLICAS_LABEL, "1")) or 1))
        if replicas > 1:
            return Layout(TIME_SLICING, replicas)
    return Layout()


def read_nodes(nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]],
               key_replicas: Mapping[str, int], catalog: Catalog = DEFAULT_CATALOG,
               slices: Iterable[Mapping[str, Any]] = ()) -> list[GpuNode]:
    """GPU nodes (a product label, a GPU count or DRA devices) with what they offer and what bound pods hold.
    A node whose NVIDIA DRA driver publishes devices (`slices`) offers those (`_dra_node`)."""
    published = node_devices(slices)
    busy: dict[str, dict[str, float]] = {}
    counts: dict[str, int] = {}
    readings = [(pod, reading) for pod in pods if (reading := _reading(pod)).asks]
    takers = shared_claim_takers(pod for pod, _ in readings)
    for pod, reading in readings:
        node = reading.node
        if not node or not reading.live:
            continue
        requests = _requests_of(pod, reading, takers)
        if requests:
            held = busy.setdefault(node, {})
            for name, count in requests.items():
                held[name] = held.get(name, 0.0) + count
            counts[node] = counts.get(node, 0) + 1
    found = []
    for obj in nodes:
        meta = obj.get("metadata") or {}
        labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
        allocatable = (obj.get("status") or {}).get("allocatable") or {}
        gpus = int(_number(labels.get(GPU_COUNT_LABEL, allocatable.get(GPU_RESOURCE, 0))))
        product_label = labels.get(PRODUCT_LABEL)
        name = str(meta.get("name", ""))
        if name in published:
            found.append(_dra_node(obj, labels, published[name], busy.get(name, {}), counts.get(name, 0), catalog))
            continue
        if gpus <= 0 and not product_label:
            continue
        product = catalog.product(product_label) if product_label else None
        layout = current_layout(labels, key_replicas)
        # the labels' promise stands for what the device plugin will advertise only where its naming is known
        # (gpupolicy.cluster, as the webhook reads it); elsewhere what the node advertises is what it offers
        trusted = (names_mig_per_profile(labels, allocatable) if layout.kind == MIG else
                   names_shares_apart(labels.get(PLUGIN_CONFIG_LABEL, "")) if layout.kind == TIME_SLICING else True)
        told = layout.offers(product, gpus) if trusted else None
        offers = {str(k): _number(v) for k, v in allocatable.items() if str(k).startswith("nvidia.com/")}
        found.append(GpuNode(
            name=name, product=product, gpus=gpus, labels=labels, layout=layout,
            offers={k: float(v) for k, v in told.items()} if told is not None else offers,
            busy=busy.get(name, {}), gpu_pods=counts.get(name, 0),
            unschedulable=bool((obj.get("spec") or {}).get("unschedulable")),
            relayout_in_flight=RELAYOUT_ANNOTATION in (meta.get("annotations") or {}),
        ))
    return sorted(found, key=lambda n: n.name)


def _policy_for(resource: str, named: str | None, policies: list[GpuPolicy]) -> GpuPolicy | None:
    """The pod's own policy (annotation), else the first sharing policy of the resource's strategy."""
    sharing = [p for p in policies if p.spec.sharing is not None]
    if named:
        own = next((p for p in sharing if p.name == named), None)
        if own is not None:
            return own
    if resource == SHARED_GPU_RESOURCE:
        wanted: SharingStrategy | None = SharingStrategy.TIME_SLICING
    elif resource.startswith(MIG_RESOURCE_PREFIX):
        wanted = SharingStrategy.MIG
    else:
        wanted = None
    return next((p for p in sharing if wanted is None or (p.spec.sharing and p.spec.sharing.strategy == wanted)),
                None)


def _dra_node(obj: Mapping[str, Any], labels: dict[str, str], devices: NodeDevices, busy: Mapping[str, float],
              gpu_pods: int, catalog: Catalog) -> GpuNode:
    """A node with DRA devices: it offers what its slices list (the device plugin's names for them), its
    product is GFD's label or the devices' own, its layout what its labels ask the GPU Operator for."""
    meta = obj.get("metadata") or {}
    first = next(iter(devices.devices.values()))
    product = catalog.product(labels.get(PRODUCT_LABEL) or first.product)
    return GpuNode(name=str(meta.get("name", "")), product=product, gpus=len(devices.rows), labels=labels,
                   layout=current_layout(labels, {}), offers={k: float(v) for k, v in device_counts(devices).items()},
                   busy=busy, gpu_pods=gpu_pods, unschedulable=bool((obj.get("spec") or {}).get("unschedulable")),
                   relayout_in_flight=RELAYOUT_ANNOTATION in (meta.get("annotations") or {}))


def read_demand(pods: Iterable[Mapping[str, Any]], policies: Iterable[GpuPolicy],
                catalog: Catalog = DEFAULT_CATALOG) -> list[Demand]:
    """Pending GPU pods, and pods left on whole GPUs that want a slice, oldest first."""
    ordered = sorted(policies, key=lambda p: (-p.spec.priority, p.name))
    found: list[tuple[str, Demand]] = []
    readings = [(pod, reading) for pod in pods if (reading := _reading(pod)).asks]
    takers = shared_claim_takers(pod for pod, _ in readings)
    for pod, reading in readings:
        if not reading.live or (reading.node and not reading.wanted):
            continue  # most pods: bound, wanting nothing more
        meta = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        annotations = meta.get("annotations") or {}
        requests = _requests_of(pod, reading, takers)
        pending = not reading.node
        wanted = str(annotations.get(WANTED_ANNOTATION) or "")
        if wanted and requests.get(wanted):
            wanted = ""  # it got its slice after all
        if pending and not wanted and requests:
            resource, count = max(requests.items(), key=lambda item: (item[1], item[0]))
        elif wanted:
            resource, count = wanted, 1.0
        else:
            continue
        policy = _policy_for(resource, annotations.get(POLICY_ANNOTATION), ordered)
        sharing = policy.spec.sharing if policy else None
        models = frozenset(normalise_product_label(m) for m in sharing.gpu_models) if sharing and \
            sharing.gpu_models else None
        selector = {str(k): str(v) for k, v in (spec.get("nodeSelector") or {}).items()}
        selected = selector.get(PRODUCT_LABEL)
        if selected:
            only = frozenset({normalise_product_label(selected)})
            models = only if models is None else models & only
        found.append((str(meta.get("creationTimestamp") or ""), Demand(
            pod=f"{meta.get('namespace', 'default')}/{meta.get('name', '')}", resource=resource, count=count,
            policy=policy.name if policy else None,
            replicas=sharing.time_slicing_replicas if sharing else 1,
            node_selector=selector, pending=pending, products=models,
        )))
    found.sort(key=lambda item: (item[0], item[1].pod))
    return [d for _, d in found]


# -- planning ---------------------------------------------------------------------------
def _fits_node(demand: Demand, node: GpuNode) -> bool:
    product = node.product.product if node.product else normalise_product_label(node.labels.get(PRODUCT_LABEL, ""))
    aliases = set(node.product.aliases) if node.product else set()
    if demand.products is not None and not ({product} | aliases) & demand.products:
        return False
    for key, value in demand.node_selector.items():
        have = node.labels.get(key)
        if key == PRODUCT_LABEL and have is not None:
            have = normalise_product_label(have)
            value = normalise_product_label(value)
        if have != value:
            return False
    return True


def _take(demands: list[Demand], node: GpuNode, free: dict[str, float], replicas: int | None = None
          ) -> list[Demand]:
    """The demands (in order) that `free` on `node` holds; `free` is drawn down."""
    taken = []
    for demand in demands:
        if demand.resource not in free or free[demand.resource] < demand.count or not _fits_node(demand, node):
            continue
        if replicas is not None and demand.resource == SHARED_GPU_RESOURCE and demand.replicas != replicas:
            continue
        free[demand.resource] -= demand.count
        taken.append(demand)
    return taken


def _options(node: GpuNode, demands: list[Demand]) -> list[Layout]:
    options: list[Layout] = []
    for replicas in sorted({d.replicas for d in demands if d.resource == SHARED_GPU_RESOURCE and d.replicas > 1}):
        options.append(Layout(TIME_SLICING, replicas))
    if node.product is not None and names_mig_per_profile(node.labels, node.offers):  # single: no mig-* ever
        options += [Layout(MIG, mig=m.name) for m in node.product.mig_layouts if m.mig_enabled]
    if any(d.resource == GPU_RESOURCE for d in demands):
        options.append(Layout())
    return [o for o in options if o != node.layout]


def _describe_served(taken: list[Demand]) -> tuple[dict[str, int], str]:
    served: dict[str, int] = {}
    for demand in taken:
        served[demand.resource] = served.get(demand.resource, 0) + 1
    parts = []
    for resource, count in sorted(served.items()):
        what = resource.removeprefix(MIG_RESOURCE_PREFIX) if resource.startswith(MIG_RESOURCE_PREFIX) else (
            "time-sliced" if resource == SHARED_GPU_RESOURCE else "whole-GPU")
        waiting = sum(1 for d in taken if d.resource == resource and d.pending)
        tail = "pending" if waiting == count else f"waiting ({count - waiting} left on whole GPUs)"
        parts.append(f"{count} {tail} {what} pod{'s' if count != 1 else ''}")
    return served, " and ".join(parts)


def plan_layout(nodes: Iterable[GpuNode], demands: Iterable[Demand]) -> LayoutPlan:
    """Node changes serving the waiting demand (module docstring: the rule)."""
    nodes = list(nodes)
    waiting = list(demands)
    held: set[str] = set()
    matched = 0
    for node in nodes:
        if node.unschedulable or not waiting:
            continue
        free = {r: node.free(r) for r in node.offers}
        taken = _take(waiting, node, free, node.layout.replicas if node.layout.kind == TIME_SLICING else None)
        if taken:
            held.add(node.name)
            matched += len(taken)
            waiting = [d for d in waiting if d not in taken]
    orphans = [d for d in waiting if d.policy is None]
    waiting = [d for d in waiting if d.policy is not None]
    candidates = [n for n in nodes if n.name not in held and n.gpu_pods == 0 and not n.unschedulable
                  and not n.relayout_in_flight and n.gpus > 0]
    targets: list[NodeTarget] = []
    while waiting and candidates:
        best: tuple[tuple[Any, ...], GpuNode, Layout, list[Demand]] | None = None
        for node in candidates:
            for option in _options(node, waiting):
                offers = option.offers(node.product, node.gpus) or {}
                taken = _take(waiting, node, {k: float(v) for k, v in offers.items()}, option.replicas)
                if not taken:
                    continue
                asked = {d.resource for d in waiting}
                share = sum(v for k, v in offers.items() if k in asked) / max(sum(offers.values()), 1)
                score = (len(taken), share, -node.gpus, option.kind == node.layout.kind)
                if best is None or score > best[0]:
                    best = (score, node, option, taken)
        if best is None:
            break
        _, node, option, taken = best
        served, what = _describe_served(taken)
        policies = [d.policy for d in taken if d.policy]
        policy = max(sorted(set(policies)), key=policies.count)
        reason = f"node {node.name}: {option.describe()} serves {what}; node is empty"
        if node.layout.kind != WHOLE:
            reason += f" (was {node.layout.describe()})"
        targets.append(NodeTarget(node.name, policy, node.layout, option, served, reason))
        candidates = [n for n in candidates if n.name != node.name]
        waiting = [d for d in waiting if d not in taken]
    unserved = tuple((d.pod, _why_unserved(d, nodes)) for d in orphans + waiting if d.pending)
    return LayoutPlan(tuple(targets), matched, unserved)


def _why_unserved(demand: Demand, nodes: list[GpuNode]) -> str:
    if demand.policy is None:
        return f"no sharing policy covers {demand.resource}"
    fitting = [n for n in nodes if _fits_node(demand, n)]
    if not fitting:
        return "no node of an allowed product"
    return f"no node without GPU pods can offer {demand.resource}"

