"""Frozen, documented value types shared by every layer of whichgpu.

Over 600 lines because it is the one vocabulary every layer shares, and the exported JSON shapes
it defines are versioned together (``SCHEMA_VERSION``): a layer imports its answer's types from
here whatever their domain (catalog, runs, estimates, serving, bench results, validation).

These are the nouns of the tool. The catalog produces ``GpuSpec``, ``Source`` and ``Price``;
later layers add workload profiles, estimates and benchmark results. Every type is immutable and
validated (pydantic, ``frozen=True``, unknown fields rejected), and every field is documented,
with its unit in its name. Anything that changes a stored or exported shape bumps
``SCHEMA_VERSION`` and gets a CHANGELOG line.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

SCHEMA_VERSION = 1
"""Version of the exported JSON shapes (bumped on any incompatible change)."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class _Tabular(_Frozen):
    """A result that shows itself: ``_repr_html_`` (Jupyter) and ``to_frame`` (pandas).

    The rendering lives in ``whichgpu.report.notebook``, imported on first use, so this module
    stays light; pandas is needed only by ``to_frame``.
    """

    def to_frame(self) -> Any:
        """A pandas DataFrame of the result (see ``whichgpu.report.notebook.frame``)."""
        from whichgpu.report.notebook import frame

        return frame(self)

    def _repr_html_(self) -> str:
        from whichgpu.report.notebook import html

        return html(self)


class Vendor(str, Enum):
    """Who makes the accelerator."""

    NVIDIA = "nvidia"
    AMD = "amd"
    GOOGLE = "google"
    INTEL = "intel"
    APPLE = "apple"

    @property
    def label(self) -> str:
        """The maker's name as written (``NVIDIA``, ``AMD``, ``Google``, ``Intel``, ``Apple``)."""
        name = str(self.value)
        return name.upper() if self in (Vendor.NVIDIA, Vendor.AMD) else name.title()


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


_BASEBOARD_FORMS = (FormFactor.SXM, FormFactor.OAM, FormFactor.SUPERCHIP, FormFactor.MEZZANINE)


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
    "devices",
    "memory_gb",
    "memory_usable_mib",
    "memory_cuda_total_mib",
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
    "sustained_tensor_tflops",
    "tdp_w",
    "slot_width",
    "cooling",
    "pcie_gen",
    "pcie_lanes",
    "interconnect",
    "interconnect_gen",
    "interconnect_bandwidth_gbps",
    "interconnect_domain_gpus",
    "ecc",
    "launch_price_usd",
)
"""Catalog fields that are facts about the hardware; each non-null one has a ``Provenance``."""

_PER_DEVICE_FIELDS: tuple[str, ...] = (
    "memory_gb",
    "memory_usable_mib",
    "memory_cuda_total_mib",
    "memory_bandwidth_gbps",
    "l2_cache_mib",
    *(name for name in SPEC_FIELDS if name.endswith(("_tflops", "_tops"))),
    "tdp_w",
)
"""``GpuSpec`` figures of a package that its devices share out (``GpuSpec.one_device``)."""


class GpuSpec(_Tabular):
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
    default_variant: bool = False
    """Whether a family name this record shares with others (``RTX 3080``) means this card when
    given alone: the original card of the family, where one variant is *the* card (the 10 GB
    RTX 3080, not the later 12 GB refresh). At most one record of a family sets it."""

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
    devices: int | None = Field(default=None, ge=1)
    """Devices the package appears as to PyTorch, each its own GPU with its own memory (an
    MI250X's two GCDs); None: one. The memory, rates, bandwidth and power here are the whole
    package's; ``one_device`` gives one device's share, what one process runs on."""

    memory_gb: float | None = None
    """Memory as sold, decimal GB (a "24 GB" card is 24)."""
    memory_usable_mib: float | None = None
    """Total memory the driver reports (NVML / ``mem_get_info`` total), MiB, where known."""
    memory_cuda_total_mib: float | None = None
    """Device memory CUDA reports as total (``cudaMemGetInfo`` / torch ``total_memory``), MiB;
    what a process can allocate into, below the marketed size."""
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
    sustained_tensor_tflops: float | None = None
    """A dense 16-bit matrix product's rate measured under load on a card whose power limit
    holds its clock below the boost the peaks assume (T4, L4), TFLOP/s. Where given, the
    throughput model's tensor rate never exceeds it (``estimate.throughput.gpu_rates``)."""

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
    interconnect_domain_gpus: int | None = None
    """GPUs that one switched NVLink domain joins where it spans more than one 8-GPU machine
    (GB200 and GB300 NVL72: 72); None: the machine's GPUs."""
    ecc: bool | None = None
    """Whether the memory has ECC."""
    launch_price_usd: float | None = None
    """Launch list price (MSRP), USD, where the vendor published one."""

    notes: str | None = None
    """Free-text remarks a buyer should read (e.g. "two GCDs: appears as two devices")."""
    provenance: dict[str, Provenance] = Field(default_factory=dict)
    """Field name -> where its value comes from; one entry for every non-null spec field."""

    @property
    def is_module(self) -> bool:
        """Whether it is a module (SXM, OAM, a superchip, a mezzanine) that sits on its vendor's
        baseboard in a server sold whole, rather than a PCIe card or a whole computer (SoC)."""
        return self.form_factor in _BASEBOARD_FORMS

    def capability(self) -> tuple[int, int] | None:
        """``compute_capability`` as numbers (``"8.9"``: ``(8, 9)``); None when the catalog
        gives none or not of that form."""
        try:
            major, minor = (self.compute_capability or "").split(".")[:2]
            return int(major), int(minor)
        except ValueError:
            return None

    def one_device(self) -> GpuSpec:
        """The spec of one of ``devices`` devices (itself when the package is one): the memory,
        rates, bandwidth, compute units, L2 and board power divided evenly among them, as
        PyTorch sees each (an MI250X GCD: 64 GB, 1.6 TB/s, 110 CUs)."""
        n = self.devices or 1
        if n == 1:
            return self
        shared: dict[str, float | int | None] = {
            name: None if (value := getattr(self, name)) is None else value / n
            for name in _PER_DEVICE_FIELDS
        }
        for name in ("sm_count", "memory_bus_width_bits"):
            whole = getattr(self, name)
            shared[name] = None if whole is None else whole // n
        name = f"{self.name} (one of its {n} devices)"
        return self.model_copy(update={**shared, "devices": 1, "name": name})

    @property
    def amp_tensor_tflops(self) -> float | None:
        """The matrix rate mixed-precision (FP16/BF16 with FP32 accumulate) training gets: the
        tensor cores' where the GPU has them, else its FP32 units' — without tensor cores
        cuBLAS multiplies FP16 matrices in FP32 arithmetic (Pascal's FP16 units run at 1/64 of
        FP32; the GTX 16 series' accumulate in FP16), so the FP16 vector rate does not apply."""
        return self.fp16_tensor_tflops or self.bf16_tensor_tflops or self.fp32_tflops


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
    instance_gpus: tuple[int, ...] | None = None
    """Cloud rates: the GPU counts of the machines the rate is offered in (``(8,)`` for a whole
    8-GPU node, ``(1,)`` for single-GPU instances); None where the source does not say."""
    user: bool = False
    """True when it comes from a user price file rather than the shipped catalog."""

    def offered_for(self, gpus: int) -> bool:
        """Whether ``gpus`` GPUs can be rented at this rate in one machine (unknown: yes)."""
        return self.instance_gpus is None or gpus in self.instance_gpus


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


class Comparison(_Tabular):
    """Side-by-side figures of several GPUs, relative to the first."""

    gpu_ids: tuple[str, ...]
    """Catalog ids, baseline first."""
    names: tuple[str, ...]
    """Marketing names, same order."""
    rows: tuple[ComparisonRow, ...]
    """The quantities compared."""
    price_notes: tuple[str, ...]
    """For each GPU, which purchase price the price rows use (kind, provider, date, source)."""
    cloud_notes: tuple[str, ...] = ()
    """For each GPU, which cloud rate the cloud row shows (provider, date, source)."""


# --- Workloads and run configurations -------------------------------------------------------

Mode = Literal["train", "inference"]
Precision = Literal["fp32", "tf32", "fp16", "bf16", "bf16-pure", "fp8"]
Fp8Recipe = Literal["tensorwise", "rowwise"]
"""torchao's float8 training recipes whichgpu models (``RunConfig.fp8_recipe``)."""
Optimizer = Literal["adamw", "adamw-8bit", "adafactor", "sgd", "paged-adamw-8bit"]
OptimizerImpl = Literal["foreach", "for-loop", "fused", "in-backward"]
"""How the optimizer step runs: ``foreach`` (PyTorch's default on CUDA: each operation over all
parameters at once, with temporaries the size of them all), ``for-loop`` (one parameter at a
time: ``foreach=False``, and the loop of Composer's ``DecoupledAdamW`` that llm-foundry trains
with), ``fused`` (one kernel per parameter group, no temporaries: ``fused=True``),
``in-backward`` (each parameter updated in the backward pass as soon as its gradient is
accumulated, which is then dropped, so no full set of gradients exists: PyTorch's
``register_post_accumulate_grad_hook`` pattern, torchtune's ``optimizer_in_bwd``; one GPU,
no gradient accumulation, no fp16 loss scaling)."""
LossKernel = Literal["torch", "fused", "chunked", "fused-linear"]
"""A language model's cross-entropy: ``torch`` (transformers' loss: the logits upcast to fp32, a
log-softmax and its gradient in fp32), ``fused`` (one kernel that reads the 16-bit logits and
writes their gradient, as flash-attn's ``CrossEntropyLoss`` — llm-foundry's default — and
Liger's do), ``chunked`` (torchtune's ``CEWithChunkedOutputLoss``: the output projection and
the fp32 upcast run on 8 chunks of the sequence, so the 16-bit logits exist whole but their
fp32 copy one chunk at a time) or ``fused-linear`` (Liger's ``FusedLinearCrossEntropy``: the
output projection, the loss and its gradients run chunk by chunk in the forward pass, so no
logits of the whole batch exist in any dtype). See ``whichgpu.workloads.hf``."""
CHECKPOINTING_POLICY_PATTERN = r"^(full|selective|every-[1-9][0-9]*)$"
"""The forms of ``RunConfig.checkpointing_policy``: ``full``, ``selective``, ``every-N``."""
Method = Literal["full", "lora", "qlora"]
Sharding = Literal["ddp", "zero1", "zero2", "zero3", "fsdp", "hsdp"]
"""How data-parallel GPUs share the model state: ``ddp`` (each holds all of it), ``zero1``
(the optimizer state and master weights split, the gradients whole and reduced once a step:
DeepSpeed's ZeRO stage 1, Megatron-Core's distributed optimizer), ``zero2`` (gradients and
optimizer state split), ``zero3``/``fsdp`` (parameters split too), ``hsdp``
(FSDP's hybrid sharding: split as ``fsdp`` among the GPUs of each node, each node a replica;
on one node the same as ``fsdp``)."""
ThroughputUnit = Literal["images", "tokens", "sequences", "samples"]
DEFAULT_NEW_TOKENS = 128
"""Tokens generated per sequence when an inference run of a language model gives none."""


class RunConfig(_Frozen):
    """What is done with a workload: mode, precision, sizes, optimizer, fine-tuning method.

    Construct through ``whichgpu.workloads.run_config`` (or validate with
    ``RunConfig.model_validate``), which checks that the options make sense together.
    """

    mode: Mode = "train"
    """``train`` (forward, loss, backward, optimizer step) or ``inference``."""
    precision: Precision = "bf16"
    """``fp32`` (TF32 off), ``tf32``, ``fp16``/``bf16`` (AMP, fp32 master weights), ``bf16-pure``
    (weights, grads and optimizer state in bf16), ``fp8``."""
    batch_size: int | None = None
    """Samples per step; None = the workload's default (or, for fit, the search variable)."""
    seq_len: int | None = None
    """Tokens per sequence for sequence models; None = the workload's default."""
    optimizer: Optimizer = "adamw"
    """Optimizer for training."""
    optimizer_impl: OptimizerImpl = "foreach"
    """How the optimizer step runs (see ``OptimizerImpl``); adamw and sgd take all four,
    adafactor all but fused, adamw-8bit and paged-adamw-8bit their own kernels only."""
    loss_kernel: LossKernel = "torch"
    """A language model's cross-entropy kernel (see ``LossKernel``)."""
    grad_accum: int = 1
    """Gradient accumulation: micro-batches of ``batch_size`` per optimizer step on each GPU.
    Memory is one micro-batch's plus the gradients kept across micro-steps; an optimizer step
    takes ``grad_accum`` forward and backward passes and one update. The global batch is
    ``batch_size x grad_accum x`` the data-parallel copies (``global_batch_size``). With
    ``pipeline_parallel`` > 1 these are the micro-batches the pipeline runs in a step."""
    checkpointing: bool = False
    """Gradient (activation) checkpointing, by ``checkpointing_policy``."""
    checkpointing_policy: str = Field(default="full", pattern=CHECKPOINTING_POLICY_PATTERN)
    """Which activations a checkpointed run recomputes in the backward pass: ``full`` (every
    repeated layer's, keeping only each layer's input), ``every-N`` (every N-th layer's,
    counting from the first: torchtitan's ``selective`` layer mode with ``ac_freq`` N,
    transformers' ``every_n_layers``; the other layers keep theirs) or ``selective`` (per
    operator within every layer: the outputs of matrix multiplications and attention are kept,
    the rest recomputed: torchtitan's ``op`` mode). Applies with ``checkpointing`` only."""
    compile: bool = False
    """The training step runs under ``torch.compile`` (default mode, inductor): ``bench``
    measures it so; ``fit`` leaves out of the forward and backward passes' peak the
    activations inductor's partitioner recomputes instead of saving (derived on fake tensors,
    ``trace.compiled``). A language model's inference (``mode="inference"``): its decode steps
    run compiled as transformers' ``generate`` runs a static cache (``mode="reduce-overhead"``,
    CUDA graphs; the prefill eager): ``predict`` times them without the per-operator dispatch
    floor and ``bench`` measures them so."""
    method: Method = "full"
    """``full`` fine-tuning / training, ``lora``, or ``qlora`` (4-bit NF4 base weights)."""
    lora_rank: int = 16
    """LoRA rank (``lora``/``qlora``)."""
    lora_targets: tuple[str, ...] = ()
    """Module names LoRA adapts; empty = the workload's default (attention and MLP projections)."""
    context: int | None = None
    """Inference: prompt (context) length in tokens."""
    new_tokens: int | None = None
    """Inference: tokens generated per sequence."""
    concurrency: int = 1
    """Inference: sequences served at once."""
    gpus: int = 1
    """GPUs of the run: training, data parallel (each takes ``batch_size`` samples), beyond
    one node's 8 in nodes of 8 joined by ``network``; inference, one model served tensor
    parallel across them (``batch_size`` sequences in all), within one node."""
    sharding: Sharding = "ddp"
    """With ``gpus`` > 1: what the data-parallel GPUs split between them (see ``Sharding``)."""
    tensor_parallel: int = 1
    """Training: GPUs of one node that split every layer between them (Megatron-style tensor
    parallel with sequence parallel: attention heads and MLP columns split, and the
    activations between them split along the sequence), exchanging activations four times a
    layer in each micro-step. ``gpus`` is a multiple of ``tensor_parallel x
    pipeline_parallel``; the rest of the factor is data parallel."""
    pipeline_parallel: int = 1
    """Training: stages the layers are split into, each on its own GPUs, with a 1F1B schedule
    over the step's ``grad_accum`` micro-batches (at least one per stage)."""
    virtual_stages: int = 1
    """Training with ``pipeline_parallel`` > 1: chunks of layers each GPU holds, not adjacent
    (the interleaved 1F1B schedule: Megatron-LM's virtual pipeline, torchtitan's
    ``Interleaved1F1B``), which cuts the pipeline's bubble by this factor, multiplies its
    sends by it, and keeps more micro-batches in flight; 1: plain 1F1B."""
    tensor_parallel_overlap: bool = False
    """Training with ``tensor_parallel`` > 1: the exchanges run beside the matrix products of
    their layer (Megatron-Core's ``--tp-comm-overlap`` with Transformer Engine's userbuffers,
    which NVIDIA's performance recipes turn on; torchtitan's async tensor parallel), so that
    a layer's exchanges cost only what outlasts its matrix products; False: none of them
    hidden."""
    context_parallel: int = 1
    """Training: GPUs that split every sequence between them (context parallel: Megatron-Core's
    ``--context-parallel-size``, torchtitan's ``context_parallel_degree``). Each holds and
    computes 1/C of every sequence's tokens (the sequence cut into 2C chunks, two a GPU, so
    that causal attention's work is even) and passes the keys and values around a ring so that
    its queries attend over the whole sequence. Every GPU of the group holds the whole model
    state, reduced (and, under ZeRO/FSDP, sharded) with the data-parallel copies. ``gpus`` is a
    multiple of ``tensor_parallel x pipeline_parallel x context_parallel``."""
    expert_parallel: int = 1
    """Training a mixture of experts: GPUs that spread each layer's routed experts between
    them (expert parallel: Megatron-Core's ``--expert-model-parallel-size``, torchtitan's
    ``expert_parallel_degree``), each holding 1/E of them; every token is sent to the GPUs of
    its experts and back by all-to-all, twice a layer in the forward pass and twice in the
    backward. The GPUs are data-parallel copies (E divides ``data_parallel()``): each runs its
    own micro-batch through the rest of the model, and the experts' gradients are reduced over
    the copies that hold the same experts (``data_parallel() / E``). 1: every GPU holds every
    expert."""
    fp8_recipe: Fp8Recipe = "tensorwise"
    """Training in ``fp8``: torchao's scaling recipe (``Float8LinearConfig.from_recipe_name``).
    ``tensorwise``: one scale per tensor (e4m3 forward, e5m2 gradients); ``rowwise``: one scale
    per row or column (all e4m3), the forward product a CUTLASS rowwise kernel and the
    backward's cuBLAS products followed by a rescaling kernel each, and the weight cast twice,
    once for each product it enters."""
    fp8_all_gather: bool = False
    """Training in ``fp8`` under ``zero3``/``fsdp``/``hsdp``: FSDP gathers the converted linear
    layers' weights in fp8, one byte a weight instead of two (torchao's
    ``enable_fsdp_float8_all_gather``, torchtitan's ``--float8.enable_fsdp_float8_all_gather``):
    smaller gathered units, half the gathers' bytes for those weights."""
    network: str | None = None
    """Training on more GPUs than one node holds: the fabric between the nodes, by its id in
    ``estimate/data/links.json``'s ``fabrics`` (``ib-ndr``, ``ib-hdr``, ``roce-1600``); None =
    the default fabric, InfiniBand NDR (``ib-ndr``), which the prediction's assumptions then
    name. No effect on one node."""

    def parallelism(self) -> str:
        """How the run's GPUs share it, in words: ``tensor parallel`` for inference (one model
        split across them; ``sharding`` is a training option and stays ``ddp``), else the
        training's ``sharding`` (``ddp``, ``zero2`` …), after its model-parallel split where
        it has one (``tensor parallel 2 x pipeline parallel 4, fsdp``)."""
        if self.mode == "inference":
            return "tensor parallel"
        split = self.model_parallel_words()
        return f"{split}, {self.sharding}" if split else self.sharding

    def model_parallel(self) -> int:
        """GPUs that run one micro-batch between them: ``tensor_parallel x pipeline_parallel x
        context_parallel`` (1 for inference, whose ``gpus`` are all tensor parallel)."""
        if self.mode == "inference":
            return 1
        return self.tensor_parallel * self.pipeline_parallel * self.context_parallel

    def data_parallel(self) -> int:
        """Copies of the model training side by side on their own batches: training's
        ``gpus`` over ``model_parallel`` (1 for inference)."""
        if self.mode == "inference":
            return 1
        return max(1, self.gpus // self.model_parallel())

    def state_group(self) -> int:
        """GPUs that hold the same share of the model state and reduce its gradients together
        (ZeRO and FSDP shard it over them): the data-parallel copies times the context-parallel
        GPUs of each, which work on the same weights (1 for inference)."""
        if self.mode == "inference":
            return 1
        return self.data_parallel() * self.context_parallel

    def model_parallel_words(self) -> str:
        """The model-parallel split in words (``tensor parallel 2 x pipeline parallel 4``);
        empty without one."""
        parts = []
        if self.tensor_parallel > 1:
            parts.append(f"tensor parallel {self.tensor_parallel}")
        if self.pipeline_parallel > 1:
            interleaved = (
                f" ({self.virtual_stages} virtual stages)" if self.virtual_stages > 1 else ""
            )
            parts.append(f"pipeline parallel {self.pipeline_parallel}{interleaved}")
        if self.context_parallel > 1:
            parts.append(f"context parallel {self.context_parallel}")
        return " x ".join(parts)

    def memory_levers(self) -> tuple[str, ...]:
        """Options not used by this run that make a step need less memory per GPU, in words
        (what to suggest when nothing fits); GPU counts are left to the caller."""
        levers: list[str] = []
        if self.mode == "inference":  # the batch is the concurrency; the KV cache the lever
            if self.concurrency > 1 or (self.batch_size or 1) > 1:
                levers.append("a lower --concurrency (or none: the most that fit)")
            levers.append("a shorter --context")
            levers.append(
                f"fewer --new-tokens than {self.new_tokens or 'the default'} (each sequence's "
                "KV cache holds context + new tokens)"
            )
            return tuple(levers)
        if not self.checkpointing:
            levers.append("--checkpointing (recompute activations in the backward pass)")
        elif self.checkpointing_policy != "full":
            levers.append("--checkpointing-policy full (recompute every layer's activations)")
        if self.method == "full":
            levers.append("--method lora or qlora")
            if self.optimizer == "adamw":
                levers.append("--optimizer adamw-8bit")
        if self.batch_size is not None and self.batch_size > 1:  # below 1 is no batch at all
            levers.append("no --batch-size (the largest batch that fits)")
        return tuple(levers)

    def global_batch_size(self, batch_size: int | None = None) -> int | None:
        """Samples per optimizer step over all GPUs: the micro-batch (``batch_size``, else
        the run's) x ``grad_accum`` x the data-parallel copies (``gpus`` without a
        model-parallel split); None when no micro-batch is known."""
        micro = batch_size if batch_size is not None else self.batch_size
        if micro is None:
            return None
        return micro * self.grad_accum * self.data_parallel()

    def checkpointing_every_layers(self) -> int | None:
        """Of a checkpointed run, every how many repeated layers one is checkpointed (1 for
        ``full`` and ``selective``, N for ``every-N``); None without checkpointing."""
        if not self.checkpointing:
            return None
        if self.checkpointing_policy.startswith("every-"):
            return int(self.checkpointing_policy.removeprefix("every-"))
        return 1

    def checkpointing_words(self) -> str:
        """The checkpointing policy as a suffix to "gradient checkpointing": empty for
        ``full``, `` (every 2nd layer)``, `` (selective: attention and every other matmul
        kept)``."""
        if self.checkpointing_policy == "selective":
            return " (selective: attention and every other matmul kept)"
        every = self.checkpointing_every_layers()
        if every is None or every == 1:
            return ""
        teen = every % 100 in (11, 12, 13)
        suffix = {1: "st", 2: "nd", 3: "rd"}.get(0 if teen else every % 10)
        return f" (every {every}{suffix or 'th'} layer)"

    def describe(self, seq_len: int | None = None) -> str:
        """The run in words, as the headings print it: mode, precision, what differs from a
        plain run, and the sequence length (``seq_len`` when resolved from the workload)."""
        parts: list[str] = [self.mode, self.precision]
        if self.mode == "train":
            parts.append(
                self.optimizer
                if self.optimizer_impl == "foreach"
                else f"{self.optimizer} ({self.optimizer_impl})"
            )
            if self.loss_kernel != "torch":
                parts.append(f"{self.loss_kernel} cross-entropy")
            if self.method != "full":
                parts.append(f"{self.method} rank {self.lora_rank}")
            if self.checkpointing:
                parts.append(f"gradient checkpointing{self.checkpointing_words()}")
            if self.grad_accum > 1:
                parts.append(f"gradient accumulation {self.grad_accum}")
            if self.compile:
                parts.append("torch.compile")
            if self.precision == "fp8" and self.fp8_recipe != "tensorwise":
                parts.append(f"{self.fp8_recipe} scaling")
            if self.fp8_all_gather:
                parts.append("fp8 all-gather")
            if self.model_parallel() > 1:
                parts.append(self.model_parallel_words())
            if self.expert_parallel > 1:
                parts.append(f"expert parallel {self.expert_parallel}")
        if self.mode == "inference" and self.compile:
            parts.append("compiled decoding")
        tokens = seq_len or self.seq_len
        if self.mode == "inference" and self.context:
            parts.append(f"context {self.context} + {self.new_tokens or 0} new tokens")
        elif tokens:
            parts.append(f"sequence length {tokens}")
        return ", ".join(parts)


class WorkloadInfo(_Frozen):
    """A named workload: what model, what input, what unit its throughput is counted in."""

    name: str
    """Registry slug (``resnet50``, ``llama-3.1-8b``)."""
    family: str
    """Family module (``vision``, ``llm``, ``seed_translation`` …)."""
    task: str
    """What it does (``image classification``, ``causal language modelling`` …)."""
    description: str
    """Architecture and input in one or two sentences."""
    input_desc: str
    """The input of one sample (``3x224x224 image``, ``sequence of 2048 tokens``)."""
    throughput_unit: ThroughputUnit
    """What one unit of throughput counts."""
    default_batch_size: int
    """Batch size used when none is given."""
    default_seq_len: int | None = None
    """Sequence length used when none is given (sequence models)."""
    is_sequence_model: bool = False
    """Whether ``seq_len`` applies."""
    max_seq_len: int | None = None
    """Longest sequence the model takes (the size of its position table); None: no bound
    known. Searches for the largest sequence length stop here."""
    params_published: int | None = None
    """Published parameter count, for checking the built model."""
    params_source: str | None = None
    """Where ``params_published`` comes from (paper, model card, repository)."""
    reference: str | None = None
    """The architecture's paper or reference implementation."""


# --- Step profiles ---------------------------------------------------------------------------

Phase = Literal["setup", "forward", "backward", "optimizer", "prefill", "decode"]
"""Where in a traced step an operator ran. ``setup``: making the batch (and the KV cache).
Training: ``forward``, ``backward``, ``optimizer``. Inference of a causal language model:
``prefill`` (the prompt through the model, filling the KV cache) and ``decode`` (one new token
per sequence, attending over the cache); inference of any other model: ``forward``."""
OpKind = Literal[
    "gemm",
    "conv",
    "attention",
    "elementwise",
    "norm",
    "reduction",
    "embedding",
    "optimizer",
    "copy",
    "communication",
    "other",
]
TensorCategory = Literal[
    "parameter",
    "buffer",
    "input",
    "gradient",
    "optimizer",
    "activation",
    "temporary",
    "parameter_cast",
    "paged_optimizer",
]
"""What a storage held; the order gives the codes of stored profiles (append new ones).
``parameter_cast`` is a parameter cast to another dtype for an operator while the forward or
backward runs: autocast's 16-bit copy of an fp32 weight (kept until the forward ends, and
until backward has used it where an operator saved it). ``paged_optimizer`` is optimizer state
that a paged optimizer (``--optimizer paged-adamw-8bit``) allocates in CUDA unified memory,
outside PyTorch's caching allocator (``whichgpu.estimate.paged``)."""


class OpRecord(_Frozen):
    """One operator call of the traced step."""

    name: str
    """ATen operator (``aten.mm``)."""
    kind: OpKind
    """What kind of work it is (decides the engine and the roofline in prediction)."""
    phase: Phase
    """Where in the step it ran."""
    flops: int
    """Floating-point operations (multiply-add = 2), where a formula exists; else 0."""
    bytes_read: int
    """Bytes of its tensor inputs."""
    bytes_written: int
    """Bytes of its tensor outputs."""
    dtype: str
    """Dtype of its first tensor input (``bfloat16``)."""
    gemm_bmnk: tuple[int, int, int, int] | None = None
    """For matrix multiplies: (batch, M, N, K)."""
    conv: tuple[int, ...] | None = None
    """For convolutions: (N, C_in, H, W, C_out, kH, kW, stride, groups) of the forward."""
    norm: tuple[int, ...] | None = None
    """For batch norm (forward and backward): (N, C, S) of its input, S the elements of one
    sample's channel (H x W); absent from profiles traced before it was recorded."""
    attention: tuple[int, ...] | None = None
    """For scaled-dot-product attention (forward and backward): (batch, q_heads, kv_heads,
    q_len, kv_len, head_dim, causal, masked, mask_rows) as the kernel sees them; ``causal`` is
    1 when the kernel applies its own causal mask, ``masked`` is 1 when an explicit
    ``attn_mask`` is given (which rules out the flash backend on CUDA), ``mask_rows`` the
    product of the mask's dimensions but the last (0 without a mask; absent from profiles
    traced before it was recorded). transformers folds the query heads of a group
    into ``q_len`` for single-token decode with grouped-query attention, so a decode op may
    show ``q_heads == kv_heads`` and ``q_len`` = heads per group."""


class AllocEvent(_Frozen):
    """A storage allocated or freed during the trace, in order."""

    op_index: int
    """Index of the operator that allocated/freed it (-1: before the first op)."""
    storage: int
    """Identifier of the storage, unique within the trace."""
    size_bytes: int
    """Exact bytes of the storage (allocator rounding is applied later, when replayed)."""
    alloc: bool
    """True for an allocation, False for a free."""
    category: TensorCategory
    """What the storage held (decided after the trace: see ``trace`` docs)."""
    step: int
    """Which traced step (0 or 1; step 1 is the steady state with optimizer state present)."""


class StepProfile(_Frozen):
    """One training (or inference) step of a workload, traced on the CPU with fake tensors."""

    workload: str
    """Workload name (or the user's config / model path)."""
    run: RunConfig
    """The run configuration traced (batch size and sequence length resolved)."""
    batch_size: int
    """Samples per step."""
    seq_len: int | None
    """Sequence length, for sequence models."""
    units_per_step: int
    """Throughput units per step (samples x units per sample)."""
    throughput_unit: ThroughputUnit
    """What the units are."""
    params_total: int
    """All parameters."""
    params_trainable: int
    """Parameters with ``requires_grad``."""
    ops: tuple[OpRecord, ...]
    """Operators of the steady-state step (the second one), in order."""
    events: tuple[AllocEvent, ...]
    """Every allocation and free of both traced steps, in order, parameters first."""
    choices: dict[str, str]
    """Device-dependent kernel choices in effect (attention backend, optimizer implementation)."""
    trace_seconds: float
    """Wall time of the trace."""
    torch_version: str
    """torch version that traced it."""

    @property
    def flops_per_step(self) -> int:
        """FLOPs of one step."""
        return sum(op.flops for op in self.ops)

    @property
    def bytes_per_step(self) -> int:
        """Bytes read and written by the operators of one step (no cache reuse assumed)."""
        return sum(op.bytes_read + op.bytes_written for op in self.ops)


class ProfileSummary(_Frozen):
    """What ``whichgpu profile`` reports about a traced step."""

    workload: str
    """Workload traced."""
    batch_size: int
    """Samples per step."""
    seq_len: int | None
    """Sequence length (sequence models)."""
    params_total: int
    """All parameters."""
    params_trainable: int
    """Trainable parameters."""
    flops_per_step: int
    """FLOPs of one step (forward, backward and optimizer for training)."""
    flops_per_sample: float
    """``flops_per_step / batch_size``."""
    forward_flops_per_sample: float
    """FLOPs of the forward pass per sample."""
    bytes_per_step: int
    """Bytes read and written by the step's operators (no cache reuse assumed)."""
    units_per_step: int
    """Throughput units per step."""
    throughput_unit: ThroughputUnit
    """Unit of ``units_per_step``."""
    op_mix: dict[str, dict[str, float]]
    """Per operator kind: ``flops_share``, ``bytes_share`` and ``count``."""
    peak_live_bytes: int
    """Peak of live tensor bytes (exact storage sizes, before allocator rounding)."""
    peak_live_by_category: dict[str, int]
    """Live bytes per category at that peak."""
    choices: dict[str, str]
    """Kernel choices in effect while tracing."""
    trace_seconds: float
    """Wall time of the trace."""


# --- Memory estimates ------------------------------------------------------------------------


class SoftwareStack(_Frozen):
    """What a process holds on a GPU besides the tensors PyTorch's caching allocator serves,
    and the two speed figures that depend on the stack's software (attention on Hopper, and
    attention under ``torch.compile``)."""

    id: str
    """Stack id (``pytorch2-cuda12``)."""
    label: str
    """One line for people."""
    default: bool = False
    """Whether estimates use this stack unless told otherwise."""
    cuda_context_bytes: int
    """CUDA context with the kernels loaded by a training step, outside the allocator."""
    cublas_workspace_bytes: int
    """cuBLAS workspace per (handle, stream), served by the allocator (GPUs other than sm 9.0)."""
    cublas_workspace_sm90_bytes: int
    """The same on compute capability 9.0."""
    cublaslt_workspace_bytes: int
    """cuBLASLt workspace per (handle, stream), served by the allocator."""
    cudnn_workspace_percent: int
    """cuDNN's convolution workspace, allocated through the caching allocator around each
    call, as a percentage of the larger of the convolution's input and output bytes: the
    largest of a step's is added to its peak reserved bytes."""
    nccl_bytes_per_gpu: int
    """NCCL buffers per GPU when more than one GPU trains, outside the allocator."""
    hopper_attention_percent: int = 100
    """The rate of the stack's attention kernels on Hopper (compute capability 9.x), as a
    percentage of the rate a kernel written for Hopper reaches there: 100 where its kernels use
    Hopper's warpgroup matrix instructions, less where they are Ampere's, which Hopper runs
    at a fraction of its tensor peak."""
    compiled_causal_mask: bool = False
    """Whether the stack's transformers builds a dense causal mask while ``torch.compile``
    traces a model (transformers before 5.18), so a compiled step runs masked attention that
    computes every block, where eager passes ``is_causal`` and skips half of them."""
    provenance: dict[str, Provenance] = Field(default_factory=dict)
    """Where each value comes from."""


class EngineMemoryTier(_Frozen):
    """An engine's defaults for GPUs of a range of memory (SGLang's ``ServerArgs`` picks its
    token budget and CUDA-graph batch cap by the GPU's memory)."""

    below_gib: float | None
    """The tier holds GPUs of less than this many GiB (and of at least the previous tier's);
    None: every larger GPU (the last tier)."""
    token_budget: int
    """Tokens one scheduler step holds on these GPUs (SGLang's ``chunked_prefill_size``)."""
    graph_batch: int
    """Largest decode batch replayed as a CUDA graph (``cuda_graph_max_bs``) with fewer
    tensor-parallel GPUs than ``StaticReserve.large_tp_from``."""
    graph_batch_large_tp: int
    """The same with ``StaticReserve.large_tp_from`` GPUs or more."""


class StaticReserve(_Frozen):
    """How an engine whose memory fraction covers the weights and the KV cache only
    (``memory_fraction_of: static``, SGLang's ``mem_fraction_static``) derives that fraction
    from what it keeps back for activations and CUDA graphs, in MiB:
    ``reserved = base + max(token budget, min_budget_tokens) x per_budget_token +
    graph batch x per_graph_batch + GPUs x per_gpu``, at least ``floor`` on GPUs of more
    than ``floor_above_gib``; the fraction is ``round((capacity - reserved) / capacity, 3)``."""

    base_mib: float
    """Kept back on every GPU (the attention backend's metadata)."""
    per_budget_token_mib: float
    """Kept back per token of the step budget (a large prefill's activations)."""
    min_budget_tokens: int
    """The step budget counted at least this many tokens."""
    per_graph_batch_mib: float
    """Kept back per sequence of the largest CUDA-graph batch."""
    per_gpu_mib: float
    """Kept back per tensor-parallel GPU."""
    floor_mib: float
    """The least kept back on a GPU of more than ``floor_above_gib``."""
    floor_above_gib: float
    """Where the floor starts."""
    large_tp_from: int
    """Tensor-parallel GPUs from which the tiers' ``graph_batch_large_tp`` applies."""

    def fraction(
        self, capacity_gib: float, token_budget: int, graph_batch: int, gpus: int
    ) -> float:
        """The engine's memory fraction on a GPU of ``capacity_gib`` (one of ``gpus``)."""
        capacity_mib = capacity_gib * 1024
        reserved = (
            self.base_mib
            + max(token_budget, self.min_budget_tokens) * self.per_budget_token_mib
            + graph_batch * self.per_graph_batch_mib
            + gpus * self.per_gpu_mib
        )
        if capacity_gib > self.floor_above_gib:
            reserved = max(reserved, self.floor_mib)
        return round((capacity_mib - reserved) / capacity_mib, 3)


class ServingEngine(_Frozen):
    """A serving engine's memory policy (``data/v1/stacks``): how it sizes its paged KV cache."""

    id: str
    """Engine id (``vllm``), the value of ``fit --serving``."""
    label: str
    """One line for people, with the version the defaults are from."""
    gpu_memory_utilization: float
    """Fraction of the GPU's total memory the engine may use (weights, activations, KV cache)."""
    block_size_tokens: int
    """Tokens per KV-cache block; a sequence holds whole blocks."""
    profile_tokens: int
    """Tokens of the dummy forward pass whose peak activation the engine subtracts
    (``max_num_batched_tokens``)."""
    prefill_chunk_tokens: int
    """Tokens one scheduler step holds (vLLM's ``max_num_batched_tokens``, TensorRT-LLM's
    ``max_num_tokens``): the running sequences' decode tokens first, then prompt chunks."""
    memory_fraction_of: Literal["total", "free", "static"] = "total"
    """What ``gpu_memory_utilization`` is a fraction of: the card's total (vLLM), what is
    free after the weights and activations (TensorRT-LLM's ``free_gpu_memory_fraction``), or
    the memory free before the weights load, to hold the weights and the KV cache only, the
    rest kept for activations and CUDA graphs (SGLang's ``mem_fraction_static``)."""
    max_sequences: int = 1024
    """Sequences the scheduler runs at once at most (vLLM's ``max_num_seqs``, TensorRT-LLM's
    ``max_batch_size``) on a GPU of ``large_gpu_gib`` or more."""
    max_sequences_small_gpu: int = 1024
    """The same on a smaller GPU (and, for vLLM, on an A100 of any size)."""
    large_gpu_gib: float = 70.0
    """Where the engine's defaults change with the GPU's memory (GiB)."""
    small_gpu_names: tuple[str, ...] = ()
    """Name parts of GPUs that get the small default whatever their memory (vLLM: ``a100``)."""
    token_budget_small_gpu: int | None = None
    """``profile_tokens`` and ``prefill_chunk_tokens`` on a small GPU (vLLM's
    ``max_num_batched_tokens`` there); None: the same on every GPU."""
    cuda_graphs_decode: bool = True
    """Whether decode steps replay captured CUDA graphs (one launch per step, no per-operator
    host dispatch)."""
    chunked_prefill: bool = True
    """Whether the engine splits a prompt over steps by default (chunked prefill). False: a
    prompt runs whole in one step, beside the decodes, when the step's token budget holds it,
    and one longer than the budget is refused unless chunked prefill is switched on."""
    memory_tiers: tuple[EngineMemoryTier, ...] = ()
    """Defaults by the GPU's memory (SGLang); empty: ``large_gpu_gib`` and the small-GPU
    fields decide."""
    static_reserve: StaticReserve | None = None
    """How the memory fraction follows from the GPU (``memory_fraction_of: static``); None:
    ``gpu_memory_utilization`` on every GPU."""
    cuda_graph_max_batch: int | None = None
    """Largest decode batch replayed as a CUDA graph on this GPU (set by ``on_gpu`` from the
    tiers); None: every decode batch, as far as the engine's notes say."""
    provenance: dict[str, Provenance] = Field(default_factory=dict)
    """Where each value comes from."""

    @model_validator(mode="after")
    def _tiers_cover_every_gpu(self) -> ServingEngine:
        bounds = [t.below_gib for t in self.memory_tiers]
        if bounds and (
            bounds[-1] is not None
            or None in bounds[:-1]
            or bounds[:-1] != sorted(b for b in bounds[:-1] if b is not None)
        ):
            raise ValueError(
                "memory_tiers must rise by below_gib and end with one of below_gib null"
            )
        if self.memory_fraction_of == "static" and self.static_reserve is None:
            raise ValueError("memory_fraction_of static needs a static_reserve")
        return self

    def runs_prompts_whole(self, context: int) -> bool:
        """Whether the engine, at its defaults, runs a prompt of ``context`` tokens whole in
        one step: it does not chunk prompts and the step's budget holds this one (a longer
        one needs chunked prefill switched on)."""
        return not self.chunked_prefill and context <= self.prefill_chunk_tokens

    def is_small_gpu(self, capacity_gib: float, gpu_name: str) -> bool:
        """Whether the engine's defaults for small GPUs apply to a GPU of ``capacity_gib``
        named ``gpu_name``."""
        named = any(part in gpu_name.lower() for part in self.small_gpu_names)
        return capacity_gib < self.large_gpu_gib or named

    def on_gpu(self, capacity_gib: float, gpu_name: str, gpus: int = 1) -> ServingEngine:
        """The engine as it runs on a GPU of ``capacity_gib`` named ``gpu_name``, one of
        ``gpus`` tensor-parallel ones: its token budget (profiling pass and step) and its cap
        on running sequences are that GPU's defaults; an engine with memory tiers (SGLang)
        also takes its CUDA-graph batch cap and, with a static reserve, its memory fraction
        from them. Resolving again for the same GPU changes nothing."""
        if self.memory_tiers:
            tier = next(
                t for t in self.memory_tiers if t.below_gib is None or capacity_gib < t.below_gib
            )
            reserve = self.static_reserve
            large_tp = reserve is not None and gpus >= reserve.large_tp_from
            graph = tier.graph_batch_large_tp if large_tp else tier.graph_batch
            tiered: dict[str, Any] = {
                "profile_tokens": tier.token_budget,
                "prefill_chunk_tokens": tier.token_budget,
                "cuda_graph_max_batch": graph,
            }
            if reserve is not None:
                tiered["gpu_memory_utilization"] = reserve.fraction(
                    capacity_gib, tier.token_budget, graph, gpus
                )
            return self.model_copy(update=tiered)
        if not self.is_small_gpu(capacity_gib, gpu_name):
            return self
        budget = self.token_budget_small_gpu
        update: dict[str, int] = {"max_sequences": self.max_sequences_small_gpu}
        if budget is not None:
            update |= {"profile_tokens": budget, "prefill_chunk_tokens": budget}
        return self.model_copy(update=update)


class ServingEstimate(_Frozen):
    """How many sequences a serving engine with a paged KV cache holds at once on one GPU (or
    on ``gpus`` tensor-parallel ones; every byte figure is then one GPU's share).

    ``kv_cache_budget_bytes = gpu_memory_utilization x capacity - weights - activation peak -
    non-torch`` (vLLM; TensorRT-LLM's fraction is of what the rest leaves free, SGLang's of
    the memory free before the weights load, for the weights and the KV cache:
    ``memory_fraction_of``); the budget is cut into blocks of ``block_size_tokens`` tokens and
    every sequence of ``tokens_per_sequence`` holds whole blocks.
    """

    engine: str
    """Engine id (``vllm``)."""
    engine_label: str
    """The engine and the version its defaults come from."""
    gpu_memory_utilization: float
    """The engine's memory fraction on this GPU (of what: ``memory_fraction_of``)."""
    memory_fraction_of: Literal["total", "free", "static"] = "total"
    """What the fraction is of (``ServingEngine.memory_fraction_of``)."""
    engine_budget_bytes: int
    """What the engine takes: weights, activations, non-torch memory and the KV cache
    (SGLang's: the weights and the KV cache)."""
    weights_bytes: int
    """Parameters and buffers in the serving dtype (from the profile), on one GPU."""
    activation_peak_bytes: int
    """Peak allocator bytes of the engine's profiling pass (one prefill of ``profile_tokens``
    tokens) less its weights and KV cache: activations, temporaries, cuBLAS workspaces."""
    profile_tokens: int
    """Tokens of that profiling pass (``max_num_batched_tokens``)."""
    non_torch_bytes: int
    """Memory outside PyTorch's allocator: the CUDA context of the software stack (and its
    NCCL buffers with more than one GPU)."""
    kv_cache_budget_bytes: int
    """What remains for KV-cache blocks (negative: the model does not load)."""
    kv_bytes_per_token: int
    """Keys and values of one token over all layers on one GPU: ``layers x 2 x kv_heads x
    head_dim x dtype bytes`` (of its share of the KV heads when tensor parallel)."""
    block_size_tokens: int
    """Tokens per block."""
    kv_blocks: int
    """Whole blocks in the budget."""
    tokens_per_sequence: int
    """Context plus new tokens of one sequence."""
    blocks_per_sequence: int
    """Blocks one sequence holds (rounded up)."""
    max_concurrency: int
    """Sequences of ``tokens_per_sequence`` whose KV cache fits at once (0: none), at most the
    engine's cap on running sequences on this GPU."""
    assumptions: tuple[str, ...]
    """What the answer assumes, in words."""
    gpus: int = 1
    """GPUs serving the model together, tensor parallel."""

    def holds_words(self) -> str:
        """What limits the sequences, in words: the KV cache, or the scheduler's cap where
        the cache would hold more."""
        held = self.kv_blocks // max(self.blocks_per_sequence, 1)
        what = f"{self.max_concurrency} sequences of {self.tokens_per_sequence:,} tokens"
        if held > self.max_concurrency:
            return f"its scheduler runs at most {what} at once (its KV cache would hold {held})"
        return f"its KV cache holds {what}"


def decode_requests_per_s(concurrency: int, ttft_s: float, tpot_s: float, new_tokens: int) -> float:
    """Requests per second of ``concurrency`` sequences each generating ``new_tokens`` tokens,
    by Little's law: ``concurrency / latency``, a request's latency being its TTFT and then
    ``new_tokens - 1`` decode steps (a new request taking each finished one's place)."""
    return concurrency / (ttft_s + max(new_tokens - 1, 0) * tpot_s)


class ServingSpeedPoint(_Frozen):
    """A serving engine's latencies at one concurrency (``ServingSpeed.by_concurrency``)."""

    concurrency: int
    """Requests in the engine at once."""
    ttft_s: float
    """Time to first token of one request's prompt, prefilled in chunks beside the other
    sequences' decodes, s. Prefill-only requests (``new_tokens`` 0): the request's latency."""
    tpot_s: float | None
    """Time per output token: a step of the steady state, every running sequence's decode
    token with the arriving requests' prompts beside them, s. None for prefill-only requests,
    which generate no token."""
    output_tokens_per_s: float
    """``concurrency / tpot_s`` (less where the step budget holds the prompts back): output
    tokens per second over all sequences; 0 for prefill-only requests, which generate none
    (see ``requests_per_s``)."""
    requests_per_s: float | None = None
    """Requests completed per second (``decode_requests_per_s``); of prefill-only requests,
    prompt tokens per second / prompt tokens. None in answers from before it."""
    prompt_tokens_per_s: float | None = None
    """Prompt tokens per second, ``requests_per_s x context``. None in answers from before
    it."""


class ServingBenchmark(_Frozen):
    """What a closed-loop benchmark of fixed-length requests would report
    (``ServingSpeed.benchmark``, ``whichgpu.estimate.engine_run``): ``requests`` prompts sent
    so that ``concurrency`` are in flight (``vllm bench serve --max-concurrency C --num-prompts
    N --request-rate inf``), simulated step by step, the first wave arriving together."""

    requests: int
    """Prompts sent in all."""
    concurrency: int
    """Requests the client keeps in flight."""
    running_limit: int
    """The most sequences the engine runs at once (its scheduler's cap or its KV cache)."""
    mean_ttft_s: float
    """Time to first token, mean over the requests: arrival to the end of the step that
    finishes the prompt (waiting for a slot and for the token budget included), s."""
    median_ttft_s: float
    """Time to first token, median over the requests, s."""
    settled_mean_ttft_s: float | None
    """Time to first token, mean over the requests after the first wave (the first
    ``concurrency``, which arrive together): what a long run settles to, s; None when every
    request is in the first wave."""
    settled_median_ttft_s: float | None
    """Time to first token, median over the requests after the first wave, s."""
    mean_tpot_s: float | None
    """Time per output token after the first, ``(end - first token) / (new_tokens - 1)``,
    mean over the requests, s; None when each generates one token."""
    median_tpot_s: float | None
    """Time per output token, median over the requests, s."""
    output_tokens_per_s: float
    """``requests x new_tokens`` over the run's duration."""
    duration_s: float
    """From the first request's arrival to the last one's end, s."""
    steps: int
    """Engine steps the run took."""


class ServingSpeed(_Frozen):
    """How fast a serving engine (CUDA graphs, paged KV cache, chunked prefill) serves a
    language model on one GPU or ``gpus`` tensor-parallel ones (``predict --serving``).

    A decode step is one graph launch whose time is the sum of its kernels, each at its
    roofline ``max(bytes / achievable bandwidth, FLOPs / achievable tensor rate)``
    (``whichgpu.estimate.engine_speed``), plus the tensor-parallel all-reduces; the prompt is
    prefilled in chunks of the engine's token budget.

    Prefill-only requests (``new_tokens`` 0: embedding, classification, scoring, reranking)
    run no decode step: the decode fields (``tpot_s``, ``decode_bound``, ``decode_bytes``,
    ``decode_flops``, ``bandwidth_bound_tpot_s``, ``usd_per_million_output_tokens``) are None,
    ``output_tokens_per_s`` is 0, ``ttft_s`` is the request's latency and the throughput is
    ``requests_per_s`` and ``prompt_tokens_per_s``.
    """

    engine: str
    """Engine id (``vllm``)."""
    engine_label: str
    """The engine and the version its defaults come from."""
    gpus: int
    """GPUs serving the model together, tensor parallel."""
    concurrency: int
    """Sequences served at once (asked, or the most the engine's KV cache holds)."""
    context: int
    """Prompt tokens per request."""
    new_tokens: int
    """Generated tokens per request."""
    ttft_s: float
    """Time to first token at ``concurrency``, s. Prefill-only requests: the request's
    latency, ``concurrency / requests_per_s`` (Little's law; queueing for the engine's token
    budget included)."""
    tpot_s: float | None
    """Time per output token at ``concurrency`` (a step of the steady state: the decodes and
    the arriving prompts beside them), s; None for prefill-only requests."""
    output_tokens_per_s: float
    """``concurrency / tpot_s`` (less where the step budget holds the prompts back), over all
    GPUs serving the model; 0 for prefill-only
    requests, which generate none (their rate is ``requests_per_s``, ``prompt_tokens_per_s``)."""
    decode_bound: Literal["memory", "compute"] | None
    """What limits the decode step: the bytes it reads or its FLOPs; None for prefill-only
    requests."""
    decode_bytes: int | None
    """Bytes one GPU reads in a decode step: its weights once, every sequence's KV cache at
    the generation's average length (``context + new_tokens / 2``), the activations; None
    for prefill-only requests."""
    decode_flops: float | None
    """FLOPs of one GPU in a decode step; None for prefill-only requests."""
    bandwidth_bound_tpot_s: float | None
    """The decode step at the full DRAM bandwidth (``decode_bytes / bandwidth``), s: the floor
    no engine goes under; None for prefill-only requests."""
    requests_per_s: float | None = None
    """Requests completed per second at ``concurrency``, over all GPUs: of a decode run
    ``decode_requests_per_s`` (Little's law); of prefill-only requests, the prompt tokens the
    engine's steps prefill per second (``min(token budget, concurrency x context)`` tokens
    per step) / ``context``. None in answers from before it."""
    prompt_tokens_per_s: float | None = None
    """``requests_per_s x context``: prompt tokens per second. None in answers from before
    it."""
    step_bound: Literal["memory", "compute"] | None = None
    """Prefill-only requests: what limits the engine's prefill step, the bytes it reads or its
    FLOPs; None for decode runs (see ``decode_bound``)."""
    max_concurrency: int | None = None
    """The most sequences the engine's KV cache holds (``fit --serving``), None if unknown."""
    by_concurrency: tuple[ServingSpeedPoint, ...] = ()
    """TTFT, TPOT and output tokens/s as the concurrency doubles (1, 2, 4 … and the asked
    one), up to the KV limit."""
    target_tpot_s: float | None = None
    """``--tpot-ms`` as seconds, when given."""
    target_ttft_s: float | None = None
    """``--ttft-ms`` as seconds, when given."""
    max_concurrency_within_targets: int | None = None
    """The largest concurrency (within the KV limit) whose TPOT and TTFT meet the targets;
    0 when none does; None without targets."""
    usd_per_gpu_hour: float | None = None
    """The catalog's cheapest on-demand cloud rate per GPU-hour for ``gpus`` such GPUs in one
    machine; None without a price."""
    usd_per_million_output_tokens: float | None = None
    """``usd_per_gpu_hour x gpus / (output tokens per hour) x 10^6`` at ``concurrency``
    (the engine kept busy); None without a price and for prefill-only requests."""
    usd_per_million_prompt_tokens: float | None = None
    """Prefill-only requests: ``usd_per_gpu_hour x gpus / (prompt tokens per hour) x 10^6``
    at ``concurrency`` (kept busy); None without a price and for decode runs (whose cost is
    per output token)."""
    usd_per_thousand_requests: float | None = None
    """``usd_per_gpu_hour x gpus / (requests per hour) x 10^3`` at ``concurrency`` (kept
    busy); None without a price."""
    price_source: str | None = None
    """Which price it is (provider, date, source), in words."""
    burst_ttft_s: float | None = None
    """The ``concurrency`` requests arriving together instead (an offline batch): the time to
    first token of the last of them, the prefill of every prompt in the engine's token
    budget. None for prefill-only requests and answers from before it."""
    burst_tpot_s: float | None = None
    """The same burst: a decode step of all of them together, no prompt beside it."""
    burst_output_tokens_per_s: float | None = None
    """The same burst: its generated tokens over its wall time, prefill included."""
    benchmark: ServingBenchmark | None = None
    """With ``requests`` asked: a closed-loop benchmark of that many requests at
    ``concurrency``, as a benchmark client reports it (mean and median TTFT and TPOT, output
    tokens/s over the run). None unless asked."""
    assumptions: tuple[str, ...] = ()
    """What the answer assumes, in words."""

    @model_validator(mode="before")
    @classmethod
    def _per_request(cls, data: Any) -> Any:
        """A decode run's ``requests_per_s``, ``prompt_tokens_per_s`` and
        ``usd_per_thousand_requests`` where not given (an answer from before them, or one
        built without them): derived from its latencies, lengths and price."""
        if not isinstance(data, dict):
            return data
        out = dict(data)
        new, ttft, tpot = out.get("new_tokens"), out.get("ttft_s"), out.get("tpot_s")
        if out.get("requests_per_s") is None and new and ttft and tpot is not None:
            out["requests_per_s"] = decode_requests_per_s(
                out.get("concurrency") or 1, ttft, tpot, new
            )
        rps, context = out.get("requests_per_s"), out.get("context")
        if out.get("prompt_tokens_per_s") is None and rps and context:
            out["prompt_tokens_per_s"] = rps * context
        hourly, gpus = out.get("usd_per_gpu_hour"), out.get("gpus") or 1
        if out.get("usd_per_thousand_requests") is None and hourly is not None and rps:
            out["usd_per_thousand_requests"] = hourly * gpus / (rps * 3600) * 1e3
        return out


MemoryCategory = Literal[
    "weights", "gradients", "optimizer", "activations", "temporaries", "overhead"
]


class MemoryEstimate(_Tabular):
    """Peak GPU memory of a workload step on one GPU, and the largest batch that fits.

    Every byte figure is what one process on one GPU holds. ``device_total_bytes`` is what
    ``nvidia-smi`` would show for the process at its peak; it must not exceed
    ``capacity_bytes`` for the step to fit.
    """

    gpu: str
    """Catalog id of the GPU."""
    gpu_name: str
    """Its name."""
    workload: str
    """Workload estimated."""
    run: RunConfig
    """Run configuration (batch size and sequence length resolved)."""
    batch_size: int
    """Samples per step the figures below are for (the largest that fits, unless given).
    Inference of a language model: the concurrency, sequences served at once."""
    seq_len: int | None
    """Sequence length (sequence models). Inference of a language model: the context (prompt)
    tokens; the KV cache holds ``run.new_tokens`` more."""
    fits: bool
    """Whether ``batch_size`` fits."""
    max_batch_size: int
    """Largest batch that fits at ``seq_len`` (0: not even one sample). Inference of a
    language model: the largest concurrency at that context."""
    max_batch_capped: bool
    """True when the search stopped at its upper limit: more may fit."""
    batch_given: bool = False
    """True when the caller gave the batch; False when ``batch_size`` is the largest that fits
    (1 when none does)."""
    gpus: int = 1
    """GPUs working together; every byte figure here is per GPU. Training: ``batch_size`` is
    the batch of one GPU (the global batch is ``gpus`` times larger). Inference: one model
    served tensor parallel, ``batch_size`` sequences in all."""
    sharding: Sharding = "ddp"
    """What the GPUs split between them (``ddp``: nothing; see ``whichgpu.estimate.sharding``)."""
    max_seq_len: int | None = None
    """Largest sequence length that fits at ``batch_size`` (0: not even one token). Searched
    for sequence models when a batch size is given; None otherwise."""
    max_seq_len_capped: bool = False
    """True when ``max_seq_len`` is the model's position limit (or the search's): the memory
    would take longer sequences."""
    fits_at_seq_len: int | None = None
    """When not even batch 1 fits at ``seq_len``: the longest shorter length among 64, 96, 128,
    192, 256, … (powers of two and 1.5 times them) at which batch 1 fits; 0 when none does.
    None when it fits, for models without sequences, and where it was not searched."""
    peak_allocated_bytes: int
    """Predicted ``torch.cuda.max_memory_allocated``."""
    peak_reserved_bytes: int
    """Predicted ``torch.cuda.max_memory_reserved`` (allocator segments)."""
    device_total_bytes: int
    """Reserved + CUDA context + workspaces outside the allocator + communication buffers."""
    capacity_bytes: int
    """Memory CUDA reports for the GPU (below the marketed size)."""
    capacity_note: str
    """Where ``capacity_bytes`` comes from (catalog measurement, or how it was derived)."""
    headroom_bytes: int
    """``capacity_bytes - device_total_bytes`` (negative: does not fit)."""
    next_batch_device_total_bytes: int | None
    """Device total at ``max_batch_size + 1``: the margin to the next size."""
    breakdown: dict[MemoryCategory, int]
    """Bytes by category at the peak; sums to ``device_total_bytes``."""
    overheads: dict[str, int]
    """The parts of ``overhead`` that are not allocator rounding and caching."""
    assumptions: tuple[str, ...]
    """What the estimate assumes, in words."""
    method: str
    """``stored profile`` (no torch) or ``traced`` (this machine traced the model)."""
    kv_cache_bytes: int | None = None
    """Inference of a language model: the static KV cache at ``batch_size`` that this GPU
    holds (its share of the KV heads when ``gpus`` > 1; part of ``activations`` in
    ``breakdown``); None otherwise."""
    kv_bytes_per_token: int | None = None
    """Inference of a language model: KV-cache bytes per token of one sequence on this GPU."""
    serving: ServingEstimate | None = None
    """``fit --serving``: the serving engine's KV-cache budget and concurrency; None otherwise."""
    paged_state_bytes: int = 0
    """Optimizer state in unified memory (``--optimizer paged-adamw-8bit``): resident in the
    GPU's free memory while there is room, paged to host memory when not; not in
    ``device_total_bytes`` (nor in ``breakdown``). 0 for other optimizers."""
    experts_per_layer: int | None = None
    """Training a mixture of experts: its routed experts per layer (from its config), which
    ``--expert-parallel`` can spread over the data-parallel copies; None for a dense model."""
    paged_out_bytes: int = 0
    """The part of ``paged_state_bytes`` that cannot stay resident at this batch:
    ``max(0, paged_state_bytes - max(headroom_bytes, 0))``; each optimizer step pages it in
    and out again over PCIe."""


# --- Validation ------------------------------------------------------------------------------

Verdict = Literal["exact", "conservative", "too high", "no reference", "skipped"]


class MemoryValidationCase(_Frozen):
    """One measured largest batch against the prediction."""

    reference: str
    """Where the measurement comes from (``lambda2020``)."""
    model: str
    """Model as the reference names it."""
    workload: str
    """The whichgpu workload that stands for it."""
    gpu: str
    """Catalog id of the GPU."""
    unit: str
    """What the batch counts (images, sequences, tokens)."""
    measured_max_batch: int
    """The reference's largest batch (0: did not fit at all)."""
    predicted_max_batch: int
    """whichgpu's largest batch, in the reference's unit."""
    predicted_on_grid: int
    """The prediction rounded down to the sizes the reference tried."""
    steps: int
    """Grid steps from the measurement to the prediction (negative: conservative)."""
    verdict: Verdict
    """``exact``, ``conservative`` (below the measurement) or ``too high``."""
    note: str = ""
    """Why a case was skipped, or what is special about it."""
    framework: str = ""
    """The framework of the code the reference ran."""
    batches_set_by_hand: bool = False
    """The reference's batches are round values set by hand, not a search: a prediction above
    one is not shown to be too high."""


class MeasuredMemoryCase(_Frozen):
    """One of whichgpu's own measurements (``whichgpu bench``, shipped in
    ``validate/data/measured``) against the prediction of the same run.

    On a CUDA GPU the measured numbers are PyTorch's peak allocated and reserved bytes and
    the memory NVML saw in use; the predictions are ``fit``'s for that catalog GPU. On the CPU
    there is no caching allocator: the measured number is the peak of live tensor bytes
    (``bench.tensor_memory``), the prediction the traced step's (``ScalableProfile.
    live_peak_bytes``), and reserved and device memory do not apply.
    """

    result_id: str
    """Id of the measurement (``whichgpu results show``)."""
    workload: str
    """Workload measured."""
    device_name: str
    """The device as the measurement names it."""
    device_kind: str
    """``cuda``, ``cpu``, ``mps``."""
    gpu: str | None
    """Catalog id of the GPU (None off CUDA)."""
    run: RunConfig
    """The run measured (its batch size and sequence length set)."""
    measured_allocated_bytes: int
    """Peak allocated (CUDA) or live tensor (CPU) bytes measured."""
    predicted_allocated_bytes: int
    """The prediction of the same."""
    measured_reserved_bytes: int | None = None
    """Peak reserved bytes measured (CUDA)."""
    predicted_reserved_bytes: int | None = None
    """Peak reserved bytes predicted (CUDA)."""
    measured_device_bytes: int | None = None
    """Device memory in use that NVML saw (CUDA)."""
    predicted_device_bytes: int | None = None
    """``fit``'s device total (CUDA)."""
    memory_limit_bytes: int | None = None
    """The cap the largest-batch search ran under, if any."""
    measured_max_batch: int | None = None
    """Largest batch the search found (None: not searched)."""
    predicted_max_batch: int | None = None
    """Largest batch predicted for the same device (and cap)."""
    max_batch_verdict: Verdict | None = None
    """``exact``, ``conservative`` or ``too high``."""
    note: str = ""
    """What the comparison assumes or why part of it is missing."""


ReferenceSource = Literal[
    "lambda2020", "own", "h200-2026-11", "llm-foundry", "serving", "parallel", "recipes"
]
"""A reference ``validate`` compares with: Lambda's 2020 table, whichgpu's own bench results
(``validate/data/measured/*.json``), the measurements on an NVIDIA H200 of 2026-11-26 (an
independent training loop), MosaicML llm-foundry's published MPT training benchmarks,
published serving measurements of vLLM and TensorRT-LLM (``validate/data/serving``),
published tensor- and pipeline-parallel training runs of NeMo and Megatron-Bridge
(``validate/data/parallel``), or published runs of today's training recipes: compiled,
selectively checkpointed, FSDP2, float8 (``validate/data/recipes``)."""


class SourceSummary(_Frozen):
    """One line of a validation's closing summary: one reference's error on one quantity.

    Errors are signed fractions, ``predicted / measured - 1`` (for speeds: positive means
    predicted faster; for memory and batches: positive means predicted larger)."""

    source: ReferenceSource
    """The reference."""
    quantity: str
    """What is compared (``peak reserved``, ``largest batch``, ``speed`` …)."""
    cases: int
    """Cases with both a measurement and a prediction."""
    mean_abs_error: float | None = None
    """Mean absolute error (MAPE), fraction (None for counts only)."""
    mean_error: float | None = None
    """Mean signed error (the bias), fraction."""
    worst_error: float | None = None
    """The signed error of largest magnitude, fraction."""
    note: str = ""
    """Counts that matter beside the errors (``2 would run out of memory`` …)."""


class ReferenceMemoryCase(_Frozen):
    """One training run measured on a GPU outside whichgpu's harness against ``fit`` of the same
    run on that catalog GPU: peak memory at the measured batch, or the largest batch."""

    source: ReferenceSource
    """The reference."""
    case: str
    """The case as the reference names it (``gpt2 bf16 s1024 b8``)."""
    workload: str
    """The whichgpu workload predicted."""
    gpu: str
    """Catalog id of the GPU."""
    run: RunConfig
    """The run predicted (batch size unset for a largest-batch case)."""
    measured_allocated_bytes: int | None = None
    """Peak allocated bytes (``torch.cuda.max_memory_allocated``)."""
    predicted_allocated_bytes: int | None = None
    """``fit``'s peak allocated bytes."""
    measured_reserved_bytes: int | None = None
    """Peak reserved bytes (``torch.cuda.max_memory_reserved``)."""
    predicted_reserved_bytes: int | None = None
    """``fit``'s peak reserved bytes."""
    measured_device_bytes: int | None = None
    """Device memory in use that NVML saw right after the steps (current, not peak)."""
    predicted_device_bytes: int | None = None
    """``fit``'s device total (reserved + CUDA context + workspaces)."""
    reserved_error: float | None = None
    """``predicted_reserved / measured_reserved - 1``."""
    measured_max_batch: int | None = None
    """The largest batch that ran (largest-batch cases)."""
    predicted_max_batch: int | None = None
    """``fit``'s largest batch."""
    would_oom: bool = False
    """The predicted largest batch is above the measured one: following ``fit`` runs out of
    memory."""
    note: str = ""
    """What the comparison assumes, or why part of it is missing."""


class FsdpFitCase(_Frozen):
    """One published multi-GPU training run (it ran) against ``fit``'s answer for one of its
    GPUs: does the run's micro-batch fit, sharded as the run was?"""

    source: ReferenceSource
    """The reference."""
    model: str
    """The model as the reference names it (``mpt-7b``)."""
    gpu: str
    """Catalog id of the GPU."""
    run: RunConfig
    """The run asked about (micro-batch per GPU, sequence length, GPU count, sharding,
    checkpointing)."""
    fits: bool | None
    """``fit``'s answer at the run's micro-batch (None: no answer, see ``note``)."""
    predicted_max_batch: int | None = None
    """The largest micro-batch ``fit`` allows per GPU."""
    predicted_device_bytes: int | None = None
    """``fit``'s device total per GPU at the run's micro-batch."""
    capacity_bytes: int | None = None
    """The memory ``fit`` compares it with."""
    note: str = ""
    """Why there is no answer, or what the comparison assumes."""


class ReferenceThroughputCase(_Frozen):
    """One published or measured training speed against ``predict`` of the same run."""

    source: ReferenceSource
    """The reference."""
    case: str
    """The case as the reference names it."""
    workload: str
    """The whichgpu workload predicted."""
    gpu: str
    """Catalog id of the GPU."""
    run: RunConfig
    """The run predicted."""
    quantity: str
    """What ``measured`` and ``predicted`` count: ``s/step``, ``tokens/s per GPU``, or a
    serving engine's ``output tokens/s``, ``TPOT ms`` or ``TTFT ms``."""
    measured: float
    """Measured value."""
    predicted: float | None
    """Predicted value (None: no prediction, see ``note``)."""
    error: float | None = None
    """Speed error: ``predicted speed / measured speed - 1`` (for times: step, TPOT, TTFT,
    ``measured / predicted - 1``); positive means predicted faster."""
    measured_mfu: float | None = None
    """Model FLOPs utilisation the reference states or implies."""
    predicted_mfu: float | None = None
    """``predict``'s model FLOPs utilisation."""
    fits: bool = True
    """Whether ``fit`` says the run fits; when not, ``predict`` gives no speed and the
    prediction is the predictor's time of the step as if it did."""
    note: str = ""
    """What the comparison assumes, or why there is no prediction."""
    publication: str = ""
    """Where a reference gathers several publications (``serving``), the one the case is
    from (its ``source_id`` in the reference's data README); else empty."""


class MemoryValidation(_Frozen):
    """``whichgpu validate memory``: every case and the summary."""

    cases: tuple[MemoryValidationCase, ...]
    """Each compared (model, GPU)."""
    assumptions: tuple[str, ...]
    """What the comparison assumes about the references."""
    compared: int
    """Cases with a verdict."""
    exact: int
    """Cases predicted exactly (on the grid)."""
    conservative_by_one: int
    """Cases one grid step below the measurement."""
    conservative_more: int
    """Cases more than one step below."""
    too_high: int
    """Cases above the measurement — the failure that matters most."""
    too_high_evidenced: int = 0
    """Of ``too_high``, those the reference can show: PyTorch code (what whichgpu models) with
    batches from a search, or a model the reference could not run at all."""
    measured: tuple[MeasuredMemoryCase, ...] = ()
    """whichgpu's own measurements against the predictions (``MeasuredMemoryCase``)."""
    gpu_runs: tuple[ReferenceMemoryCase, ...] = ()
    """Training runs measured on GPUs outside whichgpu's harness (the H200 measurements)."""
    fsdp_runs: tuple[FsdpFitCase, ...] = ()
    """Published multi-GPU runs (llm-foundry) against ``fit``'s answer."""
    recipe_runs: tuple[ReferenceMemoryCase, ...] = ()
    """Published runs of today's training recipes (``validate.recipes``): peak reserved
    memory per GPU against ``fit``'s."""
    sources: tuple[ReferenceSource, ...] = ()
    """The references compared (empty in results written before references could be
    chosen: all of them)."""
    summaries: tuple[SourceSummary, ...] = ()
    """Per reference and quantity: the error over its cases."""


# --- Throughput ------------------------------------------------------------------------------


GENERATED_RATE_NOTE = (
    "tokens/s of a language model's inference = tokens generated per second over whole "
    "requests, the prefill of the context included: concurrency x new tokens / (prefill + new "
    "tokens x decode step); the decode alone runs faster (concurrency / the per-token time)"
)
"""What an inference rate in tokens/s counts, in the words every view and note uses (it is
``estimate.prediction``'s: a request batch is one prefill and one decode step per new token)."""


class ThroughputEstimate(_Tabular):
    """Predicted throughput of a workload on a GPU (or N data parallel), with its band.

    Training: ``step_time_s`` is one step. Inference of a language model: ``step_time_s`` is
    one request batch (the prefill and every decode step) and ``throughput`` the tokens it
    generates per second, the prefill's time included (``GENERATED_RATE_NOTE``); the decode
    alone is ``decode_step_s``.
    """

    gpu: str
    """Catalog id of the GPU."""
    gpu_name: str
    """Its name."""
    workload: str
    """Workload predicted."""
    run: RunConfig
    """Run configuration (batch size and sequence length resolved)."""
    batch_size: int
    """Samples per step per GPU (the largest that fits, unless given)."""
    seq_len: int | None
    """Sequence length (sequence models)."""
    fits: bool
    """Whether ``batch_size`` fits in memory (``whichgpu fit``); no speed is given otherwise."""
    n_gpus: int
    """GPUs training together (data parallel)."""
    step_time_s: float | None
    """Predicted time of one training step, s (None when it does not fit); with gradient
    accumulation, one optimizer step: ``run.grad_accum`` micro-steps and the update."""
    throughput: float | None
    """Predicted units per second over all GPUs (None when it does not fit). Inference of a
    language model: tokens generated per second over whole requests, the prefill included
    (``GENERATED_RATE_NOTE``)."""
    throughput_unit: str
    """``images/s``, ``tokens/s``, ``sequences/s`` or ``samples/s``."""
    low: float | None
    """Lower end of the band."""
    high: float | None
    """Upper end of the band."""
    band: float
    """Relative half-width of the band (validation error of this workload type)."""
    relative_band: float | None = None
    """Relative error against another GPU's prediction of the same run, what ranking two GPUs
    risks: the leave-one-GPU-out band for a measured workload; for one never measured, whose
    error is mostly shared by every GPU, the error left once one GPU is measured (the
    calibrated band). None: not known (``band`` then stands in)."""
    scaling_efficiency: float | None
    """Throughput over N x one GPU's (None for one GPU)."""
    link: str | None = None
    """N GPUs: the link they exchange gradients over, in words (None for one GPU)."""
    mfu: float | None
    """Model FLOPs utilisation: step FLOPs / step time over the peak of the run's precision.
    The step's FLOPs are those it runs, as the bench's FLOP counter counts them: a checkpointed
    step's recomputation is counted (what is often called hardware FLOPs utilisation), so it
    reads higher than an MFU that counts the model's FLOPs once."""
    time_shares: dict[str, float]
    """Share of the step bound by ``matrix`` engines, ``memory`` bandwidth, ``launch``, and on
    N GPUs the gradient ``exchange`` that does not hide behind backward."""
    calibrated_on: str | None = None
    """When corrected by a measurement of the same run on one GPU (``--calibrate``): which."""
    speed_unknown: str | None = None
    """Why the speed cannot be predicted on this GPU (a figure the catalog lacks), when a GPU
    named in the question cannot be timed; ``throughput`` is then None."""
    global_batch_size: int | None = None
    """Training: samples per optimizer step over all GPUs, ``batch_size`` (the micro-batch of
    each GPU) x ``run.grad_accum`` x ``n_gpus``; None for inference."""
    micro_step_s: float | None = None
    """Training with gradient accumulation: time of one micro-step (forward and backward of
    ``batch_size`` samples, no update), s; None otherwise."""
    prefill_s: float | None = None
    """Inference of a language model: time of the prompt's prefill (time to first token), s."""
    decode_step_s: float | None = None
    """Inference of a language model: time of one decode step (time per output token), s."""
    serving_speed: ServingSpeed | None = None
    """``--serving ENGINE``: the engine's TTFT, TPOT, output tokens/s and cost per million
    output tokens (the eager fields above stay plain PyTorch generation's)."""
    tensor_flops_share: float
    """Share of the FLOPs on tensor cores."""
    assumptions: tuple[str, ...]
    """What the prediction assumes."""
    method: str
    """How the step was obtained (stored profile / traced) and the constants' provenance."""

    @property
    def ranking_band(self) -> float:
        """``relative_band``, or ``band`` where it is not known."""
        return self.band if self.relative_band is None else self.relative_band

    @staticmethod
    def merged_assumptions(estimates: Sequence[ThroughputEstimate]) -> tuple[str, ...]:
        """The assumptions of several GPUs' predictions, each once: those every GPU shares,
        then the others after the names of the GPUs they hold for."""
        if not estimates:
            return ()
        shared = [a for a in estimates[0].assumptions if all(a in e.assumptions for e in estimates)]
        holders: dict[str, list[str]] = {}
        for e in estimates:
            for a in e.assumptions:
                if a not in shared:
                    holders.setdefault(a, []).append(e.gpu_name)
        return (*shared, *(f"{', '.join(names)}: {a}" for a, names in holders.items()))


class ErrorStats(_Frozen):
    """Relative errors of one predictor over a set of cases."""

    method: str
    """Predictor or baseline."""
    mape: float
    """Mean absolute percentage error (fraction)."""
    median: float
    """Median absolute error (fraction)."""
    p90: float
    """90th percentile of the absolute error (fraction)."""
    cases: int
    """Cases counted."""


class ThroughputValidationCase(_Frozen):
    """One measured throughput against the out-of-sample predictions."""

    model: str
    """Model as the reference names it."""
    workload: str
    """The workload that stands for it."""
    gpu: str
    """Catalog id."""
    unit: str
    """Throughput unit of the reference."""
    measured: float
    """Measured throughput."""
    leave_gpu_out: float
    """Predicted with constants fitted without this GPU."""
    leave_model_out: float
    """Predicted with constants fitted without this model."""
    bandwidth_baseline: float
    """Mean of the other GPUs' measurements scaled by bandwidth."""


class MeasuredThroughputCase(_Frozen):
    """One of whichgpu's own GPU measurements (``whichgpu bench`` on a catalog GPU, shipped in
    ``validate/data/measured``) against ``predict`` of the same run on the same GPU.

    The predictor's constants are fitted on the Lambda 2020 table only, so every such case is
    out of sample.
    """

    result_id: str
    """Id of the measurement."""
    workload: str
    """Workload measured."""
    gpu: str
    """Catalog id of the GPU measured."""
    run: RunConfig
    """The run measured (batch size, sequence length, GPU count set)."""
    unit: str
    """Throughput unit (``images/s``, ``tokens/s`` …)."""
    measured: float
    """Measured throughput."""
    predicted: float | None
    """``predict``'s throughput for the same run (None when it cannot predict it)."""
    low: float | None = None
    """Lower end of the prediction's band."""
    high: float | None = None
    """Upper end of the prediction's band."""
    measured_mfu: float | None = None
    """Model FLOPs utilisation the bench measured."""
    predicted_mfu: float | None = None
    """Model FLOPs utilisation of the prediction."""
    error: float | None = None
    """``predicted / measured - 1`` (None without a prediction)."""
    note: str = ""
    """What differs between the two, or why there is no prediction."""


class ThroughputValidation(_Frozen):
    """``validate throughput``: cases, error summaries, rank correlations, seed checks."""

    cases: tuple[ThroughputValidationCase, ...]
    """Every compared case."""
    summaries: tuple[ErrorStats, ...]
    """Errors of the predictor (held out) and of the baselines, over the same cases."""
    rank_correlation: dict[str, float]
    """Per model: Spearman correlation of leave-one-GPU-out predictions with measurements."""
    left_out: tuple[str, ...]
    """Reference rows not compared, with why."""
    seed_checks: tuple[str, ...]
    """The seed guides' speed ratios against the predicted ones."""
    assumptions: tuple[str, ...]
    """Settings the reference is read with."""
    measured: tuple[MeasuredThroughputCase, ...] = ()
    """whichgpu's own GPU measurements against ``predict`` (out of sample)."""
    measured_summary: ErrorStats | None = None
    """Errors over ``measured`` (None when no GPU measurement is shipped)."""
    speed_ratios: tuple[str, ...] = ()
    """What fp8 and torch.compile gave in ``measured``, against ``predict``'s ratios, in
    words (``validate.measured.speed_ratios``)."""
    references: tuple[ReferenceThroughputCase, ...] = ()
    """Speeds measured outside whichgpu's harness (the H200 measurements, llm-foundry's
    published runs) against ``predict``."""
    sources: tuple[ReferenceSource, ...] = ()
    """The references compared."""
    summaries_by_source: tuple[SourceSummary, ...] = ()
    """Per reference: the error over its cases."""


# --- Benchmark results ----------------------------------------------------------------------

DeviceKind = Literal["cuda", "cpu", "mps", "fake"]
"""Where a benchmark ran: a CUDA GPU, the CPU, Apple's MPS, or the simulated test device."""


class BenchEnvironment(_Frozen):
    """The machine and software a measurement was made with, so a reader can judge it."""

    device_kind: DeviceKind
    """Kind of device measured."""
    device_name: str
    """Name the device reports (``NVIDIA H200``, the CPU's model name, ``fake``)."""
    device_uuid: str | None = None
    """GPU UUID (NVML / torch), None off CUDA."""
    device_count: int = 1
    """Devices of this kind visible to the process."""
    driver_version: str | None = None
    """NVIDIA driver version."""
    cuda_version: str | None = None
    """CUDA runtime torch was built with."""
    cudnn_version: str | None = None
    """cuDNN version torch loaded."""
    torch_version: str | None = None
    """torch version."""
    libraries: dict[str, str] = Field(default_factory=dict)
    """Other library versions that shape the run (``transformers``, ``numpy`` …)."""
    whichgpu_version: str
    """whichgpu version that measured."""
    python_version: str
    """Python version."""
    platform: str
    """Operating system and architecture (``platform.platform()``)."""
    host: str
    """Host name."""
    cpu: str | None = None
    """CPU model."""
    cpu_count: int | None = None
    """Logical CPUs."""
    power_limit_w: float | None = None
    """GPU power limit in force (NVML), W."""
    memory_total_bytes: int | None = None
    """Device memory the runtime reports as total."""
    interconnect: str | None = None
    """How the GPUs of a multi-GPU run are linked (NVLink, PCIe), as the driver reports."""
    tf32_matmul: bool | None = None
    """``torch.backends.cuda.matmul.allow_tf32`` during the run."""
    tf32_cudnn: bool | None = None
    """``torch.backends.cudnn.allow_tf32`` during the run."""
    amp_dtype: str | None = None
    """Autocast dtype in force (``bfloat16``/``float16``), None without AMP."""


class BenchResult(_Tabular):
    """One measurement: a workload's training (or inference) speed and memory on a device.

    Throughput is in the workload's unit over all GPUs of the run; step times are of one
    synchronised step, after warm-up. Memory figures are of the measured batch.
    """

    id: str = Field(pattern=r"^[0-9a-f]{8,64}$")
    """Unique id of the result (hex), assigned when it is measured."""
    workload: str
    """Workload measured."""
    run: RunConfig
    """Run configuration measured (batch size and sequence length resolved)."""
    device: str
    """Device the run asked for (``cuda:0``, ``cpu``, ``mps``, ``fake``)."""
    device_name: str
    """Name the device reports."""
    gpu: str | None
    """Catalog id of the GPU, when the device name resolves to one."""
    n_gpus: int = Field(ge=1)
    """Devices measured together (data parallel)."""
    precision: str
    """Precision of the run (as ``run.precision``)."""
    batch_size: int = Field(ge=1)
    """Samples per step per device."""
    seq_len: int | None = Field(ge=1)
    """Tokens per sequence (sequence models)."""
    max_batch_size: int | None = Field(default=None, ge=0)
    """Largest batch that ran, when it was searched (0: not even batch 1; None: the batch was
    given, not searched)."""
    max_batch_resolution: int | None = Field(default=None, ge=1)
    """Resolution of that search (1 = exact)."""
    max_seq_len: int | None = Field(default=None, ge=0)
    """Largest sequence length that ran at ``batch_size``, when it was searched."""
    memory_limit_bytes: int | None = Field(default=None, gt=0)
    """Cap the search was run under (``--memory-limit``), None for the device's memory."""
    compiled: bool = False
    """Whether the model ran under ``torch.compile``."""
    channels_last: bool = False
    """Whether images were in channels-last layout."""
    throughput: float | None = Field(gt=0, allow_inf_nan=False)
    """Units per second over all devices (None if the run did not fit)."""
    throughput_unit: str
    """``images/s``, ``tokens/s``, ``sequences/s`` or ``samples/s``."""
    step_time_s: float | None = Field(gt=0, allow_inf_nan=False)
    """Median time of one step, s."""
    step_time_iqr_s: float | None = Field(ge=0, allow_inf_nan=False)
    """Interquartile range of the step times, s."""
    iterations: int = Field(ge=0)
    """Timed steps."""
    warmup_iterations: int = Field(ge=0)
    """Steps run before timing (until step times were steady)."""
    measured_s: float = Field(ge=0, allow_inf_nan=False)
    """Wall time of the timed steps, s."""
    peak_allocated_bytes: int | None = Field(default=None, ge=0)
    """Peak bytes held by tensors (``torch.cuda.max_memory_allocated``)."""
    peak_reserved_bytes: int | None = Field(default=None, ge=0)
    """Peak bytes the caching allocator held (``torch.cuda.max_memory_reserved``)."""
    device_used_bytes: int | None = Field(default=None, ge=0)
    """Peak device memory in use as NVML reports it (includes the CUDA context)."""
    power_w: float | None = Field(default=None, ge=0)
    """Mean board power while timing, W (NVML)."""
    energy_j_per_sample: float | None = Field(default=None, ge=0)
    """Energy per sample over all devices, J."""
    sm_clock_mhz: float | None = None
    """Mean SM clock while timing, MHz."""
    temperature_c: float | None = None
    """Maximum GPU temperature while timing, °C."""
    utilization: float | None = None
    """Mean GPU utilisation while timing (fraction)."""
    flops_per_step: float | None = None
    """Model FLOPs of one step on one device (counted by torch's FLOP counter)."""
    mfu: float | None = None
    """Model FLOPs utilisation against the catalog's dense peak for the precision."""
    scaling_efficiency: float | None = None
    """Multi-GPU: throughput over n_gpus x the one-GPU throughput, when both were measured."""
    per_rank: tuple[dict[str, float], ...] = ()
    """Multi-GPU: each rank's own step time and memory, as it reported them."""
    notes: tuple[str, ...] = ()
    """What the reader should know (aggregation rules, clamps, warnings)."""
    environment: BenchEnvironment
    """Machine and software."""
    created_at: dt.datetime
    """When it was measured (UTC)."""


# --- Cost: regions, build classes, energy, break-even, value, build checks -------------------

CheckStatus = Literal["ok", "warn", "fail"]
"""Outcome of one build check: ``ok``, ``warn`` (it works with a caveat the reason names) or
``fail`` (it does not work as asked)."""
BuildCheckName = Literal["power", "slots", "cooling", "pcie", "nvlink"]
"""What a build check looks at: power supply, slot width, cooling, PCIe lanes, NVLink."""
ThroughputSource = Literal["given", "proxy"]
"""Where a value row's throughput comes from: the caller (predicted or measured) or the
catalog's dense AMP tensor rate standing in for it."""


class GridRegion(_Frozen):
    """A region's average electricity price and grid carbon intensity (``data/v1/cost``)."""

    id: str
    """Region id (``us``, ``de``, ``world``), the value of ``--region``."""
    label: str
    """What the figures are for, in words (``United States (national average)``)."""
    default: bool = False
    """Whether cost commands use this region unless told otherwise (exactly one is)."""
    electricity_usd_per_kwh: float | None = Field(default=None, gt=0)
    """Average retail electricity price, USD per kWh (None: not in the data)."""
    grid_gco2_per_kwh: float | None = Field(default=None, ge=0)
    """Carbon intensity of the electricity, grams of CO2 (or CO2e, see the note) per kWh."""
    provenance: dict[str, Provenance] = Field(default_factory=dict)
    """Where each value comes from."""


class UtilizationProfile(_Frozen):
    """A named share of the time a machine does work (the guides' typical utilisations)."""

    id: str
    """Profile id (``phd-desktop``), accepted by ``--utilization``."""
    label: str
    """Who works like this."""
    utilization: float = Field(gt=0, le=1)
    """Share of the hours of a year the GPUs run (0-1)."""
    provenance: dict[str, Provenance] = Field(default_factory=dict)
    """Where the value comes from."""


class BuildClass(_Frozen):
    """A kind of machine for 1-2, 3-4 or 5-8 GPUs: its base cost, power and board layout.

    The base system is everything but the GPUs: barebones (board, case), CPU, RAM, power
    supply and storage. Slot positions count expansion-slot widths from the first GPU slot.
    """

    id: str
    """Class id (``desktop``, ``workstation``, ``server``)."""
    label: str
    """What machine it is, in words."""
    gpus: int = Field(ge=1)
    """Most GPUs a machine of this class holds; a build of N GPUs uses the smallest class
    with at least N."""
    base_system_usd: float | None = Field(default=None, gt=0)
    """Price of the machine without GPUs, USD (None: no sourced price)."""
    cpu_w: float = Field(ge=0)
    """Power of the CPU counted by the power-supply rule and the energy figures, W."""
    psu_w: float | None = Field(default=None, gt=0)
    """Power supply of the reference build, W (None: not known; give one to check it)."""
    gpu_lanes: int = Field(ge=1)
    """PCIe lanes the platform gives its GPU slots in all."""
    gpu_slot_positions: tuple[int, ...]
    """Positions of the x16 slots usable for GPUs, in slot widths from the first one."""
    expansion_slots: int = Field(ge=1)
    """Expansion-slot widths the case offers from the first GPU slot on (a card must end
    within them)."""
    server_airflow: bool = False
    """Whether the chassis pushes air through the cards (passive datacenter cards need it)."""
    provenance: dict[str, Provenance] = Field(default_factory=dict)
    """Where each value comes from."""


class CostRules(_Frozen):
    """The rules of thumb the cost and build computations use, each sourced."""

    psu_margin_fraction: float = Field(ge=0)
    """Headroom asked of a power supply above the summed load (0.10 = 10 %)."""
    psu_rest_w: float = Field(ge=0)
    """Power counted for the motherboard, RAM, drives and fans, W."""
    largest_desktop_psu_w: float = Field(gt=0)
    """Largest common desktop (ATX) power supply, W; above it a build needs two supplies or a
    server chassis."""
    lanes_per_gpu_good: int = Field(ge=1)
    """PCIe lanes per GPU with which multi-GPU training loses nothing worth mentioning."""
    lanes_per_gpu_min: int = Field(ge=1)
    """Fewest PCIe lanes per GPU that still work well (below ``lanes_per_gpu_good`` it costs
    a few per cent with 3 or more GPUs)."""
    cooling_gap_slots: int = Field(ge=0)
    """Free slot widths between two open-air cards for them to cool themselves."""
    default_utilization: float = Field(gt=0, le=1)
    """Utilisation used when none is given."""
    default_years: float = Field(gt=0)
    """Years of ownership used when none are given."""
    provenance: dict[str, Provenance] = Field(default_factory=dict)
    """Where each value comes from."""


class CostPoint(_Frozen):
    """Cumulative cost of renting and of owning after some days (a point of the break-even
    curve)."""

    days: float
    """Days since the purchase."""
    cloud_usd: float
    """Rent paid by then, USD."""
    own_usd: float
    """Purchase price plus electricity by then, USD (no resale)."""


class Breakeven(_Tabular):
    """Renting against owning: yearly costs, the break-even day and the cost of N years.

    ``own`` is a machine bought for ``system_cost_usd`` that draws ``gpu_w + cpu_w`` while it
    works, ``utilization`` of the time; ``cloud`` rents the same capacity for the same hours at
    ``cloud_usd_per_hour``. The formulas are in ``docs/cost.md``.
    """

    system_cost_usd: float
    """Price of the owned machine (GPUs and the rest), USD."""
    gpu_w: float
    """Power of its GPUs while working, W."""
    cpu_w: float
    """Power of the CPU and the rest of the machine while working, W."""
    utilization: float
    """Share of the hours of a year the machine (or the rented instance) works."""
    electricity_usd_per_kwh: float
    """Electricity price, USD per kWh."""
    cloud_usd_per_hour: float
    """Rent of the equivalent cloud capacity, USD per hour of use."""
    years: float
    """Years of ownership for the total cost."""
    resale_usd: float
    """What the machine sells for after ``years``, USD."""
    energy_kwh_per_year: float
    """Electricity the machine uses in a year: (gpu_w + cpu_w) / 1000 x 24 x 365 x utilization."""
    electricity_usd_per_year: float
    """``energy_kwh_per_year x electricity_usd_per_kwh``."""
    cloud_usd_per_year: float
    """Rent for a year: ``cloud_usd_per_hour x 24 x 365 x utilization``."""
    own_usd_per_year: float
    """Owning, per year over ``years``: electricity plus (system cost - resale) / years."""
    breakeven_days: float | None
    """Day on which the rent paid equals the purchase plus the electricity used (None: renting
    stays cheaper, its daily cost not above the electricity's)."""
    breakeven_use_hours: float | None
    """Hours of actual use up to that day (``breakeven_days x 24 x utilization``)."""
    own_tco_usd: float
    """Total cost of owning for ``years``: system cost + electricity - resale."""
    cloud_tco_usd: float
    """Total rent for ``years``."""
    grid_gco2_per_kwh: float | None = None
    """Carbon intensity used for ``co2_kg_per_year`` (None: no region figure)."""
    co2_kg_per_year: float | None = None
    """CO2 of the owned machine's electricity in a year, kg (None: no carbon intensity)."""
    curve: tuple[CostPoint, ...] = ()
    """Cumulative costs month by month over ``years`` (for a break-even chart)."""
    inputs: dict[str, str] = Field(default_factory=dict)
    """Where each input came from: ``given``, or the catalog record and source it was read
    from."""
    assumptions: tuple[str, ...] = ()
    """What the comparison assumes, in words."""


class JobEnergy(_Frozen):
    """Electricity, its cost and its CO2 for one job (a training run) or one period."""

    power_w: float
    """Power drawn while the job runs (GPUs and the rest of the machine), W."""
    hours: float
    """How long the job runs, h."""
    energy_kwh: float
    """``power_w / 1000 x hours``."""
    electricity_usd_per_kwh: float | None
    """Electricity price used (None: no price given or in the region's data)."""
    electricity_usd: float | None
    """Cost of that electricity, USD."""
    grid_gco2_per_kwh: float | None
    """Carbon intensity used, g CO2 per kWh (None: none given or in the region's data)."""
    co2_kg: float | None
    """CO2 of that electricity, kg."""
    region: str | None = None
    """Region the defaults came from."""
    assumptions: tuple[str, ...] = ()
    """What the figures assume."""


class ValueRow(_Frozen):
    """Performance per dollar of one GPU (alone or in a machine), bought or rented."""

    gpu: str
    """Catalog id."""
    gpu_name: str
    """Its name."""
    count: int
    """GPUs counted (1 for the GPU alone)."""
    price_kind: str
    """Which price: ``new``, ``used``, ``launch``, ``buy`` (the lower of the newest new and
    used, else launch), ``cloud`` (cheapest on-demand) or ``cloud-spot``."""
    gpu_price_usd: float
    """Price of one GPU: USD per unit, or USD per GPU-hour for cloud kinds."""
    price_note: str
    """Where that price comes from (kind, provider, date, source)."""
    base_system_usd: float | None
    """The build class's machine without GPUs, USD (None: the GPU alone, or rented)."""
    total_usd: float | None
    """What is bought: count x GPU price + base system, USD (None for cloud kinds)."""
    usd_per_hour: float | None
    """Rent of ``count`` GPUs per hour, USD (None for purchases)."""
    throughput: float
    """Throughput of the ``count`` GPUs together (count x per-GPU; linear scaling assumed)."""
    throughput_per_gpu: float
    """Throughput of one GPU."""
    throughput_unit: str
    """Unit of ``throughput`` (``tokens/s``, or ``AMP TFLOPS`` for the proxy)."""
    throughput_source: ThroughputSource
    """``given`` by the caller or ``proxy`` (the catalog's dense AMP tensor rate)."""
    throughput_per_kusd: float | None
    """Purchases: throughput per USD 1,000 spent (None for cloud kinds)."""
    units_per_usd: float | None
    """Cloud: units processed per USD of rent (throughput x 3600 / usd_per_hour)."""
    usd_per_million_units: float | None
    """Cloud: rent per million units (for a throughput in TFLOPS, per million TFLOP)."""
    relative: float
    """Performance per dollar divided by the reference row's (1.0 = as good; higher is better)."""


class ValueTable(_Tabular):
    """Performance per dollar of several GPUs, normalised to a reference (charts-ready)."""

    price_kind: str
    """Price kind of every row."""
    count: int | None
    """GPUs per machine; None for the GPU alone (no base system)."""
    build_class: str | None
    """Build class whose base cost is added (None for the GPU alone or rented)."""
    base_system_usd: float | None
    """That base cost, USD."""
    reference: str
    """Catalog id of the row every ``relative`` is divided by."""
    rows: tuple[ValueRow, ...]
    """One row per GPU, best value first."""
    skipped: tuple[str, ...] = ()
    """GPUs left out, each with why (no price of the kind, no throughput)."""
    assumptions: tuple[str, ...] = ()
    """What the comparison assumes."""


class BuildCheck(_Frozen):
    """One check of a multi-GPU build, with its verdict and the reason in a sentence."""

    name: BuildCheckName
    """What is checked."""
    status: CheckStatus
    """``ok``, ``warn`` or ``fail``."""
    reason: str
    """Why, with the numbers and what to do about a ``warn`` or ``fail``."""


class BuildReport(_Frozen):
    """Can N of a GPU go into one machine? Power supply, slots, cooling, PCIe and NVLink."""

    gpu: str
    """Catalog id."""
    gpu_name: str
    """Its name."""
    count: int
    """GPUs in the machine."""
    build_class: str
    """Build class used for the base platform (``desktop``, ``workstation``, ``server``)."""
    build_label: str
    """That class in words."""
    gpu_tdp_w: float | None
    """Board power of one GPU, W (None: not in the catalog)."""
    cpu_w: float
    """CPU power counted, W."""
    rest_w: float
    """Motherboard, RAM, drives and fans counted, W."""
    load_w: float | None
    """count x gpu_tdp_w + cpu_w + rest_w, W."""
    recommended_psu_w: float | None
    """``load_w`` plus the margin, W."""
    psu_w: float | None
    """Power supply checked against, W (given, or the class's reference build)."""
    slot_width: float | None
    """Slots one card occupies."""
    gpus_that_fit: int | None
    """Cards of that width the class's board and case take (None: not a PCIe card)."""
    lanes_per_gpu: int | None
    """PCIe lanes each GPU gets at this count."""
    checks: tuple[BuildCheck, ...]
    """The checks, in order: power, slots, cooling, pcie, nvlink."""
    status: CheckStatus
    """The worst status among the checks."""
    assumptions: tuple[str, ...] = ()
    """What the checks assume."""


# --- Recommendation -------------------------------------------------------------------------

AcquireMode = Literal["buy", "rent"]
"""Whether the GPUs are bought (purchase + electricity) or rented (cloud rate per hour)."""
RankMetric = Literal["cost", "perf-per-dollar", "time", "throughput"]
"""What a ranking orders by: cost to finish the job, throughput per dollar, time to finish,
throughput."""

_METRIC_WORDS: dict[str, str] = {
    "cost": "the cost of the job",
    "perf-per-dollar": "performance per dollar",
    "time": "the time of the job",
    "throughput": "speed",
}


class JobSize(_Frozen):
    """How much work the user wants done: a time, or an amount of samples or tokens."""

    hours: float | None = Field(default=None, gt=0)
    """Hours of use (then the cost is of those hours and more throughput is more work)."""
    samples: float | None = Field(default=None, gt=0)
    """Samples (sequences, images) to process."""
    tokens: float | None = Field(default=None, gt=0)
    """Tokens to process (language models)."""
    epochs: float | None = Field(default=None, gt=0)
    """Passes over ``dataset_size`` samples."""
    dataset_size: int | None = Field(default=None, gt=0)
    """Samples in the dataset (with ``epochs``)."""

    def describe(self) -> str:
        """The job in words."""
        if self.hours is not None:
            return f"{self.hours:g} hours of use"
        if self.tokens is not None:
            return f"{self.tokens:,.0f} tokens"
        if self.samples is not None:
            return f"{self.samples:,.0f} samples"
        return f"{self.epochs:g} epochs of {self.dataset_size:,} samples"


class Candidate(_Frozen):
    """One GPU (or N of it) that can do the job, with what it gives and what it costs."""

    rank: int
    """Position in the ranking (1 = best)."""
    gpu: str
    """Catalog id."""
    gpu_name: str
    """Name."""
    count: int
    """GPUs in the machine (data parallel when more than one), or in all its machines."""
    machines: int = 1
    """Machines the GPUs are in: 1, or a cluster of ``count`` / 8 machines of 8 (the link
    data's ``max_gpus_per_node``) joined by ``network``, each priced as one machine."""
    network: str | None = None
    """With several ``machines``: the fabric between them, by its id in the link data
    (``ib-ndr``, the default, ``ib-hdr``, ``roce-1600``); None on one machine."""
    fits: bool
    """Whether the run fits in memory (always true for a ranked candidate)."""
    max_batch_size: int
    """Largest batch (concurrency for inference) per GPU that fits."""
    batch_size: int
    """Batch per GPU the speed is for."""
    throughput: float
    """Units per second over all GPUs. Inference of a language model: tokens generated per
    second over whole requests, the prefill included (``GENERATED_RATE_NOTE``); a measured one
    is ``bench``'s, counted the same way."""
    throughput_unit: str
    """``images/s``, ``tokens/s`` …"""
    throughput_low: float
    """Lower end of the throughput band (the measurement itself when measured)."""
    throughput_high: float
    """Upper end."""
    throughput_source: Literal["predicted", "measured"]
    """Whether the throughput is ``whichgpu predict``'s or a stored ``whichgpu bench`` result."""
    time_s: float | None
    """Time to finish the job, s (None without a job size, or for a job given in hours)."""
    cost_usd: float
    """Buy: the machine (GPUs + base system) plus electricity for the job. Rent: the rental of
    the job (one hour's rate without a job size)."""
    purchase_usd: float | None
    """Buy: GPUs plus the base system of the build class."""
    hourly_usd: float | None
    """Rent: rate of all the GPUs per hour."""
    energy_kwh: float | None
    """Electricity of the job (buy), kWh."""
    electricity_usd: float | None
    """Its cost."""
    co2_kg: float | None
    """Its CO2 at the region's grid intensity."""
    perf_per_dollar: float
    """Buy: throughput per $1,000 of machine. Rent: units per dollar of rental."""
    perf_per_dollar_unit: str
    """Unit of ``perf_per_dollar``."""
    price_note: str
    """Which price was used (kind, provider, date, age, source)."""
    price_as_of: dt.date | None = None
    """Date of that price (None where none was used)."""
    price_stale: bool = False
    """Whether that price is older than the staleness threshold of its kind (``--stale-after``;
    ``whichgpu.catalog.freshness``): refresh it before acting on it."""
    reasons: tuple[str, ...]
    """Why it ranks where it does, and what to know about it."""

    def label(self) -> str:
        """The candidate's GPUs, short (``gpus_label``)."""
        return gpus_label(self.count, self.gpu_name, self.machines)


def gpus_label(count: int, gpu_name: str, machines: int = 1) -> str:
    """GPUs in words, short: ``H100 SXM``, ``8 x H100 SXM``, ``16 x H100 SXM (2 machines)``."""
    name = f"{count} x {gpu_name}" if count > 1 else gpu_name
    return f"{name} ({machines} machines)" if machines > 1 else name


ExclusionKind = Literal["memory", "batch", "speed", "price", "budget", "time", "build"]
"""What rules a GPU out of a ranking (``EXCLUSION_LABELS`` says each in words)."""


class Exclusion(_Frozen):
    """A GPU that cannot do the job as asked, and why, in one line."""

    gpu: str
    """Catalog id."""
    gpu_name: str
    """Name."""
    count: int
    """GPUs in the machine considered."""
    kind: ExclusionKind
    """What rules it out: it does not fit, its largest batch is below ``--min-batch``, its speed
    cannot be predicted, it has no price for the mode, it is over budget, it would not
    finish the job within ``--within`` hours, or the machine of that many priced for it cannot
    run them (its power supply is below their load)."""
    reason: str
    """Why (``needs 13.1 GB, has 12``; ``over budget by $400`` …)."""


EXCLUSION_LABELS: dict[str, str] = {
    "memory": "does not fit",
    "batch": "largest batch below --min-batch",
    "budget": "over budget",
    "price": "no price",
    "speed": "speed cannot be predicted",
    "time": "would not finish in time",
    "build": "the machine as priced cannot run them",
}
"""Each ``Exclusion.kind`` in words, as the answer and the renderings group them."""


def too_close_to_rank(better: float, worse: float, relative_band: float) -> bool:
    """Whether ``better`` leads ``worse`` (both positive, in a metric where more is better)
    by no more than ``relative_band``: the error of one prediction against another could
    swap them."""
    return better <= worse * (1 + relative_band)


class Ranking(_Tabular):
    """``whichgpu recommend``: candidates ranked for a workload, a job and a budget."""

    workload: str
    """Workload."""
    run: RunConfig
    """Run configuration."""
    mode: AcquireMode
    """Buy or rent."""
    metric: RankMetric
    """What the ranking orders by."""
    job: JobSize | None
    """The job, when a size was given."""
    budget_usd: float | None
    """Budget (buy: machine price; rent: the job's rental)."""
    within_hours: float | None = None
    """Deadline: the job must finish within this many hours."""
    region: str
    """Region whose electricity price and grid intensity are used."""
    preset: str | None
    """The persona preset the question came from (``--for``)."""
    vendor: str | None = None
    """The only maker whose GPUs were considered (``--vendor``, or the preset's); None: all."""
    ranking: tuple[Candidate, ...]
    """Candidates, best first."""
    excluded: tuple[Exclusion, ...]
    """GPUs that cannot do it, with why."""
    answer: str
    """The recommendation in a sentence or two."""
    closeness: tuple[str, ...]
    """Neighbours among the leaders (``A ≈ B``) whose places the speed prediction's band could
    swap: too close to rank on ``metric`` (``closeness_text`` says so in words)."""
    assumptions: tuple[str, ...]
    """What the numbers assume."""

    @property
    def closeness_text(self) -> str:
        """``closeness`` as a sentence: on what the neighbours are too close, and why."""
        if not self.closeness:
            return ""
        return (
            f"Too close to rank on {_METRIC_WORDS[self.metric]} (the error of one GPU's speed "
            "prediction against another's could swap them): " + "; ".join(self.closeness) + "."
        )
