"""The GAN workloads of Lambda's 2020 benchmark: pix2pixHD and StyleGAN.

Parameter counts are checked against the published figures and against independent counts of
the reference repositories' layer lists; forward convolution FLOPs of a traced step against an
analytic count of the same layers at the published input sizes (neither paper publishes FLOPs).
"""

from __future__ import annotations

import itertools
import subprocess
import sys
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import whichgpu.workloads.seed_gan as seed_gan  # noqa: E402
from whichgpu.schema import RunConfig  # noqa: E402
from whichgpu.trace.step import trace_step  # noqa: E402
from whichgpu.workloads.registry import get_workload  # noqa: E402


def _fake_model(name: str, run: RunConfig | None = None) -> Any:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        return get_workload(name).build(run or RunConfig()).model


def _count(module: Any, trainable: bool = True) -> int:
    return sum(p.numel() for p in module.parameters() if p.requires_grad or not trainable)


def _conv(cin: int, cout: int, k: int, px: int) -> int:
    """Weights and bias of a k x k convolution (px unused: same helper shape as the FLOPs)."""
    del px
    return cin * cout * k * k + cout


# --- pix2pixHD ----------------------------------------------------------------------------------


def _pix2pixhd_g_params() -> int:
    """NVIDIA/pix2pixHD networks.LocalEnhancer, --netG local --ngf 32, counted by hand."""
    g, local, inp = 64, 32, 36  # global ngf = 2 x 32; 35 labels + 1 edge channel
    total = _conv(inp, g, 7, 0)
    total += sum(_conv(g * 2**i, g * 2 ** (i + 1), 3, 0) for i in range(4))
    total += 9 * 2 * _conv(g * 16, g * 16, 3, 0)
    total += sum(_conv(g * 2 ** (4 - i), g * 2 ** (3 - i), 3, 0) for i in range(4))
    total += _conv(inp, local, 7, 0) + _conv(local, 2 * local, 3, 0)
    total += 3 * 2 * _conv(2 * local, 2 * local, 3, 0)
    total += _conv(2 * local, local, 3, 0) + _conv(local, 3, 7, 0)
    return total


def _pix2pixhd_d_params() -> int:
    """3 x NLayerDiscriminator(39, ndf 64, n_layers 3), 4x4 kernels."""
    chans = [39, 64, 128, 256, 512, 1]
    return 3 * sum(_conv(a, b, 4, 0) for a, b in itertools.pairwise(chans))


def test_pix2pixhd_parameter_counts() -> None:
    # Neither the paper nor the repository prints a count: the published figure is the count
    # of the repository's definition (models/networks.py), recomputed here by hand.
    model = _fake_model("pix2pixhd")
    assert _count(model.netG) == _pix2pixhd_g_params() == seed_gan.P2P_G_PARAMS == 182_857_059
    assert _count(model.netD) == _pix2pixhd_d_params() == seed_gan.P2P_D_PARAMS == 8_404_803
    assert _count(model.vgg) == 0  # frozen
    assert _count(model.vgg, trainable=False) == seed_gan.P2P_VGG_PARAMS
    info = get_workload("pix2pixhd").info
    assert _count(model) == info.params_published


def _out(size: int, k: int, s: int, p: int) -> int:
    return (size + 2 * p - k) // s + 1


def _pix2pixhd_forward_conv_flops() -> int:
    """Forward convolution FLOPs per image: G once, D three times (3 scales), VGG19 twice."""
    h, w = seed_gan.P2P_HEIGHT, seed_gan.P2P_WIDTH
    px = h * w
    macs = 0
    # global generator at half resolution (input downsampled once)
    g = 64
    macs += 36 * g * 49 * px // 4
    for i in range(4):
        macs += g * 2**i * g * 2 ** (i + 1) * 9 * px // 4 ** (i + 2)
    macs += 18 * (16 * g) ** 2 * 9 * px // 4**5
    for i in range(4):  # transposed convs: counted over their input pixels
        macs += g * 2 ** (4 - i) * g * 2 ** (3 - i) * 9 * px // 4 ** (5 - i)
    # local enhancer at full resolution
    macs += 36 * 32 * 49 * px + 32 * 64 * 9 * px // 4 + 6 * 64 * 64 * 9 * px // 4
    macs += 64 * 32 * 9 * px // 4 + 32 * 3 * 49 * px
    # discriminator: 3 scales (avg-pool 3, stride 2, pad 1 between them), run 3 times
    d_macs = 0
    sh, sw = h, w
    for _ in range(3):
        ch, cw = sh, sw
        for cin, cout, stride in [
            (39, 64, 2),
            (64, 128, 2),
            (128, 256, 2),
            (256, 512, 1),
            (512, 1, 1),
        ]:
            ch, cw = _out(ch, 4, stride, 2), _out(cw, 4, stride, 2)
            d_macs += cin * cout * 16 * ch * cw
        sh, sw = _out(sh, 3, 2, 1), _out(sw, 3, 2, 1)
    macs += 3 * d_macs
    # VGG19 conv1_1 .. conv5_1 on the fake and the real image
    vgg = [(3, 64, 1), (64, 64, 1), (64, 128, 4), (128, 128, 4), (128, 256, 16)]
    vgg += [(256, 256, 16)] * 3 + [(256, 512, 64)] + [(512, 512, 64)] * 3 + [(512, 512, 256)]
    macs += 2 * sum(cin * cout * 9 * px // div for cin, cout, div in vgg)
    return 2 * macs


def test_pix2pixhd_traces_one_training_step() -> None:
    profile = trace_step(get_workload("pix2pixhd"), RunConfig(batch_size=1, precision="bf16"))
    assert profile.params_total == seed_gan.P2P_G_PARAMS + seed_gan.P2P_D_PARAMS + 12_944_960
    assert profile.params_trainable == get_workload("pix2pixhd").info.params_published
    assert profile.units_per_step == 1
    assert profile.throughput_unit == "images"
    conv_fwd = sum(
        op.flops for op in profile.ops if op.phase == "forward" and op.name == "aten.convolution"
    )
    # Exact layer shapes: the traced forward convolutions match the analytic count (0.1 %).
    assert conv_fwd == pytest.approx(_pix2pixhd_forward_conv_flops(), rel=1e-3)
    # The backward pass costs about twice the forward (no weight grads for the frozen VGG).
    assert 2.0 < profile.flops_per_step / conv_fwd < 3.0


# --- StyleGAN -----------------------------------------------------------------------------------


def _nf(stage: int) -> int:
    return min(8192 // 2**stage, 512)


def _stylegan_g_params() -> int:
    """NVlabs/stylegan G_style: mapping + G_synthesis, every ToRGB_lod, trainable variables."""
    mapping = 8 * (512 * 512 + 512)

    def epilogue(c: int) -> int:  # noise weight, bias, style dense (512 -> 2c) + bias
        return c + c + 512 * 2 * c + 2 * c

    synth = 512 * 16 + 2 * epilogue(512) + 512 * 512 * 9
    for res in range(3, 11):
        cin, cout = _nf(res - 2), _nf(res - 1)
        synth += cin * cout * 9 + cout * cout * 9 + 2 * epilogue(cout)
    synth += sum(_nf(res - 1) * 3 + 3 for res in range(2, 11))
    return mapping + synth


def _stylegan_d_params() -> int:
    """NVlabs/stylegan D_basic at 1024: every FromRGB_lod, blocks 1024 -> 8, 4x4 head."""
    total = sum(_conv(3, _nf(res - 1), 1, 0) for res in range(2, 11))
    for res in range(10, 2, -1):
        total += _conv(_nf(res - 1), _nf(res - 1), 3, 0) + _conv(_nf(res - 1), _nf(res - 2), 3, 0)
    total += _conv(_nf(1) + 1, _nf(1), 3, 0) + (_nf(1) * 16 * _nf(0) + _nf(0)) + (_nf(0) + 1)
    return total


def test_stylegan_parameter_counts() -> None:
    model = _fake_model("stylegan")
    # 26.2M: Karras et al. 2019 (StyleGAN), section 2 ("26.2M trainable parameters").
    assert _count(model.G) == _stylegan_g_params() == seed_gan.SG_G_PARAMS
    assert _count(model.G) == pytest.approx(26.2e6, rel=0.01)
    # 23.1M: Karras et al. 2018 (Progressive GAN), Table 2 discriminator, which StyleGAN keeps.
    assert _count(model.D) == _stylegan_d_params() == seed_gan.SG_D_PARAMS
    assert _count(model.D) == pytest.approx(23.1e6, rel=0.01)
    assert _count(model) == pytest.approx(get_workload("stylegan").info.params_published, rel=0.01)


def _stylegan_forward_conv_flops() -> int:
    """Forward convolution FLOPs per image: G twice (G step, D step), D three times, and the
    blur filters of D once more (R1's gradient runs them, as the reference's custom gradient
    does, inside the loss)."""
    g = 512 * 512 * 9 * 16
    for res in range(3, 11):
        cin, cout, px = _nf(res - 2), _nf(res - 1), 4**res
        g += cin * cout * 16 * px // 4 if 2**res >= 128 else cin * cout * 9 * px  # up
        g += cout * 9 * px + cout * cout * 9 * px  # blur, conv
    g += 16 * 3 * 4**10  # ToRGB
    d = 3 * 16 * 4**10  # FromRGB
    d_blur = 0
    for res in range(10, 2, -1):
        c, cout, px = _nf(res - 1), _nf(res - 2), 4**res
        d_blur += c * 9 * px
        d += c * c * 9 * px + c * 9 * px  # conv0, blur
        d += c * cout * 16 * px // 4 if 2**res >= 128 else c * cout * 9 * px  # conv1_down
    d += 513 * 512 * 9 * 16
    return 2 * (2 * g + 3 * d + d_blur)


def test_stylegan_traces_one_training_step_with_r1() -> None:
    profile = trace_step(get_workload("stylegan"), RunConfig(batch_size=1, precision="bf16"))
    assert profile.params_trainable == seed_gan.SG_G_PARAMS + seed_gan.SG_D_PARAMS
    assert profile.units_per_step == 1
    conv_fwd = sum(
        op.flops for op in profile.ops if op.phase == "forward" and op.name == "aten.convolution"
    )
    assert conv_fwd == pytest.approx(_stylegan_forward_conv_flops(), rel=1e-3)
    # R1's double backward runs inside the loss (the forward phase) as convolution backward.
    assert any(
        op.phase == "forward" and op.name == "aten.convolution_backward" for op in profile.ops
    )
    assert 2.0 < profile.flops_per_step / conv_fwd < 3.5


def test_bf16_pure_builds_bf16_weights_and_inputs() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    run = RunConfig(precision="bf16-pure")
    with FakeTensorMode():
        for name in ("pix2pixhd", "stylegan"):
            built = get_workload(name).build(run)
            assert {p.dtype for p in built.model.parameters()} == {torch.bfloat16}
            batch = built.make_batch(2, None)
            floats = [v for v in batch.values() if v.is_floating_point()]
            assert floats and all(v.dtype == torch.bfloat16 for v in floats)


def test_module_import_does_not_import_torch() -> None:
    program = (
        "import sys; sys.modules['torch'] = None\n"
        "import whichgpu.workloads.seed_gan as m\n"
        "from whichgpu.workloads.registry import get_workload\n"
        "assert get_workload('stylegan').info.family == 'seed_gan'\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, check=False, timeout=60
    )
    assert result.returncode == 0, result.stderr
