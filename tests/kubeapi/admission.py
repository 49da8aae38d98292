"""Dynamic admission: call Mutating then Validating webhook configurations over HTTPS,
the way kube-apiserver's admission chain does.

For each webhook whose rules, namespaceSelector and objectSelector match, the
double POSTs an AdmissionReview v1 to `clientConfig.url`, or to a service
reference resolved through `ApiServer.map_service` (TLS verified against the
caBundle with the server name `<service>.<namespace>.svc`, as upstream). It
honours timeoutSeconds, failurePolicy, sideEffects under dryRun and
reinvocationPolicy IfNeeded, applies the returned base64 JSON Patch, and turns
a denial into the error kube-apiserver returns. Configurations run in name
order, webhooks in list order; validating webhooks run one after another
(upstream runs them in parallel, with the same outcome). `matchConditions`
(CEL) are not evaluated: a webhook with them is treated as matching.
"""

from __future__ import annotations

import base64
import copy
import http.client
import json
import socket
import ssl
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import jsonpatch

from tests.kubeapi.resources import Resource
from tests.kubeapi.selectors import match_label_selector
from tests.kubeapi.status import ApiError, bad_request, internal
from tests.kubeapi.store import Store

MUTATING = "admissionregistration.k8s.io/mutatingwebhookconfigurations"
VALIDATING = "admissionregistration.k8s.io/validatingwebhookconfigurations"
USER = {"username": "kubernetes-admin", "groups": ["system:masters", "system:authenticated"]}
ServiceResolver = Callable[[str, str, int], "str | None"]


@dataclass
class Attributes:
    """What the request is about (admission.Attributes upstream)."""

    operation: str  # CREATE | UPDATE | DELETE | CONNECT
    resource: Resource
    namespace: str
    name: str
    subresource: str = ""
    kind: dict[str, str] = field(default_factory=dict)  # group/version/kind of `object`
    options: dict[str, Any] = field(default_factory=dict)
    dry_run: bool = False


class Admission:
    def __init__(self, store: Store, resolve_service: ServiceResolver) -> None:
        self._store = store
        self._resolve = resolve_service
        self.calls: list[tuple[str, str]] = []  # (webhook name, operation): tests assert on it

    def admit(self, attrs: Attributes, obj: dict[str, Any] | None, old: dict[str, Any] | None,
              warnings: list[str]) -> dict[str, Any] | None:
        """Run the mutating webhooks; return the (possibly patched) object."""
        if attrs.resource.group == "admissionregistration.k8s.io":
            return obj  # never intercept webhook configurations (upstream rule, avoids lockout)
        hooks = self._matching(MUTATING, attrs, obj, old)
        last_change: dict[str, int] = {}
        called_at: dict[str, int] = {}
        for step, hook in enumerate(hooks, start=1):
            called_at[hook["name"]] = step
            new = self._call(hook, attrs, obj, old, warnings, mutating=True)
            if new != obj:
                obj = new
                last_change["any"] = step
        # reinvocationPolicy IfNeeded: once, for hooks that ran before a later change
        for hook in hooks:
            if hook.get("reinvocationPolicy") == "IfNeeded" and last_change.get("any", 0) > called_at[hook["name"]]:
                obj = self._call(hook, attrs, obj, old, warnings, mutating=True)
        return obj

    def validate(self, attrs: Attributes, obj: dict[str, Any] | None, old: dict[str, Any] | None,
                 warnings: list[str]) -> None:
        if attrs.resource.group == "admissionregistration.k8s.io":
            return
        for hook in self._matching(VALIDATING, attrs, obj, old):
            self._call(hook, attrs, obj, old, warnings, mutating=False)

    # matching -----------------------------------------------------------------------------------
    def _matching(self, key: str, attrs: Attributes, obj: dict[str, Any] | None,
                  old: dict[str, Any] | None) -> list[dict[str, Any]]:
        configs, _ = self._store.list(key)
        out = []
        for cfg in sorted(configs, key=lambda c: c["metadata"]["name"]):
            for hook in cfg.get("webhooks") or []:
                if self._matches(hook, attrs, obj, old):
                    out.append(hook)
        return out

    def _matches(self, hook: dict[str, Any], attrs: Attributes, obj: dict[str, Any] | None,
                 old: dict[str, Any] | None) -> bool:
        res = attrs.resource
        resource_name = f"{res.plural}/{attrs.subresource}" if attrs.subresource else res.plural
        for rule in hook.get("rules") or []:
            ops = rule.get("operations") or []
            if "*" not in ops and attrs.operation not in ops:
                continue
            if not _any(rule.get("apiGroups"), res.group) or not _any(rule.get("apiVersions"), res.version):
                continue
            if not any(_resource_matches(pattern, resource_name) for pattern in rule.get("resources") or []):
                continue
            scope = rule.get("scope", "*")
            if (scope == "Cluster" and res.namespaced) or (scope == "Namespaced" and not res.namespaced):
                continue
            break
        else:
            return False
        labels_of = [o.get("metadata", {}).get("labels") for o in (obj, old) if o]
        if not any(match_label_selector(hook.get("objectSelector") or {}, labels) for labels in labels_of or [{}]):
            return False
        ns_selector = hook.get("namespaceSelector") or {}
        if res.key == "/namespaces":
            return any(match_label_selector(ns_selector, labels) for labels in labels_of or [{}])
        if res.namespaced and attrs.namespace:
            ns = self._store.get("/namespaces", "", attrs.namespace)
            return match_label_selector(ns_selector, (ns or {}).get("metadata", {}).get("labels"))
        return True

    # calling ------------------------------------------------------------------------------------
    def _call(self, hook: dict[str, Any], attrs: Attributes, obj: dict[str, Any] | None,
              old: dict[str, Any] | None, warnings: list[str], mutating: bool) -> dict[str, Any] | None:
        name = hook["name"]
        if attrs.dry_run and hook.get("sideEffects") not in ("None", "NoneOnDryRun"):
            raise bad_request(f'admission webhook "{name}" does not support dry run')
        self.calls.append((name, attrs.operation))
        review_uid = str(uuid.uuid4())
        review = _review(review_uid, attrs, obj, old)
        fail_open = hook.get("failurePolicy", "Fail") == "Ignore"
        try:
            response = self._post(hook, review)
            if response.get("apiVersion") != "admission.k8s.io/v1" or response.get("kind") != "AdmissionReview":
                raise ValueError(f"expected AdmissionReview admission.k8s.io/v1 in response, got "
                                 f"{response.get('kind')} {response.get('apiVersion')}")
            result = response.get("response") or {}
            if result.get("uid") != review_uid:
                raise ValueError(f"expected response.uid={review_uid!r}, got {result.get('uid')!r}")
        except (OSError, ValueError, http.client.HTTPException, ssl.SSLError) as exc:
            if fail_open:
                return obj
            raise internal(f'failed calling webhook "{name}": failed to call webhook: {exc}') from None
        for text in result.get("warnings") or []:
            warnings.append(text)
        if not result.get("allowed"):
            raise _denied(name, result.get("status"))
        if mutating and result.get("patch"):
            if result.get("patchType") != "JSONPatch":
                raise internal(f'received invalid webhook response: webhook "{name}": patchType must be JSONPatch')
            try:
                ops = json.loads(base64.b64decode(result["patch"]))
                obj = jsonpatch.apply_patch(copy.deepcopy(obj), ops)
            except (ValueError, jsonpatch.JsonPatchException, jsonpatch.JsonPointerException, TypeError) as exc:
                raise internal(f'JSON Patch from webhook "{name}" failed to apply: {exc}') from None
        return obj

    def _post(self, hook: dict[str, Any], review: dict[str, Any]) -> dict[str, Any]:
        cc = hook.get("clientConfig") or {}
        server_name = None
        if cc.get("url"):
            url = cc["url"]
        elif cc.get("service"):
            svc = cc["service"]
            port = int(svc.get("port", 443))
            base = self._resolve(svc["namespace"], svc["name"], port)
            if base is None:
                raise OSError(f'service "{svc["namespace"]}/{svc["name"]}" port {port} is not mapped '
                              f"to a local URL (ApiServer.map_service)")
            url = base.rstrip("/") + (svc.get("path") or "/")
            server_name = f'{svc["name"]}.{svc["namespace"]}.svc'
        else:
            raise ValueError("webhook clientConfig has neither url nor service")
        parts = urlsplit(url)
        if parts.scheme != "https":
            raise ValueError(f"webhook scheme must be https: {url}")
        timeout = float(hook.get("timeoutSeconds", 10))
        ctx = ssl.create_default_context()
        if cc.get("caBundle"):
            ctx = ssl.create_default_context(cadata=base64.b64decode(cc["caBundle"]).decode())
        host, port = parts.hostname or "", parts.port or 443
        raw = socket.create_connection((host, port), timeout=timeout)
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
        conn.sock = ctx.wrap_socket(raw, server_hostname=server_name or host)
        try:
            path = parts.path or "/"
            if parts.query:
                path += "?" + parts.query
            path += ("&" if parts.query else "?") + f"timeout={int(timeout)}s"
            conn.request("POST", path, body=json.dumps(review),
                         headers={"Content-Type": "application/json", "Accept": "application/json"})
            resp = conn.getresponse()
            body = resp.read()
            if resp.status != 200:
                raise ValueError(f"the server responded with status {resp.status}: {body[:200]!r}")
            parsed = json.loads(body)
            if not isinstance(parsed, dict):
                raise ValueError("response is not a JSON object")
            return parsed
        finally:
            conn.close()


def _any(values: list[str] | None, value: str) -> bool:
    return bool(values) and ("*" in values or value in values)  # type: ignore[operator]


def _resource_matches(pattern: str, resource: str) -> bool:
    if pattern in ("*/*", resource):
        return True
    if pattern == "*":
        return "/" not in resource
    main, _, sub = pattern.partition("/")
    r_main, _, r_sub = resource.partition("/")
    return bool(sub) and bool(r_sub) and (main in ("*", r_main)) and (sub in ("*", r_sub))


def _review(review_uid: str, attrs: Attributes, obj: dict[str, Any] | None,
            old: dict[str, Any] | None) -> dict[str, Any]:
    res = attrs.resource
    gvr = {"group": res.group, "version": res.version, "resource": res.plural}
    kind = attrs.kind or {"group": res.group, "version": res.version, "kind": res.kind}
    request: dict[str, Any] = {
        "uid": review_uid, "kind": kind, "resource": gvr, "requestKind": kind, "requestResource": gvr,
        "name": attrs.name, "operation": attrs.operation, "userInfo": USER,
        "object": obj if attrs.operation != "DELETE" else None, "oldObject": old,
        "dryRun": attrs.dry_run, "options": attrs.options or None,
    }
    if attrs.subresource:
        request["subResource"] = attrs.subresource
        request["requestSubResource"] = attrs.subresource
    if res.namespaced:
        request["namespace"] = attrs.namespace
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def _denied(name: str, status: dict[str, Any] | None) -> ApiError:
    """webhookerrors.ToStatusErr: code < 400 becomes 400, message prefixed with who denied it."""
    status = status or {}
    denied_by = f'admission webhook "{name}" denied the request'
    code = int(status.get("code") or 0)
    if code < 400:
        code = 400
    if status.get("message"):
        message = f"{denied_by}: {status['message']}"
    elif status.get("reason"):
        message = f"{denied_by}: {status['reason']}"
    else:
        message = f"{denied_by} without explanation"
    return ApiError(code, status.get("reason", ""), message, status.get("details"))
