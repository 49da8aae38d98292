"""`sharing.via: DRA` at admission: which ResourceClaimTemplate each GPU container claims through.

Real: gpupolicy.admission.mutate_pod and the dry-run's template entries with the real catalog; patches
applied with the independent `jsonpatch` library. Faked: nothing (pods, policies and nodes in memory).
tests/e2e/test_dra.py runs the same against kube-scheduler's DynamicResources plugin.
"""

from __future__ import annotations

import pytest

from gpupolicy.admission.claims import TEMPLATE_ANNOTATION, policy_templates
from gpupolicy.admission.dryrun import claim_templates
from gpupolicy.admission.mutate import Action, mutate_pod
from gpupolicy.catalog import DEFAULT_CATALOG
from gpupolicy.model import Mode
from tests.core.builders import apply, make_node, make_pod, make_policy, make_view

H200, A100_40 = "NVIDIA-H200", "NVIDIA-A100-SXM4-40GB"


def dra(mode: str = "Automatic", **sharing: object) -> object:
    return make_policy("dra", mode=mode, sharing={"strategy": "MIG", "via": "DRA", **sharing})


def claimed(pod: dict, view) -> dict:
    result = mutate_pod(pod, view)
    after = apply(pod, result.patch)
    assert after == result.object
    assert mutate_pod(after, view).patch == [], "mutation must be idempotent"
    return after


def templates_of(pod: dict) -> list[str]:
    return [c["resourceClaimTemplateName"] for c in pod["spec"].get("resourceClaims") or []]


@pytest.mark.parametrize(("memory", "nodes", "models", "expected"), [
    ("10Gi", (H200,), [], "kubeon-mig-1g.18gb"),
    ("20Gi", (H200,), [], "kubeon-mig-1g.35gb"),
    ("4Gi", (A100_40,), [], "kubeon-mig-1g.5gb"),
    ("10Gi", (H200, A100_40), [], "kubeon-mig-1g.18gb-nvidia-h200"),  # no one profile fits both: pinned
    ("10Gi", (), [H200], "kubeon-mig-1g.18gb"),
    (None, (H200,), [], "kubeon-gpu-1"),  # no need declared: a whole GPU
], ids=["h200-10gi", "h200-20gi", "a100-4gi", "two-products-pinned", "gpu-models", "no-need-whole"])
def test_smallest_profile_holding_the_need(memory, nodes, models, expected) -> None:
    annotations = {"gpu.kubeon.io/gpu-memory": memory} if memory else None
    policy = dra(gpuModels=models) if models else dra()
    view = make_view(policy, nodes=tuple(make_node(f"n{i}", p, offers_slices=False) for i, p in enumerate(nodes)))
    pod = claimed(make_pod(annotations=annotations), view)
    assert templates_of(pod) == [expected]
    assert "nvidia.com/gpu" not in pod["spec"]["containers"][0]["resources"]["limits"]
    assert pod["spec"]["containers"][0]["resources"]["claims"] == [{"name": "kubeon-claim-0"}]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["spec"]["tolerations"]
    assert pod["metadata"]["annotations"][TEMPLATE_ANNOTATION] == expected
    assert expected in policy_templates(policy.spec.sharing, DEFAULT_CATALOG)  # the controller may create it


def test_each_container_gets_a_claim_of_its_own() -> None:
    view = make_view(dra(), nodes=(make_node("n", H200, offers_slices=False),))
    pod = claimed(make_pod(containers=2, annotations={"gpu.kubeon.io/gpu-memory": "10Gi"}), view)
    assert [c["name"] for c in pod["spec"]["resourceClaims"]] == ["kubeon-claim-0", "kubeon-claim-1"]
    assert [c["resources"]["claims"] for c in pod["spec"]["containers"]] == [
        [{"name": "kubeon-claim-0"}], [{"name": "kubeon-claim-1"}]]


def test_template_selects_the_profile_and_its_real_memory() -> None:
    policy = dra(gpuModels=[H200])
    template = policy_templates(policy.spec.sharing, DEFAULT_CATALOG)["kubeon-mig-1g.18gb"].object("ml", "dra", "u1")
    exactly = template["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    assert exactly["deviceClassName"] == "mig.nvidia.com" and exactly["count"] == 1
    assert exactly["selectors"][0]["cel"]["expression"] == (
        "device.attributes['gpu.nvidia.com'].profile == '1g.18gb' && "
        "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('16384Mi')) >= 0")
    assert template["metadata"]["ownerReferences"][0] == {"apiVersion": "gpu.kubeon.io/v1alpha1",
                                                          "kind": "GpuPolicy", "name": "dra", "uid": "u1"}


@pytest.mark.parametrize(("pod", "reason"), [
    (make_pod(annotations={"gpu.kubeon.io/gpu-memory": "200Gi"}), "no MIG profile holds 204800Mi"),
    ({**make_pod(annotations={"gpu.kubeon.io/gpu-memory": "10Gi"}),
      "spec": {**make_pod()["spec"], "resourceClaims": [{"name": "x", "resourceClaimName": "mine"}]}},
     "the pod has its own spec.resourceClaims"),
    (make_pod(annotations={"gpu.kubeon.io/gpu-memory": "ten"}), "is not a memory quantity"),
    (make_pod(annotations={"gpu.kubeon.io/gpu-memory": "10Gi"}), "no GPU product known"),
    (make_pod(gpus=16), "container c0 asks for 16 GPUs (whole GPUs: 1 to 8)"),
], ids=["need-no-device-has", "own-claims", "bad-annotation", "no-product-known", "more-gpus-than-a-node"])
def test_left_alone_with_the_reason(pod: dict, reason: str, request: pytest.FixtureRequest) -> None:
    # the ResourceSlices do not say the products yet: a node's GFD label or the policy's gpuModels must
    nodes = () if request.node.callspec.id == "no-product-known" else (make_node("n", H200, offers_slices=False),)
    result = mutate_pod(pod, make_view(dra(), nodes=nodes))
    assert result.patch == []
    assert [d.action for d in result.decisions] == [Action.SKIP]
    assert len(result.warnings) == 1 and reason in result.warnings[0] and "pod left unchanged" in result.warnings[0]


def test_recommend_names_the_template_and_writes_nothing() -> None:
    view = make_view(dra(mode="Recommend"), nodes=(make_node("n", H200, offers_slices=False),))
    pod = make_pod(annotations={"gpu.kubeon.io/gpu-memory": "10Gi"})
    result = mutate_pod(pod, view)
    assert result.patch == [] and result.object == pod
    assert result.warnings == ["kubeon-gpu dra (Recommend): would use ResourceClaimTemplate kubeon-mig-1g.18gb"]
    assert result.decisions[0].mode == Mode.RECOMMEND and not result.decisions[0].applied
    assert claim_templates(pod, result, view) == []  # the dry-run shows no template either


def test_dry_run_shows_the_template_the_controller_creates() -> None:
    view = make_view(dra(), nodes=(make_node("n", H200, offers_slices=False),))
    pod = make_pod(annotations={"gpu.kubeon.io/gpu-memory": "10Gi"})
    shown = claim_templates(pod, mutate_pod(pod, view), view)
    assert [(t["kind"], t["metadata"]["namespace"], t["metadata"]["name"]) for t in shown] == [
        ("ResourceClaimTemplate", "ml", "kubeon-mig-1g.18gb")]
