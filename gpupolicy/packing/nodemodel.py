"""The packing engine's view of a cluster: N nodes as numpy struct-of-arrays, plus pod demands.

Pure: no I/O, no clock. One `NodeState` serves three callers (the live
extender, the openb simulator and the consolidation planner), so every
policy scores against the same arrays and fit rules.

How per-GPU state is modelled
- `gpu_free[n, g]` is the free milli-GPU (1000 = one GPU) of GPU g on node n;
  GPUs a node does not have are masked out by `gpu_present` and hold 0.
  In the openb trace the simulator places pods on GPU indices itself, so the
  per-GPU state is exact.
- On a real Kubernetes node the NVIDIA device plugin, not the scheduler,
  picks the devices. What is real there are node-level counts: free whole
  GPUs (`nvidia.com/gpu` allocatable minus requests), free time-sliced
  replicas (`nvidia.com/gpu.shared`) and free MIG devices per resource
  (`nvidia.com/mig-<profile>`). `kubemodel.py` puts every pod on GPU rows:
  a whole-GPU or time-sliced share pod on the GPU indices recorded on it
  (`gpu.kubeon.io/gpu-index`, written by the extender's bind), a share with
  its declared fraction, a MIG device as its slice of the GPU its layout
  cuts (`migdevices.py`: `mig_per_gpu`, `mig_held`); MIG and shared counts
  also live in `mig_free` / `shared_free` and are fitted by count.

Incremental updates (`place`/`remove`) touch one row and refresh the
per-node summaries (`full_count`, `max_partial`, `gpu_free_total`) that the
fit rules read, so a replay never rescans the cluster.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from gpupolicy.packing import migslices
from gpupolicy.packing.migslices import MAX_DEVICES_PER_GPU, free_milli, resource_slices

MILLI = migslices.MILLI  # milli-GPU in one whole GPU
# The largest amount the model holds: CPU milli, memory MiB, GPU, device and replica counts (2^32: four
# million cores, four pebibytes). Readers of API objects saturate a larger amount at it (kubemodel.saturated:
# a pod asking more fits nowhere, the truth), so the model's int64 arrays never overflow, whatever is summed.
MAX_AMOUNT = 2**32
# The most GPU rows one node may have (16 GPUs cut into 7 MIG devices each under the single strategy is
# 112): the row width of every node's arrays is the widest node's, so a node claiming more is refused.
MAX_GPUS_PER_NODE = 128
_next_version = [1]  # row versions, unique across every NodeState of the process


def next_versions(count: int) -> npt.NDArray[np.int64]:
    """`count` row versions never handed out before (equal versions mean equal rows, across copies too)."""
    start = _next_version[0]
    _next_version[0] = start + count
    return np.arange(start, start + count, dtype=np.int64)


T = TypeVar("T")
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class PodDemand:
    """What one pod asks of a node. Pure value.

    `gpu_milli` is per GPU: below 1000 only when `num_gpu == 1` (a GPU-sharing
    pod that takes a slice of one GPU); otherwise the pod needs `num_gpu`
    fully free GPUs. `allowed_models` is None when any GPU model will do.
    `mig` maps MIG resource names (`nvidia.com/mig-1g.10gb`) to counts;
    `shared` is a count of `nvidia.com/gpu.shared` replicas.
    """

    cpu_milli: int = 0
    memory_mib: int = 0
    num_gpu: int = 0
    gpu_milli: int = 0
    allowed_models: frozenset[str] | None = None
    mig: Mapping[str, int] = field(default_factory=dict)
    shared: int = 0
    gpu_memory_mib: int = 0  # per-GPU memory the pod declared (gpu.kubeon.io/gpu-memory); 0 = unknown
    name: str = ""

    def __post_init__(self) -> None:
        amounts = (self.num_gpu, self.gpu_milli, self.cpu_milli, self.memory_mib, self.shared, self.gpu_memory_mib,
                   *self.mig.values())
        if min(amounts) < 0:
            raise ValueError(f"negative demand in pod {self.name!r}")
        if max(amounts) > MAX_AMOUNT:
            raise ValueError(f"pod {self.name!r}: a demand above {MAX_AMOUNT} (readers saturate at it)")
        if self.gpu_milli > MILLI:
            raise ValueError(f"gpu_milli {self.gpu_milli} > {MILLI} in pod {self.name!r}")
        if self.num_gpu > 1 and 0 < self.gpu_milli < MILLI:
            raise ValueError(f"pod {self.name!r}: a sharing pod (gpu_milli < 1000) takes one GPU")

    @property
    def saturated(self) -> bool:
        """Some amount is at the model's bound: the pod asked for more than any node has (it fits nowhere)."""
        return max(self.cpu_milli, self.memory_mib, self.num_gpu, self.shared, self.gpu_memory_mib,
                   *self.mig.values()) >= MAX_AMOUNT

    @property
    def gpu_total_milli(self) -> int:
        """Milli-GPU this pod occupies in the milli model (num_gpu * gpu_milli)."""
        return self.num_gpu * self.gpu_milli if self.num_gpu and self.gpu_milli else 0

    @property
    def is_sharing(self) -> bool:
        return self.num_gpu == 1 and 0 < self.gpu_milli < MILLI

    @property
    def needs_gpu(self) -> bool:
        return self.gpu_total_milli > 0


@dataclass(frozen=True)
class NodeSpec:
    """One node's capacity, the input to `NodeState.build`. Pure value."""

    name: str
    cpu_milli: int
    memory_mib: int
    gpu_count: int = 0
    model: str = ""
    gpu_memory_mib: int = 0
    mig: Mapping[str, int] = field(default_factory=dict)
    shared: int = 0
    exclusive: bool = True  # whole GPUs can be requested (False: a time-sliced node advertising only replicas)
    # MIG devices of each resource on one GPU (the node's MIG layout, every GPU alike): with `gpu_count`,
    # the GPUs are rows MIG devices are placed on (migdevices.py); empty: MIG devices by count only
    mig_per_gpu: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        amounts = (self.cpu_milli, self.memory_mib, self.gpu_count, self.gpu_memory_mib, self.shared,
                   *self.mig.values(), *self.mig_per_gpu.values())
        if min(amounts) < 0 or max(amounts) > MAX_AMOUNT:
            raise ValueError(f"node {self.name}: an amount below 0 or above {MAX_AMOUNT}")
        if self.gpu_count > MAX_GPUS_PER_NODE:
            raise ValueError(f"node {self.name}: {self.gpu_count} GPUs, more than {MAX_GPUS_PER_NODE}")
        if max(self.mig_per_gpu.values(), default=0) > MAX_DEVICES_PER_GPU:
            raise ValueError(f"node {self.name}: more than {MAX_DEVICES_PER_GPU} MIG devices on one GPU")


class NodeState:
    """Free resources of N nodes as arrays; mutable only through `place`, `remove` and `reset_row`.

    Arrays (length N unless said): `cpu_free`, `mem_free`, `cpu_cap`, `mem_cap`,
    `model_idx` (into `models`), `gpu_count`, `gpu_memory_mib`,
    `gpu_free` (N x G milli), `gpu_present` (N x G), `mig_free` (N x R over
    `mig_resources`), `shared_free`, and the derived `full_count` (fully free
    GPUs), `max_partial` (largest free milli on a partly used GPU, 0 if none),
    `gpu_free_total`. MIG rows (migdevices.py): `mig_per_gpu` (N x R devices per
    GPU), `mig_held` (N x G x R), `mig_slices` (R compute slices per device),
    `mig_layout` (N compute slices one GPU's layout holds; 0: no MIG rows).
    """

    def __init__(
        self,
        names: Sequence[str],
        cpu_cap: IntArray,
        mem_cap: IntArray,
        models: Sequence[str],
        model_idx: IntArray,
        gpu_count: IntArray,
        gpu_memory_mib: IntArray,
        mig_resources: Sequence[str],
        mig_cap: IntArray,
        shared_cap: IntArray,
        exclusive: BoolArray | None = None,
        mig_per_gpu: IntArray | None = None,
    ) -> None:
        self.names: tuple[str, ...] = tuple(names)
        self.index: dict[str, int] = {n: i for i, n in enumerate(self.names)}
        if len(self.index) != len(self.names):
            raise ValueError("duplicate node names")
        n = len(self.names)
        width = max(1, int(gpu_count.max()) if n else 1)
        self.models: tuple[str, ...] = tuple(models)
        self.model_idx = model_idx.astype(np.int64)
        self.cpu_cap = cpu_cap.astype(np.int64)
        self.mem_cap = mem_cap.astype(np.int64)
        self.cpu_free = self.cpu_cap.copy()
        self.mem_free = self.mem_cap.copy()
        self.gpu_count = gpu_count.astype(np.int64)
        self.gpu_memory_mib = gpu_memory_mib.astype(np.int64)
        self.gpu_present: BoolArray = np.arange(width)[None, :] < self.gpu_count[:, None]
        self.gpu_free: IntArray = np.where(self.gpu_present, MILLI, 0).astype(np.int64)
        self.mig_resources: tuple[str, ...] = tuple(mig_resources)
        self.mig_cap = mig_cap.astype(np.int64).reshape(n, len(self.mig_resources))
        self.mig_free = self.mig_cap.copy()
        self.mig_slices = resource_slices(self.mig_resources)
        self.mig_per_gpu = (np.zeros_like(self.mig_cap) if mig_per_gpu is None
                            else mig_per_gpu.astype(np.int64).reshape(self.mig_cap.shape))
        self.mig_per_gpu[self.gpu_count == 0] = 0  # no GPU rows: MIG devices by count only
        self.mig_layout = self.mig_per_gpu @ self.mig_slices
        self.mig_held = np.zeros((n, width, len(self.mig_resources)), dtype=np.int64)
        self.shared_cap = shared_cap.astype(np.int64)
        self.shared_free = self.shared_cap.copy()
        self.full_count = self.gpu_count.copy()
        self.max_partial = np.zeros(n, dtype=np.int64)
        self.gpu_free_total = self.gpu_count * MILLI
        self.schedulable: BoolArray = np.ones(n, dtype=bool)  # False: cordoned or draining
        # False: the node's GPUs are advertised only as time-sliced replicas (no whole-GPU requests)
        self.exclusive: BoolArray = np.ones(n, dtype=bool) if exclusive is None else exclusive.astype(bool)
        # per row, a number no other row content of any state has had (next_versions): caches compare it, and a
        # copy's rows keep their numbers until they change, so a cache built on one state serves its copies
        self.row_version = next_versions(n)
        self._static: dict[str, Any] = {}  # values derived from capacity alone (`static`)

    # ---- construction -------------------------------------------------------------------
    @classmethod
    def build(cls, specs: Iterable[NodeSpec]) -> NodeState:
        """A fresh (empty) cluster from node specs, in the given order. Pure."""
        specs = list(specs)
        models = sorted({s.model for s in specs})
        midx = {m: i for i, m in enumerate(models)}
        mig_resources = sorted({r for s in specs for r in (*s.mig, *s.mig_per_gpu)})
        mig_cap = np.array([[s.mig.get(r, 0) for r in mig_resources] for s in specs], dtype=np.int64)
        per_gpu = np.array([[s.mig_per_gpu.get(r, 0) for r in mig_resources] for s in specs], dtype=np.int64)
        return cls(
            names=[s.name for s in specs],
            cpu_cap=np.array([s.cpu_milli for s in specs], dtype=np.int64),
            mem_cap=np.array([s.memory_mib for s in specs], dtype=np.int64),
            models=models,
            model_idx=np.array([midx[s.model] for s in specs], dtype=np.int64),
            gpu_count=np.array([s.gpu_count for s in specs], dtype=np.int64),
            gpu_memory_mib=np.array([s.gpu_memory_mib for s in specs], dtype=np.int64),
            mig_resources=mig_resources,
            mig_cap=mig_cap.reshape(len(specs), len(mig_resources)),
            shared_cap=np.array([s.shared for s in specs], dtype=np.int64),
            exclusive=np.array([s.exclusive for s in specs], dtype=bool),
            mig_per_gpu=per_gpu.reshape(len(specs), len(mig_resources)),
        )

    def copy(self) -> NodeState:
        """An independent copy (the consolidation planner simulates moves on one)."""
        other = object.__new__(NodeState)
        for key, value in self.__dict__.items():
            other.__dict__[key] = value.copy() if isinstance(value, np.ndarray | dict) else value
        return other

    # the arrays a row's load lives in (what `_apply`, `hold_mig`, `refresh` and `reset_row` write)
    _LOAD = ("cpu_free", "mem_free", "gpu_free", "mig_held", "mig_free", "shared_free", "full_count", "max_partial",
             "gpu_free_total", "schedulable")

    def take_rows(self, other: NodeState, names: Sequence[str]) -> bool:
        """Copy the load of the rows `names` from `other`, a state where each has the same spec (the caller
        knows). Why: a node joining a 5,000-node cluster builds a new state, and taking every pod off every
        row again cost the extender 0.6 s; the rows that did not change are copied instead. Only between
        states of the same GPU width and MIG resources (else False, nothing copied: occupy them again)."""
        if self.gpu_free.shape[1] != other.gpu_free.shape[1] or self.mig_resources != other.mig_resources:
            return False
        mine = np.array([self.index[n] for n in names], dtype=np.int64)
        theirs = np.array([other.index[n] for n in names], dtype=np.int64)
        for key in self._LOAD:
            getattr(self, key)[mine] = getattr(other, key)[theirs]
        self.row_version[mine] = next_versions(len(mine))
        return True

    def static(self, key: str, build: Callable[[], T]) -> T:
        """`build()`, once per state: for values that depend on capacity alone (no row update changes
        them; a change of capacity builds a new state)."""
        if key not in self._static:
            self._static[key] = build()
        value: T = self._static[key]
        return value

    def __len__(self) -> int:
        return len(self.names)

    @property
    def gpu_capacity_milli(self) -> int:
        return int(self.gpu_count.sum()) * MILLI

    # ---- mutation -----------------------------------------------------------------------
    def place(self, node: int, demand: PodDemand, gpu_indices: Sequence[int] = ()) -> None:
        """Take `demand` from `node`, GPU milli from `gpu_indices`. Raises if it does not fit."""
        self._apply(node, demand, gpu_indices, sign=-1)

    def remove(self, node: int, demand: PodDemand, gpu_indices: Sequence[int] = ()) -> None:
        """Give back what `place` took (a pod finished, or a planned move)."""
        self._apply(node, demand, gpu_indices, sign=+1)

    def _apply(self, node: int, demand: PodDemand, gpu_indices: Sequence[int], sign: int) -> None:
        cpu = self.cpu_free[node] + sign * demand.cpu_milli
        mem = self.mem_free[node] + sign * demand.memory_mib
        if cpu < 0 or mem < 0 or cpu > self.cpu_cap[node] or mem > self.mem_cap[node]:
            raise ValueError(f"cpu/memory out of range on node {self.names[node]} for pod {demand.name!r}")
        whole, devices, mig_gpus = self.split_indices(node, demand, gpu_indices)
        k = demand.num_gpu if demand.needs_gpu else 0
        if len(whole) != k or len(whole) + len(mig_gpus) != len(gpu_indices) or len(mig_gpus) != len(devices):
            raise ValueError(f"pod {demand.name!r} needs {demand.num_gpu if demand.needs_gpu else 0} GPU "
                             f"indices and one per MIG device on {self.names[node]}, got {list(gpu_indices)}")
        held = self.mig_held[node].copy()
        for r, g in zip(devices, mig_gpus, strict=True):
            if not (0 <= g < held.shape[0] and self.gpu_present[node, g]
                    and 0 <= held[g, r] - sign <= self.mig_per_gpu[node, r]):
                raise ValueError(f"GPU {g} of node {self.names[node]} has no {self.mig_resources[r]} "
                                 f"{'free' if sign < 0 else 'held'} for pod {demand.name!r}")
            held[g, r] -= sign  # place (sign -1) holds one more device
        row = self.gpu_free[node]
        for g in whole:
            if not self.gpu_present[node, g]:
                raise ValueError(f"node {self.names[node]} has no GPU {g}")
            value = row[g] + sign * demand.gpu_milli
            if value < 0 or value > MILLI:
                raise ValueError(f"GPU {g} of node {self.names[node]} out of range for pod {demand.name!r}")
        for resource, count in demand.mig.items():
            r = self.mig_resources.index(resource) if resource in self.mig_resources else -1
            if r < 0 or not 0 <= self.mig_free[node, r] + sign * count <= self.mig_cap[node, r]:
                raise ValueError(f"{resource} out of range on node {self.names[node]}")
        shared = self.shared_free[node] + sign * demand.shared
        if not 0 <= shared <= self.shared_cap[node]:
            raise ValueError(f"nvidia.com/gpu.shared out of range on node {self.names[node]}")
        # all checks passed: commit
        self.cpu_free[node] = cpu
        self.mem_free[node] = mem
        for g in whole:
            row[g] += sign * demand.gpu_milli
        if mig_gpus:
            self.hold_mig(node, held)
        for resource, count in demand.mig.items():
            self.mig_free[node, self.mig_resources.index(resource)] += sign * count
        self.shared_free[node] = shared
        self.refresh(node)

    def split_indices(self, node: int, demand: PodDemand, gpu_indices: Sequence[int]
                      ) -> tuple[tuple[int, ...], list[int], tuple[int, ...]]:
        """A pod's GPU indices on `node` as (whole GPUs or share, its MIG devices' resource indices, their
        GPUs). The order on the pod (`gpu.kubeon.io/gpu-index`): the `num_gpu` GPUs of its milli part first,
        then one GPU per MIG device (resources in name order); MIG devices take no index on a node without
        MIG rows."""
        k = demand.num_gpu if demand.needs_gpu else 0
        devices = self.mig_devices(demand.mig) if demand.mig and self.mig_layout[node] > 0 else []
        return tuple(gpu_indices[:k]), devices, tuple(gpu_indices[k:k + len(devices)])

    def mig_devices(self, mig: Mapping[str, int]) -> list[int]:
        """The state's resource index of every MIG device a demand asks for, in resource order;
        resources the state does not know are left out (they fit nowhere). A count above what the widest
        node's GPU rows can hold is cut to one more than that: it still fits nowhere, and the lists built
        from it stay short (a pod asking a billion devices)."""
        most = self.gpu_free.shape[1] * MAX_DEVICES_PER_GPU + 1
        out: list[int] = []
        for resource in sorted(mig):
            if resource in self.mig_resources:
                out += [self.mig_resources.index(resource)] * min(int(mig[resource]), most)
        return out

    def hold_mig(self, node: int, held: IntArray) -> None:
        """Set the MIG devices held per GPU of `node` (G x R) and the GPUs' free milli from them (the one
        conversion, migslices.py). Unchecked: `_apply` checks first, the live model clamps."""
        self.mig_held[node] = held
        cut = self.gpu_present[node] & (self.mig_layout[node] > 0)
        self.gpu_free[node] = np.where(cut, free_milli(held @ self.mig_slices, self.mig_layout[node]),
                                       self.gpu_free[node])

    def refresh(self, node: int) -> None:
        """Recompute one node's GPU summaries after its row changed."""
        row = self.gpu_free[node]
        present = self.gpu_present[node]
        self.full_count[node] = int(np.count_nonzero(row == MILLI))
        partial = row[present & (row < MILLI)]
        self.max_partial[node] = int(partial.max()) if partial.size else 0
        self.gpu_free_total[node] = int(row.sum())
        self.row_version[node] = _next_version[0]
        _next_version[0] += 1

    def reset_row(self, node: int, spec: NodeSpec | None = None, *, schedulable: bool | None = None) -> None:
        """Give one node back all of its capacity (no pods on it), optionally set `schedulable`.

        The extender's cache recomputes a node's row this way (reset, then
        `occupy` each bound or assumed pod) instead of writing the arrays
        itself. `spec`, when given, must describe the capacity this row was
        built with: a node whose capacity, GPU product or MIG layout changed
        needs a new state (`NodeState.build`), because derived caches (e.g.
        fragmentation terms per GPU model) were built for the old layout.
        Bumps the row's `row_version`.
        """
        if spec is not None:
            self._check_layout(node, spec)
        self.cpu_free[node] = self.cpu_cap[node]
        self.mem_free[node] = self.mem_cap[node]
        self.gpu_free[node] = np.where(self.gpu_present[node], MILLI, 0)
        self.mig_held[node] = 0
        self.mig_free[node] = self.mig_cap[node]
        self.shared_free[node] = self.shared_cap[node]
        if schedulable is not None:
            self.schedulable[node] = schedulable
        self.refresh(node)

    def _check_layout(self, node: int, spec: NodeSpec) -> None:
        mig = {r: int(self.mig_cap[node, i]) for i, r in enumerate(self.mig_resources) if self.mig_cap[node, i]}
        same = (spec.name == self.names[node] and spec.cpu_milli == self.cpu_cap[node]
                and spec.memory_mib == self.mem_cap[node] and spec.gpu_count == self.gpu_count[node]
                and spec.model == self.models[self.model_idx[node]]
                and spec.gpu_memory_mib == self.gpu_memory_mib[node]
                and {r: c for r, c in spec.mig.items() if c} == mig and spec.shared == self.shared_cap[node]
                and spec.exclusive == bool(self.exclusive[node]) and self._same_mig_layout(node, spec))
        if not same:
            raise ValueError(f"node {self.names[node]}: capacity or layout changed; build a new NodeState")

    def _same_mig_layout(self, node: int, spec: NodeSpec) -> bool:
        per_gpu = {r: int(c) for r, c in zip(self.mig_resources, self.mig_per_gpu[node].tolist(), strict=True) if c}
        wanted = {r: c for r, c in spec.mig_per_gpu.items() if c} if spec.gpu_count else {}
        return per_gpu == wanted

    def set_gpu_free(self, node: int, values: Sequence[int]) -> None:
        """Overwrite one node's per-GPU free milli (the extender's resync of a node). """
        row = np.zeros(self.gpu_free.shape[1], dtype=np.int64)
        row[: len(values)] = values
        if np.any(row[~self.gpu_present[node]] != 0) or np.any((row < 0) | (row > MILLI)):
            raise ValueError(f"bad GPU free values for node {self.names[node]}: {list(values)}")
        self.gpu_free[node] = row
        self.refresh(node)


def model_mask(state: NodeState, allowed: frozenset[str] | None) -> BoolArray:
    """Nodes whose GPU model is allowed (all nodes when `allowed` is None). O(N)."""
    if allowed is None:
        return np.ones(len(state), dtype=bool)
    vocab = np.array([m in allowed for m in state.models], dtype=bool)
    return vocab[state.model_idx] if len(state.models) else np.zeros(len(state), dtype=bool)


def parse_gpu_spec(spec: str) -> frozenset[str] | None:
    """openb's `gpu_spec` column: empty = any model, else `|`-separated allowed models."""
    models = frozenset(part for part in spec.split("|") if part)
    return models or None
