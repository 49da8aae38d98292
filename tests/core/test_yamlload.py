"""gpupolicy/yamlload.py gives exactly what `yaml.safe_load_all` gives: objects, aliases and errors.

Real: PyYAML's own safe loader (the C one where libyaml is built, as the
dry-run used before) is the reference. Documents cover what the short way
builds (maps, lists, every safe scalar tag, aliases, an anchor inside
itself) and what it must hand back to PyYAML (merge keys, `!!set`,
`!!omap`, complex keys, unknown tags, invalid values); hypothesis adds
generated YAML text.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.dryrun import generate
from gpupolicy.yamlload import RESOLVED_MAX, UNREADABLE, KubeLoader, ShortConstruction

try:
    from yaml import CSafeLoader as Reference
except ImportError:  # pragma: no cover - PyYAML without libyaml
    from yaml import SafeLoader as Reference  # type: ignore[assignment]


def load(text: str | bytes, loader: Any) -> list[Any]:
    return list(yaml.load_all(text, Loader=loader))


def same(a: Any, b: Any, seen: set[tuple[int, int]] | None = None) -> bool:
    """Equal, types and key order included (NaN equal to NaN); a map or list holding itself where the other
    holds itself."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (dict, list)):
        seen = set() if seen is None else seen
        if (id(a), id(b)) in seen:
            return True
        seen.add((id(a), id(b)))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k], seen) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y, seen) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return bool(a == b)


def outcome(text: str | bytes, loader: Any) -> tuple[str, Any]:
    try:
        return "ok", load(text, loader)
    except Exception as exc:  # the error, as the dry-run would report it
        return type(exc).__name__, str(exc)


class PureKubeLoader(ShortConstruction, yaml.SafeLoader):
    """The short way over PyYAML's pure-Python loader: what KubeLoader is where libyaml is absent."""


def assert_same(text: str | bytes) -> None:
    """The same objects or the same error; where PyYAML lets a bare error out (`!!int abc`), a ConstructorError
    marked at the scalar it could not read (the module's one difference)."""
    for ours_loader, reference_loader in ((KubeLoader, Reference), (PureKubeLoader, yaml.SafeLoader)):
        ours, reference = outcome(text, ours_loader), outcome(text, reference_loader)
        if ours[0] == "ok" and reference[0] == "ok":
            assert same(ours[1], reference[1]), text
        elif reference[0] in {e.__name__ for e in UNREADABLE}:
            assert ours[0] == "ConstructorError" and "cannot be read" in ours[1] and ", line " in ours[1], ours
        else:
            assert ours == reference


CASES = [
    "apiVersion: v1\nkind: Pod\nmetadata: {name: a, labels: {app: x}}\nspec:\n  containers:\n  - name: c\n"
    "    resources: {limits: {nvidia.com/gpu: 1, memory: 16Gi}}\n",
    "a: [yes, no, on, off, true, False, ~, null, '', 1, 0x1f, 0o17, 017, 1_000, -2, +3, 1.5, 1e3, .inf, -.Inf, .nan]\n",
    "t: 2026-12-03\nu: 2026-12-03T10:00:00Z\nv: '2026-12-03'\nb: !!binary aGVsbG8=\n",
    "explicit: [!!str 1, !!int '7', !!float '2', !!bool 'true', !!null '']\n",
    "{1: a, 1.5: b, true: c, null: d, 2026-01-01: e}\n",
    "dup: 1\ndup: 2\n",
    "base: &b {x: 1, y: [1, 2]}\ncopy: *b\nlist: [*b, *b]\n",
    "base: &b {x: 1}\nmerged: {<<: *b, y: 2}\n",
    "merged: {<<: [{a: 1}, {b: 2}], c: 3}\n",
    "= : value-key\n",
    "s: !!set {a, b}\no: !!omap [{a: 1}, {b: 2}]\np: !!pairs [{a: 1}, {a: 2}]\n",
    "? [a, b]\n: complex\n",
    "? {a: 1}\n: complex\n",
    "x: !custom 1\n",
    "x: !!int abc\n",
    "x: !!bool maybe\n",
    "x: !!float nope\n",
    "x: !!timestamp yesterday\n",
    "x: !!timestamp 2020-02-30\n",
    "a: [1, {b: !!int 12x}]\n",
    "big: " + "9" * 5000 + "\n",
    "x: !!binary '%%%'\n",
    "x: !!map [1, 2]\n",
    "x: !!seq {a: 1}\n",
    "---\na: 1\n---\n---\n[1, 2]\n--- text\n...\n",
    "a: 1\n  b: 2\n",
    "a: [1, 2\n",
    "",
]


@pytest.mark.parametrize("text", CASES, ids=lambda text: text[:40])
def test_the_same_as_pyyaml(text: str) -> None:
    assert_same(text)


def test_an_alias_is_the_same_object() -> None:
    (doc,) = load("base: &b {x: 1, y: [1, 2]}\ncopy: *b\nlist: [*b, *b]\n", KubeLoader)
    assert doc["copy"] is doc["base"] and doc["list"][1] is doc["base"]


def bomb(levels: int, width: int = 9) -> str:
    """Nested anchors, each a list of `width` aliases of the one before: width ** levels nodes expanded."""
    lines = ["kind: Pod", "l0: &l0 [" + ", ".join(["lol"] * width) + "]"]
    lines += [f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(("text", "message"), [
    (bomb(9), "excessive aliasing: 30 nodes expand to 490,329,066 through aliases"),
    (bomb(9) + "!!set {a}: 1\n", "excessive aliasing"),  # PyYAML's own construction: checked before it too
    ("a: &a {name: s, me: *a}\n", "an anchor's value contains its own alias"),
    ("&l [1, *l]\n", "an anchor's value contains its own alias"),
], ids=["billion-laughs", "billion-laughs-unusual", "map-holds-itself", "list-holds-itself"])
def test_aliases_that_never_end_or_explode_are_refused_as_kubectl_refuses_them(text: str, message: str) -> None:
    with pytest.raises(yaml.constructor.ConstructorError, match=message):
        load(text, KubeLoader)
    with pytest.raises(yaml.constructor.ConstructorError, match=message):
        load(text, PureKubeLoader)


def test_aliases_within_go_yamls_limits_are_read() -> None:
    text = bomb(3, 9)  # 819 nodes once expanded: under the 1,000 go-yaml starts to count at
    assert same(load(text, KubeLoader), load(text, Reference))
    many = "base: &b {x: 1}\nlist: [" + ", ".join(["*b"] * 150) + "]\n"  # 150 aliases, 3 nodes each: 99% under
    assert same(load(many, KubeLoader), load(many, Reference))


@pytest.mark.parametrize(("text", "where"), [("a: 1\nb: [2, {c: !!int 12x}]\n", "line 2, column 12"),
                                           (f"a: {'9' * 5000}\n", "line 1, column 4"),
                                           ("x: !!bool maybe\n", "line 1, column 4")],
                         ids=["int-in-a-list", "5000-digit-int", "bool"])
def test_a_value_pyyaml_cannot_read_is_a_yaml_error_saying_where(text: str, where: str) -> None:
    with pytest.raises(yaml.constructor.ConstructorError, match=f"(?s)cannot be read.*{where}"):
        load(text, KubeLoader)


def test_the_benchmark_export_and_the_examples(tmp_path: Path) -> None:
    path = tmp_path / "objects.yaml"
    generate(path, 600)
    data = path.read_bytes()
    assert same(load(data, KubeLoader), load(data, Reference))
    for example in sorted(Path(__file__).resolve().parents[2].joinpath("examples").glob("*.yaml")):
        assert_same(example.read_bytes())


def test_the_tag_memo_stays_bounded_and_right() -> None:
    text = "".join(f"k{i}: {v}\n" for i in range(RESOLVED_MAX + 50) for v in ("x", "1")[i % 2:i % 2 + 1])
    loader = KubeLoader(text)
    try:
        doc = loader.get_single_data()
        assert len(loader._resolved or {}) <= RESOLVED_MAX
    finally:
        loader.dispose()
    assert same(doc, yaml.load(text, Loader=Reference))


words = st.sampled_from(["a", "b c", "1", "0x1f", "1.5", "yes", "No", "null", "~", "2026-01-01", "'q'", '"d"',
                         "*x", "&x v", "<<", "!!str 1", "!!int 2", "!!set {a}", "[1, 2]", "{a: 1}", "-", ":"])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(words, words, st.integers(0, 3)), min_size=1, max_size=12))
def test_generated_yaml_the_same_as_pyyaml(lines: list[tuple[str, str, int]]) -> None:
    text = "".join(f"{'  ' * depth}{key}: {value}\n" for key, value, depth in lines)
    assert_same(text)


def test_a_document_leaves_nothing_for_the_collector(tmp_path: Path) -> None:
    """Each document's nodes and objects are freed when it is done with (no reference cycle holds them until
    the collector runs: a recursive closure did, and the collector then ran ten times as often)."""
    import gc

    path = tmp_path / "objects.yaml"
    generate(path, 300)
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        for _ in yaml.load_all(path.read_bytes(), Loader=KubeLoader):
            pass
        assert gc.collect() == 0
    finally:
        if was:
            gc.enable()


DEEP_FLOW = "a: " + "[" * 50_000 + "]" * 50_000  # libyaml's recursive composer crashed the process on it
DEEP_BLOCK = "".join(" " * depth + f"k{depth}:\n" for depth in range(1_100)) + " " * 1_100 + "v\n"


@pytest.mark.parametrize(("text", "message"), [
    (DEEP_FLOW, "document 1: nested more than 1000 levels deep; not read"),
    (DEEP_BLOCK, "document 1: nested more than 1000 levels deep; not read"),
    (f"kind: A\n---\n{DEEP_FLOW}\n---\nkind: B\n", "document 2: nested more than 1000 levels deep; not read"),
    (f"---\nkind: A\n---\n{DEEP_FLOW}\n", "document 2: nested more than 1000 levels deep; not read"),
])
def test_every_reader_of_user_yaml_refuses_a_document_nested_too_deeply(text: str, message: str) -> None:
    """safe_load, safe_load_all and documents (the webhook's --policies, the hub, kubeconfigs, the
    time-slicing ConfigMap, the scheduler config of simulate) never hand it to the parser."""
    from gpupolicy.yamlload import TooDeep, describe_error, documents, safe_load, safe_load_all

    for load in (safe_load_all, safe_load):
        with pytest.raises(TooDeep) as caught:
            load(text)
        assert describe_error(caught.value) == message
    with pytest.raises(ValueError, match=message):
        documents(text.encode())


def test_deep_but_not_too_deep_yaml_is_read() -> None:
    from gpupolicy.yamlload import safe_load

    assert safe_load("a: " + "[" * 900 + "]" * 900) == {"a": yaml.load("[" * 900 + "]" * 900, Loader=Reference)}
    many = "items: [" + ", ".join("[1]" for _ in range(5_000)) + "]"  # many brackets, shallow
    assert len(safe_load(many)["items"]) == 5_000
