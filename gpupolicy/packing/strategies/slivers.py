"""What the slice a sharing pod leaves on its GPU can still hold. Pure.

At the 100% point of the openb replay the unallocated share is the free
slices of partly used GPUs. A slice is waste unless typical sharing pods
fill it, and only those the node can still host count: a 180m slice beside
an 810m pod is waste on a node with no CPU left for a 160m pod.

`sliver_waste(left)` = left - the largest sum of typical sharing sizes
(repeats allowed) that fits in it, over the sizes whose typical pods the
node's CPU, memory and GPU model still admit after the placement. A
(470m + 320m) GPU keeps 210m, a (650m + 320m) one 30m. A size whose pods
are scarce against the slices waiting for them (`plentiful`) is left out: a
210m slice "filled" by a 160m pod is waste when 810m pods leave twenty 190m
slices per 160m pod. Kubeon takes
`weight x waste` off a sharing pod's fragment change before rounding; as
one number per GPU state it keeps equal GPUs equal, so FGD's fixed-order
packing survives (a tie-break on the same measure did not help:
docs/benchmarks/history/packing.md, "Experiment history").
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from gpupolicy.packing.fragmentation import FragModel
from gpupolicy.packing.nodemodel import MILLI, IntArray
from gpupolicy.packing.placement import FloatArray

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


def plentiful(sizes: tuple[int, ...], weights: tuple[float, ...], ratio: float) -> tuple[bool, ...]:
    """Per size: are its pods at least `ratio` x as common as the slices that wait for them?

    A lone pod of size s > 500m leaves 1000 - s, and that slice waits for the
    largest size that fits it; once that size's pods are all spoken for, for
    the next smaller one. Slices are served smallest first (they have the
    fewest fillers). Pods of 500m or less are left out: their slices hold
    another pod like them. On openb's default trace 810m pods (14% of pods)
    leave 190m that 160m pods (0.7%) fill: counting 160m as a filler calls a
    (470m + 320m) GPU's 210m "filled" when almost every 160m pod is long gone
    into an 810m slice. Below 160m the same slices wait for 110m and 50m pods
    (where a mix has them), so those are scarce too.
    """
    left = list(weights)  # pods of each size not yet spoken for
    wanted = [0.0] * len(sizes)
    big = (i for i in range(len(sizes)) if 2 * sizes[i] > MILLI)  # smaller pods' slices hold pods like them
    for s in sorted(big, key=lambda i: -sizes[i]):  # largest pod = smallest slice first
        need = weights[s]
        for t in sorted((i for i in range(len(sizes)) if sizes[i] <= MILLI - sizes[s]), key=lambda i: -sizes[i]):
            wanted[t] += need
            taken = min(need, left[t])
            left[t] -= taken
            need -= taken
            if need <= 0:
                break
    return tuple(w >= ratio * d for w, d in zip(weights, wanted, strict=True))


def filler_types(model: FragModel, scarcity: float) -> IntArray:
    """The mix's typical sharing types whose size counts as a filler (not scarce at `scarcity`)."""
    is_share = (model.gm > 0) & (model.gm < MILLI) & (model.k == 1)
    if scarcity > 0 and is_share.any():
        sizes = np.unique(model.gm[is_share])
        weights = tuple(float(model.p[is_share & (model.gm == g)].sum()) for g in sizes)
        keep = plentiful(tuple(int(g) for g in sizes), weights, scarcity)
        is_share &= np.isin(model.gm, sizes[np.array(keep, dtype=bool)])
    out: IntArray = np.flatnonzero(is_share)
    return out


def sliver_waste(model: FragModel, left: IntArray, cpu_left: IntArray, mem_left: IntArray,
                 nodes: IntArray, fillers: IntArray | None = None) -> FloatArray:
    """Waste of a slice of `left` milli on each of `nodes` with `cpu_left` / `mem_left` free after the pod.

    `fillers`: the typical types that may fill it (`filler_types`; default
    every sharing type). A caller keeps them per mix: this runs per decision.
    """
    share = filler_types(model, 0.0) if fillers is None else fillers
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
