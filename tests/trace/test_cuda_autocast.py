"""The tracer's CUDA autocast rules (``whichgpu.trace.cuda_autocast``) and the model output a
training step holds (``workloads.hf.loss_from_output``)."""

from __future__ import annotations

import re
import weakref
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from whichgpu.estimate.sharding import event_phases
from whichgpu.schema import RunConfig
from whichgpu.trace import trace_step
from whichgpu.trace.cuda_autocast import (
    FP32,
    FP32_APPEND_DTYPE,
    FP32_SET_OPT_DTYPE,
    LOWER_PRECISION_FP,
    PROMOTE,
    cuda_autocast_rules,
)
from whichgpu.workloads.hf import HELD_OUTPUT, loss_from_output
from whichgpu.workloads.user import config_workload

FIXTURES = Path(__file__).parents[1] / "fixtures"
BF16 = torch.bfloat16


def _bf16_autocast() -> torch.autocast:
    return torch.autocast("cpu", dtype=BF16)


def test_cuda_runs_pow_softmax_layer_norm_and_sums_in_fp32() -> None:
    x = torch.randn(4, 8)
    weight = torch.nn.Parameter(torch.randn(8, 8))
    with cuda_autocast_rules(), _bf16_autocast():
        h = torch.nn.functional.linear(x, weight)
        assert h.dtype == BF16  # a GEMM: 16-bit on both devices
        assert torch.pow(h, 3.0).dtype == torch.float32
        assert h.exp().dtype == torch.float32
        assert torch.softmax(h, -1).dtype == torch.float32
        assert torch.log_softmax(h, -1, None).dtype == torch.float32  # dtype given positionally
        assert torch.softmax(h, -1, dtype=BF16).dtype == BF16  # a dtype asked for is kept
        assert torch.nn.functional.layer_norm(h, (8,)).dtype == torch.float32
        assert h.sum().dtype == torch.float32
        assert h.norm().dtype == torch.float32  # fp32_append_dtype
        assert torch.addcmul(h, h, x).dtype == torch.float32  # promote: one input is fp32
        assert torch.addcmul(h, h, h).dtype == BF16
        assert torch.einsum("ij,jk->ik", x, weight).dtype == BF16  # CUDA's table lists einsum
    # the CPU's own table is back: it leaves these in the input's dtype
    with _bf16_autocast():
        h = torch.nn.functional.linear(x, weight)
        assert torch.pow(h, 3.0).dtype == BF16
        assert torch.softmax(h, -1).dtype == BF16


def test_operators_only_the_cpu_table_lists_pass_through() -> None:
    # the CPU's table runs reflection padding in fp32; CUDA's does not list it
    a = torch.randn(1, 2, 3, dtype=BF16)
    with _bf16_autocast():
        assert torch.nn.functional.pad(a, (1, 1), mode="reflect").dtype == torch.float32
    with cuda_autocast_rules(), _bf16_autocast():
        assert torch.nn.functional.pad(a, (1, 1), mode="reflect").dtype == BF16


class _CastsOf(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Counts the copies (``_to_copy``) made of one tensor."""

    def __init__(self, tensor: torch.Tensor) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.tensor, self.count = tensor, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func is torch.ops.aten._to_copy.default and args[0] is self.tensor:
            self.count += 1
        return func(*args, **(kwargs or {}))


def test_a_parameter_is_cast_once_per_autocast_region() -> None:
    # addmv is in CUDA's 16-bit list, not the CPU's: its casts go through the module's cache
    weight = torch.nn.Parameter(torch.randn(8, 8))
    vector, bias = torch.randn(8), torch.randn(8)
    with cuda_autocast_rules(), _CastsOf(weight) as casts:
        with _bf16_autocast():
            assert torch.addmv(bias, weight, vector).dtype == BF16
            torch.addmv(bias, weight, vector)
        assert casts.count == 1
        # a new region casts again: PyTorch clears its cache as the outermost region ends
        with _bf16_autocast():
            torch.addmv(bias, weight, vector)
        assert casts.count == 2


def test_the_table_is_cudas_own() -> None:
    registered = {
        name.removeprefix("aten::")
        for name in torch._C._dispatch_get_registrations_for_dispatch_key("AutocastCUDA")
    }
    ours = set(LOWER_PRECISION_FP) | set(FP32) | set(FP32_SET_OPT_DTYPE) | set(FP32_APPEND_DTYPE)
    ours |= set(PROMOTE)
    # every operator of the table is one CUDA's autocast registers (the 16-bit list's
    # overloads without a name register under the operator's default overload)
    assert {name.removesuffix(".default") for name in ours} <= registered


def _header_lists(header: Path) -> dict[str, set[str]]:
    text = header.read_text(encoding="utf-8")
    lists = {}
    for macro in (
        "AT_FORALL_LOWER_PRECISION_FP",
        "AT_FORALL_FP32",
        "AT_FORALL_FP32_SET_OPT_DTYPE",
        "AT_FORALL_PROMOTE",
    ):
        body = re.search(rf"#define {macro}\(_\)(.*?)\n\n", text, re.S)
        assert body is not None, macro
        entries = re.findall(r"_\((\w+)(?:, (\w+))?\)", body.group(1))
        lists[macro] = {name + (f".{overload}" if overload else "") for name, overload in entries}
    return lists


def test_the_table_matches_the_installed_torch_header() -> None:
    header = Path(torch.__file__).parent / "include" / "ATen" / "autocast_mode.h"
    if not header.exists():
        pytest.skip("this torch ships no C++ headers")
    lists = _header_lists(header)
    assert lists["AT_FORALL_LOWER_PRECISION_FP"] == set(LOWER_PRECISION_FP)
    assert lists["AT_FORALL_FP32"] == set(FP32)
    assert lists["AT_FORALL_FP32_SET_OPT_DTYPE"] == set(FP32_SET_OPT_DTYPE)
    assert lists["AT_FORALL_PROMOTE"] == set(PROMOTE)


def test_gelu_new_saves_fp32_tensors_under_cuda_rules() -> None:
    # GPT-2's activation: pow makes the chain 32-bit on CUDA, so what backward keeps doubles
    from transformers.activations import NewGELUActivation

    x = torch.randn(16, 64, requires_grad=True)
    weight = torch.nn.Parameter(torch.randn(64, 64))

    def saved_bytes() -> int:
        total = 0

        def pack(t: torch.Tensor) -> torch.Tensor:
            nonlocal total
            total += t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), _bf16_autocast():
            NewGELUActivation()(torch.nn.functional.linear(x, weight))
        return total

    cpu = saved_bytes()
    with cuda_autocast_rules():
        cuda = saved_bytes()
    assert cuda > cpu


def test_the_loss_holds_the_models_output_without_a_cycle() -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=16)
    model = GPT2LMHeadModel(config)
    ids = torch.randint(0, 64, (2, 8))
    loss = loss_from_output(model, {"input_ids": ids, "labels": ids})
    held = getattr(loss, HELD_OUTPUT)
    assert held["logits"].shape == (2, 8, 64)
    logits = weakref.ref(held["logits"])
    del held, loss
    assert logits() is None  # freed with the loss, by reference counting alone


def test_a_trace_holds_the_logits_until_the_step_ends() -> None:
    run = RunConfig(batch_size=2, seq_len=32)
    profile = trace_step(config_workload(FIXTURES / "tiny-llama.json"), run)
    assert "cuda rules" in profile.choices["autocast"]
    logits_bytes = 2 * 32 * 512 * 2  # batch x length x vocabulary, bf16 under autocast
    events = profile.events
    phases = event_phases(
        [e.op_index for e in events], [e.step for e in events], [op.phase for op in profile.ops]
    )
    allocated = {
        e.storage: p for e, p in zip(events, phases, strict=True) if e.alloc and e.step == 1
    }
    freed = {
        e.storage: p for e, p in zip(events, phases, strict=True) if not e.alloc and e.step == 1
    }
    sizes = {e.storage: e.size_bytes for e in events}
    held = [
        s
        for s, phase in allocated.items()
        if sizes[s] == logits_bytes and phase == "forward" and freed.get(s) == "optimizer"
    ]
    assert held  # allocated in the forward pass, freed only after the optimizer step
    cpu = trace_step(config_workload(FIXTURES / "tiny-llama.json"), run, kernels="cpu")
    assert "cpu rules" in cpu.choices["autocast"]
