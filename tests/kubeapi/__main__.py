"""Run the test cluster by hand for trials, or probe a server's API semantics:

    python -m tests.kubeapi serve --port 6443 --kubeconfig /tmp/kubeapi.kubeconfig
    python -m tests.kubeapi probe --kubeconfig /tmp/kubeapi.kubeconfig   # or a real cluster's

Starts the test API server on 127.0.0.1:PORT with the CRDs of manifests/crd and the upstream
Karpenter/KEDA CRDs installed, one CPU node and `--gpu-nodes` GPU nodes (A100, 8 GPUs), and
the stand-ins running (scheduler for every schedulerName unless --scheduler-name, workload
controllers and kubelet, Karpenter); writes the kubeconfig to PATH, prints its path and serves
until interrupted. `KUBEAPI_LOG=1` logs every request; SIGUSR1 prints every thread's stack.
"""

from __future__ import annotations

import argparse
import faulthandler
import shutil
import signal
import sys
import time
from pathlib import Path

from tests.kubeapi.cluster import REPO, Cluster, kubectl_binary
from tests.cluster.objects import make_node


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.kubeapi")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the test cluster until interrupted")
    serve.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: a free one)")
    serve.add_argument("--kubeconfig", default="", help="where to write the kubeconfig (default: a temp file)")
    serve.add_argument("--gpu-nodes", type=int, default=1, help="GPU nodes to create (default 1)")
    serve.add_argument("--scheduler-name", default=None,
                       help="schedulerName the scheduler stand-in places (default: every pod)")
    probe = sub.add_parser("probe", help="check the API semantics the tools rely on (tests/kubeapi/probe.py)")
    probe.add_argument("--kubeconfig", required=True, help="kubeconfig of the server to probe")
    probe.add_argument("--kubectl", default="", help="kubectl binary (default: .tools/bin/kubectl, else PATH)")
    args = parser.parse_args(argv)
    if args.command == "probe":
        import requests
        from kubernetes.config.config_exception import ConfigException

        from tests.kubeapi.probe import probe as run_probe
        from tests.kubeapi.probe import report

        try:
            return report(run_probe(args.kubeconfig, args.kubectl or kubectl_binary()))
        except (ConfigException, OSError, requests.ConnectionError) as exc:
            print(f"python -m tests.kubeapi probe: {args.kubeconfig}: {exc}", file=sys.stderr)
            return 2
    nodes = [make_node("cpu-0", product=None, gpus=0)] + [make_node(f"gpu-{i}") for i in range(args.gpu_nodes)]
    crds = sorted((REPO / "manifests" / "crd").glob("*.yaml"))
    # The handler only notes the signal and the main thread polls for the note: the kernel may hand the
    # signal to any thread (the server's, the stand-ins'), and then a main thread blocked in an untimed
    # Event.wait never woke to run the handler (serve outlived its SIGINT in CI). Setting an Event from
    # the handler could also deadlock on the Event's lock held by the interrupted wait.
    received: list[int] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, _frame: received.append(signum))
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1`: every thread's stack on stderr
    try:
        cluster = Cluster(nodes=nodes, crd_files=crds, scheduler_name=args.scheduler_name, port=args.port)
        cluster.__enter__()
    except OSError as exc:
        print(f"python -m tests.kubeapi serve: cannot listen on 127.0.0.1:{args.port}: {exc}", file=sys.stderr)
        return 2
    try:
        path = cluster.kubeconfig
        if args.kubeconfig:
            Path(args.kubeconfig).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(cluster.kubeconfig, args.kubeconfig)
            path = str(Path(args.kubeconfig).resolve())
        print(path, flush=True)
        print(f"serving {cluster.url} (Ctrl-C to stop)", file=sys.stderr, flush=True)
        while not received:
            time.sleep(0.1)
    finally:
        cluster.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
