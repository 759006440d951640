"""Replays shipped with the stored profiles are current, equal to a fresh replay, and used."""

from __future__ import annotations

import gzip
import json

import pytest

from whichgpu import api
from whichgpu.estimate import replay_cache
from whichgpu.estimate.memory import REPLAY_MODEL_VERSION, StepMemory
from whichgpu.estimate.sharding import SINGLE_GPU
from whichgpu.profiles.stored import load_stem, stored_digest, stored_keys

STALE = "run scripts/warm_replays.py to replay the stored profiles again"


@pytest.fixture
def fresh_memories():
    """Shared step memories start again from the shipped replays alone."""
    replay_cache.forget_memories()
    yield
    replay_cache.forget_memories()


@pytest.mark.parametrize("stem", stored_keys())
def test_every_stored_profile_ships_current_replays(stem):
    ref = replay_cache.replays_ref(stem)
    assert ref.is_file(), f"{stem} has no shipped replays: {STALE}"
    doc = json.loads(gzip.decompress(ref.read_bytes()))
    assert doc["profile_sha256"] == stored_digest(stem), f"{stem}: new profile file; {STALE}"
    assert doc["replay_model_version"] == REPLAY_MODEL_VERSION, STALE
    assert replay_cache.shipped_replays(stem), f"{stem}: no replays in the file; {STALE}"


@pytest.mark.parametrize("stem", stored_keys())
def test_shipped_replays_equal_a_fresh_replay(stem):
    """A change to the allocator model, the sharding streams or the replay itself that changes
    what a replay returns must bump ``REPLAY_MODEL_VERSION``: the smallest and largest
    single-GPU replays and one of several GPUs (if any) are recomputed."""
    shipped = replay_cache.shipped_replays(stem)
    single = sorted((k for k in shipped if k[3] == SINGLE_GPU), key=lambda k: (k[0], str(k)))
    several = sorted((k for k in shipped if k[3] != SINGLE_GPU), key=str)
    profile = load_stem(stem)
    assert profile is not None
    fresh = StepMemory(profile)
    for key in {single[0], single[-1], *several[:1]}:
        assert fresh.replay(*key) == shipped[key], (stem, key, STALE)


def test_a_named_workload_needs_no_replay_across_the_catalog(fresh_memories):
    """The default question, on every catalog GPU, is answered from the shipped replays."""
    api.predict("bert-large")
    api.fit("bert-large")
    stem = "bert-large_train_bf16_adamw"
    profile = load_stem(stem)
    memory = replay_cache.step_memory(profile, stem)
    assert memory.live_replays == 0
    assert len(memory.replays()) > 50


def test_replays_of_another_profile_file_are_ignored(monkeypatch, fresh_memories):
    stem = "resnet50_train_bf16_adamw"
    assert replay_cache.shipped_replays(stem)
    monkeypatch.setattr(replay_cache, "stored_digest", lambda _stem: "0" * 64)
    assert replay_cache.shipped_replays(stem) == {}
    monkeypatch.setattr(replay_cache, "REPLAY_MODEL_VERSION", REPLAY_MODEL_VERSION + 1)
    assert replay_cache.shipped_replays(stem) == {}


def test_only_the_stored_profile_object_gets_the_shared_memory(fresh_memories):
    stem = "resnet50_train_bf16_adamw"
    profile = load_stem(stem)
    assert replay_cache.step_memory(profile, stem) is replay_cache.step_memory(profile, stem)
    other = replay_cache.step_memory(profile, None)
    assert other is not replay_cache.step_memory(profile, stem)
    assert other.replays() == {}
    copy = type(profile).from_json(profile.to_json())  # the same content, not the shipped file
    assert replay_cache.step_memory(copy, stem).replays() == {}


def test_written_replays_read_back_the_same(tmp_path):
    stem = "resnet50_train_bf16_adamw"
    profile = load_stem(stem)
    memory = StepMemory(profile)
    for batch in (1, 5):
        memory.replay(batch, None, (1 << 20,), SINGLE_GPU)
    path = replay_cache.save_replays(stem, memory.replays(), tmp_path)
    doc = json.loads(gzip.decompress(path.read_bytes()))
    assert replay_cache.decode_replays(doc) == memory.replays()
    assert doc["profile_sha256"] == stored_digest(stem)
