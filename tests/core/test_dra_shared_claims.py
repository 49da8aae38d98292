"""Time-slicing through DRA, the pure part: which shared claim a share names, and what the claim holds.

Real: gpupolicy.admission.sharedclaims with the real catalog and the policy model. Faked: nothing (counts
in memory). Not wired yet: the model still refuses `TimeSlicing` with `via: DRA` (test_dra_claims covers it).
"""

from __future__ import annotations

import pytest

from gpupolicy.admission.sharedclaims import MAX_CLAIM_CONSUMERS, pick_shared_claim, shared_claim
from gpupolicy.catalog import DEFAULT_CATALOG
from gpupolicy.dra import shared_claim_name
from gpupolicy.model import SharingSpec

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
