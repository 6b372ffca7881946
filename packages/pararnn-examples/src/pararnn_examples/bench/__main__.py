"""``python3 -m pararnn_examples.bench``: the same as the ``pararnn-bench`` command."""

import sys

from .cli import main

sys.exit(main())
