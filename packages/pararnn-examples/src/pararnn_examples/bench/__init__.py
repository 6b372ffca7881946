"""pararnn-bench: the benchmark harness of the ParaRNN layers (``docs/benchmarks.md``).

Command line: ``pararnn-bench --out DIR ...`` or ``python3 -m pararnn_examples.bench --out DIR``
(``--help`` lists every option). From Python::

    from pararnn_examples.bench import BenchConfig, Shape, run_bench, write_results, format_table

    config = BenchConfig(device="cpu", shapes=(Shape(2, 64, 16),), repeats=3, warmup=1)
    result = run_bench(config)
    write_results(result, Path("bench_out"))
    print(format_table(result))

Methods come from a registry (:func:`register_method`); the built-in ones are in
:mod:`pararnn_examples.bench.methods` and a peer library plugs in the same way.
"""

# Importing the module registers the built-in methods.
from . import methods as methods
from .cases import (
    CELLS,
    DIRECTIONS,
    DTYPES,
    SCOPES,
    BenchConfig,
    Case,
    CaseInputs,
    Shape,
    grid_shapes,
    parse_shape,
    recurrence_view,
)
from .harness import TOLERANCES, BenchRecord, BenchResult, run_bench
from .measure import copy_bandwidth, floor_bytes, measure
from .registry import (
    Method,
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
    "CSV_NAME",
    "DIRECTIONS",
    "DTYPES",
    "JSON_NAME",
    "PLOT_NAME",
    "RECORD_COLUMNS",
    "SCOPES",
    "TOLERANCES",
    "BenchConfig",
    "BenchRecord",
    "BenchResult",
    "Case",
    "CaseInputs",
    "Method",
    "Reference",
    "Runner",
    "Shape",
    "copy_bandwidth",
    "floor_bytes",
    "format_table",
    "get_method",
    "grid_shapes",
    "measure",
    "method_names",
    "parse_shape",
    "plot_time_vs_steps",
    "recurrence_view",
    "register_method",
    "run_bench",
    "unregister_method",
    "write_results",
]
