"""Name resolution: normalisation, short forms, ambiguity, suggestions, memory narrowing."""

from __future__ import annotations

import pytest

from whichgpu.catalog import load_catalog
from whichgpu.catalog.names import NameIndex, normalize
from whichgpu.errors import AmbiguousGpu, UnknownGpu
from whichgpu.schema import GpuSpec, Segment, Vendor


def _spec(gpu_id: str, name: str, memory_gb: float, *aliases: str) -> GpuSpec:
    return GpuSpec(
        id=gpu_id,
        name=name,
        vendor=Vendor.NVIDIA,
        segment=Segment.DATACENTER,
        aliases=aliases,
        memory_gb=memory_gb,
    )


@pytest.fixture
def index() -> NameIndex:
    return NameIndex(
        [
            _spec("rtx-3090", "GeForce RTX 3090", 24, "NVIDIA GeForce RTX 3090"),
            _spec("a100-sxm4-40gb", "A100 SXM4 40GB", 40, "A100", "A100-40GB"),
            _spec(
                "a100-sxm4-80gb", "A100 SXM4 80GB", 80, "A100", "A100-80GB", "NVIDIA A100-SXM4-80GB"
            ),
            _spec("gtx-1080-ti", "GeForce GTX 1080 Ti", 11),
        ]
    )


def test_normalize_drops_brand_words_and_punctuation() -> None:
    assert normalize("NVIDIA GeForce RTX 3090") == "rtx3090"
    assert normalize("  rtx-3090 ") == "rtx3090"
    assert normalize("Tesla V100-PCIE-32GB") == "v100pcie32gb"


@pytest.mark.parametrize(
    "name",
    ["3090", "rtx3090", "RTX 3090", "GeForce RTX 3090", "NVIDIA GeForce RTX 3090", "rtx-3090"],
)
def test_common_spellings_resolve(index: NameIndex, name: str) -> None:
    assert index.resolve(name).id == "rtx-3090"


def test_short_form_keeps_suffix(index: NameIndex) -> None:
    assert index.resolve("1080 Ti").id == "gtx-1080-ti"
    assert index.resolve("1080ti").id == "gtx-1080-ti"


def test_family_name_is_ambiguous_with_candidates(index: NameIndex) -> None:
    with pytest.raises(AmbiguousGpu) as err:
        index.resolve("A100")
    assert {c[0] for c in err.value.candidates} == {"a100-sxm4-40gb", "a100-sxm4-80gb"}
    assert "a100-sxm4-80gb" in str(err.value)


def test_memory_narrows_a_family(index: NameIndex) -> None:
    assert index.resolve("A100", memory_gb=79.2).id == "a100-sxm4-80gb"
    with pytest.raises(AmbiguousGpu):
        index.resolve("A100", memory_gb=24)


def test_cloud_and_nvml_names(index: NameIndex) -> None:
    assert index.resolve("A100-80GB").id == "a100-sxm4-80gb"
    assert index.resolve("NVIDIA A100-SXM4-80GB").id == "a100-sxm4-80gb"


def test_unknown_name_suggests_close_matches(index: NameIndex) -> None:
    with pytest.raises(UnknownGpu) as err:
        index.resolve("rtx 3900")
    assert err.value.suggestions[0].startswith("rtx-3090")
    with pytest.raises(UnknownGpu) as err:
        index.resolve("zzzz")
    assert err.value.suggestions == []


def test_a_name_that_holds_the_whole_query_is_suggested_first() -> None:
    # only the 16 GB RTX 5060 Ti is catalogued (the 8 GB one shares its NVML name, so the
    # bare name is not an alias); the closest edit-distance names are other cards
    with pytest.raises(UnknownGpu) as err:
        load_catalog().resolve("rtx 5060 ti")
    assert err.value.suggestions[0].startswith("rtx-5060-ti-16gb")


def test_a_family_name_means_its_default_variant_with_a_note() -> None:
    catalog = load_catalog([])
    spec, note = catalog.resolve_noted("RTX 3080")
    assert spec.id == "rtx-3080-10gb"
    assert note is not None and "10 GB" in note and "rtx-3080-12gb" in note
    assert catalog.resolve("3080").id == "rtx-3080-10gb"
    # a name of one record carries no note; the variants stay reachable
    assert catalog.resolve_noted("RTX 3080 12GB") == (catalog.get("rtx-3080-12gb"), None)
    # a reported memory size picks the variant: NVML names both "NVIDIA GeForce RTX 3080"
    assert catalog.resolve("NVIDIA GeForce RTX 3080", memory_gb=12.9).id == "rtx-3080-12gb"
    assert catalog.resolve("NVIDIA GeForce RTX 3080", memory_gb=10.5).id == "rtx-3080-10gb"
    # a memory size no variant has does not fall back to the default
    with pytest.raises(AmbiguousGpu):
        catalog.resolve("NVIDIA GeForce RTX 3080", memory_gb=24)


@pytest.mark.parametrize("family", ["A100", "H100", "H200", "V100", "RTX 4060 Ti", "Titan X"])
def test_real_ambiguities_stay_ambiguous(family: str) -> None:
    with pytest.raises(AmbiguousGpu):
        load_catalog([]).resolve(family)


def test_default_variants_are_one_per_family() -> None:
    from whichgpu.catalog.names import alias_keys

    gpus = load_catalog([]).all()
    owners: dict[str, list[GpuSpec]] = {}
    for spec in gpus:
        for key in alias_keys(spec):
            owners.setdefault(key, []).append(spec)
    for spec in (g for g in gpus if g.default_variant):
        families = [specs for specs in owners.values() if spec in specs and len(specs) > 1]
        assert families, f"{spec.id} is a default variant but shares no family name"
    for key, specs in owners.items():
        assert sum(s.default_variant for s in specs) <= 1, key
