"""The API's rules over the store: create/get/list/update/patch/delete with
resourceVersion preconditions, generation, finalizers, dryRun, admission,
CRD schemas, and the subresources (status, scale, binding, eviction).

Request flow for a write, as in kube-apiserver: decode -> defaults (and CR
pruning) -> mutating admission -> validation (CR schema, built-in checks) ->
validating admission -> store with a resourceVersion precondition. PATCH and
unconditional PUT retry on a concurrent write, like GuaranteedUpdate.
"""

from __future__ import annotations

import contextlib
import copy
import random
import string
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import yaml

from tests.kubeapi import apply as ssa
from tests.kubeapi import defaults, eviction, protobuf, schema, status
from tests.kubeapi.admission import Admission, Attributes
from tests.kubeapi.patching import APPLY, apply_patch, check_patch_type
from tests.kubeapi.resources import Catalog, Resource, from_crd
from tests.kubeapi.selectors import (
    match_fields,
    match_requirements,
    parse_fields,
    parse_labels,
    selector_string,
)
from tests.kubeapi.status import ApiError
from tests.kubeapi.store import Store

Obj = dict[str, Any]
CRDS = "apiextensions.k8s.io/customresourcedefinitions"
# Deletes answer with the object for these storage keys, with a Status for the rest (as upstream).
_RETURNS_OBJECT = {"/pods", "/namespaces", CRDS}


@dataclass
class Options:
    """Per-request options from the query string."""

    dry_run: bool = False
    field_validation: str = "Warn"  # Strict | Warn | Ignore (server default: Warn)
    warnings: list[str] = field(default_factory=list)
    field_manager: str = ""  # fieldManager, else from the User-Agent (ssa.manager_from)
    force: bool = False  # server-side apply's force
    created: bool = False  # set by an apply that created the object (answered 201)
    user_agent: str = ""

    @property
    def manager(self) -> str:
        """The manager of a non-apply write."""
        return ssa.manager_from(self.field_manager, self.user_agent)


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Registry:
    def __init__(self, store: Store, catalog: Catalog, admission: Admission) -> None:
        self.store = store
        self.catalog = catalog
        self.admission = admission

    # reads --------------------------------------------------------------------------------------
    def get(self, res: Resource, ns: str, name: str) -> Obj:
        obj = self.store.get(res.key, ns, name)
        if obj is None:
            raise status.not_found(res.plural, res.group, name)
        return present(res, obj)

    def list(self, res: Resource, ns: str | None, label_selector: str | None = None,
             field_selector: str | None = None) -> Obj:
        labels = parse_labels(label_selector)
        fields = parse_fields(field_selector, res.key)
        items, rv = self.store.list(res.key, ns)
        items = [present(res, o) for o in items
                 if match_requirements(labels, o["metadata"].get("labels")) and match_fields(fields, o)]
        return {"apiVersion": res.api_version, "kind": f"{res.kind}List",
                "metadata": {"resourceVersion": str(rv)}, "items": items}

    # create -------------------------------------------------------------------------------------
    def create(self, res: Resource, ns: str, body: Any, opts: Options, managed: list[Obj] | None = None) -> Obj:
        obj = self._decode(res, ns, body)
        meta = obj["metadata"]
        if meta.get("resourceVersion"):
            raise status.bad_request("resourceVersion should not be set on objects to be created")
        if not meta.get("name") and not meta.get("generateName"):
            raise status.invalid(res.kind, res.group, "", [("metadata.name", "FieldValueRequired",
                                                             "Required value: name or generateName is required")])
        if res.namespaced:
            self._check_namespace(ns)
        for k in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "managedFields",
                  "generation"):
            meta.pop(k, None)
        obj = self._prepare(res, obj, None, opts)
        defaults.on_create(res, obj)
        attrs = Attributes("CREATE", res, ns, meta.get("name", ""), options=_options("CreateOptions", opts),
                           dry_run=opts.dry_run)
        obj = self.admission.admit(attrs, obj, None, opts.warnings)
        obj = self._prepare(res, obj, None, opts)
        self._validate(res, obj, None)
        self.admission.validate(attrs, obj, None, opts.warnings)
        meta = obj["metadata"]
        if not meta.get("name"):
            meta["name"] = meta["generateName"] + "".join(random.choices(string.ascii_lowercase + string.digits, k=5))
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=now(), generation=1)
        if managed is not None:
            meta["managedFields"] = managed
        else:
            ssa.update(None, obj, _schema(res), opts.manager, res.api_version)
        if res.key == CRDS:
            obj = self._crd_accepted(obj)
        if opts.dry_run:
            return present(res, obj)
        try:
            stored = self.store.put(res.key, obj, create=True)
        except KeyError:
            raise status.already_exists(res.plural, res.group, meta["name"]) from None
        if res.key == CRDS:
            self.catalog.register_crd(meta["name"], from_crd(stored))
        return present(res, stored)

    # update / patch -----------------------------------------------------------------------------
    def update(self, res: Resource, ns: str, name: str, body: Any, opts: Options, sub: str = "") -> Obj:
        new = self._decode(res, ns, body)
        if new["metadata"].get("name") != name:
            raise status.bad_request(f"the name of the object ({new['metadata'].get('name')}) does not match "
                                     f"the name on the URL ({name})")
        want_rv = new["metadata"].get("resourceVersion") or None
        if want_rv is None and res.custom:
            raise status.invalid(res.kind, res.group, name, [("metadata.resourceVersion", "FieldValueInvalid",
                                                              "Invalid value: 0x0: must be specified for an update")])
        for _ in range(10):
            current = self.store.get(res.key, ns, name)
            if current is None:
                raise status.not_found(res.plural, res.group, name)
            if want_rv is not None and current["metadata"]["resourceVersion"] != want_rv:
                raise status.conflict(res.plural, res.group, name)
            try:
                return self._update(res, current, copy.deepcopy(new), opts, sub)
            except ValueError:
                if want_rv is not None:
                    raise status.conflict(res.plural, res.group, name) from None
        raise status.conflict(res.plural, res.group, name)

    def patch(self, res: Resource, ns: str, name: str, body: bytes, content_type: str, opts: Options,
              sub: str = "") -> Obj:
        if check_patch_type(content_type, res.custom) == APPLY:
            return self.apply(res, ns, name, body, opts, sub)
        for _ in range(10):
            current = self.store.get(res.key, ns, name)
            if current is None:
                raise status.not_found(res.plural, res.group, name)
            new = apply_patch(present(res, current), body, content_type, res.custom)
            meta = new.get("metadata")
            if not isinstance(meta, dict):
                raise status.bad_request("metadata must be an object")
            want_rv = meta.get("resourceVersion")
            if want_rv and want_rv != current["metadata"]["resourceVersion"]:
                raise status.conflict(res.plural, res.group, name)
            meta["resourceVersion"] = current["metadata"]["resourceVersion"]
            if meta.get("name") != name or meta.get("namespace", "") != current["metadata"].get("namespace", ""):
                raise status.bad_request("metadata.name and metadata.namespace cannot be changed by a patch")
            try:
                return self._update(res, current, new, opts, sub)
            except ValueError:
                continue
        raise status.conflict(res.plural, res.group, name)

    def apply(self, res: Resource, ns: str, name: str, body: bytes, opts: Options, sub: str = "") -> Obj:
        """Server-side apply (PATCH application/apply-patch+yaml); creates a missing object."""
        if not opts.field_manager:
            raise status.invalid("PatchOptions", "meta.k8s.io", "", [
                ("fieldManager", "FieldValueRequired", "Required value: is required for apply patch")])
        try:
            config = yaml.safe_load(body or b"")
        except yaml.YAMLError as exc:
            raise status.bad_request(f"error decoding YAML: {exc}") from None
        if not isinstance(config, dict):
            raise status.bad_request("the body of an apply patch must be an object")
        if not config.get("apiVersion") or not config.get("kind"):
            raise status.bad_request("invalid object type: apiVersion and kind must be set in an apply patch")
        config = self._decode(res, ns, config)
        if config["metadata"].get("name") not in (None, name):
            raise status.bad_request(f"the name of the object ({config['metadata'].get('name')}) does not match "
                                     f"the name on the URL ({name})")
        config["metadata"]["name"] = name
        config["metadata"].pop("managedFields", None)
        if res.has_status and sub != "status":
            config.pop("status", None)  # the main resource ignores status (resetFields)
        for _ in range(10):
            current = self.store.get(res.key, ns, name)
            if current is None:
                if sub:
                    raise status.not_found(res.plural, res.group, name)
                obj = ssa.apply(None, config, _schema(res), opts.field_manager, opts.force, res.api_version)
                managed = obj["metadata"].pop("managedFields")
                try:
                    created = self.create(res, ns, obj, opts, managed=managed)
                except ApiError as err:
                    if err.reason == "AlreadyExists":
                        continue
                    raise
                opts.created = True
                return created
            new = ssa.apply(present(res, current), config, _schema(res), opts.field_manager, opts.force,
                            res.api_version, sub)
            new["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            try:
                return self._update(res, current, new, opts, sub, track=False)
            except ValueError:
                continue
        raise status.conflict(res.plural, res.group, name)

    def _update(self, res: Resource, current: Obj, new: Obj, opts: Options, sub: str,
                admit: bool = True, track: bool = True) -> Obj:
        """Merge `new` over `current` by the subresource's rules, admit, validate and store.
        Raises ValueError when the store moved on since `current` was read."""
        cmeta = current["metadata"]
        if sub == "status":
            merged = copy.deepcopy(current)
            merged["status"] = new.get("status")
            if merged["status"] is None:
                merged.pop("status")
            new = merged
        else:
            nmeta = new["metadata"]
            for k in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "generation",
                      "namespace"):
                if k in cmeta:
                    nmeta[k] = cmeta[k]
                else:
                    nmeta.pop(k, None)
            if res.has_status:
                if "status" in current:
                    new["status"] = current["status"]
                else:
                    new.pop("status", None)
        new["metadata"]["resourceVersion"] = cmeta["resourceVersion"]
        new = self._prepare(res, new, current, opts)
        attrs = Attributes("UPDATE", res, cmeta.get("namespace", ""), cmeta["name"], subresource=sub,
                           options=_options("UpdateOptions", opts), dry_run=opts.dry_run)
        if admit:
            new = self.admission.admit(attrs, new, present(res, current), opts.warnings)
            new = self._prepare(res, new, current, opts)
        self._validate(res, new, current)
        if cmeta.get("deletionTimestamp"):
            added = set(new["metadata"].get("finalizers") or []) - set(cmeta.get("finalizers") or [])
            if added:
                raise status.invalid(res.kind, res.group, cmeta["name"], [(
                    "metadata.finalizers", "FieldValueForbidden",
                    f"Forbidden: no new finalizers can be added if the object is being deleted, found new "
                    f"finalizers {sorted(added)}")])
        if admit:
            self.admission.validate(attrs, new, present(res, current), opts.warnings)
        if track:
            ssa.update(present(res, current), new, _schema(res), opts.manager, res.api_version,
                       sub if sub == "status" else "")
        if _strip(new) == _strip(current):
            return present(res, current)  # no-op update: no new resourceVersion, no event
        if _spec_of(new, res) != _spec_of(current, res):
            new["metadata"]["generation"] = int(cmeta.get("generation", 1)) + 1
        if opts.dry_run:
            return present(res, new)
        stored = self.store.put(res.key, new, expect_rv=cmeta["resourceVersion"])
        if res.key == CRDS:
            self.catalog.register_crd(cmeta["name"], from_crd(stored))
        if stored["metadata"].get("deletionTimestamp") and not stored["metadata"].get("finalizers"):
            self._remove(res, stored)
        return present(res, stored)

    # delete -------------------------------------------------------------------------------------
    def delete(self, res: Resource, ns: str, name: str, options: Any, opts: Options) -> tuple[Obj, int]:
        options = options if isinstance(options, dict) else {}
        current = self.store.get(res.key, ns, name)
        if current is None:
            raise status.not_found(res.plural, res.group, name)
        pre = options.get("preconditions") or {}
        meta = current["metadata"]
        if pre.get("uid") and pre["uid"] != meta["uid"]:
            raise status.conflict(res.plural, res.group, name, f"Precondition failed: UID in precondition: "
                                  f"{pre['uid']}, UID in object meta: {meta['uid']}")
        if pre.get("resourceVersion") and pre["resourceVersion"] != meta["resourceVersion"]:
            raise status.conflict(res.plural, res.group, name, f"Precondition failed: ResourceVersion in "
                                  f"precondition: {pre['resourceVersion']}, ResourceVersion in object meta: "
                                  f"{meta['resourceVersion']}")
        attrs = Attributes("DELETE", res, ns, name, options=_options("DeleteOptions", opts), dry_run=opts.dry_run)
        self.admission.validate(attrs, None, present(res, current), opts.warnings)
        if opts.dry_run:
            return present(res, current), 200
        orphan = options.get("propagationPolicy") == "Orphan" or options.get("orphanDependents") is True
        gone = self.delete_object(res, current, orphan)
        if gone is None or res.key in _RETURNS_OBJECT or res.custom:
            return present(res, gone or self.store.get(res.key, ns, name) or current), 200
        return status.success({"name": name, "group": res.group, "kind": res.plural, "uid": meta["uid"]}), 200

    def delete_object(self, res: Resource, current: Obj, orphan: bool = False) -> Obj | None:
        """Delete now, or mark for deletion when finalizers hold it. Returns the deleted object,
        or None when it is only marked."""
        meta = current["metadata"]
        if meta.get("finalizers"):
            if not meta.get("deletionTimestamp"):
                marked = copy.deepcopy(current)
                marked["metadata"].update(deletionTimestamp=now(), deletionGracePeriodSeconds=0)
                with contextlib.suppress(KeyError, ValueError):
                    self.store.put(res.key, marked, expect_rv=meta["resourceVersion"])
            return None
        return self._remove(res, current, orphan)

    def _remove(self, res: Resource, obj: Obj, orphan: bool = False) -> Obj | None:
        meta = obj["metadata"]
        ns, name = meta.get("namespace", ""), meta["name"]
        if res.key == "/namespaces":
            self._empty_namespace(name)
        try:
            gone = self.store.remove(res.key, ns, name)
        except KeyError:
            return None
        if res.key == CRDS:
            self.catalog.unregister_crd(name)
            group, plural = (obj.get("spec") or {}).get("group", ""), ((obj.get("spec") or {}).get("names") or {}
                                                                      ).get("plural", "")
            for item in self.store.list(f"{group}/{plural}")[0]:
                self.store.remove(f"{group}/{plural}", item["metadata"].get("namespace", ""), item["metadata"]["name"])
        self._collect_dependents(meta["uid"], ns if res.namespaced else None, orphan)
        return gone

    def _empty_namespace(self, ns: str) -> None:
        """The namespace controller's job, done at once (finalizers on contents are not waited for)."""
        for key in self.store.kinds():
            for item in self.store.list(key, ns)[0]:
                if item["metadata"].get("namespace") == ns:
                    with contextlib.suppress(KeyError):
                        self.store.remove(key, ns, item["metadata"]["name"])

    def _collect_dependents(self, owner_uid: str, ns: str | None, orphan: bool) -> None:
        """The garbage collector, background propagation: delete objects whose owners are all gone."""
        for key in self.store.kinds():
            resources = self.catalog.by_key(key)
            for item in self.store.list(key, ns)[0]:
                refs = item["metadata"].get("ownerReferences") or []
                if not any(r.get("uid") == owner_uid for r in refs):
                    continue
                left = [r for r in refs if r.get("uid") != owner_uid]
                if orphan or left:
                    item["metadata"]["ownerReferences"] = left
                    with contextlib.suppress(KeyError, ValueError):
                        self.store.put(key, item, expect_rv=item["metadata"]["resourceVersion"])
                elif resources:
                    self.delete_object(resources[0], item)

    # subresources -------------------------------------------------------------------------------
    def bind(self, ns: str, name: str, body: Any, opts: Options) -> Obj:
        pods = self.catalog.lookup("", "v1", "pods")
        assert pods is not None
        target = (body or {}).get("target") or {}
        if not target.get("name"):
            raise status.invalid("Binding", "", name, [("target.name", "FieldValueRequired", "Required value")])
        pod = self.store.get("/pods", ns, name)
        if pod is None:
            raise status.not_found("pods", "", name)
        if pod["metadata"].get("deletionTimestamp"):
            raise status.conflict("pods/binding", "", name, f"pod {name} is being deleted, cannot be assigned "
                                  f"to a host")
        if pod["spec"].get("nodeName"):
            raise status.conflict("pods/binding", "", name, f'pod {name} is already assigned to node '
                                  f'"{pod["spec"]["nodeName"]}"')
        attrs = Attributes("CREATE", pods, ns, name, subresource="binding",
                           kind={"group": "", "version": "v1", "kind": "Binding"},
                           options=_options("CreateOptions", opts), dry_run=opts.dry_run)
        body = self.admission.admit(attrs, body, None, opts.warnings)
        self.admission.validate(attrs, body, None, opts.warnings)
        if not opts.dry_run:
            pod["spec"]["nodeName"] = target["name"]
            conds = [c for c in pod.setdefault("status", {}).get("conditions") or [] if c.get("type") != "PodScheduled"]
            conds.append({"type": "PodScheduled", "status": "True", "lastTransitionTime": now()})
            pod["status"]["conditions"] = conds
            try:
                self.store.put("/pods", pod, expect_rv=pod["metadata"]["resourceVersion"])
            except ValueError:
                raise status.conflict("pods/binding", "", name) from None
        return status.success(code=201)

    def evict(self, ns: str, name: str, body: Any, opts: Options) -> Obj:
        pods = self.catalog.lookup("", "v1", "pods")
        assert pods is not None
        pod = self.store.get("/pods", ns, name)
        if pod is None:
            raise status.not_found("pods", "", name)
        attrs = Attributes("CREATE", pods, ns, name, subresource="eviction",
                           kind={"group": "policy", "version": "v1", "kind": "Eviction"},
                           options=_options("CreateOptions", opts), dry_run=opts.dry_run)
        body = self.admission.admit(attrs, body, None, opts.warnings)
        self.admission.validate(attrs, body, None, opts.warnings)
        phase = (pod.get("status") or {}).get("phase")
        if not (phase in ("Succeeded", "Failed", "Pending") or pod["metadata"].get("deletionTimestamp")):
            budgets = eviction.matching_budgets(self.store, pod)
            if len(budgets) > 1:
                raise status.internal("This pod has more than one PodDisruptionBudget, which the eviction "
                                      "subresource does not support.")
            if budgets:
                b = eviction.budget(self.store, budgets[0])
                blocked = (b.disruptions_allowed == 0) if eviction.is_ready(pod) else (b.healthy < b.desired_healthy)
                if blocked:
                    raise ApiError(429, "TooManyRequests",
                                   "Cannot evict pod as it would violate the pod's disruption budget.",
                                   {"causes": [{"reason": "DisruptionBudget", "message":
                                                f"The disruption budget {b.name} needs {b.desired_healthy} "
                                                f"healthy pods and has {b.healthy} currently"}],
                                    "retryAfterSeconds": 0})
        if not opts.dry_run:
            self.delete(pods, ns, name, (body or {}).get("deleteOptions") or {}, Options())
        return status.success(code=201)

    def get_scale(self, res: Resource, ns: str, name: str) -> Obj:
        return self._scale_of(res, self.get(res, ns, name))

    def update_scale(self, res: Resource, ns: str, name: str, body: Any, content_type: str | None,
                     opts: Options) -> Obj:
        for _ in range(10):
            parent = self.get(res, ns, name)
            scale = self._scale_of(res, parent)
            if content_type is None:
                new = body if isinstance(body, dict) else {}
            else:
                new = apply_patch(scale, body, content_type, custom=False)
            want_rv = (new.get("metadata") or {}).get("resourceVersion")
            if want_rv and want_rv != parent["metadata"]["resourceVersion"]:
                raise status.conflict(f"{res.plural}.{res.group}" if res.group else res.plural, "", name)
            replicas = (new.get("spec") or {}).get("replicas", 0)
            if not isinstance(replicas, int) or replicas < 0:
                raise status.invalid("Scale", "autoscaling", name, [(
                    "spec.replicas", "FieldValueInvalid",
                    f"Invalid value: {replicas}: must be greater than or equal to 0")])
            attrs = Attributes("UPDATE", res, ns, name, subresource="scale",
                               kind={"group": "autoscaling", "version": "v1", "kind": "Scale"},
                               options=_options("UpdateOptions", opts), dry_run=opts.dry_run)
            new = self.admission.admit(attrs, new, scale, opts.warnings) or new
            self.admission.validate(attrs, new, scale, opts.warnings)
            updated = copy.deepcopy(parent)
            _set_path(updated, _scale_path(res, "specReplicasPath"), (new.get("spec") or {}).get("replicas", 0))
            current = self.store.get(res.key, ns, name)
            if current is None:
                raise status.not_found(res.plural, res.group, name)
            try:
                result = self._update(res, current, updated, opts, "", admit=False)
            except ValueError:
                continue
            return self._scale_of(res, result)
        raise status.conflict(res.plural, res.group, name)

    def _scale_of(self, res: Resource, parent: Obj) -> Obj:
        meta = parent["metadata"]
        sel = _get_path(parent, _scale_path(res, "labelSelectorPath"))
        return {
            "apiVersion": "autoscaling/v1", "kind": "Scale",
            "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
                         if k in meta},
            "spec": {"replicas": _get_path(parent, _scale_path(res, "specReplicasPath")) or 0},
            "status": {"replicas": _get_path(parent, _scale_path(res, "statusReplicasPath")) or 0,
                       "selector": sel if isinstance(sel, str) else selector_string(sel)},
        }

    # helpers ------------------------------------------------------------------------------------
    def _decode(self, res: Resource, ns: str, body: Any) -> Obj:
        if not isinstance(body, dict):
            raise status.bad_request("the body of the request is not a JSON object")
        obj = copy.deepcopy(body)
        api_version, kind = obj.get("apiVersion"), obj.get("kind")
        if api_version and api_version != res.api_version:
            raise status.bad_request(f"the API version in the data ({api_version}) does not match the expected "
                                     f"API version ({res.api_version})")
        if kind and kind != res.kind:
            raise status.bad_request(f"the kind in the data ({kind}) does not match the expected kind ({res.kind})")
        obj["apiVersion"], obj["kind"] = res.api_version, res.kind
        meta = obj.get("metadata")
        if meta is None:
            meta = obj["metadata"] = {}
        if not isinstance(meta, dict):
            raise status.bad_request("metadata must be an object")
        if res.namespaced:
            if meta.get("namespace") and meta["namespace"] != ns:
                raise status.bad_request("the namespace of the provided object does not match the namespace sent "
                                         "on the request")
            meta["namespace"] = ns
        else:
            meta.pop("namespace", None)
        return obj

    def _check_namespace(self, ns: str) -> None:
        nsobj = self.store.get("/namespaces", "", ns)
        if nsobj is None:
            raise status.not_found("namespaces", "", ns)
        if nsobj["metadata"].get("deletionTimestamp"):
            raise status.forbidden("namespaces", "", ns, f"unable to create new content in namespace {ns} "
                                   f"because it is being terminated")

    def _prepare(self, res: Resource, obj: Obj, old: Obj | None, opts: Options) -> Obj:
        """Built-in types: Go zero values (what decoding into the Go type gives). CRs: pruning
        and defaulting (with fieldValidation for the pruned fields)."""
        if not res.custom:
            return protobuf.zero_values(obj)
        if res.schema is None:
            return obj
        pruned_obj, pruned = schema.prune(obj, res.schema, root=True)
        if pruned and opts.field_validation == "Strict":
            texts = ", ".join(f'unknown field "{p}"' for p in pruned)
            raise status.bad_request(f'{res.kind} in version "{res.version}" cannot be handled as a {res.kind}: '
                                     f"strict decoding error: {texts}")
        if pruned and opts.field_validation == "Warn":
            opts.warnings.extend(f'unknown field "{p}"' for p in pruned if f'unknown field "{p}"' not in opts.warnings)
        return schema.apply_defaults(pruned_obj, res.schema)

    def _validate(self, res: Resource, obj: Obj, old: Obj | None) -> None:
        causes = defaults.validate(res, obj, old)
        if res.custom and res.schema is not None:
            body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
            causes += schema.validate(body, res.schema)
        if res.key == CRDS:
            causes += _crd_causes(obj)
        if causes:
            raise status.invalid(res.kind, res.group, obj["metadata"].get("name", ""), causes)

    def _crd_accepted(self, crd: Obj) -> Obj:
        spec = crd["spec"]
        storage = [v["name"] for v in spec.get("versions") or [] if v.get("storage")]
        crd["status"] = {
            "acceptedNames": spec.get("names"),
            "storedVersions": storage,
            "conditions": [{"type": t, "status": "True", "reason": r, "message": m, "lastTransitionTime": now()}
                           for t, r, m in (("NamesAccepted", "NoConflicts", "no conflicts found"),
                                           ("Established", "InitialNamesAccepted",
                                            "the initial names have been accepted"))],
        }
        return crd


def present(res: Resource, obj: Obj) -> Obj:
    """The object as seen through res's group/version (CRD conversion strategy None)."""
    out = dict(obj)
    out["apiVersion"], out["kind"] = res.api_version, res.kind
    return out


def _schema(res: Resource) -> ssa.Schema:
    if res.custom:
        return ssa.Schema(res.schema or {"x-kubernetes-preserve-unknown-fields": True})
    return ssa.Schema(None)


def _options(kind: str, opts: Options) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": kind, "apiVersion": "meta.k8s.io/v1"}
    if opts.dry_run:
        out["dryRun"] = ["All"]
    return out


def _strip(obj: Obj) -> Obj:
    out = copy.deepcopy(obj)
    out["metadata"].pop("resourceVersion", None)
    out.pop("apiVersion", None)
    out.pop("kind", None)
    return out


def _spec_of(obj: Obj, res: Resource) -> Obj:
    skip = {"metadata", "apiVersion", "kind"} | ({"status"} if res.has_status else set())
    return {k: v for k, v in obj.items() if k not in skip}


def _scale_path(res: Resource, which: str) -> str:
    builtin = {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas",
               "labelSelectorPath": ".spec.selector"}
    if res.scale_paths is not None:
        return res.scale_paths.get(which, "")
    return builtin[which]


def _get_path(obj: Obj, path: str) -> Any:
    cur: Any = obj
    for part in [p for p in path.split(".") if p]:
        cur = cur.get(part) if isinstance(cur, dict) else None
    return cur


def _set_path(obj: Obj, path: str, value: Any) -> None:
    parts = [p for p in path.split(".") if p]
    cur = obj
    for part in parts[:-1]:
        cur = cur.setdefault(part, {})
    cur[parts[-1]] = value


def _crd_causes(crd: Obj) -> list[tuple[str, str, str]]:
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    errs = []
    for f in ("group",):
        if not spec.get(f):
            errs.append((f"spec.{f}", "FieldValueRequired", "Required value"))
    for f in ("plural", "kind"):
        if not names.get(f):
            errs.append((f"spec.names.{f}", "FieldValueRequired", "Required value"))
    if not spec.get("versions"):
        errs.append(("spec.versions", "FieldValueRequired", "Required value"))
    elif sum(1 for v in spec["versions"] if v.get("storage")) != 1:
        errs.append(("spec.versions", "FieldValueInvalid", "Invalid value: must have exactly one version marked "
                     "as storage version"))
    want = f"{names.get('plural')}.{spec.get('group')}"
    if crd["metadata"].get("name") != want:
        errs.append(("metadata.name", "FieldValueInvalid", f'Invalid value: "{crd["metadata"].get("name")}": must '
                     f'be spec.names.plural+"."+spec.group'))
    return errs
