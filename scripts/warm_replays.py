"""Ask every stored profile its default questions and ship the replays they needed.

Run from the repository root (torch is not needed):

    python scripts/warm_replays.py                  # every stored profile
    python scripts/warm_replays.py bert-large gpt2  # the stored profiles of some workloads

The questions: ``fit`` and ``predict`` on every catalog GPU under every software stack, in the
profile's own run configuration; ``validate memory``; ``recommend`` for every preset. What they
replayed is written to ``src/whichgpu/workloads/profiles/replays/<stem>.json.gz``
(``whichgpu.estimate.replay_cache``). The questions are then asked again from the written
files alone, and the script fails if any of them still had to replay.

Run it after ``scripts/make_profiles.py`` (which stores new profile files, so the replays of
the old ones no longer apply), after a change to the catalog's GPUs or stacks, and after bumping
``REPLAY_MODEL_VERSION``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from whichgpu import api
from whichgpu.catalog.stacks import shipped_stacks
from whichgpu.estimate import replay_cache
from whichgpu.profiles.stored import load_stem, stored_keys
from whichgpu.ranking.presets import shipped_presets
from whichgpu.schema import RunConfig
from whichgpu.validate.memory import validate_memory
from whichgpu.workloads import run_config

OUT = (
    Path(__file__).resolve().parent.parent
    / "src"
    / "whichgpu"
    / "workloads"
    / "profiles"
    / replay_cache.REPLAYS_DIR
)

_RUN_FIELDS = (
    "mode",
    "precision",
    "optimizer",
    "checkpointing",
    "checkpointing_policy",
    "method",
    "lora_rank",
    "grad_accum",
)


def run_options(run: RunConfig) -> dict[str, Any]:
    """The options that ask for ``run``'s stored profile (those that differ from the
    defaults)."""
    default = run_config()
    return {k: getattr(run, k) for k in _RUN_FIELDS if getattr(run, k) != getattr(default, k)}


def ask(stems: list[str], *, everything: bool) -> None:
    """The default questions of ``stems`` (and, with ``everything``, those that span many
    workloads: ``validate memory`` and the presets)."""
    for stem in stems:
        profile = load_stem(stem)
        assert profile is not None
        options = run_options(profile.run)
        for stack in shipped_stacks():
            api.fit(profile.workload, stack=stack.id, **options)
            api.predict(profile.workload, stack=stack.id, **options)
    if everything:
        validate_memory()
        for preset in shipped_presets():
            api.recommend(preset=preset.id)


def live_replays(stems: list[str]) -> dict[str, int]:
    """Replays computed so far for each stem (not shipped or memoised)."""
    out = {}
    for stem in stems:
        profile = load_stem(stem)
        assert profile is not None
        out[stem] = replay_cache.step_memory(profile, stem).live_replays
    return out


def main(args: list[str]) -> int:
    stems = [s for s in stored_keys() if not args or s.split("_", 1)[0] in args]
    if not stems:
        print(f"no stored profile of {' '.join(args)}", file=sys.stderr)
        return 2
    everything = not args
    started = time.perf_counter()
    ask(stems, everything=everything)
    for stem in stems:
        profile = load_stem(stem)
        assert profile is not None
        replays = replay_cache.step_memory(profile, stem).replays()
        path = replay_cache.save_replays(stem, replays, OUT)
        print(
            f"{stem:48s} {len(replays):5d} replays  {path.stat().st_size / 1024:6.1f} KiB",
            flush=True,
        )
    print(f"asked and written in {time.perf_counter() - started:.0f} s")

    # ask again from the files alone: nothing may need a replay
    replay_cache.forget_memories()
    ask(stems, everything=everything)
    missed = {stem: n for stem, n in live_replays(stems).items() if n}
    for stem, n in missed.items():
        print(f"{stem}: {n} replays were not covered", file=sys.stderr)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
