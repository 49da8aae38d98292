"""End to end: GpuPolicies and GPU workloads through real kubectl, kube-apiserver and the real webhook.

Real: kubectl 1.35 (`create -f`, `get`), kube-apiserver v1.35 calling the `kubeon-gpu webhook`
process over HTTPS through the chart's Mutating/ValidatingWebhookConfiguration (as the chart
renders them: failurePolicy, selectors, timeouts; clientConfig.url on 127.0.0.1 with the caBundle
of `kubeon-gpu certs generate`), the webhook authenticated as its chart ServiceAccount, the
GpuPolicy CRD from manifests/, kube-controller-manager's Deployment and ReplicaSet controllers
creating the pods through admission, the default kube-scheduler binding them, KWOK making them
Ready. Faked: the GPUs (KWOK nodes labelled as GPU Feature Discovery labels A100s), the containers
(nothing runs). Each test gets its own namespace, nodes and policy; its pods are kept on its nodes
with a nodeSelector.

Warnings: a Deployment's pods are created by kube-controller-manager, whose create shows no
terminal, so the chart's ValidatingWebhookConfiguration also sends Deployments, StatefulSets, Jobs
and CronJobs to /validate, which answers with the warnings their pods would get (never a patch).
The Recommend case checks that `kubectl create -f <deployment>` itself prints the warning, that
the Deployment's pods stay unchanged, and that a bare GPU pod's create prints it too. GpuPolicies
go through the mutating webhook, which labels them with their kind for the CRD's Kind printer
column.
"""

from __future__ import annotations

from typing import Any

import yaml

from tests.cluster.cluster import Cluster
from tests.cluster.objects import make_deployment, make_pod
from tests.e2e.conftest import group_nodes, in_group, wait_for_policy

# Only the webhook: these pods are the user's (no schedulerName), placed by the default scheduler.
# prometheus.url set (nothing listens; the webhook never queries it): Automatic sharing may act.
CLUSTER = {"kubeon": True, "kubeon_components": ("webhook",),
           "kubeon_sets": ("prometheus.url=http://127.0.0.1:9",)}
MIG_RESOURCE = "nvidia.com/mig-1g.10gb"


def mig_policy(name: str, namespace: str, mode: str, profile: str = "1g.10gb") -> dict[str, Any]:
    return {
        "apiVersion": "gpu.kubeon.io/v1alpha1", "kind": "GpuPolicy", "metadata": {"name": name},
        "spec": {"mode": mode, "selector": {"namespaces": [namespace]},
                 "sharing": {"strategy": "MIG", "migProfile": profile, "gpuModels": ["NVIDIA-A100-SXM4-80GB"]}},
    }


def kubectl_create(cluster: Cluster, obj: dict[str, Any], check: bool = True) -> Any:
    return cluster.kubectl("create", "-f", "-", input=yaml.safe_dump(obj), check=check)


def user_pod(name: str, namespace: str, **kwargs: Any) -> dict[str, Any]:
    """A pod as a user writes it (no schedulerName), kept on this test's nodes."""
    return make_pod(name, namespace, scheduler_name=None, node_selector=in_group(namespace), **kwargs)


def user_deployment(name: str, namespace: str, replicas: int, **kwargs: Any) -> dict[str, Any]:
    return make_deployment(name, namespace, replicas=replicas, scheduler_name=None,
                           node_selector=in_group(namespace), **kwargs)


def gpu_resources(pod: dict[str, Any]) -> dict[str, Any]:
    return pod["spec"]["containers"][0]["resources"]


def test_automatic_mig_policy_rewrites_deployment_pods(kube_cluster: Cluster, namespace: str) -> None:
    cluster = kube_cluster
    mig_node, _ = group_nodes(cluster, namespace)
    kubectl_create(cluster, mig_policy(f"{namespace}-auto", namespace, "Automatic"))
    wait_for_policy(cluster, f"{namespace}-auto", user_pod("probe", namespace, gpus=1))

    kubectl_create(cluster, user_deployment("llm", namespace, replicas=2, gpus=1))
    pods = cluster.wait_for(lambda: len(cluster.pods(namespace, "app=llm", ready=True)) == 2
                            and cluster.pods(namespace, "app=llm", ready=True), timeout=60,
                            message="2 Ready llm pods")
    for pod in pods:
        resources = gpu_resources(pod)
        assert resources["limits"] == {MIG_RESOURCE: "1"}
        assert resources["requests"][MIG_RESOURCE] == "1"
        assert "nvidia.com/gpu" not in resources["requests"]
        assert {"key": MIG_RESOURCE, "operator": "Exists", "effect": "NoSchedule"} in pod["spec"]["tolerations"]
        assert pod["metadata"]["annotations"]["gpu.kubeon.io/policy"] == f"{namespace}-auto"
        assert "gpu.kubeon.io/rewritten-from" in pod["metadata"]["annotations"]
        assert pod["spec"]["nodeName"] == mig_node  # only the MIG node offers the slice (and is tainted)
    listed = cluster.kubectl("get", "pods", "-n", namespace, "-l", "app=llm", "-o", "name").stdout.split()
    assert len(listed) == 2


def test_recommend_policy_leaves_pods_unchanged_and_warns(kube_cluster: Cluster, namespace: str) -> None:
    cluster, policy = kube_cluster, f"{namespace}-recommend"
    _, whole_node = group_nodes(cluster, namespace)
    kubectl_create(cluster, mig_policy(policy, namespace, "Recommend"))
    wait_for_policy(cluster, policy, user_pod("probe", namespace, gpus=1))

    deployment = kubectl_create(cluster, user_deployment("llm", namespace, replicas=1, gpus=1))
    assert "deployment.apps/llm created" in deployment.stdout
    warnings = [line for line in deployment.stderr.splitlines() if line.startswith("Warning:")]
    assert len(warnings) == 1, deployment.stderr
    assert f"{policy} (Recommend): would use nvidia.com/mig-1g.10gb" in warnings[0]
    # short enough for a terminal line with a policy name of 17 characters (this one's is longer)
    assert len(warnings[0].removeprefix("Warning: ").replace(policy, "e2e-mig-recommend")) < 120
    [pod] = cluster.wait_for(lambda: cluster.pods(namespace, "app=llm", ready=True), timeout=60,
                             message="a Ready llm pod")
    assert gpu_resources(pod)["limits"] == {"nvidia.com/gpu": "1"}
    assert "gpu.kubeon.io/policy" not in (pod["metadata"].get("annotations") or {})
    assert pod["spec"]["nodeName"] == whole_node

    created = kubectl_create(cluster, user_pod("solo", namespace, gpus=1))
    assert "Warning:" in created.stderr
    assert policy in created.stderr and "Recommend" in created.stderr
    [solo] = [p for p in cluster.pods(namespace) if p["metadata"]["name"] == "solo"]
    assert gpu_resources(solo)["limits"] == {"nvidia.com/gpu": "1"}


def test_non_gpu_deployment_creates_without_warnings(kube_cluster: Cluster, namespace: str) -> None:
    cluster, policy = kube_cluster, f"{namespace}-recommend"
    kubectl_create(cluster, mig_policy(policy, namespace, "Recommend"))
    wait_for_policy(cluster, policy, user_pod("probe", namespace, gpus=1))
    created = kubectl_create(cluster, user_deployment("web", namespace, replicas=1))
    assert "deployment.apps/web created" in created.stdout and "Warning:" not in created.stderr


def test_policies_are_labelled_with_their_kind_for_the_printer_column(kube_cluster: Cluster, namespace: str) -> None:
    name = f"{namespace}-kind"
    kubectl_create(kube_cluster, mig_policy(name, namespace, "Recommend"))
    labels = kube_cluster.kubectl("get", "gpupolicy", name, "-o", "jsonpath={.metadata.labels}").stdout
    assert '"gpu.kubeon.io/kind":"sharing"' in labels
    header, row = kube_cluster.kubectl("get", "gpupolicies", name).stdout.splitlines()
    assert header.split()[:5] == ["NAME", "KIND", "MODE", "REQUESTED", "PRIORITY"]
    # MODE and REQUESTED come from the controller's status write; no controller runs in this module.
    # kube-apiserver renders the Table: a column whose field is absent is an empty cell.
    assert table_cells(header, row)[:4] == [name, "sharing", "", ""]


def table_cells(header: str, row: str) -> list[str]:
    """The cells of one `kubectl get` row, cut at the header's column starts (empty cells stay empty)."""
    starts = [i for i, ch in enumerate(header) if ch != " " and (i == 0 or header[i - 1] == " ")]
    return [row[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]


def test_policy_with_unknown_mig_profile_is_refused_with_the_field_path(kube_cluster: Cluster,
                                                                        namespace: str) -> None:
    name = f"{namespace}-bad-profile"
    result = kubectl_create(kube_cluster, mig_policy(name, namespace, "Automatic", "9g.999gb"), check=False)
    assert result.returncode != 0
    assert "denied the request" in result.stderr
    assert "spec.sharing.migProfile" in result.stderr
    missing = kube_cluster.kubectl("get", "gpupolicies", name, check=False)
    assert missing.returncode != 0 and "NotFound" in missing.stderr
