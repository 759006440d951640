"""The user's own model: a Hugging Face ``config.json`` (``--config FILE``) or a Python function
that builds a PyTorch model (``--model FILE.py:FUNCTION`` or ``--model package.module:FUNCTION``).

Over 600 lines because both ways in share the batch handling (resizing an example batch, the
weight dtype, reading sizes under fake tensors) and the error messages that name the user's
file; the ``--model`` protocol (what the function may return, ``model_defaults``, the rules
fake tensors impose) is described, with examples, in ``docs/workloads.md`` ("Your own model").
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import inspect
import json
import os
import re
import sys
import traceback
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from whichgpu.errors import UnsupportedWorkload, UsageError, WhichGpuError, WorkloadError
from whichgpu.schema import RunConfig, ThroughputUnit, WorkloadInfo
from whichgpu.workloads.base import Batch, BuiltWorkload, Workload, keyword_inference
from whichgpu.workloads.config_tasks import (
    Task,
    batch_maker,
    check_task,
    class_for,
    host_linspace,
    inference_forward,
    task_choices,
    task_config,
    task_of,
    task_shape,
)
from whichgpu.workloads.hf import (
    build_hf_model,
    default_dtype,
    layer_count,
    loss_from_output,
    skip_init_when_fake,
    weight_dtype,
    with_layers,
)
from whichgpu.workloads.profile_cache import source_digest

if TYPE_CHECKING:
    import torch

SIZE_FIELDS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "vocab_size",
    "max_position_embeddings",
    "head_dim",
    "num_local_experts",
    "num_experts_per_tok",
)
"""Config fields that size the model: whole numbers from 1 up where a config gives them (a
fraction or a boolean would be coerced by the model class; 0 would lift a length limit)."""


def read_user_config(path: Path, task: Task | None = None) -> tuple[dict[str, Any], Task]:
    """The user's Hugging Face config file as a dict, its ``architectures`` set to the class
    ``task`` asks for (or as the file names it), and the task; ``UsageError`` otherwise."""
    try:
        config: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"Cannot read --config {path}: {exc.strerror}.") from exc
    except UnicodeDecodeError as exc:
        raise UsageError(f"--config {path} is not UTF-8 text; give a config.json.") from exc
    except json.JSONDecodeError as exc:
        raise UsageError(f"--config {path} is not valid JSON: {exc}.") from exc
    if not isinstance(config, dict) or "model_type" not in config:
        raise UsageError(f"--config {path} has no 'model_type'; is it a Hugging Face config.json?")
    for key in SIZE_FIELDS:
        value = config.get(key)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise UsageError(
                f"--config {path}: '{key}' must be a whole number from 1 up, not "
                f"{json.dumps(value)}."
            )
    named = config.get("architectures") or []
    if not isinstance(named, list) or not all(isinstance(a, str) for a in named):
        raise UsageError(
            f"--config {path}: 'architectures' must be a list of class names, e.g. "
            f'["LlamaForCausalLM"], not {json.dumps(named)}.'
        )
    architectures = list(named)
    if not architectures:
        raise UsageError(
            f"--config {path} names no 'architectures' (the model class, e.g. "
            '"architectures": ["LlamaForCausalLM"]); add it to the file.'
        )
    if task is not None:
        chosen = class_for(architectures[0], task, config)
        return {**config, "architectures": [chosen]}, task
    found = task_of(architectures[0], config)
    if found is None:
        raise UnsupportedWorkload(
            f"Cannot tell the task of '{architectures[0]}'; pass --task {task_choices()}."
        )
    return {**config, "architectures": architectures}, found


def config_workload(path: Path, task: Task | None = None) -> Workload:
    """A workload built from the user's config file, for its task (``config_tasks``)."""
    named, resolved_task = read_user_config(path, task)
    config = task_config(resolved_task, named)
    architectures = config["architectures"]
    check_task(path, resolved_task, config)
    shape = task_shape(resolved_task, config)
    if shape.needs_vocab and int(config.get("vocab_size", 0)) <= 0:
        raise UsageError(f"--config {path} has no 'vocab_size'.")

    per_token = shape.throughput_unit == "tokens"  # target tokens of an encoder-decoder

    def build(run: RunConfig) -> BuiltWorkload:
        return built(_config_model(path, config, run))

    def build_with_layers(run: RunConfig, layers: int) -> BuiltWorkload:
        return built(_config_model(path, with_layers(config, layers), run))

    def built(model: torch.nn.Module) -> BuiltWorkload:
        return BuiltWorkload(
            model=model,
            make_batch=batch_maker(resolved_task, config, architectures[0], model),
            loss=loss_from_output,
            units_per_sample=lambda seq_len: (
                int(seq_len or shape.default_seq_len or 1) if per_token else 1
            ),
            forward=inference_forward,
        )

    info = WorkloadInfo(
        name=str(path),
        family="user",
        task=resolved_task,
        description=f"{architectures[0]} from {path.name}",
        input_desc=shape.input_desc,
        throughput_unit=shape.throughput_unit,
        default_batch_size=1,
        default_seq_len=shape.default_seq_len,
        is_sequence_model=shape.is_sequence_model,
        max_seq_len=shape.max_seq_len,
    )
    identity = json.dumps({"config": config, "task": resolved_task}, sort_keys=True)
    digest = hashlib.sha256(identity.encode()).hexdigest()
    # an encoder-decoder has two stacks (BART's and Whisper's num_hidden_layers is one of them)
    layers = None if shape.two_stacks or config.get("is_encoder_decoder") else layer_count(config)
    return Workload(
        info=info,
        build=build,
        source_digest=digest,
        layers=layers,
        build_with_layers=build_with_layers if layers is not None else None,
    )


def _config_model(path: Path, config: Mapping[str, Any], run: RunConfig) -> torch.nn.Module:
    """The model of the user's config; a config ``transformers`` refuses (a ``hidden_size`` not
    divisible by ``num_attention_heads`` …) is a ``UsageError`` that names the fields."""
    try:
        with host_linspace():
            return build_hf_model(dict(config), run)
    except Exception as exc:
        if not _is_config_error(exc):
            raise
        cause = exc.__cause__ if exc.__cause__ is not None else exc
        message = str(cause).strip().rstrip(".")
        named = _fields_named(config, message, getattr(exc, "field", None))
        fields = (
            f" Check {', '.join(named)} in the file."
            if named
            else " Check the model's size fields in the file."
        )
        raise UsageError(
            f"--config {path}: transformers refuses this {config.get('model_type')} config: "
            f"{message}.{fields}"
        ) from exc


def _is_config_error(exc: BaseException) -> bool:
    """Whether ``exc`` is ``transformers`` refusing a config's values (its strict dataclass
    validation, or the ``ValueError`` older configs raise)."""
    try:
        from huggingface_hub.errors import StrictDataclassError
    except ImportError:  # pragma: no cover - older huggingface_hub: ValueError only
        return isinstance(exc, ValueError)
    return isinstance(exc, StrictDataclassError | ValueError)


def _fields_named(config: Mapping[str, Any], message: str, field: object) -> list[str]:
    """``'hidden_size' (1000)`` for each config field the error names, by key (``head_dim``)
    or in words (``hidden size``, ``number of attention heads`` for ``num_attention_heads``)."""
    text = message.lower()
    named: list[str] = []
    for key, value in config.items():
        if isinstance(value, dict | list):
            continue
        words = key.lower().replace("_", " ")
        bare = words.removeprefix("num ")
        if key == field or key in text or words in text or (bare != words and bare in text):
            named.append(f"'{key}' ({json.dumps(value)})")
    return named


# --- --model FILE.py:FUNCTION / package.module:FUNCTION ------------------------------------


class UserModelError(WorkloadError):
    """The ``--model`` function could not be loaded, called or run; the message says which."""


_TRACEBACK_LOGGERS = ("torch._subclasses.fake_tensor",)
"""torch loggers that log a whole traceback when an operator fails under fake tensors (a shape
mistake in the user's model), before the exception whichgpu reports in one line."""


@contextlib.contextmanager
def _quiet_torch() -> Iterator[None]:
    """Silence ``_TRACEBACK_LOGGERS`` while the user's code runs (the error is reported anyway,
    as a ``UserModelError``); their levels are restored afterwards."""
    import logging

    loggers = [logging.getLogger(name) for name in _TRACEBACK_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def _exit_error(spec: str, what: str, exc: SystemExit) -> UserModelError:
    """A ``sys.exit`` in the user's code as an error that says where and what to do."""
    frames = [
        f
        for f in traceback.extract_tb(exc.__traceback__)
        if not f.filename.startswith(_PACKAGE_DIR) and "site-packages" not in f.filename
    ]
    where = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return UserModelError(
        f"--model {spec}: {what} called sys.exit({exc.code!r}){where}. A model file must not "
        'exit: put script code under `if __name__ == "__main__":` so that importing the '
        "file and calling the function only build the model."
    )


class MakeBatch(Protocol):
    """``make_batch(batch_size, seq_len) -> dict``: the keyword inputs of one step."""

    def __call__(self, batch_size: int, seq_len: int | None) -> Mapping[str, Any]: ...


class LossFn(Protocol):
    """``loss(model, batch) -> scalar tensor``: one forward pass and its training loss."""

    def __call__(self, model: torch.nn.Module, batch: Mapping[str, Any]) -> torch.Tensor: ...


ExampleBatch = Any
"""An example batch: a tensor, a tuple or list of them (the model's positional inputs) or a
dict of them (its keyword inputs); sized along the first dimension."""

UserModel = (
    tuple["torch.nn.Module", MakeBatch]
    | tuple["torch.nn.Module", MakeBatch, LossFn]
    | tuple["torch.nn.Module", ExampleBatch]
    | tuple["torch.nn.Module", ExampleBatch, Callable[["torch.nn.Module", ExampleBatch], Any]]
    | BuiltWorkload
)
"""What a ``--model`` function returns."""


@dataclass(frozen=True)
class ModelDefaults:
    """What ``model_defaults`` declares about a ``--model`` function."""

    batch_size: int | None = None
    """Samples per step when no --batch-size is given; None: an example batch's first
    dimension, else 1."""
    seq_len: int | None = None
    """Default sequence length; set for models that take sequences (then --seq-len applies)."""
    unit: ThroughputUnit | None = None
    """Throughput unit; default ``tokens`` (``seq_len`` per sample) with ``seq_len``, else
    ``samples``."""


_DEFAULTS_ATTRIBUTE = "__whichgpu_defaults__"
_PACKAGE_DIR = str(Path(__file__).resolve().parents[1])
"""whichgpu's own source, left out when an error names the line of the user's code."""
_F = TypeVar("_F", bound=Callable[..., Any])


def model_defaults(
    *, batch_size: int | None = None, seq_len: int | None = None, unit: ThroughputUnit | None = None
) -> Callable[[_F], _F]:
    """Declare a ``--model`` function's default batch size, sequence length and unit::

    @model_defaults(batch_size=8, seq_len=512)
    def build(run): ...
    """
    if (batch_size is not None and batch_size < 1) or (seq_len is not None and seq_len < 1):
        raise ValueError("model_defaults: batch_size and seq_len must be at least 1")
    declared = ModelDefaults(batch_size=batch_size, seq_len=seq_len, unit=unit)

    def mark(function: _F) -> _F:
        setattr(function, _DEFAULTS_ATTRIBUTE, declared)
        return function

    return mark


def model_workload(spec: str) -> Workload:
    """The workload of ``--model FILE.py:FUNCTION`` or ``--model package.module:FUNCTION``.

    Imports the file or module now (errors surface before any tracing); calls the function
    only in ``build``, under the caller's fake-tensor mode.
    """
    target, _, name = spec.rpartition(":")
    if not target or not name.isidentifier():
        raise UsageError(
            f"--model {spec}: expected FILE.py:FUNCTION or package.module:FUNCTION, e.g. "
            "--model my_model.py:build."
        )
    is_file = target.endswith(".py") or "/" in target or os.sep in target
    module, directory = _import_file(spec, Path(target)) if is_file else _import_module(spec)
    where = target if is_file else f"module {target}"
    function = _find_function(spec, module, name, where)
    takes_run = _takes_run(spec, function)
    declared = getattr(function, _DEFAULTS_ATTRIBUTE, None)
    defaults = declared if isinstance(declared, ModelDefaults) else ModelDefaults()
    unit: ThroughputUnit = defaults.unit or ("tokens" if defaults.seq_len else "samples")
    default_batch = defaults.batch_size or _example_size(function, takes_run, directory) or 1

    def build(run: RunConfig) -> BuiltWorkload:
        with (
            _on_path(directory),
            default_dtype(weight_dtype(run)),
            skip_init_when_fake(),
            _quiet_torch(),
        ):
            try:
                result = function(run) if takes_run else function()
            except WhichGpuError:
                raise
            except SystemExit as exc:
                raise _exit_error(spec, f"{name}()", exc) from exc
            except Exception as exc:
                raise UserModelError(f"--model {spec} raised {_describe(exc)}") from exc
        return _built(spec, result, run, unit, defaults)

    info = WorkloadInfo(
        name=spec,
        family="user",
        task="your model (--model)",
        description=f"{name}() from {target}",
        input_desc="your batch",
        throughput_unit=unit,
        default_batch_size=default_batch,
        default_seq_len=defaults.seq_len,
        is_sequence_model=defaults.seq_len is not None,
    )
    return Workload(info=info, build=build, source_digest=source_digest(_sources_folder(module)))


def _sources_folder(module: ModuleType) -> Path:
    """The folder of the user's model code: the file's own, or its top package's."""
    top = sys.modules.get(module.__name__.partition(".")[0], module)
    origin = Path(getattr(top, "__file__", None) or getattr(module, "__file__", None) or ".")
    return origin.resolve().parent


@contextlib.contextmanager
def _on_path(directory: Path) -> Iterator[None]:
    """``directory`` first on ``sys.path`` while the user's code runs, so that it can import
    its sibling modules; removed afterwards (unless it was there already)."""
    entry = str(directory)
    if entry in sys.path:
        yield
        return
    sys.path.insert(0, entry)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(entry)


def _import_file(spec: str, path: Path) -> tuple[ModuleType, Path]:
    if not path.is_file():
        raise UsageError(f"--model {spec}: no such file '{path}'.")
    module_name = "whichgpu_user_model_" + re.sub(r"\W", "_", path.stem)
    loader_spec = importlib.util.spec_from_file_location(module_name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise UsageError(f"--model {spec}: '{path}' is not a Python file.")
    module = importlib.util.module_from_spec(loader_spec)
    directory = path.resolve().parent
    sys.modules[module_name] = module  # dataclasses and pickling look modules up by name
    with _on_path(directory):
        try:
            loader_spec.loader.exec_module(module)
        except SystemExit as exc:
            del sys.modules[module_name]
            raise _exit_error(spec, f"importing {path}", exc) from exc
        except Exception as exc:
            del sys.modules[module_name]
            raise UserModelError(
                f"--model {spec}: importing {path} raised {_describe(exc)}"
            ) from exc
    return module, directory


def _import_module(spec: str) -> tuple[ModuleType, Path]:
    target = spec.rpartition(":")[0]
    directory = Path.cwd()
    with _on_path(directory):
        try:
            return importlib.import_module(target), directory
        except SystemExit as exc:
            raise _exit_error(spec, f"importing {target}", exc) from exc
        except ModuleNotFoundError as exc:
            missing = exc.name or ""
            if target == missing or target.startswith(missing + "."):
                raise UsageError(
                    f"--model {spec}: no module named '{missing}' (looked in the current "
                    "directory and the installed packages); for a file, write path/to/file.py."
                ) from exc
            raise UserModelError(
                f"--model {spec}: importing {target} raised {_describe(exc)}"
            ) from exc
        except Exception as exc:
            raise UserModelError(
                f"--model {spec}: importing {target} raised {_describe(exc)}"
            ) from exc


def _find_function(spec: str, module: ModuleType, name: str, where: str) -> Callable[..., Any]:
    function = getattr(module, name, None)
    if function is None:
        defined = sorted(
            n
            for n, v in vars(module).items()
            if inspect.isfunction(v) and v.__module__ == module.__name__ and not n.startswith("_")
        )
        listed = f" Functions there: {', '.join(defined)}." if defined else ""
        raise UsageError(f"--model {spec}: {where} has no function '{name}'.{listed}")
    if not callable(function):
        raise UsageError(
            f"--model {spec}: '{name}' in {where} is {_kind(function)}, not a function."
        )
    return function  # type: ignore[no-any-return]


def _takes_run(spec: str, function: Callable[..., Any]) -> bool:
    """Whether the function takes the ``RunConfig`` (one parameter) or nothing."""
    try:
        parameters = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):
        return True
    positional = [
        p
        for p in parameters
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]
    if len(positional) > 1:
        raise UsageError(
            f"--model {spec}: the function takes {len(positional)} arguments; it should take "
            "the run configuration (one argument) or nothing."
        )
    return bool(positional) or any(p.kind == p.VAR_POSITIONAL for p in parameters)


def _describe(exc: BaseException) -> str:
    """``Type: message (file:line)``, the line being the innermost frame outside whichgpu and
    torch, with a hint when fake tensors were the cause."""
    text = f"{type(exc).__name__}: {exc}".strip().rstrip(".")
    frames = [
        f
        for f in traceback.extract_tb(exc.__traceback__)
        if "site-packages" not in f.filename and not f.filename.startswith(_PACKAGE_DIR)
    ]
    if frames:
        text += f" (at {frames[-1].filename}:{frames[-1].lineno})"
    if "DataDependent" in type(exc).__name__ or "DynamicOutputShape" in type(exc).__name__:
        text += (
            ". The model is traced with fake tensors, which have shapes but no values: the step "
            "cannot depend on tensor values (.item(), nonzero, boolean masks)"
        )
    return text + "."


def _kind(value: object) -> str:
    """``a tuple of 2 (Sequential, function)``, ``an int``: what a value is, for messages."""
    if isinstance(value, tuple):
        return f"a tuple of {len(value)} ({', '.join(type(v).__name__ for v in value)})"
    name = type(value).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def _built(
    spec: str, result: object, run: RunConfig, unit: ThroughputUnit, defaults: ModelDefaults
) -> BuiltWorkload:
    """Check what the function returned and wrap it with clear errors."""
    import torch

    expected = "(model, batch), (model, make_batch), either with a loss, or a BuiltWorkload"
    if isinstance(result, BuiltWorkload):
        built = result
    elif isinstance(result, tuple) and len(result) in (2, 3):
        model, feed, *rest = result
        user_loss = rest[0] if rest else None
        if not isinstance(model, torch.nn.Module):
            raise UserModelError(
                f"--model {spec} returned {_kind(result)}; the first item must be the model "
                f"(a torch.nn.Module), in {expected}."
            )
        if user_loss is not None and not callable(user_loss):
            raise UserModelError(
                f"--model {spec} returned {_kind(result)}; the loss must be a function "
                f"loss(model, batch), in {expected}."
            )
        example = _example_of(feed)
        if example is None and not callable(feed):
            raise UserModelError(
                f"--model {spec} returned {_kind(result)}; the second item must be a batch "
                "(a tensor, or a tuple, list or dict of tensors) or a function "
                f"make_batch(batch_size, seq_len), in {expected}."
            )

        def units_per_sample(seq_len: int | None) -> int:
            return int(seq_len or defaults.seq_len or 1) if unit == "tokens" else 1

        if example is None:
            make_batch = _checked_batch(spec, feed, run)
            loss = _checked_loss(spec, user_loss, _keyword_forward)
            forward = keyword_inference
        else:
            make_batch = example.batch_maker(spec, defaults.seq_len)
            loss = _checked_loss(spec, example.with_users_batch(user_loss), example.forward)
            forward = example.forward
        built = BuiltWorkload(
            model=model,
            make_batch=make_batch,
            loss=loss,
            units_per_sample=units_per_sample,
            # With a loss, it alone knows how the model takes the batch: inference runs it.
            forward=loss if user_loss is not None else _checked_forward(spec, forward),
        )
    else:
        raise UserModelError(f"--model {spec} returned {_kind(result)}; expected {expected}.")
    _check_fake(spec, built.model)
    return built


_POSITIONAL = "inputs"
"""The batch key under which an example's positional inputs travel (a tuple)."""


@dataclass(frozen=True)
class _Example:
    """The user's example batch, held on the CPU and repeated along its first dimension to
    make a batch of another size."""

    value: Any
    """The example as the function returned it (its tensors moved to the CPU)."""
    size: int
    """Its batch size: the first dimension of its first tensor."""

    @property
    def positional(self) -> bool:
        """Whether the example holds positional inputs (a tensor, tuple or list)."""
        return not isinstance(self.value, Mapping)

    def resized(self, batch_size: int) -> Batch:
        """The batch of ``batch_size`` samples, as ``BuiltWorkload`` carries it: the example's
        tensors whose first dimension is the example's size hold ``batch_size`` rows (row ``i``
        a copy of row ``i mod size``); other items are kept as they are."""
        import torch

        def resize(leaf: Any) -> Any:
            if not isinstance(leaf, torch.Tensor) or leaf.dim() == 0:
                return leaf
            if leaf.shape[0] != self.size or batch_size == self.size:
                return leaf
            rows = torch.arange(batch_size, device=leaf.device) % self.size
            return leaf.index_select(0, rows)

        value = torch.utils._pytree.tree_map(resize, self.value)
        if self.positional:
            return {_POSITIONAL: tuple(value) if isinstance(value, (tuple, list)) else (value,)}
        return dict(value)

    def as_given(self, batch: Batch) -> Any:
        """``batch`` in the form the user gave the example (a tensor, tuple, list or dict)."""
        if not self.positional:
            return batch
        inputs = batch[_POSITIONAL]
        if isinstance(self.value, list):
            return list(inputs)
        return inputs if isinstance(self.value, tuple) else inputs[0]

    def forward(self, model: torch.nn.Module, batch: Batch) -> Any:
        """The model on ``batch``: positional inputs, or the keyword inputs but ``labels``."""
        if self.positional:
            return model(*batch[_POSITIONAL])
        return keyword_inference(model, batch)

    def with_users_batch(self, user_loss: Callable[..., Any] | None) -> Callable[..., Any] | None:
        """``user_loss`` called with the batch in the form the user gave (None stays None)."""
        if user_loss is None:
            return None
        return lambda model, batch: user_loss(model, self.as_given(batch))

    def batch_maker(self, spec: str, declared_seq_len: int | None) -> MakeBatch:
        """``make_batch`` for the example: any batch size, the example's sequence length."""

        def make_batch(batch_size: int, seq_len: int | None) -> Mapping[str, Any]:
            if seq_len is not None and seq_len != declared_seq_len:
                raise UsageError(
                    f"--model {spec} returns an example batch, whose shapes fix the sequence "
                    f"length ({declared_seq_len}); to vary it, return make_batch(batch_size, "
                    "seq_len) instead of the batch."
                )
            return self.resized(batch_size)

        return make_batch


def _example_of(feed: object) -> _Example | None:
    """``feed`` as an example batch, or None when it is not one (a function, or no tensor)."""
    import torch

    if callable(feed) or not isinstance(feed, (torch.Tensor, tuple, list, Mapping)):
        return None
    tensors = [
        leaf
        for leaf in torch.utils._pytree.tree_flatten(feed)[0]
        if isinstance(leaf, torch.Tensor) and leaf.dim() > 0
    ]
    if not tensors:
        return None
    on_cpu = torch.utils._pytree.tree_map(
        lambda leaf: leaf.cpu() if isinstance(leaf, torch.Tensor) else leaf, feed
    )
    return _Example(value=on_cpu, size=int(tensors[0].shape[0]))


def _example_size(function: Callable[..., Any], takes_run: bool, directory: Path) -> int | None:
    """The batch size of the example batch ``function`` returns (called once, under fake
    tensors), or None when it returns ``make_batch`` or something else. A failure is left to
    the real call, which reports it with the run's own configuration."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    run = RunConfig()
    try:
        with (
            FakeTensorMode(),
            _on_path(directory),
            default_dtype(weight_dtype(run)),
            skip_init_when_fake(),
            _quiet_torch(),
        ):
            result = function(run) if takes_run else function()
            example = (
                _example_of(result[1])
                if isinstance(result, tuple) and len(result) in (2, 3)
                else None
            )
    except (Exception, SystemExit):
        return None
    return example.size if example is not None else None


def _check_fake(spec: str, model: torch.nn.Module) -> None:
    """Under fake tensors, every weight must be fake: one built at import holds real memory."""
    from torch._guards import active_fake_mode
    from torch._subclasses.fake_tensor import FakeTensor

    if active_fake_mode() is None:
        return
    if any(not isinstance(t, FakeTensor) for t in [*model.parameters(), *model.buffers()]):
        raise UserModelError(
            f"--model {spec} returned a model whose weights already existed: whichgpu calls the "
            "function under fake tensors (no memory, no GPU), so the function must create the "
            "model itself, not return one built at import."
        )


def _checked_batch(spec: str, make_batch: Callable[..., Any], run: RunConfig) -> MakeBatch:
    def checked(batch_size: int, seq_len: int | None) -> Mapping[str, Any]:
        with default_dtype(weight_dtype(run)), _quiet_torch():
            try:
                batch = make_batch(batch_size, seq_len)
            except WhichGpuError:
                raise
            except SystemExit as exc:
                raise _exit_error(spec, "make_batch", exc) from exc
            except Exception as exc:
                raise UserModelError(
                    f"make_batch of --model {spec} raised {_describe(exc)}"
                ) from exc
        if not isinstance(batch, Mapping):
            raise UserModelError(
                f"make_batch of --model {spec} returned {_kind(batch)}; it must return a dict "
                "of the model's keyword inputs, e.g. {'x': torch.randn(batch_size, 784)}."
            )
        return batch

    return checked


def _keyword_forward(model: torch.nn.Module, batch: Batch) -> Any:
    """The model on the batch's items as keyword inputs, ``labels`` included (``transformers``
    models return their loss when given them)."""
    return model(**batch)


def _checked_forward(
    spec: str, forward: Callable[[torch.nn.Module, Batch], Any]
) -> Callable[[torch.nn.Module, Batch], Any]:
    """``forward`` (an inference step) with its errors reported as the user's."""

    def checked(model: torch.nn.Module, batch: Batch) -> Any:
        try:
            with _quiet_torch():
                return forward(model, batch)
        except WhichGpuError:
            raise
        except SystemExit as exc:
            raise _exit_error(spec, "the forward pass", exc) from exc
        except Exception as exc:
            raise UserModelError(
                f"the forward pass of --model {spec} raised {_describe(exc)}"
            ) from exc

    return checked


def _checked_loss(
    spec: str,
    user_loss: Callable[..., Any] | None,
    forward: Callable[[torch.nn.Module, Batch], Any],
) -> LossFn:
    """``user_loss``, or the loss read off ``forward``'s output, with clear errors."""

    def checked(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
        import torch

        try:
            with _quiet_torch():
                value = user_loss(model, batch) if user_loss else output_loss(forward(model, batch))
        except WhichGpuError:
            raise
        except SystemExit as exc:
            raise _exit_error(spec, "the loss", exc) from exc
        except Exception as exc:
            what = "loss" if user_loss else "the forward pass"
            raise UserModelError(f"{what} of --model {spec} raised {_describe(exc)}") from exc
        if not isinstance(value, torch.Tensor) or value.numel() != 1:
            raise UserModelError(
                f"the loss of --model {spec} is {_kind(value)} of shape "
                f"{tuple(getattr(value, 'shape', ()))}; it must be a single number (a scalar "
                "tensor)."
            )
        return value

    return checked


def output_loss(output: object) -> torch.Tensor:
    """The training loss read off a model's output: the output itself if it is one number,
    its ``loss`` (attribute or key), else the sum of its floating-point tensors."""
    import torch

    if isinstance(output, torch.Tensor) and output.numel() == 1:
        return output
    loss = output.get("loss") if isinstance(output, Mapping) else getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    leaves = [t for t in _tensors(output) if t.is_floating_point()]
    if not leaves:
        raise UserModelError(
            f"The model returned {_kind(output)}, with no floating-point tensor to train on; "
            "return (model, make_batch, loss) with a loss function."
        )
    total = leaves[0].sum()
    for leaf in leaves[1:]:
        total = total + leaf.sum()
    return total


def _tensors(value: object) -> Iterator[torch.Tensor]:
    import torch

    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)
