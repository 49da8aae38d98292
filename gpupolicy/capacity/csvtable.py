"""Reading a CSV table with required columns: one rule for the instance catalog and the openb traces.

Why here: the capacity core's catalog (gpupolicy/capacity/instances.py) and the simulator's trace
reader (simulator/trace.py) read the same kind of file and must say the same thing about a missing
file or column, a file that is not UTF-8 text, or a row the csv module cannot read (a field over its
131,072-character limit); the message names the file, and the row or the first missing column.
The upper bounds of a node's (or a pod's) numbers live here for the same reason: both readers refuse
a row past them, so no reader hands the packing engine a number its int64 arrays cannot hold or a
GPU count it would allocate a row of per node.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

MAX_GPUS = 256  # GPUs of one node (or instance type), or asked by one pod
MAX_CPU_MILLI = 10**9  # a million CPUs
MAX_MEMORY_MIB = 10**9  # about 954 TiB


def read_rows(path: Path, required: Sequence[str]) -> list[dict[str, str]]:
    """Every row of `path` as a dict; `ValueError` naming the file when it cannot be read or lacks a column.

    Rows are numbered as the readers number them: the header is row 1, the first record row 2.
    """
    rows: list[dict[str, str]] = []
    header: Sequence[str] | None = None
    try:
        with path.open(newline="", encoding="utf-8-sig") as fh:
            reader = csv.DictReader(fh)
            header = reader.fieldnames or []
            missing = [c for c in required if c not in header]
            if missing:
                raise ValueError(f"{path}: missing column {missing[0]!r} (need {', '.join(required)})")
            for row in reader:
                rows.append(row)
    except OSError as exc:
        raise ValueError(f"{path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text ({exc.reason})") from None
    except csv.Error as exc:
        raise ValueError(f"{path}:{1 if header is None else len(rows) + 2}: {exc}") from None
    return rows
