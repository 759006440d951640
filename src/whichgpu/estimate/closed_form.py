"""Closed-form memory of a transformer training step, from a Hugging Face config (no torch).

Over 600 lines because every buffer of a transformer step is written out term by term for each
precision class and model family, and each term answers to the tracer's record of the same
buffer (the cross-check).

The fast path beside the traced one (``whichgpu.estimate.memory``): instant answers for
decoder-only language models (Llama, Mistral, Qwen2, GPT-2) and BERT encoders, and a
cross-check of the stored traces. Parameters, model states, saved activations and the peak
of allocated bytes over four phases of the second step are formulas in the config's sizes;
``reserved_bytes`` turns the peak into reserved bytes with one fitted factor. Pure Python; no
torch, no numpy.

The notation, formulas and calibration: docs/memory.md, "Closed-form path" (its formulas).
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from whichgpu.errors import UnsupportedWorkload
from whichgpu.schema import RunConfig

Family = Literal["llama", "gpt2", "bert"]
PrecisionClass = Literal["amp", "fp32", "pure"]
PhaseName = Literal["forward_end", "backward_start", "backward_end", "optimizer"]

ADAMW_8BIT_BLOCK = 256
"""Elements per fp32 absmax of an 8-bit AdamW state (bitsandbytes >= 0.44, ``optim8bit``)."""
ADAMW_8BIT_MIN_SIZE = 4096
"""Parameters with fewer elements keep fp32 states in 8-bit AdamW (``min_8bit_size``)."""
ADAMW_8BIT_CHUNK = 1 << 22
"""Elements the traced 8-bit AdamW updates per step (``recipe.optim8bit.CHUNK_ELEMENTS``)."""
NF4_BLOCK = 64
"""Weights per absmax in QLoRA's NF4 storage."""
NF4_ABSMAX_BLOCK = 256
"""Absmax values per fp32 scale in QLoRA's double quantisation."""

_LLAMA_TYPES = {"llama", "mistral", "qwen2"}
_BERT_HEADS = {"BertForPreTraining", "BertForQuestionAnswering", "BertModel"}


@dataclass(frozen=True)
class TransformerShape:
    """The sizes of a transformer that the formulas use, read from a Hugging Face config."""

    family: Family
    """Implementation family: ``llama`` (Llama, Mistral, Qwen2), ``gpt2`` or ``bert``."""
    architecture: str
    """The config's model class (``LlamaForCausalLM``, ``BertForPreTraining`` …)."""
    hidden: int
    """Hidden size ``h``."""
    layers: int
    """Transformer blocks ``n``."""
    heads: int
    """Query heads ``H``."""
    kv_heads: int
    """Key/value heads ``H_kv`` (GQA; equal to ``H`` without it)."""
    head_dim: int
    """Width of one head ``d``."""
    intermediate: int
    """MLP width ``I``."""
    vocab: int
    """Vocabulary ``V``."""
    positions: int
    """Learned position embeddings (GPT-2, BERT); 0 with rotary positions."""
    type_vocab: int
    """BERT token-type embeddings; 0 otherwise."""
    tied: bool
    """Whether the output layer shares the input embedding's weight."""
    qkv_bias: bool
    """Biases on the query/key/value projections."""
    out_bias: bool
    """Bias on the attention output projection."""
    mlp_bias: bool
    """Biases on the MLP projections."""
    experts: int
    """Experts per MoE layer (0: dense MLP)."""
    materialised_attention: bool = False
    """The attention scores (and their dropout mask) are materialised and saved, as in the
    2019 code the Lambda stand-ins model (``MATERIALISED_ATTENTION_KEY`` in the config)."""


MATERIALISED_ATTENTION_KEY = "whichgpu_materialised_attention"
"""A key ``workload_config`` sets in the configs of workloads traced with materialised
attention scores (``MATERIALISED_ATTENTION_WORKLOADS``); no Hugging Face config has it."""
MATERIALISED_ATTENTION_WORKLOADS = ("bert-base", "bert-squad")
"""The closed-form workloads that stand for Lambda 2020 models (their builders set
``BuiltWorkload.fused_attention_dropout`` False)."""


_SIZES = ("hidden", "layers", "heads", "kv_heads", "head_dim", "intermediate", "vocab")
"""Fields of a ``TransformerShape`` that must be positive whole numbers."""


def parse_config(config: Mapping[str, Any]) -> TransformerShape:
    """The shape of a Hugging Face ``config.json`` dict; ``UnsupportedWorkload`` otherwise,
    also when a size it needs is missing, not a number, or not positive."""
    try:
        shape = _parse_config(config)
    except KeyError as exc:
        raise UnsupportedWorkload(
            f"The config has no {exc.args[0]!r}, which the closed form needs."
        ) from exc
    except (TypeError, ValueError) as exc:
        raise UnsupportedWorkload(
            f"The config has a size that is not a whole number ({exc})."
        ) from exc
    bad = [name for name in _SIZES if getattr(shape, name) < 1]
    if bad or shape.heads % shape.kv_heads:
        what = ", ".join(bad) if bad else "attention heads not a multiple of the KV heads"
        raise UnsupportedWorkload(f"The config's sizes cannot describe a model: {what}.")
    return shape


def _parse_config(config: Mapping[str, Any]) -> TransformerShape:
    model_type = str(config.get("model_type", ""))
    arch = str((config.get("architectures") or [""])[0])
    if model_type in _LLAMA_TYPES or model_type == "mixtral":
        h = int(config["hidden_size"])
        heads = int(config["num_attention_heads"])
        head_dim = int(config.get("head_dim") or h // heads)
        qkv_bias = model_type == "qwen2" or bool(config.get("attention_bias", False))
        return TransformerShape(
            family="llama",
            architecture=arch or "LlamaForCausalLM",
            hidden=h,
            layers=int(config["num_hidden_layers"]),
            heads=heads,
            kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=head_dim,
            intermediate=int(config["intermediate_size"]),
            vocab=int(config["vocab_size"]),
            positions=0,
            type_vocab=0,
            tied=bool(config.get("tie_word_embeddings", False)),
            qkv_bias=qkv_bias,
            out_bias=model_type != "qwen2" and bool(config.get("attention_bias", False)),
            mlp_bias=bool(config.get("mlp_bias", False)),
            experts=int(config.get("num_local_experts", 0)) if model_type == "mixtral" else 0,
        )
    if model_type == "gpt2":
        h = int(config["n_embd"])
        heads = int(config["n_head"])
        return TransformerShape(
            family="gpt2",
            architecture=arch or "GPT2LMHeadModel",
            hidden=h,
            layers=int(config["n_layer"]),
            heads=heads,
            kv_heads=heads,
            head_dim=h // heads,
            intermediate=int(config.get("n_inner") or 4 * h),
            vocab=int(config["vocab_size"]),
            positions=int(config["n_positions"]),
            type_vocab=0,
            tied=bool(config.get("tie_word_embeddings", True)),
            qkv_bias=True,
            out_bias=True,
            mlp_bias=True,
            experts=0,
            materialised_attention=bool(config.get(MATERIALISED_ATTENTION_KEY, False)),
        )
    if model_type == "bert":
        if arch and arch not in _BERT_HEADS:
            raise UnsupportedWorkload(
                f"The closed form covers BERT as {', '.join(sorted(_BERT_HEADS))}, not {arch}."
            )
        h = int(config["hidden_size"])
        heads = int(config["num_attention_heads"])
        return TransformerShape(
            family="bert",
            architecture=arch or "BertModel",
            hidden=h,
            layers=int(config["num_hidden_layers"]),
            heads=heads,
            kv_heads=heads,
            head_dim=h // heads,
            intermediate=int(config["intermediate_size"]),
            vocab=int(config["vocab_size"]),
            positions=int(config.get("max_position_embeddings", 512)),
            type_vocab=int(config.get("type_vocab_size", 2)),
            tied=True,
            qkv_bias=True,
            out_bias=True,
            mlp_bias=True,
            experts=0,
            materialised_attention=bool(config.get(MATERIALISED_ATTENTION_KEY, False)),
        )
    raise UnsupportedWorkload(
        f"The closed-form path covers Llama, Mistral, Qwen2, Mixtral (parameters only), GPT-2 "
        f"and BERT configs, not model_type '{model_type or '?'}'; use the traced path."
    )


# --- parameters ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tensor:
    """One parameter tensor of the model: its name, shape and whether a GEMM consumes it."""

    name: str
    """Qualified name, with ``{i}`` for the layer index collapsed (``layers.q_proj.weight``)."""
    shape: tuple[int, ...]
    """Shape."""
    linear: bool
    """A linear layer's weight (autocast casts it to half; QLoRA quantises it, except heads)."""
    count: int = 1
    """How many such tensors (one per layer for block tensors)."""

    @property
    def numel(self) -> int:
        """Elements of one tensor."""
        return math.prod(self.shape)


def parameter_tensors(shape: TransformerShape) -> list[Tensor]:
    """Every parameter tensor of the model, tied weights once."""
    s = shape
    h, n, inter = s.hidden, s.layers, s.intermediate
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    out: list[Tensor] = []

    def add(name: str, dims: tuple[int, ...], linear: bool = False, count: int = n) -> None:
        out.append(Tensor(name, dims, linear, count))

    if s.family == "llama":
        add("embed_tokens", (s.vocab, h), count=1)
        for proj, width in (("q", q), ("k", kv), ("v", kv)):
            add(f"{proj}_proj.weight", (width, h), True)
            if s.qkv_bias:
                add(f"{proj}_proj.bias", (width,))
        add("o_proj.weight", (h, q), True)
        if s.out_bias:
            add("o_proj.bias", (h,))
        if s.experts:
            add("router.weight", (s.experts, h), True)
            add("experts.gate_up_proj", (s.experts, 2 * inter, h))
            add("experts.down_proj", (s.experts, h, inter))
        else:
            for proj, dims in (("gate", (inter, h)), ("up", (inter, h)), ("down", (h, inter))):
                add(f"{proj}_proj.weight", dims, True)
                if s.mlp_bias:
                    add(f"{proj}_proj.bias", (dims[0],))
        add("input_layernorm.weight", (h,))
        add("post_attention_layernorm.weight", (h,))
        add("norm.weight", (h,), count=1)
        if not s.tied:
            add("lm_head.weight", (s.vocab, h), True, count=1)
        return out
    if s.family == "gpt2":
        add("wte", (s.vocab, h), count=1)
        add("wpe", (s.positions, h), count=1)
        for name, (i, o) in (
            ("attn.c_attn", (h, 3 * h)),
            ("attn.c_proj", (h, h)),
            ("mlp.c_fc", (h, inter)),
            ("mlp.c_proj", (inter, h)),
        ):
            add(f"{name}.weight", (i, o), True)
            add(f"{name}.bias", (o,))
        for ln in ("ln_1", "ln_2"):
            add(f"{ln}.weight", (h,))
            add(f"{ln}.bias", (h,))
        add("ln_f.weight", (h,), count=1)
        add("ln_f.bias", (h,), count=1)
        return out
    # BERT
    add("word_embeddings", (s.vocab, h), count=1)
    add("position_embeddings", (s.positions, h), count=1)
    add("token_type_embeddings", (s.type_vocab, h), count=1)
    add("embeddings.LayerNorm.weight", (h,), count=1)
    add("embeddings.LayerNorm.bias", (h,), count=1)
    for name, (o, i) in (
        ("attention.self.query", (h, h)),
        ("attention.self.key", (h, h)),
        ("attention.self.value", (h, h)),
        ("attention.output.dense", (h, h)),
        ("intermediate.dense", (inter, h)),
        ("output.dense", (h, inter)),
    ):
        add(f"{name}.weight", (o, i), True)
        add(f"{name}.bias", (o,))
    for ln in ("attention.output.LayerNorm", "output.LayerNorm"):
        add(f"{ln}.weight", (h,))
        add(f"{ln}.bias", (h,))
    if s.architecture in ("BertForPreTraining", "BertModel"):
        add("pooler.dense.weight", (h, h), True, count=1)
        add("pooler.dense.bias", (h,), count=1)
    if s.architecture == "BertForPreTraining":
        add("cls.predictions.transform.dense.weight", (h, h), True, count=1)
        add("cls.predictions.transform.dense.bias", (h,), count=1)
        add("cls.predictions.transform.LayerNorm.weight", (h,), count=1)
        add("cls.predictions.transform.LayerNorm.bias", (h,), count=1)
        add("cls.predictions.bias", (s.vocab,), count=1)
        add("cls.seq_relationship.weight", (2, h), True, count=1)
        add("cls.seq_relationship.bias", (2,), count=1)
    if s.architecture == "BertForQuestionAnswering":
        add("qa_outputs.weight", (2, h), True, count=1)
        add("qa_outputs.bias", (2,), count=1)
    return out


def parameter_count(shape: TransformerShape) -> int:
    """All parameters (tied weights once): the sum over ``parameter_tensors``."""
    return sum(t.numel * t.count for t in parameter_tensors(shape))


def linear_weight_count(shape: TransformerShape) -> int:
    """Elements of the weights GEMMs read, the output layer's (tied or not) included."""
    own = sum(t.numel * t.count for t in parameter_tensors(shape) if t.linear)
    return (
        own
        + (shape.vocab * shape.hidden if shape.family != "bert" and shape.tied else 0)
        + (shape.vocab * shape.hidden if shape.family == "bert" and _bert_mlm(shape) else 0)
    )


def _bert_mlm(shape: TransformerShape) -> bool:
    return shape.architecture == "BertForPreTraining"


# --- model states ----------------------------------------------------------------------------


def precision_class(run: RunConfig) -> PrecisionClass:
    """``amp`` for fp16/bf16, ``fp32`` for fp32/tf32, ``pure`` for bf16-pure."""
    if run.precision in ("fp16", "bf16"):
        return "amp"
    if run.precision in ("fp32", "tf32"):
        return "fp32"
    if run.precision == "bf16-pure":
        return "pure"
    raise UnsupportedWorkload(f"The closed-form path does not cover --precision {run.precision}.")


def _weight_bytes_per_element(run: RunConfig) -> int:
    """Bytes of a trainable weight (and of its gradient and Adam states): fp32 except bf16-pure."""
    return 2 if precision_class(run) == "pure" else 4


@dataclass(frozen=True)
class ModelStates:
    """Bytes of the weights, gradients and optimizer state, and the trainable count."""

    params_total: int
    """All parameters (a 4-bit weight counts its logical elements)."""
    params_trainable: int
    """Parameters the optimizer updates."""
    weights_bytes: int
    """Weights (and QLoRA's quantisation state)."""
    gradients_bytes: int
    """Gradients of the trainable parameters, each in its parameter's dtype."""
    optimizer_bytes: int
    """Optimizer state."""
    optimizer_temporary_bytes: int
    """Largest temporary of the optimizer step."""


def _lora_targets(shape: TransformerShape) -> list[Tensor]:
    """The layers LoRA adapts by default (the workloads' targets: attention and MLP)."""
    names = {
        "llama": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
        "gpt2": ("c_attn", "c_proj", "c_fc"),
        "bert": ("query", "key", "value", "dense"),
    }[shape.family]
    return [
        t
        for t in parameter_tensors(shape)
        if t.linear and t.name.split(".weight")[0].rsplit(".", 1)[-1] in names
    ]


def model_states(shape: TransformerShape, run: RunConfig) -> ModelStates:
    """Weights, gradients and optimizer state of ``run`` on this model, exact in bytes.

    - full: weights ``4·P`` (``2·P`` bf16-pure), gradients the same, optimizer per
      ``optimizer_state_bytes``.
    - lora: the base frozen in half (fp32 for fp32/tf32), adapters ``r·(in + out)`` per
      target in the trainable dtype; gradients and optimizer state for the adapters only.
    - qlora: every linear layer but the output layers in NF4 (``n/2`` bytes, one uint8 absmax
      code per 64, one fp32 scale per 256 codes, a 4-byte offset, and the 16 + 256 fp32 code
      tables per layer); the rest as in lora.
    """
    tensors = parameter_tensors(shape)
    total = sum(t.numel * t.count for t in tensors)
    w = _weight_bytes_per_element(run)
    trainable: list[tuple[tuple[int, ...], int]]
    if run.method == "full":
        trainable = [(t.shape, t.count) for t in tensors]
        weights = total * w
    else:
        half = 4 if precision_class(run) == "fp32" else 2
        targets = _lora_targets(shape)
        rank = run.lora_rank
        adapters: list[tuple[tuple[int, ...], int]] = []
        for t in targets:
            adapters.append(((rank, _in_features(t)), t.count))
            adapters.append(((_out_features(t), rank), t.count))
        trainable = adapters
        adapter_bytes = sum(math.prod(d) * c for d, c in adapters) * w
        if run.method == "lora":
            weights = total * half + adapter_bytes
        else:
            quantised = [t for t in tensors if (t.linear and t.count > 1) or _is_block_linear(t)]
            q_elems = sum(t.numel * t.count for t in quantised)
            nf4 = sum(_nf4_bytes(t.numel) * t.count for t in quantised)
            weights = (total - q_elems) * half + nf4 + adapter_bytes
    p_trainable = sum(math.prod(d) * c for d, c in trainable)
    state, temporary = optimizer_state_bytes(run, trainable, w)
    return ModelStates(
        params_total=total,
        params_trainable=p_trainable,
        weights_bytes=weights,
        gradients_bytes=p_trainable * w,
        optimizer_bytes=state,
        optimizer_temporary_bytes=temporary,
    )


def _in_features(t: Tensor) -> int:
    """Input width of a linear weight (GPT-2's ``Conv1D`` stores ``(in, out)``)."""
    return t.shape[0] if t.name.startswith(("attn.c_", "mlp.c_")) else t.shape[-1]


def _out_features(t: Tensor) -> int:
    return t.shape[-1] if t.name.startswith(("attn.c_", "mlp.c_")) else t.shape[0]


def _is_block_linear(t: Tensor) -> bool:
    return t.linear and t.name.startswith(("pooler", "cls.predictions.transform"))


def _nf4_bytes(n: int) -> int:
    blocks = -(-n // NF4_BLOCK)
    groups = -(-blocks // NF4_ABSMAX_BLOCK)
    return (n + 1) // 2 + blocks + 4 * groups + 4 + 4 * (16 + 256)


def optimizer_state_bytes(
    run: RunConfig, trainable: Sequence[tuple[tuple[int, ...], int]], w: int
) -> tuple[int, int]:
    """``(state, largest temporary)`` bytes of the optimizer over ``(shape, count)`` tensors.

    - adamw (foreach): ``m`` and ``v`` in the parameter dtype, ``2·w·P_t``; one temporary the
      size of all parameters (``sqrt(v)``), ``w·P_t``.
    - sgd (momentum, foreach): one buffer, ``w·P_t``; no temporary.
    - adamw-8bit: per tensor of ``n >= 4096`` elements ``2·n`` + ``2·4·ceil(n/256)`` (uint8
      states, fp32 absmax per 256), smaller ones ``8·n`` (fp32 states); temporaries of one
      chunk, ``(12 or 20)·min(n_max, 4 Mi)`` bytes (fp32 or bf16 parameters).
    - adafactor (torch, no momentum): per matrix ``(..., r, c)`` a row and a column factor,
      ``w·(prod(...)·(r + c))``; per vector a full second moment; one temporary the size of
      all parameters, ``w·P_t``.
    """
    p = sum(math.prod(d) * c for d, c in trainable)
    if run.optimizer == "adamw":
        return 2 * w * p, w * p
    if run.optimizer == "sgd":
        return w * p, 0
    if run.optimizer == "adamw-8bit":
        state = 0
        for dims, count in trainable:
            n = math.prod(dims)
            if n >= ADAMW_8BIT_MIN_SIZE:
                state += count * (2 * n + 2 * 4 * -(-n // ADAMW_8BIT_BLOCK))
            else:
                state += count * 8 * n
        largest = max((math.prod(d) for d, _ in trainable), default=0)
        per_element = 12 if w == 4 else 20
        return state, per_element * min(largest, ADAMW_8BIT_CHUNK)
    if run.optimizer == "adafactor":
        state = 0
        for dims, count in trainable:
            if len(dims) >= 2:
                state += count * w * math.prod(dims[:-2]) * (dims[-2] + dims[-1])
            else:
                state += count * w * math.prod(dims)
        return state, w * p
    raise UnsupportedWorkload(f"The closed-form path does not cover --optimizer {run.optimizer}.")


# --- activations -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ActivationTerms:
    """Bytes saved for backward, by what they scale with (see ``saved_bytes``)."""

    per_layer_token_bytes: int
    """``a_layer``: per transformer block and token."""
    per_layer_token_position_bytes: int
    """``a_scores``: per block, token and key position (materialised attention scores)."""
    per_token_bytes: int
    """``a_tail``: per token outside the blocks (embeddings, final norm, head, log-softmax)."""
    per_position_bytes: int
    """``a_pos``: per position, shared by the batch (rotary tables, position ids)."""
    per_sample_bytes: int
    """``a_sample``: per sequence (pooler, sentence-level heads)."""
    constant_bytes: int
    """``c_weights``: independent of the sizes (AMP's half copies of the linear weights)."""
    forward_held_per_layer_token_bytes: int
    """Freed only when the forward's output is dropped: a key/value cache, per block, token."""

    def saved_bytes(self, layers: int, batch_size: int, seq_len: int) -> int:
        """``A = n·T·a_layer + n·T·L·a_scores + T·a_tail + L·a_pos + b·a_sample + c``."""
        tokens = batch_size * seq_len
        return (
            layers * tokens * self.per_layer_token_bytes
            + layers * tokens * seq_len * self.per_layer_token_position_bytes
            + tokens * self.per_token_bytes
            + seq_len * self.per_position_bytes
            + batch_size * self.per_sample_bytes
            + self.constant_bytes
        )


def activation_terms(shape: TransformerShape, run: RunConfig) -> ActivationTerms:
    """What one training step saves for backward, per family and precision class.

    Llama family (RMSNorm, RoPE, SDPA, SwiGLU), per block and token:

    - amp: ``26h + 4q + 4kv + 4H + 8I + 8`` — the fp32 residual entering each RMSNorm (``4h``,
      twice), its ``x·rsqrt`` (``4h``, twice) and ``rsqrt`` (4, twice); a half copy of the
      normed input per projection (q, k, v: ``6h``; gate, up: ``4h``); the half q, k, v handed
      to SDPA (``2q + 2kv + 2kv``), its output (``2q``) and log-sum-exp (``4H``); gate, SiLU,
      up and product outputs (``4·2I``). Tail ``10h + 4 + 4V + 8``; rotary tables ``8d`` per
      position; constant ``2·P_linear``. Held to the end of the forward: the fp32 key/value
      cache, ``8kv``.
    - fp32: ``24h + 8q + 8kv + 4H + 16I + 8``; tail ``12h + 4 + 4V + 8``; ``8d`` per position.
    - pure: ``16h + 4q + 4kv + 4H + 8I + 8`` (each RMSNorm saves an fp32 copy of its input,
      ``rsqrt``, its half ``x·rsqrt`` and output); tail ``8h + 4 + 4V + 8``; ``4d`` per
      position.

    GPT-2 (amp; attention dropout inside the fused kernel): per block ``26h + 16I + 16 + 4H``
    (LayerNorm inputs and statistics, half casts, the half q/k/v, output and log-sum-exp
    SDPA saves, the one-byte masks of the residual branches' dropouts, the five tensors of
    ``gelu_new``, three of them fp32 under CUDA's autocast); tail ``7h + 8 + 4V + 8`` (the
    embeddings' dropout mask among them); position ids ``8`` per position; held: the half
    key/value cache ``4h``. With materialised scores (the math path) the block saved ``28h +
    16I + 16`` (fp32 q/k/v for the score GEMMs instead) and ``12H`` per key position
    (softmax output, the dropout mask and output of the CPU math kernel).

    BERT (amp / fp32; fused as GPT-2): per block ``27h + 4I + 16 + 4H`` / ``36h + 8I + 16 +
    4H``; materialised (``bert-base``, ``bert-squad``): ``32h + 4I + 16`` / ``34h + 8I + 16``
    and ``12H`` per key position. Embeddings ``5h + 8``; the MLM head ``8h + 4 + 4V`` /
    ``16h + 8 + 4V`` (logits for every token); pooler and NSP ``4h + 8`` per sequence; the QA
    head ``2h + 8`` / ``4h + 8`` per token and ``16`` per sequence. Every dropout outside the
    attention keeps CUDA's one-byte mask (the tracer runs ``native_dropout``).

    The fused blocks' ``h`` coefficients were read off the stored traces' bytes per token
    (the difference of two batch sizes) when the tracer moved to the fused kernel, and match
    them to 0.1 % (``scripts/calibrate_closed_form.py`` prints every point).
    """
    s = shape
    h, inter, heads, d = s.hidden, s.intermediate, s.heads, s.head_dim
    q, kv, vocab = s.heads * s.head_dim, s.kv_heads * s.head_dim, s.vocab
    cls = precision_class(run)
    weights = 2 * linear_weight_count(s) if cls == "amp" else 0
    loss = 4 * vocab + 8  # fp32 log-softmax output, int64 shifted labels
    if s.experts:
        raise UnsupportedWorkload(
            "The closed-form path counts mixture-of-experts parameters but not their routed "
            "activations; use the traced path for Mixtral."
        )
    if s.family == "llama":
        layer = {
            "amp": 26 * h + 4 * q + 4 * kv + 4 * heads + 8 * inter + 8,
            "fp32": 24 * h + 8 * q + 8 * kv + 4 * heads + 16 * inter + 8,
            "pure": 16 * h + 4 * q + 4 * kv + 4 * heads + 8 * inter + 8,
        }[cls]
        tail = {"amp": 10 * h + 4, "fp32": 12 * h + 4, "pure": 8 * h + 4}[cls] + loss
        rotary = 2 * d * (2 if cls == "pure" else 4)
        held = 8 * kv if cls == "amp" else 0
        return ActivationTerms(layer, 0, tail, rotary, 0, weights, held)
    if s.family == "gpt2":
        if cls != "amp":
            raise UnsupportedWorkload(
                "The closed-form path covers GPT-2 under AMP (fp16/bf16) only; use the traced "
                "path for fp32 or bf16-pure."
            )
        # gelu_new under CUDA's autocast: pow's fp32 copy of its input, tanh's output and
        # 1 + tanh in fp32, 0.5·x and c_proj's input cast in half (``trace.cuda_autocast``)
        if s.materialised_attention:
            layer, per_position = 28 * h + 16 * inter + 16, 12 * heads
        else:
            layer, per_position = 26 * h + 16 * inter + 16 + 4 * heads, 0
        return ActivationTerms(layer, per_position, 7 * h + 8 + loss, 8, 0, weights, 4 * h)
    if cls == "pure":
        raise UnsupportedWorkload(
            "The closed-form path covers BERT in fp32 and AMP only; use the traced path for "
            "bf16-pure."
        )
    amp = cls == "amp"
    if s.materialised_attention:
        layer = (32 * h + 4 * inter + 16) if amp else (34 * h + 8 * inter + 16)
        per_position = 12 * heads
    else:
        layer = (27 * h + 4 * inter if amp else 36 * h + 8 * inter) + 16 + 4 * heads
        per_position = 0
    tail = 5 * h + 8
    sample = 0
    if s.architecture == "BertForPreTraining":
        tail += (8 * h + 4 if amp else 16 * h + 8) + 4 * vocab
        sample = 4 * h + 8
    elif s.architecture == "BertForQuestionAnswering":
        tail += (2 * h if amp else 4 * h) + 8
        sample = 16
    return ActivationTerms(layer, per_position, tail, 0, sample, weights, 0)


# --- calibrated coefficients -----------------------------------------------------------------

COEFFICIENTS_FILE = "closed_form_coefficients.json"
"""Fitted by ``scripts/calibrate_closed_form.py --fit`` (``whichgpu/estimate/data/``)."""


@dataclass(frozen=True)
class Coefficients:
    """The closed form's fitted numbers (data, with provenance), not derived from the code."""

    safety_fraction: float
    """Added to every phase: the largest shortfall of the analytic phases against the traces
    (allocator blocks larger than the request when a cached block is not split, and the
    small temporaries of GPT-2's and BERT's heads and materialised attention that the
    analytic phases leave out), so that the closed form errs high."""
    provenance: str
    """Script, date and data the numbers were fitted from."""
    reserved_factor: float
    """Peak reserved bytes per closed-form allocated byte, workspaces apart: the largest
    ratio of a trace's replayed peak reserved bytes (its cuBLAS workspaces' own segments
    taken out) to the closed form's peak allocated bytes, so that ``reserved_bytes`` is
    never below a trace at the points it was fitted on."""
    reserved_provenance: str
    """Script, date and points ``reserved_factor`` was fitted from."""


@functools.cache
def load_coefficients() -> Coefficients:
    """The shipped coefficients (``data/closed_form_coefficients.json``; read once)."""
    from importlib import resources

    data = resources.files("whichgpu.estimate").joinpath("data").joinpath(COEFFICIENTS_FILE)
    doc = json.loads(data.read_text(encoding="utf-8"))
    return Coefficients(
        safety_fraction=float(doc["safety_fraction"]),
        provenance=str(doc["provenance"]),
        reserved_factor=float(doc["reserved_factor"]),
        reserved_provenance=str(doc["reserved_provenance"]),
    )


def reserved_bytes(allocated_bytes: int) -> int:
    """Peak reserved bytes (the caching allocator's segments, workspaces apart) for a
    closed-form peak of ``allocated_bytes``: ``ceil(reserved_factor · allocated)``."""
    return math.ceil(load_coefficients().reserved_factor * allocated_bytes)


# --- the estimate ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ClosedFormEstimate:
    """Memory of one training step from the closed form (see the module for every formula)."""

    family: Family
    """Implementation family the formulas follow."""
    batch_size: int
    """Sequences per step ``b``."""
    seq_len: int
    """Tokens per sequence ``L``."""
    params_total: int
    """All parameters, exact from the config."""
    params_trainable: int
    """Parameters the optimizer updates."""
    weights_bytes: int
    """Weights ``W``."""
    gradients_bytes: int
    """Gradients ``G``."""
    optimizer_bytes: int
    """Optimizer state ``S``."""
    activations_bytes: int
    """Saved for backward at the end of the forward pass, ``A``."""
    activation_peak_bytes: int
    """Largest activation-related excess over the model states: ``A`` plus the loss and
    forward-held temporaries at the larger of ``forward_end`` and ``backward_start``."""
    phases: dict[PhaseName, int]
    """Allocated bytes at each named phase's peak."""
    peak_allocated_bytes: int
    """The step's peak of allocated bytes: the largest phase."""
    peak_phase: PhaseName
    """Where the peak occurs."""


def estimate(
    config: Mapping[str, Any], run: RunConfig, batch_size: int, seq_len: int
) -> ClosedFormEstimate:
    """The closed-form memory of a training step of ``config`` at ``(batch_size, seq_len)``."""
    if run.mode != "train":
        raise UnsupportedWorkload("The closed-form path covers training steps only.")
    if run.method != "full" or run.checkpointing:
        raise UnsupportedWorkload(
            "The closed-form path gives model states for LoRA/QLoRA (model_states) but no "
            "activations for them or for checkpointing yet; use the traced path."
        )
    if run.loss_kernel in ("chunked", "fused-linear") or run.grad_accum > 1:
        raise UnsupportedWorkload(
            "The closed-form path has no terms for chunked losses or gradient accumulation "
            "yet; use the traced path."
        )
    shape = parse_config(config)
    states = model_states(shape, run)
    terms = activation_terms(shape, run)
    cls = precision_class(run)
    tokens = batch_size * seq_len
    saved = terms.saved_bytes(shape.layers, batch_size, seq_len)
    vocab_logits = shape.family != "bert" or _bert_mlm(shape)
    logits_half = 0 if cls == "fp32" or not vocab_logits else 2 * tokens * shape.vocab
    logits_fp32 = 4 * tokens * shape.vocab if vocab_logits else 0
    coefficients = load_coefficients()
    # the model's output, held until the step ends (``workloads.hf.loss_from_output``): the
    # logits in the dtype the head made them (half under AMP and pure; in fp32 they are the
    # very tensor the loss reads) and the key/value cache a ``use_cache`` model returns
    held = shape.layers * tokens * terms.forward_held_per_layer_token_bytes
    held += logits_half if cls != "fp32" else logits_fp32
    w, g, s = states.weights_bytes, states.gradients_bytes, states.optimizer_bytes
    grad_bytes = _weight_bytes_per_element(run)
    tied_sum = 2 * shape.vocab * shape.hidden * grad_bytes if shape.tied else 0
    fp32_copy = logits_fp32 if cls != "fp32" else 0  # ``logits.float()`` is the logits in fp32
    phases: dict[PhaseName, int] = {
        "forward_end": w + s + saved + fp32_copy + held,
        "backward_start": w + s + saved + 2 * logits_fp32 + held,
        "backward_end": w + s + g + tied_sum + held,
        "optimizer": w + s + g + states.optimizer_temporary_bytes + held,
    }
    margin = 1 + coefficients.safety_fraction
    phases = {k: math.ceil(v * margin) for k, v in phases.items()}
    peak_phase = max(phases, key=lambda k: phases[k])
    return ClosedFormEstimate(
        family=shape.family,
        batch_size=batch_size,
        seq_len=seq_len,
        params_total=states.params_total,
        params_trainable=states.params_trainable,
        weights_bytes=w,
        gradients_bytes=g,
        optimizer_bytes=s,
        activations_bytes=saved,
        activation_peak_bytes=max(phases["forward_end"], phases["backward_start"]) - w - s,
        phases=phases,
        peak_allocated_bytes=phases[peak_phase],
        peak_phase=peak_phase,
    )


# --- cross-check against the traced path ------------------------------------------------------

DEFAULT_POINTS: tuple[tuple[int, int], ...] = tuple((b, L) for b in (1, 4, 16) for L in (512, 2048))
"""``(batch, seq_len)`` points of the calibration table."""
RESERVED_POINTS: tuple[tuple[int, int], ...] = tuple(
    (b, L) for b in (1, 4, 16, 64) for L in (512, 2048)
)
"""``(batch, seq_len)`` points ``reserved_factor`` is fitted on (larger batches too: the
allocator's cache grows unevenly with the sizes)."""


@dataclass(frozen=True)
class CrossCheckRow:
    """One comparison of the closed form with a stored (traced) profile."""

    workload: str
    """Workload name."""
    profile: str
    """Stored profile key (workload, mode, precision, optimizer)."""
    batch_size: int
    """Batch size."""
    seq_len: int
    """Sequence length (capped at the model's positions)."""
    traced_bytes: int
    """Peak allocated bytes of the replayed trace (no workspaces): the reference."""
    closed_form_bytes: int
    """Peak allocated bytes of the closed form."""
    relative_error: float
    """``closed_form / traced - 1``; positive means the closed form is higher (safe side)."""
    phase: PhaseName
    """The closed form's peak phase."""
    traced_reserved_bytes: int
    """Peak reserved bytes of the replayed trace (no workspaces)."""
    closed_form_reserved_bytes: int
    """``reserved_bytes`` of the closed form's peak: what ``fit --fast`` adds the workspaces,
    the CUDA context and the rest to."""

    @property
    def reserved_error(self) -> float:
        """``closed_form_reserved / traced_reserved - 1``; positive is the safe side."""
        return self.closed_form_reserved_bytes / self.traced_reserved_bytes - 1


def closed_form_workloads() -> list[str]:
    """Named workloads whose shipped config the closed form covers (stored profiles exist)."""
    return [
        "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl",
        "llama-3.2-1b", "llama-3.2-3b", "llama-3.1-8b", "llama-3.1-70b", "mistral-7b",
        "qwen2.5-7b", "qwen2.5-14b", "qwen2.5-32b",
        "bert-base", "bert-large", "bert-squad",
    ]  # fmt: skip


def workload_config(workload: str) -> dict[str, Any]:
    """The Hugging Face config of a named workload (as its ``build`` uses it)."""
    from whichgpu.workloads.hf import read_config

    if workload == "bert-squad":
        config = {**read_config("bert-base"), "architectures": ["BertForQuestionAnswering"]}
    else:
        config = read_config(workload)
    if workload in MATERIALISED_ATTENTION_WORKLOADS:
        config[MATERIALISED_ATTENTION_KEY] = True
    return config


def cross_check(
    workloads: Iterable[str] | None = None,
    points: Iterable[tuple[int, int]] = DEFAULT_POINTS,
    runs: Iterable[RunConfig] | None = None,
) -> list[CrossCheckRow]:
    """Closed form vs the replayed stored profiles, for each workload, run and point.

    ``runs`` defaults to every stored training precision (optimizer AdamW). Points beyond a
    model's positions are capped at them (duplicates dropped). Profiles not stored are skipped.
    Imports the traced path's replay (numpy), not torch.
    """
    from whichgpu.estimate.memory import StepMemory
    from whichgpu.profiles.stored import load_stored

    names = list(workloads) if workloads is not None else closed_form_workloads()
    run_list = (
        list(runs)
        if runs is not None
        else [RunConfig(precision="bf16"), RunConfig(precision="fp32")]
    )
    wanted = list(points)
    rows: list[CrossCheckRow] = []
    for name in names:
        config = workload_config(name)
        shape = parse_config(config)
        for run in run_list:
            profile = load_stored(name, run)
            if profile is None:
                continue
            memory = StepMemory(profile)
            seen: set[tuple[int, int]] = set()
            for b, length in wanted:
                length = min(length, shape.positions) if shape.positions else length
                if (b, length) in seen:
                    continue
                seen.add((b, length))
                replay = memory.replay(b, length, ())
                traced = replay.peak_allocated_bytes
                closed = estimate(config, run, b, length)
                rows.append(
                    CrossCheckRow(
                        workload=name,
                        profile=f"{name}_{run.mode}_{run.precision}_{run.optimizer}",
                        batch_size=b,
                        seq_len=length,
                        traced_bytes=traced,
                        closed_form_bytes=closed.peak_allocated_bytes,
                        relative_error=closed.peak_allocated_bytes / traced - 1,
                        phase=closed.peak_phase,
                        traced_reserved_bytes=replay.peak_reserved_bytes,
                        closed_form_reserved_bytes=reserved_bytes(closed.peak_allocated_bytes),
                    )
                )
    return rows
