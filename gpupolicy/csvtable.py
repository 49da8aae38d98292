"""Reading a CSV table with required columns: one rule for the instance catalog and the openb traces.

Why here: the capacity core's catalog (gpupolicy/capacity/instances.py) and the simulator's trace
reader (simulator/trace.py) read the same kind of file and must say the same thing about a missing
file or column; the message names the file and the first missing column.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path


def read_rows(path: Path, required: Sequence[str]) -> list[dict[str, str]]:
    """Every row of `path` as a dict; `ValueError` naming the file when it cannot be read or lacks a column."""
    try:
        with path.open(newline="") as fh:
            reader = csv.DictReader(fh)
            header = reader.fieldnames or []
            missing = [c for c in required if c not in header]
            if missing:
                raise ValueError(f"{path}: missing column {missing[0]!r} (need {', '.join(required)})")
            return list(reader)
    except OSError as exc:
        raise ValueError(f"{path}: {exc.strerror or exc}") from exc
