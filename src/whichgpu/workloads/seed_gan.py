"""GANs of Lambda Labs' 2020 GPU benchmark: pix2pixHD (Cityscapes 2048x1024) and StyleGAN (FFHQ
1024x1024), written in plain PyTorch after the authors' reference implementations.

Over 600 lines because it restates two reference GANs layer by layer (pix2pixHD, StyleGAN),
each with its own generator, discriminator and losses.

Both are trained by alternating a generator and a discriminator update. A traced step runs
one forward pass whose scalar loss is the *sum* of the generator and the discriminator losses,
then one backward pass and one optimizer step over both networks: that stands for the two
alternating updates (same operators, same weight and optimizer-state memory; the activations
of both halves are held at once, a small overestimate of peak memory where the authors free
the generator half before the discriminator half). Throughput is counted in images.

torch is imported inside the builders only; listing the workloads never imports it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from whichgpu.schema import RunConfig, WorkloadInfo
from whichgpu.workloads.base import Batch, BuiltWorkload, Workload
from whichgpu.workloads.hf import default_dtype, weight_dtype
from whichgpu.workloads.registry import register

if TYPE_CHECKING:
    import torch

# --- pix2pixHD ---------------------------------------------------------------------------------

P2P_HEIGHT, P2P_WIDTH = 1024, 2048
"""Cityscapes at full resolution, as the repository's 2048x1024 setting trains it."""
P2P_LABEL_NC = 35
"""Cityscapes label ids (``--label_nc 35``, the repository's default)."""
P2P_NGF = 32
"""``--ngf 32`` with ``--netG local``: the global generator gets 2 x 32 = 64 filters."""
P2P_N_DOWNSAMPLE_GLOBAL = 4
P2P_N_BLOCKS_GLOBAL = 9
P2P_N_BLOCKS_LOCAL = 3
P2P_NDF = 64
P2P_N_LAYERS_D = 3
P2P_NUM_D = 3
P2P_LAMBDA_FEAT = 10.0
"""Weight of the feature-matching and VGG losses (``--lambda_feat``, repository default)."""
P2P_VGG_WEIGHTS = (1.0 / 32, 1.0 / 16, 1.0 / 8, 1.0 / 4, 1.0)

P2P_G_PARAMS = 182_857_059
"""LocalEnhancer(36 -> 3, ngf 32, 4 downsamplings, 9 + 3 residual blocks), trainable."""
P2P_D_PARAMS = 8_404_803
"""3 x NLayerDiscriminator(39 channels, ndf 64, 3 layers), trainable."""
P2P_VGG_PARAMS = 12_944_960
"""VGG19 conv1_1 .. conv5_1 (frozen, ``requires_grad=False``), the perceptual-loss network."""


def _add(terms: Iterable[torch.Tensor]) -> torch.Tensor:
    """Sum of scalar losses, left to right (``loss += ...`` in the reference)."""
    it = iter(terms)
    total = next(it)
    for term in it:
        total = total + term
    return total


def _build_pix2pixhd(run: RunConfig) -> torch.nn.Module:
    import torch
    import torch.nn.functional as F
    from torch import nn

    def norm(channels: int) -> nn.Module:
        return nn.InstanceNorm2d(channels, affine=False)  # the repository's --norm instance

    class ResnetBlock(nn.Module):
        def __init__(self, dim: int) -> None:
            super().__init__()
            self.conv_block = nn.Sequential(
                nn.ReflectionPad2d(1),
                nn.Conv2d(dim, dim, 3),
                norm(dim),
                nn.ReLU(True),
                nn.ReflectionPad2d(1),
                nn.Conv2d(dim, dim, 3),
                norm(dim),
            )

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = x + self.conv_block(x)
            return out

    def global_trunk(input_nc: int, ngf: int) -> list[nn.Module]:
        """GlobalGenerator.model without its last three layers (pad, 7x7 conv, tanh)."""
        layers: list[nn.Module] = [
            nn.ReflectionPad2d(3),
            nn.Conv2d(input_nc, ngf, 7),
            norm(ngf),
            nn.ReLU(True),
        ]
        for i in range(P2P_N_DOWNSAMPLE_GLOBAL):
            c = ngf * 2**i
            layers += [nn.Conv2d(c, 2 * c, 3, stride=2, padding=1), norm(2 * c), nn.ReLU(True)]
        c = ngf * 2**P2P_N_DOWNSAMPLE_GLOBAL
        layers += [ResnetBlock(c) for _ in range(P2P_N_BLOCKS_GLOBAL)]
        for i in range(P2P_N_DOWNSAMPLE_GLOBAL):
            c = ngf * 2 ** (P2P_N_DOWNSAMPLE_GLOBAL - i)
            layers += [
                nn.ConvTranspose2d(c, c // 2, 3, stride=2, padding=1, output_padding=1),
                norm(c // 2),
                nn.ReLU(True),
            ]
        return layers

    class LocalEnhancer(nn.Module):
        """``networks.LocalEnhancer`` with one enhancer: global net at half resolution."""

        def __init__(self, input_nc: int, output_nc: int, ngf: int) -> None:
            super().__init__()
            self.model = nn.Sequential(*global_trunk(input_nc, ngf * 2))
            self.model1_1 = nn.Sequential(
                nn.ReflectionPad2d(3),
                nn.Conv2d(input_nc, ngf, 7),
                norm(ngf),
                nn.ReLU(True),
                nn.Conv2d(ngf, ngf * 2, 3, stride=2, padding=1),
                norm(ngf * 2),
                nn.ReLU(True),
            )
            self.model1_2 = nn.Sequential(
                *[ResnetBlock(ngf * 2) for _ in range(P2P_N_BLOCKS_LOCAL)],
                nn.ConvTranspose2d(ngf * 2, ngf, 3, stride=2, padding=1, output_padding=1),
                norm(ngf),
                nn.ReLU(True),
                nn.ReflectionPad2d(3),
                nn.Conv2d(ngf, output_nc, 7),
                nn.Tanh(),
            )
            self.downsample = nn.AvgPool2d(3, stride=2, padding=1, count_include_pad=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            coarse = self.model(self.downsample(x))
            out: torch.Tensor = self.model1_2(self.model1_1(x) + coarse)
            return out

    class NLayerDiscriminator(nn.Module):
        """PatchGAN with intermediate features kept (``getIntermFeat``, for feature matching)."""

        def __init__(self, input_nc: int) -> None:
            super().__init__()
            pad = math.ceil((4 - 1) / 2)
            stages: list[list[nn.Module]] = [
                [nn.Conv2d(input_nc, P2P_NDF, 4, stride=2, padding=pad), nn.LeakyReLU(0.2, True)]
            ]
            nf = P2P_NDF
            for _ in range(1, P2P_N_LAYERS_D):
                prev, nf = nf, min(nf * 2, 512)
                stages.append(
                    [
                        nn.Conv2d(prev, nf, 4, stride=2, padding=pad),
                        norm(nf),
                        nn.LeakyReLU(0.2, True),
                    ]
                )
            prev, nf = nf, min(nf * 2, 512)
            stages.append(
                [nn.Conv2d(prev, nf, 4, stride=1, padding=pad), norm(nf), nn.LeakyReLU(0.2, True)]
            )
            stages.append([nn.Conv2d(nf, 1, 4, stride=1, padding=pad)])
            self.stages = nn.ModuleList(nn.Sequential(*s) for s in stages)

        def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
            feats = []
            for stage in self.stages:
                x = stage(x)
                feats.append(x)
            return feats

    class MultiscaleDiscriminator(nn.Module):
        def __init__(self, input_nc: int) -> None:
            super().__init__()
            self.scales = nn.ModuleList(NLayerDiscriminator(input_nc) for _ in range(P2P_NUM_D))
            self.downsample = nn.AvgPool2d(3, stride=2, padding=1, count_include_pad=False)

        def forward(self, x: torch.Tensor) -> list[list[torch.Tensor]]:
            result = []
            for i, scale in enumerate(self.scales):
                result.append(scale(x))
                if i != len(self.scales) - 1:
                    x = self.downsample(x)
            return result

    def vgg_block(cin: int, cout: int) -> list[nn.Module]:
        return [nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU(True)]

    class Vgg19(nn.Module):
        """torchvision ``vgg19().features[:30]`` in the repository's five slices, frozen."""

        def __init__(self) -> None:
            super().__init__()
            pool = nn.MaxPool2d(2, 2)
            self.slices = nn.ModuleList(
                [
                    nn.Sequential(*vgg_block(3, 64)),
                    nn.Sequential(*vgg_block(64, 64), pool, *vgg_block(64, 128)),
                    nn.Sequential(*vgg_block(128, 128), pool, *vgg_block(128, 256)),
                    nn.Sequential(
                        *vgg_block(256, 256),
                        *vgg_block(256, 256),
                        *vgg_block(256, 256),
                        pool,
                        *vgg_block(256, 512),
                    ),
                    nn.Sequential(
                        *vgg_block(512, 512),
                        *vgg_block(512, 512),
                        *vgg_block(512, 512),
                        pool,
                        *vgg_block(512, 512),
                    ),
                ]
            )
            for p in self.parameters():
                p.requires_grad = False

        def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
            outs = []
            for s in self.slices:
                x = s(x)
                outs.append(x)
            return outs

    class Pix2PixHD(nn.Module):
        """Generator, multi-scale discriminator and VGG19; ``forward`` returns the step's loss."""

        def __init__(self) -> None:
            super().__init__()
            self.netG = LocalEnhancer(P2P_LABEL_NC + 1, 3, P2P_NGF)
            self.netD = MultiscaleDiscriminator(P2P_LABEL_NC + 1 + 3)
            self.vgg = Vgg19()

        def encode_input(self, label: torch.Tensor, inst: torch.Tensor) -> torch.Tensor:
            """One-hot label map plus instance-boundary map (``Pix2PixHDModel.encode_input``)."""
            dtype = next(self.netG.parameters()).dtype
            n, _, h, w = label.shape
            one_hot = torch.zeros(n, P2P_LABEL_NC, h, w, device=label.device, dtype=dtype)
            one_hot = one_hot.scatter_(1, label, 1.0)
            edge = torch.zeros_like(inst, dtype=torch.bool)
            dx = inst[:, :, :, 1:] != inst[:, :, :, :-1]
            dy = inst[:, :, 1:, :] != inst[:, :, :-1, :]
            edge[:, :, :, 1:] |= dx
            edge[:, :, :, :-1] |= dx
            edge[:, :, 1:, :] |= dy
            edge[:, :, :-1, :] |= dy
            return torch.cat((one_hot, edge.to(dtype)), dim=1)

        def forward(
            self, label: torch.Tensor, inst: torch.Tensor, image: torch.Tensor
        ) -> torch.Tensor:
            input_label = self.encode_input(label, inst)
            fake = self.netG(input_label)
            # Discriminator losses (LSGAN: mean squared error against 0 / 1 targets); the
            # image pool is off (--pool_size 0, the default), so the fake is used as is.
            pred_fake_pool = self.netD(torch.cat((input_label, fake.detach()), dim=1))
            pred_real = self.netD(torch.cat((input_label, image), dim=1))
            loss_d_fake = _add(F.mse_loss(p[-1], torch.zeros_like(p[-1])) for p in pred_fake_pool)
            loss_d_real = _add(F.mse_loss(p[-1], torch.ones_like(p[-1])) for p in pred_real)
            # Generator: GAN loss, discriminator feature matching, VGG perceptual loss.
            pred_fake = self.netD(torch.cat((input_label, fake), dim=1))
            loss_g_gan = _add(F.mse_loss(p[-1], torch.ones_like(p[-1])) for p in pred_fake)
            feat_weight = 4.0 / (P2P_N_LAYERS_D + 1) / P2P_NUM_D * P2P_LAMBDA_FEAT
            loss_g_feat = _add(
                feat_weight * F.l1_loss(pf[j], pr[j].detach())
                for pf, pr in zip(pred_fake, pred_real, strict=True)
                for j in range(len(pf) - 1)
            )
            x_vgg, y_vgg = self.vgg(fake), self.vgg(image)
            loss_g_vgg = (
                _add(
                    wt * F.l1_loss(xv, yv.detach())
                    for wt, xv, yv in zip(P2P_VGG_WEIGHTS, x_vgg, y_vgg, strict=True)
                )
                * P2P_LAMBDA_FEAT
            )
            loss_g = loss_g_gan + loss_g_feat + loss_g_vgg
            loss_d = (loss_d_fake + loss_d_real) * 0.5
            total: torch.Tensor = loss_g + loss_d
            return total

    with default_dtype(weight_dtype(run)):
        return Pix2PixHD()


def _pix2pixhd_batch(model: torch.nn.Module, batch_size: int) -> dict[str, Any]:
    import torch

    param = next(model.parameters())
    shape = (batch_size, 1, P2P_HEIGHT, P2P_WIDTH)
    return {
        "label": torch.randint(0, P2P_LABEL_NC, shape, device=param.device),
        # Cityscapes instance ids (class id x 1000 + instance index for countable classes).
        "inst": torch.randint(0, 34_000, shape, device=param.device, dtype=torch.int32),
        "image": torch.rand(
            batch_size, 3, P2P_HEIGHT, P2P_WIDTH, device=param.device, dtype=param.dtype
        )
        * 2
        - 1,
    }


# --- StyleGAN ----------------------------------------------------------------------------------

SG_RESOLUTION = 1024
SG_LATENT = 512
SG_MAPPING_LAYERS = 8
SG_MAPPING_LRMUL = 0.01
SG_FMAP_BASE = 8192
SG_FMAP_MAX = 512
SG_MBSTD_GROUP = 4
SG_STYLE_MIXING_PROB = 0.9
SG_DLATENT_AVG_BETA = 0.995
SG_R1_GAMMA = 10.0
"""R1 weight of the FFHQ configuration (``train.py``: ``D_logistic_simplegp, r1_gamma=10``)."""
SG_G_EMA_BETA = 0.5 ** (32 / 10_000)
"""Gs smoothing: half-life 10 kimg (``G_smoothing_kimg``) at the 1024x1024 minibatch of 32 (8
GPUs x 4, ``train.py``); its value does not change the cost."""

SG_G_PARAMS = 26_219_627
"""G_style trainable variables: mapping + synthesis with every ToRGB_lod layer."""
SG_D_PARAMS = 23_087_249
"""D_basic trainable variables with every FromRGB_lod layer."""


def _nf(stage: int) -> int:
    return min(SG_FMAP_BASE >> stage, SG_FMAP_MAX)


def _build_stylegan(run: RunConfig) -> torch.nn.Module:
    import torch
    import torch.nn.functional as F
    from torch import nn

    log2 = int(math.log2(SG_RESOLUTION))
    num_layers = 2 * log2 - 2
    sqrt2 = math.sqrt(2.0)

    def lrelu(x: torch.Tensor) -> torch.Tensor:
        return F.leaky_relu(x, 0.2)

    class Dense(nn.Module):
        """Equalised-learning-rate dense layer (``dense`` + ``apply_bias``, ``use_wscale``)."""

        def __init__(self, fin: int, fout: int, gain: float = sqrt2, lrmul: float = 1.0) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.randn(fout, fin) / lrmul)
            self.bias = nn.Parameter(torch.zeros(fout))
            self.w_mul = gain / math.sqrt(fin) * lrmul
            self.b_mul = lrmul

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.linear(x, self.weight * self.w_mul, self.bias * self.b_mul)

    class Conv(nn.Module):
        """Equalised-learning-rate convolution with the repository's fused up/down variants."""

        def __init__(
            self,
            cin: int,
            cout: int,
            kernel: int,
            gain: float = sqrt2,
            mode: str = "same",
            bias: bool = True,
        ) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.randn(cout, cin, kernel, kernel))
            self.bias = nn.Parameter(torch.zeros(cout)) if bias else None
            self.w_mul = gain / math.sqrt(cin * kernel * kernel)
            self.mode = mode

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            w = self.weight * self.w_mul
            if self.mode == "up":  # upscale2d_conv2d, fused: 4x4 transposed conv, stride 2
                w = F.pad(w, (1, 1, 1, 1))
                w = w[:, :, 1:, 1:] + w[:, :, :-1, 1:] + w[:, :, 1:, :-1] + w[:, :, :-1, :-1]
                x = F.conv_transpose2d(x, w.transpose(0, 1), stride=2, padding=1)
            elif self.mode == "down":  # conv2d_downscale2d, fused: 4x4 conv, stride 2
                w = F.pad(w, (1, 1, 1, 1))
                w = (
                    w[:, :, 1:, 1:] + w[:, :, :-1, 1:] + w[:, :, 1:, :-1] + w[:, :, :-1, :-1]
                ) * 0.25
                x = F.conv2d(x, w, stride=2, padding=1)
            elif self.mode == "conv-down":  # conv2d, then downscale2d (2x2 box filter)
                x = F.avg_pool2d(F.conv2d(x, w, padding=w.shape[-1] // 2), 2)
            else:
                x = F.conv2d(x, w, padding=w.shape[-1] // 2)
            if self.bias is not None:
                x = x + self.bias.view(1, -1, 1, 1)
            return x

    class _BlurFn(torch.autograd.Function):
        """The filter with the reference's custom gradients: its gradient (and the gradient of
        that, for R1) is the same symmetric filter again, one depthwise convolution each."""

        @staticmethod
        def forward(ctx: Any, x: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
            ctx.save_for_backward(kernel)
            return F.conv2d(x, kernel.to(x.dtype), padding=1, groups=kernel.shape[0])

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
            (kernel,) = ctx.saved_tensors
            return blur(grad, kernel), None

    blur: Callable[..., torch.Tensor] = _BlurFn.apply

    class Blur(nn.Module):
        """Depthwise [1, 2, 1] x [1, 2, 1] / 16 low-pass filter (``blur2d``)."""

        def __init__(self, channels: int) -> None:
            super().__init__()
            f = torch.tensor([1.0, 2.0, 1.0])
            k = (f[:, None] * f[None, :]) / 16
            self.register_buffer(
                "kernel", k.expand(channels, 1, 3, 3).contiguous(), persistent=False
            )

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return blur(x, self.kernel)

    def upscale(x: torch.Tensor) -> torch.Tensor:
        return F.interpolate(x, scale_factor=2.0, mode="nearest")

    class Epilogue(nn.Module):
        """Noise, bias, leaky ReLU, instance norm, AdaIN style modulation (``layer_epilogue``)."""

        def __init__(self, channels: int) -> None:
            super().__init__()
            self.noise_weight = nn.Parameter(torch.zeros(channels))
            self.bias = nn.Parameter(torch.zeros(channels))
            self.style = Dense(SG_LATENT, 2 * channels, gain=1.0)

        def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            n, c, h, wd = x.shape
            noise = torch.randn(n, 1, h, wd, device=x.device, dtype=x.dtype)
            x = x + noise * self.noise_weight.view(1, -1, 1, 1)
            x = lrelu(x + self.bias.view(1, -1, 1, 1))
            x = x - x.mean(dim=(2, 3), keepdim=True)
            x = x * torch.rsqrt(x.square().mean(dim=(2, 3), keepdim=True) + 1e-8)
            style: torch.Tensor = self.style(w).view(n, 2, c, 1, 1)
            return x * (style[:, 0] + 1) + style[:, 1]

    class Mapping(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.dense = nn.ModuleList(
                Dense(SG_LATENT, SG_LATENT, lrmul=SG_MAPPING_LRMUL)
                for _ in range(SG_MAPPING_LAYERS)
            )

        def forward(self, z: torch.Tensor) -> torch.Tensor:
            x = z * torch.rsqrt(z.square().mean(dim=1, keepdim=True) + 1e-8)
            for layer in self.dense:
                x = lrelu(layer(x))
            return x

    class Synthesis(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.const = nn.Parameter(torch.ones(1, _nf(1), 4, 4))
            self.epi0 = Epilogue(_nf(1))
            # The synthesis convolutions have no bias of their own: the epilogue adds it.
            self.conv4 = Conv(_nf(1), _nf(1), 3, bias=False)
            self.epi1 = Epilogue(_nf(1))
            self.up = nn.ModuleList()
            self.blur = nn.ModuleList()
            self.conv = nn.ModuleList()
            self.epi = nn.ModuleList()
            for res in range(3, log2 + 1):
                cin, cout = _nf(res - 2), _nf(res - 1)
                fused = 2**res >= 128  # fused_scale='auto': output side >= 128
                self.up.append(Conv(cin, cout, 3, mode="up" if fused else "same", bias=False))
                self.blur.append(Blur(cout))
                self.conv.append(Conv(cout, cout, 3, bias=False))
                self.epi.extend([Epilogue(cout), Epilogue(cout)])
            # One ToRGB per level of detail, as the progressive-growing graph holds them; at
            # full resolution (lod 0) only the last one is used.
            self.torgb = nn.ModuleList(
                Conv(_nf(res - 1), 3, 1, gain=1.0) for res in range(2, log2 + 1)
            )
            self.fused = [2**res >= 128 for res in range(3, log2 + 1)]

        def forward(self, w: torch.Tensor) -> torch.Tensor:
            x = self.const.expand(w.shape[0], -1, -1, -1)
            x = self.epi0(x, w[:, 0])
            x = self.epi1(self.conv4(x), w[:, 1])
            for i in range(len(self.conv)):
                up = self.up[i](x if self.fused[i] else upscale(x))
                x = self.epi[2 * i](self.blur[i](up), w[:, 2 * i + 2])
                x = self.epi[2 * i + 1](self.conv[i](x), w[:, 2 * i + 3])
            out: torch.Tensor = self.torgb[-1](x)
            return out

    class Generator(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mapping = Mapping()
            self.synthesis = Synthesis()
            self.register_buffer("dlatent_avg", torch.zeros(SG_LATENT))

        def forward(self, z: torch.Tensor) -> torch.Tensor:
            n = z.shape[0]
            w = self.mapping(z)
            if self.training:
                with torch.no_grad():  # moving average of W (for truncation at test time)
                    avg: torch.Tensor = self.dlatent_avg  # type: ignore[assignment]
                    avg.copy_(torch.lerp(w.mean(0).to(avg.dtype), avg, SG_DLATENT_AVG_BETA))
                # Style mixing regularisation: a second latent takes over from a random layer
                # (with probability 0.9), drawn on the device: no data-dependent control flow.
                w2 = self.mapping(torch.randn_like(z))
                mix = torch.rand((), device=z.device) < SG_STYLE_MIXING_PROB
                cut = torch.randint(1, num_layers, (), device=z.device)
                cutoff = torch.where(mix, cut, torch.full_like(cut, num_layers))
                idx = torch.arange(num_layers, device=z.device).view(1, -1, 1)
                ws = torch.where(idx < cutoff, w[:, None], w2[:, None])
            else:
                ws = w[:, None].expand(n, num_layers, -1)
            out: torch.Tensor = self.synthesis(ws)
            return out

    class Discriminator(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            # One FromRGB per level of detail (lod 0 = full resolution is the one used).
            self.fromrgb = nn.ModuleList(Conv(3, _nf(res - 1), 1) for res in range(log2, 1, -1))
            self.conv0 = nn.ModuleList()
            self.blur = nn.ModuleList()
            self.down = nn.ModuleList()
            for res in range(log2, 2, -1):
                c, cout = _nf(res - 1), _nf(res - 2)
                fused = 2**res >= 128  # fused_scale='auto': input side >= 128
                self.conv0.append(Conv(c, c, 3))
                self.blur.append(Blur(c))
                self.down.append(Conv(c, cout, 3, mode="down" if fused else "conv-down"))
            self.conv4 = Conv(_nf(1) + 1, _nf(1), 3)
            self.dense0 = Dense(_nf(1) * 16, _nf(0))
            self.dense1 = Dense(_nf(0), 1, gain=1.0)

        def forward(self, img: torch.Tensor) -> torch.Tensor:
            x = lrelu(self.fromrgb[0](img))
            for i in range(len(self.conv0)):
                x = lrelu(self.conv0[i](x))
                x = lrelu(self.down[i](self.blur[i](x)))
            x = minibatch_stddev(x)
            x = lrelu(self.conv4(x))
            x = lrelu(self.dense0(x.flatten(1)))
            out: torch.Tensor = self.dense1(x)
            return out

    def minibatch_stddev(x: torch.Tensor) -> torch.Tensor:
        """Append the group standard deviation as a feature map (group 4, one feature).

        The reference needs the batch to be divisible by the group (or smaller than it); other
        batches use the largest group size of at most 4 that divides the batch.
        """
        n, c, h, w = x.shape
        g = max(d for d in range(1, min(SG_MBSTD_GROUP, n) + 1) if n % d == 0)
        y = x.float().reshape(g, -1, 1, c, h, w)
        y = y - y.mean(dim=0, keepdim=True)
        y = torch.sqrt(y.square().mean(dim=0) + 1e-8)
        y = y.mean(dim=(2, 3, 4), keepdim=True).mean(dim=2)
        y = y.to(x.dtype).repeat(g, 1, h, w)
        return torch.cat((x, y), dim=1)

    class StyleGAN(nn.Module):
        """G, D and G's moving average Gs; ``forward`` returns the step's summed loss."""

        def __init__(self) -> None:
            super().__init__()
            self.G = Generator()
            self.D = Discriminator()
            for i, p in enumerate(self.G.parameters()):
                self.register_buffer(f"gs_{i}", p.detach().clone())

        def forward(
            self, latents: torch.Tensor, latents_d: torch.Tensor, reals: torch.Tensor
        ) -> torch.Tensor:
            # G step (G_logistic_nonsaturating): softplus(-D(G(z))).
            fake = self.G(latents)
            loss_g = F.softplus(-self.D(fake)).mean()
            # D step (D_logistic_simplegp): a fresh fake (no gradient to G), the reals, R1.
            with torch.no_grad():
                fake_d = self.G(latents_d)
            reals = reals.detach().requires_grad_(True)
            real_scores = self.D(reals)
            fake_scores = self.D(fake_d)
            (grad,) = torch.autograd.grad(real_scores.sum(), reals, create_graph=True)
            r1 = grad.float().square().sum(dim=(1, 2, 3))
            loss_d = (F.softplus(fake_scores) + F.softplus(-real_scores)).flatten()
            loss_d = (loss_d + r1 * (SG_R1_GAMMA * 0.5)).mean()
            # Gs = lerp(G, Gs, beta) after each G step (setup_as_moving_average_of).
            with torch.no_grad():
                gs = [b for name, b in self.named_buffers() if name.startswith("gs_")]
                torch._foreach_lerp_(
                    gs, [p.detach() for p in self.G.parameters()], 1 - SG_G_EMA_BETA
                )
            total: torch.Tensor = loss_g + loss_d
            return total

    with default_dtype(weight_dtype(run)):
        return StyleGAN()


def _stylegan_batch(model: torch.nn.Module, batch_size: int) -> dict[str, Any]:
    import torch

    param = next(model.parameters())
    return {
        "latents": torch.randn(batch_size, SG_LATENT, device=param.device, dtype=param.dtype),
        "latents_d": torch.randn(batch_size, SG_LATENT, device=param.device, dtype=param.dtype),
        "reals": torch.rand(
            batch_size, 3, SG_RESOLUTION, SG_RESOLUTION, device=param.device, dtype=param.dtype
        )
        * 2
        - 1,
    }


# --- registration ------------------------------------------------------------------------------


def _loss(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """Generator + discriminator losses of one step, summed into one scalar.

    The sum stands for the authors' alternating updates: its backward pass computes the
    gradients of both networks that the two separate backward passes compute.
    """
    out: torch.Tensor = model(**batch)
    return out


def _pix2pixhd(run: RunConfig) -> BuiltWorkload:
    model = _build_pix2pixhd(run)
    return BuiltWorkload(
        model=model,
        make_batch=lambda b, s: _pix2pixhd_batch(model, b),
        loss=_loss,
        units_per_sample=lambda s: 1,
    )


def _stylegan(run: RunConfig) -> BuiltWorkload:
    model = _build_stylegan(run)
    return BuiltWorkload(
        model=model,
        make_batch=lambda b, s: _stylegan_batch(model, b),
        loss=_loss,
        units_per_sample=lambda s: 1,
    )


register(
    Workload(
        info=WorkloadInfo(
            name="pix2pixhd",
            family="seed_gan",
            task="image-to-image translation (GAN)",
            description=(
                "pix2pixHD: global generator (ngf 64, 4 downsamplings, 9 residual blocks) + one "
                "local enhancer (ngf 32, 3 residual blocks), 3 multi-scale PatchGAN discriminators "
                "(ndf 64, 3 layers); LSGAN + feature matching + VGG19 perceptual loss; Cityscapes "
                "label map (35 classes one-hot + instance edges) at 2048x1024"
            ),
            input_desc="2048x1024 label map + instance map + 3x1024x2048 image",
            throughput_unit="images",
            default_batch_size=1,
            params_published=P2P_G_PARAMS + P2P_D_PARAMS,
            params_source=(
                "not printed in the paper; counted from NVIDIA/pix2pixHD models/networks.py "
                "(LocalEnhancer G 182,857,059 with --netG local --ngf 32 --n_downsample_global 4; "
                "MultiscaleDiscriminator D 8,404,803 with --num_D 3, 39 input channels); "
                "trainable only: the frozen VGG19 loss network (12,944,960) is not counted"
            ),
            reference="https://github.com/NVIDIA/pix2pixHD",
        ),
        build=_pix2pixhd,
    )
)

register(
    Workload(
        info=WorkloadInfo(
            name="stylegan",
            family="seed_gan",
            task="unconditional image generation (GAN)",
            description=(
                "StyleGAN: 8x512 mapping network, style-based synthesis network (AdaIN, noise "
                "inputs, 4 -> 1024, fmap_base 8192, fmap_max 512) and the progressive-GAN "
                "discriminator; non-saturating logistic loss with R1 (gamma 10), style mixing; "
                "FFHQ 1024x1024"
            ),
            input_desc="3x1024x1024 image (and 512-d latents)",
            throughput_unit="images",
            default_batch_size=4,
            params_published=26_200_000 + 23_100_000,
            params_source=(
                "G 26.2M (Karras et al. 2019, section 2: 'our style-based generator has 26.2M "
                "trainable parameters'); D 23.1M (Karras et al. 2018, Progressive GAN, Table 2, "
                "the discriminator StyleGAN keeps); NVlabs/stylegan training/networks_stylegan.py "
                "gives 26,219,627 + 23,087,249"
            ),
            reference="https://github.com/NVlabs/stylegan",
        ),
        build=_stylegan,
    )
)
