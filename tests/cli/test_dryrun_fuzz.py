"""Property: whatever file `kubeon-gpu dry-run -f` is given, it exits 0 or 2 within 1 s, never a traceback.

Generated: valid Pods and workloads, the same with a subtree replaced by a
value of the wrong type (lists, maps, huge or malformed quantities, deep
nesting, surrogate-free odd strings), written as YAML or JSON, then
sometimes truncated, spliced with random bytes, or replaced by random bytes
altogether. Real: the CLI in-process (an exception escaping `main` is the
traceback a user would see) on real files. Fixed seed, bounded examples;
docs/cli.md says how to run it longer.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import time
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

import cli.dryrun  # noqa: F401 - imported before the clock starts, as in a real run
from cli.main import main
from tests.cli.helpers import EXAMPLES, PROG

EXAMPLES_RUN = int(os.environ.get("KUBEON_FUZZ_EXAMPLES", "150"))

names = st.text("abcdefghij-0123456789", min_size=1, max_size=12)
quantities = st.one_of(
    st.sampled_from(["1", "2", "500m", "8Gi", "1e3", "0.5", "-1", "1e1000000", "9e99999Gi", "1Ki1", "", " ",
                     "0x10", "1e-1000000", "NaN", "inf", "1" * 400, "1.5e308"]),
    st.integers(min_value=-(10**30), max_value=10**30), st.floats(allow_nan=True), st.booleans(), st.none())
scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20), quantities)
junk = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                     st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                    max_leaves=8)


@st.composite
def containers(draw: Any) -> dict[str, Any]:
    resource = draw(st.sampled_from(["nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "cpu", "memory"]))
    return {"name": draw(names), "image": "x", "resources": {"limits": {resource: draw(quantities)}}}


@st.composite
def objects(draw: Any) -> dict[str, Any]:
    meta = {"name": draw(names), "namespace": draw(st.sampled_from(["inference", "research", "batch", "default"]))}
    if draw(st.booleans()):
        meta["annotations"] = {"gpu.kubeon.io/gpu-memory": draw(st.one_of(quantities, st.text(max_size=6)))}
    if draw(st.booleans()):
        meta["labels"] = {"app": draw(st.sampled_from(["jupyter", "llm", "x"]))}
    spec = {"containers": draw(st.lists(containers(), min_size=1, max_size=2))}
    kind = draw(st.sampled_from(["Pod", "Deployment", "Job", "CronJob", "StatefulSet", "Service", "List"]))
    if kind == "Pod":
        return {"apiVersion": "v1", "kind": kind, "metadata": meta, "spec": spec}
    if kind == "List":
        return {"apiVersion": "v1", "kind": "List", "items": [{"apiVersion": "v1", "kind": "Pod", "metadata": meta,
                                                               "spec": spec}]}
    template = {"metadata": {"labels": meta.get("labels", {})}, "spec": spec}
    body = {"jobTemplate": {"spec": {"template": template}}} if kind == "CronJob" else {"template": template}
    return {"apiVersion": "apps/v1", "kind": kind, "metadata": meta, "spec": body}


def paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix]
    if isinstance(obj, dict):
        for key, value in obj.items():
            found += paths(value, (*prefix, key))
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            found += paths(value, (*prefix, i))
    return found


@st.composite
def mutated(draw: Any) -> dict[str, Any]:
    obj = draw(objects())
    for _ in range(draw(st.integers(0, 3))):
        where = draw(st.sampled_from(paths(obj)[1:]))
        parent = obj
        for key in where[:-1]:
            parent = parent[key]
        replacement = draw(st.one_of(junk, st.just("DEEP")))
        parent[where[-1]] = replacement
    return obj


@st.composite
def files(draw: Any) -> bytes:
    docs = draw(st.lists(mutated(), min_size=1, max_size=4))
    if draw(st.booleans()):
        text = yaml.safe_dump_all(docs, sort_keys=False).encode()
    else:
        text = "\n".join(json.dumps(d) for d in docs).encode()  # JSON documents, one per line: valid YAML? often not
    depth = draw(st.sampled_from([50, 1500, 40_000]))
    text = text.replace(b"DEEP", b"[" * depth + b"]" * depth)
    how = draw(st.sampled_from(["as-is", "as-is", "truncate", "splice", "random"]))
    if how == "truncate":
        text = text[: draw(st.integers(0, len(text)))]
    elif how == "splice":
        at = draw(st.integers(0, len(text)))
        text = text[:at] + draw(st.binary(min_size=1, max_size=8)) + text[at:]
    elif how == "random":
        text = draw(st.binary(max_size=300))
    return text


@seed(20261201)
@settings(max_examples=EXAMPLES_RUN, deadline=None, derandomize=False,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                 HealthCheck.data_too_large])
@given(content=files(), output=st.sampled_from(["json", "yaml", "jsonl", "text"]))
def test_any_file_exits_0_or_2_within_a_second(tmp_path: Path, content: bytes, output: str) -> None:
    path = tmp_path / "input.yaml"
    path.write_bytes(content)
    out, err = io.StringIO(), io.StringIO()
    # CPU time of this thread, the one running the command (in-process, no I/O wait beyond a small
    # local file): what a pathological file could blow up (libyaml's quadratic nesting). Wall time
    # also counted every other process on a shared 2-core VM (1.44 s at load 20, docs/testing.md).
    started = time.thread_time()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["dry-run", "-f", str(path), "--policies", str(EXAMPLES / "policies.yaml"),
                     "--nodes", str(EXAMPLES / "nodes.yaml"), "-o", output])
    elapsed = time.thread_time() - started
    assert code in (0, 2), err.getvalue()
    assert elapsed < 1.0, f"{elapsed:.2f} s"
    lines = err.getvalue().splitlines()
    assert all(line.startswith(PROG) for line in lines), lines
    problems = [line for line in lines if not line.startswith(PROG + "note:")]
    assert (code == 2) == bool(problems), lines
    assert all(line.startswith(f"{PROG}{path}") for line in problems), problems
    if output in ("json", "jsonl") and code == 0:
        text = out.getvalue()
        entries = json.loads(text) if output == "json" else [json.loads(line) for line in text.splitlines()]
        assert entries and all({"allowed", "object", "patch"} <= set(e) for e in entries)
