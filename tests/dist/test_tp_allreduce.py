"""Tensor parallel along d_h: 2 gloo ranks on CPU (CI), the same checks with NCCL on 2 GPUs."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import pararnn_core as pc
from pararnn_dist.tensor_parallel import shard_cell, tensor_parallel_diag_block

Results = dict[int, dict[str, str]]
WORKER = "tp_worker.py"
CHECKS = [
    "sharded_block_equals_unsharded_cell_and_linear",
    "fresh_block_has_shard_shapes",
    "column_then_row_equals_two_linears",
    "divisibility_and_kind_errors",
]


@pytest.mark.parametrize("check", CHECKS)
def test_worker_check(harness: Any, worker_results: Results, check: str) -> None:
    """One named check of the worker group (gloo on CPU; NCCL, marked cuda, on 2 GPUs)."""
    harness.assert_check(worker_results, check)


@pytest.mark.parametrize("cls", [pc.ParaGRU, pc.ParaLSTM, pc.ParaSLSTM])
def test_shards_run_the_same_channels(cls: type[pc.ParaCell]) -> None:
    """Without a group: the shards' states are the full cell's channels (diagonal recurrence)."""
    torch.manual_seed(0)
    cell = cls(3, 6).double()  # type: ignore[call-arg]
    x = torch.randn(2, 5, 3, dtype=torch.float64)
    full, _ = pc.newton_apply(cell, x, config=pc.NewtonConfig(max_iters=5))
    parts = [
        pc.newton_apply(shard_cell(cell, r, 3), x, config=pc.NewtonConfig(max_iters=5))[0]
        for r in range(3)
    ]
    torch.testing.assert_close(torch.cat(parts, dim=2), full, atol=1e-12, rtol=1e-12)


def test_needs_an_initialised_group() -> None:
    with pytest.raises(RuntimeError, match="init_process_group"):
        tensor_parallel_diag_block("gru", 3, 4, 2)
