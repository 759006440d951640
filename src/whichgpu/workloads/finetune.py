"""Fine-tuning methods on a built model: LoRA (as peft does it) and QLoRA (bitsandbytes NF4 + LoRA).

Neither ``peft`` nor ``bitsandbytes`` is used: the wrappers here are written in plain PyTorch
after those libraries' code, keeping their memory layout (which tensors exist, their dtypes and
shapes, what autograd saves) and their math, so that a traced step allocates what a real one
does. This module imports torch: import it only where a model is built (the tracer).

The facts followed and their sources: docs/workloads.md, "Fine-tuning methods: LoRA and QLoRA".
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor

from whichgpu.errors import UnsupportedWorkload
from whichgpu.schema import RunConfig
from whichgpu.workloads.base import BuiltWorkload
from whichgpu.workloads.hf import weight_dtype

LORA_ALPHA = 8
"""peft's default ``lora_alpha``; the scaling is ``LORA_ALPHA / rank``."""
ALL_LINEAR = "all-linear"
"""peft's shorthand target: every linear layer but the output layer."""
NF4_BLOCK_SIZE = 64
"""Weights per fp32 absmax in bitsandbytes' 4-bit quantisation (CUDA default)."""
ABSMAX_BLOCK_SIZE = 256
"""Absmax values per fp32 scale in the double quantisation (fixed in bitsandbytes)."""
DEQUANT_CHUNK_ELEMENTS = 1 << 22
"""Weights dequantised per step of the loop (a multiple of ``NF4_BLOCK_SIZE``)."""
NF4_CODE = (
    -1.0,
    -0.6961928009986877,
    -0.5250730514526367,
    -0.39491748809814453,
    -0.28444138169288635,
    -0.18477343022823334,
    -0.09105003625154495,
    0.0,
    0.07958029955625534,
    0.16093020141124725,
    0.24611230194568634,
    0.33791524171829224,
    0.44070982933044434,
    0.5626170039176941,
    0.7229568362236023,
    1.0,
)
"""The 16 NF4 levels, ascending (bitsandbytes ``get_4bit_type("nf4")``)."""
_HALF_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "bf16-pure": torch.bfloat16}
_TINY = torch.finfo(torch.float32).tiny


def dynamic_map_values(signed: bool) -> list[float]:
    """The 256 ascending values of bitsandbytes' 8-bit dynamic map (``create_dynamic_map``).

    Seven decades of ``10^(i-6)`` times the midpoints of ``linspace(0.1, 1, k)``, with ``k``
    doubling per decade (signed: both signs), plus 0 and 1. bitsandbytes evaluates the
    linspace in float32; here it is float64, rounded to float32 by the caller: the values
    differ from bitsandbytes' by at most 2 float32 ulps.
    """
    exponent_bits, non_sign_bits = 7, 7
    data: list[float] = []
    for i in range(exponent_bits):
        items = 2 ** (i + non_sign_bits - exponent_bits + (0 if signed else 1)) + 1
        bounds = [0.1 + 0.9 * j / (items - 1) for j in range(items)]
        scale = 10.0 ** (-(exponent_bits - 1) + i)
        means = [scale * (a + b) / 2.0 for a, b in itertools.pairwise(bounds)]
        data += means
        if signed:
            data += [-m for m in means]
    data += [0.0, 1.0]
    return sorted(data)


def dynamic_map(signed: bool, device: torch.device) -> torch.Tensor:
    """bitsandbytes' dynamic map as a float32 tensor on ``device`` (in the active mode)."""
    return torch.tensor(dynamic_map_values(signed), dtype=torch.float32, device=device)


def nearest_code(values: torch.Tensor, code: torch.Tensor) -> torch.Tensor:
    """For each value, the int32 index of the nearest entry of the ascending ``code``.

    The thresholds are the midpoints between neighbouring levels, as in bitsandbytes'
    ``dQuantizeNF4`` (ties go to the lower level).
    """
    midpoints = (code[1:] + code[:-1]) / 2
    return torch.bucketize(values, midpoints, out_int32=True)


def adapter_dtype(run: RunConfig) -> torch.dtype:
    """The LoRA adapters' dtype: fp32 in training (peft's ``autocast_adapter_dtype=True``
    default upcasts half-precision adapters, see docs/workloads.md), else the weights'."""
    return torch.float32 if run.mode == "train" else weight_dtype(run)


def base_weight_dtype(run: RunConfig) -> torch.dtype:
    """The dtype of the frozen base weights (and 4-bit compute dtype) of lora/qlora."""
    return _HALF_DTYPES.get(run.precision, torch.float32)


# --- NF4 ------------------------------------------------------------------------------------


def quantize_nf4(
    weight: torch.Tensor, absmax_code: torch.Tensor, nf4_code: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Quantise ``weight`` to NF4 with double quantisation, as bitsandbytes' ``quantize_4bit``.

    Returns the packed weight (``((n + 1) // 2, 1)`` uint8), the 8-bit absmax codes (one per
    block of 64), their fp32 scales (one per 256 blocks) and the fp32 offset (0-dim).
    """
    n = weight.numel()
    blocks = -(-n // NF4_BLOCK_SIZE)
    flat = F.pad(weight.detach().reshape(-1).float(), (0, blocks * NF4_BLOCK_SIZE - n))
    grid = flat.view(blocks, NF4_BLOCK_SIZE)
    absmax = grid.abs().amax(dim=1)
    scaled = (grid / absmax.clamp_min(_TINY).unsqueeze(1)).clamp(-1.0, 1.0)
    codes = nearest_code(scaled.reshape(-1)[:n], nf4_code)
    if n % 2:
        codes = F.pad(codes, (0, 1))
    packed = ((codes[0::2] << 4) | codes[1::2]).to(torch.uint8).unsqueeze(1)
    offset = absmax.mean()
    groups = -(-blocks // ABSMAX_BLOCK_SIZE)
    centred = F.pad(absmax - offset, (0, groups * ABSMAX_BLOCK_SIZE - blocks))
    centred_grid = centred.view(groups, ABSMAX_BLOCK_SIZE)
    scales = centred_grid.abs().amax(dim=1)
    normalised = centred_grid / scales.clamp_min(_TINY).unsqueeze(1)
    absmax_codes = nearest_code(normalised.reshape(-1)[:blocks], absmax_code).to(torch.uint8)
    return packed, absmax_codes, scales, offset


class Nf4Linear(nn.Module):
    """A frozen linear layer stored in NF4 (bitsandbytes ``Linear4bit``, ``quant_type="nf4"``,
    ``compress_statistics=True``): a packed uint8 ``weight`` parameter and the quant state as
    buffers. The forward pass dequantises into a temporary per call (``Nf4Matmul``)."""

    bias: nn.Parameter | None
    absmax_codes: torch.Tensor
    absmax_scales: torch.Tensor
    absmax_offset: torch.Tensor
    nf4_code: torch.Tensor
    absmax_code: torch.Tensor

    def __init__(
        self, weight: torch.Tensor, bias: nn.Parameter | None, compute_dtype: torch.dtype
    ) -> None:
        """``weight`` is ``(out_features, in_features)``; ``bias`` stays as it is, frozen."""
        super().__init__()
        self.out_features, self.in_features = (int(d) for d in weight.shape)
        self.compute_dtype = compute_dtype
        device = weight.device
        self.register_buffer("nf4_code", torch.tensor(NF4_CODE, dtype=torch.float32, device=device))
        self.register_buffer("absmax_code", dynamic_map(True, device))
        packed, codes, scales, offset = quantize_nf4(weight, self.absmax_code, self.nf4_code)
        self.weight = nn.Parameter(packed, requires_grad=False)
        self.register_buffer("absmax_codes", codes)
        self.register_buffer("absmax_scales", scales)
        self.register_buffer("absmax_offset", offset)
        if bias is not None:
            bias.requires_grad_(False)
        self.register_parameter("bias", bias)

    def absmax(self) -> torch.Tensor:
        """The fp32 absmax of every block of 64, rebuilt from the double quantisation."""
        blocks = self.absmax_codes.numel()
        groups = self.absmax_scales.numel()
        values = self.absmax_code.index_select(0, self.absmax_codes.int())
        if groups * ABSMAX_BLOCK_SIZE != blocks:
            values = F.pad(values, (0, groups * ABSMAX_BLOCK_SIZE - blocks))
        scaled = values.view(groups, ABSMAX_BLOCK_SIZE) * self.absmax_scales.unsqueeze(1)
        return scaled.view(-1)[:blocks] + self.absmax_offset

    def dequantize(self, dtype: torch.dtype, chunk_elements: int | None = None) -> torch.Tensor:
        """The ``(out, in)`` weight in ``dtype``: one new tensor, filled chunk by chunk.

        Per chunk of blocks: split each byte into its high and low nibble, look the codes up
        in the NF4 table (fp32), multiply by the block absmax in place and write the product,
        rounded to ``dtype``, into the output. A weight whose size is not a multiple of 64
        gets an output padded to whole blocks (a view of its first ``in x out`` values).

        In a trace (fake tensors) only the first chunk runs the loop; one copy that allocates
        nothing writes the rest. The memory is the same (each chunk frees its temporaries
        before the next), and the trace records the bytes a fused dequantisation kernel moves
        instead of eight operators per chunk (a 70B model's MLP weight has 56 chunks), which
        made a 70B QLoRA trace take a quarter of an hour.
        """
        chunk = chunk_elements or DEQUANT_CHUNK_ELEMENTS
        if chunk % NF4_BLOCK_SIZE:
            raise ValueError(f"chunk_elements must be a multiple of {NF4_BLOCK_SIZE}")
        blocks = self.absmax_codes.numel()
        half_block = NF4_BLOCK_SIZE // 2
        packed = self.weight.view(-1)
        if packed.numel() != blocks * half_block:  # a partial last block
            packed = F.pad(packed, (0, blocks * half_block - packed.numel()))
        nibbles = packed.view(blocks, half_block, 1)
        scale = self.absmax().view(blocks, 1, 1, 1)
        table = self.nf4_code.view(-1, 1)
        shifts = torch.tensor([4, 0], dtype=torch.uint8, device=packed.device)
        out = torch.empty(blocks, half_block, 2, 1, dtype=dtype, device=packed.device)
        rows = chunk // NF4_BLOCK_SIZE
        traced = isinstance(packed, FakeTensor)
        for first in range(0, blocks, rows):
            last = min(blocks, first + rows)
            codes = ((nibbles[first:last] >> shifts) & 15).int()  # (rows, 32, 2), high first
            out[first:last] = F.embedding(codes, table).mul_(scale[first:last])
            del codes  # free this chunk's temporaries before the next is made
            if traced and last < blocks:
                out[last:].copy_(nibbles[last:].unsqueeze(-1).expand(-1, -1, 2, 1))
                break
        n = self.in_features * self.out_features
        return out.view(-1)[:n].view(self.out_features, self.in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``Linear4bit.forward``: compute in ``compute_dtype``, return in the input dtype."""
        input_dtype = x.dtype
        x = x.to(self.compute_dtype)
        bias = None if self.bias is None else self.bias.to(self.compute_dtype)
        out: torch.Tensor = Nf4Matmul.apply(x, self.weight, bias, self)  # type: ignore[no-untyped-call]
        return out.to(input_dtype)


class Nf4Matmul(torch.autograd.Function):
    """``x @ W.T + b`` with ``W`` dequantised on the fly, forward and backward (``MatMul4Bit``).

    Nothing but the layer (whose packed weight exists anyway) is kept for the backward pass.
    """

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        packed: torch.Tensor,
        bias: torch.Tensor | None,
        layer: Nf4Linear,
    ) -> torch.Tensor:
        """Dequantise, ``linear``, free the dequantised weight."""
        weight = layer.dequantize(layer.compute_dtype)
        out = F.linear(x, weight.to(x.dtype), bias)
        ctx.layer = layer
        return out

    @staticmethod
    def backward(
        ctx: Any, grad_out: torch.Tensor
    ) -> tuple[torch.Tensor | None, None, torch.Tensor | None, None]:
        """``grad_x = grad_out @ W`` with ``W`` dequantised again; no weight gradient."""
        layer: Nf4Linear = ctx.layer
        grad_x = None
        if ctx.needs_input_grad[0]:
            weight = layer.dequantize(layer.compute_dtype)
            grad_x = torch.matmul(grad_out, weight.to(grad_out.dtype))
        grad_bias = None
        if ctx.needs_input_grad[2]:
            grad_bias = grad_out.reshape(-1, grad_out.shape[-1]).sum(0)
        return grad_x, None, grad_bias, None


# --- LoRA -----------------------------------------------------------------------------------


class LoraLinear(nn.Module):
    """A frozen base layer plus a trainable low-rank update (peft ``lora.Linear``, or peft's
    ``lora.bnb.Linear4bit`` when the base is an ``Nf4Linear``)."""

    def __init__(
        self,
        base_layer: nn.Module,
        in_features: int,
        out_features: int,
        rank: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        """``rank`` is r; the adapters are created in ``dtype`` on ``device``."""
        super().__init__()
        self.base_layer = base_layer
        self.lora_A = nn.Linear(in_features, rank, bias=False, dtype=dtype, device=device)
        self.lora_B = nn.Linear(rank, out_features, bias=False, dtype=dtype, device=device)
        self.lora_dropout = nn.Identity()
        self.scaling = LORA_ALPHA / rank
        self.rank = rank
        self.target = ""  # the LoRA target (module name or suffix) that chose this layer
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Base output plus ``lora_B(lora_A(dropout(x))) * scaling``, as peft computes it."""
        adapter_dtype = self.lora_A.weight.dtype
        result: torch.Tensor = self.base_layer(x)
        if isinstance(self.base_layer, Nf4Linear):
            result = result.clone()
            convert = not torch.is_autocast_enabled(x.device.type)
            if convert and x.dtype != adapter_dtype:
                x = x.to(adapter_dtype)
            update: torch.Tensor = self.lora_B(self.lora_A(self.lora_dropout(x))) * self.scaling
            if convert:
                update = update.to(result.dtype)
            return result + update
        result_dtype = result.dtype
        if x.dtype != adapter_dtype:
            x = x.to(adapter_dtype)
        result = result + self.lora_B(self.lora_A(self.lora_dropout(x))) * self.scaling
        return result.to(result_dtype)


# --- Applying a method ----------------------------------------------------------------------


def _conv1d_class() -> type[nn.Module] | None:
    try:
        from transformers.pytorch_utils import Conv1D
    except ImportError:  # transformers is optional for plain-PyTorch workloads
        return None
    conv1d: type[nn.Module] = Conv1D
    return conv1d


def _linear_shape(module: nn.Module, conv1d: type[nn.Module] | None) -> tuple[int, int] | None:
    """``(in_features, out_features)`` of a layer LoRA or QLoRA can take, else None."""
    if type(module) is nn.Linear:
        return module.in_features, module.out_features
    if conv1d is not None and type(module) is conv1d:
        weight = module.weight
        assert isinstance(weight, torch.Tensor)
        return int(weight.shape[0]), int(weight.shape[1])  # Conv1D stores (in, out)
    if isinstance(module, Nf4Linear):
        return module.in_features, module.out_features
    return None


def _output_layers(model: nn.Module) -> set[str]:
    """Names of the layers kept out of ``all-linear`` and of 4-bit quantisation.

    The output embedding, modules with a parameter tied to another module's (or used under two
    names), and the module of the model's last parameter (transformers'
    ``get_keys_to_not_convert``, whose tied keys are found here by parameter identity).
    """
    names: set[str] = set()
    get_output = getattr(model, "get_output_embeddings", None)
    output = get_output() if callable(get_output) else None
    if output is not None:
        names |= {name for name, module in model.named_modules() if module is output}
    parameters = [name for name, _ in model.named_parameters()]
    if parameters:
        names.add(parameters[-1].rpartition(".")[0])
    owners: dict[int, list[str]] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        for param in module.parameters(recurse=False):
            owners.setdefault(id(param), []).append(name)
    for shared in owners.values():
        if len(shared) > 1:
            names |= set(shared)
    return names


def _matches(name: str, target: str) -> bool:
    return name == target or name.endswith("." + target)


def _freeze_in(model: nn.Module, dtype: torch.dtype) -> None:
    """Freeze every parameter and store floating ones in ``dtype`` (tied ones stay tied)."""
    converted: dict[int, tuple[nn.Parameter, nn.Parameter]] = {}  # keeps the old ones alive
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is None:
                continue
            if id(param) not in converted:
                param.requires_grad_(False)
                new = param
                if param.is_floating_point() and param.dtype != dtype:
                    new = nn.Parameter(param.detach().to(dtype), requires_grad=False)
                converted[id(param)] = (param, new)
            module._parameters[name] = converted[id(param)][1]


def _quantize_linears(model: nn.Module, compute_dtype: torch.dtype) -> int:
    """Replace every linear layer but the output layers by an ``Nf4Linear``; returns how many."""
    conv1d = _conv1d_class()
    skip = _output_layers(model)
    chosen = [
        (name, module)
        for name, module in model.named_modules()
        if name not in skip
        and _linear_shape(module, conv1d) is not None
        and not isinstance(module, Nf4Linear)
    ]
    for name, module in chosen:
        weight = module.weight
        if type(module) is not nn.Linear:  # Conv1D: (in, out) -> (out, in)
            weight = weight.t()
        bias = module.bias if isinstance(module.bias, nn.Parameter) else None
        model.set_submodule(name, Nf4Linear(weight, bias, compute_dtype))
    return len(chosen)


def _targets(built: BuiltWorkload, run: RunConfig) -> tuple[tuple[str, ...], bool]:
    """The LoRA targets and whether the user named them."""
    if run.lora_targets:
        return run.lora_targets, True
    return (built.lora_targets or (ALL_LINEAR,)), False


def _lora_layers(model: nn.Module, targets: tuple[str, ...], user_given: bool) -> dict[str, str]:
    """The layers to adapt, by name, each with the target that chose it; raises
    ``UnsupportedWorkload`` if the targets do not fit the model."""
    conv1d = _conv1d_class()
    linear = [name for name, m in model.named_modules() if _linear_shape(m, conv1d) is not None]
    if not linear:
        raise UnsupportedWorkload(
            "This model has no linear layers, so LoRA has nothing to adapt; use --method full."
        )
    if targets == (ALL_LINEAR,):
        skip = _output_layers(model)
        every = {name: name.rpartition(".")[2] for name in linear if name not in skip}
        if not every:
            raise UnsupportedWorkload(
                "This model's only linear layers are output layers, which all-linear leaves "
                "out; name them with --lora-targets or use --method full."
            )
        return every
    modules = dict(model.named_modules())
    known = sorted({name.rpartition(".")[2] for name in linear})
    chosen: dict[str, str] = {}
    for target in targets:
        hits = [name for name in modules if name and _matches(name, target)]
        if not hits and user_given:
            raise UnsupportedWorkload(
                f"--lora-targets '{target}' matches no module of this model; its linear "
                f"layers are named {', '.join(known)} (or use all-linear)."
            )
        for name in hits:
            if _linear_shape(modules[name], conv1d) is None:
                kind = type(modules[name]).__name__
                raise UnsupportedWorkload(
                    f"LoRA target '{target}' names {name}, a {kind}; LoRA adapts linear "
                    f"layers only ({', '.join(known)})."
                )
            chosen.setdefault(name, target)
    if not chosen:
        raise UnsupportedWorkload(
            f"The workload's default LoRA targets ({', '.join(targets)}) match no linear layer "
            f"of this model; its linear layers are named {', '.join(known)}: choose with "
            "--lora-targets."
        )
    return chosen


def apply_method(built: BuiltWorkload, run: RunConfig) -> BuiltWorkload:
    """Turn a freshly built model into the one ``run.method`` trains (in place; returned).

    ``full``: unchanged. ``lora``: every parameter frozen (floating ones stored in
    ``base_weight_dtype``), then each target layer wrapped in a ``LoraLinear`` with adapters
    in ``adapter_dtype(run)``. ``qlora``: the same, after replacing every linear layer but
    the output layers by an ``Nf4Linear``. Call it in the tensor mode the model was built in.
    """
    if run.method == "full":
        return built
    model = built.model
    targets, user_given = _targets(built, run)
    frozen_dtype = base_weight_dtype(run)
    _freeze_in(model, frozen_dtype)
    if run.method == "qlora" and _quantize_linears(model, frozen_dtype) == 0:
        raise UnsupportedWorkload(
            "This model has no linear layers to quantise to 4 bits; --method qlora does not "
            "apply (try --method lora)."
        )
    conv1d = _conv1d_class()
    adapters = adapter_dtype(run)
    for name, target in _lora_layers(model, targets, user_given).items():
        base = model.get_submodule(name)
        shape = _linear_shape(base, conv1d)
        assert shape is not None
        device = next(base.parameters()).device
        lora = LoraLinear(base, shape[0], shape[1], run.lora_rank, adapters, device)
        lora.target = target
        model.set_submodule(name, lora)
    return built


def count_parameters(model: nn.Module) -> tuple[int, int]:
    """``(total, trainable)`` parameters; a 4-bit weight counts its logical ``in x out``."""
    packed = {
        id(m.weight): m.in_features * m.out_features
        for m in model.modules()
        if isinstance(m, Nf4Linear)
    }
    total = trainable = 0
    for param in model.parameters():
        count = packed.get(id(param), param.numel())
        total += count
        if param.requires_grad:
            trainable += count
    return total, trainable


def method_choices(run: RunConfig, model: nn.Module) -> dict[str, str]:
    """What the fine-tuning method did, for the profile's ``choices`` (empty for ``full``)."""
    if run.method == "full":
        return {}
    adapted = [m for m in model.modules() if isinstance(m, LoraLinear)]
    kinds = ",".join(dict.fromkeys(m.target for m in adapted))
    frozen = str(base_weight_dtype(run)).removeprefix("torch.")
    adapters = str(adapter_dtype(run)).removeprefix("torch.")
    choices = {
        "finetune": (
            f"{run.method} r={run.lora_rank} alpha={LORA_ALPHA} on {kinds} "
            f"({len(adapted)} layers); base frozen in {frozen}, adapters in {adapters}"
        )
    }
    if run.method == "qlora":
        quantized = sum(isinstance(m, Nf4Linear) for m in model.modules())
        choices["dequantisation"] = (
            f"nf4 → {frozen} per layer, forward and backward ({quantized} layers; blocks of "
            f"{NF4_BLOCK_SIZE}, double-quantised absmax; chunks of {DEQUANT_CHUNK_ELEMENTS} "
            "weights)"
        )
    return choices
