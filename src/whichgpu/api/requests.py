"""The questions of the API as typed values: what the CLI builds from its flags, once, and
what the keyword functions of ``whichgpu.api`` build from their keywords.

A request names what it is about (``Target``), how the step runs (the ``RunConfig`` that
``workloads.run_config`` checked, or for ``recommend`` and ``report`` the ``RunOptions`` as
given, which a preset completes before they are checked, and for ``bench`` the
``RunOptions`` as given, checked once the workload is known) and the question's own options.
``api.fit.answer_fit``, ``api.predict.answer_predict``, ``api.recommend.answer_recommend``,
``api.report.answer_report``, ``api.profile.answer_profile``, ``api.bench.answer_bench`` and
``api.bench.answer_bench_engine`` answer them; the requests are frozen and compute nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from whichgpu.errors import UsageError, option
from whichgpu.schema import BenchResult, RunConfig
from whichgpu.workloads import run_config


@dataclass(frozen=True)
class Target:
    """What a question is about: a named workload, a Hugging Face ``config`` file (with the
    ``task`` its model is built for), or the user's ``model`` function (``FILE.py:FUNCTION``).
    All None: a ``recommend`` preset's workload."""

    workload: str | None = None
    """A registered workload (``whichgpu workloads``), or a ``FILE.py:FUNCTION`` or
    ``config.json`` given where a name goes."""
    config: Path | str | None = None
    """A model's ``config.json``."""
    task: str | None = None
    """What the ``config`` model is built for (``workloads.config_tasks``)."""
    model: str | None = None
    """The user's model, ``FILE.py:FUNCTION``."""

    @property
    def names_own_model(self) -> bool:
        """Whether the target is the user's model (a ``config`` file or a ``model``
        function), which a preset's workload does not replace."""
        return self.config is not None or self.model is not None

    @property
    def is_empty(self) -> bool:
        """Whether the target names nothing (a preset's workload is asked for)."""
        return self.workload is None and not self.names_own_model


@dataclass(frozen=True)
class RunOptions:
    """The run options as the user gave them, unchecked: None is not given (the default, or
    a ``recommend`` preset's value, applies). ``config`` checks them into a ``RunConfig``
    (``workloads.run_config``); each field is the ``RunConfig`` field of its name, whose
    docstring says what it means. GPUs are not here: how many a question asks about is the
    question's (a count, or ``recommend``'s counts to compare)."""

    mode: str | None = None
    precision: str | None = None
    batch_size: int | None = None
    seq_len: int | None = None
    optimizer: str | None = None
    optimizer_impl: str | None = None
    loss_kernel: str | None = None
    grad_accum: int | None = None
    checkpointing: bool | None = None
    checkpointing_policy: str | None = None
    compile: bool | None = None
    method: str | None = None
    lora_rank: int | None = None
    lora_targets: str | Sequence[str] | None = None
    """Comma-separated (as the CLI's flag gives them) or a sequence of module names."""
    context: int | None = None
    new_tokens: int | None = None
    concurrency: int | None = None
    sharding: str | None = None
    tensor_parallel: int | None = None
    pipeline_parallel: int | None = None
    virtual_stages: int | None = None
    context_parallel: int | None = None
    expert_parallel: int | None = None
    tensor_parallel_overlap: bool | None = None
    fp8_recipe: str | None = None
    fp8_all_gather: bool | None = None
    network: str | None = None

    @classmethod
    def of(cls, options: Mapping[str, Any]) -> RunOptions:
        """The run options of keywords (``**run_options`` of the API's functions); a name that
        is no run option is refused as ``run_config`` refuses it (``UsageError``)."""
        names = {f.name for f in fields(cls)}
        unknown = {k: v for k, v in options.items() if k not in names}
        if unknown:
            run_config(**unknown)  # refuses what no run takes, naming it
            raise UsageError(f"{option(next(iter(unknown)))} is not a run option here.")
        return cls(**options)

    def given(self) -> dict[str, Any]:
        """The options given, by ``RunConfig`` field name."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return {name: value for name, value in values.items() if value is not None}

    def config(self, gpus: int | None = None) -> RunConfig:
        """The checked ``RunConfig`` of these options on ``gpus`` GPUs (None: one)."""
        return run_config(gpus=gpus, **self.given())


@dataclass(frozen=True)
class FitRequest:
    """Will it fit? (``api.fit``): the step's peak memory and largest batch on each GPU."""

    target: Target
    run: RunConfig = field(default_factory=RunConfig)
    """The run, checked; ``run.gpus`` GPUs work together (data parallel in training, tensor
    parallel in inference), every figure per GPU."""
    gpus: Sequence[str] | None = None
    """The GPUs to answer for, by name (None: every catalog GPU with a known memory size)."""
    stack: str | None = None
    """The software stack whose memory outside the allocator is added (None: the default)."""
    serving: str | None = None
    """A serving engine (``vllm``, ``tensorrt-llm``, ``sglang``) whose paged KV cache decides
    what fits (inference of a language model); None: plain PyTorch generation."""
    quantization: str | None = None
    """With ``serving``: how the engine stores the weights (``int4``, ``int8``, ``fp8``);
    without, compiled decoding's weight-only format (``int8``, ``int4``; inference with
    ``compile``)."""
    kv_cache_dtype: str | None = None
    """With ``serving``: how the engine stores its KV cache (``auto``: the serving dtype, the
    default; ``fp8``: one byte per element)."""
    fast: bool = False
    """Answer from the closed form (no torch, no trace); see ``api.fit.fit``."""


@dataclass(frozen=True)
class PredictRequest:
    """How fast? (``api.predict``): the step's predicted throughput on each GPU."""

    target: Target
    run: RunConfig = field(default_factory=RunConfig)
    """The run, checked; ``run.gpus`` GPUs of one machine (at most its largest count)."""
    gpus: Sequence[str] | None = None
    """The GPUs to answer for, by name (None: every catalog GPU the step fits on)."""
    stack: str | None = None
    """The software stack (None: the default)."""
    calibrate: Path | str | BenchResult | None = None
    """A measurement of the same run on one GPU (a result, a results file or a stored id)
    whose measured / predicted ratio corrects every prediction."""
    store: Path | str | None = None
    """The results store a ``calibrate`` id is read from (None: the user's)."""
    serving: str | None = None
    """A serving engine whose speed each answer also carries (inference of a language
    model)."""
    tpot_ms: float | None = None
    """With ``serving``: a target time per output token, in milliseconds."""
    ttft_ms: float | None = None
    """With ``serving``: a target time to first token, in milliseconds."""
    quantization: str | None = None
    """With ``serving``: how the engine stores the weights (``int4``, ``int8``, ``fp8``);
    without, compiled decoding's weight-only format (``int8``, ``int4``; inference with
    ``compile``)."""
    kv_cache_dtype: str | None = None
    """With ``serving``: how the engine stores its KV cache (``auto``: the serving dtype, the
    default; ``fp8``: one byte per element)."""
    requests: int | None = None
    """With ``serving``: also simulate a closed-loop benchmark of this many fixed-length
    requests at the concurrency (``ServingSpeed.benchmark``)."""


@dataclass(frozen=True)
class RecommendRequest:
    """Which GPU? (``api.recommend``): every candidate sized, timed and priced, ranked for the
    question. The question's fields are checked, and a ``preset``'s values merged in, by
    ``ranking.question.ask``."""

    target: Target = field(default_factory=Target)
    run: RunOptions = field(default_factory=RunOptions)
    """The run options as given; a ``preset``'s fill those not given, then they are checked."""
    preset: str | None = None
    """One of the guides' personas (``ranking.presets``); given values win over its own."""
    acquire: str | None = None
    """``buy`` (the default: purchase and electricity) or ``rent`` (cloud rates)."""
    budget_usd: float | None = None
    """Buy: the machine's price at most; rent: the job's rental at most (with a job size)."""
    within_hours: float | None = None
    """A deadline for a job given in work (``samples``, ``tokens``, ``epochs``)."""
    used: bool | None = None
    """Buying: True or None (not said) ranks a GPU at its used price where that is lower than
    its new one; False at new prices only."""
    gpu_only: bool = False
    """Buy the GPUs alone (the computer is already there)."""
    provider: str | None = None
    """Rent from this provider only."""
    gpu_count: int | str | None = None
    """GPUs per machine: N, ``auto`` (1, 2, 4 and 8) or a range ``1-4`` (None: one, or the
    preset's)."""
    gpus: Sequence[str] | None = None
    """The candidate GPUs, by name (None: every catalog GPU)."""
    vendor: str | None = None
    """Keep one maker's GPUs (``nvidia``, ``amd`` …; ``any``: every maker)."""
    hours: float | None = None
    """Job: hours of use."""
    samples: float | None = None
    """Job: samples to process."""
    tokens: float | None = None
    """Job: tokens to process."""
    epochs: float | None = None
    """Job: epochs of ``dataset_size`` samples."""
    dataset_size: int | None = None
    """Samples per epoch."""
    min_batch: int | None = None
    """The smallest batch a candidate must fit."""
    region: str | None = None
    """The region whose electricity price and climate apply (None: the default)."""
    top: int | None = None
    """Candidates to rank (None: all)."""
    sort: str | None = None
    """What ranks them: ``cost``, ``perf-per-dollar``, ``time`` or ``throughput``."""
    serving: str | None = None
    """Rank as served by an engine (``vllm``, ``tensorrt-llm``, ``sglang``; inference of a language
    model): a candidate fits when the engine's KV cache holds the asked concurrency at
    context + new tokens (``fit --serving``), and its speed and cost are the engine's
    (``predict --serving``); stored measurements (plain PyTorch) neither rank nor correct it."""
    quantization: str | None = None
    """With ``serving``: how the engine stores the weights (``int4``, ``int8``, ``fp8``); a GPU
    it cannot run them on is left out with why."""
    kv_cache_dtype: str | None = None
    """With ``serving``: how the engine stores its KV cache (``auto``, the default, or
    ``fp8``); a GPU it has no fp8 KV cache on is left out with why."""
    stack: str | None = None
    """The software stack (None: the default)."""
    store: Path | str | None = None
    """The results store whose ``bench`` results of the run replace predictions, and correct
    them on other GPUs as ``predict --calibrate`` does (None: the user's)."""
    prices: Sequence[Path | str] | None = None
    """CSV files of the user's own prices laid over the catalog's (None: the user's price
    file, when there is one)."""


@dataclass(frozen=True)
class ReportRequest:
    """Everything the HTML report shows (``api.report``): ``recommend``'s question answered,
    then its candidates' speeds, memory, value and provenance."""

    recommend: RecommendRequest = field(default_factory=RecommendRequest)
    """The question, as ``recommend`` asks it; its ``gpus`` are also shown."""
    reference: str | None = None
    """The GPU the speeds are divided by (None: the leading candidate)."""
    results: bool = False
    """Add the stored benchmark results as Lambda's tables."""


@dataclass(frozen=True)
class ProfileRequest:
    """One step traced on the CPU and summarised (``api.profile``)."""

    target: Target
    run: RunConfig = field(default_factory=RunConfig)
    """The run, checked."""


@dataclass(frozen=True)
class BenchRequest:
    """Measure it (``api.bench``): throughput, memory and power of the step on a real device,
    each probe and measurement in a child process."""

    target: Target
    run: RunOptions = field(default_factory=RunOptions)
    """The run options as given, checked (``RunOptions.config``) once the target's workload is
    known: an unknown workload is refused before an option it does not take."""
    gpu_count: int | None = None
    """GPUs of this node that then train together (DDP), measured after one alone, for the
    scaling efficiency (None: one)."""
    device: str = "cuda"
    """Where to measure: ``cuda``, ``cuda:N``, ``cpu``, ``mps`` or ``fake`` (a simulated
    device, for trying the harness)."""
    find_max_batch: bool = False
    """Search the largest batch that runs, and measure at it: from whichgpu's own prediction
    where a stored profile gives one at once (galloping), else doubling from 1; then
    bisection. The result's notes say how far the prediction was off."""
    max_batch_resolution: int = 1
    """With ``find_max_batch``: stop when the largest batch is known to within this (1:
    exact)."""
    find_max_seq_len: bool = False
    """Search the longest sequence that runs at the batch, from its prediction the same way,
    and measure at it."""
    memory_limit_gib: float | None = None
    """GiB a step may use (None: the device's memory): sizes for a smaller card, and gives the
    CPU, which needs one to search, a limit (counted as live tensor bytes)."""
    compile: bool = False
    """Measure the model under ``torch.compile``."""
    channels_last: bool = False
    """Channels-last images and weights (CNNs)."""
    min_seconds: float | None = None
    """Seconds of timed steps, at least, after the warm-up (None: ``bench.TimingRule``'s)."""
    min_iters: int | None = None
    """Timed steps, at least (None: ``bench.TimingRule``'s)."""
    timeout_s: float | None = None
    """Stop a child process that makes no progress (builds nothing, finishes no step) for this
    many seconds (None: 600)."""


@dataclass(frozen=True)
class EngineBenchRequest:
    """Measure it through a serving engine (``api.bench.bench_engine``): a burst of requests
    to a causal language model served by vLLM on this machine's CUDA GPUs."""

    target: Target
    """The language model: a registered workload or a ``config.json`` (``--model`` has no
    config for the engine)."""
    run: RunOptions = field(default_factory=RunOptions)
    """The run options as given (``mode`` inference; ``precision``, ``context``,
    ``new_tokens``, ``concurrency``), checked once the workload is known."""
    engine: str = "vllm"
    """The engine measured through (``bench.engine.ENGINES``)."""
    gpu_count: int | None = None
    """GPUs serving the model tensor parallel (None: one)."""
    device: str = "cuda"
    """``cuda`` (or ``cuda:0``): the engine serves on the first visible GPUs."""
    compare: bool = True
    """Add whichgpu's own prediction of the same run (``predict --serving``) on the GPU."""
