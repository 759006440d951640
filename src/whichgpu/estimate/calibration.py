"""Correct predictions with a measurement of the same run on one GPU (``predict --calibrate``).

The operator-time model's error is mostly the same on every GPU for one workload and one
software stack: kernels it does not know about, fused or not, an input pipeline. One measured
step on the user's own GPU shows that error, and carrying the ratio measured / predicted to the
other GPUs removes it (the rule ``validate throughput`` checks: on the Lambda 2020 table it
halves the leave-one-GPU-out error). The band then becomes the error of that corrected
prediction (``PerfParameters.calibrated_error_bands``). Pure Python.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from whichgpu.errors import UsageError
from whichgpu.schema import BenchResult, RunConfig, ThroughputEstimate

MATCHED_FIELDS = ("mode", "precision", "method", "optimizer", "checkpointing")
"""Run options a measurement must share with the prediction to calibrate it."""


@dataclass(frozen=True)
class Calibration:
    """The correction one measurement gives."""

    result: BenchResult
    """The measurement."""
    predicted: float
    """What the model predicts for it (same GPU, batch and length), units/s."""

    @property
    def factor(self) -> float:
        """Measured over predicted throughput."""
        assert self.result.throughput is not None
        return self.result.throughput / self.predicted

    def describe(self) -> str:
        """In words, for the estimates' method."""
        r = self.result
        return (
            f"calibrated on your measurement on {r.gpu} (whichgpu bench result {r.id[:8]}, "
            f"{r.created_at:%Y-%m-%d}, batch {r.batch_size}): measured {r.throughput:,.4g} "
            f"against {self.predicted:,.4g} predicted, x{self.factor:.3g} on every GPU"
        )


def matching_measurement(
    results: Iterable[BenchResult], workload: str, run: RunConfig
) -> BenchResult:
    """The newest result of ``workload`` run as ``run`` on one catalog GPU, or a usage error
    that says what the file held."""
    given = list(results)
    usable = [r for r in given if not _mismatches(r, workload, run)]
    if not usable:
        why = "; ".join(f"{r.id[:8]} {', '.join(_mismatches(r, workload, run))}" for r in given[:3])
        more = f" (and {len(given) - 3} more)" if len(given) > 3 else ""
        raise UsageError(
            f"--calibrate: no measurement of {workload} on one catalog GPU with "
            f"{run.mode}, {run.precision}, {run.method}, {run.optimizer}"
            + (", checkpointing" if run.checkpointing else "")
            + (f", sequence length {run.seq_len}" if run.seq_len else "")
            + (f". Given: {why}{more}" if why else "")
            + ". Measure it with `whichgpu bench` using the same options, or drop --calibrate."
        )
    return max(usable, key=lambda r: r.created_at)


def _mismatches(result: BenchResult, workload: str, run: RunConfig) -> list[str]:
    """Why ``result`` cannot calibrate ``workload`` run as ``run`` (empty: it can)."""
    why = []
    if result.workload != workload:
        why.append(f"is of {result.workload}")
    if result.gpu is None:
        why.append(f"ran on {result.device_name}, not a catalog GPU")
    if result.n_gpus != 1:
        why.append(f"ran on {result.n_gpus} GPUs, not one")
    if not result.throughput:
        why.append("has no throughput")
    why.extend(
        f"has {k} {getattr(result.run, k)}, not {getattr(run, k)}"
        for k in MATCHED_FIELDS
        if getattr(result.run, k) != getattr(run, k)
    )
    if run.seq_len is not None and result.seq_len != run.seq_len:
        why.append(f"has sequence length {result.seq_len}, not {run.seq_len}")
    return why


def calibrate(
    estimates: Iterable[ThroughputEstimate], calibration: Calibration, band: float
) -> list[ThroughputEstimate]:
    """``estimates`` corrected by ``calibration``'s factor, with the calibrated ``band``."""
    factor = calibration.factor
    out = []
    for e in estimates:
        if e.throughput is None or e.step_time_s is None:
            out.append(e)
            continue
        throughput = e.throughput * factor
        out.append(
            e.model_copy(
                update={
                    "throughput": throughput,
                    "step_time_s": e.step_time_s / factor,
                    "low": throughput * (1 - band),
                    "high": throughput * (1 + band),
                    "band": band,
                    "mfu": None if e.mfu is None else e.mfu * factor,
                    "calibrated_on": calibration.describe(),
                    "assumptions": (
                        *e.assumptions,
                        f"{calibration.describe()}; band +/-{band:.0%}: the 80th percentile of "
                        "the error of such corrected predictions on the Lambda 2020 table",
                    ),
                }
            )
        )
    return out
