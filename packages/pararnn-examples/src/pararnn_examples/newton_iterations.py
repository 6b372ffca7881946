"""How many Newton iterations the built-in cells need, against the sequence length T.

DESIGN §1: after k exact Newton updates the first k states are exact, so a solve never needs
more than T updates; for contracting cells it needs a handful, whatever T is. This module measures
that claim for :class:`~pararnn_core.ParaGRU`, :class:`~pararnn_core.ParaLSTM` and
:class:`~pararnn_core.ParaSLSTM` at their default initialisation with inputs drawn from N(0, 1):
for each (cell, T) one :class:`~pararnn_core.ParaRNN` training forward on the CPU with the eager
scan backend, ``NewtonConfig(tol=..., max_iters=min(T, cap))``, and the iteration count read from
``model.last_stats`` (:class:`~pararnn_core.NewtonStats`). Each result is also compared with the
sequential recurrence (:func:`~pararnn_core.sequential_apply`) on the same cell and input.

Defaults: float64, ``tol = 1e-6`` on ``max_t |f(h_{t-1}, u_t) - h_t|`` -- float64 so that the count
reflects Newton, not float32 rounding (float32 residuals of states in ``[-1, 1]`` bottom out near
1e-7). ``examples/plot_newton_iterations.py`` runs :func:`main`; the figure is
``docs/img/newton_iterations.png`` and the table is in ``docs/numerics.md``.

Example:
    >>> from pararnn_examples.newton_iterations import StudyConfig, measure_iterations
    >>> result = measure_iterations("ParaGRU", 32, StudyConfig(batch=1, d_in=2, d_h=3))
    >>> result.converged, 1 <= result.iters <= 32
    (True, True)
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import torch

from pararnn_core import NewtonConfig, ParaCell, ParaGRU, ParaLSTM, ParaRNN, ParaSLSTM
from pararnn_core import sequential_apply as run_sequential

__all__ = [
    "CELL_TYPES",
    "DEFAULT_OUTPUT",
    "DEFAULT_STEPS",
    "IterationResult",
    "StudyConfig",
    "format_table",
    "main",
    "measure_iterations",
    "plot_iterations",
    "run_study",
]

#: The built-in cells the study covers, by the name the table prints.
CELL_TYPES: Final[dict[str, Callable[..., ParaCell]]] = {
    "ParaGRU": ParaGRU,
    "ParaLSTM": ParaLSTM,
    "ParaSLSTM": ParaSLSTM,
}
#: The sequence lengths of the study's grid.
DEFAULT_STEPS: Final[tuple[int, ...]] = (16, 64, 256, 1024, 4096)
#: Where the command line saves the figure, relative to the repository root.
DEFAULT_OUTPUT: Final = Path("docs/img/newton_iterations.png")
_DTYPES: Final[dict[str, torch.dtype]] = {"float64": torch.float64, "float32": torch.float32}


@dataclass(frozen=True)
class StudyConfig:
    """The grid and the solver settings of the study.

    Attributes:
        cells: names from :data:`CELL_TYPES`.
        steps: the sequence lengths T.
        batch, d_in, d_h: the problem size of every run (inputs ``[batch, T, d_in]``).
        dtype: the cells' and inputs' dtype (float64 or float32).
        tol: Newton stops once the max residual is ``<= tol`` (``NewtonConfig.tol``).
        max_iters_cap: ``NewtonConfig.max_iters = min(T, max_iters_cap)``: T updates always
            suffice in exact arithmetic; the cap bounds the time a cell that does not contract
            could take (it then shows as not converged).
        seed: seeds the cell's initialisation and the input of every (cell, T) run, so each
            result does not depend on which others ran before it.
    """

    cells: tuple[str, ...] = tuple(CELL_TYPES)
    steps: tuple[int, ...] = DEFAULT_STEPS
    batch: int = 4
    d_in: int = 16
    d_h: int = 64
    dtype: torch.dtype = torch.float64
    tol: float = 1e-6
    max_iters_cap: int = 64
    seed: int = 0

    def __post_init__(self) -> None:
        unknown = [c for c in self.cells if c not in CELL_TYPES]
        if unknown or not self.cells:
            raise ValueError(
                f"cells must be a non-empty subset of {tuple(CELL_TYPES)}, got {self.cells}"
            )
        if not self.steps or any(not isinstance(t, int) or t < 1 for t in self.steps):
            raise ValueError(f"steps must be a non-empty tuple of ints >= 1, got {self.steps}")
        for name in ("batch", "d_in", "d_h", "max_iters_cap"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if self.dtype not in _DTYPES.values():
            raise ValueError(f"dtype must be torch.float64 or torch.float32, got {self.dtype}")
        if not self.tol > 0:
            raise ValueError(f"tol must be > 0, got {self.tol!r}")


@dataclass(frozen=True)
class IterationResult:
    """One (cell, T) run.

    Attributes:
        cell, steps: the cell name and T.
        iters: Newton updates until the max residual was ``<= tol`` (``NewtonStats.iters``).
        max_iters: the ``NewtonConfig.max_iters`` the run had.
        residuals: the max residual before each update and after the last (``NewtonStats``).
        converged: ``NewtonStats.converged`` (the final residual is ``<= tol``).
        error_vs_sequential: ``max |y_newton - y_sequential|`` over the layer's outputs.
        seconds: wall time of the Newton forward (not of the sequential check).
    """

    cell: str
    steps: int
    iters: int
    max_iters: int
    residuals: tuple[float, ...]
    converged: bool
    error_vs_sequential: float
    seconds: float


def measure_iterations(cell_name: str, steps: int, config: StudyConfig) -> IterationResult:
    """Run one ParaRNN training forward of ``cell_name`` over T = ``steps`` and read its stats.

    The global torch RNG is left as it was (the run seeds a forked one with ``config.seed``).

    Raises:
        ValueError: unknown ``cell_name`` or ``steps < 1``.
        NewtonDivergenceError: the solve diverged (never at the cells' default init).
    """
    if cell_name not in CELL_TYPES:
        raise ValueError(f"cell_name must be one of {tuple(CELL_TYPES)}, got {cell_name!r}")
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an int >= 1, got {steps!r}")
    max_iters = min(steps, config.max_iters_cap)
    newton = NewtonConfig(max_iters=max_iters, tol=config.tol, scan_backend="eager")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        cell = CELL_TYPES[cell_name](config.d_in, config.d_h, dtype=config.dtype)
        x = torch.randn(config.batch, steps, config.d_in, dtype=config.dtype)
    model = ParaRNN(cell, newton).train()
    with torch.no_grad():
        start = time.perf_counter()
        y = model(x)
        seconds = time.perf_counter() - start
        (stats,) = model.last_stats
        # The answer itself, not only the residual: Newton's output is the recurrence's.
        reference = cell.output(run_sequential(cell, x))
    assert isinstance(y, torch.Tensor)
    error = (y - reference).abs().max().item()
    return IterationResult(
        cell=cell_name,
        steps=steps,
        iters=stats.iters,
        max_iters=max_iters,
        residuals=stats.residuals,
        converged=stats.converged,
        error_vs_sequential=error,
        seconds=seconds,
    )


def run_study(
    config: StudyConfig,
    progress: Callable[[Iterable[tuple[str, int]]], Iterable[tuple[str, int]]] | None = None,
) -> list[IterationResult]:
    """:func:`measure_iterations` over the grid ``config.cells × config.steps``.

    Args:
        config: the grid and settings.
        progress: wraps the iterable of ``(cell, T)`` pairs (e.g. ``tqdm``); None for none.

    Returns:
        One result per pair, cells in ``config.cells`` order, T ascending within a cell.
    """
    grid: Iterable[tuple[str, int]] = [
        (cell, steps) for cell in config.cells for steps in sorted(config.steps)
    ]
    if progress is not None:
        grid = progress(grid)
    return [measure_iterations(cell, steps, config) for cell, steps in grid]


def format_table(results: Sequence[IterationResult], *, with_time: bool = False) -> str:
    """A markdown table: one row per (cell, T) with the iterations, the max residual before the
    first update and after each one, and the difference from the sequential recurrence.

    ``with_time`` adds the wall time column (left out of the docs: it depends on the machine).
    """
    header = ["cell", "T", "iterations", "max_iters", "max residual per iteration", "converged"]
    header.append("max abs(Newton - sequential)")
    if with_time:
        header.append("seconds")
    rows = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in results:
        cells = [
            r.cell,
            str(r.steps),
            str(r.iters),
            str(r.max_iters),
            " → ".join(f"{v:.1e}" for v in r.residuals),
            "yes" if r.converged else "no",
            f"{r.error_vs_sequential:.1e}",
        ]
        if with_time:
            cells.append(f"{r.seconds:.2f}")
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _dtype_name(dtype: torch.dtype) -> str:
    return next(name for name, value in _DTYPES.items() if value == dtype)


def plot_iterations(results: Sequence[IterationResult], config: StudyConfig, path: Path) -> None:
    """Save the two-panel figure: iterations against T, and the residual per iteration at the
    largest T, one line per cell.

    Raises:
        ValueError: ``results`` is empty.
    """
    if not results:
        raise ValueError("results must hold at least one IterationResult, got none")
    # The object-oriented API with no pyplot: no global figure state, no display backend needed.
    from matplotlib.figure import Figure
    from matplotlib.ticker import FormatStrFormatter

    fig = Figure(figsize=(11.0, 4.2), layout="constrained")
    left, right = fig.subplots(1, 2)
    cells = list(dict.fromkeys(r.cell for r in results))
    all_steps = sorted({r.steps for r in results})
    # Equal counts would hide each other: distinct markers and dashes keep every cell visible.
    markers, dashes = ("o", "s", "^", "D"), ("-", "--", ":", "-.")
    left.plot(all_steps, all_steps, color="grey", linewidth=1, label="worst case: T")
    for i, cell in enumerate(cells):
        mine = sorted((r for r in results if r.cell == cell), key=lambda r: r.steps)
        style = {
            "color": f"C{i}",
            "marker": markers[i % 4],
            "markersize": 9 - 2 * (i % 4),  # smaller on top, so stacked markers all show
            "linestyle": dashes[i % 4],
        }
        left.plot([r.steps for r in mine], [r.iters for r in mine], label=cell, **style)
        last = mine[-1]  # this cell's longest run
        right.semilogy(
            range(len(last.residuals)),
            [max(v, 1e-300) for v in last.residuals],
            label=f"{cell} (T = {last.steps})",
            **style,
        )
    left.set_xscale("log", base=2)
    left.set_yscale("log", base=2)
    left.set_ylim(bottom=1)
    for axis in (left.xaxis, left.yaxis):
        axis.set_major_formatter(FormatStrFormatter("%g"))
    left.set_xlabel("sequence length T")
    left.set_ylabel("Newton iterations to reach tol")
    left.set_title(
        f"iterations to max residual <= {config.tol:g} ({_dtype_name(config.dtype)}, "
        f"B = {config.batch}, d_h = {config.d_h})",
        fontsize=10,
    )
    left.grid(True, alpha=0.3)
    left.legend()
    right.axhline(config.tol, color="grey", linewidth=1, label=f"tol = {config.tol:g}")
    right.set_xticks(range(max(len(r.residuals) for r in results)))
    right.set_xlabel("Newton iteration (0: the initial guess)")
    right.set_ylabel("max_t |f(h_{t-1}, u_t) - h_t|")
    right.set_title("max residual per iteration, longest T", fontsize=10)
    right.grid(True, alpha=0.3)
    right.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="plot_newton_iterations",
        description=(
            "Newton iterations needed by ParaGRU, ParaLSTM and ParaSLSTM (default init, inputs "
            "N(0, 1)) to reach a residual tolerance, against T; CPU, eager scan backend. Prints "
            "a markdown table and saves a figure."
        ),
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of every run (default 0)")
    parser.add_argument(
        "--steps", type=int, nargs="+", default=list(DEFAULT_STEPS), help="sequence lengths T"
    )
    parser.add_argument(
        "--cells", nargs="+", choices=list(CELL_TYPES), default=list(CELL_TYPES), help="cells"
    )
    parser.add_argument("--batch", type=int, default=StudyConfig.batch, help="batch size B")
    parser.add_argument("--d-in", type=int, default=StudyConfig.d_in, help="input features")
    parser.add_argument("--d-h", type=int, default=StudyConfig.d_h, help="hidden channels")
    parser.add_argument(
        "--dtype", choices=list(_DTYPES), default="float64", help="precision (default float64)"
    )
    parser.add_argument(
        "--tol", type=float, default=StudyConfig.tol, help="residual tolerance (default 1e-6)"
    )
    parser.add_argument(
        "--max-iters-cap",
        type=int,
        default=StudyConfig.max_iters_cap,
        help="max_iters = min(T, this) (default 64)",
    )
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUTPUT, help=f"figure path (default {DEFAULT_OUTPUT})"
    )
    parser.add_argument("--no-plot", action="store_true", help="print the table only")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def _tqdm(pairs: Iterable[tuple[str, int]]) -> Iterator[tuple[str, int]]:
    from tqdm import tqdm  # type: ignore[import-untyped]

    items = list(pairs)
    bar = tqdm(items, unit="run", dynamic_ncols=True)
    for cell, steps in bar:
        bar.set_postfix_str(f"{cell} T={steps}")
        yield cell, steps


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (``--help``); returns the exit status: 1 if a run did not converge."""
    args = _parser().parse_args(argv)
    try:
        config = StudyConfig(
            cells=tuple(args.cells),
            steps=tuple(args.steps),
            batch=args.batch,
            d_in=args.d_in,
            d_h=args.d_h,
            dtype=_DTYPES[args.dtype],
            tol=args.tol,
            max_iters_cap=args.max_iters_cap,
            seed=args.seed,
        )
    except ValueError as error:
        _parser().error(str(error))
    results = run_study(config, None if args.no_progress else _tqdm)
    print(
        f"Newton iterations to max residual <= {config.tol:g}, {args.dtype}, B = {config.batch}, "
        f"d_in = {config.d_in}, d_h = {config.d_h}, seed {config.seed}, CPU, scan_backend='eager', "
        f"max_iters = min(T, {config.max_iters_cap})"
    )
    print(format_table(results, with_time=True))
    if not args.no_plot:
        plot_iterations(results, config, args.out)
        print(f"figure: {args.out}")
    return 0 if all(r.converged for r in results) else 1
