"""Peer libraries timed beside ParaRNN, each through its public API (``docs/benchmarks.md``).

Installed with the optional dependency group ``pararnn-examples[bench]`` (CUDA only); each is
imported lazily, when one of its methods is part of a run, and skipped with the reason when it
does not import, needs a GPU the run does not have, or cannot take a case's shape or dtype.

============================  =============================================  =================
method                        peer                                           scope
============================  =============================================  =================
``accelerated_scan``          accelerated-scan, ``accelerated_scan.scalar``  ``"scan"``
``accelerated_scan_warp``     accelerated-scan, ``accelerated_scan.warp``    ``"scan"``
``fla_chunk_hgrn``            fla-core, ``fla.ops.hgrn.chunk_hgrn``          ``"scan"``
``flashrnn``                  flashrnn, ``flashrnn.flashrnn``                cell scopes
============================  =============================================  =================

:mod:`.linear_scan` and :mod:`.layers` say how each one's inputs are laid out and checked.
Importing this package registers the methods.
"""

from .base import (
    BENCH_EXTRA,
    PEER_TOLERANCES,
    Peer,
    PeerStatus,
    PeerUnavailable,
    first_call,
    peer_statuses,
    warm_up,
)
from .layers import FLASHRNN, FLASHRNN_CELLS, FLASHRNN_HEAD_DIM, FlashRNNCell
from .linear_scan import (
    ACCELERATED_SCAN,
    ACCELERATED_SCAN_WARP,
    FLA_HGRN,
    accelerated_scan_layout,
    fla_hgrn_inputs,
)

__all__ = [
    "ACCELERATED_SCAN",
    "ACCELERATED_SCAN_WARP",
    "BENCH_EXTRA",
    "FLASHRNN",
    "FLASHRNN_CELLS",
    "FLASHRNN_HEAD_DIM",
    "FLA_HGRN",
    "PEER_TOLERANCES",
    "FlashRNNCell",
    "Peer",
    "PeerStatus",
    "PeerUnavailable",
    "accelerated_scan_layout",
    "first_call",
    "fla_hgrn_inputs",
    "peer_statuses",
    "warm_up",
]
