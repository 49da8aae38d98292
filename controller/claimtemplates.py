"""The ResourceClaimTemplates that pods rewritten by `via: DRA` policies name (docs/designs/dra.md).

The webhook's patch only names a template (a mutating call cannot create
objects reliably); this reconciler creates each missing one on first sight,
from the policy's own sizes (`named_templates`: a pod's annotation cannot make
it write anything the policy would not), labelled ours and owned by the
GpuPolicy, so kube-controller-manager's garbage collector deletes it with the
policy. The shared ResourceClaims `kubeon-ts-<policy>-<i>` that pods of a
TimeSlicing `via: DRA` policy name (their `gpu.kubeon.io/shared-claim` label) are
created the same way (`is_shared_claim_of`: only names that policy produces). One
of that name that is not ours is left alone, with a Warning
Event on the policy (the controller writes Events in `default` only). Templates
are written only for pods the webhook rewrote, which it does only in the modes
that act; nothing here looks at the mode again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import Any

from controller.context import ControllerContext
from gpupolicy.admission.claims import (
    MANAGED_BY,
    MANAGED_BY_LABEL,
    TEMPLATE_ANNOTATION,
    named_templates,
    policy_templates,
)
from gpupolicy.admission.rewrite import ANNOTATION_POLICY
from gpupolicy.admission.sharedclaims import is_shared_claim_of, shared_claim
from gpupolicy.catalog import DEFAULT_CATALOG
from gpupolicy.dra import SHARED_CLAIM_LABEL
from gpupolicy.model import API_VERSION, KIND, GpuPolicy, PolicyKind, SharingStrategy, SharingVia
from kube.claims import create_template, get_template
from kube.events import ObjectRef

log = logging.getLogger(__name__)


class ClaimTemplateReconciler:
    """Reconciler 2 in controller/loop.py's registry."""

    name = "claim-templates"

    def __init__(self, period_seconds: float = 5.0) -> None:
        self.period_seconds = period_seconds
        # (namespace, name, policy uid) known to exist, forgotten every minute (a template deleted by hand
        # comes back); a template not ours is warned about once
        self._seen: set[tuple[str, str, str]] = set()
        self._warned: set[tuple[str, str, str]] = set()
        self._passes = 0

    def reconcile(self, ctx: ControllerContext) -> None:
        policies = {p.name: p for p in ctx.policies.valid(PolicyKind.SHARING)
                    if p.spec.sharing is not None and p.spec.sharing.via is SharingVia.DRA}
        self._passes += 1
        if self._passes % max(1, int(60 / max(self.period_seconds, 1.0))) == 0:
            self._seen.clear()
        if not policies:
            return
        sizes = {name: policy_templates(p.spec.sharing, DEFAULT_CATALOG) for name, p in policies.items()
                 if p.spec.sharing is not None and p.spec.sharing.strategy is SharingStrategy.MIG}  # once a pass
        for pod in ctx.cluster().pods():
            metadata = pod.get("metadata") or {}
            annotations = metadata.get("annotations") or {}
            claim = str((metadata.get("labels") or {}).get(SHARED_CLAIM_LABEL) or "")
            if TEMPLATE_ANNOTATION not in annotations and not claim:
                continue
            namespace = str(metadata.get("namespace"))
            for name in str(annotations.get(ANNOTATION_POLICY, "")).split(","):
                policy = policies.get(name)
                if policy is None or policy.spec.sharing is None:
                    continue
                uid = policy.metadata.uid
                if name in sizes:
                    for template in named_templates(annotations, sizes[name]):
                        self._ensure(ctx, namespace, template.name, policy,
                                     partial(template.object, namespace, name, uid))
                elif claim and is_shared_claim_of(name, claim):
                    sharing = policy.spec.sharing
                    self._ensure(ctx, namespace, claim, policy,
                                 partial(shared_claim, claim, namespace, sharing, DEFAULT_CATALOG, name, uid))

    def _ensure(self, ctx: ControllerContext, namespace: str, name: str, policy: GpuPolicy,
                body: Callable[[], dict[str, Any]]) -> None:
        """Create `name` (a template or a shared claim, `body()`) when missing; warn once when it is not ours."""
        key = (namespace, name, str(policy.metadata.uid))
        if key in self._seen or not ctx.is_leader():
            return
        wanted = body()
        kind, plural = str(wanted["kind"]), str(wanted["kind"]).lower() + "s"
        current = get_template(ctx.api, namespace, name, plural)
        if current is None:
            if create_template(ctx.api, wanted) is not None:
                log.info("%s created namespace=%s name=%s policy=%s", kind.lower(), namespace, name, policy.name)
            return  # a 409 is read again next pass
        labels = (current.get("metadata") or {}).get("labels") or {}
        if labels.get(MANAGED_BY_LABEL) != MANAGED_BY and key not in self._warned:
            self._warned.add(key)
            ref = ObjectRef(API_VERSION, KIND, policy.name, None, policy.metadata.uid)
            ctx.recorder.warning(ref, "ClaimTemplateNotOurs",
                                 f"{kind} {namespace}/{name} exists and is not kubeon's: left alone; "
                                 f"pods naming it claim through it as it is")
            log.warning("%s not ours namespace=%s name=%s: left alone", kind.lower(), namespace, name)
        self._seen.add(key)
