"""The controller side's pure parts: the drain steps, the NodePool/NodeClaim shapes, shared-GPU demand, modes.

Real: the functions themselves, and for the NodePool and NodeClaim bodies a real kube-apiserver with
Karpenter v1.9.0's own CRDs (tests/cluster, `karpenter=True`): a server-side dry-run create with strict
field validation, so an unknown field is refused (400) where a plain create would silently prune it, and
the CRDs' schema and CEL rules answer 422. Nothing is faked.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from controller.capacity.usage import covered, node_usage_query
from gpupolicy.capacity import drain
from gpupolicy.capacity.demand import boot_labels, launch_demand
from gpupolicy.capacity.instances import load_instances
from gpupolicy.capacity.nodepool import allowed_types, claim_name, desired_nodeclaim, desired_nodepool
from gpupolicy.model import CapacitySpec, Mode, PolicyKind, parse_policy
from gpupolicy.modes import disruption_mode, handling
from kube.karpenter import contains
from tests.cluster.cluster import Cluster

ROOT = Path(__file__).resolve().parents[2]
CATALOG = ROOT / "gpupolicy" / "capacity" / "data" / "aws-gpu-instances.csv"
SPEC = CapacitySpec.model_validate({
    "nodePool": "gpu", "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "gpu"},
    "gpuModels": ["NVIDIA-L4", "NVIDIA-A10G", "NVIDIA-A100-SXM4-80GB"], "maxGpus": 64,
    "consolidation": {"underusedBelowPercent": 10, "for": "2h", "maxDisruptedNodes": 1}})


# Karpenter's CRDs on a real API server (the cluster starts only for the tests that ask for it).
CLUSTER = {"karpenter": True, "gpu_operator": False}


def karpenter_accepts(cluster: Cluster, obj: dict[str, Any], plural: str) -> dict[str, Any]:
    """The object as the API server would store it: a dry-run create with strict field validation, so a
    field Karpenter's CRD does not have fails (400) instead of being pruned; schema and CEL errors are 422."""
    return dict(cluster.custom.create_cluster_custom_object("karpenter.sh", "v1", plural, obj, dry_run="All",
                                                            field_validation="Strict"))


def refusal(cluster: Cluster, obj: dict[str, Any], plural: str) -> tuple[int, str]:
    with pytest.raises(ApiException) as refused:
        karpenter_accepts(cluster, obj, plural)
    return refused.value.status, str(refused.value.body)


def products() -> dict[str, str]:
    return {t.name: t.model for t in load_instances(CATALOG)}


# -- NodePool and NodeClaim ------------------------------------------------------------------
def test_the_nodepool_is_the_declared_shape_and_valid_for_karpenter(kube_cluster: Cluster) -> None:
    pool = desired_nodepool("p", SPEC, products())
    stored = karpenter_accepts(kube_cluster, pool, "nodepools")
    assert contains(stored, pool)  # every field we sent stored as sent (defaults such as expireAfter added)
    template = pool["spec"]["template"]["spec"]
    assert template["requirements"][0]["values"] == ["g5.12xlarge", "g5.xlarge", "g6.xlarge", "p4de.24xlarge"]
    assert template["taints"] == [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]
    assert pool["spec"]["limits"] == {"nvidia.com/gpu": "64"}
    assert pool["spec"]["disruption"] == {"consolidationPolicy": "WhenEmpty", "consolidateAfter": "Never",
                                          "budgets": [{"nodes": "1"}]}
    assert "limits" not in desired_nodepool("p", SPEC.model_copy(update={"max_gpus": None}), products())["spec"]


def test_karpenters_crds_on_the_api_server_refuse_an_unknown_field_and_a_bad_budget(kube_cluster: Cluster) -> None:
    """What the check above stands on: a field the NodePool does not have is refused, not pruned (strict
    field validation), and a budget that is not a count or a percentage fails the CRD's pattern."""
    pool = desired_nodepool("p", SPEC, products())
    pool["spec"]["template"]["spec"]["gpuTaints"] = []  # not a NodePool field
    status, body = refusal(kube_cluster, pool, "nodepools")
    assert status == 400 and 'unknown field \\"spec.template.spec.gpuTaints\\"' in body, body
    pool = desired_nodepool("p", SPEC, products())
    pool["spec"]["disruption"]["budgets"] = [{"nodes": "ten"}]
    status, body = refusal(kube_cluster, pool, "nodepools")
    assert status == 422 and "spec.disruption.budgets[0].nodes" in body and "should match" in body, body


def test_no_gpu_model_of_the_catalog_is_a_clear_error() -> None:
    spec = SPEC.model_copy(update={"gpu_models": ["NVIDIA-B200"]})
    assert allowed_types(spec, products()) == []
    with pytest.raises(ValueError, match=r"no instance type of the catalog has a GPU in gpuModels \['NVIDIA-B200'\]"):
        desired_nodepool("p", spec, products())


def test_a_nodeclaim_is_valid_named_stably_and_boots_the_layout(kube_cluster: Cluster) -> None:
    pods = [f"ml/p{i}" for i in range(30)]
    name = claim_name("gpu", "p4de.24xlarge", pods, 0)
    assert name == claim_name("gpu", "p4de.24xlarge", list(reversed(pods)), 0) != claim_name("gpu", "p4de.24xlarge",
                                                                                             pods, 1)
    claim = desired_nodeclaim(name, "p", SPEC, "p4de.24xlarge", boot_labels("nvidia.com/mig-1g.10gb", "all-1g.10gb"),
                              pods)
    stored = karpenter_accepts(kube_cluster, claim, "nodeclaims")
    assert contains(stored, claim)  # every field we sent stored as sent
    assert claim["metadata"]["labels"]["nvidia.com/mig.config"] == "all-1g.10gb"
    assert claim["metadata"]["labels"]["karpenter.sh/nodepool"] == "gpu"
    assert claim["metadata"]["annotations"]["gpu.kubeon.io/launched-for"].endswith(",+10")


def test_a_bad_nodepool_name_is_refused_with_the_field() -> None:
    with pytest.raises(ValueError, match="is not a NodePool name"):
        parse_policy({"metadata": {"name": "x"}, "spec": {"capacity": {
            "nodePool": "GPU_pool", "nodeClassRef": {"group": "g", "kind": "k", "name": "n"}}}})


# -- demand ------------------------------------------------------------------------------------
def pod(resource: str, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "a", "namespace": "ml"},
            "spec": {"containers": [{"name": "m", "resources": {"limits": {resource: "1"},
                                                                "requests": {"cpu": "2", "memory": "4Gi"}}}],
                     **spec}}


def sharing(strategy: str, **extra: Any) -> Any:
    return parse_policy({"metadata": {"name": "s"}, "spec": {"sharing": {"strategy": strategy, **extra}}})


def test_a_time_sliced_share_is_one_replica_of_a_gpu() -> None:
    found = launch_demand(pod("nvidia.com/gpu.shared"), "nvidia.com/gpu.shared",
                          sharing("TimeSlicing", replicas=4, gpuModels=["NVIDIA-L4", "NVIDIA-H200"]), ["NVIDIA-L4"])
    assert found is not None and found.layout is None
    d = found.demand
    assert (d.num_gpu, d.gpu_milli, d.cpu_milli, d.memory_mib, d.allowed_models) == (1, 250, 2000, 4096,
                                                                                      frozenset({"NVIDIA-L4"}))


def test_a_mig_slice_is_one_instance_of_its_all_profile_layout_on_the_products_having_it() -> None:
    found = launch_demand(pod("nvidia.com/mig-1g.10gb"), "nvidia.com/mig-1g.10gb", sharing("MIG"), [])
    assert found is not None and found.layout == "all-1g.10gb"
    assert found.by_product["NVIDIA-A100-SXM4-80GB"].gpu_milli == 142  # seven 1g.10gb per A100-80GB (7 x 142 <= 1000)
    assert found.by_product["NVIDIA-A100-SXM4-40GB"].gpu_milli == 250  # four on an A100-40GB
    assert found.demand.gpu_milli == 250 and "NVIDIA-L4" not in found.by_product
    narrowed = launch_demand(pod("nvidia.com/mig-1g.10gb", nodeSelector={"nvidia.com/gpu.product": "NVIDIA-L4"}),
                             "nvidia.com/mig-1g.10gb", sharing("MIG"), [])
    assert narrowed is None  # an L4 has no MIG: nothing to launch


def test_whole_gpus_are_whole_gpus_of_the_allowed_models() -> None:
    """Planned only under node groups (no Karpenter provisions whole-GPU pods there)."""
    two = pod("nvidia.com/gpu")
    two["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "2"
    found = launch_demand(two, "nvidia.com/gpu", None, ["NVIDIA-L4"])
    assert found is not None and found.layout is None and found.by_product == {}
    d = found.demand
    assert (d.num_gpu, d.gpu_milli, d.cpu_milli, d.allowed_models) == (2, 1000, 2000, frozenset({"NVIDIA-L4"}))
    assert launch_demand(pod("nvidia.com/gpu"), "nvidia.com/gpu", None, []).demand.allowed_models is None  # type: ignore[union-attr]


# -- the drain -------------------------------------------------------------------------------------
def rec(**kw: Any) -> drain.Record:
    return drain.Record(**{"plan": "p1", "policy": "cap", "claim": "gpu-a", "started": 0.0, "deadline": 300.0, **kw})


def bound(name: str, uid: str, **meta: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ml", "uid": uid, **meta}, "status": {"phase": "Running"}}


def test_start_cordons_and_annotates_in_one_patch_and_the_record_reads_back() -> None:
    patch = drain.start_patch(rec(was_unschedulable=True))
    assert patch["spec"] == {"unschedulable": True}
    assert drain.read_record(patch["metadata"]["annotations"]) == rec(was_unschedulable=True)
    assert drain.read_record({drain.DRAINING_ANNOTATION: "{not json"}) is None


def test_evictions_skip_daemonset_mirror_finished_and_already_evicted_pods() -> None:
    pods = [bound("a", "u1"), bound("ds", "u2", ownerReferences=[{"kind": "DaemonSet", "name": "x"}]),
            bound("mirror", "u3", annotations={"kubernetes.io/config.mirror": "x"}),
            {**bound("done", "u4"), "status": {"phase": "Succeeded"}}, bound("b", "u5")]
    step = drain.advance("n", rec(evicted=("u5",)), {}, pods, 10.0)
    assert step.outcome == "draining" and step.evict == (("ml", "a", "u1"),) and step.pods_left == 2


def test_a_refused_eviction_backs_off_then_past_the_deadline_the_node_is_uncordoned() -> None:
    after = drain.after_evictions(rec(), [], "eviction of ml/a refused (429): Cannot evict pod", 10.0)
    assert after.retry_at == 10.0 + drain.BACKOFF_SECONDS
    assert drain.advance("n", after, {}, [bound("a", "u1")], 12.0).outcome == "waiting"
    undone = drain.advance("n", after, {}, [bound("a", "u1")], 300.0)
    assert undone.outcome == "undone" and "429" in undone.message
    assert undone.patch is not None and undone.patch["spec"] == {"unschedulable": None}
    assert drain.read_undone(undone.patch["metadata"]["annotations"])["plan"] == "p1"
    kept = drain.advance("n", rec(was_unschedulable=True, deadline=0.0), {}, [bound("a", "u1")], 1.0)
    assert kept.patch is not None and kept.patch["spec"] == {"unschedulable": True}  # someone else's cordon stays


def test_pods_that_no_longer_fit_elsewhere_undo_the_drain() -> None:
    step = drain.advance("n", rec(), {}, [bound("a", "u1")], 1.0, fits=False)
    assert step.outcome == "undone" and not step.evict and "no longer fit on the other nodes" in step.message


def test_do_not_disrupt_undoes_and_an_empty_node_deletes_its_claim_once() -> None:
    held = drain.advance("n", rec(), {}, [bound("a", "u1", annotations={"gpu.kubeon.io/do-not-disrupt": "true"})], 1.0)
    assert held.outcome == "undone" and "gpu.kubeon.io/do-not-disrupt on pod a" in held.message
    assert drain.advance("n", rec(), {}, [bound("a", "u1", annotations={"karpenter.sh/do-not-disrupt": "false"})],
                         1.0).outcome == "draining"
    empty = drain.advance("n", rec(), {}, [], 1.0)
    assert empty.delete_claim and empty.patch is not None
    again = drain.read_record(empty.patch["metadata"]["annotations"])
    assert again is not None and drain.advance("n", again, {}, [], 2.0).delete_claim is False


# -- modes and usage ---------------------------------------------------------------------------------
def test_every_capacity_provider_is_implemented_and_usage_needs_prometheus() -> None:
    assert handling(PolicyKind.CAPACITY).reason == "Reconciled"
    for provider in ("eks-nodegroups", "gke-nodepools", "aks-nodepools"):
        assert handling(PolicyKind.CAPACITY, capacity_provider=provider).reason == "Reconciled"
    assert handling(PolicyKind.CAPACITY, capacity_provider="ec2").reason == "NotImplemented"
    assert disruption_mode(Mode.AUTOMATIC, True, False) is Mode.RECOMMEND
    assert disruption_mode(Mode.AUTOMATIC, False, False) is Mode.AUTOMATIC
    assert disruption_mode(Mode.APPROVE, True, True) is Mode.APPROVE


def test_usage_counts_only_a_covered_window() -> None:
    assert covered([(0, 1), (60, 1), (120, 1)], 0, 120, 60)
    assert not covered([(0, 1), (300, 1)], 0, 300, 60)  # a hole longer than three steps
    assert not covered([(200, 1), (240, 1)], 0, 240, 60)  # starts too late
    assert not covered([], 0, 10, 1)
    assert "DCGM_FI_PROF_GR_ENGINE_ACTIVE" in node_usage_query(60) and "Hostname, hostname" in node_usage_query(60)
    assert json.dumps(node_usage_query(30)).count("[30000ms]") == 2


def test_fifty_six_1g_slices_fill_exactly_one_eight_gpu_a100_node() -> None:
    """7 x 1g.10gb per A100-80GB GPU, 8 GPUs: 56 pods, one p4de.24xlarge (a share rounded up to 143 milli
    fitted only 6 per GPU and asked for a second node)."""
    from controller.capacity import CapacityReconciler

    group = []
    for i in range(56):  # 1 CPU each: 56 of the node's 96 (2 each would not fit: CPU, not GPU, decides)
        small = pod("nvidia.com/mig-1g.10gb")
        small["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "1"
        found = launch_demand({**small, "metadata": {"name": f"p{i}", "namespace": "ml"}},
                              "nvidia.com/mig-1g.10gb", sharing("MIG"), ["NVIDIA-A100-SXM4-80GB"])
        assert found is not None
        group.append(found)
    catalog = [t for t in load_instances(CATALOG) if t.model == "NVIDIA-A100-SXM4-80GB"]
    plan = CapacityReconciler._plan_group(group, catalog, None)
    assert [(launch.instance_type.name, len(launch.pods)) for launch in plan] == [("p4de.24xlarge", 56)]
