"""The exceptions whichgpu raises, one class per thing a user can do something about.

::

    WhichGpuError                 base; every message says what was wrong and what to do
     ├── CatalogError             a catalog data file is invalid (names file, record, field)
     │    └── PriceFileError      a user price file is invalid (names file, line, field)
     ├── GpuLookupError           a GPU name did not resolve to one catalog record
     │    ├── UnknownGpu          no record matches; carries close suggestions
     │    └── AmbiguousGpu        several records match; carries the candidates
     ├── WorkloadError            a workload cannot be found or run as asked
     │    ├── UnknownWorkload     no registered workload has that name; carries suggestions
     │    └── UnsupportedWorkload the run configuration cannot work for it (says why; also a
     │                            NamesOptions)
     ├── NamesOptions             about options given: ``field`` is the option, the message names
     │    │                       it by the API's keyword (the CLI writes its flag instead)
     │    └── UsageError          arguments that cannot work together
     │         ├── MissingRates   the catalog lacks a figure a speed needs (names the fields)
     │         └── NotSplittable  the model does not split over that many GPUs as asked
     ├── BenchError               a benchmark could not measure (says what failed and why)
     │    └── BenchTimeout        a probe or run outlived its time limit
     └── StoreError               the results store cannot be read or written (names the file)

The CLI turns a ``WhichGpuError`` into a one-paragraph message on stderr and exit code 1 (2 for
``UsageError`` and lookup errors, which are bad input), never a traceback; it writes the options
a ``NamesOptions`` names (``option``) as its flags.
``require_positive`` is the one check of a number option that many questions share.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable


class WhichGpuError(Exception):
    """Base class: a failure with a message written for the user."""


class CatalogError(WhichGpuError):
    """A catalog data file failed validation."""


class PriceFileError(CatalogError):
    """A user-supplied price file failed validation."""

    def __init__(self, path: str, line: int | None, field: str | None, problem: str) -> None:
        self.path = path
        self.line = line
        self.field = field
        self.problem = problem
        where = path if line is None else f"{path}, line {line}"
        if field is not None:
            where += f", field '{field}'"
        super().__init__(
            f"{where}: {problem}. Fix the file (format: see `whichgpu show --help` or "
            "docs/prices.md) or leave it out (drop --prices, or unset $WHICHGPU_PRICES)."
        )


def unknown_name_message(what: str, query: str, suggestions: list[str], listing: str) -> str:
    """``Unknown <what> '<query>'. Did you mean: …? <listing>`` (the shared wording)."""
    msg = f"Unknown {what} '{query}'."
    if suggestions:
        msg += " Did you mean: " + ", ".join(suggestions) + "?"
    return f"{msg} {listing}"


class GpuLookupError(WhichGpuError):
    """A GPU name did not resolve to exactly one catalog record."""


class UnknownGpu(GpuLookupError):
    """No catalog record matches the name."""

    def __init__(self, query: str, suggestions: list[str]) -> None:
        self.query = query
        self.suggestions = suggestions
        super().__init__(
            unknown_name_message(
                "GPU", query, suggestions, "Run `whichgpu gpus` to list the catalog."
            )
        )


class AmbiguousGpu(GpuLookupError):
    """Several catalog records match the name."""

    def __init__(self, query: str, candidates: list[tuple[str, str]]) -> None:
        self.query = query
        self.candidates = candidates
        listed = "; ".join(f"{gpu_id} ({name})" for gpu_id, name in candidates)
        super().__init__(
            f"'{query}' matches {len(candidates)} GPUs: {listed}. Name one of them by its id."
        )


def option(field: str) -> str:
    """Where an error's message names the option ``field`` (a keyword of the Python API,
    ``batch_size``): a marker that ``UsageError`` writes as the keyword, and a front end as
    its own name for it (the CLI: ``--batch-size``; see ``UsageError.message_as``)."""
    return "{{" + field + "}}"


_OPTION = re.compile(r"\{\{([a-z][a-z0-9_]*)\}\}")


class NamesOptions(WhichGpuError):
    """An error about options the caller gave (``UsageError``, ``UnsupportedWorkload``).

    A message written with ``option("batch_size")`` names that option: ``str()`` gives the
    Python API's keyword (``batch_size must be at least 1``), ``message_as(name)`` another
    front end's name (the CLI passes ``--batch-size``). ``fields`` are the options named, in
    order; ``field`` is the first (the one the error is about), None when it names none.
    """

    def __init__(self, message: str = "", *args: object) -> None:
        self.template = message
        self.fields: tuple[str, ...] = tuple(dict.fromkeys(_OPTION.findall(message)))
        self.field: str | None = self.fields[0] if self.fields else None
        super().__init__(self.message_as(lambda field: field), *args)

    def message_as(self, name: Callable[[str], str]) -> str:
        """The message with each option named by ``name(field)``."""
        return _OPTION.sub(lambda m: name(m.group(1)), self.template)


class UsageError(NamesOptions):
    """Arguments that cannot work together (``field``: the option the error is about)."""


class MissingRates(UsageError):
    """The catalog lacks a figure a speed prediction needs for a GPU (an SM count, an FP32
    rate, a PCIe generation); ``missing`` names the fields."""

    def __init__(self, message: str, missing: tuple[str, ...]) -> None:
        super().__init__(message)
        self.missing = missing


class NotSplittable(UsageError):
    """The model cannot run on that many GPUs the way the question asks (a language model
    whose attention heads do not split over them; a model that does not generate, served
    "tensor parallel"). A question over several machine sizes leaves such a size out."""


class WorkloadError(WhichGpuError):
    """A workload cannot be found or run as asked."""


class UnknownWorkload(WorkloadError):
    """No registered workload has that name."""

    def __init__(self, query: str, suggestions: list[str]) -> None:
        self.query = query
        self.suggestions = suggestions
        super().__init__(
            unknown_name_message(
                "workload",
                query,
                suggestions,
                "Run `whichgpu workloads` to list them; for your own model give its "
                "config.json (--config) or FILE.py:FUNCTION (--model).",
            )
        )


class UnsupportedWorkload(WorkloadError, NamesOptions):
    """The run configuration cannot work for this workload; the message says why (and names
    the option, ``field``, as ``UsageError`` does)."""


class BenchError(WhichGpuError):
    """A benchmark could not measure what was asked; the message says what failed and why."""


class CudaForkPoisoned(BenchError):
    """A bench child found CUDA unusable because the process it was forked from had
    initialised it (the bench then spawns its children instead)."""


class BenchTimeout(BenchError):
    """A benchmark probe or run did not finish within its time limit."""


class StoreError(WhichGpuError):
    """The results store cannot be read or written; the message names the file."""


def require_positive(field: str, value: float | None, unit: str = "") -> None:
    """``UsageError`` unless ``value`` (when given) is a finite number above 0; the message
    names the option ``field`` (the API's keyword, ``budget_usd``; see ``option``) and its
    ``unit``."""
    if value is not None and not (math.isfinite(value) and value > 0):
        raise UsageError(
            f"{option(field)} must be a finite number above 0{f' ({unit})' if unit else ''}, "
            f"not {value}."
        )
