"""GpuPolicy admission: refuse invalid policies with messages naming the field path.

The pydantic model refuses structural errors (unknown mode, two bodies,
replicas < 2, bad quantities, unknown fields); this module adds the checks
that need the catalog (an unknown MIG profile for the listed gpuModels) and
turns errors into `spec.sharing.gpuMemory: ...` lines a kubectl user can act
on. It also labels a policy with its body kind (`gpu.kubeon.io/kind`) so the
CRD's Kind printer column has a plain field to read. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from gpupolicy.admission.patch import diff
from gpupolicy.catalog import Catalog, normalise_profile_name
from gpupolicy.k8s.quantity import shown
from gpupolicy.model import MANAGED_BY_HUB, MANAGED_BY_LABEL, GpuPolicy, SharingStrategy, parse_policy

KIND_LABEL = "gpu.kubeon.io/kind"


def field_path(loc: Sequence[int | str]) -> str:
    """`("spec", "sharing", "gpuMemory")` -> `spec.sharing.gpuMemory`; list indexes as `[0]`."""
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += ("." if text else "") + str(part)
    return text or "(root)"


def _message(error: Mapping[str, Any]) -> str:
    msg = str(error.get("msg", "invalid"))
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    if error.get("type") == "extra_forbidden":
        msg = "unknown field"
    return msg


def pydantic_errors(exc: ValidationError) -> list[str]:
    """One `path: message` line per error, in pydantic's order, without duplicates."""
    lines: list[str] = []
    for error in exc.errors():
        line = f"{field_path(error.get('loc', ()))}: {_message(error)}"
        if line not in lines:
            lines.append(line)
    return lines


def catalog_errors(policy: GpuPolicy, catalog: Catalog) -> list[str]:
    """Checks the model cannot make alone: MIG profile names against the listed gpuModels."""
    sharing = policy.spec.sharing
    if sharing is None:
        return []
    errors: list[str] = []
    known = []
    for i, model in enumerate(sharing.gpu_models):
        product = catalog.product(model)
        if product is None:
            errors.append(f"spec.sharing.gpuModels[{i}]: unknown GPU product {shown(model)}")
        else:
            known.append(product)
    if sharing.strategy == SharingStrategy.MIG and sharing.mig_profile != "auto":
        wanted = normalise_profile_name(sharing.mig_profile)
        if known:
            missing = [p.product for p in known if p.profile(wanted) is None]
            if missing:
                errors.append(f"spec.sharing.migProfile: {shown(sharing.mig_profile)} is not a MIG profile of "
                              f"gpuModels {', '.join(missing)}")
        elif not any(p.profile(wanted) for p in catalog.products):
            errors.append(f"spec.sharing.migProfile: unknown MIG profile {shown(sharing.mig_profile)}")
    return errors


def check_policy(obj: Any, catalog: Catalog) -> tuple[GpuPolicy | None, list[str]]:
    """Parse and check a GpuPolicy object; returns the policy (or None) and error lines."""
    if not isinstance(obj, Mapping):
        return None, ["(root): a GpuPolicy must be an object"]
    try:
        policy = parse_policy(dict(obj))
    except ValidationError as exc:
        return None, pydantic_errors(exc)
    return policy, catalog_errors(policy, catalog)


def kind_label_patch(obj: Mapping[str, Any]) -> list[dict[str, Any]]:
    """JSON Patch that sets `gpu.kubeon.io/kind` to the policy's body kind (empty when already set/invalid)."""
    try:
        policy = parse_policy(dict(obj))
    except ValidationError:
        return []
    labelled = dict(obj)  # copies of the levels written only: a deep copy recursed on deep objects
    metadata = labelled["metadata"] = dict(labelled.get("metadata") or {})
    labels = metadata.get("labels")
    labels = dict(labels) if isinstance(labels, Mapping) else {}
    labels[KIND_LABEL] = str(policy.spec.kind)
    metadata["labels"] = labels
    return diff(dict(obj), labelled)


def hub_edit_warning(obj: Any, old: Any) -> list[str]:
    """A warning for a direct edit of a hub-managed policy: the next hub sync overwrites it (the guide says so).

    Only a spec change is an edit; the controller's own relabelling passes without one.
    """
    if not isinstance(obj, Mapping) or not isinstance(old, Mapping):
        return []
    # the old object is whatever is stored (never checked here): read it as loosely as it may come
    old_meta = old.get("metadata")
    labels = old_meta.get("labels") if isinstance(old_meta, Mapping) else None
    if not isinstance(labels, Mapping) or labels.get(MANAGED_BY_LABEL) != MANAGED_BY_HUB:
        return []
    if obj.get("spec") == old.get("spec"):
        return []
    meta = obj.get("metadata")
    name = meta.get("name", "") if isinstance(meta, Mapping) else ""
    return [f"kubeon-gpu: GpuPolicy {name} is managed by the hub: this edit is overwritten on the next sync; "
            "change the policy in the hub instead"]
