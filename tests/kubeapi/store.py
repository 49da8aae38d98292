"""The versioned object map behind the double: one global resourceVersion counter,
a bounded event history, and watchers woken on every write.

It stores plain JSON dicts and knows nothing of the API's rules (the registry
applies those); it only guarantees what etcd guarantees kube-apiserver:
writes are serialised, every write gets a higher resourceVersion, and a watch
from resourceVersion N sees every later event in order, unless N has been
compacted out of the history, in which case the watch gets 410 Gone.
"""

from __future__ import annotations

import copy
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

Obj = dict[str, Any]


@dataclass(frozen=True)
class Event:
    rv: int
    type: str  # ADDED | MODIFIED | DELETED (| RAW, from a test hook)
    key: str  # resource storage key, "group/plural"
    namespace: str
    obj: Obj
    prev: Obj | None = None  # the object before a MODIFIED, for selector transitions
    raw: bytes | None = None  # type RAW: a line sent as is to the key's JSON watches (hooks.inject_line)


class Gone(Exception):
    """The requested resourceVersion is older than the kept history."""


class Store:
    """Objects by storage key and (namespace, name), plus the watch event log."""

    def __init__(self, history: int = 2000, first_rv: int = 1000) -> None:
        self.cond = threading.Condition(threading.RLock())
        self._rv = first_rv
        self._objects: dict[str, dict[tuple[str, str], Obj]] = {}
        self._history: deque[Event] = deque(maxlen=history)
        self._compacted = first_rv  # events at or below this rv are no longer kept
        self.closed = False

    # reads --------------------------------------------------------------------------------------
    @property
    def revision(self) -> int:
        with self.cond:
            return self._rv

    def get(self, key: str, namespace: str, name: str) -> Obj | None:
        with self.cond:
            obj = self._objects.get(key, {}).get((namespace, name))
            return copy.deepcopy(obj) if obj is not None else None

    def list(self, key: str, namespace: str | None = None) -> tuple[list[Obj], int]:
        with self.cond:
            items = [copy.deepcopy(o) for (ns, _), o in sorted(self._objects.get(key, {}).items())
                     if namespace is None or ns == namespace]
            return items, self._rv

    def too_old(self, since: int) -> str | None:
        """The Gone message a watch from `since` gets, or None when `since` is still in the history."""
        with self.cond:
            if since < self._compacted:
                return f"too old resource version: {since} ({self._compacted + 1})"
            return None

    def kinds(self) -> list[str]:
        """Storage keys that have ever held an object."""
        with self.cond:
            return list(self._objects)

    # writes -------------------------------------------------------------------------------------
    def put(self, key: str, obj: Obj, expect_rv: str | None = None, create: bool = False) -> Obj:
        """Store obj with a new resourceVersion. Raises KeyError/ValueError for the caller to map:
        KeyError('exists') on create of an existing object, KeyError('missing') on update of a
        missing one, ValueError on a resourceVersion precondition mismatch."""
        meta = obj["metadata"]
        ident = (meta.get("namespace", ""), meta["name"])
        with self.cond:
            bucket = self._objects.setdefault(key, {})
            current = bucket.get(ident)
            if create and current is not None:
                raise KeyError("exists")
            if not create and current is None:
                raise KeyError("missing")
            if expect_rv is not None and current is not None and current["metadata"]["resourceVersion"] != expect_rv:
                raise ValueError(current["metadata"]["resourceVersion"])
            self._rv += 1
            stored = copy.deepcopy(obj)
            stored["metadata"]["resourceVersion"] = str(self._rv)
            bucket[ident] = stored
            self._record(Event(self._rv, "ADDED" if create else "MODIFIED", key, ident[0], stored, current))
            return copy.deepcopy(stored)

    def remove(self, key: str, namespace: str, name: str, expect_rv: str | None = None) -> Obj:
        with self.cond:
            bucket = self._objects.get(key, {})
            current = bucket.get((namespace, name))
            if current is None:
                raise KeyError("missing")
            if expect_rv is not None and current["metadata"]["resourceVersion"] != expect_rv:
                raise ValueError(current["metadata"]["resourceVersion"])
            del bucket[(namespace, name)]
            self._rv += 1
            gone = copy.deepcopy(current)
            gone["metadata"]["resourceVersion"] = str(self._rv)
            self._record(Event(self._rv, "DELETED", key, namespace, gone))
            return copy.deepcopy(gone)

    def inject(self, key: str, namespace: str, line: bytes) -> None:
        """Record a RAW event carrying `line` (tests/kubeapi/hooks.py): it takes a resourceVersion and its
        place among the events, so watches meet it in order; no object changes."""
        with self.cond:
            self._rv += 1
            self._record(Event(self._rv, "RAW", key, namespace, {}, raw=line))

    def _record(self, event: Event) -> None:
        if len(self._history) == self._history.maxlen:
            self._compacted = self._history[0].rv
        self._history.append(event)
        self.cond.notify_all()

    def compact(self) -> None:
        """Drop the whole history (tests use it to force 410 Gone)."""
        with self.cond:
            if self._history:
                self._compacted = self._history[-1].rv
            self._history.clear()

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()

    # watch --------------------------------------------------------------------------------------
    def events_since(self, key: str, namespace: str | None, since: int, timeout: float,
                     still_wanted: Callable[[], bool] = lambda: True) -> Iterator[Event]:
        """Yield events for key (and namespace) with rv > since until timeout or close.

        Raises Gone before yielding anything when `since` was compacted away."""
        deadline = time.monotonic() + timeout
        last = since
        while True:
            with self.cond:
                if last < self._compacted:
                    raise Gone(f"too old resource version: {last} ({self._compacted + 1})")
                batch = [e for e in self._history if e.rv > last and e.key == key
                         and (namespace is None or e.namespace == namespace)]
                if not batch:
                    if self._history:  # everything up to here was scanned and did not match
                        last = max(last, self._history[-1].rv)
                    remaining = deadline - time.monotonic()
                    if remaining <= 0 or self.closed or not still_wanted():
                        return
                    self.cond.wait(min(remaining, 1.0))
                    continue
            for event in batch:
                last = event.rv
                yield event
