"""Child processes of the loopback cluster: started with a log file each, ended with the harness.

Every child asks the kernel to kill it when the harness dies (PR_SET_PDEATHSIG), so a pytest worker
killed by a timeout leaves no etcd or kube-apiserver behind; `stop` ends them newest first.
The signal follows the *thread* that started the child (prctl(2)): start components from a thread
that outlives them (the test's main thread), never from a short-lived worker thread.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class StartError(RuntimeError):
    """A component that exited or never became ready; the message carries its log's tail."""


@dataclass
class Child:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def tail(self, lines: int = 30) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def alive(self) -> bool:
        return self.popen.poll() is None


@dataclass
class Children:
    """The processes one cluster started, in start order."""

    log_dir: Path
    started: list[Child] = field(default_factory=list)

    def start(self, name: str, argv: Sequence[str], env: dict[str, str] | None = None,
              cwd: Path | None = None) -> Child:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_dir / f"{name}.log"
        with open(log, "ab") as sink:
            popen = subprocess.Popen(list(argv), stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env={**os.environ, **(env or {})}, cwd=cwd, preexec_fn=_die_with_parent)
        child = Child(name, popen, log)
        self.started.append(child)
        return child

    def get(self, name: str) -> Child:
        return next(c for c in reversed(self.started) if c.name == name)

    def wait_until(self, child: Child, ready: Callable[[], bool], timeout: float, what: str) -> None:
        """Poll `ready` until true; StartError with the child's log when it exits or the time runs out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not child.alive():
                raise StartError(f"{child.name} exited with {child.popen.returncode} before {what}:\n{child.tail()}")
            try:
                if ready():
                    return
            except Exception:
                pass
            time.sleep(0.1)
        raise StartError(f"{child.name}: no {what} after {timeout:.0f}s:\n{child.tail()}")

    def stop_one(self, child: Child, grace: float = 10.0) -> None:
        if child.alive():
            child.popen.send_signal(signal.SIGTERM)
            try:
                child.popen.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                child.popen.kill()
                child.popen.wait(timeout=5)

    def stop(self) -> None:
        """Stop every child, newest first, but kube-apiserver and etcd last: a kube-apiserver restarted
        during a test is the newest child, and the components that still talk to it (the controllers'
        lease release, KWOK, Karpenter, our processes) would each wait out their grace on shutdown. The
        cluster's state goes with them, so a graceful exit has 3 s, not 10."""
        last = {"kube-apiserver": 1, "etcd": 2}
        for child in sorted(reversed(self.started), key=lambda c: last.get(c.name, 0)):
            self.stop_one(child, grace=3.0)
        self.started.clear()
