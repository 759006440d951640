"""BERT encoders, built from shipped configs: pre-training (masked LM + next-sentence
prediction), SQuAD fine-tuning (``bert-squad``) and MT-DNN's multi-task GLUE model (``mt-dnn``).

Throughput is counted in sequences, as in Lambda's 2020 benchmark. Masked positions are a
fixed 15 % of the tokens, as in BERT's pre-training recipe.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from whichgpu.schema import RunConfig, WorkloadInfo
from whichgpu.workloads.base import Batch, BuiltWorkload, Workload, enable_checkpointing
from whichgpu.workloads.hf import (
    build_hf_model,
    default_dtype,
    loss_from_output,
    max_positions,
    model_device,
    read_config,
    weight_dtype,
)
from whichgpu.workloads.registry import register

if TYPE_CHECKING:
    import torch

BERT_TARGETS = ("query", "key", "value", "dense")
MASKED_FRACTION = 0.15
LAMBDA_STAND_INS = frozenset({"bert-base", "bert-squad", "mt-dnn"})
"""Workloads that stand for models of Lambda's 2020 table, whose code (google-research/bert
in TensorFlow 1.x, MT-DNN on pytorch-pretrained-bert) materialised the attention scores and
their dropout mask: traced so (``BuiltWorkload.fused_attention_dropout`` False)."""
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
            fused_attention_dropout=name not in LAMBDA_STAND_INS,
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
        max_seq_len=max_positions(config),
        params_published=params,
        params_source=f"transformers BertForPreTraining; paper figure {published}",
        reference="https://arxiv.org/abs/1810.04805",
    )
    return Workload(info=info, build=build)


for _spec in _MODELS:
    register(_make(*_spec))


# --- BERT fine-tuning on SQuAD 1.1 (Lambda 2020: "BERT Finetune") -------------------------

SQUAD_SEQ_LEN = 384
"""``--max_seq_length`` of both SQuAD 1.1 recipes in google-research/bert's README."""
SQUAD_BATCH = 12
"""``--train_batch_size`` of that README's GPU (BERT-Base) SQuAD recipe."""
SQUAD_QUERY_LEN = 64
"""``--max_query_length`` of ``run_squad.py``: the question segment (type 0) of each input."""


def _bert_squad() -> Workload:
    config = {**read_config("bert-base"), "architectures": ["BertForQuestionAnswering"]}
    vocab = int(config["vocab_size"])

    def build(run: RunConfig) -> BuiltWorkload:
        import torch

        model = build_hf_model(config, run)

        def make_batch(batch_size: int, seq_len: int | None) -> dict[str, Any]:
            seq = seq_len or SQUAD_SEQ_LEN
            device = model_device(model)
            ids = torch.randint(0, vocab, (batch_size, seq), device=device)
            segment = (torch.arange(seq, device=device) >= min(SQUAD_QUERY_LEN, seq // 2)).long()
            start = torch.randint(0, seq, (batch_size,), device=device)
            return {
                "input_ids": ids,
                "token_type_ids": segment.expand(batch_size, seq),
                "attention_mask": torch.ones_like(ids),
                "start_positions": start,
                "end_positions": torch.clamp(start + 3, max=seq - 1),
            }

        return BuiltWorkload(
            model=model,
            make_batch=make_batch,
            loss=loss_from_output,
            units_per_sample=lambda seq_len: 1,
            lora_targets=BERT_TARGETS,
            fused_attention_dropout=False,  # a Lambda 2020 model (LAMBDA_STAND_INS)
        )

    info = WorkloadInfo(
        name="bert-squad",
        family="encoders",
        task="extractive question answering (SQuAD 1.1 fine-tuning)",
        description=(
            "BERT-Base (12 layers, d=768) with a span head (start/end logits per token), "
            "fine-tuned on SQuAD 1.1 at 384 tokens: Lambda's 2020 'BERT Finetune'. Lambda does "
            "not say Base or Large; google-research/bert's README gives a BERT-Base GPU recipe "
            "(batch 12, seq 384) and says BERT-Large at 384 does not fit a 12 GB GPU even at "
            "batch 1, while Lambda ran batch 6 on 8 GB cards and batch 1 on a 6 GB card, so "
            "this is Base. For Large, pass --config with BertForQuestionAnswering."
        ),
        input_desc="a question + context pair of token ids, with answer start/end positions",
        throughput_unit="sequences",
        default_batch_size=SQUAD_BATCH,
        default_seq_len=SQUAD_SEQ_LEN,
        is_sequence_model=True,
        max_seq_len=max_positions(config),
        params_published=108_893_186,
        params_source=(
            "transformers BertForQuestionAnswering (bert-base config, no pooler); paper figure "
            "110M (Devlin et al. 2019, Table 1 rounds the encoder)"
        ),
        reference="https://github.com/google-research/bert#squad-11",
    )
    return Workload(info=info, build=build)


# --- MT-DNN (Liu et al. 2019) on GLUE -----------------------------------------------------

MT_DNN_HEADS: dict[str, int] = {
    "cola": 2,
    "sst": 2,
    "mnli": 3,
    "rte": 2,
    "qqp": 2,
    "mrpc": 2,
    "stsb": 1,
    "qnli": 1,
}
"""Task-specific output layers on the pooled [CLS] vector, outputs per task. The tasks are the
``train_datasets`` of namisan/mt-dnn ``scripts/run_mt_dnn.sh`` (GLUE without WNLI). The heads
are the paper's four kinds: classification for CoLA and SST-2 (single sentence) and for MNLI,
RTE, QQP and MRPC (pairs), a similarity regression for STS-B, and a relevance score for QNLI
(pairwise ranking: softmax over one question's candidate answers). They are linear, as
``run_mt_dnn.sh`` sets ``answer_opt=0`` (no stochastic answer network)."""
MT_DNN_STEP_TASK = "mnli"
"""The task of the traced step's batch. MT-DNN draws each mini-batch from one task, in
proportion to the task's size (the paper's Algorithm 1); MNLI (393k training pairs) is the
largest GLUE task, so most steps are MNLI steps. Only its head gets gradients in the step."""
MT_DNN_SEQ_LEN = 512
"""``--max_seq_len`` default of namisan/mt-dnn ``train.py``."""
MT_DNN_BATCH = 8
"""``--batch_size`` default of namisan/mt-dnn ``train.py``."""
MT_DNN_DROPOUT = 0.1
"""``--dropout_p`` default of ``train.py`` (dropout before each task head)."""


def _multi_task_bert(encoder: torch.nn.Module, hidden: int) -> torch.nn.Module:
    """A shared BERT encoder with MT-DNN's task heads; ``forward`` scores ``MT_DNN_STEP_TASK``."""
    import torch.nn.functional as F
    from torch import nn

    class MultiTaskBert(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = encoder
            self.dropout = nn.Dropout(MT_DNN_DROPOUT)
            self.heads = nn.ModuleDict({t: nn.Linear(hidden, n) for t, n in MT_DNN_HEADS.items()})

        def forward(
            self,
            input_ids: torch.Tensor,
            token_type_ids: torch.Tensor,
            attention_mask: torch.Tensor,
            labels: torch.Tensor | None = None,
        ) -> torch.Tensor:
            pooled = self.bert(
                input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask
            ).pooler_output
            logits: torch.Tensor = self.heads[MT_DNN_STEP_TASK](self.dropout(pooled))
            return logits if labels is None else F.cross_entropy(logits, labels)

        def gradient_checkpointing_enable(
            self,
            gradient_checkpointing_kwargs: dict[str, Any] | None = None,
            every_n_layers: int | None = None,
        ) -> None:
            enable_checkpointing(self.bert, every_n_layers, **(gradient_checkpointing_kwargs or {}))

    return MultiTaskBert()


MT_DNN_GELU = "gelu_python"
"""transformers' name for the GELU written out in Python, ``x * 0.5 * (1 + erf(x / sqrt 2))``:
the activation of pytorch-pretrained-bert 0.6.0, which namisan/mt-dnn's image installs
(``docker/Dockerfile``: ``pytorch/pytorch:1.1.0`` and ``pytorch-pretrained-bert==v0.6.0``).
Its autograd keeps the intermediate tensors the fused kernel does not."""


def _python_layer_norms(model: torch.nn.Module) -> None:
    """Replace every ``nn.LayerNorm`` of ``model`` by the one pytorch-pretrained-bert 0.6.0
    falls back to without apex (namisan/mt-dnn's image installs none): mean, centred input,
    variance, normalised input and affine, each an autograd node of its own."""
    from torch import nn

    class PythonLayerNorm(nn.Module):
        def __init__(self, norm: nn.LayerNorm) -> None:
            super().__init__()
            self.weight, self.bias, self.eps = norm.weight, norm.bias, norm.eps

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            import torch

            mean = x.mean(-1, keepdim=True)
            centred = x - mean
            variance = centred.pow(2).mean(-1, keepdim=True)
            out: torch.Tensor = self.weight * (centred / torch.sqrt(variance + self.eps))
            return out + self.bias

    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.LayerNorm):
                setattr(module, name, PythonLayerNorm(child))


def _mt_dnn() -> Workload:
    config = {
        **read_config("bert-large"),
        "architectures": ["BertModel"],
        "hidden_act": MT_DNN_GELU,
    }
    vocab = int(config["vocab_size"])
    hidden = int(config["hidden_size"])

    def build(run: RunConfig) -> BuiltWorkload:
        import torch

        encoder = build_hf_model(config, run)
        _python_layer_norms(encoder)
        with default_dtype(weight_dtype(run)):
            model = _multi_task_bert(encoder, hidden)

        def make_batch(batch_size: int, seq_len: int | None) -> dict[str, Any]:
            seq = seq_len or MT_DNN_SEQ_LEN
            device = model_device(model)
            ids = torch.randint(0, vocab, (batch_size, seq), device=device)
            segment = (torch.arange(seq, device=device) >= seq // 2).long()
            return {
                "input_ids": ids,
                "token_type_ids": segment.expand(batch_size, seq),
                "attention_mask": torch.ones_like(ids),
                "labels": torch.randint(
                    0, MT_DNN_HEADS[MT_DNN_STEP_TASK], (batch_size,), device=device
                ),
            }

        def loss(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
            out: torch.Tensor = model(**batch)
            return out

        return BuiltWorkload(
            model=model,
            make_batch=make_batch,
            loss=loss,
            units_per_sample=lambda seq_len: 1,
            lora_targets=BERT_TARGETS,
            fused_attention_dropout=False,  # a Lambda 2020 model (LAMBDA_STAND_INS)
        )

    info = WorkloadInfo(
        name="mt-dnn",
        family="encoders",
        task="multi-task natural language understanding (GLUE)",
        description=(
            "MT-DNN: a shared BERT-Large encoder (24 layers, d=1024) with task heads for 8 GLUE "
            "tasks (6 classifiers, STS-B regression, QNLI ranking score), 512 tokens; each step "
            "is one MNLI batch. Lambda's 2020 'MT-DNN'; Lambda does not say base or large: "
            "namisan/mt-dnn's GLUE recipe (scripts/run_mt_dnn.sh) and the paper start from "
            "BERT-Large, and Lambda's batches (2 on 11 GB, none on 6 GB) fit Large, not Base. "
            "As pytorch-pretrained-bert 0.6.0 ran it without apex: GELU and LayerNorm written "
            "out in Python, attention scores materialised."
        ),
        input_desc="a sentence pair of token ids (MNLI premise + hypothesis) and its label",
        throughput_unit="sequences",
        default_batch_size=MT_DNN_BATCH,
        default_seq_len=MT_DNN_SEQ_LEN,
        is_sequence_model=True,
        max_seq_len=max_positions(config),
        params_published=335_157_263,
        params_source=(
            "transformers BertModel (bert-large config, with pooler) + 8 linear GLUE heads; "
            "paper figure 340M for BERT-Large (Devlin et al. 2019, Table 1)"
        ),
        reference="https://arxiv.org/abs/1901.11504",
    )
    return Workload(info=info, build=build)


register(_bert_squad())
register(_mt_dnn())
