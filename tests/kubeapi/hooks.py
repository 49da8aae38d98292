"""Test hooks (`ApiServer.hooks`): the controls a test needs over what a real API server does only by chance.

Why: a client's handling of a dropped watch, of a 410 answered as an HTTP status rather than an ERROR
event, of a garbage line in a watch stream, or of losing an optimistic-concurrency race has to be tested
on purpose, not waited for; and a test that stops a client while its watch request is in flight has to
know the moment the server has that request. Every hook is off until a test uses it: a server whose
hooks are never touched behaves exactly as one without them (the counters only count).

Paths are request paths as the client sent them, without the query: `/api/v1/nodes`,
`/apis/gpu.kubeon.io/v1alpha1/gpupolicies`, `/api/v1/namespaces/default/pods`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from tests.kubeapi.resources import Catalog, Resource
from tests.kubeapi.status import ApiError
from tests.kubeapi.store import Store

# What a watch answers to, taken when its request arrives: (drop generation, expiry generation).
Ticket = tuple[int, int]


class Hooks:
    """Observe list/watch requests; drop or expire open watches; inject raw watch lines; force write conflicts.

    The hooks share the store's lock, so a hook that ends watches wakes them where they wait for events,
    and a change of generation is seen by a watch whose request arrived at the same moment (its ticket is
    taken under the same lock).
    """

    def __init__(self, store: Store, catalog: Catalog) -> None:
        self._store = store
        self._catalog = catalog
        self._cond = store.cond
        self._lists: list[str] = []
        self._watches: list[tuple[str, str | None]] = []
        self._drops = 0
        self._expiries = 0
        self._races: list[str | None] = []  # one entry per read still to be raced: its path, or None for any
        # Watches from a compacted resourceVersion are answered with an HTTP 410 Status (what kube-apiserver
        # does on some paths, and what clients must handle as well as the ERROR event), not 200 + ERROR.
        self.gone_as_http = False
        # Lists of built-in kinds answer items without kind/apiVersion, as kube-apiserver's typed lists do
        # (custom resources keep them, as upstream): off by default, as tests here have long read them.
        self.bare_list_items = False
        self.http_410s = 0  # watches answered 410 by `gone_as_http`

    # observing --------------------------------------------------------------------------------------
    def lists(self, path: str) -> int:
        """How many list requests (GET of a collection, not a watch) `path` has had."""
        with self._cond:
            return sum(1 for p in self._lists if p == path)

    def watches(self, path: str) -> list[str | None]:
        """The `resourceVersion` parameter (None when absent) of every watch request on `path`, oldest first,
        recorded when the request arrives, before anything is answered."""
        with self._cond:
            return [rv for p, rv in self._watches if p == path]

    def wait_for_watches(self, path: str, count: int, timeout: float) -> bool:
        """Block until `path` has had `count` watch requests (True), or `timeout` seconds pass (False).
        Woken by the request itself, so a test can act while the watch's answer is still being written."""
        with self._cond:
            return self._cond.wait_for(lambda: len(self.watches(path)) >= count, timeout)

    # controlling ------------------------------------------------------------------------------------
    def drop_watches(self) -> None:
        """End every open watch as a closed connection: the stream ends (terminating chunk), no ERROR event,
        nothing compacted, so a client resumes from the last resourceVersion it saw."""
        with self._cond:
            self._drops += 1
            self._cond.notify_all()

    def expire_watches(self) -> None:
        """Compact the history (api.compact()) and send every open watch an ERROR event with a 410 Expired
        Status, as kube-apiserver does when its watch cache is reset: every watcher must relist."""
        with self._cond:
            self._store.compact()
            self._expiries += 1
            self._cond.notify_all()

    def inject_line(self, path: str, line: str) -> None:
        """Send `line` as is, as one line of the JSON watch streams of the collection at `path` (a
        namespace's collection: that namespace's watches and all-namespace ones), in order with the
        events around it and to later watches from an older resourceVersion, as an event would be.
        It takes a resourceVersion of its own. Protobuf watches skip it."""
        res, ns = self._collection(path)
        self._store.inject(res.key, ns, line.encode())

    def race_reads(self, count: int, path: str | None = None) -> None:
        """The next `count` GETs of a single object (at `path`, or any) are each followed, before the answer
        goes out, by another writer's update of that object (a new resourceVersion and a MODIFIED event, the
        content unchanged), so the reader's write conditioned on what it read conflicts: N forced conflicts."""
        with self._cond:
            self._races.extend([path] * count)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Hold the store's lock for the block: no watch reads the history until it ends, so what is written
        in it and then compacted away in it (expire_watches(), api.compact()) is never seen by any watch,
        as changes lost to a compaction. Write in-process (api.registry): an HTTP request waits for the lock."""
        with self._cond:
            yield

    # called by the server ---------------------------------------------------------------------------
    def saw_list(self, path: str) -> None:
        with self._cond:
            self._lists.append(path)

    def saw_watch(self, path: str, resource_version: str | None) -> Ticket:
        with self._cond:
            self._watches.append((path, resource_version))
            self._cond.notify_all()
            return self._drops, self._expiries

    def dropped(self, ticket: Ticket) -> bool:
        with self._cond:
            return self._drops != ticket[0]

    def expired(self, ticket: Ticket) -> bool:
        with self._cond:
            return self._expiries != ticket[1]

    def refuse_gone(self, since: int) -> None:
        """With `gone_as_http`, raise the 410 a watch from a compacted `since` is answered with."""
        if not self.gone_as_http:
            return
        message = self._store.too_old(since)
        if message is not None:
            with self._cond:
                self.http_410s += 1
            raise ApiError(410, "Expired", message)

    def after_read(self, path: str, res: Resource, ns: str, name: str) -> None:
        with self._cond:
            index = next((i for i, p in enumerate(self._races) if p in (None, path)), None)
            if index is None:
                return
            current = self._store.get(res.key, ns, name)
            if current is not None:
                del self._races[index]
                self._store.put(res.key, current)

    def _collection(self, path: str) -> tuple[Resource, str]:
        parts = [p for p in path.split("/") if p]
        if parts[:1] == ["api"] and len(parts) >= 3:
            group, version, rest = "", parts[1], parts[2:]
        elif parts[:1] == ["apis"] and len(parts) >= 4:
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise ValueError(f"not a collection path: {path!r}")
        ns = ""
        if len(rest) == 3 and rest[0] == "namespaces":
            ns, rest = rest[1], rest[2:]
        res = self._catalog.lookup(group, version, rest[0]) if len(rest) == 1 else None
        if res is None:
            raise ValueError(f"not a collection path: {path!r}")
        return res, ns
