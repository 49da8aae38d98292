"""Where the controller may scale workloads: the scaler RoleBindings, in the namespaces ScaleToZero policies name.

The chart grants the controller no write on Deployments or StatefulSets. It
ships ClusterRole `kubeon-gpu-optimizer-scaler` (the install guide's scaler
Role: `deployments/scale`, `statefulsets/scale` get, patch; with
`keda.enabled`, KEDA ScaledObjects) bound nowhere, and the controller binds it
with a RoleBinding of the same name in exactly the namespaces that
ScaleToZero policies in Approve or Automatic name (`scaleToZero.namespaces`),
as the guide's "Created only in namespaces named by a ScaleToZero policy" says.
Recommend policies never write, so they get no binding. Right-sizing's
`rollout: Restart` needs none: it evicts pods through the Eviction API.

With KEDA on, a namespace that still holds a ScaledObject the controller made
keeps its binding until autoscale has deleted it (later in the same pass: the
binding goes on the next). Without that, deleting a policy removed the binding
first and the ScaledObject's delete got 403: left behind, KEDA went on scaling
the workload (found on the real API server; the double had no RBAC).

The scale-to-zero reconciler calls `sync_write_access` at the start of its
pass: the wanted set is computed from all policies each time, and a binding
that could not be made this pass means no write there, retried next pass.
A binding just made is waited for (a few seconds at most) until the API
server's authorizer grants it: its cache sees a new RoleBinding a moment after
the create returns, and a scale written before that is refused with 403.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from controller.context import ControllerContext
from gpupolicy.model import GpuPolicy, Mode, PolicyKind
from gpupolicy.modes import effective_mode
from gpupolicy.scaling import autoscale
from kube import scale as kscale
from kube.calls import API_ERRORS, one_line

log = logging.getLogger(__name__)

DEFAULT_SERVICE_ACCOUNT = "kubeon-gpu-optimizer"
GRANT_WAIT_SECONDS = 5.0


def write_namespaces(policies: Iterable[GpuPolicy], default_mode: Mode, prometheus_configured: bool) -> set[str]:
    """Namespaces where an acting ScaleToZero policy needs the controller to scale workloads. Pure."""
    wanted: set[str] = set()
    for policy in policies:
        if effective_mode(policy, default_mode, prometheus_configured).mode is Mode.RECOMMEND:
            continue
        if policy.spec.kind is PolicyKind.SCALE_TO_ZERO and policy.spec.scale_to_zero is not None:
            wanted.update(policy.spec.scale_to_zero.namespaces)
    return wanted


def sync_write_access(ctx: ControllerContext, service_account: str = DEFAULT_SERVICE_ACCOUNT) -> frozenset[str]:
    """Make the scaler bindings match the policies now; returns the namespaces where one exists.

    Leader only: a standby returns an empty set (and so writes nothing).
    """
    if not ctx.is_leader():
        return frozenset()
    wanted = write_namespaces(ctx.policies.valid(), ctx.default_mode, ctx.prometheus_configured)
    if ctx.keda:
        wanted |= _namespaces_with_our_scaled_objects(ctx)
    subject = kscale.ServiceAccountRef(service_account, ctx.namespace)
    result = kscale.sync_scaler_bindings(ctx.api, wanted, subject)
    for ns in result.created:
        log.info("scaler rolebinding created namespace=%s", ns)
        if not _granted(ctx, ns):
            log.info("scaler rolebinding not in force yet namespace=%s: its scales wait for a later pass", ns)
    for ns in result.deleted:
        log.info("scaler rolebinding deleted namespace=%s", ns)
    return result.bound


def _namespaces_with_our_scaled_objects(ctx: ControllerContext) -> set[str]:
    """Namespaces holding a ScaledObject the controller made (autoscale still has to delete it there)."""
    selector = f"{autoscale.MANAGED_BY_LABEL}={autoscale.MANAGED_BY},{autoscale.POLICY_LABEL}"
    return {obj["metadata"]["namespace"] for obj in kscale.list_scaled_objects_all_namespaces(ctx.api, selector)}


def _granted(ctx: ControllerContext, namespace: str, timeout: float = GRANT_WAIT_SECONDS) -> bool:
    """Wait until the authorizer grants the scale in `namespace` (the binding just made); False after `timeout`.

    An API server that cannot answer the review (an error) is not waited for: the scale's own answer
    decides, and a 403 there is retried next pass."""
    deadline = time.monotonic() + timeout
    try:
        while not kscale.may_scale(ctx.api, namespace):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
    except API_ERRORS as exc:
        log.info("scaler rolebinding not checked namespace=%s: %s", namespace, one_line(exc))
    return True
