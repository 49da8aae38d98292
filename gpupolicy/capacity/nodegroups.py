"""Managed node groups (EKS node groups) as capacity: which group a new node goes to, and their nodes. Pure.

A capacity policy's `nodePool` names the groups the optimizer may resize:
those tagged `gpu.kubeon.io/node-pool=<nodePool>` (an explicit opt-in; an
untagged group is never touched). Each group boots one instance type (its
first, when it lists several) with its Kubernetes labels, which carry the
sharing layout (`nvidia.com/mig.config`).

The provisioner plans new nodes with the same rule as for Karpenter
(provisioning.py, on the catalog narrowed to the types some group serves
with room); each planned node is then one step of a group's desired size:
`choose` picks the group serving that type and layout with the most room
left, within `maxSize` counting what this pass already asked. Instances
without a registered Node yet, and the desired size the group has not
launched yet, are reported launching, so a burst is counted once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpupolicy.capacity.provider import CapacityNode
from gpupolicy.catalog import DISABLED_LAYOUT, MIG_CONFIG_LABEL

GROUP_TAG = "gpu.kubeon.io/node-pool"  # on a node group: the capacity policy nodePool it belongs to
# GKE and AKS node pools carry these as Kubernetes node labels (the pool's own size bounds are its autoscaler's)
MAX_NODES_LABEL = "gpu.kubeon.io/max-nodes"  # required: a pool without it is left out
MIN_NODES_LABEL = "gpu.kubeon.io/min-nodes"  # default 0
# the lifecycle states (Auto Scaling) and current actions (GCE managed instance groups) of an instance going away
GONE_STATES = ("Terminating", "Terminating:Wait", "Terminating:Proceed", "Terminated", "Detaching", "Detached",
               "DELETING", "ABANDONING")


@dataclass(frozen=True)
class GroupInstance:
    """One instance of a group's Auto Scaling group."""

    id: str
    provider_id: str      # as the kubelet writes it in node.spec.providerID (aws:///<zone>/<id>, gce://<p>/<z>/<name>)
    instance_type: str
    state: str            # the cloud's lifecycle state (Pending, InService, Terminating, ...)

    @property
    def gone(self) -> bool:
        return self.state in GONE_STATES


@dataclass(frozen=True)
class NodeGroup:
    """A managed node group as read from the cloud: its type, labels, size bounds and instances."""

    name: str
    pool: str
    instance_types: tuple[str, ...]
    labels: Mapping[str, str]
    min_size: int
    max_size: int
    desired: int
    instances: tuple[GroupInstance, ...] = ()
    scaler: str = ""      # the cloud's handle of what is resized (the Auto Scaling group's name)

    @property
    def instance_type(self) -> str:
        return self.instance_types[0] if self.instance_types else ""

    def room(self, raised: int = 0) -> int:
        """Nodes that may still be added (desired below max), `raised` already asked this pass."""
        return max(0, self.max_size - self.desired - raised)


def label_bounds(kind: str, name: str, labels: Mapping[str, str], autoscaling: bool) -> tuple[int, int] | str:
    """A node pool's (min, max) nodes from its node labels, or why the pool is left out: no or a bad
    `gpu.kubeon.io/max-nodes`, or its cloud autoscaler on (two autoscalers on one pool fight)."""
    if autoscaling:
        return f"{kind} {name} left out: its cluster autoscaler is on (two autoscalers on one pool fight)"
    bounds = []
    for label, default in ((MIN_NODES_LABEL, "0"), (MAX_NODES_LABEL, None)):
        value = labels.get(label, default)
        if value is None:
            return f"{kind} {name} left out: no node label {label} (the most nodes the optimizer may run there)"
        if not value.isdigit():
            return f"{kind} {name} left out: node label {label}={value!r} is not a whole number"
        bounds.append(int(value))
    low, high = bounds
    if low > high:
        return f"{kind} {name} left out: {MIN_NODES_LABEL}={low} is above {MAX_NODES_LABEL}={high}"
    return low, high


def serves(group: NodeGroup, instance_type: str, boot: Mapping[str, str]) -> bool:
    """A node of `group` is `instance_type` and boots with `boot` labels (no MIG layout when none is asked)."""
    if group.instance_type != instance_type or any(group.labels.get(k) != v for k, v in boot.items()):
        return False
    return MIG_CONFIG_LABEL in boot or group.labels.get(MIG_CONFIG_LABEL, DISABLED_LAYOUT) == DISABLED_LAYOUT


def choose(groups: Iterable[NodeGroup], instance_type: str, boot: Mapping[str, str],
           raised: Mapping[str, int]) -> NodeGroup | None:
    """The group one new node of `instance_type` booting `boot` goes to: the one serving it with the most room
    left after `raised` (group -> nodes asked this pass), ties by name; None when every such group is full."""
    fits = [g for g in groups if serves(g, instance_type, boot) and g.room(raised.get(g.name, 0)) > 0]
    return min(fits, key=lambda g: (-g.room(raised.get(g.name, 0)), g.name)) if fits else None


def servable(groups: Iterable[NodeGroup], boot: Mapping[str, str], raised: Mapping[str, int]) -> set[str]:
    """Instance types a new node booting `boot` may be: those of groups with room serving that layout."""
    return {g.instance_type for g in groups
            if g.room(raised.get(g.name, 0)) > 0 and serves(g, g.instance_type, boot)}


def why_full(groups: Iterable[NodeGroup], boot: Mapping[str, str]) -> str:
    """Why no group takes another node booting `boot` ("" when one has room): the full groups, or none serving."""
    serving = [g for g in groups if serves(g, g.instance_type, boot)]
    if not serving:
        layout = boot.get(MIG_CONFIG_LABEL, "")
        return f"no node group of the pool boots {f'MIG {layout}' if layout else 'without a MIG layout'}"
    full = [g for g in serving if g.room() == 0]
    if len(full) < len(serving):
        return ""
    return "; ".join(f"node group {g.name} ({g.instance_type}) at its max size {g.max_size}" for g in full)


def group_nodes(groups: Iterable[NodeGroup], node_of: Mapping[str, str],
                products: Mapping[str, tuple[str, int, float]]) -> list[CapacityNode]:
    """The groups' nodes as the capacity reconciler reads them: one per instance (handle: the instance id;
    `node_of`: provider id -> registered Node name), and one launching entry per step of desired size the
    group has not launched yet. `products`: instance type -> (GPU product, GPUs, $/h) of the catalog."""
    out: list[CapacityNode] = []
    for group in groups:
        live = [i for i in group.instances if not i.gone]
        for inst in group.instances:
            out.append(_node(group, inst.id, node_of.get(inst.provider_id), inst.instance_type, products,
                             deleting=inst.gone))
        for index in range(max(0, group.desired - len(live))):
            out.append(_node(group, f"{group.name}/launching-{index}", None, group.instance_type, products))
    return out


def _node(group: NodeGroup, handle: str, node: str | None, instance_type: str,
          products: Mapping[str, tuple[str, int, float]], deleting: bool = False) -> CapacityNode:
    product, gpus, price = products.get(instance_type, (None, 0, 0.0))
    return CapacityNode(claim=handle, node=node, pool=group.pool, instance_type=instance_type, gpus=gpus,
                        product=product, price_per_hour=price, labels=dict(group.labels), deleting=deleting,
                        removable=group.desired > group.min_size)
