"""Serving, TLS and Kubernetes-watch tests."""
