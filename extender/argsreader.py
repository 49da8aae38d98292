"""ExtenderArgs bytes -> JSON, reusing the parsed NodeNames list when its bytes are ones seen before.

kube-scheduler (Go, `encoding/json`) writes ExtenderArgs compactly with
`NodeNames` last: `{"Pod":{...},"Nodes":null,"NodeNames":["a","b",...]}`.
At 5,000 nodes the list is ~100 KiB, and it is the same list pod after pod
(/filter), or the list /filter has just answered (/prioritize). Parsing it
into 5,000 new strings and then comparing it with the remembered list was a
tenth of a request; comparing bytes is a memcmp.

So the reader keeps the tails (`:["a","b",...]}`) of a few lists, and the
list object parsed from each. When a body ends with a known tail, only the
head is parsed (with `"NodeNames":null}` in place of the tail) and the known
list object is put back, so `NodeNameRows` finds it by identity.
`expect(names)` records the tail of a list about to be sent (what /filter
passed), so even the first /prioritize of a list is not parsed in full.

The head (the pod) is remembered the same way: /prioritize sends the pod
/filter has just sent, byte for byte, so a head seen before is not parsed
again; the body is a new top-level dict holding the very Pod object of the
first parse (read-only, as every parsed body), which lets `wire.parse_args`
and the service skip the checks and the reading they did for it (about
0.1 ms of a /prioritize at 15,000 nodes).

Why this is exact: a tail is recorded only when it is exactly `:` + the
compact JSON of the list + `}`. A body ending in it, whose head parses with
`"NodeNames":null}` appended, is valid JSON of the same structure with the
list in place of null: the final `}` ends the body, so it closes the
top-level object and NodeNames is a top-level member (the last, which is
the one a JSON parser keeps when a key repeats). A match preceded by a
backslash could be the end of an escaped key, so it is not used. Anything
else (other key orders, whitespace, malformed bodies) is parsed in full,
with the same errors as before. A head is recorded from a body whose tail
is exactly such a list (not after a backslash), with its members other than
NodeNames: those are what the head parses to with `"NodeNames":null}`
appended, since the list was the last member of the top-level object.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import orjson

KEY = b'"NodeNames"'
NULL_TAIL = b":null}"
_V = TypeVar("_V")
_Sig = tuple[int, bytes, bytes]  # (length, first 32 bytes, last 32 bytes) of a tail: finds the candidate


def _signature(tail: bytes) -> _Sig:
    return len(tail), tail[:32], tail[-32:]


class ArgsReader:
    """`read(raw)`: the parsed body; NodeNames is the remembered list object when its bytes match."""

    def __init__(self, size: int = 4, loads: Callable[[bytes], Any] = orjson.loads) -> None:
        self.size = size
        self._loads = loads
        self._lock = threading.Lock()
        self._tails: OrderedDict[_Sig, tuple[bytes, list[str]]] = OrderedDict()
        self._heads: OrderedDict[_Sig, tuple[bytes, dict[str, Any]]] = OrderedDict()  # NodeNames: None
        self.reused = 0  # bodies whose NodeNames came from a known tail (tests and benchmarks read it)
        self.heads_reused = 0  # of those, bodies whose head (the pod) was not parsed again

    def read(self, raw: bytes) -> Any:
        """Parse `raw`; ValueError (orjson's JSONDecodeError) for malformed JSON, as a plain parse would."""
        for at in self._candidates(raw):
            if at <= 0 or raw[at - 1] == 0x5C:  # not after a backslash
                continue
            tail = raw[at + len(KEY):]  # a copy, but bytes == bytes is a memcmp (a memoryview compares slowly)
            names = self._known(tail)
            if names is not None:
                head_bytes = raw[:at]
                members = self._lookup(self._heads, head_bytes)
                if members is not None:
                    self.heads_reused += 1
                    head: Any = dict(members)
                else:
                    try:
                        head = self._loads(head_bytes + KEY + NULL_TAIL)
                    except ValueError:
                        head = None
                    if isinstance(head, dict):
                        self._store(self._heads, head_bytes, dict(head))
                if isinstance(head, dict):
                    head["NodeNames"] = names
                    self.reused += 1
                    return head
        at = raw.rfind(KEY)
        body = self._loads(raw)
        if isinstance(body, dict) and isinstance(names := body.get("NodeNames"), list) and at > 0:
            try:
                compact = b":" + orjson.dumps(names) + b"}"
            except TypeError:  # not JSON a list of names serialises to: nothing to remember
                return body
            if raw.endswith(compact) and len(raw) - len(compact) == at + len(KEY):
                self._remember(compact, names)
                if raw[at - 1] != 0x5C:  # the key is NodeNames itself, the top-level object's last member
                    self._store(self._heads, raw[:at], {**body, "NodeNames": None})
        return body

    @staticmethod
    def _candidates(raw: bytes) -> Iterator[int]:
        """Where the NodeNames key may start: the first occurrence (the key follows the pod, a few KiB
        in, while the list after it runs to hundreds: a search from the end reads all of it), then, only
        if that one is not a known tail, the last. The tail comparison and the head's parse decide."""
        first = raw.find(KEY)
        if first < 0:
            return
        yield first
        last = raw.rfind(KEY, first + 1)
        if last >= 0:
            yield last

    def expect(self, names: list[str]) -> None:
        """Remember the tail a body carrying `names` will end with (the list /filter passed)."""
        self._remember(b":" + orjson.dumps(names) + b"}", names)

    def _known(self, tail: bytes) -> list[str] | None:
        return self._lookup(self._tails, tail)

    def _remember(self, tail: bytes, names: list[str]) -> None:
        self._store(self._tails, tail, names)

    def _lookup(self, table: OrderedDict[_Sig, tuple[bytes, _V]], data: bytes) -> _V | None:
        sig = _signature(data)
        with self._lock:
            found = table.get(sig)
            if found is None or found[0] != data:
                return None
            table.move_to_end(sig)
            return found[1]

    def _store(self, table: OrderedDict[_Sig, tuple[bytes, _V]], data: bytes, value: _V) -> None:
        sig = _signature(data)
        with self._lock:
            table[sig] = (data, value)
            table.move_to_end(sig)
            while len(table) > self.size:
                table.popitem(last=False)
