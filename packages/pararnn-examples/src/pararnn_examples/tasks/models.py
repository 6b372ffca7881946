"""The model every task trains: token embedding -> recurrent blocks -> norm -> linear head.

A block is pre-norm and residual::

    x = x + W_o · rnn(RMSNorm(x))          rnn: one ParaRNN layer (or the linear baseline)
    x = x + MLP(RMSNorm(x))                optional, GELU, width mlp_ratio · d

Each recurrent layer is its own :class:`~pararnn_core.ParaRNN` (one cell), so norms, residuals
and MLPs can sit between layers; :func:`pararnn_examples.train.newton_summary` collects the
Newton statistics of all of them. Diagonal cells mix no channels inside the recurrence (DESIGN
§1), which is why every block has the output projection ``W_o`` and, by default, an MLP.

``cell="linear"`` swaps each ParaRNN for :class:`DiagonalLinearRNN`, a linear recurrence with
input-dependent decay in ``(0, 1)`` of the same width (the class of Mamba/GLA-style layers),
solved by one :func:`pararnn_kernels.scan_diag`. Everything else is identical, so it is the
baseline that shows what the nonlinearity buys.

Shapes: ``tokens [B, T]`` (int64) -> ``logits [B, T, num_outputs]``; one step
``tokens [B] -> logits [B, num_outputs]`` with a per-block state list.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Final

import torch
from torch import Tensor, nn

from pararnn_core import NewtonConfig, ParaCell, ParaGRU, ParaLSTM, ParaRNN, ParaSLSTM
from pararnn_kernels import scan_diag

__all__ = [
    "CELLS",
    "DiagonalLinearRNN",
    "ModelConfig",
    "RecurrentBlock",
    "SequenceModel",
    "build_model",
]

#: ``cell`` names of :class:`ModelConfig`: the three ParaRNN cells and the linear baseline.
CELLS: Final[tuple[str, ...]] = ("gru", "lstm", "slstm", "linear")

#: ``DiagonalLinearRNN`` decay logits start in this range: decays ``σ(·)`` in about [0.5, 0.98],
#: memories from a few steps to ~50, so the baseline is not handicapped by a short init.
DECAY_LOGIT_INIT: Final = (0.0, 4.0)

State = list[Tensor | None]


def _positive(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


@dataclass(frozen=True)
class ModelConfig:
    """Sizes and solver settings of :class:`SequenceModel` (saved in checkpoints as a dict).

    Attributes:
        vocab_size: input tokens.
        num_outputs: classes of the head (``vocab_size`` for a language model).
        d_model: width ``D`` of the embedding, every recurrent layer and the residual stream.
        layers: recurrent blocks.
        cell: one of :data:`CELLS`.
        mlp_ratio: hidden width of each block's MLP in units of ``D``; 0 removes the MLPs.
        recurrent_init: half-width ``w`` of a ``U(-w, w)`` redraw of the cells' diagonal recurrent
            weights; None keeps the cells' contracting init (0.25). Larger values give sharper
            state-dependent gates from the start (parity needs them) at the price of more
            Newton iterations early on.
        newton_iters: Newton's ``max_iters``.
        newton_tol: Newton's ``tol`` (stop early once the residual is below it), or None.
        newton_threshold: Newton's ``divergence_threshold`` (None: the ``NewtonConfig``
            default). Non-finite residuals count as diverged whatever the value.
        newton_fallback: on a Newton divergence, recompute the layer with the sequential
            recurrence (``on_divergence="sequential"``; counted in ``History.fallbacks``)
            instead of raising :class:`~pararnn_core.NewtonDivergenceError`.
        scan_backend: ``NewtonConfig.scan_backend``. ``"auto"`` may run the fused *sequential*
            kernel on a GPU where its cost model finds it faster (small B·D·T; the stats then
            show 0 Newton iterations); ``"fused"`` always runs the fused Newton kernels.
    """

    vocab_size: int
    num_outputs: int
    d_model: int = 64
    layers: int = 2
    cell: str = "gru"
    mlp_ratio: int = 2
    recurrent_init: float | None = None
    newton_iters: int = 3
    newton_tol: float | None = None
    newton_threshold: float | None = None
    newton_fallback: bool = False
    scan_backend: str = "auto"

    def __post_init__(self) -> None:
        for name in ("vocab_size", "num_outputs", "d_model", "layers", "newton_iters"):
            _positive(name, getattr(self, name))
        if self.cell not in CELLS:
            raise ValueError(f"cell must be one of {CELLS}, got {self.cell!r}")
        if not isinstance(self.mlp_ratio, int) or self.mlp_ratio < 0:
            raise ValueError(f"mlp_ratio must be an int >= 0, got {self.mlp_ratio!r}")
        if self.recurrent_init is not None and not self.recurrent_init > 0:
            raise ValueError(f"recurrent_init must be None or > 0, got {self.recurrent_init!r}")
        if self.newton_tol is not None and not self.newton_tol >= 0:
            raise ValueError(f"newton_tol must be None or >= 0, got {self.newton_tol!r}")
        if self.newton_threshold is not None and not self.newton_threshold > 0:
            raise ValueError(f"newton_threshold must be None or > 0, got {self.newton_threshold!r}")

    def to_dict(self) -> dict[str, Any]:
        """Plain values, for a checkpoint."""
        return asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> ModelConfig:
        """The inverse of :meth:`to_dict`; unknown keys raise ValueError naming them."""
        unknown = sorted(set(values) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"unknown ModelConfig fields {unknown}")
        return cls(**values)


class DiagonalLinearRNN(nn.Module):
    """Linear recurrence with input-dependent diagonal decay (the baseline; no Newton needed).

    ``[a_pre, v] = W x + b``, ``a_t = σ(a_pre_t) ∈ (0, 1)`` and::

        h_t = a_t ⊙ h_{t-1} + (1 - a_t) ⊙ v_t

    ``h`` is linear in ``h_{t-1}`` with a positive multiplier, so a sign flip per input (what
    parity needs) cannot be expressed at any length; the forward is one parallel
    :func:`pararnn_kernels.scan_diag`.

    Args:
        d_in: input features.
        d_h: state channels.
    """

    def __init__(self, d_in: int, d_h: int) -> None:
        super().__init__()
        _positive("d_in", d_in)
        _positive("d_h", d_h)
        self.d_in, self.d_h = d_in, d_h
        self.proj = nn.Linear(d_in, 2 * d_h)
        with torch.no_grad():
            self.proj.bias[:d_h].uniform_(*DECAY_LOGIT_INIT)

    def _coefficients(self, x: Tensor) -> tuple[Tensor, Tensor]:
        a_pre, v = torch.split(self.proj(x), self.d_h, dim=-1)
        decay = torch.sigmoid(a_pre)
        return decay, (1 - decay) * v

    def forward(
        self, x: Tensor, h0: Tensor | None = None, *, return_state: bool = False
    ) -> Tensor | tuple[Tensor, Tensor]:
        """``x [B, T, d_in]``, ``h0 [B, d_h]`` or None -> ``h [B, T, d_h]`` (and ``h[:, -1]``)."""
        decay, drive = self._coefficients(x)
        states = scan_diag(decay, drive, h0)
        if return_state:
            return states, states[:, -1]
        return states

    def step(self, x_t: Tensor, state: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """One step: ``x_t [B, d_in]``, ``state [B, d_h]`` or None -> ``(h_t, h_t)``."""
        decay, drive = self._coefficients(x_t)
        new = drive if state is None else decay * state + drive
        return new, new


def _make_cell(config: ModelConfig) -> ParaCell:
    d = config.d_model
    cell: ParaCell
    if config.cell == "gru":
        cell = ParaGRU(d, d)
    elif config.cell == "lstm":
        cell = ParaLSTM(d, d)
    else:
        cell = ParaSLSTM(d, d)
    if config.recurrent_init is not None:
        weight = cell.get_parameter("recurrent_weight")
        with torch.no_grad():
            weight.uniform_(-config.recurrent_init, config.recurrent_init)
    return cell


class RecurrentBlock(nn.Module):
    """``x + W_o rnn(norm(x))``, then ``x + MLP(norm(x))``: ``[B, T, D] -> [B, T, D]``.

    Args:
        config: the model's configuration (width, cell, MLP, Newton settings).
    """

    rnn: ParaRNN | DiagonalLinearRNN

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        d = config.d_model
        self.norm = nn.RMSNorm(d)
        if config.cell == "linear":
            self.rnn = DiagonalLinearRNN(d, d)
        else:
            newton = NewtonConfig(
                max_iters=config.newton_iters,
                tol=config.newton_tol,
                on_divergence="sequential" if config.newton_fallback else "raise",
                scan_backend=config.scan_backend,
            )
            if config.newton_threshold is not None:
                newton = replace(newton, divergence_threshold=config.newton_threshold)
            self.rnn = ParaRNN(_make_cell(config), newton)
        self.out = nn.Linear(d, d)
        self.mlp: nn.Sequential | None = None
        if config.mlp_ratio > 0:
            self.mlp = nn.Sequential(
                nn.RMSNorm(d),
                nn.Linear(d, config.mlp_ratio * d),
                nn.GELU(),
                nn.Linear(config.mlp_ratio * d, d),
            )

    def _finish(self, x: Tensor, mixed: Tensor) -> Tensor:
        x = x + self.out(mixed)
        if self.mlp is not None:
            x = x + self.mlp(x)
        return x

    def forward(self, x: Tensor, state: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """``x [B, T, D]``, the layer's state or None -> ``(y [B, T, D], final state)``."""
        result = self.rnn(self.norm(x), state, return_state=True)
        assert isinstance(result, tuple)
        mixed, final = result
        assert isinstance(final, Tensor)
        return self._finish(x, mixed), final

    def step(self, x_t: Tensor, state: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """``x_t [B, D]``, the layer's state or None -> ``(y_t [B, D], new state)``."""
        mixed, new = self.rnn.step(self.norm(x_t), state)
        assert isinstance(new, Tensor)
        return self._finish(x_t, mixed), new


class SequenceModel(nn.Module):
    """Embedding -> :class:`RecurrentBlock` x ``layers`` -> RMSNorm -> Linear head.

    In ``.train()`` mode every ParaRNN layer solves by Newton, in ``.eval()`` mode by the
    one-step recurrence; :meth:`step` is the one-step recurrence in either mode.

    Args:
        config: see :class:`ModelConfig`.

    Example:
        >>> model = SequenceModel(ModelConfig(vocab_size=2, num_outputs=2, d_model=8))
        >>> model(torch.zeros(3, 10, dtype=torch.long)).shape
        torch.Size([3, 10, 2])
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        if not isinstance(config, ModelConfig):
            raise TypeError(f"config must be a ModelConfig, got {type(config).__name__}")
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(RecurrentBlock(config) for _ in range(config.layers))
        self.norm = nn.RMSNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.num_outputs)

    def _check_tokens(self, tokens: Tensor, rank: int) -> None:
        shape = "[B, T]" if rank == 2 else "[B]"
        if not isinstance(tokens, Tensor):
            raise TypeError(f"tokens must be a torch.Tensor {shape}, got {type(tokens).__name__}")
        if tokens.dim() != rank or tokens.dtype != torch.long:
            raise ValueError(
                f"tokens must be an int64 tensor {shape}, got {tokens.dtype} with shape "
                f"{tuple(tokens.shape)}"
            )
        if rank == 2 and tokens.shape[1] == 0:
            raise ValueError("tokens must hold at least one step (T >= 1), got T = 0")
        low, high = int(tokens.min()), int(tokens.max())
        if low < 0 or high >= self.config.vocab_size:
            raise ValueError(
                f"tokens must lie in [0, vocab_size={self.config.vocab_size}), got values in "
                f"[{low}, {high}]"
            )

    def _per_block(self, state: Sequence[Tensor | None] | None) -> State:
        if state is None:
            return [None] * len(self.blocks)
        if len(state) != len(self.blocks):
            raise ValueError(
                f"state must hold one entry per block ({len(self.blocks)}), got {len(state)}"
            )
        return list(state)

    def _block(self, i: int) -> RecurrentBlock:
        block = self.blocks[i]
        assert isinstance(block, RecurrentBlock)
        return block

    def forward(
        self,
        tokens: Tensor,
        state: Sequence[Tensor | None] | None = None,
        *,
        return_state: bool = False,
    ) -> Tensor | tuple[Tensor, list[Tensor]]:
        """Logits for every step.

        Args:
            tokens: ``[B, T]`` int64 in ``[0, vocab_size)``.
            state: one state per block (as returned with ``return_state``), or None.
            return_state: also return the final per-block states.

        Returns:
            ``logits [B, T, num_outputs]``, or ``(logits, states)``.
        """
        self._check_tokens(tokens, 2)
        x = self.embed(tokens)
        finals: list[Tensor] = []
        for i, given in enumerate(self._per_block(state)):
            x, final = self._block(i)(x, given)
            finals.append(final)
        logits: Tensor = self.head(self.norm(x))
        if return_state:
            return logits, finals
        return logits

    def step(
        self, tokens: Tensor, state: Sequence[Tensor | None] | None = None
    ) -> tuple[Tensor, list[Tensor]]:
        """One token per sequence through the one-step recurrence (decoding).

        Args:
            tokens: ``[B]`` int64.
            state: per-block states after the previous token, or None at the start.

        Returns:
            ``(logits [B, num_outputs], new per-block states)``.
        """
        self._check_tokens(tokens, 1)
        x = self.embed(tokens)
        finals: list[Tensor] = []
        for i, given in enumerate(self._per_block(state)):
            x, new = self._block(i).step(x, given)
            finals.append(new)
        logits: Tensor = self.head(self.norm(x))
        return logits, finals


def build_model(config: ModelConfig, device: torch.device | str = "cpu") -> SequenceModel:
    """A :class:`SequenceModel` on ``device`` (parameters drawn from torch's current RNG)."""
    return SequenceModel(config).to(device)
