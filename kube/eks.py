"""EKS managed node groups as the capacity provider (`capacity.provider: eks-nodegroups`), through boto3.

The cloud calls, and only these: eks DescribeCluster, ListNodegroups and DescribeNodegroup
(which groups carry the pool's tag, their labels, instance type and Auto
Scaling group), autoscaling DescribeAutoScalingGroups (sizes, instances),
SetDesiredCapacity (one more node: the Cluster Autoscaler's call) and
TerminateInstanceInAutoScalingGroup with ShouldDecrementDesiredCapacity
(exactly the drained node's instance, never a random one). The group is
chosen in gpupolicy/capacity/nodegroups.py.

Credentials come from boto3's default chain (IRSA or EKS Pod Identity in the
cluster, environment or profile elsewhere); the region and cluster name from
the chart (`capacity.eks.region`, `capacity.eks.clusterName`). Throttling is
retried by botocore's own retry handler (standard mode: exponential back-off
with jitter on ThrottlingException, 429 and 5xx, `MAX_ATTEMPTS` in all);
any other refusal (AccessDenied, ResourceNotFound, a missing credential) is a
`ProviderError` carrying the cloud's code and message.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError
from kubernetes import client

from gpupolicy.capacity.nodegroups import GROUP_TAG, GroupInstance, NodeGroup
from gpupolicy.capacity.provider import EKS_NODEGROUPS, NewNode, ProviderError
from gpupolicy.model import CapacitySpec
from kube.groupprovider import GroupProvider

MAX_ATTEMPTS = 6  # botocore standard retry mode: the first try and five retries with back-off


@contextmanager
def cloud_errors() -> Iterator[None]:
    """Refusals and transport failures (after botocore's retries) as `ProviderError` with the cloud's words."""
    try:
        yield
    except ClientError as exc:
        error = exc.response.get("Error") or {}
        raise ProviderError(str(error.get("Code") or "ClientError"), str(error.get("Message") or exc)[:500]) from exc
    except BotoCoreError as exc:
        raise ProviderError(type(exc).__name__, str(exc)[:500]) from exc


class EksNodeGroups(GroupProvider):
    """`CapacityProvider` over EKS managed node groups and their Auto Scaling groups."""

    name = EKS_NODEGROUPS

    def __init__(self, api: client.ApiClient, products: Mapping[str, tuple[str, int, float]], *, cluster: str,
                 node_list: Callable[[], list[dict[str, Any]]], region: str | None = None,
                 endpoint_url: str | None = None,
                 session: boto3.session.Session | None = None, max_attempts: int = MAX_ATTEMPTS) -> None:
        super().__init__(products, node_list)
        self.api, self.cluster = api, cluster
        config = Config(retries={"mode": "standard", "total_max_attempts": max_attempts})
        session = session or boto3.session.Session(region_name=region)
        self.eks = session.client("eks", region_name=region, endpoint_url=endpoint_url, config=config)
        self.autoscaling = session.client("autoscaling", region_name=region, endpoint_url=endpoint_url,
                                          config=config)

    def _read(self) -> list[NodeGroup]:
        """The tagged node groups whose Auto Scaling group exists, with its sizes and instances."""
        with cloud_errors():
            self.eks.describe_cluster(name=self.cluster)  # a missing cluster: ResourceNotFoundException
            names = [n for page in self.eks.get_paginator("list_nodegroups").paginate(clusterName=self.cluster)
                     for n in page.get("nodegroups") or []]
            described = [self.eks.describe_nodegroup(clusterName=self.cluster, nodegroupName=n)["nodegroup"]
                         for n in names]
            tagged = {_scaler_name(d): d for d in described if (d.get("tags") or {}).get(GROUP_TAG)}
            found = self._scalers([name for name in tagged if name])
        return [_group(d, found[name]) for name, d in tagged.items() if name in found]

    def _scalers(self, names: list[str]) -> dict[str, dict[str, Any]]:
        """DescribeAutoScalingGroups for `names`, at most 50 a request (the API's limit), every page."""
        paginator = self.autoscaling.get_paginator("describe_auto_scaling_groups")
        return {g["AutoScalingGroupName"]: g for start in range(0, len(names), 50)
                for page in paginator.paginate(AutoScalingGroupNames=names[start:start + 50])
                for g in page.get("AutoScalingGroups") or []}

    def ensure_pool(self, policy: str, spec: CapacitySpec) -> str:
        """Node groups are the cluster owner's: none is created or reshaped, only found."""
        if self.groups(spec.node_pool):
            return ""
        return (f"no node group of EKS cluster {self.cluster} carries tag {GROUP_TAG}={spec.node_pool} "
                "with an Auto Scaling group")

    def add(self, policy: str, spec: CapacitySpec, new: NewNode) -> str:
        """One more node in `new.group`: its desired size + 1, read fresh, never past its max."""
        group = next((g for g in self.groups(spec.node_pool) if g.name == new.group), None)
        if group is None or not group.scaler:
            raise ProviderError("NodeGroupNotFound", f"node group {new.group!r} of pool {spec.node_pool} not found")
        with cloud_errors():
            now = self.autoscaling.describe_auto_scaling_groups(
                AutoScalingGroupNames=[group.scaler])["AutoScalingGroups"][0]
            desired, most = int(now["DesiredCapacity"]), int(now["MaxSize"])
            if desired >= most:
                raise ProviderError("AtMaxSize", f"node group {group.name} is at its max size {most}")
            self.autoscaling.set_desired_capacity(AutoScalingGroupName=group.scaler, DesiredCapacity=desired + 1,
                                                  HonorCooldown=False)
        self._groups = None
        return group.name

    def remove(self, claim: str) -> None:
        """Terminate exactly instance `claim` and lower its group's desired size (already gone: done)."""
        if "/" in claim:  # a launching entry (desired size not launched yet) is no instance to terminate
            return
        try:
            with cloud_errors():
                self.autoscaling.terminate_instance_in_auto_scaling_group(
                    InstanceId=claim, ShouldDecrementDesiredCapacity=True)
        except ProviderError as exc:
            if exc.reason != "ValidationError" or "not found" not in exc.message.lower():
                raise
        self._groups = None


def _scaler_name(described: Mapping[str, Any]) -> str:
    """The Auto Scaling group a DescribeNodegroup answer names ("" while EKS has made none)."""
    return str((((described.get("resources") or {}).get("autoScalingGroups") or [{}])[0] or {}).get("name") or "")


def _group(described: Mapping[str, Any], scaler: Mapping[str, Any]) -> NodeGroup:
    """A DescribeNodegroup answer and its Auto Scaling group (sizes and instances) as a `NodeGroup`."""
    instances = tuple(GroupInstance(id=str(i["InstanceId"]),
                                    provider_id=f"aws:///{i.get('AvailabilityZone', '')}/{i['InstanceId']}",
                                    instance_type=str(i.get("InstanceType") or ""),
                                    state=str(i.get("LifecycleState") or ""))
                      for i in scaler.get("Instances") or [])
    return NodeGroup(
        name=str(described["nodegroupName"]), pool=str((described.get("tags") or {})[GROUP_TAG]),
        instance_types=tuple(described.get("instanceTypes") or ()),
        labels={str(k): str(v) for k, v in (described.get("labels") or {}).items()},
        min_size=int(scaler["MinSize"]), max_size=int(scaler["MaxSize"]), desired=int(scaler["DesiredCapacity"]),
        instances=instances, scaler=str(scaler["AutoScalingGroupName"]))
