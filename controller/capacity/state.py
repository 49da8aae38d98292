"""What one capacity pass works with: the objects it read, the provider, and the mode gate for its proposals.

Shared by the steps of the capacity pass (pool, provision, consolidation,
drain, replacement, eviction_counts), so each reads the cluster once per pass
and every step decides a proposal's state the same way (gpupolicy/proposals.py).
The PodDisruptionBudgets are listed once too, by the first step about to start a
drain (`Pass.budgets`; gpupolicy/capacity/budgets.py says which one blocks).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from controller.context import ControllerContext
from controller.crashpoints import Checkpoint
from gpupolicy.capacity.budgets import Budget, blocking_budget, read_budgets
from gpupolicy.capacity.drain import drainable
from gpupolicy.capacity.failed_launches import FailedLaunches
from gpupolicy.capacity.instances import InstanceType
from gpupolicy.capacity.nodegroups import NodeGroup, choose, servable
from gpupolicy.capacity.provider import CapacityNode, CapacityProvider, NewNode
from gpupolicy.matching import selector_matches
from gpupolicy.model import API_VERSION, KIND, CapacitySpec, GpuPolicy, Mode
from gpupolicy.model import ProposalState as State
from gpupolicy.packing.kubestate import StateMemo
from gpupolicy.proposals import StateDecision, decide_state, make_proposal
from kube.calls import API_ERRORS, one_line
from kube.events import ObjectRef

log = logging.getLogger(__name__)

SOURCE = "capacity"
HOURS_PER_MONTH = 730.0


def timestamp(text: Any) -> float | None:
    """An RFC 3339 timestamp as epoch seconds; None when absent or unreadable."""
    return _epoch(text) if isinstance(text, str) else None


@functools.lru_cache(maxsize=16_384)
def _epoch(text: str) -> float | None:
    """Memoised: a pass reads a stamp of every bound pod, and pods made together share a second's text
    (5,000 nodes / 50,000 pods: 0.4 s of a pass, `python bench/controller_pass.py`)."""
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """The object's metadata, read-only (the cache's own; a pass reads it for every pod, so not copied)."""
    found = obj.get("metadata")
    return found if type(found) is dict or isinstance(found, Mapping) else {}  # dicts: no ABC check


def annotations_of(obj: Mapping[str, Any]) -> Mapping[str, str]:
    found = meta(obj).get("annotations")
    return found if type(found) is dict or isinstance(found, Mapping) else {}


def pod_key(pod: Mapping[str, Any]) -> str:
    m = meta(pod)
    return f"{m.get('namespace', 'default')}/{m.get('name', '')}"


def live(pod: Mapping[str, Any]) -> bool:
    return not meta(pod).get("deletionTimestamp") and (pod.get("status") or {}).get("phase") not in (
        "Succeeded", "Failed")


def is_gpu_node(node: Mapping[str, Any]) -> bool:
    labels = meta(node).get("labels") or {}
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    return "nvidia.com/gpu.product" in labels or any(str(k).startswith("nvidia.com/") for k in allocatable)


def covers(policy: GpuPolicy, pod: Mapping[str, Any]) -> bool:
    """The policy's selector covers the pod (namespace labels: the automatic name label only)."""
    m = meta(pod)
    namespace = str(m.get("namespace") or "default")
    return selector_matches(policy.spec.selector, namespace, {"kubernetes.io/metadata.name": namespace},
                            dict(m.get("labels") or {}))


@dataclass
class Seen:
    """What one pass read."""

    nodes: list[dict[str, Any]]
    pods: list[dict[str, Any]]
    claims: list[CapacityNode]
    by_node: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    groups: list[NodeGroup] | None = None  # the provider's node groups (None: it has none, Karpenter)
    slices: list[dict[str, Any]] = field(default_factory=list)  # DRA ResourceSlices: devices per node

    def __post_init__(self) -> None:
        for pod in self.pods:
            name = (pod.get("spec") or {}).get("nodeName")
            if name:
                self.by_node.setdefault(str(name), []).append(pod)

    def pool_claims(self, pool: str) -> list[CapacityNode]:
        return [c for c in self.claims if c.pool == pool]


@dataclass
class Pass:
    """One pass: the context, the provider over it, what was read, the catalog and the crash hook."""

    ctx: ControllerContext
    provider: CapacityProvider
    seen: Seen
    instances: list[InstanceType]
    checkpoint: Checkpoint
    # the launches seen failing (gpupolicy/capacity/failed_launches.py): what this pass adds and removes is
    # noted there, and new launches leave out the types a launch of which failed lately
    failed: FailedLaunches = field(default_factory=FailedLaunches)
    unavailable: Mapping[str, float] = field(default_factory=dict)
    _budgets: tuple[list[Budget], str] | None = field(default=None, init=False, repr=False)
    raised: dict[str, int] = field(default_factory=dict)  # node group -> nodes asked for in this pass
    # the packing state of the GPU nodes, kept between passes by the reconciler (gpupolicy/packing/kubestate.py)
    states: StateMemo = field(default_factory=StateMemo)

    @property
    def by_type(self) -> dict[str, InstanceType]:
        return {t.name: t for t in self.instances}

    def add(self, policy: str, spec: CapacitySpec, new: NewNode) -> None:
        """Ask the provider for a node, noted so a launch that fails before the next pass is seen failing
        (a node group's launch is its desired size, read back every pass: counted in `raised` meanwhile)."""
        self.provider.add(policy, spec, new)
        if new.group:
            self.raised[new.group] = self.raised.get(new.group, 0) + 1
        else:
            self.failed.launched(new.name, new.instance_type)

    def group_for(self, pool: str, instance_type: str, boot: Mapping[str, str],
                  raised: Mapping[str, int] | None = None) -> NodeGroup | None:
        """Node groups: the group a new node of `instance_type` booting `boot` goes to, `raised` (default: what
        this pass asked for) counted; None when every group serving it is full."""
        return choose(self.group_sizes(pool), instance_type, boot, self.raised if raised is None else raised)

    def group_sizes(self, pool: str, raised: Mapping[str, int] | None = None) -> list[NodeGroup]:
        """The pool's node groups, each desired size grown by what `raised` counts for it."""
        more = raised or {}
        return [replace(g, desired=g.desired + more.get(g.name, 0)) for g in self.seen.groups or [] if g.pool == pool]

    def remove(self, claim: str) -> None:
        """Delete a claim through the provider, noted as the controller's own removal (not a failed launch)."""
        self.provider.remove(claim)
        self.failed.forget(claim)

    def launchable(self, allowed: Iterable[str], pool: str = "", boot: Mapping[str, str] | None = None,
                   raised: Mapping[str, int] | None = None) -> list[InstanceType]:
        """The catalog's GPU instance types among `allowed` that new nodes may be: none a launch of which
        failed lately; with node groups, only those a group of `pool` booting `boot` serves with room
        (`raised`, default what this pass asked for, counted)."""
        names = set(allowed)
        if self.seen.groups is not None:
            names &= servable(self.group_sizes(pool), boot or {}, self.raised if raised is None else raised)
        return [t for t in self.instances if t.name in names and t.gpus > 0 and t.name not in self.unavailable]

    def avoided(self) -> str:
        """The reason's note on the types left out (`launchable`), "" when none is."""
        if not self.unavailable:
            return ""
        now = self.ctx.clock.now()
        return "; not " + ", ".join(f"{kind} (a launch failed {max(0.0, now - at):.0f}s ago)"
                                    for kind, at in sorted(self.unavailable.items()))

    def decide(self, policy: GpuPolicy, mode: Mode, target: str, action: str) -> StateDecision:
        """The state of proposal (target, action) in `mode`: approved targets, dismissals kept."""
        base = make_proposal(policy.name, target, action, "", 0.0)
        before = self.ctx.policies.previous(policy.name).get(base.id)
        dismissed = before.state if before is not None and before.state is State.DISMISSED else None
        return decide_state(mode, target in policy.spec.approvals, dismissed)

    def budgets(self) -> tuple[list[Budget], str]:
        """The cluster's PodDisruptionBudgets, listed once per pass by the first step that asks (a pass with
        no drain to start lists none); ([], why) when the list failed."""
        if self._budgets is None:
            try:
                self._budgets = read_budgets(self.ctx.cluster().budgets()), ""
            except API_ERRORS as exc:
                log.warning("capacity: PodDisruptionBudgets unavailable: %s", one_line(exc))
                self._budgets = [], one_line(exc)[:300]
        return self._budgets

    def held_by_budget(self, pods: Iterable[Mapping[str, Any]]) -> str | None:
        """Why a drain of a node holding `pods` must not start now (gpupolicy/capacity/budgets.py): a
        PodDisruptionBudget allowing no disruption, or the budgets unreadable; None when none stands in the way."""
        budgets, error = self.budgets()
        if not budgets and not error:  # most clusters, most passes: nothing to read of the pods
            return None
        movable = [pod for pod in pods if drainable(pod)]
        if not movable:
            return None
        if error:
            return f"PodDisruptionBudgets could not be listed ({error}); no drain starts"
        return blocking_budget(movable, budgets)

    def warn_undone(self, node: str, policy: GpuPolicy | None, message: str) -> None:
        """A Warning Event `CapacityDrainUndone` on the node and on the policy."""
        refs = [ObjectRef("v1", "Node", node)]
        if policy is not None:
            refs.append(ObjectRef(API_VERSION, KIND, policy.name, None, policy.metadata.uid))
        for ref in refs:
            self.ctx.recorder.warning(ref, "CapacityDrainUndone", message)
