"""argparse types for the numeric options of the examples and of ``pararnn-bench``.

Each parses its text or raises ``argparse.ArgumentTypeError`` with the expected range and the
text it got, which argparse prefixes with the option's name.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import TypeVar

__all__ = ["nonnegative_float", "nonnegative_int", "positive_float", "positive_int"]

_Number = TypeVar("_Number", int, float)


def _parse(kind: Callable[[str], _Number], text: str, expected: str, *, zero: bool) -> _Number:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
    if not (math.isfinite(value) and (value >= 0 if zero else value > 0)):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """An ``int >= 1``."""
    return _parse(int, text, "a positive integer", zero=False)


def nonnegative_int(text: str) -> int:
    """An ``int >= 0``."""
    return _parse(int, text, "an integer >= 0", zero=True)


def positive_float(text: str) -> float:
    """A finite ``float > 0``."""
    return _parse(float, text, "a finite number > 0", zero=False)


def nonnegative_float(text: str) -> float:
    """A finite ``float >= 0``."""
    return _parse(float, text, "a finite number >= 0", zero=True)
