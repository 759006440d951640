"""whichgpu: which GPU to buy or rent for *your* model, and what it will give you.

The package answers four questions — will it fit, how fast, what it costs, which to choose —
from a sourced GPU catalog and the user's own workload. ``import whichgpu`` needs no torch.
"""

from __future__ import annotations

__version__ = "0.1.0"
