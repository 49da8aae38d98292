"""The device plugin's time-slicing config: one ConfigMap key per sharing config, named by its content. Pure.

The GPU Operator points the device plugin at one ConfigMap (install values
`gpuOperator.namespace` / `gpuOperator.timeSlicingConfigMap`); a node's label
`nvidia.com/device-plugin.config=<key>` picks the key it runs with. The
operator does not reload a key whose text changed, so a key is never edited:
its name carries a digest of its text (`kubeon-ts-r4-1a2b3c4d`), a changed
config is a new key, nodes move to it by label, and keys of ours that no node
uses any more are removed. Keys someone else wrote are never touched.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from gpupolicy.catalog import GPU_RESOURCE
from gpupolicy.cluster import OWN_PLUGIN_CONFIG_PREFIX as KEY_PREFIX
from gpupolicy.yamlload import safe_load


def sharing_config(replicas: int) -> dict[str, Any]:
    """The device plugin config (version v1) that time-slices every GPU into `replicas` shares."""
    return {
        "version": "v1",
        "sharing": {"timeSlicing": {
            "renameByDefault": True,
            "failRequestsGreaterThanOne": True,
            "resources": [{"name": GPU_RESOURCE, "replicas": replicas}],
        }},
    }


def config_text(replicas: int) -> str:
    return yaml.safe_dump(sharing_config(replicas), sort_keys=False)


@functools.lru_cache(maxsize=64)
def config_key(replicas: int) -> str:
    """The key holding `config_text(replicas)`: a new text gives a new key. Memoised: every pass reads the key
    of every time-sliced node (`own_key_replicas`), and a YAML dump and hash is about 50 us."""
    digest = hashlib.sha256(config_text(replicas).encode()).hexdigest()[:8]
    return f"{KEY_PREFIX}r{replicas}-{digest}"


def own_key_replicas(key: str) -> int | None:
    """The replicas of one of our keys, read from the key itself (None for any other key).

    `config_key` names each text it writes, so `kubeon-ts-r4-<digest>` holds the 4-share config whatever a
    ConfigMap read or GPU Feature Discovery's `nvidia.com/gpu.replicas` (relabelled some time after the
    device plugin advertises the shares) says at the moment."""
    head = key.removeprefix(KEY_PREFIX).partition("-")[0]
    if key.startswith(KEY_PREFIX) and head[:1] == "r" and head[1:].isdigit() and config_key(int(head[1:])) == key:
        return int(head[1:])
    return None


def is_our_key(key: str) -> bool:
    return key.startswith(KEY_PREFIX)


class ConfigError(ValueError):
    """A key's text is not a time-slicing config the device plugin would run."""


def replicas_of(text: str) -> int:
    """The replicas of `nvidia.com/gpu` in a key's text (raises ConfigError when not time-slicing)."""
    try:
        doc = safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"not YAML: {exc}") from exc
    if not isinstance(doc, dict):
        raise ConfigError("not a mapping")
    # any level of another shape (an operator's key, a typo) is not a config the device plugin runs
    sharing = doc.get("sharing")
    slicing = sharing.get("timeSlicing") if isinstance(sharing, dict) else None
    resources = slicing.get("resources") if isinstance(slicing, dict) else None
    for resource in resources if isinstance(resources, list) else ():
        if isinstance(resource, dict) and resource.get("name") == GPU_RESOURCE:
            replicas = resource.get("replicas")
            if isinstance(replicas, int) and replicas >= 1:
                return replicas
    raise ConfigError(f"no sharing.timeSlicing.resources entry for {GPU_RESOURCE} with replicas")


def key_replicas(data: Mapping[str, str]) -> dict[str, int]:
    """Replicas per key of the ConfigMap's data (keys that are not time-slicing configs left out)."""
    found: dict[str, int] = {}
    for key, text in data.items():
        try:
            found[key] = replicas_of(text)
        except ConfigError:
            continue
    return found


@dataclass(frozen=True)
class ConfigMapChange:
    """What to write to the time-slicing ConfigMap: keys to add (key -> text) and ours to remove."""

    add: Mapping[str, str]
    remove: tuple[str, ...]

    @property
    def empty(self) -> bool:
        return not self.add and not self.remove

    def merge_patch(self) -> dict[str, Any]:
        """A JSON merge patch on the ConfigMap (null deletes a key)."""
        data: dict[str, str | None] = {key: text for key, text in self.add.items()}
        data.update({key: None for key in self.remove})
        return {"data": data}

    def describe(self) -> str:
        parts = [f"+{key} (replicas {replicas_of(text)})" for key, text in sorted(self.add.items())]
        parts += [f"-{key}" for key in self.remove]
        return ", ".join(parts) or "no change"


def plan_configmap(data: Mapping[str, str], needed: Mapping[str, int], used: set[str]) -> ConfigMapChange:
    """Keys to add for `needed` (key -> replicas) and our keys neither needed nor used by a node label."""
    add = {key: config_text(replicas) for key, replicas in sorted(needed.items()) if data.get(key) is None}
    keep = set(needed) | used
    remove = tuple(sorted(key for key in data if is_our_key(key) and key not in keep))
    return ConfigMapChange(add, remove)
