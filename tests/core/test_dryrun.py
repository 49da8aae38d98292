"""Dry-run over Pods and workloads (core); the command line is tested in tests/cli/.

Real: gpupolicy.admission.dryrun; patches applied with the `jsonpatch` library. Faked: nothing.
"""

from __future__ import annotations

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


@pytest.mark.parametrize("kind", list(WORKLOADS))
def test_workloads_patched_through_pod_template(kind: str) -> None:
    obj, container_path = WORKLOADS[kind]
    view = make_view(make_policy())
    result = dry_run(obj, view)
    assert result.allowed
    assert f"{container_path}/resources/limits/nvidia.com~1gpu" in [op["path"] for op in result.patch]
    after = apply(obj, result.patch)
    assert after == result.object
    assert dry_run(after, view).patch == []


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
