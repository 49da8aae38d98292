"""The packing state of Kubernetes objects, kept between a controller's passes. Pure (no I/O).

Why: consolidation needs the state of every GPU node with every pod on it
(`kubemodel.state_from_kubernetes`), and the capacity pass runs every 10 s.
Built anew each pass it cost about 2.4 s of a 3.6 s pass at 5,000 nodes and
50,000 pods (`python bench/controller_pass.py`), though between two passes
few pods change. `StateMemo` keeps the last state and recomputes only the
rows whose pods changed (`NodeState.reset_row`, then the same
`kubemodel.occupy_rows`): a row's pods are known by (uid,
resourceVersion), and a version never changes; first by the objects
themselves, which a watch cache keeps until they change (`ParseMemo`,
"Held objects"), without reading a field. Exact: any change of a
node's capacity or layout, of the node list, or of which pod counts a
shared claim's GPU builds the state anew; a pod without a version makes
its row recomputed every time. Listed in docs/designs/caches.md.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpupolicy.packing.dradevices import shared_claim_takers
from gpupolicy.packing.kubemodel import bound_by_row, node_specs, occupy_rows, pod_version
from gpupolicy.packing.nodemodel import NodeSpec, NodeState

Obj = Mapping[str, Any]


class StateMemo:
    """The last state built (one owner: the capacity reconciler), with what each row was computed from."""

    def __init__(self) -> None:
        self._state: NodeState | None = None
        self._specs: list[NodeSpec] = []
        self._takers: set[str] = set()
        self._rows: dict[int, tuple[Any, ...]] = {}  # row -> (schedulable, its pods' versions)
        self._objects: dict[int, tuple[bool, tuple[Obj, ...]]] = {}  # row -> (schedulable, its pod objects)
        self._problems: dict[int, dict[str, str]] = {}  # row -> its unreadable pods
        self.builds = 0
        self.row_updates = 0

    def state(self, nodes: Iterable[Obj], pods: Iterable[Obj], unreadable: dict[str, str] | None = None,
              slices: Iterable[Obj] = ()) -> NodeState:
        """What `state_from_kubernetes(nodes, pods, unreadable, slices)` returns (a copy: the caller's)."""
        unreadable = {} if unreadable is None else unreadable
        specs, schedulable = node_specs(nodes, slices, unreadable)
        pods = list(pods)
        takers = shared_claim_takers(pods)
        state = self._state
        if state is None or specs != self._specs or takers != self._takers:
            state = NodeState.build(specs)
            self._specs, self._takers, self._rows, self._problems, self._objects = specs, takers, {}, {}, {}
            self.builds += 1
        by_row = bound_by_row(pods, state.index)
        for row, ok in enumerate(schedulable):
            on_row = by_row.get(row, [])
            held = self._objects.get(row)
            if held is not None and held[0] == ok and same_objects(held[1], on_row):
                continue
            self._objects[row] = (ok, tuple(on_row))
            versions = [pod_version(pod) for pod in on_row]
            seen = (ok, tuple(versions)) if None not in versions else None
            if seen is not None and self._rows.get(row) == seen:
                continue
            state.reset_row(row, schedulable=ok)
            problems: dict[str, str] = {}
            occupy_rows(state, {row: on_row}, takers, problems)
            self._problems[row] = problems
            if seen is None:
                self._rows.pop(row, None)
                self._objects.pop(row, None)  # no version: recomputed every time
            else:
                self._rows[row] = seen
            self.row_updates += 1
        for problems in self._problems.values():
            unreadable.update(problems)
        self._state = state
        return state.copy()


def same_objects(held: Sequence[Obj], now: Sequence[Obj]) -> bool:
    """The same objects, in the same order: identity, since a watch cache keeps an object until it changes
    (`kubemodel.ParseMemo`, "Held objects")."""
    return len(held) == len(now) and all(map(operator.is_, held, now))
