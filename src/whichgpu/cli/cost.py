"""``whichgpu cost``: cloud vs own, performance per dollar, build checks, energy of a job."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from whichgpu import cost
from whichgpu.catalog import load_catalog
from whichgpu.cli.options import JsonOption, PricesOption
from whichgpu.cli.output import emit, emit_json
from whichgpu.errors import UsageError
from whichgpu.report import cost as render

cost_app = typer.Typer(
    help=(
        "What is it worth? `whichgpu cost breakeven` (rent or buy, and when buying pays off), "
        "`whichgpu cost value` (performance per dollar of GPUs and 1-8 GPU machines), "
        "`whichgpu cost build` (power supply, slots, cooling, PCIe and NVLink of an N-GPU "
        "build) and `whichgpu cost energy` (kWh, electricity cost and CO2 of a job). Formulas "
        "and sources: docs/cost.md.\n\n"
        "Examples:\n\n"
        "  whichgpu cost breakeven --gpu 4090 --count 2 --provider runpod\n\n"
        "  whichgpu cost value --count 4 --reference 3090\n\n"
        "  whichgpu cost build --gpu 3090 --count 4 --psu-watts 1600\n\n"
        "  whichgpu cost energy --gpu 4090 --hours 36 --region de"
    ),
    no_args_is_help=True,
    rich_markup_mode="markdown",
)

_MACHINE = "The machine"
_CLOUD = "The cloud"

GpuOption = Annotated[
    Optional[str],  # noqa: UP045 - typer needs Optional at runtime on Python 3.10
    typer.Option(
        "--gpu",
        "-g",
        help="The GPU of the machine (name, alias or id): prices it, gives its power and, with "
        "--provider or by default, the cloud rate.",
        rich_help_panel=_MACHINE,
    ),
]
CountOption = Annotated[
    int,
    typer.Option(
        "--count", "-n", help="GPUs in the machine (1-8).", min=1, rich_help_panel=_MACHINE
    ),
]
CpuWattsOption = Annotated[
    Optional[float],  # noqa: UP045
    typer.Option(
        "--cpu-watts",
        help="Power of the CPU and the rest of the machine while it works, W (default: the "
        "build class's, 100 W for a desktop as in the guide).",
        rich_help_panel=_MACHINE,
    ),
]
BuildClassOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--build-class",
        help="desktop (1-2 GPUs), workstation (3-4) or server (5-8); default: the smallest "
        "that holds --count.",
        rich_help_panel=_MACHINE,
    ),
]
PriceKindOption = Annotated[
    str,
    typer.Option(
        "--price-kind",
        help="Which price: buy (the lower of the newest new and used, else launch), new, "
        "used, launch, cloud (cheapest on-demand rate), cloud-spot.",
    ),
]
RegionOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--region",
        help="Where the electricity comes from, for its price and carbon intensity (us, eu, "
        "de, fr, world, …; default us).",
    ),
]


def _count(value: int) -> int:
    if value < 1:
        raise UsageError(f"--count must be at least 1, not {value}.")
    return value


@cost_app.command("breakeven")
def breakeven(
    gpu: GpuOption = None,
    count: CountOption = 1,
    system_cost: Annotated[
        Optional[float],  # noqa: UP045
        typer.Option(
            "--system-cost",
            help="What the machine costs, USD (default: --count x the GPU's price + the build "
            "class's base system).",
            rich_help_panel=_MACHINE,
        ),
    ] = None,
    gpu_watts: Annotated[
        Optional[float],  # noqa: UP045
        typer.Option(
            "--gpu-watts",
            help="Power of all its GPUs while working, W (default: --count x board power).",
            rich_help_panel=_MACHINE,
        ),
    ] = None,
    cpu_watts: CpuWattsOption = None,
    utilization: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            "--utilization",
            "-u",
            help="Share of the year the GPUs work: 0.15, 15%, or phd-desktop (15 %), "
            "phd-cluster (35 %), company-cluster (60 %). Default 0.15.",
        ),
    ] = None,
    electricity: Annotated[
        Optional[float],  # noqa: UP045
        typer.Option(
            "--electricity",
            help="Electricity price, USD per kWh (default: the region's).",
        ),
    ] = None,
    cloud_rate: Annotated[
        Optional[float],  # noqa: UP045
        typer.Option(
            "--cloud-rate",
            help="Rent of the equivalent cloud capacity, USD per hour (default: the catalog's "
            "rate for the GPU x --count).",
            rich_help_panel=_CLOUD,
        ),
    ] = None,
    provider: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            "--provider",
            help="Take the cloud rate of this provider (aws, gcp, azure, lambda, runpod, …).",
            rich_help_panel=_CLOUD,
        ),
    ] = None,
    cloud_gpu: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            "--cloud-gpu",
            help="Rent this GPU instead of the machine's own (the guide compares an RTX 3090 "
            "desktop with a V100 instance).",
            rich_help_panel=_CLOUD,
        ),
    ] = None,
    spot: Annotated[
        bool, typer.Option("--spot", help="Use spot rates.", rich_help_panel=_CLOUD)
    ] = False,
    years: Annotated[
        Optional[float],  # noqa: UP045
        typer.Option("--years", help="Years of ownership for the totals (default 3)."),
    ] = None,
    resale: Annotated[
        Optional[float],  # noqa: UP045
        typer.Option(
            "--resale-usd",
            help="What the machine sells for after --years, USD (default: the GPUs' used "
            "price today, else the price paid, kept at --resale-per-year each year).",
        ),
    ] = None,
    resale_per_year: Annotated[
        Optional[float],  # noqa: UP045
        typer.Option(
            "--resale-per-year",
            help="Share of their value the GPUs keep each year, 0-1 (default: the resale "
            "curve of the GPU's segment, fitted to dated used prices; see docs/cost.md).",
        ),
    ] = None,
    region: RegionOption = None,
    price_kind: PriceKindOption = "buy",
    build_class: BuildClassOption = None,
    json: JsonOption = False,
    prices: PricesOption = None,
) -> None:
    """Rent or buy? Yearly costs, the day buying pays off, and the cost of N years.

    Energy per year = (GPU W + CPU W) / 1000 x 24 x 365 x utilisation; the break-even day is
    where the rent paid equals the purchase plus the electricity used. Every value you leave
    out comes from the catalog or the cost data, and the table says where from.

    The guide's example (Tim Dettmers, 2020): a $2,200 desktop with one RTX 3090 (350 W + 100 W
    CPU) at 15 % utilisation and $0.12/kWh against a $2.14/h V100 spot instance. It uses 591 kWh
    ($71) a year and breaks even after about 300 days (day 293):

      whichgpu cost breakeven --system-cost 2200 --gpu-watts 350 --cpu-watts 100 --utilization 0.15 --electricity 0.12 --cloud-rate 2.14

    From the catalog:

      whichgpu cost breakeven --gpu 4090 --count 2 --provider runpod

      whichgpu cost breakeven --gpu 3090 --cloud-gpu a10 --provider lambda --region de --json
    """  # noqa: E501 - the examples are one command line each, to copy
    catalog = load_catalog(prices)
    result = cost.breakeven(
        gpu=gpu,
        count=_count(count),
        system_cost_usd=system_cost,
        gpu_w=gpu_watts,
        cpu_w=cpu_watts,
        utilization=utilization,
        electricity_usd_per_kwh=electricity,
        cloud_usd_per_hour=cloud_rate,
        provider=provider,
        cloud_gpu=cloud_gpu,
        spot=spot,
        years=years,
        resale_usd=resale,
        resale_per_year=resale_per_year,
        region=region,
        price_kind=price_kind,
        build_class=build_class,
        catalog=catalog,
    )
    if json:
        emit_json(render.breakeven_doc(result))
        return
    emit(render.breakeven_view(result))


def _throughputs(pairs: list[str] | None) -> dict[str, float]:
    out: dict[str, float] = {}
    for pair in pairs or []:
        name, sep, number = pair.rpartition("=")
        if not sep or not name.strip():
            raise UsageError(f"--throughput: '{pair}' is not GPU=VALUE (e.g. 4090=3150).")
        try:
            out[name.strip()] = float(number)
        except ValueError:
            raise UsageError(f"--throughput: '{number}' in '{pair}' is not a number.") from None
    return out


@cost_app.command("value")
def value(
    gpus: Annotated[
        Optional[list[str]],  # noqa: UP045
        typer.Option(
            "--gpu",
            "-g",
            help="A GPU to rate (repeat for several); default: every GPU with a price of the kind.",
        ),
    ] = None,
    price_kind: PriceKindOption = "buy",
    reference: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            "--reference",
            "-r",
            help="The GPU whose value is 1.0 (default: the first --gpu, else the best).",
        ),
    ] = None,
    count: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(
            "--count",
            "-n",
            help="Rate machines of N GPUs instead of the GPU alone (the default), assuming N "
            "times the work. Bought: N x the GPU's price + the base system of the smallest "
            "build class that holds N (desktop 1-2, workstation 3-4, server 5-8; more than 8 "
            "needs --base-cost). Rented (--price-kind cloud): N x the cheapest rate offered for "
            "N GPUs in one machine.",
        ),
    ] = None,
    throughput: Annotated[
        Optional[list[str]],  # noqa: UP045
        typer.Option(
            "--throughput",
            "-t",
            help="Throughput of your workload on a GPU, GPU=VALUE (repeat; e.g. from `whichgpu "
            "predict`). Default: the AMP tensor TFLOPS as a proxy.",
            metavar="GPU=VALUE",
        ),
    ] = None,
    unit: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option("--unit", help="Unit of --throughput (tokens/s, images/s, …)."),
    ] = None,
    base_cost: Annotated[
        Optional[float],  # noqa: UP045
        typer.Option(
            "--base-cost",
            help="Price of the machine without GPUs, USD (default: the build class's).",
        ),
    ] = None,
    build_class: BuildClassOption = None,
    limit: Annotated[
        int, typer.Option("--limit", help="Rows in the table (0: all; --json has all).", min=0)
    ] = 25,
    json: JsonOption = False,
    prices: PricesOption = None,
) -> None:
    """Performance per dollar, relative to a reference GPU (the guides' charts, as numbers).

    Bought: throughput per $1,000 of the GPU alone, or of a whole machine of --count GPUs
    (count x GPU price + the build class's base system: board, CPU, RAM, PSU, storage). Rented
    (--price-kind cloud): USD per million units of work at the cheapest rate per GPU-hour.
    Without --throughput the catalog's dense AMP tensor TFLOPS stand in for speed, and the
    output says so.

    Examples:

      whichgpu cost value --gpu rtx-3080-10gb --gpu 3090 --gpu 4090 --gpu 5090 --price-kind launch

      whichgpu cost value --count 4 --reference 3090

      whichgpu cost value --price-kind cloud -t h100-sxm=3100 -t a100-sxm4-80gb=1500 --unit tokens/s --json
    """  # noqa: E501 - the examples are one command line each, to copy
    catalog = load_catalog(prices)
    given = _throughputs(throughput)
    result = cost.value(
        gpus or None,
        price_kind=price_kind,
        count=_count(count) if count is not None else None,
        reference=reference,
        throughput=given or None,
        throughput_unit=unit,
        build_class=build_class,
        base_system_usd=base_cost,
        catalog=catalog,
    )
    if json:
        emit_json(render.value_doc(result))
        return
    emit(render.value_view(result, limit or None))


@cost_app.command("build")
def build(
    gpu: Annotated[
        str, typer.Option("--gpu", "-g", help="The GPU (name, alias or id).", show_default=False)
    ],
    count: Annotated[
        int, typer.Option("--count", "-n", help="GPUs in the machine (1-8).", show_default=False)
    ],
    psu_watts: Annotated[
        Optional[float],  # noqa: UP045
        typer.Option(
            "--psu-watts",
            help="Your power supply, W (default: the build class's reference one, if known).",
        ),
    ] = None,
    cpu_watts: CpuWattsOption = None,
    build_class: BuildClassOption = None,
    json: JsonOption = False,
) -> None:
    """Can N of this GPU go in one machine? Power supply, slots, cooling, PCIe lanes, NVLink.

    Each check says ok, warn or fail and why. Power: N x board power + CPU + 100 W for the
    rest, plus 10 % headroom for spikes (the hardware guide's rule). Slots: the cards' width on
    the build class's board. Cooling: open-air cards need a free slot between them. PCIe: lanes
    per GPU on the class's platform. The guide's example, 4 x RTX 3090 (4 x 350 W = 1,400 W)
    on a 1,600 W supply, is marginal (it asks for more than 1,700 W), and 3-slot cards do not
    fit four to a board:

      whichgpu cost build --gpu 3090 --count 4 --psu-watts 1600

      whichgpu cost build --gpu rtx-a6000 --count 4 --json
    """
    report = cost.build_checks(
        gpu,
        _count(count),
        build_class=build_class,
        psu_w=psu_watts,
        cpu_w=cpu_watts,
        catalog=load_catalog(),
    )
    if json:
        emit_json(render.build_doc(report))
        return
    emit(render.build_view(report))


@cost_app.command("energy")
def energy(
    hours: Annotated[
        float, typer.Option("--hours", help="How long the job runs, h.", show_default=False)
    ],
    gpu: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option("--gpu", "-g", help="The GPU (its board power is used)."),
    ] = None,
    count: CountOption = 1,
    watts: Annotated[
        Optional[float],  # noqa: UP045
        typer.Option("--watts", help="Power of the whole machine while working, W."),
    ] = None,
    cpu_watts: CpuWattsOption = None,
    region: RegionOption = None,
    electricity: Annotated[
        Optional[float],  # noqa: UP045
        typer.Option("--electricity", help="Electricity price, USD per kWh."),
    ] = None,
    grid: Annotated[
        Optional[float],  # noqa: UP045
        typer.Option("--grid-gco2", help="Carbon intensity, g CO2 per kWh."),
    ] = None,
    json: JsonOption = False,
) -> None:
    """kWh, electricity cost and CO2 of a job: power x hours, at the region's price and grid.

    Power is --watts, or --count x the GPU's board power + the CPU and the rest. Examples:

      whichgpu cost energy --gpu 4090 --hours 36 --region de

      whichgpu cost energy --watts 450 --hours 100 --electricity 0.12 --grid-gco2 366 --json
    """
    if watts is None:
        if gpu is None:
            raise UsageError("Give the machine's power (--watts) or its GPU (--gpu).")
        watts = cost.machine_power_w(gpu, _count(count), cpu_w=cpu_watts)
    elif gpu is not None or cpu_watts is not None:
        raise UsageError(
            "Give the machine's power (--watts) or what it is built of (--gpu, --count, "
            "--cpu-watts), not both."
        )
    result = cost.job_energy(
        watts,
        hours,
        region=region,
        electricity_usd_per_kwh=electricity,
        grid_gco2_per_kwh=grid,
    )
    if json:
        emit_json(render.energy_doc(result))
        return
    emit(render.energy_view(result))
