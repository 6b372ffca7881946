"""The built-in methods: the ParaRNN paths and cuDNN, registered on import.

=====================  ===========================================================================
``newton_fused``       ``newton_apply(cell, x, config=NewtonConfig(scan_backend="fused"))``
``newton_unfused``     the same with ``scan_backend="triton"`` (``"eager"`` on the CPU)
``newton_auto``        the same with ``scan_backend="auto"``: what ``ParaRNN`` runs by default (on
                       CUDA the cost model's pick of fused Newton or the fused sequential kernel,
                       recorded in ``scan_backend``)
``sequential_fused``   ``pararnn_core.fused_sequential_apply(cell, x, stats=...)``, when that
                       function exists; ``stats`` as the Newton methods' (``--newton-stats``),
                       so both sides of a ratio wait for the device alike
``sequential_eager``   ``pararnn_core.sequential_apply``: the Python step loop (T <= max_seq_steps)
``cudnn``              ``nn.GRU`` (ParaGRU) / ``nn.LSTM`` (ParaLSTM) of the same width, batch_first;
                       CUDA and scope ``"layer"`` only
``scan_diag_triton``   scope ``"scan"``: ``pararnn_kernels.scan_diag(jac, rhs, backend="triton")``
                       (CUDA, or the CPU under ``TRITON_INTERPRET=1``)
``scan_diag_eager``    scope ``"scan"``: the same with ``backend="eager"`` (pure torch, log-depth)
=====================  ===========================================================================

The ParaRNN methods return the states ``[B, T, *S]`` and are checked against one float64
reference per case: the sequential recurrence of a float64 copy of the cell on the same inputs
(``T <= max_seq_steps``), or above that a float64 Newton solve run until its residual
``max |f(h_{t-1}, u_t) - h_t|`` is at most 1e-10 (a fixed point of the recurrence is its unique
solution, so the residual check makes it exact to ~1e-9 whatever the solver). cuDNN's output
``[B, T, d]`` is checked against a float64 copy of the same ``nn.GRU``/``nn.LSTM`` run by
PyTorch's native (non-cuDNN) implementation. The scans of scope ``"scan"`` (ours and the peers')
are checked against :func:`scan_reference`, the float64 step loop on the same ``jac`` and ``rhs``.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable
from typing import Final

import torch
from torch import Tensor, nn

import pararnn_core as pc
from pararnn_kernels import scan_diag, sequential_scan_diag
from pararnn_kernels.dispatch import resolve_scan_backend, triton_interpret_mode

from .cases import CELLS, BenchConfig, Case, CaseInputs, ScanInputs
from .registry import Method, Reference, Runner, register_method

__all__ = ["FUSED_SEQUENTIAL_NAME", "SCAN_REFERENCE_KEY", "pararnn_reference", "scan_reference"]

#: The fused sequential kernel's public name in pararnn_core, looked up at run time:
#: ``fused_sequential_apply(cell, x, h0=None, *, stats="device") -> states [B, T, *S]`` (a
#: version without the ``stats`` keyword is called without it).
FUSED_SEQUENTIAL_NAME: Final = "fused_sequential_apply"
#: Residual the float64 Newton reference must reach, and its iteration budget.
_REFERENCE_TOL: Final = 1e-10
_REFERENCE_MAX_ITERS: Final = 64
#: Relative tolerance of an fp32 check when the method multiplies in TF32.
_TF32_TOLERANCE: Final = 1e-2

#: ``(cell, inputs) -> (states [B, T, *S], stats or None)``.
ApplyFn = Callable[[pc.ParaCell, Tensor], tuple[Tensor, pc.NewtonStats | None]]

_CUDNN_LAYERS: Final[dict[str, type[nn.GRU] | type[nn.LSTM]]] = {
    "ParaGRU": nn.GRU,
    "ParaLSTM": nn.LSTM,
}


def pararnn_reference(cell: pc.ParaCell, inputs: Tensor, config: BenchConfig) -> Reference:
    """The float64 states of ``cell`` on ``inputs`` (see the module docstring).

    Args:
        cell: the case's cell (any dtype; a float64 copy is made).
        inputs: ``[B, T, d_in]``.
        config: its ``max_seq_steps`` picks sequential or Newton.

    Returns:
        ``states [B, T, *S]`` in float64 on the CPU, and the kind.

    Raises:
        RuntimeError: the Newton reference did not reach its residual.
    """
    cell64 = copy.deepcopy(cell).to(torch.float64)
    x64 = inputs.detach().to(torch.float64)
    with torch.no_grad():
        if inputs.shape[1] <= config.max_seq_steps:
            return Reference(pc.sequential_apply(cell64, x64).cpu(), "sequential_fp64")
        solver = pc.NewtonConfig(
            max_iters=_REFERENCE_MAX_ITERS, tol=_REFERENCE_TOL, scan_backend="auto"
        )
        states, stats = pc.newton_apply(cell64, x64, config=solver)
    if not stats.max_residual <= _REFERENCE_TOL:
        raise RuntimeError(
            f"the float64 Newton reference stopped at residual {stats.max_residual:.2e} after "
            f"{stats.iters} iterations (needs <= {_REFERENCE_TOL:.0e})"
        )
    return Reference(states.cpu(), f"newton_fp64(iters={stats.iters})")


#: The reference key every method of scope ``"scan"`` shares (one reference per case).
SCAN_REFERENCE_KEY: Final = "scan_fp64"


def scan_reference(inputs: ScanInputs) -> Reference:
    """``y [B, T, D]`` in float64: the step loop ``y_t = jac_t y_{t-1} + rhs_t`` on a float64 copy
    of the case's tensors, on their device (kept there: the check runs there too)."""
    with torch.no_grad():
        jac = inputs.jac.detach().to(torch.float64)
        rhs = inputs.rhs.detach().to(torch.float64)
        y = sequential_scan_diag(jac, rhs)
    return Reference(y, "sequential_fp64")


def _pararnn_runner(
    case: Case, inputs: CaseInputs, config: BenchConfig, apply: ApplyFn, *, compiles: bool = True
) -> Runner:
    cell, source, cotangent = inputs.cell, inputs.inputs, inputs.cotangent
    params = list(cell.parameters())
    layer = case.scope == "layer"
    last: list[pc.NewtonStats | None] = [None]

    def forward() -> Tensor:
        with torch.no_grad():
            states, stats = apply(cell, source)
        last[0] = stats
        return states

    def forward_backward() -> None:
        for p in params:
            p.grad = None
        source.grad = None
        states, _ = apply(cell, source)
        out = cell.output(states) if layer else states
        torch.autograd.backward(out, cotangent)

    # The layer scope's input projection is a matmul: in TF32 under --tf32 on.
    tf32 = layer and case.dtype == "fp32" and bool(torch.backends.cuda.matmul.allow_tf32)
    return Runner(
        forward=forward,
        forward_backward=forward_backward,
        reference=lambda: pararnn_reference(cell, source, config),
        reference_key="pararnn_states",
        stats=lambda: last[0],
        compiles=compiles,
        tolerance=_TF32_TOLERANCE if tf32 else None,
    )


def _newton(backend: Callable[[Case], str]) -> Callable[[Case, CaseInputs, BenchConfig], Runner]:
    def build(case: Case, inputs: CaseInputs, config: BenchConfig) -> Runner:
        solver = pc.NewtonConfig(
            max_iters=config.newton_iters,
            tol=config.newton_tol,
            scan_backend=backend(case),
            stats=config.newton_stats,
        )

        def apply(cell: pc.ParaCell, x: Tensor) -> tuple[Tensor, pc.NewtonStats | None]:
            return pc.newton_apply(cell, x, config=solver)

        return _pararnn_runner(case, inputs, config, apply)

    return build


def _unfused_backend(case: Case) -> str:
    # Triton needs CUDA; on the CPU the unfused path is the pure-torch log-depth scan.
    return "triton" if case.device.type == "cuda" else "eager"


def _fused_sequential() -> Callable[..., Tensor] | None:
    found = getattr(pc, FUSED_SEQUENTIAL_NAME, None)
    return found if callable(found) else None


def _fused_available(case: Case, config: BenchConfig) -> str | None:
    """Why the fused kernels cannot run this case (None when they can)."""
    has = getattr(pc, "has_fused_kernels", None)
    cell = CELLS[case.cell](2, 2) if case.cell in CELLS else None
    if has is None or cell is None or not has(cell):
        return f"no fused kernels for {case.cell} in pararnn-core {pc.__version__}"
    if case.device.type != "cuda" and not triton_interpret_mode():
        return (
            f"the fused kernels run on CUDA (or under TRITON_INTERPRET=1); device is {case.device}"
        )
    if case.torch_dtype == torch.float64:
        return "the fused kernels store float32, float16 or bfloat16"
    return None


def _fused_sequential_available(case: Case, config: BenchConfig) -> str | None:
    if _fused_sequential() is None:
        return (
            f"pararnn_core.{FUSED_SEQUENTIAL_NAME} does not exist in pararnn-core "
            f"{pc.__version__} (the fused sequential kernels are not there yet)"
        )
    return _fused_available(case, config)


def _build_fused_sequential(case: Case, inputs: CaseInputs, config: BenchConfig) -> Runner:
    fn = _fused_sequential()
    if fn is None:
        raise NotImplementedError(_fused_sequential_available(case, config))

    # The divergence check waits for the device as the Newton methods' statistics do: with
    # "sync" the forward reads it back, as a training layer whose "auto" picks this kernel does.
    options = {"stats": config.newton_stats} if _takes_stats(fn) else {}

    def apply(cell: pc.ParaCell, x: Tensor) -> tuple[Tensor, pc.NewtonStats | None]:
        states: Tensor = fn(cell, x, **options)
        return states, None

    return _pararnn_runner(case, inputs, config, apply)


def _takes_stats(fn: Callable[..., Tensor]) -> bool:
    try:
        return "stats" in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # pragma: no cover - a builtin without a signature
        return False


def _sequential_eager_available(case: Case, config: BenchConfig) -> str | None:
    if case.shape.steps > config.max_seq_steps:
        return (
            f"T={case.shape.steps} > max_seq_steps={config.max_seq_steps}: the eager step loop "
            "is not timed above it (--max-seq-steps)"
        )
    return None


def _build_sequential_eager(case: Case, inputs: CaseInputs, config: BenchConfig) -> Runner:
    def apply(cell: pc.ParaCell, x: Tensor) -> tuple[Tensor, pc.NewtonStats | None]:
        return pc.sequential_apply(cell, x), None

    return _pararnn_runner(case, inputs, config, apply, compiles=False)


def _cudnn_available(case: Case, config: BenchConfig) -> str | None:
    if case.device.type != "cuda":
        return f"cuDNN runs on CUDA only (device is {case.device.type})"
    if not torch.backends.cudnn.is_available():  # type: ignore[no-untyped-call]
        return "torch.backends.cudnn is not available in this PyTorch build"
    if case.cell not in _CUDNN_LAYERS:
        return f"torch.nn has no cuDNN counterpart of {case.cell}"
    if case.scope != "layer":
        return (
            "nn.GRU/nn.LSTM always apply their input projection: cuDNN is timed in scope "
            "'layer' only"
        )
    return None


def _build_cudnn(case: Case, inputs: CaseInputs, config: BenchConfig) -> Runner:
    width = case.shape.width
    rnn = _CUDNN_LAYERS[case.cell](
        width, width, batch_first=True, device=case.device, dtype=case.torch_dtype
    )
    x, cotangent = inputs.inputs, inputs.cotangent
    params = list(rnn.parameters())

    def forward() -> Tensor:
        with torch.no_grad():
            out: Tensor = rnn(x)[0]
        return out

    def forward_backward() -> None:
        for p in params:
            p.grad = None
        x.grad = None
        out: Tensor = rnn(x)[0]
        torch.autograd.backward(out, cotangent)

    def reference() -> Reference:
        rnn64 = copy.deepcopy(rnn).to(torch.float64)
        # PyTorch's native kernels, not cuDNN: an independent implementation of the same layer.
        with torch.no_grad(), torch.backends.cudnn.flags(enabled=False):
            out: Tensor = rnn64(x.detach().to(torch.float64))[0]
        return Reference(out.cpu(), "torch_native_fp64")

    # With PyTorch's default torch.backends.cudnn.allow_tf32 = True, cuDNN's fp32 RNN multiplies
    # in TF32 (10-bit mantissa): the check allows for that instead of flagging it.
    tf32 = case.dtype == "fp32" and bool(torch.backends.cudnn.allow_tf32)
    return Runner(
        forward,
        forward_backward,
        reference,
        reference_key="cudnn_output",
        tolerance=_TF32_TOLERANCE if tf32 else None,
    )


def _scan_diag_triton_available(case: Case, config: BenchConfig) -> str | None:
    try:
        resolve_scan_backend("triton", case.device, case.torch_dtype)
    except ValueError as err:
        return str(err)
    return None


def _scan_diag(backend: str) -> Callable[[Case, ScanInputs, BenchConfig], Runner]:
    def build(case: Case, inputs: ScanInputs, config: BenchConfig) -> Runner:
        jac, rhs, cotangent = inputs.jac, inputs.rhs, inputs.cotangent

        def forward() -> Tensor:
            with torch.no_grad():
                return scan_diag(jac, rhs, backend=backend)

        def forward_backward() -> None:
            jac.grad = None
            rhs.grad = None
            torch.autograd.backward(scan_diag(jac, rhs, backend=backend), cotangent)

        return Runner(
            forward,
            forward_backward,
            reference=lambda: scan_reference(inputs),
            reference_key=SCAN_REFERENCE_KEY,
        )

    return build


def _register_builtins() -> None:
    register_method(
        Method(
            "newton_fused",
            'newton_apply with NewtonConfig(scan_backend="fused"): the fused Newton kernels',
            _newton(lambda case: "fused"),
            _fused_available,
        )
    )
    register_method(
        Method(
            "newton_unfused",
            'newton_apply with scan_backend="triton" ("eager" on the CPU): unfused Newton + scans',
            _newton(_unfused_backend),
        )
    )
    register_method(
        Method(
            "newton_auto",
            'newton_apply with scan_backend="auto": the default path (the cost model\'s pick)',
            _newton(lambda case: "auto"),
        )
    )
    register_method(
        Method(
            "sequential_fused",
            f"pararnn_core.{FUSED_SEQUENTIAL_NAME}: the fused sequential kernel (when it exists)",
            _build_fused_sequential,
            _fused_sequential_available,
        )
    )
    register_method(
        Method(
            "sequential_eager",
            "pararnn_core.sequential_apply: the Python step loop (T <= --max-seq-steps)",
            _build_sequential_eager,
            _sequential_eager_available,
        )
    )
    register_method(
        Method(
            "cudnn",
            "nn.GRU / nn.LSTM of the same width, batch_first (CUDA, scope 'layer')",
            _build_cudnn,
            _cudnn_available,
        )
    )
    register_method(
        Method(
            "scan_diag_triton",
            "scope 'scan': pararnn_kernels.scan_diag(jac, rhs, backend='triton')",
            _scan_diag("triton"),
            _scan_diag_triton_available,
            scopes=("scan",),
        )
    )
    register_method(
        Method(
            "scan_diag_eager",
            "scope 'scan': pararnn_kernels.scan_diag(jac, rhs, backend='eager'), pure torch",
            _scan_diag("eager"),
            scopes=("scan",),
        )
    )


_register_builtins()
