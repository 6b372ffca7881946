"""Results on disk and on screen: CSV, JSON, a markdown table and the time-against-T plot.

Files under the output directory:

* ``bench.csv`` -- one row per record, the columns of :data:`RECORD_COLUMNS` then one
  ``speedup_vs_<method>`` column per method of the run (empty where that ratio does not exist);
* ``bench.json`` -- ``{"environment": ..., "config": ..., "records": [...]}``, each record with
  the same fields and ``speedups`` as a ``{method: ratio}`` object (non-finite numbers as null);
* ``bench_time_vs_T.png`` -- median time against T, log-log, one panel per cell and direction,
  one line per method and scope, the HBM floor dotted. Needs matplotlib, imported only here; when
  it is missing the plot is skipped with a message.
"""

from __future__ import annotations

import csv
import dataclasses
import importlib
import json
import math
from collections import Counter
from pathlib import Path
from typing import Any, Final, NamedTuple

from .cases import DIRECTIONS, SCOPES, BenchConfig
from .harness import BenchRecord, BenchResult, config_as_dict
from .peers.base import PeerStatus

__all__ = [
    "CSV_NAME",
    "JSON_NAME",
    "PLOT_NAME",
    "RECORD_COLUMNS",
    "TABLE_BASELINES",
    "PlotOutcome",
    "Written",
    "format_peers",
    "format_table",
    "load_records",
    "plot_time_vs_steps",
    "result_from_records",
    "write_csv",
    "write_json",
    "write_results",
]

CSV_NAME: Final = "bench.csv"
JSON_NAME: Final = "bench.json"
PLOT_NAME: Final = "bench_time_vs_T.png"
#: Every CSV column before the ``speedup_vs_<method>`` ones (the fields of ``BenchRecord``).
RECORD_COLUMNS: Final[tuple[str, ...]] = tuple(
    f.name for f in dataclasses.fields(BenchRecord) if f.name != "speedups"
)
#: The methods the table shows speed-ups against (when the run timed them).
TABLE_BASELINES: Final[tuple[str, ...]] = (
    "sequential_fused",
    "cudnn",
    "flashrnn",
    "accelerated_scan",
    "accelerated_scan_warp",
    "fla_chunk_hgrn",
    "sequential_eager",
)


class PlotOutcome(NamedTuple):
    """Where the plot went (None when skipped) and a one-line message saying so or why not."""

    path: Path | None
    message: str


class Written(NamedTuple):
    """The files :func:`write_results` wrote."""

    csv: Path
    json: Path
    plot: PlotOutcome


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def write_csv(result: BenchResult, path: Path) -> Path:
    """``path`` with one row per record (module docstring)."""
    speedup_columns = [f"speedup_vs_{m}" for m in result.config.methods]
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[*RECORD_COLUMNS, *speedup_columns])
        writer.writeheader()
        for record in result.records:
            row: dict[str, Any] = {c: getattr(record, c) for c in RECORD_COLUMNS}
            for m in result.config.methods:
                row[f"speedup_vs_{m}"] = record.speedups.get(m)
            writer.writerow({k: "" if v is None else v for k, v in row.items()})
    return path


def write_json(result: BenchResult, path: Path) -> Path:
    """``path`` with the environment, the configuration and every record (module docstring)."""
    payload = {
        "environment": result.environment,
        "config": config_as_dict(result.config),
        "records": [dataclasses.asdict(r) for r in result.records],
    }
    path.write_text(json.dumps(_finite(payload), indent=1, default=str) + "\n")
    return path


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if value < 100 else f"{value:.1f}"


def _ratio(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}x" if value < 100 else f"{value:.0f}x"


def _order(result: BenchResult) -> list[BenchRecord]:
    methods = {m: i for i, m in enumerate(result.config.methods)}
    cells = {c: i for i, c in enumerate(result.config.cells)}
    dtypes = {d: i for i, d in enumerate(result.config.dtypes)}

    def key(r: BenchRecord) -> tuple[int | str, ...]:
        return (
            dtypes.get(r.dtype, 99),
            cells.get(r.cell, 99),
            DIRECTIONS.index(r.direction),
            SCOPES.index(r.scope),
            r.batch,
            r.width,
            r.steps,
            methods.get(r.method, 99),
        )

    return sorted(result.records, key=key)


def format_peers(result: BenchResult) -> str:
    """One line per peer method of the run: used, with the peer's version and the call, or
    skipped and why (empty when the run has no peer method)."""
    lines = [
        PeerStatus(p["method"], p["distribution"], p["version"], p["api"], p["reason"]).line()
        for p in result.environment.get("peers", [])
    ]
    return "\n".join(lines)


def format_table(result: BenchResult, *, reason_chars: int = 70) -> str:
    """A markdown table of every record, in the order dtype, cell, direction, scope, shape.

    ``x <method>`` columns are speed-ups against the :data:`TABLE_BASELINES` the run timed (the
    other method's median over this one's); ``% floor`` is ``100 * floor_ms / median_ms`` (in
    scope ``"scan"``: the fraction of the copy floor); ``MISMATCH`` marks a forward output
    outside its tolerance; ``n/c`` in ``max err`` a method of another model, not compared.
    """
    timed = {r.method for r in result.records if r.status == "ok"}
    baselines = [m for m in TABLE_BASELINES if m in result.config.methods and m in timed]
    head = ["cell", "dtype", "scope", "dir", "B", "T", "d", "method", "ms", "% floor"]
    head += [f"x {m}" for m in baselines]
    head += ["peak MB", "max err", "iters", "note"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in _order(result):
        if r.status == "ok":
            note = r.note
            if r.err_ok is False:
                note = f"MISMATCH (tol {r.err_tol:.1e})" + (f"; {note}" if note else "")
        else:
            note = f"{r.status}: {r.skipped_reason}"
        if len(note) > reason_chars:
            note = note[: reason_chars - 3] + "..."
        peak = "-" if r.peak_bytes is None else f"{r.peak_bytes / 2**20:.0f}"
        err = "-" if r.max_err is None else f"{r.max_err:.1e}"
        if r.reference.startswith("not comparable"):
            err = "n/c"
        pct = "-" if r.pct_of_floor is None else f"{r.pct_of_floor:.1f}"
        iters = "-" if r.newton_iters is None else str(r.newton_iters)
        cells = [r.cell, r.dtype, r.scope, r.direction, str(r.batch), str(r.steps), str(r.width)]
        cells += [r.method, _ms(r.median_ms), pct]
        cells += [_ratio(r.speedups.get(m)) for m in baselines]
        cells += [peak, err, iters, note.replace("|", "/")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _matplotlib() -> tuple[Any, str]:
    try:
        matplotlib = importlib.import_module("matplotlib")
    except ImportError as err:
        return None, f"plot skipped: matplotlib is not installed ({err})"
    matplotlib.use("Agg")
    return importlib.import_module("matplotlib.pyplot"), ""


def plot_time_vs_steps(result: BenchResult, path: Path) -> PlotOutcome:
    """Median time against T, log-log (module docstring), for the run's most common ``(B, d)``.

    Returns:
        The outcome; nothing is raised when matplotlib is missing or nothing was timed.
    """
    plt, why = _matplotlib()
    if plt is None:
        return PlotOutcome(None, why)
    timed = [r for r in result.records if r.status == "ok" and r.median_ms]
    if not timed:
        return PlotOutcome(None, "plot skipped: no record was timed")
    (batch, width), _ = Counter((r.batch, r.width) for r in timed).most_common(1)[0]
    timed = [r for r in timed if (r.batch, r.width) == (batch, width)]
    names = [*result.config.cells, *sorted({r.cell for r in timed} - set(result.config.cells))]
    cells = [c for c in names if any(r.cell == c for r in timed)]
    many_dtypes = len({r.dtype for r in timed}) > 1
    colors = {m: f"C{i % 10}" for i, m in enumerate(result.config.methods)}
    styles = {"recurrence": "-", "layer": "--", "scan": "-."}
    fig, axes = plt.subplots(
        len(cells), len(DIRECTIONS), figsize=(6.0 * len(DIRECTIONS), 3.8 * len(cells)),
        squeeze=False,
    )  # fmt: skip
    for row, cell in enumerate(cells):
        for col, direction in enumerate(DIRECTIONS):
            ax = axes[row][col]
            here = [r for r in timed if r.cell == cell and r.direction == direction]
            lines: dict[tuple[str, str, str], list[BenchRecord]] = {}
            for r in here:
                lines.setdefault((r.method, r.scope, r.dtype), []).append(r)
            for (method, scope, dtype), points in lines.items():
                points.sort(key=lambda r: r.steps)
                label = f"{method} ({scope}{', ' + dtype if many_dtypes else ''})"
                ax.plot(
                    [r.steps for r in points],
                    [r.median_ms for r in points],
                    marker="o",
                    linestyle=styles.get(scope, ":"),
                    color=colors.get(method, "k"),
                    label=label,
                )
            floors = sorted({(r.steps, r.floor_ms) for r in here if r.floor_ms})
            if floors:
                ax.plot(*zip(*floors, strict=True), "k:", label="HBM floor")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{cell} {direction} (B={batch}, d={width})")
            ax.set_xlabel("T (steps)")
            ax.set_ylabel("median ms")
            ax.grid(True, which="both", alpha=0.3)
            if here:
                ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return PlotOutcome(path, f"wrote {path}")


def write_results(result: BenchResult, out_dir: Path, *, plot: bool = True) -> Written:
    """Write the CSV, the JSON and (``plot``) the figure under ``out_dir`` (created)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path = write_csv(result, out_dir / CSV_NAME)
    json_path = write_json(result, out_dir / JSON_NAME)
    outcome = (
        plot_time_vs_steps(result, out_dir / PLOT_NAME)
        if plot
        else PlotOutcome(None, "plot skipped: --no-plot")
    )
    return Written(csv_path, json_path, outcome)


def load_records(path: Path) -> list[BenchRecord]:
    """The records a run saved line by line (``bench.records.jsonl``), in measurement order.

    Raises:
        ValueError: a line is not a JSON object with :class:`BenchRecord`'s fields (names the
            file and the line).
    """
    fields = {f.name for f in dataclasses.fields(BenchRecord)}
    records = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            unknown = set(row) - fields
            if unknown:
                raise ValueError(f"unknown fields {sorted(unknown)}")
            records.append(BenchRecord(**row))
        except (TypeError, ValueError) as err:
            raise ValueError(
                f"{path}:{number}: expected a BenchRecord as one JSON object, got {line[:80]!r} "
                f"({err})"
            ) from err
    return records


def result_from_records(records: list[BenchRecord], source: str) -> BenchResult:
    """A :class:`BenchResult` around records of earlier runs, for the table and the plot.

    The configuration lists the records' cells, methods and scopes in order of appearance;
    the environment says only where the records came from (the runs' own is in their
    ``bench.json``, when they got that far).
    """
    if not records:
        raise ValueError(f"records must not be empty (source {source!r})")
    cells = tuple(dict.fromkeys(r.cell for r in records if r.scope != "scan"))
    config = BenchConfig(
        cells=cells or BenchConfig().cells,
        methods=tuple(dict.fromkeys(r.method for r in records)),
        scopes=tuple(dict.fromkeys(r.scope for r in records)),
        device="cpu",  # the plot and the table never touch a device
    )
    return BenchResult(config, {"source": source}, records)
