"""Karpenter stand-in: a NodeClaim becomes a GPU Node; deleting it drains through the Eviction API.

Real: the test API server with the upstream karpenter.sh/v1 NodeClaim and
NodePool CRDs (schema-validated), finalizers and deletionTimestamp, the
Eviction API with its PodDisruptionBudget arithmetic, and the scheduler,
workload and kubelet loops that reschedule evicted pods. Faked: the cloud
(an instance-type table), and time for the launch delay (a fake clock), so
every step is driven explicitly.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes.client.rest import ApiException

from tests.kubeapi.cluster import Cluster
from tests.cluster.objects import make_deployment, make_node, make_nodeclaim, make_nodepool, make_pdb
from tests.kubeapi.karpenter import FINALIZER, GROUP, NODECLAIMS, VERSION
from tests.kubeapi.scheduler import read_items


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    with Cluster(background=False) as running:
        running.clock = FakeClock()  # type: ignore[attr-defined]
        assert running.karpenter is not None
        running.karpenter.clock = running.clock  # type: ignore[attr-defined]
        running.karpenter.launch_delay = 5.0
        running.karpenter.evict_retry = 0.0
        yield running


def claims(cluster: Cluster) -> dict[str, dict]:
    items = read_items(cluster.custom.list_cluster_custom_object(GROUP, VERSION, NODECLAIMS, _preload_content=False))
    return {c["metadata"]["name"]: c for c in items}


def nodes(cluster: Cluster) -> dict[str, dict]:
    return {n["metadata"]["name"]: n for n in read_items(cluster.core.list_node(_preload_content=False))}


def test_claim_becomes_a_gpu_node_after_the_launch_delay(cluster: Cluster) -> None:
    cluster.create(make_nodepool("gpu", instance_types=["p4d.24xlarge"]))
    cluster.create(make_nodeclaim("gpu-x1", "p4d.24xlarge", nodepool="gpu"))
    cluster.karpenter.reconcile_once()  # type: ignore[union-attr]
    assert claims(cluster)["gpu-x1"]["metadata"]["finalizers"] == [FINALIZER]
    assert "gpu-x1" not in nodes(cluster)
    cluster.clock.now += 5  # type: ignore[attr-defined]
    cluster.karpenter.reconcile_once()  # type: ignore[union-attr]
    node = nodes(cluster)["gpu-x1"]
    labels = node["metadata"]["labels"]
    assert labels["karpenter.sh/nodepool"] == "gpu"
    assert labels["node.kubernetes.io/instance-type"] == "p4d.24xlarge"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB"
    assert labels["nvidia.com/gpu.count"] == "8"
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    status = claims(cluster)["gpu-x1"]["status"]
    assert status["nodeName"] == "gpu-x1"
    assert status["providerID"] == node["spec"]["providerID"]
    assert status["allocatable"]["nvidia.com/gpu"] == "8"
    assert {c["type"]: c["status"] for c in status["conditions"]} == {
        "Launched": "True", "Registered": "True", "Initialized": "True", "Ready": "True"}


def test_unknown_instance_type_is_reported_not_launched(cluster: Cluster) -> None:
    cluster.create(make_nodeclaim("odd", "x9.mega"))
    cluster.karpenter.reconcile_once()  # type: ignore[union-attr]
    cluster.clock.now += 10  # type: ignore[attr-defined]
    cluster.karpenter.reconcile_once()  # type: ignore[union-attr]
    [condition] = claims(cluster)["odd"]["status"]["conditions"]
    assert (condition["type"], condition["status"], condition["reason"]) == ("Launched", "False",
                                                                              "InstanceTypeNotFound")
    assert "odd" not in nodes(cluster)


def test_deleting_a_claim_drains_its_node_honouring_the_pdb(cluster: Cluster) -> None:
    cluster.create(make_nodeclaim("gpu-x1", "p4d.24xlarge"))
    cluster.settle()
    cluster.clock.now += 5  # type: ignore[attr-defined]
    cluster.settle()
    cluster.create(make_deployment("llm", replicas=2, gpus=1))
    cluster.create(make_pdb("llm", match_labels={"app": "llm"}, min_available=1))
    cluster.settle()
    assert {p["spec"]["nodeName"] for p in cluster.pods("default", "app=llm", ready=True)} == {"gpu-x1"}
    cluster.create(make_node("spare", gpus=8))

    cluster.custom.delete_cluster_custom_object(GROUP, VERSION, NODECLAIMS, "gpu-x1", _preload_content=False)
    cluster.karpenter.reconcile_once()  # type: ignore[union-attr]
    node = nodes(cluster)["gpu-x1"]
    assert {"key": "karpenter.sh/disrupted", "effect": "NoSchedule"} in node["spec"]["taints"]
    statuses = [status for _, _, status in cluster.karpenter.evictions]  # type: ignore[union-attr]
    assert statuses == [201, 429]  # the PDB lets one of two Ready pods go, not both
    assert "gpu-x1" in claims(cluster)  # held by the finalizer while pods remain

    cluster.settle()
    assert "gpu-x1" not in nodes(cluster)
    assert "gpu-x1" not in claims(cluster)
    pods = cluster.pods("default", "app=llm", ready=True)
    assert [p["spec"]["nodeName"] for p in pods] == ["spare", "spare"]
    assert cluster.karpenter.evictions[-1][2] == 201  # type: ignore[union-attr]


def test_nodeclaim_spec_is_validated_by_its_crd(cluster: Cluster) -> None:
    claim = make_nodeclaim("bad")
    del claim["spec"]["nodeClassRef"]
    with pytest.raises(ApiException) as raised:
        cluster.create(claim)
    assert raised.value.status == 422
