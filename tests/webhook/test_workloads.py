"""Workload objects at /validate: the warnings their pods would get, never a patch or a denial.

Real: the Flask app from webhook.app.create_app and the decision core;
AdmissionReviews shaped as kube-apiserver sends them for apps/v1
Deployments and StatefulSets and batch/v1 Jobs and CronJobs (API defaults
applied in the pod template). Faked: no TLS/gunicorn (the end-to-end test
covers `kubectl create -f deployment.yaml` through the real server) and the
ClusterView is static (tests/webhook/conftest.py: Automatic MIG in
`inference`, Recommend time-slicing in `research`, a 2-GPU guardrail in
`training`).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpupolicy.cluster import ClusterView
from gpupolicy.model import parse_policy
from kube.views import StaticView
from tests.webhook.conftest import example_view
from tests.webhook.payloads import SHARE, api_pod, review
from webhook.app import create_app

WORKLOADS = {  # kind -> (group, resource)
    "Deployment": ("apps", "deployments"),
    "StatefulSet": ("apps", "statefulsets"),
    "Job": ("batch", "jobs"),
    "CronJob": ("batch", "cronjobs"),
}


def template(gpus: str = "1", resource: str = "nvidia.com/gpu", labels: dict | None = None) -> dict[str, Any]:
    """A pod template as stored after API defaulting: the pod's spec without the per-pod parts."""
    spec = copy.deepcopy(api_pod(gpus, resource=resource)["spec"])
    for key in ("volumes", "serviceAccount", "priority", "enableServiceLinks", "preemptionPolicy", "tolerations"):
        spec.pop(key, None)
    spec["containers"][0].pop("volumeMounts")
    return {"metadata": {"creationTimestamp": None, "labels": {"app": "llm", **(labels or {})}}, "spec": spec}


def workload(kind: str, namespace: str, pod_template: dict[str, Any], name: str = "llm") -> dict[str, Any]:
    group = WORKLOADS[kind][0]
    selector = {"matchLabels": {"app": "llm"}}
    if kind == "CronJob":
        spec: dict[str, Any] = {"schedule": "*/5 * * * *", "concurrencyPolicy": "Allow", "suspend": False,
                                "jobTemplate": {"metadata": {}, "spec": {"template": pod_template}}}
    elif kind == "Job":
        spec = {"backoffLimit": 6, "completions": 1, "parallelism": 1, "template": pod_template}
        pod_template["spec"]["restartPolicy"] = "Never"
    else:
        spec = {"replicas": 2, "selector": selector, "template": pod_template}
    return {"apiVersion": f"{group}/v1", "kind": kind,
            "metadata": {"name": name, "namespace": namespace, "uid": "6f1c2d3e-0000-4000-8000-000000000001",
                         "generation": 1, "creationTimestamp": None, "labels": {"app": "llm"}},
            "spec": spec, "status": {}}


def workload_review(obj: dict[str, Any], operation: str = "CREATE", old: Any = None) -> dict[str, Any]:
    group, resource = WORKLOADS[obj["kind"]]
    return review(obj, namespace=obj["metadata"]["namespace"], operation=operation, group=group,
                  kind=obj["kind"], resource=resource, name=obj["metadata"]["name"], old=old)


def answer(client, path: str, body: dict[str, Any]) -> dict[str, Any]:
    resp = client.post(path, json=body)
    assert resp.status_code == 200, resp.get_data(as_text=True)
    return resp.get_json()["response"]


@pytest.mark.parametrize("kind", list(WORKLOADS))
@pytest.mark.parametrize("operation", ["CREATE", "UPDATE"])
def test_workload_gets_the_warnings_its_pods_get(client, kind: str, operation: str) -> None:
    obj = workload(kind, "research", template())
    old = copy.deepcopy(obj) if operation == "UPDATE" else None
    got = answer(client, "/validate", workload_review(obj, operation, old))
    pod_warnings = answer(client, "/mutate", review(api_pod(), namespace="research"))["warnings"]
    assert got["allowed"] is True and "patch" not in got and "status" not in got
    assert got["warnings"] == pod_warnings
    assert "notebooks (Recommend): would use nvidia.com/gpu.shared" in got["warnings"][0]
    assert all(len(w) < 120 for w in got["warnings"])


@pytest.mark.parametrize("kind", list(WORKLOADS))
def test_workloads_are_never_patched(client, kind: str) -> None:
    """Automatic policy: the pods will be rewritten at creation; the workload object is left as sent."""
    body = workload_review(workload(kind, "inference", template()))
    assert answer(client, "/validate", body) == {"uid": body["request"]["uid"], "allowed": True}
    assert answer(client, "/mutate", body) == {"uid": body["request"]["uid"], "allowed": True}


def test_approve_mode_names_the_workload_to_approve() -> None:
    policy = copy.deepcopy(SHARE)
    policy["spec"]["mode"] = "Approve"
    policy["spec"]["approvals"] = ["Deployment/inference/approved"]
    view = ClusterView(policies=(parse_policy(policy),), metrics_configured=True)
    client = create_app(StaticView(view)).test_client()
    pending = answer(client, "/validate", workload_review(workload("Deployment", "inference", template())))
    assert len(pending["warnings"]) == 1
    assert "approve Deployment/inference/llm" in pending["warnings"][0] and len(pending["warnings"][0]) < 120
    approved = answer(client, "/validate", workload_review(workload("Deployment", "inference", template(),
                                                                    name="approved")))
    assert approved["allowed"] is True and "warnings" not in approved


def test_cronjob_approval_covers_its_jobs_pods_not_others() -> None:
    policy = copy.deepcopy(SHARE)
    policy["spec"].update(mode="Approve", approvals=["CronJob/inference/nightly"])
    view = ClusterView(policies=(parse_policy(policy),), metrics_configured=True)
    client = create_app(StaticView(view)).test_client()
    ok = answer(client, "/validate", workload_review(workload("CronJob", "inference", template(), "nightly")))
    assert "warnings" not in ok
    other = answer(client, "/validate", workload_review(workload("CronJob", "inference", template(), "weekly")))
    assert "approve CronJob/inference/weekly" in other["warnings"][0]


def test_guardrail_denial_of_the_pods_is_a_warning_on_the_workload(client) -> None:
    got = answer(client, "/validate", workload_review(workload("Job", "training", template("4"))))
    assert got["allowed"] is True and "status" not in got
    assert got["warnings"] == ["kubeon-gpu: pods would be denied: GpuPolicy max-two: pod asks for 4 GPUs, "
                               "more than maxGpusPerPod 2"]
    pod = answer(client, "/validate", review(api_pod("4"), namespace="training"))
    assert pod["allowed"] is False  # the pods themselves are still denied at creation


@pytest.mark.parametrize(("namespace", "labels"), [("kube-system", None), ("kubeon-gpu", None),
                                                   ("research", {"gpu.kubeon.io/skip": "true"})])
def test_out_of_scope_workloads_get_nothing(client, namespace: str, labels: dict | None) -> None:
    body = workload_review(workload("Deployment", namespace, template(labels=labels)))
    assert answer(client, "/validate", body) == {"uid": body["request"]["uid"], "allowed": True}


@pytest.mark.parametrize("kind", list(WORKLOADS))
def test_non_gpu_workloads_are_answered_without_the_view(kind: str) -> None:
    """The fast path: a template naming no GPU resource never reaches the core (here: a view that raises)."""
    class Unreachable(StaticView):
        def current(self) -> ClusterView:
            raise AssertionError("the view was read for a workload without GPUs")

    client = create_app(Unreachable(example_view())).test_client()
    plain = template()
    for section in ("limits", "requests"):
        plain["spec"]["containers"][0]["resources"][section].pop("nvidia.com/gpu")
    body = workload_review(workload(kind, "research", plain))
    assert answer(client, "/validate", body) == {"uid": body["request"]["uid"], "allowed": True}
    gpu = answer(client, "/validate", workload_review(workload(kind, "research", template())))
    assert "internal error" in gpu["warnings"][0]  # the same client does read the view for a GPU template


def test_malformed_template_is_400_naming_the_field(client) -> None:
    obj = workload("Deployment", "research", template())
    obj["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] = ["nvidia.com/gpu"]
    obj["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"] = {"nvidia.com/gpu": "1"}
    resp = client.post("/validate", json=workload_review(obj))
    assert resp.status_code == 400
    assert "request.object.spec.template.spec.containers[0].resources.limits" in resp.get_json()["error"]


def test_workload_delete_is_allowed_unchanged(client) -> None:
    obj = workload("Deployment", "research", template())
    body = review(None, namespace="research", operation="DELETE", group="apps", kind="Deployment",
                  resource="deployments", name="llm", old=obj)
    assert answer(client, "/validate", body) == {"uid": body["request"]["uid"], "allowed": True}
