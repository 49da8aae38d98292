"""Pod logs (`GET .../pods/NAME/log`): what the test wrote for a pod, served as a kubelet would.

There are no containers, so a pod's log is whatever the test gives it: a text, or a file read
at each request (the output of a process the test runs in the pod's place). Upstream's answers
are kept: 400 naming the containers when a multi-container pod is asked without `container`,
400 for an unknown container or a pod not yet running, `tailLines` and `limitBytes` honoured;
`follow` returns what there is and ends (no streaming), `timestamps`/`sinceSeconds` ignored.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from tests.kubeapi import status


class PodLogs:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sources: dict[tuple[str, str, str], str | Path] = {}

    def write(self, namespace: str, pod: str, text: str | Path, container: str = "") -> None:
        """Set a pod's log (container "" = every container of the pod); a Path is read per request."""
        with self._lock:
            self._sources[(namespace, pod, container)] = text

    def read(self, pod: dict[str, Any], query: dict[str, str]) -> str:
        meta, spec = pod["metadata"], pod.get("spec") or {}
        name = meta["name"]
        names = [c.get("name", "") for c in spec.get("containers") or []]
        container = query.get("container") or ""
        if not container:
            default = (meta.get("annotations") or {}).get("kubectl.kubernetes.io/default-container")
            if len(names) > 1 and not default:
                raise status.bad_request(f"a container name must be specified for pod {name}, choose one of: "
                                         f"[{' '.join(names)}]")
            container = default or (names[0] if names else "")
        if container not in names:
            raise status.bad_request(f"container {container} is not valid for pod {name}")
        if (pod.get("status") or {}).get("phase", "Pending") == "Pending":
            raise status.bad_request(f'container "{container}" in pod "{name}" is waiting to start: '
                                     f"ContainerCreating")
        with self._lock:
            source = self._sources.get((meta.get("namespace", ""), name, container),
                                       self._sources.get((meta.get("namespace", ""), name, ""), ""))
        text = source.read_text(errors="replace") if isinstance(source, Path) and source.exists() else \
            (source if isinstance(source, str) else "")
        if query.get("tailLines", "").isdigit():
            lines = text.splitlines(keepends=True)
            text = "".join(lines[len(lines) - int(query["tailLines"]):]) if int(query["tailLines"]) else ""
        if query.get("limitBytes", "").isdigit():
            text = text.encode()[:int(query["limitBytes"])].decode(errors="ignore")
        return text
