"""The example tasks and the model they share.

* :mod:`~pararnn_examples.tasks.models` -- embedding -> ParaRNN blocks (or the linear-recurrence
  baseline) -> head; :class:`ModelConfig`, :class:`SequenceModel`.
* :mod:`~pararnn_examples.tasks.quickstart` -- flip-flop memory, Newton-vs-sequential agreement
  and timing (``examples/quickstart.py``).
* :mod:`~pararnn_examples.tasks.state_tracking` -- running parity against a linear recurrence
  (``examples/state_tracking.py``).
* :mod:`~pararnn_examples.tasks.char_lm` -- a character LM on the standard library's source, with
  checkpoints and sampling (``examples/char_lm.py``).
* :mod:`~pararnn_examples.tasks.cli` -- the scripts' shared argument types and options.
"""

from .models import (
    CELLS,
    DiagonalLinearRNN,
    ModelConfig,
    RecurrentBlock,
    SequenceModel,
    build_model,
)

__all__ = [
    "CELLS",
    "DiagonalLinearRNN",
    "ModelConfig",
    "RecurrentBlock",
    "SequenceModel",
    "build_model",
]
