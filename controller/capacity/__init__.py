"""GPU capacity through Karpenter: one reconciler (reconciler.py) and the steps of its pass, one module each."""

from controller.capacity.reconciler import CHECKPOINTS, SOURCE, CapacityReconciler

__all__ = ["CHECKPOINTS", "SOURCE", "CapacityReconciler"]
