"""Image classifiers of today's benchmarks: ResNet-50 and ViT-B/16 at 224x224, 1000 classes.

Built with ``transformers`` from shipped configs (no torchvision needed). Throughput is
counted in images.
"""

from __future__ import annotations

from typing import Any

from whichgpu.schema import RunConfig, WorkloadInfo
from whichgpu.workloads.base import BuiltWorkload, Workload
from whichgpu.workloads.hf import build_hf_model, loss_from_output, model_device, read_config
from whichgpu.workloads.registry import register

IMAGE_SIZE = 224
CLASSES = 1000

_MODELS = [
    (
        "resnet50",
        25_557_032,
        "ResNet-50 (v1.5, stride in the 3x3 conv): bottleneck blocks [3, 4, 6, 3], 224x224 input",
        "https://arxiv.org/abs/1512.03385",
        "25.6M (He et al. 2016; the torchvision and timm resnet50 count 25,557,032)",
        64,
        (),
    ),
    (
        "vit-b-16",
        86_567_656,
        "ViT-B/16: 12 layers, d=768, 16x16 patches of a 224x224 image",
        "https://arxiv.org/abs/2010.11929",
        "86M (Dosovitskiy et al. 2021, Table 1)",
        64,
        ("q_proj", "k_proj", "v_proj", "o_proj", "fc1", "fc2"),
    ),
]


def _make(
    name: str,
    params: int,
    description: str,
    reference: str,
    published: str,
    batch: int,
    targets: tuple[str, ...],
) -> Workload:
    config = read_config(name)

    def build(run: RunConfig) -> BuiltWorkload:
        import torch

        model = build_hf_model(config, run)

        def make_batch(batch_size: int, seq_len: int | None) -> dict[str, Any]:
            device = model_device(model)
            dtype = next(model.parameters()).dtype
            return {
                "pixel_values": torch.randn(
                    batch_size, 3, IMAGE_SIZE, IMAGE_SIZE, device=device, dtype=dtype
                ),
                "labels": torch.randint(0, CLASSES, (batch_size,), device=device),
            }

        return BuiltWorkload(
            model=model,
            make_batch=make_batch,
            loss=loss_from_output,
            units_per_sample=lambda seq_len: 1,
            lora_targets=targets,
        )

    info = WorkloadInfo(
        name=name,
        family="vision",
        task="image classification",
        description=description,
        input_desc=f"3x{IMAGE_SIZE}x{IMAGE_SIZE} image",
        throughput_unit="images",
        default_batch_size=batch,
        params_published=params,
        params_source=published,
        reference=reference,
    )
    return Workload(info=info, build=build)


for _spec in _MODELS:
    register(_make(*_spec))
