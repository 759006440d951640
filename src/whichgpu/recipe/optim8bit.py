"""8-bit AdamW with the memory layout and math of bitsandbytes' ``AdamW8bit``, in plain PyTorch.

bitsandbytes is not used; the optimizer follows its code (bitsandbytes-foundation/
bitsandbytes):

- State (``bitsandbytes/optim/optimizer.py``, ``Optimizer2State.init_state``): a parameter with
  fewer than ``min_8bit_size`` (4096) elements keeps two fp32 states of its shape; a larger one
  gets two uint8 states of its shape (``state1``, ``state2``), an fp32 absmax per block of 256
  elements for each (``absmax1``, ``absmax2``), and references to two 256-entry fp32 maps
  shared by all parameters (``qmap1``: the signed dynamic map for the first moment, ``qmap2``:
  the unsigned one for the second, ``create_dynamic_map``). The block size is 256 since
  bitsandbytes 0.44 (PR #1365, "Change 8bit optimizer blocksize 2048->256"; it was 2048).
- Defaults (``AdamW8bit``): ``betas=(0.9, 0.999)``, ``eps=1e-8``, ``weight_decay=1e-2``.
- Update (``optimizer_update_8bit_blockwise``; the pure-PyTorch reference of the same kernel is
  ``bitsandbytes/backends/triton/kernels_optim.py``, ``optimizer_update_8bit_blockwise_
  pytorch``): dequantise both states to fp32 (``qmap[code] * absmax[block]``), ``m = b1 m +
  (1 - b1) g``, ``v = b2 v + (1 - b2) g^2``, decoupled weight decay ``p *= 1 - lr wd``, then
  ``p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)``, all in fp32 whatever the
  parameter dtype; then each block's new absmax is stored and every state value is replaced by
  the index of the nearest map entry of ``value / absmax``. The fp32-state path is the same
  update without the quantisation (``optimizer_update_32bit``).

bitsandbytes runs the update as one fused CUDA kernel per parameter, with no temporaries in
device memory. Here it is real torch arithmetic, done per parameter in chunks of
``CHUNK_ELEMENTS`` elements (a multiple of the block size), so the temporaries of a step are a
few fp32 copies of one chunk whatever the size of the parameter: 12 bytes per chunk element
for fp32 parameters, 20 for bf16 ones (48 and 80 MiB at the default 4 Mi elements, measured
on a trace), which is how far the traced optimizer step can exceed the kernel's. Smaller
chunks cost trace time: about 45 recorded operators per chunk.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.nn.functional as F

from whichgpu.workloads.finetune import dynamic_map

BLOCK_SIZE = 256
"""Elements per fp32 absmax of an 8-bit state (bitsandbytes >= 0.44)."""
MIN_8BIT_SIZE = 4096
"""Parameters with fewer elements keep fp32 states (bitsandbytes ``min_8bit_size``)."""
CHUNK_ELEMENTS = 1 << 22
"""Elements updated per step of the loop over a parameter."""
IMPLEMENTATION = (
    f"8-bit blockwise AdamW (bitsandbytes AdamW8bit layout: uint8 states with an fp32 absmax "
    f"per {BLOCK_SIZE}, fp32 states below {MIN_8BIT_SIZE} elements; updated in chunks of "
    f"{CHUNK_ELEMENTS} elements)"
)
"""The profile's ``optimizer_impl`` for ``--optimizer adamw-8bit``."""
PAGED_MIN_ELEMENTS = 100_000
"""``--optimizer paged-adamw-8bit`` (bitsandbytes ``PagedAdamW8bit``, ``is_paged=True``): the
two states (``state1``, ``state2``) of a parameter of at least this many elements are
allocated in CUDA unified memory (``Optimizer8bit.get_state_buffer``: ``if not self.is_paged
or p.numel() < 1e5: return torch.zeros_like(...)``, else ``F.get_paged``, which allocates
with ``cget_managed_ptr``, i.e. ``cudaMallocManaged``); smaller parameters' states and every
absmax (``torch.zeros(..., device=p.device)`` in ``Optimizer2State.init_state``) stay
ordinary device tensors. The update is the same as ``AdamW8bit``'s; before it,
``prefetch_state`` prefetches a paged parameter's states to the GPU (``F.prefetch_tensor``,
``lib.cprefetch``)."""
PAGED_IMPLEMENTATION = (
    f"{IMPLEMENTATION}; paged: the 8-bit states of parameters of {PAGED_MIN_ELEMENTS} "
    "elements or more in CUDA unified memory, outside PyTorch's caching allocator "
    "(bitsandbytes PagedAdamW8bit)"
)
"""The profile's ``optimizer_impl`` for ``--optimizer paged-adamw-8bit``."""
PAGED_STATES = ("state1", "state2")
"""The state entries a paged optimizer allocates in unified memory (``get_state_buffer``)."""
_TINY = torch.finfo(torch.float32).tiny


def dequantize_blockwise(
    codes: torch.Tensor, absmax: torch.Tensor, qmap: torch.Tensor
) -> torch.Tensor:
    """fp32 ``(blocks, 256)`` values of ``(blocks, 256)`` uint8 ``codes``: ``qmap[code] *
    absmax[block]`` (``absmax`` is ``(blocks, 1)``)."""
    values = F.embedding(codes.int(), qmap.view(-1, 1)).view(codes.shape)
    return values.mul_(absmax)


def quantize_blockwise_into(
    values: torch.Tensor, codes: torch.Tensor, absmax: torch.Tensor, bounds: torch.Tensor
) -> None:
    """Store fp32 ``(blocks, 256)`` ``values`` (overwritten) as 8-bit ``codes`` and ``absmax``.

    ``bounds`` are the midpoints of the map: a value divided by its block's absmax gets the
    index of the nearest map entry.
    """
    block_max = torch.linalg.vector_norm(values, ord=math.inf, dim=1, keepdim=True)
    absmax.copy_(block_max)
    normalised = values.div_(block_max.clamp_min_(_TINY))
    codes.copy_(torch.bucketize(normalised, bounds, out_int32=True))


class AdamW8bit(torch.optim.Optimizer):
    """AdamW with 8-bit blockwise states, as ``bitsandbytes.optim.AdamW8bit`` (see module).

    Besides bitsandbytes' state, each 8-bit parameter's state refers to the midpoints of the
    two maps (``bounds1``, ``bounds2``; 255 fp32 each, shared like the maps), which the
    nearest-entry search uses where the CUDA kernel searches the map itself.
    """

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        min_8bit_size: int = MIN_8BIT_SIZE,
        chunk_elements: int = CHUNK_ELEMENTS,
    ) -> None:
        """bitsandbytes' defaults; ``chunk_elements`` must be a multiple of ``BLOCK_SIZE``."""
        if chunk_elements % BLOCK_SIZE:
            raise ValueError(f"chunk_elements must be a multiple of {BLOCK_SIZE}")
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}
        super().__init__(params, defaults)
        self.min_8bit_size = min_8bit_size
        self.chunk_elements = chunk_elements
        self._maps: dict[torch.device, dict[str, torch.Tensor]] = {}

    def _shared(self, device: torch.device) -> dict[str, torch.Tensor]:
        """The maps and their midpoints on ``device``, created once and shared by all states."""
        if device not in self._maps:
            signed, unsigned = dynamic_map(True, device), dynamic_map(False, device)
            self._maps[device] = {
                "qmap1": signed,
                "qmap2": unsigned,
                "bounds1": (signed[1:] + signed[:-1]) / 2,
                "bounds2": (unsigned[1:] + unsigned[:-1]) / 2,
            }
        return self._maps[device]

    def _init_state(self, param: torch.Tensor, state: dict[str, Any]) -> None:
        state["step"] = 0
        if param.numel() < self.min_8bit_size:
            state["state1"] = torch.zeros_like(param, dtype=torch.float32)
            state["state2"] = torch.zeros_like(param, dtype=torch.float32)
            return
        blocks = -(-param.numel() // BLOCK_SIZE)
        state["state1"] = torch.zeros_like(param, dtype=torch.uint8)
        state["state2"] = torch.zeros_like(param, dtype=torch.uint8)
        state["absmax1"] = torch.zeros(blocks, dtype=torch.float32, device=param.device)
        state["absmax2"] = torch.zeros(blocks, dtype=torch.float32, device=param.device)
        state.update(self._shared(param.device))

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """One AdamW step for every parameter with a gradient."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self.state[param]
                if not state:
                    self._init_state(param, state)
                state["step"] += 1
                self._update(param, param.grad, state, group)
        return loss

    def _update(
        self,
        param: torch.Tensor,
        grad: torch.Tensor,
        state: dict[str, Any],
        group: dict[str, Any],
    ) -> None:
        beta1, beta2 = group["betas"]
        lr, eps, weight_decay = group["lr"], group["eps"], group["weight_decay"]
        step = state["step"]
        correction1 = 1.0 - beta1**step
        correction2 = (1.0 - beta2**step) ** 0.5
        step_size = -lr * correction2 / correction1
        hyper = (beta1, beta2, lr, weight_decay, eps * correction2, step_size)
        eight_bit = state["state1"].dtype == torch.uint8
        flat_param, flat_grad = param.view(-1), grad.reshape(-1)
        state1, state2 = state["state1"].view(-1), state["state2"].view(-1)
        if eight_bit:
            absmax1, absmax2 = state["absmax1"].view(-1, 1), state["absmax2"].view(-1, 1)
        n = flat_param.numel()
        for start in range(0, n, self.chunk_elements):
            stop = min(n, start + self.chunk_elements)
            g = flat_grad[start:stop]
            p = flat_param[start:stop]
            if not eight_bit:
                _adamw(p, g, state1[start:stop], state2[start:stop], hyper)
                continue
            blocks = slice(start // BLOCK_SIZE, -(-stop // BLOCK_SIZE))
            first = _Run(state1[start:stop], absmax1[blocks], state["qmap1"])
            second = _Run(state2[start:stop], absmax2[blocks], state["qmap2"])
            _adamw(p, g, first.values, second.values, hyper)
            first.store(state["bounds1"])
            second.store(state["bounds2"])
            del first, second  # free this chunk's fp32 states before the next is made


def _adamw(
    param: torch.Tensor,
    grad: torch.Tensor,
    m: torch.Tensor,
    v: torch.Tensor,
    hyper: tuple[float, float, float, float, float, float],
) -> None:
    """bitsandbytes' AdamW update of one chunk, in fp32, in place (``param`` keeps its dtype)."""
    beta1, beta2, lr, weight_decay, eps_scaled, step_size = hyper
    g = grad.float()
    p = param.float()
    m.mul_(beta1).add_(g, alpha=1.0 - beta1)
    v.mul_(beta2).addcmul_(g, g, value=1.0 - beta2)
    if weight_decay > 0.0:
        p.mul_(1.0 - lr * weight_decay)
    p.addcdiv_(m, v.sqrt().add_(eps_scaled), value=step_size)
    if param.dtype != torch.float32:
        param.copy_(p)


class _Run:
    """One chunk of an 8-bit state: its codes, dequantised to fp32 ``(blocks, 256)``."""

    def __init__(self, codes: torch.Tensor, absmax: torch.Tensor, qmap: torch.Tensor) -> None:
        """``codes``: a flat run of the state; ``absmax``: its ``(blocks, 1)`` absmax."""
        self.size, self.blocks = codes.numel(), absmax.shape[0]
        self.codes, self.absmax = codes, absmax
        self.padded = self.blocks * BLOCK_SIZE != self.size  # a partial last block
        if self.padded:
            codes = F.pad(codes, (0, self.blocks * BLOCK_SIZE - self.size))
        self.grid = dequantize_blockwise(codes.view(self.blocks, BLOCK_SIZE), absmax, qmap)
        self.values = self.grid.view(-1)
        if self.padded:
            self.values[self.size :].zero_()
            self.values = self.values[: self.size]

    def store(self, bounds: torch.Tensor) -> None:
        """Quantise the (updated) values back into the state's codes and absmax."""
        if not self.padded:
            target = self.codes.view(self.blocks, BLOCK_SIZE)
            quantize_blockwise_into(self.grid, target, self.absmax, bounds)
            return
        target = torch.empty(self.blocks, BLOCK_SIZE, dtype=torch.uint8, device=self.codes.device)
        quantize_blockwise_into(self.grid, target, self.absmax, bounds)
        self.codes.copy_(target.view(-1)[: self.size])
