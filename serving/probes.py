"""Liveness and readiness endpoints shared by every server process.

`/healthz` answers 200 whenever the process can serve a request at all: a
failing liveness probe makes the kubelet restart the pod, so it must not
depend on the cluster. `/readyz` answers 200 only when `ready()` is true
(for example: every Reflector has synced), else 503, so the Service sends no
admission traffic to a replica with an empty cache.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from flask import Flask, Response, jsonify

log = logging.getLogger(__name__)


def register(app: Flask, ready: Callable[[], bool] | None = None) -> None:
    """Add GET /healthz and GET /readyz to `app`; `ready` defaults to always ready."""

    def healthz() -> Response:
        return jsonify({"status": "ok"})

    def readyz() -> Response | tuple[Response, int]:
        try:
            ok = True if ready is None else bool(ready())
        except Exception:
            log.exception("readiness check raised")
            ok = False
        if ok:
            return jsonify({"status": "ready"})
        return jsonify({"status": "not ready"}), 503

    app.add_url_rule("/healthz", "healthz", healthz, methods=["GET"])
    app.add_url_rule("/readyz", "readyz", readyz, methods=["GET"])
