"""FlashRNN (Pöppel et al., 2024) beside ParaLSTM, ParaSLSTM and ParaGRU (the cell scopes).

One method, ``flashrnn``, runs FlashRNN's counterpart of each cell through its public function
``flashrnn.flashrnn(Wx, R, b, config=FlashRNNConfig(...))``:

==============  ===========================================================================
case cell       FlashRNN function, backend
==============  ===========================================================================
``ParaLSTM``    ``"lstm"``, ``"triton_fused"``
``ParaSLSTM``   ``"slstm"``, ``"triton_fused"``
``ParaGRU``     ``"gru"``, ``"cuda_fused"`` (FlashRNN itself swaps in its ``"cuda"`` kernel for
                the GRU; both compile CUDA C++ at the first call -- a failed build is a skip)
==============  ===========================================================================

Heads of :data:`FLASHRNN_HEAD_DIM` (64): hidden ``d = 256`` is 4 heads of 64. FlashRNN's model
is not ours: its recurrent matrix is dense per head and gate (``R [G, H, 64, 64]``), ours is
diagonal per channel, and its LSTM has separate input and forget gates. So its output is not
compared with our float64 reference: the check column says ``not comparable: different model``,
and the output is checked for shape ``[S, B, T, H, 64]`` and finiteness only.

Inputs (built once per case, outside the timed calls; ``R ~ U(±1/√64)``, ``b = 0``):

* scope ``"layer"``: the case's ``x [B, T, d]`` through an ``nn.Linear(d, G d)`` into
  ``Wx [B, T, G, H, 64]``, timed like our input projection; backward of the case's cotangent on
  the hidden state ``h`` (``states[0]``) into ``x``, the projection, ``R`` and ``b``;
* scope ``"recurrence"``: ``Wx`` drawn once (unit normal) as the leaf; backward of a unit-normal
  cotangent on all its states ``[S, B, T, H, 64]`` into ``Wx``, ``R`` and ``b``.
"""

from __future__ import annotations

import math
from typing import Final, NamedTuple

import torch
from torch import Tensor, nn

from ..cases import BenchConfig, Case, CaseInputs
from ..registry import Method, NotComparable, Reference, Runner, register_method
from .base import Peer, PeerUnavailable, warm_up

__all__ = ["FLASHRNN", "FLASHRNN_CELLS", "FLASHRNN_HEAD_DIM", "FlashRNNCell"]

FLASHRNN: Final = Peer(
    "flashrnn",
    "flashrnn",
    "flashrnn.flashrnn(Wx [B, T, G, H, D], R, b, config=FlashRNNConfig(...)): triton_fused "
    "LSTM/sLSTM, cuda_fused GRU",
)
FLASHRNN_HEAD_DIM: Final = 64
#: The ``kind`` of FlashRNN's check (the ``reference`` column).
NOT_COMPARABLE: Final = "not comparable: different model"
_KERNEL_DTYPES: Final[dict[str, str]] = {
    "fp32": "float32",
    "bf16": "bfloat16",
    "fp16": "float16",
}


class FlashRNNCell(NamedTuple):
    """FlashRNN's counterpart of one of our cells.

    Attributes:
        function: FlashRNN's ``function``.
        backend: the ``backend`` asked for.
        gates_in: gates of ``Wx`` (``G``).
        gates_recurrent: gates of ``R``.
        biases: gates of ``b``.
        states: states of its output (``S``; the hidden state ``h`` is ``states[0]``).
    """

    function: str
    backend: str
    gates_in: int
    gates_recurrent: int
    biases: int
    states: int


#: Our cell -> FlashRNN's (gate and state counts from FlashRNN's function registry).
FLASHRNN_CELLS: Final[dict[str, FlashRNNCell]] = {
    "ParaLSTM": FlashRNNCell("lstm", "triton_fused", 4, 4, 4, 2),
    "ParaSLSTM": FlashRNNCell("slstm", "triton_fused", 4, 4, 4, 4),
    "ParaGRU": FlashRNNCell("gru", "cuda_fused", 3, 3, 4, 1),
}


def _flashrnn_available(case: Case, config: BenchConfig) -> str | None:
    reason = FLASHRNN.unavailable(case.device)
    if reason is not None:
        return reason
    if case.cell not in FLASHRNN_CELLS:
        return f"no FlashRNN counterpart of {case.cell} (known: {list(FLASHRNN_CELLS)})"
    if case.dtype not in _KERNEL_DTYPES:
        return f"FlashRNN stores {list(_KERNEL_DTYPES)}, got {case.dtype}"
    width = case.shape.width
    if width % FLASHRNN_HEAD_DIM:
        return (
            f"FlashRNN runs heads of {FLASHRNN_HEAD_DIM} here: d={width} is not a multiple of "
            f"{FLASHRNN_HEAD_DIM}"
        )
    return None


def _build_flashrnn(case: Case, inputs: CaseInputs, config: BenchConfig) -> Runner:
    if case.cell not in FLASHRNN_CELLS or case.shape.width % FLASHRNN_HEAD_DIM:
        raise PeerUnavailable(
            f"FlashRNN has no counterpart of {case.cell} at d={case.shape.width} here "
            f"(cells {list(FLASHRNN_CELLS)}, d a multiple of {FLASHRNN_HEAD_DIM})"
        )
    flashrnn = FLASHRNN.attr("flashrnn")
    spec = FLASHRNN_CELLS[case.cell]
    batch, steps, width = case.shape
    head = FLASHRNN_HEAD_DIM
    heads = width // head
    device, dtype = case.device, case.torch_dtype
    flash_config = FLASHRNN.attr("FlashRNNConfig")(
        function=spec.function,
        backend=spec.backend,
        dtype=_KERNEL_DTYPES[case.dtype],
        num_heads=heads,
        head_dim=head,
        batch_size=batch,
    )
    bound = 1.0 / math.sqrt(head)
    recurrent = torch.empty(spec.gates_recurrent, heads, head, head, device=device)
    recurrent = recurrent.uniform_(-bound, bound).to(dtype).requires_grad_(True)
    bias = torch.zeros(spec.biases, heads, head, device=device, dtype=dtype, requires_grad=True)
    leaves: list[Tensor] = [recurrent, bias]
    gate_shape = (batch, steps, spec.gates_in, heads, head)
    if case.scope == "layer":
        proj = nn.Linear(width, spec.gates_in * width, device=device, dtype=dtype)
        x = inputs.inputs
        leaves += [x, *proj.parameters()]
        cotangent = inputs.cotangent.reshape(batch, steps, heads, head)

        def gates() -> Tensor:
            projected: Tensor = proj(x)
            return projected.view(gate_shape)

        def checked_output(states: Tensor) -> Tensor:
            return states[0]  # the hidden state h [B, T, H, 64]

    else:
        wx = torch.randn(gate_shape, device=device).to(dtype).requires_grad_(True)
        leaves.append(wx)
        cotangent = torch.randn(spec.states, batch, steps, heads, head, device=device).to(dtype)

        def gates() -> Tensor:
            return wx

        def checked_output(states: Tensor) -> Tensor:
            return states

    def forward() -> Tensor:
        with torch.no_grad():
            states: Tensor = flashrnn(gates(), recurrent, bias, config=flash_config)[0]
        return states

    def forward_backward() -> None:
        for leaf in leaves:
            leaf.grad = None
        states: Tensor = flashrnn(gates(), recurrent, bias, config=flash_config)[0]
        torch.autograd.backward(checked_output(states), cotangent)

    backend = str(getattr(flash_config, "backend", spec.backend))
    timed_backward = warm_up(FLASHRNN, f"{spec.function} ({backend})", forward, forward_backward)
    ran = backend if backend == spec.backend else f"{backend} (asked for {spec.backend})"
    note = f"FlashRNN {spec.function}, {ran}, {heads} heads x {head}"
    model = (
        f"FlashRNN {spec.function}: dense {head}x{head} recurrent matrix per head and gate; "
        f"{case.cell}: diagonal recurrent weights"
    )
    shape = (spec.states, batch, steps, heads, head)

    def reference() -> Reference | NotComparable:
        return NotComparable(NOT_COMPARABLE, shape, model)

    return Runner(
        forward,
        timed_backward,
        reference=reference,
        reference_key=f"flashrnn_{spec.function}",
        note=note,
    )


def _register() -> None:
    register_method(
        Method(
            "flashrnn",
            "FlashRNN: triton_fused LSTM (ParaLSTM) and sLSTM (ParaSLSTM), cuda_fused GRU "
            "(ParaGRU), heads of 64; a different (dense per-head) model, not compared",
            _build_flashrnn,
            _flashrnn_available,
            peer=FLASHRNN,
        )
    )


_register()
