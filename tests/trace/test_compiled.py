"""The activations a compiled training step saves (``whichgpu.trace.compiled``) against an eager
one, on tiny models: what the partitioners choose, how the bytes are counted, what is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from whichgpu.errors import UnsupportedWorkload
from whichgpu.schema import RunConfig, WorkloadInfo
from whichgpu.trace.compiled import (
    CompiledActivations,
    FusedKernel,
    Partition,
    compiled_activations,
)
from whichgpu.workloads import run_config
from whichgpu.workloads.base import BuiltWorkload, Workload
from whichgpu.workloads.user import config_workload

FIXTURES = Path(__file__).parents[1] / "fixtures"

HIDDEN, WIDE = 64, 256


@pytest.fixture(scope="module")
def tiny_llama() -> CompiledActivations:
    """tiny-llama (tests/fixtures): 2 layers of hidden 64, vocabulary 512, bf16 AMP."""
    workload = config_workload(FIXTURES / "tiny-llama.json")
    return compiled_activations(workload, run_config(batch_size=2, seq_len=32), 2, 32)


class _Gated(torch.nn.Module):
    """A SwiGLU block and a squared loss: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = torch.nn.Linear(HIDDEN, WIDE, bias=False)
        self.up = torch.nn.Linear(HIDDEN, WIDE, bias=False)
        self.down = torch.nn.Linear(WIDE, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.nn.functional.silu(self.gate(x)) * self.up(x)
        loss: torch.Tensor = self.down(hidden).pow(2).mean()
        return loss


class _Viewed(_Gated):
    """``_Gated`` with views between its pointwise operators: the same kernels."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = torch.nn.functional.silu(self.gate(x)).view(-1, 4, WIDE // 4).unsqueeze(1)
        hidden = gate.squeeze(1).transpose(1, 2).transpose(1, 2).reshape(-1, WIDE) * self.up(x)
        loss: torch.Tensor = self.down(hidden).pow(2).mean()
        return loss


class _DataDependent(torch.nn.Module):
    """A model whose forward pass branches on a value: no graph holds it."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(HIDDEN, HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x)
        if y.sum().item() > 0:
            y = y * 2
        loss: torch.Tensor = y.pow(2).mean()
        return loss


def _workload(module: type[torch.nn.Module]) -> Workload:
    def build(run: RunConfig) -> BuiltWorkload:
        del run
        model = module()
        return BuiltWorkload(
            model=model,
            make_batch=lambda batch_size, seq_len: {"x": torch.randn(batch_size, HIDDEN)},
            loss=lambda model, batch: model(batch["x"]),
            units_per_sample=lambda seq_len: 1,
        )

    info = WorkloadInfo(
        name=module.__name__,
        family="test",
        task="test",
        description="a test model",
        input_desc="a vector",
        throughput_unit="samples",
        default_batch_size=8,
    )
    return Workload(info=info, build=build)


def test_min_cut_saves_no_more_than_the_default_partition(tiny_llama: CompiledActivations) -> None:
    assert 0 < tiny_llama.saved_bytes_compiled <= tiny_llama.saved_bytes_default
    assert tiny_llama.saved_bytes_difference == (
        tiny_llama.saved_bytes_default - tiny_llama.saved_bytes_compiled
    )


def test_saved_bytes_are_the_sum_of_the_listed_tensors(tiny_llama: CompiledActivations) -> None:
    for part in (tiny_llama.default, tiny_llama.min_cut):
        assert part.saved_bytes == sum(t.bytes for t in part.saved)
        assert [t.bytes for t in part.saved] == sorted((t.bytes for t in part.saved), reverse=True)
        for t in part.saved:
            assert (
                t.tensor_bytes
                == torch.Size(t.shape).numel()
                * getattr(torch, t.dtype.removeprefix("torch.")).itemsize
            )
            # a tensor adds bytes exactly when nothing else holds its storage
            assert (t.bytes == 0) == (t.held_by is not None)
        assert all(t.bytes > 0 for t in part.largest(5))


def test_held_tensors_add_nothing(tiny_llama: CompiledActivations) -> None:
    # the parameters the backward pass reads (RMSNorm weights) and the input ids are held by
    # the step anyway; the KV cache is one of the outputs the model returns
    for part in (tiny_llama.default, tiny_llama.min_cut):
        held = {t.held_by for t in part.saved}
        assert {"parameter", "input", "output"} <= held
        # 2 layers' keys and values of 2 sequences x 2 heads x 32 tokens x 16: the keys fp32
        # (RoPE runs in the fp32 of the residual stream), the values bf16 (a matmul's output);
        # the logits, 2 x 32 x 512 in bf16; the loss, 4 bytes
        cache = 2 * (2 * 2 * 32 * 16) * (4 + 2)
        assert part.output_bytes == cache + 2 * 32 * 512 * 2 + 4


def test_the_loss_keeps_fp32_log_probabilities_only_in_eager(
    tiny_llama: CompiledActivations,
) -> None:
    # eager autograd saves log_softmax's fp32 output over the vocabulary (2 x 32 tokens x 512);
    # inductor's partition saves the bf16 logits (an output anyway) and a max and a log-sum
    # per token, and recomputes the rest in the backward pass
    log_probs = 2 * 32 * 512 * 4
    assert tiny_llama.default.largest(1)[0].bytes == log_probs
    assert tiny_llama.default.largest(1)[0].dtype == "torch.float32"
    assert all(t.tensor_bytes < log_probs for t in tiny_llama.min_cut.saved)


def test_min_cut_recomputes_a_pointwise_chain() -> None:
    batch = 8
    run = run_config(batch_size=batch, precision="fp32")
    result = compiled_activations(_workload(_Gated), run, batch, None)
    eager = {t.op for t in result.default.saved if t.bytes}
    compiled = {t.op for t in result.min_cut.saved if t.bytes}
    # eager keeps silu's output for the product's backward; compiled recomputes it from the
    # gate's matmul output, which both keep (as the up projection's and the product, down's
    # input, which the backward's matmul needs materialised either way)
    assert "aten.silu.default" in eager
    assert "aten.silu.default" not in compiled
    wide, narrow = batch * WIDE * 4, batch * HIDDEN * 4  # fp32
    assert result.saved_bytes_default == 4 * wide + narrow  # gate, silu, up, product; output
    assert result.saved_bytes_compiled == 3 * wide + narrow
    assert result.saved_bytes_compiled < result.saved_bytes_default


def _gated(module: type[torch.nn.Module] = _Gated) -> CompiledActivations:
    return compiled_activations(
        _workload(module), run_config(batch_size=8, precision="fp32"), 8, None
    )


def test_a_pointwise_chain_between_matmuls_is_one_kernel() -> None:
    batch = 8
    wide = batch * WIDE * 4  # fp32
    forward = _gated().min_cut.forward_kernels
    assert [k.kind for k in forward] == ["extern", "fused", "extern", "extern", "fused"]
    # silu (sigmoid, a multiply, as inductor decomposes it) times up: one kernel that reads
    # the two matmuls' outputs and writes only the product, which down's matmul reads (and
    # the backward pass keeps); silu's output never reaches DRAM
    chain = forward[1]
    assert (chain.bytes_read, chain.bytes_written) == (2 * wide, wide)
    assert chain.nodes == 5
    assert chain.flops == 5 * batch * WIDE  # one per element per node
    # eager's partition keeps silu's output for the backward pass: written as well
    eager = _gated().default.forward_kernels[1]
    assert (eager.kind, eager.name, eager.bytes_read, eager.bytes_written) == (
        "fused",
        "silu..mul",
        2 * wide,
        2 * wide,
    )
    # the loss: the squares and their mean read down's output and write one number
    assert (forward[4].bytes_read, forward[4].bytes_written) == (batch * HIDDEN * 4, 4)


def test_extern_kernels_read_and_write_their_tensors() -> None:
    batch = 8
    forward = _gated().min_cut.forward_kernels
    externs = [k for k in forward if k.kind == "extern"]
    x, weight = batch * HIDDEN * 4, WIDE * HIDDEN * 4  # fp32; down's weight is as large
    assert externs == [
        FusedKernel("extern", "aten.mm.default", x + weight, batch * WIDE * 4, 0, 1),  # gate
        FusedKernel("extern", "aten.mm.default", x + weight, batch * WIDE * 4, 0, 1),  # up
        FusedKernel("extern", "aten.mm.default", batch * WIDE * 4 + weight, x, 0, 1),  # down
    ]


def test_views_add_no_kernel() -> None:
    plain, viewed = _gated(), _gated(_Viewed)
    for a, b in ((plain.default, viewed.default), (plain.min_cut, viewed.min_cut)):
        for phase in ("forward", "backward"):
            assert [(k.kind, k.bytes_read, k.bytes_written, k.nodes) for k in a.kernels(phase)] == [
                (k.kind, k.bytes_read, k.bytes_written, k.nodes) for k in b.kernels(phase)
            ]
            assert a.unfused_bytes(phase) == b.unfused_bytes(phase)


def _summary(part: Partition) -> tuple[int, ...]:
    return tuple(
        part.kernel_count(phase, kind)
        for phase in ("forward", "backward")
        for kind in ("fused", "extern")
    )


def test_fusion_moves_no_more_than_eager(tiny_llama: CompiledActivations) -> None:
    for part in (tiny_llama.default, tiny_llama.min_cut):
        for phase in ("forward", "backward"):
            assert 0 < part.kernel_bytes(phase) < part.unfused_bytes(phase)
            assert part.kernel_count(phase) < part.unfused_count(phase)
            kernels = [k for k in part.kernels(phase) if k.kind == "fused"]
            assert part.kernel_bytes(phase) == sum(k.bytes_read + k.bytes_written for k in kernels)
        assert part.forward_fused_count == part.kernel_count("forward")
        assert part.backward_fused_bytes == part.kernel_bytes("backward")
    # compiling removes most of the eager step's vector traffic
    eager = sum(tiny_llama.default.unfused_bytes(p) for p in ("forward", "backward"))
    fused = sum(tiny_llama.min_cut.kernel_bytes(p) for p in ("forward", "backward"))
    assert fused < eager / 2


def test_tiny_llama_kernel_counts(tiny_llama: CompiledActivations) -> None:
    # Extern kernels: the forward runs 2 layers x (7 matmuls + attention) + the LM head = 17;
    # the backward 2 matmuls per forward matmul and attention's backward = 32, and eager's
    # partition recomputes each layer's attention forward in the backward too = 34.
    # Compiled forward, 26 fused kernels: 15 casts of a weight to bf16 (7 per layer, the LM
    # head), each its own kernel between a parameter and a matmul; layer 0: the embedding
    # with the first norm, RoPE of q and k with the cos/sin table, the residual add with the
    # second norm, silu x up (4); layer 1 the same with q's and k's RoPE apart (5); the last
    # residual add with the final norm, and the loss (2).
    assert _summary(tiny_llama.min_cut) == (26, 17, 32, 32)
    assert _summary(tiny_llama.default) == (28, 17, 35, 34)


def test_refuses_inference() -> None:
    workload = config_workload(FIXTURES / "tiny-llama.json")
    run = run_config(mode="inference", batch_size=2, seq_len=32)
    with pytest.raises(UnsupportedWorkload, match="training step"):
        compiled_activations(workload, run, 2, 32)


POLICIES = {
    "none": {},
    "full": {"checkpointing": True},
    "selective": {"checkpointing": True, "checkpointing_policy": "selective"},
    "every-2": {"checkpointing": True, "checkpointing_policy": "every-2"},
}


@pytest.fixture(scope="module")
def checkpointed() -> dict[str, CompiledActivations]:
    """tiny-llama at 2 x 64 tokens, each checkpointing policy (and none)."""
    workload = config_workload(FIXTURES / "tiny-llama.json")
    return {
        name: compiled_activations(workload, run_config(batch_size=2, seq_len=64, **kw), 2, 64)
        for name, kw in POLICIES.items()
    }


def _backward_products(part: Partition) -> int:
    return sum(1 for k in part.backward_kernels if k.name == "aten.mm.default")


def test_checkpointed_regions_are_split_by_their_tags(
    checkpointed: dict[str, CompiledActivations],
) -> None:
    """Each checkpointed layer call's operators carry its policy's tags, which both
    partitioners honour: the default partition keeps what eager checkpointing keeps (the
    published ordering of the policies), and inside the regions the min-cut keeps the same,
    so that what compiling saves of a fully checkpointed step is what it saves outside the
    layers, whatever the policy inside them."""
    default = {name: a.default.saved_bytes for name, a in checkpointed.items()}
    assert default["none"] > default["every-2"] > default["selective"] > default["full"]
    for traced in checkpointed.values():
        assert 0 < traced.saved_bytes_compiled < traced.saved_bytes_default
    saving = {name: a.saved_bytes_difference for name, a in checkpointed.items()}
    assert saving["full"] == saving["selective"]
    # every-2 checkpoints the first of the two layers: the second saves what it saves alone
    assert saving["full"] < saving["every-2"] < saving["none"]
    per_layer = (saving["none"] - saving["full"]) / 2
    assert saving["every-2"] - saving["full"] == pytest.approx(per_layer, rel=0.1)


def test_checkpointed_layers_are_recomputed_in_the_backward_graph(
    checkpointed: dict[str, CompiledActivations],
) -> None:
    """The recomputation is the partitioner's: the backward graph runs the regions' forward
    operators again, matrix products included (full: nearly all seven of each of the two
    layers; selective: the three its policy does not keep, k, o and up, of each; every-2: one
    layer's seven), and more fused kernels, moving more bytes."""
    none = checkpointed["none"].min_cut
    added = {
        name: _backward_products(a.min_cut) - _backward_products(none)
        for name, a in checkpointed.items()
    }
    assert added["selective"] == 2 * 3
    assert added["every-2"] == 7
    assert 2 * 6 <= added["full"] <= 2 * 7
    for name in ("full", "selective", "every-2"):
        cut = checkpointed[name].min_cut
        assert cut.backward_fused_count > none.backward_fused_count
        assert cut.backward_fused_bytes > none.backward_fused_bytes


def test_refuses_a_step_it_cannot_trace() -> None:
    run = run_config(batch_size=4, precision="fp32")
    with pytest.raises(UnsupportedWorkload, match="could not trace"):
        compiled_activations(_workload(_DataDependent), run, 4, None)


@pytest.mark.slow
def test_gpt2_with_dropout_traces() -> None:
    # GPT-2 drops out (p 0.1) after attention and the MLP: CUDA's kernel keeps a one-byte mask
    result = compiled_activations("gpt2", run_config(batch_size=1, seq_len=64), 1, 64)
    assert 0 < result.saved_bytes_compiled < result.saved_bytes_default
    assert any(t.dtype == "torch.bool" for t in result.default.saved if t.bytes)
