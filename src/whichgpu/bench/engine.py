"""Measuring through a serving engine (``whichgpu bench --serving vllm``): a causal language
model served by vLLM's offline ``LLM`` API on this machine's CUDA GPUs.

The engine gets a folder holding only the model's Hugging Face ``config.json`` and loads random
weights (``load_format="dummy"``) without a tokenizer (``skip_tokenizer_init``); the prompts
are random token ids below the config's vocabulary size, so nothing is downloaded. After one
warm-up ``generate``, two are timed over ``concurrency`` fresh prompts of ``context`` tokens
arriving together (a burst, not a steady state): ``max_tokens=1`` (the prefill of the wave:
the TTFT of the last request of the burst) and ``max_tokens=new_tokens``. From them::

    burst TTFT        = t(1)
    TPOT              = (t(M) - t(1)) / (M - 1)    one decode step of all C sequences
    output tokens / s = C x M / t(M)               prefill included

vLLM is optional and never declared: it (and torch) is imported inside ``run_engine`` only.
Like the rest of ``whichgpu.bench``, this module knows nothing of the catalog, the estimates
or the store; ``whichgpu.api.bench.bench_engine`` adds whichgpu's own prediction of the same
run, and nothing here is stored.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from whichgpu.errors import BenchError, UsageError, option

ENGINES = ("vllm",)
"""The serving engines ``bench --serving`` measures through."""

ENGINE_DTYPES: Mapping[str, str] = {"bf16": "bfloat16", "bf16-pure": "bfloat16", "fp16": "float16"}
"""whichgpu's precisions an engine serves, and the dtype vLLM is given for each (the weights,
activations and KV cache in it)."""

OFFLINE_ENVIRONMENT: Mapping[str, str] = {
    "HF_HUB_OFFLINE": "1",  # huggingface_hub: never ask the Hub (the model folder is local)
    "TRANSFORMERS_OFFLINE": "1",  # transformers: the same, for older versions
    "VLLM_NO_USAGE_STATS": "1",  # vLLM: no usage report to its maintainers' server
}
"""Environment set while the engine runs (the engine's own processes inherit it), so that a
bench reaches no network; each variable the user set already keeps the user's value."""

clock: Callable[[], float] = time.perf_counter
"""The clock the ``generate`` calls are timed with (a module attribute, so a test can give
another)."""


class VllmNotInstalled(UsageError):
    """``bench --serving vllm`` where vLLM cannot be imported (``broken``: the reason, where
    it is installed but its import failed)."""

    def __init__(self, broken: str | None = None) -> None:
        what = (
            "vLLM is not installed"
            if broken is None
            else f"vLLM is installed but could not be imported ({broken})"
        )
        super().__init__(
            f"{what}, so {option('serving')} vllm cannot measure through it: `pip install "
            "vllm` (on a CUDA machine; whichgpu does not depend on it). whichgpu's own `bench "
            "--mode inference` measures eager or compiled PyTorch decode without it."
        )


@dataclass(frozen=True)
class EngineRun:
    """What to serve through the engine, checked by ``check_engine_run``."""

    workload: str
    """How the result names the model (a registered workload, or the user's config)."""
    config: Mapping[str, Any]
    """The model's Hugging Face ``config.json``, written to the engine's model folder."""
    precision: str
    """A precision of ``ENGINE_DTYPES``."""
    context: int
    """Prompt tokens per request."""
    new_tokens: int
    """Tokens generated per request (at least 2: TPOT is the time between two)."""
    concurrency: int
    """Requests arriving together (the engine's ``max_num_seqs``)."""
    gpus: int = 1
    """GPUs serving the model tensor parallel (``tensor_parallel_size``)."""
    engine: str = "vllm"
    """One of ``ENGINES``."""
    seed: int = 0
    """Seed of the engine (its random weights) and of the prompts' token ids."""
    extra_notes: Sequence[str] = field(default_factory=tuple)
    """Notes the caller adds to the result."""


class EngineBenchResult(BaseModel):
    """One measurement through a serving engine: a burst of ``concurrency`` requests of
    ``context`` prompt tokens arriving together, each generating ``new_tokens`` (random
    weights, synthetic token ids). Not a steady state: no request arrives while others decode.
    Not stored in the results store, which keeps whichgpu's own bench measurements."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    engine: str
    """The engine measured through (``vllm``)."""
    engine_version: str
    """Its version (``vllm.__version__``)."""
    gpu_name: str
    """The first GPU, as CUDA names it (``torch.cuda.get_device_name``)."""
    workload: str
    """The model served."""
    precision: str
    """whichgpu's precision (``bf16``, ``fp16``), the engine's dtype."""
    context: int
    """Prompt tokens per request."""
    new_tokens: int
    """Tokens generated per request."""
    concurrency: int
    """Requests arriving together."""
    gpus: int
    """GPUs serving the model tensor parallel."""
    burst_ttft_s: float
    """Wall time of ``generate`` with ``max_tokens=1`` over the burst: the prefill of every
    prompt, so the time to first token of the burst's last request, s."""
    tpot_s: float
    """``(t(new_tokens) - t(1)) / (new_tokens - 1)``: one decode step with every sequence of
    the burst running together (no prompt beside it), s."""
    output_tokens_per_s: float
    """``concurrency x new_tokens / t(new_tokens)``: the burst's generated tokens over its wall
    time, prefill included."""
    measured_s: float
    """Seconds of the two timed ``generate`` calls together."""
    predicted_burst_ttft_s: float | None = None
    """whichgpu's prediction of the burst TTFT (``predict --serving``'s ``burst_ttft_s``, the
    same run on this GPU), s; None where it has none."""
    predicted_tpot_s: float | None = None
    """whichgpu's prediction of the burst's TPOT (``burst_tpot_s``), s; None where it has
    none."""
    predicted_output_tokens_per_s: float | None = None
    """whichgpu's prediction of the burst's output tokens/s (``burst_output_tokens_per_s``,
    prefill included); None where it has none."""
    notes: tuple[str, ...] = ()
    """What each figure is, how it was measured, and the comparison with the prediction."""


def check_engine_run(run: EngineRun) -> None:
    """``UsageError`` for a run the engine bench cannot measure (an engine, precision or size
    it does not take)."""
    if run.engine not in ENGINES:
        raise UsageError(
            f"{option('serving')} {run.engine}: bench measures through {', '.join(ENGINES)} only."
        )
    if run.precision not in ENGINE_DTYPES:
        raise UsageError(
            f"{option('precision')} {run.precision}: a serving engine is measured at "
            f"{', '.join(ENGINE_DTYPES)} (its dtype, weights and KV cache alike)."
        )
    if run.new_tokens < 2:
        raise UsageError(
            f"{option('new_tokens')} {run.new_tokens}: a serving bench needs at least 2 new "
            "tokens (the time per output token is the time between two)."
        )
    for name, value in (
        ("context", run.context),
        ("concurrency", run.concurrency),
        ("gpu_count", run.gpus),
    ):
        if value < 1:
            raise UsageError(f"{option(name)} must be at least 1, not {value}.")
    vocab_size(run.config)  # a config without one is refused now


def vocab_size(config: Mapping[str, Any]) -> int:
    """The config's vocabulary size (looking inside a ``text_config``), which the prompts'
    token ids stay below."""
    for where in (config, config.get("text_config")):
        if isinstance(where, Mapping):
            value = where.get("vocab_size")
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    raise UsageError("The model's config.json names no vocab_size; the prompts need one.")


def cuda_device_count() -> int:
    """CUDA GPUs this process sees (0 without CUDA), asked without initialising CUDA here:
    vLLM starts its engine processes by forking only from a process that has not."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def cuda_device_name() -> str:
    """The first CUDA GPU's name (read once the engine has started)."""
    import torch

    return str(torch.cuda.get_device_name(0))


def run_engine(run: EngineRun, progress: Callable[[str], None] | None = None) -> EngineBenchResult:
    """Serve ``run`` through the engine and time it (see the module's docstring); ``progress``
    hears what it is doing (starting the engine, warming up, timing).

    Raises ``UsageError`` for a run it cannot measure, ``VllmNotInstalled`` without vLLM and
    ``BenchError`` without enough CUDA GPUs or when the engine generates other than asked.
    """
    check_engine_run(run)
    vllm = _import_vllm()
    count = cuda_device_count()
    if count == 0:
        raise BenchError(
            "No CUDA GPU is visible to torch, and vLLM's bench serves on CUDA GPUs only "
            "(whichgpu's own `bench --mode inference` measures the CPU or MPS)."
        )
    if count < run.gpus:
        raise BenchError(
            f"{run.gpus} GPUs asked to serve tensor parallel ({option('gpu_count')}), {count} "
            "visible."
        )
    vocab = vocab_size(run.config)
    tokens_prompt = importlib.import_module("vllm.inputs").TokensPrompt
    rng = random.Random(run.seed)

    def burst() -> list[Any]:
        """Fresh prompts each call: a prompt seen before would be served from the engine's
        prefix cache, skipping its prefill."""
        return [
            tokens_prompt(prompt_token_ids=rng.choices(range(vocab), k=run.context))
            for _ in range(run.concurrency)
        ]

    def sampling(max_tokens: int) -> Any:
        return vllm.SamplingParams(
            max_tokens=max_tokens, ignore_eos=True, temperature=0, detokenize=False
        )

    dtype = ENGINE_DTYPES[run.precision]
    say = progress or (lambda _message: None)
    version = str(getattr(vllm, "__version__", "unknown"))
    with (
        tempfile.TemporaryDirectory(prefix="whichgpu-vllm-") as folder,
        _environment(OFFLINE_ENVIRONMENT),
        _stdout_to_stderr(),
    ):
        (Path(folder) / "config.json").write_text(json.dumps(dict(run.config)), encoding="utf-8")
        say(f"starting vLLM {version}'s engine on {run.gpus} GPU(s) (a minute or more)")
        started = clock()
        try:
            llm = vllm.LLM(
                model=folder,
                load_format="dummy",  # random weights: the folder holds no weight file
                skip_tokenizer_init=True,  # the folder holds no tokenizer; the prompts are ids
                dtype=dtype,
                tensor_parallel_size=run.gpus,
                max_num_seqs=run.concurrency,
                # the run's longest sequence, not the config's max_position_embeddings: else
                # the engine refuses a GPU whose KV cache cannot hold one sequence that long
                max_model_len=run.context + run.new_tokens,
                seed=run.seed,
            )
        except Exception as exc:
            raise BenchError(
                f"vLLM could not start the engine: {type(exc).__name__}: {exc}"
            ) from exc
        ready_s = clock() - started
        try:
            gpu_name = cuda_device_name()
            say(f"warm-up: {run.concurrency} request(s) of {run.new_tokens} new tokens")
            llm.generate(burst(), sampling(run.new_tokens), use_tqdm=False)
            say("timing a burst with max_tokens=1, then with max_tokens=" + str(run.new_tokens))
            first_s, _ = _timed(llm, burst(), sampling(1))
            full_s, outputs = _timed(llm, burst(), sampling(run.new_tokens))
        except Exception as exc:
            raise BenchError(f"vLLM failed to generate: {type(exc).__name__}: {exc}") from exc
        finally:
            del llm
            gc.collect()
    generated = _generated_tokens(outputs)
    expected = run.concurrency * run.new_tokens
    if generated != expected:
        raise BenchError(
            f"vLLM generated {generated:,} tokens, not {run.concurrency} x {run.new_tokens} = "
            f"{expected:,} (with ignore_eos every request should run to max_tokens)."
        )
    if not (0 < first_s < full_s):
        raise BenchError(
            f"The timed generate calls took {first_s:.4g} s (1 token) and {full_s:.4g} s "
            f"({run.new_tokens} tokens): too short to measure, or out of order."
        )
    tpot = (full_s - first_s) / (run.new_tokens - 1)
    return EngineBenchResult(
        engine=run.engine,
        engine_version=version,
        gpu_name=gpu_name,
        workload=run.workload,
        precision=run.precision,
        context=run.context,
        new_tokens=run.new_tokens,
        concurrency=run.concurrency,
        gpus=run.gpus,
        burst_ttft_s=first_s,
        tpot_s=tpot,
        output_tokens_per_s=expected / full_s,
        measured_s=first_s + full_s,
        notes=(*_notes(run, version, gpu_name, dtype, ready_s), *run.extra_notes),
    )


def _notes(run: EngineRun, version: str, gpu_name: str, dtype: str, ready_s: float) -> list[str]:
    c, m = run.concurrency, run.new_tokens
    on = f"{gpu_name}" if run.gpus == 1 else f"{run.gpus} x {gpu_name} (tensor parallel)"
    return [
        f"Measured through vLLM {version} (offline LLM API, its default engine arguments but "
        f"max_num_seqs={c} and max_model_len={run.context + m}) on {on}, dtype {dtype}, random "
        f"weights (load_format='dummy'), random token ids, no tokenizer; the engine started in "
        f"{ready_s:.1f} s; one warm-up generate, then fresh prompts for each timed call (no "
        "prefix-cache hits).",
        f"A burst of {c} request(s) of {run.context} prompt tokens arriving together, not a "
        "steady state: no request arrives while the others decode.",
        f"burst TTFT: the wall time of generate(max_tokens=1) over the {c} prompts: the prefill "
        "of the whole wave, so the time to first token of the burst's last request.",
        f"TPOT: (t(max_tokens={m}) - t(max_tokens=1)) / {m - 1}: one decode step of all {c} "
        "sequence(s) together, their KV cache growing from the context, no prompt beside it.",
        f"output tokens/s: {c} x {m} / t(max_tokens={m}): the burst's generated tokens over its "
        "wall time, its prefill included.",
    ]


def _timed(llm: Any, prompts: list[Any], params: Any) -> tuple[float, Any]:
    """The wall time of one ``generate`` call, and its outputs."""
    started = clock()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    return clock() - started, outputs


def _generated_tokens(outputs: Any) -> int:
    """Tokens the requests generated (each request's first completion)."""
    return sum(len(request.outputs[0].token_ids) for request in outputs)


def _import_vllm() -> Any:
    """The ``vllm`` module, or ``VllmNotInstalled``."""
    try:
        return importlib.import_module("vllm")
    except ImportError as exc:
        if exc.name not in (None, "vllm"):  # vLLM is there but a package it needs is not
            raise VllmNotInstalled(f"{type(exc).__name__}: {exc}") from exc
        raise VllmNotInstalled() from exc


@contextlib.contextmanager
def _environment(values: Mapping[str, str]) -> Iterator[None]:
    """``values`` in the environment (those not set already), removed again afterwards."""
    added = [name for name in values if name not in os.environ]
    for name in added:
        os.environ[name] = values[name]
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """stdout sent to stderr while the engine runs: vLLM logs to stdout (its processes and C
    libraries too, through file descriptor 1), and stdout is the answer's (``--json``)."""
    sys.stdout.flush()
    try:
        saved: int | None = os.dup(1)
        os.dup2(2, 1)
    except OSError:  # no file descriptors 1 and 2 to swap
        saved = None
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stdout.flush()
        if saved is not None:
            os.dup2(saved, 1)
            os.close(saved)
