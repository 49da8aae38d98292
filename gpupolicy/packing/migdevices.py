"""MIG devices on GPU rows: which GPU of a node holds each device. Pure.

Which GPU: the fullest GPU (most compute slices held) whose layout still has a
free device of the profile, lowest index on ties, device by device. The fit is by
count (`NodeState.mig_free`, the device plugin's allocatable less the devices
held); the rows say which GPU can hold a device and how full each GPU is. The
share of its GPU a device holds is migslices.py's conversion.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from gpupolicy.packing.migslices import IntArray, free_milli
from gpupolicy.packing.nodemodel import NodeState, PodDemand


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
    devices = state.mig_devices(demand.mig)
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
