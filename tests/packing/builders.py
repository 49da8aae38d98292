"""Builders for small hand-worked node states and pods (shared by the packing tests)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gpupolicy.packing.nodemodel import NodeSpec, NodeState, PodDemand, parse_gpu_spec
from gpupolicy.packing.placement import PackingContext
from gpupolicy.packing.typicalmix import TypicalMix


def make_pod(gpus: int = 0, milli: int = 1000, cpu: int = 1000, mem: int = 1024, spec: str = "",
             name: str = "p") -> PodDemand:
    return PodDemand(cpu_milli=cpu, memory_mib=mem, num_gpu=gpus, gpu_milli=milli if gpus else 0,
                     allowed_models=parse_gpu_spec(spec), name=name)


def make_state(nodes: Sequence[tuple[str, int, int, Sequence[int], str]]) -> NodeState:
    """nodes: (name, free cpu milli, free mem MiB, per-GPU free milli, model). Capacity = free here
    except GPUs, which start full and are set to the given free values."""
    state = NodeState.build(NodeSpec(name=n, cpu_milli=c, memory_mib=m, gpu_count=len(g), model=mo)
                            for n, c, m, g, mo in nodes)
    for i, (_, _, _, gpus, _) in enumerate(nodes):
        state.set_gpu_free(i, list(gpus))
    return state


def make_ctx(mix_pods: Sequence[PodDemand] = (), seed: int = 0) -> PackingContext:
    return PackingContext(mix=TypicalMix.from_pods(mix_pods) if mix_pods else None,
                          rng=np.random.default_rng(seed))
