"""The extender's live node model: watch events in, a fresh `NodeState` out, without rebuilding per request.

What is real on a Kubernetes node (the NVIDIA device plugin, not the
scheduler, picks devices; docs/designs/extender.md):
- per GPU: whole-GPU pods hold whole GPUs, time-sliced share pods their
  declared fraction of one GPU, MIG pods their profile's slice of a GPU cut
  by the node's MIG layout, each on the GPU indices recorded on the pod by
  the extender's bind (`kubemodel.py` has the rules); MIG device and
  replica counts per node, which the fit reads.

Update rules (all under one lock; watch threads only record; the watch's
settle thread, `settle` and `rebuild`, and requests apply):
- node ADDED/DELETED, or a change of its capacity, GPU product or memory:
  the row layout changes, so the state is rebuilt by the settle thread or
  the next request (rare: node joins, device-plugin reconfiguration). Status heartbeats that
  change nothing the model reads are ignored, before any parsing (the
  allocatable resources, labels and spec compared with the last event's:
  every kubelet reports every 5 minutes, 50 events a second at 15,000
  nodes, each parsed in a watch thread while requests wait for the
  interpreter); cordon/drain flips one flag.
- pod bound/unbound/finished/deleted: its node's row is marked dirty and
  recomputed (by the settle thread, or the next request if that comes
  first) from capacity minus that node's pods
  (O(pods on the node)), so one event never costs O(cluster).
- assumptions: a pod the extender just prioritized counts on the node it
  chose until the watch shows it bound (anywhere) or deleted, or until it
  expires (`assume_seconds`, default 30 s), so back-to-back pods do not all
  see the same free GPU. Once the API accepted the extender's binding
  (`confirm`), it no longer expires: the pod is bound, and only the watch
  ends it, however late (kube-scheduler's own cache keeps a bound pod's
  assumption the same way; pkg/scheduler/backend/cache, FinishBinding).
  A request for the pod that comes after its /bind began (the decision
  prepared after /filter's answer, run late on a loaded machine; a /filter
  or /prioritize kube-scheduler gave up waiting for) neither drops nor
  moves that assumption: only the binding's failure or the watch does.

Poison-proof (issue 37): what the watches deliver is read here once, shape
first (`gpupolicy.admission.shape`, the webhook's check), then the model's
readers, which saturate amounts beyond the model's bound. A node or pod that
cannot be read is left out of the model, a pod asking more than the bound is
kept (it fills its node, as it would) but left out of the typical mix, each
said once through `kube.ignored.IgnoredObjects` (a warning and
`kubeon_gpu_objects_ignored_total{reason}`): never an exception raised later
inside every request.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpupolicy.admission.shape import node_shape_error, pod_shape_error
from gpupolicy.packing.dradevices import (
    Device,
    NodeDevices,
    SliceError,
    allocation,
    dra_node_spec,
    held_by_claim,
    read_slice,
)
from gpupolicy.packing.kubemodel import (
    FINISHED_PHASES,
    OUT_OF_RANGE,
    ObjectError,
    bound_demand,
    demand_from_pod,
    gpu_indices_from_pod,
    node_schedulable,
    node_spec,
    occupy,
)
from gpupolicy.packing.nodemodel import NodeSpec, NodeState, PodDemand
from gpupolicy.packing.placement import PackingContext
from gpupolicy.packing.scheduling import pod_key
from gpupolicy.packing.typicalmix import OnlineMix, TypicalMix
from kube.ignored import IgnoredObjects

log = logging.getLogger(__name__)

Clock = Callable[[], float]
DEFAULT_ASSUME_SECONDS = 30.0
DEFAULT_MIX_REFRESH_SECONDS = 30.0
MIN_MIX_PODS = 20  # below this many GPU pods seen, the pod being scheduled joins the learned mix
SEEN_PODS = 50_000  # keys remembered so a pod is learned once (pending, then bound)
SETTLE_ROWS = 4  # rows `settle` recomputes per hold of the lock: about a millisecond


@dataclass(frozen=True)
class _Node:
    spec: NodeSpec
    schedulable: bool


@dataclass(frozen=True)
class _Assumed:
    node: str
    demand: PodDemand
    expires: float
    gpus: tuple[int, ...] = ()
    binding: bool = False  # made by /bind: only the binding's outcome or the watch ends it


Held = tuple[PodDemand, tuple[int, ...]]  # a pod's demand and the GPU indices it is accounted on


def read_node(obj: Mapping[str, Any]) -> _Node:
    """What the model keeps of a Node; ObjectError naming the field (shape first, then the model's reader)."""
    problem = node_shape_error(obj, "node")
    if problem:
        raise ObjectError(problem)
    return _Node(node_spec(obj), node_schedulable(obj))


def read_pod(obj: Mapping[str, Any]) -> Held:
    """What the model keeps of a bound Pod; ObjectError naming the field (shape first, then the reader)."""
    problem = pod_shape_error(obj, "pod")
    if problem:
        raise ObjectError(problem)
    return bound_demand(obj), gpu_indices_from_pod(obj)


class ClusterCache:
    """Nodes, bound pods and assumed pods, kept as an up-to-date `NodeState` for the extender.

    Feed it with `on_node(event, obj)` / `on_pod(event, obj)` (the Reflectors'
    `on_change`), read it with `with cache.lock: state = cache.fresh_state()`.
    The clock is injected (tests expire assumptions without sleeping).
    """

    def __init__(self, *, clock: Clock = time.monotonic, assume_seconds: float = DEFAULT_ASSUME_SECONDS,
                 mix_refresh_seconds: float = DEFAULT_MIX_REFRESH_SECONDS,
                 ignored: IgnoredObjects | None = None) -> None:
        self.lock = threading.RLock()
        self.ignored = ignored or IgnoredObjects()  # what was left out, said once (module doc)
        self._clock = clock
        self.assume_seconds = assume_seconds
        self.mix_refresh_seconds = mix_refresh_seconds
        self._nodes: dict[str, _Node] = {}
        self._node_inputs: dict[str, tuple[Any, ...]] = {}  # what node_spec/node_schedulable read, last event
        self._pods: dict[str, tuple[str, Held]] = {}  # bound pods: key -> (node, (demand, gpus))
        self._by_node: dict[str, dict[str, Held]] = {}
        self._assumed: dict[str, _Assumed] = {}  # insertion order = expiry order (constant assume_seconds)
        self._assumed_on: dict[str, dict[str, Held]] = {}  # node -> assumed pods there
        self._confirmed: dict[str, str] = {}  # bound by the extender, not yet seen bound: key -> node
        self._slices: dict[str, tuple[str, str, list[Device]]] = {}  # ResourceSlice -> (node, pool, devices)
        self._slices_of: dict[str, set[str]] = {}  # node -> its slices' names
        self._devices: dict[str, NodeDevices] = {}  # node -> its DRA devices (from its slices)
        self._specs: dict[str, NodeSpec] = {}  # node -> its spec with its DRA rows, as of the last rebuild
        self._claims: dict[str, tuple[str, tuple[str, ...]]] = {}  # allocated claim -> (node, device names)
        self._claims_on: dict[str, dict[str, tuple[str, ...]]] = {}  # node -> its allocated claims
        self._structure_dirty = True
        self._dirty_nodes: set[str] = set()
        self._state: NodeState = NodeState.build([])
        self.ctx = PackingContext()
        self._online = OnlineMix()
        self._seen: dict[str, None] = {}  # pods already learned (insertion order: oldest first)
        self._recent: list[PodDemand] = []  # the first MIN_MIX_PODS GPU pods (the fallback mix)
        self._mix: TypicalMix | None = None
        self._mix_at = -np.inf
        self.version = 0  # bumped whenever fresh_state applies a change; equal versions = same free resources
        self.rebuilds = 0  # full rebuilds (tests and the benchmark read it)
        self.row_updates = 0  # rows recomputed for their pods
        self.rows_copied = 0  # rows a rebuild took from the last state (`_rebuild`)
        self.rows_occupied = 0  # rows a rebuild occupied again
        self.rows_settled = 0  # rows recomputed by `settle`, between requests

    # ---- watch side ---------------------------------------------------------------------------
    def on_node(self, event: str, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata")
        meta = meta if isinstance(meta, Mapping) else {}
        name = str(meta.get("name") or "")
        if not name:
            return
        status = obj.get("status")
        inputs = (meta.get("labels"), status.get("allocatable") if isinstance(status, Mapping) else status,
                  obj.get("spec"))
        if event != "DELETED" and self._node_inputs.get(name) == inputs:
            return  # a status report that changes nothing node_spec and node_schedulable read
        with self.lock:
            self._node_inputs.pop(name, None)
            if event == "DELETED":
                self.ignored.taken("node", name)
                if self._nodes.pop(name, None) is not None:
                    self._structure_dirty = True
                return
            try:
                fresh = read_node(obj)
            except ObjectError as exc:  # out of the model: the node is unknown to the extender until fixed
                self.ignored.left_out("node", name, exc.reason, str(exc))
                if self._nodes.pop(name, None) is not None:
                    self._structure_dirty = True
                return
            self.ignored.taken("node", name)
            self._node_inputs[name] = inputs
            old = self._nodes.get(name)
            self._nodes[name] = fresh
            if old is None or old.spec != fresh.spec:
                self._structure_dirty = True
            elif old.schedulable != fresh.schedulable:
                self._dirty_nodes.add(name)

    def on_pod(self, event: str, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata")
        key = pod_key(obj if isinstance(meta, Mapping) else {})
        spec = obj.get("spec")
        node = spec.get("nodeName") if isinstance(spec, Mapping) else None
        status = obj.get("status")
        phase = status.get("phase") if isinstance(status, Mapping) else None
        with self.lock:
            gone = event == "DELETED" or not node or phase in FINISHED_PHASES
            if node or event == "DELETED":
                self._drop_assumption(key)  # bound (anywhere) or gone: the API is the truth now
            if gone:
                self.ignored.taken("pod", key)
                self._forget(key)
                return
            try:
                held = read_pod(obj)
            except ObjectError as exc:  # out of the model: its node is counted without it
                self.ignored.left_out("pod", key, exc.reason, str(exc))
                self._forget(key)
                return
            demand = held[0]
            if not demand.saturated:
                self.ignored.taken("pod", key)
            old = self._pods.get(key)
            if old == (node, held):
                return
            if old is None:  # the workload's typical mix, learned from GPU pods (with what their claims hold)
                self.observe(key, demand_from_pod(obj))
            self._forget(key)
            self._pods[key] = (str(node), held)
            self._by_node.setdefault(str(node), {})[key] = held
            self._dirty_nodes.add(str(node))

    def on_slice(self, event: str, obj: Mapping[str, Any]) -> None:
        """A ResourceSlice of NVIDIA's DRA driver: its node's GPU rows change (rare: a node joins, a
        re-layout), so the state is rebuilt on the next request; parsed here, never per request."""
        meta = obj.get("metadata")
        name = str(meta.get("name") or "") if isinstance(meta, Mapping) else ""
        if not name:
            return
        node, pool, problem = "", "", ""
        devices: list[Device] = []
        if event != "DELETED":
            try:
                node, pool, devices = read_slice(obj)
            except SliceError as exc:  # out of the model: its node has no DRA devices until fixed
                problem = str(exc)
        with self.lock:
            if problem:
                self.ignored.left_out("resourceslice", name, "malformed", problem)
            else:
                self.ignored.taken("resourceslice", name)
            old = self._slices.pop(name, None)
            if node:
                self._slices[name] = (node, pool, devices)
                self._slices_of.setdefault(node, set()).add(name)
            if old is not None and old[0] != node:
                self._slices_of.get(old[0], set()).discard(name)
            for changed in {node, old[0] if old is not None else ""} - {""}:
                self._devices[changed] = NodeDevices.of(d for s in self._slices_of.get(changed, ())
                                                        for d in self._slices[s][2])
                if not self._devices[changed].devices:
                    del self._devices[changed]
                self._structure_dirty = True
                self._dirty_nodes.add(changed)  # its rows and what its claims hold: occupied again, never copied

    def on_claim(self, event: str, obj: Mapping[str, Any]) -> None:
        """A ResourceClaim: while allocated, the devices the scheduler allocated are held on their node."""
        meta = obj.get("metadata")
        meta = meta if isinstance(meta, Mapping) else {}
        key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        try:
            node, held = ("", []) if event == "DELETED" else allocation(obj)
        except SliceError as exc:
            self.ignored.left_out("resourceclaim", key, "malformed", str(exc))
            node, held = "", []
        with self.lock:
            if not node and held:  # no node selector: the node of the pool's slices
                node = next((n for n, pool, _ in self._slices.values() if pool == held[0][0]), "")
            entry = (node, tuple(device for _, device in held)) if node and held else None
            old = self._claims.get(key)
            if old == entry:
                return
            if old is not None:
                self._claims_on.get(old[0], {}).pop(key, None)
                self._dirty_nodes.add(old[0])
                del self._claims[key]
            if entry is not None:
                self._claims[key] = entry
                self._claims_on.setdefault(node, {})[key] = entry[1]
                self._dirty_nodes.add(node)

    def claim_allocated(self, key: str) -> bool:
        """Whether the claim `namespace/name` is allocated: a pending pod naming a shared claim so allocated
        asks for no GPU (kube-scheduler's DynamicResources filter keeps it on the claim's node; the claim's
        allocation holds the GPU here)."""
        with self.lock:
            return key in self._claims

    def _forget(self, key: str) -> None:
        old = self._pods.pop(key, None)
        if old is not None:
            pods = self._by_node.get(old[0])
            if pods is not None:
                pods.pop(key, None)
                if not pods:
                    del self._by_node[old[0]]
            self._dirty_nodes.add(old[0])

    def _drop_assumption(self, key: str) -> None:
        assumed = self._assumed.pop(key, None)
        node = assumed.node if assumed is not None else self._confirmed.pop(key, None)
        if node is not None:
            on_node = self._assumed_on.get(node, {})
            on_node.pop(key, None)
            if not on_node:
                self._assumed_on.pop(node, None)
            self._dirty_nodes.add(node)

    # ---- request side -------------------------------------------------------------------------
    def assume(self, key: str, node: str, demand: PodDemand, gpus: tuple[int, ...] = (), *,
               binding: bool = False) -> None:
        """Count pod `key` (`scheduling.pod_key`) on `node` (on `gpus`) until the API shows it bound, it is
        deleted, or the assumption expires. `binding`: /bind's, which a later request does not replace."""
        with self.lock:
            if key in self._pods:  # already bound per the watch: nothing to assume
                return
            if not binding and self._binding(key):  # a late request of a pod being bound (module doc)
                return
            self._drop_assumption(key)
            self._assumed[key] = _Assumed(node, demand, self._clock() + self.assume_seconds, gpus, binding)
            self._assumed_on.setdefault(node, {})[key] = (demand, gpus)
            self._dirty_nodes.add(node)

    def _binding(self, key: str) -> bool:
        assumed = self._assumed.get(key)
        return key in self._confirmed or (assumed is not None and assumed.binding)

    def placed(self, key: str) -> bool:
        """Whether pod `key` is assumed, being bound or bound: a decision prepared for it comes too late."""
        with self.lock:
            return key in self._assumed or key in self._confirmed or key in self._pods

    def forget(self, key: str) -> None:
        """Drop pod `key`'s assumption (a binding that failed)."""
        with self.lock:
            self._drop_assumption(key)

    def confirm(self, key: str) -> None:
        """The API accepted pod `key`'s binding: its assumption stays, without expiry, until the watch shows
        the pod bound or deleted (a watch slower than `assume_seconds` must not free what the pod holds)."""
        with self.lock:
            assumed = self._assumed.pop(key, None)
            if assumed is not None:
                self._confirmed[key] = assumed.node

    @property
    def assumed(self) -> dict[str, str]:
        with self.lock:
            return {**{k: a.node for k, a in self._assumed.items()}, **self._confirmed}

    def node_pods(self, node: str) -> dict[str, PodDemand]:
        with self.lock:
            return {k: held[0] for k, held in self._by_node.get(node, {}).items()}

    def fresh_state(self, forget: str | None = None) -> NodeState:
        """The node model with every recorded event applied. Call with `self.lock` held.

        `forget`: the key of a pod being scheduled again; its previous assumption no longer holds, unless
        the pod is being bound (a late request: module doc).
        """
        if forget is not None and not self._binding(forget):
            self._drop_assumption(forget)
        now = self._clock()
        expired = []
        for key, assumed in self._assumed.items():  # oldest first: stop at the first still valid
            if assumed.expires > now:
                break
            expired.append(key)
        for key in expired:
            log.debug("assumption for %s on %s expired", key, self._assumed[key].node)
            self._drop_assumption(key)
        if self._structure_dirty:
            self._rebuild()
            self.version += 1
        elif self._dirty_nodes:
            self._apply_rows(self._dirty_nodes)
            self._dirty_nodes.clear()
        self._refresh_mix(now)
        return self._state

    def settle(self, max_rows: int = SETTLE_ROWS) -> int:
        """Recompute up to `max_rows` dirty rows now, off the request path; returns how many are still dirty.

        Rows dirtied while no request came (pods bound directly, a quiet
        scheduler) were all recomputed inside the next request: some 250 us
        a row, a second at 5,000 nodes (docs/benchmarks.md, issue 47). The
        watch's settle thread (`extender.watch`) calls this between requests,
        a few rows per hold of the lock so a request never waits long for it.
        A changed node list or capacity is not rebuilt here (`rebuild`).
        """
        with self.lock:
            if not self._dirty_nodes:
                return 0
            batch = [self._dirty_nodes.pop() for _ in range(min(max_rows, len(self._dirty_nodes)))]
            self._apply_rows(batch)
            self.rows_settled += len(batch)
            return len(self._dirty_nodes)

    @property
    def dirty_rows(self) -> int:
        """Rows marked dirty and not yet recomputed (by `settle` or the next request)."""
        return len(self._dirty_nodes)

    def rebuild(self) -> None:
        """Build the state now if the node list or a capacity changed (the settle thread, after start-up and
        node joins; otherwise the next request would)."""
        with self.lock:
            if self._structure_dirty:
                self.fresh_state()

    def _apply_rows(self, names: Iterable[str]) -> None:
        """Recompute the named rows of the current state (rows of nodes it lacks wait for a rebuild); the
        caller takes them out of the dirty set."""
        for name in names:
            index = self._state.index.get(name)
            if index is not None:
                self._recompute_row(index, name)
        self.version += 1

    def observe(self, key: str, demand: PodDemand) -> None:
        """Learn a GPU pod (whole, share, MIG or replica) into the typical mix, once per pod key.

        CPU-only pods are not learned: the mix is what fragmentation is
        measured against, and a cluster's DaemonSets and batch pods would
        otherwise crowd the GPU pod types out of the coverage cut. Counts
        decay per learned GPU pod (`OnlineMix`), so the mix follows a
        changing workload.
        """
        if not (demand.needs_gpu or demand.mig or demand.shared):
            return
        if demand.saturated:  # fits nowhere: not a pod type to keep room for (said once per pod)
            self.ignored.left_out("pod", key, OUT_OF_RANGE, "asks more than any node has: not learned into "
                                  "the typical mix")
            return
        with self.lock:
            if key in self._seen:
                return
            self._seen[key] = None
            if len(self._seen) > SEEN_PODS:
                del self._seen[next(iter(self._seen))]
            if len(self._recent) < MIN_MIX_PODS:
                self._recent.append(demand)
            self._online.observe(demand)

    @property
    def gpu_pods_learned(self) -> int:
        return len(self._seen)

    def mix(self, fallback: PodDemand | None = None) -> TypicalMix | None:
        """The typical pod mix for fragmentation-aware policies.

        The learned mix once MIN_MIX_PODS GPU pods were seen; before that,
        those few pods plus `fallback` (the pod being scheduled).
        """
        if len(self._seen) >= MIN_MIX_PODS and self._mix is not None and len(self._mix):
            return self._mix
        pods = [*self._recent, *([fallback] if fallback is not None else [])]
        return TypicalMix.from_pods(pods, coverage=1.0) if pods else None

    def mix_in_force(self) -> TypicalMix | None:
        """The mix the next decision uses (without a fallback pod): /metrics and /debug/mix show it."""
        with self.lock:
            self._refresh_mix(self._clock())
            return self.mix()

    def _refresh_mix(self, now: float) -> None:
        # A new mix rebuilds the fragmentation terms (O(nodes x types)): refresh at most every
        # mix_refresh_seconds, or at once while there is none.
        empty = self._mix is None or not len(self._mix)
        starting = len(self._seen) < MIN_MIX_PODS * 2  # the first pods change the mix most: follow them at once
        if ((empty or starting) and self._online.observed) or now - self._mix_at >= self.mix_refresh_seconds:
            self._mix = self._online.mix()
            self._mix_at = now

    def _rebuild(self) -> None:
        """A new state for a changed node list or capacity: the rows of nodes whose spec and load did not
        change are copied from the last state (`NodeState.take_rows`), the others occupied again."""
        names = sorted(self._nodes)
        old, old_specs = self._state, self._specs
        self._specs = {n: self._spec(n) for n in names}  # DRA rows worked out once per rebuild (slices change rarely)
        state = NodeState.build(self._specs[n] for n in names)
        same = [n for n in names
                if n in old.index and n not in self._dirty_nodes and old_specs.get(n) == self._specs[n]]
        kept = set(same) if same and state.take_rows(old, same) else set()
        for i, name in enumerate(names):
            if name in kept:
                continue
            state.schedulable[i] = self._nodes[name].schedulable
            self._occupy_all(state, i, name)
        self.rows_copied += len(kept)
        self.rows_occupied += len(names) - len(kept)
        self._state = state
        self.ctx = PackingContext()  # caches are per state
        self._structure_dirty = False
        self._dirty_nodes.clear()
        self.rebuilds += 1

    def _spec(self, name: str) -> NodeSpec:
        """The node's spec with the GPU rows of its DRA devices (`dradevices.dra_node_spec`)."""
        spec, devices = self._nodes[name].spec, self._devices.get(name)
        if devices is None:
            return spec
        try:
            return dra_node_spec(spec, devices)
        except (SliceError, ValueError) as exc:  # more GPUs than a node may have: its slices left out
            self.ignored.left_out("node", name, OUT_OF_RANGE, f"its ResourceSlices: {exc}")
            return spec

    def _occupy_all(self, state: NodeState, index: int, name: str) -> None:
        """Bound and assumed pods and allocated claims on one row, those with recorded GPU indices first."""
        claims = self._claims_on.get(name)
        devices = self._devices.get(name)
        held_by_claims = ([held_by_claim(devices, names, key) for key, names in claims.items()]
                          if claims and devices is not None else [])
        held = [*self._by_node.get(name, {}).values(), *self._assumed_on.get(name, {}).values(),
                *held_by_claims]
        for demand, gpus in sorted(held, key=lambda h: not h[1]):
            occupy(state, index, demand, gpus)

    def _recompute_row(self, index: int, name: str) -> None:
        """Reset one row to capacity (the engine's `reset_row`), then take every bound and assumed pod off it."""
        node = self._nodes.get(name)
        if node is None:
            self._state.reset_row(index, schedulable=False)
        else:
            self._state.reset_row(index, self._specs.get(name, node.spec), schedulable=node.schedulable)
        self._occupy_all(self._state, index, name)
        self.row_updates += 1
