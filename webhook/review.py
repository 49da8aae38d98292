"""The AdmissionReview v1 envelope: read a request, build a response.

Protocol errors (not JSON, not an AdmissionReview, no uid, no request) raise
ReviewError and become HTTP 400 with a JSON message; admission outcomes
(denied, patched, warned) always travel as HTTP 200 inside the response, as
kube-apiserver expects. Shapes follow k8s.io/api/admission/v1 types.go.

JSON is read and written by serving.http (orjson): whatever parses can be written back.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpupolicy.k8s.quantity import shown
from serving.http import encode_json

ADMISSION_API_VERSIONS = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")


class ReviewError(ValueError):
    """A body that is not a usable AdmissionReview: answered with HTTP 400."""


@dataclass(frozen=True)
class Review:
    """The parts of an AdmissionRequest the handlers use."""

    api_version: str
    uid: str
    group: str
    kind: str
    operation: str
    namespace: str
    object: Any
    old_object: Any
    dry_run: bool


def parse_review(body: Any) -> Review:
    """Validate the envelope; unknown resource kinds are fine (the handler allows them unchanged)."""
    # (dict, Mapping): a parsed dict passes before the ABC's check, a Python call on every review
    if not isinstance(body, (dict, Mapping)):
        raise ReviewError("body must be a JSON object (an AdmissionReview)")
    if body.get("kind") != "AdmissionReview":
        raise ReviewError(f"unsupported kind {shown(body.get('kind'))}: expected AdmissionReview")
    api_version = body.get("apiVersion")
    if api_version not in ADMISSION_API_VERSIONS:
        raise ReviewError(f"unsupported apiVersion {shown(api_version)}: expected admission.k8s.io/v1")
    request = body.get("request")
    if not isinstance(request, (dict, Mapping)):
        raise ReviewError("request: missing AdmissionRequest")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise ReviewError("request.uid: missing")
    kind = request.get("kind")
    if not isinstance(kind, (dict, Mapping)) or not isinstance(kind.get("kind"), str):
        raise ReviewError("request.kind: missing group/version/kind")
    operation = request.get("operation")
    if not isinstance(operation, str):
        raise ReviewError("request.operation: missing")
    namespace = request.get("namespace") or ""
    if not isinstance(namespace, str):
        raise ReviewError("request.namespace: must be a string")
    return Review(
        api_version=str(api_version), uid=uid, group=str(kind.get("group") or ""), kind=str(kind["kind"]),
        operation=operation, namespace=namespace, object=request.get("object"),
        old_object=request.get("oldObject"), dry_run=bool(request.get("dryRun")),
    )


def response(
    review: Review,
    *,
    allowed: bool = True,
    patch: str = "",
    warnings: Sequence[str] | None = None,
    message: str = "",
    code: int = 403,
    audit: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """An AdmissionReview carrying the response for `review` (same uid and apiVersion); `patch` is the
    JSON Patch as the response carries it (`encode_patch`'s)."""
    body: dict[str, Any] = {"uid": review.uid, "allowed": allowed}
    if not allowed:
        body["status"] = {"code": code, "message": message, "reason": "Forbidden" if code == 403 else "Invalid"}
    if patch:
        body["patchType"] = "JSONPatch"
        body["patch"] = patch
    if warnings:
        body["warnings"] = list(warnings)
    if audit:
        body["auditAnnotations"] = dict(audit)
    return {"apiVersion": review.api_version, "kind": "AdmissionReview", "response": body}


def encode_patch(patch: list[dict[str, Any]]) -> str:
    """A JSON Patch as AdmissionResponse.patch carries it: base64 of its JSON; "" for no operations."""
    return base64.b64encode(encode_json(patch)).decode() if patch else ""
