"""MIG devices on GPU rows: the share of its GPU a device holds, and which GPU holds it. Pure.

A node whose GPUs are cut by a MIG layout (mixed strategy: `nvidia.com/mig-<profile>`
resources, every GPU alike as the GPU Operator's `all-*` layouts do) keeps its
physical GPUs as rows of the packing model, like any node. Per GPU the model knows
the layout (`NodeState.mig_per_gpu`: devices of each resource on one GPU) and the
devices held (`NodeState.mig_held`).

The one conversion (docs/designs/packing.md, "Live nodes"): a cut GPU is shared
among its layout's devices by compute slices. With `L` the compute slices the
layout's devices hold in all and `u` those of the devices held on the GPU, its
free milli is `MILLI * (L - u) // L`: 1000 untouched, 0 when every device is held,
in between by compute slices, exact in sum (no rounding sliver left on a full
GPU). One 1g.10gb of `all-1g.10gb` (7 x 1g) is 1/7 of its GPU (1000 -> 857 ->
714 ...); a 3g.40gb of `all-3g.40gb` (2 x 3g) is 1/2, the seventh compute slice
that layout leaves idle belonging to no one; the same fraction the provisioner
sizes a pending MIG pod by (1/instances of its `all-<profile>` layout,
capacity/demand.py). Compute, not memory slices: the milli of openb's sharing pods
and of `gpu.kubeon.io/gpu-share` is a compute share too.

Which GPU: the fullest GPU (most compute slices held) whose layout still has a
free device of the profile, lowest index on ties, device by device. The fit is by
count (`NodeState.mig_free`, the device plugin's allocatable less the devices
held); the rows say which GPU can hold a device and how full each GPU is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from gpupolicy.catalog import profile_compute_slices

if TYPE_CHECKING:
    from gpupolicy.packing.nodemodel import NodeState, PodDemand

MILLI = 1000
MAX_DEVICES_PER_GPU = 7  # a GPU has 7 compute slices: no MIG layout cuts it into more devices
IntArray = npt.NDArray[np.int64]


def resource_slices(resources: Sequence[str]) -> IntArray:
    """Compute slices of one device of each MIG resource (from the profile name; 1 when unreadable)."""
    return np.array([profile_compute_slices(r) or 1 for r in resources], dtype=np.int64)


def slice_milli(slices: int, layout: int) -> int:
    """The milli one device of `slices` compute slices holds on a GPU whose layout holds `layout` in all,
    rounded down (so a layout's devices fit one GPU in a bin of fixed sizes: the provisioner's)."""
    return MILLI * slices // layout if layout > 0 else 0


def free_milli(used: IntArray | int, layout: IntArray | int) -> IntArray:
    """Free milli of cut GPUs with `used` of their `layout` compute slices held (layout > 0)."""
    lay = np.asarray(layout)
    out: IntArray = np.maximum(MILLI * (lay - np.asarray(used)) // np.maximum(lay, 1), 0)
    return out


def device_list(state: NodeState, mig: Mapping[str, int]) -> list[int]:
    """The state's resource index of every MIG device a demand asks for, in resource order;
    resources the state does not know are left out (they fit nowhere). A count above what the widest
    node's GPU rows can hold is cut to one more than that: it still fits nowhere, and the lists built
    from it stay short (a pod asking a billion devices)."""
    most = state.gpu_free.shape[1] * MAX_DEVICES_PER_GPU + 1
    out: list[int] = []
    for resource in sorted(mig):
        if resource in state.mig_resources:
            out += [state.mig_resources.index(resource)] * min(int(mig[resource]), most)
    return out


def has_rows(state: NodeState, node: int) -> bool:
    """The node's GPUs are rows cut by a known MIG layout (MIG devices are placed on them)."""
    return bool(state.mig_layout[node] > 0)


def pick(state: NodeState, node: int, devices: Sequence[int], hint: Sequence[int] = ()) -> list[int] | None:
    """A GPU for each device (resource indices) on `node`: `hint` when it names, device by device, GPUs
    whose layout has room; else the fullest GPU with room. None when some device has room on no GPU."""
    held = state.mig_held[node].copy()
    per_gpu = state.mig_per_gpu[node]
    present = state.gpu_present[node]
    slices = state.mig_slices
    if len(hint) == len(devices) and _room_for(held, per_gpu, present, devices, hint):
        return [int(g) for g in hint]
    used = held @ slices
    out = []
    for r in devices:
        room = present & (held[:, r] < per_gpu[r])
        if not room.any():
            return None
        g = int(np.argmax(np.where(room, used, -1)))
        held[g, r] += 1
        used[g] += slices[r]
        out.append(g)
    return out


def _room_for(held: IntArray, per_gpu: IntArray, present: npt.NDArray[np.bool_], devices: Sequence[int],
              gpus: Sequence[int]) -> bool:
    held = held.copy()
    for r, g in zip(devices, gpus, strict=True):
        if not (0 <= g < len(present) and present[g] and held[g, r] < per_gpu[r]):
            return False
        held[g, r] += 1
    return True


def left_after(state: NodeState, demand: PodDemand, nodes: IntArray) -> IntArray:
    """Per node of `nodes`: free milli left on the GPUs the demand's MIG devices would take (`pick`'s
    choice), -1 on nodes without MIG rows or where some device has no GPU with room. Vectorised."""
    devices = device_list(state, demand.mig)
    out = np.full(len(nodes), -1, dtype=np.int64)
    rows = state.mig_layout[nodes] > 0
    if not devices or not rows.any():
        return out
    sub = nodes[rows]
    held = state.mig_held[sub].copy()  # (C, G, R)
    per_gpu = state.mig_per_gpu[sub]  # (C, R)
    present = state.gpu_present[sub]
    slices = state.mig_slices
    used = held @ slices  # (C, G)
    taken = np.zeros(present.shape, dtype=bool)
    ok = np.ones(len(sub), dtype=bool)
    at = np.arange(len(sub))
    for r in devices:
        room = present & (held[:, :, r] < per_gpu[:, r, None])
        g = np.argmax(np.where(room, used, -1), axis=1)
        ok &= room[at, g]
        held[at, g, r] += 1
        used[at, g] += slices[r]
        taken[at, g] = True
    left = np.where(taken, free_milli(used, state.mig_layout[sub][:, None]), 0).sum(axis=1)
    out[rows] = np.where(ok, left, -1)
    return out
