"""Documents nested too deeply to parse are found in the bytes and never handed to the YAML parser.

Why: libyaml composes nodes recursively in C, so ~30,000 nested brackets
crash the process (SIGSEGV, no Python error), and both libyaml and the
pure-Python scanner check every open flow level on each token, so parsing
is quadratic in the depth (40,000 levels: seconds). A Kubernetes object nests
~20 levels; anything past LIMIT is refused before parsing: the dry-run
(cli/sources.py) reports the document and reads the others, every other
reader of user YAML (gpupolicy.yamlload) refuses the file naming it.

How, cheaply: per document (split at `---` lines), the flow brackets are
counted; under LIMIT opens the document cannot be deeper. Over it (a large
JSON List, say), the depth is bounded from above: quoted strings and comments
are cut out, then a running count of opens minus closes, floored at zero, is
taken with numpy. Block nesting needs indentation, so a line indented LIMIT
columns marks its document too. A marked document is replaced, in the byte
stream the parser reads, by a placeholder scalar that `is_placeholder`
recognises, so the documents around it are still read and numbered as in
the file.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from typing import IO

LIMIT = 1000
PLACEHOLDER = "kubeon-gpu-document-nested-too-deeply"
PROBLEM = f"nested more than {LIMIT} levels deep; not read"
_DOC_MARKER = re.compile(rb"^---(?=[ \t\r\n]|$)", re.M)
_DEEP_INDENT = re.compile(rb"\n[ \t?:-]{%d}" % LIMIT)
_QUOTED_OR_COMMENT = re.compile(
    rb"""(?:(?<=[\s\[\]{},:])|^)(?:"(?:[^"\\]|\\.)*"|'(?:[^']|'')*')|(?:(?<=\s)|^)#[^\n]*""", re.M)


def _opens(data: bytes) -> int:
    return data.count(b"[") + data.count(b"{")


def flow_depth_bound(data: bytes) -> int:
    """An upper bound on flow nesting: strings and comments cut out, opens - closes floored at zero."""
    import numpy as np  # only for the rare document with many brackets: dry-run starts without it

    opens, closes = np.frombuffer(b"[{", np.uint8), np.frombuffer(b"]}", np.uint8)
    cleaned = np.frombuffer(_QUOTED_OR_COMMENT.sub(b"", data), np.uint8)
    deepest, carry = 0, 0
    for start in range(0, len(cleaned), 1 << 22):
        part = cleaned[start:start + (1 << 22)]
        steps = np.isin(part, opens).astype(np.int32) - np.isin(part, closes).astype(np.int32)
        running = carry + np.cumsum(steps, dtype=np.int64)
        depth = running - np.minimum(np.minimum.accumulate(running), 0)
        if len(depth):
            deepest, carry = max(deepest, int(depth.max())), int(depth[-1])
    return deepest


def document_ranges(fh: IO[bytes], chunk: int = 1 << 20) -> Iterator[tuple[int, int, int, bool]]:
    """(start, end, flow opens, deeply indented) per document: contents between `---` lines."""
    start, opens, indented, offset = 0, 0, False, 0
    tail = b"\n"  # the file's first line starts a line too
    while data := fh.read(chunk):
        window = tail + data
        base = offset - len(tail)  # file offset of window[0]
        cut = len(tail)
        for marker in _DOC_MARKER.finditer(window):
            if base + marker.start() < start or (marker.start() == 0 and base >= 0 and window[:1] != b"\n"):
                continue  # seen in the previous window, or not at a line start
            opens += _opens(window[cut:marker.start()])
            indented = indented or bool(_DEEP_INDENT.search(window, max(cut - 1 - LIMIT, 0), marker.start()))
            yield start, base + marker.start(), opens, indented
            start, opens, indented, cut = base + marker.end(), 0, False, marker.end()
        opens += _opens(window[max(cut, len(tail)):])
        indented = indented or bool(_DEEP_INDENT.search(window, max(cut - 1 - LIMIT, 0)))
        offset += len(data)
        tail = window[-(LIMIT + 16):]
    yield start, offset, opens, indented


def too_deep(fh: IO[bytes]) -> list[tuple[int, int]]:
    """The documents of a file that must not be parsed."""
    deep = []
    for start, end, opens, indented in list(document_ranges(fh)):
        if indented or (opens > LIMIT and _bound_of(fh, start, end) > LIMIT):
            deep.append((start, end))
    return deep


def _bound_of(fh: IO[bytes], start: int, end: int) -> int:
    fh.seek(start)
    return flow_depth_bound(fh.read(end - start))


class Guarded:
    """A file whose too-deep documents read as the placeholder; everything else byte for byte."""

    def __init__(self, fh: IO[bytes], deep: list[tuple[int, int]]) -> None:
        self.fh, self.deep, self.pos = fh, sorted(deep), 0

    def read(self, size: int = -1) -> bytes:
        if not self.deep:
            return self.fh.read(size)
        start, end = self.deep[0]
        if self.pos == start:
            self.deep.pop(0)
            self.fh.seek(end)
            self.pos = end
            return f" {PLACEHOLDER}\n".encode()
        want = start - self.pos if size < 0 else min(size, start - self.pos)
        data = self.fh.read(want)
        self.pos += len(data)
        return data

    def close(self) -> None:
        self.fh.close()


def is_placeholder(obj: object) -> bool:
    return obj == PLACEHOLDER


def guarded_text(data: bytes) -> bytes | None:
    """`data` with its too-deep documents replaced by the placeholder; None when it has none."""
    fh = io.BytesIO(data)
    deep = too_deep(fh)
    if not deep:
        return None
    fh.seek(0)
    guarded, parts = Guarded(fh, deep), []
    while part := guarded.read(1 << 20):
        parts.append(part)
    return b"".join(parts)
