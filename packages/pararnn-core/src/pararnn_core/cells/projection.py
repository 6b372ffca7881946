"""The built-in cells' input projection: an ``nn.Linear`` that can run its float32 GPU GEMMs on
the tensor cores to float32 accuracy (``pararnn_kernels.linear_tf32x3``).

In float32 with PyTorch's default matmul precision, a cell layer's time at moderate widths is
mostly its projection's three GEMMs (forward, and the input and weight gradients: 0.82 of a
ParaGRU layer's 1.22 ms of GPU work at B = 8, T = 4096, d = 256 on an H200, docs/benchmarks.md),
which PyTorch runs on the CUDA cores. Same parameters, ``state_dict`` and initialisation as
``nn.Linear``; only where the product runs can differ.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from pararnn_kernels import linear_tf32x3

__all__ = ["ProjectionLinear"]


class ProjectionLinear(nn.Linear):
    """``nn.Linear`` with a choice of GEMM: ``[..., in_features] -> [..., out_features]``.

    ``backend`` (an attribute, per module):

    * ``"auto"`` (the default): :func:`pararnn_kernels.linear_tf32x3` -- for float32 CUDA
      operands of 1024 rows or more under PyTorch's ``"highest"`` float32 matmul precision,
      the forward and ``∂L/∂x`` run on the tensor cores (three TF32 products per product,
      float32 accuracy; the weight and bias gradients stay PyTorch's); everything else (other
      dtypes, the CPU, ``torch.set_float32_matmul_precision("high")``, traced calls) is
      ``F.linear``. On an H100 a ParaGRU layer's forward+backward at B = 8, d = 256 took
      1.18-1.19x less time than with ``F.linear``, a ParaLSTM's 1.12-1.13x
      (``benchmarks/bench_projection.py``, docs/benchmarks.md).
    * ``"eager"``: ``F.linear``, exactly ``nn.Linear`` (also where a projection must be
      differentiated twice: the kernel's backward is differentiable once).
    * ``"triton"``: the kernel, or ``ValueError`` where it cannot run.

    Example:
        >>> import pararnn_core as pc
        >>> cell = pc.ParaGRU(64, 128)
        >>> cell.proj.backend = "eager"  # F.linear, as nn.Linear
    """

    backend: str = "auto"

    def forward(self, x: Tensor) -> Tensor:
        if self.backend == "eager":
            return F.linear(x, self.weight, self.bias)
        return linear_tf32x3(x, self.weight, self.bias, backend=self.backend)
