"""Which GPU nodes to give back: empty, underused or packable onto fewer nodes, always re-placed first. Pure.

Signatures (the controller and the benchmark call these):
    @dataclass(frozen=True) class ConsolidationRules: underused_below_percent: float; window_seconds: float;
        max_disrupted_nodes: int; empty_grace_seconds: float; max_evictions_per_pod: int | None = 3;
        settle_seconds: float = 0.0; min_pod_age_seconds: float = 0.0
    @dataclass(frozen=True) class Disruption: nodes: tuple[int, ...]; method: str; moves: dict[str, int];
        savings_per_hour: float; explanation: str; launches: tuple[InstanceType, ...] = ()
    plan_disruptions(state: NodeState, pods_on: Mapping[int, Sequence[tuple[str, PodDemand]]],
                     price_per_hour: Sequence[float], usage_percent: Mapping[int, float | None],
                     rules: ConsolidationRules, *, blocked: Set[int], now: float,
                     empty_since: Mapping[int, float], in_progress: int = 0,
                     strategy: Strategy | None = None, ctx: PackingContext | None = None,
                     max_trials: int = 24, instance_types: Sequence[InstanceType] = (),
                     evictions: Mapping[str, int] | None = None,
                     changed_at: Mapping[int, float] | None = None,
                     started_at: Mapping[str, float] | None = None) -> list[Disruption]
    plan_around(plan: Callable[[Set[int]], list[Disruption]], blocked: Set[int], held: Mapping[int, str],
                max_replans: int = 3) -> tuple[list[Disruption], dict[int, tuple[Disruption, str]]]

Inputs: `state` with every pod of `pods_on` placed (rows are nodes);
`pods_on[n]` the evictable pods of node n (DaemonSet and mirror pods left
out by the caller); `usage_percent[n]` the node's HIGHEST GPU utilisation
over the last `rules.window_seconds` (None when the window is not fully
covered, e.g. no Prometheus: then no usage-aware candidate);
`blocked` rows that must not be disrupted (do-not-disrupt on node or pod,
a drain under way, not yet ready); `empty_since[n]` when node n last became
empty; `in_progress` nodes already being disrupted (they count against
`max_disrupted_nodes`); `evictions[key]` how often each pod was evicted
already (a pod at `rules.max_evictions_per_pod` pins its node: no pod is
disrupted without end); `changed_at[n]` when a pod last came to or left
node n (a busy node settles `rules.settle_seconds` before it is a
candidate, as Karpenter's consolidateAfter); `started_at[key]` when each
pod started on its node (with `rules.min_pod_age_seconds`: a busy node is a
candidate once its youngest pod ran that long, and moved pods go only
beside pods that old. The survival fact: a pod that ran long tends to run
long, so a node of young pods tends to empty by itself, and a pod moved
beside young ones moves again when they leave). Rows with `schedulable`
False are neither candidates nor destinations, and a pod is never moved onto
a node dearer per GPU than the dearest it leaves.

Methods, in order (Karpenter's disruption order, plus ours):
1. `empty`: no pods for `empty_grace_seconds` (the "remove the GPU node
   when the GPU job ends" ask): deleted without a drain.
2. `underused`: GPU utilisation below `underused_below_percent` for the
   whole window, and every pod re-places on the other nodes.
3. `multi-node`: the largest set (2 or more) of the least-used nodes whose
   pods all re-place on the remaining nodes at once.
4. `single-node`: one node whose pods all re-place elsewhere, or (given
   `instance_types`) whose pods re-place on the other nodes plus new nodes
   (`plan_launches`) that cost less than it: a replacement (`launches`,
   launched and ready before the drain; `moves` to row len(state) + i
   mean the i-th launch). Savings are then the difference in price. A
   replacement is only simulated when nodes of one type holding the pods'
   summed CPU, memory and GPUs cost less than it (a bound that skips
   hopeless ones; several nodes may replace one).
Re-placement runs the packing engine (the extender's solver) on a copy with
the candidates cordoned, over every other schedulable node, as the
scheduler will place the evicted pods: the controller cannot steer them.
A move is planned only if the engine's own pick for every pod is a
destination the rules accept: a node that holds pods (moving pods onto an
empty node saves nothing), not dearer per GPU, not beside young pods (with
`min_pod_age_seconds`). Excluding those nodes from the simulation instead
(as before) planned moves the scheduler then did not make: at F=50 the
evicted pods of such plans went onto the refused nodes (an 8-GPU node
kept for weeks by 1-GPU pods at their eviction cap). `moves` are the
engine's picks. At most
`max_disrupted_nodes - in_progress` nodes in all; at most one multi- or
single-node action per call (the next loop sees the result). `max_trials`
bounds the re-placement simulations per call (a loop's time budget).

`plan_around` keeps `held` rows (row -> why: a PodDisruptionBudget that
allows no disruption, gpupolicy/capacity/budgets.py) out of the plan while
saying which of them the plan would have disrupted: it plans with them as
candidates, and when a disruption takes one, that row is noted with its
reason and the plan made again without it, so the next candidate gets its
turn (at most `max_replans` times, then every held row is blocked). A held
row is never in the plan returned; the notes (row -> the disruption it was
kept from, why) are for the proposals.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass

from gpupolicy.capacity.instances import InstanceType
from gpupolicy.capacity.provisioning import plan_launches
from gpupolicy.packing.engine import commit, decide, get_strategy
from gpupolicy.packing.nodemodel import MILLI, NodeState, PodDemand
from gpupolicy.packing.placement import PackingContext, Strategy, fit
from gpupolicy.packing.typicalmix import TypicalMix

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


@dataclass(frozen=True)
class Disruption:
    """One planned disruption: the rows to drain and delete, where their pods go, what it saves."""

    nodes: tuple[int, ...]
    method: str
    moves: dict[str, int]
    savings_per_hour: float
    explanation: str
    launches: tuple[InstanceType, ...] = ()  # replacements to launch first; moves to row len(state) + i go there


def _replacement(state: NodeState, node: int, pods: Sequence[tuple[str, PodDemand]],
                 instance_types: Sequence[InstanceType], strategy: Strategy, ctx: PackingContext,
                 exclude: Sequence[int] = ()) -> tuple[dict[str, int], tuple[InstanceType, ...]] | None:
    """Moves and new nodes for `node`'s pods: the remaining nodes (not `exclude`) first, then cheapest new ones."""
    trial = state.copy()
    trial.schedulable[node] = False
    trial.schedulable[list(exclude)] = False
    launches = plan_launches(pods, trial, [], instance_types, strategy=strategy, ctx=ctx)
    on_new = {key: len(state) + i for i, launch in enumerate(launches) for key in launch.pods}
    if not launches:
        return None  # everything fits on the remaining nodes: a deletion, not a replacement
    rest = [(k, d) for k, d in pods if k not in on_new]
    moves = replace_pods(trial, [node], rest, strategy, ctx) if rest else {}
    if moves is None or len(on_new) + len(moves) != len(pods):
        return None
    return {**moves, **on_new}, tuple(launch.instance_type for launch in launches)


def _may_replace(node: int, pods: Sequence[tuple[str, PodDemand]], price: float,
                 instance_types: Sequence[InstanceType]) -> bool:
    """A quick bound: nodes of one type, enough for the pods' summed CPU, memory and GPUs, cost less than it.

    Several nodes may replace one (an 8-GPU node kept by five 1-GPU pods: two
    4-GPU nodes); pods of one type only is a heuristic bound, not a proof.
    """
    cpu = sum(d.cpu_milli for _, d in pods)
    mem = sum(d.memory_mib for _, d in pods)
    gpus = -(-sum(d.gpu_total_milli for _, d in pods) // MILLI)

    def count(t: InstanceType) -> int:
        by_gpu = -(-gpus // t.gpus) if t.gpus else (10**9 if gpus else 0)
        return max(1, -(-cpu // t.cpu_milli), -(-mem // t.memory_mib), by_gpu)

    return any(t.price_per_hour * count(t) < price for t in instance_types)


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:g}h" if seconds >= 3600 else f"{seconds / 60:g}min"


def replace_pods(state: NodeState, nodes: Sequence[int], pods: Sequence[tuple[str, PodDemand]],
                 strategy: Strategy, ctx: PackingContext, refuse: Sequence[int] = ()) -> dict[str, int] | None:
    """Where the packing engine puts `pods` once `nodes` are gone (None: one does not fit, or lands on `refuse`)."""
    done = _replace(state, nodes, pods, strategy, ctx, refuse)
    return None if done is None else done[0]


def _replace(state: NodeState, nodes: Sequence[int], pods: Sequence[tuple[str, PodDemand]],
             strategy: Strategy, ctx: PackingContext, refuse: Sequence[int] = ()
             ) -> tuple[dict[str, int], NodeState] | None:
    """The engine places the pods as the scheduler will once they are evicted: `refuse` rows stay open to
    it (the scheduler does not know them), and a pod it puts on one makes the move no plan."""
    trial = state.copy()
    trial.schedulable[list(nodes)] = False
    refused = set(refuse)
    moves: dict[str, int] = {}
    for key, demand in sorted(pods, key=lambda kd: (-kd[1].gpu_total_milli, -kd[1].cpu_milli, kd[0])):
        fitted = fit(trial, demand)
        if not fitted.feasible.any():
            return None
        decision = decide(trial, demand, strategy, ctx, fitted=fitted)
        if decision.node is None or decision.node in refused:
            return None
        commit(trial, demand, decision)
        moves[key] = decision.node
    return moves, trial


def _used_milli(state: NodeState, n: int) -> int:
    return int(state.gpu_count[n]) * MILLI - int(state.gpu_free_total[n])


def _explain(state: NodeState, nodes: Sequence[int], pods_on: Mapping[int, Sequence[tuple[str, PodDemand]]],
             moves: Mapping[str, int], usage: str, savings: float) -> str:
    names = ", ".join(state.names[n] for n in nodes)
    count = sum(len(pods_on.get(n, ())) for n in nodes)
    dest = sorted({state.names[d] for d in moves.values()})
    gpus = int(sum(int(state.gpu_count[n]) for n in nodes))
    pods = "1 pod" if count == 1 else f"{count} pods"
    they = "it fits" if count == 1 else "they fit"
    where = f"; {they} on {', '.join(dest)}" if dest else ""
    return f"{names}: {pods}{usage}{where}; frees {gpus} GPUs, about ${savings:.2f}/h"


def plan_disruptions(
    state: NodeState,
    pods_on: Mapping[int, Sequence[tuple[str, PodDemand]]],
    price_per_hour: Sequence[float],
    usage_percent: Mapping[int, float | None],
    rules: ConsolidationRules,
    *,
    blocked: Set[int],
    now: float,
    empty_since: Mapping[int, float],
    in_progress: int = 0,
    strategy: Strategy | None = None,
    ctx: PackingContext | None = None,
    max_trials: int = 24,
    instance_types: Sequence[InstanceType] = (),
    evictions: Mapping[str, int] | None = None,
    changed_at: Mapping[int, float] | None = None,
    started_at: Mapping[str, float] | None = None,
) -> list[Disruption]:
    """The disruptions to make now, in order (module docstring: methods and budget)."""
    budget = rules.max_disrupted_nodes - in_progress
    if budget <= 0:
        return []
    strategy = strategy or get_strategy(None)
    ctx = ctx or PackingContext(mix=TypicalMix.from_pods([d for pods in pods_on.values() for _, d in pods], 1.0))
    limit = rules.max_evictions_per_pod
    pinned = set() if limit is None or not evictions else {
        n for n, pods in pods_on.items() if any(evictions.get(key, 0) >= limit for key, _ in pods)}
    eligible = [n for n in range(len(state)) if state.schedulable[n] and n not in blocked and n not in pinned]
    out: list[Disruption] = []
    taken: set[int] = set()

    def add(nodes: Sequence[int], method: str, moves: dict[str, int], usage: str = "") -> None:
        savings = float(sum(price_per_hour[n] for n in nodes))
        out.append(Disruption(tuple(nodes), method, moves, savings,
                              _explain(state, nodes, pods_on, moves, usage, savings)))
        taken.update(nodes)

    for n in eligible:
        if len(out) >= budget:
            return out
        if not pods_on.get(n) and now - empty_since.get(n, now) >= rules.empty_grace_seconds:
            add([n], EMPTY, {}, " (empty)")

    changed = changed_at or {}
    started = started_at or {}
    old = rules.min_pod_age_seconds
    busy = [n for n in eligible if pods_on.get(n) and n not in taken
            and now - changed.get(n, -float("inf")) >= rules.settle_seconds
            and (not old or all(now - started.get(key, -float("inf")) >= old for key, _ in pods_on[n]))]
    trials = 0
    base = state.copy()
    base.schedulable[list(taken)] = False
    # an empty node is no destination: moving pods onto it keeps a node alive to free another
    empties = [n for n in range(len(state)) if not pods_on.get(n) and n not in taken]

    # a pod is never moved onto a node that costs more per GPU than the ones it leaves: it would keep the
    # dearer node alive (a 1-GPU pod beside the free GPUs of an 8-GPU node whose big pod left)
    unit = [price_per_hour[n] / max(int(state.gpu_count[n]), 1) for n in range(len(state))]

    # with a minimum pod age, moved pods go only beside pods that old (they stay: a pod that ran long tends to
    # run long), so a moved pod does not land beside pods about to leave and move again when they have
    young = [n for n in range(len(state)) if old and pods_on.get(n)
             and any(now - started.get(key, -float("inf")) < old for key, _ in pods_on[n])]

    def dearer(group: Sequence[int]) -> list[int]:
        top = max(unit[n] for n in group)
        return [n for n in range(len(state)) if unit[n] > top + 1e-9] + young + empties

    underused = [n for n in busy if (u := usage_percent.get(n)) is not None and u < rules.underused_below_percent]
    for n in sorted(underused, key=lambda n: (-price_per_hour[n], n)):
        if len(out) >= budget or trials >= max_trials:
            return out
        trials += 1
        done = _replace(base, [n], pods_on[n], strategy, ctx, dearer([n]))
        if done is not None:
            usage = f", GPU util {usage_percent[n]:.0f}% for {_hours(rules.window_seconds)}"
            add([n], UNDERUSED, done[0], usage)
            base = done[1]  # the next candidate re-places around these moves

    room = budget - len(out)
    if room <= 0:
        return out
    # least GPU used per unit of price first: what is cheapest to move for what it saves
    candidates = sorted((n for n in busy if n not in taken),
                        key=lambda n: (_used_milli(state, n) / max(price_per_hour[n], 1e-9),
                                       len(pods_on[n]), n))
    open_rows = base.schedulable.copy()
    open_rows[empties] = False  # what moves may fill: schedulable nodes with pods
    free_gpu = int(base.gpu_free_total[open_rows].sum())
    # multi-node: the largest prefix (2..room) that re-places, found by halving
    lo, hi = 2, min(room, len(candidates))
    best: tuple[list[int], dict[str, int]] | None = None
    while lo <= hi and trials < max_trials:
        mid = (lo + hi) // 2
        group = candidates[:mid]
        need = sum(_used_milli(state, n) for n in group)
        moves = None
        if need <= free_gpu - sum(int(base.gpu_free_total[n]) for n in group):
            trials += 1
            moves = replace_pods(base, group, [p for n in group for p in pods_on[n]], strategy, ctx, dearer(group))
        if moves is not None:
            best, lo = (group, moves), mid + 1
        else:
            hi = mid - 1
    if best is not None:
        add(best[0], MULTI_NODE, best[1])
        return out
    for n in candidates:
        if trials >= max_trials:
            break
        if _used_milli(state, n) <= free_gpu - int(base.gpu_free_total[n]):
            trials += 1
            moves = replace_pods(base, [n], pods_on[n], strategy, ctx, dearer([n]))
            if moves is not None:
                add([n], SINGLE_NODE, moves)
                break
        if not instance_types or trials >= max_trials or not _may_replace(n, pods_on[n], price_per_hour[n],
                                                                          instance_types):
            continue
        trials += 1
        replaced = _replacement(base, n, pods_on[n], instance_types, strategy, ctx, dearer([n]))
        if replaced is None:
            continue
        moves, launches = replaced
        savings = price_per_hour[n] - sum(t.price_per_hour for t in launches)
        if savings > 0:
            names = ", ".join(t.name for t in launches)
            out.append(Disruption((n,), SINGLE_NODE, moves, savings,
                                  _explain(state, [n], pods_on, {k: d for k, d in moves.items() if d < len(state)},
                                           f"; replaced by {names}", savings), launches))
            break
    return out



def plan_around(plan: Callable[[Set[int]], list[Disruption]], blocked: Set[int], held: Mapping[int, str],
                max_replans: int = 3) -> tuple[list[Disruption], dict[int, tuple[Disruption, str]]]:
    """`plan(blocked rows)` with no `held` row disrupted; the held rows a plan would have disrupted, with the
    disruption and the reason (module docstring)."""
    noted: dict[int, tuple[Disruption, str]] = {}
    for _ in range(max_replans + 1):
        out = plan(set(blocked) | set(noted))
        hit = {n: (d, held[n]) for d in out for n in d.nodes if n in held}
        if not hit:
            return out, noted
        noted.update(hit)
    return plan(set(blocked) | set(held)), noted
