"""Instructions of each fused kernel's hot loop, from an sm_90 compile that needs no GPU.

Triton compiles a kernel for a target it is told (here an H100/H200's sm_90) without a device,
and ships ``ptxas``, ``nvdisasm`` and ``cuobjdump``: so on any machine this prints, for every
fused kernel at its default launch shape for B = 8, d = 256, its SASS instructions in all, its
registers, and the size of its first loop that branches back (the Newton iteration of the
Newton kernels, a chunk of the backward and sequential kernels): instructions, ``BAR.SYNC``
barriers and ``MUFU`` (transcendental) instructions per pass through it. A static measure, not
a timing: where a kernel is bound by issuing instructions (the Newton chunks are), fewer
instructions per iteration is less time, which only the GPU can confirm. Which tree runs is
``PYTHONPATH``'s choice, so two trees (or two Triton versions) compare in one shell::

    git archive <rev> packages | tar -x -C /tmp/old
    PYTHONPATH=$(ls -d /tmp/old/packages/*/src | paste -sd:) python3 benchmarks/sass_counts.py
    python3 benchmarks/sass_counts.py

Run it without ``TRITON_INTERPRET=1`` (the kernels then take their interpreter paths).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile
from collections.abc import Iterator
from typing import Any

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from pararnn_kernels.fused import _kernels, _kernels_lstm, _kernels_slstm

_INSTRUCTION = re.compile(r"\s+/\*[0-9a-f]{4}\*/\s")


def _binary(name: str) -> str:
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def compile_sm90(fn: Any, constexprs: dict[str, int | bool], num_warps: int) -> bytes:
    """The cubin of ``fn`` for sm_90: ``*_ptr`` arguments float32 pointers, ``tol``/``omega``
    float32, the given constexprs, every other argument int32."""
    signature = {}
    for name in fn.arg_names:
        if name.endswith("_ptr"):
            signature[name] = "*fp32"
        elif name in constexprs:
            signature[name] = "constexpr"
        else:
            signature[name] = "fp32" if name in ("tol", "omega") else "i32"
    values = {(fn.arg_names.index(k),): v for k, v in constexprs.items()}
    source = ASTSource(fn=fn, signature=signature, constexprs=values)
    compiled = triton.compile(
        source, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps}
    )
    cubin: bytes = compiled.asm["cubin"]
    return cubin


def _loops(sass: str) -> Iterator[list[str]]:
    """The instructions of each loop, from its label to the branch back (BRA.DIV excluded)."""
    lines = sass.splitlines()
    labels: dict[str, int] = {}
    for i, line in enumerate(lines):
        label = re.match(r"^(\.L_x_\d+):", line)
        if label:
            labels[label.group(1)] = i
        back = re.search(r"BRA `\((\.L_x_\d+)\)", line)
        if back and back.group(1) in labels and "BRA.DIV" not in line:
            yield [x for x in lines[labels[back.group(1)] : i + 1] if _INSTRUCTION.match(x)]


def count(cubin: bytes) -> dict[str, int]:
    """Instructions, registers and the first loop's instructions, barriers and MUFUs."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        sass = subprocess.run(
            [_binary("nvdisasm"), "-c", path], capture_output=True, text=True, check=True
        ).stdout
        usage = subprocess.run(
            [_binary("cuobjdump"), "-res-usage", path], capture_output=True, text=True, check=True
        ).stdout
    registers = re.search(r"REG:(\d+)", usage)
    loop = next(_loops(sass), [])
    body = "\n".join(loop)
    return {
        "instructions": sum(1 for line in sass.splitlines() if _INSTRUCTION.match(line)),
        "registers": int(registers.group(1)) if registers else -1,
        "loop": len(loop),
        "loop_bar": body.count("BAR.SYNC"),
        "loop_mufu": body.count("MUFU"),
    }


#: ``(cell, kernel module, Newton block_t, backward block_t and block_d, sequential rows)``:
#: the default plans of ``plan_fused``, ``backward`` and ``sequential_plan`` at B = 8, d = 256.
_CELLS = (
    ("gru", _kernels, 128, (128, 8), 16),
    ("lstm", _kernels_lstm, 64, (32, 16), 8),
    ("slstm", _kernels_slstm, 32, (32, 16), 8),
)


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    print(f"triton {triton.__version__}, sm_90")
    print("| kernel | instructions | registers | loop instructions | loop BAR.SYNC | loop MUFU |")
    print("|---|---|---|---|---|---|")
    for cell, module, block_t, (back_t, back_d), rows in _CELLS:
        kinds: dict[str, tuple[dict[str, int | bool], int]] = {
            "newton": (
                {"MAX_ITERS": 3, "GUESS": 1, "CHAINED": False, "HIST": 8,
                 "BLOCK_T": block_t, "BLOCK_D": 4},
                2,
            ),
            "backward": ({"BLOCK_T": back_t, "BLOCK_D": back_d}, 4),
            "sequential": ({"ROWS": rows, "BLOCK_D": 64, "VEC": 2}, 1),
        }  # fmt: skip
        for kind, (constexprs, warps) in kinds.items():
            fn = getattr(module, f"{cell}_{kind}_kernel")
            n = count(compile_sm90(fn, constexprs, warps))
            print(
                f"| {cell}_{kind} | {n['instructions']} | {n['registers']} | {n['loop']} | "
                f"{n['loop_bar']} | {n['loop_mufu']} |"
            )


if __name__ == "__main__":
    main()
