"""bench --mode inference --compile: a language model's decode steps compiled as transformers'
generate compiles them (mode reduce-overhead, the prefill eager, one cache reset per request)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from whichgpu.bench import CpuDevice, WorkloadRef
from whichgpu.bench.jobs import StepSpec
from whichgpu.workloads import run_config

TINY_LLAMA = Path(__file__).parents[1] / "fixtures" / "tiny-llama.json"


class _Recorded(torch.nn.Module):
    """What ``torch.compile`` returned in the test: the model, its calls counted."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model
        self.tokens: list[int] = []  # the positions each call ran
        self.caches: list[int] = []  # the cache each call was given, by id

    def forward(self, **kwargs: Any) -> Any:
        self.tokens.append(int(kwargs["input_ids"].shape[-1]))
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        self.caches.append(id(cache))
        return self.model(**kwargs)


def test_compiled_decoding_compiles_the_decode_steps_as_generate_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[dict[str, Any]] = []
    made: list[_Recorded] = []

    def compile_(model: torch.nn.Module, **options: Any) -> torch.nn.Module:
        asked.append(options)
        made.append(_Recorded(model))
        return made[-1]

    monkeypatch.setattr(torch, "compile", compile_)
    run = run_config(mode="inference", context=16, new_tokens=3, concurrency=2)
    spec = StepSpec(WorkloadRef.of(config=str(TINY_LLAMA)), run, 2, 16, compile=True)
    session = CpuDevice().open_session(spec, lambda event: None)
    assert session.compiled
    assert asked == [{"mode": "reduce-overhead"}]
    assert any(n.startswith("compiled decoding: ") for n in session.notes)
    session.step()
    session.step()
    (compiled,) = made
    # the decode steps only (one position each), three per request; the prefill ran eagerly
    assert compiled.tokens == [1] * 6
    # one cache for both requests (reset between them), as generate keeps it
    assert len(set(compiled.caches)) == 1


def test_compiling_another_model_keeps_the_default_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[dict[str, Any]] = []

    def compile_(model: torch.nn.Module, **options: Any) -> torch.nn.Module:
        asked.append(options)
        return model

    monkeypatch.setattr(torch, "compile", compile_)
    run = run_config(batch_size=2, seq_len=16, precision="fp32")
    spec = StepSpec(WorkloadRef.of(config=str(TINY_LLAMA)), run, 2, 16, compile=True)
    session = CpuDevice().open_session(spec, lambda event: None)
    assert asked == [{}] and session.compiled
    assert any(n.startswith("compiled: ") for n in session.notes)


@pytest.mark.gpu
def test_compiled_decoding_on_a_gpu_beats_eager_decoding() -> None:
    """On a GPU the tiny model's eager decode is held by the host's dispatch of each operator;
    replayed as a CUDA graph it is not."""
    from whichgpu.bench import BenchOptions, CudaDevice, TimingRule, run_bench

    run = run_config(mode="inference", context=64, new_tokens=32, concurrency=2)
    options = BenchOptions(rule=TimingRule(min_iters=3, min_seconds=0.5))
    ref = WorkloadRef.of(config=str(TINY_LLAMA))
    (eager,) = run_bench(ref, run, CudaDevice(), options)
    (compiled,) = run_bench(ref, run, CudaDevice(), BenchOptions(rule=options.rule, compile=True))
    assert compiled.compiled and not eager.compiled
    assert any(n.startswith("compiled decoding: ") for n in compiled.notes)
    assert compiled.throughput is not None and eager.throughput is not None
    assert compiled.throughput > eager.throughput
