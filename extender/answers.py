"""The extender's answers as JSON bytes, assembled from per-node fragments, without a loop over nodes.

At 5,000 nodes, building a 5,000-entry FailedNodes dict or prioritize list
in Python and serialising it took close to half of a request. Every piece
of those answers depends only on a node's name and one small code (a
rejection reason, a score 0..10), so `AnswerWriter` renders each
(node, code) fragment once, on first use, into numpy object arrays over the
state's rows; an answer is then fancy indexing plus one `b"".join` (both
C loops). The bytes are exactly what `orjson.dumps` would write for the
same dict/list (tests/extender/test_answers.py checks it).

Names not in the state (rows < 0) get their fragments rendered on the spot
(rare: a node the watch has not shown yet). One writer belongs to one
state's row order; the service makes a new one when the state is rebuilt.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from gpupolicy.placement import REASON_BY_CODE, RejectReason

ObjArray = npt.NDArray[np.object_]
MAX_SCORE = 10  # prioritize scores are 0..MAX_SCORE
UNKNOWN = -1  # reason code of a name the model does not know; REASONS[UNKNOWN] is its message


def _reason(reason: RejectReason) -> str:
    return f"kubeon-gpu: {reason.value}"


REASONS: tuple[str, ...] = (*(_reason(r) for r in REASON_BY_CODE), _reason(RejectReason.UNKNOWN_NODE))
_REASON_JSON = tuple(orjson.dumps(r) for r in REASONS)


# Fragments carry their leading comma; a section drops the first one. The answer is then one
# b"".join over all fragments: one allocation of the answer's size (joining sections first and
# concatenating them cost as much again, in page faults on fresh 100+ KiB buffers).
def _passed(quoted: bytes, _code: int) -> bytes:
    return b"," + quoted


def _failed(quoted: bytes, code: int) -> bytes:
    return b"," + quoted + b":" + _REASON_JSON[code]


def _scored(quoted: bytes, score: int) -> bytes:
    return b',{"Host":' + quoted + b',"Score":' + str(score).encode() + b"}"


class AnswerWriter:
    """Filter and prioritize answers for the nodes of one state (`names` in row order)."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = names
        self._quoted: list[bytes] | None = None
        self._tables: dict[Any, tuple[ObjArray, npt.NDArray[np.bool_]]] = {}

    def _table(self, render: Any, width: int, codes: npt.NDArray[Any]) -> ObjArray:
        """(rows x codes) fragments for `render`, with the columns `codes` use rendered (lazily, once)."""
        table, built = self._tables.get(render, (None, None))
        if table is None or built is None:
            table = np.empty((len(self.names), width), dtype=object)
            built = np.zeros(width, dtype=bool)
            self._tables[render] = (table, built)
        wanted = np.bincount(codes, minlength=width) > 0
        for code in np.flatnonzero(wanted & ~built).tolist():
            if self._quoted is None:
                self._quoted = [orjson.dumps(n) for n in self.names]
            table[:, code] = [render(q, code) for q in self._quoted]
            built[code] = True
        return table

    def _section(self, render: Any, width: int, names: Sequence[str], rows: npt.NDArray[np.int64],
                 codes: npt.NDArray[Any], pos: npt.NDArray[np.intp] | None = None) -> list[bytes]:
        """Fragments for input positions `pos` (all when None, in order), each for its code."""
        at_rows, at_codes = (rows, codes) if pos is None else (rows[pos], codes[pos])
        if at_rows.size == 0:
            return []
        at_codes = at_codes % width  # UNKNOWN (-1) -> the last column
        table = self._table(render, width, at_codes)
        out = table[np.maximum(at_rows, 0), at_codes]
        for i in np.flatnonzero(at_rows < 0).tolist():  # names the state does not know
            out[i] = render(orjson.dumps(names[i if pos is None else int(pos[i])]), int(at_codes[i]))
        fragments: list[bytes] = out.tolist()
        fragments[0] = fragments[0][1:]  # no comma before the first
        return fragments

    def filter_answer(self, names: Sequence[str], rows: npt.NDArray[np.int64], codes: npt.NDArray[Any],
                      hopeless: npt.NDArray[np.bool_]) -> bytes:
        """ExtenderFilterResult with NodeNames (nodeCacheCapable): passed names in input order,
        FailedNodes / FailedAndUnresolvableNodes with the reason of each other name."""
        rejected = codes != 0
        parts = [b'{"Nodes":null,"NodeNames":[']
        parts += self._section(_passed, 1, names, rows, codes, np.flatnonzero(~rejected))
        parts.append(b'],"FailedNodes":{')
        parts += self._section(_failed, len(REASONS), names, rows, codes, np.flatnonzero(rejected & ~hopeless))
        parts.append(b'},"FailedAndUnresolvableNodes":{')
        parts += self._section(_failed, len(REASONS), names, rows, codes, np.flatnonzero(rejected & hopeless))
        parts.append(b'},"Error":""}')
        return b"".join(parts)

    def prioritize_answer(self, names: Sequence[str], rows: npt.NDArray[np.int64],
                          scores: npt.NDArray[np.int64]) -> bytes:
        """The bare HostPriorityList: one {"Host", "Score"} per input name, in order."""
        parts = [b"["]
        parts += self._section(_scored, MAX_SCORE + 1, names, rows, scores)
        parts.append(b"]")
        return b"".join(parts)
