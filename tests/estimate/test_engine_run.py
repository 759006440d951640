"""A serving benchmark run simulated step by step (``predict --serving --requests``): the
scheduler's waves, waiting for a slot, and what a benchmark client reports."""

from __future__ import annotations

import json

import pytest

from tests.estimate.test_engine_speed import _rates, _shape
from whichgpu.estimate.engine_run import closed_loop
from whichgpu.estimate.engine_speed import EngineSpeed


def _speed(chunk_tokens: int = 2048) -> EngineSpeed:
    """Llama 3.1 8B's shape on a GPU of 2 TB/s and 250 TFLOP/s (the engine-speed tests')."""
    return EngineSpeed(_shape(), _rates(tensor=250e12), chunk_tokens=chunk_tokens)


def test_one_request_at_a_time_is_its_prefill_then_its_decode_steps() -> None:
    speed = _speed()
    run = closed_loop(
        speed, requests=5, concurrency=1, context=1000, new_tokens=64, running_limit=256
    )
    prefill = speed.step(1000, 1000 * 1000 / 2, 1000, 1).seconds
    assert run.mean_ttft_s == pytest.approx(prefill)
    assert run.median_ttft_s == pytest.approx(prefill)
    # 63 decode steps after the first token, at lengths 1001 .. 1063
    decode = sum(speed.step(1, 1000 + j, 1000 + j).seconds for j in range(1, 64)) / 63
    assert run.mean_tpot_s == pytest.approx(decode, rel=1e-3)
    assert run.duration_s == pytest.approx(5 * (prefill + 63 * decode), rel=1e-3)
    assert run.output_tokens_per_s == pytest.approx(5 * 64 / run.duration_s)
    assert run.steps == 5 * 64


def test_an_offline_batch_matches_the_burst_its_last_request_waits_for_every_prompt() -> None:
    speed = _speed()
    run = closed_loop(
        speed, requests=8, concurrency=8, context=1000, new_tokens=128, running_limit=256
    )
    burst = speed.burst(8, 1000, 128)
    # the same four prefill steps; the simulation's chunks attend over their own prompt so far
    assert run.mean_ttft_s < burst.ttft_s
    assert run.median_ttft_s < burst.ttft_s
    assert run.duration_s == pytest.approx(burst.ttft_s + 127 * burst.tpot_s, rel=0.03)


def test_fixed_length_waves_spread_out_so_later_requests_wait_less_than_the_first_wave() -> None:
    speed = _speed()
    first_wave = closed_loop(
        speed, requests=16, concurrency=16, context=1000, new_tokens=128, running_limit=256
    )
    many = closed_loop(
        speed, requests=320, concurrency=16, context=1000, new_tokens=128, running_limit=256
    )
    assert many.median_ttft_s < first_wave.median_ttft_s
    assert many.mean_ttft_s < first_wave.mean_ttft_s


def test_requests_beyond_the_running_limit_wait_for_a_slot() -> None:
    speed = _speed()
    free = closed_loop(
        speed, requests=64, concurrency=16, context=200, new_tokens=32, running_limit=256
    )
    capped = closed_loop(
        speed, requests=64, concurrency=16, context=200, new_tokens=32, running_limit=4
    )
    assert capped.running_limit == 4
    assert capped.mean_ttft_s > 2 * free.mean_ttft_s  # they queue behind the running four
    assert capped.output_tokens_per_s < free.output_tokens_per_s


def test_a_request_sent_as_a_step_ends_joins_the_step_after_the_next_on_a_busy_engine() -> None:
    """Three requests, two in flight, 1,000-token prompts in a 1,024-token budget, two tokens
    each: A is prefilled in step 1, B in steps 1-2, so A ends with step 2 while B still runs;
    C, sent then, misses step 3 (the engine began it) and is prefilled in step 4, alone."""
    speed = _speed(chunk_tokens=1024)
    run = closed_loop(speed, requests=3, concurrency=2, context=1000, new_tokens=2, running_limit=8)
    s1 = speed.step(1024, 1000 * 500 + 24 * 12, 1024, 1).seconds  # A's last token samples
    s2 = speed.step(1 + 976, 1001 + 976 * (24 + 488), 1001 + 1000, 2).seconds
    s3 = speed.step(1, 1001, 1001).seconds  # B's second token, without C
    s4 = speed.step(1000, 1000 * 500, 1000, 1).seconds  # C's prompt, the engine otherwise idle
    ttft_a, ttft_b, ttft_c = s1, s1 + s2, s3 + s4
    assert run.mean_ttft_s == pytest.approx((ttft_a + ttft_b + ttft_c) / 3)
    assert run.settled_mean_ttft_s == pytest.approx(ttft_c)
    assert run.duration_s == pytest.approx(s1 + s2 + s3 + s4 + speed.step(1, 1001, 1001).seconds)


def test_a_request_arriving_beside_decodes_waits_one_step_not_for_them_to_end() -> None:
    """A 512-token budget: A is prefilled in steps 1-2, B in steps 2-4, so with 64 tokens each
    A ends with step 65 and B two steps later. C, sent then, waits out step 66 (B's decode)
    and is prefilled in steps 67 (beside B's last decode) and 68."""
    speed = _speed(chunk_tokens=512)
    run = closed_loop(
        speed, requests=3, concurrency=2, context=1000, new_tokens=64, running_limit=8
    )
    s66 = speed.step(1, 1062, 1062).seconds
    s67 = speed.step(1 + 511, 1063 + 511 * 255.5, 1063 + 511, 1).seconds
    s68 = speed.step(489, 489 * (511 + 244.5), 1000, 1).seconds
    assert run.settled_mean_ttft_s == pytest.approx(s66 + s67 + s68)


def test_one_generated_token_has_no_tpot() -> None:
    run = closed_loop(
        _speed(), requests=3, concurrency=3, context=100, new_tokens=1, running_limit=8
    )
    assert run.mean_tpot_s is None and run.median_tpot_s is None
    assert run.output_tokens_per_s == pytest.approx(3 / run.duration_s)


def test_a_run_without_requests_or_tokens_is_refused() -> None:
    with pytest.raises(ValueError):
        closed_loop(_speed(), requests=0, concurrency=1, context=10, new_tokens=4, running_limit=1)


# --- the API and the CLI -------------------------------------------------------------------


def test_predict_with_requests_carries_the_simulated_run() -> None:
    import whichgpu.api as wg

    asked = {
        "gpus": ["a100-40gb"],
        "mode": "inference",
        "serving": "vllm",
        "context": 1024,
        "new_tokens": 128,
        "concurrency": 1,
    }
    (est,) = wg.predict("llama-3.1-8b", requests=20, **asked)  # type: ignore[arg-type]
    speed = est.serving_speed
    assert speed is not None and speed.benchmark is not None
    run = speed.benchmark
    assert (run.requests, run.concurrency) == (20, 1)
    note = next(a for a in speed.assumptions if a.startswith("benchmark run: 20 requests"))
    assert "2048-token budget" in note and "step after the next" in note
    # one request at a time: the steady state's TTFT, and about its decode step
    assert run.mean_ttft_s == pytest.approx(speed.ttft_s, rel=0.01)
    assert run.mean_tpot_s == pytest.approx(speed.tpot_s, rel=0.02)
    (plain,) = wg.predict("llama-3.1-8b", **asked)  # type: ignore[arg-type]
    assert plain.serving_speed is not None and plain.serving_speed.benchmark is None
    assert not any(a.startswith("benchmark run") for a in plain.serving_speed.assumptions)


def test_cli_predict_requests_json_and_table() -> None:
    from tests.conftest import run_cli

    args = (
        "predict", "llama-3.1-8b", "--mode", "inference", "--serving", "vllm",
        "--gpu", "h100-sxm", "--context", "1024", "--new-tokens", "128",
        "--concurrency", "16", "--requests", "64",
    )  # fmt: skip
    done = run_cli(*args, "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)  # stdout is the JSON alone
    run = doc[0]["serving_speed"]["benchmark"]
    assert run["requests"] == 64 and run["concurrency"] == 16
    assert run["mean_ttft_s"] > 0 and run["mean_tpot_s"] > 0
    assert run["output_tokens_per_s"] == pytest.approx(64 * 128 / run["duration_s"])
    shown = run_cli(*args)
    assert shown.returncode == 0, shown.stderr
    assert "A benchmark run: 64 requests, 16 in flight" in shown.stdout


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ((), "--serving"),
        (("--serving", "vllm", "--requests", "0"), "positive"),
        (("--serving", "vllm", "--new-tokens", "0"), "--new-tokens 0"),
    ],
)
def test_cli_requests_misuse_is_a_clear_error(extra: tuple[str, ...], says: str) -> None:
    from tests.conftest import run_cli

    args = ["predict", "llama-3.1-8b", "--mode", "inference", "--gpu", "h100-sxm"]
    if "--requests" not in extra:
        args += ["--requests", "10"]
    done = run_cli(*args, *extra)
    assert done.returncode == 2
    assert says in done.stderr and "Traceback" not in done.stderr


def test_an_engine_without_chunked_prefill_runs_each_prompt_whole() -> None:
    """TensorRT-LLM's default (enable_chunked_prefill off): two 1,500-token prompts arriving
    together in a 2,048-token budget run one a step; chunked, the second starts beside the
    first."""
    whole = EngineSpeed(_shape(), _rates(tensor=250e12), chunk_tokens=2048, whole_prompts=True)
    chunked = _speed()
    ask = {"requests": 2, "concurrency": 2, "context": 1500, "new_tokens": 4, "running_limit": 8}
    one, two = closed_loop(whole, **ask), closed_loop(chunked, **ask)  # type: ignore[arg-type]
    assert one.steps == two.steps == 5  # the two prefill steps, then 3 decode steps
    first = whole.step(1500, 1500 * 750, 1500, 1).seconds
    second = whole.step(1 + 1500, 1500 + 1 + 1500 * 750, 1500 + 1 + 1500, 2).seconds
    assert one.mean_ttft_s == pytest.approx((first + (first + second)) / 2)
    assert two.mean_ttft_s != pytest.approx(
        one.mean_ttft_s
    )  # chunked: 548 tokens of it in step one
    # a whole prompt's TTFT in the steady state is one step beside the decodes, where the
    # chunked engine splits it over the budget the decodes leave
    others = 999 * 1532  # the other sequences' decodes, at context + new tokens / 2
    one_step = whole.step(999 + 1500, others + 1500 * 750, others + 1500, 1000).seconds
    assert whole.ttft(1000, 1500, 64) == pytest.approx(one_step)
    assert chunked.ttft(1000, 1500, 64) > whole.ttft(1000, 1500, 64)
    # a burst: as many whole prompts a step as the budget holds (one of 1,500 in 2,048)
    assert whole.burst(4, 1500, 16).ttft_s == pytest.approx(
        4 * whole.step(1500, 1500 * 750, 1500, 1).seconds
    )
    assert whole.prefill_tokens_per_step(4, 1500) == 1500
    assert chunked.prefill_tokens_per_step(4, 1500) == 2048
