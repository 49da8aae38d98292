"""The files `kubeon-gpu dry-run` reads, one YAML document at a time.

Why streamed: a dry-run over a whole cluster's export (100,000 objects) must
not hold every document at once; each is parsed, decided, written and
forgotten. PyYAML's C loader (libyaml) parses ~10x faster than the pure-Python
one; the pure-Python loader is the fallback when libyaml is absent. Either
way the objects are built by gpupolicy/yamlload.py (the same objects, in less
time than PyYAML's own constructor).

Why the pre-scan: GpuPolicies, Nodes and Namespaces must be known before
the first pod is decided, so a cheap pass over the bytes says whether a
source holds any; and documents nested too deeply to parse safely are found
in the bytes (gpupolicy/nesting.py) and never reach the parser.

Every problem is a value (`Problem`) naming the source, the document and,
where known, the field; nothing here raises for bad input.
"""

from __future__ import annotations

import io
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import IO, Any

import yaml

from gpupolicy import nesting
from gpupolicy.yamlload import KubeLoader, describe_error

SUFFIXES = (".yaml", ".yml", ".json")
# Kinds that shape the decisions (read before any object is evaluated).
CONTEXT_KINDS = ("GpuPolicy", "Node", "Namespace")
_CHUNK = 1 << 20
_CONTEXT_KIND = re.compile(rb"""kind['"]?\s*:\s*['"]?(?:GpuPolicy|Node|Namespace|[A-Za-z]*List)\b""")


@dataclass(frozen=True)
class Source:
    """One input: a file, standard input, or an embedded example. `name` is what messages call it."""

    name: str
    open: Callable[[], IO[bytes]]
    role: str = "-f"  # "-f", "--policies" or "--nodes": which kinds it may hold


@dataclass(frozen=True)
class Problem:
    """Unusable input: `FILE, document N: FIELD: what is wrong` (document 0: the file as a whole)."""

    source: str
    document: int
    message: str
    item: int | None = None  # index in a List's items

    def where(self) -> str:
        if not self.document:
            return self.source
        item = f", items[{self.item}]" if self.item is not None else ""
        return f"{self.source}, document {self.document}{item}"

    def __str__(self) -> str:
        return f"{self.where()}: {self.message}"


@dataclass(frozen=True)
class Document:
    """One parsed YAML document (or one item of a List document)."""

    source: str
    number: int
    obj: Any
    item: int | None = None

    def problem(self, message: str) -> Problem:
        return Problem(self.source, self.number, message, self.item)


@dataclass(frozen=True)
class Scan:
    """What the byte pre-scan learnt about a source."""

    has_context: bool  # may hold GpuPolicy/Node/Namespace (or a List that might)
    empty: bool  # nothing but whitespace
    too_deep: tuple[tuple[int, int], ...] = ()  # byte ranges of documents not to parse (gpupolicy/nesting.py)


def _file_opener(path: Path) -> Callable[[], IO[bytes]]:
    return lambda: path.open("rb")


def _spooled_stdin() -> Callable[[], IO[bytes]]:
    """Standard input is copied once to an unnamed temporary file, so it can be scanned, then read."""
    spool = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the run; the OS removes it
    stream = sys.stdin.buffer if hasattr(sys.stdin, "buffer") else io.BytesIO(sys.stdin.read().encode())
    while chunk := stream.read(_CHUNK):
        spool.write(chunk)
    spool.flush()

    def opener() -> IO[bytes]:
        view = open(os.dup(spool.fileno()), "rb")  # noqa: SIM115 - the caller closes it
        view.seek(0)
        return view

    return opener


def expand(paths: list[str], role: str) -> tuple[list[Source], list[Problem]]:
    """Files for `-f`/`--policies`/`--nodes` arguments: `-` is standard input, a directory its YAML/JSON files."""
    sources: list[Source] = []
    problems: list[Problem] = []
    for raw in paths:
        if raw == "-":
            sources.append(Source("<stdin>", _spooled_stdin(), role))
            continue
        path = Path(raw)
        if path.is_dir():
            files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in SUFFIXES)
            if not files:
                problems.append(Problem(raw, 0, f"directory holds no {', '.join(SUFFIXES)} files"))
            sources.extend(Source(str(p), _file_opener(p), role) for p in files)
        elif path.is_file():
            sources.append(Source(raw, _file_opener(path), role))
        elif path.exists():
            problems.append(Problem(raw, 0, "not a regular file"))
        else:
            problems.append(Problem(raw, 0, "no such file or directory"))
    return sources, problems


def example_sources(names: tuple[str, ...] = ("policies.yaml", "nodes.yaml", "workloads.yaml")) -> list[Source]:
    """The embedded example set (package data, so it works from an installed wheel too)."""
    folder = resources.files("gpupolicy") / "examples"

    def opener(name: str) -> Callable[[], IO[bytes]]:
        return lambda: (folder / name).open("rb")

    return [Source(f"example {name}", opener(name), "-f") for name in names]


def scan(source: Source) -> Scan:
    """Passes over the bytes: context kinds, emptiness, documents too deep to parse. Cheap next to parsing."""
    has_context = non_blank = False
    tail = b""
    with source.open() as fh:
        while chunk := fh.read(_CHUNK):
            window = tail + chunk
            non_blank = non_blank or bool(chunk.strip())
            has_context = has_context or bool(_CONTEXT_KIND.search(window))
            tail = window[-64:]
        fh.seek(0)
        deep = nesting.too_deep(fh) if non_blank else []
    return Scan(has_context=has_context, empty=not non_blank, too_deep=tuple(deep))


def _reader_problem(exc: yaml.reader.ReaderError) -> str:
    char = exc.character
    code = f"0x{char:02x}" if isinstance(char, int) and char >= 0 else "an incomplete sequence"
    if "UTF-8" in str(exc.reason) or "utf-8" in str(exc.reason) or not isinstance(char, int) or char < 0:
        return f"not UTF-8 text ({code} at position {exc.position}: {exc.reason})"
    return f"binary data, not YAML text (character {code} at position {exc.position} is not allowed)"


def documents(source: Source, found: Scan) -> Iterator[Document | Problem]:
    """Each YAML document of a source in order (None for an empty one); a parse error ends the source."""
    if found.empty:
        yield Problem(source.name, 0, "empty file: no Kubernetes objects")
        return
    number = seen = 0
    with source.open() as raw:
        fh = nesting.Guarded(raw, list(found.too_deep)) if found.too_deep else raw
        loader = KubeLoader(fh)
        try:
            while True:
                try:
                    if not loader.check_node():
                        if not seen:
                            yield Problem(source.name, 0, "no Kubernetes objects (only comments and empty documents)")
                        return
                    number += 1
                    node = loader.get_node()
                    obj = loader.construct_document(node) if node is not None else None
                except yaml.reader.ReaderError as exc:
                    yield Problem(source.name, max(number, 1), _reader_problem(exc))
                    return
                except yaml.YAMLError as exc:
                    yield Problem(source.name, max(number, 1), describe_error(exc))
                    return
                except RecursionError:  # not expected under nesting.LIMIT; never a traceback
                    yield Problem(source.name, max(number, 1), "nested too deeply to read (rest of file skipped)")
                    return
                if nesting.is_placeholder(obj):
                    seen += 1
                    yield Problem(source.name, number, nesting.PROBLEM)
                    continue
                seen += obj is not None
                yield Document(source.name, number, obj)
        finally:
            loader.dispose()


def objects(doc: Document) -> Iterator[Document | Problem]:
    """A document's Kubernetes objects: itself, or a List's items; problems for what is not an object."""
    obj = doc.obj
    if not isinstance(obj, dict):
        what = "a list" if isinstance(obj, list) else f"a {type(obj).__name__} scalar"
        yield doc.problem(f"not a Kubernetes object (the document is {what}, not a map with kind)")
        return
    kind = obj.get("kind")
    if not isinstance(kind, str) or not kind:
        yield doc.problem("kind: missing; not a Kubernetes object")
        return
    if kind.endswith("List") and "items" in obj:
        items = obj["items"]
        if not isinstance(items, list):
            yield doc.problem("items: must be a list of objects")
            return
        for i, item in enumerate(items):
            sub = Document(doc.source, doc.number, item, i)
            if isinstance(item, dict) and isinstance(item.get("kind"), str) and item["kind"]:
                yield sub
            else:
                yield sub.problem("not a Kubernetes object (kind missing)")
        return
    yield doc
