"""The user's own model, from a Hugging Face ``config.json`` (random weights, no download)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from whichgpu.errors import UnsupportedWorkload, UsageError
from whichgpu.schema import RunConfig, WorkloadInfo
from whichgpu.workloads.base import BuiltWorkload, Workload
from whichgpu.workloads.hf import build_hf_model, loss_from_output, model_device, token_batch

Task = Literal["causal-lm", "seq-cls", "masked-lm"]
TASK_CLASS_SUFFIX: dict[str, str] = {
    "causal-lm": "ForCausalLM",
    "seq-cls": "ForSequenceClassification",
    "masked-lm": "ForMaskedLM",
}
DEFAULT_SEQ_LEN = 2048


def _task_of(architecture: str) -> Task:
    for task, suffix in TASK_CLASS_SUFFIX.items():
        if architecture.endswith(suffix):
            return task  # type: ignore[return-value]
    raise UnsupportedWorkload(
        f"Cannot tell the task of '{architecture}'; pass --task causal-lm, seq-cls or masked-lm."
    )


def config_workload(path: Path, task: Task | None = None) -> Workload:
    """A workload built from the user's config file."""
    try:
        config: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"Cannot read --config {path}: {exc.strerror}.") from exc
    except json.JSONDecodeError as exc:
        raise UsageError(f"--config {path} is not valid JSON: {exc}.") from exc
    if "model_type" not in config:
        raise UsageError(f"--config {path} has no 'model_type'; is it a Hugging Face config.json?")
    architectures = list(config.get("architectures") or [])
    if task is not None:
        stem = architectures[0] if architectures else ""
        base = next((stem[: -len(s)] for s in TASK_CLASS_SUFFIX.values() if stem.endswith(s)), stem)
        if not base:
            raise UsageError(f"--config {path} names no 'architectures'; it is needed with --task.")
        architectures = [base + TASK_CLASS_SUFFIX[task]]
    elif not architectures:
        raise UsageError(f"--config {path} names no 'architectures'; pass --task to choose.")
    resolved_task = task or _task_of(architectures[0])
    config = {**config, "architectures": architectures}
    vocab = int(config.get("vocab_size", 0))
    if vocab <= 0:
        raise UsageError(f"--config {path} has no 'vocab_size'.")

    def build(run: RunConfig) -> BuiltWorkload:
        import torch

        model = build_hf_model(config, run)
        lm_batch = token_batch(vocab)

        def make_batch(batch_size: int, seq_len: int | None) -> dict[str, Any]:
            if resolved_task == "causal-lm":
                return lm_batch(model, batch_size, seq_len)
            seq = seq_len or DEFAULT_SEQ_LEN
            device = model_device(model)
            ids = torch.randint(0, vocab, (batch_size, seq), device=device)
            if resolved_task == "masked-lm":
                return {"input_ids": ids, "labels": ids}
            labels = torch.randint(
                0, int(config.get("num_labels", 2)), (batch_size,), device=device
            )
            return {"input_ids": ids, "labels": labels}

        return BuiltWorkload(
            model=model,
            make_batch=make_batch,
            loss=loss_from_output,
            units_per_sample=lambda seq_len: (
                int(seq_len or DEFAULT_SEQ_LEN) if resolved_task == "causal-lm" else 1
            ),
        )

    info = WorkloadInfo(
        name=str(path),
        family="user",
        task=resolved_task,
        description=f"{architectures[0]} from {path.name}",
        input_desc="a sequence of token ids",
        throughput_unit="tokens" if resolved_task == "causal-lm" else "sequences",
        default_batch_size=1,
        default_seq_len=min(
            int(config.get("max_position_embeddings", DEFAULT_SEQ_LEN)), DEFAULT_SEQ_LEN
        ),
        is_sequence_model=True,
    )
    return Workload(info=info, build=build)
