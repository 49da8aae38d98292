"""GPU pods through Dynamic Resource Allocation: which ResourceClaimTemplate a pod's GPU is claimed with.

A sharing policy with `via: DRA` (docs/designs/dra.md) turns each container's
`nvidia.com/gpu` into a claim on a template `kubeon-<class>-<size>` in the
pod's namespace: `kubeon-mig-<profile>[-<product>]` on NVIDIA's DRA driver's
DeviceClass `mig.nvidia.com`, with a CEL selector on the profile and its real
memory (the profile `choose_mig_profile` picks, as for the device plugin), or
`kubeon-gpu-<n>[-<digest>]` on `gpu.nvidia.com` for a pod that declares no
memory need. A template follows from its name and the policy alone
(`policy_templates`), so the controller that creates it can never create
anything else than what the webhook names. Pure.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpupolicy.admission.rewrite import (
    ANNOTATION_GPU_MEMORY,
    GpuScan,
    choose_mig_profile,
    declared_need_mib,
    landing_products,
)
from gpupolicy.catalog import GPU_RESOURCE, Catalog, GpuProduct, MigProfile, normalise_profile_name
from gpupolicy.cluster import ClusterView
from gpupolicy.dra import DRIVER, GPU_CLASS, MIG_CLASS, gpu_template_name, mig_template_name
from gpupolicy.k8s.quantity import QuantityError
from gpupolicy.matching import pod_allowed_products
from gpupolicy.model import SharingSpec

TEMPLATE_ANNOTATION = "gpu.kubeon.io/claim-template"
MANAGED_BY_LABEL = "gpu.kubeon.io/managed-by"
MANAGED_BY = "kubeon-gpu-optimizer"
POLICY_LABEL = "gpu.kubeon.io/policy"
POD_CLAIM_PREFIX = "kubeon-claim-"  # spec.resourceClaims[].name of ours, one per container
MAX_WHOLE_GPUS = 8  # the most GPUs one node of the catalog holds: whole-GPU templates go up to it


@dataclass(frozen=True)
class ClaimTemplate:
    """One ResourceClaimTemplate's name and its single device request."""

    name: str
    device_class: str
    selector: str = ""  # a CEL expression, or none
    count: int = 1

    def spec(self) -> dict[str, Any]:
        """`spec` of the ResourceClaimTemplate (resource.k8s.io/v1)."""
        exactly: dict[str, Any] = {"deviceClassName": self.device_class, "allocationMode": "ExactCount",
                                   "count": self.count}
        if self.selector:
            exactly["selectors"] = [{"cel": {"expression": self.selector}}]
        return {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}

    def object(self, namespace: str, policy: str, policy_uid: str | None = None) -> dict[str, Any]:
        """The ResourceClaimTemplate as the controller creates it: labelled ours, owned by the policy."""
        metadata: dict[str, Any] = {"name": self.name, "namespace": namespace,
                                    "labels": {MANAGED_BY_LABEL: MANAGED_BY, POLICY_LABEL: policy}}
        if policy_uid:
            metadata["ownerReferences"] = [{"apiVersion": "gpu.kubeon.io/v1alpha1", "kind": "GpuPolicy",
                                            "name": policy, "uid": policy_uid}]
        return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": metadata,
                "spec": self.spec()}


def _product_names(products: list[GpuProduct]) -> str:
    """CEL: the device's productName as GFD spells it (the driver has NVML's name: spaces, not '-')."""
    names = sorted({n for p in products for n in (p.product, *p.aliases)})
    listed = ", ".join(f"'{n}'" for n in names)
    return f"device.attributes['{DRIVER}'].productName.replace(' ', '-') in [{listed}]"


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")


def allowed_products(sharing: SharingSpec, catalog: Catalog) -> list[GpuProduct]:
    """The products a policy's templates may land on: gpuModels, else the whole catalog."""
    if sharing.gpu_models:
        return [p for p in (catalog.product(m) for m in sharing.gpu_models) if p is not None]
    return list(catalog.products)


def mig_template(profile: MigProfile, products: list[GpuProduct], pinned: GpuProduct | None) -> ClaimTemplate:
    """`kubeon-mig-<profile>`: that profile with at least its least real memory over `products` (or, pinned,
    on one product: `-<product>` and its productName)."""
    having = [pinned] if pinned is not None else [p for p in products if p.profile(profile.name) is not None]
    floor = min(found.memory_mib for p in having if (found := p.profile(profile.name)) is not None)
    terms = [f"device.attributes['{DRIVER}'].profile == '{profile.name}'",
             f"device.capacity['{DRIVER}'].memory.compareTo(quantity('{floor}Mi')) >= 0"]
    if pinned is not None:
        terms.append(_product_names([pinned]))
    name = mig_template_name(profile.name, _slug(pinned.product) if pinned is not None else "")
    return ClaimTemplate(name, MIG_CLASS, " && ".join(terms))


def gpu_template(count: int, sharing: SharingSpec, catalog: Catalog) -> ClaimTemplate:
    """`kubeon-gpu-<count>`: whole GPUs, of the policy's gpuModels when it lists some (then a digest of
    them in the name: two policies never want different templates under one name)."""
    if not sharing.gpu_models:
        return ClaimTemplate(gpu_template_name(count), GPU_CLASS, count=count)
    digest = hashlib.sha256(",".join(sorted(sharing.gpu_models)).encode()).hexdigest()[:8]
    return ClaimTemplate(gpu_template_name(count, digest), GPU_CLASS, _product_names(
        allowed_products(sharing, catalog)), count)


def policy_templates(sharing: SharingSpec, catalog: Catalog) -> dict[str, ClaimTemplate]:
    """Every template a policy's pods may be given (the controller creates only these), by name."""
    products = [p for p in allowed_products(sharing, catalog) if p.mig_capable]
    found: dict[str, ClaimTemplate] = {}
    for product in products:
        for profile in product.profiles:
            for pinned in (None, product):
                template = mig_template(profile, products, pinned)
                found.setdefault(template.name, template)
    for count in range(1, MAX_WHOLE_GPUS + 1):
        template = gpu_template(count, sharing, catalog)
        found[template.name] = template
    return found


@dataclass(frozen=True)
class ClaimPlan:
    """The template per container asking for GPUs (name -> template), or why the pod is left alone."""

    containers: Mapping[str, ClaimTemplate] | None = None
    skip_reason: str = ""
    warning: str = ""
    detail: str = ""


def _left(reason: str) -> ClaimPlan:
    """Left alone, the verdict first: a warning is cut at 120 characters, and the reason may be long."""
    return ClaimPlan(None, skip_reason=reason, warning=f"pod left unchanged: {reason}")


def plan_claims(pod: Mapping[str, Any], sharing: SharingSpec, view: ClusterView, scan: GpuScan,
                type_fit_models: frozenset[str] | None = None) -> ClaimPlan:
    """Which template each GPU container of `pod` claims through under a `via: DRA` policy.

    Left alone (with the reason for a warning): a pod with its own
    `spec.resourceClaims`, one asking for a MIG slice or a shared GPU already,
    a declared memory no profile of the products it may use holds, a fixed
    profile none of them has. A pod declaring no need gets whole GPUs.
    """
    wanting = {str(c.get("name", "")): gpus.get(GPU_RESOURCE, 0.0) for c, gpus in (*scan.init, *scan.main)
               if gpus.get(GPU_RESOURCE, 0.0) > 0}
    if any(name != GPU_RESOURCE and count > 0 for _, gpus in (*scan.init, *scan.main) for name, count in gpus.items()):
        return ClaimPlan(None, skip_reason="already asks for a MIG slice or a shared GPU")
    if not wanting:
        return ClaimPlan(None, skip_reason="no container asks for nvidia.com/gpu")
    if (pod.get("spec") or {}).get("resourceClaims"):
        return _left("the pod has its own spec.resourceClaims")
    text = ((pod.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_GPU_MEMORY)
    try:
        need, source = declared_need_mib(str(text) if text else None, sharing)
    except QuantityError as exc:
        return _left(str(exc))
    odd = next((name for name, count in wanting.items() if count != int(count) or count > MAX_WHOLE_GPUS), None)
    if odd is not None:  # no template of the policy's sizes holds it (`policy_templates`)
        return _left(f"container {odd} asks for {wanting[odd]:g} GPUs (whole GPUs: 1 to {MAX_WHOLE_GPUS})")
    fixed = None if sharing.mig_profile == "auto" else normalise_profile_name(sharing.mig_profile)
    if (need is None and fixed is None) or any(count != 1 for count in wanting.values()):
        chosen = {name: gpu_template(int(count), sharing, view.catalog) for name, count in wanting.items()}
        return ClaimPlan(chosen, detail="whole GPU (no GPU memory need declared, or more than one GPU)")
    products, why_none, known = landing_products(pod_allowed_products(pod), sharing, view, type_fit_models)
    if not known:  # the profile of some catalog product no node may have: the claim would never be allocated
        return _left("no GPU product known (no GFD product label on nodes): list the policy's gpuModels")
    choice = choose_mig_profile(need, products, view, fixed, pin=known) if products else None
    if choice is None:
        what = f"profile {fixed}" if fixed else f"no MIG profile holds {need:.0f}Mi ({source})"
        where = ", ".join(p.product for p in products) or why_none
        return _left(f"{what} not on {where}" if fixed else f"{what} on {where}")
    allowed = [p for p in allowed_products(sharing, view.catalog) if p.mig_capable]
    template = mig_template(choice.profile, allowed, None)
    floor = min((f.memory_mib for p in allowed if (f := p.profile(choice.profile.name)) is not None), default=0)
    if choice.pin is not None or (need is not None and floor < need):  # on the product it was chosen on
        pinned = view.catalog.product(choice.pin or choice.product.split(", ")[0])
        if pinned is None or pinned not in allowed:
            return _left(f"{choice.profile.name} chosen on {choice.product}, which the policy's products leave out")
        template = mig_template(choice.profile, allowed, pinned)
    detail = (f"{choice.profile.name} on {choice.product} holds {choice.memory_mib}Mi"
              + (f" >= {need:.0f}Mi ({source})" if need is not None else " (fixed by policy)"))
    return ClaimPlan({name: template for name in wanting}, detail=detail)


def named_templates(annotations: Mapping[str, Any], known: Mapping[str, ClaimTemplate]) -> list[ClaimTemplate]:
    """The templates a rewritten pod (its annotations) names among `known` (its policy's `policy_templates`);
    others are not ours to create (a pod may carry any annotation)."""
    names = str(annotations.get(TEMPLATE_ANNOTATION) or "").split(",")
    return [known[name] for name in dict.fromkeys(names) if name in known]
