"""Pod mutation (sharing rewrite, tolerations, scheduler, annotations, modes, skip rules).

Real: gpupolicy.admission.mutate_pod with the real catalog; patches are
applied with the independent `jsonpatch` library. Faked: nothing (pods,
policies and nodes are built in memory).
"""

from __future__ import annotations

import json

import pytest

from gpupolicy.admission.mutate import Action, mutate_pod
from gpupolicy.cluster import NodeInfo
from gpupolicy.model import Mode
from tests.core.builders import apply, limits, make_node, make_pod, make_policy, make_view, owner_ref

MIG = "MIG"


def mutated(pod: dict, view) -> dict:
    result = mutate_pod(pod, view)
    assert result.allowed
    after = apply(pod, result.patch)
    assert after == result.object
    assert mutate_pod(after, view).patch == [], "mutation must be idempotent"
    return after


@pytest.mark.parametrize(
    ("need", "sharing_extra", "nodes", "expected"),
    [
        ("8Gi", {}, (), "nvidia.com/mig-1g.10gb"),
        ("16Gi", {}, (make_node(product="NVIDIA-H200", **{"nvidia.com/mig-1g.18gb.memory": "16384"}),),
         "nvidia.com/mig-1g.18gb"),
        ("17Gi", {}, (make_node(product="NVIDIA-H200"),), "nvidia.com/mig-1g.35gb"),
        ("12Gi", {"gpuModels": ["NVIDIA-A100-SXM4-40GB"]}, (), "nvidia.com/mig-3g.20gb"),
        ("8Gi", {}, (make_node(**{"nvidia.com/mig-1g.10gb.memory": "8000"}),), "nvidia.com/mig-1g.20gb"),
        ("30Gi", {"gpuModels": ["NVIDIA-H100-80GB-HBM3"]}, (make_node(product="NVIDIA-H200"),
                                                             make_node("h100", "NVIDIA-H100-80GB-HBM3")),
         "nvidia.com/mig-3g.40gb"),
        ("30Gi", {}, (make_node(product="NVIDIA-A100-SXM4-80GB-MIG-1g.10gb"),), "nvidia.com/mig-3g.40gb"),
    ],
    ids=["a100-1g", "h200-exact-real-memory", "h200-name-18gb-holds-16", "gpumodels-a100-40",
         "gfd-memory-label-wins", "gpumodels-beat-nodes", "gfd-mig-suffix-product"],
)
def test_auto_mig_picks_smallest_profile_by_real_memory(need, sharing_extra, nodes, expected) -> None:
    policy = make_policy(sharing={"strategy": MIG, "gpuMemory": need, **sharing_extra})
    after = mutated(make_pod(), make_view(policy, nodes=nodes))
    assert limits(after) == {"cpu": "1", expected: "1"}


def test_pod_annotation_need_beats_policy_gpu_memory() -> None:
    view = make_view(make_policy(sharing={"strategy": MIG, "gpuMemory": "8Gi"}),
                     nodes=(make_node(),))
    after = mutated(make_pod(annotations={"gpu.kubeon.io/gpu-memory": "30Gi"}), view)
    assert "nvidia.com/mig-3g.40gb" in limits(after)


@pytest.mark.parametrize(
    ("sharing", "warning_part"),
    [({"strategy": MIG, "gpuMemory": "500Gi"}, "no MIG profile holds"),
     ({"strategy": MIG}, "no GPU memory need")],
    ids=["too-big", "no-need-declared"],
)
def test_auto_mig_without_fitting_profile_leaves_pod_and_warns(sharing, warning_part) -> None:
    result = mutate_pod(make_pod(), make_view(make_policy(sharing=sharing)))
    assert result.patch == []
    assert result.decisions[0].action == Action.SKIP
    assert any(warning_part in w for w in result.warnings)


def test_fixed_profile_and_time_slicing() -> None:
    fixed = mutated(make_pod(), make_view(make_policy(sharing={"strategy": MIG, "migProfile": "2g.20gb"})))
    assert "nvidia.com/mig-2g.20gb" in limits(fixed)
    shared = mutated(make_pod(), make_view(make_policy(sharing={"strategy": "TimeSlicing"})))
    assert limits(shared) == {"cpu": "1", "nvidia.com/gpu.shared": "1"}


def test_automatic_mig_pod_is_exactly_the_slice_its_toleration_and_the_annotations() -> None:
    """The whole pod the API server stores, written out (not the patch checked against the object it came
    from): the slice in limits and requests, cpu untouched, the user's toleration kept and the slice's added,
    the policy and the original resources recorded as annotations, nothing else changed."""
    pod = make_pod(requests=True, tolerations=[{"key": "team", "operator": "Exists"}])
    assert mutated(pod, make_view(make_policy())) == {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ml", "annotations": {
            "gpu.kubeon.io/policy": "share",
            "gpu.kubeon.io/rewritten-from":
                '{"c0":{"limits":{"nvidia.com/gpu":"1"},"requests":{"nvidia.com/gpu":"1"}}}',
        }},
        "spec": {
            "containers": [{"name": "c0", "image": "busybox", "resources": {
                "limits": {"cpu": "1", "nvidia.com/mig-1g.10gb": "1"},
                "requests": {"cpu": "1", "nvidia.com/mig-1g.10gb": "1"}}}],
            "tolerations": [{"key": "team", "operator": "Exists"},
                            {"key": "nvidia.com/mig-1g.10gb", "operator": "Exists", "effect": "NoSchedule"}],
        },
    }


def test_requests_and_limits_rewritten_in_every_single_gpu_container() -> None:
    after = mutated(make_pod(requests=True, containers=2, init_gpus=1), make_view(make_policy()))
    for container in after["spec"]["containers"] + after["spec"]["initContainers"]:
        for section in ("limits",) + (("requests",) if "requests" in container["resources"] else ()):
            assert container["resources"][section].get("nvidia.com/mig-1g.10gb") == "1"
            assert "nvidia.com/gpu" not in container["resources"][section]


def test_patch_escapes_slash_in_resource_names() -> None:
    result = mutate_pod(make_pod(), make_view(make_policy()))
    paths = [op["path"] for op in result.patch]
    assert "/spec/containers/0/resources/limits/nvidia.com~1gpu" in paths
    assert "/spec/containers/0/resources/limits/nvidia.com~1mig-1g.10gb" in paths


def test_tolerations_kept_and_added() -> None:
    gpu_toleration = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    policy = make_policy(tolerations=[{"key": "gpu-pool", "operator": "Equal", "value": "shared",
                                       "effect": "NoSchedule"}])
    after = mutated(make_pod(tolerations=[gpu_toleration]), make_view(policy))
    assert after["spec"]["tolerations"] == [
        gpu_toleration,
        {"key": "nvidia.com/mig-1g.10gb", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "gpu-pool", "operator": "Equal", "value": "shared", "effect": "NoSchedule"},
    ]


@pytest.mark.parametrize(("current", "expected"),
                         [(None, "kubeon-gpu-scheduler"), ("default-scheduler", "kubeon-gpu-scheduler"),
                          ("volcano", "volcano")], ids=["unset", "default", "custom-kept"])
def test_scheduler_name(current, expected) -> None:
    after = mutated(make_pod(scheduler=current), make_view(make_policy(scheduler="kubeon-gpu-scheduler")))
    assert after["spec"]["schedulerName"] == expected


def test_scheduler_from_another_policy_kind_for_gpu_pods() -> None:
    packing = make_policy("pack", packing={"strategy": "bestfit"}, scheduler="kubeon-gpu-scheduler")
    after = mutated(make_pod(), make_view(packing))
    assert after["spec"]["schedulerName"] == "kubeon-gpu-scheduler"
    assert after["metadata"]["annotations"]["gpu.kubeon.io/policy"] == "pack"


def test_annotations_record_policy_and_original_resources() -> None:
    after = mutated(make_pod(requests=True), make_view(make_policy("share-inference")))
    notes = after["metadata"]["annotations"]
    assert notes["gpu.kubeon.io/policy"] == "share-inference"
    assert json.loads(notes["gpu.kubeon.io/rewritten-from"]) == {
        "c0": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}}}


@pytest.mark.parametrize(
    ("pod", "reason"),
    [
        (make_pod(namespace="kube-system"), "never touched"),
        (make_pod(namespace="kubeon-gpu"), "never touched"),
        (make_pod(labels={"gpu.kubeon.io/skip": "true"}), "skip"),
        (make_pod(annotations={"gpu.kubeon.io/skip": "true"}), "skip"),
        (make_pod(gpus=None), "no GPU"),
        (make_pod(gpus=0), "no GPU"),
    ],
    ids=["kube-system", "own-namespace", "skip-label", "skip-annotation", "no-gpu", "zero-gpu"],
)
def test_out_of_scope_pods_untouched(pod, reason) -> None:
    result = mutate_pod(pod, make_view(make_policy(tolerations=[{"key": "x", "operator": "Exists"}])))
    assert result.patch == [] and result.warnings == [] and result.decisions == []
    assert reason in result.note


@pytest.mark.parametrize(
    ("pod", "reason"),
    [
        (make_pod(gpus=2), "more than one GPU"),
        (make_pod(resource="nvidia.com/mig-1g.10gb"), "already"),
        (make_pod(resource="nvidia.com/gpu.shared"), "already"),
    ],
    ids=["two-gpus", "already-mig", "already-shared"],
)
def test_sharing_skips(pod, reason) -> None:
    result = mutate_pod(pod, make_view(make_policy()))
    assert result.patch == []
    assert result.decisions[0].action == Action.SKIP and reason in result.decisions[0].reason


def test_multi_gpu_container_left_alone_beside_single_gpu_one() -> None:
    pod = make_pod(containers=2)
    pod["spec"]["containers"][1]["resources"]["limits"]["nvidia.com/gpu"] = "2"
    after = mutated(pod, make_view(make_policy()))
    assert "nvidia.com/mig-1g.10gb" in limits(after, 0)
    assert limits(after, 1)["nvidia.com/gpu"] == "2"


@pytest.mark.parametrize("mode", ["Recommend", None], ids=["explicit", "default-mode"])
def test_recommend_never_patches_and_warns_briefly(mode) -> None:
    view = make_view(make_policy("a-rather-long-policy-name-for-the-warning-limit-check", mode=mode,
                                 scheduler="kubeon-gpu-scheduler"), default_mode=Mode.RECOMMEND)
    result = mutate_pod(make_pod(), view)
    assert result.patch == []
    assert result.warnings and all(len(w) < 120 for w in result.warnings)
    assert "nvidia.com/mig-1g.10gb" in result.warnings[0]
    assert [d.applied for d in result.decisions] == [False, False]


def test_default_mode_automatic_applies_policies_without_mode() -> None:
    result = mutate_pod(make_pod(), make_view(make_policy(mode=None), default_mode=Mode.AUTOMATIC))
    assert result.patch and result.decisions[0].mode == Mode.AUTOMATIC


DEPLOY_POD = make_pod(labels={"pod-template-hash": "5f7b9"}, owner=owner_ref("ReplicaSet", "llm-5f7b9"))


@pytest.mark.parametrize(
    ("approvals", "applied"),
    [(["Deployment/ml/llm"], True), (["Deployment/ml/other"], False), ([], False)],
    ids=["approved", "other-workload", "none"],
)
def test_approve_mode_patches_only_listed_owners(approvals, applied) -> None:
    view = make_view(make_policy(mode="Approve", approvals=approvals))
    result = mutate_pod(DEPLOY_POD, view)
    assert bool(result.patch) is applied
    assert result.decisions[0].applied is applied
    if not applied:
        assert "approve Deployment/ml/llm" in result.warnings[0] and len(result.warnings[0]) < 120


def test_second_policy_annotation_merges() -> None:
    pod = make_pod(annotations={"gpu.kubeon.io/policy": "older"})
    after = mutated(pod, make_view(make_policy("share")))
    assert after["metadata"]["annotations"]["gpu.kubeon.io/policy"] == "older,share"


def _on_node(pod: dict) -> dict:
    pod["spec"]["nodeName"] = "gpu-plain-1"
    return pod


@pytest.mark.parametrize(("pod", "reason"), [
    (_on_node(make_pod()), "pod is already on node gpu-plain-1 (spec.nodeName): no scheduler places it"),
    (make_pod(owner=owner_ref("DaemonSet", "burn")), "a DaemonSet's pod: its controller pins it to its node"),
], ids=["node-name", "daemonset"])
def test_a_gpu_pod_no_scheduler_places_is_left_alone(pod: dict, reason: str) -> None:
    """A slice, a node pin or kubeon's schedulerName on such a pod left it Pending (a DaemonSet's pod, pinned
    to a node that may offer no slice) or refused by its kubelet (spec.nodeName skips the scheduler; the
    kubelet admits the pod against that node's own devices)."""
    view = make_view(make_policy(scheduler="kubeon-gpu-scheduler",
                                 tolerations=[{"key": "x", "operator": "Exists"}]))
    result = mutate_pod(pod, view)
    assert result.patch == [] and result.warnings == [] and result.decisions == []
    assert result.note == reason


def test_a_mig_pin_names_the_product_as_the_nodes_offering_the_slice_spell_it() -> None:
    """The first A100 node is time-sliced, so GFD labels it `...-SHARED`: a pin to that value reached only
    it, which offers no MIG slice, and the pod stayed Pending. The A100 and the H200 share no profile that
    fits, so the pod is pinned to the A100 that offers the slice."""
    shared = NodeInfo("ts-1", {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB-SHARED",
                               "nvidia.com/gpu.replicas": "4"}, {"nvidia.com/gpu": "32"})
    view = make_view(make_policy(sharing={"strategy": MIG, "gpuMemory": "8Gi"}),
                     nodes=(shared, make_node("mig-a100"), make_node("mig-h200", "NVIDIA-H200")))
    after = mutated(make_pod(), view)
    assert after["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
    assert limits(after) == {"cpu": "1", "nvidia.com/mig-1g.10gb": "1"}
