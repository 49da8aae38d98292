"""Where the controller may write workloads: the scaler RoleBindings, for every reconciler that needs them.

The chart grants the controller no cluster-wide write on Deployments or
StatefulSets. It ships ClusterRole `kubeon-gpu-optimizer-scaler` (scale,
patch, KEDA ScaledObjects) bound nowhere, and the controller binds it with a
RoleBinding of the same name in exactly the namespaces that acting policies
name (docs/designs/install.md, RBAC):

- ScaleToZero policies in Approve or Automatic: `scaleToZero.namespaces`
  (parking and waking patch the workload);
- sharing policies with `rollout: Restart` in Approve or Automatic:
  `selector.namespaces` (right-sizing restarts the workload; the model
  refuses Restart without named namespaces, so the set is always finite).

Recommend policies never write, so they get no binding. Both reconcilers
that write workloads call `sync` at the start of their pass: the wanted set is
computed from all policies each time, so the two never undo each other, and a
writer checks `bound` for the target's namespace before writing (a binding
that could not be made this pass means no write, retried next pass).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from controller.context import ControllerContext
from gpupolicy.model import GpuPolicy, Mode, PolicyKind, Rollout
from gpupolicy.modes import effective_mode
from kube import scale as kscale

log = logging.getLogger(__name__)

DEFAULT_SERVICE_ACCOUNT = "kubeon-gpu-optimizer"


def write_namespaces(policies: Iterable[GpuPolicy], default_mode: Mode, prometheus_configured: bool) -> set[str]:
    """Namespaces where some acting policy needs the controller to write workloads. Pure."""
    wanted: set[str] = set()
    for policy in policies:
        if effective_mode(policy, default_mode, prometheus_configured).mode is Mode.RECOMMEND:
            continue
        if policy.spec.kind is PolicyKind.SCALE_TO_ZERO and policy.spec.scale_to_zero is not None:
            wanted.update(policy.spec.scale_to_zero.namespaces)
        elif (policy.spec.kind is PolicyKind.SHARING and policy.spec.sharing is not None
              and policy.spec.sharing.rollout is Rollout.RESTART):
            wanted.update(policy.spec.selector.namespaces)
    return wanted


def sync_write_access(ctx: ControllerContext, service_account: str = DEFAULT_SERVICE_ACCOUNT) -> frozenset[str]:
    """Make the scaler bindings match the policies now; returns the namespaces where one exists.

    Leader only: a standby returns an empty set (and so writes nothing).
    """
    if not ctx.is_leader():
        return frozenset()
    wanted = write_namespaces(ctx.policies.valid(), ctx.default_mode, ctx.prometheus_configured)
    subject = kscale.ServiceAccountRef(service_account, ctx.namespace)
    result = kscale.sync_scaler_bindings(ctx.api, wanted, subject)
    for ns in result.created:
        log.info("scaler rolebinding created namespace=%s", ns)
    for ns in result.deleted:
        log.info("scaler rolebinding deleted namespace=%s", ns)
    return result.bound
