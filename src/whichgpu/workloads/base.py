"""The workload protocol: a named model, how to build it, make a batch and compute its loss.

A ``Workload`` couples a documented ``WorkloadInfo`` with a ``build`` function. ``build`` runs
only when a real (or fake-tensor) model is needed and is the only place torch is imported;
listing and describing workloads never imports torch. ``BuiltWorkload`` is what the tracer
and the benchmark run: ``loss(model, make_batch(batch_size, seq_len))`` is one forward pass
with its loss.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from whichgpu.schema import RunConfig, WorkloadInfo

if TYPE_CHECKING:
    import torch

Batch = Mapping[str, Any]
"""Keyword inputs of one step (tensors, or nested structures of tensors)."""


@dataclass(frozen=True)
class BuiltWorkload:
    """A model instance with the functions that feed it and score it."""

    model: torch.nn.Module
    """The model, with random weights, on the device and dtype it was built for."""
    make_batch: Callable[[int, int | None], Batch]
    """``(batch_size, seq_len) -> batch`` of synthetic data on the model's device."""
    loss: Callable[[torch.nn.Module, Batch], torch.Tensor]
    """Forward pass and a scalar training loss."""
    units_per_sample: Callable[[int | None], int]
    """Throughput units per sample (``seq_len`` tokens for a language model, 1 for an image)."""
    lora_targets: tuple[str, ...] = ()
    """Default module names that LoRA adapts in this model."""
    fp16_master_weights: bool = False
    """Trace ``--precision fp16`` training as fairseq's ``--fp16`` runs it (its
    ``FP16Optimizer``), not as ``torch.amp``: the model in fp16 without autocast, a flat fp32
    copy of the parameters and of their gradients, the optimizer on that copy. For the
    workloads that stand for fairseq models of Lambda's 2020 table. Training code that runs
    the model (``whichgpu bench``) keeps ``torch.amp``."""
    fused_attention_dropout: bool = True
    """Trace scaled-dot-product attention with dropout as the fused kernel, as CUDA runs it
    (flash and memory-efficient attention apply the dropout inside and keep only its random
    state). False for workloads that stand for code that materialised the attention scores
    (the models of Lambda's 2020 table, written in 2019 frameworks)."""
    forward: Callable[[torch.nn.Module, Batch], Any] | None = None
    """Runs the model on a batch without a loss (an inference step); None: the batch's items
    are the model's keyword inputs, ``labels`` left out (see ``infer``)."""

    def infer(self, model: torch.nn.Module, batch: Batch) -> Any:
        """One forward pass of ``model`` on ``batch`` without a loss, as inference runs it."""
        if self.forward is not None:
            return self.forward(model, batch)
        return keyword_inference(model, batch)


def keyword_inference(model: torch.nn.Module, batch: Batch) -> Any:
    """The model on the batch's items as keyword inputs but ``labels`` (an inference step)."""
    return model(**{k: v for k, v in batch.items() if k != "labels"})


@dataclass(frozen=True)
class Workload:
    """A registered workload."""

    info: WorkloadInfo
    """What it is."""
    build: Callable[[RunConfig], BuiltWorkload]
    """Builds the model for a run configuration (imports torch)."""
    source_digest: str | None = None
    """The user's workloads: SHA-256 of what the model is built from (the config's contents;
    a ``--model`` folder's sources), the trace cache's name for it; None for a named workload
    (its name and whichgpu's code say it) and for a model too large to identify quickly."""
    layers: int | None = None
    """Layers of the model's one stack of repeated blocks (a transformer's decoder layers),
    when ``build_with_layers`` can build it with fewer; None otherwise."""
    build_with_layers: Callable[[RunConfig, int], BuiltWorkload] | None = None
    """Builds the model for a run with only its first ``n`` layers (the config's layer count
    set to ``n``): the tracer traces a deep model at a few depths and extends the step to all
    ``layers`` (``whichgpu.trace.depth``)."""


def enable_checkpointing(
    model: Any, every_n_layers: int | None = None, **checkpoint_kwargs: Any
) -> None:
    """Turn on gradient checkpointing as ``model`` offers it, with ``torch.utils.checkpoint``
    keyword arguments: transformers' ``activation_checkpointing_enable`` (5.x; its older name
    warns that it is deprecated), else ``gradient_checkpointing_enable`` (older transformers
    and whichgpu's own models).

    ``every_n_layers`` checkpoints only every N-th of the model's repeated layers, counting
    from the first (transformers' ``every_n_layers``); a model's switch must take it for any
    policy but the model's own (None: every layer, however the model checkpoints), since a
    switch that does not take it may also not pass ``checkpoint_kwargs`` on (a per-operator
    ``context_fn``)."""
    from whichgpu.errors import UnsupportedWorkload

    layered = {} if every_n_layers is None else {"every_n_layers": every_n_layers}
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs=checkpoint_kwargs, **layered)
        return
    enable = getattr(model, "gradient_checkpointing_enable", None)
    if enable is None:
        raise UnsupportedWorkload("This model has no gradient checkpointing switch.")
    if layered and "every_n_layers" not in inspect.signature(enable).parameters:
        raise UnsupportedWorkload(
            "This model checkpoints its own blocks and has no checkpointing policy: "
            "--checkpointing-policy every-N and selective need a transformers model's layers. "
            "Use --checkpointing-policy full."
        )
    enable(gradient_checkpointing_kwargs=checkpoint_kwargs, **layered)
