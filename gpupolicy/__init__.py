"""The decision core of kubeon-gpu-optimizer.

Pure: no network, no Kubernetes client, no clock, no environment. Adapters
(webhook, extender, controller, simulator, CLI) parse their input into the
typed values defined here, call the core, and apply the effects it returns.
"""
