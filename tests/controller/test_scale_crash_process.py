"""Scale to zero survives a real process kill: `kubeon-gpu controller` dies right after a write, a fresh one converges.

Real: the controller command (`python -m cli.main controller`) in subprocesses
with its Lease (2 s, renew every 0.4 s), policy sync, reconcilers and
`--prometheus-url`, authenticated as the chart's controller ServiceAccount
(keda.enabled=true); /usr/bin/prometheus with promtool-backfilled idle history
scraping the scripted DCGM exporter (tests/promharness); the real control
plane (tests/cluster) with the chart's CRDs and RBAC and the KEDA CRD. The kill is real: the
documented test hook `KUBEON_GPU_CRASH_AT=scaletozero:<checkpoint>` makes the process
`os._exit(137)` right after that write, before the next write, the Events, the
metric and the policy status write; the dead process never releases its lease,
so the next one takes over only after expiry. Faked: the GPUs (scripted
series) and the KEDA operator (the test scales a paused target to 0 itself).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from controller.crashpoints import CRASH_ENV, CRASH_EXIT_CODE, crash_point
from gpupolicy.scaling import scaletozero as core
from kube import scale as kscale
from tests.controller.conftest import Scene
from tests.controller.test_scale_to_zero_cluster import (
    CLUSTER as SCALE_CLUSTER,
)
from tests.controller.test_scale_to_zero_cluster import (
    UTIL,
    annotations,
    create,
    deploy,
    ours_on,
    parked_record,
    pod,
    policy,
    policy_status,
    script_gpu,
    workload,
)
from tests.controller.test_scale_to_zero_cluster import keda_crd as keda_crd  # the module's KEDA CRD
from tests.loopback import wait_for
from tests.promharness import DcgmExporter, PrometheusServer, constant, gpu_labels

REPO = Path(__file__).resolve().parents[2]
POLICY = "idle-gpus"
CLUSTER = SCALE_CLUSTER  # keda.enabled=true: the processes run with --keda

# A restarted controller takes the dead one's Lease once it expires, then needs a full pass against the
# real cluster: on 2 cores shared with other test workers that is well past 15 s at times.
RESTART_WAIT = 90.0


class Controller:
    """One `kubeon-gpu controller` process; `crash_at` arms the KUBEON_GPU_CRASH_AT hook (scaletozero:<crash_at>)."""

    def __init__(self, kubeconfig: str, prometheus_url: str, identity: str, tmp: Path,
                 crash_at: str | None = None) -> None:
        self.identity = identity
        self.log_path = tmp / f"{identity}.log"
        env = {k: v for k, v in os.environ.items() if k != CRASH_ENV}
        env["PYTHONPATH"] = str(REPO)
        if crash_at:
            env[CRASH_ENV] = crash_point("scaletozero", crash_at)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "controller", "--kubeconfig", kubeconfig, "--identity", identity,
             "--prometheus-url", prometheus_url, "--health-port", "0", "--health-bind", "127.0.0.1",
             "--lease-duration-seconds", "2", "--renew-seconds", "0.4", "--resync-seconds", "1", "--keda"],
            cwd=REPO, env=env, stdout=self.log_path.open("w"), stderr=subprocess.STDOUT,
        )

    @property
    def log(self) -> str:
        return self.log_path.read_text()

    def wait_killed(self, timeout: float = 15.0) -> None:
        """The hook fired: exit 137 and the log names the checkpoint."""
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"{self.identity} never reached its crash point\n{self.log}") from None
        assert code == CRASH_EXIT_CODE, f"{self.identity} exited {code}\n{self.log}"
        assert "crash injected at checkpoint=" in self.log

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                assert self.proc.wait(timeout=10) == 0, self.log
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def controllers(scene: Scene, tmp_path: Path) -> Iterator[Callable[..., Controller]]:
    started: list[Controller] = []

    def start(prom: PrometheusServer, identity: str, crash_at: str | None = None) -> Controller:
        proc = Controller(scene.kubeconfig, prom.url, identity, tmp_path, crash_at)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.proc.poll() is None:
            proc.proc.kill()
            proc.proc.wait()


def proposals_for(api: client.ApiClient, target: str) -> list[dict[str, Any]]:
    return [p for p in policy_status(api, POLICY).get("proposals") or [] if p["target"] == target]


def applied_events(api: client.ApiClient, name: str, ns: str) -> list[Any]:
    """GpuPolicyApplied Events about Deployment `name` (on the policy, in `default` where the API server keeps
    Events about cluster-scoped objects)."""
    return [e for e in client.CoreV1Api(api).list_namespaced_event("default").items
            if e.reason == "GpuPolicyApplied" and e.message.startswith(f"Deployment/{ns}/{name}: ")]


def version(api: client.ApiClient, name: str, ns: str) -> int:
    """metadata.generation: only a write of the spec (replicas through /scale included) moves it."""
    return int(workload(api, name, ns)["metadata"]["generation"])


def test_kill_after_park_and_after_wake_restart_converges(
    scene: Scene, dcgm_exporter: DcgmExporter, prometheus_factory: Callable[..., PrometheusServer],
    controllers: Callable[..., Controller],
) -> None:
    api, ns = scene.admin, scene.namespace
    key = f"Deployment/{ns}/llm"
    deploy(api, "llm", 3, ns=ns)
    # Automatic, idleFor 60s, below 5%: only the annotation wakes
    create(api, policy(POLICY, wake=False, namespaces=(ns,)))
    script_gpu(dcgm_exporter, "llm", constant(1), ns=ns)
    prom = prometheus_factory(history=180, wait_scrape=False)

    # 1. Killed right after the one park patch: nothing later in the pass happened.
    first = controllers(prom, "crash-after-park", crash_at="parked")
    first.wait_killed()
    parked = workload(api, "llm", ns)
    assert parked["spec"]["replicas"] == 0
    record = parked_record(api, "llm", ns, policy_name=POLICY)
    assert record is not None and record["replicas"] == 3 and record["scaledAt"] and record["undo"]
    assert ours_on(parked) == []
    assert "applied policy=" not in first.log and applied_events(api, "llm", ns) == []
    assert proposals_for(api, key) == []  # the status write after the pass never came
    parked_version = version(api, "llm", ns)

    # 2. A fresh process (no hook) takes the unreleased lease after expiry and converges without a write.
    second = controllers(prom, "restart-1")
    shown = wait_for(lambda: proposals_for(api, key), timeout=RESTART_WAIT, what="the restarted controller's proposal")
    assert [p["state"] for p in shown] == ["Applied"] and "from 3 replicas" in shown[0]["reason"]
    assert version(api, "llm", ns) == parked_version, "parked twice"
    assert "leadership acquired" in second.log and "crash injected" not in second.log
    second.stop()
    assert version(api, "llm", ns) == parked_version
    assert (parked_record(api, "llm", ns, policy_name=POLICY) or {})["replicas"] == 3

    # 3. Wake by annotation; killed right after the wake's scale patch (before the record's removal, its
    #    Events and status).
    dcgm_exporter.put(UTIL, gpu_labels(namespace=ns, pod=pod("llm")), constant(80))  # woken pods work
    prom.wait_for(f'{UTIL}{{pod="{pod("llm")}"}} > 50', timeout=15)
    client.AppsV1Api(api).patch_namespaced_deployment("llm", ns, {"metadata": {"annotations": {core.WAKE: "true"}}})
    third = controllers(prom, "crash-after-wake", crash_at="woken")
    third.wait_killed()
    woken = workload(api, "llm", ns)
    assert woken["spec"]["replicas"] == 3
    assert parked_record(api, "llm", ns, policy_name=POLICY) is not None, "the crash came before the record's removal"
    woken_version = version(api, "llm", ns)

    # 4. Another restart: running and busy, the record stale; it drops the record and the stale Applied
    #    proposal, and writes nothing to the workload.
    fourth = controllers(prom, "restart-2")
    wait_for(lambda: not proposals_for(api, key), timeout=RESTART_WAIT, what="the parked proposal cleared")
    wait_for(lambda: parked_record(api, "llm", ns, policy_name=POLICY) is None, timeout=RESTART_WAIT,
             what="the stale record dropped")
    assert ours_on(workload(api, "llm", ns)) == []
    assert version(api, "llm", ns) == woken_version
    assert workload(api, "llm", ns)["spec"]["replicas"] == 3
    fourth.stop()


def test_kill_between_keda_steps_restart_converges(
    scene: Scene, dcgm_exporter: DcgmExporter, prometheus_factory: Callable[..., PrometheusServer],
    controllers: Callable[..., Controller],
) -> None:
    api, ns = scene.admin, scene.namespace
    key = f"Deployment/{ns}/kedad"
    deploy(api, "kedad", 5, ns=ns)
    create(api, {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
                 "metadata": {"name": "kedad", "namespace": ns},
                 "spec": {"scaleTargetRef": {"name": "kedad"},
                          "triggers": [{"type": "cpu", "metadata": {"value": "50"}}]}})
    create(api, policy(POLICY, wake=False, namespaces=(ns,)))
    script_gpu(dcgm_exporter, "kedad", constant(0), ns=ns)
    prom = prometheus_factory(history=180, wait_scrape=False)

    def scaled_object() -> dict[str, Any]:
        return kscale.list_scaled_objects(api, ns)[0]

    # 1. Killed after recording the count in the policy status, before pausing its ScaledObject.
    controllers(prom, "crash-after-record", crash_at="recorded").wait_killed()
    half = workload(api, "kedad", ns)
    assert half["spec"]["replicas"] == 5
    assert (parked_record(api, "kedad", ns, policy_name=POLICY) or {})["replicas"] == 5
    assert not kscale.is_paused_at_zero(scaled_object())

    # 2. The restart finishes the park: same count, ScaledObject paused, proposal Applied.
    second = controllers(prom, "restart-1")
    wait_for(lambda: kscale.is_paused_at_zero(scaled_object()), what="the ScaledObject paused")
    wait_for(lambda: [p["state"] for p in proposals_for(api, key)] == ["Applied"], what="the Applied proposal")
    second.stop()
    assert (parked_record(api, "kedad", ns, policy_name=POLICY) or {})["replicas"] == 5
    client.AppsV1Api(api).patch_namespaced_deployment_scale("kedad", ns, {"spec": {"replicas": 0}})  # KEDA's job

    # 3. Wake; killed right after unpausing, before restoring the replicas.
    client.AppsV1Api(api).patch_namespaced_deployment("kedad", ns, {"metadata": {"annotations": {core.WAKE: "true"}}})
    controllers(prom, "crash-after-unpause", crash_at="unpaused").wait_killed()
    assert not kscale.is_paused_at_zero(scaled_object())
    between = workload(api, "kedad", ns)
    assert between["spec"]["replicas"] == 0
    assert (parked_record(api, "kedad", ns, policy_name=POLICY) or {})["replicas"] == 5

    # 4. The restart finishes the wake with the recorded count and clears the record.
    fourth = controllers(prom, "restart-2")
    wait_for(lambda: workload(api, "kedad", ns)["spec"]["replicas"] == 5, what="kedad back at 5")
    wait_for(lambda: parked_record(api, "kedad", ns, policy_name=POLICY) is None, what="the record dropped")
    done = workload(api, "kedad", ns)
    assert ours_on(done) == [] and annotations(done)[core.WAKE] == "true"  # the user's: we cannot write it
    assert not kscale.is_paused_at_zero(scaled_object())
    fourth.stop()
