"""How `kubeon-gpu dry-run` writes its answers: one entry per evaluated object, written as it is decided.

One shape for every machine format: each entry is the POST /dry-run answer
for one object (`allowed`, `object`, `patch`, `warnings`, `decisions`, and
`message`/`note` when set), in input order, plus `scaledObjects` for a
Deployment or StatefulSet a ScaleToZero policy with `autoscale` selects: the
KEDA ScaledObject the controller offers while KEDA writes are off, as
`policy`, `name` and `yaml` (gpupolicy/scaling/autoscale.py `offers`).

- `-o json`: a JSON list, written incrementally (byte for byte what
  `json.dumps(entries, indent=2)` gives for ASCII input; other text is UTF-8).
- `-o yaml`: a YAML stream, one document per entry (`yaml.safe_load_all` gives
  the same list), without anchors or aliases.
- `-o jsonl`: JSON Lines, one entry per line.
- `-o text`: the readable summary.

Nothing is held after it is written, so memory does not grow with the input.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from functools import lru_cache
from typing import Any, TextIO

import orjson
import yaml

from cli import yamlblock
from gpupolicy.admission.mutate import AdmissionResult
from gpupolicy.cluster import ClusterView
from gpupolicy.model import GpuPolicy

try:
    from yaml import CSafeDumper as _BaseDumper
except ImportError:  # pragma: no cover - PyYAML without libyaml
    from yaml import SafeDumper as _BaseDumper  # type: ignore[assignment]

FORMATS = ("text", "yaml", "json", "jsonl")


_STR, _INT, _BOOL, _NULL = (f"tag:yaml.org,2002:{t}" for t in ("str", "int", "bool", "null"))
_MAP, _SEQ = "tag:yaml.org,2002:map", "tag:yaml.org,2002:seq"


class _NoAliasDumper(_BaseDumper):
    """The safe dumper's output, without anchors or aliases, at a fraction of its Python cost.

    A repeated object is written out again (`ignore_aliases`). Plain JSON-like
    data (dicts, lists, str, int, bool, None) becomes nodes in one tight
    function making exactly the nodes SafeRepresenter makes with
    default_flow_style=False; anything else (floats, dates, ...) goes to
    SafeRepresenter. Implicit-tag resolution, asked twice per scalar by the
    serializer, is cached: keys and values repeat across objects.
    """

    def ignore_aliases(self, data: Any) -> bool:
        return True

    def represent_data(self, data: Any) -> yaml.Node:
        kind = type(data)
        if kind is str:
            return yaml.ScalarNode(_STR, data)
        if kind is dict:
            pairs = [(self.represent_data(k), self.represent_data(v)) for k, v in data.items()]
            return yaml.MappingNode(_MAP, pairs, flow_style=False)
        if kind is list:
            return yaml.SequenceNode(_SEQ, [self.represent_data(v) for v in data], flow_style=False)
        if kind is int:
            return yaml.ScalarNode(_INT, str(data))
        if kind is bool:
            return yaml.ScalarNode(_BOOL, "true" if data else "false")
        if data is None:
            return yaml.ScalarNode(_NULL, "null")
        return super().represent_data(data)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The serializer asks these per node; without path resolvers they do nothing but cost a call.
        self.descend_resolver = _NO_PATH.get  # type: ignore[method-assign, assignment]
        self.ascend_resolver = tuple  # type: ignore[method-assign, assignment]

    def resolve(self, kind: Any, value: Any, implicit: Any) -> Any:
        if kind is yaml.ScalarNode:
            return _resolve_scalar(value, implicit)
        return _MAP if kind is yaml.MappingNode else _SEQ


_NO_PATH: dict[Any, Any] = {}  # .get(parent, index) returns index and changes nothing


@lru_cache(maxsize=1 << 16)
def _resolve_scalar(value: str, implicit: tuple[bool, bool]) -> Any:
    return _RESOLVER.resolve(yaml.ScalarNode, value, implicit)  # type: ignore[no-untyped-call]


_RESOLVER = yaml.resolver.Resolver()


def _reads_as_str(text: str) -> bool:
    """Whether `text` written plain reads back as a string (what the dumper asks before writing it plain).

    The resolver tries only the implicit resolvers filed under the text's first character (and
    those filed under None, if any): with none there, it is a string without matching a pattern.
    """
    table = _RESOLVER.yaml_implicit_resolvers
    if text and text[0] not in table and None not in table and not _RESOLVER.yaml_path_resolvers:
        return True
    return bool(_resolve_scalar(text, (True, False)) == _STR)


def yaml_document(entry: Mapping[str, Any]) -> str:
    """One entry as a YAML document: cli/yamlblock.py's direct writer, or the libyaml dumper for what it
    does not reproduce (the two write the same bytes where both apply)."""
    if type(entry) is dict:
        try:
            return yamlblock.dump(entry, _reads_as_str)
        except yamlblock.Unsupported:
            pass
    return str(yaml.dump(entry, Dumper=_NoAliasDumper, sort_keys=False, allow_unicode=True))


def _json(entry: Any, indent: bool) -> bytes:
    option = orjson.OPT_NON_STR_KEYS | (orjson.OPT_INDENT_2 if indent else 0)
    try:
        return orjson.dumps(entry, option=option)
    except (orjson.JSONEncodeError, TypeError):  # >64-bit integers, odd keys: the slower, laxer encoder
        return json.dumps(_finite(entry), indent=2 if indent else None, ensure_ascii=False, default=str).encode()


def _finite(value: Any) -> Any:
    """`value` with NaN and the infinities (YAML's .nan, .inf) as null, which orjson writes for them: the json
    module would write NaN and Infinity, which are not JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def encode(entry: Mapping[str, Any], output: str) -> str:
    """One entry in a machine format; raises RecursionError/ValueError for what cannot be written."""
    if output == "yaml":
        return yaml_document(entry)
    return _json(entry, indent=output == "json").decode()


def _policy_mode(policy: GpuPolicy, view: ClusterView) -> str:
    """The mode the optimizer enforces, and why when it is lower than the one requested."""
    eff = view.mode_of(policy)
    return f"{policy.name} ({eff.mode}" + (f"; {eff.degraded_reason})" if eff.degraded else ")")


class Writer:
    """Writes entries as they come; `close` ends the list. Encoding happens before anything is written."""

    def __init__(self, out: TextIO, output: str) -> None:
        self.out, self.output, self.count = out, output, 0

    def header(self, view: ClusterView, catalog_note: str) -> None:
        if self.output != "text":
            return
        policies = ", ".join(_policy_mode(p, view) for p in view.policies)
        self.out.write(f"Policies: {policies}\n" if policies else "Policies: none (nothing will change)\n")
        if view.nodes:
            self.out.write("Nodes: " + ", ".join(f"{n.name} ({n.gpu_product or 'no GPU label'})"
                                                 for n in view.nodes) + "\n")
        elif catalog_note:
            self.out.write(f"Nodes: {catalog_note}\n")

    def write(self, obj: Mapping[str, Any], result: AdmissionResult,
              scaled_objects: list[dict[str, str]] | None = None, lowered: list[dict[str, str]] | None = None) -> None:
        if self.output == "text":
            text = render_entry(obj, result, scaled_objects, lowered)
        else:
            entry = result.to_wire()
            if scaled_objects:
                entry = {**entry, "scaledObjects": scaled_objects}
            if lowered:
                entry = {**entry, "enforcedBelowRequested": lowered}
            text = encode(entry, self.output)
        if self.output == "json":
            text = ("[\n  " if self.count == 0 else ",\n  ") + text.replace("\n", "\n  ")
        elif self.output == "yaml" and self.count:
            text = "---\n" + text
        elif self.output == "jsonl":
            text += "\n"
        self.out.write(text)
        self.count += 1

    def close(self) -> None:
        if self.output == "json":
            self.out.write("[]\n" if self.count == 0 else "\n]\n")
        self.out.flush()


def title(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    return f"{obj.get('kind')} {meta.get('namespace') or 'default'}/{meta.get('name', '?')}"


def render_entry(obj: Mapping[str, Any], result: AdmissionResult, scaled_objects: list[dict[str, str]] | None = None,
                 lowered: list[dict[str, str]] | None = None) -> str:
    """A summary a newcomer can read: the object (and, on its line, each policy enforced below its requested
    mode, with why), each policy's decision, the warnings, the patch."""
    verdict = "allowed" if result.allowed else f"DENIED: {result.message}"
    changed = f"{len(result.patch)} patch operations" if result.patch else "unchanged"
    below = "".join(f"; {m['policy']} enforced {m['enforced']}, not {m['requested']} as requested: {m['reason']}"
                    for m in lowered or ())
    lines = ["", f"{title(obj)}: {verdict}, {changed}{below}"]
    if result.note and not result.decisions:
        lines.append(f"  - {result.note}")
    for d in result.decisions:
        state = "applied" if d.applied else "not applied"
        lines.append(f"  - {d.policy} [{d.mode}] {d.action}, {state}: {d.reason}")
    for warning in result.warnings:
        lines.append(f"  ! warning: {warning}")
    for op in result.patch:
        value = "" if "value" not in op else " " + json.dumps(op["value"], separators=(",", ":"), default=str)
        if len(value) > 90:
            value = value[:87] + "..."
        lines.append(f"    {op['op']:7} {op['path']}{value}")
    if obj.get("kind") in ("ResourceClaimTemplate", "ResourceClaim"):  # the dry-run's entry for a claim a pod names
        spec = obj["spec"]["spec"] if obj["kind"] == "ResourceClaimTemplate" else obj["spec"]
        for request in spec["devices"]["requests"]:
            exactly = request["exactly"]
            lines.append(f"    request {request['name']}: {exactly['count']} x {exactly['deviceClassName']}")
            lines.extend(f"      where {s['cel']['expression']}" for s in exactly.get("selectors") or ())
    for offer in scaled_objects or ():
        lines.append(f"  + {offer['policy']} recommends KEDA ScaledObject {offer['name']} "
                     "(apply it yourself; the controller writes it only with keda.enabled=true):")
        lines.extend("      " + line for line in offer["yaml"].rstrip("\n").split("\n"))
    return "\n".join(lines) + "\n"
