"""Newton solver settings, per-layer statistics, and the divergence error."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from .backends import check_scan_backend_name

__all__ = ["DeferredNewtonStats", "NewtonConfig", "NewtonDivergenceError", "NewtonStats"]


@dataclass(frozen=True)
class NewtonConfig:
    """How :func:`~pararnn_core.newton_apply` solves ``h_t = f(h_{t-1}, u_t)`` (DESIGN §1).

    Attributes:
        max_iters: Newton updates at most (``>= 1``). After ``k`` updates the first ``k`` states
            are exact; contracting cells need 2-4.
        tol: stop early once ``max_t |f(h_{t-1}, u_t) - h_t| <= tol``. Checking costs one
            device-to-host sync per iteration on the unfused path; the fused kernels
            (``scan_backend="fused"``) decide per chunk on the device, with no sync, and stop
            at ``1e-6`` when ``tol`` is None. ``None`` (default) never stops early: exactly
            ``max_iters`` updates run with no sync in between, and the residual history is read
            back once at the end (one sync per layer and forward) for the stats and the
            divergence check.
        omega: damping, ``H <- H + omega * δ`` (``1`` is plain Newton).
        initial_guess: ``"step"`` (default): ``h^0_t = f(s, u_t)`` with ``s`` the cell's empty
            state -- ``f(0, u_t)`` as in the paper for cells whose empty state is zero;
            ``"initial_state"``: ``h^0_t = s``; ``"uncoupled"``: the states of the cell with
            its couplings to the previous state dropped, solved exactly by a scan
            (:meth:`ParaCell.uncoupled_states <pararnn_core.ParaCell.uncoupled_states>`; the
            fused kernels solve it per chunk from the chunk's exact start state). It knows the
            memory that the gates of the inputs alone carry, which a guess from one step
            cannot, so Newton starts about one update closer: more accuracy for the same
            ``max_iters`` (ParaSLSTM's fused chunks reach 1e-6 in three updates where one step's
            guess leaves 6e-5 to 4e-4) or, where chunks stop at ``tol``, fewer updates; what
            that costs or saves per shape is in docs/benchmarks.md (ParaGRU, ParaLSTM,
            ParaSLSTM; another cell must define ``uncoupled_states``, else the solve raises
            ``ValueError``).
        scan_backend: ``"auto"`` (on CUDA, the fused layer kernels for cells that have them,
            fused Newton or the fused sequential kernel by a cost model; the Triton scans
            otherwise), ``"triton"``, ``"eager"``, ``"fused"`` (the fused Newton kernels:
            :mod:`pararnn_core.fused`; ParaGRU, ParaLSTM and ParaSLSTM(mix='diag')), or a
            name registered through :func:`~pararnn_core.register_scan_backend` or the
            entry-point group ``pararnn.scan_backends``. An unknown name raises ValueError
            listing the known ones.
        divergence_threshold: the solve diverged if any iteration's max residual exceeds this
            (or is not finite).
        on_divergence: ``"raise"`` (:class:`NewtonDivergenceError`) or ``"sequential"``
            (recompute the layer with the sequential recurrence and record
            ``fallback="sequential"`` in its :class:`NewtonStats`).
        stats: when the solve's statistics come back to the host. ``"sync"`` (default): at the
            end of the forward (the one host sync per layer and forward above), so a divergence
            raises from the forward. ``"deferred"``: the forward waits for nothing; the
            statistics are copied to host memory as the device gets to them, and the layer's
            :class:`NewtonStats` takes them in when one of its attributes is first read or in
            the layer's backward, whichever comes first -- a divergence raises
            :class:`NewtonDivergenceError` there. The backward queues its own device work
            first and takes the statistics in before it hands back any gradient, so no
            gradient of a diverged solve reaches a parameter, and the device has the
            backward's work queued while the host waits for the forward's. The host can queue
            the following layers, the loss and the backward while the device still solves (a
            training loop that reads no statistics waits once per step, in the backward's
            first layer, with that layer's backward already queued). Needs
            ``on_divergence="raise"``: a sequential recomputation cannot wait. The unfused
            path with ``tol`` syncs at every iteration anyway; its last read is deferred all
            the same.
            ``"device"``: nothing waits, neither the forward nor the backward; the statistics
            stay in device memory and the layer's :class:`DeferredNewtonStats` reads them when
            one of its attributes is read, anew at every read (one sync each), so stats taken
            while capturing a CUDA graph show the latest replay's solve. A divergence raises
            from a read, and only there: the backward hands its gradients on without looking,
            so read the stats (or check the loss) before the optimizer step. The mode for
            capturing a training step in a CUDA graph (``torch.cuda.graph``,
            ``torch.compile(mode="reduce-overhead")``), where nothing may wait for the device:
            the fused kernels (time segments included) and the unfused path with
            ``tol=None`` capture; a solve that would wait while a graph is being captured
            (``stats`` other than ``"device"``, ``tol`` on the unfused path) raises a clear
            ``RuntimeError`` instead. Needs ``on_divergence="raise"`` as ``"deferred"`` does.
    """

    max_iters: int = 3
    tol: float | None = None
    omega: float = 1.0
    initial_guess: Literal["step", "initial_state", "uncoupled"] = "step"
    scan_backend: str = "auto"
    divergence_threshold: float = 1.0e6
    on_divergence: Literal["raise", "sequential"] = "raise"
    stats: Literal["sync", "deferred", "device"] = "sync"

    def __post_init__(self) -> None:
        if not isinstance(self.max_iters, int) or isinstance(self.max_iters, bool):
            raise TypeError(f"max_iters must be an int, got {type(self.max_iters).__name__}")
        if self.max_iters < 1:
            raise ValueError(f"max_iters must be >= 1, got {self.max_iters}")
        if self.tol is not None and not (isinstance(self.tol, int | float) and self.tol >= 0):
            raise ValueError(f"tol must be None or a float >= 0, got {self.tol!r}")
        if not (
            isinstance(self.omega, int | float) and self.omega > 0 and math.isfinite(self.omega)
        ):
            raise ValueError(f"omega must be a finite float > 0, got {self.omega!r}")
        if self.initial_guess not in ("step", "initial_state", "uncoupled"):
            raise ValueError(
                f"initial_guess must be 'step', 'initial_state' or 'uncoupled', "
                f"got {self.initial_guess!r}"
            )
        check_scan_backend_name(self.scan_backend)
        threshold = self.divergence_threshold
        if not (isinstance(threshold, int | float) and threshold > 0):
            raise ValueError(f"divergence_threshold must be a float > 0, got {threshold!r}")
        if self.on_divergence not in ("raise", "sequential"):
            raise ValueError(
                f"on_divergence must be 'raise' or 'sequential', got {self.on_divergence!r}"
            )
        if self.stats not in ("sync", "deferred", "device"):
            raise ValueError(f"stats must be 'sync', 'deferred' or 'device', got {self.stats!r}")
        if self.stats != "sync" and self.on_divergence != "raise":
            raise ValueError(
                f"stats={self.stats!r} needs on_divergence='raise' (a sequential recomputation "
                f"after a divergence cannot be deferred), got on_divergence={self.on_divergence!r}"
            )


@dataclass(frozen=True)
class NewtonStats:
    """What one layer's Newton solve did.

    Attributes:
        iters: Newton updates performed.
        max_residual: ``max |f(h_{t-1}, u_t) - h_t|`` of the returned states.
        residuals: the max residual before each update and after the last one
            (``iters + 1`` entries; ``residuals[0]`` is the initial guess's).
        backend: the scan backend that ran (``"auto"`` resolved to ``"triton"``/``"eager"``).
        converged: ``max_residual <= tol``; with ``tol=None``, ``<= sqrt(eps)`` of the dtype
            (a loose "converged", at least half the digits). False after a divergence.
        fallback: ``"sequential"`` when the states were recomputed sequentially after a
            divergence, else None.
    """

    iters: int
    max_residual: float
    residuals: tuple[float, ...]
    backend: str
    converged: bool
    fallback: str | None = None


class DeferredNewtonStats(NewtonStats):
    """:class:`NewtonStats` whose values are still on their way from the device
    (``NewtonConfig(stats="deferred")`` or ``"device"``).

    Reading any attribute (or comparing, printing, pickling) waits for the values, then checks
    the solve as the synchronous path does: a divergence raises :class:`NewtonDivergenceError`
    from that read, and from every later one. ``"deferred"``: the values are the copy the solve
    started, taken in once; the layer's backward makes the same check before it hands back
    gradients. ``"device"`` (:attr:`live`): every read takes the values from device memory
    anew, and the backward does not look.
    """

    def __init__(self, resolve: Callable[[], NewtonStats], *, live: bool = False) -> None:
        # Not the dataclass __init__: every field is read from the resolved stats.
        object.__setattr__(self, "_resolve", resolve)
        object.__setattr__(self, "_resolved", None)
        object.__setattr__(self, "_live", live)

    @property
    def live(self) -> bool:
        """Whether every read takes the values from the device anew (``stats="device"``)."""
        live: bool = object.__getattribute__(self, "_live")
        return live

    def resolved(self) -> NewtonStats:
        """The plain :class:`NewtonStats` (waits for the device: the first time, or every time
        when :attr:`live`).

        Raises:
            NewtonDivergenceError: the solve diverged.
        """
        done: NewtonStats | None = object.__getattribute__(self, "_resolved")
        if done is None:
            done = object.__getattribute__(self, "_resolve")()
            if not self.live:
                object.__setattr__(self, "_resolved", done)
        return done

    def __eq__(self, other: object) -> bool:
        if isinstance(other, DeferredNewtonStats):
            other = other.resolved()
        return self.resolved() == other

    def __hash__(self) -> int:
        return hash(self.resolved())

    def __repr__(self) -> str:
        return repr(self.resolved())

    def __reduce__(self) -> tuple[type[NewtonStats], tuple[object, ...]]:
        done = self.resolved()
        return NewtonStats, tuple(getattr(done, f.name) for f in dataclasses.fields(done))


def _resolved_field(name: str) -> property:
    return property(lambda self: getattr(self.resolved(), name), doc=f"``{name}`` when resolved.")


# Every NewtonStats field, read from the resolved stats (one list of fields to keep in step).
for _field in dataclasses.fields(NewtonStats):
    setattr(DeferredNewtonStats, _field.name, _resolved_field(_field.name))
del _field


class NewtonDivergenceError(RuntimeError):
    """The Newton residual grew past ``divergence_threshold`` or became non-finite.

    Attributes:
        residuals: max residual per iteration up to the divergence (the message shows them).
        threshold: the configured ``divergence_threshold``.
    """

    def __init__(self, residuals: Sequence[float], threshold: float, detail: str = "") -> None:
        self.residuals = tuple(float(r) for r in residuals)
        self.threshold = float(threshold)
        history = ", ".join(f"{r:.3e}" for r in self.residuals)
        super().__init__(
            f"Newton diverged: max residual per iteration [{history}] (threshold "
            f"{self.threshold:.3e}; non-finite counts as diverged){detail}. Use a more "
            "contracting cell or init, a smaller omega, or NewtonConfig(on_divergence='sequential')."
        )
