"""GKE node pools as the capacity provider (`capacity.provider: gke-nodepools`), through Google's Cloud SDKs.

The cloud calls, and only these (REST transport): container v1 nodePools.list (which pools carry the node
label `gpu.kubeon.io/node-pool=<nodePool>`, their machine type, labels, autoscaler and managed instance
group) and nodePools.setSize (one more node); compute v1 instanceGroupManagers.get (the group's target
size, read fresh before each resize), listManagedInstances (its instances) and deleteInstances (exactly
the drained node's instance, which lowers the target size: never a random one). The pool's bounds are
its node labels `gpu.kubeon.io/max-nodes` and `gpu.kubeon.io/min-nodes` (nodegroups.label_bounds); the
pool a new node goes to is chosen in gpupolicy/capacity/nodegroups.py.

Credentials come from google-auth's default chain (GKE workload identity in the cluster,
GOOGLE_APPLICATION_CREDENTIALS or gcloud's elsewhere); project, location and cluster from the chart
(`capacity.gke.*`). Throttling (429) and 503 are retried by google-api-core's `Retry` (exponential
back-off with jitter, `RETRY`); any other refusal (403 PERMISSION_DENIED, 404 NOT_FOUND, a missing
credential) is a `ProviderError` with the cloud's message. A pool in several zones (several managed
instance groups: setSize counts nodes per zone) is left out, with the reason in the policy's condition.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from google.api_core import exceptions as gexc
from google.api_core import retry as gretry
from google.api_core.client_options import ClientOptions
from google.auth import exceptions as auth_exc
from google.cloud import compute_v1, container_v1

from gpupolicy.capacity.nodegroups import GROUP_TAG, GroupInstance, NodeGroup, label_bounds
from gpupolicy.capacity.provider import GKE_NODEPOOLS, NewNode, ProviderError
from gpupolicy.model import CapacitySpec
from kube.groupprovider import GroupProvider

# 429 and 503: back-off from 1 s doubling to 30 s, with jitter, for at most 2 minutes (google-api-core's Retry)
RETRY = gretry.Retry(predicate=gretry.if_exception_type(gexc.TooManyRequests, gexc.ServiceUnavailable),
                     initial=1.0, maximum=30.0, multiplier=2.0, timeout=120.0)


@contextmanager
def cloud_errors() -> Iterator[None]:
    """Refusals, retries run out and credential failures as `ProviderError` with the cloud's words."""
    try:
        yield
    except gexc.RetryError as exc:
        if not isinstance(exc.cause, gexc.GoogleAPICallError):
            raise ProviderError("RetryError", str(exc)[:500]) from exc
        reason, message = _words(exc.cause)
        raise ProviderError(reason, f"retried until the deadline: {message}"[:500]) from exc
    except gexc.GoogleAPICallError as exc:
        raise ProviderError(*_words(exc)) from exc
    except auth_exc.GoogleAuthError as exc:
        raise ProviderError(type(exc).__name__, str(exc)[:500]) from exc


def _words(exc: gexc.GoogleAPICallError) -> tuple[str, str]:
    """The error body's canonical status (PERMISSION_DENIED, NOT_FOUND, RESOURCE_EXHAUSTED) and message;
    the exception's class and text when the answer had no JSON error body."""
    try:
        body = exc.response.json()["error"] if exc.response is not None else {}
    except (ValueError, KeyError, TypeError, AttributeError):
        body = {}
    reason = str(body.get("status") or type(exc).__name__)
    return reason, str(body.get("message") or exc.message)[:500]


class GkeNodePools(GroupProvider):
    """`CapacityProvider` over GKE node pools and their managed instance groups."""

    name = GKE_NODEPOOLS

    def __init__(self, products: Mapping[str, tuple[str, int, float]], *, project: str, location: str, cluster: str,
                 node_list: Callable[[], list[dict[str, Any]]], endpoint: str | None = None,
                 retry: gretry.Retry = RETRY) -> None:
        super().__init__(products, node_list)
        self.retry = retry
        self.parent = f"projects/{project}/locations/{location}/clusters/{cluster}"
        options = ClientOptions(api_endpoint=endpoint) if endpoint else None
        self.container = container_v1.ClusterManagerClient(transport="rest", client_options=options)
        self.compute = compute_v1.InstanceGroupManagersClient(transport="rest", client_options=options)

    def _read(self) -> list[NodeGroup]:
        """The labelled node pools with bounds, their autoscaler off and one managed instance group."""
        groups, self.left_out = [], []
        with cloud_errors():
            pools = self.container.list_node_pools(parent=self.parent, retry=self.retry).node_pools
            for pool in pools:
                labels = dict(pool.config.labels)
                if not labels.get(GROUP_TAG):
                    continue
                bounds = label_bounds("node pool", pool.name, labels, bool(pool.autoscaling.enabled))
                if isinstance(bounds, tuple) and len(pool.instance_group_urls) != 1:
                    bounds = (f"node pool {pool.name} left out: {len(pool.instance_group_urls)} managed instance "
                              "groups (a pool in one zone is resized node by node)")
                if isinstance(bounds, str):
                    self.left_out.append((labels[GROUP_TAG], bounds))
                    continue
                groups.append(self._group(pool, labels, bounds))
        return groups

    def _group(self, pool: Any, labels: dict[str, str], bounds: tuple[int, int]) -> NodeGroup:
        """One node pool, its managed instance group's target size and instances, as a `NodeGroup`."""
        url = str(pool.instance_group_urls[0])
        project, zone, manager = _group_path(url)
        target = self.compute.get(project=project, zone=zone, instance_group_manager=manager, retry=self.retry)
        managed = self.compute.list_managed_instances(project=project, zone=zone, instance_group_manager=manager,
                                                      retry=self.retry)
        machine = str(pool.config.machine_type)
        instances = tuple(GroupInstance(id=str(m.instance), provider_id=_provider_id(str(m.instance)),
                                        instance_type=machine, state=str(m.current_action or ""))
                          for m in managed)
        return NodeGroup(name=str(pool.name), pool=labels[GROUP_TAG], instance_types=(machine,), labels=labels,
                         min_size=bounds[0], max_size=bounds[1], desired=int(target.target_size),
                         instances=instances, scaler=url)

    def ensure_pool(self, policy: str, spec: CapacitySpec) -> str:
        """Node pools are the cluster owner's: none is created or reshaped, only found (or why left out)."""
        if self.groups(spec.node_pool):
            return ""
        return (f"no node pool of GKE cluster {self.parent} carries node label {GROUP_TAG}={spec.node_pool}"
                + self.why_left_out(spec.node_pool))

    def add(self, policy: str, spec: CapacitySpec, new: NewNode) -> str:
        """One more node in pool `new.group`: setSize to its group's target size + 1, read fresh, within max."""
        group = next((g for g in self.groups(spec.node_pool) if g.name == new.group), None)
        if group is None:
            raise ProviderError("NodePoolNotFound", f"node pool {new.group!r} of pool {spec.node_pool} not found")
        project, zone, manager = _group_path(group.scaler)
        with cloud_errors():
            target = int(self.compute.get(project=project, zone=zone, instance_group_manager=manager,
                                          retry=self.retry).target_size)
            if target >= group.max_size:
                raise ProviderError("AtMaxSize", f"node pool {group.name} is at its max size {group.max_size}")
            self.container.set_node_pool_size(request={"name": f"{self.parent}/nodePools/{group.name}",
                                                       "node_count": target + 1}, retry=self.retry)
        self._groups = None
        return group.name

    def remove(self, claim: str) -> None:
        """Delete exactly instance `claim` (its URL) from its managed instance group, which lowers the target
        size (already gone: done)."""
        if "/launching-" in claim:  # a step of target size not launched yet is no instance to delete
            return
        group = next((g for g in self.groups() if any(i.id == claim for i in g.instances)), None)
        if group is None:
            return
        project, zone, manager = _group_path(group.scaler)
        request = compute_v1.InstanceGroupManagersDeleteInstancesRequest(instances=[claim])
        with cloud_errors():
            self.compute.delete_instances_unary(
                project=project, zone=zone, instance_group_manager=manager, retry=self.retry,
                instance_group_managers_delete_instances_request_resource=request)
        self._groups = None


def _group_path(url: str) -> tuple[str, str, str]:
    """(project, zone, name) of a managed instance group URL (.../projects/<p>/zones/<z>/instanceGroupManagers/<n>)."""
    parts = url.rstrip("/").split("/")
    at = parts.index("projects")
    return parts[at + 1], parts[at + 3], parts[-1]


def _provider_id(instance_url: str) -> str:
    """The Node's spec.providerID of an instance URL: gce://<project>/<zone>/<instance>."""
    parts = instance_url.rstrip("/").split("/")
    at = parts.index("projects")
    return f"gce://{parts[at + 1]}/{parts[at + 3]}/{parts[-1]}"
