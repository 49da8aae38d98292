"""NVIDIA's DRA driver names and the names of our ResourceClaimTemplates, shared by admission and packing. Pure.

Admission writes a template name per GPU container (`gpupolicy.admission.claims`); packing reads it back
as what a pending pod will hold once its claim is allocated (docs/designs/dra.md, "The live model"). The
name carries the request: `kubeon-mig-<profile>[-<product>]` is one MIG device of that profile,
`kubeon-gpu-<n>[-<digest>]` is n whole GPUs; so the two sides share this one rule, and a pod's pending
demand needs no ResourceClaimTemplate watch.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpupolicy.catalog import MIG_RESOURCE_PREFIX

DRIVER = "gpu.nvidia.com"  # the driver name its ResourceSlices and CEL attribute domain use
MIG_CLASS = "mig.nvidia.com"
GPU_CLASS = "gpu.nvidia.com"
MIG_TEMPLATE_PREFIX = "kubeon-mig-"
GPU_TEMPLATE_PREFIX = "kubeon-gpu-"


@dataclass(frozen=True)
class TemplateRequest:
    """What one of our templates asks for: `count` whole GPUs, or one MIG device of `mig_resource`."""

    count: int = 0
    mig_resource: str = ""


def mig_template_name(profile: str, product_slug: str = "") -> str:
    """`kubeon-mig-<profile>[-<product>]` (`+me` written `.me`, as the device plugin's resource names do)."""
    name = f"{MIG_TEMPLATE_PREFIX}{profile.replace('+', '.')}"
    return (f"{name}-{product_slug}" if product_slug else name)[:253]


def gpu_template_name(count: int, digest: str = "") -> str:
    """`kubeon-gpu-<count>[-<digest>]`."""
    return f"{GPU_TEMPLATE_PREFIX}{count}" + (f"-{digest}" if digest else "")


def template_request(name: str) -> TemplateRequest | None:
    """The request a template of ours makes, read from its name; None for a name we never write."""
    if name.startswith(MIG_TEMPLATE_PREFIX):
        profile = name[len(MIG_TEMPLATE_PREFIX):].split("-", 1)[0]
        return TemplateRequest(mig_resource=MIG_RESOURCE_PREFIX + profile) if profile else None
    if name.startswith(GPU_TEMPLATE_PREFIX):
        count = name[len(GPU_TEMPLATE_PREFIX):].split("-", 1)[0]
        return TemplateRequest(count=int(count)) if count.isascii() and count.isdigit() and len(count) < 4 else None
    return None


SHARED_CLAIM_PREFIX = "kubeon-ts-"  # a ResourceClaim several pods name: one GPU time-sliced among them
SHARED_CLAIM_LABEL = "gpu.kubeon.io/shared-claim"  # on a pod naming one: the webhook counts pods per claim by it


def shared_claim_name(policy: str, index: int) -> str:
    """`kubeon-ts-<policy>-<index>`: deterministic, so that two admissions finding every claim full name the same
    next claim, never two new ones (policy names are DNS subdomains, at most 253; the index stays whole)."""
    suffix = f"-{index}"
    return f"{SHARED_CLAIM_PREFIX}{policy}"[:253 - len(suffix)] + suffix
