"""Running parity: the data, the linear baseline, a tiny training run, the script's options."""

from __future__ import annotations

import runpy
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import Tensor

from pararnn_examples.tasks.models import DiagonalLinearRNN, ModelConfig, build_model
from pararnn_examples.tasks.state_tracking import (
    StateTrackingConfig,
    parity_accuracy,
    parity_batch,
    run_state_tracking,
)

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "state_tracking.py"


def _script_main() -> Callable[[list[str]], None]:
    main = runpy.run_path(str(SCRIPT), run_name="state_tracking_script")["main"]
    assert callable(main)
    return main  # type: ignore[no-any-return]


def test_parity_targets_are_the_running_xor() -> None:
    bits, parity = parity_batch(5, 17, torch.Generator().manual_seed(3))
    assert bits.shape == parity.shape == (5, 17)
    for b in range(5):
        acc = 0
        for t in range(17):
            acc ^= int(bits[b, t])
            assert int(parity[b, t]) == acc
    with pytest.raises(ValueError, match="length must be a positive int, got -4"):
        parity_batch(2, -4, torch.Generator())


def test_linear_baseline_is_the_stated_recurrence() -> None:
    torch.manual_seed(0)
    layer = DiagonalLinearRNN(3, 5).double()
    x = torch.randn(2, 9, 3, dtype=torch.float64)
    h0 = torch.randn(2, 5, dtype=torch.float64)
    states = layer(x, h0)
    assert isinstance(states, Tensor)
    a_pre, v = torch.split(layer.proj(x), 5, dim=-1)
    decay = torch.sigmoid(a_pre)
    assert bool(((decay > 0) & (decay < 1)).all())
    h = h0
    stepped = h0
    for t in range(9):
        h = decay[:, t] * h + (1 - decay[:, t]) * v[:, t]
        stepped, _ = layer.step(x[:, t], stepped)
        torch.testing.assert_close(states[:, t], h, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(stepped, h, rtol=1e-10, atol=1e-10)


def test_accuracy_is_measured_in_the_stated_mode() -> None:
    torch.manual_seed(0)
    model = build_model(ModelConfig(vocab_size=2, num_outputs=2, d_model=8, layers=1))
    model.train()
    reported = parity_accuracy(model, 12, batch=16, generator=torch.Generator().manual_seed(9))
    assert model.training  # restored
    bits, parity = parity_batch(16, 12, torch.Generator().manual_seed(9))
    model.eval()
    with torch.no_grad():
        logits = model(bits)
    assert isinstance(logits, Tensor)
    assert reported == float((logits.argmax(-1) == parity).float().mean())


def test_tiny_run_learns_parity_and_beats_the_baseline() -> None:
    config = StateTrackingConfig(
        length=6, batch=64, steps=150, lr=2e-2, warmup_steps=10, d_model=8, layers=1,
        eval_batch=256, newton_iters=6,
    )  # fmt: skip
    result = run_state_tracking(config, "cpu", progress=False)
    para, linear = result.reports
    assert para.name == "ParaRNN(gru)" and linear.name == "linear baseline"
    assert set(para.accuracy) == {"T=6 eval", "T=6 train", "T=12 eval", "T=12 train"}
    assert set(linear.accuracy) == {"T=6 eval", "T=12 eval"}
    assert para.history.mean_loss(140, 150) < 0.5 * para.history.loss[0]
    assert para.accuracy["T=6 eval"] >= 0.95, para.accuracy
    assert para.accuracy["T=6 train"] == pytest.approx(para.accuracy["T=6 eval"], abs=0.01)
    assert max(para.history.iters) >= 1 and sum(para.history.fallbacks) == 0
    assert max(linear.history.iters) == 0  # no Newton in the baseline
    summary = result.summary()
    assert f"T=6 eval {para.accuracy['T=6 eval']:.2%}" in summary
    assert f"T=12 eval {linear.accuracy['T=12 eval']:.2%}" in summary


def test_config_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="length must be a positive int, got -1"):
        StateTrackingConfig(length=-1)
    with pytest.raises(ValueError, match=r"cell must be one of .* got 'linear'"):
        StateTrackingConfig(cell="linear")


def test_every_option_has_help(capsys: pytest.CaptureFixture[str]) -> None:
    main = _script_main()
    with pytest.raises(SystemExit) as stop:
        main(["--help"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    for option in ("--length", "--steps", "--cell", "--seed", "--device", "--plot", "--lr"):
        assert option in out
    parser = runpy.run_path(str(SCRIPT), run_name="x")["build_parser"]()
    for action in parser._actions:
        assert action.help, f"option {action.option_strings} has no help"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--length", "-3"], "argument --length: expected a positive integer, got '-3'"),
        (["--cell", "rnn"], "argument --cell: invalid choice: 'rnn'"),
        (["--lr", "0"], "argument --lr: expected a finite number > 0, got '0'"),
        (["--device", "tpu"], "argument --device: device must be 'auto', 'cpu', 'cuda'"),
    ],
)
def test_bad_arguments_name_the_option(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stop:
        _script_main()(argv)
    assert stop.value.code == 2
    assert message in capsys.readouterr().err
