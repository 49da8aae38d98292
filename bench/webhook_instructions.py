"""Instructions per /mutate request, ours against the limit, counted by valgrind (not a timed test).

On a shared VM the time and even the CPU a server is charged move with the
load by more than the changes they are meant to show (bench/webhook_cpu.py
rounds spread over ±100 us). Instructions do not: callgrind counts the
same program on the same input the same way every run. This counts the
app's own work, in process (the WSGI callable, no gunicorn and no TLS,
which ours and the limit share): ours (`webhook.app.create_app` with the
static view `kubeon-gpu webhook --policies` builds) and the limit
(bench/echo.py's app answering ours' bytes), each sending --requests POST
/mutate bodies of the --pods mix (bench/webhook_load.py) through the app.
A child process runs each under callgrind twice, with --requests and with
none after the same set-up, and the difference over --requests is what one
request costs; the set-up (imports, the app, two warm-up requests) cancels.

    python bench/webhook_instructions.py [--requests 500] [--pods distinct] [--against DIR]

`--server` counts the whole server instead: `kubeon-gpu webhook` and the
limit (bench/echo.py) as bench/webhook_load.py starts them (gunicorn
gthread, TLS; one worker, so one process takes every request), each run
under callgrind twice, with --requests sequential POSTs over one keep-alive
connection and with none, after the same start and five warm-up requests.
Every process of the server is counted (the master too). The ratio of the
limit's instructions per request to ours is what the throughput ratio of
bench/webhook_load.py --echo would be on a machine that runs every
instruction at the same speed: no load, no stalls, no placement of
connections. It is not the time ratio (C code such as TLS runs more
instructions per cycle than the interpreter), but it does not move with the
hour.

    python bench/webhook_instructions.py --server [--requests 300] [--pods distinct|replicas|unique]

Needs valgrind (Debian package `valgrind`); each child takes about a minute, one per core at a time.
"""

from __future__ import annotations

import argparse
import http.client
import io
import os
import re
import signal
import ssl
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def child(who: str, root: Path, requests: int, pods: str) -> None:
    """Build the app of `who` from the checkout at `root`, warm it, then send `requests` bodies."""
    sys.path.insert(0, str(root))
    sys.path.insert(1, str(ROOT))
    import yaml

    from bench.echo import echo_app
    from bench.webhook_load import body_maker
    from kube.views import StaticView
    from tests.webhook.payloads import POLICIES
    from webhook.app import create_app
    from webhook.command import add_arguments, load_static_view

    with tempfile.TemporaryDirectory(prefix="kubeon-bench-") as tmp:
        policies = Path(tmp) / "policies.yaml"
        policies.write_text(yaml.safe_dump_all(POLICIES))
        parser = argparse.ArgumentParser()
        add_arguments(parser)
        args = parser.parse_args(["--cert-dir", tmp, "--policies", str(policies),
                                  "--prometheus-url", "http://127.0.0.1:9"])  # as bench/webhook_load.py does
        ours = create_app(StaticView(load_static_view(args)))
    make = body_maker(pods)
    bodies = [make(n) for n in range(requests + 2)]
    app = ours if who != "limit" else echo_app({"/mutate": call(ours, bodies[-1])})
    call(app, bodies[-1])
    call(app, bodies[-2])
    for body in bodies[:requests]:
        call(app, body)


def call(app: Any, body: bytes) -> bytes:
    environ = {"REQUEST_METHOD": "POST", "PATH_INFO": "/mutate", "CONTENT_LENGTH": str(len(body)),
               "CONTENT_TYPE": "application/json", "wsgi.input": io.BytesIO(body), "SERVER_NAME": "127.0.0.1",
               "SERVER_PORT": "8443", "wsgi.url_scheme": "https", "SERVER_PROTOCOL": "HTTP/1.1"}
    out = app(environ, lambda *_: None)
    answer = b"".join(out)
    if hasattr(out, "close"):
        out.close()
    return answer


def instructions(who: str, root: Path, requests: int, pods: str) -> int:
    sys.path.insert(0, str(ROOT))
    from bench.callgrind import instructions_of

    return instructions_of([sys.executable, __file__, "--child", who, "--root", str(root), "--requests",
                            str(requests), "--pods", pods])


def server_instructions(who: str, requests: int, pods: str, certs: Path, answer: bytes) -> int:
    """All instructions of one server run (`who`: ours or the limit) under callgrind: start, five
    warm-up requests, `requests` measured ones, stop."""
    from bench.webhook_load import body_maker, start_server

    with tempfile.TemporaryDirectory(prefix="kubeon-callgrind-") as out:
        prefix = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}/callgrind.%p"]
        os.environ["PYTHONHASHSEED"] = "0"  # inherited by the server: the same layouts in every run
        proc, port, ca, _ = start_server(1, 4, echo_answer=answer if who == "limit" else None, tmp=certs,
                                         prefix=prefix, ready_seconds=600)
        try:
            make = body_maker(pods)
            conn = http.client.HTTPSConnection("127.0.0.1", port, context=ssl.create_default_context(cafile=ca),
                                               timeout=300)
            for n in [*range(10**6, 10**6 + 5), *range(requests)]:  # warm-up bodies differ from measured ones
                conn.request("POST", "/mutate", make(n), {"Content-Type": "application/json"})
                response = conn.getresponse()
                response.read()
                if response.status != 200:
                    raise SystemExit(f"{who}: HTTP {response.status}")
            conn.close()
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=300)
        total = 0
        for dump in Path(out).glob("callgrind.*"):  # one per process: the master and its worker
            found = re.search(r"^totals: (\d+)", dump.read_text(errors="replace"), re.MULTILINE)
            total += int(found.group(1)) if found else 0
        return total


def server_main(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(ROOT))
    from bench.webhook_load import answer_of, start_server

    print(f"{args.requests} POST /mutate ({args.pods} pods) to the whole server (gunicorn gthread 1x4, TLS), "
          f"under callgrind")
    ours = start_server(1, 4)  # not under valgrind: ours' answer, which the limit sends back, and the certs
    try:
        answer = answer_of(ours[1], ours[2])
    finally:
        ours[0].terminate()
        ours[0].wait()
    runs = [(who, n) for who in ("limit", "ours") for n in (args.requests, 0)]
    with ThreadPoolExecutor(os.cpu_count()) as pool:
        counts = list(pool.map(lambda run: server_instructions(run[0], run[1], args.pods, ours[3], answer), runs))
    limit, ours_per = [(counts[i] - counts[i + 1]) / args.requests for i in (0, 2)]
    print(f"  limit {limit:,.0f} instructions per request (whole server)")
    print(f"  ours  {ours_per:,.0f} ({ours_per - limit:,.0f} more); limit / ours {limit / ours_per:.2f} "
          f"(bench/webhook_load.py's throughput goal: >= 0.85)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--pods", choices=("same", "replicas", "unique", "distinct"), default="distinct")
    parser.add_argument("--against", type=Path, metavar="DIR", help="also ours from this checkout")
    parser.add_argument("--server", action="store_true", help="count the whole server, not the app in process")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.root, args.requests, args.pods)
        return
    if args.server:
        server_main(args)
        return
    print(f"{args.requests} POST /mutate ({args.pods} pods) through the WSGI app, in process, under callgrind")
    runs = [("limit", ROOT), ("ours", ROOT)] + ([("ours", args.against)] if args.against else [])
    with ThreadPoolExecutor(os.cpu_count()) as pool:  # each child is one process under callgrind
        counts = list(pool.map(lambda run: [instructions(*run, n, args.pods) for n in (args.requests, 0)], runs))
    limit, ours, *rest = [(full - empty) / args.requests for full, empty in counts]
    print(f"  limit {limit:,.0f} instructions per request")
    print(f"  ours  {ours:,.0f} ({ours / limit:.2f}x the limit; {ours - limit:,.0f} more)")
    if args.against:
        against = rest[0]
        print(f"  ours at {args.against} {against:,.0f} ({against - limit:,.0f} more than the limit); "
              f"ours minus it: {ours - against:+,.0f} ({(ours - against) / (against - limit):+.0%} of its excess)")


if __name__ == "__main__":
    main()
