"""The quickstart: flip-flop data, a tiny Newton run, agreement and timing recomputed, the script."""

from __future__ import annotations

import argparse
import re
import runpy
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from pararnn_examples.tasks.models import SequenceModel
from pararnn_examples.tasks.quickstart import (
    QuickstartConfig,
    QuickstartResult,
    check_agreement,
    flip_flop_batch,
    run_quickstart,
    time_forwards,
)

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "quickstart.py"
TINY = QuickstartConfig(
    length=16, batch=32, steps=60, lr=2e-2, d_model=8, layers=1, eval_batch=32,
    time_length=24, time_repeats=1,
)  # fmt: skip


def _script(name: str) -> Callable[..., object]:
    function = runpy.run_path(str(SCRIPT), run_name="quickstart_script")[name]
    assert callable(function)
    return function  # type: ignore[no-any-return]


def _stepwise_logits(model: SequenceModel, tokens: Tensor) -> Tensor:
    """The one-step recurrence written out here: ``model.step`` over time."""
    state = None
    out = []
    with torch.no_grad():
        for t in range(tokens.shape[1]):
            logits, state = model.step(tokens[:, t], state)
            out.append(logits)
    return torch.stack(out, dim=1)


@pytest.fixture(scope="module")
def tiny_result() -> QuickstartResult:
    return run_quickstart(TINY, "cpu", progress=False)


def test_flip_flop_targets_are_the_latest_write() -> None:
    tokens, targets = flip_flop_batch(4, 40, torch.Generator().manual_seed(1), p_write=0.2)
    assert bool((tokens[:, 0] < 2).all())  # the first step always writes
    for b in range(4):
        held = -1
        for t in range(40):
            token = int(tokens[b, t])
            if token < 2:
                held = token
            assert int(targets[b, t]) == held
    with pytest.raises(ValueError, match="p_write must be in \\(0, 1\\], got 0"):
        flip_flop_batch(1, 4, torch.Generator(), p_write=0)


def test_tiny_run_learns(tiny_result: QuickstartResult) -> None:
    history = tiny_result.history
    assert len(history) == TINY.steps
    assert history.mean_loss(50, 60) < 0.5 * history.mean_loss(0, 10)
    assert tiny_result.agreement.accuracy_sequential >= 0.9
    assert min(history.iters) >= 1  # every step ran Newton
    assert max(history.residual) < 1e-3


def test_agreement_numbers_are_recomputed_independently(tiny_result: QuickstartResult) -> None:
    model = tiny_result.model
    tokens, targets = flip_flop_batch(8, 20, torch.Generator().manual_seed(7))
    agreement = check_agreement(model, tokens, targets)
    model.train()
    with torch.no_grad():
        newton = model(tokens)
    assert isinstance(newton, Tensor)
    stepwise = _stepwise_logits(model, tokens)
    expected = float((newton - stepwise).abs().max())
    assert agreement.max_abs_logits == pytest.approx(expected, rel=1e-3, abs=1e-7)
    assert agreement.max_abs_logits < 1e-4
    loss = float(F.cross_entropy(stepwise.flatten(0, 1), targets.flatten()))
    assert agreement.loss_sequential == pytest.approx(loss, rel=1e-5)
    assert agreement.loss_difference == abs(agreement.loss_newton - agreement.loss_sequential)
    assert model.training  # check_agreement restores the mode


def test_agreement_detects_a_wrong_forward(tiny_result: QuickstartResult) -> None:
    """Perturbing one step of the recurrence must show up in the reported difference."""
    model = tiny_result.model
    tokens, targets = flip_flop_batch(4, 12, torch.Generator().manual_seed(2))
    cell = model.blocks[0].rnn.cells[0]  # type: ignore[union-attr,index]
    original = cell.step

    def skewed(h: Tensor, u: Tensor) -> Tensor:
        out: Tensor = original(h, u)
        return out + 0.1

    cell.step = skewed  # the sequential path runs step alone; Newton updates by step_and_jacobian
    try:
        agreement = check_agreement(model, tokens, targets)
    finally:
        del cell.step
    assert agreement.max_abs_logits > 1e-3


def test_timing_reports_both_forwards(tiny_result: QuickstartResult) -> None:
    timing = tiny_result.timing
    assert timing.newton_s > 0 and timing.sequential_s > 0
    assert timing.speedup == timing.sequential_s / timing.newton_s
    assert (timing.batch, timing.length, timing.device) == (32, 24, "cpu")
    again = time_forwards(tiny_result.model, torch.zeros(2, 5, dtype=torch.long), repeats=1)
    assert again.length == 5


def test_summary_prints_the_computed_numbers(tiny_result: QuickstartResult) -> None:
    text = tiny_result.summary()
    a, t = tiny_result.agreement, tiny_result.timing
    assert f"max |logit diff| {a.max_abs_logits:.1e}" in text
    assert f"test accuracy {a.accuracy_sequential:.2%}" in text
    assert f"Newton {t.newton_s * 1e3:.1f} ms, sequential {t.sequential_s * 1e3:.1f} ms" in text
    assert len(text.splitlines()) <= 5


def test_every_option_has_help() -> None:
    parser = _script("build_parser")()
    assert isinstance(parser, argparse.ArgumentParser)
    for action in parser._actions:
        assert action.help, f"option {action.option_strings} has no help"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--length", "-2"], "argument --length: expected a positive integer, got '-2'"),
        (["--steps", "ten"], "argument --steps: expected a positive integer, got 'ten'"),
        (["--cell", "transformer"], "argument --cell: invalid choice: 'transformer'"),
        (["--seed", "-1"], "argument --seed: expected an integer >= 0, got '-1'"),
    ],
)
def test_bad_arguments_name_the_option(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stop:
        _script("main")(argv)
    assert stop.value.code == 2
    assert message in capsys.readouterr().err


def test_script_runs_end_to_end_and_its_claims_hold(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plot = tmp_path / "loss.png"
    _script("main")(
        [
            "--steps", "40", "--length", "12", "--batch", "16", "--d-model", "8", "--layers",
            "1", "--lr", "0.02", "--eval-batch", "8", "--time-length", "16", "--time-repeats",
            "1", "--no-progress", "--plot", str(plot), "--seed", "3",
        ]
    )  # fmt: skip
    out = capsys.readouterr().out
    first, last = map(float, re.search(r"loss ([\d.]+) -> ([\d.e-]+)", out).groups())  # type: ignore[union-attr]
    assert last < first
    diff = float(re.search(r"max \|logit diff\| ([\d.e+-]+)", out).group(1))  # type: ignore[union-attr]
    assert diff < 1e-4
    assert re.search(r"Newton: \d+ iterations, max residual [\d.e+-]+", out)
    assert re.search(r"Newton [\d.]+x (faster|slower)", out)
    assert plot.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_tiny_run_uses_the_gpu() -> None:
    result = run_quickstart(TINY, "cuda", progress=False)
    assert result.timing.device.startswith("cuda")
    assert next(result.model.parameters()).is_cuda
    assert result.agreement.max_abs_logits < 1e-3
    assert result.history.mean_loss(50, 60) < result.history.mean_loss(0, 10)


def test_quickstart_trains_with_newton_kernels_on_cuda() -> None:
    """On a GPU "auto" may run the fused sequential kernel at the quickstart's sizes; the
    quickstart asks for the fused Newton kernels there, and the model passes the choice on."""
    from pararnn_core import ParaRNN
    from pararnn_examples.tasks.models import ModelConfig, SequenceModel
    from pararnn_examples.tasks.quickstart import quickstart_backend

    assert quickstart_backend(torch.device("cuda")) == "fused"
    assert quickstart_backend(torch.device("cpu")) == "auto"
    model = SequenceModel(
        ModelConfig(vocab_size=4, num_outputs=2, d_model=8, layers=1, scan_backend="eager")
    )
    rnns = [m for m in model.modules() if isinstance(m, ParaRNN)]
    assert rnns and all(r.config.scan_backend == "eager" for r in rnns)


def test_timing_length_follows_the_device_unless_given() -> None:
    from pararnn_examples.tasks.quickstart import QuickstartConfig, default_time_length

    assert default_time_length(torch.device("cuda")) == 16384
    assert default_time_length(torch.device("cpu")) == 1024
    assert QuickstartConfig().time_length is None
    with pytest.raises(ValueError, match="time_length must be a positive int, got 0"):
        QuickstartConfig(time_length=0)
