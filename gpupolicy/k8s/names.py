"""Kubernetes' name rules (apimachinery util/validation): what the API server refuses, refused first.

A GpuPolicy's `tolerations` and `schedulerName` go into every pod it matches; a value the API server's
pod validation refuses (pkg/apis/core/validation: ValidateTolerations, ValidatePodSpec's schedulerName)
made every such pod's CREATE fail after the webhook had answered. The same rules name a certificate's
DNS names (certs) and the ConfigMap `kubeon-gpu layout --configmap` plans for. Each function says why a
value breaks the rule, "" when it does not. Pure.
"""

from __future__ import annotations

import re

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_NAME_PART = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")  # IsQualifiedName's name, IsValidLabelValue


def dns_name_problem(name: str, *, wildcard: bool = True) -> str:
    """Why `name` is not a DNS subdomain (an object's name, a scheduler's, a certificate's DNS name): RFC 1123
    labels of at most 63 lowercase letters, digits and '-', at most 253 characters, and a leading `*.` where
    `wildcard`."""
    if len(name) > 253:
        return "longer than 253 characters"
    labels = name.split(".")
    if wildcard and labels[0] == "*" and len(labels) > 1:
        labels = labels[1:]
    bad = next((label for label in labels if not _DNS_LABEL.fullmatch(label)), None)
    if bad is not None:
        return (f"label {bad[:70]!r} is not a DNS label (1-63 lowercase letters, digits and '-', "
                "starting and ending with a letter or digit)")
    return ""


def dns_label_problem(name: str, what: str) -> str:
    """Why `name` is not one DNS label (a namespace's name, a Service's): a DNS subdomain without dots.
    `what` names it in the message ("a namespace")."""
    return dns_name_problem(name, wildcard=False) or (f"{what} has no dots" if "." in name else "")


def qualified_name_problem(name: str) -> str:
    """Why `name` is not a qualified name (a label key, a toleration's key): an optional DNS subdomain prefix
    and '/', then at most 63 letters, digits, '-', '_' and '.', starting and ending with a letter or digit."""
    prefix, slash, rest = name.rpartition("/")
    if slash and (not prefix or dns_name_problem(prefix, wildcard=False)):
        return f"prefix {prefix[:70]!r} is not a DNS subdomain"
    if len(rest) > 63 or not _NAME_PART.fullmatch(rest):
        return (f"name {rest[:70]!r} is not 1-63 letters, digits, '-', '_' or '.', starting and ending with "
                "a letter or digit")
    return ""


def label_value_problem(value: str) -> str:
    """Why `value` cannot be a label value (or a toleration's value): empty, or a name part of at most 63."""
    if value and (len(value) > 63 or not _NAME_PART.fullmatch(value)):
        return (f"{value[:70]!r} is not empty or 1-63 letters, digits, '-', '_' or '.', starting and ending "
                "with a letter or digit")
    return ""
