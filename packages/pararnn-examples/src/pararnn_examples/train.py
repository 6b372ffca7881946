"""The training loop every example shares: seed, device, optimizer steps, progress, history, plot.

A task hands :func:`train` a ``compute_loss(step)`` callable that draws its own batch, runs the
model (in ``.train()`` mode, so every :class:`~pararnn_core.ParaRNN` solves by Newton) and returns
the loss, optionally with extra metrics such as accuracy. The loop does the rest: learning-rate
schedule (linear warm-up, cosine decay), gradient clipping, the non-finite check, a tqdm bar whose
postfix shows the loss and the Newton iterations and max residual of every ParaRNN in the model
(from ``last_stats``), and a :class:`History` with one record per step that
:func:`plot_history` draws to a PNG.

The schedule is a pure function of the step number (:func:`learning_rate`), so a run resumed
from a checkpoint continues on the same curve without a scheduler state to save.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from pararnn_core import ParaRNN

__all__ = [
    "History",
    "NewtonSummary",
    "NonFiniteLossError",
    "TrainConfig",
    "configure_threads",
    "learning_rate",
    "newton_summary",
    "pararnn_layers",
    "pick_device",
    "plot_history",
    "seed_everything",
    "train",
]

#: What ``compute_loss`` returns: the scalar loss, or the loss and extra metrics to record.
LossResult = Tensor | tuple[Tensor, Mapping[str, float]]


class NonFiniteLossError(RuntimeError):
    """The loss became NaN or infinite; training stops instead of carrying NaN weights on."""


def seed_everything(seed: int) -> torch.Generator:
    """Seed Python's, torch's (CPU and every CUDA device) generators; returns a CPU generator
    seeded the same way, for data sampling that must not depend on how many random numbers the
    model's initialisation drew.

    Raises:
        ValueError: ``seed`` is negative (torch rejects it later with a less clear message).
    """
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be an int >= 0, got {seed!r}")
    random.seed(seed)
    torch.manual_seed(seed)
    generator = torch.Generator()
    generator.manual_seed(seed)
    return generator


def pick_device(requested: str = "auto") -> torch.device:
    """``"auto"``: CUDA when a GPU is visible, else the CPU; ``"cpu"``, ``"cuda"``, ``"cuda:N"``
    as given.

    Raises:
        ValueError: an unknown name, or CUDA asked for without a visible GPU.
    """
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(requested)
    except RuntimeError:
        raise ValueError(
            f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {requested!r}"
        ) from None
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {requested!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {requested!r} was requested but no CUDA GPU is visible")
    return device


def configure_threads(threads: int | None = None) -> int:
    """Set torch's intra-op CPU threads (default 1) and return the number used.

    Why one by default: the example models are small (a few hundred kB of activations per op),
    so a second thread gains little, and on shared cores it stalls at every op's barrier while
    another process holds a core. Measured on a 2-core machine: a flip-flop training step took
    67 ms with two threads and 70 ms with one alone, but 200 ms against 80 ms when a second
    job ran beside it. Pass more for larger models on cores of your own.

    Raises:
        ValueError: ``threads`` is given and not a positive int.
    """
    if threads is None:
        threads = 1
    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
        raise ValueError(f"threads must be a positive int or None, got {threads!r}")
    torch.set_num_threads(threads)
    return threads


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings of :func:`train`.

    Attributes:
        steps: optimizer steps in total (a resumed run continues up to this number).
        lr: peak learning rate (AdamW).
        warmup_steps: linear warm-up from ``lr / warmup_steps`` to ``lr``.
        min_lr_ratio: the cosine decay ends at ``lr * min_lr_ratio`` on the last step.
        grad_clip: clip the global gradient norm to this value; None disables clipping.
        progress: show the tqdm bar.
        desc: the bar's label.
    """

    steps: int
    lr: float = 3e-3
    warmup_steps: int = 0
    min_lr_ratio: float = 0.1
    grad_clip: float | None = 1.0
    progress: bool = True
    desc: str = "train"

    def __post_init__(self) -> None:
        if not isinstance(self.steps, int) or isinstance(self.steps, bool) or self.steps < 1:
            raise ValueError(f"steps must be a positive int, got {self.steps!r}")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be a finite float > 0, got {self.lr!r}")
        if not isinstance(self.warmup_steps, int) or self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be an int >= 0, got {self.warmup_steps!r}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio!r}")
        if self.grad_clip is not None and not (
            math.isfinite(self.grad_clip) and self.grad_clip > 0
        ):
            raise ValueError(f"grad_clip must be None or a float > 0, got {self.grad_clip!r}")


def learning_rate(step: int, config: TrainConfig) -> float:
    """The rate of 0-based ``step``: linear warm-up, then cosine decay to ``lr * min_lr_ratio``."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    span = max(1, config.steps - config.warmup_steps - 1)
    progress = min(1.0, (step - config.warmup_steps) / span)
    floor = config.min_lr_ratio
    return config.lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


@dataclass
class History:
    """One record per optimizer step (lists of equal length).

    Attributes:
        step: the 0-based step numbers (a resumed run continues the count).
        loss: training loss of the step's batch.
        iters: the largest Newton iteration count over the model's ParaRNN layers (0 without any).
        residual: the largest final max residual over those layers (0.0 without any).
        fallbacks: layers recomputed sequentially after a Newton divergence in that step.
        lr: the learning rate used.
        metrics: extra per-step values returned by ``compute_loss`` (e.g. ``"acc"``).
    """

    step: list[int] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    iters: list[int] = field(default_factory=list)
    residual: list[float] = field(default_factory=list)
    fallbacks: list[int] = field(default_factory=list)
    lr: list[float] = field(default_factory=list)
    metrics: dict[str, list[float]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.loss)

    def append(
        self,
        step: int,
        loss: float,
        newton: NewtonSummary,
        lr: float,
        metrics: Mapping[str, float],
    ) -> None:
        """Add one step's record."""
        self.step.append(step)
        self.loss.append(loss)
        self.iters.append(newton.iters)
        self.residual.append(newton.residual)
        self.fallbacks.append(newton.fallbacks)
        self.lr.append(lr)
        for name, value in metrics.items():
            self.metrics.setdefault(name, []).append(float(value))

    def mean_loss(self, first: int, last: int) -> float:
        """Mean training loss over records ``[first, last)`` (smooths batch noise)."""
        window = self.loss[first:last]
        if not window:
            raise ValueError(f"no records in [{first}, {last}) of a history of {len(self)}")
        return sum(window) / len(window)

    def newton_text(self, layers: int) -> str:
        """``"Newton 6.1 iterations on average (max 9), last step's max residual 3.0e-07,
        sequential fallbacks 0 of 800 layer solves"``; ``""`` when no step ran Newton.

        Args:
            layers: ParaRNN layers per forward (the number of solves per step).
        """
        if not self.iters or max(self.iters) == 0:
            return ""
        mean = sum(self.iters) / len(self.iters)
        return (
            f"Newton {mean:.1f} iterations on average (max {max(self.iters)}), last step's max "
            f"residual {self.residual[-1]:.1e}, sequential fallbacks {sum(self.fallbacks)} of "
            f"{len(self.iters) * layers} layer solves"
        )

    def state_dict(self) -> dict[str, Any]:
        """Plain lists, for a checkpoint."""
        return {
            "step": list(self.step),
            "loss": list(self.loss),
            "iters": list(self.iters),
            "residual": list(self.residual),
            "fallbacks": list(self.fallbacks),
            "lr": list(self.lr),
            "metrics": {k: list(v) for k, v in self.metrics.items()},
        }

    @classmethod
    def from_state_dict(cls, state: Mapping[str, Any]) -> History:
        """The inverse of :meth:`state_dict`."""
        return cls(
            step=list(state["step"]),
            loss=list(state["loss"]),
            iters=list(state["iters"]),
            residual=list(state["residual"]),
            fallbacks=list(state["fallbacks"]),
            lr=list(state["lr"]),
            metrics={k: list(v) for k, v in state["metrics"].items()},
        )


def pararnn_layers(model: nn.Module) -> Iterator[ParaRNN]:
    """Every :class:`~pararnn_core.ParaRNN` inside ``model`` (itself included), in module order."""
    for module in model.modules():
        if isinstance(module, ParaRNN):
            yield module


class NewtonSummary(NamedTuple):
    """The Newton solves of one forward, over all ParaRNN layers of a model.

    Attributes:
        iters: the largest iteration count (0 when no layer has solved yet).
        residual: the largest final max residual ``max |f(h_{t-1}, u_t) - h_t|``.
        fallbacks: layers whose solve diverged and were recomputed sequentially
            (``NewtonConfig(on_divergence="sequential")``; always 0 with ``"raise"``).
    """

    iters: int
    residual: float
    fallbacks: int


def newton_summary(model: nn.Module) -> NewtonSummary:
    """Collect ``last_stats`` of every ParaRNN in ``model`` (all zero before any ``.train()``
    forward, or without ParaRNN layers)."""
    iters, residual, fallbacks = 0, 0.0, 0
    for rnn in pararnn_layers(model):
        for stats in rnn.last_stats:
            iters = max(iters, stats.iters)
            residual = max(residual, stats.max_residual)
            fallbacks += stats.fallback is not None
    return NewtonSummary(iters, residual, fallbacks)


def _split(result: LossResult) -> tuple[Tensor, Mapping[str, float]]:
    if isinstance(result, Tensor):
        return result, {}
    loss, metrics = result
    return loss, metrics


def train(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    compute_loss: Callable[[int], LossResult],
    config: TrainConfig,
    *,
    start_step: int = 0,
    history: History | None = None,
    after_step: Callable[[int], None] | None = None,
) -> History:
    """Run optimizer steps ``start_step .. config.steps - 1`` in ``.train()`` mode.

    Each step: set the scheduled learning rate, ``loss = compute_loss(step)``, check it is
    finite, backward, clip, ``optimizer.step()``, record loss / Newton iterations / residual /
    metrics, and update the bar's postfix.

    Args:
        model: the model (put in ``.train()`` mode here, so its ParaRNN layers use Newton).
        optimizer: over ``model``'s parameters.
        compute_loss: ``step -> loss`` or ``step -> (loss, {name: value})``; draws its own batch.
        config: steps, schedule, clipping, progress bar.
        start_step: the first step to run (a resumed run passes the checkpoint's step).
        history: records to extend (a resumed run's), or None for a fresh one.
        after_step: called with the step number once the step is recorded (checkpoints).

    Returns:
        The history, extended by ``config.steps - start_step`` records.

    Raises:
        NonFiniteLossError: the loss (or the gradient norm) became NaN or infinite.
        ValueError: ``start_step`` outside ``[0, config.steps]``.
    """
    if not 0 <= start_step <= config.steps:
        raise ValueError(f"start_step must be in [0, steps={config.steps}], got {start_step}")
    history = History() if history is None else history
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    bar = _progress(config, start_step)
    try:
        for step in range(start_step, config.steps):
            lr = learning_rate(step, config)
            for group in optimizer.param_groups:
                group["lr"] = lr
            optimizer.zero_grad(set_to_none=True)
            loss, metrics = _split(compute_loss(step))
            value = float(loss.detach())
            if not math.isfinite(value):
                raise NonFiniteLossError(
                    f"loss is {value} at step {step} (lr {lr:.2e}); last Newton stats: "
                    f"{newton_summary(model)}. Lower the learning rate or clip harder."
                )
            torch.autograd.backward(loss)
            if config.grad_clip is not None:
                norm = float(nn.utils.clip_grad_norm_(params, config.grad_clip))
                if not math.isfinite(norm):
                    raise NonFiniteLossError(f"gradient norm is {norm} at step {step}")
            optimizer.step()
            newton = newton_summary(model)
            history.append(step, value, newton, lr, metrics)
            if after_step is not None:
                after_step(step)
            if bar is not None:
                postfix: dict[str, object] = {"loss": f"{value:.4f}"}
                postfix.update({k: f"{v:.3f}" for k, v in metrics.items()})
                postfix.update({"newton": newton.iters, "resid": f"{newton.residual:.1e}"})
                fallbacks = sum(history.fallbacks)
                if fallbacks:
                    postfix["fallbacks"] = fallbacks
                bar.set_postfix(postfix, refresh=False)
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    return history


def _progress(config: TrainConfig, start_step: int) -> Any:
    if not config.progress:
        return None
    from tqdm import tqdm  # type: ignore[import-untyped]

    return tqdm(
        total=config.steps, initial=start_step, desc=config.desc, unit="step", dynamic_ncols=True
    )


def plot_history(
    curves: Mapping[str, History],
    path: str | Path,
    *,
    title: str,
    metric: str = "loss",
    smooth: int = 1,
    extra_axis: str | None = None,
    log_y: bool = False,
    reference_lines: Mapping[str, float] | None = None,
) -> Path:
    """Draw one line per named history to a PNG (matplotlib's Agg canvas; no display needed).

    Args:
        curves: label -> history.
        path: the PNG to write (parent folders are created).
        title: the plot title.
        metric: ``"loss"`` or the name of a recorded metric.
        smooth: moving-average window over steps (1 = raw).
        extra_axis: a second metric drawn on a right-hand axis (dashed), e.g. ``"acc"``.
        log_y: logarithmic y axis for ``metric``.
        reference_lines: label -> value, drawn as horizontal dotted lines on the left axis
            (e.g. a baseline's level).

    Returns:
        The path written.

    Raises:
        ValueError: no curves, ``smooth < 1``, or a history lacks ``metric``.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if not curves:
        raise ValueError("curves must hold at least one history, got none")
    if smooth < 1:
        raise ValueError(f"smooth must be >= 1, got {smooth}")
    figure = Figure(figsize=(7, 4), dpi=110)
    FigureCanvasAgg(figure)
    axis = figure.add_subplot()
    right = axis.twinx() if extra_axis is not None else None
    for index, (label, record) in enumerate(curves.items()):
        colour = f"C{index}"
        axis.plot(
            record.step, _moving_average(_series(record, metric), smooth), colour, label=label
        )
        if right is not None and extra_axis is not None:
            series = _moving_average(_series(record, extra_axis), smooth)
            right.plot(record.step, series, colour, linestyle="--", alpha=0.6)
    for index, (label, value) in enumerate((reference_lines or {}).items()):
        axis.axhline(value, color=f"C{len(curves) + index}", linestyle=":", label=label)
    axis.set_xlabel("optimizer step")
    axis.set_ylabel(metric if smooth == 1 else f"{metric} (mean of {smooth} steps)")
    if log_y:
        axis.set_yscale("log")
    if right is not None:
        right.set_ylabel(f"{extra_axis} (dashed)")
    axis.set_title(title)
    axis.grid(alpha=0.3)
    # "best" only sees the left axis' lines; with a right axis, keep clear of both.
    axis.legend(loc="center right" if right is not None else "best")
    figure.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out)
    return out


def _series(record: History, metric: str) -> list[float]:
    if metric == "loss":
        return record.loss
    if metric not in record.metrics:
        raise ValueError(
            f"metric must be 'loss' or one of {sorted(record.metrics)}, got {metric!r}"
        )
    return record.metrics[metric]


def _moving_average(values: Sequence[float], window: int) -> list[float]:
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out
