"""fp8 training as the bench runs it: torchao's ``Float8Linear`` swapped into a built model.

``--precision fp8`` is bf16 AMP (fp32 master weights, autocast to bf16) with the model's linear
layers replaced by torchao's ``Float8Linear`` (``torchao.float8.convert_to_float8_training``,
its default tensorwise dynamic scaling: e4m3 for inputs and weights, e5m2 for output
gradients), the same layers ``whichgpu.estimate.fp8`` converts in its estimate: every
``nn.Linear`` whose input and output sizes are multiples of 16 (``torch._scaled_mm``'s
requirement), except the last one the model registers (a language model's output
projection), which torchao's README leaves in bf16 too. ``--fp8-recipe rowwise`` converts them
with torchao's rowwise recipe instead (``Float8LinearConfig.from_recipe_name("rowwise")``).
torchao is imported only here, only when an fp8 run is built; without it the bench says how to
install it.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from whichgpu.errors import UnsupportedWorkload, option

FP8_ALIGNMENT = 16
"""Elements each side of a converted linear layer is a multiple of (``torch._scaled_mm``)."""
MIN_CUDA_CAPABILITY = (8, 9)
"""Lowest NVIDIA compute capability with fp8 tensor cores (Ada; Hopper is 9.0)."""
TORCHAO_MISSING = (
    f"{option('precision')} fp8 runs torchao's Float8Linear, and torchao is not installed: "
    "install it beside your torch (pip install 'whichgpu[fp8]', or pip install torchao; "
    "torchao's README lists the torch each release supports)."
)


def converted_names(model: torch.nn.Module) -> list[str]:
    """The qualified names of the linear layers fp8 training converts in ``model``."""
    linears = [(name, m) for name, m in model.named_modules() if type(m) is torch.nn.Linear]
    if not linears:
        return []
    last = linears[-1][0]
    return [
        name
        for name, m in linears
        if name != last
        and m.in_features % FP8_ALIGNMENT == 0
        and m.out_features % FP8_ALIGNMENT == 0
    ]


RECIPE_WORDS = {
    "tensorwise": "tensorwise dynamic scaling, e4m3 forward, e5m2 gradients",
    "rowwise": "rowwise dynamic scaling, one scale per row or column, e4m3 throughout",
}
"""How a result's note names each recipe."""


def convert_to_fp8(model: torch.nn.Module, recipe: str = "tensorwise") -> str:
    """Swap ``model``'s converted linear layers (``converted_names``) for torchao's
    ``Float8Linear`` in place, scaled by torchao's ``recipe`` (``tensorwise``, ``rowwise``);
    returns a note saying how many, for the result. Raises ``UnsupportedWorkload`` when torchao
    is missing or the model has no layer to convert."""
    names = set(converted_names(model))
    if not names:
        raise UnsupportedWorkload(
            f"{option('precision')} fp8 converts linear layers whose sizes are multiples of "
            f"{FP8_ALIGNMENT} (all but the last); this model has none."
        )
    if recipe not in RECIPE_WORDS:
        raise UnsupportedWorkload(
            f"{option('fp8_recipe')} {recipe}: the recipes measured are {', '.join(RECIPE_WORDS)}."
        )
    convert, config_of = _torchao_convert()
    config = None if recipe == "tensorwise" else config_of(recipe)
    convert(model, module_filter_fn=lambda _module, fqn: fqn in names, config=config)
    return (
        f"fp8: {len(names)} linear layers run torchao's Float8Linear ({RECIPE_WORDS[recipe]}), "
        "the last linear layer and everything else bf16 AMP over fp32 master weights"
    )


def check_device(kind: str, capability: tuple[int, int] | None) -> str | None:
    """Why fp8 training cannot be measured on this device (``None``: it can), or, on the CPU,
    ``None`` too: torchao emulates the fp8 products there, which the bench's note says."""
    if kind == "cuda" and capability is not None and capability < MIN_CUDA_CAPABILITY:
        major, minor = capability
        return (
            f"{option('precision')} fp8 needs fp8 tensor cores (compute capability "
            f"{MIN_CUDA_CAPABILITY[0]}.{MIN_CUDA_CAPABILITY[1]} or later: Ada, Hopper, "
            f"Blackwell); this GPU is {major}.{minor}. Use {option('precision')} bf16."
        )
    if kind not in ("cuda", "cpu"):
        return (
            f"{option('precision')} fp8 is measured on CUDA GPUs (and emulated on the CPU), "
            f"not {kind}."
        )
    return None


def _torchao_convert() -> tuple[Any, Any]:
    """torchao's ``convert_to_float8_training`` and ``Float8LinearConfig.from_recipe_name``."""
    # torchao logs each optional C++ extension built for another torch that it cannot load;
    # float8 training does not use them
    quiet = logging.getLogger("torchao")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError:
        raise UnsupportedWorkload(TORCHAO_MISSING) from None
    finally:
        quiet.setLevel(level)
    return convert_to_float8_training, Float8LinearConfig.from_recipe_name
