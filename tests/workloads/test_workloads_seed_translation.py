"""The translation models of Lambda's 2020 benchmark: parameter counts, traced FLOPs, dtypes.

No published FLOPs-per-sample figure exists for these models, so the traced matrix-multiply
and convolution FLOPs are checked exactly against the count from each architecture's layer
shapes (2 FLOPs per multiply-add), and the training step against 3x the forward pass.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

import whichgpu.workloads.seed_translation as st
from whichgpu.schema import RunConfig, StepProfile
from whichgpu.workloads.registry import get_workload

NAMES = ("transformer-big", "convs2s", "unsupmt")
BATCH, SEQ = 2, 32
D_MODEL, FFN = 1024, 4096


def _fake_param_count(name: str, run: RunConfig | None = None) -> tuple[int, set[str]]:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        model = get_workload(name).build(run or RunConfig()).model
        return (
            sum(p.numel() for p in model.parameters()),
            {str(p.dtype) for p in model.parameters()},
        )


@pytest.mark.parametrize("name", NAMES)
def test_parameter_count_is_the_reference_implementations(name: str) -> None:
    # Exact counts of the reference architectures at the stated vocabularies (sources in each
    # WorkloadInfo.params_source): fairseq transformer_vaswani_wmt_en_de_big at 32768 joined BPE,
    # fairseq fconv_wmt_en_de at 40000/40000, XLM build_model at the 64699-word en-de dictionary.
    expected = {"transformer-big": 209_911_808, "convs2s": 209_569_920, "unsupmt": 310_047_094}[
        name
    ]
    info = get_workload(name).info
    assert info.params_published == expected
    assert _fake_param_count(name)[0] == expected
    assert info.family == "seed_translation" and info.throughput_unit == "tokens"
    assert info.is_sequence_model and info.default_seq_len == st.DEFAULT_SEQ_LEN


def test_transformer_big_matches_the_papers_213m_at_the_papers_vocabulary() -> None:
    # Vaswani et al. 2017, Table 3: Transformer (big) 213M parameters, with the paper's shared
    # 37000-token BPE vocabulary (section 5.1). Within 1 %.
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        model = st._transformer_big(st.TRANSFORMER_PAPER_VOCAB)
        count = sum(p.numel() for p in model.parameters())
    assert count == st.transformer_big_param_count(st.TRANSFORMER_PAPER_VOCAB) == 214_245_376
    assert abs(count / 213e6 - 1) < 0.01


@pytest.mark.parametrize("name", NAMES)
def test_bf16_pure_builds_bf16_weights(name: str) -> None:
    assert _fake_param_count(name, RunConfig(precision="bf16-pure"))[1] == {"torch.bfloat16"}


def _forward_flops(name: str) -> tuple[int, int]:
    """Forward FLOPs of matrix multiplies and convolutions from the layer shapes: (without,
    with) the attention score/value products. CPU's fused SDPA kernel (used when attention
    dropout is 0) records no FLOPs; the math path (attention dropout > 0) records them."""
    b, t, d, f = BATCH, SEQ, D_MODEL, FFN
    tokens = b * t
    enc_layer, dec_layer = 4 * d * d + 2 * d * f, 8 * d * d + 2 * d * f
    attn = 2 * 2 * b * t * t * d  # scores and weighted values of one attention layer
    if name == "transformer-big":
        linear = 2 * tokens * (6 * enc_layer + 6 * dec_layer + st.TRANSFORMER_VOCAB * d)
        return linear, linear + 18 * attn
    if name == "unsupmt":  # the decoder predicts tokens 1..t-1
        linear = 2 * tokens * (6 * enc_layer + 6 * dec_layer)
        linear += 2 * b * (t - 1) * st.XLM_VOCAB * d
        return linear, linear + 18 * attn
    # convs2s: conv MACs per position; the decoder's causal conv computes t + k - 1 outputs
    # and drops the future ones, as fairseq's LinearizedConvolution does
    emb, out_emb, vocab = 768, 512, st.CONVS2S_VOCAB
    layers = st.FCONV_WMT_EN_DE
    ins = [layers[0][0]] + [c for c, _ in layers[:-1]]
    conv = sum(2 * b * t * k * n_in * 2 * c for (c, k), n_in in zip(layers, ins, strict=True))
    conv += sum(
        2 * b * (t + k - 1) * k * n_in * 2 * c for (c, k), n_in in zip(layers, ins, strict=True)
    )
    proj = sum(n_in * c for (c, _), n_in in zip(layers, ins, strict=True) if n_in != c)
    enc_linear = emb * 512 + proj + 2048 * emb
    dec_linear = emb * 512 + proj + sum(2 * c * emb for c, _ in layers) + 2048 * out_emb
    dec_linear += out_emb * vocab
    bmm = len(layers) * 2 * 2 * b * t * t * emb
    total = conv + 2 * tokens * (enc_linear + dec_linear) + bmm
    return total, total


@pytest.fixture(scope="module")
def profiles() -> dict[str, StepProfile]:
    return {}


def _profile(cache: dict[str, StepProfile], name: str) -> StepProfile:
    from whichgpu.trace.step import trace_step

    if name not in cache:
        cache[name] = trace_step(get_workload(name), RunConfig(batch_size=BATCH, seq_len=SEQ))
    return cache[name]


@pytest.mark.parametrize("name", NAMES)
def test_training_step_traces_with_the_architectures_flops(
    name: str, profiles: dict[str, StepProfile]
) -> None:
    profile = _profile(profiles, name)  # bf16 AMP, fake tensors
    assert profile.units_per_step == BATCH * SEQ  # target tokens
    assert profile.throughput_unit == "tokens"
    assert profile.params_total == get_workload(name).info.params_published
    matmul = ("gemm", "conv")
    forward = sum(o.flops for o in profile.ops if o.phase == "forward" and o.kind in matmul)
    backward = sum(o.flops for o in profile.ops if o.phase == "backward" and o.kind in matmul)
    assert forward in _forward_flops(name)  # exact
    assert backward == 2 * forward  # gradients of inputs and of weights
    assert profile.trace_seconds < 30


def test_unsupmt_step_is_one_denoising_autoencoder_loss(
    profiles: dict[str, StepProfile],
) -> None:
    profile = _profile(profiles, "unsupmt")
    # one scored cross-entropy (no label smoothing in XLM): one log-softmax per step
    assert sum(o.name == "aten._log_softmax" for o in profile.ops) == 1
    # XLM's attention dropout 0.1 takes SDPA's math path, which materialises the weights
    assert _forward_flops("unsupmt")[1] == sum(
        o.flops for o in profile.ops if o.phase == "forward" and o.kind == "gemm"
    )


def test_module_imports_without_torch() -> None:
    code = (
        "import sys; sys.modules['torch'] = None; "
        "import whichgpu.workloads.seed_translation as m; "
        "from whichgpu.workloads.registry import get_workload; "
        "print(','.join(get_workload(n).info.name for n in "
        "('transformer-big', 'convs2s', 'unsupmt')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ",".join(NAMES)


def test_fp16_trains_as_fairseqs_fp16_optimizer() -> None:
    # fairseq's --fp16: an fp16 model without autocast, a flat fp32 master copy of the
    # parameters and of their gradients, Adam on the copy: 20 bytes per parameter of state.
    from whichgpu.trace.step import trace_step

    run = RunConfig(precision="fp16", batch_size=BATCH, seq_len=SEQ)
    profile = trace_step(get_workload("transformer-big"), run)
    assert "FP16Optimizer" in profile.choices["autocast"]
    gemms = {o.dtype for o in profile.ops if o.kind == "gemm" and o.phase == "forward"}
    assert gemms == {"float16"}
    p = profile.params_total
    by_category: dict[str, int] = {}
    first_step = [e for e in profile.events if e.alloc and e.step == 0]
    for event in first_step:
        by_category[event.category] = by_category.get(event.category, 0) + event.size_bytes
    assert by_category["parameter"] == 2 * p  # the fp16 model
    # the fp32 master copy, then Adam's fp32 m and v
    assert by_category["optimizer"] == 4 * p + 8 * p
    # fp16 gradients of the model and the flat fp32 gradient buffer
    assert by_category["gradient"] == 2 * p + 4 * p
