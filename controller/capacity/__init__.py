"""GPU capacity through Karpenter: one reconciler (reconciler.py) and the steps of its pass, one module each."""

from controller.capacity.reconciler import CHECKPOINTS, CRASH_ENV, SOURCE, CapacityReconciler, crash_checkpoint_from_env

__all__ = ["CHECKPOINTS", "CRASH_ENV", "SOURCE", "CapacityReconciler", "crash_checkpoint_from_env"]
