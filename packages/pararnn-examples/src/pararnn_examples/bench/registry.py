"""The method registry: what the harness can time, by name.

A method is a :class:`Method`: a name, a one-line summary, an availability check and a builder.
For each case (:class:`~pararnn_examples.bench.Case`) the harness asks ``available(case, config)``
-- ``None`` means "time it", a string is the reason it is recorded as skipped -- and then calls
``build(case, inputs, config)`` for a :class:`Runner`: the forward, the forward+backward, and the
float64 reference its forward output is compared with. Exceptions raised while building or
running are recorded too (``docs/benchmarks.md``: NotImplementedError, out of memory and cuDNN
refusals as skipped, anything else as an error).

The built-in methods live in :mod:`pararnn_examples.bench.methods`; a peer library (accelerated-
scan, FlashRNN, fla, ...) plugs in the same way::

    register_method(Method("flashrnn", "FlashRNN triton_fused", build_flashrnn, flashrnn_available))

and becomes a ``--methods`` choice, a row of the table and a ``speedup_vs_flashrnn`` column.
The peer adapters that ship with the harness are in :mod:`pararnn_examples.bench.peers`.

A method serves one or more *scopes* (:data:`SCOPES`): the cell scopes ``"recurrence"`` and
``"layer"`` hand it a :class:`~pararnn_examples.bench.CaseInputs`, the scope ``"scan"`` (the
linear recurrence alone) a :class:`~pararnn_examples.bench.ScanInputs`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Generic, NamedTuple, TypeVar

from torch import Tensor

import pararnn_core as pc

if TYPE_CHECKING:
    from .cases import BenchConfig, Case
    from .peers.base import Peer

__all__ = [
    "CELL_SCOPES",
    "SCOPES",
    "Method",
    "NotComparable",
    "Reference",
    "Runner",
    "get_method",
    "method_names",
    "register_method",
    "unregister_method",
]


#: ``"recurrence"``: projected inputs ``u`` to the states; ``"layer"``: ``x`` to the states with
#: the input projection; ``"scan"``: the diagonal linear recurrence ``y_t = a_t y_{t-1} + b_t``
#: alone (``docs/benchmarks.md``).
SCOPES: Final[tuple[str, ...]] = ("recurrence", "layer", "scan")
#: The scopes whose cases are a cell layer (every scope but ``"scan"``).
CELL_SCOPES: Final[tuple[str, ...]] = ("recurrence", "layer")

#: What a method's builder receives: ``CaseInputs`` (cell scopes) or ``ScanInputs`` ("scan").
InputsT = TypeVar("InputsT")


class Reference(NamedTuple):
    """A float64 result a method's forward output is compared with.

    Attributes:
        value: the reference, like the method's forward output (any device; compared in float64
            on the CPU).
        kind: how it was computed, e.g. ``"sequential_fp64"``; goes to the ``reference`` column.
    """

    value: Tensor
    kind: str


class NotComparable(NamedTuple):
    """What a method whose model differs from the case's (e.g. FlashRNN's dense per-head
    recurrence against our diagonal cells) returns instead of a :class:`Reference`.

    Its forward output is checked for shape and finiteness only, and the record says why it was
    not compared.

    Attributes:
        kind: the ``reference`` column, e.g. ``"not comparable: different model"``.
        shape: the shape the forward output must have.
        note: what differs, for the ``note`` column.
    """

    kind: str
    shape: tuple[int, ...]
    note: str = ""


def _no_stats() -> pc.NewtonStats | None:
    return None


def _same_layout(out: Tensor) -> Tensor:
    return out


@dataclass(frozen=True)
class Runner:
    """One method, built for one case.

    Attributes:
        forward: runs the forward under ``torch.no_grad()`` and returns what is checked: the
            states ``[B, T, *S]`` for ParaRNN methods, the output ``[B, T, d]`` for cuDNN.
        forward_backward: runs the forward with autograd and back-propagates the case's
            cotangent into the inputs and every parameter (gradients are reset at each call).
        reference: computes the float64 reference of ``forward()``'s result on the same inputs
            (after :attr:`to_reference_layout`), or a :class:`NotComparable`.
        reference_key: methods of one case with the same key share one reference computation.
        stats: the :class:`~pararnn_core.NewtonStats` of the latest ``forward()`` (None for
            methods without Newton).
        tolerance: relative tolerance of the check, ``max_err <= tolerance * max(1, max|ref|)``;
            None for the storage dtype's default (``harness.TOLERANCES``).
        to_reference_layout: maps ``forward()``'s result to the reference's layout before the
            check, outside the timed calls (e.g. a peer's ``[B, D, T]`` back to ``[B, T, D]``).
        note: a remark for every record of this method (e.g. which backend a peer ran).
        compiles: False when the method's first call compiles or builds nothing (the eager step
            loop): then a first forward+backward slower than ``BenchConfig.slow_ms`` is itself
            the timed call, not a warm-up followed by one (the step loop's forward+backward
            takes minutes at T = 65536).
    """

    forward: Callable[[], Tensor]
    forward_backward: Callable[[], None]
    reference: Callable[[], Reference | NotComparable]
    reference_key: str
    stats: Callable[[], pc.NewtonStats | None] = _no_stats
    tolerance: float | None = None
    to_reference_layout: Callable[[Tensor], Tensor] = _same_layout
    note: str = ""
    compiles: bool = True


def _always_available(case: Case, config: BenchConfig) -> str | None:
    return None


@dataclass(frozen=True)
class Method(Generic[InputsT]):
    """A registered benchmark method.

    Attributes:
        name: the ``--methods`` name and the ``method`` column (``[a-z0-9_]+``).
        summary: one line for ``--help`` and the docs.
        build: ``(case, inputs, config) -> Runner``; may raise (recorded, see the module
            docstring). ``inputs`` is a ``CaseInputs`` in the cell scopes and a ``ScanInputs`` in
            scope ``"scan"``.
        available: ``(case, config) -> None`` to time the case, or the reason it is skipped.
        scopes: the scopes the method serves (default: the cell scopes); the harness runs it
            only there.
        peer: the library outside ParaRNN the method calls (None for ParaRNN's own and
            PyTorch's); the run's printout and environment name its version or why it is
            skipped.
    """

    name: str
    summary: str
    build: Callable[[Case, InputsT, BenchConfig], Runner]
    available: Callable[[Case, BenchConfig], str | None] = _always_available
    scopes: tuple[str, ...] = CELL_SCOPES
    peer: Peer | None = None

    def __post_init__(self) -> None:
        valid = self.name and all(c.isascii() and (c.isalnum() or c == "_") for c in self.name)
        if not valid or self.name != self.name.lower():
            raise ValueError(
                f"Method name must be lower-case letters, digits and '_', got {self.name!r}"
            )
        if not callable(self.build) or not callable(self.available):
            raise TypeError("Method build and available must be callable")
        unknown = [s for s in self.scopes if s not in SCOPES]
        if not self.scopes or unknown:
            raise ValueError(
                f"Method scopes must be a non-empty subset of {list(SCOPES)}, got "
                f"{list(self.scopes)}"
            )


_METHODS: dict[str, Method[Any]] = {}


def register_method(method: Method[Any], *, replace: bool = False) -> None:
    """Make ``method`` a harness method (appended to the default method order).

    Raises:
        TypeError: ``method`` is not a :class:`Method`.
        ValueError: the name is taken and ``replace`` is False.
    """
    if not isinstance(method, Method):
        raise TypeError(f"method must be a Method, got {type(method).__name__}")
    if method.name in _METHODS and not replace:
        raise ValueError(f"method {method.name!r} is already registered; pass replace=True")
    _METHODS[method.name] = method


def unregister_method(name: str) -> None:
    """Forget a registered method (KeyError if absent)."""
    if name not in _METHODS:
        raise KeyError(f"method {name!r} is not registered")
    del _METHODS[name]


def method_names(scope: str | None = None) -> tuple[str, ...]:
    """Registered method names, in registration order (those serving ``scope`` if given)."""
    return tuple(n for n, m in _METHODS.items() if scope is None or scope in m.scopes)


def get_method(name: str) -> Method[Any]:
    """The registered method called ``name``.

    Raises:
        ValueError: unknown name (the message lists the known ones).
    """
    if name not in _METHODS:
        raise ValueError(f"method must be one of {list(_METHODS)}, got {name!r}")
    return _METHODS[name]
