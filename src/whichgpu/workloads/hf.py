"""Building ``transformers`` models from configs shipped as data: random weights, no download.

Configs live in ``configs/<name>.json`` (the fields of the model's Hugging Face ``config.json``
that define its architecture). The model class comes from the config's ``architectures``.
torch and transformers are imported inside the functions, never at module import.
"""

from __future__ import annotations

import functools
import json
import re
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
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


def max_positions(config: dict[str, Any]) -> int | None:
    """Positions a config's model can embed (``max_position_embeddings``, GPT-2's
    ``n_positions``), looking inside a ``text_config``; None if the config names none."""
    inner = config.get("text_config")
    if isinstance(inner, dict):
        found = max_positions(inner)
        if found is not None:
            return found
    for key in ("max_position_embeddings", "n_positions"):
        value = config.get(key)
        if isinstance(value, int) and value > 0:
            return value
    return None


LAYER_COUNT_KEYS = ("num_hidden_layers", "n_layer")
"""Config fields that give the number of a model's repeated layers (GPT-2 says ``n_layer``)."""


def layer_count(config: Mapping[str, Any]) -> int | None:
    """The config's layer count, when it has one stack of layers set by one top-level field;
    None for the rest (a ``text_config`` inside, an encoder-decoder's two stacks)."""
    if isinstance(config.get("text_config"), dict):
        return None
    for key in LAYER_COUNT_KEYS:
        value = config.get(key)
        if isinstance(value, int) and value > 0:
            return value
    return None


def with_layers(config: Mapping[str, Any], layers: int) -> dict[str, Any]:
    """The config with only its first ``layers`` layers (a per-layer ``layer_types`` list cut
    to match)."""
    key = next(k for k in LAYER_COUNT_KEYS if isinstance(config.get(k), int))
    out = {**config, key: layers}
    types = config.get("layer_types")
    if isinstance(types, list):
        out["layer_types"] = types[:layers]
    return out


def weight_dtype(run: RunConfig) -> torch.dtype:
    """The dtype weights are created in: bf16 for ``bf16-pure``, fp32 otherwise (AMP keeps
    fp32 master weights) — except in inference, where nothing is trained and so no fp32
    master copy exists: fp16/bf16 inference holds its weights in fp16/bf16, as a server loads
    them (fp32 weights under autocast would also keep a cached half copy of every weight, and
    give a language model an fp32 KV cache)."""
    import torch

    if run.precision == "bf16-pure" or (run.mode == "inference" and run.precision == "bf16"):
        return torch.bfloat16
    if run.mode == "inference" and run.precision == "fp16":
        return torch.float16
    return torch.float32


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
    with default_dtype(weight_dtype(run)), skip_init_when_fake(), _quiet_transformers():
        model: torch.nn.Module = model_cls(hf_config)
    tie = getattr(model, "tie_weights", None)
    if tie is not None:  # skipping initialisation also skips tying shared embeddings
        tie()
    if getattr(model.config, "_experts_implementation", None) == "grouped_mm":
        grouped_experts_precision(architectures[0], run)
    return model


def experts_choice(op_names: Iterable[str], precision: str) -> dict[str, str]:
    """The ``moe_experts`` entry of a profile's kernel choices, when grouped experts ran."""
    if "aten._grouped_mm" not in set(op_names):
        return {}
    if precision in ("bf16", "fp16"):
        return {
            "moe_experts": "grouped_mm, operands autocast to bf16 (as sharded mixed-precision "
            "training runs them; plain autocast over fp32 weights would run fp32 GEMMs)"
        }
    return {"moe_experts": "grouped_mm"}


_grouped_mm_autocast_registered = False

# The oldest transformers with which a mixture-of-experts step traces under AMP: 5.17 (what the
# H200 measurements ran) hands torch._grouped_mm fp32 operands there; 5.24 (the lock) does not.
GROUPED_EXPERTS_AMP_TRANSFORMERS = "5.24.0"


def transformers_version() -> str:
    """The installed transformers' version string."""
    import transformers

    return str(transformers.__version__)


def _release(version: str) -> tuple[int, ...]:
    """The numeric release of a version string (``5.24.0.dev0`` -> ``(5, 24, 0)``)."""
    parts: list[int] = []
    for part in version.split(".")[:3]:
        digits = re.match(r"\d+", part)
        if digits is None:
            break
        parts.append(int(digits.group()))
    return tuple(parts)


def grouped_experts_precision(architecture: str, run: RunConfig) -> None:
    """Make a mixture-of-experts model's expert GEMMs traceable at the run's precision.

    transformers 5 runs MoE experts with ``torch._grouped_mm`` (its default ``grouped_mm``
    experts backend on GPUs). That op is not on autocast's list (pytorch/pytorch#174763), so
    under AMP transformers casts the bf16 activations up to the fp32 master weights, and a
    single GPU would run fp32 grouped GEMMs (torch's non-bf16 fallback, a loop of fp32 ``mm``
    per expert). A model this size is trained sharded (FSDP ``MixedPrecision``, DeepSpeed
    bf16), which hands the experts bf16 weights, so its GEMMs run in bf16 on the fast path.
    Under AMP the trace does the same: CPU autocast casts ``_grouped_mm``'s operands to bf16,
    as it casts ``linear``'s (also the only dtype torch's tracing kernel of the op accepts,
    so fp16 AMP gets bf16 expert GEMMs too). fp32 and tf32 cannot be traced for that reason.
    """
    global _grouped_mm_autocast_registered
    import torch
    from torch._guards import active_fake_mode

    if run.precision in ("fp32", "tf32") and active_fake_mode() is not None:
        raise UnsupportedWorkload(
            f"{architecture} runs its experts with torch._grouped_mm, which fake tensors "
            f"(torch {torch.__version__}) accept in bf16 only, so --precision {run.precision} "
            "cannot be traced; use --precision bf16 (AMP) or bf16-pure."
        )
    if run.precision not in ("bf16", "fp16"):
        return
    if active_fake_mode() is not None and _release(transformers_version()) < _release(
        GROUPED_EXPERTS_AMP_TRANSFORMERS
    ):
        raise UnsupportedWorkload(
            f"{architecture} runs its experts with torch._grouped_mm; under AMP, transformers "
            f"{transformers_version()} hands that op fp32 operands, which fake tensors cannot "
            f"trace (they accept bf16 only). Tracing it under --precision {run.precision} "
            f"needs transformers >= {GROUPED_EXPERTS_AMP_TRANSFORMERS} (the oldest release "
            "whichgpu has traced it with): upgrade transformers, or use --precision bf16-pure."
        )
    if _grouped_mm_autocast_registered:
        return

    with warnings.catch_warnings():  # torch notes that the rule replaces a fallthrough kernel
        warnings.simplefilter("ignore")
        torch.library.register_autocast("aten::_grouped_mm", "cpu", torch.bfloat16)
    _grouped_mm_autocast_registered = True


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
def quiet_transformers() -> Iterator[None]:
    """Keep transformers' advice about configs and call options (``use_cache`` with
    checkpointing, ``loss_type``) off the user's screen while a step runs; nothing to do (and
    nothing imported) when no transformers model was built."""
    if "transformers" not in sys.modules:
        yield
        return
    with _quiet_transformers():
        yield


@contextmanager
def skip_init_when_fake() -> Iterator[None]:
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


HELD_OUTPUT = "whichgpu_held_output"
"""Attribute of the loss that holds the rest of the model's output (``loss_from_output``)."""


def loss_from_output(model: torch.nn.Module, batch: Mapping[str, Any]) -> torch.Tensor:
    """Models that compute their own loss from ``labels``.

    The rest of the model's output (a language model's logits, the key/value cache a model
    configured with ``use_cache`` returns even in training) lives as long as the loss, as in
    the training loop transformers documents ("Train in native PyTorch": ``outputs =
    model(**batch)``, ``outputs.loss.backward()``, ``optimizer.step()``), which holds
    ``outputs`` through backward and the optimizer step. The Hugging Face ``Trainer`` frees it
    when its forward returns, so this errs on the safe side for it: by the logits, 2 bytes per
    vocabulary entry and token under bf16 autocast (GPT-2, 8 x 1024 tokens: 0.8 GB).
    """
    output = model(**batch)
    loss: torch.Tensor = output.loss
    # the loss holds the output's other items, not the output itself: that would be a
    # reference cycle, freed only by the garbage collector
    held = {key: value for key, value in output.items() if key != "loss"}
    setattr(loss, HELD_OUTPUT, held)
    return loss


def fused_cross_entropy_loss(model: torch.nn.Module, batch: Mapping[str, Any]) -> torch.Tensor:
    """A language model's loss through one fused cross-entropy kernel (``loss_kernel="fused"``).

    The model runs without ``labels`` and returns its logits in the compute dtype (bf16 under
    autocast); the loss is then taken as flash-attn's ``CrossEntropyLoss`` (llm-foundry's default
    loss, ``flash_attn/ops/triton/cross_entropy.py``) and Liger's kernel take it: one pass over
    each row of logits keeps the row's log-sum-exp (fp32, one number a token), and the backward
    pass reads the logits once more and writes their gradient in their own dtype. There is no
    fp32 copy of the logits, no log-softmax output and no fp32 gradient, which transformers'
    loss makes (``ForCausalLMLoss`` upcasts the logits). The rest of the output is held with the
    loss, as ``loss_from_output`` holds it.
    """
    labels = batch.get("labels")
    inputs = {key: value for key, value in batch.items() if key != "labels"}
    output = model(**inputs)
    logits = getattr(output, "logits", None)
    if labels is None or logits is None or logits.dim() != 3 or logits.shape[:2] != labels.shape:
        raise UnsupportedWorkload(
            "--loss-kernel fused is a language model's cross-entropy over its vocabulary: this "
            "model's step has no token labels and logits of (batch, tokens, vocabulary). Drop "
            "--loss-kernel."
        )
    loss: torch.Tensor = _fused_cross_entropy().apply(logits, labels)
    setattr(loss, HELD_OUTPUT, dict(output.items()))
    return loss


@functools.cache
def _fused_cross_entropy() -> Any:
    """The fused kernel's autograd function, built once torch is imported.

    Its operators stand for the kernel's memory traffic: ``amax`` over each row reads the
    logits once and writes one number a row (the log-sum-exp, kept in fp32); the backward's
    ``mul`` reads the logits once and writes a gradient of their size and dtype. Their FLOPs
    (a few per logit) are negligible beside the LM head's GEMM.
    """
    import torch

    class FusedCrossEntropy(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            log_sum_exp = torch.amax(logits, dim=-1).float()
            ctx.save_for_backward(logits, log_sum_exp)
            return log_sum_exp.mean()

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
            logits, _ = ctx.saved_tensors
            return torch.mul(logits, grad.to(logits.dtype)), None

    return FusedCrossEntropy
