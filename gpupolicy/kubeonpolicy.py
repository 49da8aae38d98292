"""The project's default packing policy: FGD, refined. Pure.

Starts from FGD's rounded score (the rounding is what makes FGD good: it
creates ties, and ties packed in a fixed order fill nodes one after
another). Refinements, each measured in docs/designs/packing.md:
- tie-break among FGD-equal nodes toward the node left with fewer free
  whole GPUs-worth (best fit), so sharing pods and small pods consolidate.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpupolicy.fragmentation import best_per_node, frag_model, sigmoid_score
from gpupolicy.nodemodel import IntArray, NodeState, PodDemand
from gpupolicy.placement import PackingContext, Scored


@dataclass(frozen=True)
class KubeonPolicy:
    """FGD score, then a best-fit tie-break before the fixed node order."""

    name: str = "kubeon"
    description: str = "FGD rounded score with best-fit tie-breaking (project default)"

    def score(self, state: NodeState, demand: PodDemand, candidates: IntArray, ctx: PackingContext) -> Scored:
        model = frag_model(state, ctx)
        f_after, pos, gpu = model.after(demand, candidates)
        delta = model.frag[candidates][pos] - f_after
        scores, choice = best_per_node(len(candidates), pos, gpu, sigmoid_score(delta))
        left = state.gpu_free_total[candidates] - demand.gpu_total_milli
        return Scored(scores=scores, gpu=choice, tiebreak=-left.astype(np.float64))
