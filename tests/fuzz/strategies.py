"""Hypothesis strategies for issue 15's fuzzing: valid objects, and structure-aware mutations of them.

A mutation picks a place anywhere in a valid object (found by walking it) and
replaces, deletes or wraps what is there: wrong types (lists where objects
belong, strings for maps), hostile quantities (`1e1000000`, 5,000 digits),
deep nesting, long and lone-surrogate strings, integers past 64 bits. Bodies
are written with `json.dumps` (ensure_ascii, so lone surrogates travel as
`\\ud800` escapes, as a hostile client would send them); some are truncated,
some are random bytes, some are over the size limit.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

from hypothesis import strategies as st

HOSTILE_QUANTITIES = ["1e1000000", "1e999990", "1e400000", "-1e400000", "9" * 5000, "0." + "0" * 5000 + "1",
                      "8Ei", "9223372036854775808", "1e", "Gi", ".", "+", "1K", "\ud800", "", " ", "NaN", "1e-9999999"]
VALID_QUANTITIES = ["1", "2", "8Gi", "500m", "16Gi", "1.5", "0", "1e3", "100Mi", "7"]

_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12), st.sampled_from(HOSTILE_QUANTITIES + VALID_QUANTITIES),
    st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1, max_size=3),
)
json_values = st.recursive(_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)), max_leaves=8)


def _deep(levels: int, as_list: bool) -> Any:
    value: Any = []
    for _ in range(levels):
        value = [value] if as_list else {"a": value}
    return value


replacements = st.one_of(
    json_values,
    st.sampled_from(HOSTILE_QUANTITIES),
    st.builds(_deep, st.integers(200, 1100), st.booleans()),
    st.integers(10**19, 10**30),
    st.just("x" * 100_000),
    st.just([]), st.just({}), st.just(""), st.just(None),
)


def places(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every path into `value` (map keys and list indexes), the value's own root excluded."""
    if isinstance(value, dict):
        for key, sub in value.items():
            yield (*path, key)
            yield from places(sub, (*path, key))
    elif isinstance(value, list):
        for i, sub in enumerate(value):
            yield (*path, i)
            yield from places(sub, (*path, i))


def _apply(obj: Any, path: tuple[Any, ...], how: str, new: Any) -> Any:
    parent = obj
    for key in path[:-1]:
        parent = parent[key]
    key = path[-1]
    if how == "delete":
        del parent[key]
    elif how == "wrap":
        parent[key] = [parent[key]]
    elif how == "stringify":
        parent[key] = json.dumps(parent[key])[:50]
    else:
        parent[key] = new
    return obj


@st.composite
def mutated(draw: st.DrawFn, base: Any, rounds: int = 3) -> Any:
    """`base` after 0..`rounds` mutations at places drawn from the whole object."""
    obj = copy.deepcopy(base)
    for _ in range(draw(st.integers(0, rounds))):
        spots = list(places(obj))
        if not spots:
            break
        path = draw(st.sampled_from(spots))
        how = draw(st.sampled_from(["replace", "replace", "replace", "delete", "wrap", "stringify"]))
        obj = _apply(obj, path, how, draw(replacements) if how == "replace" else None)
    return obj


def encode(value: Any) -> bytes:
    return json.dumps(value).encode()


@st.composite
def bodies(draw: st.DrawFn, objects: st.SearchStrategy[Any]) -> bytes:
    """A request body: mostly mutated objects, sometimes truncated, random bytes, or 1-10 MB."""
    kind = draw(st.sampled_from(["object"] * 12 + ["truncated", "bytes", "big"]))
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    raw = encode(draw(objects))
    if kind == "truncated":
        return raw[: draw(st.integers(0, max(0, len(raw) - 1)))]
    if kind == "big":  # the same JSON padded to 1-10 MB: over the webhook's 3 MiB cap, under the extender's
        return raw + b" " * max(0, draw(st.integers(1, 10)) * 1_000_000 - len(raw))
    return raw
