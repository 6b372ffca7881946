"""A character-level language model on the Python standard library's own source, offline.

Corpus: the public top-level modules of the running interpreter's standard library
(``sysconfig.get_paths()["stdlib"]/*.py`` without a leading underscore, which also leaves out the
machine-generated ``_sysconfigdata*``), in sorted file-name order, concatenated and cut at a
character budget. Nothing is downloaded; the same interpreter gives the same text. The first
90 % is the training split, the rest validation.

Training: random windows of ``T + 1`` characters, next-character cross-entropy at every step,
the model in ``.train()`` mode (Newton). Validation: the split as ``eval_streams`` contiguous
streams read in windows of ``T`` with the state carried from window to window, the model in
``.eval()`` mode (the one-step recurrence), in bits per character. The unigram entropy of the
validation text, ``-Σ p(c) log2 p(c)`` with its own character frequencies, is the bar a model
with no context cannot beat.

Checkpoints hold the model's and optimizer's ``state_dict``, both configurations, the
vocabulary, the step, the history and the data generator's state, so a resumed run continues the
same data stream. :func:`generate` samples through :meth:`SequenceModel.step` (the one-step
recurrence of every ParaRNN layer) with a temperature.
"""

from __future__ import annotations

import math
import sysconfig
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

import torch
import torch.nn.functional as F
from torch import Tensor

from ..train import History, TrainConfig, seed_everything, train
from .models import CELLS, ModelConfig, SequenceModel, build_model

__all__ = [
    "CHECKPOINT_FORMAT",
    "CharLMConfig",
    "CharLMResult",
    "Corpus",
    "Vocabulary",
    "evaluate_bits_per_char",
    "generate",
    "load_checkpoint",
    "peek_config",
    "run_char_lm",
    "save_checkpoint",
    "stdlib_corpus",
    "unigram_entropy",
]

#: Bumped when the checkpoint layout changes; loading another version raises.
CHECKPOINT_FORMAT: Final = 1
#: Share of the corpus used for training; the rest is validation.
TRAIN_FRACTION: Final = 0.9


class Vocabulary:
    """The characters of a text, sorted; ids are positions in that order.

    Args:
        chars: the distinct characters (sorted and de-duplicated here).
    """

    def __init__(self, chars: str | Sequence[str]) -> None:
        ordered = sorted(set(chars))
        if not ordered:
            raise ValueError("chars must hold at least one character, got none")
        self.chars = "".join(ordered)
        self._index = {c: i for i, c in enumerate(self.chars)}

    def __len__(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> Tensor:
        """``text`` -> int64 ``[len(text)]``.

        Raises:
            ValueError: a character outside the vocabulary (the message names it).
        """
        try:
            ids = [self._index[c] for c in text]
        except KeyError as missing:
            raise ValueError(
                f"text holds the character {missing.args[0]!r}, which is not in the "
                f"{len(self)}-character vocabulary of the training corpus"
            ) from None
        return torch.tensor(ids, dtype=torch.long)

    def decode(self, ids: Tensor | Sequence[int]) -> str:
        """int ids -> text."""
        values = ids.tolist() if isinstance(ids, Tensor) else list(ids)
        return "".join(self.chars[i] for i in values)


@dataclass(frozen=True)
class Corpus:
    """The text, its split and its vocabulary.

    Attributes:
        files: the source files used, in order (names relative to the stdlib folder).
        vocab: the characters of the whole text.
        train: int64 ``[N_train]`` character ids.
        valid: int64 ``[N_valid]`` character ids.
    """

    files: tuple[str, ...]
    vocab: Vocabulary
    train: Tensor
    valid: Tensor


def stdlib_corpus(budget_chars: int = 1_000_000, stdlib: str | Path | None = None) -> Corpus:
    """The standard library's public top-level modules, sorted by name, cut at ``budget_chars``.

    Args:
        budget_chars: characters of text in total (train + validation).
        stdlib: the folder to read (default: this interpreter's ``sysconfig`` stdlib path).

    Raises:
        ValueError: ``budget_chars`` below 1000 (too little text for a validation split), or the
            folder holds no such ``.py`` files.
    """
    if not isinstance(budget_chars, int) or isinstance(budget_chars, bool) or budget_chars < 1000:
        raise ValueError(f"budget_chars must be an int >= 1000, got {budget_chars!r}")
    root = Path(sysconfig.get_paths()["stdlib"] if stdlib is None else stdlib)
    paths = sorted(p for p in root.glob("*.py") if not p.name.startswith("_"))
    if not paths:
        raise ValueError(f"stdlib folder {str(root)!r} holds no public top-level .py files")
    parts: list[str] = []
    used: list[str] = []
    total = 0
    for path in paths:
        if total >= budget_chars:
            break
        # A few stdlib files hold non-UTF-8 bytes in comments; replacement keeps them readable.
        text = path.read_text(encoding="utf-8", errors="replace")
        parts.append(text[: budget_chars - total])
        used.append(path.name)
        total += len(parts[-1])
    text = "".join(parts)
    vocab = Vocabulary(text)
    ids = vocab.encode(text)
    cut = int(len(ids) * TRAIN_FRACTION)
    return Corpus(tuple(used), vocab, ids[:cut], ids[cut:])


def unigram_entropy(ids: Tensor) -> float:
    """``-Σ p(c) log2 p(c)`` in bits per character, ``p`` the frequencies in ``ids [N]``."""
    if ids.numel() == 0:
        raise ValueError("ids must hold at least one character, got an empty tensor")
    counts = Counter(ids.tolist())
    n = ids.numel()
    return -sum(k / n * math.log2(k / n) for k in counts.values())


@dataclass(frozen=True)
class CharLMConfig:
    """The language-model run (defaults: the documented run, a few minutes on a 2-core CPU).

    Attributes:
        budget_chars: corpus size in characters.
        length: training window ``T``.
        batch: windows per step.
        steps: optimizer steps in total.
        lr: peak learning rate (AdamW, warm-up then cosine decay).
        warmup_steps: linear warm-up steps.
        weight_decay: AdamW weight decay.
        d_model: width of every layer.
        layers: recurrent blocks.
        cell: ``"gru"``, ``"lstm"``, ``"slstm"`` (or ``"linear"`` for the baseline).
        newton_iters: Newton's ``max_iters`` per layer and forward.
        newton_tol: stop a solve once its max residual is below this. Why not the fixed 3
            iterations of the default ``NewtonConfig``: as the language model trains, its
            recurrent weights leave the contracting init, and 3 iterations left max residuals
            of 0.4 (step 200) to 20 (step 220) before the solve diverged near step 290
            (measured with the defaults below at ``newton_iters=3, newton_tol=None``).
        newton_threshold: Newton's ``divergence_threshold``. The first iterations can overshoot
            far (max residuals of 1e4-1e7 after one update were measured) and still converge
            a few iterations later, as the gates saturate; at the default 1e6 those solves
            counted as diverged (1 of 1200 parity solves, 18 of 1200 char-LM solves), at 1e12
            none did. Non-finite residuals still count as diverged.
        newton_fallback: recompute a diverged layer sequentially instead of raising; counted
            in ``History.fallbacks`` and printed.
        eval_streams: parallel streams the validation split is read as.
        eval_chars: validation characters to score (None: the whole split).
        seed: seeds the init and the data stream.
    """

    budget_chars: int = 1_000_000
    length: int = 128
    batch: int = 32
    steps: int = 600
    lr: float = 5e-3
    warmup_steps: int = 50
    weight_decay: float = 0.01
    d_model: int = 128
    layers: int = 2
    cell: str = "gru"
    newton_iters: int = 16
    newton_tol: float | None = 1e-4
    newton_threshold: float | None = 1e12
    newton_fallback: bool = True
    eval_streams: int = 32
    eval_chars: int | None = 50_000
    seed: int = 0

    def __post_init__(self) -> None:
        for name in (
            "budget_chars",
            "length",
            "batch",
            "steps",
            "d_model",
            "layers",
            "newton_iters",
            "eval_streams",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.cell not in CELLS:
            raise ValueError(f"cell must be one of {CELLS}, got {self.cell!r}")
        if self.eval_chars is not None and self.eval_chars < 1:
            raise ValueError(f"eval_chars must be None or a positive int, got {self.eval_chars!r}")

    def model_config(self, vocab_size: int) -> ModelConfig:
        """The model's configuration for a vocabulary of ``vocab_size`` characters."""
        return ModelConfig(
            vocab_size=vocab_size,
            num_outputs=vocab_size,
            d_model=self.d_model,
            layers=self.layers,
            cell=self.cell,
            newton_iters=self.newton_iters,
            newton_tol=self.newton_tol,
            newton_threshold=self.newton_threshold,
            newton_fallback=self.newton_fallback,
        )


def _train_windows(
    ids: Tensor, batch: int, length: int, generator: torch.Generator, device: torch.device
) -> tuple[Tensor, Tensor]:
    """Random windows: ``inputs [B, T]`` and ``targets [B, T]`` (the next characters)."""
    if ids.numel() < length + 1:
        raise ValueError(
            f"length must be below the training split ({ids.numel()} characters), got {length}"
        )
    starts = torch.randint(0, ids.numel() - length, (batch,), generator=generator)
    windows = torch.stack([ids[s : s + length + 1] for s in starts.tolist()])
    return windows[:, :-1].to(device), windows[:, 1:].to(device)


@torch.no_grad()
def evaluate_bits_per_char(
    model: SequenceModel,
    ids: Tensor,
    *,
    length: int,
    streams: int,
    mode: str = "eval",
) -> float:
    """Mean next-character loss over ``ids [N]`` in bits, reading it as ``streams`` contiguous
    streams (``[streams, N // streams]``) in windows of ``length`` with the state carried over.

    Args:
        model: the language model.
        ids: int64 character ids.
        length: window ``T`` (the state carries across windows, so it only bounds memory use).
        streams: parallel streams ``B``; ``N // streams - 1`` predictions per stream are scored.
        mode: ``"eval"`` (one-step recurrence) or ``"train"`` (Newton); restored afterwards.

    Raises:
        ValueError: fewer than 2 characters per stream, or an unknown ``mode``.
    """
    if mode not in ("eval", "train"):
        raise ValueError(f"mode must be 'eval' or 'train', got {mode!r}")
    per_stream = ids.numel() // streams
    if per_stream < 2:
        raise ValueError(
            f"streams must leave at least 2 characters per stream; {ids.numel()} characters "
            f"in {streams} streams leave {per_stream}"
        )
    device = next(model.parameters()).device
    data = ids[: streams * per_stream].view(streams, per_stream).to(device)
    was_training = model.training
    model.train(mode == "train")
    total, count = 0.0, 0
    state: list[Tensor] | None = None
    try:
        for start in range(0, per_stream - 1, length):
            stop = min(start + length, per_stream - 1)
            inputs, targets = data[:, start:stop], data[:, start + 1 : stop + 1]
            result = model(inputs, state, return_state=True)
            assert isinstance(result, tuple)
            logits, state = result
            total += float(
                F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum")
            )
            count += targets.numel()
    finally:
        model.train(was_training)
    return total / count / math.log(2)


@torch.no_grad()
def generate(
    model: SequenceModel,
    vocab: Vocabulary,
    prompt: str,
    length: int,
    *,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
) -> str:
    """Continue ``prompt`` by ``length`` characters through the one-step recurrence.

    The prompt is fed one character at a time with :meth:`SequenceModel.step` (each ParaRNN
    layer's ``step``), then each new character is sampled from ``softmax(logits / temperature)``
    and fed back.

    Args:
        model: the language model (its mode is not changed: ``step`` is the same in both).
        vocab: the corpus vocabulary.
        prompt: non-empty text of vocabulary characters.
        length: characters to generate (``>= 0``).
        temperature: ``> 0`` divides the logits; ``0`` takes the most likely character.
        generator: a CPU generator for sampling (None: torch's global one).

    Returns:
        The ``length`` generated characters (without the prompt).

    Raises:
        ValueError: empty prompt, a prompt character outside the vocabulary, ``length < 0``,
            ``temperature < 0``.
    """
    if not prompt:
        raise ValueError("prompt must hold at least one character, got ''")
    if not isinstance(length, int) or isinstance(length, bool) or length < 0:
        raise ValueError(f"length must be an int >= 0, got {length!r}")
    if not (math.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"temperature must be a finite float >= 0, got {temperature!r}")
    device = next(model.parameters()).device
    ids = vocab.encode(prompt).to(device)
    state: list[Tensor] | None = None
    logits = torch.empty(0)
    for token in ids:
        logits, state = model.step(token.view(1), state)
    out: list[int] = []
    for _ in range(length):
        if temperature == 0:
            choice = int(logits.argmax(-1))
        else:
            probs = torch.softmax(logits.float().cpu() / temperature, dim=-1)
            choice = int(torch.multinomial(probs, 1, generator=generator))
        out.append(choice)
        logits, state = model.step(torch.tensor([choice], device=device), state)
    return vocab.decode(out)


def save_checkpoint(
    path: str | Path,
    model: SequenceModel,
    optimizer: torch.optim.Optimizer,
    config: CharLMConfig,
    vocab: Vocabulary,
    step: int,
    history: History,
    data_state: Tensor,
) -> Path:
    """Write model + optimizer ``state_dict``, configs, vocabulary, step, history, data RNG."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "format": CHECKPOINT_FORMAT,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "model_config": model.config.to_dict(),
        "run_config": asdict(config),
        "vocab": vocab.chars,
        "step": step,
        "history": history.state_dict(),
        "data_state": data_state,
    }
    # Write then rename, so an interrupted save never leaves a truncated checkpoint behind.
    partial = out.with_name(out.name + ".partial")
    torch.save(payload, partial)
    partial.replace(out)
    return out


@dataclass
class Checkpoint:
    """A loaded checkpoint: the rebuilt model and optimizer and what the run needs to continue."""

    model: SequenceModel
    optimizer: torch.optim.Optimizer
    config: CharLMConfig
    vocab: Vocabulary
    step: int
    history: History
    data_state: Tensor


def _optimizer(model: SequenceModel, config: CharLMConfig) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)


def _read_checkpoint(path: str | Path, device: torch.device | str) -> Mapping[str, Any]:
    source = Path(path)
    if not source.is_file():
        raise FileNotFoundError(f"checkpoint {str(source)!r} does not exist")
    payload = torch.load(source, map_location=device, weights_only=True)
    found = payload.get("format") if isinstance(payload, Mapping) else None
    if found != CHECKPOINT_FORMAT:
        raise ValueError(
            f"checkpoint {str(source)!r} has format {found!r}, expected {CHECKPOINT_FORMAT} "
            "(written by pararnn_examples.tasks.char_lm.save_checkpoint)"
        )
    assert isinstance(payload, Mapping)
    return payload


def peek_config(path: str | Path) -> CharLMConfig:
    """The run configuration stored in a checkpoint (without rebuilding the model)."""
    return CharLMConfig(**_read_checkpoint(path, "cpu")["run_config"])


def load_checkpoint(path: str | Path, device: torch.device | str = "cpu") -> Checkpoint:
    """Rebuild the model and optimizer of a :func:`save_checkpoint` file on ``device``.

    Raises:
        FileNotFoundError: no such file.
        ValueError: not a checkpoint of this format.
    """
    payload = _read_checkpoint(path, device)
    config = CharLMConfig(**payload["run_config"])
    model = build_model(ModelConfig.from_dict(payload["model_config"]), device)
    model.load_state_dict(payload["model"])
    optimizer = _optimizer(model, config)
    optimizer.load_state_dict(payload["optimizer"])
    return Checkpoint(
        model=model,
        optimizer=optimizer,
        config=config,
        vocab=Vocabulary(payload["vocab"]),
        step=int(payload["step"]),
        history=History.from_state_dict(payload["history"]),
        data_state=payload["data_state"].cpu(),
    )


@dataclass
class CharLMResult:
    """What :func:`run_char_lm` measured and produced.

    Attributes:
        config: the run's configuration (the checkpoint's when resumed, with the new ``steps``).
        model, optimizer, vocab: the trained model, its optimizer and the vocabulary.
        history: all training records (a resumed run's include the earlier ones).
        valid_bpc: validation bits per character (eval mode).
        unigram_bpc: unigram entropy of the validation text, bits per character.
        train_chars: characters of the training split.
        valid_chars: validation characters scored (``eval_chars`` of the split).
        files: the source files of the corpus, in order.
        seconds: wall-clock time of this call's training.
        start_step: the step this call started from (0 unless resumed).
        data_state: the data generator's state after the last step (what a checkpoint saves).
    """

    config: CharLMConfig
    model: SequenceModel
    optimizer: torch.optim.Optimizer
    vocab: Vocabulary
    history: History
    valid_bpc: float
    unigram_bpc: float
    train_chars: int
    valid_chars: int
    files: tuple[str, ...]
    seconds: float
    start_step: int
    data_state: Tensor

    def summary(self) -> str:
        """A few lines: corpus, loss, validation bits/char against the unigram entropy."""
        h = self.history
        tail = min(20, len(h))
        lines = [
            f"corpus: {len(self.files)} stdlib files ({self.files[0]} .. {self.files[-1]}), "
            f"{self.train_chars:,} train characters, {self.valid_chars:,} validation characters "
            f"scored, vocabulary {len(self.vocab)}",
            f"training: steps {self.start_step} -> {self.config.steps} in {self.seconds:.0f} s, "
            f"loss {h.loss[0]:.3f} -> {h.mean_loss(len(h) - tail, len(h)):.3f} nats/char "
            f"(mean of the last {tail} steps)",
            h.newton_text(self.config.layers),
            f"validation: {self.valid_bpc:.3f} bits/char (eval mode, one-step recurrence) vs "
            f"unigram entropy {self.unigram_bpc:.3f} bits/char",
        ]
        return "\n".join(line for line in lines if line)


def run_char_lm(
    config: CharLMConfig,
    device: torch.device | str = "cpu",
    *,
    resume: str | Path | None = None,
    checkpoint: str | Path | None = None,
    save_every: int | None = None,
    progress: bool = True,
    corpus: Corpus | None = None,
) -> CharLMResult:
    """Train (or continue training) the language model and measure validation bits/char.

    Args:
        config: the run; with ``resume`` only its ``steps`` is used (the rest comes from the
            checkpoint).
        device: where to train.
        resume: a checkpoint to continue from (up to ``config.steps``; no training when it is
            already there).
        checkpoint: where to save (every ``save_every`` steps and at the end), or None.
        save_every: steps between saves (None: only at the end).
        progress: show the progress bar.
        corpus: the text (default: :func:`stdlib_corpus` of the run's ``budget_chars``).

    Raises:
        ValueError: the resumed checkpoint's vocabulary does not match the corpus.
        NonFiniteLossError: the loss became NaN or infinite.
    """
    device = torch.device(device)
    data = seed_everything(config.seed)
    if resume is not None:
        loaded = load_checkpoint(resume, device)
        steps = max(config.steps, loaded.step)
        run = CharLMConfig(**{**asdict(loaded.config), "steps": steps})
        model, optimizer, history, start = (
            loaded.model,
            loaded.optimizer,
            loaded.history,
            loaded.step,
        )
        data.set_state(loaded.data_state)
    else:
        run, history, start = config, History(), 0
    corpus = stdlib_corpus(run.budget_chars) if corpus is None else corpus
    if resume is not None and loaded.vocab.chars != corpus.vocab.chars:
        raise ValueError(
            f"resume checkpoint's vocabulary ({len(loaded.vocab)} characters) differs from the "
            f"corpus's ({len(corpus.vocab)}): it was trained on other text"
        )
    if resume is None:
        model = build_model(run.model_config(len(corpus.vocab)), device)
        optimizer = _optimizer(model, run)

    def compute_loss(step: int) -> tuple[Tensor, Mapping[str, float]]:
        inputs, targets = _train_windows(corpus.train, run.batch, run.length, data, device)
        logits = model(inputs)
        assert isinstance(logits, Tensor)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return loss, {"bits/char": float(loss.detach()) / math.log(2)}

    def after_step(step: int) -> None:
        done = step + 1
        if checkpoint is not None and save_every is not None and done % save_every == 0:
            save_checkpoint(
                checkpoint, model, optimizer, run, corpus.vocab, done, history, data.get_state()
            )

    seconds = 0.0
    if start < run.steps:
        schedule = TrainConfig(
            steps=run.steps,
            lr=run.lr,
            warmup_steps=min(run.warmup_steps, run.steps - 1),
            progress=progress,
            desc=f"char LM ({run.cell})",
        )
        begin = time.perf_counter()
        train(
            model,
            optimizer,
            compute_loss,
            schedule,
            start_step=start,
            history=history,
            after_step=after_step,
        )
        seconds = time.perf_counter() - begin
    valid = corpus.valid if run.eval_chars is None else corpus.valid[: run.eval_chars]
    bpc = evaluate_bits_per_char(model, valid, length=run.length, streams=run.eval_streams)
    result = CharLMResult(
        config=run,
        model=model,
        optimizer=optimizer,
        vocab=corpus.vocab,
        history=history,
        valid_bpc=bpc,
        unigram_bpc=unigram_entropy(valid),
        train_chars=corpus.train.numel(),
        valid_chars=valid.numel(),
        files=corpus.files,
        seconds=seconds,
        start_step=start,
        data_state=data.get_state(),
    )
    if checkpoint is not None:
        save_checkpoint(
            checkpoint,
            model,
            optimizer,
            run,
            corpus.vocab,
            max(start, run.steps),
            history,
            result.data_state,
        )
    return result
