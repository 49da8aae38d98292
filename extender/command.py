"""`kubeon-gpu extender`: serve the kube-scheduler extender (POST /filter, /prioritize) with gunicorn.

Worker model: ONE gunicorn worker by default (`--workers 1`) with a few
threads. The extender is stateful: its node model and, above all, the pods
it has just placed but the API has not yet shown bound (assumptions) live
in the worker's memory. kube-scheduler schedules one pod at a time and sends
filter then prioritize back to back; with several workers, two consecutive
pods could reach different processes and both see the same free GPU. One
process answers in a few milliseconds, which is far above kube-scheduler's
rate. `--workers N` is allowed (each worker keeps its own watches and
assumptions) for read-mostly setups; the chart runs one.

Sources: with `--kubeconfig`, in-cluster (KUBERNETES_SERVICE_HOST set), or
$KUBECONFIG / ~/.kube/config, Reflectors on nodes, assigned pods, GpuPolicies
and Namespaces, started in the worker after the fork. Without any usable
configuration the extender refuses to start with one line (exit 2): an
extender that sees no nodes would answer every filter with "unknown node".
`--standalone`: an empty static cache (every node is unknown), for trials.

Bad input is one line on stderr and exit 2, in the master before any worker
forks: flags out of range (argparse), a kubeconfig the watches could not use,
an address gunicorn could not listen on.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Any

from flask import Flask

from gpupolicy.model import POLICY_STRATEGIES, Mode
from gpupolicy.packing.engine import DEFAULT_STRATEGY
from serving.flags import bind_problem, listen_host, port_number, positive_int, positive_seconds
from serving.tls import cert_dir_problem

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=port_number, default=8888, help="port kube-scheduler calls (default: 8888)")
    parser.add_argument("--bind", type=listen_host, default="0.0.0.0",
                        help="IP address (or host name) to listen on (default: 0.0.0.0, all)")
    parser.add_argument("--cert-dir", metavar="DIR", help="serve HTTPS with DIR/tls.crt and DIR/tls.key")
    parser.add_argument("--kubeconfig", metavar="PATH", help="kubeconfig (in-cluster config when unset)")
    parser.add_argument("--standalone", "--no-watch", dest="standalone", action="store_true",
                        help="trials only: no cluster, an empty node model (every node is unknown)")
    parser.add_argument("--default-strategy", "--default-policy", dest="default_strategy", default=DEFAULT_STRATEGY,
                        choices=[name for name in POLICY_STRATEGIES if name != "default"],
                        help=f"packing strategy when no GpuPolicy chooses one (default: {DEFAULT_STRATEGY}; "
                             "--default-policy: the old name)")
    parser.add_argument("--default-mode", choices=[m.value for m in Mode], default=Mode.RECOMMEND.value,
                        help="mode of GpuPolicies that set none (default: Recommend, as the webhook)")
    parser.add_argument("--assume-seconds", type=positive_seconds, default=30.0,
                        help="how long a just-placed pod counts on its node before the API shows it bound "
                             "(default: 30)")
    parser.add_argument("--scheduler-weight", type=int, default=0, metavar="N",
                        help="this extender's weight in kube-scheduler's profile (the chart passes it); known, "
                             "/prioritize lists only the hosts that can still be placed (default: 0, unknown: "
                             "every host)")
    parser.add_argument("--workers", type=positive_int, default=1,
                        help="gunicorn worker processes (default: 1, see docs)")
    parser.add_argument("--threads", type=positive_int, default=4, help="threads per worker (default: 4)")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                        help="DEBUG logs every node's score and rejection reason")


def should_watch(args: argparse.Namespace) -> bool:
    return not args.standalone


def cluster_config_problem(args: argparse.Namespace) -> str:
    """Why no cluster configuration is usable ("" when one is, or with --standalone)."""
    if args.standalone:
        return ""
    from kube.config import KubeConfigError, load_configuration

    try:
        load_configuration(args.kubeconfig)
    except KubeConfigError as exc:
        return f"{exc} (give --kubeconfig, run in a cluster, or --standalone for a trial without one)"
    return ""


def make_app_factory(args: argparse.Namespace) -> Any:
    """What each gunicorn worker calls after the fork: cache, watches, service, app."""

    def factory() -> Flask:
        from extender.app import create_app
        from extender.cache import ClusterCache
        from extender.service import ExtenderService
        from extender.watch import ClusterWatch
        from kube.views import StaticView, ViewSource
        from serving import probes

        logging.getLogger().setLevel(args.log_level)
        cache = ClusterCache(assume_seconds=args.assume_seconds)
        source: ViewSource
        binder = None
        if should_watch(args):
            from kube.binding import ApiBinder
            from kube.config import load_api_client

            api = load_api_client(args.kubeconfig)
            source = ClusterWatch(api, cache, default_mode=Mode(args.default_mode)).start()
            binder = ApiBinder(api)
        else:
            log.warning("extender running without a cluster watch: every node is unknown")
            source = StaticView()
        service = ExtenderService(cache, source, default_strategy=args.default_strategy, binder=binder,
                                  scheduler_weight=args.scheduler_weight)
        app = create_app(service)
        probes.register(app, service.ready)
        return app

    return factory


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.scheduler_weight < 0:
        print(f"kubeon-gpu extender: --scheduler-weight {args.scheduler_weight}: must be 0 (unknown) or more",
              file=sys.stderr)
        return 2
    if args.cert_dir and (problem := cert_dir_problem(Path(args.cert_dir))):
        print(f"kubeon-gpu extender: --cert-dir {args.cert_dir}: {problem}", file=sys.stderr)
        return 2
    if args.kubeconfig and not os.path.isfile(args.kubeconfig):
        print(f"kubeon-gpu extender: --kubeconfig {args.kubeconfig}: no such file", file=sys.stderr)
        return 2
    problem = cluster_config_problem(args)
    if problem:
        print(f"kubeon-gpu extender: {problem}", file=sys.stderr)
        return 2
    from serving.server import serve

    problem = bind_problem(args.bind, args.port)
    if problem:
        print(f"kubeon-gpu extender: --bind {args.bind} --port {args.port}: cannot listen: {problem}",
              file=sys.stderr)
        return 2
    serve(make_app_factory(args), bind=args.bind, port=args.port, cert_dir=args.cert_dir,
          workers=args.workers, threads=args.threads, worker_class="gthread")
    return 0
