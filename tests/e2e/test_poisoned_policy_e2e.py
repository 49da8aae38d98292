"""One poisoned GpuPolicy cannot switch the optimizer off (issue 15, defect 1), end to end.

Real: kube-apiserver v1.35 and the GpuPolicy CRD, the `kubeon-gpu webhook` process behind the
chart's webhook configurations, `kubeon-gpu controller` (status and Events) and `kubeon-gpu
extender` with the chart's second kube-scheduler calling it, each as its chart ServiceAccount.
Faked: the GPUs (KWOK nodes labelled as GFD labels A100s).

The poison is `spec.sharing.gpuMemory: "1e1000000"`. Today's CRD refuses it itself (a quantity
pattern and a CEL rule, before any validating webhook is called), but Helm installs CRDs on first
install only and never upgrades them (docs/install.md, "Upgrading"), so a cluster installed before
that rule keeps a CRD without it: this module's cluster has that CRD (today's, without the
pattern and rule on gpuMemory). There, the webhook is the guard: with it on, /validate must deny
the poison naming the field; while it is down, the chart's `failurePolicy: Ignore` lets kube-apiserver
store it. It used to raise decimal.Overflow in every watch-cache rebuild, so every pod review was
"internal error, admitted unchanged" and every /filter answered an error.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest
import requests
import yaml
from kubernetes.client.exceptions import ApiException

from kube.events import CLUSTER_SCOPED_EVENT_NAMESPACE
from tests.cluster.cluster import Cluster
from tests.cluster.kubeon import CRDS, apply_objects
from tests.cluster.objects import make_pod
from tests.e2e.conftest import group_nodes, wait_for_policy
from tests.extender.payloads import args, wire_pod

# The controller, extender and second scheduler start in `poisoned`, after the poison is stored.
CLUSTER = {"kubeon": True, "kubeon_components": ("webhook",),
           "kubeon_sets": ("prometheus.url=http://127.0.0.1:9",)}
NAMESPACE = "e2e-poison"
MIG_RESOURCE = "nvidia.com/mig-1g.10gb"


def sharing_policy(name: str, namespace: str, gpu_memory: str = "8Gi") -> dict[str, Any]:
    return {"apiVersion": "gpu.kubeon.io/v1alpha1", "kind": "GpuPolicy", "metadata": {"name": name},
            "spec": {"mode": "Automatic", "selector": {"namespaces": [namespace]},
                     "sharing": {"strategy": "MIG", "migProfile": "auto", "gpuMemory": gpu_memory,
                                 "gpuModels": ["NVIDIA-A100-SXM4-80GB"]}}}


POISON = sharing_policy("poisoned", "elsewhere", gpu_memory="1e1000000")


def crd_before_the_quantity_rule() -> dict[str, Any]:
    """Today's GpuPolicy CRD without the pattern and CEL rule on spec.sharing.gpuMemory, as an
    install from before them still has it."""
    [path] = [p for p in CRDS if p.name == "gpupolicies.gpu.kubeon.io.yaml"]
    crd = yaml.safe_load(path.read_text())
    for version in crd["spec"]["versions"]:
        gpu_memory = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["sharing"][
            "properties"]["gpuMemory"]
        gpu_memory.pop("pattern")
        gpu_memory.pop("x-kubernetes-validations")
    return dict(crd)


def _status(cluster: Cluster, name: str) -> dict[str, Any]:
    obj = json.loads(cluster.custom.get_cluster_custom_object(
        "gpu.kubeon.io", "v1alpha1", "gpupolicies", name, _preload_content=False).data)
    return obj.get("status") or {}


def _condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c.get("type") == kind), {})


def extender_count(cluster: Cluster, verb: str) -> float:
    assert cluster.kubeon is not None
    text = requests.get(f"{cluster.kubeon.extender_url}/metrics", timeout=5).text
    prefix = f'kubeon_extender_http_requests_total{{route="/{verb}",status="200"}} '
    return sum(float(line[len(prefix):]) for line in text.splitlines() if line.startswith(prefix))


@pytest.fixture(scope="module")
def poisoned(kube_cluster: Cluster) -> Iterator[Cluster]:
    """A valid sharing policy, then the poisoned one stored while the webhook was down; then the
    controller, the extender and the second scheduler start with both in the cluster."""
    c = kube_cluster
    assert c.kubeon is not None
    apply_objects(c.api_client, [crd_before_the_quantity_rule()])
    c.ensure_namespace(NAMESPACE)
    group_nodes(c, NAMESPACE)
    c.create(sharing_policy("share", NAMESPACE))
    wait_for_policy(c, "share", make_pod("probe", NAMESPACE, gpus=1))
    c.kubeon.stop_component("webhook")
    try:
        c.create(POISON)  # kube-apiserver cannot call the webhook: failurePolicy Ignore stores it
    finally:
        c.kubeon.start_webhook(c.api_client)
    # Watch events arrive in order: once the webhook has this later policy, it has the poisoned one.
    c.ensure_namespace("e2e-after")
    c.create(sharing_policy("after", "e2e-after"))
    wait_for_policy(c, "after", make_pod("probe", "e2e-after", gpus=1))
    c.kubeon.start_controller(c.api_client)
    c.kubeon.start_extender(c.api_client)  # its first list holds the poisoned policy
    c.kubeon.start_scheduler(c.api_client)
    yield c


def test_the_webhook_refuses_the_poisoned_policy_naming_the_field(poisoned: Cluster) -> None:
    again = copy.deepcopy(POISON)
    again["metadata"]["name"] = "poisoned-again"
    with pytest.raises(ApiException) as info:
        poisoned.create(again)
    message = json.loads(info.value.body)["message"]
    assert "spec.sharing.gpuMemory" in message and "largest quantity" in message, message


def test_the_stored_one_is_reported_on_its_own_status_and_events(poisoned: Cluster) -> None:
    valid = poisoned.wait_for(lambda: _condition(_status(poisoned, "poisoned"), "Valid"), timeout=30,
                              message="Valid condition on the poisoned policy")
    assert valid["status"] == "False" and valid["reason"] == "InvalidSpec"
    assert "spec.sharing.gpuMemory" in valid["message"] and "largest quantity" in valid["message"]
    [event] = poisoned.wait_for(lambda: [e for e in poisoned.events(CLUSTER_SCOPED_EVENT_NAMESPACE, "InvalidSpec")
                                         if e["involvedObject"]["name"] == "poisoned"], timeout=30,
                                message="InvalidSpec Event on the poisoned policy")
    assert event["type"] == "Warning" and "spec.sharing.gpuMemory" in event["message"]
    share = poisoned.wait_for(lambda: _condition(_status(poisoned, "share"), "Valid"), timeout=30,
                              message="Valid condition on the valid policy")
    assert share["status"] == "True", "only the poisoned policy is reported"


def test_the_valid_sharing_policy_still_rewrites_pods_and_the_extender_places_them(poisoned: Cluster) -> None:
    before = extender_count(poisoned, "filter")
    poisoned.create(make_pod("llm", NAMESPACE, gpus=1))  # schedulerName: kubeon-gpu-scheduler
    [pod] = poisoned.wait_for(lambda: [p for p in poisoned.pods(NAMESPACE, bound=True)
                                       if p["metadata"]["name"] == "llm"], timeout=60, message="llm bound")
    resources = pod["spec"]["containers"][0]["resources"]
    assert resources["limits"] == {MIG_RESOURCE: "1"}, "rewritten by the valid policy"
    assert pod["metadata"]["annotations"]["gpu.kubeon.io/policy"] == "share"
    assert pod["spec"]["nodeName"] == f"{NAMESPACE}-mig"
    assert extender_count(poisoned, "filter") > before, "placed via the extender"


def test_the_extender_still_filters_and_scores(poisoned: Cluster) -> None:
    assert poisoned.kubeon is not None
    url, whole, mig = poisoned.kubeon.extender_url, f"{NAMESPACE}-whole", f"{NAMESPACE}-mig"
    body = args(wire_pod("direct", gpus=1), [whole, mig])
    result = requests.post(f"{url}/filter", json=body, timeout=5).json()
    assert result["Error"] == "" and result["NodeNames"] == [whole]
    scores = requests.post(f"{url}/prioritize", json=args(wire_pod("direct", gpus=1), [whole]), timeout=5).json()
    assert [s["Host"] for s in scores] == [whole] and scores[0]["Score"] > 0
