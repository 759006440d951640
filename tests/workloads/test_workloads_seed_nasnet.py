"""NASNet-A Large: parameter count, published mult-adds, and a fake-tensor training step."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

import whichgpu.workloads.seed_nasnet as nasnet  # noqa: E402
from whichgpu.schema import RunConfig, StepProfile  # noqa: E402
from whichgpu.workloads.registry import get_workload  # noqa: E402

BATCH = 2  # batch norm in the auxiliary head (1x1 output) needs more than one sample


@pytest.fixture(scope="module")
def profile() -> StepProfile:
    from whichgpu.trace.step import trace_step

    return trace_step(get_workload("nasnet-large"), RunConfig(batch_size=BATCH))


def _meta_model() -> Any:
    with torch.device("meta"):
        return nasnet._build_model()


def test_registered() -> None:
    info = get_workload("nasnet-large").info
    assert info.family == "seed_nasnet"
    assert info.throughput_unit == "images"
    assert info.params_published == 88_900_000


def test_parameter_count_matches_paper() -> None:
    # Zoph et al. 2018, Table 2: NASNet-A (6 @ 4032) has 88.9M parameters; this is the network
    # without the auxiliary head. Cadene's pretrained-models.pytorch nasnetalarge (and timm's)
    # has 88,753,150 with 1000 classes, which the same architecture reproduces exactly.
    model = _meta_model()
    total = sum(p.numel() for p in model.parameters())
    aux = sum(p.numel() for p in model.aux.parameters())
    assert total - aux == 88_753_150
    assert abs(total - aux - 88_900_000) / 88_900_000 < 0.01
    # auxiliary head (slim _build_aux_head on 2016x21x21): 1x1 to 128, 6x6 conv to 768, FC
    assert aux == 2016 * 128 + 2 * 128 + 128 * 768 * 36 + 2 * 768 + 768 * 1000 + 1000


def test_shapes_follow_the_reference() -> None:
    model = _meta_model()
    x = torch.empty(BATCH, 3, 331, 331, device="meta")
    feats = [model.conv0(x)]
    for n, cell in enumerate(model.cells):
        p = model.prev_index[n]
        feats.append(cell(feats[-1], None if p < 0 else feats[p]))
    shapes = [tuple(f.shape[1:]) for f in feats]
    assert shapes[0] == (96, 165, 165)
    assert shapes[1:3] == [(168, 83, 83), (336, 42, 42)]  # the two stem reduction cells
    assert shapes[3] == (1008, 42, 42)
    assert shapes[9] == (1344, 21, 21)  # reduction cell 0
    assert shapes[16] == (2688, 11, 11)  # reduction cell 1
    assert shapes[-1] == (4032, 11, 11)
    assert len(model.cells) == 2 + 18 + 2


def test_training_step_traces(profile: StepProfile) -> None:
    assert profile.params_total == 88_753_150 + 4_567_784  # with the auxiliary head
    assert profile.units_per_step == BATCH
    assert profile.flops_per_step > 0


def test_forward_mult_adds_match_paper(profile: StepProfile) -> None:
    # Zoph et al. 2018, Table 2: 23.8B mult-adds per 331x331 image; FLOPs = 2 x MACs. The
    # auxiliary head adds ~5M MACs. Tolerance 5 % (measured: 23.797B, -0.01 %).
    forward = sum(op.flops for op in profile.ops if op.phase == "forward")
    macs_per_image = forward / 2 / BATCH
    assert abs(macs_per_image - nasnet.MACS_PUBLISHED) / nasnet.MACS_PUBLISHED < 0.05


def test_backward_flops_about_twice_forward(profile: StepProfile) -> None:
    forward = sum(op.flops for op in profile.ops if op.phase == "forward")
    backward = sum(op.flops for op in profile.ops if op.phase == "backward")
    assert backward < 2.2 * forward
