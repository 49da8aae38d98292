"""Run a Flask app under gunicorn, in-process, with TLS that follows certificate rotation.

Worker model. The webhook and extender handlers are short CPU-bound JSON
transforms (0.1-3 ms) with no I/O on the request path (caches are fed by
watch threads). On a 2-core pod: `gthread`, 2 workers (one per core: more
processes only add context switches; two processes also sidestep the GIL)
x 4 threads (kube-apiserver and kube-scheduler hold a pool of keep-alive
connections; threads let one worker keep several of them open without one
slow client stalling the others). Keep-alive is on (75 s, under the Go
client's 90 s idle timeout) so TLS handshakes, which cost more than a
review, are paid once per connection, not per request.

Certificate rotation. gunicorn asks the `ssl_context` hook for a context on
every accepted connection. `RotatingTLS` answers from a cache keyed by the
files' identity (inode, size, mtime of tls.crt and tls.key, following
symlinks): two stat calls per connection, and a new context is built only
when the files changed. So a cert rewritten in place, renamed over, or
swapped by the kubelet's `..data` symlink is served to the next connection
by the same worker processes, with no restart and no reload signal. If the
new pair does not load (cert and key written at different moments), the old
context keeps serving and the next connection tries again.

Metrics. Before gunicorn forks, `serve()` points PROMETHEUS_MULTIPROC_DIR at
a fresh temporary directory (unless the operator set one), so
`serving.metrics` can aggregate all workers; the directory is removed on exit.
"""

from __future__ import annotations

import gc
import logging
import os
import shutil
import ssl
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flask import Flask
from gunicorn.app.base import BaseApplication

from serving.metrics import MULTIPROC_ENV, use_multiprocess_values
from serving.tally import TALLY
from serving.tls import server_context

log = logging.getLogger(__name__)

KEEPALIVE_SECONDS = 75
Signature = tuple[tuple[int, int, int, int], ...]


class RotatingTLS:
    """A gunicorn `ssl_context` hook that rebuilds the context when the cert files change."""

    def __init__(self, certfile: Path, keyfile: Path) -> None:
        self.certfile = certfile
        self.keyfile = keyfile
        self._lock = threading.Lock()
        self._signature: Signature | None = None
        self._context: ssl.SSLContext | None = None
        self.loads = 0

    def _current_signature(self) -> Signature:
        stats = (os.stat(self.certfile), os.stat(self.keyfile))  # follows the ..data symlinks
        return tuple((s.st_dev, s.st_ino, s.st_size, s.st_mtime_ns) for s in stats)

    def build(self) -> ssl.SSLContext:
        return server_context(self.certfile, self.keyfile)

    def context(self) -> ssl.SSLContext:
        """The context for a new connection: cached until the files change."""
        try:
            signature = self._current_signature()
        except OSError as exc:  # mid-swap: a file briefly missing
            if self._context is None:
                raise
            log.warning("TLS files unreadable (%s); keeping the current certificate", exc)
            return self._context
        if signature == self._signature and self._context is not None:
            return self._context
        with self._lock:
            if signature != self._signature or self._context is None:
                try:
                    self._context = self.build()
                    self._signature = signature
                    self.loads += 1
                    if self.loads > 1:
                        log.info("TLS certificate reloaded from %s", self.certfile)
                except (ssl.SSLError, OSError) as exc:
                    if self._context is None:
                        raise
                    log.warning("new TLS files do not load (%s); keeping the current certificate", exc)
            return self._context

    def gunicorn_hook(self, _config: Any, _default_factory: Callable[[], ssl.SSLContext]) -> ssl.SSLContext:
        return self.context()


class _GunicornApp(BaseApplication):  # type: ignore[misc]
    def __init__(self, app_factory: Callable[[], Flask], options: dict[str, Any]) -> None:
        self._app_factory = app_factory
        self._options = options
        super().__init__()

    def load_config(self) -> None:
        for key, value in self._options.items():
            self.cfg.set(key, value)

    def load(self) -> Flask:
        # Called in each worker after the fork (no preload): watch threads and
        # per-process metrics are created where they will run.
        return load_frozen(self._app_factory)


def load_frozen(app_factory: Callable[[], Flask]) -> Flask:
    """`app_factory()`, then everything the worker holds so far moved out of the collector's sight.

    A worker holds some 85,000 tracked objects once Flask, pydantic and the
    kubernetes client are imported, and they live as long as the process.
    The collector's full collections walk all of them: 40-55 ms on a 2-core
    VM, inside whichever request triggered one (every few thousand
    reviews of distinct pods, whose remembered answers count towards the
    trigger). Frozen, a full collection walks only what requests left since
    (docs/benchmarks/history/dryrun-and-issue16-rounds.md, "Issue 16, sixth round"). Caches filled later by
    watch threads are frozen when synced (`WatchedView.start(freeze_after_sync=True)`).
    """
    app = app_factory()
    gc.collect()
    gc.freeze()
    return app


def _post_fork(_server: Any, _worker: Any) -> None:
    use_multiprocess_values()


def _worker_exit(_server: Any, _worker: Any) -> None:
    TALLY.flush()  # the counts this worker still holds (serving.tally)


def _child_exit(_server: Any, worker: Any) -> None:
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)  # type: ignore[no-untyped-call]


def gunicorn_options(*, bind: str, port: int, cert_dir: Path | None, workers: int, threads: int,
                     worker_class: str, access_log: bool) -> dict[str, Any]:
    """The gunicorn settings `serve` uses (exposed for tests and docs)."""
    options: dict[str, Any] = {
        "bind": [f"[{bind}]:{port}" if ":" in bind else f"{bind}:{port}"],
        "workers": workers,
        "threads": threads,
        "worker_class": worker_class,
        "keepalive": KEEPALIVE_SECONDS,
        "timeout": 30,
        "graceful_timeout": 10,
        "accesslog": "-" if access_log else None,
        "errorlog": "-",
        "loglevel": "info",
        "post_fork": _post_fork,
        "worker_exit": _worker_exit,
        "child_exit": _child_exit,
        "proc_name": "kubeon-gpu",
        # gunicorn's control socket (~/.gunicorn/gunicorn.ctl by default) would let a local process change
        # the worker count or stop the server; nothing of ours uses it (tests/serving/test_server.py)
        "control_socket_disable": True,
    }
    if cert_dir is not None:
        tls = RotatingTLS(cert_dir / "tls.crt", cert_dir / "tls.key")
        tls.context()  # fail now, in the master, if the pair does not load
        options.update(certfile=str(tls.certfile), keyfile=str(tls.keyfile), ssl_context=tls.gunicorn_hook)
    return options


def serve(
    app_factory: Callable[[], Flask],
    *,
    bind: str = "0.0.0.0",
    port: int,
    cert_dir: Path | str | None = None,
    workers: int = 2,
    threads: int = 4,
    worker_class: str = "gthread",
    access_log: bool = False,
) -> None:
    """Serve `app_factory()` (called once per worker) until SIGTERM/SIGINT; TLS when `cert_dir` is given."""
    cert_path = Path(cert_dir) if cert_dir is not None else None
    options = gunicorn_options(bind=bind, port=port, cert_dir=cert_path, workers=workers, threads=threads,
                               worker_class=worker_class, access_log=access_log)
    own_dir = None
    if not os.environ.get(MULTIPROC_ENV):
        own_dir = tempfile.mkdtemp(prefix="kubeon-metrics-")
        os.environ[MULTIPROC_ENV] = own_dir
    try:
        _GunicornApp(app_factory, options).run()
    except SystemExit as exc:  # gunicorn's arbiter exits the process when it halts
        if exc.code not in (0, None):
            raise
    finally:
        if own_dir is not None:
            shutil.rmtree(own_dir, ignore_errors=True)
            os.environ.pop(MULTIPROC_ENV, None)
