"""Predicted throughput of a workload's step on a GPU: training (one GPU or N data parallel)
and inference, as a ``ThroughputEstimate`` with its band and assumptions.

The operator-time model is ``estimate.throughput``; the gradient exchange of N GPUs is
``estimate.data_parallel``; the batch each GPU runs comes from the memory estimate
(``estimate.memory``). Inference of a language model is a prefill of the context and then one
decode step per new token: the request batch takes ``prefill + new_tokens x decode`` and makes
``concurrency x new_tokens`` tokens. A decode step streams the weights and the KV cache, so its
streaming operators use the decode bandwidth share (``data/throughput.json``, ``inference``)
instead of the training fit's. Other models' inference is one forward pass.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from whichgpu.estimate.compiled import FusedKernels, compiled_note, compiled_table
from whichgpu.estimate.data_parallel import (
    all_reduce_s,
    data_parallel_step,
    gpu_link,
    load_links,
    network_note,
    node_count,
    shard_group,
)
from whichgpu.estimate.expert_parallel import Experts, all_to_all, expert_note
from whichgpu.estimate.memory import split_package_note
from whichgpu.estimate.model_parallel import (
    data_parallel_link,
    model_parallel_note,
    model_parallel_step,
    recomputed_layers,
)
from whichgpu.estimate.paged import paging_seconds, speed_note
from whichgpu.estimate.serving import experts_read_share, kv_heads_on_one_gpu
from whichgpu.estimate.throughput import (
    EXCHANGE_EACH_MICRO_STEP,
    SHARDED_OPTIMIZER,
    GpuRates,
    OpTable,
    PerfParameters,
    StepTime,
    error_band,
    load_inference_parameters,
    load_parameters,
    op_table,
    peak_flops_per_s,
    peak_limited_s,
    quantize_weights,
    read_experts,
    restrict,
    select_rows,
    shard_optimizer,
    split_tokens,
    split_work,
    step_time,
)
from whichgpu.profiles.scalable import ScalableProfile
from whichgpu.schema import GpuSpec, MemoryEstimate, RunConfig, ThroughputEstimate

COMPILED_DECODING_NOTE = (
    "compiled decoding (--compile): each decode step runs as transformers' generate runs a "
    "static cache on a GPU, the forward pass under torch.compile(mode='reduce-overhead') "
    "replayed as a CUDA graph, so no operator pays the host's per-operator dispatch floor; each "
    "takes the longer of its FLOPs at the tensor rate and its bytes at the decode bandwidth "
    "share. The prefill runs eagerly, as generate runs it. Inductor's fused elementwise kernels "
    "move fewer bytes than the eager operators counted here, little beside the weights and the "
    "cache a decode step reads (the safe side); memory is the eager request's"
)
"""What a compiled inference estimate assumes (``--mode inference --compile``)."""


@dataclass(frozen=True)
class QuantizedWeights:
    """Compiled decoding of quantized weights (``--compile --quantization``): what the weight
    products read of their 16-bit bytes, and which product is the 16-bit head."""

    quantization: str
    """The format (``int8``, ``int4``): its compiled product's share of a 16-bit product's
    bandwidth is ``InferenceParameters.weight_only_bandwidth_ratio``'s."""
    weight_ratio: float
    """Bytes of one stored weight (its scales and zero points included) over the serving
    dtype's."""
    head_elements: int
    """The output head's K x N (hidden x vocabulary), left 16-bit."""
    label: str
    """The format in words."""


@dataclass(frozen=True)
class StepState:
    """What several GPUs exchange: the model state of data-parallel training, the hidden
    states of tensor-parallel inference and of tensor- and pipeline-parallel training."""

    gradient_bytes: int = 0
    """Gradients of one step."""
    parameter_bytes: int = 0
    """Parameters (what ZeRO-3/FSDP gather)."""
    layers: int = 0
    """Transformer layers (tensor parallel: two all-reduces each per forward pass)."""
    hidden_bytes_per_token: int = 0
    """Bytes of one token's hidden state (hidden size x element size)."""
    kv_heads: int = 0
    """Key/value heads of the model (tensor parallel: a GPU reads the KV heads it holds;
    0: unknown, taken as split evenly)."""
    state_share: float = 1.0
    """Tensor- or pipeline-parallel training: the share of the model state one GPU holds
    before the data-parallel split (``ShardingPlan.state_share``: of its gradients and
    parameters, what it exchanges with its copies); 1 without a split."""
    stage_work_share: float = 1.0
    """Pipeline-parallel training: the busiest stage's share of the model's work
    (``sharding.stage_work_share``: what sets the pipeline's pace); 1 without stages."""
    kv_bytes_per_token: int = 0
    """Split training: one token's keys and values in one layer, all key/value heads, in the
    activations' dtype (what context parallel passes around its ring)."""
    experts: Experts | None = None
    """Expert-parallel training: the model's routed experts (what the all-to-alls carry)."""
    expert_fraction: float = 0.0
    """Expert-parallel training: the routed experts' share of the parameters."""

    def attention_bytes_share(self, gpus: int) -> float | None:
        """The share of attention's bytes (its KV reads) one of ``gpus`` tensor-parallel GPUs
        moves: its KV heads over all of them (None: unknown, 1/``gpus``)."""
        if self.kv_heads <= 0:
            return None
        return kv_heads_on_one_gpu(self.kv_heads, gpus) / self.kv_heads


def power_limit_note(gpu: GpuSpec, rates: GpuRates) -> tuple[str, ...]:
    """What a card held below its boost clock by its power limit runs its matrix products at:
    the measured sustained rate, and where it comes from."""
    if rates.tensor_power_share >= 1.0 or gpu.sustained_tensor_tflops is None:
        return ()
    source = gpu.provenance.get("sustained_tensor_tflops")
    cited = f" ({source.source})" if source is not None and source.source else ""
    return (
        f"{gpu.name} cannot hold its boost clock under sustained matrix work within its "
        f"{gpu.tdp_w:g} W: tensor-core operators run at {rates.tensor_power_share:.0%} of the "
        f"model's rate at the datasheet peak, so that a large matrix product runs at the "
        f"{gpu.sustained_tensor_tflops:g} TFLOPS measured under load{cited}",
    )


def half_precision_note(gpu: GpuSpec, precision: str) -> tuple[str, ...]:
    """What a bf16 run on a GPU with FP16 tensor cores but none for BF16 (Volta, Turing)
    should know: it is timed on the FP32 units, and fp16 would use the tensor cores."""
    if not precision.startswith("bf16") or gpu.bf16_tensor_tflops is not None:
        return ()
    if gpu.fp16_tensor_tflops is None:
        return ()
    return (
        f"{gpu.name} has FP16 tensor cores but none for BF16: bf16 matrix products are timed "
        "on its FP32 units (PyTorch may emulate bf16 more slowly still); --precision fp16 "
        f"runs them on the tensor cores ({gpu.fp16_tensor_tflops:g} against "
        f"{gpu.fp32_tflops:g} TFLOPS)",
    )


class ThroughputPredictor:
    """Predicts one workload's run on GPU after GPU (the per-run parts computed once)."""

    def __init__(
        self,
        profile: ScalableProfile,
        run: RunConfig,
        *,
        family: str,
        method: str,
        state: StepState | None = None,
        params: PerfParameters | None = None,
        routed: tuple[int, int] | None = None,
        compiled_kernels: Callable[[int, int | None], FusedKernels] | None = None,
        compiled_causal_mask: bool = False,
        quantized: QuantizedWeights | None = None,
    ) -> None:
        self.profile = profile
        self.quantized = quantized
        """Compiled decoding's quantized weights (None: 16-bit)."""
        self.run = run
        self.params = params or load_parameters()
        self.band = error_band(self.params, profile.workload, family)
        self.fitted = profile.workload in self.params.workload_factors
        # against another GPU's prediction of the same run: a measured workload's error is
        # its own GPU's; a new workload's is mostly shared by every GPU, and what is left is
        # the error of one GPU's prediction carried to another (the calibrated band)
        self.relative_band = (
            self.band
            if self.fitted
            else error_band(self.params, profile.workload, family, calibrated=True)
        )
        self.factor = self.params.prediction_factor(profile.workload, family)
        self.factor_origin = self.params.prediction_factor_origin(profile.workload, family)
        share = self.params.host_share(profile.workload, family)
        self.host_origin = (
            f"{'this workload' if self.fitted else 'workloads of its type'}: "
            f"{share:.0%} of its modelled GPU time on a {self.params.host_reference_gpu}"
        )
        self.method = f"{method}; {self.params.method}"
        self.state = state or StepState()
        self.routed = routed
        """A mixture-of-experts model's (experts per token, experts per layer), else None."""
        if run.compile and run.mode == "train" and compiled_kernels is None:
            raise ValueError("a compiled training run needs its fused kernels")
        self.compiled_kernels = compiled_kernels
        """A compiled training step's fused kernels by (batch, length) (``api.step``)."""
        self.compiled_causal_mask = compiled_causal_mask
        """Whether the stack's compiled attention runs with a dense causal mask."""
        self.serving = "kv_cache" in profile.choices
        self.inference = load_inference_parameters() if run.mode == "inference" else None
        self.unit = "tokens/s" if self.serving else f"{profile.throughput_unit}/s"
        self.assumptions = self._assumptions()
        if "fp8" in profile.choices:  # fp8 training (estimate.fp8): its recipe and its rate
            self.assumptions += (
                profile.choices["fp8"] + "; fp8 GEMMs at the fitted tensor efficiency of the "
                "16-bit ones x the catalog's dense fp8 peak; MFU against the bf16 peak",
            )

    def _replicated_heads_note(self) -> str:
        gpus, heads = self.run.gpus, self.state.kv_heads
        if heads <= 0 or heads % gpus == 0:
            return ""
        held = kv_heads_on_one_gpu(heads, gpus)
        return (
            f"; its {heads} KV heads are fewer than the {gpus} GPUs, so each holds and reads "
            f"{held} ({held / heads:.0%} of the KV cache, not 1/{gpus})"
        )

    def _assumptions(self) -> tuple[str, ...]:
        params, run = self.params, self.run
        notes: tuple[str, ...] = (
            "time of a step = sum over its operators of max(FLOPs / (efficiency x engine "
            "peak x size ramp), bytes / (efficiency x bandwidth), launch floor)",
            f"constants fitted on {params.fitted_on} ({params.fitted_date})",
            f"speed {self.factor_origin}",
            f"band = +/-{self.band:.0%}: the 80th percentile of the "
            + (
                "leave-one-GPU-out error of this workload type in training"
                if self.fitted
                else "leave-one-model-out error of this workload type in training (a workload "
                "never measured)"
            ),
            (
                "eager PyTorch as measured in the fitted runs of today's software ("
                + ", ".join(params.today_sources)
                + "): "
                + ("" if run.compile else "torch.compile, ")
                + "fused optimizers or hand-fused kernels run faster "
                "(predict --calibrate corrects one workload by a measurement)"
            )
            if params.today_sources
            else "the constants and factors come from 2020 frameworks (eager kernels, no fused "
            "or flash attention): today's stacks likely run faster than predicted, on every "
            "GPU alike, so rankings hold better than absolute times until they are refitted on "
            "new measurements (whichgpu bench; predict --calibrate corrects one workload now)",
            "the GPU step on synthetic data: the fitted runs read real datasets and also spent "
            f"time outside the GPU ({self.host_origin}); that time is left out here, and a real "
            "input pipeline that cannot keep up adds it back",
        )
        if self.serving and self.inference is not None and run.new_tokens == 0:
            notes += (
                f"prefill-only requests (no new tokens): one forward pass over the "
                f"{run.context}-token prompts of all sequences; throughput = prompt tokens per "
                "second over all sequences. The traced request (a static KV cache for context "
                f"+ {self.profile.run.new_tokens} new tokens and one decode step, of which only "
                "the prefill is timed) sizes the memory: the cache is larger than a "
                "prefill-only pass needs, the safe side",
            )
        elif self.serving and self.inference is not None:
            notes += (
                f"inference: a prefill of {run.context} tokens per sequence, then "
                f"{run.new_tokens} decode steps each attending over the whole static cache "
                "(a paged engine reads only the filled part: somewhat faster); throughput = "
                "generated tokens per second over all sequences",
                "decode streams at "
                f"{self.inference.decode_memory_efficiency:.0%} of DRAM bandwidth: "
                f"{self.inference.source}; the speed factor applies to the prefill only",
            )
            if run.compile:
                notes += (COMPILED_DECODING_NOTE,)
            if self.quantized is not None:
                q = self.quantized
                streamed = self.inference.weight_only_bandwidth_ratio[q.quantization]
                notes += (
                    f"weights stored as {q.label}: each weight product reads "
                    f"{q.weight_ratio:.3f} of its 16-bit bytes (scales and zero points "
                    "included), widened inside the kernel, which streams them at "
                    f"{streamed:.0%} of the bandwidth a 16-bit product reaches "
                    f"({self.inference.weight_only_source}); FLOPs at the 16-bit rate; the "
                    "head stays 16-bit. "
                    "tinygemm's int4 kernels are made for few tokens and run a long prefill "
                    "slower than 16-bit (not modelled)",
                )
            if self.routed is not None:
                active, total = self.routed
                notes += (
                    f"mixture of experts: a decode step reads the experts its sequences' tokens "
                    f"are routed to, 1 - (1 - {active}/{total})^sequences of their weights "
                    "(routing taken as uniform; real routers favour some experts and read "
                    "fewer), the prefill all of them",
                )
        elif run.mode == "inference":
            notes += ("inference: one forward pass without gradients per batch",)
        if run.gpus > 1 and run.mode == "inference":
            links = load_links()
            notes += (
                f"served tensor parallel on {run.gpus} GPUs: each runs every operator of the "
                f"prefill and the decode step on 1/{run.gpus} of its work (and still launches "
                "every kernel"
                + ("; compiled, the decode step's as one replayed graph)" if run.compile else ")")
                + self._replicated_heads_note()
                + ", plus two all-reduces of the hidden states "
                "per layer and pass over NVLink/NVSwitch, the bridge or PCIe (each at least "
                f"{links.all_reduce_floor_s * 1e6:.0f} us: {links.all_reduce_floor_source})",
            )
        elif run.data_parallel() > 1:
            links = load_links()
            across = run.gpus > links.max_gpus_per_node
            copies = (
                f", {run.data_parallel()} copies of a {run.model_parallel()}-GPU split "
                if run.model_parallel() > 1
                else ", "
            )
            where = (
                f"{run.gpus} GPUs in {node_count(run.gpus, links)} nodes of "
                f"{links.max_gpus_per_node}{copies}data parallel ({run.sharding})"
                if across
                else f"{run.gpus} GPUs of one node{copies}data parallel ({run.sharding})"
            )
            over = (
                "NVLink/NVSwitch inside each node and the network between them (one ring per "
                "NIC, the node's NICs together carrying it: the network named below)"
                if across
                else "NVLink/NVSwitch (SXM/OAM boards), the bridge (two bridged cards) or PCIe"
            )
            notes += (
                f"{where}: each {'copy' if run.model_parallel() > 1 else 'GPU'} runs the "
                "one-GPU step on its own batch, then a ring all-reduce "
                "of the gradients (16-bit where ZeRO or FSDP trains an AMP run, as their mixed "
                f"precision does) over {over}, at the "
                "share of the link NCCL reaches in published all_reduce_perf runs ("
                + ", ".join(f"{k} {v:.0%}" for k, v in links.bus_efficiency.items())
                + "; sources in whichgpu/estimate/data/links.json)",
                "the exchange hides behind backward (behind the whole step for zero3/fsdp, "
                "and hsdp's gathers inside a node; hsdp's all-reduce between nodes behind "
                "backward) except the last gradient bucket; the compute is not slowed by the "
                "communication beside it, so the scaling is an upper bound",
            )
        return notes

    def _accumulation_note(self) -> str:
        """What a step of gradient accumulation is timed as."""
        run = self.run
        exchange = ""
        if run.state_group() > 1:
            exchange = (
                "; every micro-step exchanges as a whole step does (ZeRO-2/3 and FSDP "
                "reduce-scatter the gradients of each backward)"
                if run.sharding in EXCHANGE_EACH_MICRO_STEP
                else f"; {'DDP' if run.sharding == 'ddp' else 'ZeRO-1'} exchanges the "
                "gradients once, behind the last micro-step's backward (no_sync on the others)"
            )
        return (
            f"gradient accumulation: an optimizer step is {run.grad_accum} micro-steps of "
            "the traced forward and backward (each adding into the kept gradients) and one "
            f"optimizer update; throughput counts all {run.grad_accum} micro-batches" + exchange
        )

    def _kind_s(self, table: OpTable, rates: GpuRates, kind: str) -> tuple[float, float]:
        """This GPU's time in one micro-batch's forward and backward passes of the operators
        of ``table`` of one ``kind`` (``attention``, ``gemm``), timed as the step times them."""
        rows = np.flatnonzero(np.array([k == kind for k in table.kinds], dtype=bool))
        counts = None if table.counts is None else table.counts[rows]
        timed = step_time(select_rows(table, rows, counts), rates, self.run.precision, self.params)
        return timed.phase_s.get("forward", 0.0), timed.phase_s.get("backward", 0.0)

    def _with_tensor_note(self, assumptions: tuple[str, ...], step: StepTime) -> tuple[str, ...]:
        """``assumptions`` and, when the step runs on tensor cores, what their fitted efficiency
        rests on."""
        if step.tensor_flops_share <= 0:
            return assumptions
        note = self.params.coverage.tensor_note(self.run.precision)
        return assumptions if note is None else (*assumptions, note)

    def unknown_on_gpu(self, gpu: GpuSpec, memory: MemoryEstimate, why: str) -> ThroughputEstimate:
        """The answer for ``gpu`` where its speed cannot be predicted (``why``): its memory
        estimate's batch and fit, no throughput."""
        return self._no_speed(self._base(gpu, memory, self.assumptions), speed_unknown=why)

    def _base(
        self, gpu: GpuSpec, memory: MemoryEstimate, assumptions: tuple[str, ...]
    ) -> dict[str, Any]:
        """The fields of an answer on ``gpu`` that do not depend on its speed."""
        return {
            "gpu": gpu.id,
            "gpu_name": gpu.name,
            "workload": self.profile.workload,
            "run": memory.run,
            "batch_size": memory.batch_size,
            "seq_len": memory.seq_len,
            "fits": memory.fits,
            "n_gpus": self.run.gpus,
            "throughput_unit": self.unit,
            "band": self.band,
            "relative_band": self.relative_band,
            "assumptions": assumptions,
            "method": self.method,
        }

    @staticmethod
    def _no_speed(base: dict[str, Any], **extra: Any) -> ThroughputEstimate:
        """An answer without a speed (the step does not fit, or cannot be timed)."""
        return ThroughputEstimate(
            **base,
            step_time_s=None,
            throughput=None,
            low=None,
            high=None,
            mfu=None,
            scaling_efficiency=None,
            time_shares={},
            tensor_flops_share=0.0,
            **extra,
        )

    def on_gpu(self, gpu: GpuSpec, rates: GpuRates, memory: MemoryEstimate) -> ThroughputEstimate:
        """The prediction on ``gpu`` at the batch of ``memory`` (its largest, unless given)."""
        assumptions = self.assumptions
        if "attention_kernels" in memory.overheads:
            assumptions += (
                "attention falls back to PyTorch's math path on this GPU (see fit's "
                "assumptions; bf16 before Ampere): the prediction assumes the fused kernel "
                "and is optimistic; --precision fp16 runs fused",
            )
        architecture = self.params.coverage.architecture_note(gpu.architecture)
        if architecture is not None:
            assumptions += (architecture,)
        assumptions += split_package_note(gpu)
        assumptions += half_precision_note(gpu, self.run.precision)
        assumptions += power_limit_note(gpu, rates)
        base = self._base(gpu, memory, assumptions)
        if not memory.fits:
            return self._no_speed(base)
        table = op_table(self.profile, memory.batch_size, memory.seq_len)
        if self.compiled_kernels is not None:  # a compiled training step
            kernels = self.compiled_kernels(memory.batch_size, memory.seq_len)
            masked = self.compiled_causal_mask
            assumptions += (compiled_note(table, kernels, masked=masked),)
            table = compiled_table(table, kernels, masked_attention=masked)
        precision = self.run.precision
        if self.serving and self.inference is not None:
            n = self.run.gpus  # tensor parallel: each GPU runs every operator on 1/n of it
            kv_share = self.state.attention_bytes_share(n)
            # the experts a pass reads: those its tokens are routed to (all, in a prefill)
            prefill_tokens = memory.batch_size * (memory.seq_len or 1)
            prefill_part, decode_part = restrict(table, ("prefill",)), restrict(table, ("decode",))
            if self.quantized is not None:  # the weight products read the stored format
                q, sequences = self.quantized, memory.batch_size
                streamed = self.inference.weight_only_bandwidth_ratio[q.quantization]
                prefill_part, decode_part = (
                    quantize_weights(
                        part, tokens, q.weight_ratio, q.head_elements, sequences, streamed
                    )
                    for part, tokens in ((prefill_part, prefill_tokens), (decode_part, sequences))
                )
            prefill_table = split_work(
                read_experts(prefill_part, experts_read_share(self.routed, prefill_tokens)),
                n,
                kv_share,
            )
            prefill, capped = _faster(
                step_time(prefill_table, rates, precision, self.params),
                self.factor,
                peak_limited_s(prefill_table, rates, precision),
            )
            assumptions += capped
            decode_params = replace(
                self.params,
                memory_efficiency=self.inference.decode_memory_efficiency,
                # compiled decoding replays a CUDA graph: no host dispatch per operator
                launch_s=0.0 if self.run.compile else self.params.launch_s,
            )
            decode_table = split_work(
                read_experts(decode_part, experts_read_share(self.routed, memory.batch_size)),
                n,
                kv_share,
            )
            decode = step_time(decode_table, rates, precision, decode_params)
            new_tokens = 1 if self.run.new_tokens is None else self.run.new_tokens
            prefill_s, decode_s = prefill.step_time_s, decode.step_time_s
            exchange_s = 0.0
            if n > 1:  # tensor parallel: 1/N of the work, two all-reduces per layer and pass
                link = gpu_link(gpu, n)
                per_token = self.state.hidden_bytes_per_token
                context = memory.seq_len or 1
                reduces = 2 * self.state.layers
                prefill_x = reduces * all_reduce_s(memory.batch_size * context * per_token, n, link)
                decode_x = reduces * all_reduce_s(memory.batch_size * per_token, n, link)
                prefill_s += prefill_x
                decode_s += decode_x
                exchange_s = prefill_x + new_tokens * decode_x
                base["link"] = link.description
            seconds = prefill_s + new_tokens * decode_s
            units = memory.batch_size * new_tokens
            if new_tokens == 0:  # prefill-only requests: one forward pass, prompt tokens/s
                units = memory.batch_size * (memory.seq_len or 1)
            flops = prefill.flops + new_tokens * decode.flops
            shares = _shares([prefill, *([decode] * new_tokens)], seconds)
            if n > 1:
                shares["exchange"] = exchange_s / seconds
            base["assumptions"] = self._with_tensor_note(assumptions, prefill)
            return ThroughputEstimate(
                **base,
                step_time_s=seconds,
                throughput=units / seconds,
                low=units / seconds * (1 - self.band),
                high=units / seconds * (1 + self.band),
                mfu=flops / seconds / peak_flops_per_s(rates, precision),  # flops: one GPU's
                scaling_efficiency=None,
                time_shares=shares,
                tensor_flops_share=prefill.tensor_flops_share,
                prefill_s=prefill_s,
                decode_step_s=decode_s if new_tokens else None,
            )
        copies = self.run.data_parallel()
        if self.run.mode == "inference":
            table = restrict(table, ("forward",))
        else:
            if self.run.model_parallel() > 1:  # this GPU's stage, 1/T of each of its operators
                table = split_work(
                    replace(table, counts=table.weights * self.state.stage_work_share),
                    self.run.tensor_parallel,
                )
                # and 1/C of each sequence's tokens through the passes
                table = split_tokens(table, self.run.context_parallel)
            sharers = self.run.state_group()
            if sharers > 1 and self.run.sharding in SHARDED_OPTIMIZER:
                group = shard_group(sharers, self.run.sharding, tensor=self.run.tensor_parallel)
                table = shard_optimizer(table, group)
        raw = step_time(table, rates, precision, self.params)
        step, capped = _faster(raw, self.factor, peak_limited_s(table, rates, precision))
        assumptions += capped
        accumulate = self.run.mode == "train" and self.run.grad_accum > 1
        micro_s: float | None = None
        if accumulate:
            applied = raw.step_time_s / step.step_time_s if step.step_time_s > 0 else 1.0
            update = _faster(
                step_time(restrict(table, ("optimizer",)), rates, precision, self.params),
                applied,
                0.0,
            )[0]
            step, micro_s = accumulated(step, update, self.run.grad_accum)
            assumptions += (self._accumulation_note(),)
        paging_s = 0.0
        if self.run.mode == "train" and memory.paged_out_bytes > 0:
            # a paged optimizer's state that does not fit crosses PCIe in and out each step
            paging = paging_seconds(memory.paged_out_bytes, gpu)
            assumptions += (speed_note(gpu, memory.paged_out_bytes, paging),)
            if paging:
                paging_s = paging
                phases = dict(step.phase_s)
                phases["optimizer"] = phases.get("optimizer", 0.0) + paging
                step = replace(step, step_time_s=step.step_time_s + paging, phase_s=phases)
        seconds = step.step_time_s
        shares = _shares([step], seconds)
        if paging_s:
            shares["paging"] = paging_s / seconds
        scaling = None
        split_s = bubble_s = 0.0
        if self.run.model_parallel() > 1:
            micro_steps = self.run.grad_accum if accumulate else 1
            micro_s = sum(step.phase_s.get(p, 0.0) for p in ("forward", "backward"))
            split = model_parallel_step(
                micro_s / micro_steps,
                self.run,
                gpu,
                tokens=memory.batch_size * (memory.seq_len or 1),
                hidden_bytes_per_token=self.state.hidden_bytes_per_token,
                layers=self.state.layers,
                kv_bytes_per_token=self.state.kv_bytes_per_token
                * (self.state.attention_bytes_share(self.run.tensor_parallel) or 1.0),
                attention_s=self._kind_s(table, rates, "attention")
                if self.run.context_parallel > 1
                else (0.0, 0.0),
                gemm_s=sum(self._kind_s(table, rates, "gemm"))
                if self.run.tensor_parallel_overlap
                else 0.0,
            )
            split_s, bubble_s = split.added_s, split.bubble_s
            assumptions += (model_parallel_note(self.run, split, self.state.stage_work_share),)
            if split.tensor_link is not None:
                base["link"] = split.tensor_link.description
            elif split.stage_link is not None:
                base["link"] = split.stage_link
        if self.run.expert_parallel > 1 and self.state.experts is not None:
            moved = all_to_all(
                self.run,
                gpu,
                self.state.experts,
                tokens=memory.batch_size * (memory.seq_len or 1) // self.run.context_parallel,
                recomputed_share=recomputed_layers(self.run),
            )
            split_s += moved.step_s
            assumptions += (expert_note(self.run, self.state.expert_fraction, moved),)
        if self.run.gpus > 1 and self.run.mode == "train":
            backward_s = step.phase_s.get("backward", 0.0)
            exchanges = 1
            if accumulate and self.run.sharding in EXCHANGE_EACH_MICRO_STEP:
                exchanges = self.run.grad_accum  # every micro-step reduce-scatters (gathers)
            elif accumulate:  # DDP's no_sync, ZeRO-1: one exchange, behind the last backward
                backward_s /= self.run.grad_accum
            exposed_s = 0.0
            if sharers > 1:
                parallel = data_parallel_step(
                    seconds / exchanges,
                    backward_s / exchanges,
                    round(self.state.gradient_bytes * self.state.state_share),
                    round(self.state.parameter_bytes * self.state.state_share),
                    gpu,
                    sharers,
                    self.run.sharding,
                    network=self.run.network,
                    link=data_parallel_link(gpu, self.run)
                    if self.run.model_parallel() > 1
                    else None,
                    tensor=self.run.tensor_parallel,
                )
                exposed_s = parallel.exposed_s * exchanges
                base.setdefault("link", parallel.link.description)
            across = network_note(self.run.gpus, self.run.network, gpu=gpu)
            if across:
                assumptions += (across,)
            seconds = step.step_time_s + exposed_s + split_s
            scaling = step.step_time_s / seconds
            shares = {k: v * step.step_time_s / seconds for k, v in shares.items()}
            shares["exchange"] = (exposed_s + split_s - bubble_s) / seconds
            if bubble_s:
                shares["bubble"] = bubble_s / seconds
        if self.run.mode == "train":
            base["global_batch_size"] = self.run.global_batch_size(memory.batch_size)
            base["micro_step_s"] = micro_s
        units = table.units_per_step * (self.run.grad_accum if accumulate else 1)
        throughput = (copies if self.run.mode == "train" else self.run.gpus) * units / seconds
        base["assumptions"] = self._with_tensor_note(assumptions, step)
        return ThroughputEstimate(
            **base,
            step_time_s=seconds,
            throughput=throughput,
            low=throughput * (1 - self.band),
            high=throughput * (1 + self.band),
            mfu=step.flops / seconds / peak_flops_per_s(rates, precision),
            scaling_efficiency=scaling,
            time_shares=shares,
            tensor_flops_share=step.tensor_flops_share,
        )


def accumulated(step: StepTime, update: StepTime, micro_steps: int) -> tuple[StepTime, float]:
    """One optimizer step of gradient accumulation: ``micro_steps`` times the traced step
    without its ``update`` (the optimizer phase's time, FLOPs and shares), plus the update
    once; and the time of one micro-step."""
    extra = micro_steps - 1

    def more(whole: float, once: float) -> float:
        return whole + extra * (whole - once)

    flops = more(step.flops, update.flops)
    tensor_flops = more(
        step.tensor_flops_share * step.flops, update.tensor_flops_share * update.flops
    )
    phases = {
        phase: seconds * (1 if phase == "optimizer" else micro_steps)
        for phase, seconds in step.phase_s.items()
    }
    total = StepTime(
        step_time_s=more(step.step_time_s, update.step_time_s),
        matrix_s=more(step.matrix_s, update.matrix_s),
        memory_s=more(step.memory_s, update.memory_s),
        launch_s=more(step.launch_s, update.launch_s),
        phase_s=phases,
        flops=flops,
        tensor_flops_share=tensor_flops / flops if flops > 0 else 0.0,
    )
    return total, step.step_time_s - update.step_time_s


def _faster(step: StepTime, factor: float, limit_s: float) -> tuple[StepTime, tuple[str, ...]]:
    """``step`` with every time divided by the workload's speed ``factor``, but no faster than
    ``limit_s`` (the step at the GPU's peak rates, ``peak_limited_s``); and the note saying so
    when the limit stopped it (else none)."""
    note: tuple[str, ...] = ()
    if limit_s > 0 and step.step_time_s / factor < limit_s:
        capped = step.step_time_s / limit_s
        note = (
            f"the speed factor (x{factor:.2f}) would take this step past the GPU's peak rates; "
            f"the prediction stops at them (x{capped:.2f} applied: every matrix operator at "
            "its engine's peak, every other one at the full DRAM bandwidth)",
        )
        factor = capped
    return replace(
        step,
        step_time_s=step.step_time_s / factor,
        matrix_s=step.matrix_s / factor,
        memory_s=step.memory_s / factor,
        launch_s=step.launch_s / factor,
        phase_s={k: v / factor for k, v in step.phase_s.items()},
    ), note


def _shares(steps: list[StepTime], seconds: float) -> dict[str, float]:
    """Share of ``seconds`` bound by matrix engines, memory bandwidth and launches."""
    return {
        "matrix": sum(s.matrix_s for s in steps) / seconds,
        "memory": sum(s.memory_s for s in steps) / seconds,
        "launch": sum(s.launch_s for s in steps) / seconds,
    }
