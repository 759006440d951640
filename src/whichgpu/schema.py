"""Frozen, documented value types shared by every layer of whichgpu.

These are the nouns of the tool. The catalog produces ``GpuSpec``, ``Source`` and ``Price``;
later layers add workload profiles, estimates and benchmark results. Every type is immutable and
validated (pydantic, ``frozen=True``, unknown fields rejected), and every field is documented,
with its unit in its name. Anything that changes a stored or exported shape bumps
``SCHEMA_VERSION`` and gets a CHANGELOG line.
"""

from __future__ import annotations

import datetime as dt
from enum import Enum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION = 1
"""Version of the exported JSON shapes (bumped on any incompatible change)."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Vendor(str, Enum):
    """Who makes the accelerator."""

    NVIDIA = "nvidia"
    AMD = "amd"
    GOOGLE = "google"
    INTEL = "intel"
    APPLE = "apple"


class Segment(str, Enum):
    """Market segment: decides driver features (ECC, P2P), cooling and how it is sold."""

    CONSUMER = "consumer"
    WORKSTATION = "workstation"
    DATACENTER = "datacenter"


class Confidence(str, Enum):
    """How much a catalog value can be trusted, best first."""

    DATASHEET = "datasheet"
    """Printed by the vendor in a datasheet, product page or spec table."""
    WHITEPAPER = "whitepaper"
    """Printed by the vendor in an architecture whitepaper or technical brief."""
    SECONDARY = "secondary"
    """Taken from a reputable third-party database that transcribes vendor figures."""
    DERIVED = "derived"
    """Computed from other sourced values; ``Provenance.method`` says how."""
    ESTIMATE = "estimate"
    """An informed estimate (e.g. an analyst's price); treat as approximate."""


class SourceKind(str, Enum):
    """What kind of document a source is; sets the default confidence of its values."""

    DATASHEET = "datasheet"
    WHITEPAPER = "whitepaper"
    VENDOR_PAGE = "vendor-page"
    PRICE_LIST = "price-list"
    MARKET = "market"
    SECONDARY = "secondary"

    def default_confidence(self) -> Confidence:
        """The confidence of a value taken from this kind of source without other notes."""
        if self is SourceKind.WHITEPAPER:
            return Confidence.WHITEPAPER
        if self in (SourceKind.DATASHEET, SourceKind.VENDOR_PAGE, SourceKind.PRICE_LIST):
            return Confidence.DATASHEET
        if self is SourceKind.MARKET:
            return Confidence.ESTIMATE
        return Confidence.SECONDARY


class Source(_Frozen):
    """A public document that catalog values are taken from."""

    key: str
    """Short identifier used by records (e.g. ``nv-ga102-wp``)."""
    title: str
    """Document title as published."""
    url: str
    """Where it can be read."""
    publisher: str
    """Who published it (NVIDIA, AMD, AWS, …)."""
    kind: SourceKind
    """What kind of document it is."""
    published: dt.date | None = None
    """Publication or last-revision date, where the document states one."""
    accessed: dt.date | None = None
    """When its content was read for this catalog."""


class Provenance(_Frozen):
    """Where one catalog value comes from."""

    source: str
    """Key of the ``Source`` the value was read from (or derived from)."""
    confidence: Confidence
    """How far to trust it."""
    method: str | None = None
    """For derived values: the computation (e.g. ``SMs x boost MHz x 512 FLOP/clk``)."""
    note: str | None = None
    """Anything a reader should know (e.g. "datasheet prints 1,979 with sparsity")."""


class FormFactor(str, Enum):
    """How the accelerator is built into a machine."""

    PCIE = "pcie"
    SXM = "sxm"
    OAM = "oam"
    SUPERCHIP = "superchip"
    MEZZANINE = "mezzanine"
    SOC = "soc"


class Cooling(str, Enum):
    """How the board is cooled: decides how many fit side by side."""

    BLOWER = "blower"
    OPEN_AIR = "open-air"
    PASSIVE = "passive"
    LIQUID = "liquid"
    SYSTEM = "system"


class Interconnect(str, Enum):
    """The direct GPU-to-GPU link, beside PCIe."""

    NONE = "none"
    NVLINK = "nvlink"
    INFINITY_FABRIC = "infinity-fabric"
    ICI = "ici"
    ETHERNET = "ethernet"


SPEC_FIELDS: tuple[str, ...] = (
    "architecture",
    "chip",
    "compute_capability",
    "gfx_target",
    "launch_date",
    "form_factor",
    "memory_gb",
    "memory_usable_mib",
    "memory_type",
    "memory_bus_width_bits",
    "memory_data_rate_gbps",
    "memory_bandwidth_gbps",
    "sm_count",
    "boost_clock_mhz",
    "l2_cache_mib",
    "shared_memory_per_sm_kib",
    "fp64_tflops",
    "fp32_tflops",
    "fp16_tflops",
    "tf32_tensor_tflops",
    "fp16_tensor_tflops",
    "fp16_acc16_tensor_tflops",
    "bf16_tensor_tflops",
    "fp8_tensor_tflops",
    "fp4_tensor_tflops",
    "int8_tensor_tops",
    "sparse_fp16_tensor_tflops",
    "tdp_w",
    "slot_width",
    "cooling",
    "pcie_gen",
    "pcie_lanes",
    "interconnect",
    "interconnect_gen",
    "interconnect_bandwidth_gbps",
    "ecc",
    "launch_price_usd",
)
"""Catalog fields that are facts about the hardware; each non-null one has a ``Provenance``."""


class GpuSpec(_Frozen):
    """One accelerator SKU variant (memory size and form factor are part of its identity).

    Compute rates are dense (no 2:4 sparsity) peak rates at the boost clock. Tensor rates are
    with FP32 accumulate, the rate mixed-precision training gets, except
    ``fp16_acc16_tensor_tflops``. ``None`` means not applicable or not published; ``provenance``
    says where each non-null value comes from.
    """

    id: str
    """Catalog id: lower-case slug, stable across versions (e.g. ``rtx-3090``)."""
    name: str
    """Marketing name (e.g. ``GeForce RTX 3090``)."""
    vendor: Vendor
    """Maker."""
    segment: Segment
    """Consumer, workstation or datacenter."""
    aliases: tuple[str, ...] = ()
    """Other names that resolve to this record (NVML names, cloud catalogue names, short forms)."""

    architecture: str | None = None
    """Architecture family (``Ampere``, ``CDNA3``, …)."""
    chip: str | None = None
    """Die (``GA102``, ``GH100``, ``Aldebaran`` …)."""
    compute_capability: str | None = None
    """CUDA compute capability (NVIDIA), e.g. ``8.6``."""
    gfx_target: str | None = None
    """LLVM gfx target (AMD), e.g. ``gfx942``."""
    launch_date: dt.date | None = None
    """Launch (first availability or announcement where that is all that is published)."""
    form_factor: FormFactor | None = None
    """PCIe card, SXM/OAM module, superchip, SoC."""

    memory_gb: float | None = None
    """Memory as sold, decimal GB (a "24 GB" card is 24)."""
    memory_usable_mib: float | None = None
    """Total memory the driver reports (NVML / ``mem_get_info`` total), MiB, where known."""
    memory_type: str | None = None
    """GDDR6X, HBM3e, LPDDR5X, …"""
    memory_bus_width_bits: int | None = None
    """Memory interface width in bits."""
    memory_data_rate_gbps: float | None = None
    """Data rate per pin, Gbit/s."""
    memory_bandwidth_gbps: float | None = None
    """Peak memory bandwidth, decimal GB/s."""

    sm_count: int | None = None
    """Streaming multiprocessors (NVIDIA) or compute units (AMD)."""
    boost_clock_mhz: float | None = None
    """Boost clock, MHz (the clock the peak rates assume)."""
    l2_cache_mib: float | None = None
    """Last-level on-die cache (L2; AMD Infinity Cache is noted, not counted), MiB."""
    shared_memory_per_sm_kib: float | None = None
    """Largest shared memory (LDS) configurable per SM/CU, KiB."""

    fp64_tflops: float | None = None
    """FP64 vector (non-tensor) peak, TFLOP/s."""
    fp32_tflops: float | None = None
    """FP32 vector (non-tensor) peak, TFLOP/s."""
    fp16_tflops: float | None = None
    """FP16 vector (non-tensor) peak, TFLOP/s (what AMP gets on GPUs without tensor cores)."""
    tf32_tensor_tflops: float | None = None
    """TF32 tensor (matrix) peak, dense, TFLOP/s."""
    fp16_tensor_tflops: float | None = None
    """FP16 tensor peak with FP32 accumulate, dense, TFLOP/s: the AMP training rate."""
    fp16_acc16_tensor_tflops: float | None = None
    """FP16 tensor peak with FP16 accumulate, dense, TFLOP/s (2x the above on GeForce)."""
    bf16_tensor_tflops: float | None = None
    """BF16 tensor peak with FP32 accumulate, dense, TFLOP/s."""
    fp8_tensor_tflops: float | None = None
    """FP8 tensor peak with FP32 accumulate, dense, TFLOP/s."""
    fp4_tensor_tflops: float | None = None
    """FP4 tensor peak, dense, TFLOP/s."""
    int8_tensor_tops: float | None = None
    """INT8 tensor peak, dense, TOP/s."""
    sparse_fp16_tensor_tflops: float | None = None
    """The vendor's FP16 tensor figure *with* 2:4 sparsity (same accumulate as the larger dense
    figure). Kept only to check that dense figures are not sparse ones; never used for speed."""

    tdp_w: float | None = None
    """Board power (TDP / TBP / max power), W."""
    slot_width: float | None = None
    """PCIe slots the card occupies (2, 2.5, 3 …); ``None`` for modules."""
    cooling: Cooling | None = None
    """Blower, open-air, passive (needs server airflow), liquid, or cooled by the system."""
    pcie_gen: int | None = None
    """PCIe generation of the host link."""
    pcie_lanes: int | None = None
    """PCIe lanes of the host link."""
    interconnect: Interconnect | None = None
    """Direct GPU-to-GPU link, or ``none``."""
    interconnect_gen: str | None = None
    """Generation of that link (``3`` for NVLink 3, …)."""
    interconnect_bandwidth_gbps: float | None = None
    """Total GPU-to-GPU link bandwidth per GPU, both directions, GB/s."""
    ecc: bool | None = None
    """Whether the memory has ECC."""
    launch_price_usd: float | None = None
    """Launch list price (MSRP), USD, where the vendor published one."""

    notes: str | None = None
    """Free-text remarks a buyer should read (e.g. "two GCDs: appears as two devices")."""
    provenance: dict[str, Provenance] = Field(default_factory=dict)
    """Field name -> where its value comes from; one entry for every non-null spec field."""

    @property
    def amp_tensor_tflops(self) -> float | None:
        """The rate mixed-precision (FP16/BF16) training gets: tensor if present, else vector."""
        return self.fp16_tensor_tflops or self.bf16_tensor_tflops or self.fp16_tflops


PriceKind = Literal["launch", "new", "used", "cloud-on-demand", "cloud-spot"]
PricePer = Literal["unit", "hour"]


class Price(_Frozen):
    """One dated price of one GPU: bought (per unit) or rented (per GPU-hour)."""

    gpu_id: str
    """Catalog id of the GPU."""
    kind: PriceKind
    """``launch`` (MSRP), ``new`` / ``used`` street price, ``cloud-on-demand``, ``cloud-spot``."""
    usd: float
    """Price in US dollars, per ``per``."""
    per: PricePer
    """``unit`` for a purchase, ``hour`` for one GPU rented for one hour."""
    provider: str | None = None
    """Cloud provider or market (``aws``, ``runpod``, ``ebay`` …); ``None`` for MSRP."""
    region: str | None = None
    """Cloud region, or the market's country."""
    as_of: dt.date
    """Date the price was observed or published."""
    source: str
    """Source key from the catalog's source table, or (user files) free text / URL."""
    note: str | None = None
    """How it was obtained (e.g. ``p5.48xlarge $55.04/h / 8 GPUs``)."""
    user: bool = False
    """True when it comes from a user price file rather than the shipped catalog."""


class ComparisonRow(_Frozen):
    """One quantity across the compared GPUs."""

    label: str
    """What it is, for a reader (``Memory bandwidth``)."""
    field: str
    """Machine name (``memory_bandwidth_gbps``)."""
    unit: str
    """Unit of ``values`` (``GB/s``)."""
    values: tuple[float | None, ...]
    """One value per GPU, in the order of ``Comparison.gpu_ids``; None where unknown."""
    ratios: tuple[float | None, ...]
    """Each value divided by the first GPU's (the baseline); None where either is unknown."""
    higher_is_better: bool
    """Whether a larger value is the better one (false for power and price)."""


class Comparison(_Frozen):
    """Side-by-side figures of several GPUs, relative to the first."""

    gpu_ids: tuple[str, ...]
    """Catalog ids, baseline first."""
    names: tuple[str, ...]
    """Marketing names, same order."""
    rows: tuple[ComparisonRow, ...]
    """The quantities compared."""
    price_notes: tuple[str, ...]
    """For each GPU, which price the price rows use (kind, provider, date)."""
