"""Correct predictions with a measurement of the same run on one GPU (``predict --calibrate``).

The operator-time model's error is mostly the same on every GPU for one workload and one
software stack: kernels it does not know about, fused or not, an input pipeline. One measured
step on the user's own GPU shows that error, and carrying the ratio measured / predicted to the
other GPUs removes it (the rule ``validate throughput`` checks: on the Lambda 2020 table it
halves the leave-one-GPU-out error). The band then becomes the error of that corrected
prediction (``PerfParameters.calibrated_error_bands``). Pure Python.

A measurement is applied only if it is possible (``Calibration.check``): its MFU (the
prediction's at the measured run, times the ratio) at most 1, and the ratio within
``PLAUSIBLE_FACTORS``. Outside them the measurement is wrong (a mistyped throughput, another
GPU or run), not the model, and correcting every GPU by it would spread the mistake.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from whichgpu.errors import UsageError
from whichgpu.schema import BenchResult, RunConfig, ThroughputEstimate

MATCHED_FIELDS = (
    "mode",
    "precision",
    "method",
    "optimizer",
    "checkpointing",
    "checkpointing_policy",
)
"""Run options a measurement must share with the prediction to calibrate it."""

PLAUSIBLE_FACTORS = (0.05, 20.0)
"""Measured / predicted ratios a calibration may apply. The model's error is tens of percent
(``validate throughput``); a measurement twenty times off is not of the run it claims."""
MAX_MFU = 1.0
"""Largest model FLOPs utilisation a measurement may have: no run beats its GPU's peak."""


class ImplausibleMeasurement(UsageError):
    """A measurement that cannot be of the run and GPU it names (``Calibration.check``);
    ``reason`` says why, without advice."""

    def __init__(self, result: BenchResult, reason: str) -> None:
        self.result = result
        self.reason = reason
        short = result.id[:8]
        super().__init__(
            f"--calibrate: {reason}. Check the result (`whichgpu results show {short}`): its "
            f"throughput, batch or GPU may be wrong; delete it (`whichgpu results delete "
            f"{short}`) or measure again with `whichgpu bench`."
        )


@dataclass(frozen=True)
class Calibration:
    """The correction one measurement gives."""

    result: BenchResult
    """The measurement."""
    predicted: float
    """What the model predicts for it (same GPU, batch and length), units/s."""
    predicted_mfu: float | None = None
    """The prediction's model FLOPs utilisation, when it has one."""

    @property
    def factor(self) -> float:
        """Measured over predicted throughput."""
        assert self.result.throughput is not None
        return self.result.throughput / self.predicted

    @property
    def measured_mfu(self) -> float | None:
        """The measurement's model FLOPs utilisation: the same FLOPs in 1 / ``factor`` of the
        predicted time."""
        return None if self.predicted_mfu is None else self.predicted_mfu * self.factor

    def check(self) -> None:
        """Raise ``ImplausibleMeasurement`` when the measurement is not possible: an MFU above
        ``MAX_MFU``, or a ratio outside ``PLAUSIBLE_FACTORS``."""
        r = self.result
        low, high = PLAUSIBLE_FACTORS
        measured = (
            f"result {r.id[:8]} ({r.workload} on {r.gpu}, batch {r.batch_size}) measured "
            f"{r.throughput:,.4g} {r.throughput_unit} against {self.predicted:,.4g} predicted "
            f"(x{self.factor:.3g})"
        )
        mfu = self.measured_mfu
        if mfu is not None and mfu > MAX_MFU:
            raise ImplausibleMeasurement(
                r,
                f"{measured}, an MFU of {mfu:,.0%}: more FLOPs per second than {r.gpu}'s peak, "
                "so the measurement is not physically possible for that GPU",
            )
        if not low <= self.factor <= high:
            raise ImplausibleMeasurement(
                r,
                f"{measured}, outside the x{low:g} to x{high:g} a measurement of this run can "
                f"differ from the prediction by, so it is not a possible measurement of it on "
                f"{r.gpu}",
            )

    def describe(self) -> str:
        """In words, for the estimates' method."""
        r = self.result
        return (
            f"calibrated on your measurement on {r.gpu} (whichgpu bench result {r.id[:8]}, "
            f"{r.created_at:%Y-%m-%d}, batch {r.batch_size}): measured {r.throughput:,.4g} "
            f"against {self.predicted:,.4g} predicted, x{self.factor:.3g} on every GPU"
        )


def matching_measurement(
    results: Iterable[BenchResult],
    workload: str,
    run: RunConfig,
    known_gpu: Callable[[str], bool] = lambda gpu: True,
) -> BenchResult:
    """The newest result of ``workload`` run as ``run`` on one catalog GPU (one ``known_gpu``
    says the catalog knows), or a usage error that says what the file held."""
    given = list(results)
    usable = [r for r in given if not _mismatches(r, workload, run, known_gpu)]
    if not usable:
        why = "; ".join(
            f"{r.id[:8]} {', '.join(_mismatches(r, workload, run, known_gpu))}" for r in given[:3]
        )
        more = f" (and {len(given) - 3} more)" if len(given) > 3 else ""
        raise UsageError(
            f"--calibrate: no measurement of {workload} on one catalog GPU with "
            f"{run.mode}, {run.precision}, {run.method}, {run.optimizer}"
            + (f", checkpointing{run.checkpointing_words()}" if run.checkpointing else "")
            + (f", sequence length {run.seq_len}" if run.seq_len else "")
            + (f". Given: {why}{more}" if why else "")
            + ". Measure it with `whichgpu bench` using the same options, or drop --calibrate."
        )
    return max(usable, key=lambda r: r.created_at)


def _mismatches(
    result: BenchResult, workload: str, run: RunConfig, known_gpu: Callable[[str], bool]
) -> list[str]:
    """Why ``result`` cannot calibrate ``workload`` run as ``run`` (empty: it can)."""
    why = []
    if result.workload != workload:
        why.append(f"is of {result.workload}")
    if result.gpu is None:
        why.append(f"ran on {result.device_name}, not a catalog GPU")
    elif not known_gpu(result.gpu):
        why.append(
            f"ran on GPU '{result.gpu}', which this whichgpu's catalog does not know (a newer "
            "whichgpu may: pip install --upgrade whichgpu)"
        )
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
        had = f"sequence length {result.seq_len}" if result.seq_len else "no sequence length"
        why.append(f"has {had}, not {run.seq_len}")
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
