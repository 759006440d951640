"""Quiet the log lines some libraries write while they are imported, for whichgpu's processes.

Where torchao is installed, transformers imports it, and torchao then logs one warning per
optional C++ extension built for another torch ("Failed to load ..._C_mxfp8...so") and torch
logs a deprecation warning per enum torchao registers with its pytree. None of it concerns a
whichgpu user, and it would bury the progress lines on stderr. Importing this module lowers
those loggers to errors only; the bench's fork server imports it before torch, and the CLI
calls ``quiet_import_noise`` before any command runs. Nothing else is changed.
"""

from __future__ import annotations

import logging

NOISY_LOGGERS = ("torchao", "torch.utils._pytree")
"""Loggers whose import-time warnings are not the user's concern (see the module docstring)."""


def quiet_import_noise() -> None:
    """Let ``NOISY_LOGGERS`` pass errors only."""
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)


quiet_import_noise()
