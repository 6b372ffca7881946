"""How the launchers launch a Triton kernel: through ``torch.library.wrap_triton`` or directly."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["launchable"]


def launchable(kernel: Any) -> Any:
    """The object to index with a grid and call, for ``kernel`` (a ``@triton.jit`` function).

    Wrapped per call (a light object), so whoever replaces ``torch.library.wrap_triton`` (the
    sm_90 compile check of the tests) sees every launch. The wrapper launches through a
    higher-order op, which ``torch.compile`` needs while it traces; in eager mode that dispatch
    costs more host time than a whole kernel at moderate sizes, so eager calls launch the kernel
    itself.
    """
    wrapped = torch.library.wrap_triton(kernel)
    if getattr(wrapped, "kernel", None) is kernel and not torch.compiler.is_compiling():
        return kernel
    return wrapped
