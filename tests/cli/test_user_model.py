"""``--model FILE.py:FUNCTION`` / ``package.module:FUNCTION``: the user's own PyTorch model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli
from whichgpu.cli import main
from whichgpu.errors import UsageError, WorkloadError
from whichgpu.estimate.profile_summary import live_peak
from whichgpu.schema import RunConfig
from whichgpu.trace import trace_step
from whichgpu.workloads import select_workload
from whichgpu.workloads.user import model_workload

ROOT = Path(__file__).parents[2]
FIXTURE = "tests/fixtures/user_model.py"


def test_profile_json_of_a_model_file() -> None:
    result = run_cli("profile", "--model", f"{FIXTURE}:build", "--batch-size", "8", "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["workload"] == f"{FIXTURE}:build"
    assert doc["batch_size"] == 8 and doc["seq_len"] is None
    assert doc["params_total"] == (32 * 64 + 64) + (64 * 10 + 10)
    assert doc["throughput_unit"] == "samples" and doc["units_per_step"] == 8
    # Two Linear layers, forward 2*m*n*k each and backward twice that, no input gradient for
    # the first layer's input: 3 x forward minus the first layer's input gradient.
    forward = 2 * 8 * (32 * 64 + 64 * 10)
    assert doc["flops_per_step"] >= 2 * forward
    assert result.stderr == ""


def test_module_function_form(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # package.module is looked up from the current directory
    result = run_cli("profile", "--model", "tests.fixtures.user_model:build_sequence", "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert (doc["batch_size"], doc["seq_len"]) == (4, 16)  # from @model_defaults
    assert doc["throughput_unit"] == "tokens" and doc["units_per_step"] == 4 * 16


def test_run_config_reaches_the_function_and_seq_len_applies(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(ROOT)
    workload = select_workload(None, None, model="tests.fixtures.user_model:build_sequence")
    assert workload.info.is_sequence_model and workload.info.default_seq_len == 16
    profile = trace_step(workload, RunConfig(batch_size=2, seq_len=8, precision="bf16-pure"))
    assert profile.units_per_step == 16
    assert {op.dtype for op in profile.ops if op.kind == "gemm"} == {"bfloat16"}


def test_default_loss_and_weights_follow_the_precision() -> None:
    profile = trace_step(
        model_workload(f"{FIXTURE}:build"), RunConfig(batch_size=2, precision="bf16-pure")
    )
    assert profile.params_total == 2762
    assert {op.dtype for op in profile.ops if op.kind == "gemm"} == {"bfloat16"}


def test_the_example_traces() -> None:
    profile = trace_step(model_workload("examples/my_model.py:build"), RunConfig(batch_size=4))
    assert profile.params_total > 2_000_000
    assert any(op.kind == "conv" for op in profile.ops)


def test_an_example_batch_sets_the_default_and_is_resized() -> None:
    workload = model_workload(f"{FIXTURE}:build_with_example")
    assert workload.info.default_batch_size == 6
    assert trace_step(workload, RunConfig()).units_per_step == 6
    resized = trace_step(workload, RunConfig(batch_size=13, precision="fp32"))
    assert resized.units_per_step == 13
    assert live_peak(resized)[1]["input"] == 13 * 32 * 4  # the batch alone, not the example
    # A declared default wins over the example's size.
    assert model_workload(f"{FIXTURE}:build_sequence").info.default_batch_size == 4


def test_an_example_resizes_rows_and_keeps_other_items() -> None:
    import torch

    from whichgpu.workloads.user import _example_of

    ids = torch.arange(3)
    example = _example_of((torch.tensor([[1.0], [2.0], [3.0]]), ids, torch.ones(7), 5))
    assert example is not None and example.size == 3
    inputs, labels, other, scalar = example.as_given(example.resized(7))
    assert inputs[:, 0].tolist() == [1, 2, 3, 1, 2, 3, 1] and labels.tolist() == [
        0,
        1,
        2,
        0,
        1,
        2,
        0,
    ]
    assert other.shape == (7,) and scalar == 5  # leading size 7 is not the batch's 3: kept
    assert example.as_given(example.resized(2))[1].tolist() == [0, 1]
    assert example.resized(3)["inputs"][1] is example.value[1]


@pytest.mark.parametrize(
    ("spec", "mode"),
    [
        ("build_with_example", "inference"),
        ("build_with_labelled_example", "train"),
        ("build_with_labelled_example", "inference"),  # runs the loss: it knows the inputs
        ("build_with_keyword_example", "train"),
        ("build_with_keyword_example", "inference"),
    ],
)
def test_positional_and_keyword_examples_train_and_infer(spec: str, mode: str) -> None:
    result = run_cli("profile", f"{FIXTURE}:{spec}", "--mode", mode, "--batch-size", "9", "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["batch_size"] == 9 and doc["params_total"] == 2762


def test_a_real_step_on_a_resized_example_keeps_labels_valid() -> None:
    """A CPU bench runs the real step: labels repeated from the example stay class indices."""
    result = run_cli(
        "bench",
        f"{FIXTURE}:build_with_labelled_example",
        "--device",
        "cpu",
        "--precision",
        "fp32",
        "--batch-size",
        "10",
        "--min-seconds",
        "0.1",
        "--min-iters",
        "2",
        "--no-store",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    (doc,) = json.loads(result.stdout)
    assert doc["batch_size"] == 10 and doc["throughput"] > 0


@pytest.mark.parametrize(
    ("spec", "extra", "message"),
    [
        (
            "tests/fixtures/no_such_file.py:build",
            [],
            "no such file 'tests/fixtures/no_such_file.py'",
        ),
        (
            f"{FIXTURE}:bild",
            [],
            "has no function 'bild'. Functions there: batch_is_a_list, batch_is_a_number, build,",
        ),
        (
            f"{FIXTURE}:NOT_A_FUNCTION",
            [],
            "'NOT_A_FUNCTION' in tests/fixtures/user_model.py is an int",
        ),
        (f"{FIXTURE}:needs_two", [], "takes 2 arguments"),
        (f"{FIXTURE}:no_parameters", [], "has no trainable parameters"),
        (f"{FIXTURE}:reads_a_value", [], "the step cannot depend on tensor values"),
        (f"{FIXTURE}:raises", [], "raised ValueError: the config file is missing (at "),
        (
            f"{FIXTURE}:returns_the_model_only",
            [],
            "returned a Sequential; expected (model, batch), (model, make_batch)",
        ),
        (f"{FIXTURE}:batch_is_a_number", [], "the second item must be a batch"),
        (
            f"{FIXTURE}:build_with_keyword_example",
            ["--seq-len", "8"],
            "returns an example batch, whose shapes fix the sequence length (1)",
        ),
        (f"{FIXTURE}:prebuilt", [], "must create the model itself"),
        (f"{FIXTURE}:batch_is_a_list", [], "make_batch of --model"),
        (f"{FIXTURE}:build", ["--seq-len", "8"], "@model_defaults(seq_len=N)"),
        (FIXTURE, [], "expected FILE.py:FUNCTION or package.module:FUNCTION"),
        ("no_such_package.models:build", [], "no module named 'no_such_package'"),
    ],
)
def test_model_errors_are_clear(
    spec: str,
    extra: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(ROOT)
    code = main(["profile", "--model", spec, *extra, "--json"])
    out, err = capsys.readouterr()
    assert code == 2, err
    assert message in err
    assert json.loads(out)["error"]["message"] in err  # --json: the error on stdout too
    assert "Traceback" not in err and "bug in whichgpu" not in err


def test_errors_in_a_child_process_are_one_paragraph() -> None:
    result = run_cli("profile", "--model", f"{FIXTURE}:raises")
    assert result.returncode == 2
    assert "raised ValueError: the config file is missing" in result.stderr
    assert "user_model.py:" in result.stderr and "Traceback" not in result.stderr


def test_exactly_one_workload() -> None:
    with pytest.raises(UsageError, match="exactly one"):
        select_workload("resnet50", None, model=f"{FIXTURE}:build")
    with pytest.raises(UsageError, match="--task applies to --config only"):
        select_workload(None, None, "causal-lm", model=f"{FIXTURE}:build")
    assert issubclass(type(_error_of(f"{FIXTURE}:raises")), WorkloadError)


def test_a_model_or_config_given_where_a_workload_name_goes() -> None:
    by_name = select_workload(f"{FIXTURE}:build", None)
    assert by_name.info.name == model_workload(f"{FIXTURE}:build").info.name
    config = select_workload("tests/fixtures/tiny-llama.json", None)
    assert config.info.name == "tests/fixtures/tiny-llama.json"
    result = run_cli("fit", f"{FIXTURE}:build", "--gpu", "rtx-4090", "--json")
    assert result.returncode == 0, result.stderr
    (estimate,) = json.loads(result.stdout)
    assert estimate["workload"] == f"{FIXTURE}:build" and estimate["max_batch_size"] > 0
    unknown = run_cli("fit", "my-own-net", "--gpu", "rtx-4090")
    assert unknown.returncode != 0 and "FILE.py:FUNCTION (--model)" in unknown.stderr


def _error_of(spec: str) -> Exception:
    try:
        trace_step(model_workload(spec), RunConfig())
    except Exception as exc:
        return exc
    raise AssertionError(f"{spec} traced")


def test_a_recommendation_at_the_batch_searchs_cap_says_more_fits() -> None:
    import whichgpu.api as wg

    ranking = wg.recommend(model=f"{FIXTURE}:build", gpus=["h100-sxm"], acquire="rent", hours=10)
    (first,) = ranking.ranking
    assert "the batch search stops at 65536: more fits" in first.reasons[0]


def test_a_shape_mistake_is_one_line_without_torchs_logged_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    model = tmp_path / "shapes.py"
    model.write_text(
        "import torch\nfrom torch import nn\n\n"
        "def build():\n"
        "    net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(60, 10))\n"
        "    return net, torch.randn(4, 32)\n",
        encoding="utf-8",
    )
    code = main(["profile", "--model", f"{model}:build", "--json"])
    out, err = capsys.readouterr()
    assert code == 2, err
    assert "must have same reduction dim" in json.loads(out)["error"]["message"]
    # torch's fake-tensor logger logs the whole traceback at ERROR before raising
    assert not [r for r in caplog.records if r.name.startswith("torch")], caplog.text
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("body", "shown", "line"),
    [("import sys\nsys.exit(0)\n", "sys.exit(0)", 2), ("raise SystemExit('bye')\n", "'bye'", 1)],
)
def test_a_model_file_that_exits_at_import_is_an_input_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], body: str, shown: str, line: int
) -> None:
    model = tmp_path / "exits.py"
    model.write_text(body + "\ndef build():\n    pass\n", encoding="utf-8")
    code = main(["fit", "--model", f"{model}:build", "--gpu", "4090", "--json"])
    out, err = capsys.readouterr()
    assert code == 2
    error = json.loads(out)["error"]
    assert error["exit_code"] == 2 and error["kind"] == "UserModelError"
    assert shown in error["message"] and 'if __name__ == "__main__"' in error["message"]
    assert f"{model}:{line})" in err


def test_a_function_that_exits_is_an_input_error(tmp_path: Path) -> None:
    model = tmp_path / "exits_late.py"
    model.write_text("import sys\n\ndef build():\n    sys.exit(3)\n", encoding="utf-8")
    with pytest.raises(WorkloadError, match=r"build\(\) called sys.exit\(3\)"):
        trace_step(model_workload(f"{model}:build"), RunConfig())


def test_a_config_transformers_refuses_is_an_input_error_naming_the_fields(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = json.loads((ROOT / "tests/fixtures/tiny-llama.json").read_text(encoding="utf-8"))
    config.update(hidden_size=1000, num_attention_heads=3, num_key_value_heads=3)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    code = main(["fit", "--config", str(path), "--gpu", "4090", "--json"])
    out, err = capsys.readouterr()
    assert code == 2, err
    message = json.loads(out)["error"]["message"]
    assert "'hidden_size' (1000)" in message and "'num_attention_heads' (3)" in message
    assert "bug in whichgpu" not in err and "Traceback" not in err
