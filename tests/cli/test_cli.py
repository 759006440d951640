"""End-to-end runs of the command line, in a child process, as a user would type them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_cli
from whichgpu.catalog import load_catalog
from whichgpu.errors import UsageError


def test_gpus_json_is_the_only_stdout() -> None:
    result = run_cli("gpus", "--json")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert len(rows) >= 70
    required = {
        "id",
        "name",
        "vendor",
        "segment",
        "architecture",
        "memory_gb",
        "memory_bandwidth_gbps",
        "fp32_tflops",
        "fp16_tensor_tflops",
        "bf16_tensor_tflops",
        "tf32_tensor_tflops",
        "fp8_tensor_tflops",
        "tdp_w",
        "launch_price_usd",
    }
    assert all(required <= set(row) for row in rows)


def test_gpus_filters_and_sorts() -> None:
    result = run_cli(
        "gpus",
        "--min-memory",
        "80",
        "--vendor",
        "nvidia",
        "--sort",
        "memory_bandwidth_gbps",
        "--json",
    )
    rows = json.loads(result.stdout)
    assert rows and all(r["memory_gb"] >= 80 and r["vendor"] == "nvidia" for r in rows)
    bandwidths = [r["memory_bandwidth_gbps"] for r in rows]
    assert bandwidths == sorted(bandwidths, reverse=True)


def test_gpus_table_for_people() -> None:
    result = run_cli("gpus", "4090")
    assert result.returncode == 0
    assert "rtx-4090" in result.stdout and "sorted by" in result.stdout


def test_show_json_has_provenance_aliases_prices() -> None:
    result = run_cli("show", "3090", "--json")
    assert result.returncode == 0, result.stderr
    sheet = json.loads(result.stdout)
    assert sheet["id"] == "rtx-3090"
    assert sheet["provenance"]["memory_bandwidth_gbps"]["source_url"].startswith("https://")
    assert "NVIDIA GeForce RTX 3090" in sheet["aliases"]
    kinds = {p["kind"] for p in sheet["prices"]}
    assert "launch" in kinds
    for price in sheet["prices"]:
        assert {"kind", "usd", "per", "provider", "region", "as_of", "source"} <= set(price)


def test_show_table_names_sources() -> None:
    result = run_cli("show", "h100-sxm")
    assert result.returncode == 0, result.stderr
    assert "Sources" in result.stdout and "https://" in result.stdout


def test_compare_ratios_against_first() -> None:
    result = run_cli("compare", "3090", "4090", "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["gpu_ids"] == ["rtx-3090", "rtx-4090"]
    bandwidth = next(r for r in doc["rows"] if r["field"] == "memory_bandwidth_gbps")
    assert bandwidth["ratios"][0] == 1.0
    assert bandwidth["ratios"][1] > 1.0
    # every price shown says where it comes from
    catalog = load_catalog()
    for gpu_id, note in zip(doc["gpu_ids"], doc["cloud_notes"], strict=True):
        rate = catalog.cheapest_cloud_price(gpu_id)
        assert note == "no cloud rate" if rate is None else rate.source in note
    for gpu_id, note in zip(doc["gpu_ids"], doc["price_notes"], strict=True):
        bought = catalog.purchase_price(gpu_id)
        assert bought is not None and bought.source in note


def test_unknown_gpu_is_a_clear_usage_error() -> None:
    result = run_cli("show", "rtx 3900")
    assert result.returncode == 2
    assert "Unknown GPU 'rtx 3900'" in result.stderr and "rtx-3090" in result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_error_messages_print_the_users_text_as_written() -> None:
    # brackets and :name: are the terminal library's markup and emoji codes, not the user's
    for name in ("[/]", "cpu:smile: [batch, 784]"):
        result = run_cli("show", name)
        assert result.returncode == 2, result.stderr
        assert f"Unknown GPU '{name}'" in result.stderr and "Traceback" not in result.stderr


def test_ambiguous_gpu_lists_candidates() -> None:
    result = run_cli("show", "A100", "--json")
    assert result.returncode == 2
    assert "a100-sxm4-80gb" in result.stderr
    # under --json the failure is a JSON document on stdout too
    error = json.loads(result.stdout)["error"]
    assert error["kind"] == "AmbiguousGpu" and error["exit_code"] == 2
    assert "a100-sxm4-80gb" in error["message"]


def test_a_parser_error_under_json_is_json_too() -> None:
    result = run_cli("fit", "resnet50", "--batch-size", "abc", "--json")
    assert result.returncode == 2
    assert "--batch-size" in json.loads(result.stdout)["error"]["message"]


@pytest.mark.parametrize(
    "args",
    [
        ("recommend", "resnet50", "--budget", "nan"),
        ("recommend", "resnet50", "--hours=inf"),
        ("cost", "energy", "--watts", "1e300", "--hours", "10"),
        ("gpus", "--min-memory", "-inf"),
    ],
)
def test_numbers_no_option_can_use_are_refused(args: tuple[str, ...]) -> None:
    result = run_cli(*args)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "is not a number whichgpu can use" in result.stderr
    assert args[-1].split("=")[-1] in result.stderr or args[-3] in result.stderr


def test_a_result_id_that_reads_as_a_huge_number_is_still_an_id(tmp_path: Path) -> None:
    result = run_cli("results", "show", "12345e67", "--store", str(tmp_path / "s.db"))
    assert result.returncode == 2 and "No result has the id '12345e67'" in result.stderr
    # an option's value too, where the option takes a stored result's id
    store = str(tmp_path / "s.db")
    for args in (("--calibrate", "49227e32"), ("--calibrate=49227e32",)):
        result = run_cli("predict", "resnet50", "--gpu", "4090", *args, "--store", store)
        assert result.returncode == 2 and "Traceback" not in result.stderr
        assert "49227e32" in result.stderr and "not a number" not in result.stderr


def test_an_infinite_answer_is_refused_rather_than_written_as_invalid_json() -> None:
    from whichgpu.cli.output import emit_json

    with pytest.raises(UsageError, match="infinite or undefined"):
        emit_json({"energy_kwh": float("inf")})


def test_compare_needs_two() -> None:
    result = run_cli("compare", "3090")
    assert result.returncode == 2
    assert "at least two" in result.stderr and "Traceback" not in result.stderr


def test_bad_option_value_exits_2() -> None:
    result = run_cli("gpus", "--sort", "colour")
    assert result.returncode == 2 and "Cannot sort by 'colour'" in result.stderr
    result = run_cli("gpus", "--vendor", "nvidiaa")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    result = run_cli("gpus", "--min-memory", "-5")
    assert result.returncode == 2 and "from 0 up" in result.stderr


def test_bad_price_file_names_line_and_field(tmp_path: Path) -> None:
    bad = tmp_path / "prices.csv"
    bad.write_text(
        "gpu_id,kind,usd,per,provider,region,as_of,source,note\n"
        "rtx-3090,used,lots,unit,ebay,US,2026-01-01,me,\n"
    )
    result = run_cli("show", "3090", "--prices", str(bad))
    assert result.returncode == 2
    assert f"{bad}, line 2, field 'usd'" in result.stderr
    assert "Traceback" not in result.stderr


def test_user_price_file_shows_up(tmp_path: Path) -> None:
    mine = tmp_path / "prices.csv"
    mine.write_text(
        "gpu_id,kind,usd,per,provider,region,as_of,source,note\n"
        "rtx-3090,used,650,unit,local-market,DE,2026-11-01,my notes,3 listings\n"
    )
    result = run_cli("show", "3090", "--json", env={"WHICHGPU_PRICES": str(mine)})
    prices = json.loads(result.stdout)["prices"]
    assert any(p["usd"] == 650 and p["user"] for p in prices)
    # a price file named in the environment that is not there is an error, not ignored
    missing = run_cli("show", "3090", env={"WHICHGPU_PRICES": str(tmp_path / "typo.csv")})
    assert missing.returncode == 2 and "typo.csv: cannot be read" in missing.stderr


def test_help_teaches_with_examples() -> None:
    for command in ("gpus", "show", "compare"):
        result = run_cli(command, "--help")
        assert result.returncode == 0
        assert "Examples" in result.stdout


def test_version_and_module_entry() -> None:
    result = run_cli("--version")
    assert result.returncode == 0 and result.stdout.startswith("whichgpu ")


def test_workloads_json() -> None:
    result = run_cli("workloads", "--json")
    assert result.returncode == 0, result.stderr
    names = {w["name"] for w in json.loads(result.stdout)}
    assert {"resnet50", "llama-3.1-8b", "bert-base"} <= names


def test_profile_json_of_a_user_config() -> None:
    config = Path(__file__).parents[1] / "fixtures" / "tiny-llama.json"
    result = run_cli(
        "profile", "--config", str(config), "--batch-size", "2", "--seq-len", "32", "--json"
    )
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    for key in (
        "params_total",
        "params_trainable",
        "flops_per_step",
        "flops_per_sample",
        "bytes_per_step",
        "op_mix",
        "batch_size",
        "seq_len",
    ):
        assert key in doc
    assert doc["batch_size"] == 2 and doc["seq_len"] == 32
    assert result.stderr == ""


def test_profile_bad_input_is_exit_2() -> None:
    result = run_cli("profile", "resnet5")
    assert result.returncode == 2 and "Did you mean: resnet50" in result.stderr
    result = run_cli("profile", "resnet50", "--seq-len", "10")
    assert result.returncode == 2 and "does not apply" in result.stderr
    result = run_cli("profile")
    assert result.returncode == 2 and "Name one workload" in result.stderr


def test_a_config_whose_architectures_is_not_a_list_says_so(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "llama", "architectures": "LlamaForCausalLM"}))
    result = run_cli("profile", "--config", str(config))
    assert result.returncode == 2 and "must be a list of class names" in result.stderr
    # sizes are whole numbers from 1 up, not coerced
    sized = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64.5}
    config.write_text(json.dumps(sized))
    result = run_cli("profile", "--config", str(config))
    assert result.returncode == 2 and "'hidden_size' must be a whole number" in result.stderr


def _help_examples() -> list[tuple[str, list[str]]]:
    """Every example command line in every command's help: (command path, arguments)."""
    import shlex

    import typer

    from whichgpu.cli import app

    found: list[tuple[str, list[str]]] = []

    def walk(command: Any, path: str) -> None:
        for line in (command.help or "").splitlines():
            text = line.strip().split("  #")[0]
            if text.startswith("whichgpu "):
                words = shlex.split(text)[1:]
                shell = [i for i, w in enumerate(words) if w in (">", ">>", "|", "&&", "2>")]
                found.append((path, words[: shell[0]] if shell else words))
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, f"{path} {name}".strip())

    walk(typer.main.get_command(app), "")
    return found


def test_every_help_example_parses_and_names_gpus_the_catalog_knows() -> None:
    import typer

    from whichgpu.catalog import load_catalog
    from whichgpu.cli import app

    catalog = load_catalog()
    examples = _help_examples()
    assert len(examples) > 30
    root = typer.main.get_command(app)
    for path, args in examples:  # an example may show another command than its help's own
        command: Any = root
        rest = list(args)
        while hasattr(command, "commands"):
            sub = command.commands.get(rest[0])
            assert sub is not None, f"{path}: unknown command in {args}"
            command, rest = sub, rest[1:]
        context = command.make_context(path, list(rest))  # raises on an unknown option
        for option in ("gpu", "cloud_gpu", "gpus" if path == "compare" else "-"):
            value = context.params.get(option)
            for name in [value] if isinstance(value, str) else value or []:
                catalog.resolve(name)  # raises on an unknown or ambiguous name


def test_gpus_arch_matches_the_start_of_an_architecture_and_refuses_an_unknown_one() -> None:
    import whichgpu.api as wg

    assert {g.architecture for g in wg.gpus(arch="ada")} == {"Ada Lovelace"}
    assert {g.architecture for g in wg.gpus(arch="blackwell")} == {"Blackwell", "Blackwell Ultra"}
    assert {g.architecture for g in wg.gpus(arch="CDNA")} >= {"CDNA2", "CDNA3"}
    result = run_cli("gpus", "--arch", "xyz")
    assert result.returncode == 2 and "Known: Ada Lovelace" in result.stderr
    with pytest.raises(UsageError, match="min_memory_gb must be a number"):
        wg.gpus(min_memory_gb="big")  # type: ignore[arg-type]
    assert "Traceback" not in result.stderr
