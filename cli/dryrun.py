"""`kubeon-gpu dry-run`: what the optimizer would do to pods and workloads, offline.

Two passes, the first only where it is needed: GpuPolicies, Nodes and
Namespaces (from `--policies`, `--nodes`, or `-f` files the byte scan says
hold them) are read first, since every decision depends on them; then each
Pod or workload of the `-f` files is parsed, decided, written and forgotten
(cli/sources.py, cli/writers.py), so memory stays flat however large the input.

Bad input never ends the run: each problem is one line on stderr,
`kubeon-gpu dry-run: FILE, document N: FIELD: what is wrong`, the other
documents are still evaluated and written, and the exit status is 2.
Documents of other kinds (Service, ConfigMap, ...) are skipped with a note.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, TextIO

from tqdm import tqdm

from cli.sources import (
    CONTEXT_KINDS,
    Document,
    Problem,
    Scan,
    Source,
    documents,
    example_sources,
    expand,
    objects,
    scan,
)
from cli.writers import FORMATS, Writer
from gpupolicy.admission.dryrun import (
    CLAIM_TEMPLATE_NOTE,
    SHARED_CLAIM_NOTE,
    SUPPORTED_KINDS,
    DryRunError,
    claim_templates,
    dry_run,
)
from gpupolicy.admission.mutate import AdmissionResult
from gpupolicy.admission.shape import object_shape_error
from gpupolicy.admission.validation import check_policy
from gpupolicy.catalog import DEFAULT_CATALOG
from gpupolicy.cluster import ClusterView, node_from_object
from gpupolicy.model import GpuPolicy, Mode
from gpupolicy.scaling.autoscale import UNSET_SERVER, offers
from serving.flags import http_url

PROG = "kubeon-gpu dry-run"
ROLE_KINDS = {"--policies": ("GpuPolicy", "Namespace"), "--nodes": ("Node",), "-f": CONTEXT_KINDS}

EPILOG = f"""\
output (-o yaml, json, jsonl): one entry per Pod or workload evaluated, in input order; each entry is
the POST /dry-run answer: allowed, object (after mutation), patch (JSON Patch against the input),
warnings, decisions (policy, mode, action, applied, reason), and message/note when set; a
Deployment or StatefulSet a ScaleToZero policy with autoscale selects also gets scaledObjects (policy,
name, yaml): the KEDA ScaledObject the controller offers as a recommendation while keda.enabled=false;
an entry whose policies are enforced below the mode they request (sharing and scaleToZero stay Recommend
without --metrics) gets enforcedBelowRequested (policy, requested, enforced, reason with the flag that
changes it), which -o text puts on the entry's first line. A pod a `via: DRA` sharing policy rewrites is
followed by an entry for each ResourceClaimTemplate or shared ResourceClaim (TimeSlicing) it names (object:
what the controller creates).
  json:  a JSON list          yaml: a YAML stream, one document per entry, no anchors
  jsonl: one entry per line   text: a readable summary (the default with --example)
Documents of other kinds ({", ".join(("Service", "ConfigMap", "..."))}) are skipped with a note on stderr.
Without --nodes, MIG profiles are chosen over every MIG-capable model of the built-in catalog
(the note on stderr names them).

exit status: 0 all evaluated; 2 some input unusable (one line each on stderr:
`{PROG}: FILE, document N: FIELD: what is wrong`; the other documents are still evaluated).
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EPILOG
    parser.add_argument("-f", "--filename", metavar="FILE", action="append", default=[],
                        help="Pods and workloads to evaluate, YAML or JSON (Deployment, StatefulSet, Job, CronJob, "
                             "... or a List); may also hold GpuPolicies, Nodes, Namespaces. A directory: its "
                             ".yaml/.yml/.json files; '-': standard input. Repeatable")
    parser.add_argument("--policies", metavar="FILE", action="append", default=[],
                        help="GpuPolicy documents (and Namespaces, for namespaceSelector); repeatable")
    parser.add_argument("--nodes", metavar="FILE", action="append", default=[],
                        help="Node documents with GPU Feature Discovery labels (nvidia.com/gpu.product); "
                             "without it the built-in GPU catalog is assumed; repeatable")
    parser.add_argument("-o", "--output", choices=FORMATS,
                        help="text summary, or every answer as yaml, json or jsonl (default: yaml; text "
                             "with --example)")
    parser.add_argument("--example", action="store_true",
                        help="evaluate the embedded example (policies, nodes, workloads; examples/ in the repository)")
    parser.add_argument("--default-mode", choices=[m.value for m in Mode], default=Mode.RECOMMEND.value,
                        help="mode of policies that set none (the install's defaultMode; default: Recommend)")
    parser.add_argument("--route-cpu-pods-on-gpu-nodes", choices=("true", "false"), default="true",
                        help="as the install's webhook.routeCpuPodsOnGpuNodes: CPU-only pods that tolerate the "
                             "GPU taint get the schedulerName of the policies they match (default: true)")
    parser.add_argument("--metrics", action="store_true",
                        help="evaluate as an install with prometheus.url set; without it sharing and "
                             "scaleToZero policies stay Recommend, as they do in the cluster (--example implies it)")
    parser.add_argument("--prometheus-url", type=http_url, metavar="URL", default=None,
                        help="the install's prometheus.url: serverAddress of the KEDA ScaledObjects offered in "
                             f"scaledObjects (default {UNSET_SERVER}); implies --metrics")


@dataclass
class Report:
    """Lines on stderr; remembers whether any input was unusable (exit status 2)."""

    err: TextIO
    errors: int = 0
    skipped: dict[str, Counter[str]] = field(default_factory=dict)

    def problem(self, problem: Problem) -> None:
        self.errors += 1
        self._line(f"{PROG}: {problem}")

    def note(self, text: str) -> None:
        self._line(f"{PROG}: note: {text}")

    def skip(self, doc: Document) -> None:
        self.skipped.setdefault(doc.source, Counter())[str(doc.obj.get("kind"))] += 1

    def _line(self, text: str) -> None:
        tqdm.write(text, file=self.err)

    def flush_skipped(self) -> None:
        for source, kinds in self.skipped.items():
            what = ", ".join(f"{n} {kind}" for kind, n in kinds.most_common())
            self.note(f"{source}: skipped {what} (dry-run evaluates {', '.join(SUPPORTED_KINDS)})")


@dataclass
class Context:
    """The GpuPolicies, Nodes and Namespaces that decisions read."""

    policies: list[GpuPolicy] = field(default_factory=list)
    nodes: list[dict[str, Any]] = field(default_factory=list)
    namespaces: dict[str, dict[str, str]] = field(default_factory=dict)

    def add(self, doc: Document, role: str) -> Problem | None:
        """Take a context document; a problem when it is invalid or not a kind `role` accepts."""
        kind = doc.obj["kind"]
        if kind not in ROLE_KINDS[role]:
            return doc.problem(f"kind: {kind} does not belong in {role} (it takes {' and '.join(ROLE_KINDS[role])} "
                               "objects; give Pods and workloads with -f)")
        shape = _shape_problem(doc.obj)
        if shape:
            return doc.problem(shape)
        try:
            if kind == "GpuPolicy":
                policy, errors = check_policy(doc.obj, DEFAULT_CATALOG)
                if errors or policy is None:
                    return doc.problem(errors[0] if errors else "not a valid GpuPolicy")
                self.policies.append(policy)
                return None
            meta = doc.obj.get("metadata") or {}
            if not meta.get("name"):
                return doc.problem(f"metadata.name: missing: a {kind} needs a name")
            if kind == "Node":
                self.nodes.append(doc.obj)
            else:
                self.namespaces[meta["name"]] = dict(meta.get("labels") or {})
        except RecursionError:
            return doc.problem("nested too deeply to read")
        except Exception as exc:  # the edge: never a traceback for input
            return doc.problem(f"cannot be read ({type(exc).__name__}: {str(exc)[:200]})")
        return None

    def view(self, default_mode: Mode, metrics: bool = False, route_cpu_pods: bool = True) -> ClusterView:
        return ClusterView(policies=tuple(self.policies), namespace_labels=self.namespaces,
                           nodes=tuple(node_from_object(n) for n in self.nodes), default_mode=default_mode,
                           metrics_configured=metrics, route_cpu_pods=route_cpu_pods)


def _items(source: Source, found: Scan) -> Iterator[Document | Problem]:
    for item in documents(source, found):
        if isinstance(item, Problem):
            yield item
        elif item.obj is not None:  # an empty document between two `---`
            yield from objects(item)


def _shape_problem(obj: Any) -> str:
    """The shared shape check's first complaint, as `FIELD: what is wrong` ("" when the shape is fine)."""
    return object_shape_error(obj, "object").removeprefix("object.")


def evaluate(doc: Document, view: ClusterView) -> AdmissionResult | Problem:
    """One object's answer, or the problem that stops it (naming the field)."""
    shape = _shape_problem(doc.obj)
    if shape:
        return doc.problem(shape)
    try:
        return dry_run(doc.obj, view)
    except DryRunError as exc:
        return doc.problem(str(exc).removeprefix("object."))
    except RecursionError:
        return doc.problem("nested too deeply to evaluate")
    except Exception as exc:  # the edge: never a traceback for input
        return doc.problem(f"cannot be evaluated ({type(exc).__name__}: {str(exc)[:200]})")


def read_all(sources: list[Source]) -> tuple[Context, list[Document], list[Problem]]:
    """Every document of a few small files at once (`kubeon-gpu layout`): context kinds read, the rest returned."""
    context, others, problems = Context(), [], []
    for source in sources:
        try:
            found = scan(source)
        except OSError as exc:
            problems.append(Problem(source.name, 0, exc.strerror or str(exc)))
            continue
        for item in _items(source, found):
            if isinstance(item, Problem):
                problems.append(item)
            elif item.obj["kind"] in CONTEXT_KINDS:
                problem = context.add(item, "-f")
                if problem:
                    problems.append(problem)
            else:
                others.append(item)
    return context, others, problems


def catalog_note(view: ClusterView) -> str:
    """What MIG profiles are chosen over without nodes: the sharing policies' gpuModels when every one lists
    some (admission's `landing_products`), else the whole catalog."""
    sharing = [p.spec.sharing for p in view.policies if p.spec.sharing is not None]
    if sharing and all(s.gpu_models for s in sharing):
        listed = ", ".join(sorted({m for s in sharing for m in s.gpu_models}))
        return f"none given (--nodes): MIG profiles are chosen over the sharing policies' gpuModels ({listed})"
    models = ", ".join(p.product for p in DEFAULT_CATALOG.products if p.mig_capable)
    return (f"none given (--nodes): MIG profiles are chosen over every MIG-capable model of the built-in "
            f"catalog ({models})")


def _sources(args: argparse.Namespace, report: Report) -> list[tuple[Source, Scan]]:
    sources = example_sources() if args.example else []
    for role, paths in (("--policies", args.policies), ("--nodes", args.nodes), ("-f", args.filename)):
        found, problems = expand(paths, role)
        sources += found
        for problem in problems:
            report.problem(problem)
    scanned = []
    for source in sources:
        try:
            scanned.append((source, scan(source)))
        except OSError as exc:
            report.problem(Problem(source.name, 0, exc.strerror or str(exc)))
    return scanned


def run(args: argparse.Namespace) -> int:
    report = Report(sys.stderr)
    if not args.example and not args.filename:
        report.problem(Problem("-f", 0, "give -f FILE (pods or workloads; '-' for standard input) or --example"))
        return 2
    sources = _sources(args, report)
    context = Context()
    for source, found in sources:
        if source.role == "-f" and not found.has_context:
            continue
        for item in _items(source, found):
            if isinstance(item, Document) and (source.role != "-f" or item.obj["kind"] in CONTEXT_KINDS):
                problem = context.add(item, source.role)
                if problem:
                    report.problem(problem)
            elif isinstance(item, Problem) and source.role != "-f":
                report.problem(item)
    view = context.view(Mode(args.default_mode), bool(args.metrics or args.example or args.prometheus_url),
                        args.route_cpu_pods_on_gpu_nodes == "true")
    output = args.output or ("text" if args.example else "yaml")
    note = "" if view.nodes else catalog_note(view)
    if note and output != "text":
        report.note(f"nodes: {note}")
    writer = Writer(sys.stdout, output)
    writer.header(view, note)
    evaluated = _evaluate_all(sources, view, writer, report, args.prometheus_url or UNSET_SERVER)
    writer.close()
    report.flush_skipped()
    if not evaluated and not report.errors:
        report.problem(Problem(", ".join(args.filename) or "example", 0, "no Pod or workload to evaluate"))
    return 2 if report.errors else 0


# How this command's flags lift a mode the install's settings lower, by the effective mode's reason code
# (gpupolicy/modes.py; a dry-run has no hub to be cut off from).
LIFTED_BY = {"PrometheusNotConfigured": "--metrics (or --prometheus-url URL) evaluates it as an install with "
                                        "prometheus.url set"}


def lowered_modes(view: ClusterView, result: AdmissionResult, offered: list[dict[str, str]]) -> list[dict[str, str]]:
    """The policies of one answer (its decisions, its ScaledObject offers) enforced below the mode they request:
    `policy`, `requested`, `enforced` and `reason` (why, and the flag that changes it)."""
    names = dict.fromkeys([d.policy for d in result.decisions] + [o["policy"] for o in offered])
    by_name = {p.name: p for p in view.policies}
    lowered = []
    for name in names:
        mode = view.mode_of(by_name[name])
        if mode.degraded:
            lift = LIFTED_BY.get(mode.reason_code)
            lowered.append({"policy": name, "requested": mode.requested.value, "enforced": mode.mode.value,
                            "reason": f"{mode.cause}; {lift}" if lift else str(mode.cause)})
    return lowered


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _write_templates(obj: Any, result: AdmissionResult, view: ClusterView, writer: Writer,
                     shown: set[tuple[str, str, str]]) -> None:
    """Each ResourceClaimTemplate or shared ResourceClaim a rewritten object names, once per kind, namespace and
    name, as its own entry."""
    for template in claim_templates(obj, result, view):
        key = (template["kind"], template["metadata"]["namespace"], template["metadata"]["name"])
        if key not in shown:
            shown.add(key)
            note = SHARED_CLAIM_NOTE if template["kind"] == "ResourceClaim" else CLAIM_TEMPLATE_NOTE
            writer.write(template, AdmissionResult(object=template, note=note))


def _evaluate_all(sources: list[tuple[Source, Scan]], view: ClusterView, writer: Writer, report: Report,
                  server_address: str = UNSET_SERVER) -> int:
    evaluated = 0
    shown: set[tuple[str, str, str]] = set()  # claim templates and shared claims written: each once
    err = report.err
    # A bar on a terminal's stderr while the answers go elsewhere (a file, a pipe); on a terminal the
    # answers themselves show progress, and a bar would be torn by them.
    show = _isatty(err) and not _isatty(writer.out)
    with tqdm(desc="dry-run", unit=" objects", file=err, disable=not show, leave=False) as progress:
        for source, found in sources:
            if source.role != "-f":
                continue
            for item in _items(source, found):
                if isinstance(item, Problem):
                    report.problem(item)
                    continue
                kind = item.obj["kind"]
                if kind in CONTEXT_KINDS:
                    if not found.has_context:  # the scan missed it (an unusual spelling of `kind:`)
                        report.problem(item.problem(f"kind: {kind} was not read before the pods; write it as "
                                                    f"`kind: {kind}` on one line, or give it with --policies/--nodes"))
                    continue
                if kind not in SUPPORTED_KINDS:
                    report.skip(item)
                    continue
                result = evaluate(item, view)
                if isinstance(result, AdmissionResult):
                    try:
                        offered = offers(item.obj, view.policies, server_address)
                        writer.write(item.obj, result, offered, lowered_modes(view, result, offered))
                        _write_templates(item.obj, result, view, writer, shown)
                    except RecursionError:
                        result = item.problem("nested too deeply to write the answer")
                    except (ValueError, TypeError) as exc:
                        result = item.problem(f"answer cannot be written ({type(exc).__name__}: {str(exc)[:200]})")
                if isinstance(result, Problem):
                    report.problem(result)
                else:
                    evaluated += 1
                progress.update()
    return evaluated
