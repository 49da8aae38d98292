"""`kubeon-gpu simulate`: replay an openb-format trace through a packing strategy, print one JSON line.

Bad input (missing file or column, bad value, unknown strategy) prints one
line naming it on stderr and exits 2. On a terminal, a progress bar on
stderr (tqdm) counts the arrivals; nothing is written there otherwise.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tqdm import tqdm

from cli import simcapacity
from gpupolicy.packing.engine import DEFAULT_STRATEGY, STRATEGIES, UnknownStrategyError
from gpupolicy.packing.nodemodel import PodDemand
from simulator.replay import MAX_TUNE, ReplayResult, replay, tune_problem
from simulator.trace import TraceError, load_nodes, load_pods

PLACEMENT_COLUMNS = ("seq", "pod", "node", "gpu_indices", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli",
                     "gpu_spec")


EPILOG = """\
output: one JSON line with these keys
  strategy                the packing strategy replayed
  seed                    the seed of the arrival order, the resampling and the tie-breaks
  pods                    arrivals replayed: the trace's pods in shuffled order, then pods drawn again
                          from the trace until arrived GPU demand reaches --tune x the cluster's GPU
                          capacity; so it is larger than the trace's row count unless the trace alone
                          asks for that much
  alloc_pct_at_100        GPUs allocated, % of the cluster's GPU capacity, when the GPU demand that has
                          arrived first reaches 100% of capacity (null if it never does); the number the
                          openb papers report
  alloc_pct_at_end        the same after the last arrival
  unallocated_pct_at_100  100 - alloc_pct_at_100: capacity left unused (fragmented) at that point
  seconds                 wall time of the replay

example (files vendored in the repository):
  kubeon-gpu simulate --nodes vendor/openb/openb_node_list_gpu_node.csv \\
      --pods vendor/openb/openb_pod_list_default.csv --strategy fgd --seed 42
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EPILOG
    parser.add_argument("--nodes", required=True, metavar="CSV",
                        help="nodes CSV in openb format (sn,cpu_milli,memory_mib,gpu,model)")
    parser.add_argument("--pods", required=True, metavar="CSV",
                        help="pods CSV in openb format (name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec)")
    parser.add_argument("--strategy", "--policy", dest="strategy", default=DEFAULT_STRATEGY,
                        help=f"packing strategy: one of {', '.join(STRATEGIES)} (default: {DEFAULT_STRATEGY}; "
                             "--policy: the old name)")
    parser.add_argument("--seed", type=int, default=None,
                        help="random seed of the arrival order, resampling and tie-breaks (default: 42, "
                             "0 with --capacity; "
                             "weights were tuned on 42..51 only)")
    parser.add_argument("--tune", type=float, default=1.3,
                        help="replay until arrived GPU demand reaches this multiple of GPU capacity, above 0 and "
                             f"at most {MAX_TUNE:g} (default: 1.3)")
    parser.add_argument("--placements", metavar="CSV", help="write every placement to this CSV, in arrival order")
    parser.add_argument("--through-extender", action="store_true",
                        help="replay through the extender's HTTP endpoints with kube-scheduler's scoring of "
                             "the scheduler profile (cli/livereplay.py)")
    parser.add_argument("--scheduler-config", metavar="FILE",
                        help="KubeSchedulerConfiguration (or its ConfigMap) for --through-extender "
                             "(default: the chart's, manifests/rendered/scheduler.yaml)")
    parser.add_argument("--route-cpu-pods-on-gpu-nodes", choices=("true", "false"), default=None,
                        help="with --through-extender: the webhook's switch of the same name (default: true, "
                             "the chart's); false leaves the trace's CPU-only pods to the default-scheduler")
    simcapacity.add_arguments(parser)


def _progress_bar(arrivals: list[PodDemand]) -> Iterable[PodDemand]:
    """A tqdm bar over the arrivals on a terminal's stderr; the arrivals unchanged otherwise."""
    if not sys.stderr.isatty():
        return arrivals
    bar: Iterable[PodDemand] = tqdm(arrivals, desc="simulate", unit=" pods", file=sys.stderr, leave=False)
    return bar


def write_placements(path: str, result: ReplayResult) -> None:
    with open(path, "w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(PLACEMENT_COLUMNS)
        for p in result.placements:
            spec = "|".join(sorted(p.pod.allowed_models)) if p.pod.allowed_models else ""
            out.writerow([p.seq, p.pod.name, p.node or "", "|".join(str(g) for g in p.gpu_indices),
                          p.pod.cpu_milli, p.pod.memory_mib, p.pod.num_gpu, p.pod.gpu_milli, spec])


def _scheduler_config(path: str | Path) -> dict[str, Any]:
    """The KubeSchedulerConfiguration of `path`, checked as `--through-extender` uses it; `ProfileError`
    naming the file (and the field) when it cannot be used."""
    from cli.livereplay import load_scheduler_config
    from simulator.kubescheduler import Profile, ProfileError

    try:
        config = load_scheduler_config(path)
        if not Profile.from_config(config).extenders:
            raise ProfileError("extenders: none (the replay goes through the extender)")
    except UnicodeDecodeError as exc:
        raise ProfileError(f"--scheduler-config {path}: not UTF-8 text ({exc.reason})") from None
    except ProfileError as exc:
        message = str(exc)
        prefix = f"{path}: "
        raise ProfileError(f"--scheduler-config {message if message.startswith(prefix) else prefix + message}"
                           ) from None
    return config


def run(args: argparse.Namespace) -> int:
    if args.seed is not None and args.seed < 0:
        print(f"error: --seed must be a non-negative integer, got {args.seed}", file=sys.stderr)
        return 2
    if args.capacity:
        return simcapacity.run_capacity(args)
    if args.seed is None:
        args.seed = 42
    if args.strategy not in STRATEGIES:
        print(f"error: unknown strategy {args.strategy!r}; choose from {', '.join(STRATEGIES)}", file=sys.stderr)
        return 2
    problem = tune_problem(args.tune)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    if args.route_cpu_pods_on_gpu_nodes is not None and not args.through_extender:
        print("error: --route-cpu-pods-on-gpu-nodes needs --through-extender (the simulator routes no pods)",
              file=sys.stderr)
        return 2
    try:
        nodes = load_nodes(args.nodes)
        pods = load_pods(args.pods)
        if args.through_extender:
            from cli.livereplay import SHIPPED_SCHEDULER_CONFIG, replay_through_extender

            config = _scheduler_config(args.scheduler_config or SHIPPED_SCHEDULER_CONFIG)
            result = replay_through_extender(nodes, pods, args.seed, args.tune, config, args.strategy,
                                             keep_placements=bool(args.placements),
                                             route_cpu_pods=args.route_cpu_pods_on_gpu_nodes != "false")
        else:
            result = replay(nodes, pods, args.strategy, args.seed, args.tune, keep_placements=bool(args.placements),
                            progress=_progress_bar)
    except (TraceError, UnknownStrategyError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.placements:
        try:
            write_placements(args.placements, result)
        except OSError as exc:
            print(f"error: --placements {args.placements}: {exc.strerror or exc}", file=sys.stderr)
            return 2
    print(json.dumps(result.summary()))
    return 0
