"""Profiles traced on this machine, kept so that the next question about the same model is instant.

A workload without a stored profile (the user's ``--config`` or ``--model``, or a named one
with a run configuration nothing ships for, such as LoRA of a 70B model) is traced at seven
sizes, which takes seconds for a small model and minutes for a large one. The result does not
depend on the GPU, the batch size, the sequence length or how many GPUs share the step, so
``fit``, ``predict``, ``recommend`` and ``report`` of the same model and run ask for the same
profile. It is kept in the trace cache (``settings.cache_dir()``) under a key that names
everything the trace depends on:

- the model: a named workload's name; a config file's resolved contents; for ``--model``, the
  Python, JSON, YAML and TOML files in the model file's folder (its own code, the modules beside
  it and the settings it may read). A folder too large to read quickly is not cached;
- what of the run changes the trace (mode, precision, optimizer, checkpointing, method, LoRA
  rank and targets, generated tokens) — not the sizes, the GPUs or the sharding;
- whichgpu's own code (every module of the package: a change to the tracer or a workload
  builder is a new key) and the versions of Python, torch and transformers.

A cached profile is therefore the very profile a new trace would give. Reading or writing the
cache never fails a command: a missing, unreadable or foreign file is traced anew, and a
cache that cannot be written is skipped. Files are written atomically; those unused for
``UNUSED_DAYS`` are deleted when a new profile is kept. ``WHICHGPU_NO_CACHE`` turns the cache
off; deleting the folder clears it.

Pure Python; never imports torch (nor numpy until a profile is read).
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import hashlib
import importlib.metadata
import json
import os
import re
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from whichgpu import settings
from whichgpu.files import write_json_gz_atomically
from whichgpu.profiles.stored import replays_path
from whichgpu.schema import RunConfig
from whichgpu.workloads.base import Workload
from whichgpu.workloads.run_config import DEFAULT_NEW_TOKENS

if TYPE_CHECKING:
    from whichgpu.profiles.scalable import ScalableProfile

CACHE_FORMAT = "whichgpu-trace-cache"
CACHE_VERSION = 1
"""Bumped when the key or the file layout changes (old entries are then never read)."""
PROFILES_SUBDIR = "profiles"
"""Folder, under the cache directory, of the kept profiles."""

UNUSED_DAYS = 60
"""Kept files unused for this long are deleted when a new profile is kept (an upgrade of
whichgpu or torch leaves the old keys unused for good)."""
KEPT_NAME = re.compile(r"^\.?[0-9a-f]{32}\.(json\.gz|replays\.json\.gz)(\.[0-9a-f]+\.tmp)?$")
"""Names of the files the cache writes (and of their temporaries); nothing else is deleted."""
PROFILE_NAME = re.compile(r"^[0-9a-f]{32}\.json\.gz$")
"""Names of the kept profiles."""

SOURCE_SUFFIXES = (".py", ".json", ".yaml", ".yml", ".toml", ".cfg")
"""Files of a ``--model`` folder that can change the model it builds."""
SOURCE_FILES_MAX = 400
"""A ``--model`` folder with more such files than this is not cached (too slow to check)."""
SOURCE_BYTES_MAX = 32 * 2**20
"""Nor one whose such files hold more bytes than this."""
ENTRIES_MAX = 5000
"""Nor one whose walk meets more files and folders than this (a home folder, a dataset)."""
SKIPPED_DIRS = frozenset({"__pycache__", "node_modules", "site-packages", "venv", "env"})
"""Folders of a ``--model`` folder that are not the model's sources (hidden ones neither)."""


def source_digest(folder: Path) -> str | None:
    """SHA-256 of the names and contents of the model's source files under ``folder``, or None
    past ``SOURCE_FILES_MAX`` of them, ``SOURCE_BYTES_MAX`` bytes or ``ENTRIES_MAX`` entries
    walked (or when the folder cannot be read): such a model is traced every time."""
    digest = hashlib.sha256()
    total = 0
    try:
        files = sorted(_source_files(folder))
    except _TooLarge:
        return None
    try:
        for path in files:
            data = path.read_bytes()
            total += len(data)
            if total > SOURCE_BYTES_MAX:
                return None
            digest.update(path.relative_to(folder).as_posix().encode() + b"\0")
            digest.update(hashlib.sha256(data).digest())
    except OSError:
        return None
    return digest.hexdigest()


class _TooLarge(Exception):
    pass


def _source_files(folder: Path) -> Iterator[Path]:
    """The model's source files under ``folder``; raises ``_TooLarge`` past the limit."""
    seen = walked = 0
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in SKIPPED_DIRS]
        walked += len(dirs) + len(files)
        if walked > ENTRIES_MAX:
            raise _TooLarge
        for name in files:
            if name.endswith(SOURCE_SUFFIXES) and not name.startswith("."):
                seen += 1
                if seen > SOURCE_FILES_MAX:
                    raise _TooLarge
                yield Path(root) / name


def code_digest() -> str:
    """SHA-256 of whichgpu's own modules and shipped model configs (what a trace runs)."""
    digest = hashlib.sha256()
    package = resources.files("whichgpu")
    for path in sorted(package_files(package, ""), key=lambda item: item[0]):
        digest.update(path[0].encode() + b"\0")
        digest.update(hashlib.sha256(path[1].read_bytes()).digest())
    return digest.hexdigest()


def package_files(folder: Any, prefix: str) -> Iterator[tuple[str, Any]]:
    """``(path, file)`` of the modules (and shipped model configs) below a package folder,
    paths prefixed with ``prefix``: what a trace's code digest covers."""
    for entry in folder.iterdir():
        name = prefix + entry.name
        if entry.is_dir():
            if entry.name != "__pycache__":
                yield from package_files(entry, name + "/")
        elif entry.name.endswith(".py") or (
            name.startswith("workloads/configs/") and entry.name.endswith(".json")
        ):
            yield name, entry


def distribution_version(distribution: str) -> str | None:
    """The installed version of a distribution (None: not installed)."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def traced_run(run: RunConfig) -> RunConfig:
    """``run`` without what a trace does not depend on: the sizes, the GPUs, the sharding, the
    tensor-, pipeline- or context-parallel split and fp8 all-gather (and, for inference, the
    concurrency and the context, with the generated tokens made explicit); of gradient
    accumulation only whether there is any (every count above one traces the same
    micro-step; the eager step stands for a compiled one, whose difference ``trace.compiled``
    derives) — the same for every question the profile answers."""
    update: dict[str, Any] = {
        "batch_size": None,
        "seq_len": None,
        "gpus": 1,
        "sharding": "ddp",
        "tensor_parallel": 1,
        "pipeline_parallel": 1,
        "virtual_stages": 1,
        "context_parallel": 1,
        "expert_parallel": 1,
        "fp8_recipe": "tensorwise",
        "fp8_all_gather": False,
        "network": None,
        "compile": False,
        "grad_accum": min(run.grad_accum, 2),
    }
    if run.mode == "inference":
        update |= {
            "context": None,
            "concurrency": 1,
            "new_tokens": run.new_tokens or DEFAULT_NEW_TOKENS,
        }
    return run.model_copy(update=update)


def cache_key(workload: Workload, run: RunConfig, *, named: bool) -> dict[str, Any] | None:
    """What the trace of ``workload`` for ``run`` depends on, or None when it cannot be told
    (a ``--model`` folder too large to read): ``named`` for a registered workload."""
    if named:
        model = f"whichgpu:{workload.info.name}"
    elif workload.source_digest is None:
        return None
    else:
        model = workload.source_digest
    return {
        "format": CACHE_FORMAT,
        "version": CACHE_VERSION,
        "workload": workload.info.name,
        "model": model,
        "run": traced_run(run).model_dump(mode="json"),
        **_environment(),
    }


def cache_path(key: dict[str, Any]) -> Path:
    """The file that holds the profile of ``key``."""
    name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
    return settings.cache_dir() / PROFILES_SUBDIR / f"{name}.json.gz"


def kept_file(workload: Workload, run: RunConfig, *, named: bool) -> Path | None:
    """The file of the profile kept for ``workload`` and ``run``, if there is one (and the
    cache is on)."""
    key = _active_key(workload, run, named=named)
    if key is None:
        return None
    path = cache_path(key)
    return path if path.is_file() else None


def _active_key(workload: Workload, run: RunConfig, *, named: bool) -> dict[str, Any] | None:
    """``cache_key``, or None also when the user turned the cache off."""
    if settings.cache_disabled():
        return None
    return cache_key(workload, run, named=named)


def cached_profile(workload: Workload, run: RunConfig, *, named: bool) -> ScalableProfile | None:
    """The profile kept for ``workload`` and ``run``, or None (none kept, the cache is off,
    or the file cannot be read: a new trace then replaces it)."""
    from whichgpu.profiles.scalable import ScalableProfile

    key = _active_key(workload, run, named=named)
    doc = None if key is None else _read_kept(key)
    if doc is None:
        return None
    try:
        profile = ScalableProfile.from_json(doc["profile"])
    except (KeyError, TypeError, ValueError):
        return None
    profile.events.flags.writeable = False
    return profile


def keep_profile(
    workload: Workload, run: RunConfig, profile: ScalableProfile, *, named: bool
) -> Path | None:
    """Keep ``profile``, traced for ``workload`` and ``run``; returns the file, or None when
    the cache is off, the model cannot be identified or the file cannot be written."""
    key = _active_key(workload, run, named=named)
    return None if key is None else _write_kept(key, "profile", profile.to_json())


def _read_kept(key: dict[str, Any]) -> dict[str, Any] | None:
    """The document kept under ``key``, marked as used now (not deleted as unused); None if
    there is none, it cannot be read or it was written for another key."""
    path = cache_path(key)
    try:
        with gzip.open(path, "rb") as fh:
            doc = json.loads(fh.read())
    except (OSError, EOFError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("key") != key:
        return None
    with contextlib.suppress(OSError):
        os.utime(path)
    return doc


def _write_kept(key: dict[str, Any], field: str, value: Any) -> Path | None:
    """Keep ``value`` under ``key`` as the document's ``field``; the file, or None if it
    cannot be written. Files unused for ``UNUSED_DAYS`` go."""
    path = cache_path(key)
    try:
        write_json_gz_atomically(path, {"key": key, field: value})
    except OSError:
        return None
    forget_unused(path.parent)
    return path


COMPILED_KEY = "compiled_partition"
"""The key field that marks a compiled step's partition (``trace.compiled``), by batch and
length, where a profile's key has none."""


def _compiled_key(
    workload: Workload, run: RunConfig, batch_size: int, *, named: bool
) -> dict[str, Any] | None:
    key = _active_key(workload, run, named=named)
    if key is None:
        return None
    return key | {COMPILED_KEY: {"batch_size": batch_size, "seq_len": run.seq_len}}


def cached_compiled(
    workload: Workload, run: RunConfig, batch_size: int, *, named: bool
) -> dict[str, Any] | None:
    """What ``keep_compiled`` kept of the compiled step of ``workload`` for ``run`` at
    ``batch_size`` x ``run.seq_len``, or None (none kept, the cache is off, or unreadable)."""
    key = _compiled_key(workload, run, batch_size, named=named)
    doc = None if key is None else _read_kept(key)
    found = None if doc is None else doc.get("compiled")
    return dict(found) if isinstance(found, dict) else None


def keep_compiled(
    workload: Workload, run: RunConfig, batch_size: int, found: Mapping[str, Any], *, named: bool
) -> Path | None:
    """Keep ``found`` (JSON-ready), what a trace of the compiled step at ``batch_size`` gave;
    returns the file, or None when the cache is off or the file cannot be written. The compiled
    partition of a large model takes minutes to trace, like its profile."""
    key = _compiled_key(workload, run, batch_size, named=named)
    return None if key is None else _write_kept(key, "compiled", dict(found))


def forget_unused(folder: Path, days: float = UNUSED_DAYS) -> list[Path]:
    """Delete the cache's files in ``folder`` that were not used for ``days`` (a profile's
    replays go with it); returns what was deleted. Errors leave a file where it is."""
    cutoff = time.time() - days * 86400
    try:
        entries = list(folder.iterdir())
    except OSError:
        return []
    return [e for e in entries if KEPT_NAME.match(e.name) and _delete_older(e, cutoff)]


def _delete_older(path: Path, cutoff: float) -> bool:
    """Delete ``path`` if it was last modified before ``cutoff``; whether it was."""
    try:
        if path.stat().st_mtime >= cutoff:
            return False
        path.unlink()
    except OSError:
        return False
    return True


# --- what the cache holds (``whichgpu cache``) -----------------------------------------------


@dataclass(frozen=True)
class KeptTrace:
    """One profile in the trace cache, or a compiled step's partition (``COMPILED_KEY``)."""

    path: Path
    """The profile's file (its replays, if any, lie beside it)."""
    workload: str
    """The workload's name: a named workload, a config file or a ``--model`` spec."""
    run: str
    """What of the run the trace is of (``RunConfig.describe``)."""
    size_bytes: int
    """Bytes of the profile and its replays on disk."""
    last_used: datetime
    """When a question last read it (or it was written), UTC."""
    current: bool
    """Whether this whichgpu, Python, torch and transformers can use it (False: kept by
    another version, it will not be read again; ``whichgpu cache clear --stale`` removes it)."""


def kept_traces() -> list[KeptTrace]:
    """The profiles in the trace cache, most recently used first (unreadable files are
    listed as not current, with the workload unknown)."""
    folder = settings.cache_dir() / PROFILES_SUBDIR
    try:
        files = [p for p in folder.iterdir() if PROFILE_NAME.match(p.name)]
    except OSError:
        return []
    found = [_kept_trace(p) for p in files]
    return sorted((k for k in found if k is not None), key=lambda k: k.last_used, reverse=True)


def _kept_trace(path: Path) -> KeptTrace | None:
    try:
        stat = path.stat()
        replays = replays_path(path)
        size = stat.st_size + (replays.stat().st_size if replays.is_file() else 0)
    except OSError:
        return None
    used = datetime.fromtimestamp(stat.st_mtime, tz=timezone.utc)
    try:
        with gzip.open(path, "rb") as fh:
            key = json.loads(fh.read())["key"]
        run = RunConfig.model_validate(key["run"]).describe()
        if COMPILED_KEY in key:
            at = key[COMPILED_KEY]
            run += f"; torch.compile's partition at {at['batch_size']} x {at['seq_len']}"
        current = key["version"] == CACHE_VERSION and all(
            key.get(name) == value for name, value in _environment().items()
        )
        return KeptTrace(path, str(key["workload"]), run, size, used, current)
    except (OSError, EOFError, ValueError, KeyError, TypeError):
        return KeptTrace(path, "(unreadable)", "", size, used, False)


def clear_cache(*, stale_only: bool = False) -> tuple[int, int]:
    """Delete the trace cache's profiles and their replays (``stale_only``: only those no
    longer current); returns how many profiles and how many bytes went."""
    gone = bytes_freed = 0
    for kept in kept_traces():
        if stale_only and kept.current:
            continue
        for path in (kept.path, replays_path(kept.path)):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        gone += 1
        bytes_freed += kept.size_bytes
    return gone, bytes_freed


@functools.lru_cache(maxsize=1)
def _environment() -> Mapping[str, Any]:
    """The parts of a key that name this installation (read once per process)."""
    return MappingProxyType(
        {
            "whichgpu_code": code_digest(),
            "python": "{}.{}".format(*sys.version_info[:2]),
            "torch": distribution_version("torch"),
            "transformers": distribution_version("transformers"),
        }
    )
