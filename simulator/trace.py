"""Reading openb-format traces (CSV) into the packing engine's values. The simulator's only file I/O.

Nodes: `sn,cpu_milli,memory_mib,gpu,model`. Pods:
`name,cpu_milli,memory_mib,num_gpu,gpu_milli` plus optional `gpu_spec`
(absent: any GPU model, as the published multigpu lists have it; extra
columns are ignored). Numbers must be finite and at most the bounds of
gpupolicy/capacity/csvtable.py (`MAX_GPUS` GPUs, `MAX_CPU_MILLI` milli-CPU, `MAX_MEMORY_MIB`
MiB). Errors name the file, the row and the column, so the CLI can print one line and
exit 2.
"""

from __future__ import annotations

import math
from pathlib import Path

from gpupolicy.capacity.csvtable import MAX_CPU_MILLI, MAX_GPUS, MAX_MEMORY_MIB, read_rows
from gpupolicy.packing.nodemodel import NodeSpec, PodDemand, parse_gpu_spec

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")  # gpu_spec optional: any model


class TraceError(ValueError):
    """A trace file that cannot be used: missing file or column, bad value."""


def _rows(path: Path, required: tuple[str, ...]) -> list[dict[str, str]]:
    try:
        return read_rows(path, required)
    except ValueError as exc:
        raise TraceError(str(exc)) from None


LIMITS = {"cpu_milli": MAX_CPU_MILLI, "memory_mib": MAX_MEMORY_MIB, "gpu": MAX_GPUS, "num_gpu": MAX_GPUS}


def _int(path: Path, line: int, row: dict[str, str], column: str) -> int:
    text = (row.get(column) or "").strip()
    try:
        number = float(text) if text else 0.0
    except ValueError:
        raise TraceError(f"{path}:{line}: column {column!r} is not a number: {text[:40]!r}") from None
    if not math.isfinite(number):
        raise TraceError(f"{path}:{line}: column {column!r} is not a finite number: {text[:40]!r}")
    value = int(number)
    if value != number:  # 2.5 GPUs, 1.5 milli-CPU: no such count, and truncating it hid a typo
        raise TraceError(f"{path}:{line}: column {column!r} is not a whole number: {text[:40]!r}")
    if value < 0:
        raise TraceError(f"{path}:{line}: column {column!r} is negative: {value}")
    limit = LIMITS.get(column)
    if limit is not None and value > limit:
        raise TraceError(f"{path}:{line}: column {column!r} is above {limit:,}: {text[:40]!r}")
    return value


def load_nodes(path: str | Path) -> list[NodeSpec]:
    """Node specs in file order."""
    p = Path(path)
    out = []
    for line, row in enumerate(_rows(p, NODE_COLUMNS), start=2):
        name = (row["sn"] or "").strip()
        if not name:
            raise TraceError(f"{p}:{line}: column 'sn' is empty")
        out.append(NodeSpec(
            name=name,
            cpu_milli=_int(p, line, row, "cpu_milli"),
            memory_mib=_int(p, line, row, "memory_mib"),
            gpu_count=_int(p, line, row, "gpu"),
            model=(row["model"] or "").strip(),
        ))
    if not out:
        raise TraceError(f"{p}: no nodes")
    return out


def load_pods(path: str | Path) -> list[PodDemand]:
    """Pod demands in file order."""
    p = Path(path)
    out = []
    for line, row in enumerate(_rows(p, POD_COLUMNS), start=2):
        num_gpu = _int(p, line, row, "num_gpu")
        gpu_milli = _int(p, line, row, "gpu_milli")
        if gpu_milli > 1000:
            raise TraceError(f"{p}:{line}: column 'gpu_milli' above 1000: {gpu_milli}")
        if num_gpu > 1 and 0 < gpu_milli < 1000:
            raise TraceError(f"{p}:{line}: column 'gpu_milli' below 1000 with num_gpu {num_gpu}")
        out.append(PodDemand(
            name=(row["name"] or "").strip() or f"pod-{line}",
            cpu_milli=_int(p, line, row, "cpu_milli"),
            memory_mib=_int(p, line, row, "memory_mib"),
            num_gpu=num_gpu,
            gpu_milli=gpu_milli if num_gpu else 0,
            allowed_models=parse_gpu_spec(row.get("gpu_spec") or ""),
        ))
    return out
