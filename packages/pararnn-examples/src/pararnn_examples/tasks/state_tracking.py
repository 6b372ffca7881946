"""Running parity: a state-tracking task that nonlinear RNNs solve and linear recurrences cannot.

Input: random bits ``x_1..x_T``; target at every step: the parity of the prefix,
``y_t = x_1 ⊕ ... ⊕ x_t``. A recurrent solution flips one bit of state on every 1, which a
nonlinear cell does with a saturated, state-dependent candidate (``c = tanh(a_c r h)`` with
``a_c < 0`` in the ParaGRU) and holds at any length. A linear recurrence with decay in ``(0, 1)``
cannot flip a sign; it can only count with fading memory, which is why the
:class:`~pararnn_examples.tasks.models.DiagonalLinearRNN` baseline stays near chance as soon as
the prefix holds more 1s than its memory resolves.

:func:`run_state_tracking` trains a ParaRNN model with Newton and the baseline of the same width,
depth and training budget, then measures per-step accuracy on fresh sequences at the training
length and at twice it, with each model in ``.eval()`` mode (the one-step recurrence) and, for
the ParaRNN, also in ``.train()`` mode (Newton) as a check that both solve the same recurrence.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from ..train import (
    History,
    TrainConfig,
    newton_summary,
    plot_history,
    seed_everything,
    train,
)
from .models import CELLS, ModelConfig, SequenceModel, build_model

__all__ = [
    "ModelReport",
    "StateTrackingConfig",
    "StateTrackingResult",
    "parity_accuracy",
    "parity_batch",
    "run_state_tracking",
]


def parity_batch(
    batch: int, length: int, generator: torch.Generator, device: torch.device | str = "cpu"
) -> tuple[Tensor, Tensor]:
    """Random bits and their running parity.

    Args:
        batch: sequences ``B``.
        length: steps ``T``.
        generator: a CPU generator (batches are drawn on the CPU, so a seed gives the same data
            on every device).
        device: where the tensors go.

    Returns:
        ``bits [B, T]`` and ``parity [B, T]``, int64 in ``{0, 1}``, with
        ``parity[:, t] = bits[:, :t + 1].sum() % 2``.

    Raises:
        ValueError: ``batch`` or ``length`` not a positive int.
    """
    for name, value in (("batch", batch), ("length", length)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    bits = torch.randint(0, 2, (batch, length), generator=generator)
    parity = torch.cumsum(bits, dim=1) % 2
    return bits.to(device), parity.to(device)


def _loss_and_accuracy(logits: Tensor, targets: Tensor) -> tuple[Tensor, float]:
    loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
    accuracy = float((logits.argmax(-1) == targets).float().mean())
    return loss, accuracy


@torch.no_grad()
def parity_accuracy(
    model: SequenceModel,
    length: int,
    *,
    batch: int,
    generator: torch.Generator,
    mode: str = "eval",
) -> float:
    """Per-step accuracy of ``model`` on ``batch`` fresh sequences of ``length`` steps.

    Args:
        model: a parity model (2 input tokens, 2 outputs).
        length: ``T`` of the test sequences.
        batch: sequences to average over.
        generator: the data generator.
        mode: ``"eval"`` (one-step recurrence) or ``"train"`` (Newton for ParaRNN layers). The
            model's mode is restored afterwards.

    Returns:
        The fraction of the ``batch * length`` steps predicted correctly.
    """
    if mode not in ("eval", "train"):
        raise ValueError(f"mode must be 'eval' or 'train', got {mode!r}")
    device = next(model.parameters()).device
    bits, parity = parity_batch(batch, length, generator, device)
    was_training = model.training
    model.train(mode == "train")
    try:
        logits = model(bits)
        assert isinstance(logits, Tensor)
    finally:
        model.train(was_training)
    return _loss_and_accuracy(logits, parity)[1]


@dataclass(frozen=True)
class StateTrackingConfig:
    """The parity experiment (defaults: the documented run, a few minutes on a 2-core CPU).

    Attributes:
        length: training sequence length ``T`` (accuracy is also measured at ``2 T``).
        batch: training sequences per step.
        steps: optimizer steps per model.
        lr: peak learning rate (AdamW, warm-up then cosine decay).
        warmup_steps: linear warm-up steps.
        d_model: width of every layer.
        layers: recurrent blocks.
        cell: the ParaRNN cell (``"gru"``, ``"lstm"``, ``"slstm"``).
        baseline: train the linear-recurrence baseline of the same size beside it.
        recurrent_init: half-width of the cells' recurrent-weight init (see
            :class:`~pararnn_examples.tasks.models.ModelConfig`); parity needs sharp,
            state-dependent gates, which a wider init offers from the start.
        newton_iters: Newton's ``max_iters`` per layer and forward. Parity is far from the
            contracting regime the default of 3 is made for: flipping a state on every 1 makes
            every step's map expanding until the gates saturate, and mid-training solves
            measured 10-15 iterations to reach ``1e-5`` at T = 64 (with transient residuals
            up to 1e4 on the way). Newton is exact after ``T`` iterations in any case.
        newton_tol: stop a solve once its max residual is below this.
        newton_threshold: Newton's ``divergence_threshold``. The first iterations can overshoot
            far (max residuals of 1e4-1e7 after one update were measured) and still converge
            a few iterations later, as the gates saturate; at the default 1e6 those solves
            counted as diverged (1 of 1200 parity solves, 18 of 1200 char-LM solves), at 1e12
            none did. Non-finite residuals still count as diverged.
        newton_fallback: recompute a diverged layer sequentially instead of raising; the
            count is reported (``History.fallbacks``) so a run that leaned on it shows it.
        eval_batch: sequences per accuracy measurement.
        seed: seeds the model inits and the training and test data.
    """

    length: int = 64
    batch: int = 64
    steps: int = 600
    lr: float = 1e-2
    warmup_steps: int = 50
    d_model: int = 32
    layers: int = 2
    cell: str = "gru"
    baseline: bool = True
    recurrent_init: float | None = 1.0
    newton_iters: int = 32
    newton_tol: float | None = 1e-5
    newton_threshold: float | None = 1e12
    newton_fallback: bool = True
    eval_batch: int = 512
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("length", "batch", "steps", "d_model", "layers", "newton_iters"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.cell not in CELLS or self.cell == "linear":
            raise ValueError(
                f"cell must be one of {tuple(c for c in CELLS if c != 'linear')} (the linear "
                f"recurrence is the baseline), got {self.cell!r}"
            )

    def model_config(self, cell: str) -> ModelConfig:
        """The :class:`ModelConfig` of the ParaRNN model (``cell``) or the baseline (``"linear"``)."""
        return ModelConfig(
            vocab_size=2,
            num_outputs=2,
            d_model=self.d_model,
            layers=self.layers,
            cell=cell,
            recurrent_init=self.recurrent_init,
            newton_iters=self.newton_iters,
            newton_tol=self.newton_tol,
            newton_threshold=self.newton_threshold,
            newton_fallback=self.newton_fallback,
        )


@dataclass
class ModelReport:
    """One trained model's numbers.

    Attributes:
        name: ``"ParaRNN(gru)"`` or ``"linear baseline"``.
        history: its training records.
        seconds: wall-clock training time.
        accuracy: ``{"T=64 eval": 0.999, "T=128 eval": ..., ...}``: per-step accuracy by length
            and mode (``eval``: one-step recurrence; ``train``: Newton).
        test_fallbacks: for each ``train``-mode measurement, the layer solves that diverged and
            were recomputed sequentially (that accuracy is then partly not Newton's).
    """

    name: str
    history: History
    seconds: float
    accuracy: dict[str, float] = field(default_factory=dict)
    test_fallbacks: dict[str, int] = field(default_factory=dict)

    def accuracy_text(self) -> str:
        """``"T=64 eval 100.00%, T=64 train 100.00%, ..."`` with fallbacks noted."""
        parts = []
        for key, value in self.accuracy.items():
            note = ""
            if self.test_fallbacks.get(key):
                count = self.test_fallbacks[key]
                solves = "solve" if count == 1 else "solves"
                note = f" ({count} layer {solves} diverged: sequential fallback)"
            parts.append(f"{key} {value:.2%}{note}")
        return ", ".join(parts)


@dataclass
class StateTrackingResult:
    """What :func:`run_state_tracking` measured: the config and one report per model."""

    config: StateTrackingConfig
    reports: list[ModelReport]

    def summary(self) -> str:
        """A few lines: per model, loss first -> last, accuracy at T and 2T, Newton numbers."""
        c = self.config
        lines = [
            f"running parity, trained at T={c.length}, tested on {c.eval_batch} fresh "
            f"sequences at T={c.length} and T={2 * c.length} (eval mode = one-step recurrence):"
        ]
        for report in self.reports:
            h = report.history
            tail = min(20, len(h))
            acc = report.accuracy_text()
            newton = h.newton_text(c.layers)
            newton = f"; {newton}" if newton else ""
            lines.append(
                f"  {report.name:16s} loss {h.loss[0]:.3f} -> {h.mean_loss(len(h) - tail, len(h)):.3g}"
                f" in {len(h)} steps ({report.seconds:.0f} s){newton}; accuracy {acc}"
            )
        return "\n".join(lines)


def _train_one(
    name: str,
    model: SequenceModel,
    config: StateTrackingConfig,
    data: torch.Generator,
    device: torch.device,
    progress: bool,
) -> ModelReport:
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.0)

    def compute_loss(step: int) -> tuple[Tensor, Mapping[str, float]]:
        bits, parity = parity_batch(config.batch, config.length, data, device)
        logits = model(bits)
        assert isinstance(logits, Tensor)
        loss, accuracy = _loss_and_accuracy(logits, parity)
        return loss, {"acc": accuracy}

    schedule = TrainConfig(
        steps=config.steps,
        lr=config.lr,
        warmup_steps=min(config.warmup_steps, config.steps - 1),
        progress=progress,
        desc=name,
    )
    start = time.perf_counter()
    history = train(model, optimizer, compute_loss, schedule)
    return ModelReport(name, history, time.perf_counter() - start)


def run_state_tracking(
    config: StateTrackingConfig,
    device: torch.device | str = "cpu",
    *,
    progress: bool = True,
) -> StateTrackingResult:
    """Train the ParaRNN model (Newton) and, if asked, the linear baseline; measure accuracy.

    Both models start from the same seed and see the same training batches (each draws from a
    generator seeded with ``config.seed``) and the same test sequences.

    Args:
        config: the experiment.
        device: where to train.
        progress: show the progress bars.

    Returns:
        The reports, ParaRNN first. ``accuracy`` holds ``"T=<n> eval"`` for both lengths and,
        for the ParaRNN model, ``"T=<n> train"`` (Newton).
    """
    device = torch.device(device)
    runs = [(f"ParaRNN({config.cell})", config.cell)]
    if config.baseline:
        runs.append(("linear baseline", "linear"))
    reports = []
    for name, cell in runs:
        data = seed_everything(config.seed)
        model = build_model(config.model_config(cell), device)
        report = _train_one(name, model, config, data, device, progress)
        for length in (config.length, 2 * config.length):
            modes = ("eval", "train") if cell != "linear" else ("eval",)
            for mode in modes:
                # The same test sequences for every model and mode: a fresh generator each time.
                test = torch.Generator().manual_seed(config.seed + 1_000_003)
                key = f"T={length} {mode}"
                report.accuracy[key] = parity_accuracy(
                    model, length, batch=config.eval_batch, generator=test, mode=mode
                )
                if mode == "train":
                    report.test_fallbacks[key] = newton_summary(model).fallbacks
        reports.append(report)
    return StateTrackingResult(config, reports)


def plot_state_tracking(result: StateTrackingResult, path: str) -> None:
    """Training loss (solid) and accuracy (dashed) of every model, smoothed over 10 steps."""
    curves = {r.name: r.history for r in result.reports}
    plot_history(
        curves,
        path,
        title=f"running parity, T = {result.config.length}",
        smooth=10,
        extra_axis="acc",
    )
