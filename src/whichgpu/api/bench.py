"""``bench``: measure a workload on a real device (throughput, memory, power).

The harness (``whichgpu.bench``) knows nothing of the catalog, the memory model or the store;
this module hands it whichgpu's own guesses of the largest batch and longest sequence as
callbacks (from stored profiles only, so the bench's process never imports torch for them)
and fills in each result's catalog GPU and MFU.

``bench_engine`` measures through a serving engine instead (``bench --serving vllm``,
``whichgpu.bench.engine``) and puts whichgpu's own prediction of the same run beside it.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from whichgpu.api.fit import fit
from whichgpu.api.predict import predict
from whichgpu.api.requests import BenchRequest, EngineBenchRequest, RunOptions, Target
from whichgpu.api.step import is_registered, select_target
from whichgpu.catalog import load_catalog
from whichgpu.errors import NotSplittable, UsageError, WhichGpuError, option, require_positive
from whichgpu.numbers import significant
from whichgpu.profiles.scalable import ScalableProfile
from whichgpu.profiles.stored import load_stored
from whichgpu.schema import BenchEnvironment, BenchResult, MemoryEstimate, RunConfig
from whichgpu.tabular import ResultList
from whichgpu.workloads import check_for_workload
from whichgpu.workloads.base import Workload

if TYPE_CHECKING:
    from whichgpu.bench import BenchOptions
    from whichgpu.bench.engine import EngineBenchResult
    from whichgpu.bench.jobs import BenchProgress


def bench(
    workload: str | None = None,
    *,
    config: Path | str | None = None,
    task: str | None = None,
    model: str | None = None,
    device: str = "cuda",
    gpu_count: int | None = None,
    find_max_batch: bool = False,
    max_batch_resolution: int = 1,
    find_max_seq_len: bool = False,
    memory_limit_gib: float | None = None,
    compile: bool = False,
    channels_last: bool = False,
    min_seconds: float | None = None,
    min_iters: int | None = None,
    timeout_s: float | None = None,
    progress: Callable[[BenchProgress], None] | None = None,
    on_result: Callable[[BenchResult], None] | None = None,
    **run_options: Any,
) -> ResultList[BenchResult]:
    """Measure it: throughput, memory and power of a workload on a real device.

    ``device`` is ``"cuda"``, ``"cuda:N"``, ``"cpu"``, ``"mps"`` (or ``"fake"``, a simulated
    device). ``run_options`` are the run configuration, as for ``fit``; ``gpu_count=N`` also
    measures N GPUs of this node together (DDP), after one alone, for the scaling efficiency.
    ``find_max_batch`` searches the largest batch and measures at it: from whichgpu's own
    prediction of it on this device where a stored profile gives one at once (galloping
    from it), else from 1 (doubling), then bisection to ``max_batch_resolution`` (1 =
    exact); the result's notes say how far the prediction was off. ``find_max_seq_len``
    searches the longest sequence at the batch, from its prediction the same way.
    ``memory_limit_gib`` caps the memory a step may use (on the CPU a search needs it).
    Timing warms up until steady, then runs at least ``min_iters`` steps and ``min_seconds``
    seconds (defaults: ``bench.TimingRule``). ``timeout_s`` stops a
    child process that makes no progress for that long.

    Under torchrun (its ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and
    ``MASTER_PORT`` in the environment) every torchrun process calls this: each measures its
    own device (``cuda:LOCAL_RANK``, or the CPU) training with all the others (DDP over the
    torchrun group), and rank 0 alone gets the results (the one-GPU baseline and the
    group's); the other ranks get none. ``gpu_count``, the searches and inference are refused
    there.

    Returns one result per measurement (two with ``gpu_count`` > 1), each also passed to
    ``on_result`` as soon as it is measured; ``progress`` receives ``BenchProgress`` events.
    The catalog id of the GPU and the MFU (model FLOPs per second over the catalog's dense
    peak for the precision) are filled in here, where the device's name resolves to a
    catalog GPU.

    The keywords become a ``BenchRequest``, answered by ``answer_bench``.
    """
    request = BenchRequest(
        Target(workload, config, task, model),
        RunOptions.of(run_options),
        gpu_count=gpu_count,
        device=device,
        find_max_batch=find_max_batch,
        max_batch_resolution=max_batch_resolution,
        find_max_seq_len=find_max_seq_len,
        memory_limit_gib=memory_limit_gib,
        compile=compile,
        channels_last=channels_last,
        min_seconds=min_seconds,
        min_iters=min_iters,
        timeout_s=timeout_s,
    )
    return answer_bench(request, progress=progress, on_result=on_result)


def answer_bench(
    request: BenchRequest,
    *,
    progress: Callable[[BenchProgress], None] | None = None,
    on_result: Callable[[BenchResult], None] | None = None,
) -> ResultList[BenchResult]:
    """``bench``'s answer to a typed request (see ``bench`` for what it means): one result per
    measurement, each with its catalog GPU and MFU, and each also passed to ``on_result`` as
    soon as it is measured; ``progress`` receives ``BenchProgress`` events."""
    from whichgpu.bench import WorkloadRef, parse_device, run_bench
    from whichgpu.bench.distributed import torchrun_group

    group = torchrun_group(os.environ)
    if group is not None and request.gpu_count is not None:
        raise UsageError(
            f"--gpus {request.gpu_count} under torchrun: the group is torchrun's (--nnodes x "
            "--nproc-per-node processes, one device each); drop --gpus."
        )
    target = request.target
    chosen = select_target(target)
    run = request.run.config(gpus=request.gpu_count)
    if request.compile and not run.compile:  # measured compiled: the result's run says so
        run = run.model_copy(update={"compile": True})
    if run.model_parallel() > 1:
        raise UsageError(
            f"bench measures one GPU, or data-parallel GPUs (DDP); a model split "
            f"{run.model_parallel_words()} runs through Megatron-LM or torchtitan, whose own "
            f"timings answer it. Drop {option('tensor_parallel')} and "
            f"{option('pipeline_parallel')}, or ask predict."
        )
    check_for_workload(run, chosen.info)
    options = dataclasses.replace(_bench_options(request, chosen, run), torchrun=group)
    ref = WorkloadRef.of(
        None if target.names_own_model else chosen.info.name,
        target.config,
        target.task,
        target.model,
    )

    def completed(result: BenchResult) -> None:
        result = _bench_on_catalog(result)
        out.append(result)
        if on_result is not None:
            on_result(result)

    out: ResultList[BenchResult] = ResultList()
    device = parse_device(request.device)
    run_bench(ref, run, device, options, progress=progress, on_result=completed)
    return out


def _bench_options(request: BenchRequest, chosen: Workload, run: RunConfig) -> BenchOptions:
    """The harness's options of ``request``, checked, with whichgpu's guesses of the largest
    batch and the longest sequence for the searches it asks for."""
    from whichgpu.bench import BenchOptions, TimingRule
    from whichgpu.units import gib_to_bytes

    limit_gib = request.memory_limit_gib
    require_positive("memory_limit_gib", limit_gib, "GiB")
    defaults = TimingRule()
    options = BenchOptions(
        find_max_batch=request.find_max_batch,
        max_batch_resolution=request.max_batch_resolution,
        find_max_seq_len=request.find_max_seq_len,
        memory_limit_bytes=None if limit_gib is None else gib_to_bytes(limit_gib),
        compile=run.compile,  # answer_bench sets it where the request asks
        channels_last=request.channels_last,
        rule=TimingRule(
            min_iters=defaults.min_iters if request.min_iters is None else request.min_iters,
            min_seconds=(
                defaults.min_seconds if request.min_seconds is None else request.min_seconds
            ),
        ),
        timeout_s=600.0 if request.timeout_s is None else request.timeout_s,
        batch_guess=(_batch_guesser(chosen, run, limit_gib) if request.find_max_batch else None),
        seq_len_guess=(
            _seq_len_guesser(chosen, run, limit_gib) if request.find_max_seq_len else None
        ),
    )
    if options.rule.min_iters < 1 or options.rule.min_seconds < 0 or options.timeout_s <= 0:
        raise UsageError(
            "--min-iters must be at least 1, --min-seconds at least 0 and --timeout more than 0."
        )
    return options


def _batch_guesser(
    workload: Workload, run: RunConfig, memory_limit_gib: float | None
) -> Callable[[BenchEnvironment, int | None], int | None] | None:
    """whichgpu's prediction of the largest batch at a sequence length on the device a bench
    inspected, for the search to start from (see ``_size_guess``)."""
    from whichgpu.estimate.memory import largest_live_batch

    def on_gpu(environment: BenchEnvironment, seq_len: int | None) -> int | None:
        (estimate,) = _fit_on_device(workload, run, environment, None, seq_len)
        return estimate.max_batch_size

    return _size_guess(workload, run, memory_limit_gib, largest_live_batch, on_gpu)


def _seq_len_guesser(
    workload: Workload, run: RunConfig, memory_limit_gib: float | None
) -> Callable[[BenchEnvironment, int], int | None] | None:
    """whichgpu's prediction of the longest sequence at a batch size on the device a bench
    inspected, for the search to start from (see ``_size_guess``)."""
    from whichgpu.estimate.memory import MAX_SEQ_LIMIT, longest_live_seq

    upper = workload.info.max_seq_len or MAX_SEQ_LIMIT

    def on_cpu(profile: ScalableProfile, limit_bytes: int, batch_size: int) -> int:
        return longest_live_seq(profile, limit_bytes, batch_size, upper)

    def on_gpu(environment: BenchEnvironment, batch_size: int) -> int | None:
        seq_len = run.seq_len or workload.info.default_seq_len
        (estimate,) = _fit_on_device(workload, run, environment, batch_size, seq_len)
        return estimate.max_seq_len

    return _size_guess(workload, run, memory_limit_gib, on_cpu, on_gpu)


def _size_guess(
    workload: Workload,
    run: RunConfig,
    memory_limit_gib: float | None,
    on_cpu: Callable[[ScalableProfile, int, Any], int],
    on_gpu: Callable[[BenchEnvironment, Any], int | None],
) -> Callable[[BenchEnvironment, Any], int | None] | None:
    """A bench search's starting point from whichgpu's own memory estimate, or None where it
    has none to give at once.

    On the CPU under ``--memory-limit``, ``on_cpu(profile, limit_bytes, size)`` answers from
    the stored profile's traced live tensors (what the CPU device counts); on a CUDA GPU in
    the catalog, ``on_gpu(environment, size)`` from ``fit`` on it (one GPU: a search probes
    one). Only a stored profile is used, so the bench's own process never imports torch; a
    user's model, a run without a stored profile, MPS, a capped CUDA search (the cap is not
    ``fit``'s capacity) or a GPU outside the catalog get no guess, and the search starts from
    the bottom. A prediction that fails for any reason of whichgpu's is no guess either.
    """
    from whichgpu.errors import WhichGpuError
    from whichgpu.units import gib_to_bytes

    profile = load_stored(workload.info.name, _one_gpu(run)) if is_registered(workload) else None
    if profile is None:
        return None
    limit = None if memory_limit_gib is None else gib_to_bytes(memory_limit_gib)

    def guess(environment: BenchEnvironment, size: Any) -> int | None:
        try:
            if environment.device_kind == "cpu" and limit is not None:
                return on_cpu(profile, limit, size)
            if environment.device_kind == "cuda" and limit is None:
                return on_gpu(environment, size)
        except WhichGpuError:
            pass
        return None

    return guess


def _one_gpu(run: RunConfig) -> RunConfig:
    return run.model_copy(update={"gpus": 1, "sharding": "ddp"})


def _fit_on_device(
    workload: Workload,
    run: RunConfig,
    environment: BenchEnvironment,
    batch_size: int | None,
    seq_len: int | None,
) -> ResultList[MemoryEstimate]:
    """``fit`` of one GPU of ``run`` on the catalog GPU a CUDA device is."""
    from whichgpu.units import bytes_to_gb

    total = environment.memory_total_bytes
    gpu = load_catalog().resolve(
        environment.device_name, memory_gb=bytes_to_gb(total) if total else None
    )
    options = _one_gpu(run).model_dump(
        exclude_defaults=True, exclude={"gpus", "batch_size", "concurrency", "seq_len"}
    )
    return fit(workload.info.name, gpus=[gpu.id], batch_size=batch_size, seq_len=seq_len, **options)


def _bench_on_catalog(result: BenchResult) -> BenchResult:
    """``result`` with its catalog GPU and MFU, or a note saying why there are none."""
    from whichgpu.errors import GpuLookupError
    from whichgpu.estimate.throughput import gpu_rates, peak_flops_per_s
    from whichgpu.units import TERA, bytes_to_gb

    env = result.environment
    if env.device_kind != "cuda":
        note = f"no catalog GPU and no MFU: the device is {env.device_kind}, not a CUDA GPU"
        return result.model_copy(update={"notes": (*result.notes, note)})
    memory_gb = bytes_to_gb(env.memory_total_bytes) if env.memory_total_bytes else None
    try:
        gpu = load_catalog().resolve(result.device_name, memory_gb=memory_gb)
    except GpuLookupError as exc:
        note = f"no catalog GPU and no MFU: '{result.device_name}' is not in the catalog ({exc})"
        return result.model_copy(update={"notes": (*result.notes, note)})
    update: dict[str, Any] = {"gpu": gpu.id}
    notes = list(result.notes)
    if result.flops_per_step and result.step_time_s:
        try:
            peak = peak_flops_per_s(gpu_rates(gpu), result.run.precision)
        except UsageError as exc:
            notes.append(f"no MFU: {exc}")
        else:
            update["mfu"] = result.flops_per_step * result.n_gpus / result.step_time_s / peak
            against = "bf16" if result.precision == "fp8" else result.precision
            notes.append(
                f"MFU: model FLOPs per second over {gpu.name}'s dense {against} peak of "
                f"{peak / TERA:.4g} TFLOP/s per GPU (catalog"
                + (
                    "; fp8 training's MFU is reported against bf16's peak"
                    if against != result.precision
                    else ""
                )
                + ")"
            )
    update["notes"] = tuple(notes)
    return result.model_copy(update=update)


ENGINE_NOT_STORED = (
    "Not stored in the results store: it keeps whichgpu's own bench measurements (`whichgpu "
    "bench --mode inference`), which plain PyTorch generation makes."
)
"""The note every engine measurement carries."""


def bench_engine(
    workload: str | None = None,
    *,
    config: Path | str | None = None,
    task: str | None = None,
    serving: str = "vllm",
    device: str = "cuda",
    gpu_count: int | None = None,
    compare: bool = True,
    progress: Callable[[str], None] | None = None,
    **run_options: Any,
) -> EngineBenchResult:
    """Measure it through a serving engine: a causal language model served by vLLM's offline
    ``LLM`` API on this machine's CUDA GPUs, with random weights and random token ids (no
    download). vLLM is optional: ``pip install vllm`` on a CUDA machine.

    ``run_options`` are the run configuration, with ``mode="inference"``: ``precision``
    (``bf16`` or ``fp16``), ``context`` prompt tokens, ``new_tokens`` (at least 2) and
    ``concurrency`` requests arriving together (default: the workload's batch size);
    ``gpu_count`` GPUs serve it tensor parallel. ``device`` is ``"cuda"``: the engine serves on
    the first visible GPUs (choose them with ``CUDA_VISIBLE_DEVICES``).

    The result (``whichgpu.bench.engine.EngineBenchResult``) is a burst, not a steady state:
    the burst's TTFT (the prefill of the whole wave), the TPOT (a decode step of all the
    requests together) and the output tokens/s (prefill included); with ``compare``,
    whichgpu's own prediction of the TPOT and output tokens/s (``predict`` with ``serving``,
    the same run on this GPU) beside them. It is not stored in the results store.
    ``progress`` hears what the bench is doing, once the request is checked.

    The keywords become an ``EngineBenchRequest``, answered by ``answer_bench_engine``.
    """
    request = EngineBenchRequest(
        Target(workload, config, task),
        RunOptions.of(run_options),
        engine=serving,
        gpu_count=gpu_count,
        device=device,
        compare=compare,
    )
    return answer_bench_engine(request, progress=progress)


def answer_bench_engine(
    request: EngineBenchRequest, *, progress: Callable[[str], None] | None = None
) -> EngineBenchResult:
    """``bench_engine``'s answer to a typed request (see ``bench_engine``): the request is
    checked (engine, mode, device, a causal language model with a ``config.json``), measured
    by ``whichgpu.bench.engine.run_engine`` and, with ``request.compare``, given whichgpu's
    prediction of the same run."""
    from whichgpu.bench.engine import ENGINES, EngineRun, check_engine_run, run_engine
    from whichgpu.workloads.run_config import inference_context

    if request.engine not in ENGINES:
        raise UsageError(
            f"{option('serving')} {request.engine}: bench measures through "
            f"{', '.join(ENGINES)} only (predict --serving also predicts tensorrt-llm and "
            "sglang)."
        )
    if request.run.mode != "inference":
        raise UsageError(
            f"{option('serving')} {request.engine} measures a language model served by the "
            f"engine, which is inference: add {option('mode')} inference"
            + (" (training is not served)." if request.run.mode == "train" else ".")
        )
    _check_engine_device(request.device)
    target = request.target
    if target.model is not None:
        raise UsageError(
            f"{option('serving')} serves a Hugging Face model from its config.json: name a "
            f"workload or give {option('config')}, not {option('model')}."
        )
    chosen = select_target(target)
    run = request.run.config(gpus=request.gpu_count)
    check_for_workload(run, chosen.info)
    doc = _causal_lm_config(chosen, target)
    _check_tensor_parallel(chosen, doc, run.gpus)
    context, new_tokens = inference_context(chosen.info, run)
    engine_run = EngineRun(
        workload=_engine_label(chosen, target),
        config=doc,
        precision=run.precision,
        context=context,
        new_tokens=new_tokens,
        concurrency=run.batch_size or chosen.info.default_batch_size,
        gpus=run.gpus,
        engine=request.engine,
        extra_notes=(ENGINE_NOT_STORED,),
    )
    check_engine_run(engine_run)  # a bad option is refused before vLLM is looked for
    result = run_engine(engine_run, progress)
    if not request.compare:
        return result
    return _with_prediction(result, target)


def _check_engine_device(device: str) -> None:
    """The engine serves on CUDA GPUs, from the first visible one."""
    if device in ("cuda", "cuda:0"):
        return
    if device.startswith("cuda:"):
        index = device.removeprefix("cuda:")
        raise UsageError(
            f"--device {device}: vLLM serves on the first visible GPUs; choose them with "
            f"CUDA_VISIBLE_DEVICES={index} and --device cuda."
        )
    raise UsageError(
        f"--device {device}: vLLM's bench serves on CUDA GPUs only (--device cuda); whichgpu's "
        f"own bench {option('mode')} inference measures {device} without {option('serving')}."
    )


def _causal_lm_config(chosen: Workload, target: Target) -> dict[str, Any]:
    """The ``config.json`` of a causal language model the engine can serve (the user's file or
    the shipped one), or ``UsageError`` saying why there is none."""
    import json

    from whichgpu.workloads.config_tasks import task_of
    from whichgpu.workloads.hf import read_config

    name = chosen.info.name
    try:
        doc: dict[str, Any] = (
            json.loads(Path(target.config).read_text(encoding="utf-8"))
            if target.config is not None
            else read_config(name)
        )
    except (OSError, ValueError) as exc:
        raise UsageError(
            f"{name} has no Hugging Face config.json for a serving engine to build it from "
            f"({type(exc).__name__}); name a causal language model (`whichgpu workloads`) or "
            f"give its {option('config')}."
        ) from exc
    named = doc.get("architectures") or []
    architecture = str(named[0]) if named else None
    does = None if architecture is None else task_of(architecture, doc)
    if does != "causal-lm" or target.task not in (None, "causal-lm"):
        raise UsageError(
            f"{name} is not a causal language model ({architecture or 'no architectures'}"
            + (f", {option('task')} {target.task}" if target.task else "")
            + f"): {option('serving')} serves one (…ForCausalLM, …LMHeadModel)."
        )
    return doc


def _check_tensor_parallel(chosen: Workload, doc: dict[str, Any], gpus: int) -> None:
    """``NotSplittable`` where the model's heads do not split over ``gpus`` GPUs."""
    from whichgpu.estimate.serving import tensor_parallel_refusal

    refusal = tensor_parallel_refusal(doc, gpus)
    if refusal is not None:
        raise NotSplittable(
            f"{chosen.info.name} cannot be served tensor parallel on {gpus} GPUs "
            f"({option('gpu_count')}): {refusal}."
        )


def _engine_label(chosen: Workload, target: Target) -> str:
    """A registered workload's name, or the user's config's architecture and file."""
    if target.config is None:
        return chosen.info.name
    return f"{chosen.info.description} ({target.config})"


def _with_prediction(result: EngineBenchResult, target: Target) -> EngineBenchResult:
    """``result`` with whichgpu's prediction of the same run (``predict`` with ``serving``) on
    the catalog GPU it ran on beside it, or a note saying why there is none."""
    try:
        gpu = load_catalog().resolve(result.gpu_name)
        answers = predict(
            None if target.config is not None else result.workload,
            config=target.config,
            task=target.task,
            gpus=[gpu.id],
            gpu_count=result.gpus,
            serving=result.engine,
            mode="inference",
            precision=result.precision,
            context=result.context,
            new_tokens=result.new_tokens,
            concurrency=result.concurrency,
        )
    except WhichGpuError as exc:
        note = f"No prediction beside it: {exc}"
        return result.model_copy(update={"notes": (*result.notes, note)})
    speed = answers[0].serving_speed if answers else None
    if speed is None or speed.burst_tpot_s is None or speed.burst_ttft_s is None:
        why = "; ".join(answers.notes) or "none given"
        note = f"No prediction beside it: whichgpu predicts no engine speed on {gpu.name} ({why})."
        return result.model_copy(update={"notes": (*result.notes, note)})
    tpot, ttft = speed.burst_tpot_s, speed.burst_ttft_s
    note = (
        f"Predicted by whichgpu for the same burst (predict --serving {result.engine}, the "
        f"same run on {gpu.name}; {speed.engine_label}): burst TTFT "
        f"{significant(ttft * 1e3)} ms (measured {significant(result.burst_ttft_s * 1e3)}), "
        f"TPOT {significant(tpot * 1e3)} ms (measured {significant(result.tpot_s * 1e3)} ms; "
        f"measured / predicted {significant(result.tpot_s / tpot)}), output tokens/s "
        f"{significant(speed.burst_output_tokens_per_s or 0.0)} (measured "
        f"{significant(result.output_tokens_per_s)}). Its steady state at this concurrency "
        f"(requests arriving as others finish): TPOT {significant((speed.tpot_s or 0) * 1e3)} "
        f"ms, {significant(speed.output_tokens_per_s)} output tokens/s."
    )
    return result.model_copy(
        update={
            "predicted_burst_ttft_s": ttft,
            "predicted_tpot_s": tpot,
            "predicted_output_tokens_per_s": speed.burst_output_tokens_per_s,
            "notes": (*result.notes, note),
        }
    )
