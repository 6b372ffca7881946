"""ParaRNN: a stack of ParaRNN cells as one ``nn.Module`` (Newton in training, steps in eval)."""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn

from ._validation import check_sequence, check_state, check_step_input
from .cells.base import ParaCell
from .config import NewtonConfig, NewtonStats
from .fused import fused_kernels_apply, fused_sequential_apply
from .newton import newton_apply, sequential_apply

__all__ = ["ParaRNN"]

State = Tensor | list[Tensor]


class ParaRNN(nn.Module):
    """One cell or a stack of cells run over sequences ``(B, T, d_in) -> (B, T, d_h)``.

    ``.train()``: every layer runs :func:`~pararnn_core.newton_apply` (parallel over time, eq. 2.6
    backward) and :attr:`last_stats` is refreshed with one :class:`NewtonStats` per layer.
    ``.eval()``: every layer runs the sequential recurrence -- the fused sequential kernel
    (:func:`~pararnn_core.fused_sequential_apply`) for cells with fused kernels on CUDA,
    :func:`~pararnn_core.sequential_apply` otherwise; :attr:`last_stats` is left as it was.

    State: for a model built from one cell, a tensor ``[B, *S]`` (``[B, d_h]`` for diagonal cells,
    ``[B, d_h, k]`` for block cells); for a model built from a list, a list with one such tensor
    (or None) per layer. ``forward(..., return_state=True)`` returns the final state in the same
    form, so a long sequence can be trained in chunks (gradients flow through the carried state;
    ``.detach()`` it for truncated BPTT)::

        y1, s = model(x[:, :4096], return_state=True)
        y2, s = model(x[:, 4096:], s, return_state=True)

    Args:
        cells: a :class:`~pararnn_core.ParaCell`, or a non-empty list of them where each layer's
            ``d_h`` is the next one's ``d_in``.
        config: the Newton settings shared by all layers.

    Example:
        >>> import torch, pararnn_core as pc
        >>> model = pc.ParaRNN([pc.ParaGRU(4, 16), pc.ParaLSTM(16, 8)])
        >>> model(torch.randn(2, 100, 4)).shape
        torch.Size([2, 100, 8])
        >>> [s.iters for s in model.last_stats]
        [3, 3]
    """

    last_stats: list[NewtonStats]

    def __init__(
        self, cells: ParaCell | Sequence[ParaCell], config: NewtonConfig | None = None
    ) -> None:
        super().__init__()
        if isinstance(cells, ParaCell):
            cell_list, self._single = [cells], True
        elif isinstance(cells, Sequence):
            cell_list, self._single = list(cells), False
            if not cell_list:
                raise ValueError("cells must hold at least one cell, got an empty sequence")
        else:
            raise TypeError(
                f"cells must be a ParaCell or a sequence of them, got {type(cells).__name__}"
            )
        for i, cell in enumerate(cell_list):
            if not isinstance(cell, ParaCell):
                raise TypeError(f"cells[{i}] must be a ParaCell, got {type(cell).__name__}")
        for i in range(1, len(cell_list)):
            if cell_list[i].d_in != cell_list[i - 1].d_h:
                raise ValueError(
                    f"cells[{i}].d_in must equal cells[{i - 1}].d_h = {cell_list[i - 1].d_h}, "
                    f"got {cell_list[i].d_in}"
                )
        config = NewtonConfig() if config is None else config
        if not isinstance(config, NewtonConfig):
            raise TypeError(f"config must be a NewtonConfig, got {type(config).__name__}")
        self.cells = nn.ModuleList(cell_list)
        self.config = config
        self.last_stats = []

    @property
    def d_in(self) -> int:
        """Input features of the first layer."""
        return self._cell(0).d_in

    @property
    def d_h(self) -> int:
        """Output features of the last layer."""
        return self._cell(len(self.cells) - 1).d_h

    def _cell(self, i: int) -> ParaCell:
        cell = self.cells[i]
        assert isinstance(cell, ParaCell)
        return cell

    def _per_layer(self, state: object, name: str) -> list[Tensor | None]:
        layers = len(self.cells)
        if state is None:
            return [None] * layers
        if isinstance(state, Tensor):
            if layers != 1:
                raise TypeError(
                    f"{name} must be a list of {layers} per-layer states for this {layers}-layer "
                    "model, got a single tensor"
                )
            return [state]
        if isinstance(state, list | tuple):
            if len(state) != layers:
                raise ValueError(
                    f"{name} must hold one state per layer ({layers}), got {len(state)}"
                )
            for i, s in enumerate(state):
                if s is not None and not isinstance(s, Tensor):
                    raise TypeError(
                        f"{name}[{i}] must be a torch.Tensor or None, got {type(s).__name__}"
                    )
            return list(state)
        raise TypeError(
            f"{name} must be a Tensor, a list of per-layer Tensors, or None; "
            f"got {type(state).__name__}"
        )

    def _state_name(self, name: str, i: int) -> str:
        return name if self._single else f"{name}[{i}]"

    def _pack(self, finals: list[Tensor]) -> State:
        return finals[0] if self._single else finals

    def forward(
        self, x: Tensor, h0: State | None = None, *, return_state: bool = False
    ) -> Tensor | tuple[Tensor, State]:
        """Run the stack over ``x``.

        Args:
            x: ``[B, T, d_in]``.
            h0: initial state (see the class docstring), or None for the cells' empty states.
            return_state: also return the final state.

        Returns:
            ``y [B, T, d_h]``, or ``(y, final_state)`` when ``return_state``.

        Raises:
            TypeError, ValueError: bad ``x`` (rank, ``d_in``, ``T = 0``, dtype, device) or ``h0``
                (shape, dtype, device), naming the argument.
            NewtonDivergenceError: see :class:`~pararnn_core.NewtonConfig`.
        """
        y = check_sequence(self._cell(0), x, "x")
        initial = self._per_layer(h0, "h0")
        finals: list[Tensor] = []
        stats: list[NewtonStats] = []
        for i, given in enumerate(initial):
            cell = self._cell(i)
            start = check_state(cell, given, y.shape[0], y, self._state_name("h0", i))
            if self.training:
                states, layer_stats = newton_apply(cell, y, start, config=self.config)
                stats.append(layer_stats)
            elif fused_kernels_apply(cell, y):
                states = fused_sequential_apply(cell, y, start)
            else:
                states = sequential_apply(cell, y, start)
            finals.append(states[:, -1])
            y = cell.output(states)
        if self.training:
            self.last_stats = stats
        if return_state:
            return y, self._pack(finals)
        return y

    def step(self, x_t: Tensor, state: State | None = None) -> tuple[Tensor, State]:
        """One token through every layer (decoding); the same in train and eval mode.

        Args:
            x_t: ``[B, d_in]``.
            state: the state after the previous token (as ``forward`` returns it), or None.

        Returns:
            ``(y_t [B, d_h], new_state)``.
        """
        y = check_step_input(self._cell(0), x_t, "x_t")
        initial = self._per_layer(state, "state")
        finals: list[Tensor] = []
        for i, given in enumerate(initial):
            cell = self._cell(i)
            start = check_state(cell, given, y.shape[0], y, self._state_name("state", i))
            new = cell.step(start, cell.project(y))
            finals.append(new)
            y = cell.output(new)
        return y, self._pack(finals)

    def extra_repr(self) -> str:
        return f"config={self.config}"
