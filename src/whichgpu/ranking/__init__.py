"""Which GPU? Rank candidates for a workload, a job and a budget, with reasons.

``rank`` prices and orders what the estimators found; ``presets`` are the seed guides'
personas as questions. The entry point for users is ``whichgpu.api.recommend``.
"""

from __future__ import annotations
