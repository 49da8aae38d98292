"""The mode a policy really runs in, and why when it differs from what it asks. Pure.

The install guide promises that metric-driven policies (sharing's
right-sizing, scaleToZero) never act on guesses: without a Prometheus URL
they stay Recommend whatever their mode says, and their status says why.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpupolicy.model import GpuPolicy, Mode, PolicyKind

METRIC_DRIVEN = frozenset({PolicyKind.SHARING, PolicyKind.SCALE_TO_ZERO})


@dataclass(frozen=True)
class EffectiveMode:
    mode: Mode
    requested: Mode
    degraded_reason: str | None = None  # set when the mode was lowered

    @property
    def degraded(self) -> bool:
        return self.degraded_reason is not None


def effective_mode(policy: GpuPolicy, default_mode: Mode, prometheus_configured: bool) -> EffectiveMode:
    """The policy's mode (else the install default), lowered to Recommend for metric-driven
    kinds when no metrics source is configured."""
    requested = policy.effective_mode(default_mode)
    if policy.spec.kind in METRIC_DRIVEN and not prometheus_configured:
        reason = (
            f"{policy.spec.kind.value} needs GPU metrics and no --prometheus-url is configured: "
            f"staying Recommend (requested {requested.value})"
        )
        return EffectiveMode(Mode.RECOMMEND, requested, reason)
    return EffectiveMode(requested, requested)
