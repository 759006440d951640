"""The closing summary of ``whichgpu validate``: one line per reference and quantity.

Also the references ``validate`` knows and how a request names them (``--source``).
"""

from __future__ import annotations

from collections.abc import Sequence

from whichgpu.errors import UsageError
from whichgpu.schema import ReferenceSource, SourceSummary

SOURCES: tuple[ReferenceSource, ...] = (
    "lambda2020",
    "own",
    "h200-2026-11",
    "llm-foundry",
    "serving",
    "parallel",
    "recipes",
)
"""Every reference, in the order the commands print them."""

SOURCE_TITLES: dict[ReferenceSource, str] = {
    "lambda2020": "Lambda 2020 table",
    "own": "whichgpu's own measurements",
    "h200-2026-11": "NVIDIA H200, 2026-11-26 and -27 (independent training loop)",
    "llm-foundry": "MosaicML llm-foundry MPT benchmarks (8x A100/H100 80GB, FSDP)",
    "serving": "published serving measurements (vLLM, TensorRT-LLM)",
    "parallel": "published tensor/pipeline-parallel training (NVIDIA NeMo, Megatron-Bridge)",
    "recipes": "published runs of today's recipes (torchao float8 on torchtitan: compiled, "
    "selective checkpointing, FSDP2)",
}
"""How the views name each reference."""

SOURCE_SETTINGS: dict[ReferenceSource, str] = {
    "h200-2026-11": (
        "one H200 SXM (catalog h200-sxm), torch 2.11.0+cu130, transformers 5.17.0, SDPA, "
        "torch AdamW (default implementation), random weights and synthetic data; bf16 = "
        "autocast with fp32 weights (whichgpu's bf16), bf16-pure = model and optimizer in "
        "bf16; peaks = torch.cuda max_memory_allocated/reserved over 3 steps after "
        "empty_cache and a reset; step time = mean of 10 steps after 3 warm-ups; largest "
        "batch = a search exact to 1; cudnn.benchmark on, so resnet50 fp32 b64's peaks hold "
        "cuDNN's algorithm-search workspaces of a 141 GB card"
    ),
    "llm-foundry": (
        "MPT models rebuilt as GPT-2 configs (learned positions, biases, exact GELU, no "
        "dropout; parameter counts equal the table's); the rows at 2,048 tokens, amp_bf16 "
        "with FSDP FULL_SHARD and DEFAULT mixed precision (whichgpu's bf16, --sharding fsdp, "
        "--gpus 8) on a100_80gb = a100-sxm4-80gb and h100_80gb = h100-sxm; one micro-batch per "
        "GPU per step (the table's gradient accumulation, 1 to 21 micro-batches per optimizer "
        "step, is not modelled: the optimizer step is counted once per micro-batch); "
        "llm-foundry's optimizer and loss (--optimizer-impl for-loop: Composer's "
        "DecoupledAdamW; --loss-kernel fused: flash-attn's cross-entropy) and its "
        "low_precision_layernorm (layer norms in bf16, the configs' norm_type); the table's "
        "attention, FlashAttention in Triton's pre-MLIR backend (Ampere's instructions), as "
        "the stack llm-foundry-2023 (--stack): on the H100s at half the rate of today's "
        "Hopper kernels, on the A100s at the GPU's own rate"
    ),
    "serving": (
        "each row as its publication ran it (engine and version, GPU, model, prompt and output "
        "tokens, concurrency; validate/data/serving/README.md), asked of predict --serving "
        "with the engine's defaults as whichgpu models them (the version whichgpu models, not "
        "the row's); a closed loop of fixed lengths is simulated step by step (predict "
        "--requests: the stated prompt count, or 40 waves with TTFT after the first where "
        "none is stated), other rows are compared with the steady state at the concurrency; "
        "TTFT is the engine's GPU steps only (no HTTP, tokenization or scheduler time)"
    ),
    "parallel": (
        "each row's GPUs, TP, PP, virtual stages (interleaved 1F1B) and CP, micro-batch, "
        "grad_accum = global batch / (micro-batch x DP), sequence length and precision "
        "(validate/data/parallel/README.md); Megatron's distributed optimizer (ZeRO-1) as "
        "zero1, rows whose notes say FSDP is on as fsdp; tensor parallel's exchanges beside the "
        "matrix products (--tp-overlap: the recipes' --tp-comm-overlap); activation "
        "recomputation is not stated, so none; Transformer Engine's fused kernels as a "
        "compiled step (--compile: "
        "the work between the matrix products fused into kernels that read their inputs once); "
        "nodes of 8 joined by the default fabric (InfiniBand NDR), GB200 within its 72-GPU "
        "NVLink domain; Mixtral's expert parallel as --expert-parallel; left out: rows without "
        "a micro-batch or a tokens/s, or longer than the model's positions"
    ),
    "recipes": (
        "each row's GPUs, sharding, micro-batch, sequence length and precision "
        "(validate/data/recipes/README.md), --compile and --checkpointing-policy selective as "
        "the runs compiled and checkpointed (torchtitan's op mode); fp8 as torchao's "
        "Float8Linear with each row's recipe (tensorwise, or --fp8-recipe rowwise); the H100 "
        "rows with --stack pytorch2-cuda12-flash-attention-2, as their torch 2.7 ran SDPA's "
        "FlashAttention-2 on Hopper; peak reserved per GPU against fit, tokens/s per GPU "
        "against predict"
    ),
}
"""How each reference outside Lambda's table and the own measurements is read (printed
under its tables)."""


def chosen_sources(names: Sequence[str] | None) -> tuple[ReferenceSource, ...]:
    """The references a request names (every one when ``names`` is empty), in ``SOURCES``
    order; an unknown name is a ``UsageError`` that lists the known ones."""
    if not names:
        return SOURCES
    unknown = [n for n in names if n not in SOURCES]
    if unknown:
        raise UsageError(
            f"--source {unknown[0]}: not a reference; choose from {', '.join(SOURCES)}."
        )
    return tuple(s for s in SOURCES if s in names)


def error_summary(
    source: ReferenceSource, quantity: str, errors: Sequence[float], note: str = ""
) -> SourceSummary:
    """The mean absolute, mean signed and worst of ``errors`` (signed fractions)."""
    if not errors:
        return SourceSummary(source=source, quantity=quantity, cases=0, note=note)
    return SourceSummary(
        source=source,
        quantity=quantity,
        cases=len(errors),
        mean_abs_error=sum(abs(e) for e in errors) / len(errors),
        mean_error=sum(errors) / len(errors),
        worst_error=max(errors, key=abs),
        note=note,
    )


def count_summary(source: ReferenceSource, quantity: str, cases: int, note: str) -> SourceSummary:
    """A line of counts only (``note``), over ``cases``."""
    return SourceSummary(source=source, quantity=quantity, cases=cases, note=note)
