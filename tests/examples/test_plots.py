"""The Newton-iteration study (pararnn_examples.newton_iterations) at tiny sizes on the CPU."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from pararnn_examples.newton_iterations import (
    CELL_TYPES,
    IterationResult,
    StudyConfig,
    format_table,
    main,
    measure_iterations,
    plot_iterations,
    run_study,
)

TINY = StudyConfig(steps=(2, 17, 64), batch=2, d_in=3, d_h=4)


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """One intra-op thread: these tiny problems gain nothing from more, and on a CPU shared with
    other jobs extra threads spin-wait (the eager block scan ran 40x slower with 2 threads)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def results() -> list[IterationResult]:
    return run_study(TINY)


def test_grid_order_and_sensible_counts(results: list[IterationResult]) -> None:
    assert [(r.cell, r.steps) for r in results] == [
        (cell, steps) for cell in CELL_TYPES for steps in (2, 17, 64)
    ]
    for r in results:
        label = f"{r.cell} T={r.steps}"
        # T >= 2: the initial guess f(h0, u_t) is exact only at t = 1, so at least one update.
        assert 1 <= r.iters <= r.steps, label
        assert r.max_iters == min(r.steps, TINY.max_iters_cap), label
        assert r.converged, label
        assert len(r.residuals) == r.iters + 1, label
        assert r.residuals[-1] <= TINY.tol < r.residuals[-2], label  # stopped at the first pass
        # float64 at tol 1e-6 with quadratic convergence: the last update lands far below tol.
        assert r.error_vs_sequential <= 1e-8, f"{label}: {r.error_vs_sequential:.2e}"


def test_two_steps_need_exactly_one_update() -> None:
    """After k updates the first k + 1 states are exact (the guess has the first): T = 2 -> 1."""
    for cell in CELL_TYPES:
        result = measure_iterations(cell, 2, TINY)
        assert result.iters == 1 and result.residuals[-1] <= 1e-15, result


def test_runs_are_reproducible_and_leave_the_rng_alone() -> None:
    state = torch.random.get_rng_state()
    first = measure_iterations("ParaLSTM", 17, TINY)
    second = measure_iterations("ParaLSTM", 17, TINY)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert first.residuals == second.residuals and first.iters == second.iters


def test_float32_reaches_its_tolerance() -> None:
    config = StudyConfig(
        cells=("ParaGRU",), steps=(64,), batch=2, d_in=3, d_h=4, dtype=torch.float32
    )
    (result,) = run_study(config)
    assert result.converged and 1 <= result.iters <= 64
    assert result.error_vs_sequential <= 1e-5


def test_table_and_figure(results: list[IterationResult], tmp_path: Path) -> None:
    table = format_table(results).splitlines()
    assert len(table) == 2 + len(results)
    assert table[2].startswith("| ParaGRU | 2 | 1 | 2 |")
    assert "seconds" in format_table(results, with_time=True).splitlines()[0]
    path = tmp_path / "img" / "iterations.png"
    plot_iterations(results, TINY, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="at least one IterationResult"):
        plot_iterations([], TINY, path)


def test_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "fig.png"
    code = main(
        ["--steps", "4", "--cells", "ParaGRU", "--d-h", "3", "--no-progress", "--out", str(out)]
    )
    assert code == 0 and out.is_file()
    printed = capsys.readouterr().out
    assert "| ParaGRU | 4 |" in printed and "float64" in printed
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    assert "--seed" in capsys.readouterr().out


def test_bad_settings_are_named() -> None:
    with pytest.raises(ValueError, match="cells must be a non-empty subset"):
        StudyConfig(cells=("ParaRNN",))
    with pytest.raises(ValueError, match="steps must be"):
        StudyConfig(steps=(0,))
    with pytest.raises(ValueError, match="d_h must be an int >= 1"):
        StudyConfig(d_h=0)
    with pytest.raises(ValueError, match="dtype must be"):
        StudyConfig(dtype=torch.float16)
    with pytest.raises(ValueError, match="cell_name must be one of"):
        measure_iterations("GRU", 4, TINY)
