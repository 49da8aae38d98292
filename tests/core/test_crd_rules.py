"""The CRD's CEL rules (x-kubernetes-validations) agree with the model that they describe.

Real: the rules as generated into the CRD, compiled and run by cel-python, and
the model's own validation. Faked: Kubernetes' CEL quantity library
(`isQuantity`, `quantity(...)`, `.compareTo(...)`), which cel-python
lacks, is stood in by the project's quantity parser (upstream's grammar and
values); the test API server does not evaluate CEL at all (tests/kubeapi/schema.py).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import celpy
import pytest
from celpy import celtypes
from pydantic import ValidationError

from gpupolicy.crd import build_crd
from gpupolicy.model import parse_policy
from gpupolicy.quantity import QuantityError, parse_nanos


class _Quantity:
    def __init__(self, nanos: int) -> None:
        self.nanos = nanos


def _is_quantity(text: celtypes.StringType) -> celtypes.BoolType:
    try:
        parse_nanos(str(text))
    except QuantityError:
        return celtypes.BoolType(False)
    return celtypes.BoolType(True)


def _quantity(text: celtypes.StringType) -> Any:
    try:
        return _Quantity(parse_nanos(str(text)))
    except QuantityError:  # upstream's ParseQuantity has no upper bound: far beyond 2^63-1 still compares
        return _Quantity(10**40)


FUNCTIONS = {
    "isQuantity": _is_quantity,
    "quantity": _quantity,
    "compareTo": lambda a, b: celtypes.IntType((a.nanos > b.nanos) - (a.nanos < b.nanos)),
}


def rules(node: dict[str, Any], path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], dict[str, str]]]:
    for rule in node.get("x-kubernetes-validations") or []:
        yield path, rule
    for name, sub in (node.get("properties") or {}).items():
        yield from rules(sub, (*path, name))


SCHEMA = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
RULES = list(rules(SCHEMA))
ENV = celpy.Environment()


def failing_rules(policy: dict[str, Any]) -> list[str]:
    """Messages of the rules that refuse `policy` (a rule applies only where its field is present)."""
    failed = []
    for path, rule in RULES:
        value: Any = policy
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        if value is None:
            continue
        program = ENV.program(ENV.compile(rule["rule"]), functions=FUNCTIONS)
        if not program.evaluate({"self": celpy.json_to_cel(value)}):
            failed.append(rule["message"])
    return failed


BASE = {"apiVersion": "gpu.kubeon.io/v1alpha1", "kind": "GpuPolicy", "metadata": {"name": "p"},
        "spec": {"mode": "Automatic", "sharing": {"strategy": "MIG", "gpuMemory": "8Gi"}}}


def _spec(**changes: Any) -> dict[str, Any]:
    policy = copy.deepcopy(BASE)
    for key, value in changes.items():
        if value is None:
            policy["spec"].pop(key, None)
        else:
            policy["spec"][key] = value
    return policy


CASES = {
    "valid": (BASE, None),
    "huge-gpu-memory": (_spec(sharing={"strategy": "MIG", "gpuMemory": "1e1000000"}), "between 0 and 2^63-1"),
    "negative-gpu-memory": (_spec(sharing={"strategy": "MIG", "gpuMemory": "-1Gi"}), "between 0 and 2^63-1"),
    "largest-gpu-memory": (_spec(sharing={"strategy": "MIG", "gpuMemory": "9223372036854775807"}), None),
    "two-bodies": (_spec(guardrail={"maxGpusPerPod": 2}), "exactly one of"),
    "no-body": (_spec(sharing=None), "exactly one of"),
    "restart-without-namespaces": (_spec(sharing={"strategy": "MIG", "rollout": "Restart"}), "rollout Restart"),
    "restart-with-namespaces": (_spec(sharing={"strategy": "MIG", "rollout": "Restart"},
                                      selector={"namespaces": ["a"]}), None),
    "autoscale-max-below-min": (_spec(sharing=None, scaleToZero={"namespaces": ["a"], "autoscale": {
        "targetUtilizationPercent": 50, "min": 3, "max": 2}}), "max must be >= min"),
    "autoscale-fine": (_spec(sharing=None, scaleToZero={"namespaces": ["a"], "autoscale": {
        "targetUtilizationPercent": 50, "max": 2}}), None),
}


def test_every_rule_is_exercised() -> None:
    messages = {rule["message"] for _, rule in RULES}
    expected = {needle for _, needle in CASES.values() if needle}
    assert all(any(needle in m for m in messages) for needle in expected)
    assert len(messages) == len(expected)


@pytest.mark.parametrize("name", list(CASES))
def test_rules_refuse_what_the_model_refuses(name: str) -> None:
    policy, needle = CASES[name]
    failed = failing_rules(policy)
    try:
        parse_policy(policy)
        model_ok = True
    except ValidationError:
        model_ok = False
    if needle is None:
        assert failed == [] and model_ok
    else:
        assert any(needle in m for m in failed), failed
        assert not model_ok
