"""The compiled shape check (`shape.fits`) accepts exactly what the walking check (`shape._check`) accepts.

`check` asks `fits` first and walks only when it says no, so a difference
would let a malformed object through (or report nothing for a refusal).
Hypothesis builds objects that follow each spec but, anywhere, may put a
value of another JSON type (null, bool, number, string, list, object,
non-string keys, bad quantities) instead.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpupolicy.admission import shape

ODD = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.floats(allow_nan=False, width=16),
                st.sampled_from(["", "x", "2", "8Gi", "1.5", "-1", "bad quantity", "1e99", "500m"]),
                st.lists(st.none() | st.integers(0, 2) | st.text(max_size=2), max_size=2),
                st.dictionaries(st.text(max_size=2), st.none() | st.integers(0, 2), max_size=2),
                st.just({1: "x"}))


def following(spec: Any, depth: int = 0) -> st.SearchStrategy[Any]:
    """Values shaped like `spec`, each part possibly replaced by an odd value."""
    if type(spec) is str:
        good = {shape.STRING: st.text(max_size=3), shape.QUANTITY: st.sampled_from(["1", "500m", "16Gi", 2, "x"]),
                shape.BOOLEAN: st.booleans(), shape.INTEGER: st.integers(-5, 5),
                shape.ANY_OBJECT: st.dictionaries(st.text(max_size=2), st.integers(), max_size=2)}[spec]
    elif type(spec) is tuple:
        kind, item = spec
        inner = following(item, depth + 1) if depth < 6 else ODD
        good = (st.lists(inner, max_size=3) if kind == "list"
                else st.dictionaries(st.text(max_size=3), inner, max_size=3))
    elif depth > 6:
        good = st.just({})
    else:
        good = st.fixed_dictionaries({}, optional={name: following(field, depth + 1) for name, field in spec.items()})
    return st.one_of(good, good, good, ODD)


SPECS = [shape.POD, shape.NODE, shape.POD_TEMPLATE, shape.METADATA, shape.POLICY]


@settings(max_examples=1500, deadline=None)
@given(st.sampled_from(range(len(SPECS))).flatmap(lambda i: st.tuples(st.just(i), following(SPECS[i]))))
def test_fits_exactly_when_the_walk_finds_nothing(case: tuple[int, Any]) -> None:
    index, value = case
    spec = SPECS[index]
    assert shape.fits(spec)(value) == (value is None or shape._check(value, spec) is None)


def test_a_refusal_still_names_the_field() -> None:
    pod = {"kind": "Pod", "metadata": {"labels": {"app": 1}}, "spec": {"containers": [{"name": "c"}]}}
    assert shape.pod_shape_error(pod) == "request.object.metadata.labels.app: must be a string, not a number"
    assert shape.pod_shape_error({"spec": {"containers": [None]}}) == (
        "request.object.spec.containers[0]: must be an object, not null")
