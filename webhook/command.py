"""`kubeon-gpu webhook`: serve /mutate, /validate, /dry-run over TLS with gunicorn.

Worker model: gunicorn `gthread`, one worker per core (default 2) with a few
threads each. A review costs ~0.1-0.3 ms of CPU and no I/O, so more processes
than cores only add context switches, while threads let each worker hold
several keep-alive connections from the API server (it keeps a pool of them)
without one slow client blocking the rest. See docs/designs/webhook.md.

The ClusterView: with `--policies FILE` or `--no-watch` (or no cluster
reachable config) a static view; otherwise Reflectors on GpuPolicies,
Namespaces and Nodes, started in each worker after the fork (threads do not
survive fork).

Bad input is one line on stderr and exit 2, in the master before any worker
forks: flags out of range (argparse), a --policies file that does not load or
holds no GpuPolicy, a kubeconfig (or in-cluster config) the watches could not
use, an address gunicorn could not listen on.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Any

from flask import Flask

from gpupolicy.admission.dryrun import DryRunError, parse_policies
from gpupolicy.cluster import ClusterView
from gpupolicy.model import KIND, Mode
from gpupolicy.yamlload import documents, objects_of_kind
from kube.views import StaticView, ViewSource, WatchedView
from serving.flags import bind_problem, file_bytes, http_url, listen_host, port_number, positive_int
from serving.tls import cert_dir_problem
from webhook.app import create_app

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cert-dir", required=True, metavar="DIR", help="directory with tls.crt and tls.key")
    parser.add_argument("--port", type=port_number, default=8443, help="HTTPS port to listen on (default: 8443)")
    parser.add_argument("--bind", type=listen_host, default="0.0.0.0",
                        help="IP address (or host name) to listen on (default: 0.0.0.0, all)")
    parser.add_argument("--workers", type=positive_int, default=2, help="gunicorn worker processes (default: 2)")
    parser.add_argument("--threads", type=positive_int, default=4, help="threads per worker (default: 4)")
    parser.add_argument("--namespace", default="kubeon-gpu", help="the optimizer's own namespace (never touched)")
    parser.add_argument("--default-mode", choices=[m.value for m in Mode], default=Mode.RECOMMEND.value,
                        help="mode of GpuPolicies that set none (the install's defaultMode; default: Recommend)")
    parser.add_argument("--prometheus-url", type=http_url, default=None, metavar="URL",
                        help="the install's Prometheus (not queried here): without it sharing policies "
                             "stay Recommend, as the controller reports in their status")
    parser.add_argument("--route-cpu-pods-on-gpu-nodes", choices=("true", "false"), default="true",
                        help="give CPU-only pods that tolerate the GPU taint (nvidia.com/gpu:NoSchedule) the "
                             "schedulerName of the policies they match, as GPU pods get it; DaemonSet pods and "
                             "pods naming a scheduler are left alone (default: true)")
    parser.add_argument("--kubeconfig", metavar="PATH", help="kubeconfig (in-cluster config when unset)")
    parser.add_argument("--no-watch", action="store_true", help="do not watch the cluster: static view only")
    parser.add_argument("--policies", metavar="FILE", help="GpuPolicy YAML documents for a static view")


def read_policy_documents(path: str) -> list[dict[str, Any]]:
    """The GpuPolicy objects of a --policies file (`gpupolicy.yamlload.objects_of_kind`: a `kind: List`
    contributes its items; other kinds are skipped with a warning, as `hub policy apply` skips them).
    ValueError, one line naming the file (and the document), also when it holds no GpuPolicy at all: a
    server holding none would decide nothing."""
    try:
        found, others = objects_of_kind(documents(file_bytes(path)), KIND)
    except OSError as exc:
        raise ValueError(f"--policies {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ValueError(f"--policies {path}: {exc}") from None
    for number, kind in others:
        log.warning("--policies %s: document %d (%s): not a GpuPolicy, skipped", path, number, kind)
    if not found:
        raise ValueError(f"--policies {path}: no GpuPolicy documents")
    return [policy for _, policy in found]


def load_static_view(args: argparse.Namespace) -> ClusterView:
    """The view from --policies (or an empty one); raises ValueError naming the file and field."""
    policies = []
    if args.policies:
        docs = read_policy_documents(args.policies)
        try:
            policies = parse_policies(docs)
        except DryRunError as exc:
            raise ValueError(f"--policies {args.policies}: {exc}") from exc
    return ClusterView(policies=tuple(policies), default_mode=Mode(args.default_mode),
                       own_namespace=args.namespace, metrics_configured=bool(args.prometheus_url),
                       route_cpu_pods=routes_cpu_pods(args))


def routes_cpu_pods(args: argparse.Namespace) -> bool:
    return bool(args.route_cpu_pods_on_gpu_nodes == "true")


def should_watch(args: argparse.Namespace) -> bool:
    if args.no_watch or args.policies:
        return False
    return bool(args.kubeconfig or os.environ.get("KUBERNETES_SERVICE_HOST"))


def make_app_factory(args: argparse.Namespace, static: ClusterView) -> Any:
    """What each gunicorn worker calls after the fork to build its app (and start its watches)."""

    def factory() -> Flask:
        source: ViewSource
        ignored = None
        if should_watch(args):
            from kube.config import load_api_client

            watched = WatchedView(load_api_client(args.kubeconfig), default_mode=Mode(args.default_mode),
                                  own_namespace=args.namespace, with_nodes=True, with_shares=True,
                                  metrics_configured=bool(args.prometheus_url),
                                  route_cpu_pods=routes_cpu_pods(args)).start(freeze_after_sync=True)
            source, ignored = watched, watched.ignored
        else:
            source = StaticView(static)
        app = create_app(source, ignored=ignored)
        try:
            from serving import probes

            probes.register(app, source.ready)
        except ImportError:  # serving's probes not available: the app still answers admission
            log.warning("serving.probes unavailable: no /healthz or /readyz")
        return app

    return factory


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        static = load_static_view(args)
    except ValueError as exc:
        print(f"kubeon-gpu webhook: {exc}", file=sys.stderr)
        return 2
    cert_dir = Path(args.cert_dir)
    problem = cert_dir_problem(cert_dir)
    if problem:
        print(f"kubeon-gpu webhook: --cert-dir {cert_dir}: {problem}", file=sys.stderr)
        return 2
    if should_watch(args):  # the workers build their watches after the fork: a bad config must stop us here
        from kube.config import KubeConfigError, load_configuration

        try:
            load_configuration(args.kubeconfig)
        except KubeConfigError as exc:
            print(f"kubeon-gpu webhook: {exc}", file=sys.stderr)
            return 2
    from serving.server import serve

    problem = bind_problem(args.bind, args.port)
    if problem:
        print(f"kubeon-gpu webhook: --bind {args.bind} --port {args.port}: cannot listen: {problem}",
              file=sys.stderr)
        return 2
    serve(make_app_factory(args, static), bind=args.bind, port=args.port, cert_dir=str(cert_dir),
          workers=args.workers, threads=args.threads, worker_class="gthread")
    return 0
