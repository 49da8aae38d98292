"""The GPU catalog: products as GPU Feature Discovery names them, and their MIG profiles.

Sizing must use the memory a MIG instance really holds, not the number in its
name (a real H200's 1g.18gb holds 16.00 GiB). The figures below come from
`nvidia-smi mig -lgip` (H200: vendor/gpu/h200-mig-lgip.txt), from
NVIDIA's MIG user guide (A100, H100), or are estimated from the H200's
measured ratios where no listing was at hand (`memory_source="estimated"`).
On a live cluster the GFD label `nvidia.com/mig-<profile>.memory` wins over
all of them: see `profile_memory_mib`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property

MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
GPU_RESOURCE = "nvidia.com/gpu"
SHARED_GPU_RESOURCE = "nvidia.com/gpu.shared"
PRODUCT_LABEL = "nvidia.com/gpu.product"
# What the GPU Operator is told per node, and what GFD reports back.
MIG_CONFIG_LABEL = "nvidia.com/mig.config"
MIG_STATE_LABEL = "nvidia.com/mig.config.state"
PLUGIN_CONFIG_LABEL = "nvidia.com/device-plugin.config"
GPU_REPLICAS_LABEL = "nvidia.com/gpu.replicas"
# On a pod the webhook left on whole GPUs because no node offers its slice yet: the slice it
# wanted. The layout planner counts it as demand, so a node comes to offer it.
WANTED_RESOURCE_ANNOTATION = "gpu.kubeon.io/wanted-resource"

GIB = 1024  # MiB


@dataclass(frozen=True)
class MigProfile:
    """One MIG GPU-instance profile of one GPU product."""

    name: str  # "1g.10gb", "1g.10gb+me"
    compute_slices: int
    memory_slices: int
    max_instances: int
    placements: tuple[int, ...]  # start slots on the memory slices
    memory_mib: int  # what an instance really holds
    memory_source: str  # "lgip" | "user-guide" | "estimated"

    @property
    def resource_name(self) -> str:
        """The device plugin's resource under the mixed strategy (`+me` becomes `.me`)."""
        return MIG_RESOURCE_PREFIX + self.name.replace("+", ".")

    @property
    def media_extensions(self) -> bool:
        return self.name.endswith("+me")


DISABLED_LAYOUT = "all-disabled"
BALANCED_LAYOUT = "all-balanced"


@dataclass(frozen=True)
class MigLayout:
    """One named MIG layout: every GPU of the node partitioned alike (MIG strategy `mixed`)."""

    name: str
    devices: tuple[tuple[str, int], ...]  # (profile, instances per GPU); empty = MIG disabled

    @property
    def mig_enabled(self) -> bool:
        return bool(self.devices)

    def resources(self, gpus: int) -> dict[str, int]:
        """What a node with `gpus` GPUs advertises under this layout (device plugin, mixed strategy)."""
        if not self.devices:
            return {GPU_RESOURCE: gpus}
        return {MIG_RESOURCE_PREFIX + name.replace("+", "."): count * gpus for name, count in self.devices}


@dataclass(frozen=True)
class GpuProduct:
    """A GPU model as GFD labels it (`nvidia.com/gpu.product`)."""

    product: str
    memory_mib: int
    compute_slices: int = 7
    memory_slices: int = 8
    profiles: tuple[MigProfile, ...] = ()
    aliases: tuple[str, ...] = ()
    pci_device_ids: tuple[str, ...] = ()  # as mig-parted's device-filter writes them: "0x20B210DE"

    @property
    def mig_capable(self) -> bool:
        return bool(self.profiles)

    @property
    def mig_layouts(self) -> tuple[MigLayout, ...]:
        """The GPU Operator's default MIG layouts for this product (`nvidia.com/mig.config` values).

        Its default mig-parted config (vendor/crds/gpu-operator_default-mig-parted-config.yaml,
        checked against this rule by tests/core/test_layout.py) offers, per product:
        `all-disabled`; `all-<profile>` with the most instances of one profile
        (`+me` written `.me`); and `all-balanced`: two of the smallest 1g, one 2g
        and (on 7-slice GPUs) one 3g.
        """
        if not self.profiles:
            return ()
        layouts = [MigLayout(DISABLED_LAYOUT, ())]
        layouts += [MigLayout("all-" + p.name.replace("+", "."), ((p.name, p.max_instances),))
                    for p in self.profiles]
        plain = [p for p in self.profiles if not p.media_extensions]
        balanced: list[tuple[str, int]] = []
        for compute, count in ((1, 2), (2, 1), (3, 1)):
            fits = [p for p in plain if p.compute_slices == compute]
            if fits:
                balanced.append((min(fits, key=lambda p: p.memory_slices).name, count))
        layouts.append(MigLayout(BALANCED_LAYOUT, tuple(balanced)))
        return tuple(layouts)

    def mig_layout(self, name: str) -> MigLayout | None:
        return next((layout for layout in self.mig_layouts if layout.name == name), None)

    def profile(self, name: str) -> MigProfile | None:
        found = self._profiles_by_name.get(name)
        return found if found is not None else self._profiles_by_name.get(normalise_profile_name(name))

    @cached_property
    def _profiles_by_name(self) -> dict[str, MigProfile]:
        """Looked up many times per admission (every profile of every candidate product): a dict, once."""
        return {p.name: p for p in self.profiles}


def normalise_profile_name(name: str) -> str:
    """Accept `1g.10gb`, `mig-1g.10gb`, `nvidia.com/mig-1g.10gb` and `1g.10gb.me` alike."""
    text = name.strip()
    if text.startswith(MIG_RESOURCE_PREFIX):
        text = text[len(MIG_RESOURCE_PREFIX):]
    elif text.startswith("mig-"):
        text = text[4:]
    if text.endswith(".me"):
        text = text[:-3] + "+me"
    return text


def profile_compute_slices(name: str) -> int:
    """Compute slices of a MIG profile or resource, from its name (`3g.40gb`, `nvidia.com/mig-3g.40gb`: 3).

    Every profile name starts with its compute slices (`<N>g.`), on every product, so the
    name alone says it (GFD's `<resource>.slices.ci` label says the same). 0: not a MIG name.
    """
    head, sep, _ = normalise_profile_name(name).partition("g.")
    return int(head) if sep and head.isdigit() else 0


def mig_layout_per_gpu(product: GpuProduct | None, layout_name: str) -> dict[str, int] | None:
    """Devices per GPU (device plugin resource -> count) of the GPU Operator's default layout `layout_name`
    (`nvidia.com/mig.config`) on `product`; None when the product or the layout is not in the catalog
    (a custom mig-parted config) or the layout disables MIG."""
    layout = product.mig_layout(layout_name) if product is not None and layout_name else None
    if layout is None or not layout.mig_enabled:
        return None
    return layout.resources(1)


# Start slots on the 8 memory slices (REFERENCE.md, MIG profiles).
_PLACEMENTS_8 = {
    ("1g", 1): (0, 1, 2, 3, 4, 5, 6),
    ("1g", 2): (0, 2, 4, 6),
    ("2g", 2): (0, 2, 4),
    ("3g", 4): (0, 4),
    ("4g", 4): (0,),
    ("7g", 8): (0,),
}
_PLACEMENTS_4 = {("1g", 1): (0, 1, 2, 3), ("2g", 2): (0, 2), ("4g", 4): (0,)}

# H200's measured share of total memory by memory slices (lgip / nvidia-smi total),
# used only to estimate products without a listing at hand.
_H200_SHARE = {1: 16.00 / 140.40, 2: 32.50 / 140.40, 4: 69.75 / 140.40, 8: 140.00 / 140.40}


def _profiles(
    total_mib: int,
    rows: Iterable[tuple[str, int, float | None]],
    source: str,
    memory_slices_total: int = 8,
) -> tuple[MigProfile, ...]:
    """Build profiles from (name, max instances, GiB or None to estimate) rows."""
    placements_table = _PLACEMENTS_8 if memory_slices_total == 8 else _PLACEMENTS_4
    built = []
    for name, max_instances, gib in rows:
        base = name.removesuffix("+me")
        compute = int(base.split("g.")[0])
        size_gb = int(base.split(".")[1].removesuffix("gb"))
        memory_slices = _memory_slices(compute, size_gb, total_mib, memory_slices_total)
        placements = placements_table[(f"{compute}g", memory_slices)]
        if name.endswith("+me"):
            max_instances = 1
        if gib is None:
            share = _H200_SHARE.get(memory_slices * 8 // memory_slices_total, memory_slices / memory_slices_total)
            memory_mib = int(total_mib * share / 256) * 256
            row_source = "estimated"
        else:
            memory_mib = round(gib * GIB)
            row_source = source
        built.append(
            MigProfile(name, compute, memory_slices, max_instances, placements, memory_mib, row_source)
        )
    return tuple(built)


def _memory_slices(compute: int, size_gb: int, total_mib: int, slices_total: int) -> int:
    """Memory slices a profile spans, from its name's size relative to the whole GPU."""
    if compute >= 7 or (slices_total == 4 and compute == 4):
        return slices_total
    fraction = size_gb * 1000 / (total_mib * 1.048576)  # name sizes are decimal GB
    for slices in (1, 2, 4):
        if fraction <= slices / slices_total * 1.25:
            return slices
    return slices_total


def _seven_slice(n1: str, n1d: str, n2: str, n3: str, n7: str, gib: tuple[float | None, ...] | None,
                 me: bool = True) -> list[tuple[str, int, float | None]]:
    g = gib or (None,) * 6
    rows: list[tuple[str, int, float | None]] = [(n1, 7, g[0])]
    if me:
        rows.append((n1 + "+me", 1, g[0]))
    rows += [(n1d, 4, g[1]), (n2, 3, g[2]), (n3, 2, g[3]), (n3.replace("3g", "4g"), 1, g[4]), (n7, 1, g[5])]
    return rows


def _build_products() -> tuple[GpuProduct, ...]:
    a100_40 = 40960
    a100_80 = 81920
    h100 = 81559
    h100_nvl = 95830
    h200 = 143771
    gh200 = 146944
    b200 = 183359
    a30 = 24576
    return (
        GpuProduct("NVIDIA-A100-SXM4-40GB", a100_40, profiles=_profiles(
            a100_40, _seven_slice("1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "7g.40gb",
                                  (4.75, 9.62, 9.62, 19.50, 19.50, 39.25)), "user-guide"),
            aliases=("NVIDIA-A100-PCIE-40GB",),
            pci_device_ids=("0x20B010DE", "0x20B110DE", "0x20F110DE", "0x20F610DE")),
        GpuProduct("NVIDIA-A100-SXM4-80GB", a100_80, profiles=_profiles(
            a100_80, _seven_slice("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "7g.80gb",
                                  (9.50, 19.50, 19.50, 39.25, 39.25, 78.75)), "user-guide"),
            aliases=("NVIDIA-A100-80GB-PCIe", "NVIDIA-A800-SXM4-80GB"),
            pci_device_ids=("0x20B210DE", "0x20B510DE", "0x20F310DE", "0x20F510DE")),
        GpuProduct("NVIDIA-H100-80GB-HBM3", h100, profiles=_profiles(
            h100, _seven_slice("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "7g.80gb",
                               (9.75, 19.62, 19.62, 39.50, 39.50, 79.25)), "user-guide"),
            aliases=("NVIDIA-H100-PCIe", "NVIDIA-H800", "NVIDIA-H800-80GB-HBM3"),
            pci_device_ids=("0x233010DE", "0x233110DE", "0x232210DE", "0x232410DE")),
        GpuProduct("NVIDIA-H100-NVL", h100_nvl, profiles=_profiles(
            h100_nvl, _seven_slice("1g.12gb", "1g.24gb", "2g.24gb", "3g.47gb", "7g.94gb", None), "estimated"),
            pci_device_ids=("0x232110DE", "0x233A10DE")),
        GpuProduct("NVIDIA-H200", h200, profiles=_profiles(
            h200, _seven_slice("1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "7g.141gb",
                               (16.00, 32.50, 32.50, 69.75, 69.75, 140.00)), "lgip"),
            aliases=("NVIDIA-H200-141GB-HBM3e",), pci_device_ids=("0x233510DE",)),
        GpuProduct("NVIDIA-GH200-144G-HBM3e", gh200, profiles=_profiles(
            gh200, _seven_slice("1g.18gb", "1g.36gb", "2g.36gb", "3g.72gb", "7g.144gb", None, me=False),
            "estimated"), aliases=("NVIDIA-GH200-144GB",), pci_device_ids=("0x234810DE",)),
        GpuProduct("NVIDIA-B200", b200, profiles=_profiles(
            b200, _seven_slice("1g.23gb", "1g.45gb", "2g.45gb", "3g.90gb", "7g.180gb", None), "estimated"),
            pci_device_ids=("0x290110DE",)),
        GpuProduct("NVIDIA-A30", a30, compute_slices=4, memory_slices=4, profiles=_profiles(
            a30, [("1g.6gb", 4, None), ("1g.6gb+me", 1, None), ("2g.12gb", 2, None),
                  ("2g.12gb+me", 1, None), ("4g.24gb", 1, None)], "estimated", memory_slices_total=4),
            aliases=("NVIDIA-A30-24GB",), pci_device_ids=("0x20B710DE",)),
        GpuProduct("Tesla-T4", 15360, aliases=("NVIDIA-T4",)),
        GpuProduct("NVIDIA-L4", 23034),
        GpuProduct("NVIDIA-A10G", 23028, aliases=("NVIDIA-A10",)),
        GpuProduct("NVIDIA-L40S", 46068),
        GpuProduct("Tesla-V100-SXM2-16GB", 16384),
        GpuProduct("Tesla-V100-SXM2-32GB", 32768),
    )


@dataclass(frozen=True)
class Catalog:
    """Lookup over products; pass it in (no module-level state is consulted by callers)."""

    products: tuple[GpuProduct, ...] = field(default_factory=_build_products)

    def product(self, label: str) -> GpuProduct | None:
        """Find a product from a GFD product label, tolerating `-SHARED` and `-MIG-...` suffixes."""
        name = normalise_product_label(label)
        for product in self.products:
            if name == product.product or name in product.aliases:
                return product
        return None

    def names(self) -> list[str]:
        return [p.product for p in self.products]


def normalise_product_label(label: str) -> str:
    """GFD appends `-SHARED` when time-sliced and `-MIG-<profile>` under the single strategy."""
    name = label.strip()
    name = name.removesuffix("-SHARED")
    if "-MIG-" in name:
        name = name.split("-MIG-")[0]
    return name


def profile_memory_mib(profile: MigProfile, node_labels: Mapping[str, str] | None = None) -> int:
    """Real memory of a MIG instance: the GFD `.memory` label when a node reports it, else the catalog."""
    if node_labels:
        label = node_labels.get(f"{profile.resource_name}.memory")
        if label and label.isdigit():
            return int(label)
    return profile.memory_mib


DEFAULT_CATALOG = Catalog()
