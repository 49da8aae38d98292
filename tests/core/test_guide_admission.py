"""What the install guide promises about admission (issue 14): the effective mode, MIG rewrites that
never leave a pod unschedulable, declared GPU memory honoured by time-slicing, bad annotations reported.

Real: the admission core (mutate_pod) and the dry-run command line; the patches are applied with
jsonpatch. Faked: nothing (the cluster is a ClusterView value, as the webhook builds it).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from cli.main import main
from gpupolicy.admission.mutate import Action, mutate_pod, validate_pod
from gpupolicy.catalog import DEFAULT_CATALOG
from gpupolicy.model import Mode
from tests.core.builders import apply, limits, make_node, make_pod, make_policy, make_view

A100 = "NVIDIA-A100-SXM4-80GB"
H100 = "NVIDIA-H100-80GB-HBM3"
H200 = "NVIDIA-H200"
PRODUCT = "nvidia.com/gpu.product"


def offered_by(product: str) -> set[str]:
    found = DEFAULT_CATALOG.product(product)
    assert found is not None
    return {p.resource_name for p in found.profiles}


def gpu_resource(pod: dict) -> str:
    [name] = [n for n in limits(pod) if n.startswith("nvidia.com/")]
    return name


def pinned_pod(product: str, how: str = "nodeSelector", **kwargs) -> dict:
    pod = make_pod(**kwargs)
    if how == "nodeSelector":
        pod["spec"]["nodeSelector"] = {PRODUCT: product, "kubernetes.io/os": "linux"}
    else:
        pod["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": PRODUCT, "operator": "In", "values": [product]}]}]}}}
    return pod


def rewrite(pod: dict, view) -> tuple[dict, list[str]]:
    result = mutate_pod(pod, view)
    after = apply(pod, result.patch)
    assert mutate_pod(after, view).patch == [], "idempotent"
    return after, result.warnings


# -- A1: without prometheus.url sharing stays Recommend, in the webhook too ------------------

def test_without_metrics_an_automatic_sharing_policy_changes_no_pod() -> None:
    view = make_view(make_policy(mode="Automatic"), nodes=(make_node(),), metrics=False)
    result = mutate_pod(make_pod(), view)
    assert result.patch == []
    [decision] = result.decisions
    assert (decision.mode, decision.action, decision.applied) == (Mode.RECOMMEND, Action.USE_MIG, False)
    assert any("(Recommend): would use nvidia.com/mig-1g.10gb" in w for w in result.warnings)
    # The same policy with metrics configured applies: the mode, not the policy, held it back.
    assert mutate_pod(make_pod(), make_view(make_policy(mode="Automatic"), nodes=(make_node(),))).patch


def test_without_metrics_a_guardrail_still_denies() -> None:
    """Only the metric-driven kinds (sharing, scaleToZero) are held in Recommend."""
    policy = make_policy("guard", mode="Automatic", guardrail={"maxGpusPerPod": 1})
    assert not validate_pod(make_pod(gpus=2), make_view(policy, metrics=False)).allowed


# -- A3: a MIG rewrite never makes a pod unschedulable -------------------------------------

def test_issue_example_pod_pinned_to_h200_gets_an_h200_profile() -> None:
    """The issue's report: nodeSelector H200 under a policy that also allows A100s got mig-1g.10gb."""
    policy = make_policy(sharing={"strategy": "MIG", "gpuMemory": "8Gi", "gpuModels": [A100, H200]})
    for how in ("nodeSelector", "affinity"):
        after, _ = rewrite(pinned_pod(H200, how), make_view(policy))
        assert gpu_resource(after) == "nvidia.com/mig-1g.18gb", how
        assert gpu_resource(after) in offered_by(H200) and gpu_resource(after) not in offered_by(A100)


def test_nodes_of_two_models_without_a_common_profile_pin_the_pod() -> None:
    nodes = (make_node("a", A100), make_node("h", H200))
    after, _ = rewrite(make_pod(), make_view(make_policy(), nodes=nodes))
    pin = after["spec"]["nodeSelector"][PRODUCT]
    assert gpu_resource(after) in offered_by(pin)


def test_a_profile_every_model_offers_needs_no_pin() -> None:
    nodes = (make_node("a", A100), make_node("h", H100))
    after, _ = rewrite(make_pod(), make_view(make_policy(), nodes=nodes))
    assert gpu_resource(after) == "nvidia.com/mig-1g.10gb"
    assert "nodeSelector" not in after["spec"]


def test_only_models_that_exist_on_nodes() -> None:
    """gpuModels allows A100 and H200, but only H200 nodes exist: an A100 slice would stay Pending."""
    policy = make_policy(sharing={"strategy": "MIG", "gpuMemory": "8Gi", "gpuModels": [A100, H200]})
    after, _ = rewrite(make_pod(), make_view(policy, nodes=(make_node("h", H200),)))
    assert gpu_resource(after) == "nvidia.com/mig-1g.18gb" and "nodeSelector" not in after["spec"]
    only_a100 = make_policy(sharing={"strategy": "MIG", "gpuMemory": "8Gi", "gpuModels": [A100]})
    result = mutate_pod(make_pod(), make_view(only_a100, nodes=(make_node("h", H200),)))
    assert result.patch == [] and any("no node has a MIG-capable product" in w for w in result.warnings)


def test_an_enforced_type_fit_policy_narrows_the_profile() -> None:
    nodes = (make_node("a", A100), make_node("h", H200))
    fit = make_policy("fit", typeFit={"allowedModels": [H200]})
    after, _ = rewrite(make_pod(), make_view(make_policy(), fit, nodes=nodes))
    assert gpu_resource(after) == "nvidia.com/mig-1g.18gb" and "nodeSelector" not in after["spec"]


def test_contradicting_pin_leaves_the_pod_whole_with_a_reason() -> None:
    policy = make_policy(sharing={"strategy": "MIG", "gpuMemory": "8Gi", "gpuModels": [A100]})
    result = mutate_pod(pinned_pod(H200), make_view(policy))
    assert result.patch == [] and result.decisions[0].action == Action.SKIP
    assert any("the pod asks for NVIDIA-H200" in w for w in result.warnings)
    fixed = make_policy(sharing={"strategy": "MIG", "migProfile": "1g.10gb"})
    result = mutate_pod(pinned_pod(H200), make_view(fixed))
    assert result.patch == [] and any("no profile 1g.10gb is offered" in w for w in result.warnings)


# -- B (admission): declared GPU memory and time-slicing; invalid annotations -----------------

def test_time_slicing_leaves_a_pod_needing_more_than_its_share_whole() -> None:
    node = make_node("h", H200, **{"nvidia.com/gpu.replicas": "4",  # time-sliced: 143771Mi / 4 = 35943Mi a share
                                   "nvidia.com/device-plugin.config": "kubeon-time-slicing"})
    view = make_view(make_policy(sharing={"strategy": "TimeSlicing"}), nodes=(node,))
    big = mutate_pod(make_pod(annotations={"gpu.kubeon.io/gpu-memory": "40Gi"}), view)
    assert big.patch == [] and big.decisions[0].action == Action.SKIP
    assert any("a time-sliced share guarantees 35943Mi" in w for w in big.warnings)
    small, _ = rewrite(make_pod(annotations={"gpu.kubeon.io/gpu-memory": "20Gi"}), view)
    assert gpu_resource(small) == "nvidia.com/gpu.shared"
    undeclared, _ = rewrite(make_pod(), view)
    assert gpu_resource(undeclared) == "nvidia.com/gpu.shared"


def test_invalid_gpu_memory_annotation_is_reported_not_ignored() -> None:
    view = make_view(make_policy(sharing={"strategy": "MIG", "gpuMemory": "8Gi"}), nodes=(make_node(),))
    result = mutate_pod(make_pod(annotations={"gpu.kubeon.io/gpu-memory": "lots"}), view)
    assert result.patch == [] and result.decisions[0].action == Action.SKIP
    assert any("gpu.kubeon.io/gpu-memory 'lots' is not a memory quantity" in w for w in result.warnings)
    assert all(len(w) < 120 for w in result.warnings)


def test_dry_run_reports_the_invalid_annotation(tmp_path: Path, capsys) -> None:
    pods = tmp_path / "pod.yaml"
    pods.write_text(yaml.safe_dump(make_pod(annotations={"gpu.kubeon.io/gpu-memory": "20 gigs"})))
    policies = tmp_path / "policies.yaml"
    policies.write_text(yaml.safe_dump(make_policy().to_wire()))
    assert main(["dry-run", "-f", str(pods), "--policies", str(policies), "--metrics", "-o", "text"]) == 0
    out = capsys.readouterr().out
    assert "! warning: kubeon-gpu share: gpu.kubeon.io/gpu-memory '20 gigs' is not a memory quantity" in out
