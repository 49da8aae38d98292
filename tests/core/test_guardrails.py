"""Pod guardrails (maxGpusPerPod, allowedGpuResources) in each mode: real gpupolicy.admission.mutate.validate_pod."""

from __future__ import annotations

import pytest

from gpupolicy.admission.mutate import WARNING_LIMIT, Action, validate_pod
from tests.core.builders import make_pod, make_policy, make_view

GUARD = {"maxGpusPerPod": 2, "allowedGpuResources": ["nvidia.com/gpu", "nvidia.com/mig-1g.10gb"]}


@pytest.mark.parametrize(
    ("pod", "violation"),
    [
        (make_pod(gpus=2), ""),
        (make_pod(gpus=3), "more than maxGpusPerPod 2"),
        (make_pod(gpus=2, containers=2), "asks for 4 GPUs"),
        (make_pod(gpus=1, init_gpus=3), "asks for 3 GPUs"),
        (make_pod(resource="nvidia.com/mig-1g.10gb"), ""),
        (make_pod(resource="nvidia.com/mig-3g.40gb"), "nvidia.com/mig-3g.40gb is not in allowedGpuResources"),
        (make_pod(resource="nvidia.com/gpu.shared"), "nvidia.com/gpu.shared is not in allowedGpuResources"),
    ],
    ids=["at-limit", "over-limit", "sum-of-containers", "init-container-peak", "allowed-mig",
         "other-mig", "shared-not-allowed"],
)
def test_automatic_guardrail_denies_violations(pod, violation) -> None:
    result = validate_pod(pod, make_view(make_policy("guard", guardrail=GUARD)))
    if violation:
        assert not result.allowed and violation in result.message and "guard" in result.message
        assert result.decisions[0].action == Action.DENY
    else:
        assert result.allowed and result.warnings == []


def test_recommend_guardrail_only_warns() -> None:
    result = validate_pod(make_pod(gpus=4), make_view(make_policy("guard", mode="Recommend", guardrail=GUARD)))
    assert result.allowed
    assert result.warnings == ["kubeon-gpu guard: pod asks for 4 GPUs, more than maxGpusPerPod 2"]
    assert result.decisions[0].action == Action.WARN


@pytest.mark.parametrize("length", [WARNING_LIMIT - 1, WARNING_LIMIT, WARNING_LIMIT + 1])
def test_warnings_are_kept_under_the_header_limit(length: int) -> None:
    """Warnings travel in HTTP headers to kubectl, kept under WARNING_LIMIT (120) characters: one of 119 is shown
    whole, one of exactly 120 or more is cut to 119 ending in an ellipsis (the policy name sets the length)."""
    tail = ": pod asks for 4 GPUs, more than maxGpusPerPod 2"
    name = "g" * (length - len("kubeon-gpu ") - len(tail))
    text = f"kubeon-gpu {name}{tail}"
    assert len(text) == length
    result = validate_pod(make_pod(gpus=4), make_view(make_policy(name, mode="Recommend", guardrail=GUARD)))
    if length < WARNING_LIMIT:
        assert result.warnings == [text]
    else:
        assert result.warnings == [text[: WARNING_LIMIT - 2] + "…"]
        assert len(result.warnings[0]) == WARNING_LIMIT - 1


def test_guardrail_ignores_protected_and_skipped_pods() -> None:
    view = make_view(make_policy("guard", guardrail={"maxGpusPerPod": 0}))
    assert validate_pod(make_pod(namespace="kube-system"), view).allowed
    assert validate_pod(make_pod(labels={"gpu.kubeon.io/skip": "true"}), view).allowed
    assert not validate_pod(make_pod(), view).allowed


def _with_init(pod: dict, *init: tuple[int, bool]) -> dict:
    """`pod` with init containers (GPUs, native sidecar: restartPolicy Always) in order."""
    pod["spec"]["initContainers"] = [
        {"name": f"init{i}", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
         **({"restartPolicy": "Always"} if sidecar else {})} for i, (gpus, sidecar) in enumerate(init)]
    return pod


@pytest.mark.parametrize(("pod", "held"), [
    (_with_init(make_pod(gpus=2), (2, True)), 4),  # a sidecar runs beside the containers: 2 + 2
    (_with_init(make_pod(gpus=1), (1, True), (2, False)), 3),  # the init container after a sidecar: 1 + 2
    (_with_init(make_pod(gpus=1), (2, False), (1, True)), 2),  # a plain init container first: its 2 alone
    (_with_init(make_pod(gpus=2), (1, False)), 2),  # a plain init container ends before the containers
], ids=["sidecar-beside-containers", "init-after-sidecar", "init-before-sidecar", "plain-init"])
def test_native_sidecars_count_with_the_containers(pod: dict, held: int) -> None:
    """Upstream counts a pod's requests this way (component-helpers PodRequests): a sidecar holds its GPUs for
    the pod's life. A 2-GPU sidecar beside 2 GPUs of containers passed maxGpusPerPod 2."""
    result = validate_pod(pod, make_view(make_policy("guard", guardrail={"maxGpusPerPod": 2})))
    if held > 2:
        assert not result.allowed and f"pod asks for {held} GPUs, more than maxGpusPerPod 2" in result.message
    else:
        assert result.allowed, result.message
