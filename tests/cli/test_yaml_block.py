"""cli/yamlblock.py writes exactly what the libyaml dumper writes, on generated data and on dry-run answers.

Real: PyYAML's C dumper (CSafeDumper, through cli.writers' no-alias dumper)
is the reference for every document; hypothesis generates JSON-like data
whose strings mix the characters that decide quoting and folding (spaces,
`:`, `#`, `-`, `'`, digits, `true`/`null`-like words, long runs). Data the
direct writer does not reproduce must raise `Unsupported` (then
`yaml_document` uses the dumper), never write something else.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.dryrun import generate
from cli import yamlblock
from cli.writers import _NoAliasDumper, _reads_as_str, yaml_document
from tests.cli.test_dryrun_stream import in_memory_answers


def reference(data: Any) -> str:
    return str(yaml.dump(data, Dumper=_NoAliasDumper, sort_keys=False, allow_unicode=True))


WORDS = ["a", "nvidia.com/gpu", "1", "-1", "0x1f", "1.5", "1e3", "true", "no", "null", "~", "", "2026-01-01",
         "12:30", "-", "--", "---x", "...", "?", ":", "#", "a:b", "a: b", "a #b", "a#b", "it's", "'q'", "-x",
         "- x", "? x", ": x", "x:", "@x", "`x", "%x", "!x", "&x", "*x", "|x", ">x", "[x]", "{x}", ",x", "x,y",
         "use nvidia.com/mig-1g.10gb instead of nvidia.com/gpu", "holds 9728Mi >= 8192Mi", "registry/app:1.2",
         "x" * 70, "y" * 85]
text = st.lists(st.sampled_from(WORDS), min_size=1, max_size=12).map(" ".join) | st.sampled_from(WORDS)
keys = st.sampled_from(["name", "image", "nvidia.com/gpu", "a b", "true", "1", "", "k:v", "a: b", "#k", "it's",
                        "x" * 90]) | text.filter(lambda t: len(t) < 100)
scalars = text | st.integers(-10**20, 10**20) | st.booleans() | st.none()
data = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(keys, inner, max_size=5), max_leaves=30)
documents = st.dictionaries(keys, data, min_size=1, max_size=6)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents)
def test_same_bytes_as_the_libyaml_dumper(doc: dict[str, Any]) -> None:
    try:
        written = yamlblock.dump(doc, _reads_as_str)
    except yamlblock.Unsupported:
        return
    assert written == reference(doc)


@settings(max_examples=100, deadline=None)
@given(documents, st.sampled_from([1.5, "caf\u00e9", " lead", "trail ", "tab\there", "line\nbreak", {1: "x"},
                                   {"k" * 130: 1}]))
def test_what_it_does_not_write_is_left_to_the_dumper(doc: dict[str, Any], odd: Any) -> None:
    doc = {**doc, "odd": odd}
    try:
        yamlblock.dump(doc, _reads_as_str)
    except yamlblock.Unsupported:
        pass
    else:
        raise AssertionError(f"{odd!r} should not be written by the direct writer")
    assert yaml_document(doc) == reference(doc)


def test_long_reasons_fold_where_libyaml_folds() -> None:
    reason = ("use nvidia.com/mig-1g.10gb instead of nvidia.com/gpu: 1g.10gb on NVIDIA-A100-SXM4-80GB holds "
              "9728Mi >= 8192Mi (policy gpuMemory 8Gi); pinned to nvidia.com/gpu.product=NVIDIA-A100-SXM4-80GB")
    doc = {"decisions": [{"policy": "p", "reason": reason, "plain": reason.replace(": ", " ")}],
           "note": reason.replace(": ", " ") * 3, "deep": {"deeper": [[reason, {"k": reason}]]}}
    written = yamlblock.dump(doc, _reads_as_str)
    assert any(len(line) > 80 for line in written.splitlines()) and "\n    " in written  # it folded
    assert written == reference(doc)


def test_dry_run_answers_of_a_generated_file(tmp_path: Path) -> None:
    """The benchmark's generator (Pods, Deployments, MIG, time-slicing, guardrails): every answer written
    directly, byte for byte the dumper's."""
    path = tmp_path / "objects.yaml"
    generate(path, 600)
    answers = in_memory_answers(path)
    assert len(answers) == 600
    for answer in answers:
        assert yamlblock.dump(answer, _reads_as_str) == reference(answer)


def test_deep_data_is_left_to_the_dumper() -> None:
    """Past MAX_DEPTH the dumper writes (or fails, RecursionError) exactly as it did before this writer."""
    deep: Any = "x"
    for _ in range(yamlblock.MAX_DEPTH + 10):
        deep = {"a": [deep]}
    try:
        yamlblock.dump({"deep": deep}, _reads_as_str)
    except yamlblock.Unsupported:
        pass
    else:
        raise AssertionError("deep data should go to the dumper")
    assert yaml_document({"deep": deep}) == reference({"deep": deep})
    shallow: Any = "x"
    for _ in range(10):
        shallow = {"a": [shallow]}
    assert yamlblock.dump({"deep": shallow}, _reads_as_str) == reference({"deep": shallow})
