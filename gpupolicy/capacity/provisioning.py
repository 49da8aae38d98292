"""Which nodes to launch for pending GPU pods: one plan per loop, cheapest capacity per GPU. Pure.

`state` holds every node that exists (ready or not: a Node object, bound
pods on it); cordoned or draining rows (`schedulable` False) are not
capacity. `launching` lists capacity that was requested but has no Node
row yet (a NodeClaim without its Node): it counts as empty nodes of those
types. `pending` pods must already be in whole-GPU or milli terms
(PodDemand: shared/MIG demand converted by the caller to `gpu_milli` per
GPU, as `gpupolicy/packing/kubemodel.py` does). `max_gpus` caps the GPUs of
existing + launching + new nodes (the NodePool's `nvidia.com/gpu` limit).

The rule:
1. Pending pods, largest GPU demand first, are placed by the packing engine
   (the extender's own solver) on a copy of the existing and launching
   capacity; what fits there needs no new node (so a burst of 50 pods
   counts what the first launches already hold: one plan per loop, never
   one node per pod).
2. The rest are bin-packed first-fit-decreasing onto new nodes. A new node
   is opened as the type where the pod's dominant resource costs least
   (price x the largest of its GPU, CPU and memory shares of that type):
   cheap per GPU for GPU pods, cheap per core for CPU-only pods.
3. Each new node is then shrunk to the cheapest type that still holds all
   pods packed on it (Karpenter's narrowing of instance-type options).
Pods no allowed type can hold, or over `max_gpus`, get no launch; callers
report them.

Cost proportional to what changed (`plan_provisioning`): a caller that
keeps the spots of the previous plan passes them as `reserved` (pod ->
(row, GPU indices) of `state` + `launching`, the `placed` of the last plan
and each `Launch`'s pods on the row the caller launched it as). A reserved
pod still pending is committed on its spot without the packing engine
(counted once, so the burst that asked for a node does not ask again);
only new pods, and reserved ones whose spot is gone (row cordoned, deleted,
or filled by pods bound meanwhile), are placed by the rule above. At
F=5300 (600 pods waiting on launching nodes at every loop) this is what
lets the benchmark finish; the plan differs from a full re-plan only in
that earlier pods keep their spots (a new, larger pod does not displace
them onto a new node).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpupolicy.capacity.instances import InstanceType
from gpupolicy.capacity.nodes import with_rows
from gpupolicy.packing.engine import commit, decide, get_strategy
from gpupolicy.packing.nodemodel import MILLI, NodeState, PodDemand
from gpupolicy.packing.placement import PackingContext, Strategy, fit
from gpupolicy.packing.typicalmix import TypicalMix


@dataclass(frozen=True)
class Launch:
    """One node to request: its type and the pending pods (keys) it is for."""

    instance_type: InstanceType
    pods: tuple[str, ...]
    gpus: tuple[tuple[int, ...], ...] = ()  # per pod of `pods`, the GPU indices it was packed on


Spot = tuple[int, tuple[int, ...]]  # a row of state + launching, and the GPU indices a pod takes on it


@dataclass(frozen=True)
class Plan:
    """`plan_provisioning`'s answer: nodes to launch, and the spots of pods placed on existing capacity."""

    launches: list[Launch]
    placed: dict[str, Spot]


@dataclass
class _Bin:
    """A planned node: pods packed on it so far, against the capacity of `kind`."""

    kind: InstanceType
    cpu: int = 0
    mem: int = 0
    gpu_used: list[int] = field(default_factory=list)
    pods: list[tuple[str, PodDemand]] = field(default_factory=list)
    gpus: list[tuple[int, ...]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.gpu_used = [0] * self.kind.gpus

    def take(self, key: str, demand: PodDemand) -> bool:
        """Pack `demand` here if it fits (sharing pods best-fit on one GPU, whole GPUs on free ones)."""
        if not self.kind.holds(demand):
            return False
        if self.cpu + demand.cpu_milli > self.kind.cpu_milli or self.mem + demand.memory_mib > self.kind.memory_mib:
            return False
        gpus: list[int] = []
        if demand.needs_gpu:
            if demand.is_sharing:
                room = [(MILLI - u, g) for g, u in enumerate(self.gpu_used) if MILLI - u >= demand.gpu_milli]
                if not room:
                    return False
                gpus = [min(room)[1]]
            else:
                gpus = [g for g, u in enumerate(self.gpu_used) if u == 0][: demand.num_gpu]
                if len(gpus) < demand.num_gpu:
                    return False
            for g in gpus:
                self.gpu_used[g] += demand.gpu_milli
        self.cpu += demand.cpu_milli
        self.mem += demand.memory_mib
        self.pods.append((key, demand))
        self.gpus.append(tuple(gpus))
        return True

    def gpus_needed(self) -> int:
        return sum(1 for u in self.gpu_used if u)


def dominant_cost(kind: InstanceType, demand: PodDemand) -> float:
    """What `demand` costs per hour on `kind` by its dominant share of the type's resources."""
    shares = [demand.cpu_milli / kind.cpu_milli, demand.memory_mib / kind.memory_mib]
    if demand.needs_gpu and kind.gpus:
        shares.append(demand.gpu_total_milli / (MILLI * kind.gpus))
    return kind.price_per_hour * max(shares)


def _shrink(b: _Bin, instance_types: Sequence[InstanceType]) -> _Bin:
    """`b` on the cheapest type that holds every pod of it (FFD on an empty node of it), `b` at worst."""
    for kind in sorted(instance_types, key=lambda t: (t.price_per_hour, t.gpus, t.name)):
        if kind.price_per_hour >= b.kind.price_per_hour:
            break
        trial = _Bin(kind)
        if all(trial.take(k, d) for k, d in b.pods):
            return trial
    return b


def _order(item: tuple[str, PodDemand]) -> tuple[int, int, int, str]:
    key, d = item
    return (-d.gpu_total_milli, -d.cpu_milli, -d.memory_mib, key)


def plan_launches(
    pending: Sequence[tuple[str, PodDemand]],
    state: NodeState,
    launching: Sequence[InstanceType],
    instance_types: Sequence[InstanceType],
    *,
    max_gpus: int | None = None,
    strategy: Strategy | None = None,
    ctx: PackingContext | None = None,
) -> list[Launch]:
    """The nodes to launch so that every pending pod has a place (module docstring: the rule)."""
    return plan_provisioning(pending, state, launching, instance_types, max_gpus=max_gpus, strategy=strategy,
                             ctx=ctx).launches


def _keep(trial: NodeState, demand: PodDemand, spot: Spot) -> bool:
    """Commit `demand` on its reserved `spot` if the row is still capacity and the spot still holds it."""
    row, gpus = spot
    if not 0 <= row < len(trial) or not trial.schedulable[row] or len(gpus) != (demand.num_gpu if demand.needs_gpu
                                                                                 else 0):
        return False
    try:
        trial.place(row, demand, gpus)
    except ValueError:
        return False
    return True


def plan_provisioning(
    pending: Sequence[tuple[str, PodDemand]],
    state: NodeState,
    launching: Sequence[InstanceType],
    instance_types: Sequence[InstanceType],
    *,
    max_gpus: int | None = None,
    strategy: Strategy | None = None,
    ctx: PackingContext | None = None,
    reserved: Mapping[str, Spot] | None = None,
) -> Plan:
    """`plan_launches`, keeping the `reserved` spots of pods an earlier plan placed (module docstring)."""
    if not pending:
        return Plan([], {})
    order = sorted(pending, key=_order)
    strategy = strategy or get_strategy(None)
    ctx = ctx or PackingContext(mix=TypicalMix.from_pods([d for _, d in pending], 1.0))
    trial = with_rows(state, [t.spec(f"launching-{i}") for i, t in enumerate(launching)])
    gpus = int(trial.gpu_count.sum())
    placed: dict[str, Spot] = {}
    kept = reserved or {}
    fresh: list[tuple[str, PodDemand]] = []
    for key, demand in order:  # reserved spots first: they were promised before any new pod came
        spot = kept.get(key)
        if spot is not None and _keep(trial, demand, spot):
            placed[key] = spot
        else:
            fresh.append((key, demand))
    left: list[tuple[str, PodDemand]] = []
    for key, demand in fresh:
        fitted = fit(trial, demand)
        if not fitted.feasible.any():
            left.append((key, demand))
            continue
        decision = decide(trial, demand, strategy, ctx, fitted=fitted)
        commit(trial, demand, decision)
        assert decision.node is not None
        placed[key] = (decision.node, decision.gpu_indices)
    bins: list[_Bin] = []
    for key, demand in left:
        if any(b.take(key, demand) for b in bins):
            continue
        options = [t for t in instance_types if t.holds(demand)]
        if not options:
            continue
        kind = min(options, key=lambda t: (dominant_cost(t, demand), t.price_per_hour, t.name))
        if max_gpus is not None and gpus + kind.gpus > max_gpus:
            smaller = [t for t in options if gpus + t.gpus <= max_gpus]
            if not smaller:
                continue
            kind = min(smaller, key=lambda t: (dominant_cost(t, demand), t.price_per_hour, t.name))
        b = _Bin(kind)
        b.take(key, demand)
        bins.append(b)
        gpus += kind.gpus
    shrunk = [_shrink(b, instance_types) for b in bins]
    return Plan([Launch(b.kind, tuple(k for k, _ in b.pods), tuple(b.gpus)) for b in shrunk], placed)
