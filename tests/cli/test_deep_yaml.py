"""A YAML file nested too deeply to parse, given to every command that reads one: one line, exit 2.

libyaml composes nodes recursively in C: 50,000 nested brackets crashed each of these processes with
SIGSEGV (exit 139), with no message, before gpupolicy.yamlload refused such documents the way the
dry-run already did (gpupolicy/nesting.py). The hub console's policy form answers it with the form's
own error, not a dead worker.

Real: the commands as subprocesses (`python -m cli.main`), the hub's app with its SQLite database.
Faked: nothing.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.cli.helpers import subprocess_run

DEEP = "a: " + "[" * 50_000 + "]" * 50_000 + "\n"
PROBLEM = "document 1: nested more than 1000 levels deep; not read"


@pytest.fixture
def deep(tmp_path: Path) -> Path:
    path = tmp_path / "deep.yaml"
    path.write_text(DEEP)
    return path


def _ca(tmp_path: Path) -> Path:
    from certs.material import generate

    generate("kubeon-gpu-optimizer-webhook", "kubeon-gpu", tmp_path / "certs")
    return tmp_path / "certs" / "ca.crt"


def _trace(tmp_path: Path) -> list[str]:
    nodes, pods = tmp_path / "nodes.csv", tmp_path / "pods.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn1,16000,65536,2,T4\n")
    pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,"
                    "deletion_time,scheduled_time\np1,1000,2048,1,500,,LS,Running,0,1,0\n")
    return ["--nodes", str(nodes), "--pods", str(pods)]


@pytest.mark.parametrize("command", ["hub policy apply", "webhook --policies", "extender --kubeconfig",
                                     "certs patch-cabundle --kubeconfig", "simulate --scheduler-config"])
def test_a_file_nested_too_deeply_is_one_line_and_exit_2(command: str, deep: Path, tmp_path: Path) -> None:
    args = {
        "hub policy apply": ["hub", "--db", f"sqlite:///{tmp_path / 'hub.db'}", "policy", "apply", "--cluster", "c1",
                             "-f", str(deep)],
        "webhook --policies": ["webhook", "--cert-dir", str(tmp_path), "--no-watch", "--policies", str(deep)],
        "extender --kubeconfig": ["extender", "--kubeconfig", str(deep)],
        "certs patch-cabundle --kubeconfig": ["certs", "patch-cabundle", "--ca-file", str(_ca(tmp_path)),
                                              "--mutating", "m", "--kubeconfig", str(deep)],
        "simulate --scheduler-config": ["simulate", "--through-extender", *_trace(tmp_path), "--scheduler-config",
                                        str(deep)],
    }[command]
    run = subprocess_run(*args, timeout=60)
    assert run.code == 2, (run.code, run.err[-2000:])
    lines = run.err.strip().splitlines()
    assert len(lines) == 1 and str(deep) in lines[0] and PROBLEM in lines[0], lines


def test_the_console_policy_form_says_so(tmp_path: Path) -> None:
    from hub.app import create_app
    from hub.db import open_db
    from hub.store import Hub

    app = create_app(Hub(open_db(f"sqlite:///{tmp_path / 'hub.db'}")), "admin-token")
    browser = app.test_client()
    browser.get("/console/sign-in")
    with browser.session_transaction() as session:
        csrf = session["csrf"]
    assert browser.post("/console/sign-in", data={"credential": "admin-token", "csrf_token": csrf}).status_code == 302
    with browser.session_transaction() as session:
        csrf = session["csrf"]
    browser.post("/console/clusters", data={"name": "c1", "csrf_token": csrf})
    answer = browser.post("/console/clusters/c1/policies", data={"name": "p1", "mode": "Automatic", "spec": DEEP,
                                                                  "new": "1", "csrf_token": csrf})
    assert answer.status_code == 400
    errors = re.findall(r'id="spec-error"[^>]*>([^<]*)', answer.get_data(as_text=True))
    assert errors == [PROBLEM], errors
