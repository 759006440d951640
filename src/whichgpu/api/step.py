"""One training (or inference) step, ready to be sized on GPUs: what ``fit`` and ``predict``
(and ``recommend``, ``report`` and ``bench``'s guesses) share.

``ask`` is the preamble of every sizing question, written once: check the run against the
workload, resolve the GPUs and the software stack, and ``prepare`` the step (the run's sizes
resolved, its profile stored, kept or traced, its allocator replays). ``predictor`` turns a
prepared step into the throughput model's ``ThroughputPredictor``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from whichgpu.api.catalog import resolve_gpus
from whichgpu.api.requests import Target
from whichgpu.catalog.stacks import get_stack
from whichgpu.errors import NotSplittable, UsageError, option
from whichgpu.numbers import significant
from whichgpu.profiles.scalable import ScalableProfile
from whichgpu.profiles.stored import load_stored, profile_key
from whichgpu.schema import GpuSpec, RunConfig, SoftwareStack
from whichgpu.workloads import check_for_workload, select_workload
from whichgpu.workloads.base import Workload
from whichgpu.workloads.hf import read_config
from whichgpu.workloads.registry import get_workload
from whichgpu.workloads.run_config import inference_context, split_options

if TYPE_CHECKING:
    from whichgpu.estimate.compiled import FusedKernels
    from whichgpu.estimate.engine_speed import Quantization
    from whichgpu.estimate.expert_parallel import Experts
    from whichgpu.estimate.memory import StepMemory
    from whichgpu.estimate.prediction import QuantizedWeights, StepState, ThroughputPredictor
    from whichgpu.trace.compiled import CompiledActivations


def select(
    workload: str | None, config: Path | str | None, task: str | None, model: str | None
) -> Workload:
    """The workload a call names: registered, a config file, or the user's model."""
    return select_workload(
        workload,
        Path(config) if config else None,
        task,  # type: ignore[arg-type]
        model=model,
    )


def select_target(target: Target) -> Workload:
    """The workload a request's ``target`` names (see ``select``)."""
    return select(target.workload, target.config, target.task, target.model)


def scalable_profile(
    workload: Workload, run: RunConfig, progress: Callable[[str], None] | None = None
) -> tuple[ScalableProfile, str]:
    """The step of ``workload`` for every size: stored if shipped, else kept from an earlier
    trace on this machine (``workloads.profile_cache``), else traced (needs torch; ``progress``
    hears each size as it is traced) and kept.

    Returns the profile and how it was obtained (``stored profile``, ``traced (kept from an
    earlier run)`` or ``traced``).
    """
    from whichgpu.workloads.profile_cache import cached_profile, keep_profile

    named = is_registered(workload)
    if named:
        stored = load_stored(workload.info.name, run)
        if stored is not None:
            return stored, "stored profile"
    kept = cached_profile(workload, run, named=named)
    if kept is not None:
        return kept, _traced("traced (kept from an earlier run)", kept)
    try:
        from whichgpu.trace.scaling import trace_scalable
    except ImportError as exc:
        what = "this run configuration" if named else "a workload of your own"
        raise UsageError(
            f"No stored profile answers for {workload.info.name} with {what}, and tracing one "
            "needs torch: pip install 'whichgpu[torch]'."
        ) from exc
    profile = trace_scalable(workload, run, progress=progress)
    keep_profile(workload, run, profile, named=named)
    return profile, _traced("traced", profile)


def _traced(method: str, profile: ScalableProfile) -> str:
    """How a traced profile was obtained, saying so when it was traced with a few of its
    layers and extended (``whichgpu.trace.depth``)."""
    layers = profile.choices.get("layers")
    return method if layers is None else f"{method}; {layers}"


def _config_doc(workload: Workload, config: Path | str | None) -> dict[str, Any]:
    """The model's ``config.json``: the user's file or the shipped one."""
    if config is not None:
        doc: dict[str, Any] = json.loads(Path(config).read_text(encoding="utf-8"))
        return doc
    return read_config(workload.info.name)


def config_label(config: Path | str, params_total: int) -> str:
    """How answers name the model of a ``--config`` file: its architecture and size, then the
    file (``LlamaForCausalLM, 1.24B parameters (my-model/config.json)``), in headlines, report
    titles and the results' ``workload``."""
    named = json.loads(Path(config).read_text(encoding="utf-8")).get("architectures") or []
    architecture = str(named[0]) if named else "a model"
    return f"{architecture}, {parameter_count(params_total)} parameters ({config})"


def parameter_count(params: int) -> str:
    """A parameter count as model cards write it: ``1.24B``, ``124M``, ``85.8K``."""
    for factor, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if params >= factor:
            return f"{significant(params / factor)}{suffix}"
    return str(params)


def is_registered(workload: Workload) -> bool:
    """Whether ``workload`` is the registered workload of its name (not the user's own)."""
    try:
        return get_workload(workload.info.name) is workload
    except Exception:
        return False


_PHASES: tuple[Literal["forward"], Literal["backward"]] = ("forward", "backward")
"""The phases of a compiled step's partition."""


class CompiledStep:
    """What ``torch.compile`` changes in a training step, by batch and sequence length, from
    AOTAutograd's partitions of the step on fake tensors (``trace.compiled``), traced at batch
    1 and 2 of the run's length on first use and taken as linear in the tokens (batch x
    length) from there: the bytes of activations the compiled step does not save for its
    backward pass (calling it; fused attention keeps no score matrix), and the kernels its
    fusible operators run as (``kernels``). Not proportional: a small part of each does not
    grow with the batch (the weights' casts), which a proportional reading of one trace would
    count once per sample."""

    def __init__(
        self,
        workload: Workload,
        run: RunConfig,
        progress: Callable[[str], None] | None,
    ) -> None:
        if run.mode != "train":
            raise UsageError(
                f"{option('compile')} estimates a compiled training step; a compiled "
                "inference step is not modelled."
            )
        self._workload = workload
        self._run = run
        self._progress = progress
        self._traced: tuple[CompiledTrace, CompiledTrace] | None = None
        """The step at batch 1 and at batch 2 of the run's length."""

    def _traces(self) -> tuple[CompiledTrace, CompiledTrace]:
        if self._traced is None:
            traced = []
            for batch in (1, 2):
                if self._progress is not None:
                    self._progress(f"partitioning the compiled step at batch {batch}")
                traced.append(compiled_trace(self._workload, self._run, batch))
            self._traced = (traced[0], traced[1])
        return self._traced

    def _tokens(self, batch_size: int, seq_len: int | None) -> float:
        """``batch_size`` x ``seq_len`` in samples of the traced length."""
        length = self._run.seq_len
        return batch_size * (seq_len / length if seq_len and length else 1.0)

    def __call__(self, batch_size: int, seq_len: int | None) -> int:
        """Bytes not saved at ``batch_size`` x ``seq_len``."""
        one, two = (t.not_saved_bytes for t in self._traces())
        return max(0, round(one + (two - one) * (self._tokens(batch_size, seq_len) - 1)))

    def kernels(self, batch_size: int, seq_len: int | None) -> FusedKernels:
        """The fused kernels of the compiled step at ``batch_size`` x ``seq_len``: each
        phase's bytes and work linear in the tokens through the two traces, shared among its
        kernels as at batch 2."""
        from whichgpu.estimate.compiled import FusedKernels

        one, two = self._traces()
        x = self._tokens(batch_size, seq_len)
        phases: list[str] = []
        moved: list[float] = []
        flops: list[float] = []
        pairs = ((one.bytes, two.bytes, moved), (one.flops, two.flops, flops))
        for phase in _PHASES:
            for at_one, at_two, out in pairs:
                total_one, each = sum(at_one[phase]), at_two[phase]
                total_two = sum(each)
                total = max(0.0, total_one + (total_two - total_one) * (x - 1))
                out.extend(v * total / total_two if total_two else 0.0 for v in each)
            phases.extend([phase] * len(two.bytes[phase]))
        return FusedKernels(tuple(phases), np.array(moved), np.array(flops))


@dataclass(frozen=True)
class CompiledTrace:
    """What one trace of the compiled step gives (``CompiledStep``)."""

    not_saved_bytes: int
    """Activations the min-cut partition does not save against the default one."""
    bytes: dict[str, tuple[int, ...]]
    """Per phase, each fused kernel's DRAM bytes."""
    flops: dict[str, tuple[int, ...]]
    """Per phase, each fused kernel's vector work."""

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready document (``from_json`` reads it back)."""
        return {
            "not_saved_bytes": self.not_saved_bytes,
            "bytes": {p: list(v) for p, v in self.bytes.items()},
            "flops": {p: list(v) for p, v in self.flops.items()},
        }

    @staticmethod
    def of(traced: CompiledActivations) -> CompiledTrace:
        """What ``trace.compiled``'s partitions of one step give: the activations the min-cut
        partition does not save, and its fused kernels by phase."""
        cut = traced.min_cut
        return CompiledTrace(
            not_saved_bytes=traced.saved_bytes_difference,
            bytes={p: tuple(k.bytes for k in cut.kernels(p) if k.kind == "fused") for p in _PHASES},
            flops={p: tuple(k.flops for k in cut.kernels(p) if k.kind == "fused") for p in _PHASES},
        )

    @staticmethod
    def from_json(doc: dict[str, Any]) -> CompiledTrace | None:
        """``to_json``'s document read back, or None if it is not one."""
        try:
            return CompiledTrace(
                not_saved_bytes=int(doc["not_saved_bytes"]),
                bytes={p: tuple(int(v) for v in doc["bytes"][p]) for p in _PHASES},
                flops={p: tuple(int(v) for v in doc["flops"][p]) for p in _PHASES},
            )
        except (KeyError, TypeError, ValueError):
            return None


_COMPILED_TRACES: dict[tuple[str, str, int], CompiledTrace] = {}
"""``compiled_trace``'s answers in this process, by workload name, run and batch."""


def compiled_trace(workload: Workload, run: RunConfig, batch_size: int) -> CompiledTrace:
    """The compiled step at ``batch_size``: stored for a few named runs
    (``profiles.stored.load_stored_compiled``), else traced and kept in the trace cache
    (``workloads.profile_cache``) for the next question, as a profile is (seconds to minutes
    to trace); memoised."""
    from whichgpu.profiles.stored import load_stored_compiled
    from whichgpu.workloads.profile_cache import cached_compiled, keep_compiled

    memo = (workload.info.name, run.model_dump_json(), batch_size)
    found = _COMPILED_TRACES.get(memo)
    if found is not None:
        return found
    named = is_registered(workload)
    kept = load_stored_compiled(workload.info.name, run, batch_size) if named else None
    if kept is None:
        kept = cached_compiled(workload, run, batch_size, named=named)
    if kept is not None:
        found = CompiledTrace.from_json(kept)
    if found is None:
        try:
            from whichgpu.trace.compiled import compiled_activations
        except ImportError as exc:
            raise UsageError(
                f"{option('compile')}: no stored partition of {workload.info.name}'s compiled "
                f"step answers at {run.seq_len} tokens, and tracing one needs torch: pip "
                "install 'whichgpu[torch]'."
            ) from exc
        found = CompiledTrace.of(compiled_activations(workload, run, batch_size, run.seq_len))
        keep_compiled(workload, run, batch_size, found.to_json(), named=named)
    _COMPILED_TRACES[memo] = found
    return found


@dataclass(frozen=True)
class Step:
    """A workload's step, ready to be sized on GPUs: run options resolved, profile loaded."""

    run: RunConfig
    profile: ScalableProfile
    method: str
    memory: StepMemory
    seq_limit: int | None
    """Longest sequence the model takes (minus the new tokens of an inference run)."""
    kv_per_token: int | None
    """KV-cache bytes per token (inference of a language model), else None."""
    kv_heads: int | None = None
    """The model's key/value heads (inference of a language model), else None."""
    model_config: dict[str, Any] | None = None
    """The model's ``config.json`` (inference of a language model, or training split tensor
    or pipeline parallel), else None."""
    kv_cache_dtype: str = "auto"
    """How a serving engine stores the KV cache (``--kv-cache-dtype``): ``auto`` in the serving
    dtype (``kv_per_token``), ``fp8`` one byte per element. Plain PyTorch generation keeps its
    cache in the serving dtype whatever this says."""
    compiled: CompiledStep | None = None
    """With ``run.compile``: what compilation changes in the step, by size."""
    quantization: Quantization | None = None
    """Compiled decoding's quantized weights (``--compile --quantization``, no serving
    engine: ``engine_speed.COMPILED_WEIGHT_FORMATS``); None: as the model holds them. A
    serving engine's quantization is the engine's (``api.serving.engine_quantization``)."""
    experts: Experts | None = None
    """A mixture of experts' routed experts, from its config (training; None for a dense
    model or one without a config). Expert parallel spreads them when
    ``run.expert_parallel`` > 1."""

    @property
    def expert_fraction(self) -> float:
        """The routed experts' share of the parameters under expert parallel (else 0)."""
        if self.experts is None or self.run.expert_parallel <= 1:
            return 0.0
        return self.experts.fraction(self.profile.params_total)

    def engine_kv_per_token(self) -> int | None:
        """KV-cache bytes per token in a serving engine's cache (``kv_cache_dtype``): of an
        fp8 cache, one byte per key and value element; else ``kv_per_token``."""
        if self.kv_cache_dtype != "fp8" or self.model_config is None:
            return self.kv_per_token
        from whichgpu.estimate.engine_speed import KV_FP8_BYTES
        from whichgpu.estimate.serving import kv_bytes_per_token

        return kv_bytes_per_token(self.model_config, KV_FP8_BYTES)


@dataclass(frozen=True)
class Asked:
    """A sizing question, checked and prepared: the step and where to size it."""

    chosen: Workload
    step: Step
    targets: list[GpuSpec]
    """The GPUs asked about (every catalog GPU with a known memory size when none named)."""
    software: SoftwareStack


def ask(
    chosen: Workload,
    run: RunConfig,
    *,
    gpus: Sequence[str] | None,
    stack: str | None,
    config: Path | str | None,
    progress: Callable[[str], None] | None,
    one_node: bool = False,
) -> Asked:
    """The preamble ``fit`` and ``predict`` share: check ``run`` against the workload (and,
    with ``one_node``, that its GPUs are a count whose speed can be timed: one node, or
    training on nodes of 8 over a known fabric), resolve the GPUs and the software stack,
    and prepare the step."""
    check_for_workload(run, chosen.info)
    from whichgpu.estimate.data_parallel import check_gpu_count, get_fabric

    if one_node:
        check_gpu_count(run.gpus, run.mode, run.network)
    elif run.network is not None:
        get_fabric(run.network)
    targets = resolve_gpus(gpus)
    software = get_stack(stack)
    step = prepare(chosen, run, config, progress)
    return Asked(chosen, step, targets, software)


def prepare(
    chosen: Workload,
    run: RunConfig,
    config: Path | str | None,
    progress: Callable[[str], None] | None,
    loaded: tuple[ScalableProfile, str] | None = None,
) -> Step:
    """Resolve the run's sizes for ``chosen`` and load (or trace) its step (``loaded``: the
    profile and how it was obtained, when the caller has it already; it does not depend on
    how many GPUs share the step)."""
    if run.mode == "inference" and run.concurrency != 1 and run.batch_size is None:
        run = run.model_copy(update={"batch_size": run.concurrency})
    if chosen.info.is_sequence_model and run.seq_len is None and run.mode == "train":
        run = run.model_copy(update={"seq_len": chosen.info.default_seq_len})
    if progress is not None:
        progress(f"profiling {chosen.info.name}")
    from whichgpu.estimate import fp8

    fp8.check_run(run)
    # an fp8 run is derived from its bf16 AMP step (``estimate.fp8``), never traced
    profile, method = loaded or scalable_profile(chosen, fp8.base_run(run), progress)
    if run.precision == "fp8" and profile.run.precision != "fp8":
        profile = fp8.fp8_profile(profile, run.fp8_recipe)
        method = f"{method}; fp8 ({run.fp8_recipe}) derived from its bf16 AMP step"
    if config is not None:  # answers name the model, not only its file
        profile = replace(profile, workload=config_label(config, profile.params_total))
    seq_limit = chosen.info.max_seq_len
    kv_per_token = kv_head_count = None
    doc: dict[str, Any] | None = None
    if "kv_cache" in profile.choices:  # inference of a language model
        run, doc, seq_limit, kv_per_token, kv_head_count = _serving_run(
            chosen, run, config, seq_limit
        )
    elif chosen.info.is_sequence_model and run.seq_len is None:
        run = run.model_copy(update={"seq_len": chosen.info.default_seq_len})
    if run.model_parallel() > 1:
        doc = _model_parallel_config(chosen, run, config)
    experts = None
    if run.expert_parallel > 1:
        doc, experts = _expert_parallel_config(chosen, run, config, doc)
    elif run.mode == "train" and chosen.info.is_sequence_model:
        experts = _routed_experts(chosen, config, doc)
    if run.mode == "inference" and run.gpus > 1 and kv_per_token is None:
        raise NotSplittable(
            f"{option('gpu_count')} with {option('mode')} inference serves a language model "
            "tensor parallel; "
            f"{chosen.info.name} does not generate, so each GPU would run a copy of it: "
            "estimate one GPU."
        )
    if run.compile and run.mode == "inference" and kv_per_token is None:
        raise UsageError(
            f"{option('compile')} with {option('mode')} inference estimates a language model's "
            f"compiled decoding (CUDA graphs, as transformers' generate runs a static cache); "
            f"{chosen.info.name} does not generate, and its compiled forward pass is not "
            f"modelled: drop {option('compile')} for the eager estimate."
        )
    memory = _step_memory(chosen, run, profile)
    # fp8's saving is its bf16 AMP step's (the same graph but for the linear layers' casts);
    # a compiled inference step changes the decode's time, not what it holds (estimate.prediction)
    compiled = (
        CompiledStep(chosen, fp8.base_run(run), progress)
        if run.compile and run.mode == "train"
        else None
    )
    return Step(
        run,
        profile,
        method,
        memory,
        seq_limit,
        kv_per_token,
        kv_head_count,
        doc,
        compiled=compiled,
        experts=experts,
    )


def _serving_run(
    chosen: Workload, run: RunConfig, config: Path | str | None, seq_limit: int | None
) -> tuple[RunConfig, dict[str, Any], int | None, int, int]:
    """A language model's inference run with its context and new tokens resolved, its
    ``config.json``, the longest prompt it takes, its KV-cache bytes per token and its
    key/value heads; a model that cannot be split over the run's GPUs tensor parallel raises
    ``NotSplittable``."""
    from whichgpu.estimate.serving import (
        kv_bytes_per_token,
        kv_heads,
        serving_dtype_bytes,
        tensor_parallel_refusal,
    )

    context, new_tokens = inference_context(chosen.info, run)
    if seq_limit is not None:
        seq_limit -= new_tokens
    run = run.model_copy(update={"seq_len": context, "context": context, "new_tokens": new_tokens})
    doc = _config_doc(chosen, config)
    kv_per_token = kv_bytes_per_token(doc, serving_dtype_bytes(run.precision))
    kv_head_count = kv_heads(doc)
    refusal = tensor_parallel_refusal(doc, run.gpus)
    if refusal is not None:
        raise NotSplittable(
            f"{chosen.info.name} cannot be served tensor parallel on {run.gpus} GPUs "
            f"({option('gpu_count')}): {refusal}."
        )
    return run, doc, seq_limit, kv_per_token, kv_head_count


def _model_parallel_config(
    chosen: Workload, run: RunConfig, config: Path | str | None
) -> dict[str, Any]:
    """The ``config.json`` of a language model trained tensor or pipeline parallel, whose
    layers, hidden size and heads the split needs; a model without one, or one the split
    does not fit (``estimate.model_parallel.plan_refusal``), raises ``NotSplittable``."""
    from whichgpu.estimate.model_parallel import plan_refusal

    words = run.model_parallel_words()
    why = f"{chosen.info.name} cannot train {words} ({split_options(run)})"
    try:
        doc = _config_doc(chosen, config)
        refusal = plan_refusal(doc, run)
    except (OSError, KeyError, TypeError, ValueError):
        raise NotSplittable(
            f"{why}: the split is modelled for transformer language models whose config.json "
            "names their layers, hidden size and attention heads, and this workload has none. "
            f"Use {option('sharding')} fsdp to spread it over the GPUs."
        ) from None
    if refusal is not None:
        raise NotSplittable(f"{why}: {refusal}.")
    return doc


def _expert_parallel_config(
    chosen: Workload,
    run: RunConfig,
    config: Path | str | None,
    loaded: dict[str, Any] | None,
) -> tuple[dict[str, Any], Experts]:
    """The ``config.json`` of a mixture of experts trained expert parallel (``loaded``: when
    the caller has read it already) and its routed experts; a model without them, or whose
    experts do not split as asked (``estimate.expert_parallel.plan_refusal``), raises
    ``NotSplittable``."""
    from whichgpu.estimate.expert_parallel import experts_of, plan_refusal

    why = (
        f"{chosen.info.name} cannot train expert parallel {run.expert_parallel} "
        f"({option('expert_parallel')})"
    )
    try:
        doc = loaded if loaded is not None else _config_doc(chosen, config)
        refusal = plan_refusal(doc, run)
        found = experts_of(doc)
    except (OSError, KeyError, TypeError, ValueError):
        raise NotSplittable(
            f"{why}: it is modelled for transformer mixtures of experts whose config.json names "
            "their layers, hidden size and routed experts, and this workload has none."
        ) from None
    if refusal is not None or found is None:
        raise NotSplittable(f"{why}: {refusal}.")
    return doc, found


def _routed_experts(
    chosen: Workload, config: Path | str | None, loaded: dict[str, Any] | None
) -> Experts | None:
    """The routed experts of a model whose ``config.json`` (``loaded``: when the caller has
    read it already) names them, what ``fit`` offers expert parallel for; None for a dense
    model or one without a readable config."""
    from whichgpu.estimate.expert_parallel import experts_of

    try:
        return experts_of(loaded if loaded is not None else _config_doc(chosen, config))
    except (OSError, KeyError, TypeError, ValueError):
        return None


def _step_memory(workload: Workload, run: RunConfig, profile: ScalableProfile) -> StepMemory:
    """The replays of ``profile``: of a stored profile, shared by every call in this process
    and started from the replays shipped with it (``estimate.replay_cache``)."""
    from whichgpu.estimate.replay_cache import kept_memory, step_memory
    from whichgpu.workloads.profile_cache import kept_file

    named = is_registered(workload)
    stem = profile_key(workload.info.name, run) if named else None
    if stem is not None and load_stored(workload.info.name, run) is profile:
        return step_memory(profile, stem)
    kept = kept_file(workload, run, named=named)
    return step_memory(profile) if kept is None else kept_memory(profile, kept)


def keep_replays() -> None:
    """Keep what this call replayed of profiles from the trace cache, for the next run."""
    from whichgpu.estimate.replay_cache import keep_new_replays

    keep_new_replays()


def predictor(
    chosen: Workload, step: Step, software: SoftwareStack | None = None
) -> ThroughputPredictor:
    """The throughput predictor of ``step``: what its GPUs exchange, for a mixture of experts
    served, how its tokens are routed, and for a compiled step, its fused kernels and whether
    the ``software`` (default: the default stack) runs its attention masked."""
    from whichgpu.estimate.prediction import ThroughputPredictor
    from whichgpu.estimate.serving import routed_experts

    stack = software or get_stack()
    return ThroughputPredictor(
        step.profile,
        step.run,
        family=chosen.info.family,
        method=step.method,
        state=_exchange_state(step),
        routed=None if step.model_config is None else routed_experts(step.model_config),
        compiled_kernels=None if step.compiled is None else step.compiled.kernels,
        compiled_causal_mask=stack.compiled_causal_mask,
        quantized=_quantized_weights(step),
    )


def _quantized_weights(step: Step) -> QuantizedWeights | None:
    """How compiled decoding's weight products read ``step.quantization``'s weights (None:
    16-bit)."""
    if step.quantization is None or step.model_config is None:
        return None
    from whichgpu.estimate.engine_speed import COMPILED_WEIGHT_FORMATS
    from whichgpu.estimate.prediction import QuantizedWeights
    from whichgpu.estimate.serving import layer_shape, serving_dtype_bytes, text_config

    fmt = COMPILED_WEIGHT_FORMATS[step.quantization]
    _, hidden = layer_shape(step.model_config)
    vocab = int(text_config(step.model_config).get("vocab_size") or 0)
    return QuantizedWeights(
        quantization=step.quantization,
        weight_ratio=fmt.bytes_per_weight(hidden) / serving_dtype_bytes(step.run.precision),
        head_elements=hidden * vocab,
        label=fmt.label,
    )


def _exchange_state(step: Step) -> StepState | None:
    """What several GPUs exchange for this step (None on one GPU): gradients and parameters in
    data-parallel training, hidden states in tensor-parallel inference."""
    from whichgpu.estimate.data_parallel import run_parallel
    from whichgpu.estimate.expert_parallel import exchange_share
    from whichgpu.estimate.prediction import StepState
    from whichgpu.estimate.serving import (
        kv_bytes_per_token,
        kv_heads,
        layer_shape,
        serving_dtype_bytes,
    )
    from whichgpu.estimate.sharding import (
        fp8_gathered_share,
        stage_work_share,
        working_bytes,
    )

    if step.run.gpus <= 1:
        return None
    inference = step.run.mode == "inference"
    if inference and step.model_config is not None:  # a language model served tensor parallel
        layers, hidden = layer_shape(step.model_config)
        return StepState(
            layers=layers,
            hidden_bytes_per_token=hidden * serving_dtype_bytes(step.run.precision),
            kv_heads=step.kv_heads or 0,
        )
    sizes = step.memory.state_sizes("parameter")
    gradient_bytes = sum(step.memory.state_sizes("gradient"))
    parameter_bytes = sum(sizes)
    plan = step.memory.plan(run_parallel(step.run, expert_fraction=step.expert_fraction))
    if plan.working_parameters:
        # the GPUs gather and reduce the plan's 16-bit working copies
        gradient_bytes = working_bytes(gradient_bytes)
        parameter_bytes = working_bytes(parameter_bytes)
    if step.run.fp8_all_gather:  # the blocks' weights gathered at 1 byte, not 2
        parameter_bytes = round(parameter_bytes * (1 - fp8_gathered_share(sizes) / 2))
    if step.experts is not None:  # the experts' among the copies that hold the same ones
        exchanged = exchange_share(
            step.expert_fraction, step.run.expert_parallel, step.run.state_group()
        )
        gradient_bytes = round(gradient_bytes * exchanged)
        parameter_bytes = round(parameter_bytes * exchanged)
    if step.model_config is None:
        return StepState(gradient_bytes=gradient_bytes, parameter_bytes=parameter_bytes)
    # split tensor or pipeline parallel: the hidden states it exchanges, in the activations'
    # dtype (16-bit under AMP and fp8 training, fp32 without it)
    layers, hidden = layer_shape(step.model_config)
    element_bytes = 4 if step.run.precision in ("fp32", "tf32") else 2
    return StepState(
        gradient_bytes=gradient_bytes,
        parameter_bytes=parameter_bytes,
        layers=layers,
        hidden_bytes_per_token=hidden * element_bytes,
        kv_heads=kv_heads(step.model_config),
        state_share=plan.state_share,
        stage_work_share=stage_work_share(sizes, step.run.pipeline_parallel),
        kv_bytes_per_token=kv_bytes_per_token(step.model_config, element_bytes) // layers,
        experts=step.experts,
        expert_fraction=step.expert_fraction,
    )
