"""How many Newton iterations ParaGRU, ParaLSTM and ParaSLSTM need, against the sequence length.

    uv run examples/plot_newton_iterations.py            # T in {16, 64, 256, 1024, 4096}
    uv run examples/plot_newton_iterations.py --help

CPU only (the eager scan backend), float64, tolerance 1e-6 on the max residual
``max_t |f(h_{t-1}, u_t) - h_t|``; each cell at its default init with inputs from N(0, 1). Prints
a markdown table (iterations, residuals, the largest difference from the sequential recurrence)
and saves ``docs/img/newton_iterations.png``. The code is
:mod:`pararnn_examples.newton_iterations`; ``docs/numerics.md`` shows the result.
"""

from __future__ import annotations

from pararnn_examples.newton_iterations import main

if __name__ == "__main__":
    raise SystemExit(main())
