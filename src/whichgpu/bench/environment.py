"""The machine and software a measurement is made with (``BenchEnvironment``).

Captured in a child process on the device itself: what the device reports (name, UUID, memory,
count), NVML's driver, power limit and interconnect on NVIDIA GPUs, the versions of torch,
CUDA, cuDNN and the libraries that shape a step, and the host (platform, CPU, Python). A
figure that cannot be read is None and a note says why. The numeric settings in force (TF32,
autocast dtype) are filled in by the measurement, which is where they are set.
"""

from __future__ import annotations

import contextlib
import os
import platform
import socket
import subprocess
import sys
from importlib import metadata

from whichgpu.bench.devices.protocol import Device, NvmlTarget
from whichgpu.bench.jobs import Inspection, PrecisionState
from whichgpu.schema import BenchEnvironment
from whichgpu.version import __version__

LIBRARIES = ("transformers", "numpy", "triton", "nvidia-ml-py", "torchao")
"""Libraries whose versions are recorded besides torch (those installed)."""


def cpu_model() -> str | None:
    """The CPU's model name (``/proc/cpuinfo``, ``sysctl`` on macOS, else ``platform``)."""
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as fh:
        for line in fh:
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                return line.split(":", 1)[1].strip() or None
    if sys.platform == "darwin":
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string"],
                capture_output=True,
                text=True,
                timeout=5,
                check=False,
            )
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.strip()
    return platform.processor() or None


def physical_memory_bytes() -> int | None:
    """Physical memory of the host (None where the platform does not say)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return None


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def capture(device: Device, n_devices: int = 1) -> Inspection:
    """The environment of ``device`` (and the interconnect of ``n_devices`` from it)."""
    notes: list[str] = []
    facts = device.describe()
    notes.extend(facts.notes)
    torch_version = _version("torch")
    cuda_version = cudnn_version = None
    if "torch" in sys.modules:
        import torch

        torch_version = torch.__version__
        if device.kind == "cuda":
            cuda_version = torch.version.cuda
            cudnn = torch.backends.cudnn.version()  # type: ignore[no-untyped-call]
            cudnn_version = None if cudnn is None else str(cudnn)
    driver = power_limit = interconnect = None
    if device.kind == "cuda":
        from whichgpu.bench.nvml import gpu_facts

        targets = [_nvml_target(device.for_rank(r)) for r in range(min(n_devices, facts.count))]
        gpu = gpu_facts([t for t in targets if t is not None])
        driver, power_limit, interconnect = gpu.driver_version, gpu.power_limit_w, gpu.interconnect
        notes.extend(gpu.notes)
        if n_devices > 1 and interconnect is None:
            notes.append("interconnect unknown: NVML did not report the GPUs' topology")
    libraries = {name: v for name in LIBRARIES if (v := _version(name)) is not None}
    environment = BenchEnvironment(
        device_kind=device.kind,
        device_name=facts.name,
        device_uuid=facts.uuid,
        device_count=facts.count,
        driver_version=driver,
        cuda_version=cuda_version,
        cudnn_version=cudnn_version,
        torch_version=torch_version,
        libraries=libraries,
        whichgpu_version=__version__,
        python_version=platform.python_version(),
        platform=platform.platform(),
        host=socket.gethostname(),
        cpu=cpu_model(),
        cpu_count=os.cpu_count(),
        power_limit_w=power_limit,
        memory_total_bytes=facts.memory_total_bytes,
        interconnect=interconnect,
    )
    return Inspection(environment=environment, notes=tuple(notes))


def _nvml_target(device: Device) -> NvmlTarget | None:
    target = getattr(device, "nvml_target", None)
    return target() if callable(target) else None


def with_precision(environment: BenchEnvironment, state: PrecisionState) -> BenchEnvironment:
    """``environment`` with the numeric settings a measurement ran under."""
    return environment.model_copy(
        update={
            "tf32_matmul": state.tf32_matmul,
            "tf32_cudnn": state.tf32_cudnn,
            "amp_dtype": state.amp_dtype,
        }
    )
