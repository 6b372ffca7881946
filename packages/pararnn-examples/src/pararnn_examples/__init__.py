"""pararnn_examples: the code behind ``examples/``.

* :mod:`pararnn_examples.train` -- the training loop every task shares (seed, progress bar with
  the Newton iterations and residuals, loss history and plot).
* :mod:`pararnn_examples.tasks` -- the tasks: running parity (state tracking, with a linear
  recurrence beside it) and a character-level language model on the Python standard library's
  own sources.
* :mod:`pararnn_examples.bench` -- ``pararnn-bench``, the benchmark harness (``docs/benchmarks.md``).
* :mod:`pararnn_examples.newton_iterations` -- the Newton-iterations-against-T study.
* :mod:`pararnn_examples.apidoc` -- writes ``docs/api/<package>.md`` from the docstrings.
* :mod:`pararnn_examples.torchrun` -- process-group setup shared by the distributed examples.

Nothing here is needed to train a model: ``pararnn-core`` is enough for one GPU.
"""

__version__ = "0.1.0"
