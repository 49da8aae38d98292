"""The GpuPolicy CRD generated from the model: structural rules, columns, and the checked-in file.

Real: gpupolicy.crd, the `kubeon-gpu crd` command, the file under manifests/,
and kubernetes-validate's upstream CustomResourceDefinition schema. Faked:
nothing; no API server is started (structural rules are checked here).
"""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import yaml

from cli.crd import render
from cli.main import main
from gpupolicy.crd import build_crd

CHECKED_IN = Path(__file__).resolve().parents[2] / "manifests" / "crd" / "gpupolicies.gpu.kubeon.io.yaml"


def walk(node, path="schema"):
    yield path, node
    for name, sub in (node.get("properties") or {}).items():
        yield from walk(sub, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from walk(node["additionalProperties"], f"{path}{{}}")


def test_checked_in_crd_is_fresh() -> None:
    assert CHECKED_IN.read_text(encoding="utf-8") == render(), (
        "manifests/crd/gpupolicies.gpu.kubeon.io.yaml is stale: run "
        "`kubeon-gpu crd --out manifests/crd/gpupolicies.gpu.kubeon.io.yaml`")


def test_crd_identity_and_columns() -> None:
    crd = build_crd()
    spec = crd["spec"]
    assert crd["metadata"]["name"] == "gpupolicies.gpu.kubeon.io"
    assert spec["scope"] == "Cluster" and spec["names"]["shortNames"] == ["gpup"]
    version = spec["versions"][0]
    assert version["name"] == "v1alpha1" and version["subresources"] == {"status": {}}
    assert [c["name"] for c in version["additionalPrinterColumns"]] == ["Kind", "Mode", "Requested", "Priority",
                                                                         "Hub", "Via", "Age"]
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns["Mode"] == ".status.effectiveMode" and columns["Requested"] == ".status.requestedMode"


def test_schema_is_structural() -> None:
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in walk(schema):
        for banned in ("anyOf", "oneOf", "allOf", "$ref", "$defs", "default", "title"):
            assert banned not in node, f"{path} has {banned}"
        assert "type" in node or node.get("x-kubernetes-preserve-unknown-fields"), f"{path} has no type"
        assert not ("properties" in node and "additionalProperties" in node), path
    spec = schema["properties"]["spec"]["properties"]
    assert spec["mode"]["enum"] == ["Recommend", "Approve", "Automatic"]
    assert spec["sharing"]["properties"]["strategy"]["enum"] == ["MIG", "TimeSlicing"]
    assert set(spec) >= {"sharing", "scaleToZero", "packing", "typeFit", "capacity", "guardrail"}
    assert schema["properties"]["metadata"] == {"type": "object"}
    status = schema["properties"]["status"]
    assert status.get("x-kubernetes-preserve-unknown-fields") is True
    assert "x-kubernetes-preserve-unknown-fields" not in schema["properties"]["spec"]


def test_crd_valid_against_upstream_schema() -> None:
    assert kubernetes_validate.validate(build_crd(), "1.30", strict=True) is not None


def test_cli_writes_file(tmp_path: Path) -> None:
    out = tmp_path / "crd.yaml"
    assert main(["crd", "--out", str(out)]) == 0
    assert yaml.safe_load(out.read_text())["kind"] == "CustomResourceDefinition"


def test_cli_names_an_out_it_cannot_write(tmp_path: Path, capsys) -> None:
    """A directory or a missing parent was an IsADirectoryError / FileNotFoundError traceback."""
    assert main(["crd", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"kubeon-gpu crd: --out {tmp_path}: Is a directory\n"
    missing = tmp_path / "no" / "crd.yaml"
    assert main(["crd", "--out", str(missing)]) == 2
    assert capsys.readouterr().err == f"kubeon-gpu crd: --out {missing}: No such file or directory\n"
