"""A `NodeState` grown by nodes that do not exist yet (launching NodeClaims, planned launches). Pure.

Provisioning must count capacity that was requested but has no Node yet,
and consolidation must simulate on a copy; both need the packing engine's
arrays with extra empty rows, built here once.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gpupolicy.packing.nodemodel import MILLI, NodeSpec, NodeState, next_versions


def with_rows(state: NodeState, specs: Sequence[NodeSpec]) -> NodeState:
    """A new state: `state`'s rows (with their free resources and schedulability) then empty `specs` rows."""
    if not specs:
        return state.copy()
    models = sorted(set(state.models) | {s.model for s in specs})
    midx = {m: i for i, m in enumerate(models)}
    old_models = np.array([midx[m] for m in state.models], dtype=np.int64)
    mig_resources = sorted(set(state.mig_resources) | {r for s in specs for r in (*s.mig, *s.mig_per_gpu)})
    n_old, n_new = len(state), len(specs)
    mig_cap = np.zeros((n_old + n_new, len(mig_resources)), dtype=np.int64)
    mig_free = np.zeros_like(mig_cap)
    per_gpu = np.zeros_like(mig_cap)
    old_at = [mig_resources.index(r) for r in state.mig_resources]
    mig_cap[:n_old, old_at] = state.mig_cap
    mig_free[:n_old, old_at] = state.mig_free
    per_gpu[:n_old, old_at] = state.mig_per_gpu
    for i, s in enumerate(specs):
        for r, c in s.mig.items():
            mig_cap[n_old + i, mig_resources.index(r)] = c
            mig_free[n_old + i, mig_resources.index(r)] = c
        for r, c in s.mig_per_gpu.items():
            per_gpu[n_old + i, mig_resources.index(r)] = c
    out = NodeState(
        names=[*state.names, *(s.name for s in specs)],
        cpu_cap=np.concatenate([state.cpu_cap, [s.cpu_milli for s in specs]]).astype(np.int64),
        mem_cap=np.concatenate([state.mem_cap, [s.memory_mib for s in specs]]).astype(np.int64),
        models=models,
        model_idx=np.concatenate([old_models[state.model_idx] if n_old else np.zeros(0, np.int64),
                                  [midx[s.model] for s in specs]]).astype(np.int64),
        gpu_count=np.concatenate([state.gpu_count, [s.gpu_count for s in specs]]).astype(np.int64),
        gpu_memory_mib=np.concatenate([state.gpu_memory_mib, [s.gpu_memory_mib for s in specs]]).astype(np.int64),
        mig_resources=mig_resources,
        mig_cap=mig_cap,
        shared_cap=np.concatenate([state.shared_cap, [s.shared for s in specs]]).astype(np.int64),
        exclusive=np.concatenate([state.exclusive, [s.exclusive for s in specs]]).astype(bool),
        mig_per_gpu=per_gpu,
    )
    out.cpu_free[:n_old] = state.cpu_free
    out.mem_free[:n_old] = state.mem_free
    width = state.gpu_free.shape[1]
    out.gpu_free[:n_old, :width] = state.gpu_free[:, : out.gpu_free.shape[1]]
    out.mig_free[:] = mig_free
    out.mig_held[:n_old, :width][:, :, old_at] = state.mig_held[:, : out.gpu_free.shape[1]]
    out.shared_free[:n_old] = state.shared_free
    out.schedulable[:n_old] = state.schedulable
    refresh_all(out)
    return out


def refresh_all(state: NodeState) -> None:
    """`NodeState.refresh` for every row at once (vectorised)."""
    free, present = state.gpu_free, state.gpu_present
    state.full_count[:] = np.count_nonzero(present & (free == MILLI), axis=1)
    partial = np.where(present & (free < MILLI), free, 0)
    state.max_partial[:] = partial.max(axis=1) if partial.shape[1] else 0
    state.gpu_free_total[:] = free.sum(axis=1)
    state.row_version[:] = next_versions(len(state))
