"""Where the streamed scan leads: the default plan against the streamed pass, by shape.

On one CUDA GPU of compute capability >= 9.0: ``scan_diag``'s forward pass (``do_bench``
medians, % of the copy bandwidth measured at the start) by the default plan, the streamed pass
(64-step chunks x 32 channels, 4 stages), its 32-step chunks, its 6 stages, and the chunked walk
forced onto 32 and 16 channels per program, for bf16 and fp32 storage at shapes whose 32-channel
programs number 128 to 768. The default window of the streamed pass
(``launch.STREAMED_WAVES``, ``launch.STREAMED_MAX_STEPS``) was drawn from this table
(docs/benchmarks.md, 2026-12-07)::

    PYTHONPATH=$(ls -d packages/*/src | paste -sd:) python3 benchmarks/streamed_window.py
"""

from __future__ import annotations

import argparse
import functools
from typing import Any

import torch
from bench_scan import _shape, copy_bandwidth, median_ms, random_inputs  # from this folder

from pararnn_kernels.scan import launch

SHAPES = [
    (8, 1024, 1536), (8, 2048, 1536), (8, 4096, 1536), (8, 8192, 1536), (8, 16384, 1536),
    (8, 32768, 1536), (8, 65536, 1536), (4, 4096, 1536), (16, 4096, 1536), (12, 4096, 1024),
    (32, 4096, 512), (32, 16384, 512), (16, 4096, 768), (64, 4096, 256), (16, 16384, 768),
    (32, 65536, 512), (8, 65536, 512),
]  # fmt: skip
VARIANTS: list[tuple[str, dict[str, Any]]] = [
    ("default", {}),
    ("streamed", {"method": "streamed"}),
    ("streamed 32 x 4", {"method": "streamed", "block_t": 32}),
    ("streamed 64 x 6", {"method": "streamed", "stages": 6}),
    ("chunked 32", {"method": "chunked", "block_d": 32}),
    ("chunked 16", {"method": "chunked", "block_d": 16}),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", type=_shape, default=SHAPES, metavar="B,T,D")
    parser.add_argument("--dtypes", nargs="+", choices=("bf16", "fp32"), default=["bf16", "fp32"])
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("streamed_window.py needs a CUDA GPU")
    dev = torch.device("cuda")
    bandwidth = copy_bandwidth(dev)
    print(f"{torch.cuda.get_device_name()}, copy {bandwidth / 1e9:.0f} GB/s", flush=True)
    dtypes = {"bf16": torch.bfloat16, "fp32": torch.float32}
    for name in args.dtypes:
        dtype = dtypes[name]
        for b, t, d in args.shapes:
            jac, rhs = random_inputs(b, t, d, dtype, dev)
            nbytes = 3 * jac.numel() * jac.element_size()
            cells = []
            for label, kw in VARIANTS:
                try:
                    ms = median_ms(
                        functools.partial(
                            launch.triton_scan_diag, jac, rhs, None, reverse=False, **kw
                        )
                    )
                except ValueError as err:  # a plan this shape cannot take
                    cells.append(f"{label} - ({err})")
                    continue
                cells.append(f"{label} {100 * nbytes / (ms * 1e-3) / bandwidth:.1f}%")
            plan = launch.plan_scan_diag(b, t, d, dev, dtype=dtype)
            programs = b * -(-d // 32)
            print(
                f"{name} {b},{t},{d} B*D={b * d} programs={programs} default={plan.method}: "
                + ", ".join(cells),
                flush=True,
            )
            del jac, rhs


if __name__ == "__main__":
    main()
