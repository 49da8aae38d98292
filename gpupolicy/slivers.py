"""What the slice a sharing pod leaves on its GPU can still hold. Pure.

At the 100% point of the openb replay the unallocated share is the free
slices of partly used GPUs. A slice is waste unless typical sharing pods
fill it, and only those the node can still host count: a 180m slice beside
an 810m pod is waste on a node with no CPU left for a 160m pod.

`sliver_waste(left)` = left - the largest sum of typical sharing sizes
(repeats allowed) that fits in it, over the sizes whose typical pods the
node's CPU, memory and GPU model still admit after the placement. A
(470m + 320m) GPU keeps 210m, a (650m + 320m) one 30m. KubeonPolicy takes
`weight x waste` off a sharing pod's fragment change before rounding; as
one number per GPU state it keeps equal GPUs equal, so FGD's fixed-order
packing survives (a tie-break on the same measure did not help:
docs/designs/packing.md, third round).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from gpupolicy.fragmentation import FragModel
from gpupolicy.nodemodel import MILLI, IntArray
from gpupolicy.placement import FloatArray

MAX_SIZES = 62  # distinct typical sharing sizes tracked per node as bits of an int64


@lru_cache(maxsize=256)
def waste_table(sizes: tuple[int, ...]) -> FloatArray:
    """waste[r] = r - the largest sum of `sizes` (repeats allowed) <= r, for r = 0..1000."""
    reach = np.zeros(MILLI + 1, dtype=bool)
    reach[0] = True
    for size in sizes:  # unbounded knapsack over sizes: r is reachable if r - size is
        for r in range(size, MILLI + 1):
            reach[r] |= reach[r - size]
    best = np.maximum.accumulate(np.where(reach, np.arange(MILLI + 1), 0))
    table: FloatArray = (np.arange(MILLI + 1) - best).astype(np.float64)
    table.setflags(write=False)
    return table


def sliver_waste(model: FragModel, left: IntArray, cpu_left: IntArray, mem_left: IntArray,
                 nodes: IntArray) -> FloatArray:
    """Waste of a slice of `left` milli on each of `nodes` with `cpu_left` / `mem_left` free after the pod."""
    share = np.flatnonzero((model.gm > 0) & (model.gm < MILLI) & (model.k == 1))  # typical sharing types
    idx = np.clip(left, 0, MILLI)
    if share.size == 0:
        return idx.astype(np.float64)
    sizes = np.unique(model.gm[share])
    if sizes.size > MAX_SIZES:  # more sizes than mask bits: every size counts, whatever the node can host
        return waste_table(tuple(sizes.tolist()))[idx]
    ok = (cpu_left[:, None] >= model.cpu[share][None, :]) & model.model_ok[nodes][:, share]
    if model.use_memory:
        ok &= mem_left[:, None] >= model.mem[share][None, :]
    # per row, the set of sizes some hostable type has, as a bit mask over `sizes`
    has = (ok.astype(np.float64) @ (model.gm[share][:, None] == sizes[None, :])) > 0
    mask = has.astype(np.int64) @ (np.int64(1) << np.arange(sizes.size, dtype=np.int64))
    out = np.empty(len(left), dtype=np.float64)
    for bits in np.unique(mask).tolist():  # distinct filler sets: a handful, not one per node
        sel = mask == bits
        subset = tuple(int(s) for i, s in enumerate(sizes.tolist()) if (bits >> i) & 1)
        out[sel] = waste_table(subset)[idx[sel]]
    return out
