"""What every peer adapter shares: the lazy import, the version, the skip reasons, the tolerances.

A *peer* is a public library that users would pick instead of ParaRNN. Its adapter imports it only
when one of its methods is part of a run (:meth:`Peer.load`), and every way it cannot run becomes
a skip with the reason, never an error of the run: not installed (the ``ImportError`` text), no
CUDA device, a shape or dtype the library does not take, or a failure at its first call, which is
where these libraries compile their kernels (:func:`first_call`).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any, Final

import torch

if TYPE_CHECKING:
    from ..registry import Method

__all__ = [
    "BENCH_EXTRA",
    "PEER_TOLERANCES",
    "Peer",
    "PeerStatus",
    "PeerUnavailable",
    "first_call",
    "peer_statuses",
    "warm_up",
]

#: How to install every peer (the optional dependency group of pararnn-examples).
BENCH_EXTRA: Final = "pip install 'pararnn-examples[bench]'"
#: Relative tolerance of a peer's check against the float64 reference, per storage dtype:
#: ``max_err <= tolerance * max(1, max |reference|)`` -- the harness's own ``TOLERANCES``, so a
#: peer and ParaRNN pass the same test. bf16 allows for a peer that scans in bf16 (rounding at
#: each combine) or stores the log of the multiplier in bf16.
PEER_TOLERANCES: Final[dict[str, float]] = {"fp32": 1e-4, "fp16": 1e-2, "bf16": 6e-2}

#: Modules whose import raised something other than ImportError (e.g. a CUDA compilation at
#: import time): not retried within one process.
_BROKEN: dict[str, str] = {}


class PeerUnavailable(NotImplementedError):
    """A peer cannot run a case; the harness records the message as the skip reason."""


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def _describe(err: BaseException) -> str:
    """The error's type and first line, then its cause's (a compiler's error message quotes
    the source first and names what went wrong in the exception it was raised from)."""
    lines = str(err).strip().splitlines()
    text = f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__
    cause = err.__cause__ or err.__context__
    if cause is not None:
        text += f" (from {_one_line(cause)[:200]})"
    return text


@dataclass(frozen=True)
class Peer:
    """A library outside ParaRNN that benchmark methods call through its public API.

    Attributes:
        distribution: its name on PyPI (the version comes from ``importlib.metadata``).
        module: the module imported, lazily, e.g. ``"accelerated_scan.scalar"``.
        api: the call the adapter makes, its layout and its kind, for the printout.
        needs_cuda: its kernels run on CUDA devices only.
    """

    distribution: str
    module: str
    api: str
    needs_cuda: bool = True

    def version(self) -> str | None:
        """The installed version, or None (not installed, or a module without metadata)."""
        try:
            return importlib.metadata.version(self.distribution)
        except importlib.metadata.PackageNotFoundError:
            return None

    def load(self) -> ModuleType:
        """The imported module.

        Raises:
            PeerUnavailable: it does not import; the message names the distribution, the error
                and how to install it.
        """
        module = sys.modules.get(self.module)
        if module is not None:
            return module
        if self.module in _BROKEN:
            raise PeerUnavailable(_BROKEN[self.module])
        try:
            return importlib.import_module(self.module)
        except ImportError as err:
            raise PeerUnavailable(
                f"{self.distribution} is not installed or does not import "
                f"({_one_line(err)}); {BENCH_EXTRA}"
            ) from err
        except Exception as err:
            reason = f"import of {self.module} ({self.distribution}) failed: {_one_line(err)}"
            _BROKEN[self.module] = reason
            raise PeerUnavailable(reason) from err

    def attr(self, name: str) -> Any:
        """A public attribute of :attr:`module` (:meth:`load` first).

        Raises:
            PeerUnavailable: it does not import, or has no attribute ``name`` (another version).
        """
        module = self.load()
        if not hasattr(module, name):
            raise PeerUnavailable(
                f"{self.module} has no attribute {name!r} ({self.distribution} "
                f"{self.version() or 'version unknown'}); the adapter calls {self.api}"
            )
        return getattr(module, name)

    def unavailable(self, device: torch.device) -> str | None:
        """Why the peer cannot run on ``device`` at all (None when it can): the import first,
        then the device."""
        try:
            self.load()
        except PeerUnavailable as err:
            return str(err)
        if self.needs_cuda and device.type != "cuda":
            return (
                f"needs CUDA: {self.distribution}'s kernels run on CUDA devices, device is "
                f"{device.type}"
            )
        return None


def first_call(peer: Peer, what: str, fn: Callable[[], object]) -> None:
    """Call ``fn`` once, outside the timed calls: the call at which the peer compiles its kernels.

    Raises:
        torch.cuda.OutOfMemoryError: as is (the harness records it).
        PeerUnavailable: any other failure, naming the peer, ``what`` and the error.
    """
    try:
        fn()
    except torch.cuda.OutOfMemoryError:
        raise
    except Exception as err:
        version = peer.version()
        name = f"{peer.distribution} {version}" if version else peer.distribution
        raise PeerUnavailable(
            f"{name} {what} failed at its first call (where it compiles its kernels): "
            f"{_describe(err)}"
        ) from err


def warm_up(
    peer: Peer, what: str, forward: Callable[[], object], forward_backward: Callable[[], None]
) -> Callable[[], None]:
    """First calls of a peer's forward and forward+backward (:func:`first_call`).

    A failing forward raises :class:`PeerUnavailable` (every record of the case is skipped); a
    failing backward only makes the returned forward+backward raise it at each call, so the
    forward is still timed and only the ``fwd_bwd`` record is skipped, with the reason.

    Returns:
        ``forward_backward``, or a stand-in that raises the backward's failure.
    """
    first_call(peer, f"{what} forward", forward)
    try:
        first_call(peer, f"{what} forward+backward", forward_backward)
    except PeerUnavailable as err:
        reason = str(err)

        def unavailable() -> None:
            raise PeerUnavailable(reason)

        return unavailable
    return forward_backward


@dataclass(frozen=True)
class PeerStatus:
    """Whether one peer method of a run can run there, for the run's printout and environment.

    Attributes:
        method: the method's name.
        distribution, version, api: the peer's (version None: not installed or unknown).
        reason: why every case of the method is skipped ("" when it is used).
    """

    method: str
    distribution: str
    version: str | None
    api: str
    reason: str

    @property
    def used(self) -> bool:
        return not self.reason

    def line(self) -> str:
        """One line: ``peer <method>: <distribution> <version> used (<api>)`` or skipped, why."""
        version = self.version or ("version unknown" if self.used else "not installed")
        head = f"peer {self.method}: {self.distribution} {version}"
        return f"{head} used ({self.api})" if self.used else f"{head} skipped: {self.reason}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "distribution": self.distribution,
            "version": self.version,
            "api": self.api,
            "used": self.used,
            "reason": self.reason,
        }


def peer_statuses(methods: Iterable[Method[Any]], device: torch.device) -> list[PeerStatus]:
    """The status of each method of ``methods`` that calls a peer (imports it, if installed).

    Shape- and dtype-dependent reasons are not known here: they appear on the records.
    """
    out = []
    for method in methods:
        peer = method.peer
        if peer is None:
            continue
        reason = peer.unavailable(device) or ""
        out.append(PeerStatus(method.name, peer.distribution, peer.version(), peer.api, reason))
    return out
