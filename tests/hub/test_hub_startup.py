"""What `kubeon-gpu hub serve` prints when it starts, as the README runs it: one line per fact.

Real: the hub process (gunicorn, one worker) on a fresh SQLite database, its stdout and stderr
together as an operator reads them. Nothing is faked.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.hub.conftest import start_hub

# gunicorn's "[time] [pid] [LEVEL] " and logging's "time LEVEL name: " prefixes; pids and ports vary
_PREFIX = re.compile(r"^(\[[^]]*\] \[\d+\] \[\w+\] |\d{4}-\d\d-\d\d [\d:,]+ \w+ [\w.]+: )")


def test_hub_serve_says_each_start_up_fact_once(tmp_path: Path) -> None:
    hub = start_hub(f"sqlite:///{tmp_path}/hub.db")
    hub.stop()
    text = hub.log.read_text()
    start = [line for line in text[:text.index("Handling signal")].splitlines()
             if line.strip() and "GET /healthz" not in line]
    port = hub.url.rsplit(":", 1)[1]

    assert not [line for line in start if "alembic" in line], text
    assert len([line for line in start if "plain HTTP" in line]) == 1, text
    schema = [line for line in start if "schema" in line]
    assert len(schema) == 1 and "hub.db: schema 0002 (upgraded from an empty database)" in schema[0], text
    assert len([line for line in start if f":{port}" in line]) == 1, text
    said = [_PREFIX.sub("", line) for line in start]  # one worker (start_hub): no line says the same twice
    assert len(set(said)) == len(said), text
