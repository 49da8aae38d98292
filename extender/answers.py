"""The extender's answers as JSON bytes, assembled from per-node pieces, without a loop over nodes.

At 5,000 nodes, building a 5,000-entry FailedNodes dict or prioritize list
in Python and serialising it took close to half of a request. An answer's
entries are a per-node prefix (`,"name"`, `,"name":` or
`,{"Host":"name","Score":`) followed, for failed nodes and scores, by one of
a dozen shared suffixes (a reason's JSON string, `7}`). `AnswerWriter`
renders the three prefixes of every node once per state, on first use, into
numpy object arrays over the state's rows; an answer is then fancy indexing,
an interleave by slice assignment and one `b"".join` (all C loops), one
allocation of the answer's size. The bytes are exactly what `orjson.dumps`
writes for the same dict/list (tests/extender/test_answers.py).

Why prefixes and shared suffixes rather than one fragment per (node, code):
that table is 11-12 times larger, and picking 5,000 random objects from it
touched megabytes of memory per answer; measured in the gunicorn worker on a
shared 2-core machine, cache misses made it the largest cost of a request.

A prioritize answer joins per-node entries rendered with score "0"
(`,{"Host":"name","Score":0}`), or "10" for the engine's pick and the nodes
identical to it (thousands in a cluster of many identical nodes: splicing
them in one by one was a Python loop), then overwrites every one-digit score
in one numpy assignment at offsets from the entries' cumulative lengths.
That halves the pieces to join against prefix + suffix.

Names not in the state (rows < 0) get their prefix rendered on the spot
(rare: a node the watch has not shown yet). One writer belongs to one
state's row order; the service makes a new one when the state is rebuilt.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from gpupolicy.packing.placement import REASON_BY_CODE, RejectReason

ObjArray = npt.NDArray[np.object_]
UNKNOWN = -1  # reason code of a name the model does not know; REASONS[UNKNOWN] is its message
MAX_SCORE = 10  # prioritize scores are 0..MAX_SCORE
UNRESOLVABLE_PER_REASON = 16  # FailedAndUnresolvableNodes: at most this many nodes per reason


def _reason(reason: RejectReason) -> str:
    return f"kubeon-gpu: {reason.value}"


REASONS: tuple[str, ...] = (*(_reason(r) for r in REASON_BY_CODE), _reason(RejectReason.UNKNOWN_NODE))


def _objects(items: Sequence[bytes]) -> ObjArray:
    out = np.empty(len(items), dtype=object)
    out[:] = list(items)
    return out


_REASON_JSON = _objects([orjson.dumps(r) for r in REASONS])  # index: code (UNKNOWN = last)
_SCORE_END = _objects([f"{s}}}".encode() for s in range(MAX_SCORE + 1)])

# Each prefix carries its leading comma; a section drops the first one.
_PREFIXES: dict[str, Callable[[bytes], bytes]] = {
    "name": lambda quoted: b"," + quoted,
    "key": lambda quoted: b"," + quoted + b":",
    "host": lambda quoted: b',{"Host":' + quoted + b',"Score":',
}


def bounded_unresolvable(pos: npt.NDArray[np.intp], codes: npt.NDArray[Any],
                         limit: int) -> tuple[npt.NDArray[np.intp], dict[int, int]]:
    """Of the unresolvable positions `pos`, the first `limit` of each reason (input order kept), and
    {code: count} of the reasons that had more.

    kube-scheduler gives a node the extender left out of both maps the status
    of an absent node, UnschedulableAndUnresolvable, exactly what
    FailedAndUnresolvableNodes says (framework.NewDefaultNodeToStatus;
    schedule_one.go findNodesThatPassExtenders): listing such a node only adds
    its reason to the pod's FailedScheduling message. So a bounded sample per
    reason, its reason naming the full count, tells the user the same.
    """
    if pos.size <= limit:
        return pos, {}
    at = codes[pos]
    order = np.argsort(at, kind="stable")
    grouped = at[order]
    starts = np.flatnonzero(np.r_[True, grouped[1:] != grouped[:-1]])
    counts = np.diff(np.r_[starts, grouped.size])
    rank = np.arange(grouped.size) - np.repeat(starts, counts)
    kept = pos[np.sort(order[rank < limit])]
    crowded = {int(grouped[s]): int(c) for s, c in zip(starts.tolist(), counts.tolist(), strict=True) if c > limit}
    return kept, crowded


def crowded_reason(code: int, count: int) -> str:
    """A reason shown for a sample of its nodes, with how many nodes it applies to."""
    return f"{REASONS[code]} ({count} nodes)"


# What kube-scheduler adds per host besides the extenders (pkg/scheduler/apis/config/v1/default_plugins.go,
# the profile the chart ships): TaintToleration 3, NodeAffinity 2, NodeResourcesFit 1, PodTopologySpread 2,
# InterPodAffinity 2, NodeResourcesBalancedAllocation 1, ImageLocality 1, each 0..MaxNodeScore (100). The
# most these can put one host ahead of another. PodTopologySpread (system default spreading for pods of a
# Service or ReplicaSet) and ImageLocality (cached images) score real pods, so all of them count.
MAX_NODE_SCORE = 100
DEFAULT_PLUGIN_SWING = MAX_NODE_SCORE * (3 + 2 + 1 + 2 + 2 + 1 + 1)
EXTENDER_POINT = MAX_NODE_SCORE // MAX_SCORE  # extender.go: score x weight x (MaxNodeScore / MaxExtenderPriority)


def score_reach(weight: int, swing: int = DEFAULT_PLUGIN_SWING) -> int | None:
    """How many points below the top extender score a host can still be placed; None: unknown (weight 0).

    kube-scheduler adds `score x weight x 10` per listed host to the plugins'
    total (0..`swing` apart between two hosts) and takes the highest
    (prioritizeNodes, nodeScoreHeap in schedule_one.go). A host `d` points
    below the top scorer can beat or tie it only if `d x weight x 10 <= swing`.
    """
    if weight <= 0:
        return None
    return swing // (weight * EXTENDER_POINT)


def listed_scores(scores: npt.NDArray[np.int64], reach: int | None) -> npt.NDArray[np.intp] | None:
    """The positions a prioritize answer lists (None: every position).

    kube-scheduler adds each listed host's score x weight x 10 to its total,
    nothing for an unlisted one, and gives only listed hosts the random value
    (Randomizer) that breaks exact ties (prioritizeNodes in schedule_one.go).
    A host more than `reach` points (`score_reach`) below the top scorer
    cannot be placed whatever the plugins say, listed or not, and leaving it
    out only lowers its total: the pick is the same as with every host listed.
    Every host within `reach` of the top is listed with its score, so their
    totals and random tie-breaks are the same as with the full list. With
    `reach` unknown (the extender was not told its weight) or no host above 0,
    every host is listed.
    """
    if reach is None or scores.size == 0:
        return None
    top = int(scores.max())
    if top == 0:
        return None
    listed = np.flatnonzero(scores >= top - reach)
    return None if listed.size == scores.size else listed


class AnswerWriter:
    """Filter and prioritize answers for the nodes of one state (`names` in row order)."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = names
        self._prefixes: dict[str, ObjArray] = {}
        self._zero: tuple[ObjArray, ObjArray, npt.NDArray[np.int64]] | None = None

    def _prefix_array(self, kind: str) -> ObjArray:
        arr = self._prefixes.get(kind)
        if arr is None:
            render = _PREFIXES[kind]
            arr = _objects([render(orjson.dumps(n)) for n in self.names])
            self._prefixes[kind] = arr
        return arr

    def _section(self, kind: str, names: Sequence[str], rows: npt.NDArray[np.int64],
                 pos: npt.NDArray[np.intp] | None, ends: ObjArray | None = None,
                 codes: npt.NDArray[Any] | None = None) -> list[bytes]:
        """Entries for input positions `pos` (all when None), in order: prefix, then `ends[code]` if given."""
        at_rows = rows if pos is None else rows[pos]
        if at_rows.size == 0:
            return []
        picked = self._prefix_array(kind)[np.maximum(at_rows, 0)]
        for i in np.flatnonzero(at_rows < 0).tolist():  # names the state does not know
            picked[i] = _PREFIXES[kind](orjson.dumps(names[i if pos is None else int(pos[i])]))
        prefixes: list[bytes] = picked.tolist()
        prefixes[0] = prefixes[0][1:]  # no comma before the first entry
        if ends is None or codes is None:
            return prefixes
        at_codes = codes if pos is None else codes[pos]
        parts: list[bytes] = [b""] * (2 * len(prefixes))
        parts[0::2] = prefixes
        parts[1::2] = ends[at_codes].tolist()
        return parts

    def filter_answer(self, names: Sequence[str], rows: npt.NDArray[np.int64], codes: npt.NDArray[Any],
                      hopeless: npt.NDArray[np.bool_]) -> bytes:
        """ExtenderFilterResult with NodeNames (nodeCacheCapable): passed names in input order,
        FailedNodes with the reason of every other name preemption could help, and
        FailedAndUnresolvableNodes bounded (`bounded_unresolvable`)."""
        rejected = codes != 0
        parts = [b'{"Nodes":null,"NodeNames":[']
        parts += self._section("name", names, rows, np.flatnonzero(~rejected))
        parts.append(b'],"FailedNodes":{')
        parts += self._section("key", names, rows, np.flatnonzero(rejected & ~hopeless), _REASON_JSON, codes)
        parts.append(b'},"FailedAndUnresolvableNodes":{')
        kept, crowded = bounded_unresolvable(np.flatnonzero(rejected & hopeless), codes, UNRESOLVABLE_PER_REASON)
        ends = _REASON_JSON
        if crowded:
            ends = ends.copy()
            for code, count in crowded.items():
                ends[code] = orjson.dumps(crowded_reason(code, count))
        parts += self._section("key", names, rows, kept, ends, codes)
        parts.append(b'},"Error":""}')
        return b"".join(parts)

    def prioritize_answer(self, names: Sequence[str], rows: npt.NDArray[np.int64],
                          scores: npt.NDArray[np.int64], reach: int | None = None) -> bytes:
        """The bare HostPriorityList: {"Host", "Score"} for the input names that can still be placed, in
        order (`listed_scores`: within `reach` points of the top; every name when `reach` is None)."""
        pos = listed_scores(scores, reach)
        at_rows = rows if pos is None else rows[pos]
        if at_rows.size == 0 or int(at_rows.min()) < 0:  # names the state does not know: the general path
            parts = [b"["]
            parts += self._section("host", names, rows, pos, _SCORE_END, scores)
            parts.append(b"]")
            return b"".join(parts)
        rows = at_rows
        if pos is not None:
            scores = scores[pos]
        entries, tens_entries, lengths = self._score_entries()
        tens = scores >= MAX_SCORE  # the engine's pick and the nodes identical to it: two digits
        chosen = entries[rows]
        if tens.any():
            chosen[tens] = tens_entries[rows[tens]]
        picked: list[bytes] = chosen.tolist()
        picked[0] = picked[0][1:]  # no comma before the first entry
        buf = np.frombuffer(b"[" + b"".join(picked) + b"]", dtype=np.uint8).copy()
        ends = np.cumsum(lengths[rows] + tens)  # entry i ends (exclusive) at 1 + ends[i] - 1 (comma dropped)
        ones = ~tens
        buf[ends[ones] - 2] = scores[ones] + ord("0")  # "...,"Score":D}": the digit is second-to-last
        return buf.tobytes()

    def _score_entries(self) -> tuple[ObjArray, ObjArray, npt.NDArray[np.int64]]:
        """`,{"Host":"name","Score":0}` and `...:10}` per row, and the first's length (once per state)."""
        if self._zero is None:
            host = self._prefix_array("host")
            entries = host + b"0}"
            self._zero = (entries, host + b"10}", np.fromiter(map(len, entries), dtype=np.int64, count=len(entries)))
        return self._zero
