"""The bench's FLOPs and eager steps on models with grouped-query attention (every Llama 3,
Qwen or Mistral model): the count is right, a counter that fails never costs the measurement,
and an eager inference bench compiles nothing.

torch before 2.13 asserts in ``sdpa_flop_count`` when key and value have fewer heads than the
query, which is how transformers calls ``scaled_dot_product_attention`` on CUDA; these tests
rebuild that failure on the CPU (torch's own formula made as strict as torch 2.11's) and run
the fused CUDA attention operators on meta tensors, whose shape rules accept grouped queries.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.utils.flop_counter")  # the module torch_211_counter patches

from whichgpu.bench import BenchOptions, CpuDevice, TimingRule, WorkloadRef, run_bench  # noqa: E402
from whichgpu.bench import flops as bench_flops  # noqa: E402
from whichgpu.bench.flops import (  # noqa: E402
    COUNTED,
    FlopCount,
    attention_backward_flops,
    attention_flops,
    count_flops,
    flop_count,
    traced_flops,
)
from whichgpu.bench.jobs import BenchProgress, MeasureJob, StepSpec  # noqa: E402
from whichgpu.bench.probe import prepare  # noqa: E402
from whichgpu.bench.session import EAGER_NOTE, TorchSession  # noqa: E402
from whichgpu.bench.worker import measure_task  # noqa: E402
from whichgpu.schema import RunConfig  # noqa: E402
from whichgpu.workloads import run_config  # noqa: E402

TINY_LLAMA = Path(__file__).parents[1] / "fixtures" / "tiny-llama.json"
"""A two-layer Llama with 4 query heads and 2 key/value heads (grouped-query attention)."""
QUICK = TimingRule(min_iters=3, min_seconds=0.1, window=1, warmup_max_iters=4)
B, H_Q, H_KV, S, D = 2, 8, 2, 16, 32
"""Batch, query heads, key/value heads, sequence length and head dim of the attention tests."""
FORWARD = 4 * B * H_Q * S * S * D
"""Attention's forward by hand: Q K^T and P V, each 2 b h_q s_q s_k d."""
BACKWARD = 10 * B * H_Q * S * S * D
"""Its backward as torch counts it: Q K^T recomputed, then four GEMMs for dP, dV, dQ, dK."""


@pytest.fixture(autouse=True, scope="module")
def _children_preload_torch() -> None:
    prepare("cpu")


def _strict_sdpa_flop_count(query: Any, key: Any, value: Any) -> int:
    """torch 2.11's ``sdpa_flop_count``: every head count must agree."""
    if not (query[1] == key[1] == value[1]):
        raise AssertionError("sdpa_flop_count: query/key/value shapes are incompatible")
    return int(4 * query[0] * query[1] * query[2] * key[2] * query[3])


@pytest.fixture
def torch_211_counter(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's own attention FLOP formula as strict as it was in torch 2.11."""
    monkeypatch.setattr(torch.utils.flop_counter, "sdpa_flop_count", _strict_sdpa_flop_count)


def _qkv(device: str = "cpu", grad: bool = False) -> tuple[Any, Any, Any]:
    def make(heads: int) -> Any:
        return torch.randn(B, heads, S, D, device=device, requires_grad=grad)

    return make(H_Q), make(H_KV), make(H_KV)


# --- attention formulas ------------------------------------------------------------------------


def test_grouped_query_attention_costs_attention_at_the_query_heads() -> None:
    q, k = (B, H_Q, S, D), (B, H_KV, S, D)
    assert attention_flops(q, k, k) == FORWARD == attention_flops(q, q, q)
    assert attention_backward_flops(q, q, k, k) == BACKWARD == attention_backward_flops(q, q, q, q)
    # different value head dim and key length: 2 b h s_q s_k (d_qk + d_v)
    assert attention_flops((1, 4, 3, 8), (1, 2, 5, 8), (1, 2, 5, 16)) == 2 * 4 * 3 * 5 * (8 + 16)
    with pytest.raises(ValueError, match="not a multiple"):
        attention_flops((1, 6, 3, 8), (1, 4, 3, 8), (1, 4, 3, 8))
    with pytest.raises(ValueError, match="do not go together"):
        attention_flops((1, 4, 3, 8), (1, 2, 3, 16), (1, 2, 3, 8))
    with pytest.raises(ValueError, match="output gradient"):
        attention_backward_flops((1, 2, 3, 8), (1, 4, 3, 8), (1, 2, 3, 8), (1, 2, 3, 8))


@pytest.mark.usefixtures("torch_211_counter")
def test_gqa_sdpa_on_the_cpu_is_counted_by_hand() -> None:
    """``scaled_dot_product_attention(enable_gqa=True)`` with 8 query and 2 key/value heads,
    forward and backward, through whichgpu's counting (torch's CPU fused kernel has no
    formula of torch's at all)."""
    q, k, v = _qkv(grad=True)

    def forward() -> None:
        torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)

    def forward_and_backward() -> None:
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        out.sum().backward()

    assert count_flops(forward) == FORWARD
    assert count_flops(forward_and_backward) == FORWARD + BACKWARD


@pytest.mark.usefixtures("torch_211_counter")
@pytest.mark.parametrize(
    ("name", "extra"),
    [
        ("_scaled_dot_product_flash_attention", ()),
        ("_scaled_dot_product_efficient_attention", (None, True)),
        ("_scaled_dot_product_cudnn_attention", (None, True)),
    ],
)
def test_cuda_attention_kernels_with_grouped_queries_are_counted(
    name: str, extra: tuple[Any, ...]
) -> None:
    """The fused kernels transformers reaches on CUDA, run on meta tensors: torch's counter
    (2.11's rule) asserts, as it did on the H200; whichgpu's counts them."""
    from torch.utils.flop_counter import FlopCounterMode

    op = getattr(torch.ops.aten, name)
    q, k, v = _qkv("meta")
    with (
        pytest.raises(AssertionError, match="shapes are incompatible"),
        FlopCounterMode(display=False),
    ):
        op(q, k, v, *extra)
    assert count_flops(lambda: op(q, k, v, *extra)) == FORWARD


def test_every_fused_attention_operator_of_this_torch_has_a_formula() -> None:
    """Every ``_scaled_dot_product_*`` operator torch registers, but the composite math one
    (it decomposes into matmuls, which torch counts with the heads it repeated)."""
    formulas = bench_flops.counter_formulas()
    names = {
        name.removeprefix("aten::").split(".")[0]
        for name in torch._C._dispatch_get_all_op_names()
        if name.startswith("aten::_scaled_dot_product_")
    } - {"_scaled_dot_product_attention_math"}
    fused = [getattr(torch.ops.aten, name) for name in sorted(names)]
    assert len(fused) >= 4
    assert [op for op in fused if op not in formulas] == []
    shapes = ((B, H_Q, S, D), (B, H_KV, S, D), (B, H_KV, S, D))
    for op in fused:
        if str(op).endswith("_backward"):
            assert formulas[op]((B, H_Q, S, D), *shapes) == BACKWARD
        else:
            assert formulas[op](*shapes) == FORWARD


# --- the fallback ------------------------------------------------------------------------------


def test_a_failing_count_falls_back_to_the_trace_then_to_none() -> None:
    said: list[str] = []

    def fails() -> int:
        raise AssertionError("sdpa_flop_count: query/key/value shapes are incompatible")

    assert flop_count(lambda: 7, fails, said.append) == FlopCount(7.0, COUNTED)
    assert said == []
    traced = flop_count(fails, lambda: 5, said.append)
    assert traced.flops_per_step == 5.0
    assert "trace of the step" in traced.method and "shapes are incompatible" in traced.method
    assert said and "FLOP counter failed" in said[0]
    neither = flop_count(fails, lambda: int("x"), said.append)
    assert neither.flops_per_step is None
    assert "no MFU" in neither.method and "ValueError" in neither.method


def _llama_spec(run: RunConfig, batch: int, seq: int) -> StepSpec:
    return StepSpec(WorkloadRef.of(config=TINY_LLAMA), run, batch, seq)


def _strict_attention(query: Any, key: Any, value: Any) -> int:
    if query[1] != key[1]:
        raise AssertionError("sdpa_flop_count: query/key/value shapes are incompatible")
    return 0


def test_a_counter_that_fails_mid_step_keeps_the_measurement(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The H200 failure in this process: the formula asserts inside a real Llama step under
    the counter. The measurement stands, with the trace's FLOPs, which are the count's."""
    run = run_config(precision="fp32", batch_size=2, seq_len=16)
    spec = _llama_spec(run, 2, 16)
    events: list[BenchProgress] = []
    job = MeasureJob(CpuDevice(), spec, QUICK)
    counted = measure_task(job, events.append)
    assert counted.flops_method == COUNTED
    assert counted.flops_per_step == traced_flops(spec.workload.resolve(), run, "cpu", None)

    monkeypatch.setattr(bench_flops, "attention_flops", _strict_attention)
    fell_back = measure_task(job, events.append)
    assert fell_back.timing.times_s and fell_back.flops_per_step == counted.flops_per_step
    assert "trace of the step" in fell_back.flops_method
    assert "AssertionError: sdpa_flop_count" in fell_back.flops_method
    assert any(e.stage == "flops" and "FLOP counter failed" in e.message for e in events)

    def no_trace(*args: Any) -> int:
        raise RuntimeError("tracing is broken too")

    monkeypatch.setattr(bench_flops, "traced_flops", no_trace)
    monkeypatch.setattr("whichgpu.bench.session.traced_flops", no_trace)
    neither = measure_task(job, events.append)
    assert neither.timing.times_s and neither.flops_per_step is None
    assert "no MFU" in neither.flops_method and "tracing is broken too" in neither.flops_method


def test_a_real_cpu_bench_of_a_grouped_query_llama_counts_its_flops() -> None:
    """A Llama with grouped-query attention trained and served on the CPU in child processes:
    the FLOPs are counted (not traced), and they are the trace's to the FLOP."""
    from whichgpu.trace import trace_step

    workload = WorkloadRef.of(config=TINY_LLAMA)
    train = run_config(precision="fp32", batch_size=2, seq_len=32)
    serve = run_config(precision="fp32", mode="inference", context=32, new_tokens=3)
    for run, new_tokens in ((train, None), (serve, 3)):
        (result,) = run_bench(workload, run, CpuDevice(), BenchOptions(rule=QUICK))
        assert result.throughput and result.flops_per_step
        assert COUNTED in result.notes and EAGER_NOTE in result.notes
        assert not result.compiled
        profile = trace_step(workload.resolve(), result.run, kernels="cpu")
        assert result.flops_per_step == bench_flops.step_flops(profile, new_tokens)


# --- eager means eager -------------------------------------------------------------------------


@pytest.fixture
def compiled_norm(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Llama's RMSNorm compiled by the library (TorchDynamo's ``eager`` backend: no C++
    compiler needed), as a transformers release may compile parts of a model itself; and
    ``torch.compile`` refusing to be called at all while the test runs."""
    from transformers.models.llama import modeling_llama

    norm = modeling_llama.LlamaRMSNorm
    compiled = torch.compile(norm.forward, backend="eager")
    monkeypatch.setattr(norm, "forward", compiled)

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("torch.compile was called during an eager bench")

    monkeypatch.setattr(torch, "compile", refused)
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.usefixtures("compiled_norm")
def test_an_eager_inference_bench_compiles_nothing() -> None:
    """A served request (static KV cache, prefill, decode steps) measured without
    ``--compile``: no ``torch.compile`` call, no frame compiled by TorchDynamo, although the
    model holds a compiled function; the same model called outside the bench does compile."""
    from torch._dynamo.utils import counters

    run = run_config(precision="fp32", mode="inference", context=16, new_tokens=3)
    spec = _llama_spec(run, 1, 16)
    session = TorchSession(CpuDevice(), spec, lambda event: None)
    frames = counters["frames"]["total"]
    session.step()  # first: a frame dynamo skips once (under a dispatch mode) it skips for good
    session.memory_steps(2)
    flops = session.flops_per_step()
    assert counters["frames"]["total"] == frames, dict(counters["frames"])
    assert flops.method == COUNTED and flops.flops_per_step
    assert not session.compiled and EAGER_NOTE in session.notes
    torch._dynamo.reset()  # forget the frames dynamo was told to skip
    with torch.inference_mode():  # the control: outside the bench, the norm compiles
        session._eager(input_ids=torch.zeros(1, 4, dtype=torch.long))
    assert counters["frames"]["total"] > frames


@pytest.mark.gpu
def test_a_real_gpu_bench_of_a_grouped_query_llama_counts_its_flops() -> None:
    """On CUDA transformers calls SDPA with ``enable_gqa=True`` and a fused kernel runs with
    the key/value's own head count: the FLOPs are counted (not traced), and they are those of
    the same step counted on the CPU (another attention kernel, the same work)."""
    from whichgpu.bench import CudaDevice

    workload = WorkloadRef.of(config=TINY_LLAMA)
    run = run_config(precision="bf16", batch_size=4, seq_len=128)
    (result,) = run_bench(workload, run, CudaDevice(), BenchOptions(rule=QUICK))
    assert result.throughput and COUNTED in result.notes and EAGER_NOTE in result.notes
    on_cpu = CpuDevice().open_session(_llama_spec(result.run, 4, 128), lambda event: None)
    assert result.flops_per_step == on_cpu.flops_per_step().flops_per_step
