"""Kubernetes Node and Pod objects (plain dicts, as the API returns them) to the packing model. Pure.

The extender calls these with what its reflector cached; nothing here talks
to the API. What is modelled (docs/designs/packing.md, "Live nodes"), per GPU:
- Whole GPUs (`nvidia.com/gpu`): a pod holds `num_gpu` GPUs at 1000 milli.
- Time-sliced shares (`nvidia.com/gpu.shared: 1`): a pod holds a known
  fraction of one GPU: `gpu.kubeon.io/gpu-share` (milli of one GPU, 1..1000),
  else its declared GPU memory (`gpu.kubeon.io/gpu-memory`) over the GPU's
  memory (label `nvidia.com/gpu.memory`), else 1/replicas of the node's
  time-slicing config (label `nvidia.com/gpu.replicas`, or replicas over GPU
  count). `share_milli` is the one conversion; the simulator's live replay
  writes the same annotation for openb's sharing pods.
- Where a pod's GPU milli lands: the GPU indices in `gpu.kubeon.io/gpu-index`
  (comma-separated), which the extender's bind verb writes before it binds
  (docs/designs/extender.md, "Which GPU"). The NVIDIA device plugin does not
  read it: with time-slicing it hands out replicas by its own allocation
  policy (distributed by default), so the index is the optimizer's
  accounting of the GPU's share, exact in sum per node, not a device
  assignment. Pods without the annotation (bound by another scheduler) take
  the fullest GPU that still fits them (shares) or the first free ones.
- MIG devices (`nvidia.com/mig-<profile>`, mixed strategy): fitted by the
  node's free count (allocatable less the devices held: the device plugin's
  truth), and held on GPU rows: a MIG node keeps its physical GPUs
  (`nvidia.com/gpu.count`) cut by its layout (`nvidia.com/mig.config`, looked
  up in the GPU Operator's default mig-parted config through the catalog;
  else the advertised devices spread evenly over the GPUs), and a MIG pod
  holds its profile's compute slices of one GPU (`migslices.py`, the one
  conversion), on the GPU index recorded on it, else the fullest GPU whose
  layout has a free device of its profile. Under the single strategy the
  device plugin advertises MIG devices as `nvidia.com/gpu` and GFD counts
  them in `nvidia.com/gpu.count`: they are the rows then, whole.
- GPU product from the GFD label `nvidia.com/gpu.product` (normalised, so
  `-SHARED` and `-MIG-...` suffixes do not split a model), per-GPU memory
  from `nvidia.com/gpu.memory` (MiB).
- Nodes cordoned (`spec.unschedulable`) or marked for consolidation
  (label or taint `gpu.kubeon.io/draining`) are kept but unschedulable.
- Pods count against their node unless they finished (Succeeded/Failed).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import replace
from decimal import Decimal
from typing import Any, TypeVar

import numpy as np

from gpupolicy.catalog import (
    DEFAULT_CATALOG,
    GPU_RESOURCE,
    MIG_CONFIG_LABEL,
    MIG_RESOURCE_PREFIX,
    PRODUCT_LABEL,
    SHARED_GPU_RESOURCE,
    Catalog,
    mig_layout_per_gpu,
    normalise_product_label,
)
from gpupolicy.k8s.quantity import QuantityError, parse_bytes_mib, parse_quantity, shown
from gpupolicy.matching import pod_allowed_products as allowed_products
from gpupolicy.packing.dradevices import (
    claims_demand,
    dra_node_spec,
    node_devices,
    shared_claim_takers,
    shared_claims,
)
from gpupolicy.packing.migdevices import pick
from gpupolicy.packing.migslices import MAX_DEVICES_PER_GPU
from gpupolicy.packing.nodemodel import MAX_AMOUNT, MILLI, NodeSpec, NodeState, PodDemand

DRAINING_KEY = "gpu.kubeon.io/draining"
GPU_MEMORY_ANNOTATION = "gpu.kubeon.io/gpu-memory"
GPU_SHARE_ANNOTATION = "gpu.kubeon.io/gpu-share"  # milli of one GPU a time-sliced pod uses (1..1000)
GPU_INDEX_ANNOTATION = "gpu.kubeon.io/gpu-index"  # GPU indices on its node the pod is accounted on
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"
GPU_REPLICAS_LABEL = "nvidia.com/gpu.replicas"
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
FINISHED_PHASES = ("Succeeded", "Failed")

Obj = Mapping[str, Any]
MALFORMED = "malformed"  # a missing field, a value of the wrong type, not a quantity
OUT_OF_RANGE = "out-of-range"  # a negative amount, more GPU rows than a node may have (nodemodel's bounds)


class ObjectError(ValueError):
    """A Node or Pod dict the model cannot use; the message names the field, `reason` is MALFORMED or
    OUT_OF_RANGE (what a watch-fed state counts when it leaves the object out)."""

    def __init__(self, message: str, reason: str = MALFORMED) -> None:
        super().__init__(message)
        self.reason = reason


def saturated(amount: int) -> int:
    """An amount read from an object, at most `nodemodel.MAX_AMOUNT`: a pod asking more fits nowhere
    either way, and a node offering more offers more than any pod can ask (the one saturation rule)."""
    return amount if amount <= MAX_AMOUNT else MAX_AMOUNT


def _mapping(value: Any, field: str) -> Mapping[str, Any]:
    """An optional object field ({} when absent); ObjectError naming it when it is not an object."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ObjectError(f"{field}: expected an object, got {shown(value)}")
    return value


def _label_count(labels: Mapping[str, Any], key: str) -> int | None:
    """A label holding a count (ASCII digits only: `int` refuses other Unicode digits), else None."""
    text = str(labels.get(key, ""))
    return int(text) if text.isascii() and text.isdigit() and len(text) < 20 else None


def _get(obj: Obj, *path: str) -> Any:
    cur: Any = obj
    for key in path:
        if not (type(cur) is dict or isinstance(cur, Mapping)):  # a watch's objects are dicts: no ABC check
            return None
        cur = cur.get(key)
    return cur


def _quantity(value: Any, field: str) -> Decimal:
    try:
        return parse_quantity(value)
    except (QuantityError, ValueError, TypeError) as exc:
        raise ObjectError(f"{field}: not a quantity: {shown(value)}") from exc


def cpu_milli_of(value: Any, field: str) -> int:
    """A CPU quantity in milli-cores; ObjectError naming `field` when it is not one."""
    return saturated(int(_quantity(value, field) * 1000))


def memory_mib_of(value: Any, field: str) -> int:
    """A memory quantity in MiB; ObjectError naming `field` when it is not one."""
    try:
        return saturated(int(parse_bytes_mib(value)))
    except (QuantityError, ValueError, TypeError) as exc:
        raise ObjectError(f"{field}: not a memory quantity: {shown(value)}") from exc


def _count(value: Any, field: str) -> int:
    return _whole(_quantity(value, field), field)


def _whole(amount: Decimal, field: str) -> int:
    """A device count: a whole number (the API server refuses a fraction of an extended resource, and
    truncating one would misstate the object), saturated."""
    if amount != amount.to_integral_value():
        raise ObjectError(f"{field}: {amount} is not a whole number of devices")
    return saturated(int(amount))


def _container_requests(container: Any, where: str) -> dict[str, Any]:
    """Requests, with limits standing in for extended resources that only set limits."""
    resources = _mapping(_mapping(container, where).get("resources"), f"{where}.resources")
    requests = dict(_mapping(resources.get("requests"), f"{where}.resources.requests"))
    for name, value in _mapping(resources.get("limits"), f"{where}.resources.limits").items():
        if name not in requests and (name.startswith("nvidia.com/") or name in ("cpu", "memory")):
            requests[name] = value
    return requests


def _containers(spec: Obj, field: str) -> list[Any]:
    value = spec.get(field)
    if value is not None and not isinstance(value, list):
        raise ObjectError(f"spec.{field}: expected a list, got {shown(value)}")
    return value or []


class ParseMemo:
    """Pods already parsed, by (uid, resourceVersion): one version of an object never changes, so its
    parse is exact. Why: the controller's passes read every pod of the cluster from its watch cache each
    time (10,000 pods: parsing their quantities was about half of a capacity pass, bench/cluster_scale.py),
    and between two passes few pods change. Owned by the controller (ControllerContext.parse_memo),
    consulted only inside `parsing(memo)`.

    Dropped: an entry no pass read for `age_seconds` (60 s, beyond the capacity and layout periods) is
    gone within twice that. Each table is replaced by an empty one every `age_seconds` (`rotate`, as a pass
    starts), and an entry read from the one before is carried over. Versions come and go with every pod
    and node event: kept whole, a table held every version until `limit` (262,144 entries of a kind, some
    130 MB of node specs at 5,000 nodes), then emptied whole; it still is past `limit`.

    Held objects. A watch cache replaces an object when it changes and keeps it otherwise (kube/reflector.py;
    it writes a new resourceVersion into a kept object whose trimmed content did not change), so the object
    itself identifies its reading: each reading is also kept by the object's identity, with the object
    (`_objects`; rotated with the tables). Finding a reading that way is one lookup, where its version key
    read two fields and built a tuple, several times a pod a pass; at 5,000 nodes / 50,000 pods that was a
    third of a capacity pass (docs/benchmarks.md, issue 47)."""

    def __init__(self, limit: int = 262_144, age_seconds: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limit, self.age_seconds, self._clock = limit, age_seconds, clock
        self._tables: dict[str, dict[tuple[str, str], Any]] = {}  # kind -> version -> reading
        self._older: dict[str, dict[tuple[str, str], Any]] = {}  # the tables before the last rotation
        self._objects: dict[int, tuple[Obj, dict[str, Any]]] = {}  # id -> (the object, kind -> reading)
        self._older_objects: dict[int, tuple[Obj, dict[str, Any]]] = {}  # before the last rotation
        self._rotated = clock()

    @property
    def requests(self) -> dict[tuple[str, str], dict[str, Decimal]]:
        return self.table("requests")

    @property
    def demands(self) -> dict[tuple[str, str], PodDemand]:
        return self.table("demands")

    def table(self, kind: str) -> dict[tuple[str, str], Any]:
        return self._tables.setdefault(kind, {})

    def carried(self, kind: str, key: tuple[str, str]) -> Any:
        """The reading of `key` in the table before the last rotation (None: none)."""
        older = self._older.get(kind)
        return older.get(key) if older else None

    def rotate(self) -> None:
        """Start new tables once `age_seconds` passed since the last: what the older ones hold and nobody
        reads meanwhile is dropped with them."""
        now = self._clock()
        if now - self._rotated >= self.age_seconds:
            self._older, self._tables, self._rotated = self._tables, {}, now
            self._older_objects, self._objects = self._objects, {}

    def held(self, kind: str, obj: Obj) -> Any:
        """The reading of kind `kind` kept for this very object (None: none); one held before the last
        rotation is carried over, as `carried` does for versions."""
        found = self._objects.get(id(obj))
        if found is None:
            older = self._older_objects.pop(id(obj), None)
            if older is None or older[0] is not obj:
                return None
            found = self._objects[id(obj)] = older
        return found[1].get(kind) if found[0] is obj else None

    def hold(self, kind: str, obj: Obj, value: Any) -> None:
        """Keep `value` as this object's reading of kind `kind` (and the object, so its identity stays its own)."""
        found = self._objects.get(id(obj))
        if found is None or found[0] is not obj:
            if len(self._objects) >= self.limit:
                self._objects.clear()
            found = self._objects[id(obj)] = (obj, {})
        found[1][kind] = value

    def remember(self, table: dict[tuple[str, str], Any], key: tuple[str, str], value: Any) -> None:
        if len(table) >= self.limit:
            table.clear()
        table[key] = value


T = TypeVar("T")
_ACTIVE: ContextVar[ParseMemo | None] = ContextVar("kubeon_parse_memo", default=None)


@contextmanager
def parsing(memo: ParseMemo) -> Iterator[None]:
    """Within this block (a controller pass), pod_requests and demand_from_pod use `memo`."""
    memo.rotate()
    token = _ACTIVE.set(memo)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def pod_version(pod: Obj) -> tuple[str, str] | None:
    """(uid, resourceVersion): one version of an object never changes; None without them. Read for every
    pod several times a pass (each memo's key): indexing, not type checks, which a non-mapping fails."""
    try:
        meta = pod["metadata"]
        uid, rv = meta["uid"], meta["resourceVersion"]
    except (KeyError, TypeError, IndexError):
        return None
    return (uid, rv) if type(uid) is str and type(rv) is str and uid and rv else None


def _remembered(kind: str, parse: Callable[[Obj], T], pod: Obj, memo: ParseMemo) -> T:
    """`parse(pod)`, from `memo`'s table `kind` when this version of the pod was parsed before (no version:
    parsed). The object held before answers first (`ParseMemo`, "Held objects")."""
    found: T | None = memo.held(kind, pod)
    if found is not None:
        return found
    key = pod_version(pod)
    if key is None:
        return parse(pod)
    table = memo.table(kind)
    found = table.get(key)
    if found is None:
        found = memo.carried(kind, key)
        if found is None:
            found = parse(pod)
        memo.remember(table, key, found)
    memo.hold(kind, pod, found)
    return found


def memoised(kind: str, read: Callable[[Obj], T], pod: Obj) -> T:
    """`read(pod)`, remembered per pod version in the active memo's table `kind` (outside `parsing`: read).
    `read` must depend on the pod alone."""
    memo = _ACTIVE.get()
    return read(pod) if memo is None else _remembered(kind, read, pod, memo)


def pod_requests(pod: Obj) -> dict[str, Decimal]:
    """Effective requests: sum over containers, at least the largest init container (per resource).
    Inside `parsing(memo)` the answer for a pod version parsed before is the one dict kept: read-only."""
    memo = _ACTIVE.get()
    return _parse_requests(pod) if memo is None else _remembered("requests", _parse_requests, pod, memo)


def _parse_requests(pod: Obj) -> dict[str, Decimal]:
    spec = _mapping(pod.get("spec"), "spec")
    total: dict[str, Decimal] = {}
    for i, c in enumerate(_containers(spec, "containers")):
        for name, value in _container_requests(c, f"spec.containers[{i}]").items():
            total[name] = total.get(name, Decimal(0)) + _quantity(value, f"spec.containers[{i}].resources.{name}")
    for i, c in enumerate(_containers(spec, "initContainers")):
        for name, value in _container_requests(c, f"spec.initContainers[{i}]").items():
            q = _quantity(value, f"spec.initContainers[{i}].resources.{name}")
            total[name] = max(total.get(name, Decimal(0)), q)
    return total


def _explicit_share(annotations: Mapping[str, Any]) -> int:
    text = annotations.get(GPU_SHARE_ANNOTATION)
    if text is None:
        return 0
    try:
        value = int(str(text).strip())
    except ValueError:
        value = -1
    if not 0 < value <= MILLI:
        raise ObjectError(f"metadata.annotations.{GPU_SHARE_ANNOTATION}: expected milli of one GPU "
                          f"(1..{MILLI}), got {text!r}")
    return value


def demand_from_pod(pod: Obj) -> PodDemand:
    """A Kubernetes Pod dict as a PodDemand (remembered inside `parsing(memo)`, by pod version)."""
    memo = _ACTIVE.get()
    return _parse_demand(pod) if memo is None else _remembered("demands", _parse_demand, pod, memo)


def _parse_demand(pod: Obj) -> PodDemand:
    """A Kubernetes Pod dict as a PodDemand. Raises ObjectError naming the bad field.

    A time-sliced share pod with `gpu.kubeon.io/gpu-share` is a sharing
    demand of that milli on one GPU; without it the milli depends on the node
    (`resolve_share`) and stays 0 here.
    """
    if not isinstance(pod, Mapping) or not isinstance(pod.get("spec"), Mapping):
        raise ObjectError("pod: missing spec")
    meta = _mapping(pod.get("metadata"), "metadata")
    req = pod_requests(pod)
    gpus = _whole(req.get(GPU_RESOURCE, Decimal(0)), f"resources.{GPU_RESOURCE}")
    mig = {name: _whole(v, f"resources.{name}") for name, v in req.items()
           if name.startswith(MIG_RESOURCE_PREFIX) and v > 0}
    claimed_gpus, claimed_mig = claims_demand(pod)  # what its claims on our templates will hold (dradevices)
    gpus += claimed_gpus
    for name, count in claimed_mig.items():
        mig[name] = mig.get(name, 0) + count
    annotations = _mapping(meta.get("annotations"), "metadata.annotations")
    gpu_mem = annotations.get(GPU_MEMORY_ANNOTATION)
    shared = _whole(req.get(SHARED_GPU_RESOURCE, Decimal(0)), f"resources.{SHARED_GPU_RESOURCE}")
    share = _explicit_share(annotations) if shared == 1 and not gpus else 0
    try:
        return PodDemand(
            cpu_milli=saturated(int(req.get("cpu", Decimal(0)) * 1000)),
            memory_mib=saturated(int(req.get("memory", Decimal(0)) / (1024 * 1024))),
            num_gpu=gpus or (1 if share else 0),
            gpu_milli=MILLI if gpus else share,
            allowed_models=allowed_products(pod),
            mig=mig,
            shared=shared,
            gpu_memory_mib=memory_mib_of(gpu_mem, f"metadata.annotations.{GPU_MEMORY_ANNOTATION}") if gpu_mem else 0,
            name=f"{meta.get('namespace', '')}/{meta.get('name', '')}",
        )
    except ValueError as exc:  # a negative request (PodDemand's bounds)
        raise ObjectError(f"pod: {exc}", OUT_OF_RANGE) from exc


def bound_demand(pod: Obj) -> PodDemand:
    """What a bound pod holds itself: its demand less what its claims on our templates ask for, which the
    claims' allocations hold (`dradevices.held_by_claim`: the device the scheduler allocated, never a guess)."""
    return _less(demand_from_pod(pod), *claims_demand(pod))


def _less(demand: PodDemand, gpus: int, mig: Mapping[str, int]) -> PodDemand:
    """`demand` without `gpus` whole GPUs and the `mig` devices (what claims hold instead of the pod)."""
    if not (gpus or mig):
        return demand
    left = {name: count - mig.get(name, 0) for name, count in demand.mig.items() if count > mig.get(name, 0)}
    num_gpu = max(0, demand.num_gpu - gpus)
    return replace(demand, num_gpu=num_gpu, gpu_milli=demand.gpu_milli if num_gpu else 0, mig=left)


def pending_claim_demand(pod: Obj, allocated: Callable[[str], bool]) -> PodDemand:
    """A pending pod's demand, less the GPU of each shared claim it names that is `allocated` already: that
    claim's allocation holds the GPU on its node, where kube-scheduler's DynamicResources filter keeps the
    pod (docs/designs/dra.md)."""
    return _less(demand_from_pod(pod), sum(1 for claim in shared_claims(pod) if allocated(claim)), {})


def share_milli(demand: PodDemand, gpu_memory_mib: int, replicas: int) -> int:
    """The milli of one GPU a time-sliced share pod uses on a GPU of `gpu_memory_mib` with `replicas`.

    Declared share first (already in `gpu_milli`), then declared memory over
    the GPU's memory (rounded up), then one replica's even share (rounded
    down, so `replicas` shares fit one GPU). 0: not a share, or nothing known.
    """
    if demand.shared != 1 or demand.num_gpu > 1 or (demand.num_gpu == 1 and demand.gpu_milli >= MILLI):
        return 0
    if demand.gpu_milli:
        return demand.gpu_milli
    if demand.gpu_memory_mib and gpu_memory_mib > 0:
        return min(MILLI, -(-demand.gpu_memory_mib * MILLI // gpu_memory_mib))
    return MILLI // replicas if replicas > 0 else 0


def resolve_share(demand: PodDemand, gpu_memory_mib: int, replicas: int) -> PodDemand:
    """The demand with its share's milli filled in (`share_milli`); other demands unchanged."""
    if demand.needs_gpu or demand.shared != 1:
        return demand
    milli = share_milli(demand, gpu_memory_mib, replicas)
    return replace(demand, num_gpu=1, gpu_milli=milli) if milli else demand


def node_share_basis(state: NodeState, node: int) -> tuple[int, int]:
    """(GPU memory MiB, time-slicing replicas per GPU) of one node; 0 where unknown."""
    count = int(state.gpu_count[node])
    return int(state.gpu_memory_mib[node]), int(state.shared_cap[node]) // count if count else 0


def cluster_share_basis(state: NodeState) -> tuple[int, int]:
    """The basis for a pending share pod: the smallest GPU memory and replicas among time-sliced nodes.

    Conservative (the largest fraction any such node would charge), so a
    pending pod never looks smaller than it will be once bound. Capacity
    only: worked out once per state (`NodeState.static`).
    """
    return state.static("cluster-share-basis", lambda: _cluster_share_basis(state))


def _cluster_share_basis(state: NodeState) -> tuple[int, int]:
    sliced = (state.shared_cap > 0) & (state.gpu_count > 0)
    if not sliced.any():
        return 0, 0
    mem = state.gpu_memory_mib[sliced]
    known = mem[mem > 0]
    replicas = state.shared_cap[sliced] // state.gpu_count[sliced]
    return (int(known.min()) if known.size else 0), int(replicas.min())


def gpu_indices_from_pod(pod: Obj) -> tuple[int, ...]:
    """GPU indices recorded on a bound pod (`gpu.kubeon.io/gpu-index`); () when absent or unreadable."""
    annotations = _get(pod, "metadata", "annotations")
    text = annotations.get(GPU_INDEX_ANNOTATION) if isinstance(annotations, Mapping) else None
    if not text:
        return ()
    try:
        return tuple(int(part) for part in str(text).split(",") if part.strip())
    except ValueError:
        return ()


def node_spec(node: Obj, catalog: Catalog = DEFAULT_CATALOG) -> NodeSpec:
    """A Kubernetes Node dict's allocatable capacity as a NodeSpec.

    A time-sliced node (replicas advertised as `nvidia.com/gpu.shared`, no
    `nvidia.com/gpu`) keeps its physical GPUs as rows: the GFD label
    `nvidia.com/gpu.count`, else replicas over `nvidia.com/gpu.replicas`;
    it takes no whole-GPU pods (`exclusive` False). So does a MIG node
    (`mig_rows`): its GPUs are rows cut by its MIG layout.
    """
    name = _get(node, "metadata", "name")
    if not name or not isinstance(name, str):
        raise ObjectError("node: missing metadata.name")
    alloc = _mapping(_get(node, "status", "allocatable"), "status.allocatable")
    labels = _mapping(_get(node, "metadata", "labels"), "metadata.labels")
    mig = {k: _count(v, f"status.allocatable.{k}") for k, v in alloc.items() if k.startswith(MIG_RESOURCE_PREFIX)}
    whole = _count(alloc.get(GPU_RESOURCE, 0), f"status.allocatable.{GPU_RESOURCE}")
    shared = _count(alloc.get(SHARED_GPU_RESOURCE, 0), f"status.allocatable.{SHARED_GPU_RESOURCE}")
    mig = {k: v for k, v in mig.items() if v > 0}
    gpus = whole
    per_gpu: dict[str, int] = {}
    memory = saturated(_label_count(labels, GPU_MEMORY_LABEL) or 0)
    if not whole and shared:
        count, replicas = _label_count(labels, GPU_COUNT_LABEL), _label_count(labels, GPU_REPLICAS_LABEL)
        if count is not None:
            gpus = count
        elif replicas:
            gpus = shared // replicas
    elif not whole and mig:
        product = catalog.product(str(labels.get(PRODUCT_LABEL, "")))
        per_gpu, gpus = mig_rows(labels, mig, catalog)
        memory = memory or (product.memory_mib if product is not None else 0)
    try:
        return NodeSpec(
            name=name,
            cpu_milli=cpu_milli_of(alloc.get("cpu", 0), "status.allocatable.cpu"),
            memory_mib=memory_mib_of(alloc.get("memory", 0), "status.allocatable.memory"),
            gpu_count=gpus,
            model=normalise_product_label(str(labels.get(PRODUCT_LABEL, ""))),
            gpu_memory_mib=memory,
            mig=mig,
            shared=shared,
            exclusive=bool(whole) or not (shared or mig),
            mig_per_gpu=per_gpu,
        )
    except ValueError as exc:  # negative allocatable, more GPU rows than a node may have (NodeSpec's bounds)
        raise ObjectError(str(exc), OUT_OF_RANGE) from exc


def mig_rows(labels: Mapping[str, Any], mig: Mapping[str, int], catalog: Catalog = DEFAULT_CATALOG
             ) -> tuple[dict[str, int], int]:
    """(devices per GPU, GPUs) of a MIG node advertising `mig` (mixed strategy, no whole GPUs).

    The layout is the GPU Operator's default one `nvidia.com/mig.config` names, for the
    node's product, when it holds every advertised device on the node's GPUs (GFD's
    `nvidia.com/gpu.count`, else as many as the layout needs); otherwise (a custom
    mig-parted config, or a re-layout under way whose devices are not advertised yet)
    the advertised devices spread evenly over the GPUs. ({}, 0) when the GPU count is
    unknown either way: MIG devices by count only.
    """
    count = _label_count(labels, GPU_COUNT_LABEL) or 0
    product = catalog.product(str(labels.get(PRODUCT_LABEL, "")))
    layout = mig_layout_per_gpu(product, str(labels.get(MIG_CONFIG_LABEL, "")))
    if layout is not None and set(mig) <= set(layout):
        need = max(-(-c // layout[r]) for r, c in mig.items())
        if count >= need or not count:
            return layout, count or need
    if count <= 0:
        return {}, 0
    spread = {r: -(-c // count) for r, c in mig.items()}
    if max(spread.values(), default=0) > MAX_DEVICES_PER_GPU:  # more devices than GPUs can be cut into: by count only
        return {}, 0
    return spread, count


def node_schedulable(node: Obj) -> bool:
    """False when cordoned or marked for consolidation (label or taint gpu.kubeon.io/draining)."""
    if _get(node, "spec", "unschedulable"):
        return False
    labels = _mapping(_get(node, "metadata", "labels"), "metadata.labels")
    if str(labels.get(DRAINING_KEY, "")).lower() in ("true", "1", "yes"):
        return False
    taints = _get(node, "spec", "taints")
    return not any(isinstance(t, Mapping) and t.get("key") == DRAINING_KEY
                   for t in (taints if isinstance(taints, list) else []))


def occupy(state: NodeState, node: int, demand: PodDemand, gpu_indices: tuple[int, ...] = ()) -> None:
    """Count a running pod against its node, clamping at zero instead of failing.

    The API is the truth: a node may already be over-committed (e.g. capacity
    shrank under running pods), and the model must still load. GPU milli
    comes off the recorded `gpu_indices` when they name GPUs of the node;
    otherwise a share takes the fullest GPU that holds it and whole GPUs the
    first free slots. A share's milli is resolved against this node.
    """
    demand = resolve_share(demand, *node_share_basis(state, node))
    state.cpu_free[node] = max(0, state.cpu_free[node] - demand.cpu_milli)
    state.mem_free[node] = max(0, state.mem_free[node] - demand.memory_mib)
    whole, devices, mig_gpus = state.split_indices(node, demand, gpu_indices)
    if demand.needs_gpu:
        row = state.gpu_free[node]
        present = state.gpu_present[node]
        chosen = [g for g in whole if 0 <= g < row.size and present[g]]
        if len(chosen) != demand.num_gpu:
            if demand.is_sharing:
                fits = np.flatnonzero(present & (row >= demand.gpu_milli))
                chosen = [int(fits[np.argmin(row[fits])])] if fits.size else []
            else:
                chosen = [int(g) for g in np.flatnonzero(row == MILLI)[: demand.num_gpu]]
        for g in chosen:
            row[g] = max(0, row[g] - demand.gpu_milli)
    if devices:
        _hold_mig(state, node, devices, mig_gpus)
    for resource, count in demand.mig.items():
        if resource in state.mig_resources:
            r = state.mig_resources.index(resource)
            state.mig_free[node, r] = max(0, state.mig_free[node, r] - count)
    state.shared_free[node] = max(0, state.shared_free[node] - demand.shared)
    state.refresh(node)


def _hold_mig(state: NodeState, node: int, devices: list[int], recorded: tuple[int, ...]) -> None:
    """Hold MIG devices on GPU rows: on the recorded GPUs when their layout has room for each, else the
    fullest GPU with room; a device no GPU has room for (more held than the node has) holds none."""
    chosen = pick(state, node, devices, recorded)
    held = state.mig_held[node].copy()
    if chosen is not None:
        for r, g in zip(devices, chosen, strict=True):
            held[g, r] += 1
        state.hold_mig(node, held)
        return
    for r in devices:
        one = pick(state, node, [r])
        if one is not None:
            held[one[0], r] += 1
            state.hold_mig(node, held)
            held = state.mig_held[node].copy()


def state_from_kubernetes(nodes: Iterable[Obj], pods: Iterable[Obj],
                          unreadable: dict[str, str] | None = None, slices: Iterable[Obj] = ()) -> NodeState:
    """A NodeState from Node dicts and the Pod dicts bound to them (others are ignored). Pure.

    Pods with recorded GPU indices are counted first, so pods without them
    fill around what is known. One object the model cannot read never stops
    the rest (issue 37): such a node is left out with its pods, and the node
    of such a pod is unschedulable (nothing is planned onto a node whose load
    is not known). Each is named in `unreadable` (`Node/name`, `Pod/ns/name`
    -> the problem) when the caller passes a dict. A node with DRA devices in `slices` gets their rows
    (`dradevices.dra_node_spec`), and a bound pod's claims on our templates hold the devices they name.
    (`kubestate.StateMemo` builds the same state, keeping it between a controller's passes.)
    """
    unreadable = {} if unreadable is None else unreadable
    specs, schedulable = node_specs(nodes, slices, unreadable)
    state = NodeState.build(specs)
    state.schedulable[:] = schedulable
    pods = list(pods)
    occupy_rows(state, bound_by_row(pods, state.index), shared_claim_takers(pods), unreadable)
    return state


def node_specs(nodes: Iterable[Obj], slices: Iterable[Obj], unreadable: dict[str, str]) -> tuple[list[NodeSpec],
                                                                                                 list[bool]]:
    """Each readable node's spec (with its DRA rows) and whether it is schedulable, in `nodes` order."""
    devices = node_devices(slices)
    specs: list[NodeSpec] = []
    schedulable: list[bool] = []
    for n in nodes:
        try:
            spec, ok = memoised("node-spec", _node_reading, n)  # a pass reads every node; few change between two
            if spec.name in devices:
                spec = dra_node_spec(spec, devices[spec.name])
        except ValueError as exc:  # ObjectError, SliceError, or a DRA row count out of range
            unreadable[f"Node/{_get(n, 'metadata', 'name')}"] = str(exc)
            continue
        specs.append(spec)
        schedulable.append(ok)
    return specs, schedulable


def _node_reading(node: Obj) -> tuple[NodeSpec, bool]:
    return node_spec(node), node_schedulable(node)


def bound_by_row(pods: Iterable[Obj], index: Mapping[str, int]) -> dict[int, list[Obj]]:
    """The unfinished pods bound to each row's node, in `pods` order."""
    out: dict[int, list[Obj]] = {}
    for pod in pods:
        row = index.get(node_name) if isinstance(node_name := _get(pod, "spec", "nodeName"), str) else None
        if row is not None and _get(pod, "status", "phase") not in FINISHED_PHASES:
            out.setdefault(row, []).append(pod)
    return out


def occupy_rows(state: NodeState, by_row: Mapping[int, list[Obj]], takers: set[str],
                unreadable: dict[str, str]) -> None:
    """Take each row's pods off it, those with recorded GPU indices first; a row with an unreadable pod
    becomes unschedulable (`state_from_kubernetes`). Rows are independent: a subset of rows gets the same
    rows as all of them."""
    bound = []
    for row, pods in by_row.items():
        for pod in pods:
            try:  # a shared claim's GPU is held once, by the pod that counts it (dradevices.shared_claim_takers)
                demand = demand_from_pod(pod)
                if shared_claims(pod) and \
                        f"{_get(pod, 'metadata', 'namespace') or 'default'}/{_get(pod, 'metadata', 'name')}" \
                        not in takers:
                    demand = _less(demand, len(shared_claims(pod)), {})
            except ObjectError as exc:
                unreadable[f"Pod/{_get(pod, 'metadata', 'namespace')}/{_get(pod, 'metadata', 'name')}"] = str(exc)
                state.schedulable[row] = False
                continue
            bound.append((row, demand, gpu_indices_from_pod(pod)))
    for index, demand, gpus in sorted(bound, key=lambda b: not b[2]):
        occupy(state, index, demand, gpus)
