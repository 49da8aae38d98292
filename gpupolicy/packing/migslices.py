"""MIG devices as compute slices of their GPU: the one conversion. Pure, on plain numbers.

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

Which GPU holds each device is migdevices.py's, over the node state; this module
reads no state, so the state (nodemodel.py) can use the conversion without a cycle.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from gpupolicy.catalog import profile_compute_slices

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
