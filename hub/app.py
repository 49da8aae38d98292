"""The hub's Flask app: the API, the console, probes; errors always as JSON on the API paths."""

from __future__ import annotations

import logging
import secrets
from typing import Any

from flask import Flask, Response, redirect, request, url_for
from werkzeug.exceptions import HTTPException

from hub.api import api, error_response
from hub.console import console
from hub.store import Hub, HubError

log = logging.getLogger(__name__)


def create_app(hub: Hub, admin_token: str, *, secret_key: str | None = None, secure_cookies: bool = False) -> Flask:
    """One app over one store. `secret_key` signs session cookies (a random one per process if unset:
    fine with one worker; `hub serve` passes one shared by its workers)."""
    app = Flask(__name__)
    app.extensions["kubeon_hub"] = hub
    app.config.update(
        KUBEON_ADMIN_TOKEN=admin_token,
        SECRET_KEY=secret_key or secrets.token_hex(32),
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Lax",
        SESSION_COOKIE_SECURE=secure_cookies,
        PERMANENT_SESSION_LIFETIME=12 * 3600,  # a console cookie's signature holds for a working day, not 31
        MAX_CONTENT_LENGTH=None,
    )
    app.register_blueprint(api)
    app.register_blueprint(console)

    @app.get("/")
    def root() -> Any:
        return redirect(url_for("console.clusters"))

    @app.after_request
    def _no_store(response: Response) -> Response:
        """Console pages are never cached: a cluster token is shown once, on one of them."""
        if request.path.startswith("/console/") and not request.path.startswith("/console/static/"):
            response.headers["Cache-Control"] = "no-store"
        return response

    @app.get("/healthz")
    def healthz() -> Response:
        return Response('{"status": "ok"}', mimetype="application/json")

    @app.errorhandler(HubError)
    def _hub_error(exc: HubError) -> Response:
        return error_response(exc)

    @app.errorhandler(HTTPException)
    def _http_error(exc: HTTPException) -> Response:
        return error_response(HubError(exc.code or 500, exc.description or exc.name))

    @app.errorhandler(Exception)
    def _unexpected(exc: Exception) -> Response:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return error_response(HubError(500, "internal error"))

    return app
