"""Shared by the worker scripts: process-group setup, the check registry, closeness checks."""

from __future__ import annotations

import json
import os
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import Tensor

from pararnn_kernels.testing import assert_elementwise_close

Check = Callable[[], None]


def init() -> tuple[int, int, torch.device]:
    """Initialise the group from the launcher's environment; returns (rank, world, device)."""
    backend = os.environ["PARARNN_TEST_BACKEND"]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend, timeout=timedelta(seconds=60), device_id=None)
    return rank, world, device


class Checks:
    """Named checks, run in order on every rank; each rank records its own outcome."""

    def __init__(self) -> None:
        self.checks: dict[str, Check] = {}

    def add(self, fn: Check) -> Check:
        self.checks[fn.__name__] = fn
        return fn

    def run(self, cleanup: Callable[[], None] | None = None) -> None:
        results: dict[str, str] = {}
        for name, fn in self.checks.items():
            try:
                fn()
                results[name] = "ok"
            except Exception:
                results[name] = traceback.format_exc()
        if cleanup is not None:
            cleanup()
        out = Path(os.environ["PARARNN_TEST_OUT"]) / f"rank{dist.get_rank()}.json"
        out.write_text(json.dumps(results))
        dist.destroy_process_group()


def check_close(
    actual: Tensor, expected: Tensor, *, atol: float = 0.0, rtol: float = 0.0, what: str = ""
) -> None:
    """Elementwise ``|a - e| <= atol + rtol |e|``; on failure name the first bad index."""
    assert_elementwise_close(actual, expected, atol=atol, rtol=rtol, name=what)


class Mismatches:
    """``check_close`` that records instead of raising, for checks that loop over collectives:
    a rank that stopped at its first mismatch would leave the other rank waiting in (or
    mismatching) the next collective, so each rank finishes every call and then raises."""

    def __init__(self) -> None:
        self.messages: list[str] = []

    def close(
        self, actual: Tensor, expected: Tensor, *, atol: float = 0.0, rtol: float = 0.0, what: str
    ) -> None:
        try:
            check_close(actual, expected, atol=atol, rtol=rtol, what=what)
        except AssertionError as err:
            self.messages.append(str(err))

    def raise_any(self) -> None:
        if self.messages:
            shown = "\n".join(self.messages[:6])
            raise AssertionError(f"{len(self.messages)} comparison(s) failed:\n{shown}")


def expect_error(exc: type[Exception], fragment: str, fn: Callable[[], object]) -> None:
    """``fn()`` must raise ``exc`` whose message contains ``fragment``."""
    try:
        fn()
    except exc as err:
        if fragment not in str(err):
            raise AssertionError(f"message {str(err)!r} lacks {fragment!r}") from err
        return
    raise AssertionError(f"expected {exc.__name__} containing {fragment!r}; nothing was raised")
