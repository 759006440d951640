"""fp8 training as the bench builds it: which linear layers torchao's Float8Linear replaces."""

from __future__ import annotations

import builtins
from typing import Any

import pytest
import torch

from whichgpu.errors import UnsupportedWorkload
from whichgpu.recipe.fp8 import check_device, convert_to_fp8, converted_names


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(64, 128),  # converted
        torch.nn.GELU(),
        torch.nn.Linear(128, 40),  # 40 is not a multiple of 16: stays
        torch.nn.Linear(40, 64),  # stays for the same reason
        torch.nn.Linear(64, 32),  # converted
        torch.nn.Linear(32, 16),  # the last linear layer: stays, as the estimate keeps it
    )


def test_the_layers_converted_are_the_aligned_ones_but_the_last() -> None:
    assert converted_names(_model()) == ["0", "4"]
    assert converted_names(torch.nn.Sequential(torch.nn.Linear(16, 16))) == []


def test_conversion_swaps_exactly_those_layers_and_the_step_still_trains() -> None:
    from torchao.float8.float8_linear import Float8Linear

    torch.manual_seed(0)
    model = _model()
    note = convert_to_fp8(model)
    swapped = [name for name, m in model.named_modules() if isinstance(m, Float8Linear)]
    assert swapped == ["0", "4"] and "2 linear layers" in note
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(torch.randn(8, 64)).float().square().mean()
    loss.backward()  # type: ignore[no-untyped-call]
    first = model[0]
    assert isinstance(first, torch.nn.Linear) and first.weight.grad is not None
    assert first.weight.dtype == torch.float32  # master weights stay fp32


def test_rowwise_conversion_scales_every_cast_per_axis_and_trains() -> None:
    from torchao.float8.config import ScalingGranularity
    from torchao.float8.float8_linear import Float8Linear

    torch.manual_seed(0)
    model = _model()
    note = convert_to_fp8(model, "rowwise")
    swapped = [m for m in model.modules() if isinstance(m, Float8Linear)]
    assert len(swapped) == 2 and "rowwise" in note and "e4m3 throughout" in note
    config = swapped[0].config
    casts = (
        config.cast_config_input,
        config.cast_config_weight,
        config.cast_config_grad_output,
        config.cast_config_weight_for_grad_input,
    )
    assert all(c.scaling_granularity is ScalingGranularity.AXISWISE for c in casts)
    assert config.cast_config_grad_output.target_dtype == torch.float8_e4m3fn
    # the backward's products accumulate in full precision: torchao's rescaled cuBLAS path
    assert not config.gemm_config_grad_input.use_fast_accum
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(torch.randn(8, 64)).float().square().mean()
    loss.backward()  # type: ignore[no-untyped-call]
    first = model[0]
    assert isinstance(first, torch.nn.Linear) and first.weight.grad is not None


def test_an_unknown_recipe_is_refused() -> None:
    with pytest.raises(UnsupportedWorkload, match="tensorwise, rowwise"):
        convert_to_fp8(_model(), "blockwise")


def test_a_model_with_nothing_to_convert_is_refused() -> None:
    with pytest.raises(UnsupportedWorkload, match="multiples of 16"):
        convert_to_fp8(torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.Linear(16, 16)))


def test_without_torchao_the_error_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_torchao(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("torchao"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_torchao)
    with pytest.raises(UnsupportedWorkload, match=r"pip install 'whichgpu\[fp8\]'"):
        convert_to_fp8(_model())


@pytest.mark.parametrize(
    ("kind", "capability", "refused"),
    [
        ("cuda", (8, 0), "compute capability 8.9"),  # A100: no fp8 tensor cores
        ("cuda", (8, 9), None),  # Ada
        ("cuda", (9, 0), None),  # Hopper
        ("cpu", None, None),  # emulated, and the bench's note says so
        ("mps", None, "CUDA GPUs"),
    ],
)
def test_which_devices_can_measure_fp8(
    kind: str, capability: tuple[int, int] | None, refused: str | None
) -> None:
    why = check_device(kind, capability)
    assert (why is None) == (refused is None)
    if refused is not None:
        assert why is not None and refused in why
