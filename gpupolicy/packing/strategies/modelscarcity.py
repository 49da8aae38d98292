"""How scarce each GPU model is for the model-restricted pods of the typical mix. Pure.

A pod restricted to P100 GPUs can run on a few nodes only; a pod that any
GPU will do can run anywhere. The fragment (fragmentation.py) knows per
type which models it may use (`TypicalMix.allowed_matrix`), but it counts
free GPU, not whose GPU it is: on openb's gpuspec20 trace a replay without
this ends with G2 GPUs free (few restricted types want them) while pods
restricted to P100, V100 and T4 fail, because unrestricted pods took those
GPUs first.

`model_scarcity(state, mix)[j]` = the GPU milli that restricted types want
from model j (each type's demand spread over its allowed models by their
GPU count) per GPU of j, divided by the mix's whole GPU demand per GPU of
the cluster: 0 where no restricted type asks for j, 1 where restricted pods
alone would take j's fair share. One number per model, so nodes of one
model keep their ties (and FGD's fixed-order packing); a mix without
restricted types gives 0 everywhere. The mix is the same object on both
paths (the trace's in the simulator, the learned `OnlineMix` live), so the
same pods make the same scarcity.
"""

from __future__ import annotations

import numpy as np

from gpupolicy.packing.nodemodel import NodeState
from gpupolicy.packing.placement import FloatArray
from gpupolicy.packing.typicalmix import TypicalMix


def model_scarcity(state: NodeState, mix: TypicalMix) -> FloatArray:
    """Per GPU model of `state` (`state.models`): restricted types' demand per GPU of it, against the mix's."""
    caps = np.bincount(state.model_idx, weights=state.gpu_count, minlength=len(state.models)).astype(np.float64)
    demand = mix.weight * mix.gpu_milli * np.maximum(mix.num_gpu, 1)  # (M,), 0 for CPU-only types
    restricted = np.array([a is not None for a in mix.allowed], dtype=bool) & (mix.gpu_milli > 0)
    spread = mix.allowed_matrix(state.models)[restricted] * caps[None, :]  # (restricted, models)
    spread /= np.maximum(spread.sum(axis=1, keepdims=True), 1e-9)
    wanted = demand[restricted] @ spread  # (models,)
    overall = demand.sum() / max(float(caps.sum()), 1.0)
    out: FloatArray = wanted / np.maximum(caps, 1e-9) / max(overall, 1e-12)
    return out
