"""Capability and dtype dispatch: which backend runs a scan, in which storage and compute dtypes.

Rules (one place for them, every op asks here):

* Storage dtypes: float32, float16, bfloat16 (and float64, for references and tests).
  The Triton kernels accumulate in float32 always; float64 inputs run on the eager path, which
  accumulates in float64 (``"auto"`` picks it, an explicit ``"triton"`` raises).
* bfloat16 needs compute capability >= 8.0 on CUDA. ``"auto"`` on an older card picks the eager
  path (float32 arithmetic on the bf16 storage); an explicit ``"triton"`` request raises, naming the
  capability.
* ``"auto"`` is ``"triton"`` for CUDA tensors when Triton is importable, ``"eager"`` otherwise.
  ``"triton"`` on CPU tensors is allowed only under ``TRITON_INTERPRET=1`` (the Triton interpreter;
  the variable must be set before the kernel modules are imported).

The device capability and multiprocessor count are read lazily, once per device, never at import.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Final, Literal

import torch

__all__ = [
    "KNOWN_BACKENDS",
    "STORAGE_DTYPES",
    "TRITON_STORAGE_DTYPES",
    "BackendName",
    "ResolvedBackend",
    "compute_dtype",
    "device_capability",
    "multiprocessor_count",
    "resolve_scan_backend",
    "supports_bf16",
    "triton_installed",
    "triton_interpret_mode",
]

BackendName = Literal["auto", "triton", "eager"]
ResolvedBackend = Literal["triton", "eager"]

KNOWN_BACKENDS: Final[tuple[str, ...]] = ("auto", "triton", "eager")
STORAGE_DTYPES: Final[tuple[torch.dtype, ...]] = (
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.float64,
)
# What the Triton kernels store; float64 (the reference precision) always runs eager.
TRITON_STORAGE_DTYPES: Final[tuple[torch.dtype, ...]] = (
    torch.float32,
    torch.float16,
    torch.bfloat16,
)

_CAPABILITY: dict[int, tuple[int, int]] = {}
_SM_COUNT: dict[int, int] = {}


def _cuda_index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def device_capability(device: torch.device) -> tuple[int, int] | None:
    """Compute capability ``(major, minor)`` of a CUDA device, None for other devices (cached)."""
    if device.type != "cuda":
        return None
    index = _cuda_index(device)
    if index not in _CAPABILITY:
        _CAPABILITY[index] = torch.cuda.get_device_capability(index)
    return _CAPABILITY[index]


def multiprocessor_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (cached); 4 for the CPU interpreter."""
    if device.type != "cuda":
        return 4
    index = _cuda_index(device)
    if index not in _SM_COUNT:
        _SM_COUNT[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SM_COUNT[index]


def supports_bf16(device: torch.device) -> bool:
    """Whether the Triton kernels may store bfloat16 on this device (CC >= 8.0, or the interpreter)."""
    capability = device_capability(device)
    return capability is None or capability >= (8, 0)


def triton_interpret_mode() -> bool:
    """True when ``TRITON_INTERPRET=1``: Triton kernels then run on CPU tensors, in Python."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


# Whether Triton is installed is looked up (not imported) once: torch.compile cannot trace
# importlib, and the answer cannot change while the process runs.
_TRITON_INSTALLED: Final[bool] = importlib.util.find_spec("triton") is not None


def triton_installed() -> bool:
    """Whether the ``triton`` package is installed (looked up once, at import)."""
    return _TRITON_INSTALLED


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Accumulation dtype for a storage dtype: float64 for float64, float32 for everything else."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def resolve_scan_backend(backend: str, device: torch.device, dtype: torch.dtype) -> ResolvedBackend:
    """Pick the backend that runs a scan of ``dtype`` storage on ``device``.

    Raises:
        ValueError: unknown backend name, or an explicit ``"triton"`` request this device cannot
            serve (no CUDA and no interpreter, no Triton installed, bf16 below CC 8.0).
    """
    if backend not in KNOWN_BACKENDS:
        known = ", ".join(repr(name) for name in KNOWN_BACKENDS)
        raise ValueError(f"backend must be one of {known}; got {backend!r}")
    if backend == "eager":
        return "eager"
    on_cuda = device.type == "cuda"
    if backend == "auto":
        servable = dtype in TRITON_STORAGE_DTYPES and (
            dtype != torch.bfloat16 or supports_bf16(device)
        )
        return "triton" if on_cuda and servable and triton_installed() else "eager"
    # An explicit "triton" request: say exactly why it cannot run.
    if not triton_installed():
        raise ValueError("backend='triton' needs the 'triton' package, which is not installed")
    if not on_cuda and not triton_interpret_mode():
        raise ValueError(
            f"backend='triton' needs CUDA tensors, got device {device}; set TRITON_INTERPRET=1 "
            "before importing pararnn_kernels to run the kernels in the Triton interpreter"
        )
    if dtype not in TRITON_STORAGE_DTYPES:
        raise ValueError(
            "backend='triton' stores float32, float16 or bfloat16 (accumulating in float32); "
            f"got {dtype}: use backend='eager' or 'auto' for it"
        )
    if dtype == torch.bfloat16 and not supports_bf16(device):
        major, minor = device_capability(device) or (0, 0)
        raise ValueError(
            f"backend='triton' with bfloat16 storage needs compute capability >= 8.0, but {device} "
            f"has {major}.{minor}; use float16/float32 or backend='auto'"
        )
    return "triton"
