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
extender's reasons, with the count of nodes each one covers: the extender's
answer on its own, and the message the real kube-scheduler (the chart's
second scheduler calling the extender, tests/cluster) writes from it.
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
from tests.cluster.cluster import Cluster
from tests.cluster.objects import make_node, make_pod
from tests.extender.payloads import Harness, wire_pod
from tests.extender.test_answers import expected_filter

VENDOR = Path(__file__).resolve().parents[2] / "vendor" / "openb"
# the extender and the chart's second scheduler (the webhook is not needed: pods name that scheduler)
CLUSTER = {"kubeon": True, "kubeon_components": ("extender", "scheduler")}
A100 = "NVIDIA-A100-SXM4-80GB"


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


def with_weight(weight: int | None) -> dict[str, Any]:
    """The chart's rendered KubeSchedulerConfiguration, with the extender's weight set to `weight` if given."""
    config = copy.deepcopy(load_scheduler_config())
    for extender in config["extenders"]:
        extender["weight"] = weight or extender["weight"]
    return config


@pytest.mark.parametrize("weight", [None, 121], ids=["chart-weight", "weight-121-top-only"])
def test_smaller_answers_make_the_same_placements_on_an_openb_replay(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, weight: int | None) -> None:
    """At the chart's weight (as rendered: 131, only the top listed) and at 121 (only the top), the stand-in
    kube-scheduler places every pod as with every host listed and every rejection in full."""
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


def test_a_pod_that_fits_nowhere_is_answered_with_a_sample_of_nodes_per_reason() -> None:
    """The extender's filter answer alone: at most UNRESOLVABLE_PER_REASON nodes per reason, the reason
    naming how many nodes it covers (kube-scheduler counts only the nodes listed)."""
    names = [f"a100-{i:02d}" for i in range(40)] + [f"h100-{i}" for i in range(3)]
    cluster = [make_node(n, A100, 8) for n in names[:40]]
    cluster += [make_node(n, "NVIDIA-H100-80GB-HBM3", 8, unschedulable=True) for n in names[40:]]
    h = Harness(cluster)
    pod = wire_pod("h100-only", gpus=1, node_selector={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"})
    result = h.filter(pod, names)
    assert result["NodeNames"] == [] and result["Error"] == ""
    unresolvable = result["FailedAndUnresolvableNodes"]
    model = f"{REASONS[2]} (40 nodes)"
    assert list(unresolvable.values()).count(model) == UNRESOLVABLE_PER_REASON
    assert [unresolvable[n] for n in names[40:]] == [REASONS[1]] * 3
    assert np.all([n in names for n in unresolvable])


def test_a_pod_that_fits_nowhere_gets_a_message_naming_the_extenders_reasons(kube_cluster: Cluster,
                                                                             namespace: str) -> None:
    """What `kubectl describe pod` shows: kube-scheduler's own filters first (the cordoned nodes), then the
    extender's reasons for the nodes that passed them (draining, which only the optimizer reads), each
    counted over the nodes listed: a sample of 16 naming all 40. The pod's product selector would make
    kube-scheduler's node affinity reject other models before the extender is asked, so the extender's
    GPU-model reason never reaches a real message; draining does."""
    group = {"kubeon-test/group": namespace}
    draining = [f"{namespace}-d{i:02d}" for i in range(40)]
    cordoned = [f"{namespace}-c{i}" for i in range(3)]
    for name in draining:
        kube_cluster.create_node(make_node(name, A100, 8, labels={**group, "gpu.kubeon.io/draining": "true"}))
    for name in cordoned:
        kube_cluster.create_node(make_node(name, A100, 8, labels=group, unschedulable=True))
    try:
        def settled() -> bool:  # KWOK made them Ready: no not-ready taint left to refuse the pod first
            nodes = kube_cluster.core.list_node(label_selector=f"kubeon-test/group={namespace}").items
            return len(nodes) == 43 and all(t.key == "node.kubernetes.io/unschedulable"
                                            for n in nodes for t in n.spec.taints or [])

        kube_cluster.wait_for(settled, timeout=60, message="the nodes Ready")
        kube_cluster.create(make_pod("nowhere", namespace, gpus=1, node_selector=group))

        def failed() -> str:
            return next((e["message"] for e in kube_cluster.events(namespace, "FailedScheduling")
                         if e["involvedObject"]["name"] == "nowhere" and "kubeon-gpu" in e["message"]), "")

        message = kube_cluster.wait_for(failed, timeout=60, message="a FailedScheduling event naming the extender")
        assert message.startswith("0/43 nodes are available: "), message
        assert f"{UNRESOLVABLE_PER_REASON} {REASONS[1]} (40 nodes)" in message, message
        assert "3 node(s) were unschedulable" in message, message
    finally:
        for name in draining + cordoned:
            kube_cluster.core.delete_node(name)
