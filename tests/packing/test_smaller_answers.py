"""The extender's smaller answers change no placement: an openb replay through kube-scheduler, both ways.

Real: the openb trace (vendor/openb: the first 100 nodes, 300 pods), the
extender's app, service and node model, its /filter, /prioritize and /bind,
and the stand-in kube-scheduler with the chart's rendered profile
(simulator/kubescheduler.py, through cli.livereplay). The reference is the
answer encoding before issue 16, kept here: every rejected node in
FailedAndUnresolvableNodes and every input host in the prioritize list,
serialised from plain dicts. Same seed, same arrivals, same profile (the
chart's, and the same with the extender's weight at 121, where only the top
scorers are listed): the placements (node and GPU indices per pod) must be
identical.

A pod that fits nowhere still gets a FailedScheduling message naming the
extender's reasons, with the count of nodes each one covers.
"""

from __future__ import annotations

import copy
import csv
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from cli.livereplay import load_scheduler_config, replay_through_extender
from extender.answers import REASONS, UNRESOLVABLE_PER_REASON, AnswerWriter
from simulator.trace import load_nodes, load_pods
from tests.extender.payloads import Harness, wire_pod
from tests.extender.test_answers import expected_filter
from tests.cluster.objects import make_node
from tests.kubeapi.scheduler import summarise_failures

VENDOR = Path(__file__).resolve().parents[2] / "vendor" / "openb"


def subset(src: Path, dst: Path, rows: int, spec_every: int = 0) -> Path:
    """The first `rows` rows; with `spec_every`, every n-th row asks for V100s only (gpu_spec, as
    openb's gpuspec traces write it), so the extender has unresolvable nodes (the wrong model)."""
    with src.open(newline="") as fh:
        reader = csv.DictReader(fh)
        kept = [row for _, row in zip(range(rows), reader, strict=False)]
        fields = list(reader.fieldnames or ())
    for i, row in enumerate(kept):
        if spec_every and i % spec_every == 0:
            row["gpu_spec"] = "V100M16|V100M32"
    with dst.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fields)
        writer.writeheader()
        writer.writerows(kept)
    return dst


def full_filter_answer(self: AnswerWriter, names: list[str], rows: Any, codes: Any, hopeless: Any) -> bytes:
    """The answer before issue 16: every rejected node with its reason, in both maps."""
    return expected_filter(names, codes.tolist(), hopeless.tolist())


def full_prioritize_answer(self: AnswerWriter, names: list[str], rows: Any, scores: Any, *reach: Any) -> bytes:
    """The answer before issue 16: every input host, zeros included."""
    return orjson.dumps([{"Host": n, "Score": int(s)} for n, s in zip(names, scores.tolist(), strict=True)])


class Sizes:
    """Bytes of every answer the replay gets (wrapping whichever encoder is in force)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.filter = self.prioritize = 0
        self.unresolvable_sampled = 0
        filter_answer, prioritize_answer = AnswerWriter.filter_answer, AnswerWriter.prioritize_answer

        def counted_filter(writer: AnswerWriter, *args: Any) -> bytes:
            out: bytes = filter_answer(writer, *args)
            self.filter += len(out)
            self.unresolvable_sampled += b" nodes)" in out
            return out

        def counted_prioritize(writer: AnswerWriter, *args: Any) -> bytes:
            out: bytes = prioritize_answer(writer, *args)
            self.prioritize += len(out)
            return out

        monkeypatch.setattr(AnswerWriter, "filter_answer", counted_filter)
        monkeypatch.setattr(AnswerWriter, "prioritize_answer", counted_prioritize)


def with_weight(weight: int) -> dict[str, Any]:
    """The chart's rendered KubeSchedulerConfiguration with the extender's weight set to `weight`."""
    config = copy.deepcopy(load_scheduler_config())
    for extender in config["extenders"]:
        extender["weight"] = weight
    return config


@pytest.mark.parametrize("weight", [71, 121], ids=["chart-weight-71", "weight-121-top-only"])
def test_smaller_answers_make_the_same_placements_on_an_openb_replay(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, weight: int) -> None:
    """At the chart's weight (71: hosts 1 point below the top stay listed) and at 121 (only the top), the
    stand-in kube-scheduler places every pod as with every host listed and every rejection in full."""
    nodes = load_nodes(subset(VENDOR / "openb_node_list_gpu_node.csv", tmp_path / "nodes.csv", 100))
    pods = load_pods(subset(VENDOR / "openb_pod_list_default.csv", tmp_path / "pods.csv", 300, spec_every=5))
    config = with_weight(weight)
    with monkeypatch.context() as patch:
        new = Sizes(patch)
        smaller = replay_through_extender(nodes, pods, seed=42, keep_placements=True, config=config)
    with monkeypatch.context() as patch:
        patch.setattr(AnswerWriter, "filter_answer", full_filter_answer)
        patch.setattr(AnswerWriter, "prioritize_answer", full_prioritize_answer)
        old = Sizes(patch)
        reference = replay_through_extender(nodes, pods, seed=42, keep_placements=True, config=config)
    assert len(smaller.placements) == len(reference.placements) == smaller.pods > 250
    assert sum(p.node is not None for p in smaller.placements) > 100
    assert smaller.placements == reference.placements
    assert smaller.alloc_pct_at_end == reference.alloc_pct_at_end
    # the smaller answers were in force: prioritize lists fewer hosts. kube-scheduler's own filters
    # (node affinity, unschedulable, resources) run first, so here the extender rejects only for
    # reasons preemption may resolve: FailedNodes, kept whole, and filter answers of the same size.
    assert new.prioritize < old.prioritize / 2
    assert new.filter == old.filter and new.unresolvable_sampled == 0


def test_a_pod_that_fits_nowhere_gets_a_message_naming_the_reasons() -> None:
    names = [f"a100-{i:02d}" for i in range(40)] + [f"h100-{i}" for i in range(3)]
    cluster = [make_node(n, "NVIDIA-A100-SXM4-80GB", 8) for n in names[:40]]
    cluster += [make_node(n, "NVIDIA-H100-80GB-HBM3", 8, unschedulable=True) for n in names[40:]]
    h = Harness(cluster)
    pod = wire_pod("h100-only", gpus=1, node_selector={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"})
    result = h.filter(pod, names)
    assert result["NodeNames"] == [] and result["Error"] == ""
    unresolvable = result["FailedAndUnresolvableNodes"]
    model = f"{REASONS[2]} (40 nodes)"
    assert list(unresolvable.values()).count(model) == UNRESOLVABLE_PER_REASON
    assert [unresolvable[n] for n in names[40:]] == [REASONS[1]] * 3
    message = summarise_failures(len(names), {**result["FailedNodes"], **unresolvable})
    assert "GPU model not allowed by the pod (40 nodes)" in message
    assert "node cordoned or draining" in message
    assert np.all([n in names for n in unresolvable])
