"""The ResourceClaimTemplates that pods rewritten by `via: DRA` policies name (docs/designs/dra.md).

The webhook's patch only names a template (a mutating call cannot create
objects reliably); this reconciler creates each missing one on first sight,
from the policy's own sizes (`named_templates`: a pod's annotation cannot make
it write anything the policy would not), labelled ours and owned by the
GpuPolicy, so kube-controller-manager's garbage collector deletes it with the
policy. A template of that name that is not ours is left alone, with a Warning
Event on the policy (the controller writes Events in `default` only). Templates
are written only for pods the webhook rewrote, which it does only in the modes
that act; nothing here looks at the mode again.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from controller.context import ControllerContext
from gpupolicy.admission.claims import (
    MANAGED_BY,
    MANAGED_BY_LABEL,
    TEMPLATE_ANNOTATION,
    ClaimTemplate,
    named_templates,
    policy_templates,
)
from gpupolicy.admission.rewrite import ANNOTATION_POLICY
from gpupolicy.catalog import DEFAULT_CATALOG
from gpupolicy.model import API_VERSION, KIND, GpuPolicy, PolicyKind, SharingVia
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
                 if p.spec.sharing is not None}  # worked out once a pass, not per pod
        for pod in ctx.cluster().pods():
            annotations = (pod.get("metadata") or {}).get("annotations") or {}
            if TEMPLATE_ANNOTATION in annotations:
                for name in str(annotations.get(ANNOTATION_POLICY, "")).split(","):
                    if name in sizes:
                        self._ensure(ctx, pod, policies[name], sizes[name])

    def _ensure(self, ctx: ControllerContext, pod: dict[str, Any], policy: GpuPolicy,
                known: Mapping[str, ClaimTemplate]) -> None:
        metadata = pod["metadata"]
        namespace = str(metadata.get("namespace"))
        for template in named_templates(metadata.get("annotations") or {}, known):
            key = (namespace, template.name, str(policy.metadata.uid))
            if key in self._seen or not ctx.is_leader():
                continue
            current = get_template(ctx.api, namespace, template.name)
            if current is None:
                created = create_template(ctx.api, template.object(namespace, policy.name, policy.metadata.uid))
                if created is not None:
                    log.info("resourceclaimtemplate created namespace=%s name=%s policy=%s", namespace,
                             template.name, policy.name)
                continue  # a 409 is read again next pass
            labels = (current.get("metadata") or {}).get("labels") or {}
            if labels.get(MANAGED_BY_LABEL) != MANAGED_BY and key not in self._warned:
                self._warned.add(key)
                ref = ObjectRef(API_VERSION, KIND, policy.name, None, policy.metadata.uid)
                ctx.recorder.warning(ref, "ClaimTemplateNotOurs",
                                     f"ResourceClaimTemplate {namespace}/{template.name} exists and is not "
                                     f"kubeon's: left alone; pods naming it claim through it as it is")
                log.warning("resourceclaimtemplate not ours namespace=%s name=%s: left alone", namespace,
                            template.name)
            self._seen.add(key)
