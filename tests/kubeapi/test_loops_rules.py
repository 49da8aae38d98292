"""The cluster loops' rules and the node fixtures, checked without a server.

Real: the fixture builders, the scheduler's fit/taint/affinity predicates, the
pod-template hash, the instance-type table, the openb node list on disk and
the GPU catalog. Faked: nothing; no server is started here (the loops'
behaviour through the API server is in the other test_loops_* modules).
"""

from __future__ import annotations

from decimal import Decimal

import pytest

from gpupolicy.catalog import DEFAULT_CATALOG
from tests.cluster.objects import (
    make_deployment,
    make_node,
    make_nodeclaim,
    make_pod,
    nodes_from_openb,
    nodes_from_yaml,
    required_node_affinity,
)
from tests.kubeapi.karpenter import INSTANCE_TYPES, drainable, node_for_claim, requested_instance_type
from tests.kubeapi.scheduler import (
    filter_node,
    node_free,
    pod_requests,
    summarise_failures,
    tolerates,
)
from tests.kubeapi.workloads import pod_template_hash, safe_encode, scale_down_order


def labels(node: dict) -> dict:
    return node["metadata"]["labels"]


# ---------------------------------------------------------------- fixtures

def test_whole_gpu_node_has_gfd_labels_and_resource() -> None:
    node = make_node("a100-0", "NVIDIA-A100-SXM4-80GB", 8)
    assert labels(node)["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"
    assert labels(node)["nvidia.com/gpu.count"] == "8"
    assert labels(node)["nvidia.com/gpu.memory"] == "81920"
    assert labels(node)["nvidia.com/mig.strategy"] == "mixed"  # the cluster's strategy, MIG mode on or off
    assert labels(node)["nvidia.com/mig.capable"] == "true"
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"


def test_mig_node_advertises_profiles_per_gpu_with_real_memory() -> None:
    node = make_node("h200-0", "NVIDIA-H200", 8, mig={"1g.18gb": 7})
    assert labels(node)["nvidia.com/mig.strategy"] == "mixed"
    assert labels(node)["nvidia.com/mig-1g.18gb.count"] == "56"
    assert labels(node)["nvidia.com/mig-1g.18gb.memory"] == str(16 * 1024)  # lgip: 16.00 GiB, not 18
    assert labels(node)["nvidia.com/mig-1g.18gb.product"] == "NVIDIA-H200-MIG-1g.18gb"
    assert node["status"]["allocatable"]["nvidia.com/mig-1g.18gb"] == "56"
    assert "nvidia.com/gpu" not in node["status"]["allocatable"]


def test_mixed_mig_layout_and_media_extension_resource_name() -> None:
    node = make_node("a100-0", "NVIDIA-A100-SXM4-80GB", 2, mig={"3g.40gb": 1, "2g.20gb": 1, "1g.10gb+me": 1})
    alloc = node["status"]["allocatable"]
    assert alloc["nvidia.com/mig-3g.40gb"] == "2"
    assert alloc["nvidia.com/mig-1g.10gb.me"] == "2"
    profile = DEFAULT_CATALOG.product("NVIDIA-A100-SXM4-80GB").profile("2g.20gb")  # type: ignore[union-attr]
    assert labels(node)["nvidia.com/mig-2g.20gb.memory"] == str(profile.memory_mib)


@pytest.mark.parametrize("mig, message", [
    ({"1g.10gb": 8}, "at most 7"),
    ({"9g.99gb": 1}, "no MIG profile"),
    ({"7g.80gb": 1, "1g.10gb": 1}, "memory slices"),
], ids=["too-many-instances", "unknown-profile", "over-the-gpu"])
def test_impossible_mig_layouts_are_refused(mig: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_node("x", "NVIDIA-A100-SXM4-80GB", 1, mig=mig)


def test_time_sliced_node_is_renamed_shared() -> None:
    node = make_node("t4-0", "Tesla-T4", 2, shared_replicas=4)
    assert node["status"]["allocatable"]["nvidia.com/gpu.shared"] == "8"
    assert labels(node)["nvidia.com/gpu.product"] == "Tesla-T4-SHARED"
    assert labels(node)["nvidia.com/gpu.replicas"] == "4"


def test_gpu_taint_names_each_advertised_resource() -> None:
    node = make_node("a", "NVIDIA-A100-SXM4-40GB", 1, mig={"1g.5gb": 7}, gpu_taint=True)
    assert node["spec"]["taints"] == [{"key": "nvidia.com/mig-1g.5gb", "effect": "NoSchedule"}]


def test_openb_subset_keeps_file_order_and_maps_models() -> None:
    nodes = nodes_from_openb(models=["T4"], limit=3)
    assert len(nodes) == 3
    assert all(labels(n)["nvidia.com/gpu.product"] == "Tesla-T4" for n in nodes)
    assert [n["metadata"]["name"] for n in nodes] == sorted(n["metadata"]["name"] for n in nodes)
    first = nodes_from_openb(limit=1)[0]
    assert first["metadata"]["name"] == "openb-node-0000"
    assert first["status"]["allocatable"] == {"cpu": "64000m", "memory": "262144Mi", "pods": "110",
                                              "nvidia.com/gpu": "2"}
    assert len(nodes_from_openb()) == 1213


def test_nodes_from_yaml_accepts_short_specs_and_full_nodes() -> None:
    text = """
- {name: a, product: NVIDIA-H100-80GB-HBM3, gpus: 4, mig: {1g.10gb: 7}}
- {name: b, product: null, cpu: "8"}
---
apiVersion: v1
kind: Node
metadata: {name: c}
"""
    nodes = nodes_from_yaml(text)
    assert [n["metadata"]["name"] for n in nodes] == ["a", "b", "c"]
    assert nodes[0]["status"]["allocatable"]["nvidia.com/mig-1g.10gb"] == "28"
    assert "nvidia.com/gpu.product" not in labels(nodes[1])


# ---------------------------------------------------------------- scheduler predicates

def test_pod_requests_sum_containers_and_take_the_larger_init() -> None:
    pod = make_pod("p", gpus=1, cpu="500m", memory="1Gi")
    pod["spec"]["containers"].append({"name": "side", "resources": {"requests": {"cpu": "250m"}}})
    pod["spec"]["initContainers"] = [{"name": "init", "resources": {"requests": {"cpu": "2"}}}]
    assert pod_requests(pod) == {"cpu": Decimal(2), "memory": Decimal(2**30), "nvidia.com/gpu": Decimal(1)}


def test_free_capacity_subtracts_bound_pods_and_a_pod_slot_each() -> None:
    node = make_node("n", "NVIDIA-A100-SXM4-80GB", 2, cpu="4", pods="3")
    free = node_free(node, [make_pod("a", gpus=1, cpu="1"), make_pod("b", gpus=1, cpu="1")])
    assert free["nvidia.com/gpu"] == 0
    assert free["cpu"] == 2
    assert free["pods"] == 1


@pytest.mark.parametrize("pod_args, node_args, expected", [
    ({"gpus": 1}, {}, None),
    ({"gpus": 9}, {}, "Insufficient nvidia.com/gpu"),
    ({"cpu": "200"}, {}, "Insufficient cpu"),
    ({"gpus": 1}, {"product": None}, "Insufficient nvidia.com/gpu"),
    ({"gpus": 1}, {"gpu_taint": True}, "node(s) had untolerated taint {nvidia.com/gpu}"),
    ({"gpus": 1, "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]},
     {"gpu_taint": True}, None),
    ({}, {"unschedulable": True}, "node(s) were unschedulable"),
    ({}, {"taints": [{"key": "k", "value": "v", "effect": "NoExecute"}]}, "node(s) had untolerated taint {k: v}"),
    ({}, {"taints": [{"key": "k", "effect": "PreferNoSchedule"}]}, None),
    ({"node_selector": {"pool": "a"}}, {"labels": {"pool": "b"}}, "node(s) didn't match Pod's node affinity/selector"),
    ({"node_selector": {"pool": "a"}}, {"labels": {"pool": "a"}}, None),
    ({"extra_resources": {"nvidia.com/mig-1g.10gb": "1"}}, {"mig": {"1g.10gb": 7}}, None),
    ({"extra_resources": {"nvidia.com/mig-2g.20gb": "1"}}, {"mig": {"1g.10gb": 7}},
     "Insufficient nvidia.com/mig-2g.20gb"),
], ids=["fits", "too-many-gpus", "too-much-cpu", "cpu-node", "gpu-taint", "gpu-taint-tolerated", "cordoned",
        "noexecute", "prefer-no-schedule-ignored", "selector-mismatch", "selector-match", "mig-fits",
        "mig-wrong-profile"])
def test_filter_node(pod_args: dict, node_args: dict, expected: str | None) -> None:
    node = make_node("n", **{"product": "NVIDIA-A100-SXM4-80GB", "gpus": 8, **node_args})
    assert filter_node(make_pod("p", **pod_args), node, []) == expected


@pytest.mark.parametrize("expression, matches", [
    ({"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-A100-SXM4-80GB"]}, True),
    ({"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-H200"]}, False),
    ({"key": "nvidia.com/gpu.product", "operator": "NotIn", "values": ["NVIDIA-H200"]}, True),
    ({"key": "nvidia.com/mig.capable", "operator": "Exists"}, True),
    ({"key": "absent", "operator": "Exists"}, False),
    ({"key": "absent", "operator": "DoesNotExist"}, True),
    ({"key": "nvidia.com/gpu.count", "operator": "Gt", "values": ["4"]}, True),
], ids=["in", "not-in-values", "notin", "exists", "missing", "does-not-exist", "gt"])
def test_required_node_affinity(expression: dict, matches: bool) -> None:
    pod = make_pod("p", affinity=required_node_affinity(expression))
    reason = filter_node(pod, make_node("n"), [])
    assert (reason is None) == matches


def test_affinity_terms_are_ored() -> None:
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
    ]}}}
    pod = make_pod("p", affinity=affinity)
    assert filter_node(pod, make_node("n", labels={"zone": "b"}), []) is None
    assert filter_node(pod, make_node("n", labels={"zone": "c"}), []) is not None


@pytest.mark.parametrize("toleration, taint, ok", [
    ({"operator": "Exists"}, {"key": "any", "effect": "NoSchedule"}, True),
    ({"key": "k", "operator": "Equal", "value": "v"}, {"key": "k", "value": "v", "effect": "NoSchedule"}, True),
    ({"key": "k", "value": "w"}, {"key": "k", "value": "v", "effect": "NoSchedule"}, False),
    ({"key": "k", "operator": "Exists", "effect": "NoExecute"}, {"key": "k", "effect": "NoSchedule"}, False),
], ids=["wildcard", "equal", "other-value", "other-effect"])
def test_tolerations(toleration: dict, taint: dict, ok: bool) -> None:
    assert tolerates([toleration], taint) is ok


def test_failure_summary_reads_like_kube_scheduler() -> None:
    message = summarise_failures(3, {"a": "Insufficient cpu", "b": "Insufficient cpu", "c": "x"})
    assert message == "0/3 nodes are available: 2 Insufficient cpu, 1 x."


# ---------------------------------------------------------------- workloads

def test_template_hash_is_stable_and_changes_with_the_template() -> None:
    template = make_deployment("d", gpus=1)["spec"]["template"]
    again = make_deployment("d", gpus=1)["spec"]["template"]
    other = make_deployment("d", gpus=2)["spec"]["template"]
    assert pod_template_hash(template) == pod_template_hash(again)
    assert pod_template_hash(template) != pod_template_hash(other)
    assert pod_template_hash(template) != pod_template_hash(template, collision_count=1)
    assert set(pod_template_hash(template)) <= set("bcdfghjklmnpqrstvwxz2456789")
    assert safe_encode(0) == "b"


def test_scale_down_prefers_unscheduled_then_not_ready_then_newest() -> None:
    def pod(name: str, created: str, node: str | None, ready: bool) -> dict:
        p = make_pod(name)
        p["metadata"]["creationTimestamp"] = created
        if node:
            p["spec"]["nodeName"] = node
        p["status"] = {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
        return p
    pods = [pod("old-ready", "2026-01-01T00:00:00Z", "n", True), pod("new-ready", "2026-01-02T00:00:00Z", "n", True),
            pod("pending", "2025-01-01T00:00:00Z", None, False), pod("starting", "2025-01-01T00:00:00Z", "n", False)]
    order = [p["metadata"]["name"] for p in sorted(pods, key=scale_down_order)]
    assert order == ["pending", "starting", "new-ready", "old-ready"]


# ---------------------------------------------------------------- karpenter

def test_instance_types_carry_gpus_the_catalog_knows() -> None:
    for instance in INSTANCE_TYPES.values():
        if instance.product:
            assert DEFAULT_CATALOG.product(instance.product) is not None, instance.name
    assert INSTANCE_TYPES["p4d.24xlarge"].gpus == 8
    assert INSTANCE_TYPES["p5.48xlarge"].product == "NVIDIA-H100-80GB-HBM3"


def test_node_for_claim_has_karpenter_and_gfd_labels() -> None:
    claim = make_nodeclaim("gpu-abc", "g5.xlarge", nodepool="inference",
                           taints=[{"key": "nvidia.com/gpu", "effect": "NoSchedule"}])
    claim["metadata"]["uid"] = "u-1"
    assert requested_instance_type(claim) == "g5.xlarge"
    node = node_for_claim(claim, INSTANCE_TYPES["g5.xlarge"])
    assert labels(node)["karpenter.sh/nodepool"] == "inference"
    assert labels(node)["node.kubernetes.io/instance-type"] == "g5.xlarge"
    assert labels(node)["nvidia.com/gpu.product"] == "NVIDIA-A10G"
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "1"
    assert node["spec"]["taints"] == [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]
    assert node["spec"]["providerID"].startswith("aws:///us-east-1a/i-")
    assert node["metadata"]["ownerReferences"][0]["kind"] == "NodeClaim"


def test_drain_skips_daemonset_and_mirror_pods() -> None:
    plain = make_pod("p")
    daemon = make_pod("d")
    daemon["metadata"]["ownerReferences"] = [{"kind": "DaemonSet", "name": "x", "uid": "1"}]
    mirror = make_pod("m", annotations={"kubernetes.io/config.mirror": "abc"})
    assert [drainable(p) for p in (plain, daemon, mirror)] == [True, False, False]
