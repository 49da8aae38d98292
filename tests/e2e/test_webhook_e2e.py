"""End to end: GpuPolicies and GPU workloads through real kubectl, the API server and the real webhook.

Real: kubectl 1.35 (`create -f`, `get`), the test API server calling the
`kubeon-gpu webhook` process over HTTPS through the chart's
Mutating/ValidatingWebhookConfiguration (service rewritten to a local URL,
caBundle from `kubeon-gpu certs generate`), the GpuPolicy CRD from
manifests/, the workload controllers that create pods through admission,
the scheduler stand-in that binds them and the kubelet stand-in that makes
them Ready. Faked: the nodes (GFD-labelled A100 objects, no GPUs) and the
containers (nothing runs).

Warnings: a Deployment's pods are created by the workload controller, whose
create shows no terminal, so the chart's ValidatingWebhookConfiguration also
sends Deployments, StatefulSets, Jobs and CronJobs to /validate, which
answers with the warnings their pods would get (never a patch). The
Recommend case checks that `kubectl create -f <deployment>` itself prints
the warning, that the Deployment's pods stay unchanged, and that a bare GPU
pod's create prints it too. GpuPolicies go through the mutating webhook,
which labels them with their kind for the CRD's Kind printer column.
"""

from __future__ import annotations

from typing import Any

import yaml

from tests.e2e.conftest import Webhook, wait_for_policy
from tests.kubeapi.cluster import Cluster
from tests.cluster.objects import make_deployment, make_pod

MIG_RESOURCE = "nvidia.com/mig-1g.10gb"


def mig_policy(name: str, namespace: str, mode: str, profile: str = "1g.10gb") -> dict[str, Any]:
    return {
        "apiVersion": "gpu.kubeon.io/v1alpha1", "kind": "GpuPolicy", "metadata": {"name": name},
        "spec": {"mode": mode, "selector": {"namespaces": [namespace]},
                 "sharing": {"strategy": "MIG", "migProfile": profile, "gpuModels": ["NVIDIA-A100-SXM4-80GB"]}},
    }


def kubectl_create(cluster: Cluster, obj: dict[str, Any], check: bool = True) -> Any:
    return cluster.kubectl("create", "-f", "-", input=yaml.safe_dump(obj), check=check)


def gpu_resources(pod: dict[str, Any]) -> dict[str, Any]:
    return pod["spec"]["containers"][0]["resources"]


def test_automatic_mig_policy_rewrites_deployment_pods(e2e_cluster: Cluster, webhook: Webhook) -> None:
    cluster, namespace = e2e_cluster, "e2e-mig"
    cluster.ensure_namespace(namespace)
    kubectl_create(cluster, mig_policy("e2e-mig-auto", namespace, "Automatic"))
    wait_for_policy(webhook, "e2e-mig-auto", make_pod("probe", namespace, gpus=1))

    kubectl_create(cluster, make_deployment("llm", namespace, replicas=2, gpus=1))
    pods = cluster.wait_for(lambda: len(cluster.pods(namespace, "app=llm", ready=True)) == 2
                            and cluster.pods(namespace, "app=llm", ready=True), timeout=20,
                            message="2 Ready llm pods")
    for pod in pods:
        resources = gpu_resources(pod)
        assert resources["limits"] == {MIG_RESOURCE: "1"}
        assert resources["requests"][MIG_RESOURCE] == "1"
        assert "nvidia.com/gpu" not in resources["requests"]
        assert {"key": MIG_RESOURCE, "operator": "Exists", "effect": "NoSchedule"} in pod["spec"]["tolerations"]
        assert pod["metadata"]["annotations"]["gpu.kubeon.io/policy"] == "e2e-mig-auto"
        assert "gpu.kubeon.io/rewritten-from" in pod["metadata"]["annotations"]
        assert pod["spec"]["nodeName"] == "a100-mig-0"  # only the MIG node offers the slice (and is tainted)
    listed = cluster.kubectl("get", "pods", "-n", namespace, "-l", "app=llm", "-o", "name").stdout.split()
    assert len(listed) == 2


def test_recommend_policy_leaves_pods_unchanged_and_warns(e2e_cluster: Cluster, webhook: Webhook) -> None:
    cluster, namespace = e2e_cluster, "e2e-recommend"
    cluster.ensure_namespace(namespace)
    kubectl_create(cluster, mig_policy("e2e-mig-recommend", namespace, "Recommend"))
    wait_for_policy(webhook, "e2e-mig-recommend", make_pod("probe", namespace, gpus=1))

    deployment = kubectl_create(cluster, make_deployment("llm", namespace, replicas=1, gpus=1))
    assert "deployment.apps/llm created" in deployment.stdout
    warnings = [line for line in deployment.stderr.splitlines() if line.startswith("Warning:")]
    assert len(warnings) == 1, deployment.stderr
    assert "e2e-mig-recommend (Recommend): would use nvidia.com/mig-1g.10gb" in warnings[0]
    assert len(warnings[0].removeprefix("Warning: ")) < 120
    [pod] = cluster.wait_for(lambda: cluster.pods(namespace, "app=llm", ready=True), timeout=20,
                             message="a Ready llm pod")
    assert gpu_resources(pod)["limits"] == {"nvidia.com/gpu": "1"}
    assert "gpu.kubeon.io/policy" not in (pod["metadata"].get("annotations") or {})
    assert pod["spec"]["nodeName"] == "a100-whole-0"

    created = kubectl_create(cluster, make_pod("solo", namespace, gpus=1))
    assert "Warning:" in created.stderr
    assert "e2e-mig-recommend" in created.stderr and "Recommend" in created.stderr
    [solo] = [p for p in cluster.pods(namespace) if p["metadata"]["name"] == "solo"]
    assert gpu_resources(solo)["limits"] == {"nvidia.com/gpu": "1"}


def test_non_gpu_deployment_creates_without_warnings(e2e_cluster: Cluster, webhook: Webhook) -> None:
    cluster, namespace = e2e_cluster, "e2e-plain"
    cluster.ensure_namespace(namespace)
    kubectl_create(cluster, mig_policy("e2e-mig-recommend-cpu", namespace, "Recommend"))
    wait_for_policy(webhook, "e2e-mig-recommend-cpu", make_pod("probe", namespace, gpus=1))
    created = kubectl_create(cluster, make_deployment("web", namespace, replicas=1))
    assert "deployment.apps/web created" in created.stdout and "Warning:" not in created.stderr


def test_policies_are_labelled_with_their_kind_for_the_printer_column(
        e2e_cluster: Cluster, webhook: Webhook) -> None:
    kubectl_create(e2e_cluster, mig_policy("e2e-kind-column", "e2e-kind", "Recommend"))
    labels = e2e_cluster.kubectl("get", "gpupolicy", "e2e-kind-column", "-o",
                                 "jsonpath={.metadata.labels}").stdout
    assert '"gpu.kubeon.io/kind":"sharing"' in labels
    table = e2e_cluster.kubectl("get", "gpupolicies", "e2e-kind-column").stdout.splitlines()
    assert table[0].split()[:5] == ["NAME", "KIND", "MODE", "REQUESTED", "PRIORITY"]
    # MODE and REQUESTED come from the controller's status write; no controller runs here.
    assert table[1].split()[:4] == ["e2e-kind-column", "sharing", "<none>", "<none>"]


def test_policy_with_unknown_mig_profile_is_refused_with_the_field_path(
        e2e_cluster: Cluster, webhook: Webhook) -> None:
    result = kubectl_create(e2e_cluster, mig_policy("e2e-bad-profile", "e2e-bad", "Automatic", "9g.999gb"),
                            check=False)
    assert result.returncode != 0
    assert "denied the request" in result.stderr
    assert "spec.sharing.migProfile" in result.stderr
    missing = e2e_cluster.kubectl("get", "gpupolicies", "e2e-bad-profile", check=False)
    assert missing.returncode != 0 and "NotFound" in missing.stderr
