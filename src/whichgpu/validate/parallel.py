"""Published tensor- and pipeline-parallel training throughput against ``predict``: each
usable row of ``data/parallel/published.csv`` (NVIDIA's NeMo and Megatron-Bridge tables of
Llama 3 pre-training: GPUs, TP, PP, virtual pipeline, micro-batch, global batch, sequence
length, precision and the tokens/s per GPU reached) is asked of ``predict`` with the same split
(timed as if it fitted where ``fit`` refuses it, ``timing.predict_even_if_unfit``), and the
tokens/s per GPU compared (error positive: predicted faster); rows whose settings whichgpu does
not model (no micro-batch or tokens/s stated, lengths beyond the model's positions) are listed
with the reason they are left out. Expert-parallel rows (Mixtral) run ``expert_parallel``.
Megatron's distributed optimizer shards
optimizer state and master weights and reduces the whole gradients once a step (ZeRO-1:
``zero1``); rows whose notes say FSDP is on run as ``fsdp``; tensor parallel's exchanges
overlap the matrix products (``tensor_parallel_overlap``), as NVIDIA's performance recipes
set. Megatron-Core runs Transformer
Engine's fused kernels for the work between the matrix products (normalisation fused into the
next linear layer with its fp8 cast, fused rotary embedding, SwiGLU and cross-entropy), so the
rows are predicted as compiled steps (``compile=True``: the same non-matrix work fused into
kernels that read their inputs once, ``estimate.compiled``), the nearest whichgpu models. The
folder's README says where each row comes from and how it is read.
"""

from __future__ import annotations

import csv
import functools
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from whichgpu.errors import WhichGpuError
from whichgpu.schema import ReferenceThroughputCase, RunConfig
from whichgpu.validate.timing import UNFIT_NOTE, predict_even_if_unfit
from whichgpu.workloads import run_config

SOURCE = "parallel"
"""The reference's id in ``validate`` results."""

DATA_DIR = "parallel"
"""Folder of the table, under ``validate/data``."""

TABLE_FILE = "published.csv"
"""The transcribed measurements."""

QUANTITY = "tokens/s per GPU"
"""What the rows measure, as the views name it."""

UNMODELLED_GPUS: dict[str, str] = {}
"""Catalog GPUs whose rows are left out, and why (none: GB200 NVL72's 72-GPU NVLink domain is
the catalog's ``interconnect_domain_gpus``)."""

TFLOPS_ONLY_MICRO_BATCH = 1
"""The micro-batch of the rows that publish TFLOP/s but no micro-batch (NVIDIA's long-sequence
study, ``nemo-longseq-25.04rc2``): at 1,024K tokens its global batch of 4 over 4 data-parallel
copies leaves one sequence a step on each, and one is taken for every row of the table."""

WHOLE_ATTENTION_SOURCES = ("nemo-",)
"""Sources whose model TFLOP/s count attention's score blocks whole, causal or not (NeMo's
``llama3`` FLOPs formula before Megatron-Bridge halved the term): every NeMo row that gives
both tokens/s and TFLOP/s has exactly that ratio (``tests/validate``), Megatron-Bridge's
rows the halved one. A row of these sources that gives only TFLOP/s is read as tokens/s
through the same count (``ParallelRow.measured_tokens_per_s``)."""

_FSDP_ON = re.compile(r"\bFSDP(?:=(?!0\b)\d+| on\b| over\b)")
"""Notes that say FSDP is on (``FSDP=1``, ``FSDP=64``, ``FSDP on``, ``FSDP over 64 GPUs``;
``FSDP=0`` is off)."""


@dataclass(frozen=True)
class ParallelRow:
    """One published measurement (a row of ``published.csv``); empty cells are None."""

    source_id: str
    """Short name of the publication (the README lists each with its URL)."""
    source_date: str
    """Year and month of the software release."""
    software: str
    """Container and framework."""
    model: str
    """The whichgpu workload that stands for the model."""
    gpu: str
    """Catalog id of the GPU."""
    gpus: int
    """GPUs of the run."""
    tp: int
    """Tensor-parallel size."""
    pp: int
    """Pipeline-parallel size."""
    cp: int | None
    """Context-parallel size."""
    vp: int | None
    """Virtual pipeline stages (interleaved 1F1B chunks)."""
    ep: int | None
    """Expert-parallel size."""
    dp: int
    """Data-parallel size."""
    micro_batch: int | None
    """Sequences per micro-batch."""
    global_batch: int
    """Sequences per optimizer step."""
    seq_len: int
    """Tokens per sequence."""
    precision: str
    """``fp8`` or ``bf16``."""
    checkpointing: str
    """Activation recomputation as stated (``unstated`` on every row)."""
    tokens_per_s_per_gpu: float | None
    """Published tokens/s per GPU."""
    model_tflops_per_gpu: float | None
    """Published model TFLOP/s per GPU (FLOP count per token not stated)."""
    notes: str
    """What else the publication states about the run."""

    def measured_tokens_per_s(self) -> float | None:
        """The tokens/s per GPU the row gives, or, for a source whose TFLOP/s count is known
        (``WHOLE_ATTENTION_SOURCES``), its TFLOP/s per GPU over that count's FLOPs per token;
        None where it gives neither."""
        if self.tokens_per_s_per_gpu is not None:
            return self.tokens_per_s_per_gpu
        if self.model_tflops_per_gpu is None or not self.source_id.startswith(
            WHOLE_ATTENTION_SOURCES
        ):
            return None
        return self.model_tflops_per_gpu * 1e12 / _whole_attention_flops(self.model, self.seq_len)

    @property
    def derived(self) -> bool:
        """Whether ``measured_tokens_per_s`` is read from the published TFLOP/s."""
        return self.tokens_per_s_per_gpu is None and self.measured_tokens_per_s() is not None

    def micro_batch_run(self) -> int | None:
        """The micro-batch predicted: the row's, or ``TFLOPS_ONLY_MICRO_BATCH`` for a row whose
        tokens/s is read from its TFLOP/s."""
        if self.micro_batch is None and self.derived:
            return TFLOPS_ONLY_MICRO_BATCH
        return self.micro_batch

    @property
    def model_parallel(self) -> bool:
        """Whether the row splits a micro-batch (TP, PP or CP above 1)."""
        return self.tp > 1 or self.pp > 1 or (self.cp or 1) > 1

    @property
    def layout(self) -> str:
        """The split in a few characters: ``TP4 PP8 VP5 DP2``, ``DP8``."""
        parts = [f"TP{self.tp}"] if self.tp > 1 else []
        parts += [f"PP{self.pp}"] if self.pp > 1 else []
        parts += [f"VP{self.vp}"] if (self.vp or 1) > 1 else []
        parts += [f"CP{self.cp}"] if (self.cp or 1) > 1 else []
        parts += [f"EP{self.ep}"] if (self.ep or 1) > 1 else []
        return " ".join([*parts, f"DP{self.dp}"])

    @property
    def case(self) -> str:
        """How the views name the row."""
        return f"{self.source_id} {self.model} {self.layout}"

    @property
    def sharding(self) -> str:
        """``fsdp`` where the notes say FSDP is on, else ``zero1`` (Megatron's distributed
        optimizer, ZeRO-1: whichgpu's nearest strategy)."""
        return "fsdp" if _FSDP_ON.search(self.notes) else "zero1"

    def grad_accum(self) -> int | None:
        """Micro-batches per optimizer step on each data-parallel copy: global batch / (micro-
        batch x DP); None where that is not a whole number or no micro-batch is given."""
        micro = self.micro_batch_run()
        if micro is None:
            return None
        per_step = micro * self.dp
        if self.global_batch % per_step:
            return None
        return self.global_batch // per_step

    def left_out_reasons(self) -> list[str]:
        """Why the row is not compared (empty: it is)."""
        from whichgpu.catalog import load_catalog
        from whichgpu.workloads import get_workload

        why = []
        positions: int | None = None
        try:
            positions = get_workload(self.model).info.max_seq_len
        except WhichGpuError:
            why.append(f"{self.model} is not a whichgpu workload")
        if self.gpu in UNMODELLED_GPUS:
            why.append(UNMODELLED_GPUS[self.gpu])
        else:
            try:
                load_catalog().resolve(self.gpu)
            except WhichGpuError:
                why.append(f"{self.gpu} is not in the GPU catalog")
        if self.precision not in ("fp8", "bf16"):
            why.append(f"precision {self.precision} is not compared")
        if self.micro_batch_run() is None:
            why.append("no micro-batch stated")
        if self.measured_tokens_per_s() is None:
            why.append("no tokens/s per GPU published")
        if positions is not None and self.seq_len > positions:
            why.append(
                f"{self.seq_len:,} tokens are beyond {self.model}'s {positions:,} positions (the "
                "run extended them)"
            )
        cp = self.cp or 1
        if self.dp * self.tp * self.pp * cp != self.gpus:
            why.append(
                f"DP{self.dp} x TP{self.tp} x PP{self.pp} x CP{cp} is not the {self.gpus} GPUs"
            )
        elif self.micro_batch_run() is not None and self.grad_accum() is None:
            why.append(
                f"global batch {self.global_batch} / (micro-batch {self.micro_batch_run()} x "
                f"DP{self.dp}) is not a whole number of micro-batches"
            )
        return why

    def run(self) -> RunConfig:
        """The training run ``predict`` is asked about (a usable row only)."""
        return run_config(
            mode="train",
            gpus=self.gpus,
            tensor_parallel=self.tp,
            pipeline_parallel=self.pp,
            virtual_stages=self.vp or 1,
            context_parallel=self.cp or 1,
            expert_parallel=self.ep or 1,
            # NVIDIA's performance recipes overlap tensor parallel's exchanges (the README)
            tensor_parallel_overlap=self.tp > 1,
            grad_accum=self.grad_accum(),
            batch_size=self.micro_batch_run(),
            seq_len=self.seq_len,
            precision=self.precision,
            sharding=self.sharding,
            compile=True,  # Transformer Engine's fused kernels (the module's docstring)
        )

    def settings(self) -> str:
        """The settings predicted, in words, for the note."""
        return (
            f"{self.gpus} GPUs, {self.layout}, micro-batch {self.micro_batch_run()}, grad_accum "
            f"{self.grad_accum()}, L{self.seq_len}, {self.precision}, {self.sharding}, fused "
            "kernels as --compile"
            + (EXPERTS_NOTE if (self.ep or 1) > 1 and self.precision == "fp8" else "")
        )


EXPERTS_NOTE = (
    "; the experts' grouped products in bf16 (whichgpu's fp8 is torchao's Float8Linear, which "
    "converts linear layers only; Transformer Engine runs them in fp8)"
)
"""The note of an expert-parallel fp8 row: what whichgpu runs at bf16 that the row ran in
fp8."""


DERIVED_NOTE = (
    "tokens/s read from the published TFLOP/s per GPU with NeMo's count of model FLOPs "
    "(attention counted whole); micro-batch not stated, taken as 1"
)
"""The note of a row whose tokens/s is read from its TFLOP/s."""


def model_flops_per_token(config: Mapping[str, Any], seq_len: int, *, causal: bool) -> float:
    """Model FLOPs of one trained token of a Llama-shaped model at ``seq_len`` as NVIDIA's
    performance tables count them (NeMo's and Megatron-Bridge's ``llama3`` formula, forward
    and backward): ``layers x hidden^2 x (12 + 12 kv_heads / heads + 18 ffn / hidden +
    12 seq_len / hidden x (1/2 if causal) + 6 vocab / (layers x hidden))``."""
    hidden, layers = int(config["hidden_size"]), int(config["num_hidden_layers"])
    heads = int(config["num_attention_heads"])
    kv = int(config.get("num_key_value_heads", heads))
    attention = 12 * seq_len / hidden * (0.5 if causal else 1.0)
    return float(
        layers
        * hidden
        * hidden
        * (
            12
            + 12 * kv / heads
            + 18 * int(config["intermediate_size"]) / hidden
            + attention
            + 6 * int(config["vocab_size"]) / (layers * hidden)
        )
    )


@functools.cache
def _whole_attention_flops(model: str, seq_len: int) -> float:
    """``model_flops_per_token`` of a workload's shipped config, attention counted whole (read
    once per model and length)."""
    from whichgpu.workloads.hf import read_config

    return model_flops_per_token(read_config(model), seq_len, causal=False)


def _int(text: str) -> int | None:
    return int(text) if text.strip() else None


def _float(text: str) -> float | None:
    return float(text) if text.strip() else None


def _required(text: str) -> int:
    value = _int(text)
    if value is None:
        raise ValueError("a required count is empty")
    return value


def parallel_rows() -> list[ParallelRow]:
    """Every row of the shipped table."""
    ref = resources.files("whichgpu.validate").joinpath("data").joinpath(DATA_DIR)
    with ref.joinpath(TABLE_FILE).open(encoding="utf-8") as fh:
        return [
            ParallelRow(
                source_id=r["source"],
                source_date=r["source_date"],
                software=r["software"],
                model=r["model"],
                gpu=r["gpu"],
                gpus=_required(r["gpus"]),
                tp=_required(r["tp"]),
                pp=_required(r["pp"]),
                cp=_int(r["cp"]),
                vp=_int(r["vp"]),
                ep=_int(r["ep"]),
                dp=_required(r["dp"]),
                micro_batch=_int(r["micro_batch"]),
                global_batch=_required(r["global_batch"]),
                seq_len=_required(r["seq_len"]),
                precision=r["precision"],
                checkpointing=r["checkpointing"],
                tokens_per_s_per_gpu=_float(r["tokens_per_s_per_gpu"]),
                model_tflops_per_gpu=_float(r["model_tflops_per_gpu"]),
                notes=r["notes"],
            )
            for r in csv.DictReader(fh)
        ]


def _cases(rows: Sequence[ParallelRow]) -> list[str]:
    """Each row's ``case``, with `` (2)``, `` (3)`` … where an earlier row has the same one
    (a second value the publication printed for the same settings)."""
    seen: dict[tuple[str, str], int] = {}
    out = []
    for row in rows:
        n = seen[(row.case, row.gpu)] = seen.get((row.case, row.gpu), 0) + 1
        out.append(row.case if n == 1 else f"{row.case} ({n})")
    return out


def _bare_run(row: ParallelRow) -> RunConfig:
    """The run of a row that is not predicted: its GPUs, sequence length and precision only
    (its split may be one whichgpu does not model)."""
    precision = row.precision if row.precision in ("fp8", "bf16") else None
    return run_config(mode="train", gpus=row.gpus, seq_len=row.seq_len, precision=precision)


def parallel_throughput(
    rows: Sequence[ParallelRow] | None = None, progress: Callable[[str], None] | None = None
) -> list[ReferenceThroughputCase]:
    """``predict``'s tokens/s per GPU for every usable row (default: the shipped table), and
    every other row with a published tokens/s, unpredicted, with the reason it is left out."""
    rows = parallel_rows() if rows is None else list(rows)
    out = []
    for row, case in zip(rows, _cases(rows), strict=True):
        measured = row.measured_tokens_per_s()
        if measured is None:
            continue  # nothing to list a row by: ``left_out_rows`` names it
        base: dict[str, Any] = {
            "source": SOURCE,
            "case": case,
            "workload": row.model,
            "gpu": row.gpu,
            "quantity": QUANTITY,
            "measured": measured,
        }
        why = row.left_out_reasons()
        if why:
            out.append(
                ReferenceThroughputCase(
                    **base,
                    run=_bare_run(row),
                    predicted=None,
                    note="left out: " + "; ".join(why),
                )
            )
            continue
        if progress is not None:
            progress(case)
        try:
            run = row.run()
            estimate, fits = predict_even_if_unfit(row.model, row.gpu, run)
        except WhichGpuError as exc:
            out.append(
                ReferenceThroughputCase(
                    **base,
                    run=_bare_run(row),
                    predicted=None,
                    note=f"{row.settings()}; {exc}",
                )
            )
            continue
        per_gpu = None if estimate.throughput is None else estimate.throughput / run.gpus
        note = row.settings() + ("" if fits else f"; {UNFIT_NOTE}")
        if row.derived:
            note += f"; {DERIVED_NOTE}"
        if per_gpu is None:
            note += f"; {estimate.speed_unknown or 'no speed for this run'}"
        out.append(
            ReferenceThroughputCase(
                **base,
                run=run,
                predicted=per_gpu,
                error=None if per_gpu is None else per_gpu / measured - 1,
                predicted_mfu=estimate.mfu,
                fits=fits,
                note=note,
            )
        )
    return out


def left_out_rows(rows: Sequence[ParallelRow] | None = None) -> list[tuple[ParallelRow, str]]:
    """Every row that is not compared, with why (default: the shipped table)."""
    rows = parallel_rows() if rows is None else list(rows)
    return [(r, "; ".join(why)) for r in rows if (why := r.left_out_reasons())]


def _size(model: str) -> str:
    """A model's size as the ratio notes write it (``llama-3.1-70b``: ``70B``)."""
    return model.rsplit("-", 1)[-1].upper()


def split_ratios(
    cases: Sequence[ReferenceThroughputCase], rows: Sequence[ParallelRow] | None = None
) -> list[str]:
    """For each publication and GPU with a compared model-parallel row (TP or PP above 1) and a
    compared pure data-parallel row: their tokens/s per GPU's ratio, measured and predicted
    (the first row of each kind; the split's cost apart from the kernels' speed)."""
    rows = parallel_rows() if rows is None else list(rows)
    by_case = {(c.case, c.gpu): c for c in cases if c.source == SOURCE and c.predicted is not None}
    compared = [
        (r, by_case[(k, r.gpu)])
        for r, k in zip(rows, _cases(rows), strict=True)
        if (k, r.gpu) in by_case
    ]
    out = []
    for key in dict.fromkeys((r.source_id, r.gpu) for r, _ in compared):
        mine = [(r, c) for r, c in compared if (r.source_id, r.gpu) == key]
        split = next(((r, c) for r, c in mine if r.model_parallel), None)
        plain = next(((r, c) for r, c in mine if not r.model_parallel), None)
        if split is None or plain is None:
            continue
        (sr, sc), (pr, pc) = split, plain
        assert sc.predicted is not None and pc.predicted is not None
        layout = sr.layout.rsplit(" DP", 1)[0]
        out.append(
            f"{key[0]} {key[1]}: {_size(sr.model)} {layout} / {_size(pr.model)} DP{pr.dp} "
            f"measured {sc.measured / pc.measured:.3f}, "
            f"predicted {sc.predicted / pc.predicted:.3f}"
        )
    return out
