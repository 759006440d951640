"""Building ``transformers`` models from configs shipped as data: random weights, no download.

Configs live in ``configs/<name>.json`` (the fields of the model's Hugging Face ``config.json``
that define its architecture). The model class comes from the config's ``architectures``.
torch and transformers are imported inside the functions, never at module import.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from whichgpu.errors import UnsupportedWorkload
from whichgpu.schema import RunConfig

if TYPE_CHECKING:
    import torch

CONFIG_DIR = Path(__file__).parent / "configs"


def read_config(name: str) -> dict[str, Any]:
    """The shipped config of a named workload."""
    data: dict[str, Any] = json.loads((CONFIG_DIR / f"{name}.json").read_text(encoding="utf-8"))
    return data


def weight_dtype(run: RunConfig) -> torch.dtype:
    """The dtype weights are created in: bf16 for ``bf16-pure``, fp32 otherwise (AMP keeps
    fp32 master weights)."""
    import torch

    return torch.bfloat16 if run.precision == "bf16-pure" else torch.float32


@contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Create parameters directly in ``dtype`` (no fp32 copy first)."""
    import torch

    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def build_hf_model(config: Mapping[str, Any], run: RunConfig) -> torch.nn.Module:
    """Instantiate the config's architecture with random weights, SDPA attention."""
    import transformers

    architectures = config.get("architectures") or []
    if not architectures:
        raise UnsupportedWorkload(
            "The config names no model class ('architectures'); pass --task to choose one."
        )
    model_cls = getattr(transformers, architectures[0], None)
    if model_cls is None:
        raise UnsupportedWorkload(
            f"transformers {transformers.__version__} has no class '{architectures[0]}'."
        )
    fields = {k: v for k, v in config.items() if k != "architectures"}
    hf_config = transformers.AutoConfig.for_model(**fields)
    if getattr(model_cls, "_supports_sdpa", False):
        hf_config._attn_implementation = "sdpa"
    with default_dtype(weight_dtype(run)), _skip_init_when_fake(), _quiet_transformers():
        model: torch.nn.Module = model_cls(hf_config)
    tie = getattr(model, "tie_weights", None)
    if tie is not None:  # skipping initialisation also skips tying shared embeddings
        tie()
    return model


@contextmanager
def _quiet_transformers() -> Iterator[None]:
    """Keep transformers' advice about configs (meant for model authors) off the user's screen."""
    from transformers.utils import logging as hf_logging

    previous = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    try:
        yield
    finally:
        hf_logging.set_verbosity(previous)


@contextmanager
def _skip_init_when_fake() -> Iterator[None]:
    """Skip weight initialisation under fake tensors: values do not exist there, and some
    initialisers (truncated normal) depend on them. Real builds initialise as usual."""
    from torch._guards import active_fake_mode

    if active_fake_mode() is None:
        yield
        return
    from transformers.initialization import no_init_weights

    with no_init_weights():
        yield


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of the model's first parameter."""
    return next(model.parameters()).device


def token_batch(
    vocab_size: int, with_labels: bool = True
) -> Callable[[torch.nn.Module, int, int | None], dict[str, Any]]:
    """A batch maker for causal language models: random token ids, labels = inputs."""

    def make(model: torch.nn.Module, batch_size: int, seq_len: int | None) -> dict[str, Any]:
        import torch

        if seq_len is None:
            raise UnsupportedWorkload("A language model needs a sequence length (--seq-len).")
        ids = torch.randint(0, vocab_size, (batch_size, seq_len), device=model_device(model))
        return {"input_ids": ids, "labels": ids} if with_labels else {"input_ids": ids}

    return make


def loss_from_output(model: torch.nn.Module, batch: Mapping[str, Any]) -> torch.Tensor:
    """Models that compute their own loss from ``labels``."""
    loss: torch.Tensor = model(**batch).loss
    return loss
