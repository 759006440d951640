"""Published serving measurements against ``predict --serving`` (and compiled decoding
against ``predict --compile``): each row of
``data/serving/published.csv`` (an engine and its version, a GPU, a model, prompt and output
lengths, a concurrency, and what was measured: output tokens/s, TPOT or TTFT) is asked of
``predict`` with the same settings, and the error is computed as for the training references
(positive: predicted faster). The data's sources and what each row assumes are in the folder's
README. ``fit_serving`` picks the serving constants (the decode bandwidth share, the fp8
efficiency) that fit the throughput and TPOT rows best (``scripts/fit_serving.py``
evaluates them at each point), with each publication's error when fitted without it.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any, cast

from whichgpu.errors import WhichGpuError
from whichgpu.schema import ReferenceThroughputCase, RunConfig, ThroughputEstimate
from whichgpu.validate.timing import fit_options
from whichgpu.workloads import run_config

SOURCE = "serving"
"""The reference's id in ``validate`` results."""

DATA_DIR = "serving"
"""Folder of the table, under ``validate/data``."""

TABLE_FILE = "published.csv"
"""The transcribed measurements."""

LONG_RUN = "long"
"""The ``requests`` of a run of fixed lengths whose prompt count the source does not state."""

LONG_RUN_WAVES = 40
"""A ``long`` run is simulated with this many times its concurrency of requests, and its TTFT
taken after the first wave (``ServingBenchmark.settled_mean_ttft_s``): what it settles to."""

COMPILED = "compiled"
"""The ``engine`` of a row of compiled decoding (``torch.compile``, no serving engine): asked
of ``predict --mode inference --compile``."""

QUANTITIES = {
    "output_tokens_per_s": "output tokens/s",
    "tpot_ms": "TPOT ms",
    "ttft_ms": "TTFT ms",
    "compiled_tokens_per_s": "compiled decoding tokens/s",
}
"""The quantities a row may give, and how the views name them."""


@dataclass(frozen=True)
class ServingRow:
    """One published measurement (a row of ``published.csv``)."""

    source_id: str
    """Short name of the publication (the README lists each with its URL and date)."""
    engine: str
    """Serving engine, as ``predict --serving`` names it (``vllm``, ``tensorrt-llm``), or
    ``compiled``: compiled decoding, no engine (``predict --compile``)."""
    engine_version: str
    """The engine's version the publication states."""
    gpu: str
    """Catalog id of the GPU."""
    gpus: int
    """GPUs serving the model (tensor parallel)."""
    workload: str
    """The whichgpu workload that stands for the model."""
    precision: str
    """Serving dtype (``bf16``, ``fp16``)."""
    quantization: str | None
    """How the weights are stored where not 16-bit (``fp8``, ``int4``), else None."""
    kv_cache_dtype: str | None
    """How the engine kept its KV cache where not in the serving dtype (``fp8``), else None."""
    input_tokens: int
    """Prompt tokens per request."""
    output_tokens: int
    """Generated tokens per request."""
    concurrency: int | None
    """Requests in flight at once (None: fed at an unbounded rate, so as many as the engine's
    KV cache holds: ``predict`` is asked at the largest concurrency ``fit --serving`` finds)."""
    requests: int | None
    """Prompts the benchmark sent in all, for a run of fixed lengths (``predict --requests``
    simulates that run, and its figure is compared); None where the lengths vary (or, with
    ``long_run``, the count is not stated), and the steady state at the concurrency is
    compared."""
    long_run: bool
    """A run of fixed lengths at a fixed concurrency whose prompt count is not stated: it is
    simulated ``LONG_RUN_WAVES`` waves long and its TTFT taken after the first wave."""
    quantity: str
    """``output_tokens_per_s``, ``tpot_ms`` or ``ttft_ms``."""
    statistic: str
    """``mean`` or ``median`` over the requests (throughputs: ``total``)."""
    value: float
    """The published value, in the quantity's unit."""
    note: str
    """What else the publication states about the run."""

    @property
    def case(self) -> str:
        """How the views name the row."""
        tp = f" x{self.gpus}" if self.gpus > 1 else ""
        quant = f" {self.quantization}" if self.quantization else ""
        quant += " kv-fp8" if self.kv_cache_dtype == "fp8" else ""
        load = "max" if self.concurrency is None else str(self.concurrency)
        sent = f" n{self.requests}" if self.requests is not None else ""
        sent = " long" if self.long_run else sent
        return (
            f"{self.workload}{quant} {self.engine} {self.engine_version}{tp} "
            f"{self.input_tokens}/{self.output_tokens} c{load}{sent}"
        )

    def simulated_requests(self, concurrency: int) -> int | None:
        """The requests of the benchmark run simulated for the row (None: none is)."""
        if self.long_run:
            return LONG_RUN_WAVES * concurrency
        return self.requests

    def run(self, concurrency: int | None = None) -> RunConfig:
        """The inference run ``predict`` is asked about (at ``concurrency`` where the row's is
        unbounded)."""
        return run_config(
            mode="inference",
            precision=self.precision,
            concurrency=self.concurrency or concurrency,
            context=self.input_tokens,
            new_tokens=self.output_tokens,
            gpus=self.gpus,
            compile=self.engine == COMPILED,
        )


def by_publication(cases: list[ReferenceThroughputCase]) -> str:
    """The mean |error| of each publication among ``cases`` (one quantity's), where more
    than one contributes: a summary over several sources can hide that one of them is far
    off, e.g. ``nim-llm-benchmarking 6: 27.1%; trtllm-performance-v0.9 16: 53.7%``."""
    groups: dict[str, list[float]] = {}
    for case in cases:
        if case.error is not None:
            groups.setdefault(case.publication, []).append(abs(case.error))
    if len(groups) < 2:
        return ""
    return "; ".join(
        f"{name} {len(errors)}: {sum(errors) / len(errors):.1%}" for name, errors in groups.items()
    )


def _int(text: str) -> int:
    return int(text.replace("_", ""))


def serving_rows() -> list[ServingRow]:
    """Every row of the shipped table."""
    ref = resources.files("whichgpu.validate").joinpath("data").joinpath(DATA_DIR)
    ref = ref.joinpath(TABLE_FILE)
    with ref.open(encoding="utf-8") as fh:
        lines = [line for line in fh if not line.startswith("#")]
    return [
        ServingRow(
            source_id=r["source_id"],
            engine=r["engine"],
            engine_version=r["engine_version"],
            gpu=r["gpu"],
            gpus=_int(r["gpus"]),
            workload=r["workload"],
            precision=r["precision"],
            quantization=r["quantization"] or None,
            kv_cache_dtype=r["kv_cache_dtype"] or None,
            input_tokens=_int(r["input_tokens"]),
            output_tokens=_int(r["output_tokens"]),
            concurrency=None if r["concurrency"] == "max" else _int(r["concurrency"]),
            requests=_int(r["requests"]) if r["requests"] not in ("", LONG_RUN) else None,
            long_run=r["requests"] == LONG_RUN,
            quantity=r["quantity"],
            statistic=r["statistic"],
            value=float(r["value"]),
            note=r["note"],
        )
        for r in csv.DictReader(lines)
    ]


def _asked(row: ServingRow, concurrency: int) -> ThroughputEstimate:
    """``predict --serving``'s answer for ``row`` at ``concurrency`` (a compiled decoding
    row: ``predict --compile``'s)."""
    from whichgpu.api import predict

    if row.engine == COMPILED:
        (estimate,) = predict(
            row.workload,
            gpus=[row.gpu],
            quantization=cast(Any, row.quantization),
            **fit_options(row.run(concurrency)),
        )
        return estimate
    (estimate,) = predict(
        row.workload,
        gpus=[row.gpu],
        serving=row.engine,
        quantization=cast(Any, row.quantization),
        kv_cache_dtype=row.kv_cache_dtype,
        requests=row.simulated_requests(concurrency),
        **fit_options(row.run(concurrency)),
    )
    return estimate


def _predicted(row: ServingRow, speed: Any) -> float | None:
    """The prediction of the row's quantity from a ``ServingSpeed``: of its simulated
    benchmark run where the row states the requests sent or is a ``long`` run (the row's
    statistic, mean or median; a long run's TTFT after its first wave), else of the steady
    state at the concurrency."""
    run = speed.benchmark
    if row.quantity == "output_tokens_per_s":
        return float((run or speed).output_tokens_per_s)
    if run is not None:
        kind = "tpot" if row.quantity == "tpot_ms" else "ttft"
        stat = "median" if row.statistic == "median" else "mean"
        settled = "settled_" if row.long_run and kind == "ttft" else ""
        seconds = getattr(run, f"{settled}{stat}_{kind}_s")
    else:
        seconds = speed.tpot_s if row.quantity == "tpot_ms" else speed.ttft_s
    return None if seconds is None else float(seconds) * 1000


def _error(row: ServingRow, predicted: float) -> float:
    """Positive: predicted faster (a throughput above, a time below the measured one)."""
    if row.quantity in ("output_tokens_per_s", "compiled_tokens_per_s"):
        return predicted / row.value - 1
    return row.value / predicted - 1


def serving_throughput(
    rows: list[ServingRow] | None = None, progress: Callable[[str], None] | None = None
) -> list[ReferenceThroughputCase]:
    """``predict --serving``'s answer for every published row (default: the shipped table)."""
    out = []
    for row in serving_rows() if rows is None else rows:
        if progress is not None:
            progress(row.case)
        base: dict[str, Any] = {
            "source": SOURCE,
            "case": row.case,
            "workload": row.workload,
            "gpu": row.gpu,
            "run": row.run(1),
            "quantity": QUANTITIES[row.quantity],
            "measured": row.value,
            "publication": row.source_id,
        }
        try:
            estimate = _asked(row, row.concurrency or 1)
            if row.concurrency is None:  # unbounded: as many as the KV cache holds
                speed = estimate.serving_speed
                held = speed.max_concurrency if speed is not None else None
                if held:
                    estimate = _asked(row, held)
                    base["run"] = row.run(held)
        except WhichGpuError as exc:
            out.append(ReferenceThroughputCase(**base, predicted=None, note=str(exc)))
            continue
        speed = estimate.serving_speed
        if row.engine == COMPILED:  # the request's generated tokens/s, its prefill included
            predicted = estimate.throughput
        else:
            predicted = None if speed is None else _predicted(row, speed)
        if predicted is None:
            why = estimate.speed_unknown or "no serving speed for this run"
            out.append(ReferenceThroughputCase(**base, predicted=None, note=why))
            continue
        out.append(
            ReferenceThroughputCase(
                **base,
                predicted=predicted,
                error=_error(row, predicted),
                fits=estimate.fits,
                note=f"{row.statistic}; {row.note}" if row.note else row.statistic,
            )
        )
    return out


FITTED_QUANTITIES = ("output_tokens_per_s", "tpot_ms", "compiled_tokens_per_s")
"""The quantities ``scripts/fit_serving.py`` fits the serving constants to: engines'
output tokens/s (decode steps and, at many requests, batched prefills) and TPOT, compiled
decoding's tokens/s. TTFT is not among them: it stays an independent check."""


def fitted_rows(rows: list[ServingRow] | None = None) -> list[ServingRow]:
    """The rows (default: the shipped table's) of a quantity the serving constants are fitted
    to."""
    rows = serving_rows() if rows is None else rows
    return [r for r in rows if r.quantity in FITTED_QUANTITIES]


Point = tuple[float, float]
"""Serving constants a fit tries: the decode bandwidth share and the fp8 tensor efficiency."""


@dataclass(frozen=True)
class ServingFit:
    """The serving constants that fit published measurements best, and how well they predict
    each publication's rows when fitted without them."""

    point: Point
    """The constants (decode bandwidth share, fp8 efficiency) of the least mean squared
    ``log(predicted / measured)`` over all rows."""
    rows: int
    """Rows fitted (those with a prediction)."""
    in_sample: dict[str, float]
    """Mean |error| of each publication's rows at ``point``."""
    held_out: dict[str, float]
    """Mean |error| of each publication's rows at the point fitted without that publication."""
    held_out_point: dict[str, Point]
    """That point, by publication left out."""
    held_out_all: float
    """Mean |error| over all rows, each at the point fitted without its publication."""


def _squared_log_error(cases: list[ReferenceThroughputCase], leave_out: str | None) -> float:
    logs = [
        math.log1p(c.error) for c in cases if c.error is not None and c.publication != leave_out
    ]
    return sum(v * v for v in logs) / len(logs) if logs else math.inf


def _mean_abs(cases: list[ReferenceThroughputCase]) -> float:
    errors = [abs(c.error) for c in cases if c.error is not None]
    return sum(errors) / len(errors) if errors else math.nan


def best_point(
    by_point: dict[Point, list[ReferenceThroughputCase]], leave_out: str | None = None
) -> Point:
    """The point among ``by_point``'s (each point's cases: the rows predicted at it) with the
    least mean squared log error, without ``leave_out``'s rows where given."""
    if not by_point:
        raise ValueError("no points evaluated")
    return min(by_point, key=lambda p: (_squared_log_error(by_point[p], leave_out), p))


def fit_serving(by_point: dict[Point, list[ReferenceThroughputCase]]) -> ServingFit:
    """The best of the evaluated points, and, leaving each publication out in turn, the best
    point for the others (among the same evaluated points) and its error on the one left out."""
    point = best_point(by_point)
    publications = sorted({c.publication for c in by_point[point] if c.error is not None})
    in_sample, held_out, held_point = {}, {}, {}
    pooled: list[ReferenceThroughputCase] = []
    for name in publications:
        held_point[name] = best_point(by_point, name)
        own = [c for c in by_point[held_point[name]] if c.publication == name]
        pooled += own
        held_out[name] = _mean_abs(own)
        in_sample[name] = _mean_abs([c for c in by_point[point] if c.publication == name])
    return ServingFit(
        point=point,
        rows=sum(1 for c in by_point[point] if c.error is not None),
        in_sample=in_sample,
        held_out=held_out,
        held_out_point=held_point,
        held_out_all=_mean_abs(pooled),
    )
