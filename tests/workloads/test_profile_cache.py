"""The trace cache: a profile traced once answers the next question about the same model and run,
and nothing else; a changed model, a broken file or a cache turned off traces anew."""

from __future__ import annotations

import gzip
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_cli
from whichgpu.api import fit, scalable_profile
from whichgpu.cli import main
from whichgpu.estimate import replay_cache
from whichgpu.schema import RunConfig
from whichgpu.workloads import Workload, get_workload, select_workload
from whichgpu.workloads import profile_cache as cache
from whichgpu.workloads.profile_cache import (
    UNUSED_DAYS,
    cache_key,
    cache_path,
    cached_profile,
    forget_unused,
    kept_file,
    source_digest,
)

pytestmark = pytest.mark.fresh_trace_cache  # what the cache itself does, from empty

FIXTURES = Path(__file__).parents[1] / "fixtures"
TINY = FIXTURES / "tiny-llama.json"

MODEL_FILE = """
import torch
from torch import nn

WIDTH = {width}

def build():
    model = nn.Sequential(nn.Linear(WIDTH, 64), nn.ReLU(), nn.Linear(64, 10))
    return model, lambda batch_size, seq_len: {{"input": torch.randn(batch_size, WIDTH)}}
"""


def _tiny_config() -> Workload:
    return select_workload(None, TINY)


def test_a_traced_profile_is_kept_and_answers_again_unchanged() -> None:
    workload = _tiny_config()
    run = RunConfig(seq_len=64)
    traced, how = scalable_profile(workload, run)
    assert how == "traced"
    kept, how = scalable_profile(workload, run)
    assert how == "traced (kept from an earlier run)"
    assert kept.to_json() == traced.to_json()
    assert not kept.events.flags.writeable


def test_the_key_ignores_sizes_gpus_and_sharding_but_not_what_changes_the_trace() -> None:
    workload = _tiny_config()
    base = cache_key(workload, RunConfig(), named=False)
    same = [
        RunConfig(batch_size=8, seq_len=512),
        RunConfig(gpus=8, sharding="fsdp"),
    ]
    for run in same:
        assert cache_key(workload, run, named=False) == base
    different = [
        RunConfig(precision="fp32"),
        RunConfig(checkpointing=True),
        RunConfig(method="lora"),
        RunConfig(method="lora", lora_rank=8),
        RunConfig(optimizer="sgd"),
        RunConfig(mode="inference"),
    ]
    keys = [cache_key(workload, run, named=False) for run in different]
    assert base not in keys
    assert len({json.dumps(k, sort_keys=True) for k in keys}) == len(keys)


def test_inference_keys_ignore_concurrency_and_context_but_not_new_tokens() -> None:
    workload = get_workload("llama-3.2-1b")
    one = cache_key(workload, RunConfig(mode="inference"), named=True)
    assert one == cache_key(
        workload, RunConfig(mode="inference", concurrency=8, context=4096), named=True
    )
    assert one == cache_key(workload, RunConfig(mode="inference", new_tokens=128), named=True)
    assert one != cache_key(workload, RunConfig(mode="inference", new_tokens=256), named=True)


def test_another_config_is_another_model(tmp_path: Path) -> None:
    doc = json.loads(TINY.read_text())
    copy = tmp_path / "tiny-llama.json"
    copy.write_text(json.dumps(doc))
    same = select_workload(None, copy)
    doc["intermediate_size"] = doc["intermediate_size"] * 2
    copy.write_text(json.dumps(doc))
    wider = select_workload(None, copy)
    assert same.source_digest == _tiny_config().source_digest
    assert wider.source_digest != same.source_digest


def test_editing_a_model_file_or_its_neighbours_traces_anew(tmp_path: Path) -> None:
    folder = tmp_path / "project"
    folder.mkdir()
    model = folder / "net.py"
    model.write_text(MODEL_FILE.format(width=32))
    spec = f"{model}:build"
    first, how = scalable_profile(select_workload(spec, None), RunConfig())
    assert how == "traced"
    _, how = scalable_profile(select_workload(spec, None), RunConfig())
    assert how == "traced (kept from an earlier run)"

    (folder / "settings.yaml").write_text("width: 64\n")  # a file the model might read
    _, how = scalable_profile(select_workload(spec, None), RunConfig())
    assert how == "traced"

    model.write_text(MODEL_FILE.format(width=512))
    wider, how = scalable_profile(select_workload(spec, None), RunConfig())
    assert how == "traced"
    assert wider.params_total > first.params_total


def test_a_folder_too_large_to_check_is_not_identified(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(4):
        (tmp_path / f"m{i}.py").write_text(f"X = {i}\n")
    assert source_digest(tmp_path) is not None
    monkeypatch.setattr(cache, "SOURCE_FILES_MAX", 3)
    assert source_digest(tmp_path) is None
    monkeypatch.setattr(cache, "SOURCE_FILES_MAX", 400)
    monkeypatch.setattr(cache, "SOURCE_BYTES_MAX", 10)
    assert source_digest(tmp_path) is None
    monkeypatch.setattr(cache, "SOURCE_BYTES_MAX", 2**20)
    monkeypatch.setattr(cache, "ENTRIES_MAX", 2)
    assert source_digest(tmp_path) is None


def test_hidden_and_environment_folders_are_not_sources(tmp_path: Path) -> None:
    (tmp_path / "net.py").write_text("X = 1\n")
    before = source_digest(tmp_path)
    for folder in (".git", "__pycache__", "venv"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "x.py").write_text("Y = 2\n")
    assert source_digest(tmp_path) == before
    (tmp_path / "net.py").write_text("X = 2\n")
    assert source_digest(tmp_path) != before


def test_a_broken_or_foreign_file_is_traced_anew_and_replaced() -> None:
    workload = _tiny_config()
    run = RunConfig(seq_len=64)
    traced, _ = scalable_profile(workload, run)
    key = cache_key(workload, run, named=False)
    assert key is not None
    path = cache_path(key)

    path.write_bytes(path.read_bytes()[:100])  # a truncated file
    assert cached_profile(workload, run, named=False) is None
    _, how = scalable_profile(workload, run)
    assert how == "traced"
    assert cached_profile(workload, run, named=False) is not None

    foreign = {"key": {**key, "model": "another"}, "profile": traced.to_json()}
    path.write_bytes(gzip.compress(json.dumps(foreign).encode()))
    assert cached_profile(workload, run, named=False) is None


def test_the_cache_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WHICHGPU_NO_CACHE", "1")
    workload = _tiny_config()
    run = RunConfig(seq_len=64)
    for _ in range(2):
        _, how = scalable_profile(workload, run)
        assert how == "traced"
    key = cache_key(workload, run, named=False)
    assert key is not None and not cache_path(key).exists()


def test_a_cache_path_that_is_a_file_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("WHICHGPU_CACHE_DIR", str(blocker))
    _, how = scalable_profile(_tiny_config(), RunConfig(seq_len=64))
    assert how == "traced"
    assert blocker.read_text() == ""


def test_the_second_cli_question_about_a_config_answers_from_the_first_trace() -> None:
    args = ("--config", str(TINY), "--gpu", "t4", "--seq-len", "64", "--json")
    first = run_cli("fit", *args)
    assert first.returncode == 0, first.stderr
    second = run_cli("predict", *args, "--batch-size", "8")
    assert second.returncode == 0, second.stderr
    third = run_cli("fit", *args)
    assert third.returncode == 0, third.stderr
    (a,), (b,) = json.loads(first.stdout), json.loads(third.stdout)
    assert a.pop("method") == "traced"
    assert b.pop("method") == "traced (kept from an earlier run)"
    assert a == b


def test_replays_are_kept_beside_the_profile_and_answer_the_next_run() -> None:
    options = {"config": str(TINY), "gpus": ["t4", "rtx-4090"], "seq_len": 64}
    first = fit(**options)  # type: ignore[arg-type]
    workload, run = _tiny_config(), RunConfig(seq_len=64)
    path = kept_file(workload, run, named=False)
    assert path is not None
    assert path.with_name(path.name.replace(".json.gz", ".replays.json.gz")).is_file()

    replay_cache.forget_kept_memories()  # as a new process would start
    again = fit(**options)  # type: ignore[arg-type]
    assert [e.model_dump() for e in again] == [
        {**e.model_dump(), "method": "traced (kept from an earlier run)"} for e in first
    ]
    profile = cached_profile(workload, run, named=False)
    assert profile is not None
    assert replay_cache.kept_memory(profile, path).live_replays == 0


def test_kept_replays_of_other_profile_bytes_are_ignored() -> None:
    options = {"config": str(TINY), "gpus": ["t4"], "seq_len": 64}
    fit(**options)  # type: ignore[arg-type]
    workload, run = _tiny_config(), RunConfig(seq_len=64)
    path = kept_file(workload, run, named=False)
    assert path is not None
    path.write_bytes(gzip.compress(gzip.decompress(path.read_bytes()), mtime=1))  # new bytes
    replay_cache.forget_kept_memories()
    fit(**options)  # type: ignore[arg-type]
    profile = cached_profile(workload, run, named=False)
    assert profile is not None
    assert replay_cache.kept_memory(profile, path).live_replays > 0


def test_files_unused_for_long_are_deleted_and_nothing_else(tmp_path: Path) -> None:
    old, recent = "a" * 32 + ".json.gz", "b" * 32 + ".json.gz"
    old_replays, stray = "a" * 32 + ".replays.json.gz", "." + "c" * 32 + ".json.gz.0a1b.tmp"
    users = "notes.json.gz"
    for name in (old, recent, old_replays, stray, users):
        (tmp_path / name).write_bytes(b"x")
    long_ago = time.time() - (UNUSED_DAYS + 1) * 86400
    for name in (old, old_replays, stray, users):
        os.utime(tmp_path / name, (long_ago, long_ago))
    deleted = forget_unused(tmp_path)
    assert sorted(p.name for p in deleted) == sorted([old, old_replays, stray])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([recent, users])


def _cache_doc(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    capsys.readouterr()
    assert main(["cache", *args, "--json"]) == 0
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    return doc


def test_cache_list_and_clear(capsys: pytest.CaptureFixture[str]) -> None:
    assert _cache_doc(capsys, "list")["traces"] == []
    workload, run = _tiny_config(), RunConfig(seq_len=64)
    fit(config=str(TINY), gpus=["t4"], seq_len=64)
    path = kept_file(workload, run, named=False)
    assert path is not None

    # a trace another version kept, and a file that cannot be read
    doc = json.loads(gzip.decompress(path.read_bytes()))
    doc["key"]["torch"] = "0.0.1"
    older = path.with_name("0" * 32 + ".json.gz")
    older.write_bytes(gzip.compress(json.dumps(doc).encode()))
    broken = path.with_name("f" * 32 + ".json.gz")
    broken.write_bytes(b"not gzip")

    listed = {t["file"]: t for t in _cache_doc(capsys, "list")["traces"]}
    assert set(listed) == {str(path), str(older), str(broken)}
    mine = listed[str(path)]
    assert mine["current"] and mine["workload"] == str(TINY)
    assert mine["run"] == "train, bf16, adamw"
    assert mine["size_bytes"] > path.stat().st_size  # the replays beside it count too
    assert not listed[str(older)]["current"]
    assert listed[str(broken)]["workload"] == "(unreadable)"

    stale = _cache_doc(capsys, "clear", "--stale")
    assert stale["deleted"] == 2
    assert [t["file"] for t in _cache_doc(capsys, "list")["traces"]] == [str(path)]
    everything = _cache_doc(capsys, "clear")
    assert everything["deleted"] == 1 and everything["freed_bytes"] == mine["size_bytes"]
    assert list(path.parent.iterdir()) == []


def test_cache_commands_print_tables() -> None:
    fit_run = run_cli("fit", "--config", str(TINY), "--gpu", "t4", "--seq-len", "64", "--json")
    assert fit_run.returncode == 0, fit_run.stderr
    listed = run_cli("cache", "list")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.startswith("1 trace in ")
    assert "tiny-llama.json" in listed.stdout and "yes" in listed.stdout
    cleared = run_cli("cache", "clear")
    assert cleared.returncode == 0, cleared.stderr
    assert cleared.stdout.startswith("Deleted 1 trace (")
