"""Load benchmark for the admission webhook over TLS (not a timed test).

Starts `kubeon-gpu webhook` (gunicorn gthread, TLS from certs/ generated on
the fly, static policies) unless --url is given, then drives POST /mutate
with kube-apiserver-shaped AdmissionReviews that get rewritten to MIG:

- max: C client processes x T threads, each thread with its own keep-alive
  HTTPS connection (http.client), closed loop for --seconds;
- rate: the same clients paced to a fixed total rate (default 500/s),
  latency measured from the scheduled send time (no coordinated omission).

--pods picks what the clients send (webhook.memo decides each distinct pod once
per view, so a benchmark of one repeated pod would measure the memo alone):
- same: one review, byte for byte, every time (the benchmark before the memo);
- replicas (default): the pods of 16 Deployments (4 GPU memory sizes; 12
  ask for 1 GPU, 4 for 2), in turn, each request with its own uid and a
  managedFields stamp that moves every 20 requests, as the API server sends
  replicas;
- unique: every pod an Indexed Job's, with its own completion index (label
  and annotation): distinct bytes, one decision input
  (gpupolicy.admission.replicas), so the memo answers after the first;
- distinct: every pod different in what the decision reads (its container's
  name, which the rewritten-from annotation records): the memo never
  answers, every request runs the whole decision.

- wrk (with --wrk, when Debian's `wrk` is installed): the max phase driven by
  a C load generator, so far less of the 2 cores goes to the client than with
  Python's http.client + ssl. wrk does not verify the server certificate.

Prints requests/s and p50/p90/p99 latency. The load generator shares the
machine's cores with the server: on a 2-core box it takes CPU from it.

--echo N: also start the limit (bench/echo.py: the same gunicorn, TLS and
worker settings, a plain WSGI callable that parses the review and answers
the constant bytes ours answered for it) and run N interleaved pairs
(ours max, limit max, ours paced, limit paced), then print medians and the
ratios ours/limit. Both servers stay up; the idle one costs nothing.

    python bench/webhook_load.py --seconds 10 --rate 500
    python bench/webhook_load.py --seconds 8 --echo 3 [--pods same|replicas|unique|distinct]
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import multiprocessing as mp
import os
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from certs.material import generate  # noqa: E402
from tests.webhook.payloads import POLICIES, api_pod, review  # noqa: E402

PODS = ("same", "replicas", "unique", "distinct")
_UID, _STAMP, _INDEX = "@UID@", "2026-11-30T10:00:@STAMP@Z", "@INDEX@"  # replaced per request


def body_maker(pods: str) -> Callable[[int], bytes]:
    """Request n's body for the --pods mix (see the module docstring); cheap: bytes replaced in a template."""
    if pods == "same":
        same = json.dumps(review(api_pod())).encode()
        return lambda n: same
    if pods == "replicas":
        sizes = ("4Gi", "8Gi", "16Gi", "30Gi")
        pods_of = [api_pod("1" if i < 12 else "2", annotations={"gpu.kubeon.io/gpu-memory": sizes[i % 4]},
                           labels={"app": f"llm-{i}", "pod-template-hash": f"{i:09d}"}) for i in range(16)]
    elif pods == "unique":
        pods_of = [api_pod(annotations={"batch.kubernetes.io/job-completion-index": _INDEX},
                           labels={"batch.kubernetes.io/job-completion-index": _INDEX})]
    else:
        pods_of = [api_pod()]
        pods_of[0]["spec"]["containers"][0]["name"] = f"server-{_INDEX}"
    for pod in pods_of:
        pod["metadata"]["managedFields"][0]["time"] = _STAMP
    templates = [json.dumps(review(pod, uid=_UID)).encode() for pod in pods_of]
    tag = os.getpid()

    def make(n: int) -> bytes:
        body = templates[n % len(templates)].replace(_UID.encode(), f"{tag}-{n}".encode())
        body = body.replace(_STAMP.encode(), f"2026-11-30T10:{n // 20 // 60 % 60:02d}:{n // 20 % 60:02d}Z".encode())
        return body.replace(_INDEX.encode(), str(n).encode()) if pods in ("unique", "distinct") else body

    return make


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(workers: int, threads: int, echo_answer: bytes | None = None,
                 tmp: Path | None = None, root: Path = ROOT, prefix: Sequence[str] = (),
                 ready_seconds: float = 30) -> tuple[subprocess.Popen, int, str, Path]:
    """Ours (`kubeon-gpu webhook` of the checkout at `root`), or with `echo_answer` the limit
    (bench/echo.py) on the same certs; `prefix`: a command to run it under (valgrind)."""
    import yaml

    if tmp is None:
        tmp = Path(tempfile.mkdtemp(prefix="kubeon-bench-"))
        generate("kubeon-gpu-optimizer-webhook", "kubeon-gpu", tmp, ip_addresses=["127.0.0.1"])
        (tmp / "policies.yaml").write_text(yaml.safe_dump_all(POLICIES))
    port = free_port()
    if echo_answer is not None:
        (tmp / "answer.json").write_bytes(echo_answer)
        command = [sys.executable, str(ROOT / "bench" / "echo.py"), "--cert-dir", str(tmp), "--port", str(port),
                   "--workers", str(workers), "--threads", str(threads), "--answer",
                   f"/mutate={tmp / 'answer.json'}"]
    else:
        command = [sys.executable, "-m", "cli.main", "webhook", "--cert-dir", str(tmp), "--bind", "127.0.0.1",
                   "--port", str(port), "--workers", str(workers), "--threads", str(threads),
                   "--policies", str(tmp / "policies.yaml"),
                   # an install with prometheus.url (never queried by the webhook): the sharing policy rewrites
                   "--prometheus-url", "http://127.0.0.1:9"]
    proc = subprocess.Popen([*prefix, *command], cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ca = str(tmp / "ca.crt")
    deadline = time.monotonic() + ready_seconds
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPSConnection("127.0.0.1", port, context=ssl.create_default_context(cafile=ca),
                                               timeout=1)
            conn.request("GET", "/healthz")
            if conn.getresponse().status == 200:
                return proc, port, ca, tmp
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("server did not start")


def client_proc(port: int, ca: str, threads: int, seconds: float, rate: float, out: mp.Queue,
                pods: str = "replicas") -> None:
    """One load process: `threads` keep-alive connections; rate 0 = closed loop."""
    make = body_maker(pods)
    counter = itertools.count()
    headers = {"Content-Type": "application/json"}
    context = ssl.create_default_context(cafile=ca)
    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()
    start_at = time.perf_counter() + 0.5

    def worker(index: int) -> None:
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
        conn.connect()
        mine: list[float] = []
        interval = threads / rate if rate else 0.0
        next_send = start_at + (index * interval / threads if rate else 0.0)
        end = start_at + seconds
        while True:
            now = time.perf_counter()
            if rate:
                if next_send > now:
                    time.sleep(next_send - now)
                scheduled = next_send
                next_send += interval
            else:
                scheduled = now
            if scheduled >= end:
                break
            try:
                conn.request("POST", "/mutate", make(next(counter)), headers)
                resp = conn.getresponse()
                resp.read()
                if resp.status != 200:
                    errors[0] += 1
            except (OSError, http.client.HTTPException):
                errors[0] += 1
                conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
            mine.append(time.perf_counter() - scheduled)
        with lock:
            latencies.extend(mine)

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    out.put((latencies, errors[0]))


def percentile(latencies: list[float], p: float) -> float:
    """The p-th percentile of sorted latencies in seconds, in ms."""
    return latencies[min(len(latencies) - 1, int(p / 100 * len(latencies)))] * 1000 if latencies else 0.0


def run(port: int, ca: str, procs: int, threads: int, seconds: float, rate: float,
        pods: str = "replicas", keep: list[float] | None = None) -> dict[str, float]:
    """One phase; its latencies (seconds) are also appended to `keep` when given."""
    queue: mp.Queue = mp.Queue()
    per_proc_rate = rate / procs if rate else 0.0
    children = [mp.Process(target=client_proc, args=(port, ca, threads, seconds, per_proc_rate, queue, pods))
                for _ in range(procs)]
    for c in children:
        c.start()
    latencies: list[float] = []
    errors = 0
    for _ in children:
        got, errs = queue.get()
        latencies.extend(got)
        errors += errs
    for c in children:
        c.join()
    latencies.sort()
    if keep is not None:
        keep.extend(latencies)
    return {"requests": len(latencies), "errors": errors, "rps": len(latencies) / seconds,
            "p50_ms": percentile(latencies, 50), "p90_ms": percentile(latencies, 90),
            "p99_ms": percentile(latencies, 99), "max_ms": latencies[-1] * 1000}


def answer_of(port: int, ca: str) -> bytes:
    """The bytes ours answers for the benchmark's review (the limit answers the same)."""
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ssl.create_default_context(cafile=ca), timeout=10)
    # one uid: two servers' answers compare equal when their decisions do (bench/webhook_cpu.py --against)
    conn.request("POST", "/mutate", json.dumps(review(api_pod(), uid=_UID)).encode(),
                 {"Content-Type": "application/json"})
    resp = conn.getresponse()
    body = resp.read()
    if resp.status != 200 or b'"patch"' not in body:
        raise SystemExit(f"ours did not rewrite the review: HTTP {resp.status} {body[:200]!r}")
    return body


def echo_pairs(args: argparse.Namespace, ours: tuple[int, str], limit: tuple[int, str]) -> None:
    """`args.echo` interleaved pairs, each: ours max, limit max, ours paced, limit paced; medians, ratios.

    The paced latencies are also pooled over the pairs: on a shared VM one slow
    phase moves that phase's p99 (and so the median of a few pairs), while
    interleaving gives both servers the same chance of meeting one; pooled,
    each side's p99 is taken over the same spread of slow and quiet phases.
    Neither figure settles a small difference on a noisy hour: run more pairs."""
    rows: dict[str, list[dict[str, float]]] = {"ours max": [], "limit max": [], "ours rate": [], "limit rate": []}
    pooled: dict[str, list[float]] = {"ours": [], "limit": []}
    for pair in range(1, args.echo + 1):
        for phase, rate, conns in (("max", 0.0, args.threads), ("rate", args.rate, args.rate_threads)):
            for who, (port, ca) in (("ours", ours), ("limit", limit)):
                r = run(port, ca, args.procs, conns, args.seconds, rate, args.pods,
                        keep=pooled[who] if phase == "rate" else None)
                rows[f"{who} {phase}"].append(r)
                print(f"pair {pair} {who:<5} {phase:<4}: {r['rps']:6.0f} req/s, p50 {r['p50_ms']:.2f} ms, "
                      f"p99 {r['p99_ms']:.2f} ms, errors {r['errors']}, load {os.getloadavg()[0]:.1f}", flush=True)

    def med(key: str, field: str) -> float:
        return statistics.median(r[field] for r in rows[key])

    print(f"medians over {args.echo} pairs (ratio = ours / limit):")
    o, li = med("ours max", "rps"), med("limit max", "rps")
    ratios = [a["rps"] / b["rps"] for a, b in zip(rows["ours max"], rows["limit max"], strict=True)]
    print(f"  max throughput: ours {o:.0f} req/s, limit {li:.0f} req/s, ratio {o / li:.2f} "
          f"(pairs {min(ratios):.2f}-{max(ratios):.2f}; goal >= 0.85)")
    for field in ("p50_ms", "p99_ms"):
        o, li = med("ours rate", field), med("limit rate", field)
        print(f"  {args.rate:.0f}/s {field[:3]}: ours {o:.2f} ms, limit {li:.2f} ms, ratio {o / li:.2f}"
              + (" (goal <= 1.2 and <= 5 ms)" if field == "p99_ms" else ""))
    for values in pooled.values():
        values.sort()
    for p in (50, 99):
        o, li = percentile(pooled["ours"], p), percentile(pooled["limit"], p)
        print(f"  {args.rate:.0f}/s p{p} pooled over the pairs ({len(pooled['ours'])} and {len(pooled['limit'])} "
              f"requests): ours {o:.2f} ms, limit {li:.2f} ms, ratio {o / li:.2f}")


def run_wrk(port: int, connections: int, seconds: float) -> str:
    """Closed-loop max throughput with wrk (1 thread, keep-alive connections); its own summary lines."""
    body = json.dumps(review(api_pod()))
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write('wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
                     f"wrk.body = {json.dumps(body)}\n")
    out = subprocess.run(["wrk", "-t1", f"-c{connections}", f"-d{int(seconds)}s", "--latency", "-s", script.name,
                          f"https://127.0.0.1:{port}/mutate"], capture_output=True, text=True, timeout=seconds + 30)
    os.unlink(script.name)
    keep = ("Requests/sec", "50%", "90%", "99%", "Non-2xx", "Socket errors")
    return "\n".join(line.strip() for line in out.stdout.splitlines() if line.strip().startswith(keep))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=500.0, help="fixed total rate for the paced run")
    parser.add_argument("--procs", type=int, default=1, help="load generator processes")
    parser.add_argument("--threads", type=int, default=8, help="keep-alive connections per process (max run)")
    parser.add_argument("--rate-threads", type=int, default=4, help="connections per process (paced run)")
    parser.add_argument("--server-workers", type=int, default=2)
    parser.add_argument("--server-threads", type=int, default=4)
    parser.add_argument("--only", choices=("max", "rate"), help="run one phase only")
    parser.add_argument("--pods", choices=PODS, default="replicas", help="what the clients send (above)")
    parser.add_argument("--echo", type=int, metavar="PAIRS", default=0,
                        help="run this many interleaved pairs against the limit (bench/echo.py)")
    parser.add_argument("--wrk", type=int, metavar="CONNECTIONS", default=0,
                        help="also drive the max phase with wrk and this many connections")
    args = parser.parse_args()
    proc, port, ca, tmp = start_server(args.server_workers, args.server_threads)
    echo = None
    try:
        print(f"machine: {os.cpu_count()} cores; server: gunicorn gthread {args.server_workers} workers x "
              f"{args.server_threads} threads, TLS; pods: {args.pods} (Pod CREATEs rewritten to MIG; 2-GPU "
              f"pods get the schedulerName only); "
              f"load average {os.getloadavg()[0]:.1f}")
        if args.echo:
            answer = answer_of(port, ca)
            echo = start_server(args.server_workers, args.server_threads, echo_answer=answer, tmp=tmp)
            print(f"limit: bench/echo.py, same settings, constant answer of {len(answer)} bytes")
            echo_pairs(args, (port, ca), (echo[1], echo[2]))
            return
        if args.only in (None, "max"):
            r = run(port, ca, args.procs, args.threads, args.seconds, 0.0, args.pods)
            print(f"max  ({args.procs}x{args.threads} keep-alive clients): {r['rps']:.0f} req/s, p50 "
                  f"{r['p50_ms']:.2f} ms, p90 {r['p90_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms, "
                  f"errors {r['errors']}")
        if args.wrk:
            print(f"wrk  (1 thread x {args.wrk} keep-alive connections, {args.seconds:.0f} s):")
            print(run_wrk(port, args.wrk, args.seconds))
        if args.only in (None, "rate"):
            r = run(port, ca, args.procs, args.rate_threads, args.seconds, args.rate, args.pods)
            print(f"rate ({args.rate:.0f}/s, {args.procs}x{args.rate_threads} clients): {r['rps']:.0f} req/s, "
                  f"p50 {r['p50_ms']:.2f} ms, p90 {r['p90_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms, "
                  f"max {r['max_ms']:.2f} ms, errors {r['errors']}")
    finally:
        for p in (proc, echo[0] if echo else None):
            if p is not None:
                p.send_signal(signal.SIGTERM)
                p.wait(10)


if __name__ == "__main__":
    main()
