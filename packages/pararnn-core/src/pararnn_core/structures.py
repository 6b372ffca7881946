"""Jacobian structures: how a cell's state is laid out and what ``∂f/∂h`` looks like.

The structure decides the cost of Newton (DESIGN §1): the Jacobian ``J_t = ∂f/∂h(h_{t-1}, u_t)`` is
stored per step in one of three layouts, and the Newton correction is the matching linear scan.

==============  ====================  =======================  ==================================
structure       one state             one step's Jacobian      scan
==============  ====================  =======================  ==================================
``Diag()``      ``[B, D]``            ``[B, D]``               ``pararnn_kernels.scan_diag``
``Block(k)``    ``[B, D, k]``         ``[B, D, k, k]``         ``pararnn_kernels.scan_block_diag``
``Dense()``     ``[B, D]``            ``[B, D, D]``            block scan with one ``D x D`` block
==============  ====================  =======================  ==================================

A sequence of states adds the time axis after the batch: ``[B, T, D]``, ``[B, T, D, k]``. In a block
Jacobian ``J[..., d, i, j] = ∂h'[d, i] / ∂h[d, j]`` (row = output component, column = input). Dense is
for small ``D`` only: a test oracle and a way to try a mixing cell before writing a structured one.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Block", "Dense", "Diag", "Structure"]


@dataclass(frozen=True)
class Diag:
    """One scalar per channel: ``J_t`` is diagonal, stored as ``[B, T, D]``."""

    def state_shape(self, d_h: int) -> tuple[int, ...]:
        """Shape of one state without the batch axis: ``(d_h,)``."""
        return (d_h,)

    def jacobian_shape(self, d_h: int) -> tuple[int, ...]:
        """Shape of one step's Jacobian without the batch axis: ``(d_h,)``."""
        return (d_h,)

    def __str__(self) -> str:
        return "diag"


@dataclass(frozen=True)
class Block:
    """A ``k x k`` block per channel: state ``[B, D, k]``, ``J_t`` stored as ``[B, T, D, k, k]``.

    Args:
        k: components per channel (``k >= 1``; the Triton scan serves ``k <= 4``).
    """

    k: int

    def __post_init__(self) -> None:
        if not isinstance(self.k, int) or isinstance(self.k, bool) or self.k < 1:
            raise ValueError(f"Block(k): k must be a positive int, got {self.k!r}")

    def state_shape(self, d_h: int) -> tuple[int, ...]:
        """Shape of one state without the batch axis: ``(d_h, k)``."""
        return (d_h, self.k)

    def jacobian_shape(self, d_h: int) -> tuple[int, ...]:
        """Shape of one step's Jacobian without the batch axis: ``(d_h, k, k)``."""
        return (d_h, self.k, self.k)

    def __str__(self) -> str:
        return f"block{self.k}"


@dataclass(frozen=True)
class Dense:
    """A full ``D x D`` Jacobian: state ``[B, D]``, ``J_t`` stored as ``[B, T, D, D]`` (small D only)."""

    def state_shape(self, d_h: int) -> tuple[int, ...]:
        """Shape of one state without the batch axis: ``(d_h,)``."""
        return (d_h,)

    def jacobian_shape(self, d_h: int) -> tuple[int, ...]:
        """Shape of one step's Jacobian without the batch axis: ``(d_h, d_h)``."""
        return (d_h, d_h)

    def __str__(self) -> str:
        return "dense"


Structure = Diag | Block | Dense
