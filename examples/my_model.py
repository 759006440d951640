"""Your own PyTorch model in whichgpu: ``whichgpu profile --model examples/my_model.py:build``.

A ``--model`` function builds the model and returns it with an example batch, ``(model,
batch)`` or ``(model, batch, loss)``; whichgpu resizes the batch along its first dimension.
For inputs whose shape changes with the sequence length, it returns ``make_batch(batch_size,
seq_len)``, the model's keyword inputs for one step, instead of the batch. whichgpu calls it
under fake tensors (no memory, no GPU), so the model must be created inside the function.
Without a ``loss``, the training loss is the model's output if it is one number, else its
``loss``, else the sum of its outputs. See docs/workloads.md for the whole protocol.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from whichgpu.schema import RunConfig
from whichgpu.workloads import model_defaults


def build() -> tuple[nn.Module, object, object]:
    """A small CNN for 32x32 RGB images (CIFAR-10), trained with cross-entropy; an example
    batch of 128 images and their labels (the default batch size)."""
    model = nn.Sequential(
        nn.Conv2d(3, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 128, 3, padding=1), nn.BatchNorm2d(128), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(128 * 8 * 8, 256), nn.ReLU(), nn.Linear(256, 10),
    )  # fmt: skip
    batch = {"images": torch.randn(128, 3, 32, 32), "labels": torch.randint(0, 10, (128,))}

    def loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return F.cross_entropy(model(batch["images"]), batch["labels"])

    return model, batch, loss


@model_defaults(batch_size=16, seq_len=256)
def build_transformer(run: RunConfig) -> tuple[nn.Module, object]:
    """A 6-layer Transformer encoder over token ids; ``--seq-len`` applies (default 256).

    It takes the run configuration, e.g. to size the model by precision (unused here). The
    model's output is a scalar loss, so no ``loss`` function is needed.
    """
    vocab, width = 32000, 512

    class TinyEncoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocab, width)
            self.layers = nn.ModuleList(
                nn.TransformerEncoderLayer(width, nhead=8, batch_first=True, norm_first=True)
                for _ in range(6)
            )
            self.head = nn.Linear(width, vocab)

        def forward(self, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            x = self.embed(ids)
            for layer in self.layers:
                x = layer(x)
            return F.cross_entropy(self.head(x).flatten(0, 1), targets.flatten())

    def make_batch(batch_size: int, seq_len: int | None) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, vocab, (batch_size, seq_len or 256))
        return {"ids": ids, "targets": ids}

    return TinyEncoder(), make_batch
