"""GPU requests through DRA (issue 42, docs/designs/dra.md): unchanged `nvidia.com/gpu` pods claim MIG devices,
or a time-sliced share of one GPU through a ResourceClaim several pods name.

Real: kubectl, kube-apiserver v1.35 calling the chart's webhook, the chart's controller (its
claim-templates reconciler creating ResourceClaimTemplates as its ServiceAccount), kube-controller-manager's
resource-claim controller making each pod's ResourceClaim from the template and its garbage collector,
kube-scheduler v1.35's DynamicResources plugin allocating the claim from ResourceSlices (DRA is GA and on by
default; the harness changes no feature gate), KWOK running the pod. Faked: the GPUs — the NVIDIA DRA
driver shim (tests/cluster/dra_driver.py) publishes the driver chart's DeviceClasses and one ResourceSlice
per KWOK node with the catalog's real MIG memory; the nodes advertise no `nvidia.com/gpu` (no device plugin).
"""

from __future__ import annotations

import time
from typing import Any

import yaml

from gpupolicy.k8s.quantity import parse_quantity
from tests.cluster.cluster import Cluster
from tests.cluster.dra_driver import publish as publish_slices
from tests.cluster.dra_driver import resource_slice
from tests.cluster.objects import make_node, make_pod
from tests.e2e.conftest import in_group, wait_for_policy

CLUSTER = {"kubeon": True, "kubeon_components": ("webhook", "controller")}
H200, A100_40 = "NVIDIA-H200", "NVIDIA-A100-SXM4-40GB"
TEMPLATE = "kubeon-mig-1g.18gb"
GPU_TAINT = {"key": "nvidia.com/gpu", "effect": "NoSchedule"}
CONTROLLER = "system:serviceaccount:kubeon-gpu:kubeon-gpu-optimizer"
RESOURCE = "resource.k8s.io/v1"


def dra_policy(name: str, namespace: str, mode: str = "Automatic", **sharing: Any) -> dict[str, Any]:
    return {"apiVersion": "gpu.kubeon.io/v1alpha1", "kind": "GpuPolicy", "metadata": {"name": name},
            "spec": {"mode": mode, "selector": {"namespaces": [namespace]},
                     "sharing": {"strategy": "MIG", "via": "DRA", "gpuModels": [H200], **sharing}}}


def gpu_pod(name: str, namespace: str, memory: str | None = "10Gi", **kwargs: Any) -> dict[str, Any]:
    """A pod as its author wrote it for the device plugin: `nvidia.com/gpu: 1`, its need declared."""
    annotations = {"gpu.kubeon.io/gpu-memory": memory} if memory else None
    return make_pod(name, namespace, annotations=annotations, gpus=1, scheduler_name=None,
                    node_selector=in_group(namespace), **kwargs)


def kubectl_create(cluster: Cluster, obj: dict[str, Any], check: bool = True) -> Any:
    return cluster.kubectl("create", "-f", "-", input=yaml.safe_dump(obj), check=check)


def dra_nodes(cluster: Cluster, namespace: str) -> tuple[str, str]:
    """Two KWOK nodes with the DRA driver, no device plugin: an A100 40GB cut into 7x 1g.5gb (4.75 GiB each,
    too small for 10Gi) and an H200 cut into 1g.18gb, 1g.18gb, 2g.35gb, 3g.71gb. Both tainted as GPU nodes."""
    small, large = f"{namespace}-a100"[-63:], f"{namespace}-h200"[-63:]
    for node in (small, large):
        cluster.create(make_node(node, None, labels=in_group(namespace), taints=[GPU_TAINT]))
    publish_slices(cluster, [resource_slice(small, A100_40, 1, ["1g.5gb"] * 7),
                             resource_slice(large, H200, 1, ["1g.18gb", "1g.18gb", "2g.35gb", "3g.71gb"])])
    cluster.wait_nodes_settled(small, large)
    return small, large


def get(cluster: Cluster, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
    args = ["get", kind, name, "-o", "json", "--ignore-not-found"] + (["-n", namespace] if namespace else [])
    out = cluster.kubectl(*args).stdout.strip()
    return yaml.safe_load(out) if out else None


def templates(cluster: Cluster, namespace: str) -> list[dict[str, Any]]:
    out = cluster.kubectl("get", "resourceclaimtemplates", "-n", namespace, "-o", "json").stdout
    return list(yaml.safe_load(out)["items"])


def controller_template_writes(cluster: Cluster, namespace: str) -> list[dict[str, Any]]:
    return [e for e in cluster.plane.audit_events(CONTROLLER)
            if (e.get("objectRef") or {}).get("resource") == "resourceclaimtemplates"
            and (e.get("objectRef") or {}).get("namespace") == namespace and e.get("verb") == "create"]


def allocated_device(cluster: Cluster, pod: dict[str, Any]) -> dict[str, Any]:
    """The device of the pod's claim as the scheduler allocated it, read in the ResourceSlice it came from."""
    status = pod["status"]["resourceClaimStatuses"][0]
    claim = get(cluster, "resourceclaim", status["resourceClaimName"], pod["metadata"]["namespace"])
    assert claim is not None
    result = claim["status"]["allocation"]["devices"]["results"][0]
    slices = yaml.safe_load(cluster.kubectl("get", "resourceslices", "-o", "json").stdout)["items"]
    pool = next(s for s in slices if s["spec"]["pool"]["name"] == result["pool"])
    device = next(d for d in pool["spec"]["devices"] if d["name"] == result["device"])
    return {"node": pool["spec"]["nodeName"], **device}


def test_unchanged_pod_claims_a_mig_device_the_scheduler_allocates(kube_cluster: Cluster, namespace: str) -> None:
    cluster = kube_cluster
    _, h200 = dra_nodes(cluster, namespace)
    policy = f"{namespace}-dra"
    kubectl_create(cluster, dra_policy(policy, namespace))
    wait_for_policy(cluster, policy, gpu_pod("probe", namespace))

    created = kubectl_create(cluster, gpu_pod("llm", namespace))
    assert "Warning:" not in created.stderr, created.stderr
    pod = cluster.wait_for(lambda: next(iter(cluster.pods(namespace, "app=llm", ready=True)), None), timeout=90,
                           message="the llm pod Running on a node")
    container = pod["spec"]["containers"][0]
    assert "nvidia.com/gpu" not in (container["resources"].get("limits") or {})
    assert container["resources"]["claims"] == [{"name": "kubeon-claim-0"}]
    assert pod["spec"]["resourceClaims"] == [{"name": "kubeon-claim-0", "resourceClaimTemplateName": TEMPLATE}]
    device = allocated_device(cluster, pod)
    assert device["node"] == h200 == pod["spec"]["nodeName"]
    assert device["attributes"]["type"] == {"string": "mig"}
    assert parse_quantity(device["capacity"]["memory"]["value"]) >= 10 * 2**30
    assert device["attributes"]["profile"] == {"string": "1g.18gb"}

    template = get(cluster, "resourceclaimtemplate", TEMPLATE, namespace)
    assert template is not None
    assert template["metadata"]["labels"]["gpu.kubeon.io/managed-by"] == "kubeon-gpu-optimizer"
    assert [r["name"] for r in template["metadata"]["ownerReferences"]] == [policy]
    assert len(controller_template_writes(cluster, namespace)) == 1  # by the controller, as its ServiceAccount


def test_recommend_warns_and_writes_nothing(kube_cluster: Cluster, namespace: str) -> None:
    cluster = kube_cluster
    kubectl_create(cluster, dra_policy("dra-rec", namespace, "Recommend"))
    wait_for_policy(cluster, "dra-rec", gpu_pod("probe", namespace))

    created = kubectl_create(cluster, gpu_pod("llm", namespace))
    assert f"Warning: kubeon-gpu dra-rec (Recommend): would use ResourceClaimTemplate {TEMPLATE}" in created.stderr
    pod = get(cluster, "pod", "llm", namespace)
    assert pod is not None and "resourceClaims" not in pod["spec"]
    assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    time.sleep(12)  # more than two passes of the claim-templates reconciler (every 5 s)
    assert templates(cluster, namespace) == [] and controller_template_writes(cluster, namespace) == []
    cluster.kubectl("delete", "gpupolicy", "dra-rec")


def test_policy_removed_leaves_no_template_of_ours(kube_cluster: Cluster, namespace: str) -> None:
    cluster = kube_cluster
    policy = f"{namespace}-gc"
    kubectl_create(cluster, dra_policy(policy, namespace))
    wait_for_policy(cluster, policy, gpu_pod("probe", namespace))
    kubectl_create(cluster, gpu_pod("llm", namespace))  # no node for it: it waits, its template is made
    cluster.wait_for(lambda: get(cluster, "resourceclaimtemplate", TEMPLATE, namespace), timeout=30,
                     message=f"the controller's {TEMPLATE}")
    cluster.kubectl("delete", "gpupolicy", policy)
    cluster.wait_for(lambda: templates(cluster, namespace) == [], timeout=60,
                     message="the garbage collector deleting the template with its policy")


def test_user_template_of_that_name_is_left_alone(kube_cluster: Cluster, namespace: str) -> None:
    cluster = kube_cluster
    mine = {"apiVersion": RESOURCE, "kind": "ResourceClaimTemplate",
            "metadata": {"name": TEMPLATE, "namespace": namespace},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpu.nvidia.com"}}]}}}}
    cluster.create(mine)
    policy = f"{namespace}-user"
    kubectl_create(cluster, dra_policy(policy, namespace))
    wait_for_policy(cluster, policy, gpu_pod("probe", namespace))
    kubectl_create(cluster, gpu_pod("llm", namespace))
    cluster.wait_for(lambda: [e for e in cluster.events("default", "ClaimTemplateNotOurs")
                              if e["involvedObject"]["name"] == policy], timeout=30,
                     message="a ClaimTemplateNotOurs warning on the policy")
    template = get(cluster, "resourceclaimtemplate", TEMPLATE, namespace)
    assert template is not None and not template["metadata"].get("labels")
    assert template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] == "gpu.nvidia.com"
    cluster.kubectl("delete", "gpupolicy", policy)


def test_bad_input_is_left_alone_with_the_reason(kube_cluster: Cluster, namespace: str) -> None:
    cluster = kube_cluster
    kubectl_create(cluster, dra_policy("dra-bad", namespace))
    wait_for_policy(cluster, "dra-bad", gpu_pod("probe", namespace))

    huge = kubectl_create(cluster, gpu_pod("huge", namespace, memory="200Gi"))
    assert "Warning: kubeon-gpu dra-bad: pod left unchanged: no MIG profile holds 204800Mi" in huge.stderr, \
        huge.stderr
    own = gpu_pod("own", namespace)
    own["spec"]["resourceClaims"] = [{"name": "mine", "resourceClaimTemplateName": "someone-elses"}]
    mine = kubectl_create(cluster, own)
    assert "Warning: kubeon-gpu dra-bad: pod left unchanged: the pod has its own spec.resourceClaims" \
        in mine.stderr, mine.stderr
    for name in ("huge", "own"):
        pod = get(cluster, "pod", name, namespace)
        assert pod is not None and pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
        assert "gpu.kubeon.io/claim-template" not in pod["metadata"].get("annotations", {})

    unknown = kubectl_create(cluster, dra_policy("dra-unknown", namespace, migProfile="9g.999gb"), check=False)
    assert unknown.returncode != 0 and "spec.sharing.migProfile" in unknown.stderr, unknown.stderr
    cluster.kubectl("delete", "gpupolicy", "dra-bad")


def ts_policy(name: str, namespace: str, mode: str = "Automatic", replicas: int = 2) -> dict[str, Any]:
    policy = dra_policy(name, namespace, mode)
    policy["spec"]["sharing"] = {"strategy": "TimeSlicing", "replicas": replicas, "via": "DRA", "gpuModels": [H200]}
    return policy


def named_claim(cluster: Cluster, name: str, namespace: str) -> str:
    pod = get(cluster, "pod", name, namespace)
    assert pod is not None
    return str(pod["spec"]["resourceClaims"][0]["resourceClaimName"])


def claims(cluster: Cluster, namespace: str) -> list[dict[str, Any]]:
    out = cluster.kubectl("get", "resourceclaims", "-n", namespace, "-o", "json").stdout
    return list(yaml.safe_load(out)["items"])


def h200_nodes(cluster: Cluster, namespace: str, count: int = 2) -> list[str]:
    """`count` KWOK nodes of the test's group, each with one whole H200 in its driver's slice, settled."""
    nodes = [f"{namespace}-h200-{i}"[-63:] for i in range(count)]
    for node in nodes:
        cluster.create(make_node(node, None, labels=in_group(namespace), taints=[GPU_TAINT]))
    publish_slices(cluster, [resource_slice(node, H200, 1) for node in nodes])
    cluster.wait_nodes_settled(*nodes)
    return nodes


def test_time_sliced_pods_share_one_claim_and_the_next_gets_another(kube_cluster: Cluster, namespace: str) -> None:
    cluster = kube_cluster
    h200_nodes(cluster, namespace)
    policy = f"{namespace}-ts"
    kubectl_create(cluster, ts_policy(policy, namespace))
    wait_for_policy(cluster, policy, gpu_pod("probe", namespace, memory=None))

    for name in ("a", "b", "c"):
        created = kubectl_create(cluster, gpu_pod(name, namespace, memory=None))
        assert "Warning:" not in created.stderr, created.stderr
    first, second = f"kubeon-ts-{policy}-0", f"kubeon-ts-{policy}-1"
    assert [named_claim(cluster, n, namespace) for n in ("a", "b", "c")] == [first, first, second]
    running = cluster.wait_for(lambda: (lambda pods: pods if len(pods) == 3 else None)(
        [p for n in ("a", "b", "c") for p in cluster.pods(namespace, f"app={n}", ready=True)]),
        timeout=90, message="the three pods Running")
    a, b, c = running
    assert "nvidia.com/gpu" not in (a["spec"]["containers"][0]["resources"].get("limits") or {})
    assert a["spec"]["nodeName"] == b["spec"]["nodeName"] != c["spec"]["nodeName"]  # one GPU per node
    shared = get(cluster, "resourceclaim", first, namespace)
    assert shared is not None
    assert len(shared["status"]["allocation"]["devices"]["results"]) == 1  # allocated once, for both pods
    assert sorted(r["name"] for r in shared["status"]["reservedFor"]) == ["a", "b"]
    assert shared["metadata"]["labels"]["gpu.kubeon.io/managed-by"] == "kubeon-gpu-optimizer"
    assert [r["name"] for r in shared["metadata"]["ownerReferences"]] == [policy]
    writes = [e for e in cluster.plane.audit_events(CONTROLLER)
              if (e.get("objectRef") or {}).get("resource") == "resourceclaims" and e.get("verb") == "create"
              and (e.get("objectRef") or {}).get("namespace") == namespace]
    assert len(writes) == 2  # by the controller, as its ServiceAccount

    cluster.kubectl("delete", "gpupolicy", policy)
    cluster.kubectl("delete", "pod", "a", "b", "c", "-n", namespace, "--wait=true")
    cluster.wait_for(lambda: claims(cluster, namespace) == [], timeout=60,
                     message="the garbage collector deleting the shared claims with their policy")


def test_time_slicing_recommend_warns_and_writes_nothing(kube_cluster: Cluster, namespace: str) -> None:
    cluster = kube_cluster
    kubectl_create(cluster, ts_policy("ts-rec", namespace, "Recommend"))
    wait_for_policy(cluster, "ts-rec", gpu_pod("probe", namespace, memory=None))
    created = kubectl_create(cluster, gpu_pod("llm", namespace, memory=None))
    assert "Warning: kubeon-gpu ts-rec (Recommend): would use ResourceClaim kubeon-ts-ts-rec-0" in created.stderr, \
        created.stderr
    pod = get(cluster, "pod", "llm", namespace)
    assert pod is not None and "resourceClaims" not in pod["spec"]
    assert "gpu.kubeon.io/shared-claim" not in pod["metadata"].get("labels", {})
    time.sleep(12)  # more than two passes of the claim-templates reconciler (every 5 s)
    assert claims(cluster, namespace) == []
    cluster.kubectl("delete", "gpupolicy", "ts-rec")


def test_time_slicing_bad_input_is_named(kube_cluster: Cluster, namespace: str) -> None:
    cluster = kube_cluster
    kubectl_create(cluster, ts_policy("ts-bad", namespace))
    wait_for_policy(cluster, "ts-bad", gpu_pod("probe", namespace, memory=None))
    two = gpu_pod("two", namespace, memory=None)
    two["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "2"}}
    created = kubectl_create(cluster, two)
    assert "Warning: kubeon-gpu ts-bad: pod left unchanged: a time-sliced share is one GPU for one container" \
        in created.stderr, created.stderr
    pod = get(cluster, "pod", "two", namespace)
    assert pod is not None and pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"
    one = kubectl_create(cluster, ts_policy("ts-one", namespace, replicas=1), check=False)
    assert one.returncode != 0 and "spec.sharing.replicas" in one.stderr, one.stderr
    cluster.kubectl("delete", "gpupolicy", "ts-bad")
