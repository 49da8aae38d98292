"""What `kubeon-gpu dry-run` writes: one documented shape in every format, the catalog it assumed.

Real: the CLI in-process on the files in examples/ and on temp files; the
webhook core (`dry_run`) as the reference for each entry. Faked: nothing.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest
import yaml

from cli.sources import Document, Scan, Source, documents
from gpupolicy.admission.dryrun import dry_run as core_dry_run
from gpupolicy.admission.validation import check_policy
from gpupolicy.catalog import DEFAULT_CATALOG
from gpupolicy.cluster import ClusterView, node_from_object
from tests.cli.helpers import EXAMPLES, LOWERED, PROG, ROOT, WITHOUT_METRICS, dry_run, with_lowered

FILES = ("-f", str(EXAMPLES / "workloads.yaml"), "--policies", str(EXAMPLES / "policies.yaml"),
         "--nodes", str(EXAMPLES / "nodes.yaml"))


def reference() -> list[dict]:
    """Each workload's answer from the core, with the example policies and nodes, in file order, and the
    policies of its decisions that are enforced below the mode they request (LOWERED)."""
    load = lambda name: [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]  # noqa: E731
    policies = [check_policy(d, DEFAULT_CATALOG)[0] for d in load("policies.yaml") if d["kind"] == "GpuPolicy"]
    namespaces = {d["metadata"]["name"]: d["metadata"].get("labels", {})
                  for d in load("policies.yaml") if d["kind"] == "Namespace"}
    view = ClusterView(policies=tuple(policies), namespace_labels=namespaces,
                       nodes=tuple(node_from_object(n) for n in load("nodes.yaml")))
    return with_lowered([core_dry_run(d, view).to_wire() for d in load("workloads.yaml")])


def test_json_yaml_jsonl_are_one_shape_a_list_of_answers(capsys) -> None:
    expected = json.loads(json.dumps(reference()))
    as_json = dry_run(capsys, *FILES, "-o", "json")
    as_yaml = dry_run(capsys, *FILES, "-o", "yaml")
    as_jsonl = dry_run(capsys, *FILES, "-o", "jsonl")
    default = dry_run(capsys, *FILES)
    assert {as_json.code, as_yaml.code, as_jsonl.code, default.code} == {0}
    assert json.loads(as_json.out) == expected
    assert list(yaml.safe_load_all(as_yaml.out)) == expected
    assert [json.loads(line) for line in as_jsonl.out.splitlines()] == expected
    assert default.out == as_yaml.out  # yaml is the default with -f
    assert set(expected[0]) >= {"allowed", "object", "patch", "warnings", "decisions"}


@pytest.mark.parametrize("output", ["text", "yaml", "json", "jsonl"])
def test_a_policy_enforced_below_its_mode_says_why_in_every_format(capsys, output: str) -> None:
    """The same files as `--example`, whose sharing policies apply there (it implies --metrics), stay
    Recommend with -f alone: each entry says so, with the reason and the flag that changes it."""
    run = dry_run(capsys, *FILES, "-o", output)
    assert run.code == 0, run.err
    if output == "text":
        first = next(line for line in run.out.splitlines() if line.startswith("Deployment inference/llm-small:"))
        assert first == ("Deployment inference/llm-small: allowed, unchanged; share-inference enforced Recommend, "
                         f"not Automatic as requested: sharing {WITHOUT_METRICS}")
        job = next(line for line in run.out.splitlines() if line.startswith("Job batch/embed-docs:"))
        assert "share-batch enforced Recommend, not Approve as requested: sharing needs GPU metrics" in job
        assert not [line for line in run.out.splitlines() if line.startswith("Pod research/notebook-ana:")
                    and "enforced" in line], "a policy enforced as requested has no such note"
    else:
        entries = (json.loads(run.out) if output == "json" else list(yaml.safe_load_all(run.out)) if output == "yaml"
                   else [json.loads(line) for line in run.out.splitlines()])
        assert entries[0]["enforcedBelowRequested"] == [LOWERED["share-inference"]]
        assert [e.get("enforcedBelowRequested") for e in entries[1:3]] == [None, [LOWERED["share-batch"]]]
    with_metrics = dry_run(capsys, *FILES, "-o", output, "--metrics")
    assert with_metrics.code == 0 and with_metrics.out, with_metrics.err
    assert "enforcedBelowRequested" not in with_metrics.out and "as requested" not in with_metrics.out


def test_a_scale_to_zero_offer_says_its_policy_is_enforced_below_its_mode(capsys) -> None:
    run = dry_run(capsys, "-f", str(EXAMPLES / "scale-to-zero.yaml"), "-o", "text")
    first = next(line for line in run.out.splitlines() if line.startswith("Deployment research/llm-chat:"))
    assert first.endswith("idle-research enforced Recommend, not Automatic as requested: "
                          f"scaleToZero {WITHOUT_METRICS}"), first


def test_json_is_a_list_even_for_one_object(capsys) -> None:
    run = dry_run(capsys, "-f", str(EXAMPLES / "pod.yaml"), "--policies", str(EXAMPLES / "policies.yaml"),
                  "-o", "json")
    answer = json.loads(run.out)
    assert isinstance(answer, list) and len(answer) == 1
    assert answer[0]["decisions"][0]["action"] == "UseMIG"
    assert run.out == json.dumps(answer, indent=2, ensure_ascii=False) + "\n"


@pytest.mark.parametrize("output", ["json", "jsonl"])
def test_json_is_json_whatever_the_yaml_held(tmp_path: Path, capsys, output: str) -> None:
    """YAML's .inf and .nan are null (as orjson writes them), never the json module's NaN and Infinity,
    also when something else in the object (bytes, a set) needs the laxer encoder."""
    for odd in ("", "  bytes: !!binary aGVsbG8=\n  set: !!set {a, b}\n"):
        path = tmp_path / "odd.yaml"
        path.write_text("apiVersion: v1\nkind: Pod\nmetadata: {name: odd}\nspec:\n  containers: [{name: c}]\n"
                        "  inf: .inf\n  nan: .nan\n" + odd)
        run = dry_run(capsys, "-f", str(path), "-o", output)
        assert run.code == 0, run.err

        def refuse(constant: str) -> None:
            raise AssertionError(f"{constant} is not JSON")

        text = run.out if output == "json" else "[" + ",".join(run.out.splitlines()) + "]"
        (entry,) = json.loads(text, parse_constant=refuse)
        assert entry["object"]["spec"]["inf"] is None and entry["object"]["spec"]["nan"] is None


def test_yaml_has_no_anchors_or_aliases(tmp_path: Path, capsys) -> None:
    """The same map twice in one input (a YAML alias) is written out twice, never as &id001/*id001."""
    text = """\
apiVersion: v1
kind: Pod
metadata: {name: twins, namespace: inference}
spec:
  containers:
  - name: a
    image: x
    resources: &same
      limits: {nvidia.com/gpu: 1}
      requests: {nvidia.com/gpu: 1}
  - name: b
    image: x
    resources: *same
"""
    path = tmp_path / "pod.yaml"
    path.write_text(text)
    run = dry_run(capsys, "-f", str(path), "--policies", str(EXAMPLES / "policies.yaml"), "-o", "yaml")
    assert run.code == 0, run.err
    assert "&id" not in run.out and "*id" not in run.out and "&" not in run.out
    answer = yaml.safe_load(run.out)
    assert answer["object"]["spec"]["containers"][0]["resources"] == answer["object"]["spec"]["containers"][1][
        "resources"]


def test_yaml_output_equals_the_safe_dumper(capsys) -> None:
    """The fast representer writes exactly what yaml.safe_dump writes (aliases aside), quoting included."""

    class Plain(yaml.SafeDumper):
        def ignore_aliases(self, data: object) -> bool:
            return True

    run = dry_run(capsys, *FILES, "-o", "yaml")
    expected = "---\n".join(yaml.dump(e, Dumper=Plain, sort_keys=False, allow_unicode=True) for e in reference())
    assert run.out == expected


def test_without_nodes_the_assumed_catalog_is_named(capsys) -> None:
    args = ("-f", str(EXAMPLES / "pod.yaml"), "--policies", str(EXAMPLES / "policies.yaml"))
    machine = dry_run(capsys, *args, "-o", "json")
    assert machine.code == 0
    assert machine.notes() == [f"{PROG}note: nodes: none given (--nodes): MIG profiles are chosen over every "
                               "MIG-capable model of the built-in catalog (NVIDIA-A100-SXM4-40GB, "
                               "NVIDIA-A100-SXM4-80GB, NVIDIA-H100-80GB-HBM3, NVIDIA-H100-NVL, NVIDIA-H200, "
                               "NVIDIA-GH200-144G-HBM3e, NVIDIA-B200, NVIDIA-A30)"]
    text = dry_run(capsys, *args, "-o", "text")
    assert "Nodes: none given (--nodes): MIG profiles are chosen over every MIG-capable model" in text.out
    with_nodes = dry_run(capsys, *args, "--nodes", str(EXAMPLES / "nodes.yaml"), "-o", "json")
    assert with_nodes.notes() == []


def test_example_summary_is_readable(capsys) -> None:
    run = dry_run(capsys, "--example")
    assert run.code == 0
    assert "Deployment inference/llm-small: allowed" in run.out
    assert "[Automatic] UseMIG, applied" in run.out
    assert "[Recommend] UseTimeSlicing, not applied" in run.out
    assert "approve CronJob/batch/nightly-eval" in run.out


def test_yaml_output_and_nodes_choose_the_profile(tmp_path: Path, capsys) -> None:
    run = dry_run(capsys, "-f", str(EXAMPLES / "pod.yaml"), "--policies", str(EXAMPLES / "policies.yaml"),
                  "--nodes", str(EXAMPLES / "nodes.yaml"), "--metrics")
    answer = yaml.safe_load(run.out)
    assert answer["object"]["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/mig-2g.20gb": "1"}


def test_documents_stream_one_at_a_time(tmp_path: Path) -> None:
    """The reader yields the first document before it has read the second (parse, decide, write, forget)."""
    path = tmp_path / "two.yaml"
    path.write_text("kind: Pod\nmetadata: {name: a}\n---\nkind: Pod\nmetadata: {name: [\n")
    items = documents(Source(str(path), lambda: path.open("rb")), Scan(has_context=False, empty=False))
    first = next(items)
    assert isinstance(first, Document) and first.obj["metadata"]["name"] == "a"
    assert "not valid YAML" in str(next(items))


def test_progress_only_on_a_terminal(tmp_path: Path) -> None:
    """A terminal on stderr gets a tqdm bar for long runs; a pipe gets none (subprocesses, real pty)."""
    path = tmp_path / "many.yaml"
    path.write_text("---\n".join(f"kind: Pod\nmetadata: {{name: p{i}}}\nspec: {{containers: []}}\n"
                                 for i in range(3000)))
    command = [sys.executable, "-m", "cli.main", "dry-run", "-f", str(path), "-o", "jsonl"]
    piped = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert piped.returncode == 0 and "objects" not in piped.stderr and "\r" not in piped.stderr
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a terminal has a size
    proc = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=follower, cwd=ROOT, timeout=120)
    os.close(follower)
    seen = b""
    try:
        while chunk := os.read(leader, 65536):
            seen += chunk
    except OSError:
        pass
    os.close(leader)
    assert proc.returncode == 0
    assert b"dry-run: " in seen and b"objects" in seen, seen[-500:]


@pytest.mark.parametrize("output", ["json", "yaml", "jsonl", "text"])
def test_every_format_streams_through_a_closed_pipe(tmp_path: Path, output: str) -> None:
    """`kubeon-gpu dry-run ... | head -1`: the reader leaves early; no traceback."""
    path = tmp_path / "many.yaml"
    path.write_text("---\n".join(f"kind: Pod\nmetadata: {{name: p{i}}}\nspec: {{containers: []}}\n"
                                 for i in range(3000)))
    result = subprocess.run(f"{sys.executable} -m cli.main dry-run -f {path} -o {output} | head -1",
                            shell=True, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.stdout.strip()
    assert "Traceback" not in result.stderr and "BrokenPipe" not in result.stderr, result.stderr


@pytest.mark.parametrize("command", [["dry-run", "-f", "examples/pod.yaml"], ["dry-run", "--example", "-o", "json"],
                                     ["layout", "--example"], ["crd"]])
def test_an_output_that_cannot_be_written_is_one_line(command: list[str]) -> None:
    """Standard output on a full disk (/dev/full): one line and exit 2, as `crd --out /dev/full` was; a
    traceback of OSError before."""
    with open("/dev/full", "w") as full:
        result = subprocess.run([sys.executable, "-m", "cli.main", *command], stdout=full, stderr=subprocess.PIPE,
                                text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and "Exception ignored" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines()[-1] == "kubeon-gpu: cannot write the output: No space left on device"


def test_without_nodes_the_policies_gpu_models_are_named(capsys) -> None:
    machine = dry_run(capsys, "-f", str(EXAMPLES / "dra.yaml"), "-o", "json")
    assert f"{PROG}note: nodes: none given (--nodes): MIG profiles are chosen over the sharing policies' " \
           "gpuModels (NVIDIA-H200)" in machine.notes()
