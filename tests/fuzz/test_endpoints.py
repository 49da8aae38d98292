"""Issue 15: every endpoint answers hostile input with 200/400/413 JSON, within 1 s, never an internal error.

Property-based (hypothesis): valid objects (Pod and workload AdmissionReviews,
GpuPolicy reviews, dry-run bodies, ExtenderArgs with NodeNames or Nodes) and
structure-aware mutations of them (tests/fuzz/strategies.py), plus truncated
JSON, random bytes and 1-10 MB bodies. For admission, a 200 echoes the uid and
its patch applies to the object sent; for the extender, answers only name
nodes that were sent. The decision core's safety nets (the webhook's "internal
error, admitted unchanged", the extender's "internal error" Error) must never
fire: each would be a bug reached by input.

Real: the webhook and extender Flask apps with the decision core, the
extender's node model fed with real Node dicts. Faked: the transport (Flask's
test client) and the watches (static views).

CI runs a fixed seed (derandomize) and KUBEON_FUZZ_EXAMPLES examples per
endpoint (default 60); the long run is documented in docs/benchmarks/history/robustness.md:
`KUBEON_FUZZ_EXAMPLES=10000 KUBEON_FUZZ_REPORT=/tmp/fuzz.json python3 -m pytest -q --timeout=0 tests/fuzz`
(`--timeout=0`: a 10,000-example test runs past the suite's 300 s per-test limit).
"Within 1 s" is measured as the handling thread's CPU time (the test client runs
the app in the test's thread), so it bounds the work and not the wait for a
core on a loaded machine; the report has both.
"""

from __future__ import annotations

import base64
import json
import os
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import jsonpatch
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kube.views import StaticView
from tests.cluster.objects import make_deployment, make_node
from tests.extender.payloads import Harness, wire_pod
from tests.fuzz.strategies import bodies, mutated
from tests.webhook.conftest import example_view
from tests.webhook.payloads import GUARD, NOTEBOOKS, SHARE, api_pod, policy_review, review
from webhook.app import INTERNAL_WARNING, create_app

EXAMPLES = int(os.environ.get("KUBEON_FUZZ_EXAMPLES", "60"))
LIMIT_S = 1.0
FUZZ = settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.large_base_example])
STATS: dict[str, dict[str, Any]] = {}

A100 = "NVIDIA-A100-SXM4-80GB"
NODES = [make_node("a100-0", A100, 8), make_node("a100-mig", A100, 2, mig={"1g.10gb": 7}),
         make_node("t4", "Tesla-T4", 2, shared_replicas=4), make_node("cpu-0", None, 0)]
NAMES = [n["metadata"]["name"] for n in NODES]


def _deployment_review() -> dict[str, Any]:
    deployment = make_deployment("llm", "inference", gpus=1)
    return review(deployment, group="apps", kind="Deployment", resource="deployments", name="llm")


ADMISSION_BASES = [
    review(api_pod()), review(api_pod("2"), namespace="training"), review(api_pod(), namespace="research"),
    review(api_pod(resource="nvidia.com/gpu.shared", annotations={"gpu.kubeon.io/gpu-memory": "8Gi"})),
    policy_review(SHARE), policy_review(GUARD), _deployment_review(),
]
DRY_RUN_BASES = [
    {"object": api_pod()},
    {"object": make_deployment("llm", "inference", gpus=1), "policies": [SHARE, NOTEBOOKS],
     "nodes": NODES[:2], "namespace": {"name": "inference", "labels": {"team": "a"}}},
    {"object": {**make_deployment("job", "training", gpus=2), "kind": "Job", "apiVersion": "batch/v1"},
     "policies": [GUARD]},
]
EXTENDER_BASES = [
    {"Pod": wire_pod("p", gpus=1), "Nodes": None, "NodeNames": NAMES},
    {"Pod": wire_pod("m", gpus=1, gpu_resource="nvidia.com/mig-1g.10gb"), "Nodes": None, "NodeNames": NAMES},
    {"Pod": wire_pod("s", gpus=1, gpu_resource="nvidia.com/gpu.shared", cpu="2"), "NodeNames": None,
     "Nodes": {"apiVersion": "v1", "kind": "NodeList", "metadata": {}, "items": NODES}},
]


def objects(bases: list[dict[str, Any]]) -> st.SearchStrategy[Any]:
    return st.sampled_from(bases).flatmap(mutated)


WEBHOOK = create_app(StaticView(example_view()))
EXTENDER = Harness(NODES)


def _post(app_client: Any, endpoint: str, raw: bytes) -> tuple[int, Any]:
    """Post through the test client, which runs the app in this thread: its CPU time is the request's."""
    start, cpu = time.perf_counter(), time.thread_time()
    resp = app_client.post(endpoint, data=raw, content_type="application/json")
    elapsed, used = time.perf_counter() - start, time.thread_time() - cpu
    stats = STATS.setdefault(endpoint, {"examples": 0, "status": Counter(), "max_s": 0.0, "max_cpu_s": 0.0})
    stats["examples"] += 1
    stats["status"][resp.status_code] += 1
    stats["max_s"] = max(stats["max_s"], elapsed)
    stats["max_cpu_s"] = max(stats["max_cpu_s"], used)
    assert resp.status_code in (200, 400, 413), resp.get_data()[:300]
    assert resp.mimetype == "application/json"
    body = orjson.loads(resp.get_data())
    # CPU time, not wall time: the bound is on the work (the defects were CPU-bound, 23 s in one
    # request); on this 2-core machine shared by other agents wall time also counts waiting for a core.
    assert used < LIMIT_S, f"{endpoint} took {used:.2f} s of CPU ({elapsed:.2f} s wall)"
    if resp.status_code != 200:
        assert isinstance(body, dict) and isinstance(body.get("error"), str) and len(body["error"]) < 2000
    return resp.status_code, body


def _sent(raw: bytes) -> Any:
    return orjson.loads(raw)  # a 200 means the server parsed it, with the same parser


def _applies(obj: Any, patch_b64: str | None) -> None:
    if patch_b64:
        patch = json.loads(base64.b64decode(patch_b64))
        jsonpatch.apply_patch(obj, patch, in_place=True)  # raises if the patch does not apply


def _check_admission(endpoint: str, raw: bytes) -> None:
    status, body = _post(WEBHOOK.test_client(), endpoint, raw)
    if status != 200:
        return
    sent = _sent(raw)
    answer = body["response"]
    assert answer["uid"] == sent["request"]["uid"] and body["apiVersion"] == sent["apiVersion"]
    assert not any(w.startswith(INTERNAL_WARNING) for w in answer.get("warnings") or [])
    _applies(sent["request"].get("object"), answer.get("patch"))


@FUZZ
@given(bodies(objects(ADMISSION_BASES)))
def test_mutate(raw: bytes) -> None:
    _check_admission("/mutate", raw)


@FUZZ
@given(bodies(objects(ADMISSION_BASES)))
def test_validate(raw: bytes) -> None:
    _check_admission("/validate", raw)


@FUZZ
@given(bodies(objects(DRY_RUN_BASES)))
def test_dry_run(raw: bytes) -> None:
    status, body = _post(WEBHOOK.test_client(), "/dry-run", raw)
    if status == 200:
        assert isinstance(body["allowed"], bool)
        patch = body.get("patch") or []
        jsonpatch.apply_patch(_sent(raw)["object"], patch, in_place=True)


def _sent_names(raw: bytes) -> set[str]:
    sent = _sent(raw)
    names = sent.get("NodeNames")
    if isinstance(names, list):
        return set(names)
    return {n["metadata"]["name"] for n in sent["Nodes"]["items"]}


@FUZZ
@given(bodies(objects(EXTENDER_BASES)))
def test_filter(raw: bytes) -> None:
    status, body = _post(EXTENDER.client, "/filter", raw)
    if status != 200:
        return
    assert "internal error" not in body["Error"], body["Error"]
    if body["Error"]:
        return
    names = _sent_names(raw)
    passed = body["NodeNames"] if body["Nodes"] is None else [n["metadata"]["name"] for n in body["Nodes"]["items"]]
    assert set(passed) | set(body["FailedNodes"]) | set(body["FailedAndUnresolvableNodes"]) <= names


@FUZZ
@given(bodies(objects(EXTENDER_BASES)))
def test_prioritize(raw: bytes) -> None:
    status, body = _post(EXTENDER.client, "/prioritize", raw)
    if status == 200:
        names = _sent_names(raw)
        assert isinstance(body, list)
        assert all(entry["Host"] in names and 0 <= entry["Score"] <= 10 for entry in body)


@pytest.fixture(scope="module", autouse=True)
def _report() -> Iterator[None]:
    yield
    target = os.environ.get("KUBEON_FUZZ_REPORT")
    if target:
        with open(target, "w", encoding="utf-8") as out:
            json.dump({k: {**v, "status": dict(v["status"])} for k, v in STATS.items()}, out, indent=1)

