"""The results store: storage, lookup, files, safety (foreign files, versions, concurrent writers,
a killed writer), the Lambda-style pivot, and the ``whichgpu results`` commands end to end."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import os
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_cli
from whichgpu.errors import StoreError, UsageError
from whichgpu.report.results import result_doc, results_doc
from whichgpu.schema import SCHEMA_VERSION, BenchEnvironment, BenchResult, RunConfig
from whichgpu.store import (
    CSV_COLUMNS,
    STORE_VERSION,
    ImportFileError,
    ResultLookupError,
    ResultStore,
    pivot_results,
)
from whichgpu.store import files as store_files
from whichgpu.store import results as store_results

T0 = dt.datetime(2026, 11, 20, 9, 30, tzinfo=dt.timezone.utc)
GIB = 1 << 30


def make_env(**changes: Any) -> BenchEnvironment:
    """The environment of a run on one RTX 4090 (values as NVML and torch report them)."""
    values: dict[str, Any] = {
        "device_kind": "cuda",
        "device_name": "NVIDIA GeForce RTX 4090",
        "device_uuid": "GPU-5f1d2c3e-8a7b-4c6d-9e0f-112233445566",
        "driver_version": "560.35.03",
        "cuda_version": "12.4",
        "cudnn_version": "90100",
        "torch_version": "2.5.1+cu124",
        "libraries": {"transformers": "4.46.3", "numpy": "2.1.3"},
        "whichgpu_version": "0.1.0",
        "python_version": "3.11.7",
        "platform": "Linux-6.8.0-49-generic-x86_64-with-glibc2.39",
        "host": "lab-01",
        "cpu": "AMD Ryzen 9 7950X 16-Core Processor",
        "cpu_count": 32,
        "power_limit_w": 450.0,
        "memory_total_bytes": 25_386_352_640,
        "tf32_matmul": False,
        "tf32_cudnn": True,
        "amp_dtype": "bfloat16",
    }
    values.update(changes)
    return BenchEnvironment(**values)


def make_result(
    *,
    workload: str = "resnet50",
    precision: str = "bf16",
    gpu: str | None = "rtx-4090",
    device_name: str = "NVIDIA GeForce RTX 4090",
    throughput: float | None = 1432.7,
    batch_size: int = 256,
    n_gpus: int = 1,
    minutes: int = 0,
    result_id: str | None = None,
    **changes: Any,
) -> BenchResult:
    """A realistic training measurement (ResNet-50, bf16, batch 256 on an RTX 4090 by default);
    ``minutes`` after ``T0``."""
    step = batch_size * n_gpus / throughput if throughput else None
    values: dict[str, Any] = {
        "id": result_id or uuid.uuid4().hex,
        "workload": workload,
        "run": RunConfig(precision=precision, batch_size=batch_size, gpus=n_gpus),
        "device": "cuda:0",
        "device_name": device_name,
        "gpu": gpu,
        "n_gpus": n_gpus,
        "precision": precision,
        "batch_size": batch_size,
        "seq_len": None,
        "max_batch_size": 384,
        "max_batch_resolution": 8,
        "throughput": throughput,
        "throughput_unit": "images/s",
        "step_time_s": step,
        "step_time_iqr_s": 0.0021 if step else None,
        "iterations": 60,
        "warmup_iterations": 12,
        "measured_s": 10.7,
        "peak_allocated_bytes": 17_824_500_224,
        "peak_reserved_bytes": 19_478_347_776,
        "device_used_bytes": 20_215_480_320,
        "power_w": 431.6,
        "energy_j_per_sample": 0.3012,
        "sm_clock_mhz": 2610.0,
        "temperature_c": 71.0,
        "utilization": 0.98,
        "flops_per_step": 6.2e12,
        "mfu": 0.412,
        "notes": ("step times steady after 12 warm-up steps",),
        "environment": make_env(device_name=device_name),
        "created_at": T0 + dt.timedelta(minutes=minutes),
    }
    values.update(changes)
    return BenchResult(**values)


def make_fake_result(**changes: Any) -> BenchResult:
    """A run on the simulated test device: no GPU, most optional figures unknown."""
    values: dict[str, Any] = {
        "id": uuid.uuid4().hex,
        "workload": "bert-base",
        "run": RunConfig(precision="fp32", batch_size=8, seq_len=128),
        "device": "fake",
        "device_name": "fake",
        "gpu": None,
        "n_gpus": 1,
        "precision": "fp32",
        "batch_size": 8,
        "seq_len": 128,
        "throughput": 812.5,
        "throughput_unit": "sequences/s",
        "step_time_s": 0.00984,
        "step_time_iqr_s": 0.0001,
        "iterations": 20,
        "warmup_iterations": 3,
        "measured_s": 0.197,
        "environment": BenchEnvironment(
            device_kind="fake",
            device_name="fake",
            whichgpu_version="0.1.0",
            python_version="3.11.7",
            platform="Linux-6.8.0-x86_64",
            host="ci",
        ),
        "created_at": T0,
    }
    values.update(changes)
    return BenchResult(**values)


def make_two_gpu_result(**changes: Any) -> BenchResult:
    """Two RTX 4090s, data parallel, with per-rank figures and a scaling efficiency."""
    return make_result(
        n_gpus=2,
        throughput=2751.2,
        scaling_efficiency=0.96,
        per_rank=(
            {"step_time_s": 0.1861, "peak_reserved_bytes": 19_478_347_776.0},
            {"step_time_s": 0.1859, "peak_reserved_bytes": 19_480_444_928.0},
        ),
        environment=make_env(device_count=2, interconnect="PCIe 4.0 x16"),
        **changes,
    )


@pytest.fixture
def store(tmp_path: Path) -> ResultStore:
    return ResultStore(tmp_path / "data" / "results.sqlite")


def _files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


# --- Storing and finding -------------------------------------------------------------------------


def test_default_path_comes_from_the_environment(tmp_path: Path) -> None:
    assert ResultStore().path == tmp_path / "results.sqlite"  # set by conftest


def test_a_missing_store_reads_as_empty_and_is_not_created(store: ResultStore) -> None:
    assert store.list() == []
    with pytest.raises(ResultLookupError, match="holds none yet"):
        store.get("abc")
    with pytest.raises(ResultLookupError):
        store.delete("abc")
    assert not store.path.parent.exists()


def test_add_then_get_by_id_or_prefix(store: ResultStore) -> None:
    result = make_result()
    assert store.add(result) == result.id
    assert store.path.exists()  # the folder and the file were made by the first write
    assert store.get(result.id) == result
    assert store.get(result.id[:6]) == result
    assert store.get(result.id[:6].upper()) == result


def test_an_ambiguous_prefix_lists_the_candidates(store: ResultStore) -> None:
    first = make_result(result_id="abc1" + "0" * 28)
    second = make_result(result_id="abc2" + "0" * 28, workload="vit-b16", minutes=5)
    store.add_many([first, second])
    with pytest.raises(ResultLookupError) as caught:
        store.get("abc")
    assert set(caught.value.candidates) == {first.id, second.id}
    assert "abc10000" in str(caught.value) and "vit-b16" in str(caught.value)
    assert isinstance(caught.value, StoreError) and isinstance(caught.value, UsageError)
    assert store.get("abc2") == second
    # ids that share their first 12 characters are shown long enough to tell apart
    third = make_result(result_id="0" * 20 + "1" + "0" * 11, minutes=7)
    fourth = make_result(result_id="0" * 20 + "2" + "0" * 11, minutes=8)
    store.add_many([third, fourth])
    with pytest.raises(ResultLookupError) as caught:
        store.get("0000")
    assert third.id[:24] in str(caught.value) and fourth.id[:24] in str(caught.value)


def test_an_unknown_id_says_where_to_look(store: ResultStore) -> None:
    store.add(make_result())
    with pytest.raises(ResultLookupError, match="results list"):
        store.get("zzzz")
    with pytest.raises(ResultLookupError):
        store.get("%")  # LIKE wildcards are taken literally


def test_adding_twice_changes_nothing_and_a_stored_id_is_never_overwritten(
    store: ResultStore,
) -> None:
    result = make_result()
    assert store.add_many([result, make_result()]) == 2
    assert store.add_many([result]) == 0
    changed = result.model_copy(update={"throughput": 9999.0})
    with pytest.raises(StoreError, match="never overwritten"):
        store.add_many([make_result(), changed])
    assert store.get(result.id) == result
    assert len(store.list()) == 2  # all or nothing: the other new result was not added


def test_list_is_newest_first_and_filters(store: ResultStore) -> None:
    old = make_result(minutes=0)
    vit = make_result(workload="vit-b16", minutes=10)
    h200 = make_result(gpu="h200-sxm", device_name="NVIDIA H200", throughput=3510.0, minutes=20)
    fake = make_fake_result(created_at=T0 + dt.timedelta(minutes=30))
    store.add_many([vit, fake, old, h200])
    assert [r.id for r in store.list()] == [fake.id, h200.id, vit.id, old.id]
    assert [r.id for r in store.list(workload="RESNET50")] == [h200.id, old.id]
    assert [r.id for r in store.list(gpu="rtx-4090")] == [vit.id, old.id]
    assert [r.id for r in store.list(device="h200")] == [h200.id]
    assert [r.id for r in store.list(device="geforce", workload="resnet50")] == [old.id]
    assert [r.id for r in store.list(limit=2)] == [fake.id, h200.id]
    with pytest.raises(UsageError):
        store.list(limit=0)


def test_times_in_other_zones_sort_by_the_instant(store: ResultStore) -> None:
    later_in_utc = make_result(created_at=dt.datetime(2026, 11, 20, 8, 0, tzinfo=dt.timezone.utc))
    east = dt.timezone(dt.timedelta(hours=9))
    earlier = make_result(created_at=dt.datetime(2026, 11, 20, 16, 0, tzinfo=east))  # 07:00 UTC
    store.add_many([earlier, later_in_utc])
    assert [r.id for r in store.list()] == [later_in_utc.id, earlier.id]


def test_delete_returns_the_result_and_removes_it(store: ResultStore) -> None:
    keep, gone = make_result(), make_result(minutes=1)
    store.add_many([keep, gone])
    assert store.delete(gone.id[:8]) == gone
    assert store.list() == [keep]
    with pytest.raises(ResultLookupError):
        store.get(gone.id)


# --- Files ---------------------------------------------------------------------------------------


def _varied_results() -> list[BenchResult]:
    return [
        make_result(),
        make_result(workload="vit-b16", precision="fp16", minutes=1, compiled=True),
        make_result(throughput=None, max_batch_size=None, minutes=2),  # did not fit
        make_two_gpu_result(minutes=3),
        make_fake_result(created_at=T0 + dt.timedelta(minutes=4), notes=()),
        make_result(
            workload="llama-3.2-1b",
            run=RunConfig(method="lora", seq_len=2048, batch_size=4),
            batch_size=4,
            seq_len=2048,
            max_seq_len=4096,
            throughput_unit="tokens/s",
            throughput=18_734.123456789,
            memory_limit_bytes=16 * GIB,
            gpu=None,
            device_name='Odd "name", with, commas\nnewlines\r\nof all\u2028kinds',
            minutes=5,
        ),
    ]


@pytest.mark.parametrize("suffix", [".json", ".csv"])
def test_export_then_import_gives_back_equal_results(
    store: ResultStore, tmp_path: Path, suffix: str
) -> None:
    results = _varied_results()
    store.add_many(results)
    target = tmp_path / "out" / f"lab-01{suffix}"
    summary = store.export(target)
    assert (summary.results, summary.format) == (len(results), suffix[1:])
    assert _files(target.parent) == [target.name]  # no temporary file left behind

    other = ResultStore(tmp_path / "other.sqlite")
    imported = other.import_file(target)
    assert (imported.records, imported.added) == (len(results), len(results))
    assert imported.already_present == 0
    assert other.list() == store.list()
    again = other.import_file(target)
    assert (again.added, again.already_present) == (0, len(results))
    assert len(other.list()) == len(results)


def test_export_shapes(store: ResultStore, tmp_path: Path) -> None:
    store.add_many([make_result(minutes=1), make_result()])
    store.export(tmp_path / "r.json")
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["schema_version"] == SCHEMA_VERSION
    assert [r["created_at"] for r in doc["results"]] == sorted(
        r["created_at"] for r in doc["results"]
    )
    store.export(tmp_path / "r.csv")
    lines = (tmp_path / "r.csv").read_text().splitlines()
    header = lines[0].split(",")
    assert tuple(header) == CSV_COLUMNS
    assert {"run_json", "environment_json", "throughput", "peak_reserved_bytes"} <= set(header)
    covered = {c.removesuffix("_json") for c in header} - {"schema_version"}
    assert covered == set(BenchResult.model_fields)  # every field has a column
    assert len(lines) == 3


def test_export_filters_and_format_choice(store: ResultStore, tmp_path: Path) -> None:
    store.add_many([make_result(), make_result(workload="vit-b16")])
    summary = store.export(tmp_path / "vit.data", "json", workload="vit-b16")
    assert summary.results == 1
    assert json.loads((tmp_path / "vit.data").read_text())["results"][0]["workload"] == "vit-b16"
    with pytest.raises(UsageError, match=r"\.json or \.csv"):
        store.export(tmp_path / "out.txt")


def test_a_failed_export_leaves_the_old_file(
    store: ResultStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.add(make_result())
    target = tmp_path / "keep.json"
    target.write_text("the previous export\n")

    def broken(out: Any, results: Any) -> None:
        out.write('{"schema_version": 1, "results": [')
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store_files, "_write_json", broken)
    with pytest.raises(StoreError, match="No space left"):
        store.export(target)
    assert target.read_text() == "the previous export\n"
    assert _files(tmp_path) == ["data", "keep.json"]


def test_import_accepts_what_json_output_prints(store: ResultStore, tmp_path: Path) -> None:
    results = [make_result(), make_two_gpu_result(minutes=1)]
    listed = tmp_path / "listed.json"
    listed.write_text(json.dumps(results_doc(results)))
    shown = tmp_path / "shown.json"
    single = make_fake_result()
    shown.write_text(json.dumps(result_doc(single)))
    assert store.import_file(listed).added == 2
    assert store.import_file(shown).added == 1
    assert store.get(single.id) == single


def _bad_import(store: ResultStore, path: Path) -> ImportFileError:
    with pytest.raises(ImportFileError) as caught:
        store.import_file(path)
    assert store.list() == []  # nothing of an invalid file is imported
    assert isinstance(caught.value, UsageError)
    return caught.value


def test_import_errors_name_the_file_record_and_field(store: ResultStore, tmp_path: Path) -> None:
    good, bad = make_result().model_dump(mode="json"), make_result().model_dump(mode="json")
    bad["throughput"] = "fast"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"schema_version": 1, "results": [good, bad]}))
    message = str(_bad_import(store, path))
    assert str(path) in message and "results[1]" in message and "'throughput'" in message

    nested = make_result().model_dump(mode="json")
    nested["environment"]["cpu_count"] = "many"
    path.write_text(json.dumps({"schema_version": 1, "results": [nested]}))
    assert "environment.cpu_count" in str(_bad_import(store, path))

    path.write_text('{"schema_version": 1, "results": [')
    assert "not valid JSON" in str(_bad_import(store, path))

    path.write_text(json.dumps({"schema_version": SCHEMA_VERSION + 1, "results": []}))
    newer = str(_bad_import(store, path))
    assert "newer whichgpu" in newer and "Upgrade whichgpu" in newer
    assert "Fix the file" not in newer and ".." not in newer

    # values no measurement can have, and ids that are not hexadecimal
    for field, value in (
        ("throughput", -5.0),
        ("batch_size", 0),
        ("step_time_s", -1.0),
        ("id", "zz"),
        ("power_w", -3.0),
    ):
        impossible = make_result().model_dump(mode="json") | {field: value}
        path.write_text(json.dumps({"schema_version": 1, "results": [impossible]}))
        assert f"'{field}'" in str(_bad_import(store, path)), field

    # one id twice in the file with different values
    first = make_result()
    twice = [first, first.model_copy(update={"throughput": 1.0})]
    path.write_text(
        json.dumps({"schema_version": 1, "results": [r.model_dump(mode="json") for r in twice]})
    )
    message = str(_bad_import(store, path))
    assert "results[1]" in message and "also results[0]'s" in message

    path.write_text(json.dumps({"gpus": []}))
    assert "not a whichgpu results file" in str(_bad_import(store, path))

    assert "cannot be read" in str(_bad_import(store, tmp_path / "missing.json"))


def test_csv_import_errors_name_the_line_and_column(store: ResultStore, tmp_path: Path) -> None:
    source = ResultStore(tmp_path / "source.sqlite")
    source.add_many([make_result(), make_result(minutes=1)])
    exported = tmp_path / "good.csv"
    source.export(exported)
    lines = exported.read_text().splitlines(keepends=True)
    path = tmp_path / "bad.csv"

    path.write_text(lines[0] + lines[1] + lines[2].replace(",1,bf16,256,", ",one,bf16,256,", 1))
    message = str(_bad_import(store, path))
    assert str(path) in message and "line 3" in message and "'n_gpus'" in message

    row = next(csv.reader([lines[1]]))
    row[CSV_COLUMNS.index("run_json")] = "{not json"
    text = io.StringIO()
    csv.writer(text).writerow(row)
    path.write_text(lines[0] + text.getvalue())
    assert "'run_json'" in str(_bad_import(store, path))

    path.write_text(lines[0].rstrip("\n") + ",colour\n")
    assert "unknown column" in str(_bad_import(store, path))

    path.write_text("")
    assert "empty" in str(_bad_import(store, path))


def test_an_import_never_overwrites_a_different_stored_result(
    store: ResultStore, tmp_path: Path
) -> None:
    stored = make_result()
    store.add(stored)
    path = tmp_path / "changed.json"
    changed = stored.model_copy(update={"throughput": 1.0}).model_dump(mode="json")
    path.write_text(json.dumps({"schema_version": 1, "results": [changed]}))
    with pytest.raises(ImportFileError, match="already stored with other values"):
        store.import_file(path)
    assert store.list() == [stored]


# --- Files that are not stores, versions --------------------------------------------------------


def _refused(store: ResultStore, match: str) -> None:
    for attempt in (store.list, lambda: store.add(make_result()), lambda: store.get("ab")):
        with pytest.raises(StoreError, match=match) as caught:
            attempt()
        assert str(store.path) in str(caught.value)


def test_a_file_that_is_not_sqlite_is_refused_and_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "results.sqlite"
    content = b"These are my lab notes, not a database.\n" * 200
    path.write_bytes(content)
    _refused(ResultStore(path), "not a SQLite database")
    assert path.read_bytes() == content
    assert _files(tmp_path) == ["results.sqlite"]


def test_another_programs_database_is_refused_and_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "mine.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, text TEXT)")
        conn.execute("INSERT INTO notes (text) VALUES ('keep me')")
    conn.close()
    content = path.read_bytes()
    _refused(ResultStore(path), "not a whichgpu results store")
    assert path.read_bytes() == content
    assert _files(tmp_path) == ["mine.sqlite"]


def test_a_store_from_a_newer_whichgpu_is_refused(store: ResultStore) -> None:
    store.add(make_result())
    conn = sqlite3.connect(store.path)
    conn.execute("UPDATE meta SET value = '99' WHERE key = 'store_version'")
    conn.commit()
    conn.close()
    content = store.path.read_bytes()
    _refused(store, "newer whichgpu.*Upgrade whichgpu")
    assert store.path.read_bytes() == content


def test_a_damaged_row_names_the_result(store: ResultStore) -> None:
    result = make_result()
    store.add(result)
    conn = sqlite3.connect(store.path)
    conn.execute("UPDATE results SET result_json = '{}'")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match=result.id):
        store.list()


def test_the_layout_version_is_the_number_of_steps() -> None:
    assert STORE_VERSION == len(store_results._STEPS) == 1


def _add_note_column(conn: sqlite3.Connection) -> None:
    """A made-up version 2 (a free-text note on each result), to exercise the upgrade path."""
    conn.execute("ALTER TABLE results ADD COLUMN note TEXT NOT NULL DEFAULT ''")


def test_an_older_store_is_upgraded_after_a_copy_is_saved(
    store: ResultStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    results = [make_result(), make_two_gpu_result(minutes=1)]
    store.add_many(results)  # a version-1 store, as this whichgpu writes it
    monkeypatch.setattr(store_results, "_STEPS", (*store_results._STEPS, _add_note_column))
    monkeypatch.setattr(store_results, "STORE_VERSION", 2)

    assert store.list() == sorted(results, key=lambda r: r.created_at, reverse=True)
    conn = sqlite3.connect(store.path)
    version = conn.execute("SELECT value FROM meta WHERE key = 'store_version'").fetchone()[0]
    columns = [row[1] for row in conn.execute("PRAGMA table_info(results)")]
    conn.close()
    assert version == "2" and "note" in columns
    backup = store.path.with_name("results.sqlite.v1.bak")
    conn = sqlite3.connect(backup)
    assert conn.execute("SELECT value FROM meta WHERE key = 'store_version'").fetchone()[0] == "1"
    assert conn.execute("SELECT count(*) FROM results").fetchone()[0] == 2
    conn.close()

    fresh = ResultStore(tmp_path / "fresh.sqlite")  # a new store is built by the same steps
    fresh.add(results[0])
    conn = sqlite3.connect(fresh.path)
    assert "note" in [row[1] for row in conn.execute("PRAGMA table_info(results)")]
    conn.close()
    assert not fresh.path.with_name("fresh.sqlite.v1.bak").exists()


# --- Processes -----------------------------------------------------------------------------------

WRITER = """
import sys, uuid
from pathlib import Path
from whichgpu.schema import BenchResult
from whichgpu.store import ResultStore

template = BenchResult.model_validate_json(Path(sys.argv[1]).read_text())
store = ResultStore(Path(sys.argv[2]))
count = int(sys.argv[3])
i = 0
while count < 0 or i < count:
    store.add(template.model_copy(update={"id": uuid.uuid4().hex, "batch_size": i + 1}))
    i += 1
"""


def _writer(tmp_path: Path, store: ResultStore, count: int) -> subprocess.Popen[str]:
    template = tmp_path / "template.json"
    if not template.exists():
        template.write_text(make_result().model_dump_json())
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, str(template), str(store.path), str(count)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_two_processes_writing_at_once_both_land(store: ResultStore, tmp_path: Path) -> None:
    writers = [_writer(tmp_path, store, 40) for _ in range(2)]  # racing to create the store, too
    errors = [proc.communicate(timeout=120)[1] for proc in writers]
    assert [proc.returncode for proc in writers] == [0, 0], errors
    results = store.list()
    assert len(results) == 80
    assert len({r.id for r in results}) == 80


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")
def test_a_writer_killed_mid_write_leaves_a_readable_store(
    store: ResultStore, tmp_path: Path
) -> None:
    for wanted in (5, 25):  # kill it twice, at different moments
        before = len(store.list())
        proc = _writer(tmp_path, store, -1)
        deadline = time.monotonic() + 90
        try:
            while len(store.list()) < before + wanted:  # reading while it writes
                assert proc.poll() is None, proc.communicate()[1]
                assert time.monotonic() < deadline
                time.sleep(0.01)
        finally:  # never left writing forever, whatever failed above
            proc.kill()
            proc.communicate()
        results = store.list()  # every row validates as a BenchResult
        assert len(results) >= before + wanted
    conn = sqlite3.connect(store.path)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.close()
    store.add(make_result())  # and it takes new results
    assert len(store.list()) == len(results) + 1


# --- Lambda-style tables -------------------------------------------------------------------------


def test_pivot_uses_the_newest_result_and_says_so() -> None:
    old = make_result(throughput=1200.0, minutes=0)
    new = make_result(throughput=1432.7, minutes=60)
    h200 = make_result(gpu="h200-sxm", device_name="NVIDIA H200", throughput=2865.4)
    pivot = pivot_results([old, h200, new], reference="rtx-4090")
    (row,) = pivot.rows
    assert row.cells["rtx-4090"].result_id == new.id
    assert row.cells["rtx-4090"].results == 2
    assert row.cells["h200-sxm"].relative_throughput == pytest.approx(2.0, rel=1e-3)
    assert pivot.devices == ("rtx-4090", "h200-sxm")
    assert any("newest" in note and "2 results" in note for note in pivot.notes)


def test_pivot_rows_split_by_precision_and_columns_by_gpu_count() -> None:
    results = [
        make_result(),
        make_result(precision="fp32", throughput=512.0),
        make_two_gpu_result(),
        make_result(gpu="rtx-3090", device_name="NVIDIA GeForce RTX 3090", throughput=780.0),
    ]
    checkpointed = make_result(run=RunConfig(batch_size=256, checkpointing=True), minutes=9)
    results.append(checkpointed)  # another setting: its own row, not the newest of bf16's
    pivot = pivot_results(results, reference="NVIDIA GeForce RTX 3090")  # a reported name
    assert pivot.reference == "rtx-3090" and pivot.reference_chosen
    assert set(pivot.devices) == {"rtx-4090", "2x rtx-4090", "rtx-3090"}
    assert [(r.workload, r.precision, r.checkpointing) for r in pivot.rows] == [
        ("resnet50", "bf16", False),
        ("resnet50", "bf16", True),
        ("resnet50", "fp32", False),
    ]
    bf16, _, fp32 = pivot.rows
    assert bf16.cells["rtx-4090"].results == 1
    assert bf16.cells["2x rtx-4090"].relative_throughput == pytest.approx(2751.2 / 780.0)
    assert fp32.cells["rtx-4090"].relative_throughput is None  # no 3090 measurement in fp32
    assert any("2 of 3 rows" in note for note in pivot.notes)


def test_pivot_reference_matching() -> None:
    results = [make_result(), make_two_gpu_result(), make_fake_result()]
    assert pivot_results(results, "4090").reference == "rtx-4090"  # the single-GPU one wins
    assert pivot_results(results, "2x").reference == "2x rtx-4090"
    assert pivot_results(results).reference == "fake"  # a tie: fewer devices, then the name
    more = [*results, make_result(workload="vit-b16")]
    assert pivot_results(more).reference == "rtx-4090"  # the device measured most
    with pytest.raises(UsageError, match="Devices with results: 2x rtx-4090, fake, rtx-4090"):
        pivot_results(results, "a100")
    h100s = [
        make_result(gpu="h100-sxm", device_name="NVIDIA H100 80GB HBM3"),
        make_result(gpu="h100-pcie", device_name="NVIDIA H100 PCIe"),
    ]
    with pytest.raises(UsageError, match="several"):
        pivot_results(h100s, "h100")
    assert pivot_results([]).rows == ()


# --- The command line ----------------------------------------------------------------------------


@pytest.fixture
def filled(tmp_path: Path) -> list[BenchResult]:
    """The test's default store (WHICHGPU_STORE) holding a few results."""
    results = [
        make_result(),
        make_result(gpu="rtx-3090", device_name="NVIDIA GeForce RTX 3090", throughput=780.0),
        make_two_gpu_result(minutes=5),
    ]
    ResultStore().add_many(results)
    return results


REQUIRED_KEYS = {
    "id",
    "workload",
    "device_name",
    "gpu",
    "n_gpus",
    "precision",
    "batch_size",
    "max_batch_size",
    "throughput",
    "throughput_unit",
    "step_time_s",
    "step_time_iqr_s",
    "peak_allocated_bytes",
    "peak_reserved_bytes",
    "power_w",
    "energy_j_per_sample",
    "mfu",
    "environment",
    "created_at",
    "schema_version",
}


def test_cli_list_json_and_table(filled: list[BenchResult]) -> None:
    result = run_cli("results", "list", "--json")
    assert result.returncode == 0, result.stderr
    docs = json.loads(result.stdout)
    assert docs[0]["id"] == filled[2].id  # newest first
    assert all(set(d) >= REQUIRED_KEYS for d in docs)
    assert docs == results_doc(ResultStore().list())

    result = run_cli("results", "list", "--gpu", "3090", "--json")
    assert [d["id"] for d in json.loads(result.stdout)] == [filled[1].id]

    result = run_cli("results", "list", "--workload", "resnet50", "--limit", "2")
    assert result.returncode == 0, result.stderr
    assert filled[2].id[:8] in result.stdout and "newest first" in result.stdout
    assert "2x rtx-4090" in result.stdout and "images/s" in result.stdout


def test_cli_list_of_an_empty_store(tmp_path: Path) -> None:
    result = run_cli("results", "list", "--json", "--store", str(tmp_path / "none.sqlite"))
    assert (result.returncode, json.loads(result.stdout)) == (0, [])
    result = run_cli("results", "list")
    assert result.returncode == 0 and "No results" in result.stdout
    assert not (tmp_path / "none.sqlite").exists()


def test_cli_show(filled: list[BenchResult]) -> None:
    wanted = filled[2]
    result = run_cli("results", "show", wanted.id[:8], "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == result_doc(wanted)
    result = run_cli("results", "show", wanted.id[:8])
    assert result.returncode == 0, result.stderr
    for text in (wanted.id, "Environment", "PCIe 4.0 x16", "Per rank", "scaling_efficiency"):
        assert text in result.stdout


def test_cli_bad_ids_are_usage_errors(filled: list[BenchResult]) -> None:
    result = run_cli("results", "show", "zzzz")
    assert result.returncode == 2
    assert "error:" in result.stderr and "zzzz" in result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_cli_export_import_round_trip(filled: list[BenchResult], tmp_path: Path) -> None:
    other = str(tmp_path / "team.sqlite")
    for name in ("lab.json", "lab.csv"):
        target = str(tmp_path / name)
        result = run_cli("results", "export", target, "--json")
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["results"] == 3
        result = run_cli("results", "import", target, "--store", other, "--json")
        assert result.returncode == 0, result.stderr
        summary = json.loads(result.stdout)
        assert (summary["added"], summary["already_present"]) == (
            (3, 0) if name.endswith("json") else (0, 3)
        )
    assert ResultStore(Path(other)).list() == ResultStore().list()
    result = run_cli("results", "import", str(tmp_path / "lab.csv"), "--store", other)
    # the line wraps where the temporary path's length puts it: compare the words
    assert result.returncode == 0 and "0 added, 3 already present" in " ".join(
        result.stdout.split()
    )


def test_cli_import_of_a_bad_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text(json.dumps({"schema_version": 1, "results": [{"id": "x"}]}))
    result = run_cli("results", "import", str(path))
    assert result.returncode == 2
    assert str(path) in result.stderr and "results[0]" in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_delete(filled: list[BenchResult]) -> None:
    gone = filled[0]
    result = run_cli("results", "delete", gone.id[:8], "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == result_doc(gone)
    assert run_cli("results", "show", gone.id[:8]).returncode == 2
    result = run_cli("results", "delete", filled[1].id)
    assert result.returncode == 0 and "Deleted" in result.stdout
    assert ResultStore().list() == [filled[2]]


def test_cli_table(filled: list[BenchResult]) -> None:
    result = run_cli("results", "table", "--reference", "3090", "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["reference"] == "rtx-3090" and doc["schema_version"] == SCHEMA_VERSION
    (row,) = doc["rows"]
    assert row["cells"]["rtx-4090"]["relative_throughput"] == pytest.approx(1432.7 / 780.0)
    result = run_cli("results", "table", "--reference", "3090")
    assert result.returncode == 0, result.stderr
    assert "Largest batch" in result.stdout and "relative to rtx-3090" in result.stdout
    result = run_cli("results", "table", "--reference", "a100")
    assert result.returncode == 2 and "Devices with results" in result.stderr


def test_cli_a_file_that_is_not_a_store(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("not a database\n" * 100)
    result = run_cli("results", "list", "--store", str(path))
    assert result.returncode == 1
    assert str(path) in result.stderr and "left untouched" in result.stderr
    assert "Traceback" not in result.stderr
    assert path.read_text() == "not a database\n" * 100


def test_the_store_needs_neither_torch_nor_numpy() -> None:
    program = (
        "import sys; sys.modules['torch'] = None; sys.modules['numpy'] = None\n"
        "import whichgpu.store, whichgpu.report.results\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, check=False, timeout=60
    )
    assert result.returncode == 0, result.stderr


def test_exports_get_the_permissions_of_any_new_file(store: ResultStore, tmp_path: Path) -> None:
    store.add(make_result())
    target = tmp_path / "mine.json"
    old = os.umask(0o022)
    try:
        store.export(target)
    finally:
        os.umask(old)
    assert target.stat().st_mode & 0o777 == 0o644
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


# --- Never writing over a store, possible values, unknown GPUs, stores that cannot be read ----


def _snapshot(store: ResultStore) -> tuple[bytes, list[BenchResult]]:
    return store.path.read_bytes(), store.list()


def test_an_export_is_never_written_over_the_store_or_another_database(
    store: ResultStore, tmp_path: Path
) -> None:
    store.add_many([make_result(), make_result(minutes=1)])
    before = _snapshot(store)
    spelled_otherwise = store.path.parent / ".." / store.path.parent.name / store.path.name
    for target in (store.path, spelled_otherwise, Path(f"{store.path}-wal")):
        with pytest.raises(UsageError, match="the results store") as refused:
            store.export(target, "json")
        assert "Choose another file name" in str(refused.value)
    link = tmp_path / "link.json"
    link.symlink_to(store.path)
    with pytest.raises(UsageError, match="the results store"):
        store.export(link)
    # another SQLite file, likely someone's store, is refused by its header
    other = ResultStore(tmp_path / "team.db")
    other.add(make_result())
    kept = other.path.read_bytes()
    with pytest.raises(UsageError, match="is a SQLite database"):
        store.export(other.path, "json")
    assert other.path.read_bytes() == kept
    assert _snapshot(store) == before
    assert not [p for p in store.path.parent.iterdir() if p.name.endswith(".tmp")]


def test_the_cli_never_writes_an_export_or_a_report_over_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    named = ResultStore(tmp_path / "named.sqlite")
    named.add(make_result())
    before = _snapshot(named)
    path = str(named.path)
    for args in (
        ("results", "export", path, "--store", path, "--format", "json"),
        ("report", "resnet50", "--gpu", "4090", "--store", path, "--out", path),
    ):
        result = run_cli(*args)
        assert result.returncode == 2, result.stderr
        assert "is the results store" in result.stderr and "Traceback" not in result.stderr
    assert _snapshot(named) == before
    # the default store when no --store is given ($XDG_DATA_HOME/whichgpu/results.sqlite)
    monkeypatch.delenv("WHICHGPU_STORE")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    default = ResultStore()
    assert default.path == tmp_path / "data" / "whichgpu" / "results.sqlite"
    default.add(make_result())
    before = _snapshot(default)
    for args in (
        ("results", "export", str(default.path), "--format", "csv"),
        ("report", "resnet50", "--gpu", "4090", "--out", str(default.path)),
    ):
        result = run_cli(*args)
        assert result.returncode == 2 and "is the results store" in result.stderr, result.stderr
    # and any SQLite file, whichever store is in use
    result = run_cli("report", "resnet50", "--gpu", "4090", "--out", path)
    assert result.returncode == 2 and "is a SQLite database" in result.stderr
    assert _snapshot(default) == before and _snapshot(named)[0] == named.path.read_bytes()


def test_an_export_of_nothing_never_empties_an_existing_file(
    store: ResultStore, tmp_path: Path
) -> None:
    target = tmp_path / "lab.json"
    store.add(make_result())
    store.export(target)
    kept = target.read_bytes()
    for where, call in (
        (
            "does not exist",
            lambda: ResultStore(tmp_path / "typo.sqlite").export(target),
        ),
        ("matches workload 'nope'", lambda: store.export(target, workload="nope")),
    ):
        with pytest.raises(UsageError, match=where) as refused:
            call()
        assert "left as it was" in str(refused.value) and "--store" in str(refused.value)
    assert target.read_bytes() == kept
    # a new file may hold no results
    assert store.export(tmp_path / "new.json", workload="nope").results == 0
    result = run_cli("results", "export", str(target), "--store", str(tmp_path / "typo.sqlite"))
    assert result.returncode == 2 and "Nothing to export" in result.stderr
    assert target.read_bytes() == kept


def test_folders_and_paths_under_a_file_are_named_as_such(
    store: ResultStore, tmp_path: Path
) -> None:
    store.add(make_result())
    folder = tmp_path / "folder"
    folder.mkdir()
    notes = tmp_path / "notes.txt"
    notes.write_text("mine\n")
    with pytest.raises(UsageError, match="is a folder, not a file"):
        store.export(folder)
    with pytest.raises(UsageError, match="which is a file, not a directory"):
        store.export(notes / "out.json")
    with pytest.raises(ImportFileError, match="is a folder, not a file"):
        store.import_file(folder)
    with pytest.raises(ImportFileError, match="which is a file, not a directory"):
        store.import_file(notes / "in.json")
    for args in (("export", str(folder)), ("import", str(folder)), ("import", f"{notes}/x")):
        result = run_cli("results", *args, "--store", str(store.path))
        assert result.returncode == 2, result.stderr
        assert "Cannot tell the format" not in result.stderr
        assert "folder" in result.stderr or "not a directory" in result.stderr
    assert notes.read_text() == "mine\n"


def _future(days: float) -> str:
    moment = dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=days)
    return moment.isoformat().replace("+00:00", "Z")


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("mfu", 50.0, "not a fraction from 0 to 1"),
        ("mfu", -0.1, "not a fraction from 0 to 1"),
        ("utilization", 3.0, "not a fraction of the time"),
        ("created_at", "2999-01-01T00:00:00Z", "in the future"),
        ("created_at", "@2", "in the future"),
        ("workload", "", "is empty"),
        ("precision", " ", "is empty"),
        ("batch_size", 10**30, "beyond the largest number"),
        ("iterations", 2**31, "beyond the largest number"),
        ("run.batch_size", 10**12, "beyond the largest number"),
        ("peak_reserved_bytes", 2**63, "beyond the largest number"),
        ("sm_clock_mhz", float("nan"), "not a finite number"),
    ],
)
def test_import_refuses_values_no_measurement_has(
    store: ResultStore, tmp_path: Path, field: str, value: Any, says: str
) -> None:
    record = make_result().model_dump(mode="json")
    if value == "@2":
        value = _future(2)
    if "." in field:
        head, key = field.split(".")
        record[head][key] = value
    else:
        record[field] = value
    path = tmp_path / "impossible.json"
    path.write_text(json.dumps({"schema_version": 1, "results": [record]}))
    message = str(_bad_import(store, path))
    assert f"results[0], field '{field}'" in message and says in message, message


def test_import_accepts_possible_edges_and_a_clock_a_little_ahead(
    store: ResultStore, tmp_path: Path
) -> None:
    record = make_result(mfu=1.0, utilization=0.0).model_dump(mode="json")
    record["created_at"] = _future(0.5)  # clocks disagree by hours, not years
    record["peak_reserved_bytes"] = 2**40
    path = tmp_path / "edges.json"
    path.write_text(json.dumps({"schema_version": 1, "results": [record]}))
    assert store.import_file(path).added == 1


def test_an_integer_sqlite_cannot_hold_is_an_error_not_an_overflow(
    store: ResultStore, tmp_path: Path
) -> None:
    with pytest.raises(UsageError, match=r"field '(run\.)?batch_size' is 10+, beyond"):
        store.add(make_result(batch_size=10**30))
    assert store.list() == []
    record = make_result().model_dump(mode="json")
    record["batch_size"] = 10**30
    source = tmp_path / "big.json"
    source.write_text(json.dumps([record]))
    result = run_cli("results", "import", str(source), "--store", str(store.path))
    assert result.returncode == 2 and "'batch_size'" in result.stderr
    assert "Traceback" not in result.stderr and "OverflowError" not in result.stderr
    # the CSV route checks the same
    csv_file = tmp_path / "big.csv"
    good = ResultStore(tmp_path / "good.sqlite")
    good.add(make_result())
    good.export(csv_file)
    header, row = csv_file.read_text().splitlines()[:2]
    cells = next(csv.reader([row]))
    cells[CSV_COLUMNS.index("batch_size")] = str(10**30)
    text = io.StringIO()
    csv.writer(text).writerow(cells)
    csv_file.write_text(header + "\n" + text.getvalue())
    message = str(_bad_import(store, csv_file))
    assert "line 2, field 'batch_size'" in message


def _future_gpu_result(**changes: Any) -> BenchResult:
    """A result as a newer whichgpu could write it: on a GPU this catalog does not know."""
    return make_result(gpu="not-a-gpu", device_name="NVIDIA Future GPU", minutes=10, **changes)


def test_import_keeps_results_on_gpus_the_catalog_does_not_know_and_says_so(
    store: ResultStore, tmp_path: Path
) -> None:
    path = tmp_path / "newer.json"
    path.write_text(
        json.dumps(results_doc([_future_gpu_result(), _future_gpu_result(), make_result()]))
    )
    summary = store.import_file(path)
    assert summary.added == 3
    assert (summary.unknown_gpus, summary.unknown_gpu_results) == (("not-a-gpu",), 2)
    other = str(tmp_path / "other.sqlite")
    result = run_cli("results", "import", str(path), "--store", other)
    assert result.returncode == 0, result.stderr
    words = " ".join(result.stdout.split())
    assert "2 results name a GPU this whichgpu's catalog does not know (not-a-gpu)" in words
    assert "not used for predictions" in words
    doc = json.loads(run_cli("results", "import", str(path), "--store", other, "--json").stdout)
    assert doc["unknown_gpus"] == ["not-a-gpu"] and doc["unknown_gpu_results"] == 2


def test_predictions_leave_out_results_on_gpus_the_catalog_does_not_know(
    store: ResultStore,
) -> None:
    import whichgpu.api as wg

    unknown = _future_gpu_result()
    store.add_many([make_result(throughput=1234.5), unknown])
    ranking = wg.recommend("resnet50", gpus=["rtx-4090", "rtx-3090"], store=store.path)
    top = {c.gpu: c for c in ranking.ranking}
    assert top["rtx-4090"].throughput_source == "measured"
    assert any(
        "not-a-gpu, which this whichgpu's catalog does not know" in a for a in ranking.assumptions
    )
    data = wg.report("resnet50", gpus=["rtx-4090"], results=True, store=store.path)
    assert [p.source for p in data.speeds] == ["measured"]
    assert data.results is not None  # the tables still list every stored result
    with pytest.raises(UsageError, match="'not-a-gpu', which this whichgpu's catalog does not"):
        wg.predict("resnet50", gpus=["rtx-4090"], calibrate=unknown.id, store=store.path)
    calibrate = ["predict", "resnet50", "--gpu", "4090", "--calibrate", unknown.id[:8]]
    result = run_cli(*calibrate, "--store", str(store.path))
    assert result.returncode == 2 and "not-a-gpu" in result.stderr
    assert "Unknown GPU" not in result.stderr and "Traceback" not in result.stderr


def test_a_calibration_that_is_not_possible_is_refused(store: ResultStore) -> None:
    import whichgpu.api as wg
    from whichgpu.estimate.calibration import ImplausibleMeasurement

    absurd = make_result(throughput=1e15, minutes=5)
    with pytest.raises(ImplausibleMeasurement, match="not physically possible for that GPU") as e:
        wg.predict("resnet50", gpus=["rtx-4090"], calibrate=absurd)
    assert "MFU of" in str(e.value) and f"whichgpu results show {absurd.id[:8]}" in str(e.value)
    slow = make_result(batch_size=8, throughput=10.0, run=RunConfig(precision="bf16", batch_size=8))
    with pytest.raises(UsageError, match=r"outside the x0\.05 to x20"):
        wg.predict("resnet50", gpus=["rtx-4090"], calibrate=slow)
    # recommend leaves the impossible one out, says so, and uses the older possible one
    older = make_result(throughput=1200.0)
    store.add_many([absurd, older])
    ranking = wg.recommend("resnet50", gpus=["rtx-4090", "rtx-3090"], store=store.path)
    top = {c.gpu: c for c in ranking.ranking}
    assert top["rtx-4090"].throughput == pytest.approx(1200.0)
    assert any(older.id[:8] in r for r in top["rtx-3090"].reasons)  # calibrated on it
    assert any(f"measurement {absurd.id[:8]} is not used" in a for a in ranking.assumptions)
    calibrate = ["predict", "resnet50", "--gpu", "4090", "--calibrate", absurd.id[:8]]
    result = run_cli(*calibrate, "--store", str(store.path))
    assert result.returncode == 2 and "not physically possible" in result.stderr


def test_a_store_named_but_unreadable_is_an_error_in_every_command(tmp_path: Path) -> None:
    import whichgpu.api as wg

    notes = tmp_path / "notes.txt"
    notes.write_text("not a database\n" * 100)
    damaged = tmp_path / "damaged.sqlite"
    damaged.write_bytes(b"SQLite format 3\x00" + b"\xff" * 4000)
    folder = tmp_path / "folder"
    folder.mkdir()
    for bad in (notes, damaged, folder):
        with pytest.raises(StoreError, match=str(bad)):
            wg.recommend("resnet50", gpus=["rtx-4090"], store=bad)
    result = run_cli("recommend", "resnet50", "--gpu", "4090", "--store", str(notes))
    assert result.returncode == 1 and str(notes) in result.stderr
    assert "Traceback" not in result.stderr
    result = run_cli(
        "report",
        "resnet50",
        "--gpu",
        "4090",
        "--store",
        str(folder),
        "--out",
        str(tmp_path / "r.html"),
    )
    assert result.returncode == 1 and "is a folder" in result.stderr
    assert notes.read_text() == "not a database\n" * 100
    # a store that does not exist holds nothing: the predictions are used
    assert wg.recommend("resnet50", gpus=["rtx-4090"], store=tmp_path / "none.sqlite").ranking


def test_the_output_check_never_reads_a_pipe(tmp_path: Path) -> None:
    from whichgpu.files import check_output_file

    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)  # opening it to read its first bytes would wait for a writer forever
    check_output_file(pipe, "--out", ResultStore(tmp_path / "s.sqlite").own_files())
