"""Consolidation: which GPU nodes to give back, as ordered methods behind one protocol (Karpenter's shape).

`plan_disruptions(DisruptionInputs)` runs `METHODS` in order (planner.py
says why that order); each method is one module: emptiness, underused,
multinode, singlenode. Re-placement runs the packing engine as the
scheduler will (replay.py). A pod is never moved onto an empty node, a node
dearer per GPU than the dearest it leaves, or (with a minimum pod age)
beside young pods (planning.py `refused`).
"""

from gpupolicy.capacity.disruption.inputs import (
    EMPTY,
    MULTI_NODE,
    SINGLE_NODE,
    UNDERUSED,
    ConsolidationRules,
    Disruption,
    DisruptionInputs,
)
from gpupolicy.capacity.disruption.planner import METHODS, plan_around, plan_disruptions
from gpupolicy.capacity.disruption.replay import replace_pods

__all__ = ["EMPTY", "METHODS", "MULTI_NODE", "SINGLE_NODE", "UNDERUSED", "ConsolidationRules", "Disruption",
           "DisruptionInputs", "plan_around", "plan_disruptions", "replace_pods"]
