"""A list-then-watch cache of one resource kind, kept fresh by a background thread.

Why: admission and scheduling answers must not call the API server on the hot
path. A `Reflector` lists a kind once, remembers the list's resourceVersion,
then watches from it and applies ADDED/MODIFIED/DELETED events to an
in-memory dict. It is the small Python counterpart of client-go's reflector:

- 410 Gone (an `ApiException` with status 410, or an ERROR event whose code
  is 410) means the resourceVersion is too old: relist, diff against the
  cache (so `on_change` still sees every change) and watch again.
- A dropped connection or any other error: reconnect with exponential
  backoff, watching from the last resourceVersion seen.
- A bad event (no metadata, a failing `key`, a raising `on_change`) is logged
  and skipped; the thread never dies from one event.

Objects are kept as plain JSON dicts, exactly as the API server sent them
or as `transform` trims them (Nodes, bound Pods: kube/trim.py), with no
model deserialization, so consumers parse them with the core's own models.
`snapshot()` returns a new dict whose values are shared: treat them as
read-only. The reflector replaces an object that changed; with a
`transform`, an event that leaves the kept object as it was but for its
resourceVersion (a kubelet's status heartbeat on a trimmed Node) writes the
new version into the object already held instead: at 15,000 nodes every
node reports every few minutes, and replacing each would leave a new
object for the garbage collector to walk, undoing a freeze of the synced
cache (kube.views), while consumers hear of neither (`_changed`).
"""

from __future__ import annotations

import bisect
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import orjson
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from kube.stoppable import Stopping

log = logging.getLogger(__name__)

JsonObject = dict[str, Any]
ListFunc = Callable[..., Any]
KeyFunc = Callable[[JsonObject], str]
# on_change(event_type, obj): event_type is "ADDED", "MODIFIED" or "DELETED".
OnChange = Callable[[str, JsonObject], None]
# transform(obj) -> what the cache keeps of it (client-go's TransformFunc); it must keep metadata.name,
# .namespace and .resourceVersion (the key and the relist's comparison read them).
Transform = Callable[[JsonObject], JsonObject]

GONE = 410


def object_key(obj: JsonObject) -> str:
    """`namespace/name` for namespaced objects, `name` for cluster-scoped ones."""
    meta = obj["metadata"]
    namespace = meta.get("namespace")
    return f"{namespace}/{meta['name']}" if namespace else str(meta["name"])


def custom_objects_lister(
    api_client: client.ApiClient, group: str, version: str, plural: str
) -> ListFunc:
    """A list function for a cluster-wide custom resource, usable as a Reflector source."""
    from kube import rest

    return rest.lister(api_client, f"/apis/{group}/{version}/{plural}")


class _Gone(Exception):
    """The watch's resourceVersion expired: relist."""


def _loads(data: str | bytes) -> Any:
    """JSON parsed by orjson (a list of 15,000 nodes of 8 KiB: 1.5 s against json's 1.9 s, in a relist
    that leaves the cache stale until done), or by json where orjson refuses what json reads (a number
    beyond a double's range, NaN); json.JSONDecodeError when neither can. An integer beyond 64 bits
    comes back a float from orjson, as Go's encoding/json reads one into an interface{}."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)


class _DictWatch(watch.Watch):
    """kubernetes' Watch with each event parsed once into plain dicts.

    Its own `unmarshal_event` parses an event, writes the object back as JSON
    and parses it again to build the return type (a dict, for `object`): three
    passes over every Node report, the larger part of a watch thread's time per
    event, taken while holding the interpreter a request is waiting for. Its
    `deserialize=False` mode (kubernetes 34.1+) parses once but drops the
    `raw_object` its own ERROR handling reads, so a 410 Gone event would raise
    KeyError instead of ending the watch.
    """

    def unmarshal_event(self, data: str, return_type: Any) -> dict[str, Any] | None:
        if not data or data.isspace():
            return None
        try:
            event = _loads(data)
        except json.JSONDecodeError:
            return None
        if isinstance(event, dict):
            event["raw_object"] = event.get("object")
        return event if isinstance(event, dict) else None


class Reflector:
    """Cache of one kind. Call `start()`, then `wait_for_sync()`, then read `snapshot()`.

    `list_func` is a `kube.rest.lister(...)` (a generated list method such as
    `CoreV1Api(api).list_node` works too) or a `custom_objects_lister(...)`: it is called with keyword arguments
    only (`_preload_content`, `watch`, `resource_version`, ...).
    """

    def __init__(
        self,
        list_func: ListFunc,
        *,
        key: KeyFunc = object_key,
        on_change: OnChange | None = None,
        transform: Transform | None = None,
        name: str = "reflector",
        timeout_seconds: int = 300,
        backoff_initial: float = 0.2,
        backoff_max: float = 30.0,
    ) -> None:
        self._list_func = list_func
        self._key = key
        self._on_change = on_change
        self._transform = transform
        self.name = name
        self._timeout_seconds = timeout_seconds
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max
        self._lock = threading.Lock()
        self._items: dict[str, JsonObject] = {}
        self._order: list[str] | None = None  # the keys of `_items` sorted (`in_key_order`); None: not kept yet
        self._resource_version: str | None = None
        self._synced = threading.Event()
        self._stopping = threading.Event()
        self._ended = threading.Event()  # the loop is over: stopped, or its client stopped for good
        self._settled = threading.Event()  # synced or ended: what `wait_for_sync` waits for
        self._watch: watch.Watch | None = None
        self._thread: threading.Thread | None = None
        self.relists = 0  # how many lists were made; tests and metrics read it

    # ---- public API -------------------------------------------------------
    def start(self) -> Reflector:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"reflector-{self.name}", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """End the thread within `timeout` seconds, a watch blocked on a quiet stream included.

        kubernetes' `Watch.stop` shuts the stream's socket only once the watch's response exists; a stop
        that came between the request and its response headers left the thread reading the stream until
        the server ended it (up to timeoutSeconds). So the stop is repeated until the thread has ended.
        """
        self._stopping.set()
        deadline = time.monotonic() + timeout
        while True:
            current = self._watch
            if current is not None:
                current.stop()  # type: ignore[no-untyped-call]
            thread = self._thread
            left = deadline - time.monotonic()
            if thread is None or left <= 0:
                return
            thread.join(min(0.05, left))
            if not thread.is_alive():
                return

    def snapshot(self) -> dict[str, JsonObject]:
        with self._lock:
            return dict(self._items)

    def in_key_order(self) -> list[JsonObject]:
        """The objects held, in key order (a LIST's). Why: the controller's passes read every pod in that
        order, and sorting 50,000 keys each time cost a tenth of a second a read once the insertion order
        had drifted from it; the sorted keys are kept instead, and each event places its key (`_placed`)."""
        with self._lock:
            if self._order is None:
                self._order = sorted(self._items)
            items = self._items
            return [items[k] for k in self._order]

    def _placed(self, key: str, present: bool) -> None:
        """Keep `_order` with `key` in it (`present`) or not, after a change of `_items`. Call with the lock held."""
        order = self._order
        if order is None:
            return
        at = bisect.bisect_left(order, key)
        found = at < len(order) and order[at] == key
        if present and not found:
            order.insert(at, key)
        elif found and not present:
            del order[at]

    def get(self, key: str) -> JsonObject | None:
        with self._lock:
            return self._items.get(key)

    def remember(self, obj: JsonObject) -> None:
        """Hold `obj` (what a write of ours returned) now, unless the cache holds a newer version: the
        watch event that brings it follows. Consumers are not told (they wrote it)."""
        obj = self._transform(obj) if self._transform is not None else obj
        key = self._key(obj)
        with self._lock:
            if not _older(obj, self._items.get(key)):
                self._items[key] = obj
                self._placed(key, True)

    def has_synced(self) -> bool:
        return self._synced.is_set()

    def wait_for_sync(self, timeout: float | None = None) -> bool:
        """Whether the first list came within `timeout` seconds; False at once if the loop ended unsynced."""
        self._settled.wait(timeout)
        return self._synced.is_set()

    @property
    def ended(self) -> bool:
        """The loop is over (`stop`, or the client refused every request with `Stopping`)."""
        return self._ended.is_set()

    @property
    def resource_version(self) -> str | None:
        return self._resource_version

    def __enter__(self) -> Reflector:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- the loop ---------------------------------------------------------
    def _run(self) -> None:
        try:
            self._loop()
        finally:
            self._ended.set()
            self._settled.set()

    def _loop(self) -> None:
        backoff = self._backoff_initial
        while not self._stopping.is_set():
            try:
                if self._resource_version is None:
                    self._relist()
                if self._watch_once():
                    backoff = self._backoff_initial
                    continue
            except Stopping:
                # the controller's client refuses every request from now on (kube/stoppable.py): retrying
                # would only back off until the process ends, and a pass waiting for this cache would wait
                # out its whole sync timeout (a SIGTERM during the first lists held the exit 12 s)
                self._stopping.set()
                break
            except _Gone:
                log.info("%s: resourceVersion %s expired, relisting", self.name, self._resource_version)
                self._resource_version = None
                continue
            except ApiException as exc:
                if exc.status == GONE:
                    self._resource_version = None
                    continue
                log.warning("%s: API error %s %s; retrying in %.1fs", self.name, exc.status, exc.reason, backoff)
            except Exception as exc:
                if self._stopping.is_set():
                    break
                log.warning("%s: %s: %s; retrying in %.1fs", self.name, type(exc).__name__, exc, backoff)
            self._stopping.wait(backoff)
            backoff = min(backoff * 2, self._backoff_max)

    def _relist(self) -> None:
        read_timeout = max(self._timeout_seconds, 30)
        resp = self._list_func(_preload_content=False, _request_timeout=(10, read_timeout))
        try:
            body = _loads(resp.data)
        finally:
            resp.release_conn()
        item_kind = str(body.get("kind", "")).removesuffix("List")
        fresh: dict[str, JsonObject] = {}
        for item in body.get("items") or []:
            # List items omit kind/apiVersion; fill them so cached objects look like watched ones.
            item.setdefault("kind", item_kind)
            item.setdefault("apiVersion", body.get("apiVersion"))
            try:
                if self._transform is not None:
                    item = self._transform(item)
                fresh[self._key(item)] = item
            except Exception:
                log.exception("%s: skipping listed object without a key", self.name)
        with self._lock:
            old = self._items
            told = {k: obj for k, obj in fresh.items()
                    if k not in old or (_rv(old[k]) != _rv(obj) and self._changed(old[k], obj))}
            if self._transform is not None:  # the same but for the version: the object held stays
                for k in fresh.keys() - told.keys():
                    fresh[k] = _take_version(old[k], fresh[k])
            self._items, self._order = fresh, None
        self._resource_version = str(body.get("metadata", {}).get("resourceVersion") or "") or None
        self.relists += 1
        self._synced.set()
        self._settled.set()
        for k, obj in told.items():
            self._notify("MODIFIED" if k in old else "ADDED", obj)
        for k, obj in old.items():
            if k not in fresh:
                self._notify("DELETED", obj)

    def _watch_once(self) -> bool:
        """Watch until the server ends the stream. True when it was a healthy watch."""
        started, events = time.monotonic(), 0
        # events stay plain dicts, parsed once, no model validation to trip over
        w = _DictWatch(return_type=object)  # type: ignore[no-untyped-call]
        self._watch = w
        try:
            stream = w.stream(  # type: ignore[no-untyped-call]
                self._list_func,
                resource_version=self._resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=self._timeout_seconds,
                _request_timeout=(10, self._timeout_seconds + 15),
            )
            for event in stream:
                if self._stopping.is_set():
                    break
                events += 1
                self._apply(event)
        finally:
            self._watch = None
        # A server that closes every watch at once must not make us spin.
        return events > 0 or time.monotonic() - started > 1.0

    def _apply(self, event: dict[str, Any]) -> None:
        try:
            kind = event.get("type")
            obj: Any = event.get("raw_object", event.get("object"))
            if kind == "ERROR":
                code = obj.get("code") if isinstance(obj, dict) else None
                if code == GONE:
                    raise _Gone()
                raise ApiException(status=code or 500, reason=str(obj))
            rv = _rv(obj)
            if kind == "BOOKMARK":
                self._resource_version = rv or self._resource_version
                return
            if self._transform is not None and kind in ("ADDED", "MODIFIED", "DELETED"):
                obj = self._transform(obj)
            key = self._key(obj)
            with self._lock:
                before = self._items.get(key)
                changed = kind == "DELETED" or self._changed(before, obj)
                if kind == "DELETED":
                    self._items.pop(key, None)
                    self._placed(key, False)
                elif kind in ("ADDED", "MODIFIED"):
                    if _older(obj, before):  # a write of ours `remember`ed is newer: the watch catches up
                        changed = False
                    elif changed or before is None:
                        self._items[key] = obj
                        if before is None:
                            self._placed(key, True)
                    else:
                        _take_version(before, obj)
                else:
                    log.warning("%s: ignoring event of type %r", self.name, kind)
                    return
            if rv:
                self._resource_version = rv
            if changed:
                self._notify(str(kind), obj)
        except (_Gone, ApiException):
            raise
        except Exception:
            log.exception("%s: skipping bad watch event", self.name)

    def _changed(self, before: JsonObject | None, after: JsonObject) -> bool:
        """Whether `on_change` hears of `after`. With a `transform`, not when the kept object is the one
        kept before but for its resourceVersion: a kubelet's status heartbeat leaves a trimmed Node as it
        was (the cache still keeps the new resourceVersion), and at 15,000 nodes those are an event every
        few milliseconds that each consumer would otherwise read and compare itself."""
        if self._transform is None or before is None:
            return True
        return bool(_without_version(before) != _without_version(after))

    def _notify(self, event_type: str, obj: JsonObject) -> None:
        if self._on_change is None:
            return
        try:
            self._on_change(event_type, obj)
        except Exception:
            log.exception("%s: on_change raised for %s", self.name, event_type)


def _take_version(kept: JsonObject, newer: JsonObject) -> JsonObject:
    """`kept` with `newer`'s resourceVersion written in (one existing key of its metadata: readers in
    other threads see the old or the new string, never a dict being resized)."""
    rv = _rv(newer)
    if rv is not None and isinstance(kept.get("metadata"), dict):
        kept["metadata"]["resourceVersion"] = rv
    return kept


def _without_version(obj: JsonObject) -> Any:
    metadata = obj.get("metadata")
    if not isinstance(metadata, dict) or "resourceVersion" not in metadata:
        return obj
    return {**obj, "metadata": {k: v for k, v in metadata.items() if k != "resourceVersion"}}


def _older(obj: JsonObject, held: JsonObject | None) -> bool:
    """Whether `held` is a later version of `obj`. resourceVersions are etcd revisions, integers that
    compare (apimachinery v0.35 pkg/util/resourceversion.CompareResourceVersion); one that does not
    parse as an integer is never called older."""
    if held is None:
        return False
    mine, theirs = _rv(obj), _rv(held)
    if mine is None or theirs is None or not mine.isdigit() or not theirs.isdigit():
        return False
    return int(mine) < int(theirs)


def _rv(obj: Any) -> str | None:
    if isinstance(obj, dict):
        meta = obj.get("metadata")
        if isinstance(meta, dict) and meta.get("resourceVersion") is not None:
            return str(meta["resourceVersion"])
    return None
