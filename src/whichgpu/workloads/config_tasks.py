"""The tasks a ``--config`` model is built for: the ``transformers`` class of each, the synthetic
batch a step takes and what a sample counts as.

The task names follow ``transformers``' pipelines and auto classes; each builds the class
``AutoModelFor…`` takes for it and trains on random inputs and targets of its shapes:

* ``causal-lm`` (``…ForCausalLM``, ``…LMHeadModel``): token ids, labels the same ids;
* ``seq-cls`` (``…ForSequenceClassification``): token ids, a class label per sequence;
* ``masked-lm`` (``…ForMaskedLM``; ``…ForPreTraining`` with its next-sentence label): token
  ids, labels the same ids;
* ``question-answering`` (``…ForQuestionAnswering``): token ids, an answer's start and end;
* ``token-classification`` (``…ForTokenClassification``): token ids, a class label per token;
* ``seq2seq-lm`` (``…ForConditionalGeneration`` of a text encoder-decoder: T5, BART): source
  ids, decoder ids and target labels;
* ``image-classification`` (``…ForImageClassification``: ViT, ConvNeXt): pixels of
  ``num_channels`` x ``image_size`` x ``image_size``, a class label per image;
* ``speech-seq2seq`` (``WhisperForConditionalGeneration``): log-mel features of
  ``num_mel_bins`` x ``2 * max_source_positions`` frames (3000: 30 s of audio), decoder ids and
  transcript labels.

Class labels run over ``id2label`` (else ``num_labels``, else 2).

Sequence lengths. An encoder-decoder's source and target both have ``seq_len`` tokens, as the
named translation workloads have theirs, and its throughput is counted in target tokens. Whisper's
audio is always the 30-second window its encoder takes; ``seq_len`` is the transcript's length
(at most ``max_target_positions``, its default).

Nothing here imports torch at module import; the batch makers do, when a model is built.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from whichgpu.errors import UnsupportedWorkload, UsageError
from whichgpu.schema import ThroughputUnit
from whichgpu.workloads.base import Batch
from whichgpu.workloads.hf import max_positions, model_device, token_batch

if TYPE_CHECKING:
    import torch

Task = Literal[
    "causal-lm",
    "seq-cls",
    "masked-lm",
    "question-answering",
    "token-classification",
    "seq2seq-lm",
    "image-classification",
    "speech-seq2seq",
]
CONDITIONAL_GENERATION = "ForConditionalGeneration"
TASK_CLASS_SUFFIX: dict[str, str] = {
    "causal-lm": "ForCausalLM",
    "seq-cls": "ForSequenceClassification",
    "masked-lm": "ForMaskedLM",
    "question-answering": "ForQuestionAnswering",
    "token-classification": "ForTokenClassification",
    "seq2seq-lm": CONDITIONAL_GENERATION,
    "image-classification": "ForImageClassification",
    "speech-seq2seq": CONDITIONAL_GENERATION,
}
"""The class-name ending of each task in ``transformers`` (``LlamaForCausalLM``). Two tasks share
``…ForConditionalGeneration``: the config tells them apart (``task_of``)."""
OLDER_CLASS_SUFFIX: dict[str, Task] = {"LMHeadModel": "causal-lm", "ForPreTraining": "masked-lm"}
"""Endings of other model classes with one of the tasks (``GPT2LMHeadModel``, which has no
``…ForCausalLM`` twin; ``BertForPreTraining``, masked-language modelling with BERT's
next-sentence head, trained on both)."""
AUTO_MAPPINGS: dict[str, str] = {
    "causal-lm": "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
    "seq-cls": "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
    "masked-lm": "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
    "question-answering": "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES",
    "token-classification": "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES",
    "seq2seq-lm": "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
    "image-classification": "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",
    "speech-seq2seq": "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES",
}
"""transformers' tables of the class each model type uses for a task."""
TARGET_KEYS = ("labels", "start_positions", "end_positions", "next_sentence_label")
"""Batch items that are training targets, left out of an inference step."""

DEFAULT_SEQ_LEN = 2048
"""Default sequence length of a text model, or its position limit when shorter."""
DEFAULT_SEQ2SEQ_LEN = 512
"""Default source and target length of an encoder-decoder without a position limit (T5's
relative positions): the length T5 was pre-trained at (Raffel et al. 2020, section 3.1.2)."""
DEFAULT_IMAGE_SIZE = 224
WHISPER_SOURCE_POSITIONS = 1500
"""Whisper's encoder positions when a config leaves them out; the encoder's convolutions halve
the frames, so it takes twice as many (3000 frames of 10 ms: 30 s of audio)."""
WHISPER_TARGET_POSITIONS = 448


def task_choices() -> str:
    """The task names, for messages: ``causal-lm, seq-cls, … or speech-seq2seq``."""
    names = list(TASK_CLASS_SUFFIX)
    return f"{', '.join(names[:-1])} or {names[-1]}"


def _auto_names(task: str) -> Mapping[str, str | tuple[str, ...]]:
    """transformers' table of ``task``'s class per model type (empty without transformers)."""
    try:
        from transformers.models.auto import modeling_auto
    except ImportError:  # fit --fast without transformers
        return {}
    names: Mapping[str, str | tuple[str, ...]] = getattr(modeling_auto, AUTO_MAPPINGS[task], {})
    return names


def _in_auto_table(architecture: str, task: str) -> bool:
    for value in _auto_names(task).values():
        if architecture == value or (isinstance(value, tuple) and architecture in value):
            return True
    return False


def task_of(architecture: str, config: Mapping[str, Any]) -> Task | None:
    """The task ``architecture`` does, from its name; a ``…ForConditionalGeneration`` class is
    Whisper-like speech recognition when the config has ``num_mel_bins``, a text encoder-decoder
    when it says ``is_encoder_decoder`` (as T5's, BART's and Whisper's own files do), else as
    transformers lists the class (which imports it); a vision-language one is neither."""
    if architecture.endswith(CONDITIONAL_GENERATION):
        if "num_mel_bins" in config:
            return "speech-seq2seq"
        if config.get("is_encoder_decoder") is True:
            return "seq2seq-lm"
        for task in ("speech-seq2seq", "seq2seq-lm"):
            if _in_auto_table(architecture, task):
                return task
        return None
    for task, suffix in TASK_CLASS_SUFFIX.items():
        if architecture.endswith(suffix):
            return task  # type: ignore[return-value]
    for suffix, older_task in OLDER_CLASS_SUFFIX.items():
        if architecture.endswith(suffix):
            return older_task
    return None


def class_for(architecture: str, task: Task, config: Mapping[str, Any]) -> str:
    """The class of ``architecture``'s model family for ``task``: itself when it already does
    that task, else the class transformers' auto classes take for the config's model type and
    the task (``gpt2`` causal LM: ``GPT2LMHeadModel``), else its stem (before ``For…``, or a
    base ``…Model``) with the task's ending."""
    if task_of(architecture, config) == task:
        return architecture
    found = _auto_names(task).get(str(config.get("model_type")))
    if isinstance(found, tuple):  # DeiT: the plain head first, then the one with a teacher
        found = found[0] if found else None
    if found:
        return found
    if "For" in architecture:
        stem = architecture[: architecture.rindex("For")]
    else:
        stem = architecture.removesuffix("LMHeadModel").removesuffix("Model") or architecture
    return stem + TASK_CLASS_SUFFIX[task]


def num_labels(config: Mapping[str, Any]) -> int:
    """The classes of a classification head, as transformers counts them: ``id2label``'s
    entries, else ``num_labels``, else its default of 2."""
    named = config.get("id2label")
    if isinstance(named, dict) and named:
        return len(named)
    count = config.get("num_labels")
    return count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else 2


def image_shape(config: Mapping[str, Any]) -> tuple[int, int, int]:
    """Channels, height and width of an image classifier's input: ``num_channels`` (3) and
    ``image_size`` (224; a number, or height and width)."""
    channels = config.get("num_channels", 3)
    size = config.get("image_size", DEFAULT_IMAGE_SIZE)
    sides = size if isinstance(size, list | tuple) else [size, size]
    values = [channels, *sides]
    if len(values) != 3 or not all(
        isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values
    ):
        raise UsageError(
            f"'image_size' ({size!r}) and 'num_channels' ({channels!r}) must be whole numbers "
            "from 1 up (image_size: one number, or height and width)."
        )
    return values[0], values[1], values[2]


def whisper_frames(config: Mapping[str, Any]) -> tuple[int, int]:
    """Mel bins and frames of Whisper's ``input_features``: ``num_mel_bins`` (80) by twice
    ``max_source_positions`` (1500: 3000 frames, 30 s of audio); the encoder takes no other
    length."""
    return (
        int(config.get("num_mel_bins", 80)),
        2 * int(config.get("max_source_positions", WHISPER_SOURCE_POSITIONS)),
    )


@dataclass(frozen=True)
class TaskShape:
    """What a task's sample is: the ``WorkloadInfo`` fields that depend on the task."""

    input_desc: str
    throughput_unit: ThroughputUnit
    is_sequence_model: bool
    default_seq_len: int | None
    max_seq_len: int | None
    needs_vocab: bool
    """Whether the batch holds token ids (the config must give ``vocab_size``)."""
    two_stacks: bool = False
    """An encoder and a decoder: no one layer count to trace fewer layers by."""


def task_shape(task: Task, config: Mapping[str, Any]) -> TaskShape:
    """The input, throughput unit and sequence lengths of ``task`` for ``config``."""
    limit = max_positions(dict(config))
    if task == "image-classification":
        channels, height, width = image_shape(config)
        return TaskShape(
            f"{channels}x{height}x{width} image", "images", False, None,
            None, needs_vocab=False,
        )  # fmt: skip
    if task == "speech-seq2seq":
        bins, frames = whisper_frames(config)
        target = int(config.get("max_target_positions", WHISPER_TARGET_POSITIONS))
        return TaskShape(
            f"{bins} mel bins x {frames} frames of audio features (a 30 s window) and a "
            "transcript of seq_len tokens",
            "samples", True, target, target, needs_vocab=True, two_stacks=True,
        )  # fmt: skip
    if task == "seq2seq-lm":
        return TaskShape(
            "a source sequence of token ids and a target sequence of as many",
            "tokens", True, min(limit or DEFAULT_SEQ2SEQ_LEN, DEFAULT_SEQ_LEN), limit,
            needs_vocab=True, two_stacks=True,
        )  # fmt: skip
    inputs = {
        "question-answering": "a sequence of token ids with an answer's start and end",
        "token-classification": "a sequence of token ids with a class label per token",
    }
    return TaskShape(
        inputs.get(task, "a sequence of token ids"),
        "tokens" if task == "causal-lm" else "sequences",
        True, min(limit or DEFAULT_SEQ_LEN, DEFAULT_SEQ_LEN), limit, needs_vocab=True,
    )  # fmt: skip


def task_config(task: Task, config: Mapping[str, Any]) -> dict[str, Any]:
    """The config as ``task``'s class is built from it: a question-answering head gives two
    logits a token (start and end), whatever labels the file names for another head."""
    if task != "question-answering":
        return dict(config)
    labels = ("id2label", "label2id", "num_labels")
    return {**{k: v for k, v in config.items() if k not in labels}, "num_labels": 2}


def check_task(path: object, task: Task, config: Mapping[str, Any]) -> None:
    """Refuse a task the config's model cannot be fed for, saying which would do."""
    if task == "speech-seq2seq" and config.get("model_type") != "whisper":
        raise UnsupportedWorkload(
            f"--config {path}: speech-seq2seq inputs are shaped as Whisper's (log-mel features "
            f"of num_mel_bins x 3000 frames); a {config.get('model_type')} model takes others."
        )
    if task == "seq2seq-lm" and "num_mel_bins" in config:
        raise UnsupportedWorkload(
            f"--config {path} is a speech model (it has num_mel_bins); use --task speech-seq2seq."
        )


MakeBatch = Callable[[int, int | None], dict[str, Any]]


def batch_maker(
    task: Task, config: Mapping[str, Any], architecture: str, model: torch.nn.Module
) -> MakeBatch:
    """``make_batch(batch_size, seq_len)`` of ``task``: random inputs and targets of the
    task's shapes on the model's device (floating-point inputs in the weights' dtype)."""
    import torch

    vocab = int(config.get("vocab_size", 0))
    shape = task_shape(task, config)

    def ids(batch_size: int, seq: int) -> torch.Tensor:
        return torch.randint(0, vocab, (batch_size, seq), device=model_device(model))

    def labels(*size: int) -> torch.Tensor:
        return torch.randint(0, num_labels(config), size, device=model_device(model))

    def features(*size: int) -> torch.Tensor:
        dtype = next(model.parameters()).dtype
        return torch.randn(*size, device=model_device(model), dtype=dtype)

    if task == "causal-lm":
        lm = token_batch(vocab)
        return lambda batch_size, seq_len: lm(model, batch_size, seq_len)
    if task == "image-classification":
        channels, height, width = image_shape(config)
        return lambda batch_size, seq_len: {
            "pixel_values": features(batch_size, channels, height, width),
            "labels": labels(batch_size),
        }

    def make(batch_size: int, seq_len: int | None) -> dict[str, Any]:
        seq = seq_len or shape.default_seq_len or DEFAULT_SEQ_LEN
        if task == "speech-seq2seq":
            bins, frames = whisper_frames(config)
            return {
                "input_features": features(batch_size, bins, frames),
                "decoder_input_ids": ids(batch_size, seq),
                "labels": ids(batch_size, seq),
            }
        tokens = ids(batch_size, seq)
        if task == "seq2seq-lm":  # as a seq2seq collator gives them: decoder ids and labels
            decoder = ids(batch_size, seq)
            return {
                "input_ids": tokens,
                "decoder_input_ids": decoder,
                "labels": ids(batch_size, seq),
            }
        if task == "question-answering":
            start = torch.randint(0, seq, (batch_size,), device=tokens.device)
            end = torch.clamp(start + 3, max=seq - 1)
            return {"input_ids": tokens, "start_positions": start, "end_positions": end}
        if task == "token-classification":
            return {"input_ids": tokens, "labels": labels(batch_size, seq)}
        if task == "masked-lm":
            if architecture.endswith("ForPreTraining"):  # and its next-sentence head
                pairs = torch.randint(0, 2, (batch_size,), device=tokens.device)
                return {"input_ids": tokens, "labels": tokens, "next_sentence_label": pairs}
            return {"input_ids": tokens, "labels": tokens}
        return {"input_ids": tokens, "labels": labels(batch_size)}

    return make


def inference_forward(model: torch.nn.Module, batch: Batch) -> Any:
    """An inference step: the model on the batch without its targets (``TARGET_KEYS``). An
    encoder-decoder runs its encoder and its decoder over the whole target at once (teacher
    forcing, as when scoring), not token by token."""
    return model(**{k: v for k, v in batch.items() if k not in TARGET_KEYS})


class _HostNumbers:
    """Numbers a model's constructor computes with ``torch.linspace(…, device="cpu")`` only to
    read them back as Python floats: the stochastic-depth rate of each block of ConvNeXt, Swin,
    BEiT … (``[x.item() for x in torch.linspace(0, rate, depth, device="cpu")]``, or
    ``.split(depths)`` then ``.tolist()``). Under fake tensors those reads have no values; this
    holds the real ones and answers the reads (``item``, ``tolist``, iteration, ``split``)."""

    def __init__(self, values: list[float]) -> None:
        self.values = values

    def item(self) -> float:
        (value,) = self.values
        return value

    def tolist(self) -> list[float]:
        return list(self.values)

    def __len__(self) -> int:
        return len(self.values)

    def __iter__(self) -> Iterator[_HostNumbers]:
        return (_HostNumbers([value]) for value in self.values)

    def split(self, sizes: int | Sequence[int]) -> list[_HostNumbers]:
        if isinstance(sizes, int):
            sizes = [sizes] * -(-len(self.values) // sizes) if sizes > 0 else []
        chunks, start = [], 0
        for size in sizes:
            chunks.append(_HostNumbers(self.values[start : start + size]))
            start += size
        return chunks


@contextmanager
def host_linspace() -> Iterator[None]:
    """While a model is built under fake tensors, ``torch.linspace(…, device="cpu")`` gives its
    numbers (``_HostNumbers``), computed for real: transformers' vision models build their
    stochastic-depth rates so and read them back, which fake tensors cannot answer. Elsewhere,
    and for any other ``linspace``, nothing changes."""
    import torch
    from torch._guards import active_fake_mode
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    if active_fake_mode() is None:
        yield
        return
    linspace = torch.linspace

    def numbers(*args: Any, **kwargs: Any) -> Any:
        if str(kwargs.get("device")) != "cpu" or kwargs.get("requires_grad"):
            return linspace(*args, **kwargs)
        with unset_fake_temporarily():
            return _HostNumbers(linspace(*args, **kwargs).tolist())

    torch.linspace = numbers
    try:
        yield
    finally:
        torch.linspace = linspace
