"""pararnn-bench: the benchmark harness of the ParaRNN layers (``docs/benchmarks.md``).

Command line: ``pararnn-bench --out DIR ...`` or ``python3 -m pararnn_examples.bench --out DIR``
(``--help`` lists every option). From Python::

    from pararnn_examples.bench import BenchConfig, Shape, run_bench, write_results, format_table

    config = BenchConfig(device="cpu", shapes=(Shape(2, 64, 16),), repeats=3, warmup=1)
    result = run_bench(config)
    write_results(result, Path("bench_out"))
    print(format_table(result))

Methods come from a registry (:func:`register_method`); the built-in ones are in
:mod:`pararnn_examples.bench.methods`, and the public libraries timed beside ParaRNN
(accelerated-scan, fla, FlashRNN: the ``bench`` extra) in :mod:`pararnn_examples.bench.peers`,
registered the same way. The scope ``"scan"`` times ``pararnn_kernels.scan_diag`` against the
peers' linear scans::

    config = BenchConfig(scopes=("scan",), methods=("scan_diag_triton", "accelerated_scan"))
"""

# Importing the modules registers the built-in methods, then the peers'.
from . import methods as methods
from . import peers as peers
from .cases import (
    CELL_SCOPES,
    CELLS,
    DIRECTIONS,
    DTYPES,
    SCAN_CELL,
    SCAN_SHAPES,
    SCOPES,
    BenchConfig,
    Case,
    CaseInputs,
    ScanInputs,
    Shape,
    grid_shapes,
    make_scan_inputs,
    parse_shape,
    recurrence_view,
)
from .harness import TOLERANCES, BenchRecord, BenchResult, run_bench
from .measure import copy_bandwidth, floor_bytes, measure, scan_floor_bytes
from .peers.base import PeerStatus, peer_statuses
from .registry import (
    Method,
    NotComparable,
    Reference,
    Runner,
    get_method,
    method_names,
    register_method,
    unregister_method,
)
from .report import (
    CSV_NAME,
    JSON_NAME,
    PLOT_NAME,
    RECORD_COLUMNS,
    format_table,
    plot_time_vs_steps,
    write_results,
)

__all__ = [
    "CELLS",
    "CELL_SCOPES",
    "CSV_NAME",
    "DIRECTIONS",
    "DTYPES",
    "JSON_NAME",
    "PLOT_NAME",
    "RECORD_COLUMNS",
    "SCAN_CELL",
    "SCAN_SHAPES",
    "SCOPES",
    "TOLERANCES",
    "BenchConfig",
    "BenchRecord",
    "BenchResult",
    "Case",
    "CaseInputs",
    "Method",
    "NotComparable",
    "PeerStatus",
    "Reference",
    "Runner",
    "ScanInputs",
    "Shape",
    "copy_bandwidth",
    "floor_bytes",
    "format_table",
    "get_method",
    "grid_shapes",
    "make_scan_inputs",
    "measure",
    "method_names",
    "parse_shape",
    "peer_statuses",
    "plot_time_vs_steps",
    "recurrence_view",
    "register_method",
    "run_bench",
    "scan_floor_bytes",
    "unregister_method",
    "write_results",
]
