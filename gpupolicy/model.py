"""The GpuPolicy custom resource (gpu.kubeon.io/v1alpha1), the single source of truth.

The CRD's openAPIV3Schema is generated from these models; the webhook's
validation, the controller and the dry-run all parse through them, so a
policy means the same thing everywhere. Wire names are camelCase (aliases);
Python attributes are snake_case.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel
from pydantic_core import InitErrorDetails, PydanticCustomError

from gpupolicy.k8s.names import dns_name_problem, label_value_problem, qualified_name_problem
from gpupolicy.k8s.quantity import (
    DURATION_PATTERN,
    MAX_TEXT,
    QUANTITY_PATTERN,
    QuantityError,
    parse_duration,
    parse_quantity,
)

GROUP = "gpu.kubeon.io"
VERSION = "v1alpha1"
API_VERSION: Literal["gpu.kubeon.io/v1alpha1"] = "gpu.kubeon.io/v1alpha1"
KIND: Literal["GpuPolicy"] = "GpuPolicy"
PLURAL = "gpupolicies"

# Hub sync (docs/hub-api.md): objects the hub owns, the hub revision they came from, and whether the
# cluster's token still works. A policy labelled Disconnected is not in force anywhere.
MANAGED_BY_LABEL = "gpu.kubeon.io/managed-by"
MANAGED_BY_HUB = "hub"
HUB_STATE_LABEL = "gpu.kubeon.io/hub"
HUB_CONNECTED, HUB_DISCONNECTED = "Connected", "Disconnected"
HUB_REVISION_ANNOTATION = "gpu.kubeon.io/hub-revision"

BODY_FIELDS = ("sharing", "scale_to_zero", "packing", "type_fit", "capacity", "guardrail")


class Mode(StrEnum):
    """What a policy may do: propose only, apply approved targets, or apply."""

    RECOMMEND = "Recommend"
    APPROVE = "Approve"
    AUTOMATIC = "Automatic"


class PolicyKind(StrEnum):
    SHARING = "sharing"
    SCALE_TO_ZERO = "scaleToZero"
    PACKING = "packing"
    TYPE_FIT = "typeFit"
    CAPACITY = "capacity"
    GUARDRAIL = "guardrail"


# body field -> its kind, worked out once (to_camel per call was a twentieth of an admission)
_KIND_OF_FIELD = tuple((name, PolicyKind(to_camel(name))) for name in BODY_FIELDS)


class SharingStrategy(StrEnum):
    MIG = "MIG"
    TIME_SLICING = "TimeSlicing"


class WholeGpus(StrEnum):
    """Who launches nodes for pending whole-GPU pods of a Karpenter pool (docs/designs/capacity.md)."""

    KARPENTER = "Karpenter"  # Karpenter, from the NodePool (its own instance choice)
    OPTIMIZER = "Optimizer"  # the optimizer's NodeClaims; the NodePool's limits keep Karpenter from launching


class SharingVia(StrEnum):
    """How a sharing policy's pods get their device: the device plugin's extended resources (`nvidia.com/mig-*`),
    or a ResourceClaim on NVIDIA's DRA driver (docs/designs/dra.md)."""

    DEVICE_PLUGIN = "DevicePlugin"
    DRA = "DRA"


class Rollout(StrEnum):
    NONE = "None"
    RESTART = "Restart"


class ProposalState(StrEnum):
    PROPOSED = "Proposed"
    APPROVED = "Approved"
    APPLIED = "Applied"
    DISMISSED = "Dismissed"


# What the CRD says beyond the Python types, so the API server refuses the worst before our code
# runs (issue 15). The Python validators below stay the reference (and give the clearer message);
# these only describe them: a pattern and length per quantity and duration, CEL where it fits.
# `quantity()` is Kubernetes' CEL quantity library (1.28+, upstream ParseQuantity). Its `sign` is a
# global overload (`sign(q)`), not the member its doc comment shows: kube-apiserver refuses `q.sign()`.
_QUANTITY_SCHEMA: dict[str, Any] = {
    "pattern": QUANTITY_PATTERN, "maxLength": MAX_TEXT,
    "x-kubernetes-validations": [{
        "rule": "isQuantity(self) && quantity(self).compareTo(quantity('0')) >= 0 && "
                "quantity(self).compareTo(quantity('9223372036854775807')) <= 0",
        "message": "must be a quantity between 0 and 2^63-1 (examples: 8Gi, 500M)"}],
}
_DURATION_SCHEMA: dict[str, Any] = {"pattern": DURATION_PATTERN, "maxLength": MAX_TEXT}
_APPROVAL_SCHEMA: dict[str, Any] = {"items": {"type": "string", "pattern": r"^[^/]+/[^/]+(/[^/]+)?$"}}


def _spec_rules() -> list[dict[str, str]]:
    bodies = ", ".join(f"has(self.{to_camel(n)})" for n in BODY_FIELDS)
    return [
        {"rule": f"[{bodies}].filter(b, b).size() == 1",
         "message": f"exactly one of {', '.join(to_camel(n) for n in BODY_FIELDS)} must be set"},
        {"rule": "!has(self.sharing) || !has(self.sharing.rollout) || self.sharing.rollout != 'Restart' || "
                 "(has(self.selector) && has(self.selector.namespaces) && size(self.selector.namespaces) > 0)",
         "fieldPath": ".sharing.rollout",
         "message": "rollout Restart needs selector.namespaces: a restart evicts running pods, and only "
                    "in named namespaces"},
    ]


class _Wire(BaseModel):
    """camelCase on the wire, unknown fields refused (named in the error)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


def _untrimmed(value: str) -> None:
    """The CRD's patterns refuse spaces around a quantity or duration (parse_quantity, for pod resources,
    trims them as Quantity's JSON reading does): the model refuses what the API server would."""
    if value != value.strip():
        raise ValueError(f"{value!r} has spaces around it")


def _check_quantity(value: str | None) -> str | None:
    if value is None:
        return value
    _untrimmed(value)
    try:
        if parse_quantity(value) < 0:
            raise ValueError(f"{value!r} is negative")
    except QuantityError as exc:
        raise ValueError(str(exc)) from exc
    return value


def _check_duration(value: str | None) -> str | None:
    if value is None:
        return value
    _untrimmed(value)
    try:
        parse_duration(value)
    except QuantityError as exc:
        raise ValueError(str(exc)) from exc
    return value


class LabelSelectorRequirement(_Wire):
    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[str] = Field(default_factory=list)


class LabelSelector(_Wire):
    """metav1.LabelSelector."""

    match_labels: dict[str, str] = Field(default_factory=dict)
    match_expressions: list[LabelSelectorRequirement] = Field(default_factory=list)


class Selector(_Wire):
    """Which pods a policy covers; all given parts must match, empty matches every pod."""

    namespaces: list[str] = Field(default_factory=list)
    namespace_selector: LabelSelector | None = None
    pod_selector: LabelSelector | None = None


class Toleration(_Wire):
    """core/v1 Toleration, injected into matching pods, checked as pod validation (ValidateTolerations) checks it."""

    key: str | None = None
    operator: Literal["Exists", "Equal"] | None = None
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = None

    @model_validator(mode="after")
    def _as_pods_take_it(self) -> Toleration:
        problem = qualified_name_problem(self.key) if self.key else ""
        if problem:
            raise ValueError(f"key: {problem}")
        if not self.key and self.operator != "Exists":
            raise ValueError("operator must be Exists when key is empty (which matches every taint)")
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError("effect must be NoExecute when tolerationSeconds is set")
        if self.operator == "Exists" and self.value:
            raise ValueError("value must be empty when operator is Exists")
        problem = label_value_problem(self.value or "")
        if problem:
            raise ValueError(f"value: {problem}")
        return self


DEFAULT_TIME_SLICING_REPLICAS = 2


class SharingSpec(_Wire):
    """Give GPU pods a MIG slice or a time-sliced share instead of a whole GPU."""

    strategy: SharingStrategy
    mig_profile: str = "auto"
    gpu_memory: str | None = Field(default=None, json_schema_extra=_QUANTITY_SCHEMA)
    gpu_models: list[str] = Field(default_factory=list)
    replicas: int | None = Field(default=None, description="time-slicing replicas per GPU (>= 2)",
                                 json_schema_extra={"minimum": 2})
    rollout: Rollout = Rollout.NONE
    window: str = Field(default="7d", json_schema_extra=_DURATION_SCHEMA)
    headroom_percent: int = Field(default=20, ge=0, le=500)
    via: SharingVia = SharingVia.DEVICE_PLUGIN

    _q = field_validator("gpu_memory")(classmethod(lambda cls, v: _check_quantity(v)))
    _d = field_validator("window")(classmethod(lambda cls, v: _check_duration(v)))

    @field_validator("replicas")
    @classmethod
    def _replicas(cls, value: int | None) -> int | None:
        if value is not None and value < 2:
            raise ValueError("replicas must be at least 2 (one replica is a whole GPU)")
        return value

    @property
    def time_slicing_replicas(self) -> int:
        """Shares per GPU under TimeSlicing: `replicas`, else 2 (right-sizing and the layout agree)."""
        return self.replicas or DEFAULT_TIME_SLICING_REPLICAS


class WakeSpec(_Wire):
    prometheus_query: str | None = None
    # finite: JSON has no NaN or Infinity, and the hub serves the spec to clusters as JSON
    above: float = Field(default=0.0, allow_inf_nan=False)


class AutoscaleSpec(_Wire):
    """GPU-utilisation autoscaling through a generated KEDA ScaledObject."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": "self.max >= (has(self.min) ? self.min : 0)", "message": "max must be >= min"}]})
    target_utilization_percent: int = Field(ge=1, le=100)
    min: int = Field(default=0, ge=0)
    max: int = Field(ge=1)

    @model_validator(mode="after")
    def _bounds(self) -> AutoscaleSpec:
        if self.max < self.min:
            raise ValueError("max must be >= min")
        return self


class ScaleToZeroSpec(_Wire):
    """Park idle GPU workloads at zero replicas; wake them on a demand signal."""

    namespaces: list[str] = Field(min_length=1)
    workload_selector: LabelSelector | None = None
    idle_below_percent: float = Field(default=5.0, ge=0, le=100)
    idle_for: str = Field(default="30m", json_schema_extra=_DURATION_SCHEMA)
    wake: WakeSpec | None = None
    min_replicas_on_wake: int | None = Field(default=None, ge=1)
    autoscale: AutoscaleSpec | None = None

    _d = field_validator("idle_for")(classmethod(lambda cls, v: _check_duration(v)))


# The packing strategies a policy may choose: the engine's registry (gpupolicy/packing/engine.py) less its
# experiments, `fgd-exact` and `random`, which only `kubeon-gpu simulate` and bench/ select; "default": the
# extender's --default-strategy. tests/packing/test_policies.py keeps the two lists in step.
PackingStrategy = Literal["default", "kubeon", "fgd", "bestfit", "packing", "dotprod"]
POLICY_STRATEGIES: tuple[str, ...] = get_args(PackingStrategy)


class PackingSpec(_Wire):
    """Which packing policy the extender scores with for matching pods."""

    strategy: PackingStrategy = "default"


class TypeFitSpec(_Wire):
    """Steer GPU pods to the GPU products that serve them."""

    # allowedModels: the only products the pod may use (admission picks MIG profiles they offer; the
    # extender fails other nodes). preferredModels: products the extender tries first; the others (within
    # allowedModels) only when no preferred node can take the pod, so a preference never leaves a pod pending.

    allowed_models: list[str] = Field(default_factory=list)
    preferred_models: list[str] = Field(default_factory=list)


class NodeClassRef(_Wire):
    """Karpenter's nodeClassRef: the cloud node class the NodePool's nodes are made from."""

    group: str = Field(min_length=1)
    kind: str = Field(min_length=1)
    name: str = Field(min_length=1)


CAPACITY_PROVIDERS = ("karpenter", "eks-nodegroups", "aks-nodepools", "gke-nodepools")
_NODEPOOL_NAME = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"


class ConsolidationSpec(_Wire):
    """When a GPU node is given back (docs/designs/capacity.md, "Controller").

    `underusedBelowPercent` / `for`: DCGM utilisation of every GPU of the node
    below the threshold for the whole window (needs Prometheus; without it
    usage-aware consolidation stays Recommend). `emptyFor`: the grace after a
    node's last GPU pod ended before the node is removed. `drainTimeout`: a
    drain that has not emptied the node by then is undone (uncordoned).
    `minPodAge`: a node with pods is consolidated only once its youngest pod
    has run this long, and moved pods go only beside pods that old.
    `maxEvictionsPerPod`: a pod evicted this often pins its node (unset: the
    core's 3); 0 moves no pod at all, only empty nodes go: for pods whose work
    starts over when evicted (no checkpoints), where each move redoes what the
    pod had run (docs/benchmarks.md, issue 40).
    """

    underused_below_percent: float = Field(default=10.0, ge=0, le=100)
    for_: str = Field(default="2h", alias="for", json_schema_extra=_DURATION_SCHEMA)
    max_disrupted_nodes: int = Field(default=1, ge=0)
    empty_for: str = Field(default="1m", json_schema_extra=_DURATION_SCHEMA)
    drain_timeout: str = Field(default="15m", json_schema_extra=_DURATION_SCHEMA)
    # a busy node is a candidate once its youngest pod has run this long (unset: the core's default,
    # gpupolicy/capacity/disruption/inputs.py ConsolidationRules.min_pod_age_seconds)
    min_pod_age: str | None = Field(default=None, json_schema_extra=_DURATION_SCHEMA)
    # unset: the core's default (ConsolidationRules.max_evictions_per_pod)
    max_evictions_per_pod: int | None = Field(default=None, ge=0)

    _d = field_validator("for_", "empty_for", "drain_timeout", "min_pod_age")(
        classmethod(lambda cls, v: _check_duration(v)))

    @property
    def window_seconds(self) -> float:
        return parse_duration(self.for_)

    @property
    def empty_seconds(self) -> float:
        return parse_duration(self.empty_for)

    @property
    def drain_seconds(self) -> float:
        return parse_duration(self.drain_timeout)

    @property
    def min_pod_age_seconds(self) -> float | None:
        return None if self.min_pod_age is None else parse_duration(self.min_pod_age)


class CapacitySpec(_Wire):
    """GPU nodes added for pending GPU pods and given back when unused, through a Karpenter NodePool.

    Which cloud machinery adds the nodes is the install's `capacity.provider`
    (a chart value, `--capacity-provider`), not a policy field.
    """

    node_pool: str = Field(default="gpu", description="Karpenter NodePool the optimizer manages",
                           json_schema_extra={"pattern": _NODEPOOL_NAME, "maxLength": 63})
    node_class_ref: NodeClassRef
    gpu_models: list[str] = Field(default_factory=list)
    max_gpus: int | None = Field(default=None, ge=0, description="NodePool limits nvidia.com/gpu")
    whole_gpus: WholeGpus = Field(
        default=WholeGpus.KARPENTER,
        description="Who launches nodes for pending whole-GPU pods: Karpenter from the NodePool, or the "
                    "Optimizer with NodeClaims of the cheapest instance types that hold them (the NodePool's "
                    "limits nvidia.com/gpu is then 0, so Karpenter launches nothing itself; maxGpus is "
                    "counted by the optimizer). Node groups: always the optimizer.")
    consolidation: ConsolidationSpec = Field(default_factory=ConsolidationSpec)

    @field_validator("node_pool")
    @classmethod
    def _pool_name(cls, value: str) -> str:
        if not re.fullmatch(_NODEPOOL_NAME, value):
            raise ValueError(f"{value!r} is not a NodePool name (lower-case letters, digits and '-', "
                             "at most 63 characters)")
        return value


class GuardrailSpec(_Wire):
    """Deny (Automatic) or warn about (Recommend) GPU pods outside the limits."""

    max_gpus_per_pod: int | None = Field(default=None, ge=0)
    allowed_gpu_resources: list[str] = Field(default_factory=list)


class GpuPolicySpec(_Wire):
    model_config = ConfigDict(json_schema_extra=lambda schema: schema.update(
        {"x-kubernetes-validations": _spec_rules()}))
    mode: Mode | None = None
    priority: int = 0
    selector: Selector = Field(default_factory=Selector)
    approvals: list[str] = Field(default_factory=list, json_schema_extra=_APPROVAL_SCHEMA)
    tolerations: list[Toleration] = Field(default_factory=list)
    scheduler_name: str | None = None
    sharing: SharingSpec | None = None
    scale_to_zero: ScaleToZeroSpec | None = None
    packing: PackingSpec | None = None
    type_fit: TypeFitSpec | None = None
    capacity: CapacitySpec | None = None
    guardrail: GuardrailSpec | None = None

    @field_validator("scheduler_name")
    @classmethod
    def _scheduler_a_pod_takes(cls, value: str | None) -> str | None:
        """A DNS subdomain, as the API server's pod validation requires of spec.schedulerName."""
        problem = dns_name_problem(value, wildcard=False) if value else ""
        if problem:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _exactly_one_body(self) -> GpuPolicySpec:
        given = [name for name in BODY_FIELDS if getattr(self, name) is not None]
        if len(given) != 1:
            wire = ", ".join(to_camel(n) for n in BODY_FIELDS)
            found = ", ".join(to_camel(n) for n in given) or "none"
            raise ValueError(f"exactly one of {wire} must be set (found: {found})")
        return self

    @model_validator(mode="after")
    def _restart_names_namespaces(self) -> GpuPolicySpec:
        """rollout: Restart evicts running pods, so a policy that restarts workloads says where.

        A selector without namespaces would let one policy disrupt pods in every
        namespace its labels happen to match; naming them bounds the restart's
        reach (docs/designs/controller.md). The error names `spec.sharing.rollout`
        (a ValidationError raised here keeps its loc).
        """
        if self.sharing is not None and self.sharing.rollout is Rollout.RESTART and not self.selector.namespaces:
            message = ("rollout Restart needs selector.namespaces: a restart evicts running pods, and only "
                       "in named namespaces")
            raise ValidationError.from_exception_data("GpuPolicySpec", [InitErrorDetails(
                type=PydanticCustomError("value_error", message), loc=("sharing", "rollout"),
                input=self.sharing.rollout.value)])
        return self

    @field_validator("approvals")
    @classmethod
    def _approvals(cls, values: list[str]) -> list[str]:
        for value in values:
            parts = value.split("/")
            if len(parts) not in (2, 3) or not all(parts):
                raise ValueError(f"{value!r} is not Kind/namespace/name")
        return values

    @property
    def kind(self) -> PolicyKind:
        for name, kind in _KIND_OF_FIELD:
            if getattr(self, name) is not None:
                return kind
        raise AssertionError("validated policies have a body")


class Condition(_Wire):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str = ""
    message: str = ""
    last_transition_time: str | None = None
    observed_generation: int | None = None


class Proposal(_Wire):
    """A change a policy proposes or made; `id` is stable across controller passes."""

    id: str
    target: str  # Kind/namespace/name
    action: str
    reason: str = ""
    estimated_gpu_hours_per_month: float = 0.0
    state: ProposalState = ProposalState.PROPOSED
    # What the target's pods should ask for once applied (right-sizing: "nvidia.com/mig-1g.10gb",
    # "nvidia.com/gpu.shared"). The webhook reads it from an Applied proposal, so the controller's
    # measured size and the pods' rewrite can never disagree. None for actions that are not a resource.
    resource: str | None = None


class ParkRecord(_Wire):
    """A workload this policy parked at zero: the replica count its wake restores, and how to undo it."""

    # In the policy's status (`status.parked`, keyed Kind/namespace/name) because the install guide's
    # RBAC lets the optimizer write workloads only through their scale subresource, which carries no
    # annotations. Written before the scale to 0, removed after the wake (controller/scaletozero.py).

    replicas: int  # spec.replicas before parking
    scaled_at: str  # RFC 3339
    uid: str | None = None  # the workload's uid: a record outlives no re-created workload
    undo: dict[str, Any] = Field(default_factory=dict)


class RestartRecord(_Wire):
    """A `rollout: Restart` in progress or done: the pods (uids) it replaces, listed when it started."""

    # In the policy's status (`status.restarts`, keyed Kind/namespace/name): the optimizer restarts a
    # workload by evicting its older pods through the Eviction API (the install guide gives it no write
    # on the workload's template). Written before the first eviction; while it names the Applied
    # proposal, the workload is never restarted twice for it, and pods created later (not in `pods`)
    # are never evicted for it (controller/rightsizing.py).
    proposal: str  # the Applied proposal's id
    started_at: str  # RFC 3339
    pods: list[str] = Field(default_factory=list)  # uids of the workload's pods when it started
    undo: dict[str, Any] = Field(default_factory=dict)


class EvictionRecord(_Wire):
    """How often a capacity drain evicted the pods of one workload: what survives the pods' re-creation."""

    # In the policy's status (`status.evictions`, keyed Kind/namespace/name as gpupolicy/k8s/owners.py names
    # the workload): a Deployment's evicted pod comes back under a new name, and the install guide's RBAC
    # gives no write on workloads. `pending` uids are written before their eviction is asked, so a crash
    # between the eviction and the count is counted by the next pass (controller/capacity/eviction_counts.py).
    count: int = 0  # evictions accepted for drains of this policy
    at: float = 0.0  # when the last one was asked (epoch seconds); a record of a workload without pods
    # is dropped an hour after it
    evicted: list[str] = Field(default_factory=list)  # the last evicted pod uids (no pod counted twice)
    pending: list[str] = Field(default_factory=list)  # pod uids whose eviction is being asked


class GpuPolicyStatus(_Wire):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")
    effective_mode: Mode | None = None  # what the optimizer enforces (gpupolicy.modes.effective_mode)
    requested_mode: Mode | None = None  # spec.mode, else the install's defaultMode
    observed_generation: int | None = None
    conditions: list[Condition] = Field(default_factory=list)
    proposals: list[Proposal] = Field(default_factory=list)
    # Written only by scale to zero's own merge patches (controller/scaletozero.py), one key at a time;
    # the status writer leaves it out, so the two never overwrite each other.
    parked: dict[str, ParkRecord] | None = None
    restarts: dict[str, RestartRecord] | None = None  # the same, for right-sizing's rollout: Restart
    evictions: dict[str, EvictionRecord] | None = None  # the same, for capacity drains' evictions


class ObjectMeta(BaseModel):
    """The parts of metav1.ObjectMeta the core reads; everything else is kept as-is."""

    model_config = ConfigDict(extra="allow")
    name: str = Field(min_length=1)
    namespace: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    generation: int | None = None
    resourceVersion: str | None = None  # Kubernetes wire name
    uid: str | None = None


class GpuPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    api_version: Literal["gpu.kubeon.io/v1alpha1"] = Field(default=API_VERSION, alias="apiVersion")
    kind: Literal["GpuPolicy"] = KIND
    metadata: ObjectMeta
    spec: GpuPolicySpec
    status: GpuPolicyStatus | None = None

    @property
    def name(self) -> str:
        return self.metadata.name

    def effective_mode(self, default_mode: Mode = Mode.RECOMMEND) -> Mode:
        """The policy's own mode, else the install's defaultMode (the chart's `defaultMode`)."""
        return self.spec.mode or default_mode

    def to_wire(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


def parse_policy(obj: dict[str, Any]) -> GpuPolicy:
    """Parse a GpuPolicy object from the API (raises pydantic.ValidationError)."""
    return GpuPolicy.model_validate(obj)


def parse_valid_policies(objects: Iterable[Mapping[str, Any]]) -> tuple[list[GpuPolicy], list[tuple[str, str]]]:
    """Parse what a watch cache holds: the valid policies, and (name, first error) for the rest.

    An invalid object must never stop the others from applying (issue 15: one
    policy whose quantity overflowed used to stop every rebuild), so nothing a
    parse can raise escapes; the caller logs or reports the errors (the
    controller puts them in the policy's status and an Event).
    """
    valid: list[GpuPolicy] = []
    invalid: list[tuple[str, str]] = []
    for obj in objects:
        try:
            valid.append(parse_policy(dict(obj)))
        except ValidationError as exc:
            first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": str(exc)}
            where = ".".join(str(part) for part in first["loc"])
            invalid.append((_name(obj), f"{where}: {first['msg']}" if where else str(first["msg"])))
        except (ValueError, TypeError) as exc:  # not a mapping at all, or a value pydantic did not wrap
            invalid.append((_name(obj), f"not a GpuPolicy ({type(exc).__name__})"))
    return valid, invalid


def _name(obj: Any) -> str:
    metadata = obj.get("metadata") if isinstance(obj, Mapping) else None
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    return name if isinstance(name, str) and name else "?"
