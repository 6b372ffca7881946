"""The option helpers every task script shares (``pararnn_examples.tasks.cli``)."""

from __future__ import annotations

import argparse

import pytest

from pararnn_examples.tasks.cli import (
    CELL_NAMES,
    add_training_options,
    config_from_args,
    positive_int,
)
from pararnn_examples.tasks.quickstart import QuickstartConfig


def test_training_options_take_the_task_defaults_and_help() -> None:
    parser = argparse.ArgumentParser()
    defaults = QuickstartConfig()
    add_training_options(parser, defaults, batch="windows per step")
    args = parser.parse_args([])
    for name in ("cell", "steps", "length", "batch", "d_model", "layers", "lr"):
        assert getattr(args, name) == getattr(defaults, name)
    text = parser.format_help()
    assert f"windows per step (default {defaults.batch})" in text
    assert parser.parse_args(["--lr", "0.5", "--d-model", "7"]).d_model == 7
    assert "linear" not in CELL_NAMES


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--cell", "linear"], "argument --cell: invalid choice"),
        (["--steps", "0"], "argument --steps: expected a positive integer, got '0'"),
        (["--lr", "-1"], "argument --lr: expected a finite number > 0, got '-1'"),
    ],
)
def test_training_options_name_the_bad_argument(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = argparse.ArgumentParser()
    add_training_options(parser, QuickstartConfig())
    with pytest.raises(SystemExit):
        parser.parse_args(argv)
    assert message in capsys.readouterr().err


def test_unknown_help_override_is_refused() -> None:
    with pytest.raises(ValueError, match=r"helps must name fields among .* got \['colour'\]"):
        add_training_options(argparse.ArgumentParser(), QuickstartConfig(), colour="x")
    assert positive_int("3") == 3


def test_config_from_args_takes_same_named_options_then_extra() -> None:
    parser = argparse.ArgumentParser()
    add_training_options(parser, QuickstartConfig())
    parser.add_argument("--unrelated", default="x")
    args = parser.parse_args(["--steps", "5", "--layers", "3"])
    config = config_from_args(QuickstartConfig, args, lr=0.25)
    assert (config.steps, config.layers, config.lr) == (5, 3, 0.25)
    assert config.p_write == QuickstartConfig().p_write  # no option: the config's default
    with pytest.raises(TypeError, match="cls must be a dataclass type"):
        config_from_args(dict, args)
