"""The OpenAPI file as code: load it once, check a JSON body against one of its schemas.

The hub checks request bodies with the same schemas the tests check responses
with, so the contract is written once (hub/openapi.yaml). OpenAPI 3.1 schemas
are JSON Schema 2020-12; `$ref`s resolve inside the document.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError
from referencing import Registry, Resource

OPENAPI_FILE = Path(__file__).resolve().parent / "openapi.yaml"
DOC_URI = "urn:kubeon:hub-openapi"


@functools.cache
def document() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(OPENAPI_FILE.read_text(encoding="utf-8"))
    return loaded


@functools.cache
def _registry() -> Registry[Any]:
    resource: Resource[Any] = Resource.from_contents(document(), default_specification=_spec())
    registry: Registry[Any] = Registry().with_resource(DOC_URI, resource)
    return registry


def _spec() -> Any:
    from referencing.jsonschema import DRAFT202012

    return DRAFT202012


@functools.cache
def validator(schema_name: str) -> Draft202012Validator:
    return Draft202012Validator({"$ref": f"{DOC_URI}#/components/schemas/{schema_name}"}, registry=_registry())


def validator_for(schema: dict[str, Any]) -> Draft202012Validator:
    """A validator for a schema of the document given as `{"$ref": "#/..."}` (response schemas in tests)."""
    return Draft202012Validator({"$ref": DOC_URI + schema["$ref"]}, registry=_registry())


def problem(schema_name: str, body: Any) -> tuple[str, str] | None:
    """(field path, message) of the first way `body` breaks the schema, or None when it fits."""
    errors = sorted(validator(schema_name).iter_errors(body), key=lambda e: (len(e.absolute_path), str(e.path)))
    if not errors:
        return None
    error: ValidationError = errors[0]
    where = ".".join(str(p) for p in error.absolute_path) or "(body)"
    return where, f"{where}: {error.message}"
