"""BERT encoders: pre-training (masked LM + next-sentence prediction), built from shipped configs.

Throughput is counted in sequences, as in Lambda's 2020 benchmark. Masked positions are a
fixed 15 % of the tokens, as in BERT's pre-training recipe.
"""

from __future__ import annotations

from typing import Any

from whichgpu.schema import RunConfig, WorkloadInfo
from whichgpu.workloads.base import BuiltWorkload, Workload
from whichgpu.workloads.hf import build_hf_model, loss_from_output, model_device, read_config
from whichgpu.workloads.registry import register

BERT_TARGETS = ("query", "key", "value", "dense")
MASKED_FRACTION = 0.15
"""Share of tokens whose prediction is scored (BERT paper, section 3.1)."""

_MODELS = [
    (
        "bert-base",
        110_106_428,
        "BERT-Base: 12 layers, d=768, 12 heads, MLM + NSP heads",
        "110M (Devlin et al. 2019, Table 1 rounds the encoder)",
        (32, 512),
    ),
    (
        "bert-large",
        336_226_108,
        "BERT-Large: 24 layers, d=1024, 16 heads, MLM + NSP heads",
        "340M (Devlin et al. 2019, Table 1 rounds the encoder)",
        (8, 512),
    ),
]


def _make(
    name: str, params: int, description: str, published: str, default: tuple[int, int]
) -> Workload:
    config = read_config(name)
    vocab = int(config["vocab_size"])

    def build(run: RunConfig) -> BuiltWorkload:
        import torch

        model = build_hf_model(config, run)

        def make_batch(batch_size: int, seq_len: int | None) -> dict[str, Any]:
            seq = seq_len or default[1]
            device = model_device(model)
            ids = torch.randint(0, vocab, (batch_size, seq), device=device)
            scored = torch.arange(seq, device=device) % round(1 / MASKED_FRACTION) == 0
            labels = torch.where(scored, ids, torch.full_like(ids, -100))
            return {
                "input_ids": ids,
                "token_type_ids": torch.zeros_like(ids),
                "attention_mask": torch.ones_like(ids),
                "labels": labels,
                "next_sentence_label": torch.randint(0, 2, (batch_size,), device=device),
            }

        return BuiltWorkload(
            model=model,
            make_batch=make_batch,
            loss=loss_from_output,
            units_per_sample=lambda seq_len: 1,
            lora_targets=BERT_TARGETS,
        )

    info = WorkloadInfo(
        name=name,
        family="encoders",
        task="language model pre-training (MLM + NSP)",
        description=description,
        input_desc="a pair of segments of token ids",
        throughput_unit="sequences",
        default_batch_size=default[0],
        default_seq_len=default[1],
        is_sequence_model=True,
        params_published=params,
        params_source=f"transformers BertForPreTraining; paper figure {published}",
        reference="https://arxiv.org/abs/1810.04805",
    )
    return Workload(info=info, build=build)


for _spec in _MODELS:
    register(_make(*_spec))
