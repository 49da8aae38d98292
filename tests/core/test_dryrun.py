"""Dry-run over Pods and workloads (core); the command line is tested in tests/cli/.

Real: gpupolicy.admission.dryrun; patches applied with the `jsonpatch` library. Faked: nothing.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpupolicy.admission.dryrun import DryRunError, dry_run, view_for_request
from tests.core.builders import apply, make_pod, make_policy, make_view

CONTAINER = {"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
TEMPLATE = {"metadata": {"labels": {"app": "llm"}}, "spec": {"containers": [CONTAINER]}}
WORKLOADS = {
    "Deployment": ({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "llm", "namespace": "ml"},
                    "spec": {"template": TEMPLATE}}, "/spec/template/spec/containers/0"),
    "StatefulSet": ({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "llm", "namespace": "ml"},
                     "spec": {"template": TEMPLATE}}, "/spec/template/spec/containers/0"),
    "Job": ({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "llm", "namespace": "ml"},
             "spec": {"template": {"spec": {"containers": [CONTAINER]}}}}, "/spec/template/spec/containers/0"),
    "CronJob": ({"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "llm", "namespace": "ml"},
                 "spec": {"schedule": "* * * * *", "jobTemplate": {"spec": {"template": TEMPLATE}}}},
                "/spec/jobTemplate/spec/template/spec/containers/0"),
    "Pod": (make_pod(), "/spec/containers/0"),
}


SLICE_TOLERATION = {"key": "nvidia.com/mig-1g.10gb", "operator": "Exists", "effect": "NoSchedule"}


def at(obj: dict[str, Any], pointer: str) -> Any:
    """The value at a JSON pointer made of plain keys and list indexes ("" is the object itself)."""
    for key in pointer.split("/")[1:]:
        obj = obj[int(key)] if isinstance(obj, list) else obj[key]
    return obj


def shared_template(kind: str) -> dict[str, Any]:
    """What `make_policy()` (MIG auto, 8Gi, Automatic) makes of WORKLOADS[kind]'s pod template, written out."""
    if kind == "Pod":
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "p", "namespace": "ml", "annotations": {
                    "gpu.kubeon.io/policy": "share",
                    "gpu.kubeon.io/rewritten-from": '{"c0":{"limits":{"nvidia.com/gpu":"1"}}}'}},
                "spec": {"containers": [{"name": "c0", "image": "busybox",
                                         "resources": {"limits": {"cpu": "1", "nvidia.com/mig-1g.10gb": "1"}}}],
                         "tolerations": [SLICE_TOLERATION]}}
    metadata: dict[str, Any] = {} if kind == "Job" else {"labels": {"app": "llm"}}
    metadata["annotations"] = {"gpu.kubeon.io/policy": "share",
                               "gpu.kubeon.io/rewritten-from": '{"c":{"limits":{"nvidia.com/gpu":"1"}}}'}
    return {"metadata": metadata,
            "spec": {"containers": [{"name": "c", "image": "x",
                                     "resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}}}],
                     "tolerations": [SLICE_TOLERATION]}}


@pytest.mark.parametrize("kind", list(WORKLOADS))
def test_workloads_patched_through_pod_template(kind: str) -> None:
    """The dry-run shows the pod template the cluster would run: the slice, its toleration and the policy and
    rewritten-from annotations (a workload's template must carry them too, not only a Pod), and the patch
    turns the submitted object into exactly that."""
    obj, container_path = WORKLOADS[kind]
    template_path = container_path.removesuffix("/spec/containers/0")
    view = make_view(make_policy())
    result = dry_run(obj, view)
    assert result.allowed
    assert f"{container_path}/resources/limits/nvidia.com~1gpu" in [op["path"] for op in result.patch]
    assert at(result.object, template_path) == shared_template(kind)
    after = apply(obj, result.patch)
    assert at(after, template_path) == shared_template(kind)
    assert after == result.object
    assert dry_run(after, view).patch == []


def test_workload_template_annotations_of_its_own_are_kept_beside_the_policys() -> None:
    """A template that already carries annotations shows them and kubeon's; the patch adds only kubeon's."""
    template = {"metadata": {"labels": {"app": "llm"}, "annotations": {"team": "search"}},
                "spec": {"containers": [CONTAINER]}}
    obj = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "llm", "namespace": "ml"},
           "spec": {"template": template}}
    result = dry_run(obj, make_view(make_policy()))
    rewritten = '{"c":{"limits":{"nvidia.com/gpu":"1"}}}'
    expected = {"team": "search", "gpu.kubeon.io/policy": "share", "gpu.kubeon.io/rewritten-from": rewritten}
    assert result.object["spec"]["template"]["metadata"] == {"labels": {"app": "llm"}, "annotations": expected}
    assert apply(obj, result.patch)["spec"]["template"]["metadata"]["annotations"] == expected
    assert {"op": "add", "path": "/spec/template/metadata/annotations/gpu.kubeon.io~1policy",
            "value": "share"} in result.patch


@pytest.mark.parametrize("kind", ["Pod", "Deployment", "CronJob"])
def test_guardrail_warnings_are_shown_beside_mutation_warnings(kind: str) -> None:
    """A Recommend guardrail's warning is part of the dry-run answer, after the sharing policy's own: the user
    sees every warning kubectl would print for the pods."""
    obj, _ = WORKLOADS[kind]
    view = make_view(make_policy(mode="Recommend"),
                     make_policy("guard", mode="Recommend", guardrail={"maxGpusPerPod": 0}))
    result = dry_run(obj, view)
    assert result.allowed and result.patch == []
    assert result.warnings == ["kubeon-gpu share (Recommend): would use nvidia.com/mig-1g.10gb",
                               "kubeon-gpu guard: pod asks for 1 GPUs, more than maxGpusPerPod 0"]


def test_guardrail_warning_on_the_mutated_pod_is_shown() -> None:
    """The guardrail judges the slice the pod would get: its warning names that slice."""
    obj, _ = WORKLOADS["Deployment"]
    view = make_view(make_policy(),
                     make_policy("guard", mode="Recommend", guardrail={"allowedGpuResources": ["nvidia.com/gpu"]}))
    result = dry_run(obj, view)
    assert result.allowed
    assert result.warnings == ["kubeon-gpu guard: nvidia.com/mig-1g.10gb is not in allowedGpuResources"]
    assert [(d.policy, d.action) for d in result.decisions] == [("share", "UseMIG"), ("guard", "Warn")]


@pytest.mark.parametrize("owner_kind", ["Deployment", "CronJob"])
def test_workload_is_the_owner_for_approvals(owner_kind: str) -> None:
    obj, _ = WORKLOADS[owner_kind]
    approved = make_view(make_policy(mode="Approve", approvals=[f"{owner_kind}/ml/llm"]))
    other = make_view(make_policy(mode="Approve", approvals=["Deployment/ml/other"]))
    assert dry_run(obj, approved).patch
    assert dry_run(obj, other).patch == []


def test_guardrail_runs_on_mutated_pod() -> None:
    view = make_view(make_policy(), make_policy("guard", guardrail={"allowedGpuResources": ["nvidia.com/gpu"]}))
    result = dry_run(make_pod(), view)
    assert not result.allowed and "nvidia.com/mig-1g.10gb is not in allowedGpuResources" in result.message


@pytest.mark.parametrize(
    ("obj", "message"),
    [("pod", "object: must be"), ({"kind": "ConfigMap"}, "object.kind: 'ConfigMap'"),
     ({"kind": "Deployment", "metadata": {"name": "x"}, "spec": {}}, "object.spec.template: missing")],
    ids=["not-object", "unsupported-kind", "no-template"],
)
def test_bad_objects(obj, message: str) -> None:
    with pytest.raises(DryRunError, match=message.replace("(", r"\(").replace("[", r"\[")):
        dry_run(obj, make_view())


def test_request_view_overrides() -> None:
    body = {"policies": [make_policy("from-body").to_wire()],
            "namespace": {"name": "ml", "labels": {"team": "a"}},
            "nodes": [{"metadata": {"name": "n", "labels": {"nvidia.com/gpu.product": "NVIDIA-H200"}}}]}
    view = view_for_request(body, make_view(make_policy("base")))
    assert [p.name for p in view.policies] == ["from-body"]
    assert view.labels_of_namespace("ml")["team"] == "a"
    assert view.node_products()[0].product == "NVIDIA-H200"
    with pytest.raises(DryRunError, match=r"policies\[0\]\.spec\.mode"):
        view_for_request({"policies": [{"metadata": {"name": "x"}, "spec": {"mode": "No", "guardrail": {}}}]},
                         make_view())
