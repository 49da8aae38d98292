"""The webhook's app: POST /mutate, /validate, /dry-run (`WebhookHandlers`, one method each), plus metrics.

Every route is a plain function of the body bytes in front of Flask
(serving.wsgi.HotRoutes: Flask's dispatch cost more than the decision),
which caps the body, answers HttpError with its status and anything
unexpected as a JSON 500; Flask keeps /metrics and the probes. Handlers are
thin: parse the AdmissionReview, call the core, serialise. Protocol errors
answer 400 with a JSON message; admission outcomes answer 200. If the core
itself raises (a bug), the request is allowed unchanged with a warning and
counted, never a 500: a broken optimizer must not block pod creation. A
pod's answer is decided once per view and distinct pod (webhook.memo: the
replicas of a workload arrive alike) and counted per request.

Workloads (Deployment, StatefulSet, Job, CronJob) reach /validate only: they
are answered with the warnings their pods would get (so `kubectl create -f
deployment.yaml` shows them), never patched or denied. A template that names
no GPU resource is answered before anything else is read.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, NamedTuple

from flask import Flask
from prometheus_client import CollectorRegistry

from gpupolicy.admission.dryrun import (
    DryRunError,
    dry_run,
    pod_template,
    template_asks_for_gpu,
    view_for_request,
    workload_warnings,
)
from gpupolicy.admission.mutate import AdmissionResult, mutate_pod, validate_pod
from gpupolicy.admission.replicas import decision_input
from gpupolicy.admission.shape import dry_run_body_error, pod_shape_error, template_shape_error
from gpupolicy.admission.validation import check_policy, hub_edit_warning, kind_label_patch
from gpupolicy.cluster import ClusterView
from gpupolicy.dra import SHARED_CLAIM_LABEL
from gpupolicy.model import GROUP, KIND
from kube.ignored import IgnoredObjects
from kube.views import ViewSource
from serving.http import HttpError, decode_json, install_error_handlers
from serving.metrics import instrument
from serving.wsgi import Answer, Handler, HotRoutes, Route, error_answer, json_answer
from webhook.memo import AdmissionMemo
from webhook.metrics import WebhookMetrics
from webhook.review import Review, ReviewError, encode_patch, parse_review, response

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 3 * 1024 * 1024  # kube-apiserver's own request limit is 3 MiB
INTERNAL_WARNING = "kubeon-gpu: internal error"  # how every internal-error warning starts (`internal_warning`)
TOO_DEEP = "the object is nested too deeply to evaluate"
# (API group, kind) of the workloads whose pod templates /validate evaluates.
WORKLOAD_KINDS = frozenset({("apps", "Deployment"), ("apps", "StatefulSet"), ("batch", "Job"),
                            ("batch", "CronJob")})

Decide = Callable[[Any, ClusterView, str], AdmissionResult]  # mutate_pod, validate_pod


def internal_warning(kind: str) -> str:
    """The warning of an answer the core could not decide: it names what was admitted (a Pod, a GpuPolicy)."""
    return f"{INTERNAL_WARNING}, {kind or 'object'} admitted unchanged"


class PodAnswer(NamedTuple):
    """A pod's answer as webhook.memo keeps it: encoded, without the pod, and a handful of objects for
    the garbage collector to walk (an AdmissionResult's patch is dozens of dicts; a worker keeps a
    thousand answers, and its young collections walk them)."""

    allowed: bool
    patch: str  # base64 JSON Patch (review.encode_patch), "" for none
    warnings: tuple[str, ...]
    message: str
    counts: tuple[Any, ...]  # the decision counters to increment per request (WebhookMetrics.children)
    share: str = ""  # the shared ResourceClaim the patch names (kube/shares.py counts it), or none


def create_app(source: ViewSource, registry: CollectorRegistry | None = None,
               ignored: IgnoredObjects | None = None) -> Flask:
    """Build the app around a view source; `registry` holds its metrics (a fresh one by default).

    serving.metrics counts and times requests and serves /metrics (summed over
    gunicorn workers); WebhookMetrics adds decisions by policy/mode/action;
    `ignored` (the watched view's) counts the objects left out of the view.
    """
    app = Flask("kubeon-gpu-webhook")
    registry = registry or CollectorRegistry()
    (ignored or IgnoredObjects()).export(registry)  # kubeon_gpu_objects_ignored_total{reason}
    install_error_handlers(app)
    request_metrics = instrument(app, prefix="kubeon_webhook", registry=registry)
    handlers = WebhookHandlers(source, WebhookMetrics(registry), AdmissionMemo())
    app.extensions["kubeon_metrics"] = handlers.metrics
    app.extensions["kubeon_memo"] = handlers.memo
    app.wsgi_app = HotRoutes(app.wsgi_app, handlers.routes(), request_metrics,  # type: ignore[method-assign]
                             MAX_BODY_BYTES)
    return app


class WebhookHandlers:
    """The routes of one app: the view source they decide against, the metrics they count, the memo."""

    def __init__(self, source: ViewSource, metrics: WebhookMetrics, memo: AdmissionMemo[PodAnswer]) -> None:
        self.source = source
        self.metrics = metrics
        self.memo = memo

    def routes(self) -> dict[str, Route]:
        return {"/mutate": ("POST", self.admission("/mutate", self.mutate)),
                "/validate": ("POST", self.admission("/validate", self.validate)),
                "/dry-run": ("POST", self.dry_run)}

    def admission(self, path: str, handle: Callable[[Review], dict[str, Any]]) -> Handler:
        """The body bytes -> the AdmissionReview answer of `handle`; protocol errors 400, core bugs allowed."""
        metrics = self.metrics

        def route(data: bytes) -> Answer:
            try:
                review = parse_review(decode_json(data))  # HttpError: 400 malformed JSON
            except ReviewError as exc:
                return error_answer(400, str(exc))
            try:
                return json_answer(200, handle(review))
            except ReviewError as exc:
                return error_answer(400, str(exc))
            except HttpError as exc:  # the answer cannot be written: the request nests too deeply
                return error_answer(exc.status, exc.message)
            except RecursionError:  # parsed (orjson reads 1,024 levels), but deeper than Python code walks
                return error_answer(400, TOO_DEEP)
            except Exception:  # a core bug must not become a 500 that blocks admission
                log.exception("%s failed for uid %s", path, review.uid)
                metrics.errors.labels(path).inc()
                return json_answer(200, response(review, warnings=[internal_warning(review.kind)]))

        return route

    def mutate(self, review: Review) -> dict[str, Any]:
        """A pod CREATE: the core's patch; a GpuPolicy: its kind label; anything else: allowed as is."""
        obj = review.object
        if _is_pod(review) and review.operation == "CREATE":
            answer = self._pod_result("/mutate", review, mutate_pod)
            if answer.share and not review.dry_run:  # counted from the next view on: a burst fills a claim
                self.source.note_share(review.namespace or "", answer.share)
            return self._answer(review, answer)
        if _is_policy(review) and review.operation in ("CREATE", "UPDATE") and isinstance(obj, dict):
            return response(review, patch=encode_patch(kind_label_patch(obj)))
        return response(review)

    def validate(self, review: Review) -> dict[str, Any]:
        """A workload: its pods' warnings; a pod CREATE: the core's answer; a GpuPolicy: 422 when invalid."""
        obj = review.object
        if _is_workload(review):
            return self._validate_workload(review)
        if _is_pod(review) and review.operation == "CREATE":
            return self._answer(review, self._pod_result("/validate", review, validate_pod))
        if _is_policy(review) and review.operation in ("CREATE", "UPDATE"):
            _, errors = check_policy(obj, self.source.current().catalog)
            if errors:
                return response(review, allowed=False, code=422,
                                message=f"GpuPolicy invalid: {'; '.join(errors)}")
            warnings = hub_edit_warning(obj, review.old_object) if review.operation == "UPDATE" else []
            return response(review, warnings=warnings or None)
        return response(review)

    def dry_run(self, data: bytes) -> Answer:
        """What admission would do to an object, with the reasons (400: a body or object it cannot read)."""
        body = decode_json(data, True)  # HttpError 400: empty or malformed (an integer beyond 64 bits too)
        shape = dry_run_body_error(body)
        if shape:
            return error_answer(400, shape)
        try:
            view = view_for_request(body, self.source.current())
            ns = body.get("namespace", {}).get("name") if isinstance(body.get("namespace"), dict) else None
            result = dry_run(body["object"], view, ns)
        except DryRunError as exc:
            return error_answer(400, str(exc))
        except RecursionError:
            return error_answer(400, TOO_DEEP)
        except Exception as exc:  # a core bug: say so, as JSON, without a traceback
            log.exception("/dry-run failed")
            self.metrics.errors.labels("/dry-run").inc()
            return error_answer(422, f"could not evaluate the object ({type(exc).__name__})")
        return json_answer(200, result.to_wire())

    def _validate_workload(self, review: Review) -> dict[str, Any]:
        obj = review.object
        template = pod_template(obj) if isinstance(obj, dict) else None
        if template is None or not template_asks_for_gpu(template):
            return response(review)
        shape = template_shape_error(obj, "request.object")
        if shape:
            raise ReviewError(shape)
        # No metrics: the pods' own reviews count the decisions, once per pod.
        result = workload_warnings(obj, self.source.current(), review.namespace)
        return response(review, warnings=result.warnings)

    def _answer(self, review: Review, result: PodAnswer, code: int = 403) -> dict[str, Any]:
        self.metrics.count(result.counts)
        return response(review, allowed=result.allowed, patch=result.patch, warnings=result.warnings,
                        message=result.message, code=code)

    def _pod_result(self, path: str, review: Review, decide: Decide) -> PodAnswer:
        """The core's answer for a Pod CREATE (ReviewError: 400 for a pod the core cannot read), once per
        view and distinct pod (webhook.memo: a workload's replicas arrive alike)."""
        view = self.source.current()
        metrics = self.metrics

        def build() -> PodAnswer:
            shape = pod_shape_error(review.object)
            if shape:
                raise ReviewError(shape)
            result = decide(review.object, view, review.namespace)
            return PodAnswer(result.allowed, encode_patch(result.patch), tuple(result.warnings), result.message,
                             metrics.children(result.decisions), added_share(review.object, result.object))

        return self.memo.result(view, (path, review.namespace),
                                decision_input(review.object, review.namespace, view), build)


def added_share(before: Any, after: Any) -> str:
    """The shared claim the core's patch gave the pod (its `gpu.kubeon.io/shared-claim` label), or ""."""
    def claim(pod: Any) -> str:
        labels = ((pod.get("metadata") or {}).get("labels") or {}) if isinstance(pod, dict) else {}
        return str(labels.get(SHARED_CLAIM_LABEL) or "") if isinstance(labels, dict) else ""
    return claim(after) if claim(after) != claim(before) else ""


def _is_pod(review: Review) -> bool:
    return review.group == "" and review.kind == "Pod"


def _is_policy(review: Review) -> bool:
    return review.group == GROUP and review.kind == KIND


def _is_workload(review: Review) -> bool:
    return (review.group, review.kind) in WORKLOAD_KINDS and review.operation in ("CREATE", "UPDATE")
