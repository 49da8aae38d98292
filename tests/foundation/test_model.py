"""GpuPolicy parsing: what users write is accepted, mistakes are named by field path. Pure."""

from typing import Any

import pytest
from pydantic import ValidationError

from gpupolicy.model import Mode, PolicyKind, parse_policy, parse_valid_policies


def make_policy(spec: dict[str, Any], name: str = "p") -> dict[str, Any]:
    return {"apiVersion": "gpu.kubeon.io/v1alpha1", "kind": "GpuPolicy", "metadata": {"name": name}, "spec": spec}


def expect_error_at(spec: dict[str, Any], path: str) -> str:
    with pytest.raises(ValidationError) as caught:
        parse_policy(make_policy(spec))
    paths = {".".join(str(part) for part in err["loc"]) for err in caught.value.errors()}
    assert path in paths, paths
    return str(caught.value)


def test_the_issue_example_parses() -> None:
    policy = parse_policy(make_policy({
        "mode": "Automatic", "priority": 10,
        "selector": {"namespaces": ["inference"], "namespaceSelector": {"matchLabels": {"team": "ml"}},
                     "podSelector": {"matchLabels": {"app": "llm"}}},
        "approvals": ["Deployment/inference/llm"],
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}],
        "schedulerName": "kubeon-gpu-scheduler",
        "sharing": {"strategy": "MIG", "migProfile": "auto", "gpuMemory": "8Gi",
                    "gpuModels": ["NVIDIA-A100-SXM4-80GB"]},
    }))
    assert policy.spec.kind is PolicyKind.SHARING
    assert policy.effective_mode() is Mode.AUTOMATIC
    assert policy.spec.selector.pod_selector is not None
    assert policy.to_wire()["spec"]["sharing"]["migProfile"] == "auto"


def test_mode_defaults_to_the_install_default() -> None:
    policy = parse_policy(make_policy({"guardrail": {"maxGpusPerPod": 2}}))
    assert policy.spec.mode is None
    assert policy.effective_mode() is Mode.RECOMMEND
    assert policy.effective_mode(Mode.AUTOMATIC) is Mode.AUTOMATIC


@pytest.mark.parametrize(
    ("spec", "path"),
    [
        pytest.param({"mode": "Sometimes", "guardrail": {}}, "spec.mode", id="unknown-mode"),
        pytest.param({"sharing": {"strategy": "MIG"}, "guardrail": {}}, "spec", id="two-bodies"),
        pytest.param({}, "spec", id="no-body"),
        pytest.param({"sharing": {"strategy": "TimeSlicing", "replicas": 1}}, "spec.sharing.replicas",
                     id="replicas-below-2"),
        pytest.param({"sharing": {"strategy": "MIG", "gpuMemory": "8Gx"}}, "spec.sharing.gpuMemory",
                     id="bad-quantity"),
        pytest.param({"sharing": {"strategy": "Magic"}}, "spec.sharing.strategy", id="unknown-strategy"),
        pytest.param({"scaleToZero": {"namespaces": ["r"], "idleFor": "soon"}}, "spec.scaleToZero.idleFor",
                     id="bad-duration"),
        pytest.param({"scaleToZero": {"namespaces": []}}, "spec.scaleToZero.namespaces", id="no-namespaces"),
        pytest.param({"guardrail": {}, "approvals": ["llm"]}, "spec.approvals", id="bad-approval"),
        pytest.param({"guardrail": {"maxGpusPerPod": -1}}, "spec.guardrail.maxGpusPerPod", id="negative"),
        pytest.param({"guardrail": {}, "colour": "red"}, "spec.colour", id="unknown-field"),
        # what the API server's pod validation refuses in every pod the policy would inject it into
        pytest.param({"guardrail": {}, "tolerations": [{"key": "gpu", "effect": "NoSchedule",
                                                         "tolerationSeconds": 30}]},
                     "spec.tolerations.0", id="toleration-seconds-without-noexecute"),
        pytest.param({"guardrail": {}, "tolerations": [{"key": "x", "operator": "Exists", "value": "v"}]},
                     "spec.tolerations.0", id="exists-with-a-value"),
        pytest.param({"guardrail": {}, "tolerations": [{"operator": "Equal", "value": "v"}]},
                     "spec.tolerations.0", id="no-key-without-exists"),
        pytest.param({"guardrail": {}, "tolerations": [{"key": "not a/qualified/name", "operator": "Exists"}]},
                     "spec.tolerations.0", id="key-not-qualified"),
        pytest.param({"guardrail": {}, "tolerations": [{"key": "k", "value": "a b"}]},
                     "spec.tolerations.0", id="value-not-a-label-value"),
        pytest.param({"guardrail": {}, "schedulerName": "Kubeon_Scheduler"}, "spec.schedulerName",
                     id="scheduler-not-a-dns-subdomain"),
        # the CRD's patterns refuse these: a hub that took them could not sync them into the cluster
        pytest.param({"sharing": {"strategy": "MIG", "gpuMemory": "8Gi "}}, "spec.sharing.gpuMemory",
                     id="quantity-with-a-space"),
        pytest.param({"scaleToZero": {"namespaces": ["r"], "idleFor": " 30m"}}, "spec.scaleToZero.idleFor",
                     id="duration-with-a-space"),
        pytest.param({"scaleToZero": {"namespaces": ["r"], "wake": {"prometheusQuery": "up", "above": float("nan")}}},
                     "spec.scaleToZero.wake.above", id="nan"),  # JSON has neither: the hub serves specs as JSON
        pytest.param({"scaleToZero": {"namespaces": ["r"], "wake": {"prometheusQuery": "up", "above": float("inf")}}},
                     "spec.scaleToZero.wake.above", id="infinity"),
    ],
)
def test_mistakes_are_named_by_field_path(spec: dict[str, Any], path: str) -> None:
    expect_error_at(spec, path)


def test_two_bodies_message_names_both() -> None:
    message = expect_error_at({"sharing": {"strategy": "MIG"}, "guardrail": {}}, "spec")
    assert "sharing, guardrail" in message


@pytest.mark.parametrize(
    ("body", "kind"),
    [
        ({"sharing": {"strategy": "TimeSlicing", "replicas": 4}}, PolicyKind.SHARING),
        ({"scaleToZero": {"namespaces": ["research"], "wake": {"prometheusQuery": "up", "above": 0}}},
         PolicyKind.SCALE_TO_ZERO),
        ({"packing": {"strategy": "fgd"}}, PolicyKind.PACKING),
        ({"typeFit": {"allowedModels": ["NVIDIA-L4"]}}, PolicyKind.TYPE_FIT),
        ({"capacity": {"nodePool": "gpu", "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass",
                                                             "name": "gpu"},
                       "gpuModels": ["NVIDIA-L4"], "maxGpus": 64,
                       "consolidation": {"underusedBelowPercent": 10, "for": "2h", "maxDisruptedNodes": 1}}},
         PolicyKind.CAPACITY),
        ({"guardrail": {"allowedGpuResources": ["nvidia.com/gpu.shared"]}}, PolicyKind.GUARDRAIL),
    ],
)
def test_every_body_is_a_typed_section(body: dict[str, Any], kind: PolicyKind) -> None:
    assert parse_policy(make_policy(body)).spec.kind is kind


def test_an_invalid_policy_never_hides_the_valid_ones() -> None:
    valid, invalid = parse_valid_policies([
        make_policy({"guardrail": {"maxGpusPerPod": 2}}, name="good"),
        make_policy({"mode": "Sometimes", "guardrail": {}}, name="bad"),
        {"metadata": {}, "spec": {}},
    ])
    assert [p.name for p in valid] == ["good"]
    assert invalid[0][0] == "bad" and invalid[0][1].startswith("spec.mode: ")
    assert invalid[1][0] == "?"


def test_a_view_from_watch_cache_objects() -> None:
    from gpupolicy.cluster import view_from_objects

    view, invalid = view_from_objects(
        [make_policy({"guardrail": {}}, name="good"), make_policy({"colour": "red"}, name="bad")],
        [{"metadata": {"name": "ml", "labels": {"team": "ml"}}}],
        [{"metadata": {"name": "n1", "labels": {"nvidia.com/gpu.product": "NVIDIA-H200"}}}],
        default_mode=Mode.APPROVE, own_namespace="kubeon-gpu",
    )
    assert [p.name for p in view.policies] == ["good"] and [name for name, _ in invalid] == ["bad"]
    assert view.labels_of_namespace("ml") == {"team": "ml", "kubernetes.io/metadata.name": "ml"}
    assert [n.gpu_product for n in view.nodes] == ["NVIDIA-H200"]
    assert view.default_mode is Mode.APPROVE and view.is_protected("kubeon-gpu")


@pytest.mark.parametrize("toleration", [
    {"operator": "Exists"},
    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
    {"key": "team", "operator": "Equal", "value": "ml_research-1.a"},
    {"key": "dedicated", "value": ""},
])
def test_tolerations_pods_take_are_taken(toleration: dict[str, Any]) -> None:
    policy = parse_policy({"apiVersion": "gpu.kubeon.io/v1alpha1", "kind": "GpuPolicy", "metadata": {"name": "p"},
                           "spec": {"guardrail": {}, "tolerations": [toleration],
                                    "schedulerName": "kubeon-gpu-scheduler.v2"}})
    assert len(policy.spec.tolerations) == 1
