"""Tensor-parallel checks on 2 ranks (launched by tests/dist/test_tp_allreduce.py)."""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from _common import Checks, check_close, expect_error, init
from torch import nn

import pararnn_core as pc
from pararnn_dist import last_newton_residuals
from pararnn_dist.tensor_parallel import (
    ColumnParallelLinear,
    RowParallelLinear,
    TensorParallelDiagBlock,
    shard_cell,
    tensor_parallel_diag_block,
)

RANK, WORLD, DEVICE = init()
checks = Checks()
DTYPE = torch.float64
B, T, D_IN, D_H, D_OUT = 2, 6, 3, 4, 5
CELLS = {"gru": pc.ParaGRU, "lstm": pc.ParaLSTM, "slstm": pc.ParaSLSTM}

calls = {"all_reduce": 0}
_all_reduce = dist.all_reduce


def counting_all_reduce(*args, **kwargs):  # type: ignore[no-untyped-def]
    calls["all_reduce"] += 1
    return _all_reduce(*args, **kwargs)


dist.all_reduce = counting_all_reduce


def count_all_reduces(fn):  # type: ignore[no-untyped-def]
    calls["all_reduce"] = 0
    fn()
    return calls["all_reduce"]


@checks.add
def sharded_block_equals_unsharded_cell_and_linear() -> None:
    config = pc.NewtonConfig(max_iters=T)
    for kind, cls in CELLS.items():
        torch.manual_seed(0)  # the same unsharded weights and input on both ranks
        cell = cls(D_IN, D_H).to(DEVICE, DTYPE)
        linear = nn.Linear(D_H, D_OUT).to(DEVICE, DTYPE)
        x = torch.randn(B, T, D_IN, device=DEVICE, dtype=DTYPE)
        weight = torch.randn(B, T, D_OUT, device=DEVICE, dtype=DTYPE)
        block = TensorParallelDiagBlock.from_unsharded(cell, linear, config)

        x_full = x.clone().requires_grad_(True)
        y_full = linear(pc.ParaRNN(cell, config)(x_full))
        (y_full * weight).sum().backward()

        x_tp = x.clone().requires_grad_(True)
        y_box = []
        fwd = count_all_reduces(lambda: y_box.append(block(x_tp)))  # noqa: B023
        y_tp = y_box[0]
        bwd = count_all_reduces(lambda: (y_tp * weight).sum().backward())  # noqa: B023
        assert (fwd, bwd) == (1, 1), f"{kind}: all-reduces forward {fwd}, backward {bwd}"
        check_close(y_tp, y_full, atol=1e-12, rtol=1e-10, what=f"{kind} output")
        assert x_tp.grad is not None and x_full.grad is not None
        check_close(x_tp.grad, x_full.grad, atol=1e-12, rtol=1e-10, what=f"{kind} grad x")
        # The full gradients, sharded exactly like the weights.
        grad_cell = copy.deepcopy(cell)
        with torch.no_grad():
            for p, g in zip(grad_cell.parameters(), cell.parameters(), strict=True):
                assert g.grad is not None
                p.copy_(g.grad)
        want = dict(shard_cell(grad_cell, RANK, WORLD).named_parameters())
        for name, p in block.rnn.cells[0].named_parameters():
            assert p.grad is not None, name
            check_close(p.grad, want[name], atol=1e-12, rtol=1e-10, what=f"{kind} grad {name}")
        cols = slice(RANK * D_H // WORLD, (RANK + 1) * D_H // WORLD)
        assert block.out.weight.grad is not None and linear.weight.grad is not None
        check_close(
            block.out.weight.grad,
            linear.weight.grad[:, cols],
            atol=1e-12,
            rtol=1e-10,
            what=f"{kind} grad out.weight",
        )
        assert block.out.bias is not None and block.out.bias.grad is not None
        assert linear.bias.grad is not None
        check_close(
            block.out.bias.grad,
            linear.bias.grad,
            atol=1e-12,
            rtol=1e-10,
            what=f"{kind} grad out.bias",
        )
        assert len(last_newton_residuals(block)) == 1


@checks.add
def fresh_block_has_shard_shapes() -> None:
    torch.manual_seed(10 + RANK)  # different shards per rank; the bias must still be replicated
    for kind, gates in (("gru", 3), ("lstm", 3), ("slstm", 4)):
        block = tensor_parallel_diag_block(kind, D_IN, D_H, D_OUT, device=DEVICE, dtype=DTYPE)  # type: ignore[arg-type]
        local = block.rnn.cells[0]
        assert tuple(local.proj.weight.shape) == (gates * D_H // WORLD, D_IN), kind
        assert tuple(block.out.weight.shape) == (D_OUT, D_H // WORLD), kind
        x = torch.zeros(B, T, D_IN, device=DEVICE, dtype=DTYPE)
        dist.all_reduce(x.normal_())  # a replicated input
        y = block(x)
        assert tuple(y.shape) == (B, T, D_OUT)
        y.sum().backward()
        # The output is replicated: identical on every rank.
        gathered = [torch.empty_like(y) for _ in range(WORLD)]
        dist.all_gather(gathered, y.detach().contiguous())
        check_close(gathered[1], gathered[0], what=f"{kind} replicated output")


@checks.add
def column_then_row_equals_two_linears() -> None:
    torch.manual_seed(1)
    first = nn.Linear(D_IN, 6).to(DEVICE, DTYPE)
    second = nn.Linear(6, D_OUT).to(DEVICE, DTYPE)
    x = torch.randn(B, D_IN, device=DEVICE, dtype=DTYPE)
    x_full = x.clone().requires_grad_(True)
    second(torch.tanh(first(x_full))).square().sum().backward()
    col, row = ColumnParallelLinear.from_linear(first), RowParallelLinear.from_linear(second)
    x_tp = x.clone().requires_grad_(True)
    row(torch.tanh(col(x_tp))).square().sum().backward()
    assert x_tp.grad is not None and x_full.grad is not None
    check_close(x_tp.grad, x_full.grad, atol=1e-12, rtol=1e-10, what="grad x")
    rows = slice(RANK * 3, RANK * 3 + 3)
    assert col.local.weight.grad is not None and first.weight.grad is not None
    check_close(
        col.local.weight.grad, first.weight.grad[rows], atol=1e-12, rtol=1e-10, what="column weight"
    )
    assert row.weight.grad is not None and second.weight.grad is not None
    check_close(
        row.weight.grad, second.weight.grad[:, rows], atol=1e-12, rtol=1e-10, what="row weight"
    )


@checks.add
def divisibility_and_kind_errors() -> None:
    expect_error(
        ValueError,
        "d_h = 5 is not divisible by the tensor-parallel group size 2",
        lambda: tensor_parallel_diag_block("gru", D_IN, 5, D_OUT),
    )
    expect_error(
        ValueError, "kind must be one of", lambda: tensor_parallel_diag_block("rnn", D_IN, 4, 2)
    )  # type: ignore[arg-type]
    expect_error(ValueError, "d_in = 3 is not divisible", lambda: RowParallelLinear(3, 2))
    expect_error(ValueError, "d_out = 3 is not divisible", lambda: ColumnParallelLinear(2, 3))


checks.run()
