"""The Python API: the questions whichgpu answers, as functions returning typed results.

    >>> import whichgpu.api as wg
    >>> estimates = wg.fit("llama-3.2-1b", gpus=["rtx-4090", "a100-sxm4-80gb"], seq_len=2048)
    >>> [(e.gpu, e.max_batch_size) for e in estimates]

Each function takes the same run options as the CLI (``mode``, ``precision``, ``batch_size``,
``seq_len``, ``optimizer``, ``checkpointing``, ``method`` …) as keyword arguments and raises
``whichgpu.errors.WhichGpuError`` subclasses on bad input. Named workloads are answered from
their stored profiles without torch; other workloads and run configurations are traced, which
needs the ``torch`` extra.

One module per question: ``catalog`` (``gpus``, ``gpu``, ``compare``), ``step`` (the step
every sizing question prepares, and ``scalable_profile``), ``profile``, ``fit``, ``predict``,
``bench``, ``recommend`` and ``report``. This package is the façade: the functions are its
attributes (``whichgpu.api.fit`` is the function; its module is
``sys.modules["whichgpu.api.fit"]``).

Each keyword function turns its keywords into a typed request once (``requests``:
``FitRequest``, ``PredictRequest``, ``RecommendRequest``, ``ReportRequest``,
``ProfileRequest``, ``BenchRequest``, ``EngineBenchRequest``, each naming a ``Target`` and its
run) and hands it to the function that answers it (``answer_fit``, ``answer_predict``, …
``answer_bench``, ``answer_bench_engine``), which the CLI calls with the request it builds from
its flags.
"""

from __future__ import annotations

from whichgpu.api import step as _step
from whichgpu.api.bench import _batch_guesser as _batch_guesser
from whichgpu.api.bench import _bench_on_catalog as _bench_on_catalog
from whichgpu.api.bench import _seq_len_guesser as _seq_len_guesser
from whichgpu.api.bench import answer_bench, answer_bench_engine, bench, bench_engine
from whichgpu.api.catalog import compare, gpu, gpus, resolve_gpus
from whichgpu.api.fit import answer_fit, fit
from whichgpu.api.predict import answer_predict, predict
from whichgpu.api.profile import answer_profile, profile
from whichgpu.api.recommend import answer_recommend, recommend
from whichgpu.api.report import answer_report, report
from whichgpu.api.requests import (
    BenchRequest,
    EngineBenchRequest,
    FitRequest,
    PredictRequest,
    ProfileRequest,
    RecommendRequest,
    ReportRequest,
    RunOptions,
    Target,
)
from whichgpu.api.step import scalable_profile

# ``load_catalog`` and ``read_config`` are kept importable here for the callers that reach
# them through the API (tests), as are the private steps below: ``_select``, ``_prepare`` and
# ``_predictor`` (``validate.timing``) and the bench's guessers and catalog step (tests).
from whichgpu.catalog import load_catalog as load_catalog
from whichgpu.workloads.hf import read_config as read_config

__all__ = [
    "BenchRequest",
    "EngineBenchRequest",
    "FitRequest",
    "PredictRequest",
    "ProfileRequest",
    "RecommendRequest",
    "ReportRequest",
    "RunOptions",
    "Target",
    "answer_bench",
    "answer_bench_engine",
    "answer_fit",
    "answer_predict",
    "answer_profile",
    "answer_recommend",
    "answer_report",
    "bench",
    "bench_engine",
    "compare",
    "fit",
    "gpu",
    "gpus",
    "predict",
    "profile",
    "recommend",
    "report",
    "resolve_gpus",
    "scalable_profile",
]

_select = _step.select
_prepare = _step.prepare
_predictor = _step.predictor
