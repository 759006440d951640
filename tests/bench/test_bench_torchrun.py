"""``whichgpu bench`` under torchrun: reading its environment, a real two-rank CPU run, and
what it refuses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from whichgpu.bench.distributed import TorchrunGroup, torchrun_group
from whichgpu.cli import main
from whichgpu.errors import UsageError

ROOT = Path(__file__).resolve().parents[2]
USER_MODEL = str(ROOT / "tests" / "fixtures" / "user_model.py") + ":build"
TORCHRUN = Path(sys.executable).with_name("torchrun")

TORCHRUN_ENV = {
    "RANK": "0",
    "WORLD_SIZE": "2",
    "LOCAL_RANK": "0",
    "LOCAL_WORLD_SIZE": "2",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29500",
}
"""What torchrun sets in rank 0 of ``--nproc-per-node 2`` on one node."""

QUICK = ("--device", "cpu", "--batch-size", "4", "--min-seconds", "0.2", "--min-iters", "3")


# --- the environment ----------------------------------------------------------------------


def test_no_torchrun_environment_is_no_group() -> None:
    assert torchrun_group({}) is None
    assert torchrun_group({"LOCAL_RANK": "0", "MASTER_PORT": "1"}) is None


def test_torchrun_environment_is_read() -> None:
    group = torchrun_group(
        {
            **TORCHRUN_ENV,
            "RANK": "9",
            "WORLD_SIZE": "16",
            "LOCAL_RANK": "1",
            "LOCAL_WORLD_SIZE": "8",
            "GROUP_WORLD_SIZE": "2",
            "MASTER_ADDR": "node-01",
        }
    )
    assert group == TorchrunGroup(
        rank=9,
        world_size=16,
        local_rank=1,
        local_world_size=8,
        nodes=2,
        master_addr="node-01",
        master_port=29500,
    )
    assert not group.is_leader
    assert "16 ranks on 2 nodes" in group.describe()


def test_torchrun_environment_without_local_sizes() -> None:
    env = {k: v for k, v in TORCHRUN_ENV.items() if k != "LOCAL_WORLD_SIZE"}
    group = torchrun_group(env)
    assert group is not None and group.is_leader
    assert group.local_world_size == 2 and group.nodes == 1


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"MASTER_ADDR": None}, "MASTER_ADDR is not"),
        ({"LOCAL_RANK": None, "MASTER_PORT": None}, "LOCAL_RANK, MASTER_PORT is not"),
        ({"RANK": "two"}, "RANK='two'"),
        ({"RANK": "2"}, "do not fit"),
        ({"LOCAL_RANK": "2"}, "do not fit"),
        ({"WORLD_SIZE": "0"}, "at least 1"),
        ({"MASTER_PORT": "70000"}, "not a port"),
    ],
)
def test_a_broken_torchrun_environment_is_refused(
    change: dict[str, str | None], message: str
) -> None:
    env = {**TORCHRUN_ENV, **change}
    with pytest.raises(UsageError, match=message):
        torchrun_group({k: v for k, v in env.items() if v is not None})


# --- a real run ---------------------------------------------------------------------------


@pytest.mark.slow
def test_a_real_two_rank_torchrun_cpu_run(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env["WHICHGPU_STORE"] = str(tmp_path / "never.sqlite")
    command = [str(TORCHRUN), "--standalone", "--nproc-per-node", "2", "-m", "whichgpu"]
    command += ["bench", "--model", USER_MODEL, *QUICK, "--json", "--no-store"]
    run = subprocess.run(
        command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=180, check=False
    )
    assert run.returncode == 0, run.stderr
    document = json.loads(run.stdout)  # one document: rank 1 wrote nothing to stdout
    one, two = document
    assert one["n_gpus"] == 1 and one["throughput"] > 0
    assert any("one-GPU baseline of a torchrun run of 2 ranks" in n for n in one["notes"])
    assert two["n_gpus"] == 2 and two["run"]["gpus"] == 2 and two["batch_size"] == 4
    assert [r["rank"] for r in two["per_rank"]] == [0, 1]
    assert {r["units_per_step"] for r in two["per_rank"]} == {4}
    slowest = max(r["step_time_s"] for r in two["per_rank"])
    assert two["step_time_s"] == pytest.approx(slowest)
    assert two["throughput"] == pytest.approx(2 * 4 / slowest)
    assert two["scaling_efficiency"] == pytest.approx(two["throughput"] / (2 * one["throughput"]))
    assert any(n.startswith("torchrun: 2 ranks on 1 node") for n in two["notes"])
    assert any("measured alone right after the group run" in n for n in two["notes"])
    assert run.stderr.count("starting on --device cpu") == 1  # progress from rank 0 only
    assert "error" not in run.stderr and not (tmp_path / "never.sqlite").exists()


# --- refusals -----------------------------------------------------------------------------


def _under_torchrun(monkeypatch: pytest.MonkeyPatch, rank: int = 0) -> None:
    for name, value in {**TORCHRUN_ENV, "RANK": str(rank), "LOCAL_RANK": str(rank)}.items():
        monkeypatch.setenv(name, value)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--gpus", "2"), "--gpus 2 under torchrun"),
        (("--find-max-batch", "--memory-limit", "1"), "--find-max-batch under torchrun"),
        (("--find-max-seq-len", "--memory-limit", "1"), "--find-max-seq-len under torchrun"),
        (("--mode", "inference"), "--mode inference under torchrun"),
    ],
)
def test_what_torchrun_cannot_run_is_refused(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    extra: tuple[str, ...],
    message: str,
) -> None:
    _under_torchrun(monkeypatch)
    model = USER_MODEL.replace(":build", ":build_sequence")
    args = ["bench", "--model", model, "--device", "cpu", "--no-store", *extra]
    if "--find-max-batch" not in extra:
        args += ["--batch-size", "4"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err.replace("\n", " ") and "Traceback" not in err


def test_a_rank_other_than_0_refuses_on_stderr_only(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _under_torchrun(monkeypatch, rank=1)
    args = ["bench", "--model", USER_MODEL, *QUICK, "--gpus", "2", "--json", "--no-store"]
    assert main(args) == 2
    out, err = capsys.readouterr()
    assert out == ""  # rank 0's document is the run's, even for an error
    assert "rank 1: --gpus 2 under torchrun" in err.replace("\n", " ")
    assert "Traceback" not in err


def test_a_simulated_device_under_torchrun_is_refused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _under_torchrun(monkeypatch)
    assert main(["bench", "resnet50", "--device", "fake", "--batch-size", "2", "--no-store"]) == 2
    assert "--device fake under torchrun" in capsys.readouterr().err.replace("\n", " ")


def test_a_broken_torchrun_environment_fails_the_cli(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _under_torchrun(monkeypatch)
    monkeypatch.delenv("MASTER_ADDR")
    assert main(["bench", "--model", USER_MODEL, *QUICK, "--no-store"]) == 2
    assert "MASTER_ADDR is not" in capsys.readouterr().err.replace("\n", " ")


@pytest.mark.slow
def test_a_real_torchrun_refusal_names_the_reason(tmp_path: Path) -> None:
    """Through torchrun itself: each rank exits 2 with the reason, no traceback of ours
    (torchrun then reports its workers' failure in its own words, and exits 1)."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    command = [str(TORCHRUN), "--standalone", "--nproc-per-node", "2", "-m", "whichgpu"]
    command += ["bench", "--model", USER_MODEL, *QUICK, "--mode", "inference", "--no-store"]
    run = subprocess.run(
        command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120, check=False
    )
    assert run.returncode != 0
    assert run.stdout == ""
    assert "--mode inference under torchrun" in run.stderr.replace("\n", " ")
    assert "exitcode  : 2" in run.stderr or "exitcode: 2" in run.stderr
    assert "whichgpu/" not in run.stderr.split("ChildFailedError")[0]  # no traceback of ours
