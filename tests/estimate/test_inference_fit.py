"""``fit --mode inference``: weights + static KV cache + prefill peak, the largest concurrency,
and a serving engine's paged-KV-cache answer (``--serving vllm``)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from whichgpu.api import fit
from whichgpu.catalog import load_catalog
from whichgpu.catalog.stacks import get_serving_engine, get_stack
from whichgpu.cli import app, main
from whichgpu.estimate.memory import capacity_of, kv_cache_bytes, weights_bytes
from whichgpu.estimate.serving import kv_bytes_per_token, kv_heads, kv_on_one_gpu
from whichgpu.profiles.scalable import ScalableProfile
from whichgpu.profiles.stored import load_stored
from whichgpu.trace.scaling import trace_scalable
from whichgpu.workloads import run_config
from whichgpu.workloads.hf import read_config
from whichgpu.workloads.user import config_workload

TINY_LLAMA = Path(__file__).parents[1] / "fixtures" / "tiny-llama.json"


def test_kv_bytes_per_token_is_gqa_aware() -> None:
    # llama-3.1-8b: 32 layers x 2 (K, V) x 8 kv heads (not the 32 query heads) x 128 x 2 B
    assert kv_bytes_per_token(read_config("llama-3.1-8b"), 2) == 32 * 2 * 8 * 128 * 2 == 131072
    # gpt2: no GQA, 12 layers x 2 x 12 heads x 64 x 2 B
    assert kv_bytes_per_token(read_config("gpt2"), 2) == 12 * 2 * 12 * 64 * 2


@pytest.fixture(scope="module")
def tiny_inference() -> ScalableProfile:
    return trace_scalable(config_workload(TINY_LLAMA), run_config(mode="inference", new_tokens=16))


def test_kv_formula_matches_the_traced_cache(tiny_inference: ScalableProfile) -> None:
    per_token = kv_bytes_per_token(json.loads(TINY_LLAMA.read_text(encoding="utf-8")), 2)
    for batch, context in [(1, 40), (5, 97), (3, 200)]:  # on and off the traced grid
        expected = per_token * (context + 16) * batch
        assert kv_cache_bytes(tiny_inference, batch, context) == expected


def test_stored_inference_profile_matches_the_formula() -> None:
    profile = load_stored("gpt2", run_config(mode="inference"))
    assert profile is not None and profile.run.new_tokens == 128
    per_token = kv_bytes_per_token(read_config("gpt2"), 2)
    assert kv_cache_bytes(profile, 7, 300) == per_token * (300 + 128) * 7


def _cli_fit(*args: str) -> list[dict[str, object]]:
    result = CliRunner().invoke(app, ["fit", *args, "--json"])
    assert result.exit_code == 0, result.output
    docs: list[dict[str, object]] = json.loads(result.stdout)
    return docs


def test_cli_inference_fit_concurrency_falls_with_context() -> None:
    previous = None
    for context in (256, 512, 896):
        (doc,) = _cli_fit("gpt2", "--mode", "inference", "--context", str(context), "-g", "4090")
        assert doc["fits"] and doc["seq_len"] == context
        assert doc["run"]["new_tokens"] == 128  # type: ignore[index]
        assert doc["kv_bytes_per_token"] == 36864
        assert doc["kv_cache_bytes"] == 36864 * (context + 128) * doc["batch_size"]  # type: ignore[operator]
        assert doc["max_batch_size"] == doc["batch_size"]
        concurrency = doc["max_batch_size"]
        assert isinstance(concurrency, int) and concurrency > 0
        if previous is not None:
            assert concurrency < previous
        previous = concurrency


@pytest.mark.fresh_trace_cache  # it checks the trace is made
def test_cli_inference_fit_traces_a_config() -> None:
    (doc,) = _cli_fit(
        "--config", str(TINY_LLAMA), "--mode", "inference", "--context", "64",
        "--new-tokens", "16", "--concurrency", "3", "-g", "4090",
    )  # fmt: skip
    assert doc["method"] == "traced" and doc["batch_size"] == 3 and doc["fits"]
    assert doc["kv_cache_bytes"] == 2 * 2 * 2 * 16 * 2 * (64 + 16) * 3


def test_one_sequence_asked_for_is_one_served() -> None:
    # --concurrency 1 is the default's value, but given, it is the batch asked about
    (doc,) = _cli_fit("gpt2", "--mode", "inference", "--context", "256", "--concurrency", "1",
                      "-g", "4090")  # fmt: skip
    assert doc["batch_size"] == 1 and doc["batch_given"] is True
    assert doc["max_batch_size"] > 1


def test_serving_answer_on_an_80_gb_card() -> None:
    (estimate,) = fit(
        "llama-3.1-8b", gpus=["a100-80gb"], mode="inference", context=4096, serving="vllm"
    )
    served = estimate.serving
    assert served is not None
    catalog = load_catalog()
    capacity = capacity_of(catalog.resolve("a100-80gb"), catalog).bytes
    engine, stack = get_serving_engine("vllm"), get_stack()
    assert (engine.gpu_memory_utilization, engine.block_size_tokens) == (0.9, 16)
    profile = load_stored("llama-3.1-8b", run_config(mode="inference"))
    assert profile is not None
    weights = weights_bytes(profile)
    assert 2 * profile.params_total <= weights < 2 * profile.params_total + 2**20
    budget = math.floor(0.9 * capacity) - weights - served.activation_peak_bytes
    budget -= stack.cuda_context_bytes
    blocks = budget // (16 * 131072)
    per_sequence = math.ceil((4096 + 128) / 16)
    assert served.kv_cache_budget_bytes == budget
    assert (served.kv_blocks, served.blocks_per_sequence) == (blocks, per_sequence)
    assert served.max_concurrency == blocks // per_sequence
    assert 0 < served.activation_peak_bytes < 4 * 2**30
    assert 80 <= served.max_concurrency <= 130  # ~54 GiB of 2 MiB blocks, 264 per sequence


def test_kv_heads_split_over_tensor_parallel_gpus_never_below_one_head() -> None:
    assert kv_heads(read_config("llama-3.1-8b")) == 8 and kv_heads(read_config("gpt2")) == 12
    assert kv_on_one_gpu(800, 8, 1) == 800
    assert kv_on_one_gpu(800, 8, 2) == 400
    assert kv_on_one_gpu(800, 8, 8) == 100
    assert kv_on_one_gpu(400, 4, 8) == 100  # 4 KV heads on 8 GPUs: each keeps a whole head
    assert kv_on_one_gpu(1200, 12, 8) == 200  # 12 heads do not split in 8: 2 heads, safe side


def test_tensor_parallel_inference_reports_one_gpus_kv_cache() -> None:
    one, two = (
        fit("llama-3.1-8b", gpus=["h100-sxm"], mode="inference", concurrency=16, gpu_count=n)[0]
        for n in (1, 2)
    )
    assert one.kv_cache_bytes == 131072 * (2048 + 128) * 16
    assert two.kv_bytes_per_token == 65536 and two.kv_cache_bytes == one.kv_cache_bytes // 2
    assert two.breakdown["weights"] * 2 == pytest.approx(one.breakdown["weights"], rel=1e-6)
    assert two.max_batch_size > one.max_batch_size
    # tiny-llama has 2 KV heads: on 4 GPUs each keeps one, half of the cache, not 1/4
    ask = {"mode": "inference", "context": 64, "new_tokens": 16}
    (four,) = fit(config=str(TINY_LLAMA), gpus=["h100-sxm"], gpu_count=4, **ask)
    per_token = kv_bytes_per_token(json.loads(TINY_LLAMA.read_text(encoding="utf-8")), 2)
    assert four.kv_bytes_per_token == per_token // 2
    assert any("1 head(s) of the 2 KV heads" in a for a in four.assumptions)


def test_serving_engine_on_tensor_parallel_gpus_holds_more_sequences() -> None:
    one, two = (
        fit("llama-3.1-8b", gpus=["h100-sxm"], mode="inference", serving="vllm", gpu_count=n)[0]
        for n in (1, 2)
    )
    a, b = one.serving, two.serving
    assert a is not None and b is not None and (a.gpus, b.gpus) == (1, 2)
    assert b.weights_bytes == -(-a.weights_bytes // 2)
    assert b.kv_bytes_per_token == a.kv_bytes_per_token // 2
    assert b.non_torch_bytes == a.non_torch_bytes + get_stack().nccl_bytes_per_gpu
    # the profiling chunk's activations are split over the GPUs, as the layers are
    assert b.activation_peak_bytes == -(-a.activation_peak_bytes // 2)
    assert (
        b.kv_cache_budget_bytes
        == a.kv_cache_budget_bytes
        + a.weights_bytes
        - b.weights_bytes
        + a.activation_peak_bytes
        - b.activation_peak_bytes
        - (b.non_torch_bytes - a.non_torch_bytes)
    )
    # half the cache per token and a larger budget: more than twice the sequences
    assert b.max_concurrency > 2 * a.max_concurrency
    assert any("tensor parallel over 2 GPUs" in x for x in b.assumptions)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["gpt2", "--mode", "inference", "--serving", "foo"], "unknown serving engine"),
        (["gpt2", "--serving", "vllm"], "--mode inference"),
        (["gpt2", "--mode", "inference", "--context", "1000"], "positions"),
        (["gpt2", "--mode", "inference", "--batch-size", "4", "--concurrency", "8"], "disagrees"),
        (["gpt2", "--concurrency", "1"], "applies to --mode inference only"),
        (["gpt2", "--mode", "inference", "--precision", "fp8"], "is fp8 training"),  # untraced
    ],
)
def test_bad_inference_options_exit_2(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["fit", *args, "-g", "4090"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_an_unfit_concurrency_tells_one_story_in_table_text_json_and_hint() -> None:
    # llama-3.2-1b serving 64 sequences of 4,096 on a 4090: fewer sequences fit at that context
    # (max concurrency) and a shorter context at that concurrency (max context); one sequence
    # of 4,096 fits, so no "one sequence does not fit" ladder, and the hint names the
    # inference levers, not --batch-size
    ask = {"mode": "inference", "concurrency": 64, "context": 4096}
    (estimate,) = fit("llama-3.2-1b", gpus=["rtx-4090"], **ask)
    assert not estimate.fits and 1 <= estimate.max_batch_size < 64
    assert estimate.fits_at_seq_len is None  # one sequence of 4,096 fits
    assert estimate.max_seq_len is not None and estimate.max_seq_len < 4096
    (most,) = fit(
        "llama-3.2-1b", gpus=["rtx-4090"], **{**ask, "concurrency": estimate.max_batch_size}
    )
    (longest,) = fit("llama-3.2-1b", gpus=["rtx-4090"], **{**ask, "context": estimate.max_seq_len})
    assert most.fits and longest.fits
    (one,) = fit("llama-3.2-1b", gpus=["rtx-4090"], **{**ask, "concurrency": 1})
    assert one.fits
    result = CliRunner().invoke(
        app,
        ["fit", "llama-3.2-1b", "--mode", "inference", "--concurrency", "64", "--context",
         "4096", "--gpu", "4090"],
        terminal_width=250,
    )  # fmt: skip
    text = " ".join(result.stdout.split())
    assert "max context" in text and "Where one sequence" not in text
    hint = text.split("Nothing fits as asked. To need less memory, try: ")[1]
    assert f"--concurrency {estimate.max_batch_size} or fewer" in hint
    assert f"--context {estimate.max_seq_len:,} or shorter" in hint
    assert "fewer --new-tokens" in hint and "--gpus N" in hint
    assert "--batch-size" not in text
