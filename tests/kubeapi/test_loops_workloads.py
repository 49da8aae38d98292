"""Workload loop and kubelet stand-in: Deployments, ReplicaSets, StatefulSets follow spec.replicas.

Real: the test API server (over HTTP with the `kubernetes` client), the
scale subresource, ownerReferences, the workload controllers, the scheduler
and kubelet stand-ins that bind pods and make them Ready. Faked: no
containers run (Ready is declared by the kubelet stand-in); the loops are
stepped by the test (`settle()`), not run in threads, so results are exact.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.kubeapi.cluster import Cluster
from tests.cluster.objects import make_deployment, make_node, make_statefulset
from tests.kubeapi.scheduler import MERGE_PATCH, read_items
from tests.kubeapi.workloads import HASH_LABEL, pod_template_hash


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    with Cluster(nodes=[make_node("gpu-a", gpus=8)], background=False, karpenter=False) as running:
        yield running


def deployment_status(cluster: Cluster, name: str) -> dict:
    return cluster.apps.read_namespaced_deployment(name, "default").to_dict()["status"]


def scale(cluster: Cluster, kind: str, name: str, replicas: int) -> None:
    patch = getattr(cluster.apps, f"patch_namespaced_{kind}_scale")
    patch(name, "default", {"spec": {"replicas": replicas}}, _content_type=MERGE_PATCH, _preload_content=False)


def replicasets(cluster: Cluster) -> list[dict]:
    return read_items(cluster.apps.list_namespaced_replica_set("default", _preload_content=False))


def test_deployment_owns_pods_through_a_hashed_replicaset(cluster: Cluster) -> None:
    deploy = make_deployment("llm", replicas=2, gpus=1)
    created = cluster.create(deploy)
    cluster.settle()
    template_hash = pod_template_hash(deploy["spec"]["template"])
    [rs] = replicasets(cluster)
    assert rs["metadata"]["name"] == f"llm-{template_hash}"
    assert rs["metadata"]["labels"][HASH_LABEL] == template_hash
    assert rs["spec"]["selector"]["matchLabels"] == {"app": "llm", HASH_LABEL: template_hash}
    assert rs["metadata"]["ownerReferences"][0] == {
        "apiVersion": "apps/v1", "kind": "Deployment", "name": "llm", "uid": created["metadata"]["uid"],
        "controller": True, "blockOwnerDeletion": True}
    pods = cluster.pods("default", "app=llm")
    assert len(pods) == 2
    for pod in pods:
        assert pod["metadata"]["name"].startswith(f"llm-{template_hash}-")
        assert pod["metadata"]["labels"][HASH_LABEL] == template_hash
        assert pod["metadata"]["ownerReferences"][0]["uid"] == rs["metadata"]["uid"]
        assert pod["spec"]["nodeName"] == "gpu-a"
        assert pod["status"]["phase"] == "Running"
    status = deployment_status(cluster, "llm")
    assert (status["replicas"], status["ready_replicas"], status["available_replicas"]) == (2, 2, 2)


def test_scale_subresource_to_zero_and_back(cluster: Cluster) -> None:
    cluster.create(make_deployment("llm", replicas=2, gpus=1))
    cluster.settle()
    scale(cluster, "deployment", "llm", 0)
    cluster.settle()
    assert cluster.pods("default", "app=llm") == []
    status = deployment_status(cluster, "llm")
    assert (status["replicas"] or 0, status["ready_replicas"] or 0) == (0, 0)
    scale(cluster, "deployment", "llm", 3)
    cluster.settle()
    assert len(cluster.pods("default", "app=llm", bound=True, ready=True)) == 3
    assert deployment_status(cluster, "llm")["ready_replicas"] == 3
    assert len(replicasets(cluster)) == 1  # same template, same ReplicaSet


def test_scale_down_removes_surplus_and_unschedulable_pods_first(cluster: Cluster) -> None:
    cluster.create(make_deployment("llm", replicas=10, gpus=1))  # 8 GPUs: two stay Pending
    cluster.settle()
    assert len(cluster.pods("default", "app=llm", bound=False)) == 2
    scale(cluster, "deployment", "llm", 8)
    cluster.settle()
    pods = cluster.pods("default", "app=llm")
    assert len(pods) == 8 and all(p["spec"].get("nodeName") for p in pods)


def test_template_change_rolls_to_a_new_replicaset(cluster: Cluster) -> None:
    cluster.create(make_deployment("llm", replicas=2, gpus=1))
    cluster.settle()
    cluster.apps.patch_namespaced_deployment(
        "llm", "default", {"spec": {"template": {"metadata": {"annotations": {"rev": "2"}}}}},
        _content_type=MERGE_PATCH, _preload_content=False)
    cluster.settle()
    by_replicas = {rs["metadata"]["name"]: rs["spec"]["replicas"] for rs in replicasets(cluster)}
    assert sorted(by_replicas.values()) == [0, 2]
    pods = cluster.pods("default", "app=llm")
    assert len(pods) == 2 and all(p["metadata"]["annotations"] == {"rev": "2"} for p in pods)


def test_deleting_a_deployment_collects_its_replicaset_and_pods(cluster: Cluster) -> None:
    cluster.create(make_deployment("llm", replicas=2, gpus=1))
    cluster.settle()
    cluster.apps.delete_namespaced_deployment("llm", "default", _preload_content=False)
    cluster.settle()
    assert replicasets(cluster) == []
    assert cluster.pods("default", "app=llm") == []


def test_statefulset_creates_ordinals_in_order_and_removes_the_highest(cluster: Cluster) -> None:
    cluster.create(make_statefulset("db", replicas=3, gpus=1))
    cluster.step()  # OrderedReady: one ordinal per pass until the lower ones are Ready
    assert [p["metadata"]["name"] for p in cluster.pods("default", "app=db")] == ["db-0"]
    cluster.settle()
    pods = cluster.pods("default", "app=db", ready=True)
    assert [p["metadata"]["name"] for p in pods] == ["db-0", "db-1", "db-2"]
    assert pods[2]["metadata"]["labels"]["statefulset.kubernetes.io/pod-name"] == "db-2"
    assert pods[2]["metadata"]["ownerReferences"][0]["kind"] == "StatefulSet"
    scale(cluster, "stateful_set", "db", 1)
    cluster.settle()
    assert [p["metadata"]["name"] for p in cluster.pods("default", "app=db")] == ["db-0"]
    status = cluster.apps.read_namespaced_stateful_set("db", "default").to_dict()["status"]
    assert (status["replicas"], status["ready_replicas"]) == (1, 1)
    scale(cluster, "stateful_set", "db", 0)
    cluster.settle()
    assert cluster.pods("default", "app=db") == []


def test_parallel_statefulset_creates_all_at_once(cluster: Cluster) -> None:
    sts = make_statefulset("db", replicas=3)
    sts["spec"]["podManagementPolicy"] = "Parallel"
    cluster.create(sts)
    cluster.workloads.reconcile_once()
    assert [p["metadata"]["name"] for p in cluster.pods("default", "app=db")] == ["db-0", "db-1", "db-2"]
