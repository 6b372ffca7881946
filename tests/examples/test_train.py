"""The shared training loop: schedule, steps, history, Newton statistics, errors, plot."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

from pararnn_examples.tasks.models import ModelConfig, build_model
from pararnn_examples.train import (
    History,
    NewtonSummary,
    NonFiniteLossError,
    TrainConfig,
    configure_threads,
    learning_rate,
    newton_summary,
    pick_device,
    plot_history,
    seed_everything,
    train,
)


def _regression(seed: int = 0) -> tuple[nn.Linear, torch.optim.Optimizer, Tensor, Tensor]:
    seed_everything(seed)
    model = nn.Linear(4, 1)
    x = torch.randn(64, 4)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    return model, torch.optim.SGD(model.parameters(), lr=0.1), x, y


def test_learning_rate_warms_up_then_decays_to_the_floor() -> None:
    config = TrainConfig(steps=100, lr=1e-2, warmup_steps=10, min_lr_ratio=0.1)
    rates = [learning_rate(s, config) for s in range(100)]
    assert rates[0] == pytest.approx(1e-3)
    assert rates[9] == pytest.approx(1e-2)
    assert rates[-1] == pytest.approx(1e-3)
    decay = rates[9:]
    assert all(a >= b for a, b in itertools.pairwise(decay))


def test_train_lowers_the_loss_and_records_every_step() -> None:
    model, optimizer, x, y = _regression()
    seen: list[int] = []

    def compute_loss(step: int) -> tuple[Tensor, dict[str, float]]:
        loss = (model(x) - y).pow(2).mean()
        return loss, {"double": 2 * float(loss.detach())}

    history = train(
        model,
        optimizer,
        compute_loss,
        TrainConfig(steps=40, lr=0.1, grad_clip=None, progress=False),
        after_step=seen.append,
    )
    assert len(history) == 40
    assert history.step == list(range(40)) == seen
    assert history.loss[-1] < 0.05 * history.loss[0]
    assert history.metrics["double"] == pytest.approx([2 * v for v in history.loss])
    # No ParaRNN in this model: the Newton columns are zero, not missing.
    assert history.iters == [0] * 40
    assert history.residual == [0.0] * 40
    assert history.lr[0] == pytest.approx(learning_rate(0, TrainConfig(steps=40, lr=0.1)))


def test_resumed_train_continues_the_count_and_matches_an_unbroken_run() -> None:
    config = TrainConfig(steps=20, lr=0.05, warmup_steps=3, progress=False)
    model_a, opt_a, x, y = _regression()
    train(model_a, opt_a, lambda _s: (model_a(x) - y).pow(2).mean(), config)

    model_b, opt_b, _, _ = _regression()
    history = History()

    def interrupted(step: int) -> Tensor:
        if step == 10:
            raise KeyboardInterrupt
        return (model_b(x) - y).pow(2).mean()

    with pytest.raises(KeyboardInterrupt):
        train(model_b, opt_b, interrupted, config, history=history)
    assert len(history) == 10
    train(
        model_b,
        opt_b,
        lambda _s: (model_b(x) - y).pow(2).mean(),
        config,
        start_step=10,
        history=history,
    )
    assert history.step == list(range(20))
    assert torch.equal(model_a.weight, model_b.weight)


def test_non_finite_loss_raises_before_the_update() -> None:
    model, optimizer, x, y = _regression()
    before = model.weight.detach().clone()

    def compute_loss(step: int) -> Tensor:
        loss = (model(x) - y).pow(2).mean()
        return loss * float("nan") if step == 3 else loss

    with pytest.raises(NonFiniteLossError, match="loss is nan at step 3"):
        train(model, optimizer, compute_loss, TrainConfig(steps=10, progress=False))
    assert not torch.equal(model.weight, before)  # steps 0-2 ran
    assert torch.isfinite(model.weight).all()


def test_newton_statistics_come_from_every_pararnn_layer() -> None:
    seed_everything(0)
    model = build_model(ModelConfig(vocab_size=3, num_outputs=3, d_model=8, layers=2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, 3, (2, 12))

    def compute_loss(step: int) -> Tensor:
        logits = model(tokens)
        assert isinstance(logits, Tensor)
        return logits.logsumexp(-1).mean()

    history = train(model, optimizer, compute_loss, TrainConfig(steps=2, progress=False))
    stats = [s for block in model.blocks for s in block.rnn.last_stats]  # type: ignore[union-attr]
    assert len(stats) == 2
    assert history.iters[-1] == max(s.iters for s in stats) >= 1
    assert history.residual[-1] == max(s.max_residual for s in stats)
    assert newton_summary(model) == (history.iters[-1], history.residual[-1], 0)


def test_progress_bar_shows_loss_and_newton_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    seed_everything(0)
    model = build_model(ModelConfig(vocab_size=2, num_outputs=2, d_model=4, layers=1))
    optimizer = torch.optim.AdamW(model.parameters())
    tokens = torch.zeros(1, 5, dtype=torch.long)

    def compute_loss(step: int) -> Tensor:
        logits = model(tokens)
        assert isinstance(logits, Tensor)
        return logits.square().mean()

    train(model, optimizer, compute_loss, TrainConfig(steps=2, desc="unit"))
    err = capsys.readouterr().err
    for field in ("unit", "loss=", "newton=", "resid="):
        assert field in err, err


def test_plot_history_writes_a_png(tmp_path: Path) -> None:
    history = History()
    summary = newton_summary(nn.Linear(1, 1))
    for step in range(5):
        history.append(step, 1.0 / (step + 1), summary, 1e-3, {"acc": step / 5})
    out = plot_history({"a": history}, tmp_path / "sub" / "loss.png", title="t", extra_axis="acc")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="metric must be 'loss' or one of \\['acc'\\]"):
        plot_history({"a": history}, tmp_path / "x.png", title="t", metric="bpc")
    with pytest.raises(ValueError, match="at least one history"):
        plot_history({}, tmp_path / "x.png", title="t")


def test_history_round_trips_through_its_state_dict() -> None:
    history = History()
    history.append(0, 2.0, newton_summary(nn.Linear(1, 1)), 0.1, {"acc": 0.5})
    assert History.from_state_dict(history.state_dict()) == history


def test_bad_settings_raise_naming_the_argument(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="steps must be a positive int, got 0"):
        TrainConfig(steps=0)
    with pytest.raises(ValueError, match="lr must be a finite float > 0, got nan"):
        TrainConfig(steps=1, lr=math.nan)
    with pytest.raises(ValueError, match="grad_clip must be None or a float > 0"):
        TrainConfig(steps=1, grad_clip=-1.0)
    with pytest.raises(ValueError, match="seed must be an int >= 0, got -1"):
        seed_everything(-1)
    with pytest.raises(ValueError, match="threads must be a positive int or None, got 0"):
        configure_threads(0)
    model, optimizer, _, _ = _regression()
    with pytest.raises(ValueError, match="start_step must be in \\[0, steps=3\\], got 4"):
        train(model, optimizer, lambda _s: torch.zeros(()), TrainConfig(3), start_step=4)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert pick_device("auto") == torch.device("cpu")
    with pytest.raises(ValueError, match="device 'cuda' was requested but no CUDA GPU"):
        pick_device("cuda")
    with pytest.raises(ValueError, match="device must be 'auto', 'cpu', 'cuda' or 'cuda:N'"):
        pick_device("tpu")


def test_configure_threads_sets_torch() -> None:
    before = torch.get_num_threads()
    try:
        assert configure_threads() == 1 == torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


def test_newton_text_reports_the_recorded_numbers() -> None:
    history = History()
    for step, (iters, residual, fallbacks) in enumerate([(3, 1e-3, 0), (5, 2e-7, 1)]):
        history.append(step, 1.0, NewtonSummary(iters, residual, fallbacks), 1e-3, {})
    text = history.newton_text(layers=2)
    assert text == (
        "Newton 4.0 iterations on average (max 5), last step's max residual 2.0e-07, "
        "sequential fallbacks 1 of 4 layer solves"
    )
    assert History().newton_text(layers=2) == ""
