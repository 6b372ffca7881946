"""DDP and FSDP2 with ParaRNN: 2 gloo ranks on CPU (CI), the same checks with NCCL on 2 GPUs."""

from __future__ import annotations

from typing import Any

import pytest
from torch import nn

import pararnn_core as pc
from pararnn_dist import last_newton_residuals

Results = dict[int, dict[str, str]]
WORKER = "ddp_worker.py"
CHECKS = [
    "ddp_gradients_equal_mean_of_ranks",
    "warmup_restores_modes_and_runs_newton",
    "fsdp2_gradients_equal_mean_of_ranks",
]


@pytest.mark.parametrize("check", CHECKS)
def test_worker_check(harness: Any, worker_results: Results, check: str) -> None:
    """One named check of the worker group (gloo on CPU; NCCL, marked cuda, on 2 GPUs)."""
    harness.assert_check(worker_results, check)


def test_residuals_of_nested_models_in_module_order() -> None:
    inner = pc.ParaRNN([pc.ParaGRU(2, 3), pc.ParaGRU(3, 3)])
    outer = pc.ParaRNN(pc.ParaLSTM(3, 2))
    model = nn.Sequential(nn.Sequential(inner), outer)
    import torch

    model(torch.randn(1, 5, 2))
    got = last_newton_residuals(model)
    want = [s.max_residual for s in inner.last_stats] + [s.max_residual for s in outer.last_stats]
    assert got == want
    assert len(got) == 3
