"""API errors as the real server returns them: `kind: Status` objects with reason and code.

Every failure inside the double raises `ApiError`; the HTTP layer turns it into
the JSON body and status code kube-apiserver would send, so clients (the Python
client's ApiException, kubectl's error printer) see the same thing they would
see against a cluster.
"""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """A request that failed the way kube-apiserver fails it."""

    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None):
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            body["details"] = self.details
        return body


def _details(name: str, group: str, kind: str) -> dict[str, Any]:
    details: dict[str, Any] = {"name": name, "kind": kind}
    if group:
        details["group"] = group
    return details


def qualified(plural: str, group: str) -> str:
    """`pods` or `gpupolicies.gpu.kubeon.io`, the resource name the real messages use."""
    return f"{plural}.{group}" if group else plural


def not_found(plural: str, group: str, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{qualified(plural, group)} "{name}" not found',
                    _details(name, group, plural))


def already_exists(plural: str, group: str, name: str) -> ApiError:
    return ApiError(409, "AlreadyExists", f'{qualified(plural, group)} "{name}" already exists',
                    _details(name, group, plural))


def conflict(plural: str, group: str, name: str, why: str | None = None) -> ApiError:
    why = why or "the object has been modified; please apply your changes to the latest version and try again"
    return ApiError(409, "Conflict", f'Operation cannot be fulfilled on {qualified(plural, group)} "{name}": {why}',
                    _details(name, group, plural))


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def method_not_allowed(message: str = "the server does not allow this method on the requested resource") -> ApiError:
    return ApiError(405, "MethodNotAllowed", message)


def unsupported_media_type(content_type: str) -> ApiError:
    return ApiError(
        415, "UnsupportedMediaType",
        f'the body of the request was in an unknown format - accepted media types include: '
        f'application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml'
        f' (got "{content_type}")')


def invalid(kind: str, group: str, name: str, causes: list[tuple[str, str, str]]) -> ApiError:
    """422 Invalid; causes are (field, reason, message) like apimachinery's field.ErrorList."""
    texts = [f"{field}: {msg}" if field else msg for field, _, msg in causes]
    joined = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
    qkind = f"{kind}.{group}" if group else kind
    details = _details(name, group, kind)
    details["causes"] = [{"reason": reason, "message": msg, "field": field} for field, reason, msg in causes]
    return ApiError(422, "Invalid", f'{qkind} "{name}" is invalid: {joined}', details)


def forbidden(plural: str, group: str, name: str, why: str) -> ApiError:
    return ApiError(403, "Forbidden", f'{qualified(plural, group)} "{name}" is forbidden: {why}',
                    _details(name, group, plural))


def internal(message: str) -> ApiError:
    return ApiError(500, "InternalError", f"Internal error occurred: {message}",
                    {"causes": [{"message": message}]})


def success(details: dict[str, Any] | None = None, code: int = 200) -> dict[str, Any]:
    body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                            "code": code}
    if details:
        body["details"] = details
    return body
