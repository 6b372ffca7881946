"""Compile every Triton kernel the package launches for an sm_90 GPU, on a machine without one.

The CPU CI runs the kernels in the Triton interpreter, which accepts programs the GPU compiler
rejects. This module closes that gap without a GPU, in three steps:

1. **Record.** ``torch.library.wrap_triton`` (through which every launcher launches) is replaced
   by a recorder, and the launchers -- ``pararnn_kernels.scan.launch`` and the fused-layer
   launchers that the public fused ops share -- are called on CPU tensors in the configurations
   they use (:func:`record_launches`); a launch then stores the kernel and its arguments instead
   of running. Launchers that go on to compute with the unwritten outputs do so harmlessly.
2. **Specialize.** Each recorded call goes through Triton's own launch binder for a
   ``GPUTarget("cuda", 90, 32)`` backend, so the signature, the constexprs and the attributes
   are what a real launch would build: pointer dtypes, ints equal to 1 folded into constants,
   16-divisible ints and 16-byte-aligned pointers marked (:func:`specialize`). Identical
   specializations compile once.
3. **Compile.** ``triton.compile`` to PTX and, through ``ptxas``, to a cubin, in a fresh Python
   process without ``TRITON_INTERPRET`` (:func:`compile_in_subprocess`): with the variable set
   at import, ``@triton.jit`` makes interpreter objects -- Triton's own helpers included --
   that cannot be compiled, so re-importing the kernel modules in the same process is not
   enough. The worker imports the kernels once and forks one compile process per CPU. It uses
   a private, empty Triton cache, so every configuration really compiles and ``ptxas -v``
   reports its registers and spills.

Run as a script (``python tests/kernels/gpu_compile.py``) it records, compiles and prints the
per-configuration register table, for tuning; ``tests/kernels/test_gpu_compile.py`` is the test.
This proves that the kernels compile for sm_90 with the installed Triton, nothing about their
numbers (the interpreter and ``cuda`` tests check those).
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

import torch

#: The compile target: an H100/H200 (compute capability 9.0, 32-thread warps).
TARGET = ("cuda", 90, 32)
#: The modules holding the ``@triton.jit`` kernels (every ``*_kernel`` in them must be launched).
KERNEL_MODULES = (
    "pararnn_kernels.scan._kernels",
    "pararnn_kernels.fused._kernels",
    "pararnn_kernels.fused._kernels_lstm",
    "pararnn_kernels.fused._kernels_slstm",
    "pararnn_kernels.linear._kernels",
)

#: Tensor dtypes the launchers pass (storage dtypes, float32 workspaces, int32 flags).
_POINTER_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64)


class CompileUnavailable(Exception):
    """The installed Triton cannot compile for the CUDA target here (an environment reason)."""


# ----------------------------------------------------------------------------------------------
# Recording
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorArg:
    """A tensor argument as the binder sees it: its dtype and its address modulo 16 bytes."""

    dtype: str
    misalignment: int


@dataclass(frozen=True)
class DescriptorArg:
    """A TMA tensor descriptor argument: its tensor's rank, dtype and address modulo 16 bytes
    and the block it moves (the binder specializes on the dtype and block only)."""

    tensor: TensorArg
    rank: int
    block_shape: tuple[int, ...]


@dataclass(frozen=True)
class Launch:
    """One recorded kernel launch: the kernel (module and name), arguments and keywords."""

    module: str
    kernel: str
    args: tuple[Any, ...]
    kwargs: tuple[tuple[str, Any], ...]
    origin: str = field(default="", compare=False)

    def to_json(self) -> dict[str, Any]:
        def enc(value: Any) -> Any:
            if isinstance(value, TensorArg):
                return {"tensor": value.dtype, "misalignment": value.misalignment}
            if isinstance(value, DescriptorArg):
                return {"descriptor": enc(value.tensor), "rank": value.rank,
                        "block": list(value.block_shape)}  # fmt: skip
            return value

        return {
            "module": self.module,
            "kernel": self.kernel,
            "args": [enc(a) for a in self.args],
            "kwargs": [[k, enc(v)] for k, v in self.kwargs],
            "origin": self.origin,
        }

    @staticmethod
    def from_json(data: dict[str, Any]) -> Launch:
        def dec(value: Any) -> Any:
            if isinstance(value, dict) and "descriptor" in value:
                return DescriptorArg(dec(value["descriptor"]), value["rank"], tuple(value["block"]))
            if isinstance(value, dict):
                return TensorArg(value["tensor"], value["misalignment"])
            return value

        return Launch(
            data["module"],
            data["kernel"],
            tuple(dec(a) for a in data["args"]),
            tuple((k, dec(v)) for k, v in data["kwargs"]),
            data["origin"],
        )


def _describe(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        if value.dtype not in _POINTER_DTYPES:
            raise TypeError(f"a kernel argument of {value.dtype}, which no launcher passes")
        return TensorArg(str(value.dtype).removeprefix("torch."), value.data_ptr() % 16)
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if type(value).__name__ == "TensorDescriptor":
        return DescriptorArg(_describe(value.base), len(value.shape), tuple(value.block_shape))
    raise TypeError(f"cannot record a kernel argument of type {type(value).__name__}")


class _Recorder:
    def __init__(self) -> None:
        self.launches: list[Launch] = []
        self.origin = ""

    def wrap_triton(self, kernel: Any) -> Any:
        recorder = self

        class _Grid:
            def __getitem__(self, grid: Any) -> Callable[..., None]:
                def launch(*args: Any, **kwargs: Any) -> None:
                    fn = kernel.fn  # JITFunction and InterpretedFunction both keep the function
                    recorder.launches.append(
                        Launch(
                            fn.__module__,
                            fn.__name__,
                            tuple(_describe(a) for a in args),
                            tuple((k, _describe(v)) for k, v in kwargs.items()),
                            recorder.origin,
                        )
                    )

                return launch

        return _Grid()


@contextlib.contextmanager
def _recording() -> Iterator[_Recorder]:
    from pararnn_kernels.fused import _layer

    recorder = _Recorder()
    # The fused launchers accept CPU tensors only in interpreter mode; nothing runs here.
    with (
        mock.patch.object(torch.library, "wrap_triton", recorder.wrap_triton),
        mock.patch.object(_layer, "triton_interpret_mode", return_value=True),
    ):
        yield recorder


# Which configurations are recorded. One compile takes 0.4-14 s of a CPU core, so the cross
# product is cut to what can fail on its own: every constexpr value of every kernel in each
# pass (on the default launch plans), every launch plan (methods, tiles, narrow and wide shapes,
# segments), every kernel and pass in bfloat16 storage, and the default scan plans at sizes
# without divisibility hints. float16 takes the bfloat16 code paths and is not recorded, nor is
# the testing knob inclusive_every > 1.

#: (h0, reverse, adjoint) cases of a scan: HAS_H0 and REVERSE take both values in the forward
#: and in the adjoint pass (the adjoint runs with REVERSE = not reverse).
SCAN_CASES = ((True, False, False), (False, True, False), (True, False, True), (False, True, True))
#: With h0, one forward and one adjoint: for launch plans that only an override picks.
SCAN_CASES_H0 = (SCAN_CASES[0], SCAN_CASES[2])


def _scan_diag_launches(rec: _Recorder) -> None:
    from pararnn_kernels.scan import launch

    def run(
        dtype: torch.dtype,
        cases: Sequence[tuple[bool, bool, bool]],
        shape: tuple[int, int, int],
        **plan: Any,
    ) -> None:
        jac = torch.empty(*shape, dtype=dtype)
        h0 = torch.empty(shape[0], shape[2], dtype=dtype)
        for with_h0, reverse, adjoint in cases:
            rec.origin = f"scan_diag {dtype} {shape} {plan} h0={with_h0} reverse={reverse}"
            start = h0 if with_h0 else None
            if adjoint:
                launch.triton_scan_diag_backward(jac, jac, start, jac, reverse=reverse, **plan)
            else:
                launch.triton_scan_diag(jac, jac, start, reverse=reverse, **plan)

    cpu = torch.device("cpu")
    for dtype in (torch.float32, torch.bfloat16):
        default = launch.plan_scan_diag(2, 1024, 128, cpu, dtype=dtype).method
        for method in ("tiles", "lookback", "chunked", "twopass", "streamed"):
            cases = SCAN_CASES if method in (default, "streamed") else SCAN_CASES_H0
            run(dtype, cases, (2, 1024, 128), method=method)
        # The default plan at T and D that are not multiples of 16, in one channel block: no
        # divisibility hints, n_cols_d folded to 1 (the adjoint, the larger program).
        run(dtype, SCAN_CASES_H0[1:], (3, 1000, 50))
    # The tiles kernel with the windowed look-back walk (its default walks one tile per round
    # trip; the per-thread-runs kernel's default is the window).
    run(torch.float32, SCAN_CASES_H0[:1], (2, 1024, 128), method="tiles", window=16)


def _scan_block_launches(rec: _Recorder) -> None:
    from pararnn_kernels.scan import launch

    for k in (2, 3, 4):
        for dtype, cases in ((torch.float32, SCAN_CASES), (torch.bfloat16, SCAN_CASES_H0)):
            jac = torch.empty(2, 256, 32, k, k, dtype=dtype)
            rhs = torch.empty(2, 256, 32, k, dtype=dtype)
            h0 = torch.empty(2, 32, k, dtype=dtype)
            for with_h0, reverse, adjoint in cases:
                rec.origin = f"scan_block_diag {dtype} k={k} h0={with_h0} reverse={reverse}"
                start = h0 if with_h0 else None
                if adjoint:
                    launch.triton_scan_block_diag_backward(jac, rhs, start, rhs, reverse=reverse)
                else:
                    launch.triton_scan_block_diag(jac, rhs, start, reverse=reverse)


def _fused_launches(rec: _Recorder) -> None:
    from pararnn_kernels.fused import _layer
    from pararnn_kernels.fused.gru import GRU
    from pararnn_kernels.fused.lstm import LSTM
    from pararnn_kernels.fused.slstm import SLSTM

    # (B, T, D): B·D small (narrow tiles, long backward chunks) and B·D >= 2^15 (wide tiles).
    narrow, wide = (2, 1024, 64), (64, 128, 512)
    for spec in (GRU, LSTM, SLSTM):
        for dtype in (torch.float32, torch.bfloat16):
            for shape in (narrow, wide) if dtype == torch.float32 else (narrow,):
                batch, steps, channels = shape
                u = torch.empty(batch, steps, len(spec.gates) * channels, dtype=dtype)
                weights = [
                    torch.empty(len(rows), channels, dtype=dtype) for _, rows in spec.weights
                ]
                h0 = torch.empty(batch, *spec.state_tail(channels), dtype=dtype)
                states = torch.empty(batch, steps, *spec.state_tail(channels), dtype=dtype)
                where = f"{spec.name} {dtype} B={batch} T={steps} D={channels}"
                # The default plan (one segment: the CPU counts as 4 multiprocessors) from each
                # initial guess; 4 segments, chained on the device, from one step's guess and
                # the uncoupled one (bfloat16: the first of these only; wide: the default only).
                segmented = _layer.plan_fused(spec, batch, steps, channels, u.device, segments=4)
                runs: list[tuple[_layer.FusedPlan | None, str]] = [(segmented, "step")]
                if dtype == torch.float32:
                    runs = [
                        *((None, guess) for guess in ("step", "initial_state", "uncoupled")),
                        *runs,
                        (segmented, "uncoupled"),
                    ]
                if shape == wide:
                    runs = [(None, "step")]
                for plan, guess in runs:
                    rec.origin = f"{spec.name} newton {where} {plan} guess={guess}"
                    _layer.newton(
                        spec,
                        u,
                        weights,
                        h0,
                        max_iters=3,
                        tol=None,
                        omega=1.0,
                        initial_guess=guess,  # type: ignore[arg-type]
                        plan=plan,
                    )
                rec.origin = f"{spec.name} backward {where}"
                _layer.backward(
                    spec, u, weights, h0, states, states, block_t=None, block_d=None, num_warps=None
                )
                rec.origin = f"{spec.name} sequential {where}"
                _layer.sequential(spec, u, weights, None, block_d=None)


def _linear_launches(rec: _Recorder) -> None:
    from pararnn_kernels.linear import ops

    # A projection's forward (with its bias) and input gradient (the weight copied to be
    # contiguous along the reduction, as the backward does), and a split reduction.
    x, weight, bias = torch.empty(1100, 96), torch.empty(200, 96), torch.empty(200)
    grad_y = torch.empty(1100, 200)
    rec.origin = "linear_tf32x3 forward"
    ops._matmul(x, weight.t(), bias)
    rec.origin = "linear_tf32x3 grad x"
    ops._matmul(grad_y, weight.t().contiguous().t())
    rec.origin = "linear_tf32x3 split reduction"
    ops._matmul(torch.empty(20, 1100), torch.empty(24, 1100).t())
    # The weight gradient: bf16x6 products on the operands as stored (both reduce along rows).
    rec.origin = "linear_tf32x3 grad weight"
    ops._matmul(grad_y.t(), x, precision="bf16x6")
    # The plan of compute capability 9.x (64 steps of the reduction per stage): the tensors
    # here are the CPU's, whose plan is the other one.
    with mock.patch.object(ops, "device_capability", return_value=(9, 0)):
        rec.origin = "linear_tf32x3 forward, sm_90 plan"
        ops._matmul(x, weight.t(), bias)
        rec.origin = "linear_tf32x3 grad weight, sm_90 plan"
        ops._matmul(grad_y.t(), x, precision="bf16x6")


def record_launches() -> list[Launch]:
    """Every kernel launch of the launchers' configurations, in order (with repeats)."""
    with _recording() as rec:
        _scan_diag_launches(rec)
        _scan_block_launches(rec)
        _fused_launches(rec)
        _linear_launches(rec)
    return rec.launches


def package_kernels() -> set[tuple[str, str]]:
    """``(module, name)`` of every ``*_kernel`` that the kernel modules define."""
    found = set()
    for name in KERNEL_MODULES:
        module = importlib.import_module(name)
        for attr, value in vars(module).items():
            if attr.endswith("_kernel") and hasattr(value, "fn") and value.fn.__module__ == name:
                found.add((name, attr))
    return found


# ----------------------------------------------------------------------------------------------
# Specialization (Triton's launch binder, for the CUDA target)
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Specialized:
    """What ``triton.compile`` gets for one launch (all but ``options`` JSON-friendly)."""

    signature: dict[str, str]
    constexprs: dict[tuple[int, ...], Any]
    attrs: dict[tuple[int, ...], Any]
    options: Any

    def key(self, launch: Launch) -> str:
        """Identical keys compile to the same binary."""
        opts = {k: v for k, v in sorted(vars(self.options).items())}
        return json.dumps(
            [
                launch.module,
                launch.kernel,
                list(self.signature.items()),
                sorted((list(k), v) for k, v in self.constexprs.items()),
                sorted((list(k), v) for k, v in self.attrs.items()),
                repr(opts),
            ],
            default=repr,
        )

    def label(self, launch: Launch) -> str:
        """A readable name: kernel, storage dtype, constexprs, warps, unhinted arguments."""
        names = list(self.signature)
        dtype = next((t[1:] for t in self.signature.values() if t.startswith("*")), "-")
        consts = [f"{names[p[0]]}={_short(v)}" for p, v in self.constexprs.items()]
        unhinted = [
            names[p[0]]
            for p, a in self.attrs.items()
            if not a and self.signature[names[p[0]]] != "constexpr"
        ]
        parts = [launch.kernel, dtype, *consts, f"w{self.options.num_warps}"]
        if unhinted:
            parts.append("nohint=" + "+".join(unhinted))
        return "-".join(parts)


def _short(value: Any) -> str:
    if isinstance(value, bool):
        return str(int(value))
    return str(value)


def _triton_parts() -> dict[str, Any]:
    """The pieces of Triton this needs; :class:`CompileUnavailable` names what is missing."""
    try:
        import triton
        from triton import knobs
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource, make_backend
        from triton.runtime.jit import JITFunction, MockTensor, create_function_from_signature
        from triton.tools.tensor_descriptor import TensorDescriptor
    except ImportError as err:
        raise CompileUnavailable(f"triton cannot be imported for compilation: {err}") from err
    try:
        backend = make_backend(GPUTarget(*TARGET))
    except Exception as err:
        raise CompileUnavailable(
            f"triton {triton.__version__} has no CUDA backend for {TARGET}: {err}"
        ) from err
    if not hasattr(JITFunction, "_pack_args"):
        raise CompileUnavailable(
            f"triton {triton.__version__}'s launch binder differs from the one this test "
            "drives (JITFunction._pack_args is missing)"
        )
    return {
        "triton": triton,
        "knobs": knobs,
        "GPUTarget": GPUTarget,
        "ASTSource": ASTSource,
        "backend": backend,
        "JITFunction": JITFunction,
        "MockTensor": MockTensor,
        "binder": create_function_from_signature,
        "TensorDescriptor": TensorDescriptor,
    }


def check_environment() -> None:
    """Raise :class:`CompileUnavailable` unless the CUDA backend and ``ptxas`` are usable."""
    _triton_parts()
    try:
        from triton.backends.nvidia import compiler as nvidia

        ptxas = nvidia.get_ptxas(TARGET[1])
    except Exception as err:
        raise CompileUnavailable(f"triton finds no ptxas for sm_{TARGET[1]}: {err}") from err
    if ptxas is None or not os.path.exists(ptxas.path):
        raise CompileUnavailable(f"triton finds no ptxas for sm_{TARGET[1]}")


def specialize(launch: Launch, kernel: Any, parts: dict[str, Any]) -> Specialized:
    """Bind ``launch``'s arguments as ``JITFunction.run`` would for the CUDA target."""
    jit_cls, mock_tensor = parts["JITFunction"], parts["MockTensor"]
    if not isinstance(kernel, jit_cls):  # an interpreter object: only the binding is borrowed
        kernel = jit_cls(kernel.fn)

    class _Tensor(mock_tensor):  # type: ignore[misc, valid-type]
        def __init__(self, arg: TensorArg) -> None:
            super().__init__(getattr(torch, arg.dtype))
            self._address = arg.misalignment

        def data_ptr(self) -> int:
            return self._address

    def real(value: Any) -> Any:
        if isinstance(value, TensorArg):
            return _Tensor(value)
        if isinstance(value, DescriptorArg):
            # Shape and strides are runtime values of a descriptor; any consistent ones do.
            shape = [16] * value.rank
            strides = [16 ** (value.rank - 1 - i) for i in range(value.rank)]
            descriptor = parts["TensorDescriptor"]
            return descriptor(_Tensor(value.tensor), shape, strides, list(value.block_shape))
        return value

    args = [real(a) for a in launch.args]
    kwargs = {k: real(v) for k, v in launch.kwargs}
    # As JITFunction.run fills them in before binding.
    knobs = parts["knobs"]
    kwargs["debug"] = kwargs.get("debug", kernel.debug) or knobs.runtime.debug
    for name in ("instrumentation_mode", "fpsan_homomorphic_casts"):
        if hasattr(knobs.compilation, name):
            kwargs[name] = getattr(knobs.compilation, name)
    backend = parts["backend"]
    binder = parts["binder"](kernel.signature, kernel.params, backend)
    bound, specialization, options = binder(*args, **kwargs)
    with warnings.catch_warnings():  # Triton 3.9's notice that its FP-fusion default will change
        warnings.filterwarnings("ignore", message="TRITON_DEFAULT_FP_FUSION", category=UserWarning)
        options, signature, constexprs, attrs = kernel._pack_args(
            backend, kwargs, bound, specialization, options
        )
    return Specialized(signature, constexprs, attrs, options)


def distinct_launches(launches: Sequence[Launch]) -> dict[str, tuple[Launch, Specialized]]:
    """The launches that compile to different binaries, by :meth:`Specialized.label`."""
    parts = _triton_parts()
    seen: dict[str, str] = {}
    out: dict[str, tuple[Launch, Specialized]] = {}
    for launch in launches:
        kernel = getattr(importlib.import_module(launch.module), launch.kernel)
        spec = specialize(launch, kernel, parts)
        key = spec.key(launch)
        if key in seen:
            continue
        label = spec.label(launch)
        while label in out:  # same readable label, different binary: keep both
            label += "+"
        seen[key] = label
        out[label] = (launch, spec)
    return out


# ----------------------------------------------------------------------------------------------
# Compilation (in the worker)
# ----------------------------------------------------------------------------------------------

_REGS = re.compile(r"Used (\d+) registers")
_SPILLS = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")


def _compile_one(launch: Launch, parts: dict[str, Any]) -> dict[str, Any]:
    start = time.perf_counter()
    kernel = getattr(importlib.import_module(launch.module), launch.kernel)
    if not isinstance(kernel, parts["JITFunction"]):
        return {"ok": False, "error": f"{launch.kernel} is a {type(kernel).__name__}, not JIT"}
    log = io.StringIO()
    try:
        spec = specialize(launch, kernel, parts)
        src = parts["ASTSource"](kernel, spec.signature, spec.constexprs, spec.attrs)
        with contextlib.redirect_stdout(log):  # ptxas -v (TRITON_DUMP_PTXAS_LOG) lands here
            compiled = parts["triton"].compile(
                src, target=parts["GPUTarget"](*TARGET), options=vars(spec.options)
            )
        if not compiled.asm.get("ptx") or not compiled.asm.get("cubin"):
            return {"ok": False, "error": "compiled without PTX or cubin"}
    except Exception as err:
        return {"ok": False, "error": f"{type(err).__name__}: {err}"}
    text = log.getvalue()
    regs, spills = _REGS.search(text), _SPILLS.search(text)
    return {
        "ok": True,
        "seconds": time.perf_counter() - start,
        "registers": int(regs.group(1)) if regs else None,
        "spill_stores": int(spills.group(1)) if spills else None,
        "spill_loads": int(spills.group(2)) if spills else None,
        "shared": compiled.metadata.shared,
        "num_warps": compiled.metadata.num_warps,
    }


_PARTS: dict[str, Any] = {}


def _compile_job(launch_json: dict[str, Any]) -> dict[str, Any]:
    return _compile_one(Launch.from_json(launch_json), _PARTS)


def _worker(in_path: str, out_path: str, workers: int) -> None:
    """The subprocess: import the kernels, compile every job in forked processes, write JSON."""
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        raise RuntimeError("the compile worker must run without TRITON_INTERPRET=1")
    _PARTS.update(_triton_parts())
    for name in KERNEL_MODULES:  # imported once, before the fork
        importlib.import_module(name)
    with open(in_path) as f:
        jobs: dict[str, dict[str, Any]] = json.load(f)
    results: dict[str, dict[str, Any]] = {}
    context = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(workers, mp_context=context) as pool:
        futures = {pool.submit(_compile_job, job): label for label, job in jobs.items()}
        for future in as_completed(futures):
            try:
                results[futures[future]] = future.result()
            except Exception as err:  # a compiler crash takes its process down
                results[futures[future]] = {"ok": False, "error": f"{type(err).__name__}: {err}"}
            with open(out_path, "w") as f:  # what finished survives a hang of the rest
                json.dump(results, f)


def compile_in_subprocess(
    launches: dict[str, Launch], *, workers: int | None = None, timeout: float = 600.0
) -> tuple[dict[str, dict[str, Any]], str]:
    """Compile ``{label: launch}`` for :data:`TARGET` in a fresh Python without
    ``TRITON_INTERPRET``; it forks ``workers`` compile processes (default: one per usable CPU,
    at most 8).

    Returns the results by label (each has ``"ok"`` and either ``"error"`` or the compile time,
    registers and spills of ``ptxas -v``) and the worker's exit status and output tail, for
    labels without a result (the worker died or ran past ``timeout``).
    """
    if workers is None:
        usable = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
        workers = min(8, len(usable) if usable else os.cpu_count() or 1)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DUMP_PTXAS_LOG"] = "1"
    with tempfile.TemporaryDirectory(prefix="pararnn-gpu-compile-") as tmp:
        env["TRITON_CACHE_DIR"] = os.path.join(tmp, "cache")
        in_path, out_path = os.path.join(tmp, "in.json"), os.path.join(tmp, "out.json")
        with open(in_path, "w") as f:
            json.dump({label: launch.to_json() for label, launch in launches.items()}, f)
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", in_path, out_path]
        # A session of its own, so that a timeout ends the worker and its compile processes.
        proc = subprocess.Popen(
            [*cmd, str(workers)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            output, _ = proc.communicate(timeout=timeout)
            status = f"compile worker exited with {proc.returncode}"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
            status = f"compile worker stopped after {timeout:.0f} s"
        status += f"; its output ends:\n{output[-3000:]}"
        results: dict[str, dict[str, Any]] = {}
        if os.path.exists(out_path):
            with open(out_path) as f:
                results = json.load(f)
    return results, status


def register_table(
    distinct: dict[str, tuple[Launch, Specialized]], results: dict[str, dict[str, Any]]
) -> list[str]:
    """One line per kernel: configurations, registers per thread (min-max), spills, time."""
    by_kernel: dict[str, list[dict[str, Any]]] = {}
    for label, (launch, _spec) in distinct.items():
        result = results.get(label)
        if result and result.get("ok"):
            by_kernel.setdefault(launch.kernel, []).append(result)
    lines = [
        f"{'kernel':<28} {'configs':>7} {'registers':>9} {'spill B (st/ld)':>15} {'compile s':>9}"
    ]
    for kernel, rows in sorted(by_kernel.items()):
        regs = [r["registers"] for r in rows if r["registers"] is not None]
        stores = max((r["spill_stores"] or 0) for r in rows)
        loads = max((r["spill_loads"] or 0) for r in rows)
        span = f"{min(regs)}-{max(regs)}" if regs else "?"
        seconds = sum(r["seconds"] for r in rows)
        lines.append(
            f"{kernel:<28} {len(rows):>7} {span:>9} {f'{stores}/{loads}':>15} {seconds:>9.1f}"
        )
    return lines


def main(argv: Sequence[str]) -> int:
    if len(argv) == 4 and argv[0] == "--worker":
        _worker(argv[1], argv[2], int(argv[3]))
        return 0
    start = time.perf_counter()
    distinct = distinct_launches(record_launches())
    results, status = compile_in_subprocess(
        {label: launch for label, (launch, _) in distinct.items()}
    )
    failed = 0
    for label in distinct:
        result = results.get(label, {"ok": False, "error": status})
        if result["ok"]:
            print(
                f"{label}: {result['registers']} registers, spills "
                f"{result['spill_stores']}/{result['spill_loads']} B, {result['seconds']:.1f} s"
            )
        else:
            failed += 1
            print(f"{label}: FAILED {result['error']}")
    print("\n".join(register_table(distinct, results)))
    print(f"{len(distinct)} configurations, {failed} failed, {time.perf_counter() - start:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
