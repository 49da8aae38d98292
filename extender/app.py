"""The extender's Flask app: POST /filter, /prioritize, /bind, plus /healthz, /readyz, /metrics, /debug/mix.

Thin handlers (`ExtenderHandlers`, one method per route): parse
ExtenderArgs, call `ExtenderService`, serialise. Every route is a plain
function of the body bytes in front of Flask (serving.wsgi.HotRoutes, which
caps the body: at 15,000 nodes Flask's response handling of a 300-500 KiB
answer was 16% of a request); Flask keeps /metrics and the probes. Protocol errors (malformed JSON,
a body that is not an object) answer HTTP 400 with a JSON message. For /filter, unusable arguments
(missing Pod, NodeNames of the wrong type, a pod the model cannot read) and
internal failures answer 200 with `Error` set, which kube-scheduler reports
(and skips when the extender is `ignorable`); /prioritize has no error field,
so it answers 400 for bad arguments and, if the core fails, all-zero scores
(upstream ignores prioritize errors anyway). Either failure is counted in
`kubeon_extender_internal_errors_total` and logged once a minute per cause
(extender/failures.py): the controller turns them into `Ready=False,
ExtenderDegraded` on the policies the extender serves. /bind (ExtenderBindingArgs)
answers `{"Error": ""}` or the reason the binding failed. Never a 500 with
a traceback. GET /debug/mix shows the typical pod mix in force (also the
gauge `kubeon_extender_mix_weight`).

Each answer carries `X-Kubeon-Handler-Seconds`, the time spent inside the
handler (parse to serialise), and `X-Kubeon-Handler-Cpu-Seconds`, the CPU
time of the handling thread over the same span (what the request costs
without waiting for a contended CPU); bench/extender_load.py reads both.
/prioritize's decision is usually worked out right after /filter's answer
has been sent (`ExtenderService.ahead`, while kube-scheduler runs its own
scoring); /prioritize then carries that CPU time in
`X-Kubeon-Ahead-Cpu-Seconds` (0 when it decided itself), so a pod's cost is
the three headers together.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

from flask import Flask
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.registry import Collector

from extender.argsreader import ArgsReader
from extender.failures import InternalErrors
from extender.service import ExtenderService
from extender.wire import ArgsError, filter_error, filter_result, parse_args
from gpupolicy.packing.kubemodel import ObjectError
from serving.http import HttpError, encode_json, install_error_handlers
from serving.metrics import LATENCY_BUCKETS, instrument
from serving.tally import TALLY
from serving.wsgi import Answer, Headers, HotRoutes, Route, Then, error_answer

log = logging.getLogger(__name__)

# orjson (when installed) parses and writes the 5,000-name payloads ~5x faster than json.
_loads: Callable[[bytes], Any]
_dumps: Callable[[Any], bytes]
try:
    import orjson

    _loads, _dumps = orjson.loads, orjson.dumps
except ImportError:  # pragma: no cover - the stdlib is the fallback
    _loads = json.loads

    def _dumps(value: Any) -> bytes:
        return json.dumps(value, separators=(",", ":")).encode()

# ExtenderArgs with 5,000 node names is ~150 KiB; a NodeList of 5,000 nodes (not nodeCacheCapable) far more.
MAX_BODY_BYTES = 64 * 1024 * 1024
TIMING_HEADER = "X-Kubeon-Handler-Seconds"
CPU_TIMING_HEADER = "X-Kubeon-Handler-Cpu-Seconds"  # this thread's CPU time: contention-free cost
AHEAD_CPU_HEADER = "X-Kubeon-Ahead-Cpu-Seconds"  # /prioritize: CPU its decision took after /filter's answer


class ExtenderMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.decisions = Counter("kubeon_extender_decisions_total",
                                 "Filter/prioritize answers by verb, strategy and outcome.",
                                 ["verb", "strategy", "outcome"], registry=registry)
        self._children: dict[tuple[str, str, str], Any] = {}
        # of a slow answer, how much was waiting for the node model (held by a watch event, the settle thread or
        # /filter's work ahead for /prioritize): the rest of wall minus CPU is the interpreter and the machine
        self.lock_wait = Histogram("kubeon_extender_model_lock_wait_seconds",
                                   "Time a /filter or /prioritize waited for the node model's lock.", ["verb"],
                                   buckets=LATENCY_BUCKETS, registry=registry)
        self._waits = {verb: self.lock_wait.labels(verb) for verb in ("filter", "prioritize")}

    def decided(self, verb: str, strategy: str, outcome: str) -> None:
        """Count one answer; the labelled child looked up once per label set (`.labels()` costs more than
        the increment; the strategies and outcomes are closed sets)."""
        key = (verb, strategy, outcome)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self.decisions.labels(verb, strategy, outcome)
        TALLY.count((child,))

    def waited(self, verb: str, seconds: float) -> None:
        TALLY.observe(self._waits[verb], seconds)


class MixCollector(Collector):
    """The mix in force as `kubeon_extender_mix_weight{cpu_milli,gpu_milli,num_gpu,gpu_spec}`, and how many
    GPU pods it learned (`kubeon_extender_mix_gpu_pods`), read from the process at scrape."""

    def __init__(self, service: ExtenderService) -> None:
        self.service = service

    def collect(self) -> Any:
        from prometheus_client.core import GaugeMetricFamily

        family = GaugeMetricFamily("kubeon_extender_mix_weight",
                                   "Weight of each typical GPU pod type in the mix the extender packs against.",
                                   labels=["cpu_milli", "gpu_milli", "num_gpu", "gpu_spec"])
        for row in mix_rows(self.service):
            family.add_metric([str(row["cpu_milli"]), str(row["gpu_milli"]), str(row["num_gpu"]),
                               str(row["gpu_spec"])], float(row["weight"]))
        yield family
        yield GaugeMetricFamily("kubeon_extender_mix_gpu_pods", "GPU pods learned into the typical mix.",
                                value=float(self.service.cache.gpu_pods_learned))


class ModelCollector(Collector):
    """How the node model was kept, read from the process at scrape: `kubeon_extender_model_rebuilds_total`
    (new states: a node joined, left or changed capacity; each the slowest kind of request) and
    `kubeon_extender_model_rows_total{how}` (rows recomputed for their pods inside a request, or between
    requests by the settle thread, copied into a new state, or occupied again in one)."""

    def __init__(self, service: ExtenderService) -> None:
        self.service = service

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily

        cache = self.service.cache
        yield CounterMetricFamily("kubeon_extender_model_rebuilds", "Node states built anew.",
                                  value=float(cache.rebuilds))
        rows = CounterMetricFamily("kubeon_extender_model_rows", "Rows of the node model worked out, by how.",
                                   labels=["how"])
        for how, count in (("recomputed", cache.row_updates - cache.rows_settled), ("settled", cache.rows_settled),
                           ("copied", cache.rows_copied), ("occupied", cache.rows_occupied)):
            rows.add_metric([how], float(count))
        yield rows


def mix_rows(service: ExtenderService) -> list[dict[str, Any]]:
    mix = service.cache.mix_in_force()
    if mix is None:
        return []
    return [{"cpu_milli": int(mix.cpu_milli[i]), "gpu_milli": int(mix.gpu_milli[i]), "num_gpu": int(mix.num_gpu[i]),
             "gpu_spec": "|".join(sorted(mix.allowed[i] or ())),
             "weight": round(float(mix.weight[i]), 6)} for i in range(len(mix))]


def parse_body(reader: ArgsReader, data: bytes) -> Any:
    """Body bytes as JSON (the ArgsReader's NodeNames reuse): HttpError 400 when empty or malformed."""
    if not data.strip():
        raise HttpError(400, "empty request body: expected JSON")
    try:
        return reader.read(data)
    except ValueError as exc:  # json.JSONDecodeError and orjson.JSONDecodeError are ValueErrors
        raise HttpError(400, f"malformed JSON: {exc}") from None


Started = tuple[float, float]  # (perf_counter, thread_time) at the start of a handler


def _start() -> Started:
    return time.perf_counter(), time.thread_time()


def _timed(data: bytes, started: Started, status: int = 200) -> Answer:
    """A hot route's answer (serving.wsgi) with the two timing headers."""
    return status, data, [(TIMING_HEADER, f"{time.perf_counter() - started[0]:.6f}"),
                          (CPU_TIMING_HEADER, f"{time.thread_time() - started[1]:.6f}")]


def create_app(service: ExtenderService, registry: CollectorRegistry | None = None) -> Flask:
    """Build the app around a service; `registry` holds its metrics (a fresh one by default)."""
    app = Flask("kubeon-gpu-extender")
    registry = registry or CollectorRegistry()
    install_error_handlers(app)
    live = CollectorRegistry()  # read from this process at scrape, beside the workers' summed files
    live.register(MixCollector(service))
    live.register(ModelCollector(service))
    request_metrics = instrument(app, prefix="kubeon_extender", registry=registry, live=live, cpu=True)
    metrics, errors = ExtenderMetrics(registry), InternalErrors(registry)
    service.cache.ignored.export(registry)  # kubeon_gpu_objects_ignored_total{reason}
    reader = ArgsReader(loads=_loads)
    handlers = ExtenderHandlers(service, reader, metrics, errors)
    app.extensions["kubeon_extender"] = service
    app.extensions["kubeon_extender_args"] = reader
    app.wsgi_app = HotRoutes(app.wsgi_app, handlers.routes(), request_metrics,  # type: ignore[method-assign]
                             MAX_BODY_BYTES)
    return app


class ExtenderHandlers:
    """The routes of one app, one method each: the service they ask, the args reader, the counters."""

    def __init__(self, service: ExtenderService, reader: ArgsReader, metrics: ExtenderMetrics,
                 errors: InternalErrors) -> None:
        self.service = service
        self.reader = reader
        self.metrics = metrics
        self.errors = errors

    def routes(self) -> dict[str, Route]:
        return {"/filter": ("POST", self.filter), "/prioritize": ("POST", self.prioritize),
                "/bind": ("POST", self.bind), "/debug/mix": ("GET", self.debug_mix)}

    def filter(self, data: bytes) -> Answer | tuple[int, bytes, Headers, Then]:
        """ExtenderFilterResult: the nodes that fit; bad arguments and core bugs in `Error` (HTTP 200)."""
        started = _start()
        body = parse_body(self.reader, data)  # HttpError -> 400 JSON
        if not isinstance(body, dict):
            return error_answer(400, "body: expected an ExtenderArgs JSON object")
        service, metrics = self.service, self.metrics
        try:
            args = parse_args(body)
            outcome = service.filter(args.pod, args.names)
        except (ArgsError, ObjectError) as exc:
            metrics.decided("filter", "", "bad-args")
            return _timed(_dumps(filter_error(str(exc))), started)
        except Exception as exc:  # a core bug: say so in Error, the scheduler decides (ignorable)
            metrics.decided("filter", "", "error")
            cause = self.errors.failed("filter", exc)  # counted, logged once a minute (extender/failures.py)
            return _timed(_dumps(filter_error(f"kubeon-gpu extender internal error ({cause})")), started)
        if not outcome.any_passed and outcome.names and outcome.knows_none:
            # nothing to say about these nodes: an Error lets an ignorable extender step aside
            metrics.decided("filter", outcome.plan.strategy, "unknown-nodes")
            return _timed(_dumps(filter_error(
                f"kubeon-gpu: none of the {len(outcome.names)} nodes is in the node model")), started)
        metrics.decided("filter", outcome.plan.strategy, "fit" if outcome.any_passed else "none")
        metrics.waited("filter", outcome.lock_wait)
        if args.node_objects is not None:  # not nodeCacheCapable: the answer carries Node objects
            try:
                answer = encode_json(filter_result(args, outcome.passed, outcome.failed, outcome.unresolvable))
            except HttpError as exc:  # Node objects nested deeper than the writer goes
                return _timed(_dumps(filter_error(exc.message)), started)
            return _timed(answer, started)
        if outcome.passed:
            self.reader.expect(outcome.passed)  # the NodeNames /prioritize will get: no need to parse them again
        # /prioritize's decision, worked out once this answer is out (while kube-scheduler scores)
        return (*_timed(outcome.body(), started), lambda: service.ahead(outcome))

    def prioritize(self, data: bytes) -> Answer:
        """HostPriorityList; bad arguments 400 (no error field); a core bug answers all-zero scores."""
        started = _start()
        body = parse_body(self.reader, data)
        try:
            args = parse_args(body)
        except ArgsError as exc:
            return error_answer(400, str(exc))
        try:
            outcome = self.service.prioritize(args.pod, args.names)
        except ObjectError as exc:
            return error_answer(400, str(exc))
        except Exception as exc:  # a core bug: neutral scores keep scheduling going
            self.metrics.decided("prioritize", "", "error")
            self.errors.failed("prioritize", exc)
            return _timed(_dumps([{"Host": n, "Score": 0} for n in args.names]), started)
        self.metrics.decided("prioritize", outcome.plan.strategy, "placed" if outcome.chosen else "none")
        self.metrics.waited("prioritize", outcome.lock_wait)
        status, answer, headers = _timed(outcome.body(), started)
        return status, answer, [*headers, (AHEAD_CPU_HEADER, f"{outcome.ahead_cpu:.6f}")]

    def bind(self, data: bytes) -> Answer:
        """ExtenderBindingResult: `Error` empty once bound, else why not."""
        started = _start()
        body = parse_body(self.reader, data)
        if not isinstance(body, dict):
            return error_answer(400, "body: expected an ExtenderBindingArgs JSON object")
        fields = {key: body.get(key) for key in ("PodName", "PodNamespace", "PodUID", "Node")}
        missing = [k for k in ("PodName", "PodNamespace", "Node") if not isinstance(fields[k], str) or not fields[k]]
        if missing:
            return _timed(_dumps({"Error": f"ExtenderBindingArgs: missing {', '.join(missing)}"}), started)
        outcome = self.service.bind(str(fields["PodNamespace"]), str(fields["PodName"]),
                                    str(fields["PodUID"] or ""), str(fields["Node"]))
        self.metrics.decided("bind", "", "error" if outcome.error else "bound")
        return _timed(_dumps({"Error": outcome.error}), started)

    def debug_mix(self, _data: bytes) -> Answer:
        """The typical pod mix in force (also the gauge `kubeon_extender_mix_weight`)."""
        started = _start()
        cache = self.service.cache
        return _timed(_dumps({"gpu_pods_learned": cache.gpu_pods_learned, "types": mix_rows(self.service)}), started)
