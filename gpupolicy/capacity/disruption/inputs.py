"""What a disruption plan is made from and what it returns: the rules, the frozen inputs, the Disruption.

The inputs are one snapshot of the cluster, taken by the caller (the
controller or the simulator): the planner reads nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass, field

from gpupolicy.capacity.instances import InstanceType
from gpupolicy.packing.nodemodel import NodeState, PodDemand
from gpupolicy.packing.placement import PackingContext, Strategy

EMPTY, UNDERUSED, MULTI_NODE, SINGLE_NODE = "empty", "underused", "multi-node", "single-node"


@dataclass(frozen=True)
class ConsolidationRules:
    """The policy's `consolidation` block in plain numbers."""

    underused_below_percent: float = 10.0
    window_seconds: float = 7200.0
    max_disrupted_nodes: int = 1
    empty_grace_seconds: float = 0.0
    max_evictions_per_pod: int | None = 3  # a pod evicted this often pins its node (None: no limit)
    settle_seconds: float = 0.0  # a non-empty node is a candidate once its pods have not changed this long
    min_pod_age_seconds: float = 0.0  # a non-empty node is a candidate once its youngest pod has run this long

    def __post_init__(self) -> None:
        if not 0 <= self.underused_below_percent <= 100:
            raise ValueError("underused_below_percent must be within 0..100")
        if min(self.window_seconds, self.empty_grace_seconds, self.settle_seconds, self.min_pod_age_seconds) < 0:
            raise ValueError("window_seconds, empty_grace_seconds, settle_seconds and min_pod_age_seconds must be >= 0")
        if self.max_disrupted_nodes < 0:
            raise ValueError("max_disrupted_nodes must be >= 0")
        if self.max_evictions_per_pod is not None and self.max_evictions_per_pod < 0:
            raise ValueError("max_evictions_per_pod must be >= 0")


Pods = Sequence[tuple[str, PodDemand]]


@dataclass(frozen=True)
class DisruptionInputs:
    """One snapshot for `plan_disruptions`; rows are the nodes of `state`.

    `state` has every pod of `pods_on` placed; `pods_on[n]` holds node n's
    evictable pods (DaemonSet and mirror pods left out by the caller).
    `usage_percent[n]` is the node's HIGHEST GPU utilisation over the rules'
    window, None when the window is not fully covered (no Prometheus: then no
    usage-aware candidate). `blocked` rows are never disrupted (do-not-disrupt
    on node or pod, a drain under way, not ready). `in_progress` nodes being
    disrupted count against `max_disrupted_nodes`. `evictions[key]`: how often
    each pod was evicted (a pod at the rules' cap pins its node: no pod is
    disrupted without end). `changed_at[n]`: when a pod last came to or left
    node n (a busy node settles first, as Karpenter's consolidateAfter).
    `started_at[key]`: when each pod started on its node (for the minimum pod
    age: a pod that ran long tends to run long, so a node of young pods tends
    to empty by itself). `pending`: the pods waiting for a node; an empty node
    one of them fits is awaited, not empty (Karpenter's nominated nodes: a
    node just launched for a pending pod is empty until the scheduler binds
    it there, and deleting it then only launches another). `max_trials` bounds the re-placement simulations of
    one call (a loop's time budget). `strategy` and `ctx` default to the
    extender's packing strategy and a typical mix of these pods.
    """

    state: NodeState
    pods_on: Mapping[int, Pods]
    price_per_hour: Sequence[float]
    rules: ConsolidationRules
    now: float
    usage_percent: Mapping[int, float | None] = field(default_factory=dict)
    blocked: Set[int] = frozenset()
    empty_since: Mapping[int, float] = field(default_factory=dict)
    in_progress: int = 0
    strategy: Strategy | None = None
    ctx: PackingContext | None = None
    max_trials: int = 24
    instance_types: Sequence[InstanceType] = ()
    evictions: Mapping[str, int] = field(default_factory=dict)
    changed_at: Mapping[int, float] = field(default_factory=dict)
    started_at: Mapping[str, float] = field(default_factory=dict)
    pending: Sequence[PodDemand] = ()


@dataclass(frozen=True)
class Disruption:
    """One planned disruption: the rows to drain and delete, where their pods go, what it saves."""

    nodes: tuple[int, ...]
    method: str
    moves: dict[str, int]
    savings_per_hour: float
    explanation: str
    launches: tuple[InstanceType, ...] = ()  # replacements to launch first; moves to row len(state) + i go there
