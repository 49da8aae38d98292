"""A small Flask app built with the serving helpers, for the serving tests (test-only).

Readiness follows a file named by $KUBEON_TEST_READY_FILE (exists: ready),
so a test can flip it from outside the server's processes.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from flask import Flask, Response, jsonify

from serving import http, metrics, probes

BODY_LIMIT = 1024


def create_app() -> Flask:
    app = Flask("serving-test")
    http.install_error_handlers(app)
    ready_file = os.environ.get("KUBEON_TEST_READY_FILE")
    probes.register(app, (lambda: Path(ready_file).exists()) if ready_file else None)
    metrics.instrument(app)

    @app.post("/echo")
    def echo() -> Response:
        return jsonify({"got": http.read_json(BODY_LIMIT)})

    @app.get("/pid")
    def pid() -> Response:
        return jsonify({"pid": os.getpid(), "multiproc_dir": os.environ.get("PROMETHEUS_MULTIPROC_DIR")})

    @app.get("/boom")
    def boom() -> Response:
        raise RuntimeError("secret internals")

    return app


def main() -> None:
    """`python -m tests.serving.app_factory CERT_DIR|- PORT WORKERS`: serve the test app."""
    from serving.server import serve

    cert_dir, port, workers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    serve(create_app, bind="127.0.0.1", port=port, cert_dir=None if cert_dir == "-" else Path(cert_dir),
          workers=workers, threads=2)


if __name__ == "__main__":
    main()
