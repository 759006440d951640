"""Building ``transformers`` models from configs shipped as data: random weights, no download.

Over 600 lines because the losses a language model's step can take (fused, chunked,
fused-linear) live beside the builder whose models they reach into; they split out next.

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
from dataclasses import dataclass
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
    fields = {k: v for k, v in config.items() if k not in ("architectures", NORM_TYPE_KEY)}
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
    if config.get(NORM_TYPE_KEY) == LOW_PRECISION_LAYER_NORM:
        low_precision_layer_norms(model)
    return model


NORM_TYPE_KEY = "norm_type"
"""A config key (MPT's, read by llm-foundry) naming the layer norm the training code runs."""

LOW_PRECISION_LAYER_NORM = "low_precision_layernorm"
"""``norm_type`` of llm-foundry's MPT models: layer norms computed in the autocast dtype."""


def low_precision_layer_norms(model: torch.nn.Module) -> None:
    """Replace every ``nn.LayerNorm`` of ``model`` by a layer norm computed in the autocast
    dtype, as llm-foundry's ``low_precision_layernorm`` (``LPLayerNorm`` in
    ``llmfoundry/models/layers/norm.py``) does: under autocast, the input, weight and bias are
    cast to the autocast dtype and the norm runs with autocast off, so its input is saved and
    its output made in bf16, where autocast's own table would run ``layer_norm`` in fp32
    (an fp32 copy of the input saved, an fp32 output cast again for the next layer)."""
    import torch
    from torch import nn

    class LowPrecisionLayerNorm(nn.Module):
        def __init__(self, norm: nn.LayerNorm) -> None:
            super().__init__()
            self.weight, self.bias = norm.weight, norm.bias
            self.normalized_shape, self.eps = norm.normalized_shape, norm.eps

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            kind = x.device.type
            if not torch.is_autocast_enabled(kind):
                return nn.functional.layer_norm(
                    x, self.normalized_shape, self.weight, self.bias, self.eps
                )
            dtype = torch.get_autocast_dtype(kind)

            def cast(t: torch.Tensor | None) -> torch.Tensor | None:
                return None if t is None else t.to(dtype)

            with torch.autocast(device_type=kind, enabled=False):
                return nn.functional.layer_norm(
                    x.to(dtype), self.normalized_shape, cast(self.weight), cast(self.bias), self.eps
                )

    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.LayerNorm):
                setattr(module, name, LowPrecisionLayerNorm(child))


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


IGNORE_INDEX = -100
"""Label of a position that has no target (transformers' and PyTorch's ``ignore_index``)."""

CHUNKED_CE_CHUNKS = 8
"""Chunks of the sequence ``loss_kernel="chunked"`` computes the logits and the loss in:
torchtune's default (``num_output_chunks=8`` of its decoders, ``CEWithChunkedOutputLoss``)."""

FUSED_LINEAR_MAX_CHUNKS = 64
"""Most chunks ``loss_kernel="fused-linear"`` splits the batch's tokens into (see
``fused_linear_chunks``)."""


def fused_linear_chunks(vocab_size: int, hidden_size: int) -> int:
    """Chunks of the batch's tokens of ``loss_kernel="fused-linear"``: Liger's rule, which
    makes a chunk's logits about as large as the hidden states of the whole batch.

    Liger takes ``inc_factor = ceil(V / H)`` and a chunk of ``next_power_of_2(ceil(tokens /
    inc_factor))`` tokens; for a power-of-two token count that is ``2 ** floor(log2(inc_factor))``
    chunks whatever the count, which is the number used here for every count (so that the
    traced step is the same at every size and its profile scales exactly), at most
    ``FUSED_LINEAR_MAX_CHUNKS`` (GPT-2: 64 chunks, Llama 3: 32).
    """
    increase = max(1, -(-vocab_size // max(1, hidden_size)))
    return min(FUSED_LINEAR_MAX_CHUNKS, 1 << (increase.bit_length() - 1))


def loss_chunk_multiple(loss_kernel: str) -> int:
    """What a sequence length must be a multiple of for ``loss_kernel``'s chunks to be equal
    (at any batch): 1 for unchunked kernels. A traced grid of lengths that are multiples of it
    gives a profile that scales exactly (``whichgpu.trace.scaling``)."""
    return {"chunked": CHUNKED_CE_CHUNKS, "fused-linear": FUSED_LINEAR_MAX_CHUNKS}.get(
        loss_kernel, 1
    )


@dataclass(frozen=True)
class DecoderOutput:
    """What a chunked loss takes of a causal language model in place of its logits."""

    hidden: torch.Tensor
    """The last hidden states, (batch, tokens, hidden), after the final norm."""
    head: torch.nn.Linear
    """The output projection (``lm_head``) that would make the logits of them."""
    targets: torch.Tensor
    """Each position's target: the next position's label (``IGNORE_INDEX`` at the end), as
    transformers' ``ForCausalLMLoss`` shifts them."""
    held: dict[str, Any]
    """The rest of the decoder's output, held with the loss (``loss_from_output``)."""


_SCALED_LOGITS = ("final_logit_softcapping", "logit_scale", "logits_scaling")
"""Config fields of models whose logits are more than ``lm_head`` of the hidden states
(Gemma 2's soft cap, Cohere's and Granite's scales): a chunked loss would leave that out."""


def decoder_output(model: torch.nn.Module, batch: Mapping[str, Any], kernel: str) -> DecoderOutput:
    """Run a causal language model's decoder without its output projection (``kernel`` names
    the ``--loss-kernel`` in errors): its base model (``base_model``) on the batch's inputs,
    and the ``lm_head`` that ``get_output_embeddings`` names."""
    import torch

    labels = batch.get("labels")
    head = getattr(model, "get_output_embeddings", lambda: None)()
    base = getattr(model, "base_model", model)
    config = getattr(model, "config", None)
    text = config.get_text_config() if config is not None else None
    scaled = [
        name for name in _SCALED_LOGITS if getattr(text, name, None) not in (None, 1, 1.0, 0, 0.0)
    ]
    if labels is None or not isinstance(head, torch.nn.Linear) or base is model or scaled:
        why = (
            f"its logits are scaled or capped ({', '.join(scaled)})"
            if scaled
            else "this model's step has no token labels, or no base model and linear output "
            "projection (lm_head) to split"
        )
        raise UnsupportedWorkload(
            f"--loss-kernel {kernel} computes a causal language model's output projection and "
            f"cross-entropy chunk by chunk; {why}. Use --loss-kernel torch or fused."
        )
    inputs = {key: value for key, value in batch.items() if key != "labels"}
    output = base(**inputs)
    hidden = output[0]
    if hidden.dim() != 3 or hidden.shape[:2] != labels.shape:
        raise UnsupportedWorkload(
            f"--loss-kernel {kernel}: the decoder's output is not (batch, tokens, hidden) "
            "beside the labels. Use --loss-kernel torch or fused."
        )
    targets = torch.nn.functional.pad(labels[:, 1:], (0, 1), value=IGNORE_INDEX)
    held = {key: value for key, value in output.items() if key != "last_hidden_state"}
    return DecoderOutput(hidden, head, targets, held)


def chunked_cross_entropy_loss(model: torch.nn.Module, batch: Mapping[str, Any]) -> torch.Tensor:
    """A causal language model's loss as torchtune's chunked cross-entropy computes it
    (``loss_kernel="chunked"``).

    Mirrors torchtune's ``CEWithChunkedOutputLoss`` (https://github.com/pytorch/torchtune,
    ``torchtune/modules/loss/ce_chunked_output_loss.py``, from its pull request 1390) with the
    decoder's
    ``num_output_chunks=8``: the output projection runs on each of ``CHUNKED_CE_CHUNKS`` chunks
    of the sequence, and each chunk's 16-bit logits are upcast to fp32 and reduced to a summed
    cross-entropy on their own; the sum over chunks is divided by the number of targets. The
    16-bit logits of every chunk stay for the backward pass (all of them together are the
    batch's logits), their fp32 copy exists one chunk at a time. torchtune compiles the per-
    chunk loss (``compute_cross_entropy``), so that the compiled graph keeps only its 16-bit
    input and each row's log-sum-exp for the backward and recomputes the upcast there; the
    per-chunk autograd function here (``_upcast_cross_entropy``) keeps the same (eager
    ``F.cross_entropy`` would keep each chunk's fp32 log-softmax until the backward, the
    whole fp32 logits after all). Targets are shifted as transformers' ``ForCausalLMLoss``
    shifts them, so the loss equals the model's own.
    """
    out = decoder_output(model, batch, "chunked")
    count = (out.targets != IGNORE_INDEX).sum()
    chunk_loss = _upcast_cross_entropy()
    total: torch.Tensor | None = None
    pieces = zip(
        out.hidden.chunk(CHUNKED_CE_CHUNKS, dim=1),
        out.targets.chunk(CHUNKED_CE_CHUNKS, dim=1),
        strict=True,
    )
    for hidden, targets in pieces:
        part: torch.Tensor = chunk_loss.apply(out.head(hidden), targets)
        total = part if total is None else total + part
    assert total is not None
    loss = total / count
    setattr(loss, HELD_OUTPUT, out.held)
    return loss


@functools.cache
def _upcast_cross_entropy() -> Any:
    """The summed cross-entropy of one chunk of 16-bit logits, upcast to fp32 inside (the
    compiled ``compute_cross_entropy`` of torchtune), as an autograd function: it keeps the
    16-bit logits and one fp32 log-sum-exp per row; the backward upcasts the logits again and
    writes their gradient, softmax minus the target, in their dtype."""
    import torch

    class UpcastCrossEntropy(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            upcast = logits.float()
            log_sum_exp = torch.logsumexp(upcast, dim=-1)
            valid = targets != IGNORE_INDEX
            index = targets.clamp(min=0).unsqueeze(-1)
            picked = upcast.gather(-1, index).squeeze(-1)
            ctx.save_for_backward(logits, log_sum_exp, targets)
            return ((log_sum_exp - picked) * valid).sum()

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
            logits, log_sum_exp, targets = ctx.saved_tensors
            return _softmax_minus_target(logits, log_sum_exp, targets, grad), None

    return UpcastCrossEntropy


def _softmax_minus_target(
    logits: torch.Tensor, log_sum_exp: torch.Tensor, targets: torch.Tensor, scale: torch.Tensor
) -> torch.Tensor:
    """The gradient of the summed cross-entropy wrt ``logits``, times ``scale`` (a scalar or
    one factor per row), in ``logits``' dtype: ``softmax - onehot(target)``, computed in one
    fp32 buffer of the logits' shape and zero at ignored positions."""
    import torch

    gradient = logits.float()
    gradient.sub_(log_sum_exp.unsqueeze(-1)).exp_()
    index = targets.clamp(min=0).unsqueeze(-1)
    gradient.scatter_add_(-1, index, torch.full_like(index, -1, dtype=gradient.dtype))
    gradient.mul_(((targets != IGNORE_INDEX) * scale).unsqueeze(-1))
    return gradient.to(logits.dtype)


def fused_linear_cross_entropy_loss(
    model: torch.nn.Module, batch: Mapping[str, Any]
) -> torch.Tensor:
    """A causal language model's loss as Liger's fused linear cross-entropy computes it
    (``loss_kernel="fused-linear"``).

    Mirrors Liger Kernel's ``LigerFusedLinearCrossEntropyLoss`` (its function
    ``LigerFusedLinearCrossEntropyFunction``, https://github.com/linkedin/Liger-Kernel,
    ``src/liger_kernel/ops/fused_linear_cross_entropy.py``): the batch's tokens are split into
    chunks (``fused_linear_chunks``); for each chunk the forward pass computes the chunk's logits
    (``lm_head``, in the compute dtype), their cross-entropy and its gradient (Liger's Triton
    kernel does that in one pass, writing the gradient over the logits; here the gradient is
    computed in fp32 and copied over them), then the gradient wrt the chunk's hidden states
    (into a buffer of the hidden states' size) and adds the chunk's gradient wrt the weight
    (and bias) into one buffer of the weight's size. Only those gradients are kept for the
    backward pass, which scales them by the incoming gradient in place; no logits of the whole
    batch exist, in any dtype. Targets are shifted as transformers' ``ForCausalLMLoss``
    shifts them and the loss is the mean over them, so it equals the model's own.
    """
    import torch

    out = decoder_output(model, batch, "fused-linear")
    weight = out.head.weight
    device = out.hidden.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else weight.dtype
    chunks = fused_linear_chunks(weight.shape[0], weight.shape[1])
    loss: torch.Tensor = _fused_linear_cross_entropy().apply(
        out.hidden, weight, out.head.bias, out.targets, dtype, chunks
    )
    setattr(loss, HELD_OUTPUT, out.held)
    return loss


@functools.cache
def _fused_linear_cross_entropy() -> Any:
    """The fused output projection and cross-entropy as an autograd function that computes
    its gradients in the forward pass (``fused_linear_cross_entropy_loss``)."""
    import torch

    class FusedLinearCrossEntropy(torch.autograd.Function):
        @staticmethod
        def forward(
            ctx: Any,
            hidden: torch.Tensor,
            weight: torch.Tensor,
            bias: torch.Tensor | None,
            targets: torch.Tensor,
            dtype: torch.dtype,
            chunks: int,
        ) -> torch.Tensor:
            tokens = hidden.reshape(-1, hidden.shape[-1])
            flat_targets = targets.reshape(-1)
            scale = (flat_targets != IGNORE_INDEX).sum().float().reciprocal()
            grad_hidden = torch.empty_like(tokens)
            grad_weight = torch.zeros_like(weight) if weight.requires_grad else None
            grad_bias = torch.zeros_like(bias) if bias is not None and bias.requires_grad else None
            matrix = weight.to(dtype)
            offset = None if bias is None else bias.to(dtype)
            total = torch.zeros((), dtype=torch.float32, device=hidden.device)
            with torch.autocast(hidden.device.type, enabled=False):
                pieces = zip(
                    tokens.chunk(chunks),
                    flat_targets.chunk(chunks),
                    grad_hidden.chunk(chunks),
                    strict=True,
                )
                for rows, row_targets, row_grad in pieces:
                    inputs = rows.to(dtype)
                    logits = torch.nn.functional.linear(inputs, matrix, offset)
                    upcast = logits.float()
                    log_sum_exp = torch.logsumexp(upcast, dim=-1)
                    picked = upcast.gather(-1, row_targets.clamp(min=0).unsqueeze(-1))
                    valid = row_targets != IGNORE_INDEX
                    total += ((log_sum_exp - picked.squeeze(-1)) * valid).sum()
                    del upcast, picked
                    logits.copy_(_softmax_minus_target(logits, log_sum_exp, row_targets, scale))
                    row_grad.copy_(logits @ matrix)
                    if grad_weight is not None:
                        grad_weight.add_(logits.t() @ inputs)
                    if grad_bias is not None:
                        grad_bias.add_(logits.sum(dim=0))
            ctx.hidden_shape = hidden.shape
            ctx.grads = (grad_hidden, grad_weight, grad_bias)
            return total * scale

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
            # Liger scales the kept gradients in place (they are used once)
            grad_hidden, grad_weight, grad_bias = (
                None if g is None else g.mul_(grad.to(g.dtype)) for g in ctx.grads
            )
            ctx.grads = None
            assert grad_hidden is not None
            return grad_hidden.view(ctx.hidden_shape), grad_weight, grad_bias, None, None, None

    return FusedLinearCrossEntropy
