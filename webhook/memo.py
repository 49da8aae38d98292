"""Admission answers remembered per view: a workload's replicas are decided once, not once per pod.

kube-apiserver calls mutating webhooks before it fills in the name (from
generateName), uid and creationTimestamp (apiserver handlers/create.go:
mutating admission, then the store's BeforeCreate). So the replicas of one
ReplicaSet template reach /mutate and /validate as the same object, apart
from `metadata.managedFields`, whose `time` is the second the controller
created each pod; an Indexed Job's or a StatefulSet's also differ in their
index, hostname and name. The core (`pod_shape_error`, `mutate_pod`,
`validate_pod`) is a pure function of the object, the request's namespace
and the ClusterView, and reads none of these
(gpupolicy.admission.replicas.decision_input drops them); so an answer
keyed on (path, namespace, the pod's decision input) under one view is
exact.

Entries live with the view they were computed under: a new view (a policy,
namespace or node changed) starts an empty table, so no answer outlives
what it was decided from. The table holds at most `limit` entries and
`max_bytes` of keys (a pod can be megabytes of inline env); past either,
the oldest entries leave first, as each new one comes in, so a stream of
pods that differ in what the decision reads costs one eviction per review,
not a burst of a thousand deallocations inside one unlucky request. What is kept is the
caller's answer (webhook.app keeps it encoded, never the pod). Exceptions (a
bad shape, a core bug) are never remembered.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import orjson

from gpupolicy.cluster import ClusterView

T = TypeVar("T")
Key = tuple[tuple[str, str], bytes]

DEFAULT_LIMIT = 1024
DEFAULT_MAX_BYTES = 4 * 1024 * 1024  # per table and gunicorn worker


def memo_key(scope: tuple[str, str], obj: Any) -> Key | None:
    """(scope, the object's JSON); None when it cannot be written."""
    try:
        return scope, orjson.dumps(obj)
    except (orjson.JSONEncodeError, TypeError):  # nested too deeply to write: decided every time
        return None


class AdmissionMemo(Generic[T]):
    """`result(view, scope, obj, build)`: build()'s answer, once per view and distinct `obj` (a pod's
    decision input)."""

    def __init__(self, limit: int = DEFAULT_LIMIT, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.limit = limit
        self.max_bytes = max_bytes
        # (view, its table, its keys' bytes) swapped as one value, so a thread still deciding under an
        # older view writes into that view's table, never into the current one.
        self._state: tuple[ClusterView | None, OrderedDict[Key, T], list[int]] = (None, OrderedDict(), [0])

    def result(self, view: ClusterView, scope: tuple[str, str], obj: Any, build: Callable[[], T]) -> T:
        state = self._state
        if state[0] is not view:
            state = self._state = (view, OrderedDict(), [0])
        key = memo_key(scope, obj)
        if key is None:
            return build()
        table, held = state[1], state[2]
        found = table.get(key)
        if found is not None:
            return found
        found = build()
        size = len(key[1])
        if size > self.max_bytes or key in table:  # larger than a whole table; or another thread kept it
            return found
        try:
            while table and (len(table) >= self.limit or held[0] + size > self.max_bytes):
                held[0] -= len(table.popitem(last=False)[0][1])
        except KeyError:  # another thread emptied it first
            pass
        if not table:  # threads may race on the count: it is exact again whenever the table empties
            held[0] = 0
        table[key] = found
        held[0] += size
        return found
