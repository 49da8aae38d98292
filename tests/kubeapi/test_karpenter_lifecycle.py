"""The Karpenter stand-in's NodeClaim lifecycle and NodePool accounting, as upstream does them.

Upstream (kubernetes-sigs/karpenter at the vendored commit 2266468): Launched when the cloud created the
instance (pkg/controllers/nodeclaim/lifecycle/launch.go), Registered when its Node joined
(registration.go), Initialized once the Node is Ready, without startup taints and with every extended
resource the claim requests registered non-zero (initialization.go); a NodePool's status.resources and
status.nodes sum the claims not being deleted (nodepool/counter/controller.go, state/cluster.go
updateNodePoolResources); limits are checked only by the provisioner before it creates a claim
(provisioning/provisioner.go Create), never at launch. Real: the test API server with the vendored CRDs.
Faked: the cloud (the instance table) and the launch delay's clock.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.kubeapi.cluster import Cluster
from tests.cluster.objects import make_nodeclaim, make_nodepool
from tests.kubeapi.karpenter import GROUP, NODECLAIMS, NODEPOOLS, VERSION, pool_resources
from tests.kubeapi.scheduler import MERGE_PATCH, read_items


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    with Cluster(background=False) as running:
        assert running.karpenter is not None
        running.karpenter.launch_delay = 0.0
        yield running


def items(cluster: Cluster, plural: str) -> dict[str, dict[str, Any]]:
    found = read_items(cluster.custom.list_cluster_custom_object(GROUP, VERSION, plural, _preload_content=False))
    return {o["metadata"]["name"]: o for o in found}


def conditions(claim: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in claim["status"]["conditions"]}


def test_a_claim_is_initialized_only_once_the_extended_resources_it_requests_are_registered(
        cluster: Cluster) -> None:
    claim = make_nodeclaim("mig-1", "p4de.24xlarge")
    claim["spec"]["resources"] = {"requests": {"nvidia.com/mig-1g.10gb": "7"}}
    cluster.create(claim)
    cluster.settle()
    seen = items(cluster, NODECLAIMS)["mig-1"]
    assert conditions(seen)["Launched"][0] == "True" and conditions(seen)["Registered"][0] == "True"
    assert conditions(seen)["Initialized"] == ("Unknown", "ResourceNotRegistered")
    assert conditions(seen)["Ready"][0] == "Unknown"
    node = cluster.core.read_node("mig-1")
    assert "karpenter.sh/initialized" not in (node.metadata.labels or {})
    cluster.core.patch_node_status("mig-1", {"status": {"allocatable": {"nvidia.com/mig-1g.10gb": "56"},
                                                        "capacity": {"nvidia.com/mig-1g.10gb": "56"}}},
                                   _content_type=MERGE_PATCH)  # the device plugin registers the slices
    cluster.settle()
    seen = items(cluster, NODECLAIMS)["mig-1"]
    assert {t: s for t, (s, _) in conditions(seen).items()} == {
        "Launched": "True", "Registered": "True", "Initialized": "True", "Ready": "True"}
    assert cluster.core.read_node("mig-1").metadata.labels["karpenter.sh/initialized"] == "true"


def test_nodepool_status_counts_its_claims_and_a_claim_over_the_limits_still_launches(cluster: Cluster) -> None:
    pool = make_nodepool("gpu", instance_types=["p4d.24xlarge"])
    pool["spec"]["limits"] = {"nvidia.com/gpu": "8"}
    cluster.create(pool)
    for name in ("a", "b"):
        cluster.create(make_nodeclaim(name, "p4d.24xlarge", nodepool="gpu"))
    cluster.settle()
    claims = items(cluster, NODECLAIMS)
    assert all(conditions(c)["Ready"][0] == "True" for c in claims.values())  # 16 GPUs over a limit of 8
    status = items(cluster, NODEPOOLS)["gpu"]["status"]
    assert status["nodes"] == 2
    assert (status["resources"]["nvidia.com/gpu"], status["resources"]["nodes"]) == ("16", "2")
    cluster.custom.delete_cluster_custom_object(GROUP, VERSION, NODECLAIMS, "b", _preload_content=False)
    cluster.settle()
    status = items(cluster, NODEPOOLS)["gpu"]["status"]
    assert (status["resources"]["nvidia.com/gpu"], status["nodes"]) == ("8", 1)


def test_pool_resources_follow_upstreams_state_rules() -> None:
    launched = {"metadata": {"name": "a"}, "status": {"capacity": {"cpu": "4", "nvidia.com/gpu": "1"}}}
    waiting = {"metadata": {"name": "b"}, "status": {}}  # not launched: no capacity, not even a node
    going = {"metadata": {"name": "c", "deletionTimestamp": "2026-01-01T00:00:00Z"},
             "status": {"capacity": {"nvidia.com/gpu": "8"}}}  # marked for deletion: not counted
    totals = pool_resources([launched, waiting, going], {})
    assert totals == {"cpu": "4", "ephemeral-storage": "0", "memory": "0", "nodes": "1", "nvidia.com/gpu": "1",
                      "pods": "0"}
