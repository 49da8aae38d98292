"""PyYAML's safe loader for the YAML users give: every error says where, and the objects are built faster.

Every YAML the product reads from a user goes through here (`safe_load`,
`safe_load_all`, and `KubeLoader` for the dry-run's streamed documents):
files on the command line, the hub console's policy form, the webhook's
--policies, the time-slicing ConfigMap.

With libyaml, parsing is C, but turning each node into a Python object is
PyYAML's pure-Python constructor: per node a dispatch on the tag, a
recursion guard, a memo entry, and for every map and list a generator that
is filled in later. That was most of a C-loader parse of a cluster export
(docs/benchmarks/history/dryrun-and-issue16-rounds.md, "Dry-run streamed"), and the dry-run parses a
cluster's export.

`KubeLoader.construct_document` builds the objects of a document in one
recursive walk: strings are the node's text, the other scalar tags of YAML's
safe schema go through PyYAML's own constructors, maps and lists are filled
as they are made (recorded first, so an alias gets the same object, as
with PyYAML). Anything else, and any
error, sends the whole document back through PyYAML's own construction:
explicit tags beyond the safe scalars (`!!set`, `!!omap`, `!custom`), merge
keys (`<<`), keys that are not scalars. So the objects, and the errors, are
exactly what `yaml.safe_load_all` gives; only the ordinary documents take
the short way (tests/core/test_yamlload.py compares the two). Two
differences, both YAML errors (callers answer those with a message naming
the line, never a traceback or an HTTP 500):
- where PyYAML's constructors let a bare ValueError or KeyError out for a
  scalar they cannot read (`!!int abc`, `!!bool maybe`, an int of more than
  4,300 digits), the error is marked at that scalar;
- a document whose aliases expand it past go-yaml's limits (a "billion
  laughs" of nested anchors: a few lines that stand for billions of nodes)
  or whose anchor holds its own alias is refused, as kubectl refuses it.
  PyYAML shares what an alias names, so it parsed such a document at once;
  but the dry-run writes the object back, and writing it out crashed the
  process.

`resolve` remembers the tag of each short plain scalar (`true`, `1`,
`Always`, map keys): an export repeats the same few hundred, and PyYAML
tries up to a few regular expressions on each. The tag depends on the text
and the node's kind alone while no path resolver is registered (none is,
for the safe loader); the memo is bounded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import yaml
from yaml.constructor import ConstructorError
from yaml.error import YAMLError
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from gpupolicy import nesting

try:  # libyaml is optional in PyYAML; the pure-Python loader gives the same objects, slower.
    from yaml import CSafeLoader as BaseLoader
except ImportError:  # pragma: no cover - exercised where PyYAML is built without libyaml
    from yaml import SafeLoader as BaseLoader  # type: ignore[assignment]

_PREFIX = "tag:yaml.org,2002:"
STR, SEQ, MAP = _PREFIX + "str", _PREFIX + "seq", _PREFIX + "map"
# the safe schema's scalar tags, built by PyYAML's constructors (plain functions, not generators)
SCALAR_TAGS = frozenset(_PREFIX + t for t in ("null", "bool", "int", "float", "binary", "timestamp"))
RESOLVED_MAX = 8192  # tags remembered before the memo starts again (a few MiB at most)
RESOLVED_TEXT = 64  # longer scalars (names, images, commands) are seldom repeated: not remembered


class _Unusual(Exception):
    """A node the short way does not build: the document goes through PyYAML's construction."""


if TYPE_CHECKING:  # what it is mixed into, for the type checker
    _Mixed = yaml.SafeLoader
else:
    _Mixed = object


class ShortConstruction(_Mixed):
    """The short construction and the tag memo (module doc), mixed into a PyYAML safe loader class."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._aliased = False  # whether the document being built named a map or list through an alias
        self._resolved: dict[tuple[Any, Any, Any], str] | None = None if self.yaml_path_resolvers else {}

    def resolve(self, kind: Any, value: Any, implicit: Any) -> Any:
        resolved = self._resolved
        if resolved is None:  # a path resolver: the tag depends on where the node is
            return super().resolve(kind, value, implicit)  # type: ignore[no-untyped-call]
        key = (kind, value, implicit)
        tag = resolved.get(key)
        if tag is None:
            if len(resolved) >= RESOLVED_MAX:
                resolved.clear()
            tag = super().resolve(kind, value, implicit)  # type: ignore[no-untyped-call]
            if value is None or len(value) <= RESOLVED_TEXT:
                resolved[key] = tag
        return tag

    def construct_document(self, node: Node) -> Any:
        self._aliased = False
        try:
            data = self._build(node, {})
        except Exception:  # unusual or invalid: PyYAML's own way, its own objects and errors
            pass
        else:
            if self._aliased:  # an alias of a map or list: is it a bomb?
                refuse_excessive_aliasing(node)
            return data
        refuse_excessive_aliasing(node)
        try:
            return super().construct_document(node)
        except UNREADABLE as exc:  # a scalar PyYAML's constructors cannot read (`unreadable`)
            raise unreadable(node, exc) from None

    def _build(self, node: Node, made: dict[Node, Any]) -> Any:
        """`node` as an object; `made`: the maps and lists built so far, by node (an alias gets the same
        object). A method, not a closure over `made`: a recursive closure is a reference cycle, and it
        would keep each document's nodes until the collector ran."""
        tag = node.tag
        if type(node) is ScalarNode:
            if tag == STR:
                return node.value
            if tag in SCALAR_TAGS:
                return self.yaml_constructors[tag](self, node)
            raise _Unusual
        found = made.get(node)
        if found is not None:
            self._aliased = True
            return found
        build = self._build
        if type(node) is MappingNode and tag == MAP:
            mapping: dict[Any, Any] = {}
            made[node] = mapping
            for key_node, value_node in node.value:  # a merge key raises _Unusual, a map as key TypeError
                mapping[build(key_node, made)] = build(value_node, made)
            return mapping
        if type(node) is SequenceNode and tag == SEQ:
            sequence: list[Any] = []
            made[node] = sequence
            sequence.extend([build(item, made) for item in node.value])
            return sequence
        raise _Unusual


# What PyYAML's scalar constructors raise, instead of a YAMLError, for a value they cannot read: `!!int abc`,
# `!!bool maybe`, `!!timestamp 2020-13-45`, an int of more than 4,300 digits.
UNREADABLE = (ValueError, KeyError, AttributeError, TypeError, OverflowError)


def _children(node: Node) -> list[Node]:
    """A map's keys and values in order, a list's items; a scalar has none."""
    if isinstance(node, MappingNode):
        return [item for pair in node.value for item in pair]
    return list(node.value) if isinstance(node, SequenceNode) else []


def unreadable(root: Node, exc: Exception) -> ConstructorError:
    """`exc` as a YAML error marked at the first scalar of the document that cannot be read (PyYAML lets
    the bare error out without saying where)."""
    loader = BaseLoader("")
    try:
        seen: set[int] = set()
        stack = [root]
        while stack:
            node = stack.pop()
            if id(node) in seen:
                continue
            seen.add(id(node))
            if isinstance(node, ScalarNode) and node.tag in SCALAR_TAGS:
                try:
                    loader.yaml_constructors[node.tag](loader, node)
                except UNREADABLE:
                    name = node.tag.removeprefix(_PREFIX)
                    value = node.value if len(node.value) <= 40 else node.value[:40] + "..."
                    return ConstructorError(None, None, f"{name} value {value!r} cannot be read", node.start_mark)
            stack.extend(reversed(_children(node)))
    finally:
        loader.dispose()
    return ConstructorError(None, None, f"a value cannot be read ({type(exc).__name__})", root.start_mark)


# go-yaml's limits (yaml.v3 decode.go, allowedAliasRatio), which kubectl and kube-apiserver apply: up to
# 400,000 nodes once aliases are expanded, 99% of them may come from aliases; from 4,000,000 on, 10%.
ALIAS_RATIO_RANGE = (400_000, 4_000_000)


def allowed_alias_ratio(expanded: int) -> float:
    low, high = ALIAS_RATIO_RANGE
    if expanded <= low:
        return 0.99
    if expanded >= high:
        return 0.10
    return 0.99 - 0.89 * (expanded - low) / (high - low)


def refuse_excessive_aliasing(root: Node) -> None:
    """ConstructorError when the document's aliases expand it past go-yaml's limits, or an anchor's
    value holds its own alias: a few lines of anchors can stand for billions of nodes, which PyYAML
    shares but every writer of the object (the dry-run's output) would write out in full."""
    sizes: dict[int, int] = {}  # node id -> nodes once expanded
    open_: set[int] = set()  # the collections whose children are being counted
    unique = 0
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, counted = stack.pop()
        key = id(node)
        if isinstance(node, ScalarNode) or key in sizes:
            if key not in sizes:
                sizes[key] = 1
                unique += 1
            continue
        children = _children(node)
        if counted:
            open_.discard(key)
            sizes[key] = 1 + sum(sizes[id(child)] for child in children)
            continue
        if key in open_:
            raise ConstructorError(None, None, "an anchor's value contains its own alias", node.start_mark)
        open_.add(key)
        unique += 1
        stack.append((node, True))
        stack.extend((child, False) for child in reversed(children) if id(child) not in sizes)
    expanded = sizes[id(root)]
    aliased = expanded - unique
    if expanded > 1000 and aliased > 100 and aliased / expanded > allowed_alias_ratio(expanded):
        raise ConstructorError(None, None, f"excessive aliasing: {unique:,} nodes expand to {expanded:,} through "
                                           "aliases", root.start_mark)


class KubeLoader(ShortConstruction, BaseLoader):
    """`yaml.CSafeLoader` (else `yaml.SafeLoader`, when PyYAML is built without libyaml), built the short way."""


class TooDeep(YAMLError):
    """A document nested past gpupolicy.nesting.LIMIT: never handed to the parser (libyaml's recursion
    crashes the process)."""


def _refuse_too_deep(text: str | bytes) -> None:
    """TooDeep naming the first document of `text` nested past the limit (gpupolicy.nesting)."""
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    guarded = nesting.guarded_text(data)
    if guarded is None:
        return
    number = next((n for n, doc in enumerate(yaml.load_all(guarded, Loader=KubeLoader), start=1)
                   if nesting.is_placeholder(doc)), None)
    raise TooDeep(f"document {number}: {nesting.PROBLEM}" if number else f"a document is {nesting.PROBLEM}")


def safe_load(text: str | bytes) -> Any:
    """`yaml.safe_load` through `KubeLoader`: yaml.YAMLError for anything it cannot read (TooDeep for a
    document nested too deeply to parse)."""
    _refuse_too_deep(text)
    return yaml.load(text, Loader=KubeLoader)


def safe_load_all(text: str | bytes) -> list[Any]:
    """`yaml.safe_load_all` through `KubeLoader`, as a list: yaml.YAMLError for anything it cannot read
    (TooDeep for a document nested too deeply to parse)."""
    _refuse_too_deep(text)
    return list(yaml.load_all(text, Loader=KubeLoader))


def describe_error(exc: yaml.YAMLError) -> str:
    """One line for a YAML error: where (line and column, 1-based) and what; PyYAML's own text spans
    several lines (the snippet with a caret), which a CLI message or a form field cannot show."""
    if isinstance(exc, TooDeep):
        return str(exc)
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return f"not valid YAML{where}: {problem}"


def documents(data: bytes) -> list[Any]:
    """The documents of a YAML file's bytes; ValueError with one line when they are not UTF-8 text (where
    the first bad byte is) or not YAML (`describe_error`)."""
    try:
        return safe_load_all(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at position {exc.start})") from None
    except yaml.YAMLError as exc:
        raise ValueError(describe_error(exc)) from None


def objects_of_kind(docs: list[Any], kind: str) -> tuple[list[tuple[int, dict[str, Any]]], list[tuple[int, Any]]]:
    """The objects of `kind` among a file's documents (a `kind: List` contributes its items), each with its
    document's number from 1, and (number, kind) of every other object, for the caller to note as
    skipped. Empty documents are nothing; ValueError "document N: ..." for one that is not a mapping, or a
    List whose items are not a list of mappings. The webhook's --policies and `hub policy apply` read
    their files this way."""
    found: list[tuple[int, dict[str, Any]]] = []
    others: list[tuple[int, Any]] = []
    for number, doc in enumerate(docs, start=1):
        if doc is None:
            continue
        if not isinstance(doc, dict):
            raise ValueError(f"document {number}: not a mapping")
        items = doc.get("items") if doc.get("kind") == "List" else [doc]
        if not isinstance(items, list):
            raise ValueError(f"document {number} (List): items: not a list")
        for item in items:
            if not isinstance(item, dict):
                raise ValueError(f"document {number} (List): an item is not a mapping")
            if item.get("kind") == kind:
                found.append((number, item))
            else:
                others.append((number, item.get("kind")))
    return found, others
