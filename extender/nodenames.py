"""NodeNames lists -> rows of the engine's `NodeState`, remembered for the lists seen last.

kube-scheduler sends the same NodeNames list (every node that passed its own
filters, in the same order) for consecutive pods, and /prioritize gets the
list /filter answered. Mapping 5,000 names through a dict per request was a
fifth of a request's time; comparing a list with one seen before is a C
loop over string comparisons (tens of microseconds), so this keeps the last
few lists with their rows.

A remembered list is found by a cheap key (length, first and last name),
then confirmed by full equality, so a different list never gets stale rows.
Rows belong to one state object: after a rebuild (node added or removed)
every entry is stale and is recomputed. Not thread-safe: the service calls
it with the cache lock held.

A new list (kube-scheduler's sampled NodeNames: a different window of its
node order for every pod) is mapped through a name -> row dict of its own,
built from fresh copies of the names. The state's `index` has the names the
watch parsed, strewn over hundreds of MiB of node objects: a lookup whose
hash matches compares the key string, and there each one was a cache and
TLB miss (0.12-0.17 ms for 750 names in process, 0.4 ms in the worker,
against 0.06 ms with the keys and rows allocated side by side;
docs/benchmarks/history/extender.md, issue 16 fourth round).

Better still, in kube-scheduler's order: it checks nodes in the same order
pod after pod (its snapshot's node list, zones interleaved), starting where
the last search stopped, so each list is the next stretch of that order. The
dict is first built in row order; the order of the names in the lists is
recorded as they come, and once a list brings (almost) no name not seen
before (a turn of kube-scheduler's rotation; at most `LEARN_LISTS` lists),
the dict is built again with the keys
and rows allocated in that order, so a list's lookups read neighbouring
memory (0.27 -> 0.18 ms for 750 names with cold caches in process).
Lookups give the same rows in any order: answers do not change.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from itertools import repeat

import numpy as np
import numpy.typing as npt

from gpupolicy.packing.nodemodel import IntArray, NodeState

UNKNOWN_ROW = -1  # a name the state does not know
LEARN_LISTS = 64  # new lists recorded at most before the dict is laid out in kube-scheduler's order

_Key = tuple[int, str, str]


def _laid_out(order: Iterable[str], index: dict[str, int]) -> dict[str, int]:
    """`index` with new key strings and row ints allocated one after another in `order` ("".join copies
    a string, + 0 an int above the small-int cache)."""
    return {"".join((name, "")): index[name] + 0 for name in order}


def _key(names: list[str]) -> _Key:
    return (len(names), names[0], names[-1]) if names else (0, "", "")


class NodeNameRows:
    """`rows(state, names)`: the state's row per name (`UNKNOWN_ROW` when absent), cached per list."""

    def __init__(self, size: int = 4) -> None:
        self.size = size
        self._state: NodeState | None = None
        self._entries: OrderedDict[_Key, list[tuple[list[str], IntArray]]] = OrderedDict()
        self._objects: tuple[list[str], npt.NDArray[np.object_]] | None = None  # the last list picked from
        self._index: dict[str, int] = {}  # the state's names (fresh copies, allocated together) -> row
        self._learned: dict[str, None] | None = None  # kube-scheduler's order, while it is being learned
        self._lists_learned = 0
        self.hits = 0
        self.misses = 0

    def pick(self, names: list[str], positions: IntArray) -> list[str]:
        """`[names[i] for i in positions]`, through an object array kept for the last list (half the time)."""
        held = self._objects
        if held is None or held[0] is not names:
            arr = np.empty(len(names), dtype=object)
            arr[:] = names
            held = self._objects = (names, arr)
        picked: list[str] = held[1][positions].tolist()
        return picked

    def _use(self, state: NodeState) -> None:
        if state is not self._state:
            self._state = state
            self._entries.clear()
            self._index = _laid_out(state.names, state.index)
            self._learned, self._lists_learned = {}, 0

    def _learn(self, state: NodeState, names: list[str]) -> None:
        """Record the order of a new list's names; lay the dict out in it after a whole turn (module doc)."""
        learned = self._learned
        if learned is None:
            return
        before = len(learned)
        learned.update(dict.fromkeys(names))
        self._lists_learned += 1
        turned = before and len(learned) - before <= len(names) // 100  # (almost) nothing new: a turn
        if turned or self._lists_learned >= LEARN_LISTS:
            order = [name for name in learned if name in state.index]
            order += [name for name in state.names if name not in learned]
            self._index = _laid_out(order, state.index)
            self._learned = None

    def rows(self, state: NodeState, names: list[str]) -> IntArray:
        """Rows for `names` in order. The returned array is shared: do not modify it."""
        self._use(state)
        key = _key(names)
        for seen, rows in self._entries.get(key, ()):
            if seen is names or seen == names:  # identity, else a C-level element comparison
                self._entries.move_to_end(key)
                self.hits += 1
                return rows
        self.misses += 1
        get = self._index.get
        rows = np.fromiter(map(get, names, repeat(UNKNOWN_ROW)), dtype=np.int64, count=len(names))
        self.remember(state, names, rows)
        self._learn(state, names)
        return rows

    @property
    def learning(self) -> bool:
        """Whether kube-scheduler's order is still being learned for the current state."""
        return self._learned is not None

    def remember(self, state: NodeState, names: list[str], rows: IntArray) -> None:
        """Record rows computed elsewhere (e.g. the names /filter passed, which /prioritize will send)."""
        self._use(state)
        rows.setflags(write=False)
        key = _key(names)
        bucket = self._entries.setdefault(key, [])
        bucket[:] = [(seen, r) for seen, r in bucket if seen != names][-1:]
        bucket.append((names, rows))
        self._entries.move_to_end(key)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)
