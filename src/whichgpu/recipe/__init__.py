"""The training-step recipe: what one training or inference step of a workload is.

The tracer (``whichgpu.trace``) records this step under fake tensors and the bench
(``whichgpu.bench``) runs it for real on a device; both build it from here, so the step that
is estimated and the step that is measured are the same: ``training`` (the optimizer and its
implementation, the loss, autocast, the checkpointing policy, fairseq's fp16 master weights,
whose kernels a step follows), ``generation`` (a causal language model's serving sizes and
the arguments of a generation step with a KV cache) and ``optim8bit`` (bitsandbytes'
``AdamW8bit`` in plain PyTorch). Nothing here records or times anything.

This package imports torch; nothing outside ``workloads`` builders, ``recipe``, ``trace`` and
``bench`` may import it at module level.
"""
