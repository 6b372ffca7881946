"""DDP and FSDP2 checks on 2 ranks (launched by tests/dist/test_ddp.py)."""

from __future__ import annotations

import copy

import torch
from _common import Checks, check_close, expect_error, init
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

import pararnn_core as pc
from pararnn_dist import last_newton_residuals, warmup_scan_kernels

RANK, WORLD, DEVICE = init()
checks = Checks()
DTYPE = torch.float64
T = 8


def build() -> nn.Module:
    torch.manual_seed(0)  # identical initial weights on every rank, as DDP requires anyway
    rnn = pc.ParaRNN([pc.ParaGRU(3, 4), pc.ParaLSTM(4, 4)], pc.NewtonConfig(max_iters=T))
    return nn.Sequential(rnn, nn.Linear(4, 2)).to(DEVICE, DTYPE)


def batch(rank: int) -> Tensor:
    gen = torch.Generator().manual_seed(100 + rank)
    return torch.randn(2, T, 3, generator=gen, dtype=DTYPE).to(DEVICE)


def loss_of(model: nn.Module, x: Tensor) -> Tensor:
    out: Tensor = model(x)
    return (out**2).mean()


def mean_reference_gradients(model: nn.Module) -> dict[str, Tensor]:
    """Each rank's gradient without DDP (all ranks' batches, computed here), then their mean."""
    total: dict[str, Tensor] = {}
    for rank in range(WORLD):
        ref = copy.deepcopy(model)
        loss_of(ref, batch(rank)).backward()
        for name, p in ref.named_parameters():
            assert p.grad is not None, name
            total[name] = total.get(name, 0) + p.grad / WORLD  # type: ignore[operator]
    return total


def own_residuals(model: nn.Module) -> list[float]:
    ref = copy.deepcopy(model)
    loss_of(ref, batch(RANK))
    return last_newton_residuals(ref)


@checks.add
def ddp_gradients_equal_mean_of_ranks() -> None:
    model = build()
    expected = mean_reference_gradients(model)
    residuals = own_residuals(model)
    warmup_scan_kernels(model, batch(RANK))
    ddp = DistributedDataParallel(model)  # find_unused_parameters=False (the default)
    loss_of(ddp, batch(RANK)).backward()
    for name, p in ddp.module.named_parameters():
        assert p.grad is not None, name
        check_close(p.grad, expected[name], atol=1e-12, rtol=1e-10, what=f"DDP grad {name}")
    got = last_newton_residuals(ddp)
    assert len(got) == 2, got
    assert got == residuals, f"residuals through DDP {got} != unwrapped {residuals}"


@checks.add
def warmup_restores_modes_and_runs_newton() -> None:
    model = build().eval()
    ddp = DistributedDataParallel(model)
    warmup_scan_kernels(ddp, batch(RANK))
    assert not any(m.training for m in model.modules()), "warm-up must restore eval mode"
    assert len(last_newton_residuals(ddp)) == 2
    expect_error(
        ValueError,
        "contains no pararnn_core.ParaRNN",
        lambda: warmup_scan_kernels(nn.Linear(2, 2), batch(RANK)),
    )
    expect_error(ValueError, "has no Newton statistics yet", lambda: last_newton_residuals(build()))
    expect_error(TypeError, "must be a torch.nn.Module", lambda: last_newton_residuals(3))  # type: ignore[arg-type]


@checks.add
def fsdp2_gradients_equal_mean_of_ranks() -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model = build()
    expected = mean_reference_gradients(model)
    residuals = own_residuals(model)
    mesh = init_device_mesh(DEVICE.type, (WORLD,))
    rnn = model[0]
    fully_shard(rnn, mesh=mesh)
    fully_shard(model, mesh=mesh)
    warmup_scan_kernels(model, batch(RANK))
    loss_of(model, batch(RANK)).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        grad = p.grad.full_tensor()  # type: ignore[attr-defined]
        check_close(grad, expected[name], atol=1e-12, rtol=1e-10, what=f"FSDP2 grad {name}")
    got = last_newton_residuals(model)
    assert got == residuals, f"residuals through FSDP2 {got} != unwrapped {residuals}"
    del model, rnn  # before the group goes: a sharded model outliving it can crash at exit


checks.run()
