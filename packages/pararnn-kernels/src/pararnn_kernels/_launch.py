"""How the launchers launch a Triton kernel: through ``torch.library.wrap_triton`` or directly."""

from __future__ import annotations

from typing import Any

import torch
from torch._library.triton import wrap_triton as _torch_wrap_triton
from torch.utils._python_dispatch import _get_current_dispatch_mode

__all__ = ["launchable", "plain_eager"]


def plain_eager() -> bool:
    """True outside ``torch.compile`` and outside every ``TorchDispatchMode`` (fake tensors,
    functionalization, ``make_fx`` and ``opcheck``'s tracing): the tensors are real and nothing
    records the call, so the launchers may skip the dispatcher."""
    return not torch.compiler.is_compiling() and _get_current_dispatch_mode() is None


def launchable(kernel: Any) -> Any:
    """The object to index with a grid and call, for ``kernel`` (a ``@triton.jit`` function).

    ``torch.library.wrap_triton``'s wrapper launches through a higher-order op, which tracing
    (``torch.compile``, fake tensors) needs; in plain eager mode that dispatch costs more host
    time than a whole kernel at moderate sizes, so there the kernel is launched itself, without
    even building the wrapper (about 15 µs of host time per launch). Whoever replaces
    ``torch.library.wrap_triton`` (the sm_90 compile check of the tests records launches that
    way) is still asked for every launch.
    """
    eager = plain_eager()
    if torch.library.wrap_triton is _torch_wrap_triton and eager:
        return kernel
    wrapped = torch.library.wrap_triton(kernel)
    if getattr(wrapped, "kernel", None) is kernel and eager:
        return kernel
    return wrapped
