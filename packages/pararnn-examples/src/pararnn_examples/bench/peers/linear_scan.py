"""Linear-scan peers of ``pararnn_kernels.scan_diag`` (scope ``"scan"``).

Every one solves the same recurrence as ``scan_diag(jac, rhs)`` --
``y_t = jac_t ⊙ y_{t-1} + rhs_t``, ``y_{-1} = 0`` -- in its own layout or parametrisation. The
conversion happens once per case, in the builder, outside the timed calls; the output is turned
back (a view) only for the check against the float64 reference (:func:`scan_reference`).

=========================  ==================================================================
method                     peer call, layout, constraints
=========================  ==================================================================
``accelerated_scan``       ``accelerated_scan.scalar.scan(forget, inputs)``: Triton,
                           ``[B, D, T]`` contiguous (:func:`accelerated_scan_layout`), any T
``accelerated_scan_warp``  ``accelerated_scan.warp.scan(gates, tokens)``: CUDA C++ compiled at
                           import, ``[B, D, T]``, T a power of two in [32, 65536]
``fla_chunk_hgrn``         ``fla.ops.hgrn.chunk_hgrn(x, g)``: Triton, ``[B, T, D]``,
                           ``h_t = exp(g_t) h_{t-1} + x_t``: ``x = rhs``, ``g = log jac``
                           (:func:`fla_hgrn_inputs`), so ``jac > 0``
=========================  ==================================================================

Forward+backward back-propagates the case's ``∂L/∂y`` (converted like ``y``) into both of the
peer's inputs: for fla that is ``∂L/∂g = jac ⊙ ∂L/∂jac`` instead of ``∂L/∂jac``, the same work.
Each is checked against the float64 reference with :data:`PEER_TOLERANCES`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import torch
from torch import Tensor

from ..cases import BenchConfig, Case, ScanInputs
from ..methods import SCAN_REFERENCE_KEY, scan_reference
from ..registry import Method, Runner, register_method
from .base import PEER_TOLERANCES, Peer, warm_up

__all__ = [
    "ACCELERATED_SCAN",
    "ACCELERATED_SCAN_WARP",
    "FLA_HGRN",
    "accelerated_scan_layout",
    "fla_hgrn_inputs",
]

ACCELERATED_SCAN: Final = Peer(
    "accelerated-scan",
    "accelerated_scan.scalar",
    "accelerated_scan.scalar.scan(forget, inputs) on [B, D, T], Triton",
)
ACCELERATED_SCAN_WARP: Final = Peer(
    "accelerated-scan",
    "accelerated_scan.warp",
    "accelerated_scan.warp.scan(gates, tokens) on [B, D, T], CUDA C++ compiled at import",
)
FLA_HGRN: Final = Peer(
    "fla-core",
    "fla.ops.hgrn",
    "fla.ops.hgrn.chunk_hgrn(x, g) on [B, T, D] with g = log(jac), Triton",
)
#: accelerated_scan.warp's lengths: powers of two from 32 to 65536 (its dispatch table).
_WARP_STEPS: Final = (32, 65536)
#: CUDA's limit on the second grid axis, which accelerated_scan.scalar spends on the channels.
_GRID_Y_LIMIT: Final = 65535


def accelerated_scan_layout(jac: Tensor, rhs: Tensor) -> tuple[Tensor, Tensor]:
    """``(forget, inputs)`` of accelerated-scan for ``scan_diag``'s ``(jac, rhs)``.

    Args:
        jac, rhs: ``[B, T, D]``.

    Returns:
        Two ``[B, D, T]`` contiguous copies, detached leaves that require grad; the peer's output
        ``[B, D, T]`` is ``scan_diag(jac, rhs).transpose(1, 2)``.
    """
    if jac.shape != rhs.shape or jac.dim() != 3:
        raise ValueError(
            f"jac and rhs must both be [B, T, D], got {tuple(jac.shape)} and {tuple(rhs.shape)}"
        )
    forget = jac.detach().transpose(1, 2).contiguous().requires_grad_(True)
    inputs = rhs.detach().transpose(1, 2).contiguous().requires_grad_(True)
    return forget, inputs


def fla_hgrn_inputs(jac: Tensor, rhs: Tensor) -> tuple[Tensor, Tensor]:
    """``(x, g)`` of fla's hgrn (``h_t = exp(g_t) h_{t-1} + x_t``) for ``scan_diag``'s
    ``(jac, rhs)``.

    Args:
        jac: ``[B, T, D]``, every entry > 0.
        rhs: ``[B, T, D]``.

    Returns:
        ``x = rhs`` and ``g = log(jac)`` (taken in float32, stored in jac's dtype), both
        ``[B, T, D]`` detached leaves that require grad.

    Raises:
        ValueError: shapes differ, or some ``jac <= 0`` (its log is not finite).
    """
    if jac.shape != rhs.shape or jac.dim() != 3:
        raise ValueError(
            f"jac and rhs must both be [B, T, D], got {tuple(jac.shape)} and {tuple(rhs.shape)}"
        )
    smallest = float(jac.detach().min()) if jac.numel() else 1.0
    if not smallest > 0:
        raise ValueError(
            f"jac must be > 0 everywhere for fla's g = log(jac), got a minimum of {smallest}"
        )
    g = jac.detach().float().log().to(jac.dtype).requires_grad_(True)
    x = rhs.detach().clone().requires_grad_(True)
    return x, g


def _peer_available(peer: Peer) -> Callable[[Case, BenchConfig], str | None]:
    def available(case: Case, config: BenchConfig) -> str | None:
        return peer.unavailable(case.device)

    return available


def _accelerated_scan_available(case: Case, config: BenchConfig) -> str | None:
    reason = ACCELERATED_SCAN.unavailable(case.device)
    if reason is None and case.shape.width > _GRID_Y_LIMIT:
        reason = (
            f"accelerated_scan.scalar launches one program per (batch, channel) with the channels "
            f"on grid axis 1 (at most {_GRID_Y_LIMIT}), got D={case.shape.width}"
        )
    return reason


def _warp_available(case: Case, config: BenchConfig) -> str | None:
    reason = ACCELERATED_SCAN_WARP.unavailable(case.device)
    steps = case.shape.steps
    low, high = _WARP_STEPS
    if reason is None and (steps & (steps - 1) or not low <= steps <= high):
        reason = f"accelerated_scan.warp takes T a power of two from {low} to {high}, got T={steps}"
    return reason


def _bdt_runner(peer: Peer, case: Case, inputs: ScanInputs) -> Runner:
    """A runner of ``peer.scan(a, b)`` on ``[B, D, T]`` (both accelerated-scan kernels)."""
    scan = peer.attr("scan")
    forget, tokens = accelerated_scan_layout(inputs.jac, inputs.rhs)
    grad = inputs.cotangent.transpose(1, 2).contiguous()

    def forward() -> Tensor:
        with torch.no_grad():
            out: Tensor = scan(forget, tokens)
        return out

    def forward_backward() -> None:
        forget.grad = None
        tokens.grad = None
        torch.autograd.backward(scan(forget, tokens), grad)

    return Runner(
        forward,
        warm_up(peer, "scan", forward, forward_backward),
        reference=lambda: scan_reference(inputs),
        reference_key=SCAN_REFERENCE_KEY,
        tolerance=PEER_TOLERANCES[case.dtype],
        to_reference_layout=lambda y: y.transpose(1, 2),
    )


def _build_accelerated_scan(case: Case, inputs: ScanInputs, config: BenchConfig) -> Runner:
    return _bdt_runner(ACCELERATED_SCAN, case, inputs)


def _build_accelerated_scan_warp(case: Case, inputs: ScanInputs, config: BenchConfig) -> Runner:
    return _bdt_runner(ACCELERATED_SCAN_WARP, case, inputs)


def _build_fla_chunk_hgrn(case: Case, inputs: ScanInputs, config: BenchConfig) -> Runner:
    chunk_hgrn = FLA_HGRN.attr("chunk_hgrn")
    x, g = fla_hgrn_inputs(inputs.jac, inputs.rhs)
    grad = inputs.cotangent

    def forward() -> Tensor:
        with torch.no_grad():
            out: Tensor = chunk_hgrn(x, g)[0]
        return out

    def forward_backward() -> None:
        x.grad = None
        g.grad = None
        torch.autograd.backward(chunk_hgrn(x, g)[0], grad)

    return Runner(
        forward,
        warm_up(FLA_HGRN, "chunk_hgrn", forward, forward_backward),
        reference=lambda: scan_reference(inputs),
        reference_key=SCAN_REFERENCE_KEY,
        tolerance=PEER_TOLERANCES[case.dtype],
    )


def _register() -> None:
    register_method(
        Method(
            "accelerated_scan",
            "scope 'scan': accelerated-scan's Triton scan (accelerated_scan.scalar), [B, D, T]",
            _build_accelerated_scan,
            _accelerated_scan_available,
            scopes=("scan",),
            peer=ACCELERATED_SCAN,
        )
    )
    register_method(
        Method(
            "accelerated_scan_warp",
            "scope 'scan': accelerated-scan's CUDA C++ scan (accelerated_scan.warp; compiles at "
            "import; T a power of two)",
            _build_accelerated_scan_warp,
            _warp_available,
            scopes=("scan",),
            peer=ACCELERATED_SCAN_WARP,
        )
    )
    register_method(
        Method(
            "fla_chunk_hgrn",
            "scope 'scan': fla's chunk_hgrn (fla.ops.hgrn) with g = log(jac), [B, T, D]",
            _build_fla_chunk_hgrn,
            _peer_available(FLA_HGRN),
            scopes=("scan",),
            peer=FLA_HGRN,
        )
    )


_register()
