"""The capacity provider interface: how GPU nodes are added and given back. Pure (a Protocol and plain data).

The capacity reconciler (controller/capacity/) decides with the pure
planners (provisioning.py, disruption/) and acts only through a
`CapacityProvider`: add capacity for pending pods, remove a node, and report
the nodes it manages with their cost. Karpenter (karpenter.sh/v1, I/O in
kube/karpenter.py) is the first implementation; EKS managed node groups
(`eks-nodegroups`, I/O in kube/eks.py, choice of group in nodegroups.py) the
second, GKE node pools (`gke-nodepools`, kube/gke.py) and AKS agent pools
(`aks-nodepools`, kube/aks.py) with the same choices. The install's
`capacity.provider` names one (`IMPLEMENTED`; gpupolicy/modes.py `handling`
reports any other as `NotImplemented`).
A cloud that refuses a call (permissions, a missing cluster or group) raises
`ProviderError` with its own code and message: the policy's status shows it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from gpupolicy.model import CapacitySpec
from gpupolicy.modes import IMPLEMENTED_CAPACITY_PROVIDERS

if TYPE_CHECKING:
    from gpupolicy.capacity.nodegroups import NodeGroup

KARPENTER = "karpenter"
EKS_NODEGROUPS = "eks-nodegroups"
GKE_NODEPOOLS = "gke-nodepools"
AKS_NODEPOOLS = "aks-nodepools"
IMPLEMENTED: frozenset[str] = IMPLEMENTED_CAPACITY_PROVIDERS


@dataclass(frozen=True)
class CapacityNode:
    """A GPU node the provider manages (or is launching): what it is, what it costs, where it stands."""

    claim: str                 # the provider's handle (Karpenter: the NodeClaim name)
    node: str | None           # the registered Node's name; None while launching
    pool: str                  # the NodePool (or node group) it belongs to
    instance_type: str
    gpus: int
    product: str | None
    price_per_hour: float
    labels: Mapping[str, str] = field(default_factory=dict)
    deleting: bool = False     # removal requested (Karpenter: the claim has a deletionTimestamp)
    launched_for: tuple[str, ...] = ()  # the pending pods (namespace/name) it was added for, if by us
    removable: bool = True     # False: removing it would take its node group below its min size
    # what its node offers, once the provider says (Karpenter: the NodeClaim's status.allocatable, set at
    # launch); empty: not said yet (gpupolicy/capacity/allocatable.py)
    allocatable: Mapping[str, str] = field(default_factory=dict)

    @property
    def launching(self) -> bool:
        return self.node is None and not self.deleting


@dataclass(frozen=True)
class NewNode:
    """One node to add: its name (stable: a repeated pass asks again, never twice), an instance type,
    the labels it boots with (the sharing layout), why."""

    name: str
    instance_type: str
    labels: Mapping[str, str]
    reason: str
    pods: Sequence[str] = ()   # namespace/name of the pending pods it is for
    group: str = ""            # node groups: the group whose desired size grows (nodegroups.choose)


class ProviderError(Exception):
    """The cloud refused a call: `reason` is its error code (AccessDeniedException, ResourceNotFoundException,
    ...), `message` its own words; the policy's status shows both, and nothing else is done in that pass."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason, self.message = reason, message


class CapacityProvider(Protocol):
    """What the capacity reconciler needs from the cloud machinery (kube/karpenter.py: Karpenter)."""

    name: str
    whole_gpus: bool  # provisions whole-GPU pods too (node groups); False: the provider does it (Karpenter)

    def groups(self, pool: str | None = None) -> list[NodeGroup] | None:
        """The node groups the provider resizes (the pool's; every pool's with None); None: it has none."""
        ...

    def pool_in_shape(self, policy: str, spec: CapacitySpec) -> bool | None:
        """Whether the pool has the declared shape: True, False (differs), None (missing)."""
        ...

    def ensure_pool(self, policy: str, spec: CapacitySpec) -> str:
        """Keep the pool in the declared shape (patch only the fields we own); returns "" or why not."""
        ...

    def nodes(self, pool: str | None = None) -> list[CapacityNode]:
        """The pool's nodes (every pool's with None), launching ones included, with their cost."""
        ...

    def add(self, policy: str, spec: CapacitySpec, new: NewNode) -> str:
        """Ask for one node; returns the provider's handle (the NodeClaim name)."""
        ...

    def remove(self, claim: str) -> None:
        """Give a node back by its handle (it must be empty of pods that matter: drain first)."""
        ...
