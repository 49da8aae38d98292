"""One poisoned GpuPolicy cannot switch the optimizer off (issue 15, defect 1), end to end.

Real: the test API server and its loops, the GpuPolicy CRD from manifests/,
the `kubeon-gpu webhook` process behind the chart's webhook configurations,
`kubeon-gpu controller` (status and Events) and `kubeon-gpu extender` (the
scheduler stand-in routes through it), all as subprocesses watching the
cluster. Faked: the nodes (GFD-labelled A100 objects, no GPUs).

The poison is `spec.sharing.gpuMemory: "1e1000000"`: it matches the CRD's
quantity pattern (only a CEL rule, which the test API server does not
evaluate, refuses it), so with the webhook on it reaches /validate, which
must deny it naming the field; stored with the webhook off (down, or older
than the policy), it used to raise decimal.Overflow in every watch-cache
rebuild, so every pod review was "internal error, admitted unchanged" and
every /filter answered an error.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import requests
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.e2e.conftest import Process, Webhook, wait_for_policy
from tests.extender.payloads import args, wire_pod
from tests.kubeapi.cluster import Cluster
from tests.cluster.objects import make_pod

NAMESPACE = "e2e-poison"
MIG_RESOURCE = "nvidia.com/mig-1g.10gb"


def sharing_policy(name: str, namespace: str, gpu_memory: str = "8Gi") -> dict[str, Any]:
    return {"apiVersion": "gpu.kubeon.io/v1alpha1", "kind": "GpuPolicy", "metadata": {"name": name},
            "spec": {"mode": "Automatic", "selector": {"namespaces": [namespace]},
                     "sharing": {"strategy": "MIG", "migProfile": "auto", "gpuMemory": gpu_memory,
                                 "gpuModels": ["NVIDIA-A100-SXM4-80GB"]}}}


POISON = sharing_policy("poisoned", "elsewhere", gpu_memory="1e1000000")


def _status(cluster: Cluster, name: str) -> dict[str, Any]:
    obj = json.loads(cluster.custom.get_cluster_custom_object(
        "gpu.kubeon.io", "v1alpha1", "gpupolicies", name, _preload_content=False).data)
    return obj.get("status") or {}


def _condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c.get("type") == kind), {})


def _webhooks_off(cluster: Cluster, webhook: Webhook) -> None:
    admission = client.AdmissionregistrationV1Api(cluster.api_client)
    for config in webhook.configurations:
        name = config["metadata"]["name"]
        if config["kind"] == "MutatingWebhookConfiguration":
            admission.delete_mutating_webhook_configuration(name)
        else:
            admission.delete_validating_webhook_configuration(name)


def _webhooks_on(cluster: Cluster, webhook: Webhook) -> None:
    admission = client.AdmissionregistrationV1Api(cluster.api_client)
    for config in webhook.configurations:
        if config["kind"] == "MutatingWebhookConfiguration":
            admission.create_mutating_webhook_configuration(copy.deepcopy(config), _preload_content=False)
        else:
            admission.create_validating_webhook_configuration(copy.deepcopy(config), _preload_content=False)


@pytest.fixture(scope="module")
def poisoned(e2e_cluster: Cluster, webhook: Webhook, request: pytest.FixtureRequest) -> Cluster:
    """A valid sharing policy, then the poisoned one stored past a switched-off webhook."""
    c = e2e_cluster
    c.ensure_namespace(NAMESPACE)
    c.create(sharing_policy("share", NAMESPACE))
    wait_for_policy(webhook, "share", make_pod("probe", NAMESPACE, gpus=1))
    _webhooks_off(c, webhook)
    try:
        c.create(POISON)
    finally:
        _webhooks_on(c, webhook)
    # Watch events arrive in order: once the webhook has this later policy, it has the poisoned one.
    c.ensure_namespace("e2e-after")
    c.create(sharing_policy("after", "e2e-after"))
    wait_for_policy(webhook, "after", make_pod("probe", "e2e-after", gpus=1))
    request.getfixturevalue("controller")
    extender: Process = request.getfixturevalue("extender")  # its first list holds the poisoned policy
    c.use_extenders([extender.config])
    return c


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
    [event] = poisoned.wait_for(lambda: [e for e in poisoned.events("kubeon-gpu", "InvalidSpec")
                                         if e["involvedObject"]["name"] == "poisoned"], timeout=30,
                                message="InvalidSpec Event on the poisoned policy")
    assert event["type"] == "Warning" and "spec.sharing.gpuMemory" in event["message"]
    share = poisoned.wait_for(lambda: _condition(_status(poisoned, "share"), "Valid"), timeout=30,
                              message="Valid condition on the valid policy")
    assert share["status"] == "True", "only the poisoned policy is reported"


def test_the_valid_sharing_policy_still_rewrites_pods_and_the_extender_places_them(poisoned: Cluster) -> None:
    poisoned.create(make_pod("llm", NAMESPACE, gpus=1))
    [pod] = poisoned.wait_for(lambda: [p for p in poisoned.pods(NAMESPACE, bound=True)
                                       if p["metadata"]["name"] == "llm"], timeout=20, message="llm bound")
    resources = pod["spec"]["containers"][0]["resources"]
    assert resources["limits"] == {MIG_RESOURCE: "1"}, "rewritten by the valid policy"
    assert pod["metadata"]["annotations"]["gpu.kubeon.io/policy"] == "share"
    assert pod["spec"]["nodeName"] == "a100-mig-0"
    assert any(verb == "filter" for verb, _ in poisoned.scheduler.extenders[0].calls), "placed via the extender"


def test_the_extender_still_filters_and_scores(poisoned: Cluster, extender: Process) -> None:
    names = ["a100-whole-0", "a100-mig-0"]
    body = args(wire_pod("direct", gpus=1), names)
    result = requests.post(f"{extender.url}/filter", json=body, timeout=5).json()
    assert result["Error"] == "" and result["NodeNames"] == ["a100-whole-0"]
    scores = requests.post(f"{extender.url}/prioritize", json=args(wire_pod("direct", gpus=1), ["a100-whole-0"]),
                           timeout=5).json()
    assert [s["Host"] for s in scores] == ["a100-whole-0"] and scores[0]["Score"] > 0
