"""The base system: the machine around the GPUs, priced for what the GPUs need.

Where the component data (``data/v1/components``) prices a build class's platform for the GPU
count by parts, the base system is those parts plus the smallest power supply of the component
ladder that covers the machine's recommended wattage (the build rules' ``count x board power +
CPU + rest``, plus the margin: ``whichgpu.cost.build``). A 350 W card thus gets a bigger, dearer
supply than a 250 W one. Every other class and count keeps its whole-build figure
(``base_system_usd`` of ``cost/builds.yaml``, power supply included), as does a GPU without a
board power in the catalog or one that needs more than the ladder's largest supply. The parts
are priced new; used components are not priced.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from whichgpu.catalog.components import ComponentPrices, PricedPart, shipped_component_prices
from whichgpu.schema import BuildClass, CostRules, GpuSpec


@dataclass(frozen=True)
class BaseSystemCost:
    """The machine around ``count`` GPUs, priced: by parts, or the build class's figure."""

    build_class: str
    """The build class (``desktop``, ``workstation``, ``server``)."""
    usd: float
    """The base system's price, USD."""
    by_parts: bool
    """Whether it is priced by parts (else the class's whole-build figure)."""
    parts: tuple[PricedPart, ...] = ()
    """The parts, power supply last (by parts only)."""
    needed_psu_w: float | None = None
    """The wattage the power supply is sized for: load x (1 + margin) (by parts only)."""
    source: str = ""
    """The source key of the class's figure (whole-build figure only)."""
    why_not_parts: str = ""
    """Why a class with a parts platform was priced whole (empty otherwise)."""

    @property
    def oldest_as_of(self) -> dt.date | None:
        """The date of its oldest part price (None: priced whole)."""
        return min((p.as_of for p in self.parts), default=None)

    def describe(self) -> str:
        """``$507 desktop base system (parts: cpu $110, …, 850 W psu $100 for 605 W)``."""
        if not self.by_parts:
            why = f"; {self.why_not_parts}" if self.why_not_parts else ""
            return f"${self.usd:,.0f} {self.build_class} base system ({self.source}{why})"
        *rest, psu = self.parts
        items = ", ".join(f"{p.part} ${p.usd:,.0f}" for p in rest)
        return (
            f"${self.usd:,.0f} {self.build_class} base system (parts: {items}, {psu.label} "
            f"${psu.usd:,.0f} for the {self.needed_psu_w or 0:,.0f} W it needs; "
            f"{', '.join(dict.fromkeys(p.provenance.source for p in self.parts))})"
        )


def needed_psu_w(spec: GpuSpec, count: int, build: BuildClass, rules: CostRules) -> float | None:
    """The power supply ``count`` x ``spec`` need in a ``build``: (count x board power + the
    class's CPU + the rest) x (1 + margin), as the build checks size it; None without a board
    power."""
    if spec.tdp_w is None:
        return None
    load = count * spec.tdp_w + build.cpu_w + rules.psu_rest_w
    return load * (1 + rules.psu_margin_fraction)


def base_system_cost(
    spec: GpuSpec,
    count: int,
    build: BuildClass,
    rules: CostRules,
    components: ComponentPrices | None = None,
) -> BaseSystemCost | None:
    """The base system of ``count`` x ``spec`` in a machine of class ``build``; None when
    neither the parts nor the class price it."""
    components = components or shipped_component_prices()
    platform = components.platform(build.id, count)
    why = ""
    if platform is not None:
        needed = needed_psu_w(spec, count, build, rules)
        supply = components.power_supply(needed) if needed is not None else None
        if needed is not None and supply is not None:
            return BaseSystemCost(
                build_class=build.id,
                usd=platform.usd + supply.price.usd,
                by_parts=True,
                parts=(*platform.parts, supply.price),
                needed_psu_w=needed,
            )
        why = (
            f"no board power for {spec.name} to size the power supply"
            if needed is None
            else f"{needed:,.0f} W is above the largest priced power supply"
        )
    if build.base_system_usd is None:
        return None
    prov = build.provenance.get("base_system_usd")
    return BaseSystemCost(
        build_class=build.id,
        usd=build.base_system_usd,
        by_parts=False,
        source=prov.source if prov else "",
        why_not_parts=why,
    )
