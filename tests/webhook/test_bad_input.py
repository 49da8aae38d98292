"""Issue 15 regressions for the webhook, one minimal input per defect: 400/413 JSON, never 500.

Real: the Flask app from webhook.app.create_app, the decision core and the
shared JSON reader/writer (serving.http); Faked: the transport (Flask's test
client; tests/serving/test_server.py sends oversize bodies over real TLS).
"""

from __future__ import annotations

import copy
import json

import pytest

from tests.cluster.objects import make_deployment
from tests.webhook.payloads import SHARE, api_pod, policy_review, review


def _post(client, path: str, raw: bytes):
    resp = client.post(path, data=raw, content_type="application/json")
    body = resp.get_json()  # always JSON
    assert body is not None, resp.get_data()[:200]
    return resp.status_code, body


def _deep(levels: int) -> str:
    return "[" * levels + "]" * levels


POD = api_pod()


@pytest.mark.parametrize("path", ["/mutate", "/validate", "/dry-run"])
@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        pytest.param(_deep(100_000).encode(), "depth limit", id="nesting-beyond-the-parser"),
        pytest.param(b'{"kind": ' + b"1" * 5000 + b"}", None, id="int-over-4300-digits"),
        pytest.param(b'{"kind": "\\ud800"}', "lone surrogate", id="lone-surrogate-escape"),
        pytest.param(b'{"kind": "\xed\xa0\x80"}', "not UTF-8", id="surrogate-bytes"),
        pytest.param(b'{"kind": NaN}', "unexpected character", id="nan"),
        pytest.param(b"\xef\xbb\xbf{}", "byte order mark", id="bom"),
    ],
)
def test_json_edges_are_400(client, path: str, raw: bytes, needle: str | None) -> None:
    status, body = _post(client, path, raw)
    assert status == 400, body
    assert needle is None or needle in body["error"]


def _with_object(obj) -> bytes:
    return json.dumps(review(obj)).encode()


@pytest.mark.parametrize("path", ["/mutate", "/validate"])
def test_deep_pod_field_is_answered(client, path: str) -> None:
    """A pod nested past the writer's 254 levels (parsed: orjson reads 1,024) is reviewed like any other."""
    pod = copy.deepcopy(POD)
    pod["spec"]["tolerations"].append({"key": "k", "operator": "Exists", "x": json.loads(_deep(400))})
    status, body = _post(client, path, _with_object(pod))
    assert status == 200 and body["response"]["allowed"] is True
    assert "internal error" not in json.dumps(body)


def test_deep_dry_run_object_is_400(client) -> None:
    pod = copy.deepcopy(POD)
    pod["spec"]["x"] = json.loads(_deep(400))
    status, body = _post(client, "/dry-run", json.dumps({"object": pod}).encode())
    assert status == 400 and "nested too deeply" in body["error"]


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda p: p.__setitem__("metadata", []), "request.object.metadata: must be an object"),
        (lambda p: p["metadata"].__setitem__("labels", ["a"]), "request.object.metadata.labels: must be a map"),
        (lambda p: p["spec"]["containers"][0].__setitem__("resources", []),
         "request.object.spec.containers[0].resources: must be an object"),
        (lambda p: p["spec"]["containers"][0]["resources"].__setitem__("limits", "1"),
         "request.object.spec.containers[0].resources.limits: must be a map"),
        (lambda p: p["spec"]["containers"][0]["resources"]["limits"].__setitem__("memory", "1e400000"),
         "request.object.spec.containers[0].resources.limits.memory: '1e400000' is larger"),
    ],
)
@pytest.mark.parametrize("path", ["/mutate", "/validate"])
def test_shape_errors_name_the_field(client, path: str, mutate, field: str) -> None:
    pod = copy.deepcopy(POD)
    mutate(pod)
    status, body = _post(client, path, _with_object(pod))
    assert status == 400 and body["error"].startswith(field), body


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"object": {**POD, "metadata": "x"}}, "object.metadata: must be an object"),
        ({"object": POD, "nodes": [{"metadata": {"name": "n"}, "status": {"allocatable": []}}]},
         "nodes[0].status.allocatable: must be a map"),
        ({"object": POD, "policies": [{**SHARE, "spec": {**SHARE["spec"], "sharing": {
            "strategy": "MIG", "gpuMemory": "1e1000000"}}}]}, "policies[0].spec.sharing.gpuMemory"),
        ({"object": {"kind": "Deployment", "spec": {"template": {"spec": {"containers": {}}}}}},
         "object.spec.template.spec.containers: must be a list"),
    ],
)
def test_dry_run_shape_errors_are_400_not_422(client, body, field: str) -> None:
    status, answer = _post(client, "/dry-run", json.dumps(body).encode())
    assert status == 400 and answer["error"].startswith(field), answer


def test_poisoned_policy_is_refused_naming_the_field(client) -> None:
    """Issue 15 defect 1: `gpuMemory: 1e1000000` raised decimal.Overflow and /validate failed open."""
    bad = copy.deepcopy(SHARE)
    bad["spec"]["sharing"]["gpuMemory"] = "1e1000000"
    resp = client.post("/validate", json=policy_review(bad)).get_json()["response"]
    assert resp["allowed"] is False
    assert "spec.sharing.gpuMemory" in resp["status"]["message"] and "largest quantity" in resp["status"]["message"]


def test_long_strings_are_not_echoed_whole(client) -> None:
    status, body = _post(client, "/mutate", json.dumps({"kind": "x" * 100_000}).encode())
    assert status == 400 and len(body["error"]) < 200


def test_a_workload_nested_600_levels_is_evaluated_not_a_422(client) -> None:
    """The dry-run deep-copied the workload: RecursionError, answered 422 "could not evaluate"."""
    deployment = make_deployment("llm", "inference", gpus=1)
    deployment["spec"]["template"]["spec"]["x"] = json.loads(_deep(600))
    status, body = _post(client, "/dry-run", json.dumps({"object": deployment}).encode())
    assert status == 400 and "nested too deeply" in body["error"], body  # the answer echoes the object
    deployment["spec"]["template"]["spec"]["x"] = json.loads(_deep(200))
    status, body = _post(client, "/dry-run", json.dumps({"object": deployment}).encode())
    assert status == 200 and body["patch"], body


def test_a_policy_nested_600_levels_is_labelled_not_an_internal_error(client) -> None:
    policy = copy.deepcopy(SHARE)
    policy["metadata"]["x"] = json.loads(_deep(600))
    status, body = _post(client, "/mutate", json.dumps(policy_review(policy)).encode())
    assert status == 200 and "internal error" not in json.dumps(body), body


@pytest.mark.parametrize("field", ["metadata", "spec"])
def test_a_pod_with_null_metadata_or_spec_is_reviewed(client, field: str) -> None:
    """Found by the 10,000-example run: `metadata: null` reached the core, which wrote into None."""
    pod = copy.deepcopy(POD)
    pod[field] = None
    status, body = _post(client, "/mutate", _with_object(pod))
    assert status == 200 and "internal error" not in json.dumps(body), body


@pytest.mark.parametrize(("literal", "column"), [("1" + "0" * 30, 90), ("-9223372036854775809", 90),
                                                 ("18446744073709551616", 90)])
def test_dry_run_refuses_an_integer_it_could_not_echo(client, literal: str, column: int) -> None:
    """Issue 37, smaller: an integer beyond 64 bits came back as a float (10^30 as 1e+30), so object plus patch
    no longer equalled the answer's object. Every Kubernetes integer is int64: 400 naming where it is."""
    raw = ('{"object": {"kind": "Pod", "apiVersion": "v1", "spec": {"terminationGracePeriodSeconds": '
           + literal + ', "containers": []}, "metadata": {"name": "p", "uid": "12345678901234567890123"}}}')
    status, body = _post(client, "/dry-run", raw.encode())
    assert status == 400
    assert body["error"] == (f"integer {literal[:24]}{'...' if len(literal) > 24 else ''} at line 1 column {column} "
                             "is beyond 64 bits (Kubernetes integers are int64)")


def test_dry_run_echoes_every_64_bit_integer_exactly(client) -> None:
    """The answer's object is the object sent plus the patch, integers at both ends of 64 bits included."""
    pod = copy.deepcopy(POD)
    pod["spec"]["terminationGracePeriodSeconds"] = 2**64 - 1
    pod["spec"]["activeDeadlineSeconds"] = -(2**63)
    pod["metadata"]["annotations"] = {"note": "9" * 40}  # digits in a string are not an integer
    status, body = _post(client, "/dry-run", json.dumps({"object": pod}).encode())
    assert status == 200, body
    import jsonpatch

    assert jsonpatch.apply_patch(pod, body["patch"]) == body["object"]
    assert body["object"]["spec"]["terminationGracePeriodSeconds"] == 2**64 - 1
