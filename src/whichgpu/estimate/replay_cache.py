"""Replays of the stored profiles, shipped with them, so that a whole-catalog answer needs none.

Sizing a step on every catalog GPU replays it through the allocator model at each batch size
the largest-batch search visits — about two per GPU, 15-60 ms each in pure Python, so a few
seconds for the catalog. For the named workloads those replays are the same on every machine:
the stored profile, the catalog's budgets and the stacks' workspaces fix them. So
``scripts/warm_replays.py`` runs the default questions (``fit`` and ``predict`` on every
catalog GPU and stack, ``validate memory``) and writes what they replayed beside the profiles,
in ``profiles/replays/<stem>.json.gz``; ``step_memory`` starts from them. A question they do
not cover (another sequence length, more GPUs, a GPU added to the catalog) is replayed as
before, and remembered for the rest of the process.

Shipped replays are used only for the profile file they were computed from (its SHA-256) and
the replay model they were computed with (``REPLAY_MODEL_VERSION``); anything else ignores
them, so they can make an answer faster, never different. A test recomputes a sample of them.

Profiles traced on the user's machine and kept in the trace cache (``workloads.profile_cache``)
get the same treatment there: ``kept_memory`` starts from the replays an earlier run kept beside
the profile file (for those very bytes and this replay model), and ``keep_new_replays``, which
the API calls at the end of each question, writes what was added.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from whichgpu.estimate.memory import REPLAY_MODEL_VERSION, Replay, ReplayKey, StepMemory
from whichgpu.estimate.sharding import Parallel
from whichgpu.files import write_json_gz_atomically
from whichgpu.profiles.scalable import CATEGORIES, ScalableProfile
from whichgpu.profiles.stored import load_stem, profiles_dir, replays_path, stored_digest

if TYPE_CHECKING:  # importlib.abc's home of Traversable moves in later Pythons
    from importlib.abc import Traversable

REPLAYS_DIR = "replays"
"""Directory, under the stored profiles', of their shipped replays."""
FORMAT = "whichgpu-replays"


def step_memory(profile: ScalableProfile, stem: str | None = None) -> StepMemory:
    """The replays of ``profile``: for the stored profile ``stem`` (the very object
    ``load_stem`` returns), one ``StepMemory`` per process that starts from the shipped
    replays; for any other profile, a new one."""
    if stem is not None and load_stem(stem) is profile:
        return _stored_memory(stem)
    return StepMemory(profile)


@functools.lru_cache(maxsize=64)
def _stored_memory(stem: str) -> StepMemory:
    profile = load_stem(stem)
    if profile is None:  # pragma: no cover - step_memory checked it
        raise ValueError(f"no stored profile {stem}")
    return StepMemory(profile, shipped_replays(stem))


def forget_memories() -> None:
    """Drop the shared ``StepMemory`` of every stored profile: the next ``step_memory`` starts
    again from the shipped replays alone (what they cover, without this process's own)."""
    _stored_memory.cache_clear()


def replays_ref(stem: str) -> Traversable:
    """The package resource of ``stem``'s shipped replays (may not exist)."""
    return profiles_dir().joinpath(REPLAYS_DIR).joinpath(stem + ".json.gz")


def shipped_replays(stem: str) -> dict[ReplayKey, Replay]:
    """The replays shipped for the stored profile ``stem``: empty when there are none, or when
    they were computed from another profile file or another replay model."""
    ref = replays_ref(stem)
    if not ref.is_file():
        return {}
    doc = json.loads(gzip.decompress(ref.read_bytes()))
    if (
        doc.get("format") != FORMAT
        or doc.get("replay_model_version") != REPLAY_MODEL_VERSION
        or doc.get("profile_sha256") != stored_digest(stem)
    ):
        return {}
    return decode_replays(doc)


def decode_replays(doc: dict[str, Any]) -> dict[ReplayKey, Replay]:
    """The replays of a document written by ``encode_replays``."""
    categories = doc["categories"]
    out: dict[ReplayKey, Replay] = {}
    for batch, seq, workspaces, gpus, sharding, allocated, reserved, live in doc["replays"]:
        key: ReplayKey = (batch, seq, tuple(workspaces), Parallel(gpus, sharding))
        at_peak = {c: n for c, n in zip(categories, live, strict=True) if n}
        out[key] = Replay(allocated, reserved, at_peak)
    return out


def encode_replays(stem: str, replays: dict[ReplayKey, Replay]) -> dict[str, Any]:
    """A JSON-able document of ``replays`` of the stored profile ``stem`` (sorted, so that the
    same replays always give the same file)."""
    digest = stored_digest(stem)
    if digest is None:
        raise ValueError(f"no stored profile {stem}")
    return replays_document(replays, stem, digest, "scripts/warm_replays.py")


def replays_document(
    replays: dict[ReplayKey, Replay], profile: str, profile_sha256: str, written_by: str
) -> dict[str, Any]:
    """A JSON-able document of ``replays`` of the profile file named ``profile`` whose bytes
    have SHA-256 ``profile_sha256`` (rows sorted: the same replays give the same file)."""
    rows = [
        [
            batch,
            seq,
            list(workspaces),
            parallel.gpus,
            parallel.sharding,
            replay.peak_allocated_bytes,
            replay.peak_reserved_bytes,
            [replay.live_at_peak.get(c, 0) for c in CATEGORIES],
        ]
        for (batch, seq, workspaces, parallel), replay in replays.items()
        if not parallel.model_parallel  # the document's rows have no column for the split
    ]
    rows.sort(key=lambda r: (r[3], r[4], r[2], -1 if r[1] is None else r[1], r[0]))
    return {
        "format": FORMAT,
        "replay_model_version": REPLAY_MODEL_VERSION,
        "profile": profile,
        "profile_sha256": profile_sha256,
        "written_by": written_by,
        "categories": list(CATEGORIES),
        "replays": rows,
    }


def save_replays(stem: str, replays: dict[ReplayKey, Replay], directory: Path) -> Path:
    """Write ``replays`` of ``stem`` to ``directory`` (atomically); returns the file."""
    path = directory / f"{stem}.json.gz"
    write_json_gz_atomically(path, encode_replays(stem, replays))
    return path


# --- replays of profiles kept in the trace cache ---------------------------------------------


@dataclass
class _Kept:
    memory: StepMemory
    profile_sha256: str
    written: int
    """Replays in the file when it was read or last written."""


_kept: dict[Path, _Kept] = {}


def kept_memory(profile: ScalableProfile, profile_file: Path) -> StepMemory:
    """The replays of ``profile``, kept in the trace cache as ``profile_file``
    (``workloads.profile_cache``): one ``StepMemory`` per file and process, started from the
    replays an earlier run kept beside it (``keep_new_replays`` writes them). Replays kept for
    other bytes of the profile file, or another replay model, are ignored."""
    found = _kept.get(profile_file)
    if found is not None:
        return found.memory
    try:
        digest = hashlib.sha256(profile_file.read_bytes()).hexdigest()
    except OSError:
        return StepMemory(profile)
    known = _read_kept(replays_path(profile_file), digest)
    memory = StepMemory(profile, known)
    _kept[profile_file] = _Kept(memory, digest, len(known))
    return memory


def forget_kept_memories() -> None:
    """Drop this process's ``StepMemory`` of every kept profile: the next ``kept_memory``
    reads the kept replays again."""
    _kept.clear()


def keep_new_replays() -> None:
    """Write the replays of every kept profile that this process added to; a file that cannot
    be written is skipped (the next run replays again)."""
    for profile_file, kept in _kept.items():
        replays = kept.memory.replays()
        if len(replays) <= kept.written:
            continue
        doc = replays_document(
            replays, profile_file.name, kept.profile_sha256, "whichgpu (trace cache)"
        )
        try:
            write_json_gz_atomically(replays_path(profile_file), doc)
        except OSError:
            continue
        kept.written = len(replays)


def _read_kept(path: Path, profile_sha256: str) -> dict[ReplayKey, Replay]:
    try:
        doc = json.loads(gzip.decompress(path.read_bytes()))
        if (
            doc.get("format") != FORMAT
            or doc.get("replay_model_version") != REPLAY_MODEL_VERSION
            or doc.get("profile_sha256") != profile_sha256
        ):
            return {}
        return decode_replays(doc)
    except (OSError, EOFError, ValueError, KeyError, TypeError):
        return {}
