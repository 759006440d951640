"""MosaicML llm-foundry's published MPT training benchmarks against ``fit`` and ``predict``.

The table (``data/llm-foundry/mpt-benchmarks.csv``, provenance in the README beside it) gives,
for MPT models of 125M to 30B parameters trained with FSDP (``FULL_SHARD``) on 8 A100 80GB or
8 H100 80GB (and on 16 to 64 H100s: nodes of 8 joined by a network, ``MULTI_NODE_FABRICS``),
the micro-batch per GPU, activation checkpointing, and the tokens/s reached. A
run in the table ran, so its micro-batch fitted: ``validate memory`` asks ``fit`` whether it
does for one of the run's GPUs (``sharding="fsdp"``) and counts the runs it refuses;
``validate throughput`` compares ``predict``'s tokens/s per GPU (timed as if it fitted where
``fit`` refuses, ``timing.predict_even_if_unfit``) with the table's.

The MPT models of the table are GPT-2's layout (learned positions, biases, tied embeddings,
GELU MLP of 4 x d_model; llm-foundry's ``mpt-*.yaml`` sizes, vocabulary 50,368, no dropout):
``data/llm-foundry/configs/mpt-*.json`` rebuild them as GPT-2 configs whose parameter count
equals the table's ``num_params`` at 2,048 positions. The positions table grows with
``max_seq_len``, which each row sets to its sequence length, so only the rows at 2,048 tokens
are compared (one trace per model); AMP bf16 with FSDP's ``DEFAULT`` mixed precision (fp32
master weights and optimizer state, sharded) is whichgpu's ``bf16``; the fp8 rows are kept in
the file and not compared.

Tracing the eight models takes minutes, and the trace cache keeps a trace only until
whichgpu's code changes; so their traced steps are shipped too (``data/llm-foundry/profiles``,
written by ``trace_profiles``: ``python -m whichgpu.validate.llm_foundry``, to run again
after a change to the tracer or the workload builders) and placed in the trace cache before
``fit`` and ``predict`` are asked, which then answer from them as from a trace of their own.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from whichgpu.errors import WhichGpuError
from whichgpu.profiles.scalable import ScalableProfile
from whichgpu.profiles.stored import profile_key
from whichgpu.schema import FsdpFitCase, ReferenceThroughputCase, RunConfig
from whichgpu.validate.timing import fit_options, per_gpu_case, predict_even_if_unfit
from whichgpu.workloads import run_config
from whichgpu.workloads.base import Workload
from whichgpu.workloads.profile_cache import (
    cached_profile,
    distribution_version,
    keep_profile,
    package_files,
    traced_run,
)

if TYPE_CHECKING:  # importlib.abc's home of Traversable moves in later Pythons
    from importlib.abc import Traversable

SOURCE = "llm-foundry"
"""The reference's id in ``validate`` results."""

DATA_DIR = "llm-foundry"
"""Folder of the table and the configs, under ``validate/data``."""

TABLE_FILE = "mpt-benchmarks.csv"
"""The transcribed table."""

GPUS = {"a100_80gb": "a100-sxm4-80gb", "h100_80gb": "h100-sxm"}
"""The table's GPU names and the catalog GPUs they stand for (MosaicML's 8-GPU nodes: SXM
boards)."""

PRECISIONS = {"amp_bf16": "bf16"}
"""The table's precisions compared, and whichgpu's names for them (``amp_fp8`` rows are not
compared)."""

NODE_GPUS = 8
"""GPUs of one of the table's nodes."""

MULTI_NODE_FABRICS = {
    "H100 80GB BF16": None,
    "A100 80GB with 1600 Gbps node-node interconnect (RoCE)": "roce-1600",
}
"""The network between the nodes of each table's runs on more than one node, by table: the
fabric's id in ``estimate/data/links.json`` (None: the default, InfiniBand NDR: the README
names no interconnect for its H100 runs)."""

COMPARED_SEQ_LEN = 2048
"""The sequence length of the rows compared: the configs' ``n_positions``."""

STACK = "llm-foundry-2023"
"""The software stack the table ran (``catalog/data/v1/stacks``): its FlashAttention in
Triton's pre-MLIR backend runs Ampere's matrix instructions on the H100s."""


@dataclass(frozen=True)
class FoundryRun:
    """One row of the table."""

    model: str
    """``mpt-`` and the table's size (``mpt-7b``)."""
    gpu_name: str
    """The table's GPU (``a100_80gb``, ``h100_80gb``)."""
    n_gpus: int
    """GPUs of the run."""
    seq_len: int
    """Tokens per sequence."""
    micro_batch_size: int
    """Sequences per GPU per forward/backward pass."""
    grad_accum: int
    """Micro-batches accumulated per optimizer step."""
    precision: str
    """The table's precision (``amp_bf16``, ``amp_fp8``)."""
    mp_mode: str
    """FSDP's mixed-precision mode (``DEFAULT``)."""
    sharding_strategy: str
    """FSDP's sharding (``FULL_SHARD``)."""
    activation_checkpointing: bool
    """Activation checkpointing on."""
    tokens_per_s_per_gpu: float
    """Throughput per GPU, tokens/s."""
    mfu: float
    """Model FLOPs utilisation the table states, fraction."""
    num_params: int
    """Parameters the table counts."""
    table: str = ""
    """The table (section of the README) the row is in."""

    @property
    def network(self) -> str | None:
        """The fabric between the run's nodes (None: one node, or the default fabric)."""
        if self.n_gpus <= NODE_GPUS:
            return None
        return MULTI_NODE_FABRICS.get(self.table)

    @property
    def one_node(self) -> bool:
        """Whether the run is on one node (the rows the throughput constants are fitted on)."""
        return self.n_gpus <= NODE_GPUS

    @property
    def gpu(self) -> str:
        """The catalog GPU."""
        return GPUS[self.gpu_name]

    @property
    def case(self) -> str:
        """The row in words: ``mpt-7b 8x a100_80gb s2048 mb6``, ``ckpt`` when checkpointed."""
        return (
            f"{self.model} {self.n_gpus}x {self.gpu_name} s{self.seq_len} "
            f"mb{self.micro_batch_size}" + (" ckpt" if self.activation_checkpointing else "")
        )

    @property
    def compared(self) -> bool:
        """Whether the row is compared (bf16 AMP, full sharding, 2,048 tokens, a known GPU)."""
        return (
            self.precision in PRECISIONS
            and self.sharding_strategy == "FULL_SHARD"
            and self.seq_len == COMPARED_SEQ_LEN
            and self.gpu_name in GPUS
        )

    @property
    def run(self) -> RunConfig:
        """The run asked of whichgpu: one micro-batch per GPU, FSDP over the run's GPUs, with
        llm-foundry's optimizer and loss: Composer's ``DecoupledAdamW`` steps one parameter
        at a time (``composer/optim/decoupled_weight_decay.py``: a loop, no foreach), and the
        MPT models' ``loss_fn`` defaults to ``fused_crossentropy``, flash-attn's
        ``CrossEntropyLoss`` (``llmfoundry/models/mpt/modeling_mpt.py``)."""
        return run_config(
            precision=PRECISIONS[self.precision],
            batch_size=self.micro_batch_size,
            seq_len=self.seq_len,
            checkpointing=self.activation_checkpointing,
            gpus=self.n_gpus,
            sharding="fsdp",
            network=self.network,
            optimizer_impl="for-loop",
            loss_kernel="fused",
        )


def _data() -> Traversable:
    """The package folder of the table, the configs and the profiles."""
    return resources.files("whichgpu.validate").joinpath("data").joinpath(DATA_DIR)


def foundry_runs() -> list[FoundryRun]:
    """Every row of the table, in file order."""
    text = _data().joinpath(TABLE_FILE).read_text(encoding="utf-8")
    return [
        FoundryRun(
            model=f"mpt-{row['model']}",
            gpu_name=row["gpu"],
            n_gpus=int(row["n_gpus"]),
            seq_len=int(row["seq_len"]),
            micro_batch_size=int(row["micro_batch_size"]),
            grad_accum=int(row["grad_accum"]),
            precision=row["precision"],
            mp_mode=row["mp_mode"],
            sharding_strategy=row["sharding_strategy"],
            activation_checkpointing=row["activation_checkpointing"] == "True",
            tokens_per_s_per_gpu=float(row["throughput_tokens_per_s_per_gpu"]),
            mfu=float(row["mfu_percent"]) / 100,
            num_params=int(row["num_params"]),
            table=row["table"],
        )
        for row in csv.DictReader(text.splitlines())
    ]


def compared_runs() -> list[FoundryRun]:
    """The rows compared on one node (``FoundryRun.compared``, ``one_node``): the rows the
    throughput constants are fitted on (``scripts/fit_throughput.py``)."""
    return [r for r in foundry_runs() if r.compared and r.one_node]


def validated_runs() -> list[FoundryRun]:
    """Every row compared, on one node and on several (``FoundryRun.compared``): what
    ``validate`` asks of ``fit`` and ``predict``."""
    return [r for r in foundry_runs() if r.compared]


PROFILE_DIR = "profiles"
"""Folder, under ``DATA_DIR``, of the shipped traced steps (file stems:
``stored.profile_key`` of the model and run)."""


@contextmanager
def config_file(model: str) -> Iterator[Path]:
    """The path of ``model``'s GPT-2 config (``mpt-7b`` -> ``configs/mpt-7b.json``)."""
    ref = _data().joinpath("configs").joinpath(f"{model}.json")
    if not ref.is_file():
        raise WhichGpuError(f"no config for {model} in validate/data/{DATA_DIR}/configs")
    with resources.as_file(ref) as path:
        yield Path(path)


def _workload(path: Path) -> Workload:
    from whichgpu.workloads.user import config_workload

    return config_workload(path)


def _profile_stem(model: str, run: RunConfig) -> str:
    return profile_key(model, traced_run(run))


def place_profile(model: str, path: Path, run: RunConfig) -> bool:
    """Put the shipped traced step of ``model`` for ``run`` in the trace cache, unless a
    trace of the current code is there already; whether the cache now holds one."""
    workload = _workload(path)
    if cached_profile(workload, run, named=False) is not None:
        return True
    ref = _data().joinpath(PROFILE_DIR).joinpath(_profile_stem(model, run) + ".json.gz")
    if not ref.is_file():
        return False
    with resources.as_file(ref) as shipped:
        profile = ScalableProfile.load(Path(shipped))
    return keep_profile(workload, run, profile, named=False) is not None


MANIFEST = "MANIFEST.json"
"""File, in ``PROFILE_DIR``, naming what the shipped profiles were traced with
(``tracer_state``)."""

TRACER_MODULES = (
    "recipe",
    "trace",
    "workloads/base.py",
    "workloads/hf.py",
    "workloads/user.py",
)
"""whichgpu's code a config's trace runs: the step recipe, the tracer and the config workload's
builders."""


def tracer_state() -> dict[str, str | None]:
    """What a trace of the configs depends on: a SHA-256 of ``TRACER_MODULES`` and the
    versions of torch and transformers."""
    digest = hashlib.sha256()
    package = resources.files("whichgpu")
    for name in TRACER_MODULES:
        entry = package
        for part in name.split("/"):
            entry = entry.joinpath(part)
        files = [(name, entry)] if entry.is_file() else package_files(entry, name + "/")
        for path, file in sorted(files, key=lambda item: item[0]):
            digest.update(path.encode() + b"\0" + hashlib.sha256(file.read_bytes()).digest())
    return {
        "tracer_sha256": digest.hexdigest(),
        "torch": distribution_version("torch"),
        "transformers": distribution_version("transformers"),
    }


def stale_profiles_note() -> str:
    """A note when the shipped profiles were traced by other tracer code or library versions
    than this installation's (empty when they match): the llm-foundry answers then come from
    the old traces."""
    ref = _data().joinpath(PROFILE_DIR).joinpath(MANIFEST)
    shipped = json.loads(ref.read_text(encoding="utf-8")) if ref.is_file() else {}
    now = tracer_state()
    changed = [k for k, v in now.items() if shipped.get(k) != v]
    if not changed:
        return ""
    what = " and ".join("whichgpu's tracer" if k == "tracer_sha256" else k for k in changed)
    return (
        f"answered from shipped traces made with another {what} than this installation's "
        "(python -m whichgpu.validate.llm_foundry traces them anew)"
    )


def trace_profiles(out: Path, progress: Callable[[str], None] | None = None) -> list[Path]:
    """Trace every (model, run) of the compared rows and write them to ``out`` (the shipped
    ``profiles`` folder by default when run as a script); returns the files written."""
    from whichgpu.trace.scaling import trace_scalable

    state = tracer_state()  # before tracing: a change while it runs then shows as stale
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for model, run in dict.fromkeys((r.model, traced_run(r.run)) for r in compared_runs()):
        if progress is not None:
            progress(f"{model} ({run.describe()})")
        with config_file(model) as path:
            profile = trace_scalable(_workload(path), run)
        profile = dataclasses.replace(profile, workload=model)  # not the config's path here
        target = out / f"{_profile_stem(model, run)}.json.gz"
        profile.save(target)
        written.append(target)
    (out / MANIFEST).write_text(json.dumps(state, indent=2) + "\n", encoding="utf-8")
    return written


def foundry_memory(
    runs: list[FoundryRun] | None = None, progress: Callable[[str], None] | None = None
) -> list[FsdpFitCase]:
    """``fit`` for one GPU of every compared run (default: every compared row, on one node
    and on several)."""
    from whichgpu.api import fit

    out = []
    for r in validated_runs() if runs is None else runs:
        if progress is not None:
            progress(r.case)
        base: dict[str, Any] = {"source": SOURCE, "model": r.model, "gpu": r.gpu, "run": r.run}
        try:
            with config_file(r.model) as path:
                place_profile(r.model, path, r.run)
                (estimate,) = fit(config=path, gpus=[r.gpu], stack=STACK, **fit_options(r.run))
        except WhichGpuError as exc:
            out.append(FsdpFitCase(**base, fits=None, note=f"fit failed: {exc}"))
            continue
        out.append(
            FsdpFitCase(
                **base,
                fits=estimate.fits,
                predicted_max_batch=estimate.max_batch_size,
                predicted_device_bytes=estimate.device_total_bytes,
                capacity_bytes=estimate.capacity_bytes,
            )
        )
    return out


def foundry_throughput(
    runs: list[FoundryRun] | None = None, progress: Callable[[str], None] | None = None
) -> list[ReferenceThroughputCase]:
    """``predict``'s tokens/s per GPU for every compared run (default: every compared row, on
    one node and on several)."""
    out = []
    for r in validated_runs() if runs is None else runs:
        if progress is not None:
            progress(r.case)
        base: dict[str, Any] = {
            "source": SOURCE,
            "case": r.case,
            "workload": r.model,
            "gpu": r.gpu,
            "run": r.run,
            "quantity": "tokens/s per GPU",
            "measured": r.tokens_per_s_per_gpu,
            "measured_mfu": r.mfu,
        }
        try:
            with config_file(r.model) as path:
                place_profile(r.model, path, r.run)
                estimate, fits = predict_even_if_unfit(None, r.gpu, r.run, config=path, stack=STACK)
        except WhichGpuError as exc:
            out.append(ReferenceThroughputCase(**base, predicted=None, note=str(exc)))
            continue
        out.append(per_gpu_case(base, estimate, fits, r.n_gpus, ""))
    return out


if __name__ == "__main__":  # python -m whichgpu.validate.llm_foundry [FOLDER]
    import sys

    target = (
        Path(sys.argv[1])
        if len(sys.argv) > 1
        else Path(__file__).parent / "data" / (f"{DATA_DIR}/{PROFILE_DIR}")
    )
    for file in trace_profiles(target, progress=lambda now: print(now, flush=True)):
        print(f"wrote {file}")
