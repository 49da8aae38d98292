"""The instance catalog capacity is bought from: GPU product, size and price per instance type. Pure values.

Why its own module: provisioning (which type to launch), consolidation
(what a node costs) and the benchmark (lower bound's price) read the same
catalog, so the fit of a pod on an empty instance type lives here once.
`model` is the GPU product as the packing engine's `NodeSpec.model` names
it (openb model names in the benchmark, GFD product labels live).
Bad rows raise `ValueError` naming the file, the row and the field.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpupolicy.capacity.csvtable import MAX_CPU_MILLI, MAX_GPUS, MAX_MEMORY_MIB, read_rows
from gpupolicy.packing.nodemodel import NodeSpec, PodDemand

COLUMNS = ("instance_type", "model", "gpus", "cpu_milli", "memory_mib", "price_per_hour")


@dataclass(frozen=True)
class InstanceType:
    """One purchasable node shape and its price (currency units per hour)."""

    name: str
    model: str
    gpus: int
    cpu_milli: int
    memory_mib: int
    price_per_hour: float

    def __post_init__(self) -> None:
        if self.gpus < 0 or self.cpu_milli <= 0 or self.memory_mib <= 0:
            raise ValueError(f"instance type {self.name!r}: gpus >= 0, cpu_milli > 0 and memory_mib > 0 needed")
        if not math.isfinite(self.price_per_hour) or self.price_per_hour < 0:
            raise ValueError(f"instance type {self.name!r}: price_per_hour must be a non-negative number")

    @property
    def price_per_gpu_hour(self) -> float:
        return self.price_per_hour / self.gpus if self.gpus else math.inf

    def spec(self, node_name: str) -> NodeSpec:
        """An empty node of this type under `node_name`, as the packing engine models nodes."""
        return NodeSpec(name=node_name, cpu_milli=self.cpu_milli, memory_mib=self.memory_mib,
                        gpu_count=self.gpus, model=self.model)

    def holds(self, demand: PodDemand) -> bool:
        """An empty node of this type can take `demand` (the engine's fit rules on an empty node)."""
        if demand.allowed_models is not None and self.model not in demand.allowed_models:
            return False
        if demand.cpu_milli > self.cpu_milli or demand.memory_mib > self.memory_mib:
            return False
        if demand.mig or demand.shared:
            return False  # MIG devices / replicas exist only after the GPU Operator runs: callers convert first
        return not demand.needs_gpu or demand.num_gpu <= self.gpus


def cheapest_fitting(demand: PodDemand, instance_types: Iterable[InstanceType]) -> InstanceType | None:
    """The lowest-priced type an empty node of which holds `demand` (ties: fewer GPUs, then name)."""
    fits = [t for t in instance_types if t.holds(demand)]
    return min(fits, key=lambda t: (t.price_per_hour, t.gpus, t.name)) if fits else None


def _field(source: str, line: int, row: Mapping[str, str | None], column: str) -> str:
    text = (row.get(column) or "").strip()
    if not text:
        raise ValueError(f"{source}:{line}: field {column!r} is empty")
    return text


LIMITS = {"cpu_milli": MAX_CPU_MILLI, "memory_mib": MAX_MEMORY_MIB, "gpus": MAX_GPUS}


def _number(source: str, line: int, row: Mapping[str, str | None], column: str, kind: type) -> int | float:
    text = _field(source, line, row, column)
    try:
        value = kind(text)
    except ValueError:
        raise ValueError(f"{source}:{line}: field {column!r} is not {'an integer' if kind is int else 'a number'}: "
                         f"{text[:40]!r}") from None
    if value < 0 or (kind is float and not math.isfinite(value)):
        raise ValueError(f"{source}:{line}: field {column!r} must be a non-negative number: {text[:40]!r}")
    limit = LIMITS.get(column)
    if limit is not None and value > limit:
        raise ValueError(f"{source}:{line}: field {column!r} is above {limit:,}: {text[:40]!r}")
    return value  # type: ignore[no-any-return]


def parse_instances(rows: Sequence[Mapping[str, str | None]], source: str = "instances") -> list[InstanceType]:
    """Instance types from CSV rows (dicts keyed by `COLUMNS`); `source` names the file in errors."""
    out: list[InstanceType] = []
    seen: set[str] = set()
    for line, row in enumerate(rows, start=2):
        missing = [c for c in COLUMNS if c not in row]
        if missing:
            raise ValueError(f"{source}:{line}: field {missing[0]!r} missing (need {', '.join(COLUMNS)})")
        name = _field(source, line, row, "instance_type")
        if name in seen:
            raise ValueError(f"{source}:{line}: field 'instance_type' repeats {name!r}")
        seen.add(name)
        cpu = int(_number(source, line, row, "cpu_milli", int))
        mem = int(_number(source, line, row, "memory_mib", int))
        if cpu == 0 or mem == 0:
            raise ValueError(f"{source}:{line}: field {'cpu_milli' if cpu == 0 else 'memory_mib'!r} must be > 0")
        out.append(InstanceType(
            name=name,
            model=_field(source, line, row, "model"),
            gpus=int(_number(source, line, row, "gpus", int)),
            cpu_milli=cpu,
            memory_mib=mem,
            price_per_hour=float(_number(source, line, row, "price_per_hour", float)),
        ))
    if not out:
        raise ValueError(f"{source}: no instance types")
    return out


def load_instances(path: str | Path) -> list[InstanceType]:
    """Read an instance catalog CSV (`COLUMNS`); `ValueError` naming file, row and field on bad input."""
    p = Path(path)
    return parse_instances(read_rows(p, COLUMNS), str(p))
