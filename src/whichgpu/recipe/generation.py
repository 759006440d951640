"""A causal language model's inference step, for the tracer and the bench alike: the sizes
of a served request batch (``serving_sizes``), its random prompt, its KV cache
(transformers' ``StaticCache``, allocated whole for context + new tokens) and the arguments
of one generation step with that cache, as ``generate`` passes them."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch

from whichgpu.errors import UnsupportedWorkload, UsageError
from whichgpu.schema import RunConfig, WorkloadInfo
from whichgpu.workloads.base import BuiltWorkload
from whichgpu.workloads.run_config import DEFAULT_NEW_TOKENS


@dataclass(frozen=True)
class ServingSizes:
    """The sizes of a causal language model's inference trace (from ``RunConfig``).

    The batch is the ``concurrency`` sequences served at once: every sequence is prefilled
    together, then each decode step produces one token per sequence, so a decode step yields
    ``sequences`` tokens. ``--batch-size`` is accepted as another name for it.
    """

    sequences: int
    """Sequences served at once: the batch of the prefill and of every decode step."""
    context_tokens: int
    """Prompt tokens per sequence: the prefill length."""
    new_tokens: int
    """Tokens generated per sequence; the KV cache holds ``context_tokens + new_tokens``."""


def generates_with_kv_cache(model: torch.nn.Module) -> bool:
    """Whether ``model`` is a decoder-only transformers model that generates with a KV cache.

    transformers' own test: ``can_generate()`` is true for the ``*ForCausalLM`` classes (and
    GPT-2's ``LMHeadModel``) and false for encoders (BERT, ViT) and plain PyTorch models;
    encoder-decoder models generate too but need encoder outputs, so they are left out.
    """
    can_generate = getattr(model, "can_generate", None)
    config = getattr(model, "config", None)
    if not callable(can_generate) or config is None:
        return False
    return bool(can_generate()) and not getattr(config, "is_encoder_decoder", False)


def serving_sizes(
    workload: WorkloadInfo, built: BuiltWorkload, run: RunConfig
) -> ServingSizes | None:
    """The prefill and decode sizes of an inference run of a causal LM; None for other runs.

    ``context`` defaults to ``seq_len`` if given, else to the workload's default sequence
    length, shortened so that context plus ``new_tokens`` (default ``DEFAULT_NEW_TOKENS``) fits
    the model's ``max_position_embeddings``; a given context that does not fit is refused.
    """
    if run.mode != "inference":
        return None
    if not generates_with_kv_cache(built.model):
        if run.context is not None or run.new_tokens is not None:
            raise UnsupportedWorkload(
                f"{workload.name} does not generate tokens with a KV cache; --context and "
                "--new-tokens apply to causal language models only."
            )
        return None
    if run.batch_size is not None and run.concurrency not in (1, run.batch_size):
        raise UsageError(
            "For language-model inference the batch is the --concurrency sequences served at "
            f"once; --batch-size {run.batch_size} disagrees with --concurrency "
            f"{run.concurrency}. Give one of them."
        )
    if run.context is not None and run.seq_len is not None and run.context != run.seq_len:
        raise UsageError(
            "--seq-len is the context of an inference run; give --context or --seq-len, not both."
        )
    sequences = run.concurrency if run.concurrency != 1 else (run.batch_size or 1)
    new_tokens = run.new_tokens or DEFAULT_NEW_TOKENS
    config: Any = built.model.config
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    max_positions: int | None = getattr(text_config, "max_position_embeddings", None)
    context = run.context or run.seq_len
    if context is None:
        context = workload.default_seq_len or 2048
        if max_positions is not None:
            context = min(context, max_positions - new_tokens)
    if max_positions is not None and (context < 1 or context + new_tokens > max_positions):
        raise UnsupportedWorkload(
            f"{workload.name} has {max_positions} positions; a context of {context} tokens "
            f"plus {new_tokens} new tokens does not fit. Shorten --context or --new-tokens."
        )
    return ServingSizes(sequences=sequences, context_tokens=context, new_tokens=new_tokens)


def prompt_ids(model: torch.nn.Module, serving: ServingSizes) -> torch.Tensor:
    """Random prompt token ids, ``sequences x context``, on the model's device."""
    config: Any = model.config
    vocab_size = int(config.get_text_config().vocab_size)
    device = next(model.parameters()).device
    shape = (serving.sequences, serving.context_tokens)
    return torch.randint(0, vocab_size, shape, device=device)


def static_cache(model: torch.nn.Module, serving: ServingSizes) -> Any:
    """A request's KV cache: transformers' ``StaticCache`` for context + new tokens."""
    from transformers import StaticCache

    config: Any = model.config
    return StaticCache(config=config, max_cache_len=serving.context_tokens + serving.new_tokens)


def generation_arguments(model: torch.nn.Module, cache: Any) -> dict[str, Any]:
    """The keyword arguments of one generation step with ``cache``, as ``generate`` passes them.

    The cache goes under the name the model's ``forward`` takes: ``cache`` from transformers
    5.24 on, ``past_key_values`` before it (5.24 still accepts the old name but warns that it
    goes away in 5.40). Only the last position's logits are asked for where the model can
    (``logits_to_keep=1``). The tracer and the bench build their steps from this one helper,
    so both run the same step on every supported transformers.
    """
    name = "cache" if takes_argument(model, "cache") else "past_key_values"
    arguments: dict[str, Any] = {name: cache, "use_cache": True}
    if takes_argument(model, "logits_to_keep"):
        arguments["logits_to_keep"] = 1
    return arguments


def takes_argument(model: torch.nn.Module, argument: str) -> bool:
    """Whether ``model.forward`` has a parameter named ``argument``."""
    return argument in inspect.signature(model.forward).parameters
