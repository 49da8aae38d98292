"""The default strategy's parts, removable one at a time: the ablations of docs/benchmarks.md.

An experiment, not a product setting (issue 45): a policy cannot name a
strategy without a part; bench/ablation.py and the tests that show what a
part does build one here.
"""

from __future__ import annotations

from dataclasses import replace

from gpupolicy.packing.strategies.kubeon import Kubeon, SliverWaste

PARTS = ("memory", "copies", "restricted-types", "share-stranding", "model-scarcity", "slivers", "scarcity")


def without(strategy: Kubeon, *parts: str) -> Kubeon:
    """`strategy` minus the named parts (`PARTS`)."""
    unknown = set(parts) - set(PARTS)
    if unknown:
        raise ValueError(f"unknown part(s) {sorted(unknown)}; choose from {', '.join(PARTS)}")
    frag, terms = strategy.fragment, strategy.terms
    if "copies" in parts:
        frag = replace(frag, copies=0.0)
    if "memory" in parts:
        frag = replace(frag, memory=False)
    if "restricted-types" in parts:
        frag = replace(frag, restricted_types=False)
    if "scarcity" in parts:
        terms = tuple(replace(t, scarcity=0.0) if isinstance(t, SliverWaste) else t for t in terms)
    terms = tuple(t for t in terms if t.name not in parts)
    label = "-".join(("kubeon", "without", *parts))
    return replace(strategy, name=label, description=f"kubeon without {', '.join(parts)} (ablation)",
                   fragment=frag, terms=terms)
