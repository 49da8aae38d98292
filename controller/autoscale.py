"""GPU-utilisation autoscaling: KEDA ScaledObjects for `scaleToZero.autoscale` policies.

For every workload a ScaleToZero policy with `autoscale` matches (same
matching and the same one-policy-per-workload rule as scale to zero), the
desired ScaledObject comes from gpupolicy/scaling/autoscale.py. Then, by mode:
- Recommend: the object is the proposal (its JSON in the reason); nothing written.
- Approve: created/updated only for targets listed in spec.approvals.
- Automatic: created when missing, patched when its spec or our labels differ.
ScaledObjects labelled as ours for a policy that no longer wants them
(policy gone, autoscale removed, workload no longer matched) are deleted.
A workload already targeted by someone else's ScaledObject is left alone
(KEDA refuses two ScaledObjects on one target); the proposal says so.

Without `--keda` (the chart's default, keda.enabled=false: the install guide's
RBAC has no KEDA rule) nothing is read or written: every ScaledObject is a
Proposed recommendation whose reason is its YAML, to apply by hand (the
dry-run shows the same). Ours already in the cluster are left alone.

Coexistence with scale to zero: when a parked workload's ScaledObject is
ours, scale to zero pauses it (`paused-replicas: "0"`); updates here merge
spec and labels only, so that pause annotation survives.
"""

from __future__ import annotations

import json
import logging

from controller.context import ControllerContext
from controller.scaletozero import matched_targets
from gpupolicy.model import GpuPolicy, Mode, PolicyKind, Proposal, ProposalState
from gpupolicy.modes import effective_mode
from gpupolicy.proposals import TargetRef, decide_state, is_approved, make_proposal
from gpupolicy.scaling import autoscale as core
from kube import scale as kscale

log = logging.getLogger(__name__)

SOURCE = "autoscale"
UNSET_SERVER = core.UNSET_SERVER  # shown in Recommend when --prometheus-url is not set


class AutoscaleReconciler:
    """Reconciler 4 in controller/loop.py's registry."""

    name = SOURCE

    def __init__(self, period_seconds: float = 60.0) -> None:
        self.period_seconds = period_seconds

    def reconcile(self, ctx: ControllerContext) -> None:
        policies = ctx.policies.valid(PolicyKind.SCALE_TO_ZERO)
        workloads = ctx.cluster().workloads()
        claimed: set[str] = set()
        wanted: set[tuple[str, str]] = set()  # (namespace, name) of ScaledObjects we keep
        namespaces: set[str] = set()
        for policy in policies:
            spec = policy.spec.scale_to_zero
            assert spec is not None
            targets = matched_targets(spec, workloads, claimed)
            namespaces.update(spec.namespaces)
            if spec.autoscale is None:
                ctx.policies.publish(policy.name, SOURCE, [])
                continue
            if not ctx.keda:
                ctx.policies.publish(policy.name, SOURCE, [self._offer(ctx, policy, t.kind, t.namespace, t.name)
                                                           for t in targets])
                continue
            mode = effective_mode(policy, ctx.default_mode, ctx.prometheus_configured).mode
            proposals = [self._target(ctx, policy, mode, t.kind, t.namespace, t.name, wanted) for t in targets]
            ctx.policies.publish(policy.name, SOURCE, [p for p in proposals if p is not None])
        if ctx.keda:
            self._collect_garbage(ctx, namespaces | self._namespaces_with_ours(ctx), wanted)

    def _offer(self, ctx: ControllerContext, policy: GpuPolicy, kind: str, namespace: str, name: str) -> Proposal:
        """KEDA writes are off: the ScaledObject as a recommendation, its YAML in the reason."""
        spec = policy.spec.scale_to_zero
        assert spec is not None and spec.autoscale is not None
        desired = core.scaled_object(
            policy_name=policy.name, kind=kind, namespace=namespace, name=name, spec=spec.autoscale,
            server_address=ctx.prometheus_url or UNSET_SERVER,
        )
        action = (f"KEDA ScaledObject {desired['metadata']['name']}: apply it yourself (the controller "
                  f"writes ScaledObjects only with keda.enabled=true)")
        return make_proposal(policy.name, TargetRef(kind, namespace, name).key, action,
                             core.scaled_object_yaml(desired), 0.0, ProposalState.PROPOSED)

    def _target(
        self, ctx: ControllerContext, policy: GpuPolicy, mode: Mode, kind: str, namespace: str, name: str,
        wanted: set[tuple[str, str]],
    ) -> Proposal | None:
        spec = policy.spec.scale_to_zero
        assert spec is not None and spec.autoscale is not None
        desired = core.scaled_object(
            policy_name=policy.name, kind=kind, namespace=namespace, name=name, spec=spec.autoscale,
            server_address=ctx.prometheus_url or UNSET_SERVER,
        )
        so_name = desired["metadata"]["name"]
        existing = kscale.list_scaled_objects(ctx.api, namespace)
        current = next((o for o in existing if o["metadata"]["name"] == so_name), None)
        other = kscale.scaled_object_for(existing, kind, name)
        ref = TargetRef(kind, namespace, name)
        action = (
            f"KEDA ScaledObject {so_name}: GPU utilisation target {spec.autoscale.target_utilization_percent}%, "
            f"replicas {spec.autoscale.min}..{spec.autoscale.max}"
        )
        if other is not None and other["metadata"]["name"] != so_name:
            reason = f"already autoscaled by ScaledObject {other['metadata']['name']}: left alone"
            return make_proposal(policy.name, ref.key, action, reason, 0.0, ProposalState.DISMISSED)
        if current is not None:
            wanted.add((namespace, so_name))
        reason = json.dumps(desired["spec"], sort_keys=True, separators=(",", ":"))
        up_to_date = current is not None and not core.differs(desired, current)
        state = decide_state(mode, is_approved(ref.key, policy.spec.approvals), None, already_applied=up_to_date)
        if up_to_date or not state.apply:
            return make_proposal(policy.name, ref.key, action, reason, 0.0, state.state)
        if not ctx.is_leader():
            return make_proposal(policy.name, ref.key, action, reason, 0.0, ProposalState.APPROVED)
        if current is None:
            kscale.create_scaled_object(ctx.api, desired)
            verb = "created"
        else:
            kscale.update_scaled_object(ctx.api, desired, current)
            verb = "updated"
        wanted.add((namespace, so_name))
        undo = {"action": "Autoscale", "how": f"delete ScaledObject {namespace}/{so_name}"}
        ctx.recorder.applied(ref, policy, f"Autoscale: {verb} {action}", undo, "", action_label="autoscale")
        return make_proposal(policy.name, ref.key, action, reason, 0.0, ProposalState.APPLIED)

    def _namespaces_with_ours(self, ctx: ControllerContext) -> set[str]:
        """Namespaces holding ScaledObjects we made; a cluster without KEDA has none."""
        found: set[str] = set()
        selector = f"{core.MANAGED_BY_LABEL}={core.MANAGED_BY}"
        for obj in kscale.list_scaled_objects_all_namespaces(ctx.api, selector):
            found.add(obj["metadata"]["namespace"])
        return found

    def _collect_garbage(self, ctx: ControllerContext, namespaces: set[str], wanted: set[tuple[str, str]]) -> None:
        if not ctx.is_leader():
            return
        selector = f"{core.MANAGED_BY_LABEL}={core.MANAGED_BY}"
        for namespace in sorted(namespaces):
            for obj in kscale.list_scaled_objects(ctx.api, namespace, selector):
                key = (namespace, obj["metadata"]["name"])
                ours = core.POLICY_LABEL in (obj["metadata"].get("labels") or {})
                if key not in wanted and ours and kscale.delete_scaled_object(ctx.api, *key):
                    log.info("scaledobject deleted namespace=%s name=%s (no policy wants it)", *key)

