"""What a valid, plausible stored result is, shared by the store and its files: the result
schema version a record may have (``NewerSchemaError``), the limits a stored number must keep
(``COUNT_LIMIT``, ``BYTES_LIMIT``, ``CLOCK_SKEW``) and the checks of them (``_out_of_range``,
``_implausible``), how a validation's first problem is put in words, UTC time as sortable text,
and the frozen base of the store's record types.
"""

from __future__ import annotations

import builtins
import datetime as dt
import math
from collections.abc import Callable

from pydantic import BaseModel, ConfigDict, ValidationError

from whichgpu.errors import StoreError
from whichgpu.schema import SCHEMA_VERSION, BenchResult

COUNT_LIMIT = 2**31 - 1
"""Largest count (batch, length, steps, devices) a stored result may hold."""
BYTES_LIMIT = 2**63 - 1
"""Largest byte count a stored result may hold: SQLite's largest integer."""
CLOCK_SKEW = dt.timedelta(days=1)
"""How far in the future an imported result's ``created_at`` may lie (clocks disagree)."""

_NEWER = "Upgrade whichgpu (pip install --upgrade whichgpu) to read it"


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def _utc_text(moment: dt.datetime) -> str:
    """A time as sortable UTC text (a time without a zone is taken as UTC, as results are)."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.timezone.utc)
    return moment.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class NewerSchemaError(StoreError):
    """A result written under a newer ``SCHEMA_VERSION`` than this whichgpu reads."""

    def __init__(self, where: str, version: int) -> None:
        self.reason = (
            f"{where} was written by a newer whichgpu (result schema version {version}; this "
            f"whichgpu reads up to {SCHEMA_VERSION})"
        )
        super().__init__(f"{self.reason}. {_NEWER}.")


def _check_schema_version(version: object, where: str) -> None:
    """Refuse a result written under a newer (or a nonsensical) ``SCHEMA_VERSION``."""
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise StoreError(f"{where}: schema_version must be a whole number >= 1, not {version!r}")
    if version > SCHEMA_VERSION:
        raise NewerSchemaError(where, version)


def _first_problem(exc: ValidationError, rename: Callable[[str], str] = str) -> str:
    """``field 'a.b': message`` for the first error of a validation (and how many more)."""
    errors = exc.errors()
    first = errors[0]
    loc = [str(part) for part in first["loc"]]
    field = ".".join([rename(loc[0]), *loc[1:]]) if loc else ""
    text = f"field '{field}': {first['msg']}" if field else str(first["msg"])
    if len(errors) > 1:
        text += f" (and {len(errors) - 1} more)"
    return text


def _implausible(result: BenchResult, now: dt.datetime) -> builtins.list[tuple[str, str]]:
    """(field, why) for each value of ``result`` no measurement can have, though its type
    allows it: an empty workload or precision, an MFU or utilisation outside 0-1, a time in
    the future (beyond ``CLOCK_SKEW``), a count or byte count SQLite cannot hold, or a number
    that is not finite."""
    found: builtins.list[tuple[str, str]] = [
        (field, "is empty; a result names what it measured")
        for field in ("workload", "precision")
        if not getattr(result, field).strip()
    ]
    if result.mfu is not None and not 0 <= result.mfu <= 1:
        found.append(
            (
                "mfu",
                f"is {result.mfu:g} ({result.mfu:.0%}), not a fraction from 0 to 1: no run does "
                "more than its GPU's peak FLOPs",
            )
        )
    if result.utilization is not None and not 0 <= result.utilization <= 1:
        found.append(
            ("utilization", f"is {result.utilization:g}, not a fraction of the time from 0 to 1")
        )
    created = result.created_at
    if created.tzinfo is None:
        created = created.replace(tzinfo=dt.timezone.utc)
    if created > now + CLOCK_SKEW:
        found.append(
            (
                "created_at",
                f"is {_utc_text(created)[:19]}Z, in the future: a result is made when it is "
                "measured (is the clock of the machine that measured it right?)",
            )
        )
    found.extend(_out_of_range(result.model_dump()))
    return found


def _out_of_range(doc: object, field: str = "") -> builtins.list[tuple[str, str]]:
    """(field, why) for each whole number in ``doc`` (a result as ``model_dump`` gives it)
    beyond ``COUNT_LIMIT`` (``BYTES_LIMIT`` for byte counts, fields named ``*_bytes``), and each
    number that is not finite; ``field`` is the dotted path to ``doc``."""
    if isinstance(doc, dict):
        return [
            problem
            for key, value in doc.items()
            for problem in _out_of_range(value, f"{field}.{key}" if field else str(key))
        ]
    if isinstance(doc, (builtins.list, tuple)):
        return [p for i, v in enumerate(doc) for p in _out_of_range(v, f"{field}.{i}")]
    if isinstance(doc, bool):
        return []
    if isinstance(doc, int):
        limit = BYTES_LIMIT if field.endswith("_bytes") else COUNT_LIMIT
        if abs(doc) > limit:
            return [(field, f"is {doc}, beyond the largest number a result may hold ({limit:,})")]
    if isinstance(doc, float) and not math.isfinite(doc):
        return [(field, f"is {doc}, not a finite number")]
    return []
