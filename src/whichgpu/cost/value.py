"""Performance per dollar: of a GPU alone, of whole 1-8 GPU machines, and of rented GPUs.

::

    bought:  total_usd            = count x gpu_price_usd + base_system_usd (machines only)
             throughput_per_kusd  = count x throughput_per_gpu / (total_usd / 1000)
    rented:  usd_per_hour          = count x gpu_usd_per_hour
             units_per_usd         = count x throughput_per_gpu x 3600 / usd_per_hour
             usd_per_million_units = 1e6 / units_per_usd
    relative = (throughput_per_kusd or units_per_usd) / the reference row's

The throughput comes from the caller (``recommend`` passes predicted or measured throughput per
GPU, in the workload's unit). Without it the catalog's dense AMP tensor rate (FP16/BF16 with
FP32 accumulate, in TFLOPS) stands in as a proxy, and the table says so. A machine's throughput
is the GPU count times one GPU's (linear scaling: real multi-GPU training scales a little
worse). The base system is the build class's (``whichgpu.catalog.cost_data``), as the guides
add a barebone system cost to every 1/2/4/8-GPU build.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from whichgpu.catalog.query import Catalog
from whichgpu.cost.inputs import positive
from whichgpu.cost.pricing import CLOUD_CHOICES, PriceChoice, price_note, purchase_price
from whichgpu.errors import UsageError
from whichgpu.schema import BuildClass, FormFactor, GpuSpec, Price, ValueRow, ValueTable
from whichgpu.units import MILLION, SECONDS_PER_HOUR, USD_PER_KUSD

PROXY_UNIT = "AMP TFLOPS"
"""Unit of the proxy throughput (the dense FP16/BF16 tensor rate, FP32 accumulate)."""
GIVEN_UNIT = "units/s"
"""Unit of a given throughput when the caller names none."""


def _price(catalog: Catalog, spec: GpuSpec, kind: PriceChoice, count: int | None) -> Price | None:
    if kind in CLOUD_CHOICES:
        # with a count, only rates for that many GPUs in one machine
        return catalog.cheapest_cloud_price(spec.id, spot=kind == "cloud-spot", gpus=count)
    return purchase_price(catalog, spec.id, kind)


def _row(
    spec: GpuSpec,
    price: Price,
    kind: PriceChoice,
    per_gpu: float,
    unit: str,
    source: str,
    count: int | None,
    base_system_usd: float | None,
) -> ValueRow:
    n = count or 1
    throughput = n * per_gpu
    total = per_kusd = per_hour = units_per_usd = per_million = None
    if kind in CLOUD_CHOICES:
        per_hour = n * price.usd
        units_per_usd = throughput * SECONDS_PER_HOUR / per_hour
        per_million = MILLION / units_per_usd
    else:
        total = n * price.usd + (base_system_usd or 0.0)
        per_kusd = throughput / (total / USD_PER_KUSD)
    return ValueRow(
        gpu=spec.id,
        gpu_name=spec.name,
        count=n,
        price_kind=kind,
        gpu_price_usd=price.usd,
        price_note=price_note(price),
        base_system_usd=base_system_usd,
        total_usd=total,
        usd_per_hour=per_hour,
        throughput=throughput,
        throughput_per_gpu=per_gpu,
        throughput_unit=unit,
        throughput_source="given" if source == "given" else "proxy",
        throughput_per_kusd=per_kusd,
        units_per_usd=units_per_usd,
        usd_per_million_units=per_million,
        relative=1.0,
    )


def _metric(row: ValueRow) -> float:
    value = row.throughput_per_kusd if row.throughput_per_kusd is not None else row.units_per_usd
    assert value is not None
    return value


def value_table(
    catalog: Catalog,
    gpus: Sequence[GpuSpec] | None = None,
    *,
    price_kind: PriceChoice = "buy",
    count: int | None = None,
    reference: GpuSpec | None = None,
    throughput: Mapping[str, float] | None = None,
    throughput_unit: str | None = None,
    build: BuildClass | None = None,
    base_system_usd: float | None = None,
) -> ValueTable:
    """Performance per dollar of ``gpus`` (default: every GPU that can be priced), normalised.

    ``throughput`` maps catalog ids to throughput per GPU (then only those GPUs are rated);
    ``count`` rates whole machines with the base cost of ``build`` (or ``base_system_usd``);
    ``reference`` is the row every ``relative`` is divided by (default: the first GPU given,
    else the best row).
    """
    given = {
        k: positive(f"The throughput of {k} (--throughput)", v)
        for k, v in (throughput or {}).items()
    }
    machine = count is not None and price_kind not in CLOUD_CHOICES
    if count is not None and count < 1:
        raise UsageError(f"--count must be at least 1, not {count}.")
    base = base_system_usd
    if machine and base is None:
        if build is None or build.base_system_usd is None:
            raise UsageError(
                "A machine needs a base-system price: give --base-cost, or a build class with "
                "a sourced one."
            )
        base = build.base_system_usd
    if base is not None:
        positive("The base-system price (--base-cost)", base)

    if gpus:
        candidates = list({spec.id: spec for spec in gpus}.values())
    elif given:
        candidates = [catalog.get(gpu_id) for gpu_id in given]
    else:
        candidates = list(catalog.all())
    if reference is not None and reference.id not in {spec.id for spec in candidates}:
        candidates.append(reference)

    rows: list[ValueRow] = []
    skipped: list[str] = []
    unit = (throughput_unit or GIVEN_UNIT) if given else PROXY_UNIT
    for spec in candidates:
        if given:
            per_gpu = given.get(spec.id)
            source = "given"
            if per_gpu is None:
                skipped.append(f"{spec.id}: no throughput given")
                continue
        else:
            per_gpu = spec.amp_tensor_tflops
            source = "proxy"
            if per_gpu is None:
                skipped.append(f"{spec.id}: no AMP tensor rate in the catalog")
                continue
        if machine and spec.form_factor is not None and spec.form_factor is not FormFactor.PCIE:
            skipped.append(
                f"{spec.id}: a {spec.form_factor.value} module, sold in vendor servers, not "
                "built into a machine"
            )
            continue
        price = _price(catalog, spec, price_kind, count)
        if price is None:
            sized = ""
            if count is not None and price_kind in CLOUD_CHOICES:
                sized = f" for {count} GPUs in one machine"
            skipped.append(f"{spec.id}: no {price_kind} price{sized}")
            continue
        rows.append(
            _row(spec, price, price_kind, per_gpu, unit, source, count, base if machine else None)
        )

    if not rows:
        raise UsageError(
            f"No GPU could be rated at price kind '{price_kind}': " + "; ".join(skipped[:5])
        )
    if reference is not None:
        ref_row = next((r for r in rows if r.gpu == reference.id), None)
        if ref_row is None:
            why = next((s for s in skipped if s.startswith(f"{reference.id}:")), reference.id)
            raise UsageError(f"--reference cannot be rated: {why}.")
    else:
        ref_row = next((r for r in rows if gpus and r.gpu == gpus[0].id), None)
        ref_row = ref_row or max(rows, key=_metric)
    ref_value = _metric(ref_row)
    rated = sorted(
        (r.model_copy(update={"relative": _metric(r) / ref_value}) for r in rows),
        key=lambda r: -r.relative,
    )
    assumptions = []
    if not given:
        assumptions.append(
            "Throughput is a proxy: the dense AMP tensor rate (FP16/BF16, FP32 accumulate) from "
            "the catalog. It ignores memory bandwidth, memory size and software; pass the "
            "throughput of your model (--throughput GPU=VALUE, or `whichgpu predict`)."
        )
    if count is not None and count > 1:
        assumptions.append(
            f"A machine of {count} GPUs is taken to do {count} times the work of one (linear "
            "scaling); real data-parallel training scales somewhat worse."
        )
    if machine:
        label = build.id if build is not None else "given"
        assumptions.append(
            f"Each machine adds the base system (board, CPU, RAM, PSU, storage, case) of the "
            f"{label} class: ${base:,.0f}."
        )
    if price_kind in CLOUD_CHOICES:
        assumptions.append(
            "Cloud rates are per GPU-hour, the cheapest provider's in the catalog; the unit of "
            "usd_per_million_units is the throughput's unit (a million TFLOP for the proxy)."
        )
    else:
        assumptions.append(
            "Purchase prices are the catalog's newest of the kind (buy: the lower of new and "
            "used, else launch); electricity and resale are not counted (see `whichgpu cost "
            "breakeven`)."
        )
    return ValueTable(
        price_kind=price_kind,
        count=count,
        build_class=(build.id if build is not None else None) if machine else None,
        base_system_usd=base if machine else None,
        reference=ref_row.gpu,
        rows=tuple(rated),
        skipped=tuple(skipped),
        assumptions=tuple(assumptions),
    )
