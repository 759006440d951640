"""Trace one step of a workload on the CPU, with fake tensors, into a ``StepProfile``.

This package imports torch; nothing outside ``trace``, ``workloads`` builders and ``bench``
may import it at module level.
"""

from whichgpu.trace.step import trace_step

__all__ = ["trace_step"]
