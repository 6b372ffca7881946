"""What one benchmark case is: the settings of a run, the shapes, and the tensors a method gets.

A *case* is one cell layer (``ParaGRU``, ``ParaLSTM``, ``ParaSLSTM``) at one shape ``(B, T, d)``
and storage dtype, in one *scope*:

* ``"recurrence"`` -- from the projected inputs ``u [B, T, d_u]`` to the states ``[B, T, *S]``:
  the cell's input projection is replaced by the identity (:func:`recurrence_view`), so the timed
  work is exactly what the HBM floor model counts (``docs/benchmarks.md``, "pararnn-bench").
* ``"layer"`` -- from ``x [B, T, d]`` to the states, the input projection (one GEMM) included:
  what a user calls, and the only scope in which cuDNN's ``nn.GRU`` / ``nn.LSTM`` (whose input
  projection cannot be left out) is comparable.

The scope ``"scan"`` has no cell: its case (cell name :data:`SCAN_CELL`) is the diagonal linear
recurrence ``y_t = a_t ⊙ y_{t-1} + b_t`` at one shape ``(B, T, D)`` and dtype, the op inside every
Newton step (``pararnn_kernels.scan_diag``), timed against the public scans of other libraries.
Its shapes are :attr:`BenchConfig.scan_shapes` (default :data:`SCAN_SHAPES`).

Every method of a case gets the same :class:`CaseInputs` (or :class:`ScanInputs`): same
parameters, same input, same cotangent, so the ratios between methods of one run compare like
with like.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, Literal, NamedTuple

import torch
from torch import Tensor, nn

import pararnn_core as pc

from .registry import CELL_SCOPES, SCOPES, get_method, method_names

__all__ = [
    "CELLS",
    "CELL_SCOPES",
    "DIRECTIONS",
    "DTYPES",
    "NEWTON_STATS",
    "PROJECTION_BACKENDS",
    "SCAN_CELL",
    "SCAN_JAC_RANGE",
    "SCAN_SHAPES",
    "SCOPES",
    "BenchConfig",
    "Case",
    "CaseInputs",
    "ScanInputs",
    "Shape",
    "default_device",
    "grid_shapes",
    "make_case_inputs",
    "make_scan_inputs",
    "parse_shape",
    "recurrence_view",
]

#: Storage dtypes by their command-line name.
DTYPES: Final[dict[str, torch.dtype]] = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
}
#: The cell layers, by class name: ``constructor(d_in, d_h, device=..., dtype=...)``.
CELLS: Final[dict[str, Callable[..., pc.ParaCell]]] = {
    "ParaGRU": pc.ParaGRU,
    "ParaLSTM": pc.ParaLSTM,
    "ParaSLSTM": pc.ParaSLSTM,
}
#: ``fwd``: forward under ``torch.no_grad()``; ``fwd_bwd``: forward, then backward of a fixed
#: cotangent into the input and every parameter.
DIRECTIONS: Final[tuple[str, ...]] = ("fwd", "fwd_bwd")
#: The values of ``NewtonConfig.stats`` the Newton methods can run with (``--newton-stats``).
NEWTON_STATS: Final[tuple[str, ...]] = ("sync", "deferred", "device")
#: The built-in cells' ``proj.backend`` choices (``--projection``; ``pararnn_core.ProjectionLinear``).
PROJECTION_BACKENDS: Final[tuple[str, ...]] = ("eager", "auto")


class Shape(NamedTuple):
    """One problem size: ``B`` sequences of ``T`` steps, ``d = d_in = d_h`` channels."""

    batch: int
    steps: int
    width: int

    def __str__(self) -> str:
        return f"{self.batch}x{self.steps}x{self.width}"


def parse_shape(text: str) -> Shape:
    """``"64x4096x1024"`` -> ``Shape(batch=64, steps=4096, width=1024)`` (order B, T, d).

    Raises:
        ValueError: not three positive integers separated by ``x``.
    """
    parts = text.lower().replace("×", "x").split("x")
    try:
        values = [int(p) for p in parts]
    except ValueError:
        values = []
    if len(values) != 3 or min(values) < 1:
        raise ValueError(
            f"shape must be 'BxTxD' with three positive integers (e.g. '64x4096x1024'), "
            f"got {text!r}"
        )
    return Shape(*values)


def grid_shapes(batch: int, width: int, steps: tuple[int, ...] | list[int]) -> tuple[Shape, ...]:
    """One shape per sequence length: ``(batch, T, width)`` for each ``T`` in ``steps``."""
    return tuple(Shape(batch, t, width) for t in steps)


#: The ``cell`` column of the scope ``"scan"`` (its case is the linear recurrence, not a cell).
SCAN_CELL: Final = "scan_diag"
#: The scope ``"scan"``'s default shapes ``(B, T, D)``: wide and narrow channels, long sequences,
#: a large batch and the largest of all (``docs/benchmarks.md``).
SCAN_SHAPES: Final[tuple[Shape, ...]] = (
    Shape(8, 4096, 1536),
    Shape(8, 16384, 256),
    Shape(1, 65536, 256),
    Shape(64, 4096, 1024),
    Shape(8, 65536, 1536),
)
#: The multipliers ``a_t`` of the scope ``"scan"`` are drawn uniformly from this range: inside
#: ``(0, 1)`` as a gate's are, so ``log a_t`` is finite (fla's ``chunk_hgrn`` takes the log-decay
#: ``g = log a``), with memories from 2 to 100 steps.
SCAN_JAC_RANGE: Final = (0.5, 0.99)


def default_device() -> str:
    """``"cuda"`` when a GPU is visible, else ``"cpu"``."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def _default_shapes() -> tuple[Shape, ...]:
    return grid_shapes(8, 256, (1024, 4096, 16384))


def _positive_int(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def _subset(name: str, values: tuple[str, ...], known: tuple[str, ...]) -> None:
    if not values:
        raise ValueError(f"{name} must name at least one of {list(known)}, got none")
    unknown = [v for v in values if v not in known]
    if unknown:
        raise ValueError(f"{name} must be among {list(known)}, got unknown {unknown}")


def _check_shapes(name: str, shapes: tuple[Shape, ...]) -> None:
    if not shapes:
        raise ValueError(f"{name} must hold at least one (B, T, d) shape, got none")
    for shape in shapes:
        if not isinstance(shape, Shape):
            raise ValueError(f"{name} must hold Shape(batch, steps, width), got {shape!r}")
        for field_name, value in zip(("batch", "steps", "width"), shape, strict=True):
            _positive_int(f"shape {field_name}", value)


@dataclass(frozen=True)
class BenchConfig:
    """Everything one harness run does.

    Attributes:
        cells: cell layers to time (keys of :data:`CELLS`).
        methods: registered method names (:func:`~pararnn_examples.bench.method_names`), in the
            order of the table. Each runs in the scopes it serves; every scope must have one.
        shapes: problem sizes ``(B, T, d)`` of the cell scopes.
        dtypes: storage dtypes (keys of :data:`DTYPES`).
        scopes: any of ``"recurrence"``, ``"layer"`` and ``"scan"`` (module docstring); default
            the two cell scopes.
        scan_shapes: problem sizes ``(B, T, D)`` of the scope ``"scan"``.
        device: ``"cuda"`` or ``"cpu"``.
        warmup: untimed calls before the timed ones (``>= 1``: the first call compiles kernels).
        repeats: timed calls per case; the median is reported.
        slow_ms: a case whose warm-up call takes longer than this is timed once more and no more
            (a method that compiles nothing, the eager step loop, is timed by that call).
        max_seq_steps: the eager step loop (``sequential_eager``, and the float64 sequential
            reference) runs up to this T; above it the method is recorded as skipped and the
            reference is a float64 Newton solve converged to a residual of 1e-10.
        newton_iters: ``NewtonConfig.max_iters`` of the Newton methods.
        newton_tol: ``NewtonConfig.tol`` of the Newton methods (None: exactly ``newton_iters``).
        newton_stats: ``NewtonConfig.stats`` of the Newton methods, and the ``stats`` of the
            fused sequential method (when its states are checked): ``"sync"`` (the forward reads
            the solve's statistics back before it returns) or ``"deferred"`` (it waits for
            nothing; the statistics are read after the case's first call, and the
            forward+backward's wait moves into the layer's backward) or ``"device"`` (nothing
            waits; the statistics are read after the case's first call).
        cuda_graphs: time every method's calls as replays of a CUDA graph captured after
            the warm-up (the host's launch work left out); a method whose capture fails is
            timed by ordinary calls, and its records say why. Needs ``device="cuda"`` and
            ``newton_stats="device"``.
        projection: the cells' input projection (``proj.backend`` of every method's cell):
            ``"auto"`` (the cells' default: float32 GPU products on the tensor cores,
            ``pararnn_kernels.linear_tf32x3``) or ``"eager"`` (``F.linear``).
        copy_bytes: size of the buffer whose device-to-device copy measures the bandwidth
            (None: 4 GiB on CUDA, 64 MiB on the CPU).
        seed: seeds parameters, inputs and cotangents of every case.
        fail_fast: re-raise an unexpected error instead of recording it and going on.
    """

    cells: tuple[str, ...] = tuple(CELLS)
    methods: tuple[str, ...] = field(default_factory=method_names)
    shapes: tuple[Shape, ...] = field(default_factory=_default_shapes)
    dtypes: tuple[str, ...] = ("fp32",)
    scopes: tuple[str, ...] = CELL_SCOPES
    scan_shapes: tuple[Shape, ...] = SCAN_SHAPES
    device: str = field(default_factory=default_device)
    warmup: int = 3
    repeats: int = 10
    slow_ms: float = 500.0
    max_seq_steps: int = 4096
    newton_iters: int = pc.NewtonConfig().max_iters
    newton_tol: float | None = None
    newton_stats: Literal["sync", "deferred", "device"] = "sync"
    cuda_graphs: bool = False
    projection: str = "auto"
    copy_bytes: int | None = None
    seed: int = 0
    fail_fast: bool = False

    def __post_init__(self) -> None:
        _subset("cells", self.cells, tuple(CELLS))
        _subset("methods", self.methods, method_names())
        _subset("dtypes", self.dtypes, tuple(DTYPES))
        _subset("scopes", self.scopes, SCOPES)
        for scope in self.scopes:
            if not any(scope in get_method(m).scopes for m in self.methods):
                raise ValueError(
                    f"methods must include one serving scope {scope!r} "
                    f"(one of {list(method_names(scope))}), got {list(self.methods)}"
                )
        _check_shapes("shapes", self.shapes)
        _check_shapes("scan_shapes", self.scan_shapes)
        if self.device not in ("cuda", "cpu"):
            raise ValueError(f"device must be 'cuda' or 'cpu', got {self.device!r}")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ValueError(
                "device must be 'cpu' on this machine: device='cuda' was asked for but "
                "torch.cuda.is_available() is False"
            )
        for name in ("warmup", "repeats", "max_seq_steps", "newton_iters"):
            _positive_int(name, getattr(self, name))
        if not (isinstance(self.slow_ms, int | float) and self.slow_ms > 0):
            raise ValueError(f"slow_ms must be a float > 0, got {self.slow_ms!r}")
        if self.newton_tol is not None and not (
            isinstance(self.newton_tol, int | float) and self.newton_tol >= 0
        ):
            raise ValueError(f"newton_tol must be None or a float >= 0, got {self.newton_tol!r}")
        if self.newton_stats not in NEWTON_STATS:
            raise ValueError(
                f"newton_stats must be one of {list(NEWTON_STATS)}, got {self.newton_stats!r}"
            )
        if self.cuda_graphs and self.device != "cuda":
            raise ValueError(f"cuda_graphs needs device='cuda', got device={self.device!r}")
        if self.projection not in PROJECTION_BACKENDS:
            raise ValueError(
                f"projection must be one of {list(PROJECTION_BACKENDS)}, got {self.projection!r}"
            )
        if self.cuda_graphs and self.newton_stats != "device":
            raise ValueError(
                "cuda_graphs needs newton_stats='device' (the other modes wait for the "
                f"device, which a graph cannot hold), got {self.newton_stats!r}"
            )
        if self.copy_bytes is not None:
            _positive_int("copy_bytes", self.copy_bytes)

    @property
    def torch_device(self) -> torch.device:
        """:attr:`device` as a ``torch.device``."""
        return torch.device(self.device)


@dataclass(frozen=True)
class Case:
    """One cell layer at one shape, dtype and scope, on one device.

    Attributes:
        cell: key of :data:`CELLS`, or :data:`SCAN_CELL` in scope ``"scan"``.
        shape: ``(B, T, d)``.
        dtype: key of :data:`DTYPES`.
        scope: ``"recurrence"``, ``"layer"`` or ``"scan"``.
        device: where every tensor of the case lives.
    """

    cell: str
    shape: Shape
    dtype: str
    scope: str
    device: torch.device

    @property
    def torch_dtype(self) -> torch.dtype:
        """The storage dtype."""
        return DTYPES[self.dtype]


@dataclass(frozen=True)
class CaseInputs:
    """The tensors every method of one case shares.

    Attributes:
        cell: the layer's cell (scope ``"layer"``) or its :func:`recurrence_view` (scope
            ``"recurrence"``), in the storage dtype, on the case's device.
        inputs: a leaf that requires grad: ``x [B, T, d]`` (layer) or ``u [B, T, d_u]``
            (recurrence). Forward-only calls run under ``torch.no_grad()``; the harness clears
            ``inputs.grad`` after each method.
        cotangent: ``∂L/∂output``: ``[B, T, d_h]`` (layer: the cell's output ``cell.output(H)``,
            also the shape of ``nn.GRU``'s output) or ``[B, T, *S]`` (recurrence: the states).
    """

    cell: pc.ParaCell
    inputs: Tensor
    cotangent: Tensor


@dataclass(frozen=True)
class ScanInputs:
    """The tensors every method of one ``"scan"`` case shares.

    The recurrence is ``y_t = jac_t ⊙ y_{t-1} + rhs_t``, ``y_{-1} = 0`` (``scan_diag``'s). A peer
    whose layout or parametrisation differs converts these once, in its builder, outside the
    timed calls.

    Attributes:
        jac: ``[B, T, D]`` multipliers in :data:`SCAN_JAC_RANGE`, a leaf that requires grad.
        rhs: ``[B, T, D]`` offsets, a leaf that requires grad.
        cotangent: ``[B, T, D]``: ``∂L/∂y`` for the forward+backward.
    """

    jac: Tensor
    rhs: Tensor
    cotangent: Tensor


def make_scan_inputs(case: Case) -> ScanInputs:
    """The shared tensors of a ``"scan"`` case, drawn from the current RNG in float32 and rounded
    to the storage dtype (so every dtype of one run gets the same problem up to rounding)."""
    batch, steps, width = case.shape
    low, high = SCAN_JAC_RANGE
    dtype = case.torch_dtype
    jac = torch.empty(batch, steps, width, device=case.device).uniform_(low, high)
    rhs = torch.randn(batch, steps, width, device=case.device)
    cotangent = torch.randn(batch, steps, width, device=case.device)
    return ScanInputs(
        jac.to(dtype).requires_grad_(True), rhs.to(dtype).requires_grad_(True), cotangent.to(dtype)
    )


def recurrence_view(cell: pc.ParaCell) -> pc.ParaCell:
    """A copy of ``cell`` whose input projection is the identity: it runs ``u [B, T, d_u]``.

    The built-in cells project with ``self.proj`` (an ``nn.Linear``); the copy replaces it with
    ``nn.Identity`` and sets ``d_in = d_u``, so :func:`pararnn_core.newton_apply` and
    :func:`pararnn_core.sequential_apply` accept ``u`` and solve the same recurrence with the same
    recurrent parameters, without the GEMM. Raises ValueError for a cell without ``proj``.
    """
    if not isinstance(getattr(cell, "proj", None), nn.Module):
        raise ValueError(
            f"cell must project its input with a 'proj' submodule to be benchmarked in scope "
            f"'recurrence', got {type(cell).__name__} without one"
        )
    view = copy.deepcopy(cell)
    view.proj = nn.Identity()
    view.d_in = view.d_u
    return view


def make_case_inputs(case: Case, layer_cell: pc.ParaCell, x: Tensor, grad_y: Tensor) -> CaseInputs:
    """The shared tensors of ``case`` from the layer's cell and its input and output cotangent.

    Args:
        case: the case (its scope decides what the methods receive).
        layer_cell: the cell with its projection, in the storage dtype.
        x: ``[B, T, d]`` layer input.
        grad_y: ``[B, T, d_h]`` cotangent of the layer output.

    Returns:
        For scope ``"layer"``: ``(layer_cell, x, grad_y)``; for ``"recurrence"``:
        ``(recurrence_view(layer_cell), u = layer_cell.project(x), grad_states)`` with
        ``grad_states [B, T, *S]`` drawn from the current RNG.
    """
    if case.scope == "layer":
        return CaseInputs(layer_cell, x.detach().requires_grad_(True), grad_y)
    with torch.no_grad():
        u = layer_cell.project(x).contiguous()
    batch, steps = x.shape[:2]
    grad_states = torch.randn(batch, steps, *layer_cell.state_shape, device=x.device, dtype=x.dtype)
    return CaseInputs(recurrence_view(layer_cell), u.requires_grad_(True), grad_states)
