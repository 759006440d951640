"""LoRA, QLoRA (NF4) and 8-bit AdamW: parameter counts, storage, numerics, traced memory."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from tests.conftest import run_cli
from whichgpu.errors import UnsupportedWorkload
from whichgpu.estimate.profile_summary import live_peak
from whichgpu.recipe.optim8bit import BLOCK_SIZE, AdamW8bit
from whichgpu.schema import RunConfig
from whichgpu.trace import trace_step
from whichgpu.workloads import finetune, get_workload
from whichgpu.workloads.base import BuiltWorkload
from whichgpu.workloads.finetune import (
    NF4_CODE,
    LoraLinear,
    Nf4Linear,
    apply_method,
    count_parameters,
)
from whichgpu.workloads.user import config_workload

TINY = Path(__file__).parents[1] / "fixtures" / "tiny-llama.json"
# tiny-llama: 2 layers, hidden 64, 4 heads of 16 (2 KV heads: k/v project to 32), MLP 128.
TINY_LINEARS = {  # name: (in, out)
    "q_proj": (64, 64),
    "k_proj": (64, 32),
    "v_proj": (64, 32),
    "o_proj": (64, 64),
    "gate_proj": (64, 128),
    "up_proj": (64, 128),
    "down_proj": (128, 64),
}
TINY_LAYERS = 2


def _lora_params(rank: int, names: list[str]) -> int:
    return TINY_LAYERS * sum(rank * sum(TINY_LINEARS[n]) for n in names)


def _built(run: RunConfig, workload: str | None = None) -> BuiltWorkload:
    """Build (under the active mode) and apply the run's method."""
    chosen = get_workload(workload) if workload else config_workload(TINY)
    return apply_method(chosen.build(run), run)


def test_lora_trainable_parameters_are_rank_times_in_plus_out() -> None:
    run = RunConfig(method="lora", batch_size=2, seq_len=32)
    profile = trace_step(config_workload(TINY), run)
    assert profile.params_trainable == _lora_params(16, list(TINY_LINEARS)) == 32_768
    with FakeTensorMode():
        base_total, _ = count_parameters(config_workload(TINY).build(RunConfig()).model)
    assert profile.params_total == base_total + profile.params_trainable
    assert "lora r=16 alpha=8 on q_proj,k_proj" in profile.choices["finetune"]
    assert profile.choices["optimizer_impl"] == "foreach"

    run = RunConfig(method="lora", lora_rank=4, lora_targets=("q_proj", "v_proj"))
    with FakeTensorMode():
        _, trainable = count_parameters(_built(run).model)
    assert trainable == _lora_params(4, ["q_proj", "v_proj"]) == 1_792


def test_llama_3_1_8b_lora_r16_matches_the_published_count() -> None:
    # peft's print_trainable_parameters() for meta-llama/Llama-3.1-8B with LoraConfig(r=16,
    # target_modules=[q,k,v,o,gate,up,down]_proj) prints "trainable params: 41,943,040 || all
    # params: 8,072,204,288" (as reproduced in public fine-tuning guides); it is also
    # 32 layers x 16 x (8192 + 5120 + 5120 + 8192 + 3 x 18432).
    run = RunConfig(method="lora")
    with FakeTensorMode():
        model = _built(run, "llama-3.1-8b").model
        assert count_parameters(model) == (8_072_204_288, 41_943_040)
        adapted = [m for m in model.modules() if isinstance(m, LoraLinear)]
        assert len(adapted) == 32 * 7
        base = adapted[0].base_layer.weight
        assert base.dtype == torch.bfloat16 and not base.requires_grad
        assert adapted[0].lora_A.weight.dtype == torch.float32
    with FakeTensorMode():  # QLoRA counts its 4-bit weights as the parameters they stand for
        assert count_parameters(_built(RunConfig(method="qlora"), "llama-3.1-8b").model) == (
            8_072_204_288,
            41_943_040,
        )


def test_gpt2_conv1d_layers_take_lora_and_nf4() -> None:
    # GPT-2's c_attn/c_proj/c_fc are transformers Conv1D (weight stored in x out), which peft
    # adapts and transformers quantises (transposed) like nn.Linear.
    with FakeTensorMode():
        model = _built(RunConfig(method="qlora"), "gpt2").model
        _, trainable = count_parameters(model)
        quantized = [m for m in model.modules() if isinstance(m, Nf4Linear)]
        c_attn = model.get_submodule("transformer.h.0.attn.c_attn")
        assert isinstance(c_attn, LoraLinear) and isinstance(c_attn.base_layer, Nf4Linear)
        assert (c_attn.base_layer.in_features, c_attn.base_layer.out_features) == (768, 2304)
        assert type(model.get_submodule("lm_head")) is nn.Linear  # tied output layer
    assert trainable == 12 * 16 * ((768 + 2304) + (768 + 768) + (768 + 3072) + (3072 + 768))
    assert len(quantized) == 12 * 4


def test_qlora_weight_storage_is_packed_nf4_plus_double_quantised_absmax() -> None:
    with FakeTensorMode():
        model = _built(RunConfig(method="qlora")).model
        layers = [m for m in model.modules() if isinstance(m, Nf4Linear)]
        assert len(layers) == TINY_LAYERS * len(TINY_LINEARS)
        assert type(model.get_submodule("lm_head")) is nn.Linear  # bitsandbytes skips it
        for layer in layers:
            n = layer.in_features * layer.out_features
            blocks = math.ceil(n / 64)
            expected = (
                math.ceil(n / 2)  # two 4-bit codes per byte
                + blocks  # one uint8 absmax code per block of 64
                + 4 * math.ceil(blocks / 256)  # fp32 scale per 256 absmax codes
                + 4  # fp32 offset (the mean absmax)
                + 4 * 16  # the layer's NF4 code
                + 4 * 256  # the layer's copy of the 8-bit dynamic map
            )
            tensors = [layer.weight, *layer.buffers()]
            assert sum(t.untyped_storage().nbytes() for t in tensors) == expected
            assert layer.weight.dtype == torch.uint8 and layer.weight.shape == (n // 2, 1)
            assert not layer.weight.requires_grad


def test_nf4_round_trip_is_close_and_exact_on_code_book_values() -> None:
    torch.manual_seed(0)
    weight = torch.randn(96, 200)  # 300 blocks: the double quantisation pads its last group
    restored = Nf4Linear(weight, None, torch.float32).dequantize(torch.float32)
    assert (restored - weight).norm() / weight.norm() < 0.11  # NF4 on N(0,1): about 0.092
    # No value is off by more than half the widest NF4 gap (-1 .. -0.696) times its block's
    # absmax (plus the double quantisation's small error on that absmax).
    block_max = weight.reshape(-1, 64).abs().amax(dim=1, keepdim=True)
    error = (restored - weight).reshape(-1, 64).abs()
    assert (error <= 0.16 * block_max).all()

    code = torch.tensor(NF4_CODE)
    indices = torch.stack([torch.randperm(16) for _ in range(8)]).reshape(32, 4)
    exact = code[indices] * 0.5  # every block holds -1.0 x 0.5, so each absmax is 0.5
    layer = Nf4Linear(exact, None, torch.float32)
    assert torch.equal(layer.dequantize(torch.float32), exact)
    packed = layer.weight.view(-1)
    assert torch.equal(torch.stack((packed >> 4, packed & 15), dim=1).view(32, 4), indices)
    assert torch.equal(layer.dequantize(torch.bfloat16), exact.to(torch.bfloat16))


@pytest.mark.parametrize("shape", [(7, 9), (33, 65), (64, 128)])
def test_nf4_dequantisation_in_chunks_equals_one_pass(shape: tuple[int, int]) -> None:
    layer = Nf4Linear(torch.randn(*shape), None, torch.bfloat16)
    whole = layer.dequantize(torch.bfloat16)
    assert whole.shape == shape
    assert torch.equal(layer.dequantize(torch.bfloat16, chunk_elements=64), whole)


def test_nf4_linear_and_its_adapter_match_plain_linear_on_the_dequantised_weight() -> None:
    torch.manual_seed(0)
    base = Nf4Linear(torch.randn(48, 32), nn.Parameter(torch.randn(48)), torch.float32)
    layer = LoraLinear(base, 32, 48, rank=4, dtype=torch.float32, device=torch.device("cpu"))
    nn.init.normal_(layer.lora_B.weight)  # peft starts it at zero; make the update visible
    x = torch.randn(3, 5, 32, requires_grad=True)
    y = layer(x)
    weight = base.dequantize(torch.float32)
    x_ref = x.detach().clone().requires_grad_()
    delta = layer.lora_B.weight @ layer.lora_A.weight * (8 / 4)  # alpha 8, rank 4
    y_ref = nn.functional.linear(x_ref, weight + delta, base.bias)
    assert torch.allclose(y, y_ref, atol=1e-5)
    y.square().sum().backward()
    y_ref.square().sum().backward()
    assert x.grad is not None and x_ref.grad is not None
    assert torch.allclose(x.grad, x_ref.grad, atol=1e-4)
    assert base.weight.grad is None and base.bias is not None and base.bias.grad is None
    assert layer.lora_A.weight.grad is not None and layer.lora_B.weight.grad is not None


def _regression(seed: int) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(64, 128), nn.Tanh(), nn.Linear(128, 1))
    x = torch.randn(256, 64)
    y = torch.sin(x[:, :1] * 2) + 0.5 * x[:, 1:2]
    return model, x, y


def test_adamw_8bit_reduces_a_loss_with_uint8_states() -> None:
    model, x, y = _regression(0)
    optimizer = AdamW8bit(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(40):
        loss = nn.functional.mse_loss(model(x), y)
        losses.append(loss.item())
        optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
    assert losses[-1] < 0.3 * losses[0]
    big = optimizer.state[model[0].weight]  # 8192 elements: 8-bit
    assert big["state1"].dtype == big["state2"].dtype == torch.uint8
    assert big["state1"].shape == big["state2"].shape == (128, 64)
    assert big["absmax1"].shape == big["absmax2"].shape == (8192 // BLOCK_SIZE,)
    signed, unsigned = big["qmap1"], big["qmap2"]  # bitsandbytes' dynamic maps, shared
    assert signed.numel() == unsigned.numel() == 256 and signed.max() == unsigned.max() == 1
    assert -1 < signed.min() < -0.99 and unsigned.min() == 0
    small = optimizer.state[model[2].weight]  # 128 elements, under min_8bit_size: fp32
    assert small["state1"].dtype == torch.float32 and small["state1"].shape == (1, 128)
    assert "absmax1" not in small


def test_adamw_8bit_first_step_is_adamw_and_chunking_changes_nothing() -> None:
    # From zero state the first update uses the unquantised moments, so it is torch's AdamW
    # (same decoupled weight decay, same bias correction) up to rounding.
    reference, x, y = _regression(1)
    model, _, _ = _regression(1)
    nn.functional.mse_loss(reference(x), y).backward()  # type: ignore[no-untyped-call]
    nn.functional.mse_loss(model(x), y).backward()  # type: ignore[no-untyped-call]
    torch.optim.AdamW(reference.parameters(), lr=1e-2, weight_decay=1e-2).step()
    AdamW8bit(model.parameters(), lr=1e-2).step()
    for mine, theirs in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.allclose(mine, theirs, atol=1e-6)

    torch.manual_seed(2)
    weights = [nn.Parameter(torch.randn(50, 101)) for _ in range(2)]  # 5050: a partial block
    weights[1].data.copy_(weights[0].data)
    optimizers = [AdamW8bit([weights[0]]), AdamW8bit([weights[1]], chunk_elements=BLOCK_SIZE)]
    for _ in range(3):
        grad = torch.randn(50, 101)
        for weight, optimizer in zip(weights, optimizers, strict=True):
            weight.grad = grad.clone()
            optimizer.step()
    assert torch.equal(weights[0], weights[1])
    states = [optimizer.state[w] for optimizer, w in zip(optimizers, weights, strict=True)]
    for key in ("state1", "state2", "absmax1", "absmax2"):
        assert torch.equal(states[0][key], states[1][key])


@pytest.mark.parametrize(
    ("method", "optimizer", "precision", "rank"),
    [
        ("lora", "adamw", "bf16", 16),
        ("qlora", "adamw-8bit", "bf16", 64),  # rank 64: 4096-element adapters, 8-bit states
    ],
)
def test_fake_trace_peak_equals_a_real_cpu_run_to_the_byte(
    method: str, optimizer: str, precision: str, rank: int
) -> None:
    options = {"method": method, "optimizer": optimizer, "precision": precision}
    run = RunConfig.model_validate({"batch_size": 2, "seq_len": 32, "lora_rank": rank, **options})
    workload = config_workload(TINY)
    fake = trace_step(workload, run, fake=True)
    real = trace_step(workload, run, fake=False)
    assert live_peak(fake) == live_peak(real)
    assert fake.flops_per_step == real.flops_per_step
    assert (fake.params_total, fake.params_trainable) == (real.params_total, real.params_trainable)
    if optimizer == "adamw-8bit":
        assert fake.choices["optimizer_impl"].startswith("8-bit blockwise AdamW")
        assert any(e.category == "optimizer" and e.size_bytes == 4096 for e in fake.events)
    if method == "qlora":
        assert fake.choices["dequantisation"].startswith("nf4 → ")


def test_a_trace_dequantises_one_chunk_and_copies_the_rest_at_a_real_runs_peak(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 512-weight chunks: the MLP weights (64 x 128) take 16, so a real run loops 16 times
    monkeypatch.setattr(finetune, "DEQUANT_CHUNK_ELEMENTS", 512)
    run = RunConfig(method="qlora", batch_size=2, seq_len=32)
    workload = config_workload(TINY)
    fake = trace_step(workload, run, fake=True)
    real = trace_step(workload, run, fake=False)
    assert live_peak(fake) == live_peak(real)
    dequant_ops = {"aten.__rshift__", "aten.embedding"}
    fake_loops = sum(op.name in dequant_ops for op in fake.ops)
    real_loops = sum(op.name in dequant_ops for op in real.ops)
    assert fake_loops and real_loops > 4 * fake_loops
    assert any(op.name == "aten.copy_" for op in fake.ops)


def test_targets_that_do_not_fit_say_why() -> None:
    with FakeTensorMode():
        with pytest.raises(UnsupportedWorkload, match="'nope' matches no module"):
            _built(RunConfig(method="lora", lora_targets=("q_proj", "nope")))
        with pytest.raises(UnsupportedWorkload, match="adapts linear layers only"):
            _built(RunConfig(method="lora", lora_targets=("mlp",)))
        convolutional = BuiltWorkload(
            model=nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3)),
            make_batch=lambda batch_size, seq_len: {},
            loss=lambda model, batch: torch.zeros(()),
            units_per_sample=lambda seq_len: 1,
        )
        for method in ("lora", "qlora"):
            with pytest.raises(UnsupportedWorkload, match="linear layers"):
                apply_method(convolutional, RunConfig.model_validate({"method": method}))


def test_cli_profiles_qlora() -> None:
    result = run_cli(
        "profile",
        "--config",
        str(TINY),
        "--method",
        "qlora",
        "--batch-size",
        "2",
        "--seq-len",
        "32",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["params_trainable"] == _lora_params(16, list(TINY_LINEARS))
    assert "nf4" in doc["choices"]["dequantisation"]
    assert doc["choices"]["finetune"].startswith("qlora r=16")


@pytest.mark.parametrize("precision", ["bf16", "bf16-pure", "fp16"])
def test_lora_adapters_train_in_fp32_as_peft_upcasts_them(precision: str) -> None:
    # get_peft_model's autocast_adapter_dtype=True: half adapters become fp32, also on a model
    # loaded in bf16 (measured on an H200: bf16 adapters would leave 1.5 GB of 22 GB out)
    run = RunConfig(method="lora", precision=precision, lora_targets=("q_proj",))
    with FakeTensorMode():
        model = _built(run).model
    adapters = [m for m in model.modules() if isinstance(m, LoraLinear)]
    assert adapters and {m.lora_A.weight.dtype for m in adapters} == {torch.float32}
    serving = RunConfig(method="lora", precision="bf16", mode="inference", lora_targets=("q_proj",))
    with FakeTensorMode():
        model = _built(serving).model
    assert {m.lora_A.weight.dtype for m in model.modules() if isinstance(m, LoraLinear)} == {
        torch.bfloat16
    }
