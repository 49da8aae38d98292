"""Kubernetes protobuf bodies (`application/vnd.kubernetes.protobuf`) to and from the JSON
dicts the registry works on.

The wire format, as upstream's runtime/serializer/protobuf: the magic `k8s\\x00`, then a
runtime.Unknown whose typeMeta names apiVersion/kind and whose raw holds the object's
message (the generated messages in proto/, made from upstream's generated.proto by
scripts/gen-kubeapi-proto.sh). Watch streams are frames of a 4-byte big-endian length and
a meta.v1.WatchEvent whose object.raw is such an envelope.

google.protobuf.json_format does not write Kubernetes JSON, so the mapping is done here
from the descriptors plus proto/gofields.json (read from the Go types): JSON names and
inlined structs (Volume.volumeSource), Go's omitempty (the Go side writes every non-pointer
field, so a zero string on the wire is "absent" unless the field is a pointer or not
omitempty), and the types with their own JSON: Time/MicroTime (RFC 3339), Duration (Go
duration string), Quantity (string), IntOrString (int or string), RawExtension and
FieldsV1 (embedded JSON), named slice types (Verbs: a list), bytes (base64).
"""

from __future__ import annotations

import base64
import importlib
import json
import re
import struct
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError, Message
from google.protobuf.message_factory import GetMessageClass

from tests.kubeapi import status

MEDIA = "application/vnd.kubernetes.protobuf"
WATCH_MEDIA = MEDIA + ";stream=watch"
MAGIC = b"k8s\x00"
_META = "k8s.io.apimachinery.pkg.apis.meta.v1"
_MODULES = ("api.core.v1", "api.apps.v1", "api.policy.v1", "api.autoscaling.v1", "api.autoscaling.v2",
            "api.batch.v1", "api.rbac.v1", "api.coordination.v1", "api.events.v1", "api.scheduling.v1",
            "api.admissionregistration.v1", "apimachinery.pkg.apis.meta.v1", "apimachinery.pkg.runtime")
# Kinds served under any group version whose messages live in meta/v1.
_META_KINDS = {"Status", "DeleteOptions", "CreateOptions", "UpdateOptions", "PatchOptions", "APIResourceList",
               "APIGroupList", "APIGroup", "APIVersions", "Table", "PartialObjectMetadata",
               "PartialObjectMetadataList", "WatchEvent"}


@cache
def _pool() -> Any:
    mods = [importlib.import_module(f"tests.kubeapi.proto.k8s.io.{m}.generated_pb2")
            for m in _MODULES]
    return mods[0].DESCRIPTOR.pool


@cache
def _gofields() -> dict[str, dict[str, list[str]]]:
    data: dict[str, dict[str, list[str]]] = json.loads((Path(__file__).parent / "proto/gofields.json").read_text())
    return data


def message_name(api_version: str, kind: str) -> str | None:
    """Full proto message name for apiVersion/kind, None when the types are not vendored."""
    group, _, version = api_version.rpartition("/")
    if kind in _META_KINDS:
        name = f"{_META}.{kind}"
    else:
        pkg = group.split(".")[0] if group else "core"
        name = f"k8s.io.api.{pkg}.{version}.{kind}"
    try:
        _pool().FindMessageTypeByName(name)
    except KeyError:
        return None
    return name


def _new(name: str) -> Message:
    msg: Message = GetMessageClass(_pool().FindMessageTypeByName(name))()
    return msg


# decoding: wire -> dict ---------------------------------------------------------------------------
def decode(raw: bytes, api_version: str, kind: str) -> dict[str, Any]:
    """A request body in the protobuf envelope as the JSON dict a client would have sent."""
    if not raw.startswith(MAGIC):
        raise status.bad_request("the body is not a Kubernetes protobuf message (no k8s\\x00 prefix)")
    try:
        unknown = _new("k8s.io.apimachinery.pkg.runtime.Unknown")
        unknown.ParseFromString(raw[len(MAGIC):])
        api_version = unknown.typeMeta.apiVersion or api_version  # type: ignore[attr-defined]
        kind = unknown.typeMeta.kind or kind  # type: ignore[attr-defined]
        name = message_name(api_version, kind)
        if name is None:
            raise status.unsupported_media_type(f"{MEDIA} for {api_version}/{kind}")
        msg = _new(name)
        msg.ParseFromString(unknown.raw)  # type: ignore[attr-defined]
    except DecodeError as exc:
        raise status.bad_request(f"error decoding protobuf body: {exc}") from None
    out = to_dict(msg)
    if kind not in _META_KINDS or kind == "DeleteOptions":
        out = {"apiVersion": api_version, "kind": kind, **out}
    return out


def to_dict(msg: Message) -> Any:
    desc = msg.DESCRIPTOR
    special = _SPECIAL_OUT.get(desc.full_name)
    if special is not None:
        return special(msg)
    info = _gofields().get(desc.full_name, {})
    if "" in info:  # named slice type
        return [_value_out(f, v) for f, v in msg.ListFields() for v in v]
    out: dict[str, Any] = {}
    for fdesc, value in msg.ListFields():
        jname, flags = info.get(fdesc.name, [fdesc.name, "o"])
        if fdesc.is_repeated:
            if _is_map(fdesc):
                conv = {k: _value_out(fdesc.message_type.fields_by_name["value"], value[k]) for k in value}
                if conv:
                    out[jname] = conv
            elif len(value):
                out[jname] = [_value_out(fdesc, v) for v in value]
            continue
        conv = _value_out(fdesc, value)
        if fdesc.type == FieldDescriptor.TYPE_MESSAGE:
            if conv is None or ("z" in flags and conv in ({}, "")):
                continue
            if "i" in flags:
                out.update(conv)
                continue
        elif "p" not in flags and "o" in flags and not conv:
            continue
        out[jname] = conv
    return out


def _value_out(fdesc: FieldDescriptor, value: Any) -> Any:
    if fdesc.type == FieldDescriptor.TYPE_MESSAGE:
        return to_dict(value)
    if fdesc.type == FieldDescriptor.TYPE_BYTES:
        return base64.b64encode(value).decode()
    return value


def _is_map(fdesc: FieldDescriptor) -> bool:
    return fdesc.type == FieldDescriptor.TYPE_MESSAGE and fdesc.message_type.GetOptions().map_entry


def _time_out(msg: Any, micro: bool = False) -> str | None:
    if not msg.seconds and not msg.nanos:
        return None
    t = datetime.fromtimestamp(msg.seconds, UTC)
    if micro:
        return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{msg.nanos // 1000:06d}Z"
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _json_raw(raw: bytes) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return base64.b64encode(raw).decode()


_SPECIAL_OUT: dict[str, Any] = {
    f"{_META}.Time": _time_out,
    f"{_META}.MicroTime": lambda m: _time_out(m, micro=True),
    f"{_META}.Duration": lambda m: go_duration(m.duration),
    f"{_META}.FieldsV1": lambda m: _json_raw(m.Raw),
    "k8s.io.apimachinery.pkg.runtime.RawExtension": lambda m: _json_raw(m.raw),
    "k8s.io.apimachinery.pkg.api.resource.Quantity": lambda m: m.string,
    "k8s.io.apimachinery.pkg.util.intstr.IntOrString": lambda m: m.strVal if m.type == 1 else m.intVal,
}


# encoding: dict -> wire ---------------------------------------------------------------------------
def encode(obj: dict[str, Any]) -> bytes | None:
    """The envelope for a JSON dict with apiVersion/kind, None when its kind has no vendored message."""
    api_version, kind = obj.get("apiVersion", ""), obj.get("kind", "")
    name = message_name(api_version, kind)
    if name is None:
        return None
    msg = _new(name)
    from_dict(obj, msg)
    unknown = _new("k8s.io.apimachinery.pkg.runtime.Unknown")
    unknown.typeMeta.apiVersion = api_version  # type: ignore[attr-defined]
    unknown.typeMeta.kind = kind  # type: ignore[attr-defined]
    unknown.raw = msg.SerializeToString()  # type: ignore[attr-defined]
    return MAGIC + unknown.SerializeToString()


def watch_frame(event_type: str, envelope: bytes) -> bytes:
    """One event of a protobuf watch stream: length-prefixed meta.v1.WatchEvent."""
    event = _new(f"{_META}.WatchEvent")
    event.type = event_type  # type: ignore[attr-defined]
    event.object.raw = envelope  # type: ignore[attr-defined]
    data = event.SerializeToString()
    return struct.pack(">I", len(data)) + data


def from_dict(data: Any, msg: Message) -> None:
    desc: Descriptor = msg.DESCRIPTOR
    special = _SPECIAL_IN.get(desc.full_name)
    if special is not None:
        special(data, msg)
        return
    info = _gofields().get(desc.full_name, {})
    if "" in info:
        if isinstance(data, list):
            msg.items.extend(str(v) for v in data)  # type: ignore[attr-defined]
        return
    if not isinstance(data, dict):
        return
    for fdesc in desc.fields:
        jname, flags = info.get(fdesc.name, [fdesc.name, "o"])
        if "i" in flags:
            from_dict(data, getattr(msg, fdesc.name))
            continue
        value = data.get(jname)
        if value is None:
            continue
        target = getattr(msg, fdesc.name)
        if _is_map(fdesc):
            vdesc = fdesc.message_type.fields_by_name["value"]
            for k, v in (value.items() if isinstance(value, dict) else ()):
                if vdesc.type == FieldDescriptor.TYPE_MESSAGE:
                    from_dict(v, target[k])
                else:
                    target[k] = _scalar_in(vdesc, v)
        elif fdesc.is_repeated:
            for item in value if isinstance(value, list) else ():
                if fdesc.type == FieldDescriptor.TYPE_MESSAGE:
                    from_dict(item, target.add())
                else:
                    target.append(_scalar_in(fdesc, item))
        elif fdesc.type == FieldDescriptor.TYPE_MESSAGE:
            target.SetInParent()
            from_dict(value, target)
        else:
            setattr(msg, fdesc.name, _scalar_in(fdesc, value))


def _scalar_in(fdesc: FieldDescriptor, value: Any) -> Any:
    t = fdesc.type
    if t == FieldDescriptor.TYPE_BYTES:
        return base64.b64decode(value) if isinstance(value, str) else bytes(value)
    if t == FieldDescriptor.TYPE_STRING:
        return value if isinstance(value, str) else json.dumps(value)
    if t == FieldDescriptor.TYPE_BOOL:
        return bool(value)
    if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return float(value)
    return int(value)


def _time_in(value: Any, msg: Any) -> None:
    m = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)$", str(value))
    if not m:
        return
    t = datetime.fromisoformat(m.group(1) + ("+00:00" if m.group(3) == "Z" else m.group(3)))
    msg.seconds = int(t.timestamp())
    msg.nanos = int(float("0" + m.group(2)) * 1e9) if m.group(2) else 0


def _intstr_in(value: Any, msg: Any) -> None:
    if isinstance(value, int):
        msg.type, msg.intVal = 0, value
    else:
        msg.type, msg.strVal = 1, str(value)


def _raw_in(attr: str) -> Any:
    def set_raw(value: Any, msg: Any) -> None:
        setattr(msg, attr, json.dumps(value, separators=(",", ":")).encode())
    return set_raw


_SPECIAL_IN: dict[str, Any] = {
    f"{_META}.Time": _time_in,
    f"{_META}.MicroTime": _time_in,
    f"{_META}.Duration": lambda v, m: setattr(m, "duration", parse_go_duration(str(v))),
    f"{_META}.FieldsV1": _raw_in("Raw"),
    "k8s.io.apimachinery.pkg.runtime.RawExtension": _raw_in("raw"),
    "k8s.io.apimachinery.pkg.api.resource.Quantity": lambda v, m: setattr(m, "string", str(v)),
    "k8s.io.apimachinery.pkg.util.intstr.IntOrString": _intstr_in,
}

_UNITS = {"h": 3600 * 10**9, "m": 60 * 10**9, "s": 10**9, "ms": 10**6, "us": 10**3, "µs": 10**3, "ns": 1}


def go_duration(ns: int) -> str:
    """time.Duration.String() for whole-second and sub-second values ("1h0m0s", "1.5s", "0s")."""
    if ns == 0:
        return "0s"
    sign, ns = ("-" if ns < 0 else ""), abs(ns)
    if ns < 10**9:
        for unit in ("ms", "us", "ns"):
            if ns >= _UNITS[unit]:
                return f"{sign}{ns / _UNITS[unit]:g}{unit.replace('us', 'µs')}"
    h, rest = divmod(ns, _UNITS["h"])
    m, rest = divmod(rest, _UNITS["m"])
    secs = f"{rest / 10**9:.9f}".rstrip("0").rstrip(".")
    return sign + (f"{h}h{m}m" if h else (f"{m}m" if m else "")) + f"{secs}s"


def parse_go_duration(text: str) -> int:
    total = 0
    for number, unit in re.findall(r"([\d.]+)(h|ms|us|µs|ns|m|s)", text):
        total += int(float(number) * _UNITS[unit])
    return -total if text.startswith("-") else total


def wants_protobuf(accept: str) -> bool:
    """Answer protobuf when it is the client's first choice (kubectl's typed clients send
    `application/vnd.kubernetes.protobuf,application/json`)."""
    first = accept.split(",")[0].split(";")[0].strip()
    return first == MEDIA


# Go zero values -----------------------------------------------------------------------------------
_OWN_JSON = set(_SPECIAL_OUT)


def zero_values(obj: dict[str, Any]) -> dict[str, Any]:
    """obj as Go would write it after decoding into its type: non-pointer struct fields present
    (`spec: {}` on a Node), non-omitempty scalars present at their zero value. In place; objects
    of kinds without a vendored message are returned as they are."""
    name = message_name(obj.get("apiVersion", ""), obj.get("kind", ""))
    if name is not None:
        _fill(obj, _pool().FindMessageTypeByName(name))
    return obj


def _fill(data: dict[str, Any], desc: Descriptor) -> None:
    for step in _plan(desc.full_name):
        kind, jname = step[0], step[1]
        if kind == "inline":
            _fill(data, step[2])
            continue
        value = data.get(jname)
        if kind == "zero":
            if jname not in data:
                data[jname] = step[2]
        elif kind == "list":
            if isinstance(value, list):
                for item in value:
                    if isinstance(item, dict):
                        _fill(item, step[2])
        elif kind == "map":
            if isinstance(value, dict):
                for item in value.values():
                    if isinstance(item, dict):
                        _fill(item, step[2])
        else:  # a singular message
            if value is None and step[3]:
                value = data[jname] = {}
            if isinstance(value, dict):
                _fill(value, step[2])


@cache
def _plan(full_name: str) -> tuple[tuple[Any, ...], ...]:
    """What zero-filling does per field of a message, worked out once: ("inline", "", desc),
    ("zero", json, value), ("list"|"map", json, desc) or ("msg", json, desc, add_when_missing)."""
    desc = _pool().FindMessageTypeByName(full_name)
    info = _gofields().get(full_name, {})
    steps: list[tuple[Any, ...]] = []
    for fdesc in desc.fields:
        jname, flags = info.get(fdesc.name, [fdesc.name, "po"])
        is_msg = fdesc.type == FieldDescriptor.TYPE_MESSAGE
        if "i" in flags:
            steps.append(("inline", "", fdesc.message_type))
        elif is_msg and fdesc.message_type.full_name in _OWN_JSON:
            continue
        elif _is_map(fdesc):
            vdesc = fdesc.message_type.fields_by_name["value"]
            if vdesc.type == FieldDescriptor.TYPE_MESSAGE and vdesc.message_type.full_name not in _OWN_JSON:
                steps.append(("map", jname, vdesc.message_type))
        elif fdesc.is_repeated:
            if is_msg:
                steps.append(("list", jname, fdesc.message_type))
        elif is_msg:
            add = "p" not in flags and "z" not in flags and "" not in _gofields().get(fdesc.message_type.full_name, {})
            steps.append(("msg", jname, fdesc.message_type, add))
        elif "p" not in flags and "o" not in flags:
            steps.append(("zero", jname, _ZERO.get(fdesc.type, 0)))
    return tuple(steps)


_ZERO = {FieldDescriptor.TYPE_STRING: "", FieldDescriptor.TYPE_BOOL: False, FieldDescriptor.TYPE_BYTES: ""}
