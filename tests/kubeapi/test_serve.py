"""`python -m tests.kubeapi serve`: the test cluster by hand, as the README documents it.

Real: the module run as a process, its kubeconfig, kubectl 1.35, the stand-ins (a Deployment
rolls out). Faked: nothing beyond the test cluster itself."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.kubeapi.cluster import REPO, kubectl_binary
from tests.loopback import free_port


def test_serve_prints_the_kubeconfig_and_runs_the_stand_ins(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kc"
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tests.kubeapi", "serve", "--port", str(port),
                             "--kubeconfig", str(kubeconfig)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == str(kubeconfig.resolve())
        assert f"127.0.0.1:{port}" in kubeconfig.read_text()

        def kubectl(*args: str) -> str:
            out = subprocess.run([kubectl_binary(), "--kubeconfig", str(kubeconfig), *args], capture_output=True,
                                 text=True, timeout=60)
            assert out.returncode == 0, out.stderr
            return out.stdout

        assert "gpupolicies.gpu.kubeon.io" in kubectl("get", "crd", "-o", "name")
        kubectl("create", "deployment", "web", "--image=nginx")
        assert "successfully rolled out" in kubectl("rollout", "status", "deploy/web", "--timeout=30s")
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(timeout=20)
        except subprocess.TimeoutExpired as exc:
            # Never leave it running (its stand-ins poll): say where each thread was, then stop it.
            proc.send_signal(signal.SIGUSR1)
            time.sleep(1)
            proc.kill()
            _, stderr = proc.communicate()
            raise AssertionError(f"serve did not stop within 20 s of SIGINT; its threads:\n{stderr[-6000:]}") from exc
    assert code == 0


def _tgkill(pid: int, tid: int, signum: int) -> None:
    """Send `signum` to one thread of another process (Linux tgkill; os.kill picks the thread itself)."""
    import ctypes
    import platform

    number = {"x86_64": 234, "aarch64": 131}[platform.machine()]
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(number, pid, tid, signum) != 0:
        raise OSError(ctypes.get_errno(), "tgkill failed")


def test_serve_stops_when_the_signal_lands_on_another_thread(tmp_path: Path) -> None:
    """The kernel hands a process signal to any thread that does not block it. serve's main thread waited
    on an Event without a timeout, so a SIGINT taken by a server or stand-in thread never woke it (CI saw
    serve outlive its SIGINT). Here the SIGINT goes to a thread that is not the main one, on purpose."""
    proc = subprocess.Popen([sys.executable, "-m", "tests.kubeapi", "serve", "--port", str(free_port()),
                             "--kubeconfig", str(tmp_path / "kc")], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip()  # up: the kubeconfig is written
        others = sorted(int(t.name) for t in Path(f"/proc/{proc.pid}/task").iterdir() if int(t.name) != proc.pid)
        assert others, "serve runs server and stand-in threads"
        _tgkill(proc.pid, others[0], signal.SIGINT)  # the first thread serve started after the main one
        code = proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code == 0
