"""Transformer language models (GPT-2, Llama, Mistral, Qwen, Mixtral) built from shipped configs.

Throughput is counted in tokens. Parameter counts are those of the ``transformers``
implementation of each config (the figure the model cards round, e.g. "8.03B").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from whichgpu.schema import RunConfig, WorkloadInfo
from whichgpu.workloads.base import BuiltWorkload, Workload
from whichgpu.workloads.hf import (
    build_hf_model,
    layer_count,
    loss_from_output,
    max_positions,
    read_config,
    token_batch,
    with_layers,
)
from whichgpu.workloads.registry import register

if TYPE_CHECKING:
    import torch

LLAMA_LIKE_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
GPT2_TARGETS = ("c_attn", "c_proj", "c_fc")

# name, params (exact, transformers), description, default (batch, seq), LoRA targets, card
_MODELS: list[tuple[str, int, str, tuple[int, int], tuple[str, ...], str]] = [
    (
        "gpt2",
        124_439_808,
        "GPT-2 small: 12 layers, d=768, 12 heads, 1024 context",
        (8, 1024),
        GPT2_TARGETS,
        "https://huggingface.co/openai-community/gpt2",
    ),
    (
        "gpt2-medium",
        354_823_168,
        "GPT-2 medium: 24 layers, d=1024, 16 heads",
        (8, 1024),
        GPT2_TARGETS,
        "https://huggingface.co/openai-community/gpt2-medium",
    ),
    (
        "gpt2-large",
        774_030_080,
        "GPT-2 large: 36 layers, d=1280, 20 heads",
        (4, 1024),
        GPT2_TARGETS,
        "https://huggingface.co/openai-community/gpt2-large",
    ),
    (
        "gpt2-xl",
        1_557_611_200,
        "GPT-2 XL: 48 layers, d=1600, 25 heads",
        (2, 1024),
        GPT2_TARGETS,
        "https://huggingface.co/openai-community/gpt2-xl",
    ),
    (
        "llama-3.2-1b",
        1_235_814_400,
        "Llama 3.2 1B: 16 layers, d=2048, GQA 32/8 heads, tied embeddings, 128k vocabulary",
        (4, 2048),
        LLAMA_LIKE_TARGETS,
        "https://huggingface.co/meta-llama/Llama-3.2-1B",
    ),
    (
        "llama-3.2-3b",
        3_212_749_824,
        "Llama 3.2 3B: 28 layers, d=3072, GQA 24/8 heads, tied embeddings",
        (2, 2048),
        LLAMA_LIKE_TARGETS,
        "https://huggingface.co/meta-llama/Llama-3.2-3B",
    ),
    (
        "llama-3.1-8b",
        8_030_261_248,
        "Llama 3.1 8B: 32 layers, d=4096, GQA 32/8 heads, SwiGLU 14336",
        (1, 2048),
        LLAMA_LIKE_TARGETS,
        "https://huggingface.co/meta-llama/Llama-3.1-8B",
    ),
    (
        "llama-3.1-70b",
        70_553_706_496,
        "Llama 3.1 70B: 80 layers, d=8192, GQA 64/8 heads",
        (1, 2048),
        LLAMA_LIKE_TARGETS,
        "https://huggingface.co/meta-llama/Llama-3.1-70B",
    ),
    (
        "mistral-7b",
        7_248_023_552,
        "Mistral 7B v0.3: 32 layers, d=4096, GQA 32/8, 32768 vocabulary",
        (1, 2048),
        LLAMA_LIKE_TARGETS,
        "https://huggingface.co/mistralai/Mistral-7B-v0.3",
    ),
    (
        "qwen2.5-7b",
        7_615_616_512,
        "Qwen2.5 7B: 28 layers, d=3584, GQA 28/4, QKV bias",
        (1, 2048),
        LLAMA_LIKE_TARGETS,
        "https://huggingface.co/Qwen/Qwen2.5-7B",
    ),
    (
        "qwen2.5-14b",
        14_770_033_664,
        "Qwen2.5 14B: 48 layers, d=5120, GQA 40/8",
        (1, 2048),
        LLAMA_LIKE_TARGETS,
        "https://huggingface.co/Qwen/Qwen2.5-14B",
    ),
    (
        "qwen2.5-32b",
        32_763_876_352,
        "Qwen2.5 32B: 64 layers, d=5120, GQA 40/8",
        (1, 2048),
        LLAMA_LIKE_TARGETS,
        "https://huggingface.co/Qwen/Qwen2.5-32B",
    ),
    (
        "mixtral-8x7b",
        46_702_792_704,
        "Mixtral 8x7B: sparse mixture of experts, 8 experts (top-2) per layer, 32 layers, d=4096",
        (1, 2048),
        ("q_proj", "k_proj", "v_proj", "o_proj"),
        "https://huggingface.co/mistralai/Mixtral-8x7B-v0.1",
    ),
]


def _make(
    name: str,
    params: int,
    description: str,
    default: tuple[int, int],
    targets: tuple[str, ...],
    card: str,
) -> Workload:
    config = read_config(name)

    def build_with_layers(run: RunConfig, layers: int) -> BuiltWorkload:
        return built(build_hf_model(with_layers(config, layers), run))

    def build(run: RunConfig) -> BuiltWorkload:
        return built(build_hf_model(config, run))

    def built(model: torch.nn.Module) -> BuiltWorkload:
        make = token_batch(int(config["vocab_size"]))
        return BuiltWorkload(
            model=model,
            make_batch=lambda batch_size, seq_len: make(model, batch_size, seq_len),
            loss=loss_from_output,
            units_per_sample=lambda seq_len: int(seq_len or default[1]),
            lora_targets=targets,
        )

    info = WorkloadInfo(
        name=name,
        family="llm",
        task="causal language modelling",
        description=description,
        input_desc="a sequence of token ids (next-token loss)",
        throughput_unit="tokens",
        default_batch_size=default[0],
        default_seq_len=default[1],
        is_sequence_model=True,
        max_seq_len=max_positions(config),
        params_published=params,
        params_source=f"transformers implementation of the config in {card}",
        reference=card,
    )
    layers = layer_count(config)
    return Workload(
        info=info,
        build=build,
        layers=layers,
        build_with_layers=build_with_layers if layers is not None else None,
    )


for _spec in _MODELS:
    register(_make(*_spec))
