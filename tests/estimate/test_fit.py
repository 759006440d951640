"""``fit``: peak memory and the largest batch, by library call and end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli
from whichgpu.api import fit, predict
from whichgpu.catalog import load_catalog
from whichgpu.catalog.stacks import get_stack, shipped_stacks
from whichgpu.errors import UsageError
from whichgpu.estimate.memory import (
    SHORTER_SEQ_LADDER,
    _longest_on_ladder,
    capacity_of,
    largest_within,
    workspace_sizes,
)
from whichgpu.schema import GpuSpec
from whichgpu.units import GIB, MIB

FIXTURES = Path(__file__).parents[1] / "fixtures"


def test_largest_within_finds_the_boundary_in_few_evaluations() -> None:
    curves = {
        "affine": lambda n: 1000 + 37 * n,
        "allocator steps": lambda n: 1000 + 20 * ((37 * n + 19) // 20),
        "quadratic": lambda n: 1000 + n * n,
        "flat then steep": lambda n: 1000 if n < 300 else 1000 + 10_000 * (n - 299),
    }
    for name, curve in curves.items():
        for budget in (1000, 1037, 5000, 77_777, 2_000_000):
            truth = max((n for n in range(1, 70_000) if curve(n) <= budget), default=0)
            limit = 65_536
            calls: list[int] = []

            def total(n: int, f: object = curve, seen: list[int] = calls) -> int:
                seen.append(n)
                return f(n)  # type: ignore[operator, no-any-return]

            found = largest_within(total, budget, limit)
            assert found == (min(truth, limit), truth >= limit), (name, budget)
            assert len(calls) <= 40, (name, budget, len(calls))
            assert len(set(calls)) == len(calls)  # nothing evaluated twice
    # what is already known is not evaluated again, and a near guess ends in two evaluations
    calls = []
    known = {1: 1037, 8: 1296}
    assert largest_within(lambda n: calls.append(n) or 1000 + 37 * n, 5000, 65_536, known) == (
        108,
        False,
    )
    assert len(calls) <= 3
    assert largest_within(lambda n: 10**9, 5000, 100) == (0, False)
    assert largest_within(lambda n: 0, 5000, 100) == (100, True)


def test_stacks_are_sourced() -> None:
    stacks = shipped_stacks()
    assert sum(s.default for s in stacks) == 1
    for stack in stacks:
        assert set(stack.provenance) >= {
            "cuda_context_bytes",
            "cublas_workspace_bytes",
            "hopper_attention_percent",
        }
    default = get_stack()
    assert default.cublas_workspace_bytes == 4096 * 1024 * 2 + 16 * 1024 * 8
    with pytest.raises(UsageError, match="Known stacks: pytorch2-cuda12"):
        get_stack("cuda99")  # the user's input: exit 2, not a catalog failure


def test_hopper_gets_the_larger_cublas_workspace() -> None:
    catalog = load_catalog()
    stack = get_stack()
    h100 = workspace_sizes(catalog.resolve("h100-sxm"), stack, "train")
    a100 = workspace_sizes(catalog.resolve("a100-sxm4-80gb"), stack, "train")
    assert h100[0] == 32 * MIB and a100[0] == 8519680
    assert len(h100) == 4  # cuBLAS + cuBLASLt, forward and autograd threads
    assert len(workspace_sizes(catalog.resolve("h100-sxm"), stack, "inference")) == 2


def test_capacity_is_measured_or_derived_below_marketed() -> None:
    catalog = load_catalog()
    measured = capacity_of(catalog.resolve("rtx-2080-ti"), catalog)
    assert "catalog" in measured.note
    assert 10.7 * GIB < measured.bytes < 11 * GIB

    def share(gpu: GpuSpec, total_bytes: float) -> float:
        return total_bytes / ((gpu.memory_gb or 0) * GIB)

    known = [g for g in catalog.all() if g.memory_gb and g.memory_cuda_total_mib]
    derived_any = False
    for gpu in catalog.all():
        if not gpu.memory_gb or gpu.memory_cuda_total_mib:
            continue
        derived = capacity_of(gpu, catalog)
        assert "derived" in derived.note
        derived_any = True
        # never above what any measured GPU of its kind keeps of its marketed size
        like = [
            g
            for g in known
            if (g.vendor, g.segment, (g.memory_type or "")[:3])
            == (gpu.vendor, gpu.segment, (gpu.memory_type or "")[:3])
        ]
        for g in like:
            kept = share(g, (g.memory_cuda_total_mib or 0) * MIB)
            assert share(gpu, derived.bytes) <= kept + 1e-9, (gpu.id, g.id)
        if like:
            assert f"{gpu.segment.value}" in derived.note, derived.note
    assert derived_any, "every GPU has a measured total; nothing derived to test"
    # a GeForce card is not charged the ECC reserve of datacenter GDDR cards
    geforce = next(
        g
        for g in catalog.all()
        if g.segment.value == "consumer"
        and g.vendor.value == "nvidia"
        and not g.memory_cuda_total_mib
        and (g.memory_type or "").startswith("GDDR")
    )
    a10 = catalog.resolve("a10")
    a10_kept = share(a10, capacity_of(a10, catalog).bytes)
    assert share(geforce, capacity_of(geforce, catalog).bytes) > a10_kept


def test_largest_batch_fits_and_the_next_does_not() -> None:
    estimates = fit("resnet50", gpus=["rtx-3090", "rtx-2060"])
    assert [e.gpu for e in estimates] == ["rtx-3090", "rtx-2060"]  # sorted by max batch
    for e in estimates:
        assert e.max_batch_size > 0 and e.fits and e.batch_size == e.max_batch_size
        assert e.device_total_bytes <= e.capacity_bytes
        assert e.next_batch_device_total_bytes is not None
        assert e.next_batch_device_total_bytes > e.capacity_bytes
        assert sum(e.breakdown.values()) == e.device_total_bytes
        assert e.peak_allocated_bytes <= e.peak_reserved_bytes < e.device_total_bytes
        assert e.method == "stored profile"


def test_a_given_batch_reports_fits_and_headroom() -> None:
    (small,) = fit("resnet50", gpus=["rtx-4090"], batch_size=8)
    (huge,) = fit("resnet50", gpus=["rtx-4090"], batch_size=4096)
    assert small.fits and small.headroom_bytes > 0
    assert not huge.fits and huge.headroom_bytes < 0
    assert small.max_batch_size == huge.max_batch_size
    assert small.batch_given and huge.batch_given
    (searched,) = fit("resnet50", gpus=["rtx-4090"])
    assert not searched.batch_given and searched.batch_size == searched.max_batch_size


def test_when_nothing_fits_fit_says_what_would_need_less_memory() -> None:
    searched = run_cli("fit", "llama-3.2-1b", "--seq-len", "2048", "--gpu", "rtx-4060")
    assert searched.returncode == 0, searched.stderr
    text = " ".join(searched.stdout.split())
    assert "Nothing fits as asked. To need less memory, try: --checkpointing" in text
    assert "--method lora or qlora" in text and "--sharding zero3" in text
    assert "--batch-size" not in text.split("Nothing fits")[1]  # none was given
    given = run_cli(
        "fit", "llama-3.1-8b", "--method", "lora", "--checkpointing", "--gpu", "rtx-4060",
        "--batch-size", "512",
    )  # fmt: skip
    text = " ".join(given.stdout.split())
    assert "no --batch-size (the largest batch that fits)" in text
    assert "try: --checkpointing" not in text  # already on
    fits = run_cli("fit", "gpt2", "--gpu", "rtx-4090")
    assert "Nothing fits" not in fits.stdout


def test_largest_sequence_at_a_given_batch_fits_and_one_more_token_does_not() -> None:
    (estimate,) = fit("llama-3.2-1b", gpus=["l40s"], batch_size=2, seq_len=1024)
    assert estimate.max_seq_len is not None and not estimate.max_seq_len_capped
    assert 1024 < estimate.max_seq_len < 131072
    (at_max,) = fit("llama-3.2-1b", gpus=["l40s"], batch_size=2, seq_len=estimate.max_seq_len)
    (above,) = fit("llama-3.2-1b", gpus=["l40s"], batch_size=2, seq_len=estimate.max_seq_len + 1)
    assert at_max.fits and not above.fits
    # GPT-2 has 1024 positions: on a large card the model, not memory, is the limit
    (gpt2,) = fit("gpt2", gpus=["h100-sxm"], batch_size=2)
    assert (gpt2.max_seq_len, gpt2.max_seq_len_capped) == (1024, True)
    (images,) = fit("resnet50", gpus=["h100-sxm"], batch_size=2)
    assert images.max_seq_len is None
    (searched,) = fit("gpt2", gpus=["h100-sxm"])
    assert searched.max_seq_len is None  # only asked at a given batch


def test_where_one_sequence_does_not_fit_the_longest_ladder_length_that_does() -> None:
    (estimate,) = fit("llama-3.1-8b", gpus=["rtx-4060-ti-16gb"], method="qlora")
    assert not estimate.fits and estimate.seq_len == 2048
    shorter = estimate.fits_at_seq_len
    assert shorter is not None and shorter in SHORTER_SEQ_LADDER and 64 <= shorter < 2048
    (at,) = fit("llama-3.1-8b", gpus=["rtx-4060-ti-16gb"], method="qlora", seq_len=shorter)
    step = SHORTER_SEQ_LADDER[SHORTER_SEQ_LADDER.index(shorter) + 1]
    (above,) = fit("llama-3.1-8b", gpus=["rtx-4060-ti-16gb"], method="qlora", seq_len=step)
    assert at.fits and at.max_batch_size >= 1 and not above.fits
    (fitting,) = fit("llama-3.1-8b", gpus=["h100-sxm"], method="qlora")
    assert fitting.fits and fitting.fits_at_seq_len is None
    (images,) = fit("resnet50", gpus=["gtx-1050-ti"], batch_size=4096)
    assert not images.fits and images.fits_at_seq_len is None  # no sequences
    text = " ".join(
        run_cli(
            "fit", "llama-3.1-8b", "--method", "qlora", "--gpu", "rtx-4060-ti-16gb"
        ).stdout.split()
    )
    assert f"at which batch 1 fits: GeForce RTX 4060 Ti 16GB {shorter:,}" in text


def test_longest_on_the_ladder_bisects_a_monotone_total() -> None:
    calls: list[int] = []

    def total(length: int) -> int:
        calls.append(length)
        return 1000 + 10 * length

    assert _longest_on_ladder(total, 1000 + 10 * 1500, 4096) == 1024  # 1536 is just over
    assert len(calls) <= 6
    assert _longest_on_ladder(total, 1000 + 10 * 1536, 4096) == 1536
    assert _longest_on_ladder(total, 999, 4096) == 0
    assert _longest_on_ladder(total, 10**9, 100) == 96  # below the length asked only


def test_cli_fit_json_has_the_documented_keys() -> None:
    result = run_cli("fit", "resnet50", "--gpu", "3090", "--gpu", "a100-80gb", "--json")
    assert result.returncode == 0, result.stderr
    docs = json.loads(result.stdout)
    assert len(docs) == 2
    for key in (
        "gpu",
        "fits",
        "batch_size",
        "seq_len",
        "max_batch_size",
        "peak_allocated_bytes",
        "peak_reserved_bytes",
        "device_total_bytes",
        "capacity_bytes",
        "breakdown",
    ):
        assert key in docs[0]
    assert set(docs[0]["breakdown"]) == {
        "weights",
        "gradients",
        "optimizer",
        "activations",
        "temporaries",
        "overhead",
    }


def test_cli_fit_table_and_errors() -> None:
    result = run_cli("fit", "gpt2", "--gpu", "4090", "--seq-len", "512")
    assert result.returncode == 0, result.stderr
    assert "max batch" in result.stdout and "Where the memory goes" in result.stdout
    bad = run_cli("fit", "resnet50", "--gpu", "rtx 4099")
    assert bad.returncode == 2
    assert "4090" in bad.stderr and "Traceback" not in bad.stderr
    stack = run_cli("fit", "resnet50", "--gpu", "4090", "--stack", "cuda7")
    assert stack.returncode != 0 and "pytorch2-cuda12" in stack.stderr
    too_long = run_cli("fit", "gpt2", "--gpu", "4090", "--seq-len", "2048")
    assert too_long.returncode == 2 and too_long.stdout == ""
    assert "gpt2 has 1,024 positions" in too_long.stderr and "--seq-len 1024" in too_long.stderr


@pytest.mark.fresh_trace_cache  # it checks the trace is made
def test_cli_fit_traces_a_users_config() -> None:
    result = run_cli(
        "fit",
        "--config",
        str(FIXTURES / "tiny-llama.json"),
        "--gpu",
        "t4",
        "--seq-len",
        "64",
        "--checkpointing",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    assert "[transformers]" not in result.stderr  # its use_cache / loss_type advice stays quiet
    (doc,) = json.loads(result.stdout)
    assert doc["method"] == "traced" and doc["max_batch_size"] > 100


def test_attention_without_a_fused_kernel_on_the_gpu_is_counted() -> None:
    # Turing has no flash attention and its memory-efficient kernel takes no bf16: a bf16 run
    # falls back to PyTorch's math path, which keeps the scores; fp16 runs fused, as on Ada.
    bf16 = {e.gpu: e for e in fit("gpt2", gpus=["2080ti", "4090"], seq_len=1024)}
    fp16 = {e.gpu: e for e in fit("gpt2", gpus=["2080ti", "4090"], seq_len=1024, precision="fp16")}
    turing = bf16["rtx-2080-ti"]
    assert turing.overheads["attention_kernels"] > 1 * GIB
    assert any(a.startswith("attention runs on math") for a in turing.assumptions)
    assert turing.max_batch_size < fp16["rtx-2080-ti"].max_batch_size
    assert "attention_kernels" not in fp16["rtx-2080-ti"].overheads
    assert "attention_kernels" not in bf16["rtx-4090"].overheads
    # the counted bytes are part of the device total the largest batch was searched against
    assert turing.device_total_bytes <= turing.capacity_bytes
    assert turing.next_batch_device_total_bytes is not None
    assert turing.next_batch_device_total_bytes > turing.capacity_bytes
    fast = fit("gpt2", gpus=["2080ti"], seq_len=1024, fast=True)[0]
    assert fast.overheads["attention_kernels"] > 1 * GIB
    assert 1 <= fast.max_batch_size <= turing.max_batch_size


def test_a_gpu_that_is_not_nvidias_says_it_is_sized_with_the_cuda_model() -> None:
    estimates = {e.gpu: e for e in fit("resnet50", gpus=["mi300x", "apple-m4-max", "4090"])}
    assert estimates["mi300x"].assumptions[0].startswith("ROCm GPU sized with the CUDA model")
    assert "rough guide only" in estimates["apple-m4-max"].assumptions[0]
    assert not any("CUDA model" in a for a in estimates["rtx-4090"].assumptions)


def test_a_package_of_two_devices_is_sized_and_timed_as_one_of_them() -> None:
    # an MI250X is two GCDs of 64 GB each to PyTorch: one process fills one of them
    (mi250x,) = fit("llama-3.2-1b", gpus=["mi250x"], seq_len=2048)
    assert mi250x.capacity_bytes < 64e9
    assert any("appears to PyTorch as 2 devices of 64 GB" in a for a in mi250x.assumptions)
    whole = load_catalog().get("mi250x")
    assert whole is not None and whole.devices == 2 and whole.memory_gb == 128
    one = whole.one_device()
    assert (one.memory_gb, one.fp16_tensor_tflops, one.sm_count) == (64, 191.5, 110)
    (speed,) = predict("llama-3.2-1b", gpus=["mi250x"], seq_len=2048)
    assert speed.mfu is not None and speed.throughput is not None
    assert any("2 devices" in a for a in speed.assumptions)
    # the MFU is against one device's peak: the module's would halve it
    assert speed.mfu > 0.2


def test_the_longest_sequence_is_never_shorter_than_a_ladder_length_found_to_fit() -> None:
    # memory is not quite monotonic in the length (alignment of some buffers): a search from
    # the asked length alone landed at 360 while 384, on the ladder, fits
    (estimate,) = fit(
        "llama-3.1-8b", gpus=["rtx-4060"], method="qlora", checkpointing=True,
        seq_len=512, batch_size=1,
    )  # fmt: skip
    assert not estimate.fits and estimate.fits_at_seq_len is not None
    assert estimate.max_seq_len is not None and estimate.max_seq_len >= estimate.fits_at_seq_len


def test_sizes_past_any_machine_are_refused_not_overflowed() -> None:
    with pytest.raises(UsageError, match="beyond any GPU machine"):
        fit("resnet50", gpus=["4090"], batch_size=10**11)
    with pytest.raises(UsageError, match="beyond any GPU machine"):
        fit("llama-3.2-1b", gpus=["4090"], mode="inference", concurrency=10**11)
    # within the bound, a step whose counts pass 64 bits says so
    with pytest.raises(UsageError, match="more bytes and FLOPs than 64-bit integers hold"):
        predict("llama-3.2-1b", gpus=["4090"], batch_size=2**24, seq_len=2**17)


def test_inference_takes_one_prompt_length() -> None:
    with pytest.raises(UsageError, match="seq_len 100 and context 50 disagree"):
        fit("llama-3.2-1b", gpus=["4090"], mode="inference", seq_len=100, context=50)


def test_dropping_a_batch_of_one_is_no_way_to_need_less_memory() -> None:
    from whichgpu.schema import RunConfig

    assert not any("--batch-size" in lever for lever in RunConfig(batch_size=1).memory_levers())
    assert any("--batch-size" in lever for lever in RunConfig(batch_size=8).memory_levers())


def test_a_config_is_named_by_its_architecture_and_size_in_answers_and_headlines() -> None:
    import whichgpu.api as wg
    from whichgpu.api.step import parameter_count
    from whichgpu.report.html import render_html

    config = FIXTURES / "tiny-llama.json"
    (memory,) = fit(config=config, gpus=["rtx-4090"], seq_len=64)
    label = memory.workload
    assert label.startswith("LlamaForCausalLM, ") and label.endswith(f" parameters ({config})")
    (speed,) = predict(config=config, gpus=["rtx-4090"], seq_len=64)
    assert speed.workload == label
    ranking = wg.recommend(config=config, gpus=["rtx-4090"], seq_len=64, acquire="rent")
    assert ranking.workload == label
    data = wg.report(config=config, gpus=["rtx-4090"], seq_len=64, acquire="rent")
    assert data.title == label and f"Which GPU for {label}?" in render_html(data)
    text = " ".join(
        run_cli("fit", "--config", str(config), "-g", "4090", "--seq-len", "64").stdout.split()
    )
    assert text.startswith(label)
    assert [parameter_count(n) for n in (1_235_814_400, 124_439_808, 85_800, 7)] == [
        "1.24B", "124M", "85.8K", "7",
    ]  # fmt: skip
