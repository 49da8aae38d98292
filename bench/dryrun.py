"""Benchmark `kubeon-gpu dry-run` over a large file against its limit: parsing the same file (not a timed test).

The input: N objects, 70% Pods and 30% Deployments, a third of them asking
for GPUs in namespaces the example policies select (so MIG rewrites,
time-slicing and guardrails are decided), the rest plain CPU workloads as in
a cluster export. 100,000 objects is ~32 MiB of YAML.

Ours: `kubeon-gpu dry-run -f FILE --policies examples/policies.yaml --nodes
examples/nodes.yaml -o OUTPUT > /dev/null`, a subprocess. The limit: a
subprocess that only parses the same file with PyYAML's C loader
(`yaml.load_all(..., CSafeLoader)`, each document dropped as it comes).
A third run per pair parses with ours' own loader alone (gpupolicy/yamlload.py,
which builds the same objects faster than PyYAML's constructor), so what
the decisions and the writing cost is seen apart from the parse.
Runs are interleaved ours/limit for --pairs pairs; wall time, CPU time
(user+sys: steadier than wall on a shared machine) and peak RSS (ru_maxrss
of the child) are printed per run, then medians and the ratios.
Goals (issue 16): ours <= 2x the limit's time, <= 250 MiB at 100,000 objects.
The default (40,000 objects, `-o yaml` then `-o json`, 3 pairs each) runs in
about three minutes on 2 idle cores; time per object and memory do not
depend on N (docs/benchmarks.md) apart from ours' start (0.6 s of imports,
pydantic models mostly), which weighs twice as much at 20,000 as at 40,000
and a fifth as much at the goal's 100,000.

    python bench/dryrun.py
    python bench/dryrun.py --objects 100000 --pairs 3 --output yaml

--instructions: instructions per object instead of time, counted by
valgrind's callgrind (Debian package `valgrind`), which the machine's load
and speed do not move: each command runs on --objects and on twice as many,
and the difference over --objects is one object's cost (the start, imports
above all, cancels). A few minutes at 1,000 objects.

    python bench/dryrun.py --instructions --objects 1000
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIMIT = "import sys, yaml\nfor _ in yaml.load_all(open(sys.argv[1], 'rb'), Loader=yaml.CSafeLoader):\n    pass\n"
# ours' own parse alone (gpupolicy/yamlload.py: the same objects, built faster than PyYAML's constructor)
OWN_PARSE = ("import sys, yaml\nsys.path.insert(0, sys.argv[2])\nfrom gpupolicy.yamlload import KubeLoader\n"
             "for _ in yaml.load_all(open(sys.argv[1], 'rb'), Loader=KubeLoader):\n    pass\n")

_POD = """\
apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: {ns}
  labels: {{app: {app}, release: r{i}}}
spec:
  containers:
  - name: main
    image: registry.example.com/{app}:1.{i}
    ports:
    - {{containerPort: 8080}}
    resources:
      requests: {{cpu: 500m, memory: 1Gi}}
      limits: {{cpu: "2", memory: 4Gi{gpu}}}
"""

_DEPLOYMENT = """\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {name}
  namespace: {ns}
spec:
  replicas: 2
  selector:
    matchLabels: {{app: {app}}}
  template:
    metadata:
      labels: {{app: {app}}}
      annotations: {{gpu.kubeon.io/gpu-memory: {memory}}}
    spec:
      containers:
      - name: server
        image: registry.example.com/{app}:3.{i}
        resources:
          limits: {{cpu: "4", memory: 8Gi{gpu}}}
"""

# namespace -> app label: the example policies select inference (MIG), research+jupyter (time-slicing), batch.
_GPU_PLACES = (("inference", "llm"), ("research", "jupyter"), ("batch", "embed"))


def generate(path: Path, objects: int) -> None:
    """Write `objects` documents (70% Pods, 30% Deployments; one in three asks for GPUs), deterministic."""
    with path.open("w", encoding="utf-8") as fh:
        for i in range(objects):
            gpu_place = _GPU_PLACES[i % 3] if i % 3 == 0 else None
            ns, app = gpu_place or (f"team-{i % 17}", f"svc-{i % 101}")
            gpu = ", nvidia.com/gpu: 1" if gpu_place else ""
            template = _DEPLOYMENT if i % 10 >= 7 else _POD
            if i:
                fh.write("---\n")
            fh.write(template.format(name=f"obj-{i}", ns=ns, app=app, i=i, gpu=gpu, memory=f"{8 + i % 24}Gi"))


def dry_run_command(path: Path, output: str) -> list[str]:
    return [sys.executable, "-m", "cli.main", "dry-run", "-f", str(path), "--policies",
            str(ROOT / "examples/policies.yaml"), "--nodes", str(ROOT / "examples/nodes.yaml"), "-o", output]


def measure(command: list[str]) -> tuple[float, float, float]:
    """Wall seconds, CPU seconds (user+sys) and peak RSS (MiB) of one child, from a fresh parent (ru_* its own)."""
    probe = ("import resource, subprocess, sys, time\n"
             "t = time.perf_counter()\n"
             "rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL).returncode\n"
             "u = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
             "print(time.perf_counter() - t, u.ru_utime + u.ru_stime, u.ru_maxrss, rc)\n")
    out = subprocess.run([sys.executable, "-c", probe, *command], capture_output=True, text=True, cwd=ROOT,
                         check=True).stdout.split()
    if out[3] != "0":
        raise SystemExit(f"{' '.join(command)} exited {out[3]}")
    return float(out[0]), float(out[1]), int(out[2]) / 1024


def pairs(path: Path, objects: int, size: float, output: str, count: int) -> None:
    """`count` interleaved (ours, limit, ours' parse alone) runs for one output format; per run and the medians."""
    print(f"input: {path.name}, {objects} objects, {size:.1f} MiB; output -o {output}")
    ours, limit, own = [], [], []
    for pair in range(count):
        ours.append(measure(dry_run_command(path, output)))
        limit.append(measure([sys.executable, "-c", LIMIT, str(path)]))
        own.append(measure([sys.executable, "-c", OWN_PARSE, str(path), str(ROOT)]))
        (w, c, m), (lw, lc, lm), oc = ours[-1], limit[-1], own[-1][1]
        print(f"pair {pair + 1}: ours {w:.2f} s wall {c:.2f} s cpu {m:.0f} MiB | "
              f"C-loader parse {lw:.2f} s wall {lc:.2f} s cpu {lm:.0f} MiB | "
              f"ratio wall {w / lw:.2f}x cpu {c / lc:.2f}x | ours' parse alone {oc:.2f} s cpu", flush=True)
    w, c, m = (statistics.median(run[i] for run in ours) for i in range(3))
    lw, lc, lm = (statistics.median(run[i] for run in limit) for i in range(3))
    ratios = sorted(o[1] / li[1] for o, li in zip(ours, limit, strict=True))
    print(f"-o {output} median: ours {w:.2f} s wall, {c:.2f} s cpu, {m:.0f} MiB; limit {lw:.2f} s wall, {lc:.2f} s "
          f"cpu, {lm:.0f} MiB; ratio wall {w / lw:.2f}x, cpu {c / lc:.2f}x (pairs {ratios[0]:.2f}-{ratios[-1]:.2f}; "
          f"goal <= 2x); memory {m:.0f} MiB (goal <= 250 MiB at 100,000)", flush=True)
    oc = statistics.median(run[1] for run in own)
    print(f"-o {output} ours' own parse alone (gpupolicy/yamlload.py) {oc:.2f} s cpu, {oc / lc:.2f}x the C-loader "
          f"parse; ours {c / oc:.2f}x its own parse", flush=True)


def instructions(objects: int, outputs: list[str], tmp: Path) -> None:
    """Instructions per object (bench/callgrind.py), ours against the limit: each command on `objects` and on
    twice as many, the difference over `objects` (what starting costs, the imports above all, cancels)."""
    sys.path.insert(0, str(ROOT))
    from bench.callgrind import instructions_of

    files = {n: tmp / f"objects-{n}.yaml" for n in (objects, 2 * objects)}
    for n, path in files.items():
        generate(path, n)
    commands = {"limit (C-loader parse)": lambda f: [sys.executable, "-c", LIMIT, str(f)],
                "ours' parse alone": lambda f: [sys.executable, "-c", OWN_PARSE, str(f), str(ROOT)]}
    for output in outputs:
        commands[f"ours -o {output}"] = lambda f, o=output: dry_run_command(f, o)
    runs = [(name, n) for name in commands for n in files]
    with ThreadPoolExecutor(os.cpu_count()) as pool:
        counts = dict(zip(runs, pool.map(lambda run: instructions_of(commands[run[0]](files[run[1]]), ROOT), runs),
                          strict=True))
    per = {name: (counts[name, 2 * objects] - counts[name, objects]) / objects for name in commands}
    limit = per["limit (C-loader parse)"]
    print(f"instructions per object (callgrind; {objects} and {2 * objects} objects, the difference):")
    for name, count in per.items():
        print(f"  {name:<24} {count:12,.0f}  {count / limit:.2f}x the limit")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objects", type=int, default=40_000, help="objects in the generated file")
    parser.add_argument("--pairs", type=int, default=3, help="interleaved ours/limit pairs (at least 3)")
    parser.add_argument("--output", nargs="+", default=["yaml", "json"], choices=("yaml", "json", "jsonl"),
                        help="dry-run -o, one set of pairs each")
    parser.add_argument("--file", type=Path, help="use this file instead of generating one")
    parser.add_argument("--instructions", action="store_true",
                        help="count instructions per object under callgrind instead (--objects: 1,000 is enough)")
    args = parser.parse_args()
    if args.instructions:
        with tempfile.TemporaryDirectory() as tmp:
            instructions(args.objects, args.output, Path(tmp))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        path = args.file or Path(tmp) / "objects.yaml"
        if not args.file:
            generate(path, args.objects)
        size = os.path.getsize(path) / 2**20
        for output in args.output:
            pairs(path, args.objects, size, output, args.pairs)
    print(f"cpu count {os.cpu_count()}, load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
