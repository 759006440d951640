"""The top-level Python API: lazy names, list results with frames, HTML views, filters."""

from __future__ import annotations

import doctest
import subprocess
import sys

import pytest

import whichgpu
from whichgpu.errors import UsageError
from whichgpu.schema import GpuSpec, MemoryEstimate, Ranking, Vendor
from whichgpu.tabular import ResultList

pd = pytest.importorskip("pandas")

HOSTILE = "<script>alert('x')</script>&"


def test_public_names_are_listed_and_load_lazily() -> None:
    """``dir`` lists the API; the first access imports its module, in a fresh process."""
    for name in ("fit", "predict", "recommend", "gpus", "gpu", "compare", "breakeven", "value"):
        assert name in dir(whichgpu)
        assert name in whichgpu.__all__
    program = (
        "import sys, whichgpu\n"
        "assert 'whichgpu.api' not in sys.modules and 'whichgpu.cost' not in sys.modules\n"
        "assert callable(whichgpu.fit) and 'whichgpu.api' in sys.modules\n"
        "assert callable(whichgpu.breakeven) and 'whichgpu.cost' in sys.modules\n"
        "try:\n"
        "    whichgpu.no_such_name\n"
        "except AttributeError:\n"
        "    pass\n"
        "else:\n"
        "    raise SystemExit('no AttributeError')\n"
    )
    subprocess.run([sys.executable, "-c", program], check=True, timeout=60)


def test_html_needs_neither_pandas_nor_torch() -> None:
    """A catalog listing and its HTML views load neither pandas nor torch."""
    program = (
        "import sys, whichgpu\n"
        "whichgpu.gpus('4090')._repr_html_()\n"
        "whichgpu.gpu('4090')._repr_html_()\n"
        "print(sorted(m for m in ('pandas', 'torch') if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "[]"


def test_module_docstring_examples() -> None:
    """The examples in ``whichgpu``'s docstring run (doctest)."""
    assert doctest.testmod(whichgpu, optionflags=doctest.ELLIPSIS).failed == 0


def test_subpackages_keep_their_dotted_imports() -> None:
    """``whichgpu.recommend`` is the function; the harness and the ranking are packages of
    their own names, importable every way."""
    program = (
        "import whichgpu.ranking.presets as presets, whichgpu.bench.jobs as jobs, whichgpu\n"
        "from whichgpu.api import recommend\n"
        "assert whichgpu.recommend is recommend\n"
        "assert presets.get_preset('kaggle').workload == 'vit-b-16'\n"
    )
    subprocess.run([sys.executable, "-c", program], check=True, timeout=60)


def test_fit_returns_a_list_with_a_frame() -> None:
    estimates = whichgpu.fit("resnet50", gpus=["4090"])
    assert isinstance(estimates, list) and isinstance(estimates, ResultList)
    assert len(estimates) == 1 and isinstance(estimates[0], MemoryEstimate)
    assert estimates == [estimates[0]]
    assert isinstance(estimates[:1], ResultList)
    frame = estimates.to_frame()
    assert isinstance(frame, pd.DataFrame)
    assert {"gpu", "max_batch_size", "mode", "precision", "weights_bytes"} <= set(frame.columns)
    assert frame.loc[0, "gpu"] == "rtx-4090"
    assert frame.loc[0, "max_batch_size"] == estimates[0].max_batch_size
    one = estimates[0].to_frame()
    assert list(one.columns) == list(frame.columns) and len(one) == 1


def test_predict_returns_a_list_with_a_frame() -> None:
    speeds = whichgpu.predict("bert-base", gpus=["4090", "3090"])
    frame = speeds.to_frame()
    assert list(frame["gpu"]) == [e.gpu for e in speeds]
    assert {"throughput", "low", "high", "throughput_unit", "matrix_share"} <= set(frame.columns)


def test_one_gpu_named_alone_is_one_gpu() -> None:
    assert [e.gpu for e in whichgpu.fit("resnet50", gpus="4090")] == ["rtx-4090"]
    assert [e.gpu for e in whichgpu.predict("resnet50", gpus="4090")] == ["rtx-4090"]


def test_html_escapes_every_string() -> None:
    estimate = whichgpu.fit("resnet50", gpus=["4090"])[0]
    hostile = estimate.model_copy(update={"workload": HOSTILE, "gpu_name": HOSTILE})
    for page in (ResultList([hostile])._repr_html_(), hostile._repr_html_()):
        assert "<script>" not in page
        assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;&amp;" in page
        assert page.startswith('<div class="whichgpu">')


def test_gpus_filters_and_sorts() -> None:
    found = whichgpu.gpus(vendor="amd", min_memory_gb=64, sort="memory_gb")
    assert found and isinstance(found, ResultList)
    assert all(g.vendor is Vendor.AMD and (g.memory_gb or 0) >= 64 for g in found)
    sizes = [g.memory_gb for g in found]
    assert sizes == sorted(sizes, reverse=True)
    assert set(found.to_frame()["id"]) == {g.id for g in found}
    assert "<table>" in found._repr_html_()
    assert [g.id for g in whichgpu.gpus("4090", vendor=Vendor.NVIDIA)][:1] == ["rtx-4090"]
    with pytest.raises(UsageError, match="not one of"):
        whichgpu.gpus(vendor="acme")


def test_gpu_and_compare() -> None:
    spec = whichgpu.gpu("3090")
    assert isinstance(spec, GpuSpec) and spec.id == "rtx-3090"
    assert "GeForce RTX 3090" in spec._repr_html_()
    side = whichgpu.compare("3090", "4090")
    frame = side.to_frame()
    assert {"quantity", "rtx-3090", "rtx-4090", "rtx-4090 ratio"} <= set(frame.columns)
    assert "×" in side._repr_html_()
    with pytest.raises(UsageError):
        whichgpu.compare("3090")


def test_recommend_ranking_frame_and_html() -> None:
    ranking = whichgpu.recommend("resnet50", gpus=["4090", "3090"])
    assert isinstance(ranking, Ranking)
    frame = ranking.to_frame()
    assert list(frame["rank"]) == [c.rank for c in ranking.ranking]
    assert list(frame["gpu"]) == [c.gpu for c in ranking.ranking]
    page = ranking._repr_html_()
    assert ranking.ranking[0].gpu_name in page


def test_cost_results_have_frames() -> None:
    own = whichgpu.breakeven(gpu="4090", cloud_usd_per_hour=0.5)
    assert list(own.to_frame().columns) == ["days", "cloud_usd", "own_usd"]
    assert "Renting against owning" in own._repr_html_()
    worth = whichgpu.value(["4090", "3090"])
    assert list(worth.to_frame()["gpu"]) == [r.gpu for r in worth.rows]
    assert "relative" in worth._repr_html_()


def test_empty_list_renders() -> None:
    empty: ResultList[GpuSpec] = whichgpu.gpus("no such gpu at all")
    assert empty == [] and "No results" in empty._repr_html_()


def test_frame_without_pandas_says_what_to_install() -> None:
    """pandas blocked: HTML still works; ``to_frame`` raises an ImportError naming the extra."""
    program = (
        "import sys\n"
        "sys.modules['pandas'] = None\n"
        "import whichgpu\n"
        "found = whichgpu.gpus('4090')\n"
        "assert '<table>' in found._repr_html_()\n"
        "try:\n"
        "    found.to_frame()\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
        "else:\n"
        "    raise SystemExit('no ImportError')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "pip install 'whichgpu[report]'" in result.stdout


def test_arguments_of_the_wrong_type_are_clear_usage_errors() -> None:
    with pytest.raises(UsageError, match="named by a string"):
        whichgpu.gpu(4090)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="give gpu_count="):
        whichgpu.fit("gpt2", gpus=8)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="query= is part of a GPU's name"):
        whichgpu.gpus(4090)  # type: ignore[arg-type]
