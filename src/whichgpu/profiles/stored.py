"""The stored profiles of named workloads: their keys, files and lookup.

Named workloads ship one ``ScalableProfile`` (``whichgpu.profiles.scalable``) per stored run
configuration, as package data in ``whichgpu/workloads/profiles/<key>.json.gz`` (written by
``scripts/make_profiles.py``); ``profile_key`` names the file of a run. Also the name of the
replays kept beside a profile file (``estimate.replay_cache``), and the compiled steps'
partitions stored for a few runs (``compiled/``, written by ``scripts/make_compiled.py``,
read by ``api.step.CompiledStep``). Pure Python; never imports torch, nor numpy until a
profile is read.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import json
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from whichgpu.schema import DEFAULT_NEW_TOKENS, RunConfig

if TYPE_CHECKING:  # importlib.abc's home of Traversable moves in later Pythons
    from importlib.abc import Traversable

    from whichgpu.profiles.scalable import ScalableProfile

PROFILE_DIR = "profiles"
"""Package directory (under ``whichgpu.workloads``) of the stored profiles."""
PROFILE_PACKAGE = "whichgpu.workloads"
"""The package whose data the stored profiles are."""


def profile_key(workload: str, run: RunConfig) -> str:
    """File stem of a stored profile: the workload and what of the run changes the trace.

    Training: ``<workload>_train_<precision>_<optimizer>[_forloop|_fused]
    [_fusedce|_chunkedce|_fusedlinearce][_ckpt|_ckptevery<N>|_ckptselective][_<method><rank>]
    [_accum]`` (the optimizer's implementation, the loss kernel and the checkpointing policy
    when not the default; ``accum`` for gradient accumulation, whose traced micro-step is the
    same for every count above one: the gradients of the earlier micro-steps present). Inference:
    ``<workload>_inference_<precision>_new<new tokens>`` — the concurrency and the context are
    the profile's variables, the generated tokens are fixed (default ``DEFAULT_NEW_TOKENS``).
    A TF32 run is the FP32 step (TF32 is how the GPU multiplies FP32 matrices: the same
    operators, tensors and bytes), so it takes the FP32 profile.
    """
    precision = "fp32" if run.precision == "tf32" else run.precision
    if run.mode == "inference":
        return f"{workload}_inference_{precision}_new{run.new_tokens or DEFAULT_NEW_TOKENS}"
    parts = [workload, run.mode, precision, run.optimizer]
    if run.optimizer_impl != "foreach":
        parts.append(run.optimizer_impl.replace("-", ""))
    if run.loss_kernel != "torch":
        parts.append(f"{run.loss_kernel.replace('-', '')}ce")
    if run.checkpointing:
        policy = run.checkpointing_policy
        parts.append("ckpt" if policy == "full" else f"ckpt{policy.replace('-', '')}")
    if run.method != "full":
        parts.append(f"{run.method}{run.lora_rank}")
    if run.grad_accum > 1:
        parts.append("accum")
    return "_".join(parts)


def storable(run: RunConfig) -> bool:
    """Whether stored profiles can answer for ``run`` (default LoRA targets; training, or
    inference of the whole model)."""
    return not run.lora_targets and (run.mode == "train" or run.method == "full")


def load_stored(workload: str, run: RunConfig) -> ScalableProfile | None:
    """The stored profile of a named workload for ``run``, or None if none is shipped (read
    once per process: the same object is returned again, its arrays read-only)."""
    if not storable(run):
        return None
    return load_stem(profile_key(workload, run))


def profiles_dir() -> Traversable:
    """The package directory of the stored profiles."""
    return resources.files(PROFILE_PACKAGE).joinpath(PROFILE_DIR)


@functools.lru_cache(maxsize=64)
def load_stem(stem: str) -> ScalableProfile | None:
    """The stored profile whose file stem is ``stem`` (``profile_key``), or None."""
    from whichgpu.profiles.scalable import ScalableProfile  # numpy: only once one is read

    ref = profiles_dir().joinpath(stem + ".json.gz")
    if not ref.is_file():
        return None
    with resources.as_file(ref) as path:
        profile = ScalableProfile.load(path)
    profile.events.flags.writeable = False
    return profile


COMPILED_DIR = "compiled"
"""Folder, under the stored profiles, of the stored partitions of compiled steps."""


def compiled_stem(workload: str, run: RunConfig) -> str:
    """File stem of a stored compiled step's partition: the run's profile key (gradient
    accumulation left out: the partition is of the forward pass and loss) and its length."""
    return f"{profile_key(workload, run.model_copy(update={'grad_accum': 1}))}_L{run.seq_len}"


@functools.lru_cache(maxsize=16)
def _stored_compiled(stem: str) -> dict[str, Any] | None:
    ref = profiles_dir().joinpath(COMPILED_DIR).joinpath(stem + ".json.gz")
    if not ref.is_file():
        return None
    with ref.open("rb") as raw, gzip.open(raw) as fh:
        doc: dict[str, Any] = json.loads(fh.read())
    return doc


def load_stored_compiled(workload: str, run: RunConfig, batch_size: int) -> dict[str, Any] | None:
    """What the trace of ``workload``'s compiled step for ``run`` at ``batch_size`` x
    ``run.seq_len`` gave, as ``scripts/make_compiled.py`` stored it, or None if nothing is
    stored for it (only training of the whole model at a stored length)."""
    if run.mode != "train" or not storable(run) or run.seq_len is None:
        return None
    doc = _stored_compiled(compiled_stem(workload, run))
    if doc is None:
        return None
    found = doc.get("batches", {}).get(str(batch_size))
    return dict(found) if isinstance(found, dict) else None


def stored_digest(stem: str) -> str | None:
    """SHA-256 of the stored profile file ``stem`` (what replays computed from it name), or
    None if there is none."""
    ref = profiles_dir().joinpath(stem + ".json.gz")
    if not ref.is_file():
        return None
    return hashlib.sha256(ref.read_bytes()).hexdigest()


def stored_keys() -> list[str]:
    """Stems of every stored profile."""
    ref = profiles_dir()
    if not ref.is_dir():
        return []
    return sorted(
        p.name.removesuffix(".json.gz") for p in ref.iterdir() if p.name.endswith(".json.gz")
    )


def replays_path(path: Path) -> Path:
    """The file of the replays kept beside the profile file ``path``
    (``estimate.replay_cache``)."""
    return path.with_name(path.name.removesuffix(".json.gz") + ".replays.json.gz")
