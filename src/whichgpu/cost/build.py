"""Checks of a multi-GPU build: power supply, slot width, cooling, PCIe lanes and NVLink.

Each check is a ``BuildCheck`` with ``ok``, ``warn`` or ``fail`` and a sentence that says why
and what to do; nothing is silently assumed away. The machine around the GPUs is a build class
from the cost data (``desktop``, ``workstation``, ``server``), whose board layout, CPU power and
power supply the checks use, and the rules of thumb come from the same data:

- power: ``load_w = count x board power + cpu_w + rest_w``; the power supply should give
  ``load_w x (1 + margin)`` (the margin covers the short spikes above board power); below that
  it is marginal, below ``load_w`` it fails;
- slots: cards of ``slot_width`` placed on the board's x16 positions, each ending inside the
  case; the most that fit, spread as far apart as the positions allow;
- cooling: open-air cards need a free slot between them; blower cards do not; passive
  datacenter cards need a server's airflow;
- pcie: lanes per GPU = the platform's GPU lanes / count (at most the card's own);
- nvlink: whether the GPUs have a direct link besides PCIe.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from whichgpu.catalog.cost_data import pcie_lanes_per_gpu
from whichgpu.errors import UsageError
from whichgpu.schema import (
    BuildCheck,
    BuildClass,
    BuildReport,
    CheckStatus,
    Cooling,
    CostRules,
    FormFactor,
    GpuSpec,
    Interconnect,
    Vendor,
)

_SEVERITY: dict[CheckStatus, int] = {"ok": 0, "warn": 1, "fail": 2}


def worst(statuses: Sequence[CheckStatus]) -> CheckStatus:
    """The most severe of ``statuses`` (``ok`` for none)."""
    return max(statuses, key=lambda s: _SEVERITY[s], default="ok")


def placement(
    width_slots: int, positions: Sequence[int], expansion_slots: int, count: int
) -> tuple[int, ...] | None:
    """Slot positions for ``count`` cards, as far apart as possible, or None if they don't fit.

    A card at position ``p`` covers ``p .. p + width - 1``; cards must not overlap and must end
    within ``expansion_slots``. Among the placements that fit, the one with the largest
    smallest gap is chosen.
    """
    usable = [p for p in positions if p + width_slots <= expansion_slots]
    best: tuple[int, ...] | None = None
    best_gap = -1
    for combo in itertools.combinations(usable, count):
        gaps = [b - a - width_slots for a, b in itertools.pairwise(combo)]
        if any(g < 0 for g in gaps):
            continue
        smallest = min(gaps, default=expansion_slots)
        if smallest > best_gap:
            best, best_gap = combo, smallest
    return best


def most_that_fit(width_slots: int, positions: Sequence[int], expansion_slots: int) -> int:
    """How many cards of ``width_slots`` the positions take (left to right, which is optimal)."""
    fitted = 0
    free_from = 0
    for p in positions:
        if p >= free_from and p + width_slots <= expansion_slots:
            fitted += 1
            free_from = p + width_slots
    return fitted


def _note(rules: CostRules, field: str) -> str:
    prov = rules.provenance.get(field)
    return f" (rule: {prov.note})" if prov and prov.note else ""


def _is_card(spec: GpuSpec) -> bool:
    return spec.form_factor in (None, FormFactor.PCIE)


def _power(
    spec: GpuSpec,
    count: int,
    build: BuildClass,
    rules: CostRules,
    cpu_w: float,
    psu_w: float | None,
) -> tuple[BuildCheck, float | None, float | None]:
    if spec.tdp_w is None:
        check = BuildCheck(
            name="power",
            status="warn",
            reason=f"The catalog has no board power for {spec.name}; size the power supply from "
            "the vendor's figure.",
        )
        return check, None, None
    rest = rules.psu_rest_w
    load = count * spec.tdp_w + cpu_w + rest
    recommended = load * (1 + rules.psu_margin_fraction)
    parts = (
        f"{count} x {spec.tdp_w:,.0f} W GPUs + {cpu_w:,.0f} W CPU + {rest:,.0f} W board, RAM "
        f"and drives = {load:,.0f} W; with {rules.psu_margin_fraction:.0%} headroom for the "
        f"short spikes above board power: {recommended:,.0f} W"
    )
    big = ""
    if recommended > rules.largest_desktop_psu_w and not build.server_airflow:
        big = (
            f" That is more than the largest desktop power supply "
            f"({rules.largest_desktop_psu_w:,.0f} W): use two supplies or a server chassis."
        )
    status: CheckStatus
    if psu_w is None:
        status = "warn" if big else "ok"
        reason = f"Size the power supply at {recommended:,.0f} W or more ({parts}).{big}"
    elif psu_w >= recommended:
        status = "ok"
        reason = f"The {psu_w:,.0f} W power supply covers {parts}.{big}"
    elif psu_w >= load:
        status = "warn"
        reason = (
            f"The {psu_w:,.0f} W power supply is marginal: {parts}. Get {recommended:,.0f} W or "
            f"more, or cap the GPUs' power (nvidia-smi -pl).{big}"
        )
    else:
        status = "fail"
        reason = (
            f"The {psu_w:,.0f} W power supply is below the load: {parts}. Get {recommended:,.0f} "
            f"W or more.{big}"
        )
    reason += _note(rules, "psu_margin_fraction")
    return BuildCheck(name="power", status=status, reason=reason), load, recommended


def _slots(
    spec: GpuSpec, count: int, build: BuildClass
) -> tuple[BuildCheck, int | None, tuple[int, ...] | None]:
    if not _is_card(spec):
        kind = spec.form_factor.value.upper() if spec.form_factor else "module"
        if spec.is_module and build.server_airflow:
            return (
                BuildCheck(
                    name="slots",
                    status="ok",
                    reason=f"{spec.name} is an {kind} module: it sits on its vendor's baseboard "
                    "(HGX / OAM boards, usually of 4 or 8) in a server sold whole; no slots to "
                    "fit.",
                ),
                None,
                None,
            )
        return (
            BuildCheck(
                name="slots",
                status="fail",
                reason=f"{spec.name} is a {kind} module, not a PCIe card: it goes only on its "
                "vendor's baseboard (HGX / OAM servers sold as whole systems), not in a "
                f"{build.id}.",
            ),
            None,
            None,
        )
    if spec.slot_width is None:
        return (
            BuildCheck(
                name="slots",
                status="warn",
                reason=f"The catalog has no slot width for {spec.name} (board partners' cards "
                "differ); check that the cards fit the board.",
            ),
            None,
            None,
        )
    width = math.ceil(spec.slot_width)
    positions = build.gpu_slot_positions
    fit = most_that_fit(width, positions, build.expansion_slots)
    where = (
        f"the {build.id} board's x16 slots sit at {', '.join(str(p) for p in positions)} "
        f"(slot widths) in {build.expansion_slots} expansion slots"
    )
    if count > fit:
        reason = (
            f"Only {fit} of {count} {spec.slot_width:g}-slot cards fit: {where}. Use narrower "
            "(2-slot or water-cooled) variants, PCIe riser cables to move cards, or a board "
            "with wider slot spacing."
        )
        return BuildCheck(name="slots", status="fail", reason=reason), fit, None
    placed = placement(width, positions, build.expansion_slots, count)
    assert placed is not None
    reason = (
        f"{count} {spec.slot_width:g}-slot card(s) fit at positions "
        f"{', '.join(str(p) for p in placed)}: {where}."
    )
    return BuildCheck(name="slots", status="ok", reason=reason), fit, placed


def _cooling(
    spec: GpuSpec,
    count: int,
    build: BuildClass,
    rules: CostRules,
    placed: tuple[int, ...] | None,
) -> BuildCheck:
    cooling = spec.cooling
    if cooling in (Cooling.SYSTEM, Cooling.LIQUID):
        by = "its server" if cooling is Cooling.SYSTEM else "a liquid loop"
        return BuildCheck(name="cooling", status="ok", reason=f"{spec.name} is cooled by {by}.")
    if cooling is Cooling.PASSIVE:
        if build.server_airflow:
            return BuildCheck(
                name="cooling",
                status="ok",
                reason="Passive datacenter cards in a server chassis that pushes air through them.",
            )
        return BuildCheck(
            name="cooling",
            status="warn",
            reason=f"{spec.name} has no fan of its own: it needs a server's front-to-back "
            "airflow; in a desktop or workstation case add ducted fans or use a GPU server.",
        )
    if cooling is None:
        return BuildCheck(
            name="cooling",
            status="warn",
            reason=f"The catalog has no cooler design for {spec.name}; open-air cards need a "
            f"free slot between them, blower cards do not.{_note(rules, 'cooling_gap_slots')}",
        )
    if count == 1:
        return BuildCheck(name="cooling", status="ok", reason="One card: nothing blocks its fans.")
    if cooling is Cooling.BLOWER:
        return BuildCheck(
            name="cooling",
            status="ok",
            reason="Blower coolers push the hot air out of the back of the case; they work "
            "stacked without gaps.",
        )
    if spec.slot_width is None:
        return BuildCheck(
            name="cooling",
            status="warn",
            reason=f"Not judged: the catalog has no slot width for {spec.name}, so where the "
            f"cards sit is unknown. Leave {rules.cooling_gap_slots} free slot(s) between "
            f"open-air cards.{_note(rules, 'cooling_gap_slots')}",
        )
    if placed is None:
        return BuildCheck(
            name="cooling",
            status="warn",
            reason="Not judged: the cards do not fit as asked (see slots). With risers or "
            f"another board, leave {rules.cooling_gap_slots} free slot(s) between open-air "
            f"cards.{_note(rules, 'cooling_gap_slots')}",
        )
    width = math.ceil(spec.slot_width)
    gap = min(b - a - width for a, b in itertools.pairwise(placed))
    if gap >= rules.cooling_gap_slots:
        return BuildCheck(
            name="cooling",
            status="ok",
            reason=f"{count} open-air cards with at least {gap} free slot(s) between them.",
        )
    return BuildCheck(
        name="cooling",
        status="warn",
        reason=f"{count} open-air cards stacked with {gap} free slots between them: each draws in "
        "the hot air of the next and they throttle. Use blower-style or water-cooled cards, or "
        f"PCIe risers to spread them.{_note(rules, 'cooling_gap_slots')}",
    )


def _pcie(
    spec: GpuSpec, count: int, build: BuildClass, rules: CostRules
) -> tuple[BuildCheck, int | None]:
    if not _is_card(spec):
        return (
            BuildCheck(
                name="pcie",
                status="ok",
                reason="Not a PCIe card: its baseboard links the GPUs and the host.",
            ),
            None,
        )
    lanes = pcie_lanes_per_gpu(build, count, spec.pcie_lanes)
    gen = f"PCIe {spec.pcie_gen}.0 " if spec.pcie_gen else "PCIe "
    where = f"{build.gpu_lanes} GPU lanes of the {build.id} platform / {count}"
    status: CheckStatus
    if lanes >= rules.lanes_per_gpu_good:
        status = "ok"
        reason = f"Each GPU gets {gen}x{lanes} ({where})."
    elif lanes >= rules.lanes_per_gpu_min:
        status = "ok" if count <= 2 else "warn"
        reason = (
            f"Each GPU gets {gen}x{lanes} ({where}): fine for data loading; training on "
            f"{count} GPUs in parallel loses a few per cent.{_note(rules, 'lanes_per_gpu_min')}"
        )
    else:
        status = "warn"
        reason = (
            f"Each GPU gets only {gen}x{lanes} ({where}): slow for multi-GPU training. Use a "
            f"workstation or server platform.{_note(rules, 'lanes_per_gpu_min')}"
        )
    return BuildCheck(name="pcie", status=status, reason=reason), lanes


def _nvlink(spec: GpuSpec, count: int) -> BuildCheck:
    if count == 1:
        return BuildCheck(name="nvlink", status="ok", reason="One GPU: no GPU-to-GPU link needed.")
    link = spec.interconnect
    if link is Interconnect.NVLINK:
        gen = f" {spec.interconnect_gen}" if spec.interconnect_gen else ""
        if spec.is_module:
            return BuildCheck(
                name="nvlink",
                status="ok",
                reason=f"NVLink{gen} on the baseboard links the modules (through NVSwitch on "
                "8-GPU boards): the fast path that data- and tensor-parallel training use.",
            )
        if count == 2:
            joined = f"An NVLink{gen} bridge joins the two cards (bought separately)"
        else:
            joined = (
                f"NVLink{gen} bridges join PCIe cards in pairs only: the {count} GPUs "
                "exchange gradients over PCIe, as whichgpu predict times them"
            )
        return BuildCheck(
            name="nvlink",
            status="ok",
            reason=f"{joined}; the 2020 guide finds NVLink of little use outside large GPU "
            "clusters.",
        )
    if link is None or link is Interconnect.NONE:
        return BuildCheck(
            name="nvlink",
            status="ok",
            reason="No NVLink: the GPUs exchange gradients over PCIe, enough for data-parallel "
            "training of most models (GeForce cards may not allow direct peer-to-peer copies).",
        )
    return BuildCheck(
        name="nvlink",
        status="ok",
        reason=f"GPU-to-GPU link: {link.value}.",
    )


def check_build(
    spec: GpuSpec,
    count: int,
    build: BuildClass,
    rules: CostRules,
    *,
    psu_w: float | None = None,
    cpu_w: float | None = None,
) -> BuildReport:
    """Check ``count`` of ``spec`` in a machine of class ``build``.

    ``psu_w`` is the power supply to check (default: the class's reference build, if known);
    ``cpu_w`` the CPU power to count (default: the class's).
    """
    if count < 1:
        raise UsageError(f"--count must be at least 1, not {count}.")
    if spec.vendor is Vendor.GOOGLE:
        raise UsageError(
            f"{spec.name} is sold by no one: Google rents it in its cloud only, so there is no "
            "machine to build. whichgpu cost value and recommend --rent price it by the hour."
        )
    if spec.form_factor is FormFactor.SOC:
        raise UsageError(
            f"{spec.name} is a system on a chip: it comes as a whole computer, with no slots, "
            "power supply or PCIe to check. whichgpu cost breakeven prices owning it."
        )
    if count > build.gpus:
        raise UsageError(f"A {build.id} holds at most {build.gpus} GPUs, not {count}.")
    for name, value in (("--psu-watts", psu_w), ("--cpu-watts", cpu_w)):
        if value is not None and (not math.isfinite(value) or value <= 0):
            raise UsageError(f"{name} must be a number of watts above 0, not {value:g}.")
    cpu = build.cpu_w if cpu_w is None else cpu_w
    psu = build.psu_w if psu_w is None else psu_w
    power, load, recommended = _power(spec, count, build, rules, cpu, psu)
    slots, fit, placed = _slots(spec, count, build)
    cooling = _cooling(spec, count, build, rules, placed)
    pcie, lanes = _pcie(spec, count, build, rules)
    nvlink = _nvlink(spec, count)
    checks = (power, slots, cooling, pcie, nvlink)
    assumptions = [
        f"The machine is a {build.label}: its layout, CPU power and power supply are the build "
        "class's (see `whichgpu cost build --help` and the cost data's sources).",
        "Board power (TDP) is what a GPU draws at full load on average; short spikes go above "
        "it, which the power-supply headroom covers.",
    ]
    if psu_w is None and build.psu_w is not None:
        assumptions.append(
            f"The power supply is the class's reference one ({build.psu_w:,.0f} W); give "
            "--psu-watts for yours."
        )
    return BuildReport(
        gpu=spec.id,
        gpu_name=spec.name,
        count=count,
        build_class=build.id,
        build_label=build.label,
        gpu_tdp_w=spec.tdp_w,
        cpu_w=cpu,
        rest_w=rules.psu_rest_w,
        load_w=load,
        recommended_psu_w=recommended,
        psu_w=psu,
        slot_width=spec.slot_width if _is_card(spec) else None,
        gpus_that_fit=fit,
        lanes_per_gpu=lanes,
        checks=checks,
        status=worst([c.status for c in checks]),
        assumptions=tuple(assumptions),
    )
