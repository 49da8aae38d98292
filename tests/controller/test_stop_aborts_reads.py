"""A stop ends the reconcilers' requests at once: reads in flight are aborted, writes in flight land.

Real: the kubernetes client and urllib3 over a real socket, `kube.rest` calls, the
`StoppableClient` of kube/stoppable.py, and (last test) the controller's
`ControllerProcess.stop` with its lease on the test API server. The server of the
first tests is a small HTTP server that holds a request as long as the test says:
what an API server answering a LIST of every pod on a big cluster looks like to
the client.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from kubernetes import client

from controller.command import build
from kube import rest
from kube.informers import ClusterCache
from kube.leases import get_lease
from kube.stoppable import StoppableClient, Stopping


class SlowServer:
    """GET holds until `release` is set (or 30 s); POST answers 201 after `write_delay` seconds."""

    def __init__(self, write_delay: float = 0.0) -> None:
        self.release = threading.Event()
        self.received: list[str] = []
        self.writes_done: list[str] = []
        self.answered: list[str] = []  # GETs the server has answered (held ones are not)
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                outer.received.append(f"GET {self.path}")
                outer.release.wait(30)
                outer.answered.append(f"GET {self.path}")
                self._answer(200, {"kind": "NodeList", "items": []})

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.received.append(f"POST {self.path}")
                time.sleep(write_delay)
                outer.writes_done.append(self.path)
                self._answer(201, json.loads(body or b"{}"))

            def _answer(self, code: int, obj: dict[str, Any]) -> None:
                data = json.dumps(obj).encode()
                try:
                    self.send_response(code)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass  # the client went away (the abort)

            def log_message(self, format: str, *args: object) -> None:
                return

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http.daemon_threads = True
        threading.Thread(target=self.http.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        config = client.Configuration()
        config.host = f"http://127.0.0.1:{self.http.server_address[1]}"
        self.api = client.ApiClient(config)

    def close(self) -> None:
        self.release.set()
        self.http.shutdown()
        self.http.server_close()


@pytest.fixture
def slow() -> Iterator[SlowServer]:
    server = SlowServer(write_delay=0.5)
    yield server
    server.close()


def in_thread(fn: Any) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def wait_until(cond: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_read_in_flight_is_aborted_by_the_stop(slow: SlowServer) -> None:
    stop = threading.Event()
    guard = StoppableClient(slow.api, stop)
    thread, out = in_thread(lambda: rest.call(guard.api, "GET", "/api/v1/nodes"))
    wait_until(lambda: slow.received)  # the server holds it: in flight
    assert guard.in_flight() == ["GET"]
    stop.set()
    assert guard.abort_reads() == 1
    thread.join(20)  # the server holds the read for 30 s: only the abort ends it sooner
    assert not thread.is_alive(), "the read was not aborted"
    assert isinstance(out.get("error"), Stopping), out
    assert slow.answered == [], "the read ended with the server's answer, not the abort"
    assert slow.received == ["GET /api/v1/nodes"], "urllib3's retry of the aborted read was sent"


def test_a_pass_waiting_for_the_first_lists_ends_at_the_stop(slow: SlowServer) -> None:
    """A SIGTERM while the controller's cache makes its first lists: the pass waiting for them ends at once.

    The lists are aborted and refused from then on; before, each kind's reflector backed off and retried,
    and the pass waited out the cache's 120 s sync timeout (the controller's exit took 12 s, and a CI run
    of test_frame_process.py's SIGTERM test failed on it).
    """
    stop = threading.Event()
    guard = StoppableClient(slow.api, stop)
    slow.release.set()  # discovery (is DRA served?) answers at once
    cache = ClusterCache(guard.api)
    slow.release.clear()  # the lists are held, as a big cluster's first LIST of every pod
    cache.start()
    try:
        wait_until(lambda: any("/api/v1/pods" in r for r in slow.received))
        thread, out = in_thread(lambda: cache.wait_for_sync(timeout=60))
        time.sleep(0.2)
        started = time.monotonic()
        stop.set()
        while thread.is_alive() and time.monotonic() - started < 5:
            guard.abort_reads()  # repeated, as ControllerProcess.stop does: a list may still be connecting
            thread.join(0.02)
        assert not thread.is_alive(), "the pass still waits for the cache after 5 s"
        assert isinstance(out.get("error"), Stopping), out
        assert time.monotonic() - started < 2
        assert all(f.ended for f in cache.feeds), [f.name for f in cache.feeds if not f.ended]
    finally:
        cache.stop()


def test_a_write_in_flight_lands_and_nothing_is_sent_after_the_stop(slow: SlowServer) -> None:
    stop = threading.Event()
    guard = StoppableClient(slow.api, stop)
    body = {"metadata": {"name": "e"}}
    thread, out = in_thread(lambda: rest.call(guard.api, "POST", "/api/v1/namespaces/n/events", body=body))
    wait_until(lambda: slow.received)
    stop.set()
    assert guard.abort_reads() == 0, "a write is never aborted"
    thread.join(5)
    assert out.get("value") == body, out  # its answer came back: it landed
    assert slow.writes_done == ["/api/v1/namespaces/n/events"]

    with pytest.raises(Stopping):
        rest.call(guard.api, "POST", "/api/v1/namespaces/n/events", body=body)
    with pytest.raises(Stopping):
        rest.call(guard.api, "GET", "/api/v1/nodes")
    assert len(slow.received) == 1, "a request after the stop reached the server"


class _SlowRead:
    """A reconciler whose read the server holds (a LIST on a big cluster)."""

    name = "slow-read"
    period_seconds = 60.0

    def __init__(self) -> None:
        self.started = threading.Event()
        self.outcome: BaseException | None = None

    def reconcile(self, ctx: Any) -> None:
        self.started.set()
        try:
            rest.call(ctx.api, "GET", "/api/v1/nodes")
        except BaseException as exc:
            self.outcome = exc
            raise


def test_the_process_stops_and_releases_while_a_read_is_in_flight(
        frame_api: Any, slow: SlowServer) -> None:
    """The reconcilers' reads go to the held server, the lease to the test API server: the stop does not
    wait for the read, and the lease is released (before: the stop waited for the answer)."""
    reconciler = _SlowRead()
    process = build(frame_api.api, identity="reader", reconcilers=[reconciler], on_lost=lambda _: None)
    guard = StoppableClient(slow.api, process.stop_event)  # the reconcilers' client, on the held server
    process.ctx.api, process.guard = guard.api, guard
    process.start(watch_policies=False)
    process.run_in_thread()
    assert reconciler.started.wait(20)
    wait_until(lambda: slow.received)
    process.stop(release=True)
    assert slow.answered == [], "the stop waited for the held read's answer"
    assert isinstance(reconciler.outcome, Stopping)
    lease = get_lease(frame_api.api, "kubeon-gpu", "kubeon-gpu-optimizer")
    assert lease is not None and not lease.holder, "released"
