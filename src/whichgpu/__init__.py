"""whichgpu: which GPU to buy or rent for *your* model, and what it will give you.

The package answers four questions — will it fit, how fast, what it costs, which to choose —
from a sourced GPU catalog and the user's own workload. The CLI's commands are functions here,
returning typed, frozen results:

    >>> import whichgpu
    >>> whichgpu.gpu("4090").memory_gb
    24.0
    >>> fits = whichgpu.fit("resnet50", gpus=["4090", "3090"])
    >>> [(e.gpu, e.max_batch_size) for e in fits]  # doctest: +SKIP
    [('rtx-4090', ...), ('rtx-3090', ...)]
    >>> fits.to_frame()[["gpu", "max_batch_size"]]  # doctest: +SKIP

- catalog: ``gpus`` (filter and sort), ``gpu`` (one by name), ``compare``;
- estimates: ``fit`` (memory, largest batch), ``predict`` (throughput);
- cost: ``breakeven`` (rent against own), ``value`` (performance per dollar);
- choice: ``recommend`` (ranked, with reasons).

Measuring on your own GPU is ``whichgpu.api.bench`` (it needs torch; ``whichgpu.bench`` is the
harness package), and the HTML report is ``whichgpu.api.report``.

Lists of results have ``to_frame()`` (pandas, the ``report`` extra) and every result shows as an
HTML table in Jupyter. ``docs/python.md`` walks through them.

``import whichgpu`` is light: it reads no data and imports neither torch nor numpy; each function
loads what it needs on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from whichgpu.version import __version__

if TYPE_CHECKING:
    from whichgpu.api.catalog import compare, gpu, gpus
    from whichgpu.api.fit import fit
    from whichgpu.api.predict import predict
    from whichgpu.api.recommend import recommend
    from whichgpu.cost import breakeven, value
    from whichgpu.tabular import ResultList

__all__ = [
    "ResultList",
    "__version__",
    "breakeven",
    "compare",
    "fit",
    "gpu",
    "gpus",
    "predict",
    "recommend",
    "value",
]

_LAZY = {
    "compare": "whichgpu.api",
    "fit": "whichgpu.api",
    "gpu": "whichgpu.api",
    "gpus": "whichgpu.api",
    "predict": "whichgpu.api",
    "recommend": "whichgpu.api",
    "breakeven": "whichgpu.cost",
    "value": "whichgpu.cost",
    "ResultList": "whichgpu.tabular",
}
"""Public name -> the module that defines it, imported on first access."""


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'whichgpu' has no attribute '{name}'")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*__all__, *(n for n in globals() if n.startswith("__"))})
