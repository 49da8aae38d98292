"""ArgsReader: a NodeNames list whose bytes were seen before is not parsed again, and nothing else changes.

Real: orjson, the reader. Bodies are written the way kube-scheduler's Go
encoder writes them (compact, NodeNames last) unless a case says otherwise.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest

from extender.argsreader import ArgsReader

NAMES = [f"node-{i}" for i in range(50)]


def go_body(pod_name: str, names: list[str] | None = None) -> bytes:
    pod = {"metadata": {"name": pod_name, "namespace": "default"}, "spec": {"containers": []}}
    return orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": NAMES if names is None else names})


def test_a_repeated_list_is_the_same_object_and_the_pod_is_parsed_each_time() -> None:
    reader = ArgsReader()
    first = reader.read(go_body("a"))
    second = reader.read(go_body("b"))
    assert second["NodeNames"] is first["NodeNames"]  # not parsed again: NodeNameRows finds it by identity
    assert second["NodeNames"] == NAMES
    assert second["Pod"]["metadata"]["name"] == "b"
    assert second["Nodes"] is None
    assert reader.reused == 1


def test_expect_makes_the_first_prioritize_body_a_reuse() -> None:
    reader = ArgsReader()
    passed = NAMES[3:20]
    reader.expect(passed)
    body = reader.read(go_body("a", list(passed)))
    assert body["NodeNames"] is passed
    assert reader.reused == 1


@pytest.mark.parametrize("raw", [
    pytest.param(json.dumps({"Pod": {"metadata": {"name": "a"}}, "Nodes": None, "NodeNames": NAMES}).encode(),
                 id="whitespace (not Go's form)"),
    pytest.param(orjson.dumps({"NodeNames": NAMES, "Pod": {"metadata": {"name": "a"}}}), id="other key order"),
])
def test_other_forms_are_parsed_in_full_every_time(raw: bytes) -> None:
    reader = ArgsReader()
    reader.expect(NAMES)
    bodies = [reader.read(raw) for _ in range(2)]
    assert bodies[0] == bodies[1] == json.loads(raw)
    assert reader.reused == 0


def test_a_malformed_head_with_a_known_tail_is_still_malformed() -> None:
    reader = ArgsReader()
    reader.read(go_body("a"))
    broken = b'{"Pod":{"metadata":{"name":"a"},' + go_body("a")[go_body("a").rfind(b'"NodeNames"'):]
    with pytest.raises(ValueError):
        reader.read(broken)
    with pytest.raises(ValueError):
        reader.read(b"not json" + go_body("a"))


def test_a_known_tail_inside_the_pod_is_not_taken_for_the_top_level_list() -> None:
    reader = ArgsReader()
    reader.read(go_body("a"))
    tail = go_body("a")[go_body("a").rfind(b'"NodeNames"'):]
    # the list is the value of a nested object's last key: the body closes two more objects after the tail
    nested = b'{"Pod":{"metadata":{"name":"a"},"extra":{' + tail + b"}}"
    assert reader.read(nested) == json.loads(nested)
    # an escaped quote before the key: the member's key is 'x"NodeNames', not NodeNames
    escaped = b'{"NodeNames":["z"],"Pod":{"metadata":{"name":"a"}},"x\\' + tail
    parsed: Any = reader.read(escaped)
    assert parsed == json.loads(escaped)
    assert parsed["NodeNames"] == ["z"]


def test_a_changed_list_is_parsed_and_the_memory_is_bounded() -> None:
    reader = ArgsReader(size=2)
    for i in range(5):
        names = NAMES[i:]
        assert reader.read(go_body("a", names))["NodeNames"] == names
    assert len(reader._tails) == 2
    assert reader.read(go_body("a", NAMES[4:]))["NodeNames"] == NAMES[4:]
    assert reader.reused == 1


def test_prioritize_after_filter_gets_the_same_pod_object_and_equal_bodies() -> None:
    """/prioritize sends /filter's pod byte for byte: its head is not parsed again (the very Pod object, in a
    new top-level dict), and every body still equals a plain parse."""
    reader = ArgsReader()
    filter_raw = go_body("a")
    first = reader.read(filter_raw)
    passed = NAMES[5:30]
    reader.expect(passed)
    prioritize_raw = go_body("a", list(passed))
    second = reader.read(prioritize_raw)
    assert second == orjson.loads(prioritize_raw) and first == orjson.loads(filter_raw)
    assert second["Pod"] is first["Pod"] and second is not first
    assert first["NodeNames"] == NAMES  # the first body is not changed by the second
    assert reader.heads_reused == 1
    third = reader.read(go_body("b", list(passed)))  # another pod, same list: its head is parsed
    assert third["Pod"]["metadata"]["name"] == "b" and third["Pod"] is not first["Pod"]
    assert reader.heads_reused == 1


def test_a_head_whose_key_is_escaped_is_not_remembered() -> None:
    reader = ArgsReader()
    raw = b'{"Pod":{"metadata":{"name":"a"}},"x\\"NodeNames":' + orjson.dumps(NAMES) + b"}"
    assert reader.read(raw) == json.loads(raw)
    assert not reader._heads
