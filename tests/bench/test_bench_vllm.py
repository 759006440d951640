"""``bench --serving vllm``: a language model measured through vLLM's offline engine.

vLLM is optional and never installed for the tests: a fake ``vllm`` package (``LLM``,
``SamplingParams``, ``inputs.TokensPrompt``) records what the bench gives it and advances a
fake clock by a fixed prefill and decode time per ``generate``, so every figure is known
exactly. One test runs the real engine where vLLM and a CUDA GPU are there.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from whichgpu.api import EngineBenchRequest, RunOptions, Target, answer_bench_engine, bench_engine
from whichgpu.api import predict as api_predict
from whichgpu.bench import engine
from whichgpu.bench.engine import OFFLINE_ENVIRONMENT, EngineBenchResult, VllmNotInstalled
from whichgpu.cli import main
from whichgpu.errors import BenchError, UsageError
from whichgpu.workloads.hf import read_config

GPU_NAME = "NVIDIA H100 80GB HBM3"
"""What the fake CUDA device calls itself (a catalog GPU: the prediction goes beside it)."""
START_S = 32.0
PREFILL_S = 0.5
"""The fake engine's prefill of a whole burst, s."""
DECODE_S = 0.0078125
"""The fake engine's decode step of a whole burst, s."""
CONTEXT, NEW_TOKENS, CONCURRENCY = 512, 128, 8
"""Sizes whose prediction comes from llama-3.2-1b's stored profile at once (no trace)."""
RUN = {"mode": "inference", "context": CONTEXT, "new_tokens": NEW_TOKENS, "concurrency": 8}
TINY_LLAMA = Path("tests/fixtures/tiny-llama.json")


@dataclass
class FakeClock:
    now: float = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Seen:
    """What the fake vLLM was given."""

    llm: dict[str, Any] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    environment: dict[str, str | None] = field(default_factory=dict)
    calls: list[tuple[list[dict[str, Any]], Any, Any]] = field(default_factory=list)


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch) -> Seen:
    """A fake ``vllm`` importable, one fake CUDA GPU, and the engine's clock the fake's."""
    seen = Seen()
    clock = FakeClock()

    class LLM:
        def __init__(self, **kwargs: Any) -> None:
            folder = Path(kwargs["model"])
            seen.llm = kwargs
            seen.files = sorted(p.name for p in folder.iterdir())
            seen.config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
            seen.environment = {name: os.environ.get(name) for name in OFFLINE_ENVIRONMENT}
            print("INFO fake vLLM: engine started")  # vLLM logs to stdout
            os.write(1, b"INFO fake vLLM worker: on file descriptor 1\n")
            clock.now += START_S

        def generate(self, prompts: list[Any], params: Any, use_tqdm: Any = True) -> list[Any]:
            seen.calls.append((prompts, params, use_tqdm))
            clock.now += PREFILL_S + DECODE_S * (params.max_tokens - 1)
            return [
                SimpleNamespace(outputs=[SimpleNamespace(token_ids=[7] * params.max_tokens)])
                for _ in prompts
            ]

    class SamplingParams:
        def __init__(self, **kwargs: Any) -> None:
            self.kwargs = kwargs
            self.max_tokens = kwargs["max_tokens"]

    def tokens_prompt(*, prompt_token_ids: list[int]) -> dict[str, Any]:
        return {"prompt_token_ids": prompt_token_ids}

    vllm = ModuleType("vllm")
    inputs = ModuleType("vllm.inputs")
    inputs.TokensPrompt = tokens_prompt  # type: ignore[attr-defined]
    vllm.__version__ = "0.0.0+fake"  # type: ignore[attr-defined]
    vllm.LLM = LLM  # type: ignore[attr-defined]
    vllm.SamplingParams = SamplingParams  # type: ignore[attr-defined]
    vllm.inputs = inputs  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)
    monkeypatch.setattr(engine, "clock", clock)
    monkeypatch.setattr(engine, "cuda_device_count", lambda: 2)
    monkeypatch.setattr(engine, "cuda_device_name", lambda: GPU_NAME)
    for name in OFFLINE_ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    return seen


def _expected() -> tuple[float, float, float]:
    """Burst TTFT, TPOT and output tokens/s of the fake engine, from the bench's formulas."""
    first = PREFILL_S
    full = PREFILL_S + DECODE_S * (NEW_TOKENS - 1)
    return first, (full - first) / (NEW_TOKENS - 1), CONCURRENCY * NEW_TOKENS / full


def test_the_figures_are_the_formulas_of_the_two_timed_bursts(fake_vllm: Seen) -> None:
    result = bench_engine("llama-3.2-1b", compare=False, **RUN)
    ttft, tpot, rate = _expected()
    assert result.burst_ttft_s == pytest.approx(ttft, rel=1e-12)
    assert result.tpot_s == pytest.approx(tpot, rel=1e-12)
    assert result.tpot_s == pytest.approx(DECODE_S, rel=1e-12)
    assert result.output_tokens_per_s == pytest.approx(rate, rel=1e-12)
    assert result.measured_s == pytest.approx(2 * PREFILL_S + DECODE_S * (NEW_TOKENS - 1))
    assert (result.engine, result.engine_version, result.gpu_name) == (
        "vllm",
        "0.0.0+fake",
        GPU_NAME,
    )
    assert (result.workload, result.precision, result.gpus) == ("llama-3.2-1b", "bf16", 1)
    assert (result.context, result.new_tokens, result.concurrency) == (512, 128, 8)
    assert result.predicted_tpot_s is None and result.predicted_output_tokens_per_s is None
    notes = " ".join(result.notes)
    for said in ("vLLM 0.0.0+fake", GPU_NAME, "burst", "not a steady state", "Not stored"):
        assert said in notes


def test_the_engine_gets_a_config_only_folder_random_weights_and_token_ids(
    fake_vllm: Seen,
) -> None:
    bench_engine("llama-3.2-1b", compare=False, **RUN)
    llm = fake_vllm.llm
    assert llm["load_format"] == "dummy"
    assert llm["skip_tokenizer_init"] is True
    assert llm["dtype"] == "bfloat16"
    assert llm["tensor_parallel_size"] == 1
    assert llm["max_num_seqs"] == CONCURRENCY
    assert llm["max_model_len"] == CONTEXT + NEW_TOKENS
    assert llm["seed"] == 0
    assert fake_vllm.files == ["config.json"]
    assert fake_vllm.config == read_config("llama-3.2-1b")
    assert not Path(llm["model"]).exists()  # the folder is gone afterwards
    assert fake_vllm.environment == dict(OFFLINE_ENVIRONMENT)  # no network while it runs
    assert not any(name in os.environ for name in OFFLINE_ENVIRONMENT)  # and unset after
    vocab = fake_vllm.config["vocab_size"]
    assert [params.max_tokens for _, params, _ in fake_vllm.calls] == [NEW_TOKENS, 1, NEW_TOKENS]
    bursts = []
    for prompts, params, use_tqdm in fake_vllm.calls:
        assert params.kwargs == {
            "max_tokens": params.max_tokens,
            "ignore_eos": True,
            "temperature": 0,
            "detokenize": False,
        }
        assert use_tqdm is False
        assert len(prompts) == CONCURRENCY
        ids = [p["prompt_token_ids"] for p in prompts]
        assert all(len(one) == CONTEXT and all(0 <= i < vocab for i in one) for one in ids)
        bursts.append(ids)
    assert bursts[0] != bursts[1] != bursts[2] != bursts[0]  # fresh prompts: no cache hits


def test_precision_gpus_and_the_users_config_reach_the_engine(fake_vllm: Seen) -> None:
    sizes = {**RUN, "context": 64, "new_tokens": 16}  # tiny-llama has 256 positions
    result = bench_engine(config=TINY_LLAMA, gpu_count=2, precision="fp16", compare=False, **sizes)
    llm = fake_vllm.llm
    assert (llm["dtype"], llm["tensor_parallel_size"], llm["max_model_len"]) == ("float16", 2, 80)
    assert fake_vllm.config == json.loads(TINY_LLAMA.read_text(encoding="utf-8"))
    assert str(TINY_LLAMA) in result.workload and result.gpus == 2
    ids = [i for prompts, _, _ in fake_vllm.calls for p in prompts for i in p["prompt_token_ids"]]
    assert max(ids) < 512  # tiny-llama's vocab_size


def test_the_prediction_of_the_same_run_goes_beside_the_measurement(fake_vllm: Seen) -> None:
    result = bench_engine("llama-3.2-1b", **RUN)
    (predicted,) = api_predict(
        "llama-3.2-1b", gpus=["h100-sxm"], serving="vllm", precision="bf16", **RUN
    )
    speed = predicted.serving_speed
    assert speed is not None
    # like for like: the prediction of the same burst, not of the steady state
    assert result.predicted_tpot_s == speed.burst_tpot_s
    assert result.predicted_burst_ttft_s == speed.burst_ttft_s
    assert result.predicted_output_tokens_per_s == speed.burst_output_tokens_per_s
    assert speed.burst_tpot_s is not None and speed.tpot_s is not None
    assert speed.burst_tpot_s < speed.tpot_s  # no prompt beside the burst's decode steps
    assert any(n.startswith("Predicted by whichgpu for the same burst") for n in result.notes)


def test_a_gpu_outside_the_catalog_gets_no_prediction_but_keeps_its_measurement(
    fake_vllm: Seen, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine, "cuda_device_name", lambda: "Imaginary GPU 9000")
    result = bench_engine("llama-3.2-1b", **RUN)
    assert result.predicted_tpot_s is None and result.tpot_s > 0
    assert any(n.startswith("No prediction beside it") for n in result.notes)


def test_without_vllm_the_bench_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError
    with pytest.raises(VllmNotInstalled) as caught:
        bench_engine("llama-3.2-1b", **RUN)
    assert isinstance(caught.value, UsageError)
    message = str(caught.value)
    assert "vLLM is not installed" in message and "pip install vllm" in message
    assert "bench --mode inference" in message


def test_without_vllm_the_cli_fails_with_the_message(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)
    code = main(["bench", "llama-3.2-1b", "--serving", "vllm", "--mode", "inference", "--json"])
    assert code == 2
    captured = capsys.readouterr()
    assert "pip install vllm" in captured.err
    error = json.loads(captured.out)["error"]
    assert error["kind"] == "VllmNotInstalled" and "pip install vllm" in error["message"]


def test_without_a_cuda_gpu_the_engine_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real device check (torch's), with a vLLM that imports: refused before the engine
    starts (the bare module has no ``LLM`` to start)."""
    torch = pytest.importorskip("torch")
    monkeypatch.setitem(sys.modules, "vllm", ModuleType("vllm"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    run = engine.EngineRun(
        "tiny", {"vocab_size": 8}, "bf16", context=4, new_tokens=2, concurrency=1
    )
    with pytest.raises(BenchError, match="No CUDA GPU"):
        engine.run_engine(run)


@pytest.mark.parametrize(
    ("keywords", "said"),
    [
        ({"device": "cpu"}, "CUDA GPUs only"),
        ({"device": "mps"}, "CUDA GPUs only"),
        ({"device": "cuda:1"}, "CUDA_VISIBLE_DEVICES=1"),
        ({"serving": "tensorrt-llm"}, "vllm only"),
        ({"precision": "fp32"}, "bf16, bf16-pure, fp16"),
        ({"new_tokens": 1}, "at least 2 new tokens"),
    ],
)
def test_what_the_engine_cannot_measure_is_refused_before_it_starts(
    fake_vllm: Seen, keywords: dict[str, Any], said: str
) -> None:
    with pytest.raises(UsageError, match=said.replace(".", r"\.")):
        bench_engine("llama-3.2-1b", **{**RUN, **keywords})
    assert fake_vllm.llm == {}


@pytest.mark.parametrize("mode", ["train", None])
def test_training_is_not_served(fake_vllm: Seen, mode: str | None) -> None:
    with pytest.raises(UsageError, match="mode inference"):
        answer_bench_engine(EngineBenchRequest(Target("llama-3.2-1b"), RunOptions(mode=mode)))


@pytest.mark.parametrize("workload", ["bert-base", "resnet50", "transformer-big"])
def test_only_a_causal_language_model_with_a_config_is_served(
    fake_vllm: Seen, workload: str
) -> None:
    with pytest.raises(UsageError):
        bench_engine(workload, mode="inference")
    assert fake_vllm.llm == {}


def _cli(*extra: str) -> list[str]:
    return [
        "bench",
        "llama-3.2-1b",
        "--serving",
        "vllm",
        "--mode",
        "inference",
        "--context",
        str(CONTEXT),
        "--new-tokens",
        str(NEW_TOKENS),
        "--concurrency",
        str(CONCURRENCY),
        *extra,
    ]


def test_the_cli_prints_one_json_document_on_stdout(
    fake_vllm: Seen, capfd: pytest.CaptureFixture[str]
) -> None:
    assert main(_cli("--json")) == 0
    captured = capfd.readouterr()
    doc = json.loads(captured.out)  # vLLM's log lines went to stderr
    assert set(doc) == set(EngineBenchResult.model_fields)
    ttft, tpot, rate = _expected()
    assert doc["burst_ttft_s"] == pytest.approx(ttft)
    assert doc["tpot_s"] == pytest.approx(tpot)
    assert doc["output_tokens_per_s"] == pytest.approx(rate)
    assert doc["predicted_tpot_s"] > 0 and doc["gpu_name"] == GPU_NAME
    assert "INFO fake vLLM: engine started" in captured.err and "INFO" not in captured.out
    assert "on file descriptor 1" in captured.err
    assert "Not stored" in captured.err and "vllm: warm-up" in captured.err


def test_the_cli_prints_a_table_and_stores_nothing(
    fake_vllm: Seen, capfd: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(_cli()) == 0
    out = capfd.readouterr().out
    for said in ("burst TTFT", "TPOT", "output tokens/s", "predicted (whichgpu)", GPU_NAME):
        assert said in out
    assert not (tmp_path / "results.sqlite").exists()


@pytest.mark.parametrize(
    "extra",
    [
        ["--find-max-batch"],
        ["--compile"],
        ["--store", "x.sqlite"],
        ["gpt2"],  # a second workload
        ["--model", "m.py:build"],
    ],
)
def test_the_cli_refuses_what_the_engine_bench_takes_nothing_from(
    fake_vllm: Seen, extra: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_cli(*extra)) == 2
    assert "--serving" in capsys.readouterr().err
    assert fake_vllm.llm == {}


@pytest.mark.gpu
@pytest.mark.slow
def test_the_real_engine_measures_a_small_model() -> None:
    """Through vLLM itself, where it is installed and a CUDA GPU is there."""
    pytest.importorskip("vllm")
    result = bench_engine(
        "llama-3.2-1b", mode="inference", context=128, new_tokens=16, concurrency=4
    )
    assert result.engine == "vllm" and result.engine_version
    assert result.burst_ttft_s > 0 and result.tpot_s > 0
    assert result.output_tokens_per_s == pytest.approx(
        4 * 16 / (result.burst_ttft_s + 15 * result.tpot_s)
    )
