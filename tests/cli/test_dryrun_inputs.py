"""`kubeon-gpu dry-run` on the input a new user gives it: odd files, stdin, directories, wrong types.

Real: the CLI (cli.main.main in-process, or a subprocess where stdin, a crash
or a traceback matter) on real files in a temp directory. Faked: nothing.
Every problem is one line `kubeon-gpu dry-run: FILE, document N: FIELD: what
is wrong`, exit status 2, and the other documents are still evaluated.
"""

from __future__ import annotations

import copy
import json
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.cli.helpers import EXAMPLES, PROG, ROOT, dry_run, subprocess_run

POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "llm", "namespace": "inference"},
       "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}
POLICIES = str(EXAMPLES / "policies.yaml")


def pod(name: str = "llm", **spec: object) -> dict:
    fresh = copy.deepcopy(POD)
    return {**fresh, "metadata": {"name": name, "namespace": "inference"}, "spec": {**fresh["spec"], **spec}}


def write(tmp_path: Path, name: str, content: bytes | str | list) -> str:
    path = tmp_path / name
    if isinstance(content, list):
        content = yaml.safe_dump_all(content, sort_keys=False)
    if isinstance(content, str):
        content = content.encode()
    path.write_bytes(content)
    return str(path)


def names(out: str) -> list[str]:
    return [entry["object"]["metadata"]["name"] for entry in json.loads(out)]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\x7fELF\x02\x01\x01\x00\x00\x00binary", "document 1: binary data, not YAML text"),
        ("kind: Pod\nmetadata: {name: caf\xe9}\n".encode("latin-1"), "document 1: not UTF-8 text"),
        (b"", "empty file: no Kubernetes objects"),
        (b"\n  \n# only a comment\n---\n", "no Kubernetes objects (only comments and empty documents)"),
        (b"version: '3'\nservices: {web: {image: nginx}}\n", "document 1: kind: missing; not a Kubernetes object"),
        (b"- 1\n- 2\n", "document 1: not a Kubernetes object (the document is a list"),
        (b"just words\n", "document 1: not a Kubernetes object (the document is a str scalar"),
        (b"kind: Pod\nmetadata: {name: [\n", "document 1: not valid YAML at line 3"),
        (b"kind: Pod\nmetadata: {name: a}\nspec: {priority: !!int abc}\n",
         "document 1: not valid YAML at line 3, column 18: int value 'abc' cannot be read"),
        (b"kind: Pod\nmetadata: {name: a, labels: {big: " + b"9" * 5000 + b"}}\n",
         "document 1: not valid YAML at line 2, column 35: int value '9999"),
    ],
    ids=["binary", "latin-1", "empty", "comment-only", "compose-file", "list", "scalar", "yaml-syntax",
         "tagged-int", "5000-digit-int"],
)
def test_unusable_file_is_one_line_naming_file_and_document(tmp_path: Path, capsys, content: bytes,
                                                            message: str) -> None:
    bad = write(tmp_path, "bad.yaml", content)
    good = write(tmp_path, "good.yaml", [pod()])
    run = dry_run(capsys, "-f", bad, "-f", good, "--policies", POLICIES, "-o", "json")
    assert run.code == 2
    separator = ", " if message.startswith("document") else ": "
    assert len(run.errors()) == 1 and run.errors()[0].startswith(f"{PROG}{bad}{separator}{message}"), run.err
    assert names(run.out) == ["llm"]  # the good file is still evaluated and written


def test_an_alias_bomb_is_one_line_not_a_crash(tmp_path: Path) -> None:
    """Nine lines of nested anchors stand for 490 million nodes: refused as kubectl refuses them. Run as a
    subprocess under a 3 GiB address-space limit: before the check, writing the object out took every byte
    of the machine and then crashed."""
    lines = [b"kind: Pod", b"metadata: {name: a}", b"spec:", b"  l0: &l0 [" + b",".join([b"lol"] * 9) + b"]"]
    lines += [b"  l%d: &l%d [%s]" % (i, i, b",".join([b"*l%d" % (i - 1)] * 9)) for i in range(1, 9)]
    bomb = write(tmp_path, "bomb.yaml", b"\n".join(lines) + b"\n")

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))

    done = subprocess.run([sys.executable, "-m", "cli.main", "dry-run", "-f", bomb, "-o", "json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, preexec_fn=cap)
    assert done.returncode == 2, done.stderr[-500:]
    assert f"{PROG}{bomb}, document 1: not valid YAML at line 1, column 1: excessive aliasing" in done.stderr


def test_other_kinds_are_skipped_with_a_note(tmp_path: Path, capsys) -> None:
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"}, "spec": {"ports": [{"port": 80}]}}
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "b"}}
    path = write(tmp_path, "app.yaml", [service, pod("a"), config, pod("b"), service])
    run = dry_run(capsys, "-f", path, "--policies", POLICIES, "-o", "json")
    assert run.code == 0, run.err
    assert names(run.out) == ["a", "b"]
    assert f"{PROG}note: {path}: skipped 2 Service, 1 ConfigMap (dry-run evaluates Pod, Deployment" in run.err
    assert run.errors() == []


def test_only_other_kinds_is_an_error(tmp_path: Path, capsys) -> None:
    path = write(tmp_path, "cm.yaml", [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}])
    run = dry_run(capsys, "-f", path)
    assert run.code == 2
    assert run.errors() == [f"{PROG}{path}: no Pod or workload to evaluate"]


def test_a_bad_document_does_not_lose_the_others(tmp_path: Path, capsys) -> None:
    bad = pod("bad")
    bad["spec"]["containers"][0]["resources"] = {"limits": ["nvidia.com/gpu"]}
    path = write(tmp_path, "pods.yaml", [pod("a"), bad, pod("c")])
    run = dry_run(capsys, "-f", path, "--policies", POLICIES, "-o", "json")
    assert run.code == 2
    assert run.errors() == [f"{PROG}{path}, document 2: spec.containers[0].resources.limits: must be a map, "
                            "not a list"]
    assert names(run.out) == ["a", "c"]


def test_list_items_are_named_in_messages(tmp_path: Path, capsys) -> None:
    bad = pod("bad", nodeSelector=["gpu"])
    path = write(tmp_path, "list.yaml", [{"apiVersion": "v1", "kind": "List", "items": [pod("a"), bad]}])
    run = dry_run(capsys, "-f", path, "-o", "json")
    assert run.code == 2
    assert run.errors() == [f"{PROG}{path}, document 1, items[1]: spec.nodeSelector: must be a map, not a list"]
    assert names(run.out) == ["a"]


WRONG_TYPES = [  # the wording of the shared shape check, gpupolicy/admission/shape.py
    ({"metadata": {"name": "p", "labels": ["a"]}}, "metadata.labels: must be a map, not a list"),
    ({"metadata": {"name": "p", "labels": {"version": 2}}}, "metadata.labels.version: must be a string, not a number"),
    ({"metadata": {"name": "p", "annotations": "x"}}, "metadata.annotations: must be a map, not a string"),
    ({"metadata": {"name": ["p"]}}, "metadata.name: must be a string, not a list"),
    ({"metadata": {"name": "p", "ownerReferences": {"kind": "Job"}}}, "metadata.ownerReferences: must be a list"),
    ({"spec": "containers"}, "spec: must be an object, not a string"),
    ({"spec": {"containers": {"name": "c"}}}, "spec.containers: must be a list, not an object"),
    ({"spec": {"containers": ["c"]}}, "spec.containers[0]: must be an object, not a string"),
    ({"spec": {"containers": [{"name": "c", "resources": [1]}]}},
     "spec.containers[0].resources: must be an object, not a list"),
    ({"spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": [1]}}}]}},
     "spec.containers[0].resources.limits.nvidia.com/gpu: a list is not a quantity"),
    ({"spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "one"}}}]}},
     "spec.containers[0].resources.limits.nvidia.com/gpu: 'one' is not a quantity"),
    ({"spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1e1000000"}}}]}},
     "spec.containers[0].resources.limits.nvidia.com/gpu: '1e1000000' is larger than the largest quantity"),
    ({"spec": {"initContainers": [{"name": "i", "resources": {"requests": {"memory": "9e99999Gi"}}}]}},
     "spec.initContainers[0].resources.requests.memory: '9e99999Gi' is not a quantity"),
    ({"spec": {"containers": [], "nodeSelector": {"gpu": True}}}, "spec.nodeSelector.gpu: must be a string"),
    ({"spec": {"containers": [], "affinity": "h200"}}, "spec.affinity: must be an object, not a string"),
]


@pytest.mark.parametrize(("override", "message"), WRONG_TYPES, ids=[m.split(":")[0] for _, m in WRONG_TYPES])
def test_wrong_typed_fields_name_the_field(tmp_path: Path, capsys, override: dict, message: str) -> None:
    obj = {**copy.deepcopy(POD), **override}
    path = write(tmp_path, "pod.yaml", [pod("first"), obj])
    run = dry_run(capsys, "-f", path, "--policies", POLICIES, "-o", "json")
    assert run.code == 2
    assert len(run.errors()) == 1 and run.errors()[0].startswith(f"{PROG}{path}, document 2: {message}"), run.err
    assert names(run.out) == ["first"]


def test_workload_template_fields_are_named_from_the_workload(tmp_path: Path, capsys) -> None:
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d", "namespace": "inference"},
                  "spec": {"template": {"metadata": {"labels": ["x"]}, "spec": {"containers": []}}}}
    cron = {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "c"}, "spec": {"jobTemplate": "x"}}
    path = write(tmp_path, "w.yaml", [deployment, cron])
    run = dry_run(capsys, "-f", path)
    assert run.code == 2
    assert run.errors() == [
        f"{PROG}{path}, document 1: spec.template.metadata.labels: must be a map, not a list",
        f"{PROG}{path}, document 2: spec.jobTemplate: must be an object, not a string",
    ]


def test_stdin_with_dash(capsys) -> None:
    """`cat pod.yaml | kubeon-gpu dry-run -f -` (a real pipe into a real process)."""
    run = subprocess_run("dry-run", "-f", "-", "--policies", POLICIES, "-o", "json",
                         stdin=(EXAMPLES / "pod.yaml").read_bytes())
    assert run.code == 0, run.err
    assert names(run.out) == ["llm-tiny"]
    bad = subprocess_run("dry-run", "-f", "-", stdin=b"kind: Pod\nspec: 3\n")
    assert bad.code == 2 and bad.errors() == [f"{PROG}<stdin>, document 1: spec: must be an object, not a number"]


def test_stdin_holding_policies_and_pods(capsys) -> None:
    """Policies in the same stream as the pods apply to them (the stream is read twice from a spool)."""
    text = (EXAMPLES / "pod.yaml").read_bytes() + b"\n---\n" + (EXAMPLES / "policies.yaml").read_bytes()
    run = subprocess_run("dry-run", "-f", "-", "-o", "json", "--metrics", stdin=text)
    assert run.code == 0, run.err
    entry = json.loads(run.out)[0]
    assert entry["decisions"][0]["policy"] == "share-inference" and entry["decisions"][0]["applied"]


def test_repeated_f_and_directories_keep_order(tmp_path: Path, capsys) -> None:
    folder = tmp_path / "manifests"
    folder.mkdir()
    write(folder, "b.yaml", [pod("b1"), pod("b2")])
    write(folder, "a.yml", [pod("a1")])
    write(folder, "c.json", json.dumps(pod("c1")))
    write(folder, "notes.txt", "not read")
    single = write(tmp_path, "z.yaml", [pod("z1")])
    run = dry_run(capsys, "-f", single, "-f", str(folder), "--policies", POLICIES, "-o", "json")
    assert run.code == 0, run.err
    assert names(run.out) == ["z1", "a1", "b1", "b2", "c1"]


def test_missing_file_and_empty_directory(tmp_path: Path, capsys) -> None:
    (tmp_path / "empty").mkdir()
    good = write(tmp_path, "p.yaml", [pod()])
    run = dry_run(capsys, "-f", str(tmp_path / "nope.yaml"), "-f", str(tmp_path / "empty"), "-f", good, "-o", "json")
    assert run.code == 2
    assert run.errors() == [f"{PROG}{tmp_path / 'nope.yaml'}: no such file or directory",
                            f"{PROG}{tmp_path / 'empty'}: directory holds no .yaml, .yml, .json files"]
    assert names(run.out) == ["llm"]


def test_no_input_is_a_usage_error(capsys) -> None:
    run = dry_run(capsys)
    assert run.code == 2 and "give -f FILE" in run.errors()[0]


@pytest.mark.parametrize(
    ("policies", "message"),
    [
        ([{"apiVersion": "gpu.kubeon.io/v1alpha1", "kind": "GpuPolicy", "metadata": {"name": "ok"},
           "spec": {"guardrail": {"maxGpusPerPod": 1}}},
          {"apiVersion": "gpu.kubeon.io/v1alpha1", "kind": "GpuPolicy", "metadata": {"name": "bad"},
           "spec": {"mode": "Often", "guardrail": {}}}], "document 2: spec.mode: Input should be"),
        ([{"apiVersion": "gpu.kubeon.io/v1alpha1", "kind": "GpuPolicy", "metadata": {"name": "s"},
           "spec": {"sharing": {"strategy": "MIG", "gpuMemory": "lots"}}}], "document 1: spec.sharing.gpuMemory"),
        ([{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}],
         "document 1: kind: Pod does not belong in --policies (it takes GpuPolicy and Namespace objects"),
        ([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml", "labels": {"team": 7}}}],
         "document 1: metadata.labels.team: must be a string"),
    ],
    ids=["bad-mode", "bad-quantity", "pod-in-policies", "namespace-labels"],
)
def test_policies_are_validated_naming_document_and_field(tmp_path: Path, capsys, policies: list,
                                                          message: str) -> None:
    path = write(tmp_path, "policies.yaml", policies)
    good = write(tmp_path, "pod.yaml", [pod()])
    run = dry_run(capsys, "-f", good, "--policies", path, "-o", "json")
    assert run.code == 2
    assert len(run.errors()) == 1 and run.errors()[0].startswith(f"{PROG}{path}, {message}"), run.err
    assert names(run.out) == ["llm"]


def test_overflowing_policy_quantity_is_reported_not_a_traceback(tmp_path: Path) -> None:
    policy = {"apiVersion": "gpu.kubeon.io/v1alpha1", "kind": "GpuPolicy", "metadata": {"name": "s"},
              "spec": {"sharing": {"strategy": "MIG", "gpuMemory": "1e1000000"}}}
    path = write(tmp_path, "policies.yaml", [policy])
    run = subprocess_run("dry-run", "-f", str(EXAMPLES / "pod.yaml"), "--policies", path, "-o", "json")
    assert run.code == 2 and "Traceback" not in run.err
    assert len(run.errors()) == 1 and run.errors()[0].startswith(f"{PROG}{path}, document 1: "), run.err
    assert names(run.out) == ["llm-tiny"]


@pytest.mark.parametrize(
    ("node", "message"),
    [
        ({"metadata": {"labels": {"nvidia.com/gpu.product": "NVIDIA-H200"}}}, "metadata.name: missing"),
        ({"metadata": {"name": "n", "labels": ["NVIDIA-H200"]}}, "metadata.labels: must be a map, not a list"),
        ({"metadata": {"name": "n"}, "status": {"allocatable": {"nvidia.com/gpu": "eight"}}},
         "status.allocatable.nvidia.com/gpu: 'eight' is not a quantity"),
        ({"metadata": {"name": "n"}, "status": {"capacity": {"nvidia.com/gpu": "8e8000000"}}},
         "status.capacity.nvidia.com/gpu: '8e8000000' is larger than the largest quantity"),
        ({"kind": "Pod", "metadata": {"name": "n"}}, "kind: Pod does not belong in --nodes (it takes Node objects"),
    ],
    ids=["no-name", "labels-list", "bad-quantity", "overflow", "pod-in-nodes"],
)
def test_nodes_are_validated_naming_document_and_field(tmp_path: Path, capsys, node: dict, message: str) -> None:
    good_node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "h200",
                                                                 "labels": {"nvidia.com/gpu.product": "NVIDIA-H200"}}}
    path = write(tmp_path, "nodes.yaml", [good_node, {"apiVersion": "v1", "kind": "Node", **node}])
    run = dry_run(capsys, "-f", write(tmp_path, "pod.yaml", [pod()]), "--nodes", path, "-o", "json")
    assert run.code == 2
    assert len(run.errors()) == 1 and run.errors()[0].startswith(f"{PROG}{path}, document 2: {message}"), run.err
    assert names(run.out) == ["llm"]


@pytest.mark.parametrize("style", ["flow", "block"])
def test_deep_nesting_never_crashes_the_process(tmp_path: Path, style: str) -> None:
    """libyaml's composer recurses in C: ~30,000 levels kill the process (SIGSEGV) unless read another way."""
    depth = 60_000
    deep = ("a: " + "[" * depth + "]" * depth + "\n") if style == "flow" else "".join(
        " " * i + "- " for i in range(0, 2 * 3000, 2)) + "x\n"
    first = yaml.safe_dump(pod("before"))
    path = write(tmp_path, "deep.yaml", first + "---\n" + deep)
    other = write(tmp_path, "other.yaml", [pod("after")])
    run = subprocess_run("dry-run", "-f", path, "-f", other, "-o", "json", timeout=120)
    assert run.code == 2, (run.code, run.err[-2000:])
    assert "Traceback" not in run.err
    assert run.errors() == [f"{PROG}{path}, document 2: nested more than 1000 levels deep; not read"], run.err[-2000:]
    assert names(run.out) == ["before", "after"]


def test_nesting_the_answer_cannot_be_written_in_is_one_line(tmp_path: Path, capsys) -> None:
    depth = 900  # under the parser guard (1,000 levels), over what the YAML writer recurses into
    deep = json.dumps(pod("deep", extra="NESTED")).replace('"NESTED"', "[" * depth + '"x"' + "]" * depth)
    path = write(tmp_path, "pod.yaml", deep + "\n---\n" + json.dumps(pod("ok")))
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(1000)  # CPython's default; some test runners raise it, and the writer's depth depends on it
    try:
        run = dry_run(capsys, "-f", path, "-o", "yaml", "--metrics")
    finally:
        sys.setrecursionlimit(limit)
    assert run.code == 2
    assert run.errors() == [f"{PROG}{path}, document 1: nested too deeply to write the answer"], run.err
    assert [d["object"]["metadata"]["name"] for d in yaml.safe_load_all(run.out)] == ["ok"]


def test_many_brackets_that_do_not_nest_are_read(tmp_path: Path, capsys) -> None:
    """A large JSON List (thousands of brackets in one document, strings full of brackets) is not 'too deep'."""
    items = [pod(f"p{i}", command=["sh", "-c", "echo '[[[[' \"]]{{\" # [[["]) for i in range(300)]
    path = write(tmp_path, "list.json", json.dumps({"apiVersion": "v1", "kind": "List", "items": items}, indent=1))
    run = dry_run(capsys, "-f", path, "-o", "json")
    assert run.code == 0, run.err
    assert len(json.loads(run.out)) == 300
