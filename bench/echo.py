"""The limit for the webhook and extender benchmarks: a bare server that parses and answers a constant body.

Same gunicorn, TLS and worker settings as ours (`serving.server.serve`: gthread,
the workers and threads given, keep-alive, the rotating TLS context when
--cert-dir is given), but the application is a plain WSGI callable that reads
the request body, parses it with orjson (as ours does) and answers a
constant body per path: the bytes ours answered for the same request, so
the answer costs the same to write and send. GET /healthz and /readyz
answer 200. What ours spends beyond this is ours to win back
(bench/webhook_load.py --echo, bench/extender_load.py --echo).

    python bench/echo.py --port 9443 --cert-dir DIR --answer /mutate=FILE
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

Wsgi = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def posting_app(answer: Callable[[str, Any], bytes | None]) -> Wsgi:
    """POST path -> `answer(path, parsed body)` (None: 404); GET probes -> 200."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        body: bytes | None = None
        if environ.get("REQUEST_METHOD") == "POST":
            length = int(environ.get("CONTENT_LENGTH") or 0)
            body = answer(path, orjson.loads(environ["wsgi.input"].read(length)))
        elif path in ("/healthz", "/readyz"):
            body = b'{"status":"ok"}'
        if body is None:
            start_response("404 NOT FOUND", [("Content-Type", "application/json"), ("Content-Length", "2")])
            return [b"{}"]
        start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
        return [body]

    return app


def echo_app(answers: dict[str, bytes]) -> Wsgi:
    """POST path -> its constant answer after parsing the body; GET probes -> 200."""
    return posting_app(lambda path, _parsed: answers.get(path))


def admission_app() -> Wsgi:
    """POST /mutate and /validate -> an AdmissionReview that allows the request, no patch, with the request's
    uid (kube-apiserver refuses an answer for another uid): the least any admission webhook can answer."""

    def allow(path: str, review: Any) -> bytes | None:
        if path not in ("/mutate", "/validate"):
            return None
        return orjson.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                             "response": {"uid": review["request"]["uid"], "allowed": True}})

    return posting_app(allow)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--bind", default="127.0.0.1")
    parser.add_argument("--cert-dir", default=None)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--answer", action="append", default=[], metavar="PATH=FILE",
                        help="the constant answer for POST PATH (repeatable)")
    parser.add_argument("--admission", action="store_true",
                        help="answer /mutate and /validate AdmissionReviews: allowed, with the request's uid")
    args = parser.parse_args()
    answers = {}
    for item in args.answer:
        path, _, file = item.partition("=")
        answers[path] = Path(file).read_bytes()
    from serving.server import serve

    factory = admission_app if args.admission else (lambda: echo_app(answers))
    serve(factory, bind=args.bind, port=args.port, cert_dir=args.cert_dir,  # type: ignore[arg-type,return-value]
          workers=args.workers, threads=args.threads, worker_class="gthread")


if __name__ == "__main__":
    main()
