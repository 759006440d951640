"""A serving benchmark run, step by step: ``requests`` prompts of fixed lengths sent in a
closed loop that keeps ``concurrency`` of them in flight (``vllm bench serve --max-concurrency
C --num-prompts N --request-rate inf``; C = N is an offline batch), scheduled as a
continuous-batching engine does and timed with ``EngineSpeed``'s step model. It answers what
such a benchmark reports — mean and median TTFT and TPOT over the requests and the run's output
tokens/s — where ``EngineSpeed.point`` answers for the steady state and ``EngineSpeed.burst``
for the first wave alone. The scheduler's rules and what they leave out: docs/serving.md,
"A benchmark run".
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass

from whichgpu.estimate.engine_speed import EngineSpeed
from whichgpu.schema import ServingBenchmark

EXACT_DECODE_STEPS = 8
"""Runs of identical decode-only steps up to this long are timed step by step; longer ones by
their first and last step (a step's time is linear in the KV tokens it reads, within each of
its kernels' rooflines)."""


@dataclass
class _Request:
    arrival_s: float
    prefilled: int = 0
    generated: int = 0
    first_token_s: float | None = None
    ttft_s: float = 0.0
    tpot_s: float | None = None


def closed_loop(
    speed: EngineSpeed,
    *,
    requests: int,
    concurrency: int,
    context: int,
    new_tokens: int,
    running_limit: int,
) -> ServingBenchmark:
    """Simulate the benchmark run, step by step.

    Each step the engine runs every running sequence's decode token first, then the prompts
    in the order they arrived, each as much as the step's token budget (``speed.chunk_tokens``)
    leaves (an engine without chunked prefill, ``speed.whole_prompts``: each whole, while the
    budget holds it); a waiting request starts when fewer than ``running_limit`` sequences
    run. A prompt finished in a step yields its first token at the step's end; each later
    step yields one
    more. When a request ends the client sends the next, at once, until ``requests`` were sent;
    it reaches a busy engine after the engine has begun its next step (the last token goes out
    at the step's end, the new request comes back through HTTP and tokenization), so it joins
    the step after that; an idle engine starts it at once. A step is timed by
    ``EngineSpeed``'s step model with every decode at its own length and every prompt chunk
    attending over its prompt so far."""
    if requests < 1 or concurrency < 1 or context < 1 or new_tokens < 1 or running_limit < 1:
        raise ValueError("a benchmark run needs at least one request, token and slot")
    budget = max(speed.chunk_tokens, 1)
    sent = min(concurrency, requests)
    waiting: deque[_Request] = deque(_Request(0.0) for _ in range(sent))
    prefilling: list[_Request] = []  # running, prompt not finished
    decoding: list[_Request] = []  # running, generating
    done: list[_Request] = []
    now, steps = 0.0, 0
    while waiting or prefilling or decoding:
        busy = bool(prefilling or decoding)
        while waiting and len(prefilling) + len(decoding) < running_limit:
            if busy and waiting[0].arrival_s >= now > 0:
                break  # sent as the last step ended: the engine began the next without it
            prefilling.append(waiting.popleft())
        left = budget - len(decoding)
        chunks: list[tuple[_Request, int]] = []
        for req in prefilling:
            if left <= 0:
                break
            size = min(context - req.prefilled, left)
            if speed.whole_prompts and size < context - req.prefilled:
                break  # a prompt runs whole, in a step whose budget holds it
            chunks.append((req, size))
            left -= size
        if not chunks:  # decode only: the same sequences until the first of them ends
            count = min(new_tokens - r.generated for r in decoding)
            if waiting and len(prefilling) + len(decoding) < running_limit:
                count = 1  # a request arrived as the last step ended: it joins after this one
            lengths = sum(context + r.generated for r in decoding)
            now += _decode_run_s(speed, len(decoding), lengths, count)
            steps += count
            for req in decoding:
                req.generated += count
        else:
            attended = kv_read = float(sum(context + r.generated for r in decoding))
            for req, size in chunks:
                attended += size * (req.prefilled + size / 2)
                kv_read += req.prefilled + size
            finishing = sum(req.prefilled + size == context for req, size in chunks)
            tokens = len(decoding) + sum(s for _, s in chunks)
            now += speed.step(tokens, attended, kv_read, len(decoding) + finishing).seconds
            steps += 1
            for req in decoding:
                req.generated += 1
            for req, size in chunks:
                req.prefilled += size
                if req.prefilled == context:
                    prefilling.remove(req)
                    req.generated, req.first_token_s = 1, now
                    req.ttft_s = now - req.arrival_s
                    decoding.append(req)
        for req in [r for r in decoding if r.generated >= new_tokens]:
            decoding.remove(req)
            if new_tokens > 1 and req.first_token_s is not None:
                req.tpot_s = (now - req.first_token_s) / (new_tokens - 1)
            done.append(req)
            if sent < requests:
                waiting.append(_Request(now))
                sent += 1
    ttfts = [r.ttft_s for r in done]
    later = [r.ttft_s for r in done if r.arrival_s > 0]  # after the first wave
    tpots = [r.tpot_s for r in done if r.tpot_s is not None]
    return ServingBenchmark(
        requests=requests,
        concurrency=concurrency,
        running_limit=running_limit,
        mean_ttft_s=statistics.fmean(ttfts),
        median_ttft_s=statistics.median(ttfts),
        settled_mean_ttft_s=statistics.fmean(later) if later else None,
        settled_median_ttft_s=statistics.median(later) if later else None,
        mean_tpot_s=statistics.fmean(tpots) if tpots else None,
        median_tpot_s=statistics.median(tpots) if tpots else None,
        output_tokens_per_s=requests * new_tokens / now,
        duration_s=now,
        steps=steps,
    )


def _decode_run_s(speed: EngineSpeed, sequences: int, lengths: float, count: int) -> float:
    """``count`` decode steps of ``sequences`` sequences whose lengths sum to ``lengths`` at
    the first step and grow by one each step."""

    def step_s(j: int) -> float:
        tokens = lengths + sequences * j
        return speed.step(sequences, tokens, tokens).seconds

    if count <= EXACT_DECODE_STEPS:
        return sum(step_s(j) for j in range(count))
    return count * (step_s(0) + step_s(count - 1)) / 2
