"""An API client a stop can end: requests not yet sent are refused, reads in flight are aborted.

Why: a SIGTERM'd controller must give its lease up within a second or two (a
rollout and the successor's takeover wait for it), and no write of its may land
after that release, or a successor could act on the same objects at once. So
once `stop` is set:

- every request not yet sent raises `Stopping` (checked after the request is
  registered in flight, so a stop that does not see it was set first, and the
  request sees the stop);
- `abort_reads()` shuts down the socket of every read (GET) in flight: its
  caller gets `Stopping`, and urllib3's retry of it is refused too. A read has
  no effect on the cluster, so abandoning it is always safe; on a real cluster
  a LIST of every pod can take seconds;
- writes in flight are left to finish: one already sent may be applied by the
  server whether or not we wait for its answer, so the only order that keeps
  "no write after the release" is to wait for it, then release (the caller
  joins the thread that writes before it releases the lease).

The lease loop keeps its own, unguarded client: the release must go through.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import kubernetes.client
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

READS = frozenset({"GET", "HEAD"})
STREAMS = ("watch=true", "follow=true")  # a watch's body is read for minutes: its own stop ends it


class Stopping(Exception):
    """The process is stopping: a reconcile pass in flight ends at its next API call."""


@dataclass
class _Flight:
    method: str
    conn: Any = None


class StoppableClient:
    """`api`: a client on the given one's configuration whose requests `stop` ends (module docstring)."""

    def __init__(self, base: kubernetes.client.ApiClient, stop: threading.Event) -> None:
        self.stop = stop
        self.api = kubernetes.client.ApiClient(base.configuration)
        self.api.default_headers.update(base.default_headers)
        # One request at a time per thread (the client is synchronous): thread id -> what is in flight.
        # Plain dict operations, no lock: `abort_reads` may run in a signal handler on a thread that
        # is itself inside `request`.
        self._flights: dict[int, _Flight] = {}
        rest = self.api.rest_client  # every call, generated or `kube.rest`, ends in rest_client.request
        inner: Callable[..., Any] = rest.request

        def request(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
            key = threading.get_ident()
            flight = self._flights[key] = _Flight(method.upper())
            try:
                if stop.is_set():
                    raise Stopping("the controller is stopping")
                answer = inner(method, url, *args, **kwargs)
                if flight.method in READS and not any(s in url for s in STREAMS):
                    answer.read()  # the body is part of the read a stop may abort
                return answer
            except Stopping:
                raise
            except Exception as exc:
                if stop.is_set() and flight.method in READS:
                    raise Stopping(f"the controller is stopping (read aborted: {type(exc).__name__})") from exc
                raise
            finally:
                self._flights.pop(key, None)

        rest.request = request  # type: ignore[method-assign]
        manager = rest.pool_manager
        manager.pool_classes_by_scheme = {"http": self._tracking(HTTPConnectionPool),
                                          "https": self._tracking(HTTPSConnectionPool)}

    def _tracking(self, base: type[HTTPConnectionPool]) -> type[HTTPConnectionPool]:
        """A pool class that records which connection each in-flight request uses, and refuses a read's
        retry after a stop (urllib3 retries a GET whose connection was shut down)."""
        owner = self

        class Tracking(base):  # type: ignore[valid-type,misc]
            def _get_conn(self, timeout: float | None = None) -> Any:
                flight = owner._flights.get(threading.get_ident())
                if flight is not None and flight.method in READS and owner.stop.is_set():
                    raise Stopping("the controller is stopping")
                conn = super()._get_conn(timeout)
                if flight is not None:
                    flight.conn = conn
                return conn

        Tracking.__name__ = f"Tracking{base.__name__}"
        return Tracking

    def abort_reads(self) -> int:
        """Shut down the connection of every read in flight (call once `stop` is set). How many."""
        aborted = 0
        for flight in list(self._flights.values()):
            sock = getattr(flight.conn, "sock", None) if flight.method in READS else None
            if sock is None:
                continue  # still connecting: the caller's next round (ControllerProcess.stop repeats it)
            try:
                socket.socket.shutdown(sock, socket.SHUT_RDWR)  # wakes a recv blocked in another thread
                aborted += 1
            except (OSError, TypeError):
                pass  # closed already
        return aborted

    def in_flight(self) -> list[str]:
        """Methods of the requests in flight (for logs and tests)."""
        return [f.method for f in list(self._flights.values())]
