"""Time-slicing through DRA at admission: which shared claim a share names, and what the claim holds.

Real: gpupolicy.admission.mutate_pod and sharedclaims with the real catalog and the policy model; patches
applied with the independent `jsonpatch` library. Faked: nothing (pods, policies and the view's counts of
pods per claim in memory; kube/shares.py and tests/e2e/test_dra.py count them from a real watch).
"""

from __future__ import annotations

import pytest

from gpupolicy.admission.mutate import Action, mutate_pod
from gpupolicy.admission.sharedclaims import MAX_CLAIM_CONSUMERS, is_shared_claim_of, pick_shared_claim, shared_claim
from gpupolicy.catalog import DEFAULT_CATALOG
from gpupolicy.cluster import ClusterView
from gpupolicy.dra import shared_claim_name
from gpupolicy.model import SharingSpec
from tests.core.builders import apply, make_pod, make_policy, make_view

H200 = "NVIDIA-H200"


@pytest.mark.parametrize(("held", "expected"), [
    ({}, "kubeon-ts-llm-0"),
    ({"kubeon-ts-llm-0": 2}, "kubeon-ts-llm-0"),
    ({"kubeon-ts-llm-0": 3}, "kubeon-ts-llm-1"),
    ({"kubeon-ts-llm-0": 3, "kubeon-ts-llm-1": 3}, "kubeon-ts-llm-2"),
    ({"kubeon-ts-llm-0": 3, "kubeon-ts-llm-1": 0, "kubeon-ts-llm-2": 3}, "kubeon-ts-llm-1"),
    ({"kubeon-ts-other-0": 3}, "kubeon-ts-llm-0"),
], ids=["none-yet", "room-left", "full-then-next", "all-full-new-deterministic", "gap-reused", "other-policy"])
def test_a_share_names_the_lowest_claim_with_room(held: dict[str, int], expected: str) -> None:
    assert pick_shared_claim("llm", 3, held) == expected


def test_a_claim_never_takes_more_pods_than_its_reservation_limit() -> None:
    assert pick_shared_claim("llm", 1000, {"kubeon-ts-llm-0": MAX_CLAIM_CONSUMERS}) == "kubeon-ts-llm-1"


def test_long_policy_names_keep_the_index_and_fit_a_claim_name() -> None:
    name = shared_claim_name("p" * 253, 12)
    assert len(name) == 253 and name.endswith("-12")


@pytest.mark.parametrize(("models", "selector"), [
    ([], None),
    ([H200], "device.attributes['gpu.nvidia.com'].productName.replace(' ', '-') in "
             "['NVIDIA-H200', 'NVIDIA-H200-141GB-HBM3e']"),
], ids=["any-gpu", "gpu-models"])
def test_the_claim_is_one_whole_gpu_ours_and_owned_by_the_policy(models: list[str], selector: str | None) -> None:
    sharing = SharingSpec.model_validate({"strategy": "TimeSlicing", "replicas": 3, "gpuModels": models})
    claim = shared_claim("kubeon-ts-llm-0", "team", sharing, DEFAULT_CATALOG, "llm", "uid-1")
    assert claim["kind"] == "ResourceClaim" and claim["metadata"]["namespace"] == "team"
    assert claim["metadata"]["labels"] == {"gpu.kubeon.io/managed-by": "kubeon-gpu-optimizer",
                                           "gpu.kubeon.io/policy": "llm"}
    assert claim["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    request = claim["spec"]["devices"]["requests"][0]["exactly"]
    assert request["deviceClassName"] == "gpu.nvidia.com" and request["count"] == 1
    assert [s["cel"]["expression"] for s in request.get("selectors", [])] == ([selector] if selector else [])
    assert "config" not in claim["spec"]["devices"]  # no TimeSlicing GpuConfig: the driver's gate is alpha, off


def ts_view(mode: str = "Automatic", held: dict[tuple[str, str], int] | None = None) -> ClusterView:
    policy = make_policy("llm", mode=mode, sharing={"strategy": "TimeSlicing", "replicas": 2, "via": "DRA"})
    view = make_view(policy)
    return ClusterView(**{**view.__dict__, "shared_claim_pods": held or {}})


def test_an_unchanged_pod_names_the_shared_claim_and_keeps_no_gpu_request() -> None:
    pod = make_pod(1)
    result = mutate_pod(pod, ts_view(held={("ml", "kubeon-ts-llm-0"): 1, ("other", "kubeon-ts-llm-1"): 5}))
    after = apply(pod, result.patch)
    assert after == result.object
    assert after["spec"]["resourceClaims"] == [{"name": "kubeon-claim-0", "resourceClaimName": "kubeon-ts-llm-0"}]
    container = after["spec"]["containers"][0]
    assert container["resources"]["claims"] == [{"name": "kubeon-claim-0"}]
    assert "nvidia.com/gpu" not in container["resources"]["limits"]
    assert after["metadata"]["labels"]["gpu.kubeon.io/shared-claim"] == "kubeon-ts-llm-0"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in after["spec"]["tolerations"]
    assert [(d.policy, d.action, d.applied) for d in result.decisions][:1] == [("llm", Action.USE_CLAIM, True)]
    assert mutate_pod(after, ts_view()).patch == [], "mutation must be idempotent (a reinvocation)"


def test_a_full_claim_sends_the_pod_to_the_next() -> None:
    result = mutate_pod(make_pod(1), ts_view(held={("ml", "kubeon-ts-llm-0"): 2}))
    assert result.object["spec"]["resourceClaims"][0]["resourceClaimName"] == "kubeon-ts-llm-1"


@pytest.mark.parametrize(("pod", "warning"), [
    (make_pod(2), "a time-sliced share is one GPU for one container (c0: 2)"),
    (make_pod(1, containers=2), "a time-sliced share is one GPU for one container (c0: 1, c1: 1)"),
    (make_pod(0.5), "a time-sliced share is one GPU for one container (c0: 0.5)"),
], ids=["two-gpus", "two-containers", "fraction"])
def test_more_than_one_share_is_left_alone_with_the_reason(pod: dict, warning: str) -> None:
    result = mutate_pod(pod, ts_view())
    assert result.patch == [] and result.warnings == [f"kubeon-gpu llm: pod left unchanged: {warning}"]


def test_a_pod_with_its_own_claims_is_left_alone() -> None:
    pod = make_pod(1)
    pod["spec"]["resourceClaims"] = [{"name": "mine", "resourceClaimName": "someone-elses"}]
    result = mutate_pod(pod, ts_view())
    assert result.patch == []
    assert result.warnings == ["kubeon-gpu llm: pod left unchanged: the pod has its own spec.resourceClaims"]


def test_recommend_names_the_claim_and_writes_nothing() -> None:
    result = mutate_pod(make_pod(1), ts_view("Recommend"))
    assert result.patch == []
    assert result.warnings == ["kubeon-gpu llm (Recommend): would use ResourceClaim kubeon-ts-llm-0"]


@pytest.mark.parametrize(("name", "ours"), [
    ("kubeon-ts-llm-0", True), ("kubeon-ts-llm-12", True), ("kubeon-ts-llm-x", False), ("kubeon-ts-llm", False),
    ("kubeon-ts-llm-1-0", False), ("kubeon-ts-llmx-0", False), ("kubeon-ts-llm-01", False),
])
def test_the_controller_creates_only_names_the_policy_produces(name: str, ours: bool) -> None:
    assert is_shared_claim_of("llm", name) is ours
