"""AKS agent pools as the capacity provider (`capacity.provider: aks-nodepools`), through the Azure SDK.

The cloud calls, and only these (azure-mgmt-containerservice at API version 2026-08-01, `API_VERSION`, set on
the client so that a newer SDK's default does not change the wire: 41.9.0 defaults to 2026-09-01): agentPools.list
(which pools carry the node label `gpu.kubeon.io/node-pool=<nodePool>`, their VM size, labels, count and
autoscaler), machines.list (each pool's machines and the VM behind each), agentPools.get and
createOrUpdate (one more node: the pool read fresh, its count + 1) and agentPools.deleteMachines (exactly
the drained node's machine, which lowers the count: never a random one). The long-running operations are
started, not awaited (`polling=False`): the count is the record, re-read each pass. Bounds are the node
labels `gpu.kubeon.io/max-nodes` and `gpu.kubeon.io/min-nodes` (nodegroups.label_bounds).

Credentials come from azure-identity's DefaultAzureCredential (Azure workload identity in the cluster,
managed identity or environment elsewhere); subscription, resource group and cluster from the chart
(`capacity.aks.*`). Throttling (429, honouring Retry-After) and 5xx are retried by azure-core's
RetryPolicy (exponential back-off, `RETRY_TOTAL` retries); any other refusal (403 AuthorizationFailed,
404 ResourceNotFound, a missing credential) is a `ProviderError` with ARM's code and message.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from azure.core.exceptions import AzureError, ClientAuthenticationError, HttpResponseError
from azure.identity import DefaultAzureCredential
from azure.mgmt.containerservice import ContainerServiceClient

from gpupolicy.capacity.nodegroups import GROUP_TAG, GroupInstance, NodeGroup, label_bounds
from gpupolicy.capacity.provider import AKS_NODEPOOLS, NewNode, ProviderError
from gpupolicy.model import CapacitySpec
from kube.groupprovider import GroupProvider

RETRY_TOTAL = 6  # azure-core RetryPolicy: retries after the first try, exponential back-off (or Retry-After)
API_VERSION = "2026-08-01"  # Microsoft.ContainerService: what this module was written and tested against


@contextmanager
def cloud_errors() -> Iterator[None]:
    """Refusals (after azure-core's retries) and credential failures as `ProviderError` with ARM's words."""
    try:
        yield
    except ClientAuthenticationError as exc:
        raise ProviderError("ClientAuthenticationError", str(exc.message or exc)[:500]) from exc
    except HttpResponseError as exc:
        code = (exc.error.code if exc.error else None) or f"HTTP{exc.status_code}"
        message = (exc.error.message if exc.error else None) or exc.message
        raise ProviderError(str(code), str(message)[:500]) from exc
    except AzureError as exc:
        raise ProviderError(type(exc).__name__, str(exc.message or exc)[:500]) from exc


class AksNodePools(GroupProvider):
    """`CapacityProvider` over AKS agent pools and their machines."""

    name = AKS_NODEPOOLS

    def __init__(self, products: Mapping[str, tuple[str, int, float]], *, subscription: str, resource_group: str,
                 cluster: str, node_list: Callable[[], list[dict[str, Any]]], endpoint: str | None = None,
                 retry_total: int = RETRY_TOTAL, retry_backoff: float = 0.8) -> None:
        super().__init__(products, node_list)
        self.group, self.cluster = resource_group, cluster
        extra: dict[str, Any] = {"base_url": endpoint} if endpoint else {}
        self.client = ContainerServiceClient(DefaultAzureCredential(), subscription, api_version=API_VERSION,
                                             retry_total=retry_total, retry_backoff_factor=retry_backoff, **extra)

    def _read(self) -> list[NodeGroup]:
        """The labelled agent pools with bounds and their autoscaler off, with their machines."""
        groups, self.left_out = [], []
        with cloud_errors():
            for pool in self.client.agent_pools.list(self.group, self.cluster):
                props = pool.properties
                labels = {str(k): str(v) for k, v in ((props.node_labels if props else None) or {}).items()}
                if props is None or not labels.get(GROUP_TAG):
                    continue
                bounds = label_bounds("agent pool", str(pool.name), labels, bool(props.enable_auto_scaling))
                if isinstance(bounds, str):
                    self.left_out.append((labels[GROUP_TAG], bounds))
                    continue
                groups.append(self._group(str(pool.name), str(props.vm_size or ""), int(props.count or 0),
                                          labels, bounds))
        return groups

    def _group(self, name: str, vm_size: str, count: int, labels: dict[str, str],
               bounds: tuple[int, int]) -> NodeGroup:
        """One agent pool and its machines (handle `<pool>/<machine>`) as a `NodeGroup`."""
        machines = self.client.machines.list(self.group, self.cluster, name)
        instances = tuple(GroupInstance(id=f"{name}/{m.name}", provider_id=_provider_id(m), instance_type=vm_size,
                                        state="") for m in machines)
        return NodeGroup(name=name, pool=labels[GROUP_TAG], instance_types=(vm_size,), labels=labels,
                         min_size=bounds[0], max_size=bounds[1], desired=count, instances=instances, scaler=name)

    def ensure_pool(self, policy: str, spec: CapacitySpec) -> str:
        """Agent pools are the cluster owner's: none is created or reshaped, only found (or why left out)."""
        if self.groups(spec.node_pool):
            return ""
        return (f"no agent pool of AKS cluster {self.group}/{self.cluster} carries node label "
                f"{GROUP_TAG}={spec.node_pool}" + self.why_left_out(spec.node_pool))

    def add(self, policy: str, spec: CapacitySpec, new: NewNode) -> str:
        """One more node in agent pool `new.group`: the pool read fresh, its count + 1, never past its max."""
        group = next((g for g in self.groups(spec.node_pool) if g.name == new.group), None)
        if group is None:
            raise ProviderError("AgentPoolNotFound", f"agent pool {new.group!r} of pool {spec.node_pool} not found")
        with cloud_errors():
            now = self.client.agent_pools.get(self.group, self.cluster, group.name)
            props = now.properties
            count = int((props.count if props else None) or 0)
            if props is None or count >= group.max_size:
                raise ProviderError("AtMaxSize", f"agent pool {group.name} is at its max size {group.max_size}")
            props.count = count + 1
            self.client.agent_pools.begin_create_or_update(self.group, self.cluster, group.name, now, polling=False)
        self._groups = None
        return group.name

    def remove(self, claim: str) -> None:
        """Delete exactly machine `claim` (<pool>/<machine>) from its agent pool, which lowers the count."""
        pool, _, machine = claim.partition("/")
        if not machine or machine.startswith("launching-"):  # a step of count not launched yet: no machine
            return
        with cloud_errors():
            self.client.agent_pools.begin_delete_machines(self.group, self.cluster, pool,
                                                          {"machineNames": [machine]}, polling=False)
        self._groups = None


def _provider_id(machine: Any) -> str:
    """The Node's spec.providerID of a machine: `azure://` + its VM's resource id (as the kubelet writes it)."""
    resource = str((machine.properties.resource_id if machine.properties else None) or "")
    return f"azure://{resource}" if resource else ""
