"""The hot endpoints as plain WSGI in front of the Flask app, which keeps every other route.

kube-apiserver calls /mutate and /validate for every pod, kube-scheduler
/filter and /prioritize for every pod: for those, Flask's request context,
URL map, hooks and Response object cost more than the webhook's own
decision once that was memoised (docs/benchmarks/history/admission.md, "Admission webhook").
`HotRoutes` is installed as the Flask app's `wsgi_app` (Flask's documented
middleware hook), so gunicorn and the test client alike reach it first: a
request to one of its paths with the route's method (POST, or GET for a
page such as /debug/mix) is answered by a plain function of the body bytes;
any other method on those paths is a JSON 405; everything else (/metrics,
probes, 404s) goes to Flask unchanged. Every route of the webhook and the
extender is one of these: one dispatch style.

Same contract as the Flask handlers (serving.http): the body capped and
drained before a 413, HttpError answered as `{"error": ...}` with its
status, anything unexpected logged and answered as a JSON 500 without a
traceback, and every request counted and timed in the app's RequestMetrics.

A handler may return a fourth element, work to run once the answer has been
sent (the iterable's `close()`, which every WSGI server calls after writing
the body: gunicorn, werkzeug's test client): the extender works out
/prioritize's decision while kube-scheduler runs its own scoring. Its
failures are logged; the answer is already out.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from http import HTTPStatus
from typing import Any

from serving.http import HttpError, encode_json, read_capped
from serving.metrics import RequestMetrics

log = logging.getLogger(__name__)

Headers = list[tuple[str, str]]
Answer = tuple[int, bytes, Headers]  # status, JSON body, extra headers
Then = Callable[[], None]  # work after the answer went out
Handler = Callable[[bytes], Answer | tuple[int, bytes, Headers, Then]]
Route = tuple[str, Handler]  # the HTTP method it answers, the handler
Wsgi = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def json_answer(status: int, value: Any, headers: Headers | None = None) -> Answer:
    return status, encode_json(value), headers or []


def error_answer(status: int, message: str) -> Answer:
    return status, encode_json({"error": message}), []


_STATUS_LINES: dict[int, str] = {}


def _status_line(status: int) -> str:
    line = _STATUS_LINES.get(status)
    if line is None:
        line = _STATUS_LINES[status] = f"{status} {HTTPStatus(status).phrase.upper()}"
    return line


class _ThenBody(list[bytes]):
    """The answer's one chunk; `close()` (after the server wrote it) runs the handler's follow-up."""

    def __init__(self, body: bytes, then: Then) -> None:
        super().__init__((body,))
        self._then: Then | None = then

    def close(self) -> None:
        then, self._then = self._then, None
        if then is not None:
            try:
                then()
            except Exception:
                log.exception("work after an answer failed")


class HotRoutes:
    """`routes` (path -> method, handler) answered by plain functions of the body; the rest handed to
    `fallback` (Flask)."""

    def __init__(self, fallback: Wsgi, routes: Mapping[str, Route], metrics: RequestMetrics,
                 max_body: int) -> None:
        self.fallback = fallback
        self.routes = dict(routes)
        self.metrics = metrics
        self.max_body = max_body

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        route = self.routes.get(path)
        if route is None:
            return self.fallback(environ, start_response)
        started = time.perf_counter()
        cpu = time.thread_time() if self.metrics.cpu is not None else 0.0  # a system call: only where asked
        method, handler = route
        extra: Headers = []
        then: Then | None = None
        if environ.get("REQUEST_METHOD") != method:
            status, body, extra = error_answer(405, "The method is not allowed for the requested URL.")
            extra = [("Allow", method)]
        else:
            try:
                answer = handler(self._body(environ) if method == "POST" else b"")
                status, body, extra = answer[0], answer[1], answer[2]
                if len(answer) > 3:
                    then = answer[3]
            except HttpError as exc:
                status, body, extra = error_answer(exc.status, exc.message)
            except Exception:
                log.exception("unhandled error on %s %s", environ.get("REQUEST_METHOD"), path)
                status, body, extra = error_answer(500, "internal error")
        start_response(_status_line(status), [("Content-Type", "application/json"),
                                              ("Content-Length", str(len(body))), *extra])
        self.metrics.record(path, status, time.perf_counter() - started)
        if self.metrics.cpu is not None:
            self.metrics.record_cpu(path, time.thread_time() - cpu)
        return [body] if then is None else _ThenBody(body, then)

    def _body(self, environ: Mapping[str, Any]) -> bytes:
        text = environ.get("CONTENT_LENGTH") or ""
        try:
            length: int | None = int(text) if text else None
        except ValueError:
            raise HttpError(400, f"Content-Length {text[:20]!r} is not a number") from None
        return read_capped(environ["wsgi.input"], length, self.max_body)
