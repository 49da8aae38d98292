"""Server CPU per /mutate request, ours against the limit (not a timed test).

Wall-clock benchmarks (bench/webhook_load.py) move with whatever else runs on
the machine; the CPU a server spends per request does not, much. This starts
ours and the limit exactly as bench/webhook_load.py --echo does (same gunicorn,
TLS, worker settings, certificates; the limit answers the bytes ours answered),
sends --requests POST /mutate (the --pods mix of bench/webhook_load.py) over
--conns keep-alive TLS connections from one client process, and reads utime +
stime of each server's whole process tree (gunicorn master and workers, every
thread) from /proc before and after.
Interleaved over --pairs rounds (ours, the limit, in turn); prints us of
server CPU per request for each, the difference, and the medians.

--against DIR: also start ours from another checkout (e.g. an export of main)
on the same certificates and policies, and take it in turn with the other
two: a change measured against what it changes, under the same conditions.
On a shared VM the CPU time a process is charged still moves with the load
(contended caches, the host's steal time), so prefer many short rounds
(--requests 2000 --pairs 10) and read the medians.

    python bench/webhook_cpu.py --requests 5000 --pairs 3 [--pods same|replicas|unique|distinct]
    python bench/webhook_cpu.py --requests 2000 --pairs 10 --against /tmp/main
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import os
import signal
import ssl
import statistics
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.webhook_load import PODS, answer_of, body_maker, start_server  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def tree(root: int) -> list[int]:
    """`root` and every process below it (gunicorn's master and its workers)."""
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                todo.extend(int(c) for c in (task / "children").read_text().split())
            except OSError:
                continue
    return found


def cpu_seconds(pids: list[int]) -> float:
    """utime + stime of `pids` (all their threads), in seconds."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    return total / TICK


def drive(port: int, ca: str, requests: int, conns: int, pods: str) -> int:
    """`requests` POST /mutate of the `pods` mix (bench/webhook_load.py --pods) over `conns` keep-alive
    connections; the number that failed."""
    make = body_maker(pods)
    counter = itertools.count()
    headers = {"Content-Type": "application/json"}
    context = ssl.create_default_context(cafile=ca)
    errors = [0]

    def one(count: int) -> None:
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
        for _ in range(count):
            conn.request("POST", "/mutate", make(next(counter)), headers)
            resp = conn.getresponse()
            resp.read()
            if resp.status != 200:
                errors[0] += 1
        conn.close()

    threads = [threading.Thread(target=one, args=(requests // conns,)) for _ in range(conns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors[0]


def per_request_us(pid: int, port: int, ca: str, requests: int, conns: int, pods: str) -> float:
    drive(port, ca, 200, conns, pods)  # warm: connections' first requests, lazy imports, label children
    pids = tree(pid)
    before = cpu_seconds(pids)
    errors = drive(port, ca, requests, conns, pods)
    used = cpu_seconds(pids) - before
    if errors:
        raise SystemExit(f"{errors} requests failed")
    return used / (requests // conns * conns) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--conns", type=int, default=1, help="keep-alive connections (threads) of the client")
    parser.add_argument("--server-workers", type=int, default=2)
    parser.add_argument("--server-threads", type=int, default=4)
    parser.add_argument("--pods", choices=PODS, default="replicas",
                        help="what the client sends (bench/webhook_load.py --pods)")
    parser.add_argument("--against", type=Path, metavar="DIR", help="also ours from this checkout, in turn")
    args = parser.parse_args()
    servers: dict[str, tuple[subprocess.Popen, int, str, Path]] = {}
    try:
        servers["ours"] = ours = start_server(args.server_workers, args.server_threads)
        if args.against:
            servers["against"] = start_server(args.server_workers, args.server_threads, tmp=ours[3],
                                              root=args.against)
        servers["limit"] = start_server(args.server_workers, args.server_threads,
                                        echo_answer=answer_of(ours[1], ours[2]), tmp=ours[3])
        if args.against and answer_of(*servers["against"][1:3]) != answer_of(ours[1], ours[2]):
            print(f"note: {args.against} answers differently from ours")
        print(f"{args.requests} POST /mutate ({args.pods} pods) per run over {args.conns} keep-alive TLS "
              f"connection(s); server: "
              f"gunicorn gthread {args.server_workers}x{args.server_threads}; load average "
              f"{os.getloadavg()[0]:.1f}", flush=True)
        rows: dict[str, list[float]] = {who: [] for who in servers}
        for pair in range(1, args.pairs + 1):
            for who, (proc, port, ca, _) in servers.items():
                rows[who].append(per_request_us(proc.pid, port, ca, args.requests, args.conns, args.pods))
            print(f"round {pair}: " + ", ".join(f"{who} {rows[who][-1]:.0f} us" for who in servers)
                  + f" (load {os.getloadavg()[0]:.1f})", flush=True)
        print(f"server CPU per request, medians of {args.pairs}:")
        for who in servers:
            if who == "limit":
                print(f"  limit {statistics.median(rows[who]):.0f} us")
                continue
            diffs = [a - b for a, b in zip(rows[who], rows["limit"], strict=True)]
            label = "ours" if who == "ours" else f"ours at {args.against}"
            print(f"  {label} {statistics.median(rows[who]):.0f} us, minus the limit "
                  f"{statistics.median(diffs):.0f} us (rounds {min(diffs):.0f} to {max(diffs):.0f})")
        if args.against:
            diffs = [a - b for a, b in zip(rows["ours"], rows["against"], strict=True)]
            print(f"  ours minus ours at {args.against}: {statistics.median(diffs):.0f} us "
                  f"(rounds {min(diffs):.0f} to {max(diffs):.0f})")
    finally:
        for proc, *_ in servers.values():
            proc.send_signal(signal.SIGTERM)
            proc.wait(10)


if __name__ == "__main__":
    main()
