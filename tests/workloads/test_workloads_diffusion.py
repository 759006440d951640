"""The diffusion family: the Stable Diffusion v1.5 UNet (``sd-unet``)."""

from __future__ import annotations

import pytest
import torch

import whichgpu.workloads.diffusion as diffusion
from whichgpu.schema import RunConfig, StepProfile
from whichgpu.trace.step import trace_step
from whichgpu.workloads.registry import get_workload

SD_UNET_PARAMS = 859_520_964
"""UNet2DConditionModel of runwayml/stable-diffusion-v1-5 (unet/config.json); the CompVis
loader (ldm/models/diffusion/ddpm.py) prints "DiffusionWrapper has 859.52 M params."."""

SD_UNET_MACS = 339e9
"""U-Net MACs per 512x512 image (one 4x64x64 latent, 77x768 text states) in Kim et al. 2023,
"BK-SDM: A Lightweight, Fast, and Cheap Version of Stable Diffusion" (arXiv 2305.15798), counted
with thop (src/count_macs_params.py of Nota-NetsPresso/BK-SDM), which counts convolutions and
linear layers only — not the attention score and value products."""


def _forward_conv_gemm_flops(profile: StepProfile) -> int:
    return sum(o.flops for o in profile.ops if o.phase == "forward" and o.kind in ("conv", "gemm"))


def test_registered_info() -> None:
    info = get_workload("sd-unet").info
    assert info.family == "diffusion"
    assert info.throughput_unit == "images"
    assert info.default_batch_size == 8
    assert not info.is_sequence_model
    assert info.params_published == SD_UNET_PARAMS
    assert info.params_source and info.reference


def test_parameter_count_is_exact() -> None:
    with torch.device("meta"):
        model = diffusion._build_unet(diffusion.SD15_UNET)
    assert sum(p.numel() for p in model.parameters()) == SD_UNET_PARAMS
    names = {n for n, _ in model.named_parameters()}
    # diffusers' state-dict names, so LoRA targets and checkpoints read the same
    assert "down_blocks.0.attentions.0.transformer_blocks.0.attn2.to_k.weight" in names
    assert "up_blocks.3.attentions.2.transformer_blocks.0.ff.net.0.proj.weight" in names
    assert "down_blocks.2.downsamplers.0.conv.weight" in names
    assert "up_blocks.0.upsamplers.0.conv.weight" in names
    assert "mid_block.attentions.0.proj_out.weight" in names


def test_trace_training_step() -> None:
    batch = 1
    profile = trace_step(get_workload("sd-unet"), RunConfig(batch_size=batch))
    assert profile.params_total == SD_UNET_PARAMS
    assert profile.units_per_step == batch
    forward = _forward_conv_gemm_flops(profile) / batch
    # Convolution + linear FLOPs of the forward pass = 2 x thop's MACs, within 1 %.
    assert forward == pytest.approx(2 * SD_UNET_MACS, rel=0.01)
    # Backward costs twice the forward for convolutions and linear layers.
    step = sum(o.flops for o in profile.ops if o.kind in ("conv", "gemm")) / batch
    assert step == pytest.approx(3 * forward, rel=0.02)
    # 16 transformers, each one self- and one cross-attention, all through SDPA.
    fwd_attention = [o for o in profile.ops if o.phase == "forward" and o.kind == "attention"]
    assert len(fwd_attention) == 32


def test_trace_with_checkpointing_recomputes_the_forward() -> None:
    ckpt = trace_step(get_workload("sd-unet"), RunConfig(batch_size=1, checkpointing=True))
    forward = _forward_conv_gemm_flops(ckpt)
    step = sum(o.flops for o in ckpt.ops if o.kind in ("conv", "gemm"))
    # Every resnet and transformer runs twice (as in diffusers); conv_in/out, the resamplers
    # and the timestep MLP are not checkpointed, so a little less than 4x the forward.
    assert 3.6 * forward < step < 4 * forward


def test_bf16_pure_builds_bf16_weights() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        built = get_workload("sd-unet").build(RunConfig(precision="bf16-pure"))
        batch = built.make_batch(2, None)
    assert {p.dtype for p in built.model.parameters()} == {torch.bfloat16}
    assert batch["sample"].shape == (2, 4, 64, 64)
    assert batch["sample"].dtype == torch.bfloat16
    assert batch["encoder_hidden_states"].shape == (2, 77, 768)
    assert batch["timestep"].dtype == torch.long


def test_small_unet_runs_for_real() -> None:
    """The same module code at toy widths: real forward, backward, finite loss."""
    config = dict(
        diffusion.SD15_UNET,
        block_out_channels=(32, 64, 64, 64),
        cross_attention_dim=16,
        attention_heads=2,
        norm_num_groups=8,
    )
    torch.manual_seed(0)
    model = diffusion._build_unet(config)
    sample = torch.randn(2, 4, 8, 8)
    out = model(sample, torch.tensor([3, 999]), torch.randn(2, 5, 16))
    assert out.shape == sample.shape
    loss = torch.nn.functional.mse_loss(out, torch.randn_like(out))
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None for p in model.parameters())
