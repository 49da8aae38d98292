"""A pass function run in a daemon thread, and reading list responses as plain dicts: what the GPU
Operator shim (gpu_operator.py) runs on."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import Any, Self

log = logging.getLogger(__name__)
MERGE_PATCH = "application/merge-patch+json"  # the generated client defaults PATCH to JSON Patch


def read_items(response: Any) -> list[dict[str, Any]]:
    """Items of a list call made with `_preload_content=False` (plain wire dicts, no model classes)."""
    return list(json.loads(response.data).get("items") or [])


class PassLoop:
    """A pass function run every `interval` seconds in a daemon thread."""

    def __init__(self, name: str, step: Callable[[], Any], interval: float = 0.5) -> None:
        self._name, self._step, self.interval = name, step, interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._step()
            except Exception:  # keep running across conflicts and races; the next pass repairs
                log.exception("%s pass failed", self._name)
            self._stop.wait(self.interval)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None


class InBackground:
    """`start()`/`stop()` for a shim whose passes run in its PassLoop (`self._loop`)."""

    _loop: PassLoop

    def start(self) -> Self:
        self._loop.start()
        return self

    def stop(self) -> None:
        self._loop.stop()
