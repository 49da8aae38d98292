"""GpuPolicy validation messages name the field path: real model + gpupolicy.admission.validation, real catalog."""

from __future__ import annotations

import pytest

from gpupolicy.admission.validation import check_policy, kind_label_patch
from gpupolicy.catalog import DEFAULT_CATALOG


def policy(spec: dict) -> dict:
    return {"apiVersion": "gpu.kubeon.io/v1alpha1", "kind": "GpuPolicy", "metadata": {"name": "p"}, "spec": spec}


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"mode": "Sometimes", "sharing": {"strategy": "MIG"}}, "spec.mode: Input should be"),
        ({"sharing": {"strategy": "MIG"}, "guardrail": {}}, "spec: exactly one of"),
        ({}, "spec: exactly one of"),
        ({"sharing": {"strategy": "MIG", "migProfile": "1g.18gb", "gpuModels": ["NVIDIA-A100-SXM4-80GB"]}},
         "spec.sharing.migProfile: '1g.18gb' is not a MIG profile of gpuModels NVIDIA-A100-SXM4-80GB"),
        ({"sharing": {"strategy": "MIG", "migProfile": "9g.1gb"}}, "spec.sharing.migProfile: unknown MIG"),
        ({"sharing": {"strategy": "MIG", "gpuModels": ["NVIDIA-Z9000"]}}, "spec.sharing.gpuModels[0]: unknown"),
        ({"sharing": {"strategy": "TimeSlicing", "replicas": 1}}, "spec.sharing.replicas: replicas must be"),
        ({"sharing": {"strategy": "MIG", "gpuMemory": "8 gigs"}}, "spec.sharing.gpuMemory: '8 gigs' is not"),
        ({"sharing": {"strategy": "MIG", "gpuMemory": "-8Gi"}}, "spec.sharing.gpuMemory:"),
        ({"sharing": {"strategy": "MIG", "window": "a week"}}, "spec.sharing.window:"),
        ({"sharing": {"strategy": "Magic"}}, "spec.sharing.strategy:"),
        ({"sharing": {"strategy": "MIG", "colour": "red"}}, "spec.sharing.colour: unknown field"),
        ({"approvals": ["llm"], "sharing": {"strategy": "MIG"}}, "spec.approvals:"),
        ({"guardrail": {"maxGpusPerPod": -1}}, "spec.guardrail.maxGpusPerPod:"),
        ({"selector": {"podSelector": {"matchExpressions": [{"key": "a", "operator": "Near"}]}},
          "guardrail": {}}, "spec.selector.podSelector.matchExpressions[0].operator:"),
    ],
    ids=["unknown-mode", "two-bodies", "no-body", "profile-not-on-listed-model", "unknown-profile",
         "unknown-model", "replicas-1", "bad-quantity", "negative-quantity", "bad-duration", "bad-strategy",
         "unknown-field", "bad-approval", "negative-max", "bad-operator"],
)
def test_invalid_policy_messages_name_the_field(spec: dict, expected: str) -> None:
    _, errors = check_policy(policy(spec), DEFAULT_CATALOG)
    assert errors, "expected the policy to be refused"
    assert any(e.startswith(expected) for e in errors), errors


@pytest.mark.parametrize(
    "spec",
    [
        {"sharing": {"strategy": "MIG", "migProfile": "1g.18gb", "gpuModels": ["NVIDIA-H200"]}},
        {"sharing": {"strategy": "MIG", "migProfile": "1g.10gb+me"}},
        {"sharing": {"strategy": "TimeSlicing", "replicas": 4}},
        {"guardrail": {"maxGpusPerPod": 2}},
        {"scaleToZero": {"namespaces": ["ml"], "idleFor": "45m"}},
    ],
    ids=["h200-profile", "media-profile", "timeslicing", "guardrail", "scale-to-zero"],
)
def test_valid_policies_pass(spec: dict) -> None:
    parsed, errors = check_policy(policy(spec), DEFAULT_CATALOG)
    assert errors == [] and parsed is not None


def test_non_object_refused() -> None:
    assert check_policy("nope", DEFAULT_CATALOG)[1] == ["(root): a GpuPolicy must be an object"]


def test_kind_label_patch_sets_label_once() -> None:
    import jsonpatch

    obj = policy({"guardrail": {}})
    patch = kind_label_patch(obj)
    labelled = jsonpatch.apply_patch(obj, patch)
    assert labelled["metadata"]["labels"] == {"gpu.kubeon.io/kind": "guardrail"}
    assert kind_label_patch(labelled) == []


@pytest.mark.parametrize("name", ["random", "fgd-exact", "binpack"])
def test_a_policy_chooses_only_a_product_packing_strategy_never_an_experiment(name: str) -> None:
    _, errors = check_policy(policy({"packing": {"strategy": name}}), DEFAULT_CATALOG)
    assert any(e.startswith("spec.packing.strategy: Input should be 'default', 'kubeon'") for e in errors), errors


def test_the_policy_strategies_are_the_engines_less_its_experiments() -> None:
    from gpupolicy.model import POLICY_STRATEGIES
    from gpupolicy.packing.engine import STRATEGIES

    assert set(POLICY_STRATEGIES) == {"default"} | set(STRATEGIES) - {"fgd-exact", "random"}
    for name in POLICY_STRATEGIES:
        _, errors = check_policy(policy({"packing": {"strategy": name}}), DEFAULT_CATALOG)
        assert errors == [], (name, errors)
