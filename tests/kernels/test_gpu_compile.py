"""Every Triton kernel the package launches compiles for an sm_90 GPU (H100/H200), on the CPU.

CI runs the kernels in the Triton interpreter, which accepts programs that the GPU compiler
rejects. Here the launchers are run with their launches recorded instead of executed, and each
distinct configuration is compiled to PTX and a cubin for ``GPUTarget("cuda", 90, 32)`` by the
installed Triton, in a subprocess without ``TRITON_INTERPRET`` (how: ``gpu_compile.py``).

A test per configuration names the kernel, storage dtype, constexprs and warps, and fails with
the compiler's message. No GPU is used and nothing is marked ``cuda``; without Triton's CUDA
backend or ``ptxas`` everything skips. At the end a per-kernel table of registers and spills
(``ptxas -v``) is printed; ``python tests/kernels/gpu_compile.py`` prints it per configuration.
"""

from __future__ import annotations

import traceback
from collections.abc import Iterator
from typing import Any

import pytest

from . import gpu_compile


def _collect() -> tuple[dict[str, Any], list[gpu_compile.Launch], str | None, str | None]:
    """``(distinct launches, recorded launches, skip reason, recording error)``."""
    try:
        gpu_compile.check_environment()
    except gpu_compile.CompileUnavailable as err:
        return {}, [], str(err), None
    try:
        recorded = gpu_compile.record_launches()
        return gpu_compile.distinct_launches(recorded), recorded, None, None
    except Exception:  # reported by test_launchers_record, not as a collection error
        return {}, [], None, traceback.format_exc()


DISTINCT, RECORDED, UNAVAILABLE, RECORD_ERROR = _collect()

if UNAVAILABLE is not None:
    LABELS = [pytest.param("-", marks=pytest.mark.skip(reason=UNAVAILABLE), id="unavailable")]
else:
    LABELS = [pytest.param(label, id=label) for label in DISTINCT]


@pytest.fixture(scope="module")
def compiled(
    request: pytest.FixtureRequest,
) -> Iterator[tuple[dict[str, dict[str, Any]], str]]:
    """Compile the configurations of the selected tests, once; print the register table after."""
    selected = [
        item.callspec.params["label"]
        for item in request.session.items
        if item.module is request.module and hasattr(item, "callspec")
    ]
    launches = {label: DISTINCT[label][0] for label in selected if label in DISTINCT}
    results, status = gpu_compile.compile_in_subprocess(launches)
    yield results, status
    plugins = request.config.pluginmanager
    reporter, capture = plugins.getplugin("terminalreporter"), plugins.getplugin("capturemanager")
    if reporter is None or capture is None or not results:
        return
    with capture.global_and_fixture_disabled():  # a summary for tuning, not an assertion
        reporter.line("")
        reporter.write_sep("-", f"sm_{gpu_compile.TARGET[1]} compile (ptxas -v), per kernel")
        for line in gpu_compile.register_table(DISTINCT, results):
            reporter.write_line(line)


def test_launchers_record() -> None:
    """The launchers ran on CPU tensors with their launches recorded (else nothing compiles)."""
    if UNAVAILABLE is not None:
        pytest.skip(UNAVAILABLE)
    assert RECORD_ERROR is None, f"recording the launches failed:\n{RECORD_ERROR}"
    assert DISTINCT, "no kernel launch was recorded"


def test_each_package_kernel_is_recorded() -> None:
    """Each ``*_kernel`` of the kernel modules is launched by some recorded configuration: a new
    kernel needs a scenario in ``gpu_compile.py``, and a launch that bypasses ``wrap_triton``
    shows up here."""
    if UNAVAILABLE is not None:
        pytest.skip(UNAVAILABLE)
    if RECORD_ERROR is not None:
        pytest.fail("recording failed (test_launchers_record)")
    launched = {(launch.module, launch.kernel) for launch in RECORDED}
    missing = gpu_compile.package_kernels() - launched
    assert not missing, f"kernels no recorded launcher reaches: {sorted(missing)}"


@pytest.mark.parametrize("label", LABELS)
def test_compiles_for_sm90(label: str, compiled: tuple[dict[str, dict[str, Any]], str]) -> None:
    results, status = compiled
    launch = DISTINCT[label][0]
    result = results.get(label)
    if result is None:
        pytest.fail(f"{label}: no result from the compile worker ({status})")
    if not result["ok"]:
        pytest.fail(
            f"{launch.kernel} does not compile for sm_{gpu_compile.TARGET[1]}\n"
            f"configuration: {label}\nrecorded from: {launch.origin}\n\n{result['error']}",
            pytrace=False,
        )
