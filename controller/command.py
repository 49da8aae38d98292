"""`kubeon-gpu controller`: assemble the frame (lease, policy sync, reconcilers, health) and run it.

Threads: the lease loop (renews every few seconds), a GpuPolicy watch that
wakes the policy sync when a spec changes, the health server, and the
reconcile runner on the main thread. Only the lease holder reconciles; a
replica that loses the lease exits at once (`controller.leader.exit_process`)
and its Deployment restarts it as a standby.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client

from controller.context import Clock, ControllerContext, MetricsSource, SystemClock
from controller.health import HealthServer
from controller.hubreport import SummaryReport
from controller.hubsync import MAX_POLL_SECONDS, MIN_POLL_SECONDS, HubSettings, HubState, HubSync
from controller.leader import LeaderElector, exit_process
from controller.loop import Reconciler, ReconcilerLoadError, ReconcileRunner, load_reconcilers
from controller.pendingbatch import PendingBatch
from controller.policies import PolicyStore
from controller.recorder import ControllerMetrics, Recorder
from gpupolicy.model import CAPACITY_PROVIDERS, GROUP, PLURAL, VERSION, Mode
from gpupolicy.modes import ALL_COMPONENTS, Component, parse_components
from gpupolicy.packing.health import DEFAULT_ERROR_RATIO
from kube.stoppable import StoppableClient
from serving.flags import bind_problem, http_url, listen_host, port_or_any, positive_int, positive_seconds
from serving.tls import ca_problem

log = logging.getLogger("controller")


def error_ratio(text: str) -> float:
    """--extender-error-ratio: a share in (0, 1]."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text}: must be above 0 and at most 1")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--namespace", default="kubeon-gpu", help="namespace of the Lease (the install's)")
    parser.add_argument("--prometheus-url", type=http_url, default=None,
                        help="Prometheus with DCGM metrics; without it sharing and scaleToZero stay Recommend")
    parser.add_argument("--default-mode", default=Mode.RECOMMEND.value, choices=[m.value for m in Mode],
                        help="mode of policies that set none")
    parser.add_argument("--cluster", default=None, help="this cluster's name as the hub knows it")
    parser.add_argument("--hub-url", type=http_url, default=None,
                        help="hub to pull policies and approvals from (docs/hub-api.md); unset: the GpuPolicy "
                             "objects in the cluster are the source of truth")
    parser.add_argument("--hub-token-file", default=None,
                        help="the cluster token (the mounted Secret); re-read when it changes")
    parser.add_argument("--hub-poll-interval", default=os.environ.get("KUBEON_GPU_HUB_POLL_INTERVAL") or "60s",
                        help="how often the hub is polled (default: $KUBEON_GPU_HUB_POLL_INTERVAL or 60s)")
    parser.add_argument("--hub-ca-file", default=None, help="CA bundle for a hub with a private CA")
    parser.add_argument("--components", default="webhook,extender", metavar="LIST",
                        help="which other parts of the install run (webhook, extender; the chart passes "
                             "them): a policy kind none of them handles reports Ready=False")
    parser.add_argument("--extender-url", type=http_url, default=None,
                        help="the extender's Service (the chart: http://<extender>.<namespace>.svc:8888): its "
                             "/metrics is read each pass, and packing and typeFit policies say Ready=False "
                             "ExtenderDegraded while it fails open; unset: not read")
    parser.add_argument("--extender-error-ratio", type=error_ratio, default=DEFAULT_ERROR_RATIO,
                        help="share of the extender's answers that may fail before it counts as degraded "
                             "(default: 0.1)")
    parser.add_argument("--keda", action="store_true",
                        help="write KEDA ScaledObjects for scaleToZero.autoscale and pause them while parked "
                             "(chart keda.enabled); without it they are offered as YAML in the policy status")
    parser.add_argument("--capacity-provider", default="karpenter",
                        choices=list(CAPACITY_PROVIDERS),
                        help="who adds and removes GPU nodes (chart capacity.provider): Karpenter, EKS "
                             "managed node groups, GKE or AKS node pools")
    parser.add_argument("--eks-cluster", default="",
                        help="with --capacity-provider eks-nodegroups: the EKS cluster whose node groups are "
                             "resized (chart capacity.eks.clusterName)")
    parser.add_argument("--eks-region", default="",
                        help="with --capacity-provider eks-nodegroups: its AWS region (chart capacity.eks.region; "
                             "unset: boto3's default chain, AWS_REGION)")
    for key, what in (("project", "its Google Cloud project"), ("location", "its location, a zone or region"),
                      ("cluster", "the GKE cluster whose labelled node pools are resized")):
        parser.add_argument(f"--gke-{key}", default="",
                            help=f"with --capacity-provider gke-nodepools: {what} (chart capacity.gke.{key})")
    for flag, key, what in (("subscription-id", "subscriptionId", "its Azure subscription"),
                            ("resource-group", "resourceGroup", "its resource group"),
                            ("cluster", "cluster", "the AKS cluster whose labelled agent pools are resized")):
        parser.add_argument(f"--aks-{flag}", default="",
                            help=f"with --capacity-provider aks-nodepools: {what} (chart capacity.aks.{key})")
    parser.add_argument("--uninstall", action="store_true",
                        help="once, then exit (the chart's pre-delete hook): take the lease, wake parked "
                             "workloads, remove what the optimizer put on nodes and in the time-slicing "
                             "ConfigMap, delete its ScaledObjects, NodeClaims/NodePools and RoleBindings")
    parser.add_argument("--keep-capacity", action="store_true",
                        help="with --uninstall: leave the Karpenter NodeClaims and NodePools the optimizer "
                             "made (chart uninstall.keepCapacity)")
    parser.add_argument("--lease-name", default="kubeon-gpu-optimizer", help="coordination.k8s.io Lease name")
    parser.add_argument("--identity", default=None, help="holderIdentity (default: hostname_pid)")
    parser.add_argument("--kubeconfig", default=None, help="kubeconfig (default: in-cluster or ~/.kube/config)")
    parser.add_argument("--health-port", type=port_or_any, default=8080, help="/healthz /readyz /metrics port (0: any)")
    parser.add_argument("--health-bind", type=listen_host, default="0.0.0.0",
                        help="IP address (or host name) of the health server (default: 0.0.0.0, all IPv4)")
    parser.add_argument("--resync-seconds", type=positive_seconds, default=60.0,
                        help="full GpuPolicy resync period (default: 60)")
    parser.add_argument("--lease-duration-seconds", type=positive_int, default=15,
                        help="leaseDurationSeconds (default: 15)")
    parser.add_argument("--renew-seconds", type=positive_seconds, default=5.0,
                        help="how often the holder renews (default: 5)")
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING")


@dataclass
class ControllerProcess:
    """One replica's parts, wired; `start` the background threads, `run` the loop."""

    ctx: ControllerContext
    elector: LeaderElector
    runner: ReconcileRunner
    metrics: ControllerMetrics
    health: HealthServer | None = None
    stop_event: threading.Event = field(default_factory=threading.Event)
    # The reconcilers' client (kube.stoppable): a stop refuses its next request and aborts its reads.
    guard: StoppableClient | None = None
    # The lease loop has its own stop: it keeps renewing until the reconcile loop has ended, so a
    # pass still finishing after SIGTERM never finds its lease expired (and exits 1) mid-write.
    lease_stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lease_thread: threading.Thread | None = None
    _watch: Any = None
    failed: BaseException | None = None  # what ended the reconcile loop other than a stop

    def start(self, watch_policies: bool = True) -> ControllerProcess:
        if self.health:  # first: /readyz answers (ready, as a standby) from before the first lease step
            self.health.start()
        lease = threading.Thread(target=self.elector.run, args=(self.lease_stop,),
                                 name=f"lease-{self.elector.identity}", daemon=True)
        lease.start()
        self._lease_thread = lease
        if watch_policies:
            self._watch = _policy_watch(self.ctx.api, self.runner)
        return self

    def run(self) -> None:
        self.runner.run_forever(self.stop_event)

    def run_in_thread(self) -> threading.Thread:
        thread = threading.Thread(target=self._run_recording, name=f"runner-{self.elector.identity}", daemon=True)
        thread.start()
        self._threads.append(thread)
        return thread

    def _run_recording(self) -> None:
        try:
            self.run()
        except BaseException as exc:
            log.exception("reconcile loop failed")
            self.failed = exc

    def request_stop(self) -> None:
        """Ask every loop to stop now: no request is sent after this, reads in flight are aborted."""
        self.stop_event.set()
        self.runner.wake()
        if self.guard is not None:
            self.guard.abort_reads()

    def stop(self, release: bool = True) -> None:
        """Stop promptly: loops first (no more writes), then give the lease up, then the rest.

        The lease is released only after the reconcile loop and the lease loop have ended:
        no request of the reconcilers is sent after the stop, their reads in flight are
        aborted (again every 20 ms: one still connecting at the first abort), and a write in
        flight is waited for, as its thread is joined. So no write of this replica can land
        after the release, and a successor can never act while this one still does.
        """
        self.request_stop()
        deadline = time.monotonic() + 10
        for thread in self._threads:
            while thread.is_alive() and time.monotonic() < deadline:
                thread.join(timeout=0.02)
                if self.guard is not None:
                    self.guard.abort_reads()
        running = [t.name for t in self._threads if t.is_alive()]
        self.lease_stop.set()
        if self._lease_thread is not None:
            self._lease_thread.join(timeout=10)
        if running:  # a write still in flight after 10 s: releasing now could let a successor race it
            log.warning("reconcile loop still running after 10s (%s): the lease is left to expire",
                        ",".join(running))
        elif release:
            self.elector.release()
        if self._watch is not None:
            self._watch.stop(timeout=0.2)  # a daemon thread blocked on a watch read: do not wait for it
        if self.ctx.cache is not None:
            self.ctx.cache.stop()
        if self.health:
            self.health.stop()


def _policy_watch(api: client.ApiClient, runner: ReconcileRunner) -> Any:
    """Wake the reconcilers that read GpuPolicies when one's spec changes (status writes do not bump
    generation)."""
    try:
        from kube.reflector import Reflector, custom_objects_lister
    except ImportError:  # the watch is an accelerator; the periodic resync is the guarantee
        return None
    generations: dict[str, Any] = {}

    def on_change(event_type: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        name, generation = str(meta.get("name")), meta.get("generation")
        if event_type == "DELETED" or generations.get(name) != generation:
            generations[name] = generation
            runner.policies_changed()

    return Reflector(custom_objects_lister(api, GROUP, VERSION, PLURAL), on_change=on_change,
                     name="gpupolicies").start()


def build(
    api: client.ApiClient,
    *,
    namespace: str = "kubeon-gpu",
    identity: str | None = None,
    default_mode: Mode = Mode.RECOMMEND,
    prometheus_url: str | None = None,
    metrics: MetricsSource | None = None,
    clock: Clock | None = None,
    lease_name: str = "kubeon-gpu-optimizer",
    lease_duration: int = 15,
    renew_interval: float = 5.0,
    resync_seconds: float = 60.0,
    health_port: int | None = None,
    health_bind: str = "127.0.0.1",
    on_lost: Callable[[str], None] = exit_process,
    reconcilers: list[Reconciler] | None = None,
    hub: HubSettings | None = None,
    components: frozenset[Component] = ALL_COMPONENTS,
    keda: bool = False,
    capacity_provider: str = "karpenter",
    cloud: Mapping[str, str] | None = None,
    extender_url: str | None = None,
    extender_error_ratio: float = DEFAULT_ERROR_RATIO,
) -> ControllerProcess:
    """Wire one replica. Tests pass a fake clock, scripted metrics and their own `on_lost`."""
    chosen = reconcilers if reconcilers is not None else load_reconcilers({"policies": resync_seconds})
    clock = clock or SystemClock()
    identity = identity or f"{socket.gethostname()}_{os.getpid()}"
    if metrics is None and prometheus_url:
        from controller.metrics_source import PrometheusMetricsSource

        metrics = PrometheusMetricsSource(prometheus_url)
    controller_metrics = ControllerMetrics()
    elector = LeaderElector(api, namespace, lease_name, identity, clock, lease_duration=lease_duration,
                            renew_interval=renew_interval, on_lost=on_lost)
    stop = threading.Event()
    guard = StoppableClient(api, stop)
    api = guard.api  # the lease loop keeps the original: its release must go through
    store = PolicyStore()
    recorder = Recorder(api, controller_metrics, clock, identity)
    hub_state = HubState()

    def may_write() -> bool:
        return elector.is_leader() and hub_state.connected

    ctx = ControllerContext(
        api=api, namespace=namespace, default_mode=default_mode, prometheus_url=prometheus_url,
        metrics=metrics, clock=clock, recorder=recorder, policies=store, is_leader=may_write,
        holds_lease=elector.is_leader, hub_configured=hub is not None,
        components=components | {Component.CONTROLLER}, keda=keda, capacity_provider=capacity_provider,
        cloud=dict(cloud or {}), extender_url=extender_url, extender_error_ratio=extender_error_ratio,
    )
    if hub is not None:
        sync = HubSync(hub, hub_state, controller_metrics.registry, default_mode, summary=SummaryReport())
        recorder.listeners.append(lambda policy, target, action, now: sync.applied(policy, target, action, now=now))
        chosen = [sync, *chosen]
    runner = ReconcileRunner(ctx, chosen)
    # pods kube-scheduler gave up on wake the capacity pass, batched like Karpenter's launches
    ctx.on_pod = PendingBatch(lambda when: runner.due_at("capacity", when), ctx.clock.now).on_pod

    def acquired() -> None:
        controller_metrics.leader.set(1)
        runner.trigger()

    elector.on_acquired = acquired
    health = None
    if health_port is not None:
        def ready() -> bool:
            return store.synced or not elector.is_leader()

        health = HealthServer(controller_metrics.registry, ready, health_port, health_bind)
    return ControllerProcess(ctx, elector, runner, controller_metrics, health, stop_event=stop, guard=guard)


# ControllerContext.cloud keys of GKE and AKS -> their flag after --gke- / --aks- (all required)
CLOUD_FLAGS = {"project": "project", "location": "location", "cluster": "cluster",
               "subscription": "subscription-id", "resourceGroup": "resource-group"}


def cloud_settings(args: argparse.Namespace) -> dict[str, str]:
    """Where the capacity provider's cloud calls go (ControllerContext.cloud): the chosen provider's flags."""
    if args.capacity_provider == "gke-nodepools":
        return {"project": args.gke_project, "location": args.gke_location, "cluster": args.gke_cluster}
    if args.capacity_provider == "aks-nodepools":
        return {"subscription": args.aks_subscription_id, "resourceGroup": args.aks_resource_group,
                "cluster": args.aks_cluster}
    return {"cluster": args.eks_cluster, "region": args.eks_region}


def hub_settings(args: argparse.Namespace) -> HubSettings | None:
    """The hub sync's settings from the flags; None without --hub-url. ValueError names the flag."""
    if not args.hub_url:
        log.info("no hub.url: the GpuPolicy objects in the cluster are the source of truth")
        return None
    if not args.cluster:
        raise ValueError("--hub-url needs --cluster (this cluster's name in the hub)")
    if not args.hub_token_file:
        raise ValueError("--hub-url needs --hub-token-file (the chart mounts hub.existingSecret there)")
    from gpupolicy.k8s.quantity import QuantityError, parse_duration

    try:
        interval = parse_duration(args.hub_poll_interval)
    except QuantityError as exc:
        raise ValueError(f"--hub-poll-interval {args.hub_poll_interval!r}: {exc}") from None
    if not MIN_POLL_SECONDS <= interval <= MAX_POLL_SECONDS:
        raise ValueError(f"--hub-poll-interval {args.hub_poll_interval!r}: must be between 1s and 24h")
    return HubSettings(args.hub_url, args.cluster, args.hub_token_file, interval, args.hub_ca_file)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=getattr(logging, str(args.log_level).upper(), logging.INFO),
                        format="%(levelname)s %(message)s")
    from kube.config import KubeConfigError, load_api_client

    try:
        api = load_api_client(args.kubeconfig)
    except KubeConfigError as exc:
        log.error("--kubeconfig: %s", exc)
        return 2
    try:
        components = parse_components(args.components)
    except ValueError as exc:
        log.error("--components: %s", exc)
        return 2
    if args.uninstall:
        from controller import uninstall

        return uninstall.run(
            api, args.namespace, args.lease_name, args.keda, keep_capacity=args.keep_capacity,
            gpu_operator_namespace=os.environ.get("KUBEON_GPU_OPERATOR_NAMESPACE") or "gpu-operator",
            time_slicing_configmap=os.environ.get("KUBEON_GPU_TIME_SLICING_CONFIGMAP") or "time-slicing-config")
    if args.renew_seconds >= args.lease_duration_seconds:
        log.error("--renew-seconds must be shorter than --lease-duration-seconds")
        return 2
    if args.capacity_provider == "eks-nodegroups" and not args.eks_cluster:
        log.error("--capacity-provider eks-nodegroups needs --eks-cluster (chart capacity.eks.clusterName)")
        return 2
    settings = cloud_settings(args)
    cloud = args.capacity_provider[:3]  # gke, aks: every setting required (eks: its cluster, above)
    missing = [f"--{cloud}-{CLOUD_FLAGS[k]}" for k, v in settings.items() if not v] if cloud in ("gke", "aks") else []
    if missing:
        log.error("--capacity-provider %s needs %s (chart capacity.%s.*)", args.capacity_provider,
                  ", ".join(missing), args.capacity_provider[:3])
        return 2
    try:
        hub = hub_settings(args)
    except ValueError as exc:
        log.error("%s", exc)
        return 2
    if hub is not None and hub.ca_file and (problem := ca_problem(Path(hub.ca_file))):
        log.error("--hub-ca-file %s: %s", hub.ca_file, problem)
        return 2
    problem = bind_problem(args.health_bind, args.health_port)
    if problem:
        log.error("--health-bind %s --health-port %d: cannot listen: %s", args.health_bind, args.health_port,
                  problem)
        return 2
    try:
        process = build(
            api, namespace=args.namespace, identity=args.identity, default_mode=Mode(args.default_mode),
            prometheus_url=args.prometheus_url, lease_name=args.lease_name,
            lease_duration=args.lease_duration_seconds, renew_interval=args.renew_seconds,
            resync_seconds=args.resync_seconds, health_port=args.health_port, health_bind=args.health_bind, hub=hub,
            components=components, keda=args.keda, capacity_provider=args.capacity_provider,
            cloud=settings, extender_url=args.extender_url,
            extender_error_ratio=args.extender_error_ratio,
        )
    except ReconcilerLoadError as exc:
        log.error("%s", exc)
        return 1
    log.info("controller starting identity=%s namespace=%s lease=%s prometheus=%s reconcilers=%s",
             process.elector.identity, args.namespace, args.lease_name, bool(args.prometheus_url),
             ",".join(r.name for r in process.runner.reconcilers))

    # SIGTERM and SIGINT only note the signal; the main thread sees the note and stops (aborting
    # reads, joining the reconcile thread, releasing the lease), never inside the handler, which
    # could have interrupted code holding a lock the stop needs. A handler, not a blocked mask
    # and sigtimedwait: native threads started at import (OpenBLAS's, under numpy) keep the
    # default action, and a SIGTERM the kernel handed to one of them while the main thread was
    # between two waits killed the process (exit -15 instead of a released lease).
    received: list[int] = []

    def note(signum: int, _frame: object) -> None:
        received.append(signum)  # a list append takes no lock the interrupted code could hold

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, note)
    process.start()
    runner = process.run_in_thread()
    while runner.is_alive() and not received:
        runner.join(0.1)
    if received:
        log.info("signal %d: stopping", received[0])
    started = time.monotonic()
    process.stop(release=True)
    log.info("controller stopped in %.2fs", time.monotonic() - started)
    # Everything is stopped and the lease is given up: leave without interpreter finalisation
    # (tearing down the kubernetes client, numpy and friends takes 0.3-1 s on a loaded node,
    # which a Deployment's rollout and the successor's takeover would wait for).
    logging.shutdown()
    os._exit(1 if process.failed is not None else 0)
