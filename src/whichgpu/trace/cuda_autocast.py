"""CUDA's autocast rules for a step traced on the CPU.

``torch.autocast`` keeps a table of operators per device, and the CPU's and CUDA's tables
differ. A trace runs ``torch.autocast("cpu")``, but every GPU estimate needs the tensors CUDA
autocast makes, so while ``cuda_autocast_rules()`` is active the CPU's autocast dispatch key
(``AutocastCPU``) runs CUDA's table instead, as PyTorch 2.13 declares it in
``aten/src/ATen/autocast_mode.h``.

What differs, the cast rules and their sources: docs/memory.md, "CUDA's autocast table".
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

LOWER_PRECISION_FP = (
    "_convolution.deprecated",
    "_convolution",
    "conv1d",
    "conv2d",
    "conv3d",
    "conv_tbc",
    "conv_transpose1d",
    "conv_transpose2d.input",
    "conv_transpose3d.input",
    "convolution",
    "prelu",
    "addmm",
    "addmv",
    "addr",
    "matmul",
    "einsum",
    "mm",
    "mv",
    "linalg_vecdot",
    "linear",
    "addbmm",
    "baddbmm",
    "bmm",
    "chain_matmul",
    "linalg_multi_dot",
    "_thnn_fused_lstm_cell",
    "_thnn_fused_gru_cell",
    "lstm_cell",
    "gru_cell",
    "rnn_tanh_cell",
    "rnn_relu_cell",
    "_scaled_dot_product_flash_attention",
    "scaled_dot_product_attention",
)
"""``AT_FORALL_LOWER_PRECISION_FP``: run in the autocast dtype."""

FP32 = (
    "acos",
    "asin",
    "cosh",
    "erfinv",
    "exp",
    "expm1",
    "log",
    "log10",
    "log2",
    "log1p",
    "reciprocal",
    "rsqrt",
    "sinh",
    "tan",
    "pow.Tensor_Scalar",
    "pow.Tensor_Tensor",
    "pow.Scalar",
    "softplus",
    "layer_norm",
    "native_layer_norm",
    "rms_norm",
    "group_norm",
    "frobenius_norm.dim",
    "nuclear_norm",
    "nuclear_norm.dim",
    "cosine_similarity",
    "poisson_nll_loss",
    "cosine_embedding_loss",
    "nll_loss",
    "nll_loss2d",
    "hinge_embedding_loss",
    "kl_div",
    "l1_loss",
    "smooth_l1_loss",
    "huber_loss",
    "mse_loss",
    "margin_ranking_loss",
    "multilabel_margin_loss",
    "soft_margin_loss",
    "triplet_margin_loss",
    "multi_margin_loss",
    "binary_cross_entropy_with_logits",
    "dist",
    "pdist",
    "cdist",
    "renorm",
    "logsumexp",
    "upsample_nearest1d",
    "_upsample_nearest_exact1d",
    "upsample_nearest2d",
    "_upsample_nearest_exact2d",
    "upsample_nearest3d",
    "_upsample_nearest_exact3d",
    "upsample_linear1d",
    "upsample_bilinear2d",
    "_upsample_bilinear2d_aa",
    "upsample_trilinear3d",
    "upsample_bicubic2d",
    "_upsample_bicubic2d_aa",
)
"""``AT_FORALL_FP32``: every floating input cast to float32."""

FP32_SET_OPT_DTYPE = (
    "prod",
    "prod.dim_int",
    "softmax.int",
    "log_softmax.int",
    "cumprod",
    "cumsum",
    "linalg_vector_norm",
    "linalg_matrix_norm",
    "linalg_matrix_norm.str_ord",
    "sum",
    "sum.dim_IntList",
)
"""``AT_FORALL_FP32_SET_OPT_DTYPE``: a floating first input runs with ``dtype=float32`` unless
the call gives a dtype."""

FP32_APPEND_DTYPE = {
    "norm.Scalar": "norm.ScalarOpt_dtype",
    "norm.ScalarOpt_dim": "norm.ScalarOpt_dim_dtype",
}
"""``AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE``: the overload called instead, with a float32
dtype appended (the input's dtype where the first input is not floating)."""

PROMOTE = (
    "addcdiv",
    "addcmul",
    "atan2",
    "bilinear",
    "cross",
    "dot",
    "vdot",
    "grid_sampler",
    "index_put",
    "tensordot",
    "scatter_add",
)
"""``AT_FORALL_PROMOTE``: floating inputs cast to the widest of them (float32 if any is)."""

KEEP_CPU_RULE = frozenset({"binary_cross_entropy"})
"""Operators CUDA refuses under autocast (``banned``): the CPU's rule (float32) is kept, as a
step that runs on CUDA cannot call them."""

_KEY = "AutocastCPU"


def _eligible(value: object) -> bool:
    """``is_eligible``: a floating tensor other than float64."""
    return (
        isinstance(value, torch.Tensor)
        and value.is_floating_point()
        and value.dtype is not torch.float64
    )


class _Casts:
    """``cached_cast``: casts of floating tensors, the 16-bit casts of leaf tensors that require
    grad kept until the outermost autocast region ends (PyTorch clears its cache then)."""

    def __init__(self) -> None:
        self._cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._depth = 0

    def cast(self, value: Any, dtype: torch.dtype) -> Any:
        if isinstance(value, (list, tuple)):
            return type(value)(self.cast(v, dtype) for v in value)
        if not _eligible(value) or value.dtype is dtype:
            return value
        cacheable = (
            dtype is not torch.float32
            and value.dtype is torch.float32
            and value.requires_grad
            and value.is_leaf
            and not value._is_view()
            and torch.is_autocast_cache_enabled()
        )
        if not cacheable:
            return value.to(dtype)
        found = self._cache.get(id(value))
        if found is not None and found[0] is value:
            return found[1]
        cast = value.to(dtype)
        self._cache[id(value)] = (value, cast)
        return cast

    def clear(self) -> None:
        self._cache.clear()


def _widest(values: tuple[Any, ...], lower: torch.dtype) -> torch.dtype:
    """``promote_type``: float32 if any eligible input is, else the autocast dtype."""
    for value in values:
        items = value if isinstance(value, (list, tuple)) else (value,)
        if any(_eligible(v) and v.dtype is torch.float32 for v in items):
            return torch.float32
    return lower


def _first_tensor_eligible(args: tuple[Any, ...]) -> bool:
    return bool(args) and _eligible(args[0])


def _kernel(policy: str, op: Any, casts: _Casts, target: Any = None) -> Callable[..., Any]:
    exclude = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)
    names = [argument.name for argument in op._schema.arguments]
    dtype_at = names.index("dtype") if "dtype" in names else len(names)

    def kernel(_keyset: Any, *args: Any, **kwargs: Any) -> Any:
        lower = torch.get_autocast_dtype("cpu")
        with torch._C._ExcludeDispatchKeyGuard(exclude):
            if policy == "lower":
                args = tuple(casts.cast(a, lower) for a in args)
                kwargs = {k: casts.cast(v, lower) for k, v in kwargs.items()}
            elif policy == "fp32":
                args = tuple(casts.cast(a, torch.float32) for a in args)
                kwargs = {k: casts.cast(v, torch.float32) for k, v in kwargs.items()}
            elif policy == "set_opt_dtype" and _first_tensor_eligible(args):
                if len(args) > dtype_at:
                    if args[dtype_at] is None:
                        args = (*args[:dtype_at], torch.float32, *args[dtype_at + 1 :])
                elif kwargs.get("dtype") is None:
                    kwargs["dtype"] = torch.float32
            elif policy == "append_dtype":
                dtype = torch.float32 if _first_tensor_eligible(args) else args[0].dtype
                return target(*args, **kwargs, dtype=dtype)
            elif policy == "promote":
                to = _widest(args + tuple(kwargs.values()), lower)
                args = tuple(casts.cast(a, to) for a in args)
                kwargs = {k: casts.cast(v, to) for k, v in kwargs.items()}
            return op(*args, **kwargs)

    return kernel


def _overload(name: str) -> Any:
    packet, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.aten, packet), overload or "default")


def cpu_table() -> frozenset[str]:
    """The operators the CPU's autocast table lists (``aten::`` names with their overload)."""
    names = torch._C._dispatch_get_registrations_for_dispatch_key(_KEY)
    return frozenset(n.removeprefix("aten::") for n in names if n.startswith("aten::"))


def _python_rule(name: str) -> bool:
    """Whether the CPU's rule for ``name`` was registered from Python (whichgpu's own rule for
    ``_grouped_mm``, ``workloads.hf.grouped_experts_precision``), not shipped by PyTorch: such a
    rule says how the traced step runs that operator on CUDA too, and is kept."""
    return torch._C.DispatchKey.AutocastCPU in _overload(name).py_kernels


def _exists(name: str) -> bool:
    try:
        _overload(name)
    except (AttributeError, RuntimeError):
        return False
    return True


@contextlib.contextmanager
def cuda_autocast_rules() -> Iterator[None]:
    """While active, ``torch.autocast("cpu")`` follows CUDA's autocast table (see
    docs/memory.md, "CUDA's autocast table"); the CPU's own rules are back when it exits."""
    cpu = cpu_table()
    cuda: dict[str, str] = {}
    for name in LOWER_PRECISION_FP:
        if name not in cpu:  # the CPU's kernel casts these as well, with its cast cache
            cuda[name] = "lower"
    cuda.update(dict.fromkeys(FP32, "fp32"))
    cuda.update(dict.fromkeys(FP32_SET_OPT_DTYPE, "set_opt_dtype"))
    cuda.update(dict.fromkeys(FP32_APPEND_DTYPE, "append_dtype"))
    cuda.update(dict.fromkeys(PROMOTE, "promote"))
    casts = _Casts()
    clear_cache = torch.clear_autocast_cache

    def clear_both() -> None:  # what ``torch.autocast`` calls as its outermost region ends
        clear_cache()
        casts.clear()

    library = torch.library.Library("aten", "IMPL")  # type: ignore[no-untyped-call]
    torch.clear_autocast_cache = clear_both
    try:
        with warnings.catch_warnings():
            # replacing a registered kernel warns once per operator
            warnings.simplefilter("ignore")
            for name, policy in cuda.items():
                if not _exists(name):
                    continue
                target = _overload(FP32_APPEND_DTYPE[name]) if policy == "append_dtype" else None
                kernel = _kernel(policy, _overload(name), casts, target)
                library.impl(name, kernel, _KEY, with_keyset=True)  # type: ignore[no-untyped-call]
            for name in sorted(cpu - set(cuda) - set(LOWER_PRECISION_FP) - KEEP_CPU_RULE):
                if _exists(name) and not _python_rule(name):
                    fallthrough = torch.library.fallthrough_kernel
                    library.impl(name, fallthrough, _KEY)  # type: ignore[no-untyped-call]
        yield
    finally:
        torch.clear_autocast_cache = clear_cache
        casts.clear()
        library._destroy()  # type: ignore[no-untyped-call]
