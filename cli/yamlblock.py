"""Plain data as a YAML block document, byte for byte what `yaml.dump` with the C dumper writes, in one pass.

Why: `-o yaml` of a large dry-run spent as long in the YAML writer as in
parsing the input (docs/benchmarks/history/dryrun-and-issue16-rounds.md, "Dry-run streamed"): libyaml's
emitter is C, but it calls back into Python per node (representer,
resolver, serializer). Dry-run answers are JSON-like data (dicts with str
keys, lists, str, int, bool, None) in one layout (block style, 2-space
indent, sequences in a mapping not indented, `{}`/`[]` when empty), so this
writes that layout directly, with each distinct string's quoting worked out
once.

What it reproduces of libyaml's emitter (`emitter.c`, PyYAML 6's
`CSafeDumper` with default_flow_style=False, width 80, indent 2):
- a string is plain unless a plain scalar would read back as something else
  (`'2'`, `'true'`, `'null'`, `''`, timestamps: the resolver decides) or it
  has a block indicator (`: `, ` #`, a leading `-`/`?`/`:` before a space,
  a leading `#,[]{}&*!|>'"%@` or backquote, `---`/`...`); then single-quoted with `'`
  doubled;
- a value longer than the line folds at a single space once the column
  passes 80, continuing at the scalar's indent (its collection's + 2);
  keys never fold.
Anything outside that (non-ASCII or control characters, leading or
trailing spaces, keys that are not short strings, floats, other types,
nesting past `MAX_DEPTH`) raises `Unsupported`, and the caller writes that document with the libyaml
dumper instead. tests/cli/test_yaml_block.py compares both on generated data.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Any

WIDTH = 80  # libyaml's best_width when none is set
MAX_KEY = 120  # a longer key is a "complex" key in libyaml (`? key`): not written here
# Deeper data goes to the dumper, which then succeeds or fails (RecursionError) exactly as before: its
# depth limit is the interpreter's recursion limit over several frames per level, this writer's one frame.
MAX_DEPTH = 48

_FIRST_INDICATORS = frozenset("#,[]{}&*!|>'\"%@`")


class Unsupported(ValueError):
    """Data this writer does not reproduce exactly: write it with the libyaml dumper."""


def dump(data: dict[str, Any], resolve: Callable[[str], bool]) -> str:
    """`data` as one YAML document (ends with a newline).

    `resolve(text)`: whether `text` written plain reads back as a string
    (the resolver's implicit tag for a plain scalar is `str`).
    """
    if type(data) is not dict or not data:
        raise Unsupported("top level: a non-empty mapping is written here")
    out: list[str] = []
    _Emitter(out, resolve).mapping(data, 0, inline=False)
    return "".join(out)


class _Emitter:
    def __init__(self, out: list[str], resolve: Callable[[str], bool]) -> None:
        self.out = out
        self.resolve = resolve

    def mapping(self, data: dict[Any, Any], indent: int, inline: bool) -> None:
        if indent > 2 * MAX_DEPTH:
            raise Unsupported("nested deeper than MAX_DEPTH")
        out, resolve = self.out, self.resolve
        keys, styles = _KEYS, _STYLES
        pad = " " * indent
        for key, value in data.items():
            ktext = keys.get(key) if type(key) is str else None
            if ktext is None:
                ktext = _key(key, resolve)
            head = ktext + ":" if inline else pad + ktext + ":"
            inline = False
            kind = type(value)
            if kind is str:  # the common case first, inline
                found = styles.get(value) or _style(value, resolve)
                text = found[0]
                column = indent + len(ktext) + 2
                if column + len(text) > WIDTH + 1 and " " in value:
                    text = _fold(value, found[1], column, indent + 2)
                out.append(head + " " + text + "\n")
            elif kind is dict:
                if value:
                    out.append(head + "\n")
                    self.mapping(value, indent + 2, inline=False)
                else:
                    out.append(head + " {}\n")
            elif kind is list:
                if value:
                    out.append(head + "\n")
                    self.sequence(value, indent, inline=False)  # a sequence in a mapping is not indented
                else:
                    out.append(head + " []\n")
            else:
                out.append(head + " " + self.scalar(value, indent + len(ktext) + 2, indent + 2) + "\n")

    def sequence(self, data: list[Any], indent: int, inline: bool) -> None:
        if indent > 2 * MAX_DEPTH:
            raise Unsupported("nested deeper than MAX_DEPTH")
        out = self.out
        pad = " " * indent
        for value in data:
            head = "-" if inline else pad + "-"
            inline = False
            kind = type(value)
            if kind is dict:
                if value:
                    out.append(head + " ")
                    self.mapping(value, indent + 2, inline=True)
                else:
                    out.append(head + " {}\n")
            elif kind is list:
                if value:
                    out.append(head + " ")
                    self.sequence(value, indent + 2, inline=True)
                else:
                    out.append(head + " []\n")
            else:
                out.append(head + " " + self.scalar(value, indent + 2, indent + 2) + "\n")

    def scalar(self, value: Any, column: int, indent: int) -> str:
        """`value` written from `column`; continuation lines (a long string) at `indent`."""
        kind = type(value)
        if kind is str:
            text, quoted = _STYLES.get(value) or _style(value, self.resolve)
            if column + len(text) <= WIDTH + 1 or " " not in value:
                return text  # no space past the width: nothing folds
            return _fold(value, quoted, column, indent)
        if kind is bool:
            return "true" if value else "false"
        if kind is int:
            return str(value)
        if value is None:
            return "null"
        raise Unsupported(f"a {kind.__name__} value")


_KEYS: dict[str, str] = {}
_STYLES: dict[str, tuple[str, bool]] = {}
_STYLES_MAX = 1 << 16


def _style(text: str, resolve: Callable[[str], bool]) -> tuple[str, bool]:
    """`text` as written on one line, and whether it is single-quoted. Cached per string."""
    found = _STYLES.get(text)
    if found is not None:
        return found
    if not (text.isascii() and text.isprintable()):  # printable ASCII: 0x20-0x7e
        raise Unsupported("non-ASCII or control characters")
    if text and (text[0] == " " or text[-1] == " "):
        raise Unsupported("leading or trailing space")
    plain = bool(text) and not _block_indicator(text) and resolve(text)
    found = (text, False) if plain else ("'" + text.replace("'", "''") + "'", True)
    if len(_STYLES) >= _STYLES_MAX:
        _STYLES.clear()
    _STYLES[text] = found
    return found


def _key(key: Any, resolve: Callable[[str], bool]) -> str:
    """A mapping key as written (never folded). Cached per key."""
    if type(key) is not str:
        raise Unsupported("a key that is not a string")
    if len(key) > MAX_KEY:
        raise Unsupported("a long key")
    text = _style(key, resolve)[0]
    if len(_KEYS) >= _STYLES_MAX:
        _KEYS.clear()
    _KEYS[key] = text
    return text


def _block_indicator(text: str) -> bool:
    """libyaml's `block_indicators` for a scalar (emitter.c, yaml_emitter_analyze_scalar)."""
    first = text[0]
    after_first_blank = len(text) == 1 or text[1] == " "
    return (first in _FIRST_INDICATORS or (first in "?:-" and after_first_blank)
            or text.startswith(("---", "...")) or ": " in text or text.endswith(":") or " #" in text)


@lru_cache(maxsize=4096)
def _fold(text: str, quoted: bool, column: int, indent: int) -> str:
    """A plain or single-quoted scalar with libyaml's line breaks (yaml_emitter_write_plain / _single_quoted):
    a single space (not first or last in a quoted one) becomes a break when the column is past the width."""
    out: list[str] = []
    if quoted:
        out.append("'")
        column += 1
    last = len(text) - 1
    spaces = False
    for i, ch in enumerate(text):
        if ch == " ":
            if (not spaces and column > WIDTH and (i == last or text[i + 1] != " ")
                    and not (quoted and (i == 0 or i == last))):
                out.append("\n" + " " * indent)
                column = indent
            else:
                out.append(" ")
                column += 1
            spaces = True
        else:
            if quoted and ch == "'":
                out.append("'")
                column += 1
            out.append(ch)
            column += 1
            spaces = False
    if quoted:
        out.append("'")
    return "".join(out)
