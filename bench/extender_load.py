"""Latency benchmark for the scheduler extender: filter + prioritize of one pod at 1,213 to 15,000 nodes.

For each cluster size: starts the real kube-apiserver v1.35.4 with etcd (tests/cluster, api_only:
no controller-manager, whose node-lifecycle controller would taint nodes no kubelet reports for),
creates through it the openb GPU nodes (1,213 from
vendor/openb/openb_node_list_gpu_node.csv; for 5,000 the list is
repeated with suffixed names) and binds whole-GPU pods to about half of
them (pods created with spec.nodeName), then starts `kubeon-gpu extender`
(gunicorn, 1 worker, watching that server) and plays kube-scheduler:
for each of --requests pods, POST /filter with the NodeNames kube-scheduler
would send (nodeCacheCapable) and POST /prioritize with the names that
passed, over one keep-alive connection, sequentially (kube-scheduler calls
an extender one pod at a time).

Which NodeNames (--kinds; each kind is run and printed apart):
- `sampled` (what the shipped chart makes kube-scheduler send): upstream's
  findNodesThatPassFilters runs its own filters from where the last search
  stopped and stops at numFeasibleNodesToFind feasible nodes; only those go
  to the extender (findNodesThatPassExtenders). The count comes from the
  rendered profile (manifests/rendered/scheduler.yaml, read by
  simulator.kubescheduler.Profile; `percentageOfNodesToScore` unset there:
  adaptive, max(100, 5% of N) at 15,000 nodes) and the filters and the
  rotating start are the stand-in's (simulator.kubescheduler.ClusterScores
  .feasible/.sample), the same code the stand-in scheduler in the tests runs.
- `full`: the same with percentageOfNodesToScore 100, every node
  kube-scheduler's filters pass: the worst case a profile can ask for.
- `all`: every node name, feasible or not (this benchmark before the sampled
  kind; no kube-scheduler sends it, kept to compare with earlier runs).
The model's node cache is not told of the pods the benchmark places (the
extender assumes them; nothing is bound), so ours and the limit get the very
same requests.

Measured per request:
- server: the `X-Kubeon-Handler-Seconds` header (parse -> decide -> serialise
  inside the handler, wall clock);
- server CPU: the `X-Kubeon-Handler-Cpu-Seconds` header (the handling
  thread's CPU time over the same span: the cost without CPU contention,
  which matters on a shared machine), plus /prioritize's
  `X-Kubeon-Ahead-Cpu-Seconds` (its decision, worked out after /filter's
  answer went out);
- client: the HTTP round trip seen by the caller (adds gunicorn, the socket
  and the client's own JSON work; client and server share the 2 cores).

Every prioritize assumes the pod on the chosen node (none is ever bound), so
the model changes one row per request, as in a live cluster.

--churn RATE: node status reports during the measured runs, RATE per second
(a status update of the next node in turn, its Ready condition's
lastHeartbeatTime: a MODIFIED event on the extender's node watch). Without
it the API server sends nothing while the benchmark runs and the extender's
watch threads sit idle. The kubelet reports a node's status every
nodeStatusReportFrequency (5 min) when nothing changes: 15,000 nodes send 50
a second. The updates are PATCHes of nodes/status through the real API
server, as kubelets send them (in a cluster the API server runs elsewhere,
not on the extender's cores: --pin keeps it off them); the bench's nodes are
1.1 KiB of JSON, real ones 5-20 KiB (status.images).

--echo N: after a first run, start the limit (bench/echo.py: the same
gunicorn settings, 1 worker, a plain WSGI callable that parses the
ExtenderArgs and answers constant bytes) and run
N interleaved pairs (ours, limit) of the same pods (the limit answering
ours' median-sized answer of each verb); print medians, the
ratios and the answer sizes. The limit has no handler timing header, so the
comparison is the client round trip.

    python bench/extender_load.py --sizes 1213 5000 --requests 300
    python bench/extender_load.py --sizes 15000 --requests 200 --echo 3 --kinds full
    python bench/extender_load.py --sizes 5000,15000 --requests 200 --echo 3
    python bench/extender_load.py --sizes 15000 --kinds sampled --requests 200 --echo 3 --churn 50

--pin: the servers (ours and the limit) on cores of their own, this client
and the real API server (with etcd) on the last core (sched_setaffinity; at least 2
cores). In a cluster kube-scheduler and the API server run in other pods,
most often on other nodes; without --pin the client's JSON work and the
server's requests queue for the same two cores, and the client's wait for a
core counts in the round trip of both servers.

    python bench/extender_load.py --sizes 15000 --kinds sampled --requests 300 --echo 3 --pin
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402
from kubernetes import config  # noqa: E402

from bench.cluster_replay import drained  # noqa: E402
from cli.livereplay import load_scheduler_config  # noqa: E402
from simulator.kubescheduler import ClusterScores, Profile  # noqa: E402
from tests.cluster.control_plane import ControlPlane, remove_state, scratch_dir  # noqa: E402
from tests.cluster.kubeon import apply_objects  # noqa: E402
from tests.cluster.objects import OPENB_NODES_CSV, make_pod, nodes_from_openb  # noqa: E402

CRD = ROOT / "manifests" / "crd" / "gpupolicies.gpu.kubeon.io.yaml"
GPU_CHOICES = (1, 1, 1, 1, 2, 2, 4, 8)
KINDS = ("sampled", "full", "all")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cluster_nodes(size: int) -> list[dict[str, Any]]:
    base = nodes_from_openb(OPENB_NODES_CSV)
    out: list[dict[str, Any]] = []
    copy = 0
    while len(out) < size:
        for node in base:
            if len(out) >= size:
                break
            node = json.loads(json.dumps(node))
            if copy:
                name = f"{node['metadata']['name']}-c{copy}"
                node["metadata"]["name"] = name
                node["metadata"]["labels"]["kubernetes.io/hostname"] = name
            out.append(node)
        copy += 1
    return out


def populate(kubeconfig: Path, nodes: list[dict[str, Any]], rng: random.Random,
             threads: int = 8) -> list[dict[str, Any]]:
    """Create the nodes, then pods bound to about half of them (spec.nodeName), through the real
    kube-apiserver, `threads` requests at a time."""
    bound: list[dict[str, Any]] = []
    for node in nodes:
        gpus = int(node["status"]["allocatable"].get("nvidia.com/gpu", "0"))
        if gpus and rng.random() < 0.5:
            take = rng.randint(1, gpus)
            pod = make_pod(f"load-{len(bound)}", "default", gpus=take, cpu=f"{take * 4}", memory=f"{take * 16}Gi")
            pod["spec"]["nodeName"] = node["metadata"]["name"]
            bound.append(pod)
    core = core_api(kubeconfig, threads)
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda n: drained(core.create_node(n, _preload_content=False)), nodes))
        list(pool.map(lambda p: drained(core.create_namespaced_pod("default", p, _preload_content=False)), bound))
    return bound


def core_api(kubeconfig: Path, pool: int = 4) -> Any:
    from kubernetes import client, config
    configuration = client.Configuration()
    config.load_kube_config(str(kubeconfig), client_configuration=configuration)
    configuration.connection_pool_maxsize = pool
    return client.CoreV1Api(client.ApiClient(configuration))


class Churn:
    """Node status reports at `rate` per second, as kubelets send them: a PATCH of nodes/status
    (the Ready condition's lastHeartbeatTime), a MODIFIED event on the extender's node watch."""

    def __init__(self, kubeconfig: Path, names: list[str], rate: float) -> None:
        self.core, self.names, self.rate = core_api(kubeconfig), names, rate
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="churn", daemon=True)

    def start(self) -> Churn:
        if self.rate > 0:
            self._thread.start()
        return self

    def stop(self) -> int:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        return self.sent

    def _run(self) -> None:
        interval, due = 1.0 / self.rate, time.monotonic()
        while not self._stop.wait(max(0.0, due - time.monotonic())):
            name = self.names[self.sent % len(self.names)]
            beat = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            self.core.patch_node_status(name, {"status": {"conditions": [
                {"type": "Ready", "status": "True", "reason": "KubeletReady", "lastHeartbeatTime": beat}]}},
                _preload_content=False)
            self.sent += 1
            due += interval


class ApiProcess:
    """The real kube-apiserver (with etcd; no controller-manager, whose node-lifecycle controller would
    taint nodes no kubelet reports for) holding the cluster: `kubeconfig`, `bound`; `churn`/`calm`."""

    def __init__(self, size: int, seed: int) -> None:
        self.plane = ControlPlane(scratch_dir("extender-bench-api-")).start(api_only=True)
        self.kubeconfig = self.plane.kubeconfig
        with config.new_client_from_config(str(self.kubeconfig)) as api:
            apply_objects(api, [yaml.safe_load(CRD.read_text())])
        nodes = cluster_nodes(size)
        started = time.perf_counter()
        self.bound = populate(self.kubeconfig, nodes, random.Random(seed))
        self.setup_s = time.perf_counter() - started
        self.names = [n["metadata"]["name"] for n in nodes]
        self._churn: Churn | None = None

    def churn(self, rate: float) -> None:
        self._churn = Churn(self.kubeconfig, self.names, rate).start()

    def calm(self) -> int:
        sent = self._churn.stop() if self._churn is not None else 0
        self._churn = None
        return sent

    def close(self) -> None:
        self.plane.stop()
        remove_state(self.plane.root)


def requests_for(nodes: list[dict[str, Any]], bound: list[dict[str, Any]], kind: str, count: int,
                 seed: int) -> list[tuple[dict[str, Any], list[str]]]:
    """`count` pods and the NodeNames kube-scheduler sends the extender for each (see the module doc)."""
    rng = random.Random(seed)
    pods = []
    for i in range(count):
        gpus = rng.choice(GPU_CHOICES)
        pod = make_pod(f"bench-{i}", "default", gpus=gpus, cpu=f"{gpus * 4}", memory=f"{gpus * 16}Gi")
        pod["metadata"]["uid"] = f"uid-{seed}-{i}"
        pods.append(pod)
    all_names = [n["metadata"]["name"] for n in nodes]
    if kind == "all":
        return [(pod, all_names) for pod in pods]
    cluster = ClusterScores(nodes)
    for pod in bound:
        cluster.add(pod, pod["spec"]["nodeName"])
    percentage = 100 if kind == "full" else Profile.from_config(load_scheduler_config()).percentage_of_nodes_to_score
    out = []
    for pod in pods:  # nextStartNodeIndex moves on from request to request, as upstream's does
        picked = cluster.sample(cluster.feasible(pod), percentage).tolist()
        out.append((pod, [cluster.names[i] for i in picked]))
    return out


def percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)

    def pct(p: float) -> float:
        return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))] * 1000

    return {"p50": pct(50), "p90": pct(90), "p99": pct(99), "max": ordered[-1] * 1000,
            "mean": statistics.fmean(ordered) * 1000}


def post(conn: http.client.HTTPConnection, path: str,
         body: dict[str, Any]) -> tuple[Any, float, float, float, bytes]:
    data = json.dumps(body, separators=(",", ":")).encode()  # compact, as Go's encoding/json writes it
    started = time.perf_counter()
    conn.request("POST", path, body=data, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    payload = resp.read()
    elapsed = time.perf_counter() - started
    if resp.status != 200:
        raise RuntimeError(f"{path}: HTTP {resp.status}: {payload[:200]!r}")
    # the CPU /prioritize's decision took after /filter's answer went out counts as the pod's too
    cpu = float(resp.getheader("X-Kubeon-Handler-Cpu-Seconds") or "nan")
    cpu += float(resp.getheader("X-Kubeon-Ahead-Cpu-Seconds") or "0")
    return (json.loads(payload), elapsed, float(resp.getheader("X-Kubeon-Handler-Seconds") or "nan"), cpu, payload)


def start_extender(port: int, kubeconfig: str) -> tuple[subprocess.Popen, Path]:
    """`kubeon-gpu extender` as the chart runs it: one worker, told the weight the rendered profile gives it."""
    log = Path(tempfile.mkdtemp(prefix="extender-bench-")) / "extender.log"
    weight = next(e.weight for e in Profile.from_config(load_scheduler_config()).extenders if e.prioritize_verb)
    with open(log, "wb") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "cli.main", "extender", "--port", str(port),
                                 "--bind", "127.0.0.1", "--kubeconfig", kubeconfig, "--workers", "1",
                                 "--scheduler-weight", str(weight), "--log-level", "WARNING"],
                                cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"}, preexec_fn=_on_server_cores)
    return proc, log


def start_echo(port: int, answers: dict[str, bytes]) -> tuple[subprocess.Popen, Path]:
    """The limit: bench/echo.py with ours' settings (1 worker, no TLS) answering ours' bytes."""
    tmp = Path(tempfile.mkdtemp(prefix="extender-echo-"))
    command = [sys.executable, str(ROOT / "bench" / "echo.py"), "--port", str(port), "--workers", "1"]
    for path, body in answers.items():
        (tmp / path.strip("/")).write_bytes(body)
        command += ["--answer", f"{path}={tmp / path.strip('/')}"]
    log = tmp / "echo.log"
    with open(log, "wb") as sink:
        proc = subprocess.Popen(command, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT,
                                preexec_fn=_on_server_cores)
    return proc, log


SERVER_CPUS: set[int] = set()  # --pin: the cores the servers run on (empty: any)


def _on_server_cores() -> None:
    """In the server's child before exec: onto `SERVER_CPUS` (--pin)."""
    if SERVER_CPUS:
        os.sched_setaffinity(0, SERVER_CPUS)


def pin(parser: argparse.ArgumentParser) -> str:
    """--pin: this process (and the API server and etcd it starts) on the last core, the servers on the others."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        parser.error(f"--pin: needs at least 2 cores, this process may use {len(cpus)}")
    SERVER_CPUS.update(cpus[:-1])
    os.sched_setaffinity(0, {cpus[-1]})
    return f"servers on cores {','.join(map(str, cpus[:-1]))}, client and API server on core {cpus[-1]}"


def wait_ready(proc: subprocess.Popen, log: Path, port: int) -> None:
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            raise RuntimeError(log.read_text())
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.request("GET", "/readyz")
            ready = conn.getresponse()
            ready.read()
            if ready.status == 200:
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError("server not ready:\n" + log.read_text())
        time.sleep(0.2)


def drive(port: int, pods: list[tuple[dict[str, Any], list[str]]], warmup: int) -> dict[str, Any]:
    """Play kube-scheduler for `pods` (filter the names, then prioritize the passed ones); the first
    `warmup` are not counted."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    server_f, server_p, server_sum, client_sum, cpu_sum = [], [], [], [], []
    placed = 0
    sizes: dict[str, list[int]] = {"filter": [], "prioritize": [], "request": []}
    answers: dict[str, list[bytes]] = {"/filter": [], "/prioritize": []}
    for i, (pod, names) in enumerate(pods):
        sizes["request"].append(len(names))
        result, c_f, s_f, u_f, raw = post(conn, "/filter", {"Pod": pod, "Nodes": None, "NodeNames": names})
        answers["/filter"].append(raw)
        passed = result["NodeNames"] or []
        c_p = s_p = u_p = 0.0
        if passed:
            scores, c_p, s_p, u_p, raw_p = post(conn, "/prioritize", {"Pod": pod, "Nodes": None, "NodeNames": passed})
            answers["/prioritize"].append(raw_p)
            sizes["prioritize"].append(len(raw_p))
            placed += i >= warmup and any(e["Score"] == 10 for e in scores)
        sizes["filter"].append(len(raw))
        if i >= warmup:
            server_f.append(s_f)
            server_p.append(s_p)
            server_sum.append(s_f + s_p)
            client_sum.append(c_f + c_p)
            cpu_sum.append(u_f + u_p)
    return {"requests": len(pods) - warmup, "placed": placed, "names": statistics.median(sizes["request"]),
            "server_filter_ms": percentiles(server_f),
            "server_prioritize_ms": percentiles(server_p), "server_total_ms": percentiles(server_sum),
            "server_cpu_total_ms": percentiles(cpu_sum), "client_total_ms": percentiles(client_sum),
            "filter_answer_kib": statistics.median(sizes["filter"]) / 1024,
            "prioritize_answer_kib": statistics.median(sizes["prioritize"] or [0]) / 1024,
            "load_average": os.getloadavg()[0],
            # the median-sized answer per verb: what the limit answers every time
            "_last": {verb: sorted(got, key=len)[len(got) // 2] for verb, got in answers.items() if got}}


def run_size(size: int, kinds: list[str], requests: int, warmup: int, seed: int,
             pairs: int = 0, churn: float = 0.0) -> list[dict[str, Any]]:
    """One cluster size, one extender process: per kind, ours alone, or `pairs` interleaved (ours, limit)
    runs of the same requests (a limit started per kind, answering ours' median-sized answers)."""
    nodes = cluster_nodes(size)
    out: list[dict[str, Any]] = []
    api = ApiProcess(size, seed)
    try:
        bound = api.bound
        port = free_port()
        proc, log = start_extender(port, str(api.kubeconfig))
        try:
            wait_ready(proc, log, port)

            def timed(at: int, stream: list[tuple[dict[str, Any], list[str]]]) -> dict[str, Any]:
                api.churn(churn)
                started = time.perf_counter()
                try:
                    run = drive(at, stream, warmup)
                finally:
                    run_s = time.perf_counter() - started
                    sent = api.calm()
                run["churn_per_s"] = sent / run_s
                return run

            for kind in kinds:
                total = warmup + requests
                ours = timed(port, requests_for(nodes, bound, kind, total, seed))
                request_kib = statistics.median(
                    len(json.dumps({"Pod": None, "Nodes": None, "NodeNames": names}, separators=(",", ":")))
                    for _, names in requests_for(nodes, bound, kind, 20, seed)) / 1024
                result = {"nodes": size, "kind": kind, "bound_pods": len(bound), "setup_s": round(api.setup_s, 1),
                          "request_kib": request_kib, "churn_per_s": ours["churn_per_s"]}
                if not pairs:
                    ours.pop("_last")
                    out.append({**result, **ours})
                    continue
                echo_port = free_port()
                echo = start_echo(echo_port, ours["_last"])
                try:
                    wait_ready(echo[0], echo[1], echo_port)
                    runs: dict[str, list[dict[str, Any]]] = {"ours": [], "limit": []}
                    for pair in range(pairs):
                        stream = requests_for(nodes, bound, kind, total, seed + 1 + pair)
                        for who, at in (("ours", port), ("limit", echo_port)):
                            run = timed(at, stream)
                            run.pop("_last")
                            runs[who].append(run)
                            print(f"  {kind} pair {pair + 1} {who:<5} client p50/p99 "
                                  f"{run['client_total_ms']['p50']:.2f} / {run['client_total_ms']['p99']:.2f} ms, "
                                  f"load {run['load_average']:.1f}", flush=True)
                finally:
                    echo[0].terminate()
                    echo[0].wait(timeout=15)
                out.append({**result, "pairs": runs})
                print_pairs(out[-1])
        finally:
            proc.terminate()
            proc.wait(timeout=15)
    finally:
        api.close()
    return out


def print_pairs(result: dict[str, Any]) -> None:
    runs = result["pairs"]
    size = result["nodes"]
    print(f"{size} nodes, {result['kind']} NodeNames ({runs['ours'][0]['names']:.0f} names, request "
          f"{result['request_kib']:.0f} KiB; {result['bound_pods']} bound pods, set up in {result['setup_s']} s); "
          f"answers filter {runs['ours'][0]['filter_answer_kib']:.1f} KiB, prioritize "
          f"{runs['ours'][0]['prioritize_answer_kib']:.1f} KiB (median); node status reports during the runs "
          f"{result['churn_per_s']:.0f}/s; medians over {len(runs['ours'])} pairs, ratio = ours / limit:")
    for key in ("client_total_ms", "server_total_ms", "server_cpu_total_ms"):
        for pct in ("p50", "p99"):
            ours = statistics.median(r[key][pct] for r in runs["ours"])
            limit = statistics.median(r[key][pct] for r in runs["limit"])
            note = " (goal <= 5 ms)" if key == "client_total_ms" and pct == "p99" else ""
            print(f"  {key:<22} {pct}: ours {ours:7.2f} ms, limit {limit:7.2f} ms, ratio {ours / limit:5.2f}{note}"
                  if limit == limit else f"  {key:<22} {pct}: ours {ours:7.2f} ms (the limit has no handler)")
            if key != "client_total_ms":
                break


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["1213", "5000"],
                        help="cluster sizes, space- or comma-separated (5000,15000)")
    parser.add_argument("--kinds", default="sampled,full",
                        help=f"which NodeNames to send, comma-separated, from {', '.join(KINDS)} (module doc)")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--echo", type=int, metavar="PAIRS", default=0,
                        help="interleave this many (ours, limit) runs per size against bench/echo.py")
    parser.add_argument("--churn", type=float, metavar="RATE", default=0.0,
                        help="node status reports per second during the runs (module doc; 50: 15,000 kubelets)")
    parser.add_argument("--pin", action="store_true",
                        help="the servers on cores of their own, the client on another (module doc)")
    args = parser.parse_args()
    try:
        sizes = [int(part) for item in args.sizes for part in str(item).split(",") if part]
    except ValueError:
        parser.error(f"--sizes: expected node counts such as 5000,15000, got {' '.join(args.sizes)}")
    if args.churn < 0:
        parser.error(f"--churn: expected a rate of 0 or more per second, got {args.churn}")
    kinds = [k for k in args.kinds.split(",") if k]
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        parser.error(f"--kinds: expected some of {', '.join(KINDS)}, got {args.kinds!r}")
    if args.pin:
        print(pin(parser), flush=True)
    for size in sizes:
        results = run_size(size, kinds, args.requests, args.warmup, args.seed, args.echo, args.churn)
        if args.echo:
            continue
        for result in results:
            print(json.dumps(result, default=lambda v: round(v, 3)))
            for key in ("server_filter_ms", "server_prioritize_ms", "server_total_ms", "server_cpu_total_ms",
                        "client_total_ms"):
                p = result[key]
                print(f"  {size:>5} nodes {result['kind']:<7} {key:<22} p50 {p['p50']:7.2f}  p90 {p['p90']:7.2f}"
                      f"  p99 {p['p99']:7.2f}  max {p['max']:7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
