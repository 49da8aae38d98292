"""A reconciler that cannot be imported stops the controller: an error naming it and a non-zero exit.

Real: the controller command (`python -m cli.main controller`) in a
subprocess against the test API server, with one registered reconciler's
module made unimportable (`sys.modules[name] = None`, which is how a missing
or broken module looks to `importlib`). Before, the loop logged it at INFO
and ran without that concern, reporting healthy.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from controller.loop import RECONCILERS, ReconcilerLoadError, load_reconcilers

REPO = Path(__file__).resolve().parents[2]

BROKEN = """
import sys
sys.modules["controller.scaletozero"] = None  # importing it now raises ModuleNotFoundError
from cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def test_an_unimportable_reconciler_exits_the_controller_non_zero(frame_api: Any) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", BROKEN, "controller", "--kubeconfig", frame_api.kubeconfig, "--identity", "broken",
         "--lease-duration-seconds", "2", "--renew-seconds", "0.4"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "controller.scaletozero.ScaleToZeroReconciler cannot be loaded" in done.stdout + done.stderr
    assert "controller starting" not in done.stdout + done.stderr


def test_load_reconcilers_names_the_module_that_fails() -> None:
    with pytest.raises(ReconcilerLoadError, match=r"controller\.nosuchconcern\.Thing cannot be loaded"):
        load_reconcilers(registry=[*RECONCILERS, ("controller.nosuchconcern", "Thing")])
    with pytest.raises(ReconcilerLoadError, match=r"controller\.loop\.NoSuchClass cannot be loaded"):
        load_reconcilers(registry=[("controller.loop", "NoSuchClass")])


def test_the_whole_registry_loads_in_order() -> None:
    names = [r.name for r in load_reconcilers({"policies": 7.0})]
    assert names == ["policies", "claim-templates", "rightsizing", "layout", "scaletozero", "autoscale", "capacity",
                     "extender-health"]
    assert load_reconcilers({"policies": 7.0})[0].period_seconds == 7.0
