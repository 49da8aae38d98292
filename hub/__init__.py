"""The self-hostable hub: clusters, their tokens, policies, approvals, the action log and the audit log.

Optimizers pull from it (docs/hub-api.md); it never connects to a cluster.
"""
