"""The project's default packing strategy: FGD's fragment change plus named, weighted parts. Pure.

How `Kubeon` scores a node for a pod:
1. `Fragment`: FGD's fragment change against the typical pod mix (how much
   free GPU the placement turns into GPU no typical pod can use), with the
   typical pods' memory and the copies the node's free CPU and memory can
   still feed counted;
2. plus each term (`ShareStranding`, `ModelScarcity`, `SliverWaste`), in
   milli-GPU, before rounding;
3. FGD's rounding, int(100 * sigmoid(delta / 1000)): it creates ties, and
   ties packed in the fixed node order fill nodes one after another, which
   is most of FGD's strength;
4. equal scores go to the engine's fixed node order (the simulator's
   per-seed rank; live, `scheduling.used_first_rank`: nodes holding GPU work first).

Each part says in its docstring why it helps and by how much: the drop on
the two tuning traces, openb's default and gpuspec20 (pods pinned to GPU
models), seeds 42..51, when that part alone is removed
(`without(Kubeon(), name)` in bench/parts.py, bench/ablation.py; table and protocol in
docs/benchmarks.md). The weights are frozen in `WEIGHTS`, the one place
they are set. A part stays if it earns at least 0.05 points on either
tuning trace without losing more than 0.02 on the other (issue 41; issue
13 removed CPU stranding of whole-GPU pods and two tie-breaks). A part is
measured on both paths: the copies blend (0.03 in the simulator) and
typical pods' memory (0.00) earn 1.2 and 2.2 points through the extender,
where kube-scheduler, not the engine, places the CPU-only pods
(`kubeon-gpu simulate --through-extender`, seed 42; docs/benchmarks/history/packing.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from gpupolicy.packing.fragmentation import FragModel, best_per_node, frag_model, sigmoid_score
from gpupolicy.packing.nodemodel import IntArray, NodeState, PodDemand
from gpupolicy.packing.placement import FloatArray, PackingContext, Scored
from gpupolicy.packing.strategies.modelscarcity import model_scarcity
from gpupolicy.packing.strategies.slivers import filler_types, sliver_waste
from gpupolicy.packing.strategies.stranding import FeedRate, stranding_relief
from gpupolicy.packing.typicalmix import COVERAGE, TypicalMix


@dataclass(frozen=True)
class Weights:
    """The default strategy's weights: set here and nowhere else, chosen on the tuning traces, seeds 42..51.

    Evaluation protocol and per-part ablation: docs/benchmarks.md. The default scores 96.10 on the default
    trace and 95.98 on gpuspec20 there (our FGD: 95.25 and 94.58).
    """

    copies: float = 0.25  # share of the fragment that counts the copies the free CPU can feed
    share_stranding: float = 8.0  # per milli-GPU a sharing pod strands (or stops stranding)
    sliver: float = 3.0  # per milli-GPU of a GPU slice no typical sharing size can fill
    sliver_scarcity: float = 0.4  # a filler size rarer than this x the slices waiting for it does not count
    model_scarcity: float = 0.3  # per milli-GPU x scarcity of the node's GPU model, for pods any model will do


WEIGHTS = Weights()


@dataclass(frozen=True)
class Candidates:
    """One decision as every part sees it: candidate placements (node position `pos`, GPU `gpu`) and their model."""

    state: NodeState
    demand: PodDemand
    rows: IntArray  # state row of each placement (candidates[pos])
    gpu: IntArray  # GPU of each placement (-1: whole-GPU and CPU-only pods)
    model: FragModel
    mix: TypicalMix
    ctx: PackingContext


class Term(Protocol):
    """A part added to the fragment change before rounding (milli-GPU; higher is better). None: no change."""

    @property
    def name(self) -> str: ...

    def __call__(self, c: Candidates) -> FloatArray | None: ...


@dataclass(frozen=True)
class Fragment:
    """FGD's fragment (fragmentation.py) against the most common types covering `coverage` of pods, as FGD.

    - `coverage`: every group (coverage 1.0) gained 0.1-0.4 on 9 of 11 traces
      but lost 0.5 on cpu250: rare multi-GPU groups make nodes look
      fragmented when they are not.
    - `copies` (weight `WEIGHTS.copies`): that share of the fragment counts
      the free GPU milli the node's free CPU and memory can no longer feed
      (a node with 8 free GPUs and cores for 2 typical pods strands 6). In
      the simulator the engine places every CPU-only pod and this earns
      0.03; through the extender kube-scheduler's spreading places them, on
      the nodes with the most free CPU and memory, and removing it costs
      1.2 points (seed 42).
    - `memory`: a node hosts a typical pod only with memory for it too, and
      memory caps the copies (FGD looks at CPU and GPU only). 0.00 in the
      simulator; through the extender, where the trace's CPU-only pods (a
      median 50 GiB each) land by spreading, +2.2 points (seed 42: 93.63 ->
      95.82). Sharing-pod stranding and slivers count memory with it.
    - `restricted_types`: every type restricted to GPU models stays in the
      mix however rare (a pod pinned to T4 can use a few nodes only; with
      its type counted, placements stop fragmenting exactly those nodes, and
      `ModelScarcity` sees its demand). gpuspec20 +0.07, default 0.00.
    """

    coverage: float = COVERAGE
    copies: float = WEIGHTS.copies
    memory: bool = True
    restricted_types: bool = True

    def typical(self, mix: TypicalMix) -> TypicalMix:
        """The types this fragment counts: the coverage prefix, plus the model-restricted ones."""
        keep = np.arange(len(mix)) < mix.prefix_for(self.coverage)
        if self.restricted_types:
            keep |= np.array([a is not None for a in mix.allowed], dtype=bool)
        return mix if bool(keep.all()) else mix.select(keep)

    def model(self, state: NodeState, ctx: PackingContext, mix: TypicalMix,
              rows: IntArray | None = None) -> FragModel:
        """The fragment's model, synced for `rows` (a decision's candidates; every row when None)."""
        return frag_model(state, ctx, mix, key="kubeon-frag", use_memory=self.memory, copies=self.copies > 0,
                          copies_weight=self.copies if self.copies > 0 else 1.0, rows=rows)


@dataclass(frozen=True)
class ShareStranding:
    """A sharing pod's change gains `weight` x the free GPU milli it stops stranding (loses what it strands).

    Stranded = free GPU milli beyond what the node's free CPU can feed at the
    mix's rate (strategies/stranding.py); 0 on nodes that are not
    short, so ties survive there. Sharing pods ask the most CPU per GPU milli
    (an 11.9-core pod for 470m on a 12-cores-per-GPU node), hence the weight.
    Removing it costs 0.25 points on the default trace (0.38 without the
    copies blend); the same term for whole-GPU pods earned 0.03 and went.
    """

    weight: float = WEIGHTS.share_stranding
    name: str = "share-stranding"

    def __call__(self, c: Candidates) -> FloatArray | None:
        if not c.demand.is_sharing:
            return None
        mix, use_memory = c.mix, c.model.use_memory
        rate = c.ctx.derived(f"kubeon-feed-{use_memory}", (mix,), lambda: FeedRate.of(mix, use_memory=use_memory))
        out: FloatArray = self.weight * stranding_relief(c.state, c.demand, c.rows, rate)
        return out


@dataclass(frozen=True)
class SliverWaste:
    """A sharing pod's change loses `weight` x the part of the GPU slice it leaves that nothing typical fills.

    Waste (strategies/slivers.py): the slice minus the largest sum of typical
    sharing sizes that fits it, over the sizes the node can still host and
    that are not scarce (`scarcity`: a 160m filler beside 810m pods' twenty
    190m slices per 160m pod does not count). One number per GPU state, so
    equal GPUs stay equal and the fixed-order packing survives. Removing it
    costs 0.29 points on the default trace, counting scarce fillers too
    0.18 (bench/ablation.py, 2026-12-01).
    """

    weight: float = WEIGHTS.sliver
    scarcity: float = WEIGHTS.sliver_scarcity
    name: str = "slivers"

    def __call__(self, c: Candidates) -> FloatArray | None:
        if not c.demand.is_sharing:
            return None
        st, d, model, scarcity = c.state, c.demand, c.model, self.scarcity
        fillers = c.ctx.derived(f"kubeon-fillers-{scarcity}", (model,), lambda: filler_types(model, scarcity))
        left = st.gpu_free[c.rows, c.gpu] - d.gpu_milli
        waste = sliver_waste(model, left, st.cpu_free[c.rows] - d.cpu_milli, st.mem_free[c.rows] - d.memory_mib,
                             c.rows, fillers)
        out: FloatArray = -self.weight * waste
        return out


@dataclass(frozen=True)
class ModelScarcity:
    """A GPU pod any model will do loses `weight` x its GPU milli x the scarcity of the node's GPU model.

    Scarcity (strategies/modelscarcity.py): what the mix's model-restricted
    types want from a model per GPU, against the mix's demand per GPU; 0
    where no restricted type asks for it, so a mix without restricted types
    changes nothing. Unrestricted pods then leave the GPUs restricted pods
    need. One number per model: nodes of one model keep their ties. The
    largest part on gpuspec20 (removal -0.88); 0.00 on the default trace.
    """

    weight: float = WEIGHTS.model_scarcity
    name: str = "model-scarcity"

    def __call__(self, c: Candidates) -> FloatArray | None:
        if not c.demand.needs_gpu or c.demand.allowed_models is not None:
            return None
        state, mix = c.state, c.mix
        scarcity = c.ctx.derived("kubeon-model-scarcity", (mix, state, state.models),
                                 lambda: model_scarcity(state, mix))
        out: FloatArray = -self.weight * c.demand.gpu_total_milli * scarcity[state.model_idx[c.rows]]
        return out


DEFAULT_TERMS: tuple[Term, ...] = (ShareStranding(), ModelScarcity(), SliverWaste())


@dataclass(frozen=True)
class Kubeon:
    """The default strategy: `fragment` + `terms`, then FGD's rounding; ties go to the engine's node order."""

    name: str = "kubeon"
    description: str = ("FGD's fragment + CPU-fed copies, sharing-pod CPU stranding, GPU model scarcity, "
                        "sliver waste (default)")
    fragment: Fragment = field(default_factory=Fragment)
    terms: tuple[Term, ...] = DEFAULT_TERMS

    def score(self, state: NodeState, demand: PodDemand, candidates: IntArray, ctx: PackingContext) -> Scored:
        if ctx.mix is None:
            raise ValueError("this strategy needs a typical pod mix (PackingContext.mix)")
        full, frag = ctx.mix, self.fragment
        mix = ctx.derived(f"kubeon-mix-{frag.coverage}-{frag.restricted_types}", (full,), lambda: frag.typical(full))
        model = frag.model(state, ctx, mix, candidates)
        f_after, pos, gpu = model.after(demand, candidates)
        delta = model.frag[candidates][pos] - f_after
        view = Candidates(state, demand, candidates[pos], gpu, model, mix, ctx)
        for term in self.terms:
            change = term(view)
            if change is not None:
                delta = delta + change
        scores, choice = best_per_node(len(candidates), pos, gpu, sigmoid_score(delta))
        return Scored(scores=scores, gpu=choice)
