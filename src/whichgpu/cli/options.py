"""Options shared by several commands, declared once so every command spells them the same."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

JsonOption = Annotated[
    bool, typer.Option("--json", help="Print one JSON document on stdout instead of tables.")
]

PricesOption = Annotated[
    Optional[list[Path]],  # noqa: UP045 - typer needs Optional at runtime on Python 3.10
    typer.Option(
        "--prices",
        help=(
            "A CSV of your own prices (columns gpu_id,kind,usd,per,provider,region,as_of,source,"
            "note, optionally instance_gpus; see docs/prices.md). Its rows replace the catalog's "
            "rows with the same GPU, "
            "kind, provider and region, and add the others. Repeatable. Default: "
            "~/.config/whichgpu/prices.csv (or $WHICHGPU_PRICES) when it exists."
        ),
        metavar="FILE",
    ),
]


GpuListOption = Annotated[
    Optional[list[str]],  # noqa: UP045
    typer.Option(
        "--gpu",
        "-g",
        help="A GPU to answer for (repeat for several); default: every GPU in the catalog that "
        "can be answered for.",
        show_default=False,
    ),
]
StackOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--stack",
        help=(
            "Software stack: the memory it holds outside PyTorch's allocator, how fast its "
            "attention runs on Hopper and whether a compiled step masks it (pytorch2-cuda12: "
            "torch 2.11 or later; pytorch2-cuda12-flash-attention-2: torch 2.5.1 to 2.8 or "
            "2.10, whose SDPA runs FlashAttention-2 on Hopper; pytorch2-cuda12-transformers-5.17, "
            "lambda-2020, llm-foundry-2023)."
        ),
        show_default="pytorch2-cuda12",
    ),
]

_RUN = "Run options"

ModeOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--mode",
        help="train (forward, loss, backward, optimizer step; the default) or inference (a "
        "language model serves requests from a KV cache; other models run forward only).",
        rich_help_panel=_RUN,
    ),
]
PrecisionOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--precision",
        help="fp32 (TF32 off), tf32, fp16 / bf16 (AMP with fp32 master weights), bf16-pure "
        "(weights, grads, optimizer state in bf16), fp8 (torchao Float8Linear: the linear "
        "layers' GEMMs in fp8, the rest as bf16 AMP; GPUs with fp8 tensor cores). Default bf16.",
        rich_help_panel=_RUN,
    ),
]
BatchOption = Annotated[
    Optional[int],  # noqa: UP045
    typer.Option(
        "--batch-size",
        help="Samples per step (default: the workload's, as `whichgpu workloads` lists it; for "
        "--model, the example batch's size).",
        rich_help_panel=_RUN,
    ),
]
FitBatchOption = Annotated[
    Optional[int],  # noqa: UP045
    typer.Option(
        "--batch-size",
        help="Samples per step on each GPU: say whether this batch fits, with the headroom "
        "(default: search the largest batch that fits each GPU).",
        rich_help_panel=_RUN,
    ),
]
PredictBatchOption = Annotated[
    Optional[int],  # noqa: UP045
    typer.Option(
        "--batch-size",
        help="Samples per step on each GPU (default: on each GPU the largest batch that fits "
        "it, as `whichgpu fit` finds it).",
        rich_help_panel=_RUN,
    ),
]
RecommendBatchOption = Annotated[
    Optional[int],  # noqa: UP045
    typer.Option(
        "--batch-size",
        help="Samples per step on each GPU (default: on each candidate the largest batch that "
        "fits it).",
        rich_help_panel=_RUN,
    ),
]
SeqOption = Annotated[
    Optional[int],  # noqa: UP045
    typer.Option(
        "--seq-len",
        help="Tokens per sequence, for sequence models (default: the workload's, e.g. 2048 for "
        "llama-3.1-8b; see `whichgpu workloads`). With --mode inference, another name for "
        "--context.",
        rich_help_panel=_RUN,
    ),
]
OptimizerOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--optimizer",
        help="adamw (default), adamw-8bit, paged-adamw-8bit, adafactor, sgd.",
        rich_help_panel=_RUN,
    ),
]
OptimizerImplOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--optimizer-impl",
        help="How the optimizer step runs: foreach (default, PyTorch's choice on CUDA: "
        "temporaries the size of all parameters), for-loop (one parameter at a time, as "
        "Composer/llm-foundry's DecoupledAdamW), fused (one kernel, no temporaries: "
        "torch.optim.AdamW(fused=True), torchtitan's default), in-backward (each parameter "
        "updated in the backward pass as soon as its gradient is ready, so no full set of "
        "gradients exists: torchtune's optimizer_in_bwd; one GPU, no --grad-accum, no fp16).",
        rich_help_panel=_RUN,
    ),
]
LossKernelOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--loss-kernel",
        help="A language model's cross-entropy: torch (default, transformers' loss: fp32 "
        "logits, log-softmax and gradient), fused (one kernel over the 16-bit logits, as "
        "flash-attn's CrossEntropyLoss in llm-foundry or Liger's), chunked (torchtune's "
        "chunked cross-entropy: logits upcast to fp32 one of 8 sequence chunks at a time) or "
        "fused-linear (Liger's fused linear cross-entropy: output projection, loss and "
        "gradients chunk by chunk in the forward pass, no whole logits in any dtype).",
        rich_help_panel=_RUN,
    ),
]
GradAccumOption = Annotated[
    Optional[int],  # noqa: UP045
    typer.Option(
        "--grad-accum",
        help="Gradient accumulation: micro-batches (of --batch-size) per optimizer step "
        "(default 1). Memory is one micro-batch's plus the gradients kept between them; an "
        "optimizer step is N forward/backward passes and one update; the global batch is "
        "--batch-size x N x --gpus.",
        rich_help_panel=_RUN,
        show_default=False,
    ),
]
CheckpointingOption = Annotated[
    bool,
    typer.Option(
        "--checkpointing",
        help="Gradient checkpointing of every layer (--checkpointing-policy full).",
        rich_help_panel=_RUN,
    ),
]
CheckpointingPolicyOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--checkpointing-policy",
        help="Which activations checkpointing recomputes (turns --checkpointing on): full "
        "(default: every layer), every-N (every N-th layer, e.g. every-2: torchtitan's "
        "selective layer mode with ac_freq N), selective (per operator: attention outputs and "
        "every other matmul's kept, the rest recomputed: torchtitan's op mode).",
        rich_help_panel=_RUN,
    ),
]
CompileOption = Annotated[
    bool,
    typer.Option(
        "--compile",
        help="The step runs under torch.compile (default mode; training): the activations "
        "inductor recomputes instead of saving leave the forward and backward passes' peak, "
        "and their non-matrix operators run as the kernels inductor fuses them into (both from "
        "AOTAutograd's partition of the step on fake tensors). With --checkpointing the "
        "checkpointed layers keep what their policy keeps and recompute the rest fused; the "
        "memory saving is applied per data-parallel GPU, not where tensor, pipeline or "
        "context parallel split a micro-batch. With --mode inference (a language model): "
        "compiled decoding, as transformers' generate runs a static cache (the decode steps "
        "under torch.compile mode reduce-overhead, replayed as CUDA graphs; the prefill "
        "eager): decode steps without the per-operator dispatch floor.",
        rich_help_panel=_RUN,
    ),
]
MethodOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--method",
        help="full (default), lora, qlora (4-bit NF4 base weights).",
        rich_help_panel=_RUN,
    ),
]
LoraRankOption = Annotated[
    Optional[int],  # noqa: UP045
    typer.Option("--lora-rank", help="LoRA rank (default 16).", rich_help_panel=_RUN),
]
LoraTargetsOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--lora-targets",
        help="Modules LoRA adapts, comma-separated, each a name or a dotted suffix of one "
        "(q_proj,v_proj), or all-linear (every linear layer but the output layer). Default: "
        "the workload's attention and MLP projections (Llama: q_proj,k_proj,v_proj,o_proj,"
        "gate_proj,up_proj,down_proj); all-linear for --config and --model.",
        rich_help_panel=_RUN,
    ),
]
GpusOption = Annotated[
    Optional[int],  # noqa: UP045
    typer.Option(
        "--gpus",
        help="GPUs working together (default 1). Training runs data parallel: the batch is "
        "each GPU's own (global batch = GPUs x batch), --sharding splits the model state; "
        "beyond one machine's 8, in machines of 8 joined by --network (a multiple of 8, at "
        "most 4096). Inference serves one copy of a language model tensor parallel, within "
        "one machine. Throughput is of all of them together.",
        rich_help_panel=_RUN,
    ),
]
FitGpusOption = Annotated[
    Optional[int],  # noqa: UP045
    typer.Option(
        "--gpus",
        help="GPUs working together (default 1), any number, on one machine or many: memory "
        "per GPU does not depend on where the others are. Training runs data parallel: the "
        "batch is each GPU's own (global batch = GPUs x batch), --sharding splits the model "
        "state. Inference serves one copy of a language model tensor parallel. Every figure "
        "is per GPU.",
        rich_help_panel=_RUN,
    ),
]
BenchGpusOption = Annotated[
    Optional[int],  # noqa: UP045
    typer.Option(
        "--gpus",
        help="GPUs of this node that then train together (DDP, one process each; default 1): "
        "each runs the batch, throughput is of all of them, and the scaling efficiency is "
        "against the one-GPU run measured first.",
        rich_help_panel=_RUN,
    ),
]
ShardingOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--sharding",
        help="What the --gpus split: ddp (nothing; DDP adds gradient buckets; default), zero1 "
        "(optimizer state and master weights; gradients whole, reduced once a step: DeepSpeed "
        "stage 1, Megatron's distributed optimizer), zero2 (gradients and optimizer state), "
        "zero3 or fsdp (parameters too, gathered a layer at a time), hsdp (fsdp within each "
        "node of 8, each node a replica; the nodes all-reduce the gradient shards).",
        rich_help_panel=_RUN,
    ),
]
Fp8RecipeOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--fp8-recipe",
        help="Training with --precision fp8: torchao's scaling recipe. tensorwise (default): "
        "one scale per tensor, e4m3 forward and e5m2 gradients. rowwise: one scale per row or "
        "column, all e4m3 (more robust to outliers, slower: a rescaling kernel after each "
        "backward product, the weights cast twice).",
        show_default="tensorwise",
        rich_help_panel=_RUN,
    ),
]
Fp8AllGatherOption = Annotated[
    bool,
    typer.Option(
        "--fp8-all-gather",
        help="Training with --precision fp8 and --sharding fsdp (zero3, hsdp): FSDP gathers "
        "the converted linear layers' weights in fp8, 1 byte a weight instead of 2 (torchao's "
        "enable_fsdp_float8_all_gather): smaller gathered layers, half their gathers' bytes.",
        rich_help_panel=_RUN,
    ),
]
TensorParallelOption = Annotated[
    Optional[int],  # noqa: UP045
    typer.Option(
        "--tensor-parallel",
        help="Training: GPUs of one machine that split every layer between them (Megatron-"
        "style tensor parallel with sequence parallel; default 1). It must divide the "
        "model's attention and key/value heads; --gpus is a multiple of it x "
        "--pipeline-parallel, the rest data parallel. Each GPU holds 1/T of the model state "
        "and of the activations, and exchanges hidden states 4 times a layer.",
        rich_help_panel=_RUN,
    ),
]
PipelineParallelOption = Annotated[
    Optional[int],  # noqa: UP045
    typer.Option(
        "--pipeline-parallel",
        help="Training: stages the layers are split into, each on its own GPUs (1F1B "
        "schedule; default 1). Needs --grad-accum of at least as many micro-batches per step; "
        "the bubble idles each stage P-1 micro-batch times a step. Typically across machines, "
        "with --tensor-parallel inside them: --gpus 64 --tensor-parallel 8 --pipeline-parallel "
        "4 --grad-accum 16.",
        rich_help_panel=_RUN,
    ),
]
VirtualStagesOption = Annotated[
    Optional[int],  # noqa: UP045
    typer.Option(
        "--virtual-stages",
        help="Training with --pipeline-parallel: chunks of layers each GPU holds (the "
        "interleaved 1F1B schedule, Megatron-LM's virtual pipeline; default 1). Cuts the "
        "bubble by this factor, sends this many times as often, and keeps a little more in "
        "flight. The layers must split into pipeline x virtual equal chunks.",
        rich_help_panel=_RUN,
    ),
]
TensorParallelOverlapOption = Annotated[
    bool,
    typer.Option(
        "--tp-overlap",
        help="Training with --tensor-parallel: time its exchanges as running beside the "
        "matrix products of their layer (Megatron-Core's --tp-comm-overlap, which NVIDIA's "
        "performance recipes turn on; torchtitan's async tensor parallel), so that only what "
        "outlasts them adds to the step. Default: none of them hidden.",
        rich_help_panel=_RUN,
    ),
]
ContextParallelOption = Annotated[
    Optional[int],  # noqa: UP045
    typer.Option(
        "--context-parallel",
        help="Training: GPUs that split every sequence between them (context parallel, as "
        "Megatron-Core's --context-parallel-size and torchtitan's context_parallel_degree; "
        "default 1). Each holds 1/C of every sequence's activations and passes keys and values "
        "around a ring; each holds the whole model state (sharded with the copies under "
        "--sharding zero1/zero2/fsdp). For long sequences: --seq-len 131072 --gpus 16 "
        "--context-parallel 8. --seq-len must divide into 2C chunks.",
        rich_help_panel=_RUN,
    ),
]
ExpertParallelOption = Annotated[
    Optional[int],  # noqa: UP045
    typer.Option(
        "--expert-parallel",
        help="Training a mixture of experts: data-parallel copies that spread each layer's "
        "routed experts between them (expert parallel, as Megatron-Core's "
        "--expert-model-parallel-size and torchtitan's expert_parallel_degree; default 1). "
        "Each GPU holds 1/E of the experts and sends its tokens to their experts and back by "
        "all-to-all, twice a layer each pass. E divides the copies and the experts: "
        "mixtral-8x7b --gpus 64 --expert-parallel 8 --sharding zero1.",
        rich_help_panel=_RUN,
    ),
]
NetworkOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--network",
        help="With more --gpus than one machine holds (8): the network between the machines "
        "(nodes of 8, one NIC per GPU): ib-ndr (InfiniBand NDR, 400 Gb/s per GPU; default), "
        "ib-hdr (InfiniBand HDR, 200 Gb/s), roce-1600 (RoCE, 1600 Gb/s per node).",
        rich_help_panel=_RUN,
    ),
]
ContextOption = Annotated[
    Optional[int],  # noqa: UP045
    typer.Option(
        "--context",
        help="Inference of a language model: prompt tokens per sequence (default: the "
        "workload's sequence length, shortened so that context plus --new-tokens fits the "
        "model's positions).",
        rich_help_panel=_RUN,
    ),
]
NewTokensOption = Annotated[
    Optional[int],  # noqa: UP045
    typer.Option(
        "--new-tokens",
        help="Inference of a language model: tokens generated per sequence, held in the KV "
        "cache with the context (default 128).",
        rich_help_panel=_RUN,
    ),
]
ConcurrencyOption = Annotated[
    Optional[int],  # noqa: UP045
    typer.Option(
        "--concurrency",
        help="Inference of a language model: sequences served at once (default 1; --batch-size "
        "is another name for it).",
        rich_help_panel=_RUN,
    ),
]
BenchConcurrencyOption = Annotated[
    Optional[int],  # noqa: UP045
    typer.Option(
        "--concurrency",
        help="Inference of a language model: sequences served at once (default: the "
        "workload's batch size; --find-max-batch searches the largest that runs).",
        rich_help_panel=_RUN,
    ),
]
SearchConcurrencyOption = Annotated[
    Optional[int],  # noqa: UP045
    typer.Option(
        "--concurrency",
        help="Inference of a language model: sequences served at once (default: on each GPU "
        "the most that fit).",
        rich_help_panel=_RUN,
    ),
]
QuantizationOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--quantization",
        help="With --serving: the linear layers' weights quantized, int4 (AWQ/GPTQ-style "
        "weight-only, W4A16), int8 (weight-only, W8A16) or fp8 (with fp8 activations, W8A8, "
        "where the GPU has fp8 tensor cores; else weight-only where the engine can). Sizes the "
        "weights' bytes (read every decode step; the rest of the memory is KV cache). A GPU "
        "the engine cannot run it on is refused, with why. With --compile and --mode "
        "inference (no engine): torchao's weight-only int8 or int4 (tinygemm, Ampere and "
        "later), as gpt-fast and transformers' TorchAoConfig quantize.",
        rich_help_panel=_RUN,
        show_default=False,
    ),
]
KvCacheDtypeOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--kv-cache-dtype",
        help="With --serving: how the engine stores its KV cache, auto (the serving dtype, "
        "the default) or fp8 (e4m3, 1 byte per element: twice the tokens in the same memory, "
        "half the KV bytes a decode step reads; vLLM's --kv-cache-dtype fp8, TensorRT-LLM's "
        "KvCacheConfig(dtype='fp8')). A GPU the engine has no fp8 KV cache on is refused, with "
        "why.",
        rich_help_panel=_RUN,
        show_default=False,
    ),
]
ConfigOption = Annotated[
    Optional[Path],  # noqa: UP045
    typer.Option(
        "--config",
        help="Your model: a Hugging Face config.json (no weights needed).",
        metavar="FILE",
    ),
]
ModelOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--model",
        help="Your PyTorch model: FILE.py:FUNCTION or package.module:FUNCTION, a function "
        "(taking nothing or the run configuration) that builds it and returns (model, batch), "
        "batch an example of its inputs (a tensor, tuple or dict); or (model, make_batch), "
        "make_batch(batch_size, seq_len) giving the keyword inputs; either with a "
        "loss(model, batch) as a third item; or a BuiltWorkload. See docs/workloads.md.",
        metavar="FILE.py:FUNCTION",
    ),
]
TaskOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--task",
        help="With --config: the head to build (default: read from 'architectures'): causal-lm, "
        "seq-cls, masked-lm, question-answering, token-classification, seq2seq-lm (T5, BART), "
        "image-classification (ViT, ConvNeXt) or speech-seq2seq (Whisper).",
    ),
]

QUESTION_PANEL = "Question"
"""Help panel of the options that say what the user wants: buy or rent, budget, job size."""

BuyOption = Annotated[
    bool, typer.Option("--buy", help="Buy the GPUs (default).", rich_help_panel=QUESTION_PANEL)
]
RentOption = Annotated[
    bool, typer.Option("--rent", help="Rent them by the hour.", rich_help_panel=QUESTION_PANEL)
]
BudgetOption = Annotated[
    Optional[float],  # noqa: UP045
    typer.Option(
        "--budget",
        help="USD. Buy: the machine's price. Rent: the job's rental.",
        rich_help_panel=QUESTION_PANEL,
    ),
]
MachineGpusOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--gpus",
        help="GPUs per machine: N, auto (1, 2, 4, 8; clusters of 16-64 only when none meets "
        "--within) or a range like 1-4. Beyond 8 (a multiple of 8, or a range like 8-64), "
        "training on a cluster of machines of 8 joined by --network, each priced as one.",
        rich_help_panel=QUESTION_PANEL,
    ),
]
HoursOption = Annotated[
    Optional[float],  # noqa: UP045
    typer.Option("--hours", help="Job: hours of use.", rich_help_panel=QUESTION_PANEL),
]
SamplesOption = Annotated[
    Optional[float],  # noqa: UP045
    typer.Option("--samples", help="Job: samples to process.", rich_help_panel=QUESTION_PANEL),
]
TokensOption = Annotated[
    Optional[float],  # noqa: UP045
    typer.Option("--tokens", help="Job: tokens to process.", rich_help_panel=QUESTION_PANEL),
]
EpochsOption = Annotated[
    Optional[float],  # noqa: UP045
    typer.Option("--epochs", help="Job: epochs of --dataset-size.", rich_help_panel=QUESTION_PANEL),
]
DatasetSizeOption = Annotated[
    Optional[int],  # noqa: UP045
    typer.Option("--dataset-size", help="Samples per epoch.", rich_help_panel=QUESTION_PANEL),
]
RegionOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--region",
        help="Electricity price and grid carbon of this region (see docs/cost.md).",
        rich_help_panel=QUESTION_PANEL,
    ),
]
PresetOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--for",
        help="A persona of the seed guides: learning, kaggle, cv-research, nlp-research, "
        "llm-finetune, inference, startup-cluster. Sets a workload and constraints; your "
        "flags win.",
        rich_help_panel=QUESTION_PANEL,
    ),
]
RankServingOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--serving",
        help="With --mode inference: rank as served by an engine (vllm, tensorrt-llm, "
        "sglang): a "
        "GPU fits when the engine's KV cache holds --concurrency sequences of --context + "
        "--new-tokens, and ranks by its output tokens/s and $ per million output tokens. "
        "Default: plain PyTorch generation.",
        show_default=False,
    ),
]
UsedOption = Annotated[
    Optional[bool],  # noqa: UP045
    typer.Option(
        "--used/--new",
        help=(
            "Buying: rank a GPU at its used price where the catalog has one below its new "
            "price (the default), or at new prices only (--new)."
        ),
        show_default=False,
        rich_help_panel=QUESTION_PANEL,
    ),
]
GpuOnlyOption = Annotated[
    bool,
    typer.Option(
        "--gpu-only",
        help="You have the computer: count the GPUs' price only, no base system.",
        rich_help_panel=QUESTION_PANEL,
    ),
]
ProviderOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--provider", help="Rent from this provider only.", rich_help_panel=QUESTION_PANEL
    ),
]
WithinOption = Annotated[
    Optional[float],  # noqa: UP045
    typer.Option(
        "--within",
        help="Deadline in hours: leave out what would not finish the job (in work: --samples, "
        "--tokens, --epochs) in time.",
        rich_help_panel=QUESTION_PANEL,
    ),
]
MinBatchOption = Annotated[
    Optional[int],  # noqa: UP045
    typer.Option(
        "--min-batch",
        help="Leave out GPUs whose largest batch is smaller.",
        rich_help_panel=QUESTION_PANEL,
    ),
]
SortOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--sort",
        help="cost, perf-per-dollar, time or throughput (default: cost with a job size, else "
        "perf-per-dollar).",
        rich_help_panel=QUESTION_PANEL,
    ),
]
VendorOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--vendor",
        help="Only this maker's GPUs: nvidia, amd, intel, google, apple; any lifts a "
        "preset's (learning, kaggle and llm-finetune keep to nvidia).",
        rich_help_panel=QUESTION_PANEL,
    ),
]
