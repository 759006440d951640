"""What ``whichgpu report`` shows, gathered once: the value types of ``api.report``.

``ReportData`` holds every number of the HTML report (and of ``report --json``), computed by
the library layers (recommend, predict, fit, cost, store); the renderer in
``whichgpu.report.html`` only lays them out. The types are frozen and documented like those of
``whichgpu.schema``; they live in their own module so that the shared schema stays about the
questions, not about one page.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from whichgpu.schema import (
    Breakeven,
    MemoryEstimate,
    Ranking,
    RunConfig,
    ThroughputEstimate,
    ValueTable,
)
from whichgpu.store import ResultPivot


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class SpeedPoint(_Frozen):
    """One GPU's throughput, absolute and relative to the report's reference GPU."""

    gpu: str
    """Catalog id."""
    gpu_name: str
    """Its name."""
    throughput: float
    """Units per second on one GPU (measured when ``source`` says so)."""
    low: float
    """Lower end of the uncertainty band (the value itself when measured)."""
    high: float
    """Upper end."""
    throughput_unit: str
    """``sequences/s``, ``images/s``, ``tokens/s`` …"""
    relative: float
    """``throughput`` over the reference GPU's (1.0 = as fast)."""
    relative_low: float
    """``low`` over the reference GPU's throughput."""
    relative_high: float
    """``high`` over the reference GPU's throughput."""
    batch_size: int
    """Batch per GPU the speed is for."""
    source: Literal["predicted", "measured"]
    """Whether ``whichgpu predict`` gave it or a stored ``whichgpu bench`` result."""


class ReportProvenance(_Frozen):
    """Where the numbers come from, so that a reader can judge them."""

    tool_version: str
    """whichgpu version that wrote the report."""
    schema_version: int
    """Version of the JSON documents (``whichgpu.schema.SCHEMA_VERSION``)."""
    catalog_version: str
    """Data folder of the catalog (``v1``)."""
    generated_at: str
    """When the report was computed (UTC, ISO 8601)."""
    price_dates: dict[str, str]
    """Per GPU shown, the dates of the prices used (oldest .. newest, ISO dates)."""
    user_prices: bool
    """Whether prices of the user's own file were among them."""
    throughput_model: str
    """How speeds are predicted (method of the fitted operator-time model)."""
    throughput_fitted_on: str
    """What the model's constants were fitted on."""
    throughput_fitted_date: str
    """When they were fitted."""
    throughput_error_band: float
    """The model's validation error for this kind of workload: the 80th percentile of its
    absolute error, as a share (0.43 = ±43 %); the bands of the speed chart."""
    throughput_error_basis: str = "leave one GPU out"
    """Which validation the band comes from: ``leave one GPU out`` (a workload whose speed was
    measured, on a new GPU) or ``leave one model out`` (a workload never measured)."""
    memory_method: str
    """How memory is estimated (the ``MemoryEstimate.method`` of the run)."""
    run: dict[str, str]
    """The run configuration and the question, as given and as filled in, in words."""
    store: str | None = None
    """The results store read (with ``--results``)."""


class ReportData(_Frozen):
    """``whichgpu report``: the answer, speed, memory, value, break-even, results, provenance."""

    title: str
    """The workload in words (a user's config path or model name as given; escape it)."""
    workload: str
    """Workload name."""
    run: RunConfig
    """Run configuration."""
    ranking: Ranking
    """The recommendation and its reasons (``api.recommend``)."""
    reference: str
    """Catalog id of the GPU every relative speed is divided by."""
    reference_name: str
    """Its name."""
    speeds: tuple[SpeedPoint, ...]
    """Throughput per GPU on one GPU, fastest first; measured where the store has the run."""
    throughput: tuple[ThroughputEstimate, ...]
    """The predictions behind ``speeds`` (``api.predict``), with their assumptions."""
    memory: tuple[MemoryEstimate, ...]
    """Memory per GPU (``api.fit``): largest batch, breakdown, capacity."""
    value: tuple[ValueTable, ...]
    """Performance per dollar: the GPU alone, 1/2/4/8-GPU machines, rented (those with
    prices)."""
    breakeven: Breakeven | None
    """Renting against owning the leading candidate (None: no purchase or cloud price)."""
    breakeven_gpu: str | None
    """Catalog id of the GPU of ``breakeven``."""
    breakeven_count: int
    """GPUs of that machine."""
    results: ResultPivot | None = None
    """Stored benchmark results as Lambda's tables (with ``--results``)."""
    results_count: int = 0
    """Stored results read."""
    notes: tuple[str, ...] = ()
    """What could not be shown, and why."""
    provenance: ReportProvenance
    """Catalog, prices, model error, run configuration, tool version."""
