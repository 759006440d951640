"""Scalable profiles: exact at sizes never traced, stored without loss, regenerable."""

from __future__ import annotations

from pathlib import Path

import pytest

from whichgpu.profiles.scalable import ScalableProfile, solve_polynomials
from whichgpu.profiles.stored import load_stored, profile_key, stored_keys
from whichgpu.trace.scaling import trace_scalable
from whichgpu.trace.step import trace_step
from whichgpu.workloads import get_workload, run_config
from whichgpu.workloads.user import config_workload

FIXTURES = Path(__file__).parents[1] / "fixtures"


def test_polynomials_are_exact_rationals() -> None:
    points = [(2, 16), (2, 32), (2, 64), (3, 16), (3, 32), (3, 64)]

    def f(b: int, s: int) -> int:
        return 7 + 3 * s + b * s * (s + 1) // 2

    basis = ("1", "L", "L2", "b", "bL", "bL2")
    polys, index = solve_polynomials(basis, points, [tuple(f(b, s) for b, s in points)])
    for b, s in [(1, 8), (5, 100), (64, 4096)]:
        assert polys.values(b, s)[index[0]] == f(b, s)


HEARD: list[str] = []
"""What ``trace_scalable`` reported while tracing the fixture (its progress callback)."""


@pytest.fixture(scope="module")
def tiny_scalable() -> ScalableProfile:
    workload = config_workload(FIXTURES / "tiny-llama.json", None)
    return trace_scalable(workload, run_config(), progress=HEARD.append)


def test_tracing_reports_each_size_as_it_goes(tiny_scalable: ScalableProfile) -> None:
    points = [*tiny_scalable.trace_points, tiny_scalable.check_point]
    assert len(HEARD) == len(points) >= 2
    for i, (message, (batch, length)) in enumerate(zip(HEARD, points, strict=True), 1):
        assert message == (
            f"tracing {tiny_scalable.workload} at batch {batch}, length {length} "
            f"({i} of {len(points)})"
        )


def test_profile_at_an_untraced_size_equals_its_trace(tiny_scalable: ScalableProfile) -> None:
    workload = config_workload(FIXTURES / "tiny-llama.json", None)
    batch, seq = 7, 200  # off the grid in both variables
    direct = trace_step(workload, run_config(batch_size=batch, seq_len=seq))
    predicted = tiny_scalable.at(batch, seq)
    assert predicted.units_per_step == direct.units_per_step
    assert [e.size_bytes for e in predicted.events] == sorted_sizes(direct)
    assert [op.flops for op in predicted.ops] == [op.flops for op in direct.ops]
    assert [op.gemm_bmnk for op in predicted.ops] == [op.gemm_bmnk for op in direct.ops]
    assert predicted.flops_per_step == direct.flops_per_step


def sorted_sizes(profile: object) -> list[int]:
    from whichgpu.trace.recorder import canonical_events

    return [e.size_bytes for e in canonical_events(profile.events)]  # type: ignore[attr-defined]


def test_json_round_trip(tiny_scalable: ScalableProfile, tmp_path: Path) -> None:
    path = tmp_path / "p.json.gz"
    tiny_scalable.save(path)
    again = ScalableProfile.load(path)
    assert again.to_json() == tiny_scalable.to_json()
    assert again.at(5, 96) == tiny_scalable.at(5, 96)


def test_other_formats_are_refused(tiny_scalable: ScalableProfile) -> None:
    doc = tiny_scalable.to_json()
    doc["version"] = 999
    with pytest.raises(ValueError, match="v1"):
        ScalableProfile.from_json(doc)


def test_every_named_workload_ships_a_default_profile() -> None:
    from whichgpu.workloads import all_workloads

    keys = set(stored_keys())
    missing = [
        w.info.name for w in all_workloads() if profile_key(w.info.name, run_config()) not in keys
    ]
    assert not missing, f"no stored profile for {missing}; run scripts/make_profiles.py"


def test_stored_profile_regenerates_identically() -> None:
    """The shipped resnet50 profile is what the tracer produces today."""
    run = run_config()
    stored = load_stored("resnet50", run)
    assert stored is not None
    fresh = trace_scalable(get_workload("resnet50"), run)
    keep = {"trace_seconds"}
    assert {k: v for k, v in fresh.to_json().items() if k not in keep} == {
        k: v for k, v in stored.to_json().items() if k not in keep
    }
