"""NASNet-A Large (6 @ 4032) for ImageNet at 331x331: Lambda Labs' 2020 "NasNet Large".

Written in plain torch.nn after the authors' reference, tensorflow/models
``research/slim/nets/nasnet/nasnet.py`` (``build_nasnet_large`` with ``large_imagenet_config``)
and ``nasnet_utils.py``, cross-checked against Cadene's ``pretrained-models.pytorch``
``nasnet.py``: num_cells 18, num_conv_filters 168, stem_multiplier 3, filter_scaling_rate 2,
num_reduction_layers 2 (reduction cells before cells 6 and 12), skip_reduction_layer_input 1,
dense dropout keep 0.5, drop-path keep 0.7 (scaled by cell depth), batch-norm eps 1e-3,
convolutions without bias.

Cells are the NASNet-A normal and reduction cells of the paper's Figure 4, given as the
operation / hidden-state-index / used-state lists of ``nasnet_utils.py``. TensorFlow's 'SAME'
padding is symmetric padding ``k // 2`` here: same output shapes (331 -> 165 -> 83 -> 42 -> 21 ->
11) and the same work; average pooling excludes the padding, as TensorFlow's does.

Training follows the slim reference (``train_image_classifier.py``): the auxiliary head after
cell 11 (``use_aux_head=1``) adds its cross-entropy with weight 0.4, both with label
smoothing 0.1 (the paper's recipe). Drop-path is applied in training, as the reference does,
with the keep probability at its final (end of training) schedule value; a per-sample mask
never changes a shape. The auxiliary head exists only in training mode, as in the reference.
The published 88.9M parameters count the network without the auxiliary head (about 4.6M
more). Throughput is counted in images.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from whichgpu.schema import RunConfig, WorkloadInfo
from whichgpu.workloads.base import BuiltWorkload, Workload
from whichgpu.workloads.registry import register

if TYPE_CHECKING:
    import torch

IMAGE_SIZE = 331
CLASSES = 1000
PARAMS_PUBLISHED = 88_900_000
"""NASNet-A (6 @ 4032), Zoph et al. 2018, Table 2: 88.9M parameters (no auxiliary head)."""
MACS_PUBLISHED = 23_800_000_000
"""Same table: 23.8B mult-adds per image at 331x331."""
AUX_WEIGHT = 0.4
LABEL_SMOOTHING = 0.1

# NASNet-A cells (nasnet_utils.NasNetANormalCell / NasNetAReductionCell; paper Figure 4):
# operation i reads hidden state INDICES[i] (0: this cell's input, 1: the previous cell's
# output, 2+: earlier blocks); blocks add operation pairs; unused states are concatenated.
NORMAL = (
    ("sep5", "sep3", "sep5", "sep3", "avg", "none", "avg", "avg", "sep3", "none"),
    (0, 1, 1, 1, 0, 1, 1, 1, 0, 0),
    (1, 0, 0, 0, 0, 0, 0),
)
REDUCTION = (
    ("sep5", "sep7", "max", "sep7", "avg", "sep5", "none", "avg", "sep3", "max"),
    (0, 1, 0, 1, 0, 1, 3, 2, 2, 0),
    (1, 1, 1, 0, 0, 0, 0),
)
Spec = tuple[tuple[str, ...], tuple[int, ...], tuple[int, ...]]


def _build_model(
    num_classes: int = CLASSES,
    filters: int = 168,
    num_cells: int = 18,
    stem_multiplier: int = 3,
    drop_path_keep: float = 0.7,
    dense_keep: float = 0.5,
) -> torch.nn.Module:
    """NASNet-A Large (``nasnet.build_nasnet_large``) with random weights."""
    import torch
    from torch import nn

    def bn(c: int) -> nn.BatchNorm2d:
        return nn.BatchNorm2d(c, eps=1e-3)

    def conv_bn(c_in: int, c_out: int, stride: int = 1) -> nn.Sequential:
        """ReLU, 1x1 convolution, batch norm (the cell's input projections)."""
        return nn.Sequential(nn.ReLU(), nn.Conv2d(c_in, c_out, 1, stride, bias=False), bn(c_out))

    def separable(c_in: int, c: int, k: int, stride: int) -> nn.Sequential:
        """``_stacked_separable_conv`` with 2 layers: (ReLU, depthwise, pointwise, BN) x 2."""
        layers: list[nn.Module] = []
        for a, s in ((c_in, stride), (c, 1)):
            layers += [
                nn.ReLU(),
                nn.Conv2d(a, a, k, s, k // 2, groups=a, bias=False),
                nn.Conv2d(a, c, 1, bias=False),
                bn(c),
            ]
        return nn.Sequential(*layers)

    class FactorizedReduction(nn.Module):
        """``factorized_reduction`` with stride 2: two offset 1x1 paths, concatenated."""

        def __init__(self, c_in: int, c_out: int) -> None:
            super().__init__()
            self.path1 = nn.Conv2d(c_in, c_out // 2, 1, bias=False)
            self.path2 = nn.Conv2d(c_in, c_out // 2, 1, bias=False)
            self.bn = bn(c_out)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = torch.relu(x)
            p1 = self.path1(x[:, :, ::2, ::2])
            p2 = self.path2(nn.functional.pad(x, (0, 1, 0, 1))[:, :, 1::2, 1::2])
            out: torch.Tensor = self.bn(torch.cat([p1, p2], 1))
            return out

    class Cell(nn.Module):
        """``NasNetABaseCell``: project the inputs, run the 5 blocks, concat unused states."""

        def __init__(
            self,
            spec: Spec,
            c_cur: int,
            c_prev: int | None,
            prev_stride: int,
            f: int,
            stride: int,
            keep: float,
        ) -> None:
            super().__init__()
            ops, self.indices, used = spec
            self.keep = keep
            self.cur = conv_bn(c_cur, f)
            self.prev: nn.Module
            if c_prev is None:  # first stem cell: the previous state is this cell's input
                c_prev, self.prev = c_cur, nn.Identity()
            elif prev_stride == 2:
                self.prev, c_prev = FactorizedReduction(c_prev, f), f
            elif c_prev != f:
                self.prev, c_prev = conv_bn(c_prev, f), f
            else:
                self.prev = nn.Identity()
            channels = [f, c_prev] + [f] * 5
            self.ops = nn.ModuleList()
            self.drop: list[bool] = []
            for op, idx in zip(ops, self.indices, strict=True):
                s, c_in = (stride if idx < 2 else 1), channels[idx]
                m: nn.Module
                if op.startswith("sep"):
                    m = separable(c_in, f, int(op[3]), s)
                elif op == "none":
                    m = conv_bn(c_in, f, s) if s > 1 or c_in != f else nn.Identity()
                else:
                    pool = (
                        nn.AvgPool2d(3, s, 1, count_include_pad=False)
                        if op == "avg"
                        else nn.MaxPool2d(3, s, 1)
                    )
                    m = (
                        nn.Sequential(pool, nn.Conv2d(c_in, f, 1, bias=False), bn(f))
                        if c_in != f
                        else pool
                    )
                self.ops.append(m)
                self.drop.append(op != "none")
            self.out_states = [i for i, u in enumerate(used) if not u]
            # Unused states already have f channels at the output resolution in NASNet-A
            # Large, so ``_combine_unused_states`` never needs its reduction here.
            assert all(i >= 2 or channels[i] == f for i in self.out_states)

        def drop_path(self, x: torch.Tensor) -> torch.Tensor:
            """``nasnet_utils.drop_path``: zero whole samples, scale the rest by 1/keep."""
            if not self.training or self.keep >= 1.0:
                return x
            mask = torch.floor(
                self.keep + torch.rand(x.shape[0], 1, 1, 1, device=x.device, dtype=x.dtype)
            )
            return x / self.keep * mask

        def forward(self, x: torch.Tensor, prev: torch.Tensor | None) -> torch.Tensor:
            states = [self.cur(x), self.prev(x if prev is None else prev)]
            for b in range(5):
                pair = []
                for i in (2 * b, 2 * b + 1):
                    h = self.ops[i](states[self.indices[i]])
                    pair.append(self.drop_path(h) if self.drop[i] else h)
                states.append(pair[0] + pair[1])
            return torch.cat([states[i] for i in self.out_states], 1)

    class AuxHead(nn.Module):
        """``_build_aux_head``: ReLU, 5x5/3 avg pool, 1x1 to 128, full-size conv to 768, FC."""

        def __init__(self, c_in: int, size: int) -> None:
            super().__init__()
            k = (size - 5) // 3 + 1
            self.body = nn.Sequential(
                nn.ReLU(),
                nn.AvgPool2d(5, 3),
                nn.Conv2d(c_in, 128, 1, bias=False),
                bn(128),
                nn.ReLU(),
                nn.Conv2d(128, 768, k, bias=False),
                bn(768),
                nn.ReLU(),
                nn.Flatten(),
            )
            self.fc = nn.Linear(768, num_classes)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = self.fc(self.body(x))
            return out

    class NASNetALarge(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            stem = 32 * stem_multiplier
            total = num_cells + 4  # TF: num_cells + 2 (reductions) + 2 (ImageNet stem cells)
            reductions = [num_cells * k // 3 for k in (1, 2)]  # calc_reduction_layers: 6, 12
            self.aux_after = reductions[1] - 1
            self.conv0 = nn.Sequential(nn.Conv2d(3, stem, 3, 2, bias=False), bn(stem))
            self.cells = nn.ModuleList()
            self.prev_index: list[int] = []  # which earlier output feeds each cell's "prev"
            # outputs: (channels, resolution level) of the stem conv and every cell so far
            outs: list[tuple[int, int]] = [(stem, 0)]

            def add(spec: Spec, f: int, stride: int, prev_at: int | None) -> None:
                c_cur, level = outs[-1]
                c_prev, prev_stride = None, 1
                if prev_at is not None:
                    c_prev = outs[prev_at][0]
                    prev_stride = 2 if outs[prev_at][1] != level else 1
                cell_num = len(self.cells)
                keep = 1 - (cell_num + 1) / total * (1 - drop_path_keep)
                self.cells.append(Cell(spec, c_cur, c_prev, prev_stride, f, stride, keep))
                self.prev_index.append(-1 if prev_at is None else prev_at % len(outs))
                out_c = f * (6 if spec is NORMAL else 4)
                outs.append((out_c, level + (1 if stride == 2 else 0)))

            f = filters // 4  # filter_scaling 1/4 then 1/2 in the two stem reduction cells
            add(REDUCTION, f, 2, None)
            add(REDUCTION, 2 * f, 2, -2)
            f = filters
            for i in range(num_cells):
                prev_at = len(outs) - 2  # skip_reduction_layer_input: chosen before reducing
                if i in reductions:
                    f *= 2
                    add(REDUCTION, f, 2, prev_at)
                add(NORMAL, f, 1, prev_at)
                if i == self.aux_after:
                    self.aux_cell = len(self.cells) - 1
                    size = (IMAGE_SIZE - 3) // 2 + 1  # the stem conv's 'VALID' output
                    for _ in range(outs[-1][1]):
                        size = (size + 1) // 2  # each 'SAME' stride-2 reduction
                    self.aux = AuxHead(outs[-1][0], size)
            self.dropout = nn.Dropout(1 - dense_keep)
            self.fc = nn.Linear(outs[-1][0], num_classes)

        def forward(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
            """Logits, and the auxiliary head's logits in training mode (else ``None``)."""
            outs = [self.conv0(pixel_values)]
            aux = None
            for n, cell in enumerate(self.cells):
                p = self.prev_index[n]
                outs.append(cell(outs[-1], None if p < 0 else outs[p]))
                if n == self.aux_cell and self.training:
                    aux = self.aux(outs[-1])
            x = torch.relu(outs[-1]).mean((2, 3))
            return self.fc(self.dropout(x)), aux

    return NASNetALarge()


def loss_fn(model: torch.nn.Module, batch: Mapping[str, Any]) -> torch.Tensor:
    """Cross-entropy (label smoothing 0.1) + 0.4 x the auxiliary head's, as slim trains it."""
    import torch.nn.functional as F

    logits, aux = model(batch["pixel_values"])
    labels = batch["labels"]
    loss = F.cross_entropy(logits.float(), labels, label_smoothing=LABEL_SMOOTHING)
    if aux is not None:
        loss = loss + AUX_WEIGHT * F.cross_entropy(
            aux.float(), labels, label_smoothing=LABEL_SMOOTHING
        )
    return loss


def build(run: RunConfig) -> BuiltWorkload:
    """NASNet-A Large with random weights (in bf16 for ``bf16-pure``), 331x331 inputs."""
    import torch

    from whichgpu.workloads.hf import default_dtype, weight_dtype

    with default_dtype(weight_dtype(run)):
        model = _build_model()

    def make_batch(batch_size: int, seq_len: int | None) -> dict[str, Any]:
        p = next(model.parameters())
        return {
            "pixel_values": torch.randn(
                batch_size, 3, IMAGE_SIZE, IMAGE_SIZE, device=p.device, dtype=p.dtype
            ),
            "labels": torch.randint(0, CLASSES, (batch_size,), device=p.device),
        }

    return BuiltWorkload(
        model=model, make_batch=make_batch, loss=loss_fn, units_per_sample=lambda seq_len: 1
    )


register(
    Workload(
        info=WorkloadInfo(
            name="nasnet-large",
            family="seed_nasnet",
            task="image classification",
            description="NASNet-A Large (6 @ 4032): stem conv + 2 reduction stem cells, 18 normal "
            "and 2 reduction NASNet-A cells (filters 168, 336, 672), auxiliary head "
            "(weight 0.4) and drop-path in training; 331x331 input, 1000 classes",
            input_desc=f"3x{IMAGE_SIZE}x{IMAGE_SIZE} image",
            throughput_unit="images",
            default_batch_size=16,
            params_published=PARAMS_PUBLISHED,
            params_source="88.9M (Zoph et al. 2018, Table 2, NASNet-A (6 @ 4032); without the "
            "auxiliary head, which adds ~4.6M in training)",
            reference="https://github.com/tensorflow/models/blob/master/research/slim/nets/nasnet/"
            "nasnet.py",
        ),
        build=build,
    )
)
