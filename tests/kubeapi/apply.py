"""Server-side apply and managedFields, after upstream's structured-merge-diff as the
Kubernetes docs describe it (reference/using-api/server-side-apply).

A field set is a set of paths; a path is a tuple of FieldsV1 elements: `f:<field>`,
`k:<json of the key fields>` (an element of a list with list-map keys), `v:<json value>`
(an element of a set), `i:<index>` is never produced (other lists are atomic, owned whole).
Members are the leaves a manager set (scalars, atomic lists and maps, empty objects) and the
elements of associative lists; struct and map nodes above them are only prefixes.

- apply: the config merges into the live object (maps by key, list-maps by their keys, sets
  as a union, everything else replaced); a changed field owned by another manager is a
  conflict (409, the upstream message and FieldManagerConflict causes) unless force, which
  takes the field away from them (manager "kubectl" takes the fields of kubectl's
  last-applied-configuration without conflict: the upgrade from client-side apply); fields
  the manager applied before and no longer applies are removed unless another manager still
  owns them (or something under them).
- update (create, PUT, non-apply PATCH): the writer owns the fields it changed, the others
  lose them; fields gone from the object leave every set.

List semantics come from the schema: `x-kubernetes-list-type`/`-list-map-keys`/`-map-type`
for custom resources (no list type: atomic), and for built-in types the table below (the
`+listType`/`+listMapKey` markers of the Go types the project writes; others atomic).
"""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from typing import Any

from tests.kubeapi.status import ApiError

Path = tuple[str, ...]
FieldSet = set[Path]
_IGNORED_META = {"name", "namespace", "uid", "resourceVersion", "generation", "creationTimestamp", "selfLink",
                 "managedFields", "deletionTimestamp", "deletionGracePeriodSeconds"}
# Built-in list-maps: field name -> keys ('' parent-dependent below); sets of scalars.
_BUILTIN_MAPS: dict[str, tuple[str, ...]] = {
    "containers": ("name",), "initContainers": ("name",), "ephemeralContainers": ("name",),
    "env": ("name",), "volumes": ("name",), "volumeMounts": ("mountPath",), "volumeDevices": ("devicePath",),
    "imagePullSecrets": ("name",), "hostAliases": ("ip",), "conditions": ("type",), "ownerReferences": ("uid",),
    "topologySpreadConstraints": ("topologyKey", "whenUnsatisfiable"), "resourceClaims": ("name",),
    "webhooks": ("name",), "containerStatuses": ("name",), "initContainerStatuses": ("name",),
}
_BUILTIN_SETS = {"finalizers"}
_BUILTIN_ATOMIC_MAPS = {"selector", "nodeSelector"}  # LabelSelector structType=atomic, mapType=atomic
_KEY_DEFAULTS = {"protocol": "TCP"}


class Schema:
    """How a node merges: a CRD OpenAPI node, or a built-in field name."""

    def __init__(self, node: dict[str, Any] | None, field: str = "", parent: str = "") -> None:
        self.node, self.field, self.parent = node, field, parent

    @property
    def builtin(self) -> bool:
        return self.node is None

    def child(self, name: str) -> Schema:
        if self.node is None:
            return Schema(None, name, self.field)
        props = self.node.get("properties") or {}
        if name in props:
            return Schema(props[name])
        extra = self.node.get("additionalProperties")
        return Schema(extra if isinstance(extra, dict) else {"x-kubernetes-preserve-unknown-fields": True})

    def items(self) -> Schema:
        if self.node is None:
            return Schema(None, "", self.field)
        return Schema(self.node.get("items") or {})

    def list_type(self, value: list[Any]) -> tuple[str, tuple[str, ...]]:
        """('map', keys) | ('set', ()) | ('atomic', ())."""
        if self.node is not None:
            kind = self.node.get("x-kubernetes-list-type", "atomic")
            return kind, tuple(self.node.get("x-kubernetes-list-map-keys") or ())
        if self.field in _BUILTIN_SETS:
            return "set", ()
        if self.field == "ports":
            service = any(isinstance(v, dict) and "port" in v and "containerPort" not in v for v in value)
            return "map", (("port", "protocol") if service else ("containerPort", "protocol"))
        if self.field in _BUILTIN_MAPS:
            return "map", _BUILTIN_MAPS[self.field]
        return "atomic", ()

    def atomic_map(self) -> bool:
        if self.node is not None:
            return self.node.get("x-kubernetes-map-type") == "atomic"
        return self.field in _BUILTIN_ATOMIC_MAPS


def _key(item: Any, keys: tuple[str, ...]) -> str:
    item = item if isinstance(item, dict) else {}
    return "k:" + json.dumps({k: item.get(k, _KEY_DEFAULTS.get(k)) for k in keys}, sort_keys=True,
                             separators=(",", ":"))


# field sets -------------------------------------------------------------------------------------
def field_set(obj: dict[str, Any], schema: Schema, status: bool = False) -> FieldSet:
    """The members of an object (or of its status alone, for the status subresource)."""
    out: FieldSet = set()
    if status:
        if "status" in obj:
            _walk(obj["status"], schema.child("status"), ("f:status",), out)
        return out
    for k, v in obj.items():
        if k in ("apiVersion", "kind", "status"):
            continue
        if k == "metadata" and isinstance(v, dict):
            for mk, mv in v.items():
                if mk not in _IGNORED_META:
                    _walk(mv, schema.child("metadata").child(mk), ("f:metadata", f"f:{mk}"), out)
            continue
        _walk(v, schema.child(k), (f"f:{k}",), out)
    return out


def _walk(value: Any, schema: Schema, path: Path, out: FieldSet) -> None:
    if isinstance(value, dict) and value and not schema.atomic_map():
        for k, v in value.items():
            _walk(v, schema.child(k), (*path, f"f:{k}"), out)
        return
    if isinstance(value, list) and value:
        kind, keys = schema.list_type(value)
        if kind == "map":
            for item in value:
                elem = (*path, _key(item, keys))
                out.add(elem)
                if isinstance(item, dict):
                    for k, v in item.items():
                        _walk(v, schema.items().child(k), (*elem, f"f:{k}"), out)
            return
        if kind == "set":
            out.update((*path, "v:" + json.dumps(v, sort_keys=True, separators=(",", ":"))) for v in value)
            return
    out.add(path)


def to_fields_v1(fields: FieldSet) -> dict[str, Any]:
    root: dict[str, Any] = {}
    for path in sorted(fields):
        node = root
        for elem in path:
            node = node.setdefault(elem, {})
        node["."] = {}
    return _tidy(root)


def _tidy(node: dict[str, Any]) -> dict[str, Any]:
    children = {k: _tidy(v) for k, v in node.items() if k != "."}
    if "." in node and children:
        return {".": {}, **children}
    return children


def from_fields_v1(tree: Any, prefix: Path = ()) -> FieldSet:
    out: FieldSet = set()
    if not isinstance(tree, dict):
        return out
    if (not tree or "." in tree) and prefix:
        out.add(prefix)
    for k, v in tree.items():
        if k != ".":
            out |= from_fields_v1(v, (*prefix, k))
    return out


def path_string(path: Path) -> str:
    """Upstream's rendering: .spec.containers[name="c"].image, .metadata.finalizers[="x"]."""
    out = ""
    for elem in path:
        kind, text = elem[0], elem[2:]
        if kind == "f":
            out += "." + text
        elif kind == "k":
            out += "[" + ",".join(f"{k}={json.dumps(v)}" for k, v in json.loads(text).items()) + "]"
        elif kind == "v":
            out += f"[={text}]"
    return out


# values at paths --------------------------------------------------------------------------------
_MISSING = object()


def value_at(obj: Any, path: Path, schema: Schema) -> Any:
    cur = obj
    for elem in path:
        kind, text = elem[0], elem[2:]
        if kind == "f":
            cur = cur.get(text, _MISSING) if isinstance(cur, dict) else _MISSING
            schema = schema.child(text)
        elif kind == "k":
            keys = tuple(json.loads(text))
            cur = next((i for i in cur if _key(i, keys) == elem), _MISSING) if isinstance(cur, list) else _MISSING
            schema = schema.items()
        elif kind == "v":
            want = json.loads(text)
            cur = want if isinstance(cur, list) and want in cur else _MISSING
        if cur is _MISSING:
            return _MISSING
    return cur


def remove_at(obj: dict[str, Any], path: Path) -> None:
    parent: Any = obj
    for elem in path[:-1]:
        kind, text = elem[0], elem[2:]
        if kind == "f":
            parent = parent.get(text) if isinstance(parent, dict) else None
        elif kind == "k":
            keys = tuple(json.loads(text))
            parent = next((i for i in parent if _key(i, keys) == elem), None) if isinstance(parent, list) else None
        if parent is None:
            return
    kind, text = path[-1][0], path[-1][2:]
    if kind == "f" and isinstance(parent, dict):
        parent.pop(text, None)
    elif isinstance(parent, list):
        if kind == "k":
            keys = tuple(json.loads(text))
            parent[:] = [i for i in parent if _key(i, keys) != path[-1]]
        elif kind == "v":
            parent[:] = [i for i in parent if i != json.loads(text)]


# merging ----------------------------------------------------------------------------------------
def merge(live: Any, config: Any, schema: Schema) -> Any:
    if isinstance(config, dict) and isinstance(live, dict) and not schema.atomic_map():
        out = copy.deepcopy(live)
        for k, v in config.items():
            if v is None:
                out.pop(k, None)
            else:
                out[k] = merge(live.get(k), v, schema.child(k))
        return out
    if isinstance(config, list) and isinstance(live, list):
        kind, keys = schema.list_type(config + live)
        if kind == "map":
            out_list = copy.deepcopy(live)
            for item in config:
                idx = next((i for i, e in enumerate(out_list) if _key(e, keys) == _key(item, keys)), None)
                if idx is None:
                    out_list.append(copy.deepcopy(item))
                else:
                    out_list[idx] = merge(out_list[idx], item, schema.items())
            return out_list
        if kind == "set":
            return copy.deepcopy(live) + [v for v in config if v not in live]
    return copy.deepcopy(config)


# managedFields ----------------------------------------------------------------------------------
def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _entries(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in (obj.get("metadata") or {}).get("managedFields") or [] if isinstance(e, dict)]


def _ident(entry: dict[str, Any]) -> tuple[str, str, str]:
    return entry.get("manager", ""), entry.get("operation", ""), entry.get("subresource", "")


def _sets(obj: dict[str, Any]) -> dict[tuple[str, str, str], tuple[dict[str, Any], FieldSet]]:
    return {_ident(e): (e, from_fields_v1(e.get("fieldsV1"))) for e in _entries(obj)}


def _store(sets: dict[tuple[str, str, str], tuple[dict[str, Any], FieldSet]], mine: tuple[str, str, str],
           api_version: str, before: FieldSet | None) -> list[dict[str, Any]]:
    """managedFields from the sets; `mine` gets a new timestamp only when its fields changed
    (a repeated identical apply is a no-op, as upstream)."""
    out = []
    for ident, (entry, fields) in sets.items():
        if not fields:
            continue
        entry = dict(entry)
        if ident == mine and fields != before:
            entry.update(manager=ident[0], operation=ident[1], apiVersion=api_version, time=now(),
                         fieldsType="FieldsV1")
            if ident[2]:
                entry["subresource"] = ident[2]
        entry["fieldsV1"] = to_fields_v1(fields)
        out.append(entry)
    return out


def _client_side_applied(live: dict[str, Any], schema: Schema) -> FieldSet:
    """Fields of kubectl's last-applied-configuration: `kubectl apply --server-side` (manager
    "kubectl") takes them over without conflicts, upstream's upgrade from client-side apply."""
    text = ((live.get("metadata") or {}).get("annotations") or {}).get(
        "kubectl.kubernetes.io/last-applied-configuration")
    try:
        last = json.loads(text) if text else None
    except ValueError:
        return set()
    return field_set(last, schema) if isinstance(last, dict) else set()


def _is_key_field(path: Path) -> bool:
    """A key field of a list-map element (kept while the element is)."""
    return len(path) >= 2 and path[-2].startswith("k:") and path[-1][2:] in json.loads(path[-2][2:])


def _owned_under(fields: FieldSet, path: Path) -> bool:
    n = len(path)
    return any(p[:n] == path for p in fields)


def apply(live: dict[str, Any] | None, config: dict[str, Any], schema: Schema, manager: str, force: bool,
          api_version: str, subresource: str = "") -> dict[str, Any]:
    """The object after `manager` applies `config` to `live` (None: created), managedFields
    updated; raises the upstream 409 on conflicts without force."""
    status_only = subresource == "status"
    applied = field_set(config, schema, status=status_only)
    base = live if live is not None else {}
    merged = merge(base, config, schema)
    mine = (manager, "Apply", subresource)
    sets = _sets(base)
    prev = sets.get(mine, ({}, set()))[1]
    conflicts: dict[tuple[str, str, str], list[Path]] = {}
    parents = {q[:i] for q in applied for i in range(1, len(q))}  # elements with members below: not compared
    for ident, (_entry, fields) in sets.items():
        if ident == mine:
            continue
        changed = [p for p in (applied & fields) - parents
                   if value_at(base, p, schema) != value_at(merged, p, schema)]
        if changed:
            conflicts[ident] = sorted(changed)
    if conflicts and not force:
        allowed = _client_side_applied(base, schema) if manager == "kubectl" else set()
        left = {i: [p for p in paths if p not in allowed] for i, paths in conflicts.items()}
        left = {i: paths for i, paths in left.items() if paths}
        if left:
            raise conflict_error(left, sets)
    for ident, paths in conflicts.items():
        sets[ident] = (sets[ident][0], sets[ident][1] - set(paths))
    others: FieldSet = set().union(*(f for i, (_, f) in sets.items() if i != mine)) if sets else set()
    for path in sorted(prev - applied, key=len):  # outermost first: an element goes whole
        if not _owned_under(others, path) and not _owned_under(applied, path) and not _is_key_field(path):
            remove_at(merged, path)
    sets[mine] = (sets.get(mine, ({}, set()))[0], applied)
    merged.setdefault("metadata", {})["managedFields"] = _store(sets, mine, api_version,
                                                                prev if mine in _sets(base) else None)
    return dict(merged)


def _manager_text(entry: dict[str, Any], ident: tuple[str, str, str]) -> str:
    """As upstream's printManager: Update managers with their version and time."""
    text = f'"{ident[0]}"'
    if ident[2]:
        text += f' with subresource "{ident[2]}"'
    if ident[1] == "Update":
        text += f" using {entry.get('apiVersion', '')}" + (f" at {entry['time']}" if entry.get("time") else "")
    return text


def conflict_error(conflicts: dict[tuple[str, str, str], list[Path]],
                   sets: dict[tuple[str, str, str], tuple[dict[str, Any], FieldSet]]) -> ApiError:
    """409 with upstream's message (one conflict on a line; several grouped by sorted manager)."""
    flat = [(ident, p) for ident, paths in conflicts.items() for p in paths]
    causes = [{"reason": "FieldManagerConflict", "message": f"conflict with {_manager_text(sets[i][0], i)}",
               "field": path_string(p)} for i, p in flat]
    if len(flat) == 1:
        ident, path = flat[0]
        message = f"Apply failed with 1 conflict: conflict with {_manager_text(sets[ident][0], ident)}: " \
                  f"{path_string(path)}"
    else:
        lines = []
        for ident in sorted(conflicts, key=lambda i: _manager_text(sets[i][0], i)):
            lines.append(f"conflicts with {_manager_text(sets[ident][0], ident)}:")
            lines += [f"- {path_string(p)}" for p in conflicts[ident]]
        message = f"Apply failed with {len(flat)} conflicts: " + "\n".join(lines)
    return ApiError(409, "Conflict", message, {"causes": causes})


def update(old: dict[str, Any] | None, new: dict[str, Any], schema: Schema, manager: str, api_version: str,
           subresource: str = "") -> None:
    """Ownership after a non-apply write of `new` over `old` (None: create), in place on new."""
    status_only = subresource == "status"
    sets = _sets(old or {})
    if "managedFields" in (new.get("metadata") or {}) and old is not None and \
            new["metadata"]["managedFields"] != (old.get("metadata") or {}).get("managedFields"):
        if not new["metadata"]["managedFields"]:
            new["metadata"].pop("managedFields")
        return  # the writer set managedFields itself (upstream: taken as sent; [] resets)
    present = field_set(new, schema, status=status_only)
    before = field_set(old, schema, status=status_only) if old is not None else set()
    changed = {p for p in present if p not in before or value_at(old, p, schema) != value_at(new, p, schema)}
    mine = (manager, "Update", subresource)
    if not sets and not changed:
        return
    remaining = present | field_set(new, schema, status=not status_only)
    prev = sets.get(mine, ({}, None))[1]
    for ident, (entry, fields) in list(sets.items()):
        sets[ident] = (entry, (fields & remaining) - (set() if ident == mine else changed))
    if changed:
        sets[mine] = (sets.get(mine, ({}, set()))[0], sets.get(mine, ({}, set()))[1] | changed)
    new.setdefault("metadata", {})["managedFields"] = _store(sets, mine, api_version, prev)
    if not new["metadata"]["managedFields"]:
        new["metadata"].pop("managedFields")


def manager_from(field_manager: str | None, user_agent: str) -> str:
    """fieldManager, else the User-Agent up to its first '/' (as upstream)."""
    if field_manager:
        return field_manager
    return (user_agent or "unknown").split("/")[0][:128]
