"""`kubeon-gpu controller` as real processes: two replicas, one leader, takeover, a stolen lease exits.

Real: the controller command (`python -m cli.main controller`) in subprocesses,
its Lease loop on the real clock (short lease: 2 s, renew every 0.4 s; the
SIGTERM test uses a 30 s lease so only a release explains a quick takeover), the
health server, the real control plane (tests/cluster) with the chart's CRDs and
RBAC, each process authenticated as the chart's controller ServiceAccount.
Faked: nothing; no Prometheus is configured (policies stay Recommend, which
these tests do not depend on).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from kube.leases import LeaseConflict, get_lease, replace_lease
from tests.controller.conftest import CONTROLLER_CLUSTER, Scene, make_policy
from tests.loopback import free_port, wait_for

CLUSTER = CONTROLLER_CLUSTER
REPO = Path(__file__).resolve().parents[2]
LEASE = "kubeon-gpu-optimizer"


class Replica:
    def __init__(self, kubeconfig: str, identity: str, tmp: Path, lease_duration: int = 2) -> None:
        self.identity = identity
        self.port = free_port()
        self.log_path = tmp / f"{identity}.log"
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "controller", "--kubeconfig", kubeconfig, "--identity", identity,
             "--health-port", str(self.port), "--health-bind", "127.0.0.1",
             "--lease-duration-seconds", str(lease_duration),
             "--renew-seconds", "0.4", "--resync-seconds", "1"],
            cwd=REPO, env=env, stdout=self.log_path.open("w"), stderr=subprocess.STDOUT,
        )

    @property
    def log(self) -> str:
        return self.log_path.read_text()

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=2) as answer:
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, ""
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return 0, ""  # not listening yet (a process still starting): callers poll

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def replicas(scene: Scene, tmp_path: Path) -> Iterator[list[Replica]]:
    scene.create(make_policy("guard", {"guardrail": {"maxGpusPerPod": 4}}, selector={"namespaces": [scene.namespace]}))
    started = [Replica(scene.kubeconfig, name, tmp_path) for name in ("alpha", "beta")]
    yield started
    for r in started:
        r.stop()


def holder(api: client.ApiClient) -> str | None:
    lease = get_lease(api, "kubeon-gpu", LEASE)
    return lease.holder if lease else None


def test_one_of_two_processes_leads_and_the_other_takes_over(scene: Scene, replicas: list[Replica]) -> None:
    api = scene.admin
    leader_name = wait_for(lambda: holder(api), what="a lease holder")
    leader = next(r for r in replicas if r.identity == leader_name)
    standby = next(r for r in replicas if r is not leader)
    wait_for(lambda: "policies read count=1" in leader.log, what="policies read in the leader's log")
    # The standby started as the slower of the two (start-up under load differs by seconds): wait
    # until it has seen the lease held, then it must be ready at once and must not act.
    wait_for(lambda: f"standing by identity={standby.identity}" in standby.log, what="the standby's first lease step")
    # Over more than a lease duration (2 s: five of the standby's lease steps at 0.4 s), the leader keeps
    # renewing and the standby never takes the held lease.
    renewals: set[float | None] = set()
    deadline = time.monotonic() + 2.5
    while time.monotonic() < deadline:
        lease = get_lease(api, "kubeon-gpu", LEASE)
        assert lease is not None and lease.holder == leader.identity and lease.transitions == 0, lease
        renewals.add(lease.renew_time)
        time.sleep(0.1)
    assert len(renewals) >= 3, f"the leader renewed {len(renewals) - 1} times in 2.5 s"
    assert "leadership acquired" in leader.log and "leadership acquired" not in standby.log
    assert f"holder={leader.identity}" in standby.log
    assert "policies read" not in standby.log
    assert wait_for(lambda: leader.get("/healthz")[0] == 200)
    assert standby.get("/readyz")[0] == 200
    code, text = leader.get("/metrics")
    assert code == 200 and "kubeon_gpu_leader 1.0" in text and "kubeon_gpu_policies" in text
    lease = get_lease(api, "kubeon-gpu", LEASE)
    assert lease is not None and lease.transitions == 0

    leader.proc.kill()  # no release: the standby must wait for expiry
    leader.proc.wait()
    wait_for(lambda: holder(api) == standby.identity, timeout=10, what="takeover")
    lease = get_lease(api, "kubeon-gpu", LEASE)
    assert lease is not None and lease.transitions == 1
    wait_for(lambda: "policies read" in standby.log, what="new leader syncing")


def test_a_process_whose_lease_is_stolen_exits(scene: Scene, replicas: list[Replica]) -> None:
    api = scene.admin
    leader_name = wait_for(lambda: holder(api), what="a lease holder")
    leader = next(r for r in replicas if r.identity == leader_name)
    for r in replicas:
        if r is not leader:
            r.stop()
    def steal() -> bool:
        current = get_lease(api, "kubeon-gpu", LEASE)
        assert current is not None
        now = time.time()
        try:
            replace_lease(api, current, "intruder", 60, now, now, current.transitions + 1)
        except LeaseConflict:  # the leader renewed in between: try again
            return False
        return True

    wait_for(steal, what="stealing the lease")
    assert leader.proc.wait(timeout=10) == 1
    # the leader either sees the new holder or loses its own renewal race (409)
    assert "leadership lost" in leader.log
    assert "intruder" in leader.log or "changed under us" in leader.log
    assert holder(api) == "intruder"


def test_sigterm_exits_promptly_and_releases_the_lease(scene: Scene, tmp_path: Path) -> None:
    """A SIGTERM'd leader exits at once (not after a reconcile period) and gives the lease up; the standby
    takes over at once.

    The lease lasts 30 s here: without the release the standby would wait for expiry, so a takeover
    within 15 s shows the release without timing anything finer.
    """
    api = scene.admin
    started = [Replica(scene.kubeconfig, name, tmp_path, lease_duration=30) for name in ("gamma", "delta")]
    try:
        leader_name = wait_for(lambda: holder(api), what="a lease holder")
        leader = next(r for r in started if r.identity == leader_name)
        standby = next(r for r in started if r is not leader)
        wait_for(lambda: "policies read" in leader.log, what="the leader's first sync")
        wait_for(lambda: standby.get("/readyz")[0] == 200, what="the standby up")
        before = get_lease(api, "kubeon-gpu", LEASE)
        assert before is not None and before.lease_duration_seconds == 30

        leader.proc.send_signal(signal.SIGTERM)
        try:
            code = leader.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # the log says which step of the stop took the time
            pytest.fail(f"no exit within 10 s of SIGTERM; its log:\n{leader.log}")
        assert code == 0, leader.log
        assert "lease released" in leader.log and "leadership lost" not in leader.log

        wait_for(lambda: holder(api) == standby.identity, timeout=15,
                 what="takeover after the release (a 30 s lease: not its expiry)")
        after = get_lease(api, "kubeon-gpu", LEASE)
        assert after is not None and after.transitions == before.transitions + 1
        assert after.lease_duration_seconds == 30, "the new holder writes its own duration"
        wait_for(lambda: "policies read" in standby.log, what="the new leader syncing")
    finally:
        for r in started:
            r.stop()


_TGKILL = {"x86_64": 234, "aarch64": 131}  # the tgkill syscall's number (asm/unistd.h)


def _signal_thread(pid: int, tid: int, signum: int) -> None:
    """SIGTERM handed to one thread, as the kernel may hand a process-directed signal to any thread
    that does not block it; on another architecture, the process-directed kill."""
    import ctypes

    number = _TGKILL.get(os.uname().machine)
    if number is None:
        os.kill(pid, signum)
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(number, pid, tid, signum) != 0:
        raise OSError(ctypes.get_errno(), f"tgkill {pid} {tid}")


def test_sigterm_taken_by_any_thread_still_stops_cleanly(scene: Scene, tmp_path: Path) -> None:
    """Every thread of the process, native ones included (numpy's OpenBLAS starts its own at import),
    must turn a SIGTERM into the clean stop: exit 0 and the lease released. With the signal blocked on
    the main thread and taken by sigtimedwait, a SIGTERM that landed on another thread while the main
    one was between two waits killed the process with the default action (exit -15): seen once in a
    full-suite run under load."""
    api = scene.admin
    replica = Replica(scene.kubeconfig, "epsilon", tmp_path, lease_duration=30)
    try:
        wait_for(lambda: holder(api) == "epsilon", what="the lease held")
        wait_for(lambda: "policies read" in replica.log, what="the first sync")
        pid = replica.proc.pid
        others = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task") if int(t) != pid)
        assert others, "the controller runs more than one thread (reconcile loop, health server)"
        _signal_thread(pid, others[0], signal.SIGTERM)
        assert replica.proc.wait(timeout=10) == 0, replica.log
        assert "lease released" in replica.log
        assert holder(api) in (None, "")
    finally:
        replica.stop()
