"""predict --compile: the fused kernels of AOTAutograd's min-cut partition in place of eager's
non-matrix operators, attention masked where the stack's transformers builds a mask."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import run_cli
from whichgpu.api import fit, predict
from whichgpu.api.step import _COMPILED_TRACES, CompiledStep
from whichgpu.catalog import load_catalog
from whichgpu.catalog.stacks import get_stack
from whichgpu.estimate.compiled import MASKED_ATTENTION_WORK, FusedKernels, compiled_table
from whichgpu.estimate.fp8 import CAST_OP
from whichgpu.estimate.throughput import OpTable, gpu_rates, load_parameters, step_time
from whichgpu.trace.compiled import compiled_activations
from whichgpu.validate.timing import predict_even_if_unfit
from whichgpu.workloads import run_config
from whichgpu.workloads.user import config_workload

TINY_LLAMA = Path(__file__).parents[1] / "fixtures" / "tiny-llama.json"
MASKED_STACK = "pytorch2-cuda12-transformers-5.17"


def _eager_table() -> OpTable:
    """Forward: a GEMM, an add, attention, an fp8 cast; backward: a GEMM and a mul;
    optimizer: an elementwise update. Counts 1, except the add: 3 of them."""
    kinds = ("gemm", "elementwise", "attention", "elementwise", "gemm", "elementwise", "optimizer")
    phases = ("forward", "forward", "forward", "forward", "backward", "backward", "optimizer")
    fusible = np.array([False, True, False, False, False, True, False])  # the cast is kept
    return OpTable(
        kinds=kinds,
        dtypes=("bfloat16",) * 6 + ("float32",),
        flops=np.array([8e9, 1e6, 4e9, 1e6, 16e9, 1e6, 1e6]),
        bytes_moved=np.array([4e6, 8e6, 2e6, 3e6, 8e6, 12e6, 16e6]),
        units_per_step=1,
        batch_size=1,
        seq_len=16,
        is_matrix=np.array([k in ("gemm", "attention") for k in kinds]),
        is_half=np.array([True] * 6 + [False]),
        is_fp32=np.array([False] * 6 + [True]),
        phases=np.array(phases),
        counts=np.array([1.0, 3.0, 1.0, 1.0, 1.0, 1.0, 1.0]),
        fusible=fusible,
    )


KERNELS = FusedKernels(
    phases=("forward", "backward"), bytes_moved=np.array([5e6, 6e6]), flops=np.array([2e6, 1e6])
)


def test_the_fused_kernels_replace_the_fusible_operators() -> None:
    eager = _eager_table()
    compiled = compiled_table(eager, KERNELS, masked_attention=False)
    # kept: both GEMMs, attention, the fp8 cast and the optimizer; the add (x3) and mul left
    kept = ("gemm", "attention", "elementwise", "gemm", "optimizer")
    assert compiled.kinds == (*kept, "fused", "fused")
    assert compiled.weights.tolist() == [1.0] * 7
    assert compiled.bytes_moved.tolist() == [4e6, 2e6, 3e6, 8e6, 16e6, 5e6, 6e6]
    assert compiled.phases.tolist() == [
        *("forward", "forward", "forward", "backward", "optimizer"),
        *("forward", "backward"),
    ]
    assert not compiled.is_matrix[-2:].any() and compiled.fusible is not None
    assert not compiled.fusible.any()  # a compiled table is not compiled twice
    # the roofline prices the kernels like any operator: the step is the kept operators'
    # time plus the kernels', each at the memory efficiency (or the launch floor)
    params = load_parameters()
    rates = gpu_rates(load_catalog().resolve("h100-sxm"))
    kept = compiled_table(eager, FusedKernels((), np.zeros(0), np.zeros(0)), masked_attention=False)
    bandwidth = rates.bandwidth_bytes_per_s * params.memory_efficiency
    kernels_s = sum(max(b / bandwidth, params.launch_s) for b in (5e6, 6e6))
    whole = step_time(compiled, rates, "bf16", params).step_time_s
    assert whole == pytest.approx(step_time(kept, rates, "bf16", params).step_time_s + kernels_s)


def test_masked_attention_counts_the_forward_and_backward_attention_twice() -> None:
    eager = _eager_table()
    causal = compiled_table(eager, KERNELS, masked_attention=False)
    masked = compiled_table(eager, KERNELS, masked_attention=True)
    attention = [i for i, k in enumerate(masked.kinds) if k == "attention"]
    assert masked.weights[attention].tolist() == [MASKED_ATTENTION_WORK]
    others = [i for i in range(len(masked.kinds)) if i not in attention]
    assert masked.weights[others].tolist() == causal.weights[others].tolist()


def test_a_table_that_does_not_say_what_fuses_is_refused() -> None:
    eager = _eager_table()
    with pytest.raises(ValueError, match="which operators a compiled step fuses"):
        compiled_table(
            OpTable(**{**eager.__dict__, "fusible": None}), KERNELS, masked_attention=False
        )
    with pytest.raises(ValueError, match="fused kernels run in"):
        FusedKernels(("optimizer",), np.ones(1), np.ones(1))


def test_the_fp8_casts_are_not_fused_away() -> None:
    (fp8,) = predict(
        config=TINY_LLAMA,
        gpus=["h100-sxm"],
        precision="fp8",
        compile=True,
        batch_size=4,
        seq_len=64,
    )
    note = next(a for a in fp8.assumptions if a.startswith("torch.compile (inductor"))
    assert "non-matrix operators" in note and CAST_OP not in note
    (bf16,) = predict(config=TINY_LLAMA, gpus=["h100-sxm"], compile=True, batch_size=4, seq_len=64)
    assert fp8.step_time_s is not None and bf16.step_time_s is not None


@pytest.fixture(scope="module")
def tiny_llama_runs() -> dict[str, object]:
    sizes = {"batch_size": 2, "seq_len": 64}
    (eager,) = predict(config=TINY_LLAMA, gpus=["h100-sxm"], **sizes)
    (compiled,) = predict(config=TINY_LLAMA, gpus=["h100-sxm"], compile=True, **sizes)
    (masked,) = predict(
        config=TINY_LLAMA, gpus=["h100-sxm"], compile=True, stack=MASKED_STACK, **sizes
    )
    return {"eager": eager, "compiled": compiled, "masked": masked}


def test_a_compiled_step_runs_the_partition_kernels(tiny_llama_runs: dict[str, object]) -> None:
    eager, compiled, masked = (tiny_llama_runs[k] for k in ("eager", "compiled", "masked"))
    traced = compiled_activations(config_workload(TINY_LLAMA), run_config(seq_len=64), 2, 64)
    kernels = sum(traced.min_cut.kernel_count(p) for p in ("forward", "backward"))
    note = next(a for a in compiled.assumptions if a.startswith("torch.compile (inductor"))  # type: ignore[attr-defined]
    assert f"run as {kernels:,} fused kernels" in note and "dense causal mask" not in note
    assert compiled.step_time_s < eager.step_time_s  # type: ignore[attr-defined]
    assert compiled.batch_size == eager.batch_size == 2  # type: ignore[attr-defined]
    # the masked stack runs the same kernels and twice the attention
    assert masked.step_time_s > compiled.step_time_s  # type: ignore[attr-defined]
    assert any("dense causal mask" in a for a in masked.assumptions)  # type: ignore[attr-defined]
    assert get_stack(MASKED_STACK).compiled_causal_mask and not get_stack().compiled_causal_mask
    # eager's own note no longer says compilation runs faster than it predicts
    assert not any("torch.compile, fused optimizers" in a for a in compiled.assumptions)  # type: ignore[attr-defined]


def test_kernels_are_linear_in_the_tokens_through_two_traces(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from whichgpu.api import step as step_module

    traces = {
        1: step_module.CompiledTrace(
            10, {"forward": (6, 4), "backward": (10,)}, {"forward": (1, 1), "backward": (2,)}
        ),
        2: step_module.CompiledTrace(
            16, {"forward": (9, 7), "backward": (18,)}, {"forward": (2, 2), "backward": (4,)}
        ),
    }
    monkeypatch.setattr(step_module, "compiled_trace", lambda workload, run, batch: traces[batch])
    compiled = CompiledStep(config_workload(TINY_LLAMA), run_config(seq_len=64), None)
    assert compiled(4, 64) == 10 + 6 * 3  # saved bytes: 10 at one sample, 6 more a sample
    at_four = compiled.kernels(4, 64)
    assert at_four.phases == ("forward", "forward", "backward")
    # forward: 10 at 1, 16 at 2, so 28 at 4, shared 9:7 as at batch 2; backward 10, 18: 34
    assert at_four.bytes_moved.tolist() == pytest.approx([28 * 9 / 16, 28 * 7 / 16, 34])
    assert at_four.flops.tolist() == pytest.approx([4, 4, 8])
    # half the length is half the tokens: one sample's worth less than batch 1 (never below 0)
    assert compiled.kernels(1, 32).bytes_moved.sum() == pytest.approx(7 + 6)


def test_the_partition_is_kept_for_the_next_question(monkeypatch: pytest.MonkeyPatch) -> None:
    from whichgpu.api import step as step_module

    sizes = {"batch_size": 2, "seq_len": 32}
    (first,) = predict(config=TINY_LLAMA, gpus=["h100-sxm"], compile=True, **sizes)
    (sized,) = fit(config=TINY_LLAMA, gpus=["h100-sxm"], compile=True, **sizes)
    _COMPILED_TRACES.clear()  # a new process: only the trace cache remembers

    def no_trace(*args: object, **kwargs: object) -> object:
        raise AssertionError("traced again")

    monkeypatch.setattr("whichgpu.trace.compiled.compiled_activations", no_trace)
    (again,) = predict(config=TINY_LLAMA, gpus=["h100-sxm"], compile=True, **sizes)
    assert again.step_time_s == pytest.approx(first.step_time_s)
    (resized,) = fit(config=TINY_LLAMA, gpus=["h100-sxm"], compile=True, **sizes)
    assert resized.peak_reserved_bytes == sized.peak_reserved_bytes
    assert step_module._COMPILED_TRACES  # memoised again from the kept file


def test_cli_predict_compile_json() -> None:
    cli = run_cli(
        *("predict", "--config", str(TINY_LLAMA), "--gpu", "h100-sxm", "--batch-size", "2"),
        *("--seq-len", "64", "--compile", "--json"),
    )
    assert cli.returncode == 0, cli.stderr
    (row,) = json.loads(cli.stdout)
    assert row["run"]["compile"] is True and row["throughput"] > 0
    assert any(a.startswith("torch.compile (inductor, default mode)") for a in row["assumptions"])
    listed = run_cli("cache", "list")
    assert "torch.compile's partition at 1 x 64" in listed.stdout, listed.stdout


def test_stored_partitions_answer_without_a_trace(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_trace(*args: object, **kwargs: object) -> object:
        raise AssertionError("traced, although the partition is stored")

    monkeypatch.setattr("whichgpu.trace.compiled.compiled_activations", no_trace)
    _COMPILED_TRACES.clear()
    # whichgpu's own H200 run, and Llama 3.1 8B at a common length
    for workload, gpus in (("llama-3.2-1b", 1), ("llama-3.1-8b", 8)):
        (estimate,) = predict(
            workload,
            gpus=["h200-sxm"],
            gpu_count=gpus,
            sharding="fsdp",
            compile=True,
            batch_size=1,
            seq_len=2048,
        )
        assert any(a.startswith("torch.compile (inductor") for a in estimate.assumptions)
    # NVIDIA's published Llama 3 70B runs (validate --source parallel), timed unfit
    run = run_config(
        mode="train", gpus=64, sharding="fsdp", compile=True, batch_size=1, seq_len=8192
    )
    estimate, _ = predict_even_if_unfit("llama-3.1-70b", "h100-sxm", run)
    assert estimate.throughput is not None


def test_a_stored_partition_is_what_a_trace_gives() -> None:
    from whichgpu.api.step import CompiledTrace
    from whichgpu.profiles.stored import load_stored_compiled
    from whichgpu.workloads import get_workload

    run = run_config(mode="train", precision="bf16", seq_len=2048)
    stored = load_stored_compiled("llama-3.2-1b", run, 1)
    assert stored is not None
    fresh = CompiledTrace.of(compiled_activations(get_workload("llama-3.2-1b"), run, 1, 2048))
    # scripts/make_compiled.py wrote it with this torch and transformers: run it after a
    # change to the tracer, the partitioner's grouping or the lock
    assert CompiledTrace.from_json(stored) == fresh


def test_without_torch_an_unstored_partition_says_how_to_get_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sys

    from whichgpu.errors import UsageError

    monkeypatch.setitem(sys.modules, "whichgpu.trace.compiled", None)  # torch not installed
    _COMPILED_TRACES.clear()
    with pytest.raises(UsageError, match=r"needs torch: pip install 'whichgpu\[torch\]'"):
        predict("llama-3.2-1b", gpus=["h200-sxm"], compile=True, batch_size=1, seq_len=1024)
    # a stored one answers all the same
    (stored,) = predict("llama-3.2-1b", gpus=["h200-sxm"], compile=True, batch_size=1, seq_len=2048)
    assert stored.throughput is not None


def test_a_compiled_checkpointed_step_runs_its_recomputation_fused() -> None:
    """Compiled and checkpointed: the eager checkpointed step's matrix products (the
    recomputed ones among them) with the fusible operators as the kernels of the checkpointed
    step's min-cut partition, whose backward graph recomputes the layers' pointwise work
    fused: slower than compiled alone, faster than eager checkpointed."""
    sizes = {"batch_size": 2, "seq_len": 64}
    (eager,) = predict(config=TINY_LLAMA, gpus=["h100-sxm"], checkpointing=True, **sizes)
    (compiled,) = predict(config=TINY_LLAMA, gpus=["h100-sxm"], compile=True, **sizes)
    (both,) = predict(
        config=TINY_LLAMA, gpus=["h100-sxm"], compile=True, checkpointing=True, **sizes
    )
    traced = compiled_activations(
        config_workload(TINY_LLAMA), run_config(seq_len=64, checkpointing=True), 2, 64
    )
    kernels = sum(traced.min_cut.kernel_count(p) for p in ("forward", "backward"))
    note = next(a for a in both.assumptions if a.startswith("torch.compile (inductor"))
    assert f"run as {kernels:,} fused kernels" in note
    assert eager.step_time_s and compiled.step_time_s and both.step_time_s
    assert compiled.step_time_s < both.step_time_s < eager.step_time_s
