"""``--config`` models of every common ``AutoModelFor…`` task: question answering, token
classification, text and speech encoder-decoders (T5, BART, Whisper) and image classifiers
(ViT, ConvNeXt), each with its synthetic inputs and loss (``workloads.config_tasks``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from whichgpu.cli import main
from whichgpu.errors import UnsupportedWorkload, UsageError
from whichgpu.schema import RunConfig
from whichgpu.trace import trace_step
from whichgpu.workloads import check_for_workload, select_workload
from whichgpu.workloads.user import config_workload

BERT = {
    "model_type": "bert", "vocab_size": 64, "hidden_size": 16, "num_hidden_layers": 1,
    "num_attention_heads": 2, "intermediate_size": 32, "max_position_embeddings": 64,
}  # fmt: skip
T5 = {
    "model_type": "t5", "architectures": ["T5ForConditionalGeneration"],
    "is_encoder_decoder": True, "vocab_size": 64, "d_model": 16, "d_kv": 8, "d_ff": 32,
    "num_layers": 1, "num_decoder_layers": 1, "num_heads": 2, "decoder_start_token_id": 0,
    "pad_token_id": 0, "eos_token_id": 1,
}  # fmt: skip
BART = {
    "model_type": "bart", "architectures": ["BartForConditionalGeneration"],
    "is_encoder_decoder": True, "vocab_size": 64, "d_model": 16, "encoder_layers": 1,
    "decoder_layers": 1, "num_hidden_layers": 1, "encoder_attention_heads": 2,
    "decoder_attention_heads": 2, "encoder_ffn_dim": 32, "decoder_ffn_dim": 32,
    "max_position_embeddings": 64,
}  # fmt: skip
WHISPER = {
    "model_type": "whisper", "architectures": ["WhisperForConditionalGeneration"],
    "is_encoder_decoder": True, "vocab_size": 64, "d_model": 16, "encoder_layers": 1,
    "decoder_layers": 1, "num_hidden_layers": 1, "encoder_attention_heads": 2,
    "decoder_attention_heads": 2, "encoder_ffn_dim": 32, "decoder_ffn_dim": 32,
    "num_mel_bins": 8, "max_source_positions": 32, "max_target_positions": 64,
    "decoder_start_token_id": 1, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
}  # fmt: skip
VIT = {
    "model_type": "vit", "architectures": ["ViTForImageClassification"], "hidden_size": 16,
    "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 32,
    "image_size": 32, "patch_size": 8, "num_channels": 3,
    "id2label": {"0": "cat", "1": "dog", "2": "bird"},
}  # fmt: skip
CONVNEXT = {
    "model_type": "convnext", "architectures": ["ConvNextForImageClassification"],
    "num_channels": 3, "image_size": 32, "hidden_sizes": [8, 16], "depths": [1, 1],
    "num_stages": 2, "num_labels": 5, "drop_path_rate": 0.1,
}  # fmt: skip


def _write(tmp_path: Path, config: dict[str, Any], name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(config), encoding="utf-8")
    return path


def _shapes(batch: Any) -> dict[str, tuple[int, ...]]:
    return {key: tuple(value.shape) for key, value in batch.items()}


def test_question_answering_trains_on_start_and_end_positions(tmp_path: Path) -> None:
    # BERT on SQuAD; a token-classification file's 9 labels give way to the span head's 2
    path = _write(tmp_path, {**BERT, "architectures": ["BertForQuestionAnswering"]})
    workload = config_workload(path)
    assert workload.info.task == "question-answering" and workload.layers == 1
    built = workload.build(RunConfig(precision="fp32"))
    batch = built.make_batch(2, 16)
    assert _shapes(batch) == {"input_ids": (2, 16), "start_positions": (2,), "end_positions": (2,)}
    assert int(batch["end_positions"].max()) < 16
    assert float(built.loss(built.model, batch).detach()) > 0
    assert built.infer(built.model, batch).start_logits.shape == (2, 16)
    other = _write(tmp_path, {**BERT, "architectures": ["BertForTokenClassification"],
                              "num_labels": 9}, "tok.json")  # fmt: skip
    chosen = select_workload(None, other, "question-answering")
    profile = trace_step(chosen, RunConfig(batch_size=2, seq_len=16))
    assert profile.units_per_step == 2


def test_token_classification_has_a_label_per_token(tmp_path: Path) -> None:
    labels = {str(i): f"tag{i}" for i in range(5)}
    path = _write(tmp_path, {**BERT, "architectures": ["BertForTokenClassification"],
                             "id2label": labels})  # fmt: skip
    workload = config_workload(path)
    assert workload.info.task == "token-classification"
    built = workload.build(RunConfig(precision="fp32"))
    batch = built.make_batch(2, 16)
    assert _shapes(batch) == {"input_ids": (2, 16), "labels": (2, 16)}
    assert int(batch["labels"].max()) < 5  # the classes of id2label
    assert built.infer(built.model, batch).logits.shape == (2, 16, 5)
    profile = trace_step(workload, RunConfig(batch_size=2, seq_len=16))
    assert profile.units_per_step == 2


@pytest.mark.parametrize("config", [T5, BART], ids=["t5", "bart"])
def test_seq2seq_lm_feeds_the_encoder_and_the_decoder(
    tmp_path: Path, config: dict[str, Any]
) -> None:
    workload = config_workload(_write(tmp_path, config))
    info = workload.info
    assert info.task == "seq2seq-lm" and info.throughput_unit == "tokens"
    assert workload.layers is None  # two stacks: traced whole, not extended by depth
    # T5's relative positions set no limit: its pre-training length; BART: its positions
    assert info.default_seq_len == (512 if config is T5 else 64)
    built = workload.build(RunConfig(precision="fp32"))
    batch = built.make_batch(2, 16)
    assert _shapes(batch) == {"input_ids": (2, 16), "decoder_input_ids": (2, 16), "labels": (2, 16)}
    assert float(built.loss(built.model, batch).detach()) > 0
    train = trace_step(workload, RunConfig(batch_size=2, seq_len=16))
    assert train.units_per_step == 2 * 16  # target tokens
    inference = trace_step(workload, RunConfig(mode="inference", batch_size=2, seq_len=16))
    assert inference.units_per_step == 2 * 16


@pytest.mark.parametrize("config", [VIT, CONVNEXT], ids=["vit", "convnext"])
def test_image_classification_takes_pixels_at_the_configs_size(
    tmp_path: Path, config: dict[str, Any]
) -> None:
    workload = config_workload(_write(tmp_path, config))
    info = workload.info
    assert info.task == "image-classification" and info.throughput_unit == "images"
    assert not info.is_sequence_model and info.input_desc == "3x32x32 image"
    built = workload.build(RunConfig(precision="fp32"))
    batch = built.make_batch(2, None)
    assert _shapes(batch) == {"pixel_values": (2, 3, 32, 32), "labels": (2,)}
    classes = 3 if config is VIT else 5
    assert built.infer(built.model, batch).logits.shape == (2, classes)
    # ConvNeXt reads its stochastic-depth rates back from torch.linspace as it is built, which
    # fake tensors alone cannot answer
    profile = trace_step(workload, RunConfig(batch_size=2))
    assert profile.units_per_step == 2
    assert profile.params_total == sum(p.numel() for p in built.model.parameters())
    with pytest.raises(UnsupportedWorkload, match="fixed-size 3x32x32 image inputs"):
        check_for_workload(RunConfig(seq_len=128), info)


def test_speech_seq2seq_takes_whispers_30_second_features(tmp_path: Path) -> None:
    workload = config_workload(_write(tmp_path, WHISPER))
    info = workload.info
    assert info.task == "speech-seq2seq" and info.throughput_unit == "samples"
    assert info.default_seq_len == info.max_seq_len == 64  # max_target_positions
    assert workload.layers is None
    built = workload.build(RunConfig(precision="fp32"))
    batch = built.make_batch(2, 16)
    # num_mel_bins x twice max_source_positions (3000 frames for Whisper's 1500)
    assert _shapes(batch) == {
        "input_features": (2, 8, 64), "decoder_input_ids": (2, 16), "labels": (2, 16),
    }  # fmt: skip
    assert float(built.loss(built.model, batch).detach()) > 0
    assert trace_step(workload, RunConfig(batch_size=2, seq_len=16)).units_per_step == 2
    inference = trace_step(workload, RunConfig(mode="inference", batch_size=2, seq_len=16))
    assert inference.units_per_step == 2


def test_the_task_is_read_from_the_class_or_asked_for(tmp_path: Path) -> None:
    base = _write(tmp_path, {**T5, "architectures": ["T5Model"]})
    with pytest.raises(UnsupportedWorkload, match="seq2seq-lm, image-classification or speech"):
        config_workload(base)
    chosen = config_workload(base, "seq2seq-lm")
    assert chosen.info.description.startswith("T5ForConditionalGeneration")
    with pytest.raises(UsageError, match=r"is not one of causal-lm, .* or speech-seq2seq"):
        select_workload(None, base, "translation")  # type: ignore[arg-type]
    whisper = _write(tmp_path, WHISPER, "whisper.json")
    with pytest.raises(UnsupportedWorkload, match="use --task speech-seq2seq"):
        config_workload(whisper, "seq2seq-lm")
    with pytest.raises(UnsupportedWorkload, match="shaped as Whisper's"):
        config_workload(base, "speech-seq2seq")
    # without "is_encoder_decoder", transformers' tables tell a text encoder-decoder
    unmarked = {k: v for k, v in BART.items() if k != "is_encoder_decoder"}
    assert config_workload(_write(tmp_path, unmarked, "bart.json")).info.task == "seq2seq-lm"
    # a vision-language ...ForConditionalGeneration is no encoder-decoder: it needs --task
    vlm = {"model_type": "llava", "architectures": ["LlavaForConditionalGeneration"]}
    llava = _write(tmp_path, vlm, "llava.json")
    with pytest.raises(UnsupportedWorkload, match="pass --task"):
        config_workload(llava)


def test_fit_and_predict_of_a_config_name_the_architecture(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, VIT)
    assert main(["fit", "--config", str(path), "--gpu", "h100-sxm", "--json"]) == 0
    (estimate,) = json.loads(capsys.readouterr().out)
    assert estimate["workload"].startswith("ViTForImageClassification, ")
    assert estimate["max_batch_size"] > 0
    assert main(["predict", "--config", str(path), "--gpu", "h100-sxm", "--json"]) == 0
    out = capsys.readouterr().out
    assert "ViTForImageClassification" in out and "images" in out
