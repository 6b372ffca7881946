"""How the launchers launch a Triton kernel: through ``torch.library.wrap_triton``, directly, or
by relaunching the kernel Triton compiled for the same kind of arguments before."""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch
from torch import Tensor
from torch._library.triton import wrap_triton as _torch_wrap_triton
from torch.utils._python_dispatch import _get_current_dispatch_mode

from .dispatch import triton_interpret_mode

__all__ = ["launchable", "plain_eager"]


def plain_eager() -> bool:
    """True outside ``torch.compile`` and outside every ``TorchDispatchMode`` (fake tensors,
    functionalization, ``make_fx`` and ``opcheck``'s tracing): the tensors are real and nothing
    records the call, so the launchers may skip the dispatcher."""
    return not torch.compiler.is_compiling() and _get_current_dispatch_mode() is None


def launchable(kernel: Any) -> Any:
    """The object to index with a grid and call, for ``kernel`` (a ``@triton.jit`` function).

    ``torch.library.wrap_triton``'s wrapper launches through a higher-order op, which tracing
    (``torch.compile``, fake tensors) needs; in plain eager mode that dispatch costs more host
    time than a whole kernel at moderate sizes, so there the kernel is launched without it
    (without even building the wrapper, about 15 µs of host time per launch), through
    :class:`_Relauncher` when Triton compiles it. Whoever replaces ``torch.library.wrap_triton``
    (the sm_90 compile check of the tests records launches that way) is still asked for every
    launch.
    """
    eager = plain_eager()
    if torch.library.wrap_triton is _torch_wrap_triton and eager:
        return _direct(kernel)
    wrapped = torch.library.wrap_triton(kernel)
    if getattr(wrapped, "kernel", None) is kernel and eager:
        return _direct(kernel)
    return wrapped


def _direct(kernel: Any) -> Any:
    jit_function = _jit_function_type()
    if jit_function is None or not isinstance(kernel, jit_function) or triton_interpret_mode():
        return kernel
    return _relauncher(kernel)


@functools.cache
def _jit_function_type() -> type | None:
    # Looked up on first launch, not at import: importing this module needs no Triton.
    try:
        from triton.runtime.jit import JITFunction
    except ImportError:  # pragma: no cover - Triton is a dependency on Linux
        return None
    jit_function: type = JITFunction
    return jit_function


@functools.cache
def _relauncher(kernel: Any) -> _Relauncher:
    return _Relauncher(kernel)


class _Relauncher:
    """``kernel[grid](*args, **kwargs)`` with less host time per launch.

    ``JITFunction.run`` binds every argument, derives Triton's specialization of each (dtype,
    16-byte alignment of pointers, integers divisible by 16, integer width) and builds a cache
    key from them at every launch: about half of the scan launcher's host time (``cProfile``
    on the H200's host, 2026-12-04). Here the first launch of a kind of arguments goes through Triton as usual and
    the compiled kernel it returns is kept under a key that separates at least what Triton's
    specialization separates (each tensor's dtype and ``data_ptr() % 16 == 0``; each integer's
    ``% 16 == 0``, ``== 1`` and width; bools by value; host TMA descriptors by their base's
    dtype and alignment and their block shape; every keyword argument by value, which
    covers the constexprs and launch options); later launches with the same key go to the
    compiled kernel directly (``CompiledKernel[grid](*all_arguments)``, what Triton's own launch
    ends in). Arguments of any other kind, or keyword arguments that are not hashable or hold a
    tensor, always take Triton's path.
    """

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel
        self.names: tuple[str, ...] = tuple(kernel.arg_names)
        self.compiled: dict[Hashable, Any] = {}

    def __getitem__(self, grid: Sequence[int]) -> Callable[..., None]:
        return functools.partial(self.launch, grid)

    def launch(self, grid: Sequence[int], *args: Any, **kwargs: Any) -> None:
        key = None if callable(grid) else _launch_key(args, kwargs)
        compiled = None if key is None else self.compiled.get(key)
        if compiled is not None:
            # Every parameter in signature order, constexprs included, as Triton's launch
            # passes them (its launcher skips the constexprs); a parameter left to its default
            # takes Triton's path.
            try:
                bound = (*args, *(kwargs[name] for name in self.names[len(args) :]))
            except KeyError:
                compiled = None
        if compiled is None:
            compiled = self.kernel[grid](*args, **kwargs)
            if key is not None and _relaunchable(compiled):
                self.compiled[key] = compiled
            return
        # The compiled kernel's launch takes a full three-dimensional grid.
        compiled[(*grid, 1, 1)[:3]](*bound)


def _relaunchable(compiled: Any) -> bool:
    return callable(getattr(compiled, "__getitem__", None)) and hasattr(compiled, "function")


_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)
# Keyword values of these exact types are hashable and never tensors: no check of their own.
_PLAIN_OPTIONS = frozenset({bool, int, float, str, type(None)})


def _launch_key(args: Sequence[Any], kwargs: dict[str, Any]) -> Hashable | None:
    """A key that separates every two launches Triton would compile differently, or None.

    Runs at every launch: the launchers' own argument types (exact ``Tensor`` and ``int``) are
    told apart by ``type`` first, as a chain of ``isinstance`` checks on a dozen arguments costs
    a noticeable share of a launch's host time.
    """
    spec: list[Hashable] = [torch.cuda.current_device()]
    append = spec.append
    for arg in args:
        kind = type(arg)
        if kind is Tensor:
            append((arg.dtype, arg.data_ptr() % 16 == 0))
        elif kind is int:
            append(_int_spec(arg))
        elif isinstance(arg, Tensor):
            append((arg.dtype, arg.data_ptr() % 16 == 0))
        elif isinstance(arg, bool):
            append(("b", arg))
        elif isinstance(arg, int):
            append(_int_spec(arg))
        elif isinstance(arg, float):
            append("f")
        elif isinstance(arg, _descriptor_type()):
            # Triton specializes a host TMA descriptor on its base's dtype and its block shape
            # (shape and strides are launch arguments); padding and the TF32 rounding are kept
            # too, as they change the descriptor the launcher encodes.
            append(_descriptor_spec(arg))
        else:
            return None
    for value in kwargs.values():
        if type(value) not in _PLAIN_OPTIONS and not _plain_option(value):
            return None
    return (tuple(spec), tuple(kwargs.items()))


def _int_spec(value: int) -> Hashable:
    width = 0 if _INT32[0] <= value <= _INT32[1] else 1 if _INT64[0] <= value <= _INT64[1] else 2
    return ("i", value % 16 == 0, value == 1, width)


def _plain_option(value: object) -> bool:
    """Whether a keyword value of another type may stand in a key: hashable, not a tensor."""
    if isinstance(value, Tensor):
        return False
    try:
        hash(value)
    except TypeError:
        return False
    return True


class _NoDescriptor:
    """Stands in for the descriptor type where this Triton has none (nothing is an instance)."""


@functools.cache
def _descriptor_type() -> type:
    # Looked up on first use, as _jit_function_type.
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor
    except ImportError:  # pragma: no cover - every supported Triton has it
        return _NoDescriptor
    descriptor: type = TensorDescriptor
    return descriptor


def _descriptor_spec(descriptor: Any) -> Hashable:
    return (
        "d",
        descriptor.base.dtype,
        descriptor.base.data_ptr() % 16 == 0,
        tuple(descriptor.block_shape),
        getattr(descriptor, "padding", "zero"),
        getattr(descriptor, "round_f32_to_tf32", False),
    )
