"""Dry-run of a generated 20,000-object file: the answer the in-memory implementation gave, in flat memory.

A regression guard, not the benchmark (bench/dryrun.py measures 100,000
objects against the C-loader parse). Real: the CLI as a subprocess on a file
from bench/dryrun.py's generator (70% Pods, 30% Deployments, a third asking
for GPUs), the example policies and nodes; the reference is the previous
implementation's algorithm run here: load every document, decide every one
with the core (plus the policies each entry's decisions enforce below their mode:
tests/cli/helpers.py `with_lowered`), `json.dumps(answers, indent=2)`. Faked: nothing.

Bound: peak RSS under 150 MiB at 20,000 objects (the in-memory
implementation needed ~320 MiB; measured streamed: ~40 MiB), and at most
20 MiB more than the same run at 2,000 objects: memory does not grow with
the input.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from bench.dryrun import generate
from gpupolicy.admission.dryrun import dry_run
from gpupolicy.admission.validation import check_policy
from gpupolicy.catalog import DEFAULT_CATALOG
from gpupolicy.cluster import ClusterView, node_from_object
from tests.cli.helpers import EXAMPLES, ROOT, with_lowered

PEAK_MIB = 150
GROWTH_MIB = 20
PROBE = ("import resource, subprocess, sys\n"
         "with open(sys.argv[1], 'wb') as out:\n"
         "    rc = subprocess.run(sys.argv[2:], stdout=out).returncode\n"
         "print(rc, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n")


def run_streamed(path: Path, out: Path) -> float:
    """Run `kubeon-gpu dry-run -o json` in a fresh parent; peak RSS of the dry-run process in MiB."""
    command = [sys.executable, "-m", "cli.main", "dry-run", "-f", str(path), "--policies",
               str(EXAMPLES / "policies.yaml"), "--nodes", str(EXAMPLES / "nodes.yaml"), "-o", "json"]
    probe = subprocess.run([sys.executable, "-c", PROBE, str(out), *command], capture_output=True, text=True,
                           cwd=ROOT, timeout=600, check=True)
    rc, rss_kib = probe.stdout.split()
    assert rc == "0", probe.stderr
    return int(rss_kib) / 1024


def in_memory_answers(path: Path) -> list:
    """What the previous `kubeon-gpu dry-run` computed: every document loaded, then every answer, in memory."""
    def load(p: Path) -> list:
        return [d for d in yaml.load_all(p.read_bytes(), Loader=yaml.CSafeLoader) if d is not None]

    policies = [check_policy(d, DEFAULT_CATALOG)[0] for d in load(EXAMPLES / "policies.yaml")
                if d["kind"] == "GpuPolicy"]
    namespaces = {d["metadata"]["name"]: d["metadata"].get("labels", {}) for d in load(EXAMPLES / "policies.yaml")
                  if d["kind"] == "Namespace"}
    view = ClusterView(policies=tuple(policies), namespace_labels=namespaces,
                       nodes=tuple(node_from_object(n) for n in load(EXAMPLES / "nodes.yaml")))
    return with_lowered([dry_run(d, view).to_wire() for d in load(path)])


def test_20000_objects_same_answer_in_flat_memory(tmp_path: Path) -> None:
    small, large = tmp_path / "2k.yaml", tmp_path / "20k.yaml"
    generate(small, 2_000)
    generate(large, 20_000)
    peak_small = run_streamed(small, tmp_path / "2k.json")
    peak_large = run_streamed(large, tmp_path / "20k.json")
    # byte for byte what `json.dumps(answers, indent=2)` wrote (at 2,000: the pure-Python indenting encoder is slow)
    assert (tmp_path / "2k.json").read_bytes() == (json.dumps(in_memory_answers(small), indent=2) + "\n").encode()
    streamed = json.loads((tmp_path / "20k.json").read_bytes())
    assert len(streamed) == 20_000
    assert streamed == json.loads(json.dumps(in_memory_answers(large)))  # order and content
    assert peak_large < PEAK_MIB, f"peak RSS {peak_large:.0f} MiB"
    assert peak_large - peak_small < GROWTH_MIB, f"2,000 objects: {peak_small:.0f} MiB, 20,000: {peak_large:.0f} MiB"
