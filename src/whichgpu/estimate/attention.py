"""Which kernel PyTorch's scaled-dot-product attention runs on a CUDA GPU, and its memory.

The tracer runs SDPA on the CPU, where it is always the fused CPU flash kernel, and records the
shape of every call (``OpRecord.attention``). On a GPU, ``F.scaled_dot_product_attention``
picks one of four backends (flash, memory-efficient, cuDNN, math) by the GPU's compute
capability, the dtype, the head size and the call; this module applies PyTorch's own rules,
restated here (not copied), and counts the extra bytes of the math fallback or a fused
kernel's padding. Pure Python: no torch import.

The rules and their sources: docs/memory.md, "PyTorch's SDPA backend rules".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from whichgpu.schema import GpuSpec, OpRecord

AttentionBackend = Literal["flash", "efficient", "cudnn", "math"]
"""The SDPA kernels of PyTorch on CUDA."""

SmVersion = tuple[int, int]
"""A CUDA compute capability as (major, minor)."""

FLASH_SM_RANGE: tuple[SmVersion, SmVersion] = ((8, 0), (12, 1))
"""Architectures flash attention runs on (``check_flash_attention_hardware_support``)."""
EFFICIENT_SM_RANGE: tuple[SmVersion, SmVersion] = ((5, 0), (12, 1))
"""Architectures memory-efficient attention runs on (``check_mem_efficient_hardware_support``)."""
CUDNN_SM_RANGE: tuple[SmVersion, SmVersion] = ((8, 0), (12, 1))
"""Architectures cuDNN attention runs on (``check_cudnn_hardware_support``)."""
CUDNN_PREFERRED_MAJORS = (9, 10)
"""Architectures where a recent cuDNN goes first (``check_prefer_cudnn_attention``)."""
FLASH_MAX_HEAD_DIM = 256
"""Largest head size flash attention takes (``check_head_dim_size_flash``)."""
CUDNN_MAX_HEAD_DIM = 128
"""Largest head size cuDNN attention takes without cuDNN > 9.22 (``check_cudnn_tensor_shapes``)."""
FLASH_TRAIN_SM_RANGES: tuple[tuple[SmVersion, SmVersion], ...] = (
    ((8, 6), (8, 9)),
    ((12, 0), (12, 1)),
)
"""Architectures whose flash backward cannot take every head size (smaller shared memory)."""
FLASH_HEAD_DIM_PAD = 8
"""Flash on CUDA pads head_dim to a multiple of this (``pad_last_dim<8>``)."""
EFFICIENT_MASK_PAD = 8
"""Memory-efficient attention pads a mask's kv_len to a multiple of this (``preprocess_mask``)."""

_DTYPES = {
    "fp16": "fp16",
    "float16": "fp16",
    "half": "fp16",
    "bf16": "bf16",
    "bfloat16": "bf16",
    "fp32": "fp32",
    "float32": "fp32",
    "float": "fp32",
    "tf32": "fp32",
    "fp64": "fp64",
    "float64": "fp64",
    "double": "fp64",
}
_DTYPE_BYTES = {"fp16": 2, "bf16": 2, "fp32": 4, "fp64": 8}
_HALF = ("fp16", "bf16")
_FP32_BYTES = 4


@dataclass(frozen=True)
class AttentionChoice:
    """The SDPA backend PyTorch would run for one kind of attention call on one GPU."""

    backend: AttentionBackend
    """``flash``, ``efficient`` (memory-efficient, CUTLASS), ``cudnn`` or ``math``."""
    reason: str
    """Why: what ruled out each backend tried before it, and that this one passed."""
    compute_capability: str
    """The GPU's CUDA compute capability the rules were applied to (``8.0``)."""
    dtype: str
    """Dtype of q, k and v, normalised (``fp16``, ``bf16``, ``fp32``, ``fp64``)."""
    head_dim: int
    """Size of one attention head."""
    training: bool
    """Whether q, k or v require gradients (a training step)."""
    has_mask: bool
    """Whether an explicit ``attn_mask`` is passed."""
    dropout: bool
    """Whether attention dropout is on."""


@dataclass(frozen=True)
class _Shape:
    batch: int
    q_heads: int
    kv_heads: int
    q_len: int
    kv_len: int
    head_dim: int
    causal: bool
    masked: bool
    mask_rows: int | None
    """The mask's elements per key position (None: not recorded, in an older profile)."""


def parse_compute_capability(text: str) -> SmVersion:
    """``"8.6"`` -> (8, 6)."""
    major, _, minor = text.strip().partition(".")
    return int(major), int(minor or 0)


def normalise_dtype(dtype: str) -> str:
    """``bfloat16``/``bf16`` -> ``bf16`` and so on; unknown names are returned lower-cased."""
    return _DTYPES.get(dtype.strip().lower().removeprefix("torch."), dtype.strip().lower())


def _in_range(sm: SmVersion, bounds: tuple[SmVersion, SmVersion]) -> bool:
    return bounds[0] <= sm <= bounds[1]


def _sm_text(sm: SmVersion) -> str:
    return f"sm{sm[0]}{sm[1]}"


def efficient_head_dim_alignment(sm: SmVersion, dtype: str) -> int:
    """``minimum_gemm_alignment``: what head_dim must be a multiple of for memory-efficient
    attention. Tensor cores are used from sm80, and on sm70..sm79 for fp16/bf16."""
    half = dtype in _HALF
    tensor_cores = sm[0] >= 8 or (sm[0] >= 7 and half)
    alignment = 4 if sm[0] >= 8 else 1
    if tensor_cores:
        alignment = max(alignment, 128 // (16 if half else 32))
    return alignment


def _flash_refusal(
    sm: SmVersion,
    dtype: str,
    head_dim: int,
    *,
    training: bool,
    has_mask: bool,
    causal_non_square: bool,
    dropout: bool,
) -> str | None:
    if has_mask:
        return "flash takes no attn_mask"
    if head_dim > FLASH_MAX_HEAD_DIM:
        return f"flash needs head_dim <= {FLASH_MAX_HEAD_DIM}"
    if not _in_range(sm, FLASH_SM_RANGE):
        return "flash needs sm80..sm121"
    if training and any(_in_range(sm, r) for r in FLASH_TRAIN_SM_RANGES):
        supported = head_dim <= 192 or (not dropout and head_dim > 224)
        if not supported:
            return f"flash cannot train head_dim {head_dim} on {_sm_text(sm)}"
    if causal_non_square:
        return "flash takes is_causal only with q_len == kv_len"
    if dtype not in _HALF:
        return f"flash needs fp16/bf16, not {dtype}"
    return None


def _efficient_refusal(sm: SmVersion, dtype: str, head_dim: int) -> str | None:
    if not _in_range(sm, EFFICIENT_SM_RANGE):
        return "efficient needs sm50..sm121"
    alignment = efficient_head_dim_alignment(sm, dtype)
    if head_dim % alignment:
        return f"efficient needs head_dim a multiple of {alignment}"
    allowed = ("fp16", "fp32", "bf16") if sm[0] >= 8 else ("fp16", "fp32")
    if dtype not in allowed:
        return f"efficient takes {'/'.join(allowed)} on {_sm_text(sm)}, not {dtype}"
    return None


def _cudnn_refusal(sm: SmVersion, dtype: str, head_dim: int, kv_len: int | None) -> str | None:
    if dtype not in _HALF or (dtype == "bf16" and sm[0] < 8):
        return f"cudnn needs fp16/bf16, not {dtype}"
    if not _in_range(sm, CUDNN_SM_RANGE):
        return "cudnn needs sm80..sm121"
    if head_dim > CUDNN_MAX_HEAD_DIM or head_dim % 8:
        return f"cudnn needs head_dim <= {CUDNN_MAX_HEAD_DIM} and a multiple of 8"
    if kv_len == 1:
        return "cudnn takes no kv_len of 1"
    return None


def attention_backend(
    gpu: GpuSpec,
    dtype: str,
    head_dim: int,
    *,
    training: bool,
    has_mask: bool,
    causal_non_square: bool = False,
    kv_len: int | None = None,
    dropout: bool = False,
    prefer_cudnn: bool = False,
) -> AttentionChoice:
    """The backend ``F.scaled_dot_product_attention`` picks on ``gpu`` (PyTorch's rules).

    ``causal_non_square``: ``is_causal`` with q_len != kv_len (a prefill over a cache).
    ``kv_len`` only matters for cuDNN. ``prefer_cudnn``: the PyTorch install has a cuDNN newer
    than 9.15.0, so cuDNN is tried first on sm90/sm10x (a property of the install, not of the
    GPU). Raises ``ValueError`` for a GPU without a CUDA compute capability (not NVIDIA).
    """
    if gpu.compute_capability is None:
        raise ValueError(
            f"{gpu.id} has no CUDA compute capability; PyTorch's SDPA backend rules are "
            "modelled for NVIDIA GPUs only."
        )
    sm = parse_compute_capability(gpu.compute_capability)
    kind = normalise_dtype(dtype)
    refusals = {
        "flash": _flash_refusal(
            sm,
            kind,
            head_dim,
            training=training,
            has_mask=has_mask,
            causal_non_square=causal_non_square,
            dropout=dropout,
        ),
        "efficient": _efficient_refusal(sm, kind, head_dim),
        "cudnn": _cudnn_refusal(sm, kind, head_dim, kv_len),
        "math": None,
    }
    order: list[AttentionBackend] = ["flash", "efficient", "math"]
    if prefer_cudnn and sm[0] in CUDNN_PREFERRED_MAJORS:
        order.insert(0, "cudnn")
    tried: list[str] = []
    for backend in order:
        refusal = refusals[backend]
        if refusal is None:
            passed = f"{backend} on {_sm_text(sm)} with {kind}, head_dim {head_dim}"
            reason = "; ".join([*tried, passed])
            return AttentionChoice(
                backend=backend,
                reason=reason,
                compute_capability=gpu.compute_capability,
                dtype=kind,
                head_dim=head_dim,
                training=training,
                has_mask=has_mask,
                dropout=dropout,
            )
        tried.append(refusal)
    raise AssertionError("math always passes")  # pragma: no cover


def attention_backend_for_op(
    gpu: GpuSpec,
    op: OpRecord,
    *,
    training: bool,
    dropout: bool = False,
    prefer_cudnn: bool = False,
) -> AttentionChoice:
    """``attention_backend`` for a traced attention op (mask, causal and lengths from its
    ``attention`` shape). Raises ``ValueError`` for an op without one."""
    shape = _shape(op)
    return attention_backend(
        gpu,
        op.dtype,
        shape.head_dim,
        training=training,
        has_mask=shape.masked,
        causal_non_square=shape.causal and shape.q_len != shape.kv_len,
        kv_len=shape.kv_len,
        dropout=dropout,
        prefer_cudnn=prefer_cudnn,
    )


def _shape(op: OpRecord) -> _Shape:
    if op.attention is None or len(op.attention) < 8:
        raise ValueError(f"{op.name} has no attention shape.")
    b, hq, hk, lq, lk, d, causal, masked = op.attention[:8]
    rows = op.attention[8] if len(op.attention) > 8 else None
    return _Shape(b, hq, hk, lq, lk, d, bool(causal), bool(masked), rows)


class _Live:
    """Bytes of the tensors a kernel's composite path allocates and frees, and their peak."""

    def __init__(self, preallocated: dict[str, int] | None = None) -> None:
        self.sizes: dict[str, int] = dict(preallocated or {})
        self.peak = sum(self.sizes.values())

    def alloc(self, name: str, size: int) -> None:
        self.sizes[name] = size
        self.peak = max(self.peak, sum(self.sizes.values()))

    def free(self, *names: str) -> None:
        for name in names:
            self.sizes.pop(name, None)


def _math_forward(
    s: _Shape, dtype: str, training: bool, dropout: bool = False
) -> tuple[_Live, dict[str, int]]:
    """Simulate the allocations of ``_scaled_dot_product_attention_math`` (forward).

    Returns the allocation record after the call, and the tensors it keeps (besides its
    output) for backward when ``training``: scaled q and k^T, the probabilities, and v (the
    fp32 or GQA-expanded copy, when there is one); with ``dropout`` (training) also the
    dropout's mask (one byte per score, as CUDA's ``native_dropout`` keeps it) and the
    dropped probabilities that the product with v saves.
    """
    e = _DTYPE_BYTES.get(dtype, _FP32_BYTES)
    upcast = dtype in _HALF
    c = _FP32_BYTES if upcast else e
    ql = s.batch * s.q_heads * s.q_len * s.head_dim
    ks = s.batch * s.kv_heads * s.kv_len * s.head_dim
    qs = s.batch * s.q_heads * s.kv_len * s.head_dim
    scores = s.batch * s.q_heads * s.q_len * s.kv_len
    gqa = s.q_heads != s.kv_heads
    live = _Live()
    if upcast:
        live.alloc("q32", ql * c)
        live.alloc("k32", ks * c)
        live.alloc("v32", ks * c)
    live.alloc("q", ql * c)  # q * sqrt(scale)
    if s.causal:  # ones(L, S).tril() as a float mask
        live.alloc("ones", s.q_len * s.kv_len)
        live.alloc("tril", s.q_len * s.kv_len)
        live.free("ones")
        live.alloc("mask", s.q_len * s.kv_len * c)
        live.free("tril")
    if gqa:  # repeat_interleave of k and v to the query heads
        live.alloc("k_exp", qs * c)
        live.alloc("v_exp", qs * c)
    live.alloc("kT", qs * c)  # k^T * sqrt(scale)
    live.alloc("scores", scores * c)
    if not training:
        live.free("kT")
    live.alloc("probs", scores * c)  # the mask was added to the scores in place
    live.free("scores")
    dropped = training and dropout
    if dropped:
        live.alloc("dmask", scores)
        live.alloc("dropped", scores * c)
    if upcast:
        live.alloc("probs_out", scores * e)  # probs.to(dtype), the unused second result
        live.alloc("out32", ql * c)
        live.alloc("out", ql * e)
        live.free("out32")
    else:
        live.alloc("out", ql * e)
    value = "v_exp" if gqa else ("v32" if upcast else "")
    kept = (
        ("q", "kT", "probs", value, *(("dmask", "dropped") if dropped else ())) if training else ()
    )
    saved = {name: live.sizes[name] for name in kept if name in live.sizes}
    return live, saved


def _math_backward(s: _Shape, dtype: str, dropout: bool = False) -> int:
    """Peak bytes the math path's backward holds beyond what its forward saved (freed as
    autograd releases each node's saved tensors) and the gradients of q, k, v it returns (the
    fused backward returns those too)."""
    e = _DTYPE_BYTES.get(dtype, _FP32_BYTES)
    upcast = dtype in _HALF
    c = _FP32_BYTES if upcast else e
    ql = s.batch * s.q_heads * s.q_len * s.head_dim
    ks = s.batch * s.kv_heads * s.kv_len * s.head_dim
    qs = s.batch * s.q_heads * s.kv_len * s.head_dim
    scores = s.batch * s.q_heads * s.q_len * s.kv_len
    gqa = s.q_heads != s.kv_heads
    _, saved = _math_forward(s, dtype, training=True, dropout=dropout)
    live = _Live(saved)
    if upcast:
        live.alloc("g32", ql * c)  # grad of out.to(dtype)
    live.alloc("grad_v", qs * c)  # probs^T @ grad
    live.alloc("grad_probs", scores * c)  # grad @ v^T
    live.free("g32", "v_exp", "v32")
    if dropout:  # through the dropout: grad x mask x scale
        live.free("dropped")
        live.alloc("grad_kept", scores * c)
        live.free("grad_probs", "dmask")
        live.sizes["grad_probs"] = live.sizes.pop("grad_kept")
    live.alloc("grad_scores", scores * c)  # softmax backward
    live.free("grad_probs", "probs")
    live.alloc("grad_q_scaled", ql * c)
    live.alloc("grad_kT", qs * c)
    live.free("grad_scores", "q", "kT")
    live.alloc("grad_k_exp", qs * c)  # through the scaling of k^T
    live.free("grad_kT")
    if gqa:  # sum over each group of query heads
        live.alloc("grad_k", ks * c)
        live.free("grad_k_exp")
        live.alloc("grad_v_sum", ks * c)
        live.free("grad_v")
    live.alloc("grad_q", ql * c)  # through the scaling of q
    live.free("grad_q_scaled")
    if upcast:  # the gradients in the input dtype (what the fused backward returns)
        live.alloc("grad_q_out", ql * e)
        live.alloc("grad_k_out", ks * e)
        live.alloc("grad_v_out", ks * e)
    fused_outputs = (ql + 2 * ks) * e
    return max(0, live.peak - sum(saved.values()) - fused_outputs)


def _logsumexp_bytes(s: _Shape) -> int:
    return s.batch * s.q_heads * s.q_len * _FP32_BYTES


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _fused_extra(op: OpRecord, s: _Shape, choice: AttentionChoice) -> int:
    """Extra bytes of a fused CUDA kernel over the traced CPU kernel: flash's head_dim
    padding, the efficient kernel's padded copy of a mask; cuDNN none."""
    e = _DTYPE_BYTES.get(choice.dtype, _FP32_BYTES)
    if choice.backend == "flash" and s.head_dim % FLASH_HEAD_DIM_PAD:
        padded = _round_up(s.head_dim, FLASH_HEAD_DIM_PAD)
        ql, ks = s.batch * s.q_heads * s.q_len, s.batch * s.kv_heads * s.kv_len
        if _is_backward(op):  # padded grad_out and gradients, for the unpadded gradients
            return (2 * ql + 2 * ks) * padded * e - (ql + 2 * ks) * s.head_dim * e
        # padded q, k, v and output, for the unpadded output
        return (2 * ql + 2 * ks) * padded * e - ql * s.head_dim * e
    masked = s.masked and not _is_backward(op)
    if choice.backend == "efficient" and masked and s.kv_len % EFFICIENT_MASK_PAD:
        # a dense mask's strides are multiples of kv_len: aligned exactly when kv_len is.
        # Where the profile did not record the mask's shape, the largest it can broadcast to.
        rows = s.mask_rows if s.mask_rows is not None else s.batch * s.q_heads * s.q_len
        return rows * _round_up(s.kv_len, EFFICIENT_MASK_PAD) * e
    return 0


def _is_backward(op: OpRecord) -> bool:
    return op.phase == "backward" or op.name.endswith("_backward")


def extra_attention_bytes(op: OpRecord, choice: AttentionChoice) -> int:
    """Bytes a traced attention op needs at its peak on CUDA beyond what the traced CPU kernel
    allocated (its output and fp32 logsumexp; for a backward op, the gradients of q, k, v).

    Math backend, forward: the fp32 copies of q, k, v (fp16/bf16 inputs), scaled q and k^T, the
    causal mask, GQA-expanded k and v, and the batch x q_heads x q_len x kv_len scores and
    probabilities, both live during the softmax (4 bytes each for fp16/bf16 inputs), and with
    dropout its one-byte mask and the dropped probabilities; includes what
    ``saved_attention_bytes`` keeps. Backward: the two score-sized gradient matrices and
    the fp32 gradients. Flash, efficient, cuDNN: nothing, except flash's padding of head_dim to
    a multiple of 8 and the efficient kernel's padded copy of a mask when kv_len is not a
    multiple of 8. ``choice`` comes from ``attention_backend_for_op`` for this op.
    """
    s = _shape(op)
    if choice.backend != "math":
        return _fused_extra(op, s, choice)
    if _is_backward(op):
        return _math_backward(s, choice.dtype, choice.dropout)
    live, _ = _math_forward(s, choice.dtype, choice.training, choice.dropout)
    e = _DTYPE_BYTES.get(choice.dtype, _FP32_BYTES)
    fused = s.batch * s.q_heads * s.q_len * s.head_dim * e + _logsumexp_bytes(s)
    return max(0, live.peak - fused)


def saved_attention_bytes(op: OpRecord, choice: AttentionChoice) -> int:
    """Of ``extra_attention_bytes``, the bytes a forward op keeps until its backward (training).

    Math: scaled q and k^T, the fp32 probabilities (batch x q_heads x q_len x kv_len x 4 bytes
    for fp16/bf16) and the fp32 or expanded v, less the logsumexp the fused kernel would have
    kept. Efficient: its padded mask, when there is one. Flash's padded q, k, v and output.
    Zero for backward ops and when not training.
    """
    s = _shape(op)
    if not choice.training or _is_backward(op):
        return 0
    if choice.backend != "math":
        return _fused_extra(op, s, choice)
    _, saved = _math_forward(s, choice.dtype, training=True, dropout=choice.dropout)
    return max(0, sum(saved.values()) - _logsumexp_bytes(s))


@dataclass(frozen=True)
class AttentionExtra:
    """What a step's attention needs on one GPU beyond the traced (fused CPU) kernels."""

    saved_bytes: int
    """Kept from each forward attention call until its backward, summed over the calls."""
    transient_bytes: int
    """The largest extra any one call holds while it runs, beyond what it keeps."""
    backends: tuple[str, ...]
    """The backends the calls run on, each once (``math``, ``flash`` …)."""
    reason: str
    """Why the first call that needs extra bytes runs where it does (empty if none does)."""

    @property
    def total_bytes(self) -> int:
        """The bytes to add to the step's peak: all saved ones and the largest transient."""
        return self.saved_bytes + self.transient_bytes


def step_attention_extra(
    gpu: GpuSpec, ops: list[OpRecord], *, training: bool, dropout: bool
) -> AttentionExtra:
    """``extra_attention_bytes`` and ``saved_attention_bytes`` of every traced attention call
    of a step (``ops`` with concrete shapes) on ``gpu``, summed as the step holds them: the
    saved bytes of every forward call stay to its backward, and one call's transient is on
    top at a time. Each tensor is rounded up to the 2 MiB segments large blocks come in.
    Zero for a GPU without a CUDA compute capability (the rules are NVIDIA's)."""
    if gpu.compute_capability is None:
        return AttentionExtra(0, 0, (), "")
    saved = transient = 0
    backends: list[str] = []
    reason = ""
    # the layers of a model repeat the same calls: each distinct one is worked out once
    known: dict[tuple[str, str, str | None, tuple[int, ...]], tuple[AttentionChoice, int, int]]
    known = {}
    for op in ops:
        if op.kind != "attention" or op.attention is None or len(op.attention) < 8:
            continue
        key = (op.name, op.phase, op.dtype, op.attention)
        found = known.get(key)
        if found is None:
            choice = attention_backend_for_op(gpu, op, training=training, dropout=dropout)
            extra = _segments(extra_attention_bytes(op, choice))
            kept = _segments(saved_attention_bytes(op, choice))
            found = known[key] = (choice, extra, kept)
        choice, extra, kept = found
        if choice.backend not in backends:
            backends.append(choice.backend)
        if extra and not reason:
            reason = choice.reason
        saved += kept
        transient = max(transient, extra - kept)
    return AttentionExtra(saved, transient, tuple(backends), reason)


_SEGMENT_BYTES = 2 * 1024 * 1024
"""Large blocks are carved from segments rounded to 2 MiB (``kRoundLarge``)."""


def _segments(nbytes: int) -> int:
    return _round_up(nbytes, _SEGMENT_BYTES) if nbytes > 0 else 0
