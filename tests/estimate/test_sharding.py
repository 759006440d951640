"""Training on N GPUs: one rank's event stream under DDP, ZeRO-1, ZeRO-2 and ZeRO-3/FSDP, and
``fit`` with ``--gpus`` and ``--sharding`` end to end."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

import pytest
from typer.testing import CliRunner

from whichgpu.cli import app, main
from whichgpu.errors import UsageError
from whichgpu.estimate.memory import StepMemory
from whichgpu.estimate.sharding import (
    DDP_BUCKET_CAP_BYTES,
    DDP_FIRST_BUCKET_BYTES,
    SINGLE_GPU,
    ZERO_REDUCE_BUCKET_ELEMENTS,
    Event,
    Parallel,
    ShardingPlan,
    ddp_buckets,
    event_phases,
    make_plan,
    rank_events,
    repeated_block,
    shard_bytes,
)
from whichgpu.profiles.stored import load_stored, profile_key
from whichgpu.schema import Phase, RunConfig, Sharding, TensorCategory
from whichgpu.units import MIB
from whichgpu.workloads import run_config

STRATEGIES: tuple[Sharding, ...] = ("ddp", "zero1", "zero2", "zero3", "fsdp")

# --- a tiny synthetic step ---------------------------------------------------------------------
# Model order: embedding E, two identical blocks (a, b), head H. AMP-style bytes: the fp32
# parameter (4 B/param), its fp32 gradient (4 B/param), AdamW's two fp32 moments (8 B/param).
E, A, B, H = 800, 96, 304, 800
PARAMS = (E, A, B, A, B, H)
BLOCK, ROOT = A + B, E + H
PSI_BYTES = sum(PARAMS)  # 4 bytes x parameters
ACTIVATION, TEMP = 5000, 1200


class Stream:
    """Parallel lists of a step's events, built in order."""

    def __init__(self) -> None:
        self.handles: list[int] = []
        self.sizes: list[int] = []
        self.allocs: list[bool] = []
        self.categories: list[TensorCategory] = []
        self.phases: list[Phase] = []

    def add(self, handle: int, size: int, alloc: bool, cat: TensorCategory, ph: Phase) -> None:
        self.handles.append(handle)
        self.sizes.append(size)
        self.allocs.append(alloc)
        self.categories.append(cat)
        self.phases.append(ph)

    def rank(self, plan: ShardingPlan) -> list[Event]:
        return rank_events(
            self.handles, self.sizes, self.allocs, self.categories, self.phases, plan
        )


def tiny_step(with_zero_grad: bool = False) -> Stream:
    """Parameters, one forward activation, backward (gradients in reverse order), AdamW."""
    s = Stream()
    for i, size in enumerate(PARAMS):
        s.add(i, size, True, "parameter", "setup")
    s.add(10, 64, True, "input", "setup")
    s.add(11, ACTIVATION, True, "activation", "forward")
    for i, size in reversed(list(enumerate(PARAMS))):
        s.add(20 + i, size, True, "gradient", "backward")
    s.add(11, ACTIVATION, False, "activation", "backward")
    for i, size in enumerate(PARAMS):
        s.add(30 + i, 2 * size, True, "optimizer", "optimizer")
    s.add(40, TEMP, True, "temporary", "optimizer")
    s.add(40, TEMP, False, "temporary", "optimizer")
    if with_zero_grad:
        for i, size in enumerate(PARAMS):
            s.add(20 + i, size, False, "gradient", "optimizer")
    return s


def tiny_plan(n: int, how: Sharding, sixteen_bit_working: bool = False) -> ShardingPlan:
    grads = [PARAMS[i] for i in reversed(range(len(PARAMS)))]
    return make_plan(
        Parallel(n, how),
        PARAMS,
        grads,
        trainable_params=PSI_BYTES // 4,
        sixteen_bit_working=sixteen_bit_working,
    )


def amp_step() -> Stream:
    """``tiny_step`` with autocast's bf16 copies of the weights: made in forward, used and
    freed in backward (the embedding, ``E``, is not cast)."""
    s = tiny_step()
    cast = Stream()
    first_activation = s.handles.index(11)
    for i in range(len(s.handles)):
        if i == first_activation:
            for j, size in enumerate(PARAMS[1:], start=1):
                cast.add(50 + j, size // 2, True, "parameter_cast", "forward")
        if s.phases[i] == "optimizer" and s.phases[i - 1] == "backward":
            for j, size in enumerate(PARAMS[1:], start=1):
                cast.add(50 + j, size // 2, False, "parameter_cast", "backward")
        cast.add(s.handles[i], s.sizes[i], s.allocs[i], s.categories[i], s.phases[i])
    return cast


def live(events: Sequence[Event], until: int | None = None) -> dict[TensorCategory, int]:
    """Bytes live per category after the first ``until`` events (all by default)."""
    out: dict[TensorCategory, int] = {}
    for _, size, alloc, category in events[:until]:
        out[category] = out.get(category, 0) + (size if alloc else -size)
    return {k: v for k, v in out.items() if v}


def peak(events: Sequence[Event]) -> int:
    total = best = 0
    for _, size, alloc, _ in events:
        total += size if alloc else -size
        best = max(best, total)
    return best


# --- building blocks ---------------------------------------------------------------------------


def test_shards_are_padded_up_never_down() -> None:
    assert shard_bytes(1000, 4) == 256  # 125 granules of 8 B, 32 per rank
    assert shard_bytes(1, 8) == 8
    assert shard_bytes(12345, 1) == 12345
    for numel in (1, 7, 8, 9, 1000, 4097, 128256 * 4096):
        for element_bytes in (1, 2, 4, 8):
            for n in (2, 3, 4, 7, 8):
                # at least what a flat buffer padded to a multiple of n elements gives a rank
                assert shard_bytes(numel * element_bytes, n) >= -(-numel // n) * element_bytes
                assert shard_bytes(numel * element_bytes, n) * n < numel * element_bytes + 8 * n


def test_ddp_buckets_follow_the_caps() -> None:
    kib = 1024
    sizes = [512 * kib, 600 * kib, 10 * MIB, 20 * MIB, 30 * MIB, 1 * MIB]
    assert DDP_FIRST_BUCKET_BYTES == MIB and DDP_BUCKET_CAP_BYTES == 25 * MIB
    # a bucket closes once it reaches its cap: 1 MiB first, then 25 MiB
    assert ddp_buckets(sizes) == (1112 * kib, 30 * MIB, 30 * MIB, 1 * MIB)
    assert sum(ddp_buckets(sizes)) == sum(sizes)
    assert ddp_buckets([]) == ()


def test_repeated_block_finds_the_layer_stack() -> None:
    assert repeated_block(PARAMS) == (BLOCK, 2)
    layer = [67, 16, 16, 67, 234, 234, 234, 1, 1]  # a llama layer's tensors, in MB
    model = [2101, *layer * 32, 1, 2101]
    assert repeated_block(model) == (sum(layer), 32)
    assert repeated_block([5, 6, 7]) == (0, 0)
    assert repeated_block([]) == (0, 0)


def test_event_phases_map_both_steps() -> None:
    ops: list[Phase] = ["setup", "forward", "forward", "backward", "optimizer"]
    # step 0 has one more optimizer op (state creation): 6 ops, step 1 starts at index 6
    indices = [-1, 1, 3, 4, 5, 7, 9, 10]
    steps = [0, 0, 0, 0, 0, 1, 1, 1]
    assert event_phases(indices, steps, ops) == [
        "setup",
        "forward",
        "backward",
        "optimizer",
        "optimizer",
        "forward",
        "backward",
        "optimizer",
    ]


# --- the transformation, exactly ---------------------------------------------------------------


@pytest.mark.parametrize("how", STRATEGIES)
def test_one_gpu_leaves_the_stream_as_traced(how: Sharding) -> None:
    s = tiny_step(with_zero_grad=True)
    plan = tiny_plan(1, how)
    assert plan.identity
    assert s.rank(plan) == list(zip(s.handles, s.sizes, s.allocs, s.categories, strict=True))


def test_ddp_adds_a_bucket_copy_of_the_gradients() -> None:
    s = tiny_step()
    events = s.rank(tiny_plan(4, "ddp"))
    assert live(events) == {
        "parameter": PSI_BYTES,
        "input": 64,
        "gradient": 2 * PSI_BYTES,  # the gradients and the bucket (one: < 1 MiB)
        "optimizer": 2 * PSI_BYTES,
    }
    # the bucket is there from wrap time: before the first activation
    first_activation = next(i for i, e in enumerate(events) if e[3] == "activation")
    assert live(events, first_activation)["gradient"] == PSI_BYTES
    assert peak(events) == peak(tiny_step().rank(tiny_plan(1, "ddp"))) + PSI_BYTES


def test_zero2_splits_gradients_and_optimizer_state() -> None:
    n = 4
    s = tiny_step()
    events = s.rank(tiny_plan(n, "zero2"))
    grad_shards = sum(shard_bytes(p, n) for p in PARAMS)
    bucket = PSI_BYTES  # the 5e8-element bucket, capped at all gradients
    assert live(events) == {
        "parameter": PSI_BYTES + grad_shards,  # whole working copy + the 1/N master shard
        "input": 64,
        "gradient": grad_shards + bucket,
        "optimizer": sum(shard_bytes(2 * p, n) for p in PARAMS),
    }
    # each full gradient lives only while it is copied out: alloc full, alloc shard, free full
    full = [e for e in events if e[3] == "gradient" and e[0] < 0 and e[1] in PARAMS]
    assert len(full) == 2 * len(PARAMS)
    # the optimizer's temporary is split too
    assert [e[1] for e in events if e[0] == 40] == [shard_bytes(TEMP, n)] * 2


def test_zero1_splits_the_optimizer_state_and_keeps_the_gradients_whole() -> None:
    n = 4
    events = tiny_step().rank(tiny_plan(n, "zero1"))
    shards = sum(shard_bytes(p, n) for p in PARAMS)
    bucket = PSI_BYTES  # the 5e8-element bucket, capped at all gradients
    assert live(events) == {
        "parameter": PSI_BYTES + shards,  # whole parameters + the 1/N master shard
        "input": 64,
        # whole gradients (reduced once a step), their fp32 shard and the reduce bucket
        "gradient": PSI_BYTES + shards + bucket,
        "optimizer": sum(shard_bytes(2 * p, n) for p in PARAMS),
    }
    assert [e[1] for e in events if e[0] == 40] == [shard_bytes(TEMP, n)] * 2
    # AMP: the whole parameters and gradients are the 16-bit working copies
    amp = amp_step().rank(tiny_plan(n, "zero1", sixteen_bit_working=True))
    assert "parameter_cast" not in {e[3] for e in amp}
    state = live(amp)
    assert state["parameter"] == PSI_BYTES // 2 + shards
    assert state["gradient"] == PSI_BYTES // 2 + shards + PSI_BYTES // 2


def test_zero3_gathers_root_and_two_blocks_during_the_passes() -> None:
    n = 4
    s = tiny_step()
    events = s.rank(tiny_plan(n, "zero3"))
    param_shards = sum(shard_bytes(p, n) for p in PARAMS)
    gathered = ROOT + 2 * BLOCK
    staged = ROOT + BLOCK  # unsharded gradients: the root's and one block's
    first_activation = next(i for i, e in enumerate(events) if e[3] == "activation")
    during_forward = live(events, first_activation + 1)
    assert during_forward["parameter"] == param_shards + gathered
    first_gradient = next(i for i, e in enumerate(events) if e[3] == "gradient" and e[0] >= 0)
    assert live(events, first_gradient)["gradient"] == staged
    # after backward: gathered parameters and staged gradients are gone, all state is 1/N
    assert live(events) == {
        "parameter": param_shards,
        "input": 64,
        "gradient": sum(shard_bytes(p, n) for p in PARAMS),
        "optimizer": sum(shard_bytes(2 * p, n) for p in PARAMS),
    }
    assert tiny_step().rank(tiny_plan(n, "fsdp")) == events


CAST_BYTES = (PSI_BYTES - E) // 2


def test_ddp_keeps_the_autocast_copies_of_the_weights() -> None:
    events = amp_step().rank(tiny_plan(4, "ddp", sixteen_bit_working=True))
    first_gradient = next(i for i, e in enumerate(events) if e[3] == "gradient" and e[0] >= 0)
    assert live(events, first_gradient)["parameter_cast"] == CAST_BYTES
    assert "parameter_cast" not in live(events)


def test_zero3_with_sixteen_bit_working_parameters_gathers_them_instead_of_casting() -> None:
    n = 4
    plain = amp_step().rank(tiny_plan(n, "zero3"))
    events = amp_step().rank(tiny_plan(n, "zero3", sixteen_bit_working=True))
    assert "parameter_cast" in {e[3] for e in plain}
    assert "parameter_cast" not in {e[3] for e in events}
    param_shards = sum(shard_bytes(p, n) for p in PARAMS)  # the fp32 master shard
    first_activation = next(i for i, e in enumerate(events) if e[3] == "activation")
    assert live(events, first_activation + 1)["parameter"] == param_shards + (ROOT + 2 * BLOCK) // 2
    first_gradient = next(i for i, e in enumerate(events) if e[3] == "gradient" and e[0] >= 0)
    assert live(events, first_gradient)["gradient"] == (ROOT + BLOCK) // 2
    # the state after the step is as without: fp32 shards of parameters, gradients, moments
    assert live(events) == live(plain)
    assert peak(events) < peak(plain)
    assert any("16-bit working parameters" in a for a in tiny_plan(n, "fsdp", True).assumptions)


def test_zero2_with_sixteen_bit_working_parameters_keeps_them_whole_at_two_bytes() -> None:
    n = 4
    events = amp_step().rank(tiny_plan(n, "zero2", sixteen_bit_working=True))
    assert "parameter_cast" not in {e[3] for e in events}
    grad_shards = sum(shard_bytes(p, n) for p in PARAMS)
    assert live(events) == {
        "parameter": PSI_BYTES // 2 + grad_shards,  # whole bf16 copy + the fp32 master shard
        "input": 64,
        "gradient": grad_shards + PSI_BYTES // 2,  # fp32 shards + the bf16 bucket
        "optimizer": sum(shard_bytes(2 * p, n) for p in PARAMS),
    }
    # each full gradient is bf16 while it is copied out
    full = [e[1] for e in events if e[3] == "gradient" and e[0] < 0 and e[2]]
    assert sorted(full[1:]) == sorted(p // 2 for p in PARAMS)


def test_one_gpu_keeps_the_casts_whatever_the_precision_mode() -> None:
    s = amp_step()
    as_traced = list(zip(s.handles, s.sizes, s.allocs, s.categories, strict=True))
    assert s.rank(tiny_plan(1, "zero3", sixteen_bit_working=True)) == as_traced


def test_persistent_state_falls_with_more_gpus() -> None:
    for how in ("zero2", "zero3"):
        states = []
        for n in (1, 2, 4, 8, 16):
            state = live(tiny_step().rank(tiny_plan(n, how)))
            states.append(state["optimizer"] + state["gradient"])
        assert states == sorted(states, reverse=True) and states[0] > states[-1]


def test_zero_paper_model_states_in_our_categories() -> None:
    """ZeRO (arXiv:1910.02054, Fig. 1): mixed-precision Adam holds 2Ψ (fp16 parameters) + 2Ψ
    (fp16 gradients) + 12Ψ (fp32 parameters, momentum, variance) = 16Ψ bytes per GPU under DDP,
    2Ψ + 14Ψ/N with stage 2 and 16Ψ/N with stage 3. Our AMP traces hold the same 16Ψ as
    4Ψ fp32 parameters (working and master copy at once) + 4Ψ fp32 gradients + 8Ψ moments."""
    psi = 1_000_000_000  # parameters; tensors of 1e8 parameters so that shards divide evenly
    params = [4 * psi // 10] * 10
    n = 8

    def states(how: Sharding, working: bool = False) -> int:
        plan = make_plan(
            Parallel(n, how), params, params, trainable_params=psi, sixteen_bit_working=working
        )
        s = Stream()
        for i, p in enumerate(params):
            s.add(i, p, True, "parameter", "setup")
        s.add(99, 1, True, "input", "setup")
        for i, p in enumerate(params):
            s.add(100 + i, p, True, "gradient", "backward")
        for i, p in enumerate(params):
            s.add(200 + i, 2 * p, True, "optimizer", "optimizer")
        state = live(s.rank(plan))
        element = 2 if working else 4
        zero_bucket = min(ZERO_REDUCE_BUCKET_ELEMENTS * element, element * psi)
        bucket = {"ddp": 4 * psi, "zero1": zero_bucket, "zero2": zero_bucket}
        return sum(state.values()) - 1 - bucket.get(how, 0)  # model states, no comm buffers

    assert states("ddp") == 16 * psi
    # stage 1: 4Ψ + 12Ψ/N in the paper; ours adds the fp32 gradient shard, 4Ψ/N
    assert states("zero1", working=True) == 4 * psi + 16 * psi // n >= 4 * psi + 12 * psi // n
    zero2 = 2 * psi + 14 * psi // n
    # ours: whole fp32 working copy 4Ψ + master shard 4Ψ/N + gradients 4Ψ/N + moments 8Ψ/N
    assert states("zero2") == 4 * psi + 16 * psi // n >= zero2
    assert states("zero3") == 16 * psi // n == states("fsdp")
    # with 16-bit working parameters (DeepSpeed bf16, FSDP MixedPrecision): the whole copy is
    # 2Ψ, as in the paper; the fp32 gradient shards keep ours 2Ψ/N above it
    assert states("zero2", working=True) == 2 * psi + 16 * psi // n >= zero2
    assert states("zero3", working=True) == 16 * psi // n
    assert states("ddp", working=True) == 16 * psi


# --- on a stored profile and through fit -------------------------------------------------------


def test_stored_profile_is_found_whatever_the_gpus() -> None:
    sharded = RunConfig(gpus=8, sharding="fsdp")
    assert profile_key("llama-3.1-8b", sharded) == profile_key("llama-3.1-8b", RunConfig())
    assert load_stored("llama-3.1-8b", sharded) is not None


def test_zero3_below_zero2_below_ddp_for_a_big_model() -> None:
    profile = load_stored("llama-3.1-8b", RunConfig())
    assert profile is not None
    memory = StepMemory(profile)
    peaks = {
        how: memory.replay(1, 2048, (), Parallel(8, how)).peak_allocated_bytes for how in STRATEGIES
    }
    single = memory.replay(1, 2048, (), SINGLE_GPU).peak_allocated_bytes
    assert peaks["fsdp"] == peaks["zero3"] < peaks["zero2"] < peaks["zero1"] < peaks["ddp"]
    assert peaks["zero2"] < single < peaks["ddp"]
    assert memory.replay(1, 2048, (), Parallel(1, "zero3")).peak_allocated_bytes == single


def _fit_json(*args: str) -> dict[str, object]:
    result = CliRunner().invoke(app, ["fit", "llama-3.1-8b", "--gpu", "h100-sxm", *args, "--json"])
    assert result.exit_code == 0, result.output
    (doc,) = json.loads(result.stdout)
    assert isinstance(doc, dict)
    return doc


def test_cli_fsdp_on_eight_gpus_splits_the_model_state() -> None:
    one = _fit_json()
    eight = _fit_json("--gpus", "8", "--sharding", "fsdp")
    assert (eight["gpus"], eight["sharding"]) == (8, "fsdp")
    assert (one["gpus"], one["sharding"]) == (1, "ddp")
    assert one["max_batch_size"] == 0  # 16Ψ = 120 GiB: does not fit alone
    assert eight["max_batch_size"] != 0
    b1, b8 = one["breakdown"], eight["breakdown"]
    assert isinstance(b1, dict) and isinstance(b8, dict)
    # optimizer state is exactly split (up to padding)
    assert math.isclose(b8["optimizer"], b1["optimizer"] / 8, rel_tol=1e-6)
    # weights: the 1/8 fp32 shard plus what is gathered in bf16 (FSDP MixedPrecision):
    # embeddings + lm_head + final norm (root) and two decoder layers (Llama 3.1 8B: vocab
    # 128256, hidden 4096, 8 KV heads of 128, MLP 14336; model card / config.json)
    hidden, mlp, kv = 4096, 14336, 1024
    layer = 2 * hidden * hidden + 2 * kv * hidden + 3 * hidden * mlp + 2 * hidden
    root = 2 * 128256 * hidden + hidden
    params = 32 * layer + root
    # the single GPU peaks in the optimizer step: fp32 weights (and two rotary buffers)
    assert b1["weights"] == pytest.approx(4 * params, rel=1e-6)
    assert b8["weights"] == pytest.approx(4 * params / 8 + 2 * (root + 2 * layer), rel=1e-6)
    state1 = b1["weights"] + b1["gradients"] + b1["optimizer"]
    state8 = b8["weights"] + b8["gradients"] + b8["optimizer"]
    assert state1 / 8 < state8 < state1 / 4
    assert eight["overheads"]["nccl_buffers"] > 0  # type: ignore[index]
    assumptions = " ".join(eight["assumptions"])  # type: ignore[arg-type]
    assert "32 repeated blocks" in assumptions and "prefetched" in assumptions
    assert "16-bit working parameters" in assumptions


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--sharding", "zero9"], "--sharding"),
        (["--gpus", "0"], "--gpus must be at least 1"),
        (["--sharding", "zero3", "--mode", "inference"], "--sharding zero3"),
    ],
)
def test_cli_rejects_bad_sharding_input(
    args: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["fit", "llama-3.1-8b", "--gpu", "h100-sxm", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and "Traceback" not in err
    assert len(err.splitlines()) == 1, err


def test_run_config_checks_gpus_and_sharding() -> None:
    assert run_config(gpus=4, sharding="zero2").gpus == 4
    with pytest.raises(UsageError, match="at least 1"):
        run_config(gpus=-1)
    with pytest.raises(UsageError, match="'ddp', 'zero1', 'zero2', 'zero3', 'fsdp' or 'hsdp'"):
        run_config(sharding="zero9")


@pytest.mark.parametrize("how", ["ddp", "zero1", "zero2", "zero3", "fsdp"])
def test_rank_events_say_their_phases(how: Sharding) -> None:
    """One phase per rank event (what a compiled step's peak outside the passes is found
    from): a traced event keeps its own; a buffer the strategy adds takes the phase of the
    traced event it comes before (the gathers of the forward pass, the optimizer's shards)."""
    s = tiny_step()
    phases: list[Phase] = []
    events = rank_events(
        s.handles, s.sizes, s.allocs, s.categories, s.phases, tiny_plan(4, how), phases
    )
    assert len(phases) == len(events)
    traced = dict(zip(zip(s.handles, s.allocs, strict=True), s.phases, strict=True))
    for (handle, _, alloc, _), phase in zip(events, phases, strict=True):
        if (handle, alloc) in traced:
            assert phase == traced[(handle, alloc)]
    order = ("setup", "forward", "backward", "optimizer")
    assert [order.index(p) for p in phases] == sorted(order.index(p) for p in phases)
    same: list[Phase] = []
    single = rank_events(
        s.handles, s.sizes, s.allocs, s.categories, s.phases, tiny_plan(1, "ddp"), same
    )
    assert same == s.phases and len(single) == len(s.handles)
