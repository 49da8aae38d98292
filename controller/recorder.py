"""Record what the controller did: Kubernetes Events, Prometheus metrics.

Solve first, act after: reconcilers decide with the pure core, write their
record (in the policy status: scale to zero's park record, right-sizing's
restart record) before the change it describes, apply the change, then call
`recorder.applied(...)`: one Event on the policy naming the target and the
action. The undo lives in the caller's record, not in the Event.
Metrics live in a per-process `CollectorRegistry` (not the global one) so two
replicas in one test process do not collide; the health server serves it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from kubernetes import client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from controller.sources import Clock
from gpupolicy.model import API_VERSION, KIND, GpuPolicy
from gpupolicy.proposals import TargetRef
from kube.events import CLUSTER_SCOPED_EVENT_NAMESPACE, ObjectRef, emit_event

log = logging.getLogger(__name__)


class ControllerMetrics:
    """The controller's Prometheus metrics."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.actions = Counter(
            "kubeon_gpu_actions", "Actions the controller applied to workloads",
            ["policy", "action"], registry=self.registry,
        )
        self.reconcile_errors = Counter(
            "kubeon_gpu_reconcile_errors", "Reconcile passes that raised", ["reconciler"],
            registry=self.registry,
        )
        self.policies = Gauge(
            "kubeon_gpu_policies", "GpuPolicies seen at the last resync", ["valid"], registry=self.registry,
        )
        self.proposals = Gauge(
            "kubeon_gpu_proposals", "Proposals in policy status", ["policy", "state"], registry=self.registry,
        )
        self.leader = Gauge("kubeon_gpu_leader", "1 while this replica holds the lease", registry=self.registry)
        self.status_writes = Counter(
            "kubeon_gpu_status_writes", "GpuPolicy status writes", registry=self.registry,
        )
        # a pass should end well within its reconciler's period (bench/cluster_scale.py reads the p99)
        self.pass_seconds = Histogram(
            "kubeon_gpu_reconcile_duration_seconds", "Time one reconcile pass took", ["reconciler"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60), registry=self.registry,
        )
        # the CPU the pass's thread used: against its duration, how much of a slow pass was the pass's own work
        # and how much waiting (API calls, the GIL, a machine busy with other work)
        self.pass_cpu_seconds = Histogram(
            "kubeon_gpu_reconcile_cpu_seconds", "CPU time of the thread running one reconcile pass", ["reconciler"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60), registry=self.registry,
        )


def _action_kind(action: str) -> str:
    """A bounded metric label from a free-text action (`nvidia.com/gpu=1 → ...` → `rightsize`)."""
    head = action.split(":", 1)[0].split(" ", 1)[0]
    return "rightsize" if "→" in action else head[:40]


class Recorder:
    """Events + metrics for applied actions; the caller keeps the undo in its record in the policy status."""

    def __init__(self, api: client.ApiClient, metrics: ControllerMetrics, clock: Clock,
                 identity: str = "", namespace: str = CLUSTER_SCOPED_EVENT_NAMESPACE) -> None:
        self.api = api
        # Where its Events live: they are about cluster-scoped objects (GpuPolicies, nodes), and the API
        # server keeps a core/v1 Event about a cluster-scoped object only in `default` (legacy event
        # validation); the chart's Role kubeon-gpu-optimizer-events grants events there and nowhere else.
        self.namespace = namespace
        self.metrics = metrics
        self.clock = clock
        self.identity = identity
        self.applied_log: list[dict[str, Any]] = []  # this process's actions (diagnostics, tests)
        # Called with (policy, target, action, time) for every applied action: the hub outbox.
        self.listeners: list[Callable[[GpuPolicy, str, str, float], None]] = []

    def applied(
        self, target_ref: TargetRef, policy: GpuPolicy, action: str, undo: dict[str, Any], reason: str,
        action_label: str | None = None,
    ) -> None:
        """An action was applied to `target_ref` under `policy`: an Event on the policy, counter +1.

        The Event names the target; it is about the (cluster-scoped) GpuPolicy, so it lives in
        `default` (where `kubectl describe gpupolicy NAME` finds it), the only namespace where the
        chart lets the controller write Events (the install guide's RBAC has none; docs/install.md,
        Permissions).
        """
        label = action_label or _action_kind(action)
        message = f"{action}: {reason}" if reason else action
        owner = ObjectRef(API_VERSION, KIND, policy.name, None, policy.metadata.uid)
        now = self.clock.now()
        emit_event(self.api, owner, "GpuPolicyApplied", f"{target_ref.key}: {message}", now,
                   instance=self.identity, cluster_scoped_namespace=self.namespace)
        self.metrics.actions.labels(policy=policy.name, action=label).inc()
        self.applied_log.append({"target": target_ref.key, "policy": policy.name, "action": action,
                                 "undo": undo, "reason": reason})
        log.info("applied policy=%s target=%s action=%s", policy.name, target_ref.key, action)
        for listener in self.listeners:
            listener(policy, target_ref.key, action, now)

    def warning(self, ref: ObjectRef, reason: str, message: str) -> None:
        """A Warning event (e.g. a policy that cannot act as asked)."""
        emit_event(self.api, ref, reason, message, self.clock.now(), event_type="Warning",
                   instance=self.identity, cluster_scoped_namespace=self.namespace)

    def reconcile_error(self, reconciler: str) -> None:
        self.metrics.reconcile_errors.labels(reconciler=reconciler).inc()
