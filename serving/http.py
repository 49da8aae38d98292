"""Helpers for thin JSON handlers: capped body reads, JSON parsing, JSON errors.

A handler reads `read_json(limit)`, calls the core, returns `jsonify(...)`.
Protocol problems raise `HttpError`, which `install_error_handlers` turns into
`{"error": "..."}` with the status code; so does every werkzeug HTTP error
(404, 405, 413). Anything unexpected is logged with its traceback and
answered as a JSON 500 whose body carries no traceback: callers such as
kube-apiserver log response bodies, and stack traces do not belong there.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from flask import Flask, Response, jsonify, request
from werkzeug.exceptions import HTTPException

log = logging.getLogger(__name__)

# kube-apiserver caps request bodies at 3 MiB; an AdmissionReview is at most that plus envelope.
DEFAULT_MAX_BODY = 3 * 1024 * 1024


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
    length = request.content_length
    if length is not None and length > max_bytes:
        raise HttpError(413, f"request body of {length} bytes exceeds the limit of {max_bytes}")
    # Chunked bodies have no length: read one byte past the cap to detect overflow.
    data = request.stream.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise HttpError(413, f"request body exceeds the limit of {max_bytes} bytes")
    return data


def read_json(max_bytes: int = DEFAULT_MAX_BODY) -> Any:
    """The request body parsed as JSON; 400 on an empty or malformed body, 413 over the cap."""
    data = read_body(max_bytes)
    if not data.strip():
        raise HttpError(400, "empty request body: expected JSON")
    try:
        return json.loads(data)
    except UnicodeDecodeError:
        raise HttpError(400, "malformed JSON: body is not UTF-8") from None
    except json.JSONDecodeError as exc:
        raise HttpError(400, f"malformed JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None


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
