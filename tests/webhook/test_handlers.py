"""Webhook handlers on kube-apiserver-shaped AdmissionReviews, through Flask's test client.

Real: the Flask app from webhook.app.create_app, the decision core, the
prometheus registry; patches decoded from base64 and applied with jsonpatch.
Faked: no TLS/gunicorn here (tests/webhook/test_https.py covers the real
server) and the ClusterView is static.
"""

from __future__ import annotations

import base64
import copy
import json

import jsonpatch
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kube.views import StaticView
from tests.webhook.conftest import example_view
from tests.webhook.payloads import GUARD, SHARE, api_pod, policy_review, review
from webhook.app import create_app


def decoded_patch(resp: dict) -> list:
    raw = resp["response"].get("patch")
    return json.loads(base64.b64decode(raw)) if raw else []


def test_mutate_rewrites_and_second_pass_is_empty(client) -> None:
    pod = api_pod()
    body = review(pod)
    resp = client.post("/mutate", json=body).get_json()
    assert resp["apiVersion"] == "admission.k8s.io/v1" and resp["kind"] == "AdmissionReview"
    assert resp["response"]["uid"] == body["request"]["uid"]
    assert resp["response"]["allowed"] is True and resp["response"]["patchType"] == "JSONPatch"
    after = jsonpatch.apply_patch(pod, decoded_patch(resp))
    container = after["spec"]["containers"][0]["resources"]
    assert container["limits"]["nvidia.com/mig-1g.10gb"] == "1" and "nvidia.com/gpu" not in container["requests"]
    assert after["spec"]["schedulerName"] == "kubeon-gpu-scheduler"
    assert after["metadata"]["annotations"]["gpu.kubeon.io/policy"] == "share-inference"
    again = client.post("/mutate", json=review(after)).get_json()
    assert again["response"]["allowed"] is True and "patch" not in again["response"]


def test_recommend_warns_without_patch(client) -> None:
    resp = client.post("/mutate", json=review(api_pod(), namespace="research")).get_json()["response"]
    assert "patch" not in resp and resp["allowed"] is True
    assert resp["warnings"] and all(len(w) < 120 for w in resp["warnings"])


@pytest.mark.parametrize(("namespace", "skip"), [("kube-system", False), ("kubeon-gpu", False),
                                                  ("inference", True)])
def test_untouched_pods(client, namespace: str, skip: bool) -> None:
    pod = api_pod(labels={"gpu.kubeon.io/skip": "true"} if skip else None)
    resp = client.post("/mutate", json=review(pod, namespace=namespace)).get_json()["response"]
    assert resp == {"uid": resp["uid"], "allowed": True}


def test_guardrail_denies_with_status(client) -> None:
    resp = client.post("/validate", json=review(api_pod("3"), namespace="training")).get_json()["response"]
    assert resp["allowed"] is False
    assert resp["status"]["code"] == 403 and "maxGpusPerPod 2" in resp["status"]["message"]
    ok = client.post("/validate", json=review(api_pod("2"), namespace="training")).get_json()["response"]
    assert ok["allowed"] is True


@pytest.mark.parametrize(
    ("spec_patch", "message"),
    [({"mode": "Often"}, "spec.mode"), ({"guardrail": {}}, "spec: exactly one of"),
     ({"sharing": {"strategy": "MIG", "migProfile": "1g.18gb", "gpuModels": ["NVIDIA-A100-SXM4-80GB"]}},
      "spec.sharing.migProfile"),
     ({"sharing": {"strategy": "TimeSlicing", "replicas": 1}}, "spec.sharing.replicas"),
     ({"sharing": {"strategy": "MIG", "gpuMemory": "lots"}}, "spec.sharing.gpuMemory")],
    ids=["mode", "two-bodies", "profile", "replicas", "quantity"],
)
@pytest.mark.parametrize("operation", ["CREATE", "UPDATE"])
def test_invalid_policy_denied_naming_field(client, spec_patch: dict, message: str, operation: str) -> None:
    policy = copy.deepcopy(SHARE)
    policy["spec"].update(spec_patch)
    resp = client.post("/validate", json=policy_review(policy, operation)).get_json()["response"]
    assert resp["allowed"] is False and resp["status"]["code"] == 422
    assert message in resp["status"]["message"]


def test_valid_policy_allowed_and_labelled(client) -> None:
    assert client.post("/validate", json=policy_review(GUARD)).get_json()["response"]["allowed"] is True
    resp = client.post("/mutate", json=policy_review(GUARD)).get_json()
    labelled = jsonpatch.apply_patch(GUARD, decoded_patch(resp))
    assert labelled["metadata"]["labels"]["gpu.kubeon.io/kind"] == "guardrail"


def test_editing_a_hub_managed_policy_warns_that_the_sync_overwrites_it(client) -> None:
    old = copy.deepcopy(GUARD)
    old["metadata"]["labels"] = {"gpu.kubeon.io/managed-by": "hub", "gpu.kubeon.io/hub": "Connected"}
    edited = copy.deepcopy(old)
    edited["spec"]["priority"] = 99
    body = policy_review(edited, "UPDATE")
    body["request"]["oldObject"] = old
    resp = client.post("/validate", json=body).get_json()["response"]
    assert resp["allowed"] is True
    assert resp["warnings"] == ["kubeon-gpu: GpuPolicy max-two is managed by the hub: this edit is overwritten on "
                                "the next sync; change the policy in the hub instead"]
    relabelled = copy.deepcopy(old)
    relabelled["metadata"]["labels"]["gpu.kubeon.io/hub"] = "Disconnected"
    body = policy_review(relabelled, "UPDATE")
    body["request"]["oldObject"] = old
    assert "warnings" not in client.post("/validate", json=body).get_json()["response"]


@pytest.mark.parametrize("path", ["/mutate", "/validate"])
@pytest.mark.parametrize(
    "body",
    [review({"kind": "ConfigMap", "metadata": {"name": "c"}}, kind="ConfigMap", resource="configmaps"),
     review(None, operation="DELETE", name="p", old=api_pod()),
     review({"kind": "Deployment"}, group="apps", kind="Deployment", resource="deployments")],
    ids=["configmap", "pod-delete", "deployment"],
)
def test_unknown_objects_allowed_unchanged(client, path: str, body: dict) -> None:
    resp = client.post(path, json=body)
    assert resp.status_code == 200
    assert resp.get_json()["response"] == {"uid": body["request"]["uid"], "allowed": True}


@pytest.mark.parametrize(
    ("raw", "message"),
    [(b"{not json", "malformed JSON"), (b"[1, 2]", "JSON object"), (b'{"kind": "Pod"}', "unsupported kind"),
     (json.dumps({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1"}).encode(), "request"),
     (json.dumps({**review(api_pod()), "request": {**review(api_pod())["request"], "uid": ""}}).encode(),
      "request.uid"),
     (json.dumps({**review(api_pod()), "apiVersion": "v9"}).encode(), "apiVersion"),
     (json.dumps(review("a pod")).encode(), "request.object"),
     (b"\xff\xfe", "malformed JSON")],
    ids=["malformed", "array", "not-review", "no-request", "no-uid", "bad-version", "object-not-map", "binary"],
)
@pytest.mark.parametrize("path", ["/mutate", "/validate"])
def test_protocol_errors_are_400_json(client, path: str, raw: bytes, message: str) -> None:
    resp = client.post(path, data=raw, content_type="application/json")
    assert resp.status_code == 400
    assert message in resp.get_json()["error"]


def test_oversized_body_and_wrong_method_are_json(client) -> None:
    big = client.post("/mutate", data=b"x" * (4 * 1024 * 1024), content_type="application/json")
    assert big.status_code == 413 and "error" in big.get_json()
    get = client.get("/mutate")
    assert get.status_code == 405 and "error" in get.get_json()


def test_dry_run_endpoint(client) -> None:
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "llm", "namespace": "x"},
                  "spec": {"template": {"metadata": {"labels": {"app": "llm"}},
                                        "spec": api_pod()["spec"]}}}
    resp = client.post("/dry-run", json={"object": deployment, "policies": [SHARE],
                                         "namespace": {"name": "inference", "labels": {}}})
    answer = resp.get_json()
    assert resp.status_code == 200 and answer["allowed"] is True
    assert all(op["path"].startswith("/spec/template/") for op in answer["patch"])
    assert answer["decisions"][0]["action"] == "UseMIG"
    bad = client.post("/dry-run", json={"object": {"kind": "Secret"}})
    assert bad.status_code == 400 and "object.kind" in bad.get_json()["error"]
    assert client.post("/dry-run", json={"policies": []}).status_code == 400


def test_dry_run_endpoint_shows_the_template_annotations_and_guardrail_warnings(client) -> None:
    """POST /dry-run answers the workload as the cluster would run it: the template's kubeon annotations (what
    the webhook writes on its pods) and a Recommend guardrail's warning on the slice it was given."""
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "llm", "namespace": "inference"},
                  "spec": {"template": {"metadata": {"labels": {"app": "llm"}},
                                        "spec": {"containers": [{"name": "server", "image": "vllm",
                                                                 "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}}
    guard = {"apiVersion": "gpu.kubeon.io/v1alpha1", "kind": "GpuPolicy", "metadata": {"name": "whole-only"},
             "spec": {"mode": "Recommend", "selector": {"namespaces": ["inference"]},
                      "guardrail": {"allowedGpuResources": ["nvidia.com/gpu"]}}}
    resp = client.post("/dry-run", json={"object": deployment, "policies": [SHARE, guard],
                                         "namespace": {"name": "inference", "labels": {}}})
    answer = resp.get_json()
    assert resp.status_code == 200 and answer["allowed"] is True
    assert answer["object"]["spec"]["template"] == {
        "metadata": {"labels": {"app": "llm"}, "annotations": {
            "gpu.kubeon.io/policy": "share-inference",
            "gpu.kubeon.io/rewritten-from": '{"server":{"limits":{"nvidia.com/gpu":"1"}}}'}},
        "spec": {"containers": [{"name": "server", "image": "vllm",
                                 "resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}}}],
                 "schedulerName": "kubeon-gpu-scheduler",
                 "tolerations": [{"key": "nvidia.com/mig-1g.10gb", "operator": "Exists", "effect": "NoSchedule"}]},
    }
    assert answer["warnings"] == ["kubeon-gpu whole-only: nvidia.com/mig-1g.10gb is not in allowedGpuResources"]
    after = jsonpatch.apply_patch(copy.deepcopy(deployment), answer["patch"])
    assert after["spec"]["template"]["metadata"] == answer["object"]["spec"]["template"]["metadata"]


def test_metrics_count_decisions(client) -> None:
    client.post("/mutate", json=review(api_pod()))
    text = client.get("/metrics").get_data(as_text=True)
    assert ('kubeon_webhook_decisions_total{action="UseMIG",applied="true",mode="Automatic",'
            'policy="share-inference"} 1.0') in text
    assert 'kubeon_webhook_http_requests_total{route="/mutate",status="200"} 1.0' in text
    assert "kubeon_webhook_http_request_duration_seconds_bucket" in text


def test_core_bug_answers_allowed_not_500() -> None:
    class Broken(StaticView):
        def current(self):
            raise RuntimeError("boom")

    client = create_app(Broken(example_view())).test_client()
    resp = client.post("/mutate", json=review(api_pod()))
    assert resp.status_code == 200 and resp.get_json()["response"]["allowed"] is True
    assert "internal error" in resp.get_json()["response"]["warnings"][0]


def test_validating_webhook_fails_open_counted_and_logged_with_the_uid(caplog) -> None:
    """A guardrail check that raises admits the pod (fail open, as designed), and an operator can see it:
    kubeon_webhook_internal_errors_total{path="/validate"} and an ERROR log line naming the request uid."""
    class Broken(StaticView):
        def current(self):
            raise RuntimeError("boom")

    client = create_app(Broken(example_view())).test_client()
    with caplog.at_level("ERROR", logger="webhook.app"):
        resp = client.post("/validate", json=review(api_pod(), uid="0f1e2d3c-fail-open"))
    answer = resp.get_json()["response"]
    assert resp.status_code == 200 and answer["allowed"] is True and answer["uid"] == "0f1e2d3c-fail-open"
    assert any("/validate" in r.getMessage() and "0f1e2d3c-fail-open" in r.getMessage() and r.exc_info
               for r in caplog.records)
    text = client.get("/metrics").get_data(as_text=True)
    assert 'kubeon_webhook_internal_errors_total{path="/validate"} 1.0' in text
    client.post("/validate", json=review(api_pod()))
    assert 'kubeon_webhook_internal_errors_total{path="/validate"} 2.0' in \
        client.get("/metrics").get_data(as_text=True)


json_bodies = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=15,
)


def mutate_review_fields(draw_dict: dict) -> dict:
    body = review(api_pod())
    body["request"].update(draw_dict)
    return body


FUZZ_APP = create_app(StaticView(example_view()))


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["/mutate", "/validate", "/dry-run"]),
       st.one_of(st.binary(max_size=64), json_bodies.map(lambda v: json.dumps(v).encode()),
                 st.dictionaries(st.sampled_from(["uid", "kind", "object", "operation", "namespace", "oldObject"]),
                                 json_bodies, max_size=4).map(lambda d: json.dumps(mutate_review_fields(d)).encode()),
                 json_bodies.map(lambda v: json.dumps({"object": v, "policies": [SHARE]}).encode())))
def test_random_bodies_never_5xx(path: str, raw: bytes) -> None:
    errors = FUZZ_APP.extensions["kubeon_metrics"].errors
    before = sum(errors.labels(p)._value.get() for p in ("/mutate", "/validate", "/dry-run"))
    resp = FUZZ_APP.test_client().post(path, data=raw, content_type="application/json")
    assert resp.status_code < 500, resp.get_data(as_text=True)
    assert resp.is_json
    after = sum(errors.labels(p)._value.get() for p in ("/mutate", "/validate", "/dry-run"))
    assert after == before, "the decision core raised (answered by the safety net)"
