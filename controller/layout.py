"""Sharing layout: make nodes offer the slices pods were rewritten to, through the GPU Operator (issue 18).

One pass:
1. Re-layouts in flight (node annotation `gpu.kubeon.io/mig-relayout`) move
   one step each (gpupolicy/capacity/relayout.py): they are carried on
   whatever the policies say now, since stopping half way would leave a
   node cordoned or half partitioned.
2. The planner (gpupolicy/capacity/layout.py) picks node targets for the
   waiting GPU pods; each becomes a proposal of the sharing policy whose pods
   it serves (target `Node/<name>`, approved by that entry in spec.approvals).
3. Mode gating (gpupolicy/proposals.py, effective mode from gpupolicy/modes.py:
   without Prometheus sharing stays Recommend): Recommend only shows the
   plan (proposals, and condition `LayoutPlanned` with the ConfigMap diff
   and node labels); Approve applies approved targets; Automatic applies.
   Time-slicing: the key is added to the ConfigMap, then the node's label
   moves to it. MIG (and back to whole from MIG): the cordoned re-layout.
4. Keys of ours in the ConfigMap that no node label names are removed, when
   some sharing policy may write.

The ConfigMap (install values gpuOperator.namespace/timeSlicingConfigMap,
env KUBEON_GPU_OPERATOR_NAMESPACE / KUBEON_GPU_TIME_SLICING_CONFIGMAP) is
only ever read and patched; when it is missing the policies say so
(condition TimeSlicingConfigMap=False, a Warning event) with the command
that creates it.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

from kubernetes.client.exceptions import ApiException

from controller.context import ControllerContext
from gpupolicy.capacity import relayout
from gpupolicy.capacity.layout import (
    MIG,
    MIG_CONFIG_FROM_ANNOTATION,
    RELAYOUT_ANNOTATION,
    TIME_SLICING,
    WHOLE,
    LayoutPlan,
    NodeTarget,
    current_layout,
    read_demand,
    read_nodes,
)
from gpupolicy.capacity.layout import plan_layout as plan_nodes
from gpupolicy.capacity.timeslicing import ConfigMapChange, key_replicas, plan_configmap
from gpupolicy.catalog import DEFAULT_CATALOG, MIG_CONFIG_LABEL, PLUGIN_CONFIG_LABEL
from gpupolicy.model import (
    API_VERSION,
    KIND,
    Condition,
    GpuPolicy,
    Mode,
    PolicyKind,
    Proposal,
    ProposalState,
    SharingStrategy,
    SharingVia,
)
from gpupolicy.modes import effective_mode
from gpupolicy.proposals import TargetRef, decide_state, make_proposal
from kube import layout as kl
from kube.events import ObjectRef, emit_event

log = logging.getLogger(__name__)

SOURCE = "layout"
DEFAULT_NAMESPACE = "gpu-operator"
DEFAULT_CONFIGMAP = "time-slicing-config"


def create_command(namespace: str, name: str) -> str:
    return f"kubectl create configmap {name} -n {namespace}"


@dataclass
class _Pass:
    """What one pass read."""

    nodes: list[dict[str, Any]]
    pods: list[dict[str, Any]]
    configmap: dict[str, Any] | None
    missing: str  # why the ConfigMap could not be read ("" when it was)

    @property
    def data(self) -> dict[str, str]:
        return dict((self.configmap or {}).get("data") or {})


class LayoutReconciler:
    """Reconciler `layout` in controller/loop.py's registry."""

    name = SOURCE

    def __init__(self, period_seconds: float = 20.0, *, namespace: str | None = None,
                 configmap: str | None = None, timeout_seconds: float = relayout.DEFAULT_TIMEOUT_SECONDS) -> None:
        self.period_seconds = period_seconds
        self.namespace = namespace or os.environ.get("KUBEON_GPU_OPERATOR_NAMESPACE") or DEFAULT_NAMESPACE
        self.configmap = configmap or os.environ.get("KUBEON_GPU_TIME_SLICING_CONFIGMAP") or DEFAULT_CONFIGMAP
        self.timeout_seconds = timeout_seconds
        self._warned: set[str] = set()

    # -- the pass -----------------------------------------------------------------
    def reconcile(self, ctx: ControllerContext) -> None:
        policies = ctx.policies.valid(PolicyKind.SHARING)
        nodes = ctx.cluster().nodes()
        if not policies and not any(RELAYOUT_ANNOTATION in ((n.get("metadata") or {}).get("annotations") or {})
                                    for n in nodes):
            return  # nothing to plan and nothing in flight: no pod list, no ConfigMap read
        seen = self._read(ctx, nodes)
        replicas = key_replicas(seen.data)
        in_flight = self._advance(ctx, seen, policies)
        # DRA nodes offer the devices their slices list: a claim pod a free device waits for changes no layout
        plan = plan_nodes(read_nodes(seen.nodes, seen.pods, replicas, DEFAULT_CATALOG, ctx.cluster().slices()),
                          read_demand(seen.pods, policies, DEFAULT_CATALOG))
        modes = {p.name: effective_mode(p, ctx.default_mode, ctx.prometheus_configured).mode for p in policies}
        needed = plan.keys()
        change = plan_configmap(seen.data, needed, self._used_keys(seen.nodes))
        for policy in policies:
            proposals = list(in_flight.get(policy.name, []))
            mine = [t for t in plan.targets if t.policy == policy.name]
            for target in mine:
                proposals.append(self._target(ctx, policy, modes[policy.name], target, seen))
            proposals += self._kept(ctx, policy, proposals, seen, replicas)
            conditions = [self._planned_condition(mine, change, plan)]
            sharing = policy.spec.sharing  # TimeSlicing through DRA shares a claim: the ConfigMap plays no part
            slicing = sharing is not None and sharing.strategy is SharingStrategy.TIME_SLICING and \
                sharing.via is SharingVia.DEVICE_PLUGIN
            if seen.missing and (slicing or any(t.target.kind == TIME_SLICING for t in mine)):
                conditions.append(self._missing_condition(ctx, policy, seen.missing))
            ctx.policies.publish(policy.name, SOURCE, proposals, conditions)
        if seen.configmap is not None and any(m is not Mode.RECOMMEND for m in modes.values()):
            self._cleanup(ctx)

    def _read(self, ctx: ControllerContext, nodes: list[dict[str, Any]]) -> _Pass:
        pods = ctx.cluster().pods()
        try:
            return _Pass(nodes, pods, kl.read_configmap(ctx.api, self.namespace, self.configmap), "")
        except kl.ConfigMapUnavailable as exc:
            why = "not found" if exc.status == 404 else "not readable (RBAC)"
            return _Pass(nodes, pods, None, why)

    @staticmethod
    def _used_keys(nodes: list[dict[str, Any]]) -> set[str]:
        return {str(labels[PLUGIN_CONFIG_LABEL]) for n in nodes
                if PLUGIN_CONFIG_LABEL in (labels := (n.get("metadata") or {}).get("labels") or {})}

    @staticmethod
    def _kept(ctx: ControllerContext, policy: GpuPolicy, shown: list[Proposal], seen: _Pass,
              replicas: dict[str, int]) -> list[Proposal]:
        """Applied proposals whose node still runs the layout they set: what was done stays visible."""
        layouts = {f"Node/{n['metadata']['name']}": current_layout(n["metadata"].get("labels") or {}, replicas)
                   for n in seen.nodes}
        targets = {p.target for p in shown}
        return [p for p in ctx.policies.previous(policy.name).values()
                if p.state is ProposalState.APPLIED and p.target in layouts and p.target not in targets
                and p.action == f"layout {layouts[p.target].describe()}"]

    # -- re-layouts in flight -------------------------------------------------------
    def _advance(self, ctx: ControllerContext, seen: _Pass, policies: list[GpuPolicy]) -> dict[str, list[Proposal]]:
        shown: dict[str, list[Proposal]] = {}
        by_name = {p.name: p for p in policies}
        gpu_pods: dict[str, int] | None = None  # read once a node has a re-layout in flight (most passes: none)
        for node in seen.nodes:
            meta = node.get("metadata") or {}
            record = relayout.read_record(meta.get("annotations") or {})
            if record is None:
                continue
            if gpu_pods is None:
                gpu_pods = {n.name: n.gpu_pods for n in read_nodes(seen.nodes, seen.pods, {}, DEFAULT_CATALOG,
                                                                   ctx.cluster().slices())}
            name = str(meta.get("name"))
            labels = meta.get("labels") or {}
            product = DEFAULT_CATALOG.product(str(labels.get("nvidia.com/gpu.product", "")))
            gpus = int(str(labels.get("nvidia.com/gpu.count", "0")) or 0)
            step = relayout.advance(name, record, labels, (node.get("status") or {}).get("allocatable") or {},
                                    gpu_pods.get(name, 0), product, gpus, ctx.clock.now(), self.timeout_seconds)
            if step.patch and ctx.is_leader():
                ctx.patch_node(name, step.patch)
                self._report(ctx, by_name.get(record.policy), name, step)
            policy = by_name.get(record.policy)
            if policy is not None and step.outcome not in ("done", "rolled-back", "aborted"):
                shown.setdefault(policy.name, []).append(make_proposal(
                    policy.name, f"Node/{name}", f"layout MIG {record.target}", step.message, 0.0,
                    ProposalState.APPLIED, resource=None))
        return shown

    def _report(self, ctx: ControllerContext, policy: GpuPolicy | None, node: str, step: relayout.Step) -> None:
        failed = step.outcome in ("rolling-back", "rolled-back", "stuck", "aborted")
        reason = "MigRelayoutFailed" if failed else "MigRelayout"
        log.log(logging.WARNING if failed else logging.INFO, "mig relayout node=%s outcome=%s %s", node,
                step.outcome, step.message)
        refs = [ObjectRef("v1", "Node", node)]
        if policy is not None:
            refs.append(ObjectRef(API_VERSION, KIND, policy.name, None, policy.metadata.uid))
        for ref in refs:
            if failed:
                ctx.recorder.warning(ref, reason, step.message)
            else:  # nodes and policies are cluster-scoped: the Event lives in the recorder's (`default`)
                emit_event(ctx.api, ref, reason, step.message, ctx.clock.now(), instance=ctx.recorder.identity,
                           cluster_scoped_namespace=ctx.recorder.namespace)

    # -- new targets ------------------------------------------------------------------
    def _target(self, ctx: ControllerContext, policy: GpuPolicy, mode: Mode, target: NodeTarget,
                seen: _Pass) -> Proposal:
        approved = target.target_ref in policy.spec.approvals
        base = make_proposal(policy.name, target.target_ref, target.action, target.reason, 0.0,
                             resource=target.resource)
        before = ctx.policies.previous(policy.name).get(base.id)
        dismissed = before.state if before is not None and before.state is ProposalState.DISMISSED else None
        state = decide_state(mode, approved, dismissed)
        shown, reason = state.state, target.reason
        if state.apply:
            if not ctx.is_leader():
                shown = ProposalState.APPROVED
            else:
                try:
                    applied = self._apply(ctx, policy, target, seen)
                except ApiException as exc:
                    log.warning("layout apply failed node=%s: %s", target.node, exc.reason)
                    applied = f"not applied yet: API {exc.status} {exc.reason}"
                if applied:
                    shown, reason = ProposalState.APPROVED, f"{target.reason}; {applied}"
        return make_proposal(policy.name, target.target_ref, target.action, reason, 0.0, shown,
                             resource=target.resource)

    def _apply(self, ctx: ControllerContext, policy: GpuPolicy, target: NodeTarget, seen: _Pass) -> str:
        """Make the change (or its first step); returns why not, "" when made."""
        node = next(n for n in seen.nodes if n["metadata"]["name"] == target.node)
        ref = TargetRef("Node", "", target.node, api_version="v1")
        if target.target.kind == MIG or target.current.kind == MIG:
            mig = target.target.mig
            step = relayout.start(target.node, mig, target.current.mig,
                                  bool((node.get("spec") or {}).get("unschedulable")), ctx.clock.now(),
                                  policy.name, make_proposal(policy.name, target.target_ref, target.action, "",
                                                             0.0).id)
            patch = step.patch
            node_meta = node.get("metadata") or {}
            if MIG_CONFIG_FROM_ANNOTATION not in (node_meta.get("annotations") or {}):  # the first time only
                before = str((node_meta.get("labels") or {}).get(MIG_CONFIG_LABEL, ""))
                patch = {**patch, "metadata": {**patch.get("metadata", {}), "annotations": {
                    **patch.get("metadata", {}).get("annotations", {}), MIG_CONFIG_FROM_ANNOTATION: before}}}
            ctx.patch_node(target.node, patch)
            ctx.recorder.applied(ref, policy, f"Layout: node {target.node} cordoned for MIG {mig}", {},
                                 target.reason, action_label="layout")
            return ""
        if target.target.kind == TIME_SLICING:
            if seen.configmap is None:
                return (f"ConfigMap {self.namespace}/{self.configmap} {seen.missing}: "
                        f"{create_command(self.namespace, self.configmap)}")
            key = target.target.key or ""
            if key not in seen.data:
                change = plan_configmap(seen.data, {key: target.target.replicas}, set(seen.data))
                seen.configmap = kl.patch_configmap(ctx.api, self.namespace, self.configmap, change.merge_patch(),
                                                    (seen.configmap.get("metadata") or {}).get("resourceVersion"))
        assert target.target.kind in (TIME_SLICING, WHOLE)
        ctx.patch_node(target.node, {"metadata": {"labels": target.labels}})
        ctx.recorder.applied(ref, policy, f"Layout: node {target.node} {target.target.describe()}",
                             {"labels": {k: (node["metadata"].get("labels") or {}).get(k) for k in target.labels}},
                             target.reason, action_label="layout")
        return ""

    def _cleanup(self, ctx: ControllerContext) -> None:
        """Remove our keys no node label names (read again: this pass may have added and labelled)."""
        try:
            configmap = kl.read_configmap(ctx.api, self.namespace, self.configmap)
        except kl.ConfigMapUnavailable:
            return
        nodes = ctx.cluster().nodes()  # with this pass's labels: `_apply` told the cache what it wrote
        data = dict(configmap.get("data") or {})
        change = plan_configmap(data, {}, self._used_keys(nodes))
        if change.remove and ctx.is_leader():
            kl.patch_configmap(ctx.api, self.namespace, self.configmap, change.merge_patch(),
                               (configmap.get("metadata") or {}).get("resourceVersion"))
            log.info("time-slicing keys removed: %s", ", ".join(change.remove))

    # -- conditions ---------------------------------------------------------------------
    def _planned_condition(self, mine: list[NodeTarget], change: ConfigMapChange, plan: LayoutPlan) -> Condition:
        if not mine:
            waiting = f"; {len(plan.unserved)} pod(s) no node can serve" if plan.unserved else ""
            return Condition(type="LayoutPlanned", status="False", reason="NoChange",
                             message=f"no node change needed ({plan.matched} waiting pod(s) fit what nodes offer)"
                                     f"{waiting}")
        keys = {t.target.key for t in mine if t.target.key}
        ours = ConfigMapChange({k: v for k, v in change.add.items() if k in keys}, change.remove)
        labels = "; ".join(f"{t.node}: " + ", ".join(f"{k}={v if v is not None else '(removed)'}"
                                                     for k, v in t.labels.items()) for t in mine)
        message = (f"ConfigMap {self.namespace}/{self.configmap}: {ours.describe()}; node labels: {labels}")
        return Condition(type="LayoutPlanned", status="True", reason="Planned", message=message[:1000])

    def _missing_condition(self, ctx: ControllerContext, policy: GpuPolicy, why: str) -> Condition:
        message = (f"ConfigMap {self.namespace}/{self.configmap} {why}: time-slicing cannot be applied; "
                   f"create it with `{create_command(self.namespace, self.configmap)}` (the controller may "
                   "only get and patch it)")
        if policy.name not in self._warned:
            self._warned.add(policy.name)
            ctx.recorder.warning(ObjectRef(API_VERSION, KIND, policy.name, None, policy.metadata.uid),
                                 "TimeSlicingConfigMapMissing", message)
        reason = "NotFound" if why == "not found" else "Forbidden"
        return Condition(type="TimeSlicingConfigMap", status="False", reason=reason, message=message)

