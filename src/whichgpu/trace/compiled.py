"""What ``torch.compile`` does to the activations a training step keeps for its backward pass,
derived from PyTorch's own machinery rather than fitted: the workload's forward pass and loss
(the recipe's, under bf16/fp16 autocast with CUDA's operator table, SDPA attention) are traced
once on the CPU with fake tensors through AOTAutograd into a joint forward-backward graph, which
is then split twice: by ``default_partition``, which keeps what eager autograd keeps, and by the
partitioner inductor runs (its joint-graph passes, then ``min_cut_rematerialization_partition``
over inductor's decompositions), which recomputes cheap pointwise chains in the backward instead
of saving them. A checkpointed step is traced with its layers' operators tagged as
``torch.utils.checkpoint`` tags them under compilation (``compiled_checkpoint_contexts``),
which both partitioners follow. The tensors each forward graph hands to its backward graph,
counted once per storage and leaving out those the step holds anyway (parameters, inputs, the
returned outputs), are the saved activations of an eager and of a compiled step:
``compiled_activations``. Each partition's forward and backward graphs are also grouped into
the kernels inductor would run, to first order (``FusedKernel``, ``Partition.forward_kernels``):
matrix products and attention stay "extern" kernels of their own; views move nothing; every
other operator is fused with its neighbours into kernels that read their inputs from DRAM once
and write only what leaves them. Set against ``Partition.forward_unfused_bytes`` (each fusible
operator its own kernel, as eager runs it), this is the DRAM traffic fusion removes (what
``predict --compile`` times: docs/throughput.md).
The module is longer than 600 lines because the partitions and the kernel grouping share one
walk of the graphs and its storage bookkeeping, which a split would have to repeat.
"""

from __future__ import annotations

import contextlib
import importlib
import operator
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from whichgpu.errors import UnsupportedWorkload
from whichgpu.recipe.training import (
    AMP_DTYPES,
    autocast,
    compiled_checkpoint_contexts,
    fp16_master,
    step_loss,
)
from whichgpu.schema import RunConfig
from whichgpu.trace.cuda_autocast import cuda_autocast_rules
from whichgpu.trace.step import _CudaDropout, check_supported
from whichgpu.workloads.base import BuiltWorkload, Workload, enable_checkpointing
from whichgpu.workloads.finetune import apply_method
from whichgpu.workloads.hf import HELD_OUTPUT, quiet_transformers

Partitioner = Literal["default", "min-cut"]
"""``default``: ``default_partition`` (what eager autograd saves); ``min-cut``: inductor's
partitioner (``torch._inductor.compile_fx.partition_fn``: joint-graph passes, then
``min_cut_rematerialization_partition``)."""

HeldBy = Literal["parameter", "input", "output", "saved"]
"""Why a saved tensor adds no bytes: it shares storage with a parameter or buffer, with an input
of the step, with an output the step returns (the loss, the logits, the KV cache), or with a
saved tensor listed before it. Its ``bytes`` are then 0."""


@dataclass(frozen=True)
class SavedTensor:
    """One tensor a partitioned forward graph saves for the backward graph."""

    name: str
    """The forward graph's name for it (``mm_14``, ``convert_element_type_44``...)."""
    op: str
    """The operator that makes it (``aten.mm.default``; ``placeholder`` for a graph input)."""
    shape: tuple[int, ...]
    dtype: str
    """``torch.bfloat16`` and so on."""
    tensor_bytes: int
    """numel x itemsize of the tensor itself."""
    bytes: int
    """What it adds to the saved activations: the bytes of its storage, or 0 where
    ``held_by`` says the storage is held anyway."""
    held_by: HeldBy | None
    """None: the tensor's storage is kept alive only because the backward graph needs it."""


KernelKind = Literal["fused", "extern"]
"""``extern``: a kernel inductor calls rather than generates (a matrix product, attention),
with its own launch and its own DRAM traffic; ``fused``: a kernel inductor generates from a
group of fusible operators."""

Phase = Literal["forward", "backward"]


@dataclass(frozen=True)
class FusedKernel:
    """One kernel of a partitioned graph as inductor would run it, to first order (see
    ``_kernels``)."""

    kind: KernelKind
    name: str
    """``extern``: the operator (``aten.mm.default``); ``fused``: its first and last operator
    nodes in graph order (``pow_1..mul_4``), or the one node's name."""
    bytes_read: int
    """DRAM bytes read: the tensors it reads that are made outside it (graph inputs, other
    kernels' outputs), each once; a tensor read only through views that cover part of it
    (a slice) counts what they cover, and one read through a broadcast (``expand``) its own
    bytes."""
    bytes_written: int
    """DRAM bytes written: ``extern``, all its tensor outputs; ``fused``, the outputs of its
    nodes that are used outside it (by another kernel, or as a graph output, which includes
    the tensors the forward graph saves for the backward graph)."""
    flops: int
    """``fused``: one per element per operator node, the element count being the largest of
    the node's tensor outputs and inputs (a reduction processes its input); a rough count of
    vector work. ``extern``: 0, not counted here (the matrix model prices those)."""
    nodes: int
    """Operator nodes in it (views, ``getitem`` and allocations left out): 1 for ``extern``."""

    @property
    def bytes(self) -> int:
        """``bytes_read + bytes_written``."""
        return self.bytes_read + self.bytes_written


@dataclass(frozen=True)
class Partition:
    """How one partitioner split the step's joint graph."""

    partitioner: Partitioner
    saved_bytes: int
    """Bytes the forward graph keeps for the backward graph beyond what the step holds anyway:
    the sum of ``SavedTensor.bytes`` over ``saved``."""
    saved: tuple[SavedTensor, ...]
    """Every saved tensor, largest ``bytes`` first (ties: graph order)."""
    output_bytes: int
    """Bytes of the step's outputs (loss, logits, KV cache), counted once per storage."""
    forward_ops: int
    """Operator calls in the forward graph (call_function nodes)."""
    backward_ops: int
    """Operator calls in the backward graph (recomputation included)."""
    trace_seconds: float
    """Wall time of the trace and the partition."""
    forward_kernels: tuple[FusedKernel, ...]
    """The forward graph's kernels as inductor would run them, in graph order (``_kernels``)."""
    backward_kernels: tuple[FusedKernel, ...]
    """The backward graph's kernels, likewise."""
    forward_unfused_bytes: int
    """DRAM bytes the forward graph's fusible operators move when each is its own kernel, as
    in eager mode: the sum over them of their tensor inputs and outputs (views excluded, a
    tensor read through views counted as in ``FusedKernel.bytes_read``)."""
    backward_unfused_bytes: int
    """The same for the backward graph."""

    def kernels(self, phase: Phase) -> tuple[FusedKernel, ...]:
        """``forward_kernels`` or ``backward_kernels``."""
        return self.forward_kernels if phase == "forward" else self.backward_kernels

    def kernel_count(self, phase: Phase, kind: KernelKind = "fused") -> int:
        """How many kernels of ``kind`` the ``phase``'s graph runs."""
        return sum(1 for k in self.kernels(phase) if k.kind == kind)

    def kernel_bytes(self, phase: Phase, kind: KernelKind = "fused") -> int:
        """DRAM bytes read and written by the ``phase``'s kernels of ``kind``."""
        return sum(k.bytes for k in self.kernels(phase) if k.kind == kind)

    def unfused_bytes(self, phase: Phase) -> int:
        """``forward_unfused_bytes`` or ``backward_unfused_bytes``."""
        return self.forward_unfused_bytes if phase == "forward" else self.backward_unfused_bytes

    def unfused_count(self, phase: Phase) -> int:
        """Fusible operators in the ``phase``'s graph: its kernels when each is its own."""
        return sum(k.nodes for k in self.kernels(phase) if k.kind == "fused")

    @property
    def forward_fused_count(self) -> int:
        """Fused kernels in the forward graph."""
        return self.kernel_count("forward")

    @property
    def backward_fused_count(self) -> int:
        """Fused kernels in the backward graph."""
        return self.kernel_count("backward")

    @property
    def forward_fused_bytes(self) -> int:
        """DRAM bytes of the forward graph's fused kernels."""
        return self.kernel_bytes("forward")

    @property
    def backward_fused_bytes(self) -> int:
        """DRAM bytes of the backward graph's fused kernels."""
        return self.kernel_bytes("backward")

    def largest(self, n: int = 10) -> tuple[SavedTensor, ...]:
        """The ``n`` saved tensors that add the most bytes."""
        return tuple(t for t in self.saved if t.bytes > 0)[:n]


@dataclass(frozen=True)
class CompiledActivations:
    """Saved activations of one training step, eager (``default``) and compiled (``min_cut``)."""

    workload: str
    batch_size: int
    seq_len: int | None
    precision: str
    default: Partition
    """``default_partition`` over the step as eager autograd records it (no decompositions
    beyond the ones AOTAutograd always applies)."""
    min_cut: Partition
    """Inductor's partition over the step as inductor traces it (its decomposition table)."""

    @property
    def saved_bytes_default(self) -> int:
        return self.default.saved_bytes

    @property
    def saved_bytes_compiled(self) -> int:
        return self.min_cut.saved_bytes

    @property
    def saved_bytes_difference(self) -> int:
        """What compiling saves: ``saved_bytes_default - saved_bytes_compiled``."""
        return self.default.saved_bytes - self.min_cut.saved_bytes


def compiled_activations(
    workload: Workload | str,
    run: RunConfig,
    batch_size: int,
    seq_len: int | None,
    *,
    layers: int | None = None,
) -> CompiledActivations:
    """Trace one training step of ``workload`` (a registered name or a ``Workload``) for
    ``run`` at ``batch_size`` x ``seq_len`` and partition it both ways (see the module's
    docstring); ``layers`` builds the model with only that many of its layers. Raises
    ``UnsupportedWorkload`` for a run this cannot trace, with why."""
    if isinstance(workload, str):
        from whichgpu.workloads import get_workload

        workload = get_workload(workload)
    _check(run)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=False), quiet_transformers():
        if layers is None:
            built = workload.build(run)
        elif workload.build_with_layers is not None:
            built = workload.build_with_layers(run, layers)
        else:
            raise UnsupportedWorkload(f"{workload.info.name} cannot be built with fewer layers.")
        built = apply_method(built, run)
        if fp16_master(built, run):
            raise UnsupportedWorkload(
                "This workload trains --precision fp16 as fairseq's FP16Optimizer (an fp16 "
                "model without autocast), which compiled_activations does not model."
            )
        built.model.train()
        if run.checkpointing:
            _checkpoint(built, run)
        batch = dict(built.make_batch(batch_size, seq_len))
        default = _partition(built, run, batch, "default")
        min_cut = _partition(built, run, batch, "min-cut")
    return CompiledActivations(
        workload=workload.info.name,
        batch_size=batch_size,
        seq_len=seq_len,
        precision=run.precision,
        default=default,
        min_cut=min_cut,
    )


def _check(run: RunConfig) -> None:
    check_supported(run)  # fp8
    if run.mode != "train":
        raise UnsupportedWorkload(
            "compiled_activations traces a training step (what the forward pass saves for the "
            f"backward pass); --mode {run.mode} has no backward pass."
        )


def _checkpoint(built: BuiltWorkload, run: RunConfig) -> None:
    """Checkpoint the model's layers as ``run`` asks, in the form ``torch.compile`` traces a
    checkpointed call (``compiled_checkpoint_contexts``): each call's operators tagged with
    its policy and its own region, so that both partitioners split the step as a compiled
    checkpointed step is split (``default_partition`` keeps each region's inputs and what its
    policy saves, as eager checkpointing does; the min-cut recomputes in the backward graph
    what the tags ask, and the other operators as it always does)."""
    enable_checkpointing(
        built.model,
        None if run.checkpointing_policy == "full" else run.checkpointing_every_layers(),
        use_reentrant=False,
        # torch.compile traces checkpointed regions without forking the RNG state (inductor
        # replays random operators from their seeds instead)
        preserve_rng_state=False,
        context_fn=compiled_checkpoint_contexts(run),
    )


@contextlib.contextmanager
def _unpacked_sequences() -> Iterator[None]:
    """transformers' check for packed sequences (``masking_utils.find_packed_sequence_indices``,
    reached when no KV cache is made, as under checkpointing) answered as it answers for the
    step's batch, whose positions count up from 0 in every row: not packed. The check reads a
    tensor's value, which a trace through AOTAutograd cannot."""
    from unittest import mock

    from transformers import masking_utils

    with mock.patch.object(masking_utils, "find_packed_sequence_indices", lambda _: None):
        yield


class _Step(torch.nn.Module):
    """The step's forward pass and loss as one module with positional tensor inputs and a tuple
    of tensors out, as AOTAutograd takes them: the loss, then every tensor the loss holds
    (``workloads.hf.HELD_OUTPUT``: the logits, a KV cache's keys and values), which a
    compiled model returns and the training loop keeps until the next step."""

    def __init__(self, built: BuiltWorkload, run: RunConfig, keys: Sequence[str]) -> None:
        super().__init__()
        self.model = built.model
        self.built = built
        self.run = run
        self.keys = tuple(keys)
        self.amp = run.precision in AMP_DTYPES

    def forward(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        batch = dict(zip(self.keys, tensors, strict=True))
        with _cuda_kernels(self.built, self.amp), autocast(self.run, "cpu"):
            loss = step_loss(self.built, self.run, self.model, batch)
        held = getattr(loss, HELD_OUTPUT, None)
        return (loss, *_tensors_in(held))


@contextlib.contextmanager
def _cuda_kernels(built: BuiltWorkload, amp: bool) -> Iterator[None]:
    """CUDA's dropout and autocast table, as ``trace.step`` traces a step for a GPU."""
    with _CudaDropout(fused_attention=built.fused_attention_dropout):
        if amp:
            with cuda_autocast_rules():
                yield
        else:
            yield


def _tensors_in(value: Any) -> list[torch.Tensor]:
    """The tensors in a model output: nested containers, and a transformers cache's layers'
    ``keys`` and ``values``."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors_in(v)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors_in(v)]
    layers = getattr(value, "layers", None)
    if isinstance(layers, (list, tuple)):
        return [
            t
            for layer in layers
            for t in _tensors_in([getattr(layer, "keys", None), getattr(layer, "values", None)])
        ]
    return []


def _partition(
    built: BuiltWorkload, run: RunConfig, batch: dict[str, Any], partitioner: Partitioner
) -> Partition:
    """Trace the step through AOTAutograd and split its joint graph with ``partitioner``."""
    from torch._functorch.aot_autograd import aot_module_simplified

    keys = [k for k, v in batch.items() if isinstance(v, torch.Tensor)]
    if len(keys) != len(batch):
        raise UnsupportedWorkload(
            "compiled_activations needs a batch of tensors; this workload's batch holds "
            f"{sorted(set(batch) - set(keys))} too."
        )
    step = _Step(built, run, keys)
    # How this stands in for torch.compile (torch 2.13, transformers 5.24):
    # - TorchDynamo is left out: AOTAutograd traces the step module whole (a transformers
    #   Llama or GPT-2 has no graph break; a step that branches on a value fails the trace and
    #   is refused, see below). Dynamo would hand inductor the same aten graph.
    # - The caller's autocast is active while AOTAutograd traces, as when a compiled model is
    #   first called inside ``torch.autocast``; the backward follows torch's default
    #   (``backward_pass_autocast="same_as_forward"``), as it does under torch.compile.
    # - The step returns the outputs the loss holds (logits, KV cache), as a compiled model
    #   does: they are outputs, not saved activations, and a saved tensor that shares their
    #   storage adds nothing.
    # - Nothing is compiled: the forward and backward "compilers" keep the partitioned graphs.
    # aot_module_simplified puts the parameters and buffers first, once each (a tied weight
    # once): the inputs a compiled model keeps for its lifetime. Dynamo marks them static for
    # inductor; here the partitioner is told so directly, so that saving a parameter costs
    # nothing and a cast of one may be recomputed rather than kept.
    unique = {id(t) for t in (*step.parameters(), *step.buffers())}
    static = list(range(len(unique)))
    found: dict[str, Any] = {}

    # a checkpointed run's regions are tagged through ``torch.fx.traceback``'s node metadata,
    # which the tracer copies onto the nodes only while it is preserved
    tagged = run.checkpointing

    def partition_fn(joint: torch.fx.GraphModule, inputs: Any, **kwargs: Any) -> Any:
        if tagged and not any("recompute" in node.meta for node in joint.graph.nodes):
            raise UnsupportedWorkload(
                f"torch {torch.__version__} does not tag the operators of a checkpointed layer "
                "when AOTAutograd traces it, so the compiled step's partition cannot follow "
                "the checkpointing (torch 2.13 does)."
            )
        kwargs["static_lifetime_input_indices"] = static
        found["outputs"] = kwargs["num_fwd_outputs"]
        if partitioner == "min-cut":
            from torch._guards import detect_fake_mode
            from torch._inductor.virtualized import V

            # inductor's joint-graph passes (its random-seed pass) read the fake mode from
            # ``V``, as compile_fx sets it around AOTAutograd
            with V.set_fake_mode(detect_fake_mode(inputs)):
                graphs = _inductor_partition()(joint, inputs, **kwargs)
        else:
            from torch._functorch.partitioners import default_partition

            graphs = default_partition(joint, inputs, **kwargs)
        found["forward"], found["backward"] = graphs
        return graphs

    def keep(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
        del example_inputs  # nothing is compiled: the graphs are what is wanted
        return gm.forward

    decompositions: dict[Any, Callable[..., Any]] | None = None
    if partitioner == "min-cut":
        # some of inductor's decompositions (max pooling's) call into its lowering module,
        # which compile_fx has imported by the time inductor runs them
        importlib.import_module("torch._inductor.lowering")
        from torch._inductor.decomposition import select_decomp_table

        decompositions = dict(select_decomp_table())
    started = time.perf_counter()
    try:
        with (
            torch.fx.traceback.preserve_node_meta(tagged),
            _unpacked_sequences() if tagged else contextlib.nullcontext(),
        ):
            aot_module_simplified(
                step,  # type: ignore[arg-type]  # any module works: its forward is traced whole
                [batch[k] for k in keys],
                fw_compiler=keep,
                bw_compiler=keep,
                partition_fn=partition_fn,
                decompositions=decompositions,
            )
    except UnsupportedWorkload:
        raise
    except Exception as error:  # a trace that fails says why, as one line
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise UnsupportedWorkload(
            f"AOTAutograd could not trace this workload's training step "
            f"({type(error).__name__}: {first[:300]})."
        ) from error
    seconds = time.perf_counter() - started
    if "forward" not in found:
        raise UnsupportedWorkload(
            "AOTAutograd traced no backward pass for this step: nothing requires gradients."
        )
    forward, backward = found["forward"], found["backward"]
    return _saved(partitioner, forward, backward, found["outputs"], len(static), seconds)


def _inductor_partition() -> Callable[..., Any]:
    """``torch._inductor.compile_fx.partition_fn``, imported without the deprecation warnings
    that importing it raises in torch 2.13 (``torch.jit.script_method`` in
    ``torch.utils.mkldnn``)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from torch._inductor.compile_fx import partition_fn

    return partition_fn


def _storage(node: Any) -> tuple[Any, int] | None:
    """The storage of a graph node's tensor (a weak reference to compare) and its bytes."""
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    if not isinstance(value, torch.Tensor):
        return None
    storage = value.untyped_storage()
    return StorageWeakRef(storage), int(storage.nbytes())  # type: ignore[no-untyped-call]


def _saved(
    partitioner: Partitioner,
    forward: torch.fx.GraphModule,
    backward: torch.fx.GraphModule,
    user_outputs: int,
    static_inputs: int,
    seconds: float,
) -> Partition:
    """The saved tensors of a partitioned forward graph: its outputs after the first
    ``user_outputs`` (the step's own outputs), which the backward graph takes as inputs; its
    first ``static_inputs`` inputs are the parameters and buffers."""
    (output_node,) = (n for n in forward.graph.nodes if n.op == "output")
    outputs = list(output_node.args[0])
    held: dict[Any, HeldBy] = {}
    placeholders = [n for n in forward.graph.nodes if n.op == "placeholder"]
    for index, node in enumerate(placeholders):  # parameters and buffers first, then the batch
        if (found := _storage(node)) is not None:
            held.setdefault(found[0], "parameter" if index < static_inputs else "input")
    output_bytes = 0
    for node in outputs[:user_outputs]:
        found = _storage(node)
        if found is not None and found[0] not in held:
            held[found[0]] = "output"
            output_bytes += found[1]
    rows: list[tuple[int, SavedTensor]] = []
    for order, node in enumerate(outputs[user_outputs:]):
        found = _storage(node)
        if found is None:  # a saved size (SymInt) or RNG state: no tensor
            continue
        ref, storage_bytes = found
        value = node.meta["val"]
        held_by = held.get(ref)
        if held_by is None:
            held[ref] = "saved"
        rows.append(
            (
                order,
                SavedTensor(
                    name=node.name,
                    op="placeholder" if node.op == "placeholder" else str(node.target),
                    shape=tuple(int(s) for s in value.shape),
                    dtype=str(value.dtype),
                    tensor_bytes=int(value.numel()) * value.element_size(),
                    bytes=0 if held_by is not None else storage_bytes,
                    held_by=held_by,
                ),
            )
        )
    rows.sort(key=lambda row: (-row[1].bytes, -row[1].tensor_bytes, row[0]))
    saved = tuple(tensor for _, tensor in rows)
    forward_kernels, forward_unfused = _kernels(forward.graph)
    backward_kernels, backward_unfused = _kernels(backward.graph)
    return Partition(
        partitioner=partitioner,
        saved_bytes=sum(t.bytes for t in saved),
        saved=saved,
        output_bytes=output_bytes,
        forward_ops=_ops(forward),
        backward_ops=_ops(backward),
        trace_seconds=seconds,
        forward_kernels=forward_kernels,
        backward_kernels=backward_kernels,
        forward_unfused_bytes=forward_unfused,
        backward_unfused_bytes=backward_unfused,
    )


def _ops(graph: torch.fx.GraphModule) -> int:
    return sum(1 for n in graph.graph.nodes if n.op == "call_function")


# Which operators inductor leaves to a library kernel ("extern": cuBLAS, cuDNN, flash
# attention), each with its own launch and its own DRAM traffic, by aten name. Without
# max-autotune (torch.compile's default) a matrix product is a cuBLAS call with no epilogue
# fused into it.
_EXTERN_OPS = frozenset(
    {
        "mm",
        "addmm",
        "bmm",
        "baddbmm",
        "mv",
        "addmv",
        "dot",
        "_scaled_mm",
        "_int_mm",
        "_grouped_mm",
        "_scaled_grouped_mm",
        "convolution",
        "convolution_backward",
        "cudnn_convolution",
        "_convolution",
    }
)
_EXTERN_PREFIXES = (
    "_scaled_dot_product_",  # flash, efficient, cudnn, for_cpu; forward and backward
    "_flash_attention_",
    "_efficient_attention_",
    "_cudnn_attention_",
)

# Operators that only reinterpret their input's storage: no kernel, no bytes. ``reshape``
# of a non-contiguous tensor copies in eager mode, but AOTAutograd's graphs spell that copy
# as a ``clone`` (fusible) followed by a view.
_VIEW_OPS = frozenset(
    {
        "view",
        "_unsafe_view",
        "reshape",
        "_reshape_alias",
        "permute",
        "expand",
        "expand_as",
        "view_as",
        "t",
        "transpose",
        "alias",
        "detach",
        "slice",
        "select",
        "narrow",
        "squeeze",
        "unsqueeze",
        "as_strided",
        "diagonal",
        "unfold",
        "split",
        "split_with_sizes",
        "unsafe_split",
        "unbind",
        "chunk",
        "view_as_real",
        "view_as_complex",
    }
)

# Allocations whose contents are never read before written: no kernel, no bytes.
_FREE_OPS = frozenset(
    {"empty", "empty_like", "empty_strided", "empty_permuted", "new_empty", "new_empty_strided"}
)

# Operators that pick elements of their first input by index: they read what they pick.
_GATHER_OPS = frozenset({"embedding", "index", "_unsafe_index", "gather", "index_select", "take"})

_Role = Literal["input", "view", "item", "extern", "fusible", "free", "none"]


def _role(node: torch.fx.Node) -> _Role:
    """What a graph node is to the kernel grouping: a graph ``input`` (placeholder or
    constant), a ``view``, an ``item`` of a multi-output operator (``getitem``), an ``extern``
    or a ``fusible`` operator, a ``free`` allocation, or ``none`` (no tensor: sizes, the
    output node)."""
    if node.op in ("placeholder", "get_attr"):
        return "input"
    if node.op != "call_function":
        return "none"
    if not _values(node):
        return "none"  # a SymInt computation, an RNG seed as a Python number
    if node.target is operator.getitem:
        return "item"
    name = getattr(node.target, "_opname", getattr(node.target, "__name__", ""))
    if name in _VIEW_OPS:
        return "view"
    if name in _EXTERN_OPS or name.startswith(_EXTERN_PREFIXES):
        return "extern"
    if name in _FREE_OPS:
        return "free"
    return "fusible"


def _values(node: torch.fx.Node) -> list[torch.Tensor]:
    """The tensors a node makes (one, or the tensors of a tuple)."""
    value = node.meta.get("val")
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [v for v in value if isinstance(v, torch.Tensor)]
    return []


def _nbytes(node: torch.fx.Node) -> int:
    return sum(int(v.numel()) * v.element_size() for v in _values(node))


def _numel(node: torch.fx.Node) -> int:
    return max((int(v.numel()) for v in _values(node)), default=0)


def _gathered(node: torch.fx.Node) -> torch.fx.Node | None:
    """The tensor a gather (``embedding``, ``index``...) picks elements from, or None."""
    if getattr(node.target, "_opname", None) not in _GATHER_OPS or not node.args:
        return None
    source = node.args[0]
    return source if isinstance(source, torch.fx.Node) else None


Reads = dict[torch.fx.Node, dict[torch.fx.Node, int]]
"""What one operator (or one kernel) reads: tensor -> the nodes it reads it through (itself or
views of it) -> the bytes read through each."""


def _operator_reads(node: torch.fx.Node, base: dict[torch.fx.Node, torch.fx.Node]) -> Reads:
    reads: Reads = {}
    gathered = _gathered(node)
    for source in node.all_input_nodes:
        if source not in base:  # a size or a number, not a tensor
            continue
        read = _nbytes(source)
        if source is gathered:
            # a gather reads the rows it picks, at most one element per output element, not
            # the whole table (an embedding of 128k words reads the batch's tokens' rows)
            read = min(read, _numel(node) * _values(source)[0].element_size())
        reads.setdefault(base[source], {})[source] = read
    return reads


def _read_bytes(reads: Reads) -> int:
    """DRAM bytes of ``reads``: per tensor, what the views read cover (two halves of a slice:
    the whole), never more than the tensor itself (a broadcast reads its input once; the
    cache serves the repeats)."""
    return sum(min(_nbytes(tensor), sum(through.values())) for tensor, through in reads.items())


def _kernels(graph: torch.fx.Graph) -> tuple[tuple[FusedKernel, ...], int]:
    """Group ``graph``'s operators into the kernels inductor would run, to first order, and
    count the bytes its fusible operators move when each is its own kernel.

    Extern operators (``_EXTERN_OPS``, attention) are a kernel each. Views are no kernel and
    pass their input through. Every other operator is fusible: pointwise, casts, reductions,
    gathers (``embedding``), scatters, random numbers, ``cat``. Fusible operators joined by a
    producer-consumer edge (views in between included) share a kernel, with one restriction:
    both must lie at the same extern depth (the most extern kernels on any path from the
    graph's inputs), so that no kernel holds two operators with an extern between them, which
    no scheduler can fuse (inductor's ``Scheduler.will_fusion_create_cycle``). Without it a
    transformer's residual stream would join every layer's additions and norms into one
    "kernel" around the matrix products.

    Simplifications, each a choice of this first-order model:
    - A connected group at one depth is kept whole. Inductor fuses a reduction with the
      pointwise work over the tensor it reduces, before and after it
      (``SIMDScheduling.can_fuse``: a pointwise node of ``numel`` equal to a reduction's
      ``numel x rnumel`` fuses with it, either way round; the "persistent reduction" keeps the
      reduced rows on chip), which keeps a norm or a softmax with its neighbours in one kernel
      as here. What the group does not split: reductions over different axes of one tensor
      (a norm's per-token statistics and its weight's gradient, summed over the tokens), which
      inductor runs as separate kernels, and pointwise nodes of unrelated sizes.
    - An intermediate used by two groups is written once and read by each (inductor may
      instead recompute a cheap pointwise one inside each consumer).
    - Groups that share only an input stay separate (inductor's horizontal fusion, of kernels
      of one size reading a common buffer, is not modelled), and so do the fusible operators
      on either side of a matrix product (no epilogue fusion into cuBLAS calls).
    """
    nodes = list(graph.nodes)
    roles = {n: _role(n) for n in nodes}
    base: dict[torch.fx.Node, torch.fx.Node] = {}  # view or getitem -> the tensor it shows
    owner: dict[torch.fx.Node, torch.fx.Node | None] = {}  # tensor -> the operator making it
    for n in nodes:
        role = roles[n]
        source = n.args[0] if n.args and isinstance(n.args[0], torch.fx.Node) else None
        if source is not None and (role == "view" or (role == "item" and roles[source] == "view")):
            base[n] = base.get(source, source)  # a getitem of ``split`` is a view too
        elif role == "item" and source is not None:
            base[n] = n
            owner[n] = source if roles[source] in ("extern", "fusible") else None
        elif role in ("extern", "fusible"):
            base[n] = owner[n] = n
        elif role in ("input", "free"):
            base[n] = n
            owner[n] = None
    operators = [n for n in nodes if roles[n] in ("extern", "fusible")]
    reads = {n: _operator_reads(n, base) for n in (*operators, *graph.find_nodes(op="output"))}
    users: dict[torch.fx.Node, list[torch.fx.Node]] = {}  # tensor -> operators, output node
    for n, read_by_n in reads.items():
        for tensor in read_by_n:
            users.setdefault(tensor, []).append(n)
    makers = {n: {m for t in reads[n] if (m := owner.get(t)) is not None} for n in operators}
    made: dict[torch.fx.Node, list[torch.fx.Node]] = {}  # operator -> the tensors it makes
    for tensor, maker in owner.items():
        if maker is not None:
            made.setdefault(maker, []).append(tensor)

    consumers = {
        n: [u for t in made.get(n, []) for u in users.get(t, []) if u in makers] for n in operators
    }
    # Two ways to stage the operators so that operators of one stage never have an extern
    # kernel between them: by depth, the most extern kernels on a path from the graph's
    # inputs (as soon as possible), and by height, the most on a path to its outputs (as late
    # as possible). An operator that reads no tensor (``full``, ``iota``) goes by depth to the
    # smallest depth of its consumers (externs included, so that no path leaves its stage
    # through an extern and comes back): inductor computes such a constant in the kernel that
    # uses it.
    depth: dict[torch.fx.Node, int] = {}
    for n in operators:
        depth[n] = max((depth[m] + (roles[m] == "extern") for m in makers[n]), default=0)
    for n in operators:
        if roles[n] == "fusible" and not reads[n]:
            depth[n] = min((depth[u] for u in consumers[n]), default=0)
    height: dict[torch.fx.Node, int] = {}
    for n in reversed(operators):
        height[n] = max((height[u] + (roles[u] == "extern") for u in consumers[n]), default=0)

    def fuse(stage: dict[torch.fx.Node, int]) -> list[tuple[int, FusedKernel]]:
        """The fused kernels when fusible neighbours of one ``stage`` share a kernel."""
        parent: dict[torch.fx.Node, torch.fx.Node] = {n: n for n in operators}

        def find(n: torch.fx.Node) -> torch.fx.Node:
            while parent[n] is not n:
                parent[n] = parent[parent[n]]
                n = parent[n]
            return n

        for n in operators:
            for m in makers[n]:
                if roles[n] == roles[m] == "fusible" and stage[m] == stage[n]:
                    parent[find(m)] = find(n)
        groups: dict[torch.fx.Node, list[torch.fx.Node]] = {}
        for n in operators:
            if roles[n] == "fusible":
                groups.setdefault(find(n), []).append(n)
        return [_fused(members, reads, owner, made, users, order) for members in groups.values()]

    order = {n: i for i, n in enumerate(nodes)}
    # Both stagings give kernels inductor could run; its scheduler fuses greedily where that
    # saves the most memory traffic, so keep the staging that moves fewer bytes.
    fused = min(
        (fuse(depth), fuse(height)),
        key=lambda found: (sum(k.bytes for _, k in found), len(found)),
    )
    kernels: list[tuple[int, FusedKernel]] = [
        (
            order[n],
            FusedKernel(
                kind="extern",
                name=str(n.target),
                bytes_read=_read_bytes(reads[n]),
                bytes_written=_nbytes(n),
                flops=0,
                nodes=1,
            ),
        )
        for n in operators
        if roles[n] == "extern"
    ]
    kernels.extend(fused)
    kernels.sort(key=lambda row: row[0])
    # eager: every fusible operator reads all its inputs and writes all its outputs
    unfused = sum(_read_bytes(reads[n]) + _nbytes(n) for n in operators if roles[n] == "fusible")
    return tuple(k for _, k in kernels), unfused


def _elements(node: torch.fx.Node) -> int:
    """The elements a fusible operator processes: the most of its outputs' and its inputs'
    (a reduction processes its input; a gather, its output, not the table it picks from)."""
    gathered = _gathered(node)
    inputs = [_numel(s) for s in node.all_input_nodes if s is not gathered]
    return max([_numel(node), *inputs])


def _fused(
    members: list[torch.fx.Node],
    reads: dict[torch.fx.Node, Reads],
    owner: dict[torch.fx.Node, torch.fx.Node | None],
    made: dict[torch.fx.Node, list[torch.fx.Node]],
    users: dict[torch.fx.Node, list[torch.fx.Node]],
    order: dict[torch.fx.Node, int],
) -> tuple[int, FusedKernel]:
    """The kernel of the fusible operators ``members`` (in graph order), with the graph
    position of its first."""
    inside = set(members)
    outside: Reads = {}  # what the kernel reads that is made outside it, each view once
    for m in members:
        for tensor, through in reads[m].items():
            if owner.get(tensor) not in inside:
                merged = outside.setdefault(tensor, {})
                for view, size in through.items():
                    merged[view] = max(merged.get(view, 0), size)
    written = sum(
        _nbytes(tensor)
        for m in members
        for tensor in made.get(m, [])
        if any(u not in inside for u in users.get(tensor, ()))
    )
    first, last = members[0].name, members[-1].name
    return order[members[0]], FusedKernel(
        kind="fused",
        name=first if len(members) == 1 else f"{first}..{last}",
        bytes_read=_read_bytes(outside),
        bytes_written=written,
        flops=sum(_elements(m) for m in members),
        nodes=len(members),
    )
