"""The quickstart: train on a flip-flop memory task with Newton, check it against the
sequential recurrence, and time both forwards.

Flip-flop task: each step is one of four tokens, ``write 0``, ``write 1``, ``noise 0``,
``noise 1`` (a write with probability ``p_write``, the first step always a write). The target at
every step is the bit of the latest write. A gated cell solves it by opening its update gate on
writes and closing it on noise; the noise bits are the distraction. It trains in a few hundred
steps, which is what a first run should show.

Agreement: the trained model runs the same test batch twice, in ``.train()`` mode (every
ParaRNN layer solved by Newton) and in ``.eval()`` mode (the one-step recurrence), both under
``no_grad``; the report is the largest absolute difference of the logits and the difference of
the losses. Timing: wall-clock medians of the two forwards on the same inputs after warm-up, with
``torch.cuda.synchronize`` around each run on CUDA.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ..train import History, TrainConfig, newton_summary, seed_everything, train
from .models import CELLS, ModelConfig, SequenceModel, build_model

__all__ = [
    "Agreement",
    "QuickstartConfig",
    "QuickstartResult",
    "Timing",
    "check_agreement",
    "default_time_length",
    "flip_flop_batch",
    "quickstart_backend",
    "run_quickstart",
    "time_forwards",
]

#: Token ids of the flip-flop task: ``WRITE + bit`` and ``NOISE + bit``.
WRITE, NOISE = 0, 2


def flip_flop_batch(
    batch: int,
    length: int,
    generator: torch.Generator,
    *,
    p_write: float = 0.1,
    device: torch.device | str = "cpu",
) -> tuple[Tensor, Tensor]:
    """Flip-flop sequences and the bit of the latest write at every step.

    Args:
        batch: sequences ``B``.
        length: steps ``T``.
        generator: a CPU generator (data is drawn on the CPU, the same on every device).
        p_write: probability that a step (after the first, always a write) is a write.
        device: where the tensors go.

    Returns:
        ``tokens [B, T]`` int64 in ``{0, 1, 2, 3}`` (``0/1``: write the bit, ``2/3``: noise bit)
        and ``targets [B, T]`` int64 in ``{0, 1}``.

    Raises:
        ValueError: ``batch`` or ``length`` not positive, ``p_write`` outside ``(0, 1]``.
    """
    for name, value in (("batch", batch), ("length", length)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if not 0 < p_write <= 1:
        raise ValueError(f"p_write must be in (0, 1], got {p_write!r}")
    bits = torch.randint(0, 2, (batch, length), generator=generator)
    writes = torch.rand(batch, length, generator=generator) < p_write
    writes[:, 0] = True
    tokens = torch.where(writes, WRITE + bits, NOISE + bits)
    # The latest write's index at each step: a running max over the write positions.
    steps = torch.arange(length).expand(batch, length)
    latest = torch.where(writes, steps, torch.zeros_like(steps)).cummax(dim=1).values
    targets = bits.gather(1, latest)
    return tokens.to(device), targets.to(device)


@dataclass(frozen=True)
class QuickstartConfig:
    """The quickstart run (defaults: well under a minute on a 2-core CPU).

    Attributes:
        length: training sequence length ``T``.
        batch: sequences per step.
        steps: optimizer steps.
        lr: peak learning rate.
        d_model: width; layers: recurrent blocks; cell: ParaRNN cell.
        p_write: write probability of the flip-flop task.
        eval_batch: sequences of the accuracy / agreement batch.
        time_length: ``T`` of the timing batch (``eval_batch`` sequences); None for
            :func:`default_time_length` of the device.
        time_repeats: timed runs per forward (after one warm-up).
        seed: seeds init and data.
    """

    length: int = 128
    batch: int = 32
    steps: int = 150
    lr: float = 5e-3
    d_model: int = 32
    layers: int = 2
    cell: str = "gru"
    p_write: float = 0.1
    eval_batch: int = 64
    time_length: int | None = None
    time_repeats: int = 5
    seed: int = 0

    def __post_init__(self) -> None:
        for name in (
            "length",
            "batch",
            "steps",
            "d_model",
            "layers",
            "eval_batch",
            "time_length",
            "time_repeats",
        ):
            value = getattr(self, name)
            if name == "time_length" and value is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.cell not in CELLS or self.cell == "linear":
            raise ValueError(
                f"cell must be one of {tuple(c for c in CELLS if c != 'linear')}, got {self.cell!r}"
            )


@dataclass(frozen=True)
class Agreement:
    """Newton (``.train()``) against the one-step recurrence (``.eval()``) on one batch.

    Attributes:
        max_abs_logits: ``max |logits_newton - logits_sequential|``.
        loss_newton, loss_sequential: the cross-entropy of each.
        accuracy_newton, accuracy_sequential: per-step accuracy of each.
        newton_iters, newton_residual: the Newton solve's largest iteration count and residual.
    """

    max_abs_logits: float
    loss_newton: float
    loss_sequential: float
    accuracy_newton: float
    accuracy_sequential: float
    newton_iters: int
    newton_residual: float

    @property
    def loss_difference(self) -> float:
        """``|loss_newton - loss_sequential|``."""
        return abs(self.loss_newton - self.loss_sequential)


@torch.no_grad()
def check_agreement(model: SequenceModel, tokens: Tensor, targets: Tensor) -> Agreement:
    """Run ``tokens [B, T]`` in both modes and compare (see :class:`Agreement`).

    The model's mode is restored afterwards.
    """
    was_training = model.training
    outputs: dict[str, tuple[Tensor, float, float]] = {}
    try:
        for mode in ("train", "eval"):
            model.train(mode == "train")
            logits = model(tokens)
            assert isinstance(logits, Tensor)
            loss = float(F.cross_entropy(logits.flatten(0, 1), targets.flatten()))
            accuracy = float((logits.argmax(-1) == targets).float().mean())
            outputs[mode] = (logits, loss, accuracy)
            if mode == "train":
                solves = newton_summary(model)
    finally:
        model.train(was_training)
    newton, sequential = outputs["train"], outputs["eval"]
    return Agreement(
        max_abs_logits=float((newton[0] - sequential[0]).abs().max()),
        loss_newton=newton[1],
        loss_sequential=sequential[1],
        accuracy_newton=newton[2],
        accuracy_sequential=sequential[2],
        newton_iters=solves.iters,
        newton_residual=solves.residual,
    )


@dataclass(frozen=True)
class Timing:
    """Median wall-clock seconds of each forward on the same ``[B, T]`` input.

    Attributes:
        newton_s: ``.train()`` mode (Newton), under ``no_grad``.
        sequential_s: ``.eval()`` mode (one-step recurrence), under ``no_grad``.
        batch, length: the input's shape.
        device: where it ran.
    """

    newton_s: float
    sequential_s: float
    batch: int
    length: int
    device: str

    @property
    def speedup(self) -> float:
        """``sequential_s / newton_s``: above 1 when Newton is faster."""
        return self.sequential_s / self.newton_s


def _median_seconds(run: Callable[[], object], device: torch.device, repeats: int) -> float:
    def once() -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        run()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - start

    once()  # warm-up: kernel compilation, allocator, caches
    return statistics.median(once() for _ in range(repeats))


@torch.no_grad()
def time_forwards(model: SequenceModel, tokens: Tensor, *, repeats: int = 5) -> Timing:
    """Time the Newton and the sequential forward of ``model`` on ``tokens [B, T]``.

    Each forward runs once to warm up, then ``repeats`` times; the medians are reported. The
    model's mode is restored afterwards.
    """
    device = tokens.device
    was_training = model.training
    try:
        model.train()
        newton = _median_seconds(lambda: model(tokens), device, repeats)
        model.eval()
        sequential = _median_seconds(lambda: model(tokens), device, repeats)
    finally:
        model.train(was_training)
    return Timing(newton, sequential, tokens.shape[0], tokens.shape[1], str(device))


@dataclass
class QuickstartResult:
    """The quickstart's numbers: training history, test accuracy, agreement and timing."""

    config: QuickstartConfig
    model: SequenceModel
    history: History
    seconds: float
    agreement: Agreement
    timing: Timing

    def summary(self) -> str:
        """The few closing lines: every number in them is computed from this run."""
        h, a, t = self.history, self.agreement, self.timing
        tail = min(20, len(h))
        faster = "faster" if t.speedup >= 1 else "slower"
        ratio = t.speedup if t.speedup >= 1 else 1 / t.speedup
        return "\n".join(
            [
                f"loss {h.loss[0]:.3f} -> {h.mean_loss(len(h) - tail, len(h)):.4f} "
                f"(mean of the last {tail} steps) in {len(h)} steps, {self.seconds:.1f} s; "
                f"test accuracy {a.accuracy_sequential:.2%} (eval mode)",
                f"Newton: {a.newton_iters} iterations, max residual {a.newton_residual:.1e} "
                f"(test batch)",
                f"Newton vs sequential: max |logit diff| {a.max_abs_logits:.1e}, "
                f"|loss diff| {a.loss_difference:.1e}",
                f"forward time at B={t.batch}, T={t.length} on {t.device}: Newton "
                f"{t.newton_s * 1e3:.1f} ms, sequential {t.sequential_s * 1e3:.1f} ms "
                f"(Newton {ratio:.2f}x {faster})",
            ]
        )


def default_time_length(device: torch.device) -> int:
    """``T`` of the timing batch when the config leaves it open: 16384 on a GPU, where the
    sequential kernel's per-step latency adds up (at ``T = 1024`` and these widths the two
    forwards cost about the same), 1024 elsewhere (the eager step loop is slow on the CPU)."""
    return 16384 if device.type == "cuda" else 1024


def quickstart_backend(device: torch.device) -> str:
    """The scan backend the quickstart trains with: the fused Newton kernels on CUDA, ``"auto"``
    (the unfused Newton path) elsewhere."""
    return "fused" if device.type == "cuda" else "auto"


def run_quickstart(
    config: QuickstartConfig, device: torch.device | str = "cpu", *, progress: bool = True
) -> QuickstartResult:
    """Train with Newton, then measure agreement with the sequential recurrence and timing.

    Returns:
        The :class:`QuickstartResult` (its :meth:`~QuickstartResult.summary` is what the script
        prints last).
    """
    device = torch.device(device)
    data = seed_everything(config.seed)
    model = build_model(
        ModelConfig(
            vocab_size=4,
            num_outputs=2,
            d_model=config.d_model,
            layers=config.layers,
            cell=config.cell,
            # The point is Newton: on a GPU "auto" would pick the fused sequential kernel at
            # these sizes (its cost model), so ask for the fused Newton kernels there.
            scan_backend=quickstart_backend(device),
        ),
        device,
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.0)

    def compute_loss(step: int) -> tuple[Tensor, Mapping[str, float]]:
        tokens, targets = flip_flop_batch(
            config.batch, config.length, data, p_write=config.p_write, device=device
        )
        logits = model(tokens)
        assert isinstance(logits, Tensor)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return loss, {"acc": float((logits.argmax(-1) == targets).float().mean())}

    schedule = TrainConfig(
        steps=config.steps,
        lr=config.lr,
        warmup_steps=min(20, config.steps - 1),
        progress=progress,
        desc=f"flip-flop ({config.cell})",
    )
    start = time.perf_counter()
    history = train(model, optimizer, compute_loss, schedule)
    seconds = time.perf_counter() - start
    test = torch.Generator().manual_seed(config.seed + 1_000_003)
    tokens, targets = flip_flop_batch(
        config.eval_batch, config.length, test, p_write=config.p_write, device=device
    )
    agreement = check_agreement(model, tokens, targets)
    time_length = config.time_length or default_time_length(device)
    long_tokens, _ = flip_flop_batch(
        config.eval_batch, time_length, test, p_write=config.p_write, device=device
    )
    timing = time_forwards(model, long_tokens, repeats=config.time_repeats)
    return QuickstartResult(config, model, history, seconds, agreement, timing)
