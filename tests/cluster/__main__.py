"""`python -m tests.cluster up --dir DIR [--with-kubeon] [--with-karpenter] [--with-keda]`: a loopback cluster
until SIGINT or SIGTERM. Writes DIR/kubeconfig, prints `ready`, stops every process it started and
removes its state on the way out (also when a start fails).

`python -m tests.cluster demo autoscaling [--plot FILE.png]`: the GPU autoscaling chain
(tests/cluster/chain.py, tests/cluster/demo.py) on a fresh cluster."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
from pathlib import Path

from tests.cluster.cluster import Cluster
from tests.cluster.control_plane import remove_state
from tests.cluster.processes import StartError
from tests.cluster.upstream import UpstreamMissing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.cluster")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start a loopback cluster and run until SIGINT or SIGTERM")
    up.add_argument("--dir", required=True, type=Path, help="state folder (kubeconfig, logs, etcd data)")
    up.add_argument("--with-kubeon", action="store_true", help="the optimizer as the chart renders it")
    up.add_argument("--with-karpenter", action="store_true", help="Karpenter with its KWOK provider")
    up.add_argument("--with-keda", action="store_true",
                    help="KEDA's operator and metrics adapter (v1beta1.external.metrics.k8s.io)")
    up.add_argument("--keep", action="store_true", help="keep DIR's state on exit")
    demo = sub.add_parser("demo", help="run a scenario on a fresh cluster and print its timeline")
    demo.add_argument("scenario", choices=["autoscaling"])
    demo.add_argument("--plot", type=Path, default=None, help="draw the timeline into this PNG (matplotlib)")
    args = parser.parse_args(argv)
    if args.command == "demo":
        from tests.cluster.demo import autoscaling

        return autoscaling(args.plot)
    with contextlib.suppress(PermissionError):  # its own process group: `kill -- -PGID` ends it all
        os.setpgid(0, 0)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    args.dir.mkdir(parents=True, exist_ok=True)
    cluster = Cluster(args.dir, kubeon=args.with_kubeon, karpenter=args.with_karpenter, keda=args.with_keda)
    try:
        cluster.start()
    except (StartError, UpstreamMissing, OSError) as error:
        print(f"python -m tests.cluster: {error}", file=sys.stderr)
        if not args.keep:
            remove_state(args.dir)
        return 1
    print(f"kubeconfig {cluster.kubeconfig} (started in {cluster.plane.start_seconds:.1f}s)", file=sys.stderr)
    print("ready", flush=True)
    while not stop.wait(0.5):
        pass
    cluster.stop()
    if not args.keep:
        remove_state(args.dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
