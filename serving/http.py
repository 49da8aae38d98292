"""Helpers for thin JSON handlers: capped body reads, JSON parsing and writing, JSON errors.

A handler reads `read_json(limit)`, calls the core, returns `jsonify(...)`
(or `encode_json` bytes).
Protocol problems raise `HttpError`, which `install_error_handlers` turns into
`{"error": "..."}` with the status code; so does every werkzeug HTTP error
(404, 405, 413). Anything unexpected is logged with its traceback and
answered as a JSON 500 whose body carries no traceback: callers such as
kube-apiserver log response bodies, and stack traces do not belong there.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import orjson
from flask import Flask, Response, jsonify, request
from werkzeug.exceptions import HTTPException

log = logging.getLogger(__name__)

# kube-apiserver caps request bodies at 3 MiB; an AdmissionReview is at most that plus envelope.
DEFAULT_MAX_BODY = 3 * 1024 * 1024
# An oversized body is read and dropped up to this many bytes before the 413 goes out: answering
# while the client is still sending and then closing makes the kernel reset the connection, and
# the client (mid-write on a TLS socket) sees an EOF error instead of the 413. Beyond this the
# connection is closed unread: a sender of gigabytes gets no answer.
DRAIN_BYTES = 32 * 1024 * 1024
_CHUNK = 256 * 1024
# JSON strings and numbers, in order: outside strings, nothing else in JSON holds a digit or a quote
_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|(-?[0-9]+)(\.[0-9]+)?([eE][+-]?[0-9]+)?')
_LONG = re.compile(rb"[0-9]{19}")  # no integer literal with fewer digits leaves [-2^63, 2^64-1]
_SMALLEST, _LARGEST = -(2**63), 2**64 - 1  # what orjson reads as an int (beyond: a float)


class HttpError(Exception):
    """A protocol error to answer as `{"error": message}` with `status`."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def json_error(status: int, message: str) -> Response:
    resp = jsonify({"error": message})
    resp.status_code = status
    return resp


def read_body(max_bytes: int = DEFAULT_MAX_BODY) -> bytes:
    """The request body, refusing more than `max_bytes` with 413 before reading it all."""
    return read_capped(request.stream, request.content_length, max_bytes)


def read_capped(stream: Any, length: int | None, max_bytes: int) -> bytes:
    """`length` bytes (None: chunked, up to the end) of `stream`; HttpError 413 over `max_bytes`,
    after draining up to DRAIN_BYTES so the client reads the 413 (Flask routes and serving.wsgi)."""
    if length is not None and length > max_bytes:
        if length <= DRAIN_BYTES:
            _drain(stream, length)
        raise HttpError(413, f"request body of {length} bytes exceeds the limit of {max_bytes}")
    if length is not None:
        return bytes(stream.read(length)) if length else b""
    # Chunked bodies have no length: read one byte past the cap to detect overflow.
    data = bytes(stream.read(max_bytes + 1))
    if len(data) > max_bytes:
        _drain(stream, DRAIN_BYTES - len(data))
        raise HttpError(413, f"request body exceeds the limit of {max_bytes} bytes")
    return data


def _drain(stream: Any, limit: int) -> None:
    """Read and drop up to `limit` bytes of the body (see DRAIN_BYTES)."""
    while limit > 0:
        chunk = stream.read(min(_CHUNK, limit))
        if not chunk:
            return
        limit -= len(chunk)


def decode_json(data: bytes, exact: bool = False) -> Any:
    """A request body as JSON: HttpError 400 naming what is wrong and where. Bounded work.

    orjson's verdict is final, so whatever parses can be written back: it
    refuses what Go's encoding/json (kube-apiserver, kube-scheduler) never
    writes and what could not be echoed in an answer: NaN and Infinity, lone
    surrogates and other invalid UTF-8, a byte order mark, nesting deeper than
    1,024 levels; integers beyond 64 bits become floats instead of 4,300-digit
    Python ints. The json module, whose recursion and integer limits raise
    RecursionError and ValueError, is not used for request bodies.

    `exact`: an endpoint that answers with the object it was sent (/dry-run)
    refuses such an integer instead (`wide_integer`), naming where it is: the
    float would come back in place of what was sent (issue 37: 10^30 as
    1e+30), and every integer of a Kubernetes object is an int32 or int64,
    which the API server would refuse it as.
    """
    if not data.strip():
        raise HttpError(400, "empty request body: expected JSON")
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        what = exc.msg
        if what.startswith("str is not valid UTF-8"):
            what = "body is not UTF-8"
        elif "surrogate" in what:
            what = f"{what} (a lone surrogate: \\ud800-\\udfff escapes come in pairs)"
        raise HttpError(400, f"malformed JSON: {what} at line {exc.lineno} column {exc.colno}") from None
    if exact and (where := wide_integer(data)):
        raise HttpError(400, f"{where} is beyond 64 bits (Kubernetes integers are int64)")
    return value


def wide_integer(data: bytes) -> str:
    """`integer ... at line L column C` for the first integer literal of a JSON body (valid JSON) that
    orjson reads as a float, "" when none. Bounded: a regular scan, only when some 19-digit run exists."""
    if _LONG.search(data) is None:
        return ""
    for match in _TOKEN.finditer(data):
        digits = match.group(1)
        if digits is None or match.group(2) or match.group(3) or len(digits) < 19:
            continue
        if len(digits.lstrip(b"-")) > 20 or not _SMALLEST <= int(digits) <= _LARGEST:  # no leading zeros in JSON
            at = match.start()
            line, column = data.count(b"\n", 0, at) + 1, at - data.rfind(b"\n", 0, at)
            shown = digits[:24].decode() + ("..." if len(digits) > 24 else "")
            return f"integer {shown} at line {line} column {column}"
    return ""


def encode_json(value: Any) -> bytes:
    """An answer as JSON bytes; HttpError 400 if it cannot be written.

    orjson writes at most 254 levels of nesting (and parses up to 1,024), so
    an answer that echoes part of a deeply nested request (a dry-run result,
    the Nodes of an ExtenderArgs) can fail: that is the request's fault.
    """
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError as exc:
        raise HttpError(400, f"the answer cannot be written as JSON ({exc}): "
                             "the request is nested too deeply") from None


def read_json(max_bytes: int = DEFAULT_MAX_BODY, exact: bool = False) -> Any:
    """The request body parsed as JSON; 400 on an empty or malformed body, 413 over the cap (`exact`:
    `decode_json`'s)."""
    return decode_json(read_body(max_bytes), exact)


def install_error_handlers(app: Flask) -> None:
    """Answer every error as JSON: HttpError and HTTP errors with their status, the rest 500."""

    @app.errorhandler(HttpError)
    def _http_error(exc: HttpError) -> Response:
        return json_error(exc.status, exc.message)

    @app.errorhandler(HTTPException)
    def _werkzeug_error(exc: HTTPException) -> Response:
        resp = json_error(exc.code or 500, exc.description or exc.name)
        if exc.code == 405 and exc.response is None:
            allowed = getattr(exc, "valid_methods", None)
            if allowed:
                resp.headers["Allow"] = ", ".join(allowed)
        return resp

    @app.errorhandler(Exception)
    def _unexpected(exc: Exception) -> Response:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return json_error(500, "internal error")
