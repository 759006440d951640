"""Lambda's 2020 benchmark table, and the settings whichgpu reads each of its models with.

The post (see ``data/README.md``) gives neither precisions nor sequence lengths. Each model
"comes from its authors' public repository", so each is read with the settings of that
repository's published training recipe; where the recipe is unknown the setting is fp32 at
the workload's default length. Two physical checks back the choices: at fp32 BERT Base at
512 tokens would run at 190-225 % of the GTX 1080 Ti's and RTX 2080 Ti's FP32 peaks, and
Conv. Seq2Seq at 105-124 % of the Turing cards' FP32 peaks — impossible, so those runs
were shorter (BERT) or used FP16 tensor cores (fairseq ``--fp16``). One ratio overrules a
recipe: Transformer Big ran on the GTX 1080 Ti, which has no tensor cores, at the FP32 ratio
of the RTX 2080 Ti's speed, so Lambda ran it at fp32 whatever fairseq's recipe says. These are
read off the recipes, the peaks and the cards' ratios, never tuned to make predictions agree
with the table.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from importlib import resources

from whichgpu.schema import Precision


@dataclass(frozen=True)
class LambdaModel:
    """A model of the table: the workload that stands for it and how it was run."""

    workload: str
    """whichgpu workload."""
    power_of_two: bool
    """Its largest batches are compared on powers of two (else on its column's values)."""
    precision: Precision = "fp32"
    """Precision of the run."""
    seq_len: int | None = None
    """Sequence length (None: the workload's default)."""
    why: str = "no recipe detail known: fp32 at the workload's defaults"
    """Where the settings come from."""
    framework: str = "unknown"
    """The framework of the code Lambda ran: each model "comes from its authors' public
    repository" (the post), so the authors' repository's."""
    unreadable_throughput: str | None = None
    """Why the table's throughputs of this model cannot be read as a run of the workload
    (None: they can); its rows are then left out of the throughput fit and validation, and
    its largest batches still compared."""

    @property
    def batches_set_by_hand(self) -> bool:
        """Whether the column's batches are round values set by hand rather than a search:
        the token columns (2000, 3584 — fairseq's recipe value —, 4000, 8000, 16000) and BERT
        fine-tuning (6 on both the 8 GB and the 11 GB cards). A larger batch than such a
        value may fit, so a prediction above it is not shown to be too high."""
        return not self.power_of_two

    def settings(self, name: str) -> str:
        """``name: precision[, N tokens]``, as the validations print it."""
        length = f", {self.seq_len} tokens" if self.seq_len else ""
        return f"{name}: {self.precision}{length}"


_FAIRSEQ_FP16 = (
    "fairseq's WMT en-de recipes train with --fp16 (examples/scaling_nmt), traced as its "
    "FP16Optimizer: an fp16 model with a flat fp32 master copy; at fp32 the measured words/s "
    "would exceed the Turing cards' FP32 peak (Conv. Seq2Seq: 105-124 %)"
)

_TRANSFORMER_FP32 = (
    "the table itself says fp32, though fairseq's recipe says --fp16: at the same 4000 "
    "tokens the GTX 1080 Ti (no tensor cores) ran it at 0.80 of the RTX 2080 Ti's words/s, "
    "the two cards' FP32 ratio (11.3 / 13.4 TFLOPS = 0.84), where Conv. Seq2Seq, run with "
    "FP16, ran at 0.37; on FP16 tensor cores the 2080 Ti's matrix work would run up to 4.8x "
    "faster than the 1080 Ti's (53.8 against 11.3 TFLOPS). "
    "Its measured FLOP rate follows the FP32 peak on every card (59-81 %), as the fp32 image "
    "models' do"
)

_TF_MODELS = "TensorFlow (tensorflow/models)"
_FAIRSEQ = "PyTorch (pytorch/fairseq)"
_GOOGLE_BERT = "TensorFlow (google-research/bert)"

LAMBDA_MODELS = {
    "NasNet Large": LambdaModel("nasnet-large", True, framework=_TF_MODELS),
    "DeepLabv3": LambdaModel("deeplabv3", True, framework=_TF_MODELS),
    "Yolo v3": LambdaModel("yolov3", True, framework="Darknet (pjreddie/darknet)"),
    "Pix2Pix HD": LambdaModel("pix2pixhd", True, framework="PyTorch (NVIDIA/pix2pixHD)"),
    "StyleGAN": LambdaModel("stylegan", True, framework="TensorFlow (NVlabs/stylegan)"),
    "MaskRCNN": LambdaModel(
        "maskrcnn",
        True,
        framework="unknown (the authors' Detectron is Caffe2, their maskrcnn-benchmark PyTorch)",
    ),
    "Transformer Big": LambdaModel(
        "transformer-big", False, why=_TRANSFORMER_FP32, framework=_FAIRSEQ
    ),
    "Conv. Seq2Seq": LambdaModel("convs2s", False, "fp16", why=_FAIRSEQ_FP16, framework=_FAIRSEQ),
    "unsupMT": LambdaModel(
        "unsupmt",
        False,
        framework=(
            "PyTorch (Lample et al.'s unsupervised MT: facebookresearch/UnsupervisedMT or its "
            "successor XLM, which the workload models; the post's link is not in the copy kept)"
        ),
    ),
    "BERT Base": LambdaModel(
        "bert-base",
        True,
        seq_len=128,
        why=(
            "google-research/bert pre-trains at max_seq_length 128 for 90 % of the steps "
            "(README, 'Pre-training tips'); at 512 the measured rate would be 190-225 % of the "
            "FP32 peak"
        ),
        framework=_GOOGLE_BERT,
    ),
    "BERT Finetune": LambdaModel(
        "bert-squad",
        False,
        why="google-research/bert run_squad recipe: 384 tokens, fp32",
        framework=_GOOGLE_BERT,
    ),
    "MT-DNN": LambdaModel(
        "mt-dnn",
        True,
        why="namisan/mt-dnn recipe: 512 tokens, fp32",
        framework="PyTorch (namisan/mt-dnn)",
        unreadable_throughput=(
            "namisan/mt-dnn pads each batch to its longest example (mt_dnn/batcher.py), so the "
            "work per example was set by GLUE's sentence lengths, not by the 512 tokens that "
            "bound its memory; those lengths are not known here"
        ),
    ),
}
"""Lambda's model names, the workloads that stand for them, and their settings."""


def lambda_rows() -> list[dict[str, str]]:
    """The shipped transcription of the table (``data/lambda2020.csv``)."""
    ref = resources.files("whichgpu.validate").joinpath("data").joinpath("lambda2020.csv")
    with ref.open(encoding="utf-8") as fh:
        return list(csv.DictReader(fh))
