"""Latent diffusion: the Stable Diffusion v1.5 denoising UNet, trained on 512x512 images.

The UNet follows the ``UNet2DConditionModel`` config of runwayml/stable-diffusion-v1-5 (the
``diffusers`` port of CompVis' ``ldm.modules.diffusionmodules.openaimodel.UNetModel``), written
here in plain PyTorch because ``diffusers`` is not a dependency: ``ResnetBlock2D`` (GroupNorm 32,
SiLU, 3x3 convolutions, the timestep embedding added in between), ``Transformer2DModel``
(GroupNorm, 1x1 ``proj_in``, one transformer block of self-attention, cross-attention on the
text states and a GEGLU feed-forward, 1x1 ``proj_out``), strided-convolution downsampling and
nearest-neighbour upsampling followed by a 3x3 convolution. Attention runs through
``F.scaled_dot_product_attention``. Module names follow ``diffusers`` (``to_q``, ``to_k``,
``to_v``, ``to_out.0``), so LoRA targets read the same.

Only the UNet is trained. The VAE encoder (image -> 4x64x64 latents, scaled by 0.18215) and the
CLIP ViT-L/14 text encoder (77x768 hidden states) are frozen in Stable Diffusion training and
are not part of the traced model: their outputs are synthesised. Each step samples timesteps
from the 1000-step scaled-linear DDPM schedule (betas 0.00085 to 0.012), noises the latents and
scores the UNet's noise prediction with the mean squared error (epsilon prediction), as the
CompVis and ``diffusers`` training scripts do. Throughput is counted in images.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from whichgpu.schema import RunConfig, WorkloadInfo
from whichgpu.workloads.base import BuiltWorkload, Workload
from whichgpu.workloads.hf import default_dtype, model_device, weight_dtype
from whichgpu.workloads.registry import register

if TYPE_CHECKING:
    import torch

IMAGE_SIZE = 512
"""Training resolution of Stable Diffusion v1.5 (pixels)."""
VAE_FACTOR = 8
"""Spatial downsampling of the SD VAE: 512x512 images are 64x64 latents."""
LATENT_CHANNELS = 4
TEXT_TOKENS = 77
"""CLIP tokenizer context length."""
TEXT_DIM = 768
"""CLIP ViT-L/14 text-encoder width (the UNet's ``cross_attention_dim``)."""
TRAIN_TIMESTEPS = 1000
BETA_START = 0.00085
BETA_END = 0.012

SD15_UNET: dict[str, Any] = {
    "in_channels": 4,
    "out_channels": 4,
    "block_out_channels": (320, 640, 1280, 1280),
    "down_blocks": ("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
    "up_blocks": ("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3,
    "layers_per_block": 2,
    "cross_attention_dim": 768,
    "attention_heads": 8,  # diffusers' "attention_head_dim": 8 is the number of heads in SD 1.x
    "norm_num_groups": 32,
    "norm_eps": 1e-5,
}
"""The architecture fields of runwayml/stable-diffusion-v1-5 ``unet/config.json``."""

SD_UNET_PARAMS = 859_520_964
"""Parameters of the SD v1.x UNet (the CompVis loader prints "DiffusionWrapper has 859.52 M
params."; ``UNet2DConditionModel`` of runwayml/stable-diffusion-v1-5 counts 859,520,964)."""

SD_TARGETS = ("to_q", "to_k", "to_v", "to_out.0")
"""Default LoRA targets: the attention projections, as in ``diffusers``' LoRA training script."""


def _build_unet(config: dict[str, Any]) -> torch.nn.Module:
    """The SD UNet as an ``nn.Module`` whose forward is ``(sample, timestep,
    encoder_hidden_states) -> predicted noise``."""
    import math

    import torch
    import torch.nn.functional as F
    from torch import nn
    from torch.utils.checkpoint import checkpoint

    groups: int = config["norm_num_groups"]
    eps: float = config["norm_eps"]
    heads: int = config["attention_heads"]
    context_dim: int = config["cross_attention_dim"]

    class ResnetBlock2D(nn.Module):
        def __init__(self, cin: int, cout: int, temb: int) -> None:
            super().__init__()
            self.norm1 = nn.GroupNorm(groups, cin, eps=eps)
            self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
            self.time_emb_proj = nn.Linear(temb, cout)
            self.norm2 = nn.GroupNorm(groups, cout, eps=eps)
            self.dropout = nn.Dropout(0.0)
            self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
            self.conv_shortcut = nn.Conv2d(cin, cout, 1) if cin != cout else None

        def forward(self, x: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
            h = self.conv1(F.silu(self.norm1(x)))
            h = h + self.time_emb_proj(F.silu(temb))[:, :, None, None]
            h = self.conv2(self.dropout(F.silu(self.norm2(h))))
            if self.conv_shortcut is not None:
                x = self.conv_shortcut(x)
            out: torch.Tensor = x + h
            return out

    class Attention(nn.Module):
        def __init__(self, dim: int, kv_dim: int) -> None:
            super().__init__()
            self.to_q = nn.Linear(dim, dim, bias=False)
            self.to_k = nn.Linear(kv_dim, dim, bias=False)
            self.to_v = nn.Linear(kv_dim, dim, bias=False)
            self.to_out = nn.ModuleList([nn.Linear(dim, dim), nn.Dropout(0.0)])

        def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
            b = x.shape[0]

            def split(t: torch.Tensor) -> torch.Tensor:
                return t.view(b, -1, heads, t.shape[-1] // heads).transpose(1, 2)

            q, k, v = split(self.to_q(x)), split(self.to_k(context)), split(self.to_v(context))
            out = F.scaled_dot_product_attention(q, k, v)
            out = out.transpose(1, 2).reshape(b, -1, heads * out.shape[-1])
            for layer in self.to_out:
                out = layer(out)
            return out

    class GEGLU(nn.Module):
        def __init__(self, dim: int, inner: int) -> None:
            super().__init__()
            self.proj = nn.Linear(dim, inner * 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h, gate = self.proj(x).chunk(2, dim=-1)
            out: torch.Tensor = h * F.gelu(gate)
            return out

    class FeedForward(nn.Module):
        def __init__(self, dim: int) -> None:
            super().__init__()
            self.net = nn.ModuleList(
                [GEGLU(dim, dim * 4), nn.Dropout(0.0), nn.Linear(dim * 4, dim)]
            )

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for layer in self.net:
                x = layer(x)
            return x

    class BasicTransformerBlock(nn.Module):
        def __init__(self, dim: int) -> None:
            super().__init__()
            self.norm1 = nn.LayerNorm(dim)
            self.attn1 = Attention(dim, dim)
            self.norm2 = nn.LayerNorm(dim)
            self.attn2 = Attention(dim, context_dim)
            self.norm3 = nn.LayerNorm(dim)
            self.ff = FeedForward(dim)

        def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
            h = self.norm1(x)
            x = x + self.attn1(h, h)
            x = x + self.attn2(self.norm2(x), context)
            out: torch.Tensor = x + self.ff(self.norm3(x))
            return out

    class Transformer2DModel(nn.Module):
        def __init__(self, dim: int) -> None:
            super().__init__()
            self.norm = nn.GroupNorm(groups, dim, eps=1e-6)
            self.proj_in = nn.Conv2d(dim, dim, 1)
            self.transformer_blocks = nn.ModuleList([BasicTransformerBlock(dim)])
            self.proj_out = nn.Conv2d(dim, dim, 1)

        def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
            b, c, hgt, wid = x.shape
            h = self.proj_in(self.norm(x))
            h = h.permute(0, 2, 3, 1).reshape(b, hgt * wid, c)
            for block in self.transformer_blocks:
                h = block(h, context)
            h = h.reshape(b, hgt, wid, c).permute(0, 3, 1, 2).contiguous()
            out: torch.Tensor = self.proj_out(h) + x
            return out

    class Downsample2D(nn.Module):
        def __init__(self, dim: int) -> None:
            super().__init__()
            self.conv = nn.Conv2d(dim, dim, 3, stride=2, padding=1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = self.conv(x)
            return out

    class Upsample2D(nn.Module):
        def __init__(self, dim: int) -> None:
            super().__init__()
            self.conv = nn.Conv2d(dim, dim, 3, padding=1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))
            return out

    class Block(nn.Module):
        """A down or up block: resnets, optional transformers after each, optional resampler.
        Up blocks concatenate one skip connection before each resnet."""

        def __init__(
            self,
            ins: list[int],
            skips: list[int],
            cout: int,
            temb: int,
            attn: bool,
            down: bool,
            resample: bool,
        ) -> None:
            super().__init__()
            self.skips = skips
            self.resnets = nn.ModuleList(
                [ResnetBlock2D(cin + s, cout, temb) for cin, s in zip(ins, skips, strict=True)]
            )
            self.attentions = nn.ModuleList([Transformer2DModel(cout) for _ in ins] if attn else [])
            sampler = Downsample2D(cout) if down else Upsample2D(cout)
            self.sampler_name = "downsamplers" if down else "upsamplers"
            setattr(self, self.sampler_name, nn.ModuleList([sampler] if resample else []))
            self.checkpointing = False

        def _run(self, module: nn.Module, *args: torch.Tensor) -> torch.Tensor:
            if self.checkpointing and self.training:
                out: torch.Tensor = checkpoint(module, *args, use_reentrant=False)
                return out
            result: torch.Tensor = module(*args)
            return result

        def forward(
            self,
            x: torch.Tensor,
            temb: torch.Tensor,
            context: torch.Tensor,
            skips: list[torch.Tensor],
        ) -> torch.Tensor:
            """Down blocks append their outputs to ``skips``; up blocks pop from it."""
            for i, resnet in enumerate(self.resnets):
                if self.skips[i]:
                    x = torch.cat([x, skips.pop()], dim=1)
                x = self._run(resnet, x, temb)
                if len(self.attentions):
                    x = self._run(self.attentions[i], x, context)
                if not self.skips[i]:
                    skips.append(x)
            for sampler in getattr(self, self.sampler_name):
                x = sampler(x)
                if not any(self.skips):
                    skips.append(x)
            return x

    class MidBlock(nn.Module):
        def __init__(self, dim: int, temb: int) -> None:
            super().__init__()
            self.resnets = nn.ModuleList([ResnetBlock2D(dim, dim, temb) for _ in range(2)])
            self.attentions = nn.ModuleList([Transformer2DModel(dim)])
            self.checkpointing = False

        def forward(
            self, x: torch.Tensor, temb: torch.Tensor, context: torch.Tensor
        ) -> torch.Tensor:
            modules: list[nn.Module] = [self.resnets[0], self.attentions[0], self.resnets[1]]
            for module, arg in zip(modules, (temb, context, temb), strict=True):
                if self.checkpointing and self.training:
                    x = checkpoint(module, x, arg, use_reentrant=False)
                else:
                    x = module(x, arg)
            return x

    class UNet2DConditionModel(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            chans: tuple[int, ...] = config["block_out_channels"]
            layers: int = config["layers_per_block"]
            self.time_channels = chans[0]
            temb = chans[0] * 4
            self.conv_in = nn.Conv2d(config["in_channels"], chans[0], 3, padding=1)
            self.time_embedding = nn.Sequential()
            self.time_embedding.add_module("linear_1", nn.Linear(chans[0], temb))
            self.time_embedding.add_module("act", nn.SiLU())
            self.time_embedding.add_module("linear_2", nn.Linear(temb, temb))
            skip_chans = [chans[0]]
            self.down_blocks = nn.ModuleList()
            for i, kind in enumerate(config["down_blocks"]):
                last = i == len(chans) - 1
                cin = chans[max(i - 1, 0)]
                ins = [cin] + [chans[i]] * (layers - 1)
                self.down_blocks.append(
                    Block(
                        ins,
                        [0] * layers,
                        chans[i],
                        temb,
                        kind.startswith("CrossAttn"),
                        True,
                        not last,
                    )
                )
                skip_chans += [chans[i]] * (layers + (0 if last else 1))
            self.mid_block = MidBlock(chans[-1], temb)
            self.up_blocks = nn.ModuleList()
            prev = chans[-1]
            for i, kind in enumerate(config["up_blocks"]):
                cout = chans[-1 - i]
                skips = [skip_chans.pop() for _ in range(layers + 1)]
                ins = [prev] + [cout] * layers
                self.up_blocks.append(
                    Block(
                        ins,
                        skips,
                        cout,
                        temb,
                        kind.startswith("CrossAttn"),
                        False,
                        i < len(chans) - 1,
                    )
                )
                prev = cout
            self.conv_norm_out = nn.GroupNorm(groups, chans[0], eps=eps)
            self.conv_out = nn.Conv2d(chans[0], config["out_channels"], 3, padding=1)

        def gradient_checkpointing_enable(
            self, gradient_checkpointing_kwargs: dict[str, Any] | None = None
        ) -> None:
            """Recompute each resnet and transformer in the backward pass (as ``diffusers``
            does); ``gradient_checkpointing_kwargs`` is accepted for the HF-style call."""
            del gradient_checkpointing_kwargs
            for module in self.modules():
                if isinstance(module, (Block, MidBlock)):
                    module.checkpointing = True

        def time_proj(self, timestep: torch.Tensor) -> torch.Tensor:
            """Sinusoidal embedding, cos first (``flip_sin_to_cos=True``, shift 0)."""
            half = self.time_channels // 2
            exponent = (
                -math.log(10000)
                * torch.arange(half, dtype=torch.float32, device=timestep.device)
                / half
            )
            angles = timestep.float()[:, None] * torch.exp(exponent)[None, :]
            return torch.cat([torch.cos(angles), torch.sin(angles)], dim=-1)

        def forward(
            self, sample: torch.Tensor, timestep: torch.Tensor, encoder_hidden_states: torch.Tensor
        ) -> torch.Tensor:
            temb = self.time_embedding(self.time_proj(timestep).to(sample.dtype))
            x = self.conv_in(sample)
            skips = [x]
            for block in self.down_blocks:
                x = block(x, temb, encoder_hidden_states, skips)
            x = self.mid_block(x, temb, encoder_hidden_states)
            for block in self.up_blocks:
                x = block(x, temb, encoder_hidden_states, skips)
            out: torch.Tensor = self.conv_out(F.silu(self.conv_norm_out(x)))
            return out

    return UNet2DConditionModel()


def _make_sd_unet() -> Workload:
    latent = IMAGE_SIZE // VAE_FACTOR

    def build(run: RunConfig) -> BuiltWorkload:
        import torch

        with default_dtype(weight_dtype(run)):
            model = _build_unet(SD15_UNET)
        device = model_device(model)
        betas = (
            torch.linspace(
                BETA_START**0.5, BETA_END**0.5, TRAIN_TIMESTEPS, dtype=torch.float32, device=device
            )
            ** 2
        )
        alphas_cumprod = torch.cumprod(1.0 - betas, dim=0)

        def make_batch(batch_size: int, seq_len: int | None) -> dict[str, Any]:
            """Frozen-encoder outputs (VAE latents, CLIP text states), then the forward
            diffusion step of training: sampled timesteps and noise, noisy latents."""
            dtype = next(model.parameters()).dtype
            shape = (batch_size, LATENT_CHANNELS, latent, latent)
            latents = torch.randn(shape, device=device)
            noise = torch.randn(shape, device=device)
            timesteps = torch.randint(0, TRAIN_TIMESTEPS, (batch_size,), device=device)
            abar = alphas_cumprod[timesteps][:, None, None, None]
            noisy = abar.sqrt() * latents + (1.0 - abar).sqrt() * noise
            text = torch.randn(batch_size, TEXT_TOKENS, TEXT_DIM, device=device, dtype=dtype)
            return {
                "sample": noisy.to(dtype),
                "timestep": timesteps,
                "encoder_hidden_states": text,
                "labels": noise.to(dtype),
            }

        def loss(model: torch.nn.Module, batch: Any) -> torch.Tensor:
            """Epsilon prediction: MSE between the predicted and the sampled noise."""
            pred = model(batch["sample"], batch["timestep"], batch["encoder_hidden_states"])
            value: torch.Tensor = torch.nn.functional.mse_loss(
                pred.float(), batch["labels"].float()
            )
            return value

        return BuiltWorkload(
            model=model,
            make_batch=make_batch,
            loss=loss,
            units_per_sample=lambda seq_len: 1,
            lora_targets=SD_TARGETS,
        )

    info = WorkloadInfo(
        name="sd-unet",
        family="diffusion",
        task="text-to-image latent diffusion (UNet training)",
        description=(
            "Stable Diffusion v1.5 denoising UNet (860M): channels (320, 640, 1280, 1280), 2 "
            "resnets per level, cross-attention transformers (8 heads, GEGLU) on 77x768 CLIP "
            "states at the three outer levels; 512x512 images as 4x64x64 latents, MSE on the "
            "predicted noise. The frozen VAE and text encoder are not part of the trained model "
            "(their outputs are synthetic)."
        ),
        input_desc=(
            f"{LATENT_CHANNELS}x{latent}x{latent} latent of a {IMAGE_SIZE}x{IMAGE_SIZE} "
            f"image, {TEXT_TOKENS}x{TEXT_DIM} text-encoder states"
        ),
        throughput_unit="images",
        default_batch_size=8,
        params_published=SD_UNET_PARAMS,
        params_source=(
            "859.52M: CompVis/stable-diffusion (ldm/models/diffusion/ddpm.py, count_params) "
            "prints 'DiffusionWrapper has 859.52 M params.' for configs/stable-diffusion/"
            "v1-inference.yaml; the diffusers UNet2DConditionModel of "
            "runwayml/stable-diffusion-v1-5 (unet/config.json) counts 859,520,964"
        ),
        reference="https://arxiv.org/abs/2112.10752",
    )
    return Workload(info=info, build=build)


register(_make_sd_unet())
