"""What the three managed-node-group providers (kube/eks.py, gke.py, aks.py) share.

Each reads its cloud's groups once per pass (a provider is made per pass), answers which of them a
policy's pool names, and maps the groups' instances to the cluster's Nodes by providerID, the Nodes
read from the controller's watch cache. The cloud calls (read, resize, remove one instance) are each
provider's own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gpupolicy.capacity.nodegroups import NodeGroup, group_nodes
from gpupolicy.capacity.provider import CapacityNode
from gpupolicy.model import CapacitySpec


class GroupProvider:
    """The shared half of a node-group `CapacityProvider`; subclasses define `_read` and `ensure_pool`."""

    whole_gpus = True

    def __init__(self, products: Mapping[str, tuple[str, int, float]],
                 node_list: Callable[[], list[dict[str, Any]]]) -> None:
        self.products = dict(products)
        self.node_list = node_list  # the Nodes (the controller's cache: ControllerContext.cluster().nodes)
        self._groups: list[NodeGroup] | None = None  # read once per pass (a provider is made per pass)
        self.left_out: list[tuple[str, str]] = []  # (pool, why) of groups the pool names that are not resized

    def _read(self) -> list[NodeGroup]:
        raise NotImplementedError

    def groups(self, pool: str | None = None) -> list[NodeGroup]:
        if self._groups is None:
            self._groups = self._read()
        return [g for g in self._groups if pool is None or g.pool == pool]

    def pool_in_shape(self, policy: str, spec: CapacitySpec) -> bool | None:
        return True if self.groups(spec.node_pool) else None

    def why_left_out(self, pool: str) -> str:
        why = "; ".join(reason for named, reason in self.left_out if named == pool)
        return f" and can be resized: {why}" if why else ""

    def nodes(self, pool: str | None = None) -> list[CapacityNode]:
        node_of = {str((n.get("spec") or {}).get("providerID") or ""): str(n["metadata"]["name"])
                   for n in self.node_list()}
        return group_nodes(self.groups(pool), node_of, self.products)
