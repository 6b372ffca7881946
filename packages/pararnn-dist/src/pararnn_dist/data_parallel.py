"""Data parallel (DDP, FSDP2): the two helpers ParaRNN needs around an ordinary wrap (DESIGN §3).

Why no wrapper of our own: the Newton ``autograd.Function`` takes every cell parameter as an
explicit input, so DDP's gradient hooks and FSDP2's unshard/reshard hooks fire exactly as they do
for an ``nn.Linear``, and every parameter is used in the first Newton iteration
(``find_unused_parameters=False`` is right). Each rank solves Newton for its own batch; the
residuals are per rank and nothing here communicates.

Two things remain:

* :func:`warmup_scan_kernels` -- Triton compiles a kernel on its first call, which can take
  longer than NCCL's heartbeat allows inside a step. One ``.train()`` forward under ``no_grad``
  per rank, before the wrap (DDP) or the first step (FSDP2), takes that out of the step.
* :func:`last_newton_residuals` -- the per-layer residuals of the last training forward, found
  through wrappers and nested modules.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from pararnn_core import ParaRNN

__all__ = ["find_pararnn_modules", "last_newton_residuals", "warmup_scan_kernels"]


def _check_module(model: object) -> nn.Module:
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    return model


def find_pararnn_modules(model: nn.Module) -> list[ParaRNN]:
    """Every :class:`~pararnn_core.ParaRNN` inside ``model``, in ``model.modules()`` order.

    DDP holds the model as ``.module`` and FSDP2's ``fully_shard`` keeps the module tree in place,
    so ``modules()`` reaches through both (and through any nesting).
    """
    return [m for m in _check_module(model).modules() if isinstance(m, ParaRNN)]


def _inner(model: nn.Module) -> nn.Module:
    """DDP's wrapped module (its forward would broadcast buffers: a collective); else ``model``."""
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(model, DistributedDataParallel):
        inner = model.module
        assert isinstance(inner, nn.Module)
        return inner
    return model


def warmup_scan_kernels(model: nn.Module, example_input: Tensor) -> None:
    """Compile the scan kernels before a collective watches: one ``.train()`` forward, no grad.

    Call it on every rank with a batch of the training shape and dtype (T and d matter for the
    kernels' specialisation, B little). Unwrapped or DDP-wrapped models run locally with no
    collective; an FSDP2 model runs its own forward, whose parameter all-gathers every rank joins.
    Every submodule's train/eval mode is restored afterwards. ``last_stats`` of each ParaRNN holds
    the warm-up's statistics until the next training forward.

    Args:
        model: a module containing at least one ParaRNN (possibly wrapped).
        example_input: what ``model(example_input)`` accepts, e.g. ``[B, T, d_in]``.

    Raises:
        TypeError: ``model`` is not an ``nn.Module`` or ``example_input`` not a Tensor.
        ValueError: ``model`` contains no ParaRNN.
    """
    target = _inner(_check_module(model))
    if not isinstance(example_input, Tensor):
        raise TypeError(f"example_input must be a torch.Tensor, got {type(example_input).__name__}")
    if not find_pararnn_modules(target):
        raise ValueError(
            f"model ({type(model).__name__}) contains no pararnn_core.ParaRNN: nothing to warm up"
        )
    modes = [(m, m.training) for m in target.modules()]
    try:
        target.train()
        with torch.no_grad():
            target(example_input)
    finally:
        for module, training in modes:
            module.training = training


def last_newton_residuals(model: nn.Module) -> list[float]:
    """This rank's final Newton residual per layer, from the last training forward.

    Walks ``model`` (through DDP/FSDP2 wrappers and nested modules) to every ParaRNN and returns,
    in module order and layer order, ``NewtonStats.max_residual`` of each layer: the max over the
    rank's own batch of ``|f(h_{t-1}, u_t) - h_t|``. No communication: ranks differ because their
    batches do; all-gather them yourself if one rank should print all.

    Raises:
        TypeError: ``model`` is not an ``nn.Module``.
        ValueError: no ParaRNN inside, or one that has not run a ``.train()`` forward yet.
    """
    found = find_pararnn_modules(model)
    if not found:
        raise ValueError(f"model ({type(model).__name__}) contains no pararnn_core.ParaRNN")
    residuals: list[float] = []
    for index, rnn in enumerate(found):
        if not rnn.last_stats:
            raise ValueError(
                f"ParaRNN #{index} in {type(model).__name__} has no Newton statistics yet: run a "
                "forward in .train() mode first (eval mode runs the sequential recurrence)"
            )
        residuals.extend(float(stats.max_residual) for stats in rnn.last_stats)
    return residuals
