"""The mode a policy really runs in, and which component acts on each kind. Pure.

One function decides the effective mode, and the webhook, the extender, the
controller, the dry-run and the policy status (hence `kubectl get
gpupolicies`) all call it, so what a policy says it does and what the
components do cannot disagree. Its inputs: the policy's mode, the install's
defaultMode, whether GPU metrics are configured (the install guide: "without
prometheus.url, scale to zero and sharing stay in Recommend mode") and
whether the hub is reachable with a valid token (a revoked token stops every
action: the guide's "it takes no further action").

`HANDLERS` is the one list of which component acts on which policy kind
(`handlers(policy)` adds the controller for a `via: DRA` sharing policy, whose
templates it creates); a policy whose components do not all run says so in
its status (`Ready=False`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from gpupolicy.model import GpuPolicy, Mode, PolicyKind, SharingVia

METRIC_DRIVEN = frozenset({PolicyKind.SHARING, PolicyKind.SCALE_TO_ZERO})


def metric_driven(policy: GpuPolicy) -> bool:
    """Whether the policy acts on GPU metrics: sharing (right-sizing from measured peaks) and scale to zero. A
    `via: DRA` sharing policy does not: its pods claim by declared memory (MIG) or a share of a claim
    (TimeSlicing), and right-sizing writes device-plugin resources its rewrite never reads (docs/designs/dra.md)."""
    sharing = policy.spec.sharing
    return policy.spec.kind in METRIC_DRIVEN and not (sharing is not None and sharing.via is SharingVia.DRA)


class Component(StrEnum):
    """A running part of the optimizer that acts on policies."""

    WEBHOOK = "webhook"      # admission: sharing rewrites, injections, guardrails
    EXTENDER = "extender"    # kube-scheduler extender: packing and typeFit (needs the second scheduler)
    CONTROLLER = "controller"  # reconcilers: right-sizing, scale to zero, KEDA autoscaling, capacity


# Which components act on each kind. A kind with no entry is handled by nothing in this version;
# a new controller adds its kind here and nowhere else. Capacity also needs an implemented
# `capacity.provider` (gpupolicy/capacity/provider.py): `handling` says so.
HANDLERS: Mapping[PolicyKind, frozenset[Component]] = {
    PolicyKind.SHARING: frozenset({Component.WEBHOOK}),
    PolicyKind.SCALE_TO_ZERO: frozenset({Component.CONTROLLER}),
    PolicyKind.PACKING: frozenset({Component.EXTENDER}),
    PolicyKind.TYPE_FIT: frozenset({Component.EXTENDER}),
    PolicyKind.CAPACITY: frozenset({Component.CONTROLLER}),
    PolicyKind.GUARDRAIL: frozenset({Component.WEBHOOK}),
}
IMPLEMENTED_CAPACITY_PROVIDERS = frozenset({"karpenter", "eks-nodegroups", "gke-nodepools", "aks-nodepools"})
ALL_COMPONENTS = frozenset(Component)


@dataclass(frozen=True)
class EffectiveMode:
    mode: Mode
    requested: Mode
    degraded_reason: str | None = None  # set when the mode was lowered
    reason_code: str = "AsRequested"  # condition reason: AsRequested, PrometheusNotConfigured, HubDisconnected
    cause: str | None = None  # why it was lowered, without the consequence degraded_reason adds

    @property
    def degraded(self) -> bool:
        return self.degraded_reason is not None


def effective_mode(policy: GpuPolicy, default_mode: Mode, prometheus_configured: bool,
                   hub_connected: bool = True) -> EffectiveMode:
    """The policy's mode (else the install default), lowered to Recommend for metric-driven
    kinds when no metrics source is configured, and for every kind when the hub is
    configured but cut off (revoked token)."""
    requested = policy.effective_mode(default_mode)
    if not hub_connected and requested is not Mode.RECOMMEND:
        cause = "the hub is unreachable or the cluster token was revoked"
        return EffectiveMode(Mode.RECOMMEND, requested, f"{cause}: staying Recommend (requested {requested})",
                             "HubDisconnected", cause)
    if metric_driven(policy) and not prometheus_configured and requested is not Mode.RECOMMEND:
        cause = f"{policy.spec.kind.value} needs GPU metrics and no --prometheus-url is configured"
        return EffectiveMode(Mode.RECOMMEND, requested, f"{cause}: staying Recommend (requested {requested.value})",
                             "PrometheusNotConfigured", cause)
    return EffectiveMode(requested, requested)


def disruption_mode(mode: Mode, usage_aware: bool, prometheus_configured: bool) -> Mode:
    """The mode one capacity disruption runs in: a usage-aware one (GPUs measured idle) needs DCGM
    metrics, so without Prometheus it stays Recommend; request-based emptiness keeps the policy's mode."""
    if usage_aware and not prometheus_configured:
        return Mode.RECOMMEND
    return mode


@dataclass(frozen=True)
class Handling:
    """Whether anything acts on a policy kind here; `reason` is the Ready condition's reason."""

    handled: bool
    reason: str
    message: str


def handlers(policy: GpuPolicy) -> frozenset[Component]:
    """The components that must all run for `policy` to be acted on: its kind's (`HANDLERS`), and for a
    `via: DRA` sharing policy the controller too (it creates the ResourceClaimTemplates the webhook's
    rewrite names; without it the pods wait Pending, docs/designs/dra.md)."""
    sharing = policy.spec.sharing
    dra = policy.spec.kind is PolicyKind.SHARING and sharing is not None and sharing.via is SharingVia.DRA
    return HANDLERS.get(policy.spec.kind, frozenset()) | ({Component.CONTROLLER} if dra else frozenset())


def handling(kind: PolicyKind, running: Iterable[Component] = ALL_COMPONENTS,
             capacity_provider: str = "karpenter", failing: Mapping[Component, str] | None = None,
             needed: frozenset[Component] | None = None) -> Handling:
    """Who acts on `kind` among the `running` components, for the policy's Ready condition.

    `needed`: the components that must all run (`handlers(policy)`; default the kind's `HANDLERS`).

    Capacity policies under a `capacity.provider` this version does not implement are NotImplemented
    (a guard: all four the install accepts are implemented). A kind whose
    running handlers are all `failing` (component -> why: the extender answering errors, which
    kube-scheduler ignores, gpupolicy/packing/health.py) is not acted on either: `<Component>Degraded`.
    """
    if kind is PolicyKind.CAPACITY and capacity_provider not in IMPLEMENTED_CAPACITY_PROVIDERS:
        return Handling(False, "NotImplemented",
                        f"capacity.provider={capacity_provider} is accepted but not implemented in this version: "
                        "GPU nodes are added and removed through Karpenter (capacity.provider=karpenter), EKS "
                        "managed node groups (eks-nodegroups), GKE (gke-nodepools) or AKS node pools "
                        "(aks-nodepools)")
    needed = HANDLERS.get(kind, frozenset()) if needed is None else needed
    if not needed:
        return Handling(False, "NotImplemented",
                        f"no component of this version acts on {kind.value} policies")
    up = needed & frozenset(running)
    if up != needed:
        names, missing = " and the ".join(sorted(needed)), ", ".join(sorted(needed - up))
        return Handling(False, "ControllerDisabled",
                        f"{kind.value} policies like this one are handled by the {names}; this install does not "
                        f"run the {missing}")
    broken = sorted(c for c in up if c in (failing or {}))
    if failing and len(broken) == len(up):
        return Handling(False, f"{broken[0].value.capitalize()}Degraded",
                        "; ".join(failing[c] for c in broken))
    return Handling(True, "Reconciled", f"handled by the {', '.join(sorted(up))}")


def parse_components(text: str) -> frozenset[Component]:
    """`webhook,extender` -> the components; raises ValueError naming an unknown one."""
    out: set[Component] = set()
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            out.add(Component(part))
        except ValueError:
            known = ", ".join(c.value for c in Component)
            raise ValueError(f"unknown component {part!r} (known: {known})") from None
    return frozenset(out)
