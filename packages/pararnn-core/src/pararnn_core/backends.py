"""The scan-backend registry: which code solves the linear recurrence of a Newton step.

A Newton step solves ``δ_t = J_t δ_{t-1} + r_t`` (DESIGN §1) and the backward the reverse
recurrence ``μ_t = g_t + J_{t+1}ᵀ μ_{t+1}``. Both go through one *scan backend*, chosen by name
in :class:`~pararnn_core.NewtonConfig` (``scan_backend=``):

* ``"auto"``, ``"triton"``, ``"eager"`` -- the :mod:`pararnn_kernels` scans (``"auto"``: Triton on
  CUDA tensors it can serve, the pure-torch log-depth scan elsewhere);
* ``"fused"`` -- not a scan: it selects the fused whole-layer kernels of
  :mod:`pararnn_core.fused` (Newton and backward in one kernel each), which
  :func:`~pararnn_core.newton_apply` runs for cells that have them; asking this registry for it
  raises a ValueError that says so;
* names registered with :func:`register_scan_backend`, or contributed by installed packages
  through the entry-point group ``pararnn.scan_backends`` (loaded lazily, on first use). This is
  how ``"context_parallel"`` arrives with ``pararnn-dist``.

A backend is a callable with the signature of :class:`ScanBackend`::

    backend(jac, rhs, h0, *, reverse, structure) -> Tensor

=============  ======================  ===============  ===========  =========
``structure``  ``jac``                 ``rhs``, result  ``h0``       meaning
=============  ======================  ===============  ===========  =========
``Diag()``     ``[B, T, D]``           ``[B, T, D]``    ``[B, D]``   ``y_t = jac_t ⊙ y_{t∓1} + rhs_t``
``Block(k)``   ``[B, T, D, k, k]``     ``[B, T, D, k]`` ``[B, D, k]`` ``y_t = jac_t @ y_{t∓1} + rhs_t``
``Dense()``    ``[B, T, D, D]``        ``[B, T, D]``    ``[B, D]``   ``y_t = jac_t @ y_{t∓1} + rhs_t``
=============  ======================  ===============  ===========  =========

``reverse=False``: ``y_{-1} = h0``; ``reverse=True``: ``y_t = jac_t y_{t+1} + rhs_t`` with
``y_T = h0``. ``h0=None`` means zeros (Newton passes None: ``δ_{-1} = 0``, ``μ_T = 0``). The result
has rhs's shape and dtype. Backends are called under ``torch.no_grad()`` (the Newton
``autograd.Function`` differentiates analytically) and must not modify their inputs; a
context-parallel backend receives the full replicated trajectory on every rank.
"""

from __future__ import annotations

import importlib.metadata
from typing import Final, Protocol

from torch import Tensor

from pararnn_kernels import MAX_TRITON_BLOCK, resolve_scan_backend, scan_block_diag, scan_diag

from .structures import Block, Diag, Structure

__all__ = [
    "BUILTIN_SCAN_BACKENDS",
    "ENTRY_POINT_GROUP",
    "KernelScan",
    "ScanBackend",
    "check_scan_backend_name",
    "get_scan_backend",
    "known_scan_backends",
    "register_scan_backend",
    "resolved_scan_backend_name",
    "unregister_scan_backend",
]

ENTRY_POINT_GROUP: Final = "pararnn.scan_backends"
BUILTIN_SCAN_BACKENDS: Final[tuple[str, ...]] = ("auto", "triton", "eager")
#: Known names that select whole-layer paths rather than a scan callable: name -> why.
_PENDING: Final[dict[str, str]] = {
    "fused": (
        "scan_backend='fused' selects the fused whole-layer kernels (pararnn_core.fused), which "
        "newton_apply runs for cells that have them (ParaGRU, ParaLSTM, ParaSLSTM); it is not "
        "a per-scan backend, so newton_solve and the scan registry cannot run it: use "
        "newton_apply, or 'auto', 'triton' or 'eager' here"
    ),
}
#: Names other packages provide: name -> distribution to install.
_PROVIDED_BY: Final[dict[str, str]] = {"context_parallel": "pararnn-dist"}


class ScanBackend(Protocol):
    """Solves one linear recurrence for Newton (see the module docstring for shapes)."""

    def __call__(
        self,
        jac: Tensor,
        rhs: Tensor,
        h0: Tensor | None,
        *,
        reverse: bool,
        structure: Structure,
    ) -> Tensor: ...


class KernelScan:
    """The built-in backends: :func:`pararnn_kernels.scan_diag` / ``scan_block_diag``.

    ``Dense`` runs as a block scan with one ``D x D`` block (``D > 4`` always on the eager path).

    Args:
        backend: ``"auto"``, ``"triton"`` or ``"eager"``, passed to the kernels.
    """

    def __init__(self, backend: str) -> None:
        if backend not in BUILTIN_SCAN_BACKENDS:
            raise ValueError(f"backend must be one of {BUILTIN_SCAN_BACKENDS}, got {backend!r}")
        self.backend = backend

    def __call__(
        self,
        jac: Tensor,
        rhs: Tensor,
        h0: Tensor | None,
        *,
        reverse: bool,
        structure: Structure,
    ) -> Tensor:
        if isinstance(structure, Diag):
            return scan_diag(jac, rhs, h0, reverse=reverse, backend=self.backend)
        if isinstance(structure, Block):
            return scan_block_diag(jac, rhs, h0, reverse=reverse, backend=self.backend)
        h0_block = None if h0 is None else h0.unsqueeze(1)
        out = scan_block_diag(
            jac.unsqueeze(2), rhs.unsqueeze(2), h0_block, reverse=reverse, backend=self.backend
        )
        return out.squeeze(2)

    def __repr__(self) -> str:
        return f"KernelScan({self.backend!r})"


_REGISTRY: dict[str, ScanBackend] = {}


def _entry_point_names() -> tuple[str, ...]:
    return tuple(ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))


def known_scan_backends() -> tuple[str, ...]:
    """Every name ``scan_backend=`` accepts now: built-ins, ``"fused"``, registered, entry points."""
    extra = sorted((set(_REGISTRY) | set(_entry_point_names())) - set(BUILTIN_SCAN_BACKENDS))
    pending = [name for name in _PENDING if name not in extra]
    return (*BUILTIN_SCAN_BACKENDS, *pending, *extra)


def _unknown(name: str) -> ValueError:
    known = ", ".join(repr(n) for n in known_scan_backends())
    if name in _PROVIDED_BY:
        return ValueError(
            f"scan_backend={name!r} is provided by the {_PROVIDED_BY[name]} package, which is not "
            f"installed (pip install {_PROVIDED_BY[name]}); known backends: {known}"
        )
    return ValueError(f"scan_backend must be one of {known}; got {name!r}")


def check_scan_backend_name(name: object) -> None:
    """Raise unless ``name`` is a known backend name (does not import entry points).

    Raises:
        TypeError: ``name`` is not a str.
        ValueError: unknown name (the message lists the known ones, and says which package to
            install for names like ``"context_parallel"``).
    """
    if not isinstance(name, str):
        raise TypeError(f"scan_backend must be a str, got {type(name).__name__}")
    if name in BUILTIN_SCAN_BACKENDS or name in _PENDING or name in _REGISTRY:
        return
    if name not in _entry_point_names():
        raise _unknown(name)


def register_scan_backend(name: str, backend: ScanBackend, *, replace: bool = False) -> None:
    """Make ``backend`` available as ``NewtonConfig(scan_backend=name)`` in this process.

    Raises:
        ValueError: ``name`` is a built-in or reserved name, or already registered and not
            ``replace``.
        TypeError: ``backend`` is not callable.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty str, got {name!r}")
    if name in BUILTIN_SCAN_BACKENDS or name in _PENDING:
        raise ValueError(f"name {name!r} is built in or reserved; choose another name")
    if not callable(backend):
        raise TypeError(f"backend must be callable, got {type(backend).__name__}")
    if name in _REGISTRY and not replace:
        raise ValueError(f"scan backend {name!r} is already registered; pass replace=True")
    _REGISTRY[name] = backend


def unregister_scan_backend(name: str) -> None:
    """Forget a backend registered with :func:`register_scan_backend` (KeyError if absent)."""
    if name not in _REGISTRY:
        raise KeyError(f"scan backend {name!r} is not registered")
    del _REGISTRY[name]


def get_scan_backend(name: str) -> ScanBackend:
    """The backend callable for ``name``, loading an entry point on first use.

    Raises:
        ValueError: unknown name, or ``"fused"`` (a whole-layer path, not a scan).
        TypeError: an entry point that does not load a callable.
    """
    check_scan_backend_name(name)
    if name in BUILTIN_SCAN_BACKENDS:
        return KernelScan(name)
    if name in _REGISTRY:
        return _REGISTRY[name]
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            loaded = ep.load()
            if not callable(loaded):
                raise TypeError(
                    f"entry point {ep.value!r} of group {ENTRY_POINT_GROUP!r} (name {name!r}) "
                    f"must load a scan-backend callable, got {type(loaded).__name__}"
                )
            _REGISTRY[name] = loaded
            return _REGISTRY[name]
    if name in _PENDING:
        raise ValueError(_PENDING[name])
    raise _unknown(name)


def resolved_scan_backend_name(name: str, rhs: Tensor, structure: Structure) -> str:
    """What actually runs for ``name`` on ``rhs`` (``"auto"`` becomes ``"triton"`` or ``"eager"``)."""
    if name not in BUILTIN_SCAN_BACKENDS:
        return name
    resolved: str = resolve_scan_backend(name, rhs.device, rhs.dtype)
    k = structure.k if isinstance(structure, Block) else rhs.shape[-1]
    if resolved == "triton" and not isinstance(structure, Diag) and k > MAX_TRITON_BLOCK:
        resolved = "eager"
    return resolved
