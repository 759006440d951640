"""A dispatch-level recorder: every ATen operator and every storage allocated or freed.

``Recorder`` is a ``TorchDispatchMode``. It works the same on fake tensors (no memory, no data)
and on real ones, which is how a test checks the fake trace against a real CPU run byte for
byte. Sizes are exact storage sizes; allocator rounding and caching are modelled later, when
the events are replayed. Category hints (parameter, input, gradient, optimizer state) are set
by the step runner; a cast of a parameter in the forward or backward pass (autocast's 16-bit
weight copies) is marked here, as ``parameter_cast``; activation vs temporary is decided from
lifetimes in ``finish``.
"""

from __future__ import annotations

import functools
import math
import sysconfig
import traceback
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch._subclasses.fake_tensor import DataDependentOutputException
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry

from whichgpu.attention_flops import attention_backward_flops, attention_flops
from whichgpu.schema import AllocEvent, OpKind, OpRecord, Phase, TensorCategory

_GEMM = {"mm", "addmm", "bmm", "baddbmm", "_scaled_mm", "addbmm", "_grouped_mm"}
_CONV = {
    "convolution",
    "convolution_backward",
    "_convolution",
    "cudnn_convolution",
    "mkldnn_convolution",
    "_slow_conv2d_forward",
    "_slow_conv2d_backward",
}
_NORM = {
    "native_layer_norm",
    "native_layer_norm_backward",
    "native_batch_norm",
    "native_batch_norm_backward",
    "_native_batch_norm_legit",
    "_native_batch_norm_legit_no_training",
    "_native_batch_norm_legit_functional",
    "native_group_norm",
    "native_group_norm_backward",
    "_fused_rms_norm",
    "_fused_rms_norm_backward",
    "rms_norm",
}
_REDUCTION = {
    "sum",
    "mean",
    "amax",
    "amin",
    "max",
    "min",
    "_softmax",
    "_log_softmax",
    "_softmax_backward_data",
    "_log_softmax_backward_data",
    "nll_loss_forward",
    "nll_loss_backward",
    "var_mean",
    "std_mean",
    "norm",
    "linalg_vector_norm",
    "argmax",
    "cumsum",
    "topk",
    "sort",
    "logsumexp",
}
_EMBEDDING = {
    "embedding",
    "embedding_dense_backward",
    "index_select",
    "gather",
    "scatter_add",
    "index_add",
    "index",
    "index_put",
    "_index_put_impl_",
}
_COPY = {
    "_to_copy",
    "copy_",
    "clone",
    "cat",
    "stack",
    "constant_pad_nd",
    "_unsafe_index",
    "repeat",
    "contiguous",
    "new_empty_strided",
    "empty_strided",
    "empty",
    "zeros_like",
    "zeros",
    "ones",
    "full",
    "fill_",
    "zero_",
    "new_zeros",
    "scalar_tensor",
    "arange",
    "randint",
    "randn",
    "rand",
    "ones_like",
    "empty_like",
    "full_like",
    "new_full",
    "new_ones",
    "lift_fresh",
    "_local_scalar_dense",
}


_TORCH_DIR = str(Path(torch.__file__).resolve().parent)
_THIS_FILE = str(Path(__file__).resolve())
_LIBRARY_DIRS = tuple(
    {
        str(Path(__file__).resolve().parents[1]),  # whichgpu
        sysconfig.get_paths()["stdlib"],
        sysconfig.get_paths()["purelib"],
        sysconfig.get_paths()["platlib"],
    }
)
"""Where library code lives (whichgpu, the standard library, installed packages)."""


def _read_by_user_code() -> bool:
    """Whether the code that asked PyTorch for a tensor's value is the user's own file (a
    --model function's loss or forward), rather than a library (an optimizer in whichgpu's
    step, transformers checking a mask): judged by the innermost frame outside PyTorch and
    the tracer's own modes."""
    for frame in reversed(traceback.extract_stack()):
        name = str(Path(frame.filename).resolve()) if not frame.filename.startswith("<") else ""
        if not name or name.startswith(_TORCH_DIR) or name == _THIS_FILE:
            continue
        if frame.name in ("__torch_function__", "__torch_dispatch__"):  # a mode's hook
            continue
        return not ("site-packages" in name or name.startswith(_LIBRARY_DIRS))
    return False


def _call(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Run ``func``; a host read of a fake tensor's value (``.item()``) by library code gives 1
    of its type.

    Fake tensors have no values, so ``aten._local_scalar_dense`` cannot answer. The library
    callers that reach it in a step are optimizers computing step sizes (Adafactor reads its
    step count and parameter norms) and model code checking a mask, where the value changes no
    shape and no allocation; 1 keeps them finite. A read by the user's own code (a branch on
    ``.item()`` in a --model loss) is refused, as the trace would follow an arbitrary branch;
    the error names its line. A real run is untouched: the stand-in is used only where the
    fake mode refuses.
    """
    try:
        return func(*args, **kwargs)
    except DataDependentOutputException:
        if func._overloadpacket.__name__ != "_local_scalar_dense" or _read_by_user_code():
            raise
        dtype = args[0].dtype
        if dtype.is_floating_point:
            return 1.0
        return True if dtype == torch.bool else 1


def op_kind(name: str, phase: Phase) -> OpKind:
    """Classify an ATen operator (``name`` without namespace) by the work it does."""
    base = name.rstrip("_") if name.endswith("_") and name != "copy_" else name
    if base in _GEMM:
        return "gemm"
    if base in _CONV:
        return "conv"
    if "scaled_dot_product" in base or "flash_attention" in base or "efficient_attention" in base:
        return "attention"
    if phase == "optimizer":
        return "optimizer"
    if base in _NORM:
        return "norm"
    if base in _REDUCTION:
        return "reduction"
    if base in _EMBEDDING:
        return "embedding"
    if name in _COPY or base in _COPY:
        return "copy"
    return "elementwise"


def _cpu_sdpa_flops(name: str, args: tuple[Any, ...]) -> int | None:
    """FLOPs of the CPU fused attention kernels, which torch's FLOP table leaves out.

    Tracing runs on the CPU, where SDPA dispatches to ``_scaled_dot_product_flash_attention_
    for_cpu``; on a GPU the same call is a flash/efficient kernel with the same FLOPs. The
    formulas agree with torch's for SDPA (two matmuls forward, four backward) and count
    grouped-query attention at the query's head count, where torch before 2.13 asserts
    (``whichgpu.attention_flops``).
    """
    try:
        if name == "_scaled_dot_product_flash_attention_for_cpu":
            q, k, v = args[0], args[1], args[2]
            return attention_flops(q.shape, k.shape, v.shape)
        if name == "_scaled_dot_product_flash_attention_for_cpu_backward":
            grad_out, q, k, v = args[0], args[1], args[2], args[3]
            return attention_backward_flops(grad_out.shape, q.shape, k.shape, v.shape)
    except (AttributeError, IndexError, TypeError, ValueError):
        return None
    return None


def _conv_backward_flops(name: str, args: tuple[Any, ...]) -> int | None:
    """FLOPs of ``convolution_backward``, counting grouped convolutions right.

    torch 2.13's formula ignores ``groups`` in the weight gradient, so a depthwise convolution's
    backward is over-counted about C times. Each requested gradient (input, weight) costs what
    the forward costs: 2 x N x C_out x output pixels x (C_in / groups) x kernel size, and the
    weight's shape already holds C_in / groups.
    """
    if name != "convolution_backward":
        return None
    try:
        grad_out, weight, output_mask = args[0], args[2], args[10]
        forward = 2 * grad_out.numel() * weight[0].numel()
        return int(forward * (int(bool(output_mask[0])) + int(bool(output_mask[1]))))
    except (AttributeError, IndexError, TypeError):
        return None


def _grouped_mm_flops(name: str, args: tuple[Any, ...], out: Any) -> int | None:
    """FLOPs of ``_grouped_mm`` (mixture-of-experts GEMMs), which torch's table leaves out.

    (M, K) x (G, K, N) with group offsets and (G, M, K) x (G, K, N) make ``out`` from K-long
    dot products: 2 x out elements x K. (K, M) x (M, N) with offsets (the weight gradient)
    splits the contraction over groups: 2 x K x M x N in all.
    """
    if name != "_grouped_mm":
        return None
    try:
        a, b = args[0], args[1]
        if a.dim() == 2 and b.dim() == 2:
            return int(2 * a.shape[0] * a.shape[1] * b.shape[1])
        return int(2 * out.numel() * a.shape[-1])
    except (AttributeError, IndexError, TypeError):
        return None


def _tensor_bytes(t: torch.Tensor) -> int:
    return int(t.numel()) * t.element_size()


_VIEW_LIKE = {"_unsafe_view"}
"""Operators that return a view of their input although their schema does not mark them so."""
_INDEXED_WRITE_SOURCE = {"index_copy_": 3, "index_put_": 2, "_index_put_impl_": 2}
"""In-place indexed writes, with the position of the argument holding the written values."""
_ALLOCATE_ONLY = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"}
"""Factories that only allocate: their memory is neither read nor written."""
_OVERWRITE_IN_PLACE = {
    "bernoulli_",
    "uniform_",
    "normal_",
    "random_",
    "exponential_",
    "geometric_",
    "cauchy_",
    "log_normal_",
    "fill_",
    "zero_",
}
"""In-place fills (random or constant) that write their tensor without reading it."""


def _bytes_moved(
    name: str,
    args: tuple[Any, ...],
    inputs: list[torch.Tensor],
    outputs: list[torch.Tensor],
    is_view: bool,
) -> tuple[int, int]:
    """(bytes read, bytes written) of one operator: its tensor inputs and outputs, except

    - views, and factories that only allocate (``empty``, ``empty_like`` …), move nothing;
    - an in-place fill (``bernoulli_``, ``fill_``, ``zero_`` …) writes its tensor without
      reading it;
    - an in-place indexed write (a KV cache update) reads its values and indices and writes
      the values, not the whole tensor it writes into;
    - an embedding lookup reads the rows it gathers (as many bytes as it writes), not the table.
    """
    if is_view or name in _VIEW_LIKE or name in _ALLOCATE_ONLY:
        return 0, 0
    source = _INDEXED_WRITE_SOURCE.get(name)
    if source is not None and len(args) > source and isinstance(args[source], torch.Tensor):
        written = _tensor_bytes(args[source])
        return sum(_tensor_bytes(t) for t in inputs[1:]), written
    written = sum(_tensor_bytes(t) for t in outputs)
    if name in _OVERWRITE_IN_PLACE:
        return sum(_tensor_bytes(t) for t in inputs[1:]), written
    if name == "embedding" and len(inputs) >= 2:
        return _tensor_bytes(inputs[1]) + written, written
    return sum(_tensor_bytes(t) for t in inputs), written


def _gemm_shape(name: str, args: tuple[Any, ...]) -> tuple[int, int, int, int] | None:
    try:
        if name == "mm":
            (m, k), (_, n) = args[0].shape, args[1].shape
            return (1, m, n, k)
        if name == "addmm":
            (m, k), (_, n) = args[1].shape, args[2].shape
            return (1, m, n, k)
        if name == "bmm":
            (b, m, k), (_, _, n) = args[0].shape, args[1].shape
            return (b, m, n, k)
        if name == "baddbmm":
            (b, m, k), (_, _, n) = args[1].shape, args[2].shape
            return (b, m, n, k)
    except (AttributeError, IndexError, ValueError):
        return None
    return None


def _conv_shape(name: str, args: tuple[Any, ...]) -> tuple[int, ...] | None:
    """(N, C_in, spatial..., C_out, kernel..., stride, groups) of the forward convolution."""
    try:
        if name == "convolution":
            x, w, stride, groups = args[0], args[1], args[3], args[8]
        elif name == "convolution_backward":
            x, w, stride, groups = args[1], args[2], args[4], args[9]
        else:
            return None
        return (*x.shape, int(w.shape[0]), *w.shape[2:], int(stride[0]), int(groups))
    except (AttributeError, IndexError, TypeError):
        return None


BATCH_NORM_INPUT_ARG = {
    "native_batch_norm": 0,
    "_native_batch_norm_legit": 0,
    "_native_batch_norm_legit_functional": 0,
    "_native_batch_norm_legit_no_training": 0,
    "cudnn_batch_norm": 0,
    "native_batch_norm_backward": 1,
    "batch_norm_backward": 1,
    "cudnn_batch_norm_backward": 0,
}
"""Batch-norm operators, and which of their arguments is the normalised input."""


def _norm_shape(name: str, args: tuple[Any, ...]) -> tuple[int, ...] | None:
    """(N, C, S) of a batch norm's input: S the elements of one sample's channel."""
    index = BATCH_NORM_INPUT_ARG.get(name)
    if index is None:
        return None
    try:
        x = args[index]
        if x.dim() < 2:
            return None
        n, c = int(x.shape[0]), int(x.shape[1])
        return (n, c, int(x.numel()) // max(1, n * c))
    except (AttributeError, IndexError, TypeError):
        return None


def _attention_shape(
    func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[int, ...] | None:
    """(batch, q_heads, kv_heads, q_len, kv_len, head_dim, causal, masked, mask_rows) of an
    SDPA kernel; ``mask_rows`` is the product of the mask's dimensions but the last (its
    elements per key position: ``batch x 1 x q_len`` for transformers' ``(B, 1, L, S)`` mask),
    0 without a mask.

    Arguments are found by their schema names, which every ``aten._scaled_dot_product_*``
    kernel and its backward share (``query``, ``key``, ``is_causal``, ``attn_mask`` or
    ``attn_bias``), so the CPU kernel traced here and the CUDA ones read the same way.
    """
    try:
        names = [argument.name for argument in func._schema.arguments]
    except AttributeError:
        return None
    bound = dict(zip(names, args, strict=False))  # trailing arguments may be defaults
    bound.update(kwargs)
    query, key = bound.get("query"), bound.get("key")
    if not isinstance(query, torch.Tensor) or not isinstance(key, torch.Tensor):
        return None
    if query.dim() != 4 or key.dim() != 4:
        return None
    batch, q_heads, q_len, head_dim = (int(n) for n in query.shape)
    kv_heads, kv_len = int(key.shape[1]), int(key.shape[2])
    causal = int(bool(bound.get("is_causal", False)))
    mask = bound.get("attn_mask", bound.get("attn_bias"))
    if not isinstance(mask, torch.Tensor):
        return (batch, q_heads, kv_heads, q_len, kv_len, head_dim, causal, 0, 0)
    rows = math.prod(int(n) for n in mask.shape[:-1])
    return (batch, q_heads, kv_heads, q_len, kv_len, head_dim, causal, 1, rows)


@dataclass
class _Storage:
    sid: int
    size: int
    alloc_index: int
    step: int
    hint: TensorCategory | None
    free_index: int | None = None
    free_step: int | None = None


@dataclass
class _Raw:
    op_index: int
    sid: int
    alloc: bool
    step: int


class Recorder(TorchDispatchMode):
    """Records operators and storage lifetimes while active (``with Recorder() as rec:``).

    ``phase`` and ``step`` are set by the step runner as it goes; operators are kept for step
    ``record_ops_of_step`` only (the steady state), storage events for every step.
    """

    def __init__(self, record_ops_of_step: int = 1) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.phase: Phase = "setup"
        self.step = 0
        self.record_ops_of_step = record_ops_of_step
        self.ops: list[OpRecord] = []
        self._op_count = 0
        self._storages: dict[int, _Storage] = {}
        self._live: dict[int, tuple[int, weakref.ref[Any]]] = {}
        self._raw: list[_Raw] = []
        self._forward_end: dict[int, int] = {}

    # --- storage tracking ---------------------------------------------------------------
    def track(self, tensor: torch.Tensor, hint: TensorCategory | None = None) -> None:
        """Start tracking the storage behind ``tensor`` (no-op if already tracked)."""
        storage = tensor.untyped_storage()
        key = id(storage)
        if key in self._live:
            if hint is not None:
                self._storages[self._live[key][0]].hint = hint
            return
        sid = len(self._storages)
        self._storages[sid] = _Storage(
            sid, int(storage.nbytes()), self._op_count - 1, self.step, hint
        )
        ref = weakref.ref(storage, functools.partial(self._on_free, key, sid))
        self._live[key] = (sid, ref)
        self._raw.append(_Raw(self._op_count - 1, sid, True, self.step))

    def mark(self, tensor: torch.Tensor, hint: TensorCategory) -> None:
        """Set the category of an already tracked storage (grads, optimizer state)."""
        self.track(tensor, hint)

    def _on_free(self, key: int, sid: int, _ref: object = None) -> None:
        if self._live.get(key, (None,))[0] != sid:
            return
        del self._live[key]
        info = self._storages[sid]
        info.free_index, info.free_step = self._op_count - 1, self.step
        self._raw.append(_Raw(self._op_count - 1, sid, False, self.step))

    def end_forward(self) -> None:
        """Mark the end of the forward pass of the current step."""
        self._forward_end[self.step] = self._op_count

    # --- operators ----------------------------------------------------------------------
    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        out = _call(func, args, kwargs)
        if getattr(func, "namespace", None) == "prim":
            # metadata queries (``prim.device``, which fake tensors dispatch for ``.to()``):
            # no work, no memory, and absent from a real run
            return out
        name = func._overloadpacket.__name__
        if self.step == self.record_ops_of_step:
            self.ops.append(self._op_record(func, name, args, kwargs, out))
        self._op_count += 1
        hint: TensorCategory | None = None
        if (
            name == "_to_copy"
            and self.phase in ("forward", "backward")
            and self._is_parameter(args[0])
        ):
            hint = "parameter_cast"
        for leaf in tree_flatten(out)[0]:
            if isinstance(leaf, torch.Tensor):
                self.track(leaf, hint)
        return out

    def _is_parameter(self, tensor: object) -> bool:
        """Whether ``tensor`` lives in the storage of a parameter."""
        if not isinstance(tensor, torch.Tensor):
            return False
        live = self._live.get(id(tensor.untyped_storage()))
        return live is not None and self._storages[live[0]].hint == "parameter"

    def _op_record(
        self, func: Any, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any
    ) -> OpRecord:
        inputs = [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, torch.Tensor)]
        outputs = [x for x in tree_flatten(out)[0] if isinstance(x, torch.Tensor)]
        is_view = bool(func.is_view) if hasattr(func, "is_view") else False
        bytes_read, bytes_written = _bytes_moved(name, args, inputs, outputs, is_view)
        formula = flop_registry.get(func._overloadpacket)
        own = _cpu_sdpa_flops(name, args)
        if own is None:
            own = _conv_backward_flops(name, args)
        if own is None:
            own = _grouped_mm_flops(name, args, out)
        flops = own or 0
        if formula is not None and own is None:
            try:
                flops = int(formula(*args, **kwargs, out_val=out))
            except Exception:
                flops = 0
        kind = op_kind(name, self.phase)
        return OpRecord(
            name=f"aten.{name}",
            kind=kind,
            phase=self.phase,
            flops=flops,
            bytes_read=bytes_read,
            bytes_written=bytes_written,
            dtype=str(inputs[0].dtype).removeprefix("torch.") if inputs else "none",
            gemm_bmnk=_gemm_shape(name, args),
            conv=_conv_shape(name, args),
            norm=_norm_shape(name, args),
            attention=_attention_shape(func, args, kwargs) if kind == "attention" else None,
        )

    # --- result -------------------------------------------------------------------------
    def _category(self, info: _Storage) -> TensorCategory:
        if info.hint is not None:
            return info.hint
        fwd_end = self._forward_end.get(info.step)
        if fwd_end is None or info.alloc_index >= fwd_end:
            return "temporary"
        survives = (
            info.free_index is None or info.free_step != info.step or info.free_index >= fwd_end
        )
        return "activation" if survives else "temporary"

    def events(self) -> list[AllocEvent]:
        """Allocation and free events so far, in order, with final categories."""
        return [
            AllocEvent(
                op_index=r.op_index,
                storage=r.sid,
                size_bytes=self._storages[r.sid].size,
                alloc=r.alloc,
                category=self._category(self._storages[r.sid]),
                step=r.step,
            )
            for r in self._raw
        ]


def canonical_events(events: tuple[AllocEvent, ...]) -> tuple[AllocEvent, ...]:
    """Events with each run of frees at one operator sorted by storage.

    Storages released together (a tuple of tensors dropped at once) are freed in an order that
    Python's garbage collection decides and that can differ between traces; the allocator
    cannot tell them apart, so one fixed order is as true as another.
    """
    out: list[AllocEvent] = []
    run: list[AllocEvent] = []
    for event in (*events, None):
        if event is not None and not event.alloc and (not run or run[0].op_index == event.op_index):
            run.append(event)
            continue
        out += sorted(run, key=lambda e: e.storage)
        run = []
        if event is not None:
            if event.alloc:
                out.append(event)
            else:
                run.append(event)
    return tuple(out)
