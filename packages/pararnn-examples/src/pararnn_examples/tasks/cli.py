"""What the example scripts' command lines share: argument types and the common options.

Argument types raise ``argparse.ArgumentTypeError``, so a bad value ends the script with
``error: argument --length: expected a positive integer, got '-5'`` -- the option named, the
expected and the actual value -- before anything runs.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any, TypeVar

import torch

from ..argtypes import nonnegative_float, nonnegative_int, positive_float, positive_int
from ..train import configure_threads, pick_device
from .models import CELLS

#: The ParaRNN cells a task script offers (the linear baseline has its own switch).
CELL_NAMES = tuple(c for c in CELLS if c != "linear")

__all__ = [
    "CELL_NAMES",
    "add_common_options",
    "add_training_options",
    "nonnegative_float",
    "positive_float",
    "positive_int",
    "setup_device",
]


def add_training_options(
    parser: argparse.ArgumentParser,
    defaults: Any,
    *,
    cells: tuple[str, ...] = CELL_NAMES,
    **helps: str,
) -> None:
    """``--cell``, ``--steps``, ``--length``, ``--batch``, ``--d-model``, ``--layers``, ``--lr``.

    ``defaults`` is the task's config dataclass (fields ``cell``, ``steps``, ``length``,
    ``batch``, ``d_model``, ``layers``, ``lr``); ``cells`` the choices of ``--cell``; ``helps``
    replaces the help text of a field by name (each text gets the default appended).
    """
    texts = {
        "cell": "ParaRNN cell of every layer",
        "steps": "optimizer steps",
        "length": "training sequence length T",
        "batch": "sequences per step",
        "d_model": "width of every layer",
        "layers": "recurrent blocks",
        "lr": "peak learning rate, AdamW",
    }
    unknown = set(helps) - set(texts)
    if unknown:
        raise ValueError(f"helps must name fields among {sorted(texts)}, got {sorted(unknown)}")
    texts.update(helps)
    kinds: dict[str, dict[str, Any]] = {
        "cell": {"choices": list(cells)},
        "lr": {"type": positive_float},
    }
    for name, text in texts.items():
        default = getattr(defaults, name)
        parser.add_argument(
            "--" + name.replace("_", "-"),
            default=default,
            help=f"{text} (default {default})",
            **kinds.get(name, {"type": positive_int}),
        )


_Config = TypeVar("_Config")


def config_from_args(cls: type[_Config], args: argparse.Namespace, **extra: Any) -> _Config:
    """The task config ``cls`` (a dataclass) with every field that has a parsed option of the
    same name taken from ``args``, then ``extra`` (options whose meaning differs, e.g.
    ``baseline=not args.no_baseline``)."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"cls must be a dataclass type, got {cls!r}")
    names = [f.name for f in dataclasses.fields(cls)]
    values = {name: getattr(args, name) for name in names if hasattr(args, name)}
    values.update(extra)
    return cls(**values)


def add_common_options(parser: argparse.ArgumentParser, *, default_seed: int = 0) -> None:
    """``--seed``, ``--device``, ``--threads``, ``--plot`` and ``--no-progress``."""
    parser.add_argument(
        "--seed",
        type=nonnegative_int,
        default=default_seed,
        help=f"seed of the model init and the data (default {default_seed})",
    )
    parser.add_argument(
        "--device",
        default="auto",
        help="'auto' (CUDA when a GPU is visible, else CPU), 'cpu', 'cuda' or 'cuda:N' "
        "(default auto)",
    )
    parser.add_argument(
        "--threads",
        type=positive_int,
        default=None,
        help="CPU threads for torch (default 1: these models are small enough that a second "
        "thread gains little and stalls when the cores are shared)",
    )
    parser.add_argument(
        "--plot",
        type=Path,
        default=None,
        metavar="PATH",
        help="write the loss curve to this PNG (default: no plot)",
    )
    parser.add_argument(
        "--no-progress", action="store_true", help="hide the progress bar (logs, CI)"
    )


def setup_device(parser: argparse.ArgumentParser, args: argparse.Namespace) -> torch.device:
    """Resolve ``--device`` and set the CPU threads; a bad device ends with a parser error."""
    try:
        device = pick_device(args.device)
    except ValueError as err:
        parser.error(f"argument --device: {err}")
    configure_threads(args.threads)
    return device
