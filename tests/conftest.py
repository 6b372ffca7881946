"""Session-wide test setup for every package's tests.

Without a CUDA device the Triton kernels run in the Triton interpreter: ``TRITON_INTERPRET=1``
must be set before any kernel module is imported, which is why it happens here, at collection.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
