"""Kubernetes' own rules, reimplemented pure for the core: quantities and durations (quantity.py), object
names (names.py), taints and tolerations (taints.py), who owns a pod (owners.py).

Each follows upstream's grammar and bounds (apimachinery, core/v1), so the core refuses what the API
server refuses and reads what it accepts; none does I/O.
"""
