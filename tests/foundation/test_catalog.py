"""The GPU catalog against REFERENCE.md's MIG table and the real H200 listing. Pure."""

from pathlib import Path

import pytest

from gpupolicy.catalog import DEFAULT_CATALOG, normalise_profile_name, profile_memory_mib

VENDOR = Path(__file__).resolve().parents[2] / "vendor"  # vendored upstream data (vendor/README.md)

# REFERENCE.md: profile name -> max instances, per product.
REFERENCE_TABLE = {
    "NVIDIA-A100-SXM4-40GB": "1g.5gb(7) 1g.5gb+me(1) 1g.10gb(4) 2g.10gb(3) 3g.20gb(2) 4g.20gb(1) 7g.40gb(1)",
    "NVIDIA-A100-SXM4-80GB": "1g.10gb(7) 1g.10gb+me(1) 1g.20gb(4) 2g.20gb(3) 3g.40gb(2) 4g.40gb(1) 7g.80gb(1)",
    "NVIDIA-H100-80GB-HBM3": "1g.10gb(7) 1g.10gb+me(1) 1g.20gb(4) 2g.20gb(3) 3g.40gb(2) 4g.40gb(1) 7g.80gb(1)",
    "NVIDIA-H100-NVL": "1g.12gb(7) 1g.12gb+me(1) 1g.24gb(4) 2g.24gb(3) 3g.47gb(2) 4g.47gb(1) 7g.94gb(1)",
    "NVIDIA-H200": "1g.18gb(7) 1g.18gb+me(1) 1g.35gb(4) 2g.35gb(3) 3g.71gb(2) 4g.71gb(1) 7g.141gb(1)",
    "NVIDIA-GH200-144G-HBM3e": "1g.18gb(7) 1g.36gb(4) 2g.36gb(3) 3g.72gb(2) 4g.72gb(1) 7g.144gb(1)",
    "NVIDIA-B200": "1g.23gb(7) 1g.23gb+me(1) 1g.45gb(4) 2g.45gb(3) 3g.90gb(2) 4g.90gb(1) 7g.180gb(1)",
    "NVIDIA-A30": "1g.6gb(4) 1g.6gb+me(1) 2g.12gb(2) 2g.12gb+me(1) 4g.24gb(1)",
}


@pytest.mark.parametrize("product", sorted(REFERENCE_TABLE))
def test_profiles_and_max_instances_match_the_reference(product: str) -> None:
    expected = {}
    for cell in REFERENCE_TABLE[product].split():
        name, count = cell.rstrip(")").split("(")
        expected[name] = int(count)
    found = DEFAULT_CATALOG.product(product)
    assert found is not None
    assert {p.name: p.max_instances for p in found.profiles} == expected


@pytest.mark.parametrize(
    ("profile", "slices", "placements"),
    [
        ("1g.10gb", 1, (0, 1, 2, 3, 4, 5, 6)),
        ("1g.20gb", 2, (0, 2, 4, 6)),
        ("2g.20gb", 2, (0, 2, 4)),
        ("3g.40gb", 4, (0, 4)),
        ("4g.40gb", 4, (0,)),
        ("7g.80gb", 8, (0,)),
    ],
)
def test_a100_placements(profile: str, slices: int, placements: tuple[int, ...]) -> None:
    product = DEFAULT_CATALOG.product("NVIDIA-A100-SXM4-80GB")
    assert product is not None
    found = product.profile(profile)
    assert found is not None
    assert (found.memory_slices, found.placements) == (slices, placements)


def _lgip_memory() -> dict[str, float]:
    """Parse the real H200's `nvidia-smi mig -lgip` table: profile -> GiB."""
    table = {}
    for line in (VENDOR / "gpu/h200-mig-lgip.txt").read_text().splitlines():
        parts = line.strip("| ").split()
        if len(parts) > 5 and parts[1] == "MIG":
            table[parts[2]] = float(parts[5])
    return table


def test_h200_memory_is_what_the_real_gpu_reports() -> None:
    lgip = _lgip_memory()
    assert lgip, "the listing was parsed"
    product = DEFAULT_CATALOG.product("NVIDIA-H200")
    assert product is not None
    for profile in product.profiles:
        assert profile.memory_mib == round(lgip[profile.name] * 1024), profile.name
        assert profile.memory_source == "lgip"


def test_memory_is_never_the_number_in_the_name() -> None:
    for product in DEFAULT_CATALOG.products:
        for profile in product.profiles:
            named_gb = int(profile.name.removesuffix("+me").split(".")[1].removesuffix("gb"))
            assert profile.memory_mib < named_gb * 1024, (product.product, profile.name)


def test_gfd_memory_label_wins_over_the_catalog() -> None:
    product = DEFAULT_CATALOG.product("NVIDIA-A100-SXM4-80GB")
    assert product is not None
    profile = product.profile("1g.10gb")
    assert profile is not None
    assert profile_memory_mib(profile, {"nvidia.com/mig-1g.10gb.memory": "9728"}) == 9728
    assert profile_memory_mib(profile, {}) == profile.memory_mib


@pytest.mark.parametrize(
    ("label", "product"),
    [
        ("NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-SXM4-80GB"),
        ("NVIDIA-A100-SXM4-80GB-SHARED", "NVIDIA-A100-SXM4-80GB"),
        ("NVIDIA-A100-SXM4-80GB-MIG-1g.10gb", "NVIDIA-A100-SXM4-80GB"),
        ("NVIDIA-H800", "NVIDIA-H100-80GB-HBM3"),
    ],
)
def test_product_labels_as_gfd_prints_them(label: str, product: str) -> None:
    found = DEFAULT_CATALOG.product(label)
    assert found is not None and found.product == product


def test_unknown_product() -> None:
    assert DEFAULT_CATALOG.product("NVIDIA-Unobtainium") is None


@pytest.mark.parametrize(
    ("raw", "name"),
    [("1g.10gb", "1g.10gb"), ("nvidia.com/mig-1g.10gb", "1g.10gb"), ("mig-1g.10gb.me", "1g.10gb+me")],
)
def test_profile_names_are_normalised(raw: str, name: str) -> None:
    assert normalise_profile_name(raw) == name


def test_me_profiles_use_the_device_plugin_resource_name() -> None:
    product = DEFAULT_CATALOG.product("NVIDIA-H200")
    assert product is not None
    profile = product.profile("1g.18gb+me")
    assert profile is not None and profile.resource_name == "nvidia.com/mig-1g.18gb.me"
