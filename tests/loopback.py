"""Small shared pieces for tests that start real servers on 127.0.0.1."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any


def free_port() -> int:
    """A port free on 127.0.0.1 right now (the server binds it a moment later)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(check: Callable[[], Any], timeout: float = 15.0, what: str = "", interval: float = 0.1) -> Any:
    """Poll `check` until it returns something truthy; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what or check}")
