"""A first look at ParaRNN: the parallel linear-recurrence scan, and a GRU layer trained by Newton.

    uv run python examples/scan_demo.py

Runs on a GPU through the Triton kernels when one is present, on the CPU through the eager
(pure-torch, log-depth) backend otherwise. Prints the largest deviation of the parallel scan from a
step-by-step loop, then one ParaGRU forward/backward with its Newton statistics.
"""

from __future__ import annotations

import time

import torch

from pararnn_core import ParaGRU, ParaRNN
from pararnn_kernels import scan_diag, sequential_scan_diag


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    batch, steps, channels = 4, 2048, 96
    jac = torch.empty(batch, steps, channels, device=device).uniform_(-0.99, 0.99)
    rhs = torch.randn(batch, steps, channels, device=device)
    h0 = torch.randn(batch, channels, device=device)

    start = time.perf_counter()
    y = scan_diag(jac, rhs, h0)
    if device == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    reference = sequential_scan_diag(jac.double(), rhs.double(), h0.double())
    err = ((y.double() - reference).abs().max() / reference.abs().max()).item()
    print(f"scan_diag on {device}: [B, T, D] = {list(y.shape)}, {elapsed * 1e3:.1f} ms")
    print(f"  max relative deviation from the float64 step loop: {err:.2e}")

    model = ParaRNN(ParaGRU(32, 64, device=device))
    x = torch.randn(2, 1024, 32, device=device)
    out = model(x)
    out.square().mean().backward()
    stats = model.last_stats[0]
    print(f"ParaGRU layer: output {list(out.shape)}, Newton {stats}")
    model.eval()
    with torch.no_grad():
        sequential = model(x)
    print(f"  max |Newton - sequential| = {(out.detach() - sequential).abs().max().item():.2e}")


if __name__ == "__main__":
    main()
