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

Why this is exact: a tail is recorded only when it is exactly `:` + the
compact JSON of the list + `}`. A body ending in it, whose head parses with
`"NodeNames":null}` appended, is valid JSON of the same structure with the
list in place of null: the final `}` ends the body, so it closes the
top-level object and NodeNames is a top-level member (the last, which is
the one a JSON parser keeps when a key repeats). A match preceded by a
backslash could be the end of an escaped key, so it is not used. Anything
else (other key orders, whitespace, malformed bodies) is parsed in full,
with the same errors as before.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

import orjson

KEY = b'"NodeNames"'
NULL_TAIL = b":null}"
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
        self.reused = 0  # bodies whose NodeNames came from a known tail (tests and benchmarks read it)

    def read(self, raw: bytes) -> Any:
        """Parse `raw`; ValueError (orjson's JSONDecodeError) for malformed JSON, as a plain parse would."""
        for at in self._candidates(raw):
            if at <= 0 or raw[at - 1] == 0x5C:  # not after a backslash
                continue
            tail = raw[at + len(KEY):]  # a copy, but bytes == bytes is a memcmp (a memoryview compares slowly)
            names = self._known(tail)
            if names is not None:
                try:
                    head = self._loads(raw[:at] + KEY + NULL_TAIL)
                except ValueError:
                    head = None
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
        sig = _signature(tail)
        with self._lock:
            found = self._tails.get(sig)
            if found is None or found[0] != tail:
                return None
            self._tails.move_to_end(sig)
            return found[1]

    def _remember(self, tail: bytes, names: list[str]) -> None:
        sig = _signature(tail)
        with self._lock:
            self._tails[sig] = (tail, names)
            self._tails.move_to_end(sig)
            while len(self._tails) > self.size:
                self._tails.popitem(last=False)
