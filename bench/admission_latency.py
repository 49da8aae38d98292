"""Pod create latency through the real kube-apiserver with our webhook registered against not registered.

    python bench/admission_latency.py [--rate 50] [--seconds 20] [--rounds 3] [--down]

One loopback cluster (tests/cluster: etcd, kube-apiserver, kube-controller-manager, KWOK, all real;
the default kube-scheduler stopped, so no scheduler writes pod status during a measure), our webhook
running as the chart renders it (`Cluster(kubeon=True)`, webhook only) and one Automatic packing
GpuPolicy for the trace's namespace, so each GPU pod is really routed (the mutating hook patches its
schedulerName) and validated. The pods are the openb default trace's, converted as
bench/cluster_replay.py converts them (every pod different).

Arms, each a block of --seconds at --rate creates per second, paced open loop (latency counted from
the time a create was due, so a slow server is not hidden by a slower client), in ABBA order per round:
- `registered`: the chart's MutatingWebhookConfiguration and ValidatingWebhookConfiguration applied
  (clientConfig.url on 127.0.0.1, the chart's failurePolicy and timeoutSeconds);
- `unregistered`: both deleted (stock admission: the built-in plugins alone);
- `down` (--down): registered, the webhook process stopped (connection refused): what failurePolicy
  Ignore costs while the webhook is away.
A create is `POST /api/v1/namespaces/openb/pods` with the pod's JSON, as kubectl sends it (admin client
certificate, one keep-alive connection per client thread). Between blocks the pods are deleted.

Prints one JSON line per block and a summary: p50/p90/p99/max per arm over all its blocks, the ratios
registered/unregistered, kube-apiserver's own view of each webhook call
(apiserver_admission_webhook_admission_duration_seconds: mean and the bucket that holds its p99 and
max) and the 1-minute load average (the machine is shared).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import ssl
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kubernetes import client  # noqa: E402
from kubernetes.client.rest import ApiException  # noqa: E402

from bench.cluster_replay import (  # noqa: E402
    NAMESPACE,
    PODS_CSV,
    build_trace,
    load_avg,
    packing_policy,
    pod_object,
    samples,
    total,
)
from simulator.trace import load_nodes, load_pods  # noqa: E402
from tests.cluster.cluster import Cluster  # noqa: E402
from tests.cluster.kubeon import RELEASE, apply_objects, webhook_configurations  # noqa: E402
from tests.cluster.objects import OPENB_NODES_CSV  # noqa: E402
from tests.loopback import free_port  # noqa: E402

HOOK_KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")


def _quietly(probe: Any) -> bool:
    try:
        return bool(probe())
    except OSError:
        return False


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))] if ordered else float("nan")


def stats_ms(values: list[float]) -> dict[str, float]:
    return {"n": len(values), "p50": round(1000 * percentile(values, 50), 2),
            "p90": round(1000 * percentile(values, 90), 2), "p99": round(1000 * percentile(values, 99), 2),
            "max": round(1000 * max(values), 2) if values else float("nan"),
            "mean": round(1000 * statistics.fmean(values), 2) if values else float("nan")}


class Creator:
    """Paced creates over keep-alive HTTPS connections, one per thread, with the admin client certificate."""

    def __init__(self, cluster: Cluster, threads: int = 16) -> None:
        plane = cluster.plane
        self.host, self.port = "127.0.0.1", plane.ports["apiserver"]
        self.context = plane.ssl_context()
        self.threads = threads
        self._local = threading.local()

    def _conn(self) -> http.client.HTTPSConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = http.client.HTTPSConnection(self.host, self.port, context=self.context,
                                                                  timeout=60)
        return conn

    def post(self, body: bytes) -> int:
        conn = self._conn()
        try:
            conn.request("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", body=body,
                         headers={"Content-Type": "application/json", "Accept": "application/json"})
            resp = conn.getresponse()
            resp.read()
            return resp.status
        except (OSError, http.client.HTTPException):
            conn.close()
            self._local.conn = None
            return 0

    def block(self, bodies: list[bytes], rate: float) -> tuple[list[float], int]:
        """Create `bodies` at `rate` per second; (latencies from each create's due time, errors)."""
        latencies: list[float] = []
        errors = [0]
        lock = threading.Lock()
        start = time.monotonic() + 0.2

        def one(i: int) -> None:
            due = start + i / rate
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            status = self.post(bodies[i])
            took = time.monotonic() - due
            with lock:
                if status == 201:
                    latencies.append(took)
                else:
                    errors[0] += 1

        with ThreadPoolExecutor(self.threads) as pool:
            list(pool.map(one, range(len(bodies))))
        return latencies, errors[0]


class Bench:
    def __init__(self, rate: float, seconds: float, rounds: int, down: bool, limit: bool, log: Any,
                 keep_state: bool = False) -> None:
        self.rate, self.seconds, self.rounds, self.down, self.limit, self.log = rate, seconds, rounds, down, limit, log
        self.limit_process: subprocess.Popen[bytes] | None = None
        self.cluster = Cluster(kubeon=True, kubeon_components=("webhook",), gpu_operator=False, keep_state=keep_state)
        trace = build_trace(load_nodes(OPENB_NODES_CSV), load_pods(PODS_CSV), 42)
        self.demands = trace.arrivals
        self.sent = 0

    def bodies(self, count: int) -> list[bytes]:
        out = []
        for _ in range(count):
            i = self.sent
            pod = pod_object(self.demands[i % len(self.demands)], i)
            out.append(json.dumps(pod, separators=(",", ":")).encode())
            self.sent += 1
        return out

    def run(self) -> int:
        c = self.cluster
        try:
            c.start()
            c.plane.children.stop_one(c.plane.children.get("kube-scheduler"))  # no status writes meanwhile
            c.ensure_namespace(NAMESPACE)
            c.create(packing_policy())
            assert c.kubeon is not None
            self.hooks = webhook_configurations(c.kubeon.docs, c.kubeon.webhook_url,
                                                (c.kubeon.tls / "ca.crt").read_bytes())
            c.wait_for(lambda: self.routed() is True, timeout=60, message="the webhook routing pods")
            creator = Creator(c)
            creator.block(self.bodies(int(self.rate * 3)), self.rate)  # warm up connections and caches
            self.clear()
            arms = ["registered", "unregistered"] + (["limit"] if self.limit else [])
            if self.limit:
                self.start_limit()
            results: dict[str, list[float]] = {a: [] for a in arms}
            errors: dict[str, int] = dict.fromkeys(arms, 0)
            for r in range(self.rounds):
                order = arms[r % len(arms):] + arms[:r % len(arms)]
                for arm in order:
                    self.arm(arm)
                    before = self.webhook_metrics()
                    lat, err = creator.block(self.bodies(int(self.rate * self.seconds)), self.rate)
                    after = self.webhook_metrics()
                    results[arm] += lat
                    errors[arm] += err
                    line = {"round": r, "arm": arm, **stats_ms(lat), "errors": err, "load_avg": load_avg()}
                    if arm != "unregistered":
                        line["webhook_calls"] = webhook_delta(before, after)
                    print(json.dumps(line), flush=True)
                    self.clear()
            if self.down:
                self.arm("registered")
                c.kubeon.stop_component("webhook")
                lat, err = creator.block(self.bodies(int(self.rate * self.seconds)), self.rate)
                results["down"], errors["down"] = lat, err
                print(json.dumps({"arm": "down", **stats_ms(lat), "errors": err, "load_avg": load_avg()}),
                      flush=True)
            self.summary(results, errors)
        finally:
            if self.limit_process is not None:
                self.limit_process.terminate()
                self.limit_process.wait(timeout=30)
            c.stop()
            if c.keep_state:
                self.log(f"state and logs kept in {c.root}")
        return 0

    def start_limit(self) -> None:
        """bench/echo.py --admission on the webhook's certificate: the same gunicorn, TLS and worker count as
        ours (the cluster runs ours with one worker), answering every review `allowed` with its uid."""
        assert self.cluster.kubeon is not None
        kubeon = self.cluster.kubeon
        port = free_port()
        self.limit_process = subprocess.Popen(
            [sys.executable, str(ROOT / "bench" / "echo.py"), "--admission", "--port", str(port), "--bind",
             "127.0.0.1", "--cert-dir", str(kubeon.tls), "--workers", "1"], cwd=ROOT,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.limit_hooks = webhook_configurations(kubeon.docs, f"https://127.0.0.1:{port}",
                                                  (kubeon.tls / "ca.crt").read_bytes())
        context = ssl.create_default_context(cafile=str(kubeon.tls / "ca.crt"))

        def healthy() -> bool:
            with urllib.request.urlopen(f"https://127.0.0.1:{port}/readyz", context=context, timeout=2) as resp:
                return bool(resp.status == 200)

        self.cluster.wait_for(lambda: _quietly(healthy), timeout=60, message="the limit webhook")

    def routed(self) -> bool | None:
        """Whether a dry-run create of a GPU pod comes back routed by our webhook."""
        pod = pod_object(self.demands[0], 999999)
        answer = self.cluster.core.create_namespaced_pod(NAMESPACE, pod, dry_run="All", _preload_content=False)
        return bool(json.loads(answer.data)["spec"].get("schedulerName") == "kubeon-gpu-scheduler")

    def arm(self, arm: str) -> None:
        """Register (ours or the limit) or unregister the webhook configurations, and wait until kube-apiserver
        acts on it."""
        dyn_kinds = {h["kind"]: h for h in self.hooks}
        if arm == "registered":
            apply_objects(self.cluster.api_client, self.hooks)
            self.cluster.wait_for(lambda: self.routed() is True, timeout=60, message="registered")
        elif arm == "limit":
            apply_objects(self.cluster.api_client, self.limit_hooks)
            calls = self.mutate_calls()
            self.cluster.wait_for(lambda: self.routed() is False and self.mutate_calls() > calls, timeout=60,
                                  message="the limit registered")
        else:
            admission = client.AdmissionregistrationV1Api(self.cluster.api_client)
            deletes = {"MutatingWebhookConfiguration": admission.delete_mutating_webhook_configuration,
                       "ValidatingWebhookConfiguration": admission.delete_validating_webhook_configuration}
            for kind, delete in deletes.items():
                if kind in dyn_kinds:
                    try:
                        delete(RELEASE)
                    except ApiException as error:
                        if error.status != 404:  # already unregistered (the previous block's arm)
                            raise
            self.cluster.wait_for(lambda: self.routed() is False, timeout=60, message="unregistered")
        time.sleep(1.0)  # every kube-apiserver watch of the configurations has caught up

    def mutate_calls(self) -> float:
        return total(self.webhook_metrics(), f"{WEBHOOK_METRIC}_count", name="pods.mutate.gpu.kubeon.io")

    def clear(self) -> None:
        """Delete the namespace's pods (none is bound: they go at once) and wait until they are gone."""
        core = self.cluster.core
        core.delete_collection_namespaced_pod(NAMESPACE, grace_period_seconds=0)
        self.cluster.wait_for(lambda: not json.loads(core.list_namespaced_pod(
            NAMESPACE, limit=1, _preload_content=False).data)["items"], timeout=120, message="pods deleted")

    def webhook_metrics(self) -> str:
        context = self.cluster.plane.ssl_context()
        conn = http.client.HTTPSConnection("127.0.0.1", self.cluster.plane.ports["apiserver"], context=context,
                                           timeout=30)
        conn.request("GET", "/metrics")
        return conn.getresponse().read().decode()

    def summary(self, results: dict[str, list[float]], errors: dict[str, int]) -> None:
        reg, unreg = stats_ms(results["registered"]), stats_ms(results["unregistered"])
        out: dict[str, Any] = {"summary": True, "rate": self.rate, "seconds_per_block": self.seconds,
                               "rounds": self.rounds, "registered": reg, "unregistered": unreg,
                               "p50_ratio": round(reg["p50"] / unreg["p50"], 3),
                               "p99_ratio": round(reg["p99"] / unreg["p99"], 3),
                               "errors": errors, "load_avg": load_avg(), "apiserver_webhook_calls":
                                   webhook_calls(self.webhook_metrics())}
        for arm in ("limit", "down"):
            if arm in results:
                out[arm] = stats_ms(results[arm])
                out[f"{arm}_p99_ratio"] = round(out[arm]["p99"] / unreg["p99"], 3)
        print(json.dumps(out), flush=True)


WEBHOOK_METRIC = "apiserver_admission_webhook_admission_duration_seconds"


def webhook_calls(text: str) -> dict[str, Any]:
    """kube-apiserver's histogram of each of our webhook's calls: count, mean ms, the upper bounds (ms) of
    the buckets holding its p99 and its max."""
    out: dict[str, Any] = {}
    names = {labels["name"] for labels, _ in samples(text, f"{WEBHOOK_METRIC}_count")
             if labels.get("name", "").endswith("gpu.kubeon.io") and "pods" in labels.get("name", "")}
    for name in sorted(names):
        count = total(text, f"{WEBHOOK_METRIC}_count", name=name)
        seconds = total(text, f"{WEBHOOK_METRIC}_sum", name=name)
        buckets = sorted(((float(labels["le"]), v) for labels, v in samples(text, f"{WEBHOOK_METRIC}_bucket")
                          if labels.get("name") == name), key=lambda b: b[0])
        merged: dict[float, float] = {}
        for le, v in buckets:
            merged[le] = merged.get(le, 0.0) + v
        p99 = next((le for le, v in sorted(merged.items()) if v >= 0.99 * count), float("inf"))
        top = next((le for le, v in sorted(merged.items()) if v >= count), float("inf"))
        out[name] = {"calls": int(count), "mean_ms": round(1000 * seconds / count, 2) if count else None,
                     "p99_le_ms": 1000 * p99, "max_le_ms": 1000 * top}
    return out


def webhook_delta(before: str, after: str) -> dict[str, Any]:
    """`webhook_calls` of one block: the counts and the mean of the calls made in it."""
    a, b = webhook_calls(before), webhook_calls(after)
    out = {}
    for name, now in b.items():
        was = a.get(name, {"calls": 0, "mean_ms": 0.0})
        calls = now["calls"] - was["calls"]
        total_ms = now["calls"] * (now["mean_ms"] or 0.0) - was["calls"] * (was["mean_ms"] or 0.0)
        out[name.split(".")[0] + "." + name.split(".")[1]] = {"calls": calls,
                                                              "mean_ms": round(total_ms / calls, 2) if calls else None}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=50.0, help="creates per second (default 50)")
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds per block (default 20)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of (registered, unregistered) blocks")
    parser.add_argument("--down", action="store_true", help="also a block with the webhook registered but stopped")
    parser.add_argument("--limit", action="store_true",
                        help="also blocks with the limit registered in its place (bench/echo.py --admission)")
    parser.add_argument("--keep-state", action="store_true", help="keep the cluster's folder (logs) and print it")
    args = parser.parse_args(argv)
    for flag, value in (("--rate", args.rate), ("--seconds", args.seconds), ("--rounds", args.rounds)):
        if not value > 0:
            print(f"error: {flag} must be positive, got {value}", file=sys.stderr)
            return 2

    def log(text: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)

    log(f"load {load_avg()}, {os.cpu_count()} CPUs")
    return Bench(args.rate, args.seconds, args.rounds, args.down, args.limit, log, args.keep_state).run()


if __name__ == "__main__":
    sys.exit(main())
