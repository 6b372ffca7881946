"""pararnn-bench's peers (accelerated-scan, fla, FlashRNN) and its scope "scan".

On the CPU (as in CI, where the peers are not installed): every peer method is skipped with a
reason and the run goes on; fake peer modules that mimic each library's public function and
layout with a plain torch loop show that the adapters' conversions solve ``scan_diag``'s
recurrence (values and gradients); the scan floor's byte counts; the CLI. The tests marked
``cuda`` run the real peers, when installed, at small sizes against the float64 reference.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import Tensor

from pararnn_examples.bench import (
    SCAN_CELL,
    BenchConfig,
    BenchRecord,
    Case,
    Method,
    Shape,
    format_table,
    get_method,
    make_scan_inputs,
    register_method,
    run_bench,
    scan_floor_bytes,
    unregister_method,
)
from pararnn_examples.bench.cli import main
from pararnn_examples.bench.harness import _check_not_comparable
from pararnn_examples.bench.peers import (
    ACCELERATED_SCAN,
    FLASHRNN_CELLS,
    PEER_TOLERANCES,
    Peer,
    PeerUnavailable,
    accelerated_scan_layout,
    fla_hgrn_inputs,
)
from pararnn_examples.bench.peers import base as peers_base
from pararnn_examples.bench.registry import NotComparable
from pararnn_examples.bench.report import format_peers
from pararnn_kernels import scan_diag

CPU = torch.device("cpu")
SCAN_PEERS = ("accelerated_scan", "accelerated_scan_warp", "fla_chunk_hgrn")
PEER_METHODS = (*SCAN_PEERS, "flashrnn")
#: The modules the adapters import; None in sys.modules makes an import fail like a missing one.
PEER_MODULES = (
    "accelerated_scan",
    "accelerated_scan.scalar",
    "accelerated_scan.warp",
    "fla",
    "fla.ops",
    "fla.ops.hgrn",
    "flashrnn",
)
#: B, T, D all different, T odd: a transposed or misread layout cannot pass.
SCAN_SHAPE = Shape(2, 9, 3)


def scan_config(**overrides: object) -> BenchConfig:
    settings: dict[str, object] = {
        "device": "cpu",
        "scopes": ("scan",),
        "methods": ("scan_diag_eager",),
        "scan_shapes": (SCAN_SHAPE,),
        "dtypes": ("fp32",),
        "warmup": 1,
        "repeats": 1,
        "copy_bytes": 2**20,
    }
    settings.update(overrides)
    return BenchConfig(**settings)  # type: ignore[arg-type]


def scan_case(dtype: str = "fp32", shape: Shape = SCAN_SHAPE) -> Case:
    return Case(SCAN_CELL, shape, dtype, "scan", CPU)


# ------------------------------------------------------------------------------------------------
# Fake peers: each library's public function, signature and layout, as a plain torch loop
# ------------------------------------------------------------------------------------------------


def fake_bdt_scan(forget: Tensor, inputs: Tensor) -> Tensor:
    """accelerated_scan.{scalar,warp}.scan: ``x_t = f_t x_{t-1} + i_t`` on ``[B, C, T]``."""
    assert forget.shape == inputs.shape and forget.dim() == 3
    assert forget.is_contiguous() and inputs.is_contiguous()
    state = torch.zeros_like(inputs[:, :, 0])
    out = []
    for t in range(inputs.shape[2]):
        state = forget[:, :, t] * state + inputs[:, :, t]
        out.append(state)
    return torch.stack(out, dim=2)


def fake_chunk_hgrn(
    x: Tensor, g: Tensor, initial_state: Tensor | None = None, output_final_state: bool = False
) -> tuple[Tensor, Tensor | None]:
    """fla.ops.hgrn.chunk_hgrn: ``h_t = exp(g_t) h_{t-1} + x_t`` on ``[B, T, D]``."""
    assert x.shape == g.shape and x.dim() == 3
    state = torch.zeros_like(x[:, 0]) if initial_state is None else initial_state
    out = []
    for t in range(x.shape[1]):
        state = torch.exp(g[:, t]) * state + x[:, t]
        out.append(state)
    return torch.stack(out, dim=1), (state if output_final_state else None)


#: FlashRNN's function registry: (gates of Wx, gates of R, biases, states).
FAKE_FLASHRNN_GATES = {"lstm": (4, 4, 4, 2), "slstm": (4, 4, 4, 4), "gru": (3, 3, 4, 1)}


@dataclasses.dataclass
class FakeFlashRNNConfig:
    function: str = "lstm"
    backend: str = "cuda_fused"
    dtype: str = "bfloat16"
    num_heads: int = -1
    head_dim: int = -1
    batch_size: int = 8

    def __post_init__(self) -> None:
        if self.function == "gru" and self.backend == "cuda_fused":  # as FlashRNN does
            self.backend = "cuda"


def fake_flashrnn(
    Wx: Tensor,
    R: Tensor,
    b: Tensor,
    states: Tensor | None = None,
    function: str = "lstm",
    config: FakeFlashRNNConfig | None = None,
    backend: str = "cuda_fused",
    dtype: str = "bfloat16",
) -> tuple[Tensor, Tensor]:
    """flashrnn.flashrnn: Wx ``[B, T, G, H, D]``, R ``[G, H, D, D]``, b ``[G, H, D]`` ->
    states ``[S, B, T, H, D]`` (a tanh RNN per head stands in for the cell)."""
    assert config is not None
    gates_in, gates_rec, biases, n_states = FAKE_FLASHRNN_GATES[config.function]
    batch, steps, g, heads, head = Wx.shape
    assert g == gates_in and (heads, head) == (config.num_heads, config.head_dim)
    assert R.shape == (gates_rec, heads, head, head) and b.shape == (biases, heads, head)
    assert Wx.dtype == R.dtype == b.dtype
    h = Wx.new_zeros(batch, heads, head)
    out = []
    for t in range(steps):
        h = torch.tanh(Wx[:, t].sum(1) + torch.einsum("hde,bhe->bhd", R[0], h) + b[0])
        out.append(h)
    hidden = torch.stack(out, dim=1)  # [B, T, H, D]
    all_states = hidden.unsqueeze(0).expand(n_states, *hidden.shape)
    return all_states, all_states[:, :, -1:]


def _module(name: str, **attrs: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    for key, value in attrs.items():
        setattr(module, key, value)
    return module


@pytest.fixture
def no_peers(monkeypatch: pytest.MonkeyPatch) -> None:
    """The peers as CI sees them, whether or not this machine has them: not importable."""
    for name in PEER_MODULES:
        monkeypatch.setitem(sys.modules, name, None)


@pytest.fixture
def fake_peers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every peer module replaced by its fake."""
    fakes = {
        "accelerated_scan": _module("accelerated_scan"),
        "accelerated_scan.scalar": _module("accelerated_scan.scalar", scan=fake_bdt_scan),
        "accelerated_scan.warp": _module("accelerated_scan.warp", scan=fake_bdt_scan),
        "fla": _module("fla"),
        "fla.ops": _module("fla.ops"),
        "fla.ops.hgrn": _module("fla.ops.hgrn", chunk_hgrn=fake_chunk_hgrn),
        "flashrnn": _module("flashrnn", flashrnn=fake_flashrnn, FlashRNNConfig=FakeFlashRNNConfig),
    }
    for name, module in fakes.items():
        monkeypatch.setitem(sys.modules, name, module)


@pytest.fixture
def on_cpu() -> Iterator[list[str]]:
    """Each peer method registered again as ``cpu_<name>``: the same builder, run on the CPU
    (the real ones need CUDA)."""
    names = []
    for name in PEER_METHODS:
        method = get_method(name)
        clone = Method(f"cpu_{name}", method.summary, method.build, scopes=method.scopes)
        register_method(clone)
        names.append(clone.name)
    try:
        yield names
    finally:
        for name in names:
            unregister_method(name)


# ------------------------------------------------------------------------------------------------
# Absent peers: skipped with the reason, the run goes on
# ------------------------------------------------------------------------------------------------


@pytest.mark.usefixtures("no_peers")
def test_absent_peers_are_skipped_with_the_reason_and_the_run_goes_on(
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = scan_config(
        scopes=("scan", "layer"),
        cells=("ParaGRU",),
        shapes=(Shape(2, 8, 64),),
        methods=("scan_diag_eager", *SCAN_PEERS, "sequential_eager", "flashrnn"),
    )
    result = run_bench(config, progress=True)
    by_method: dict[str, list[BenchRecord]] = {}
    for r in result.records:
        by_method.setdefault(r.method, []).append(r)
    for ours in ("scan_diag_eager", "sequential_eager"):
        assert all(r.status == "ok" and r.err_ok for r in by_method[ours]), ours
    distributions = {"accelerated_scan": "accelerated-scan", "accelerated_scan_warp":
                     "accelerated-scan", "fla_chunk_hgrn": "fla-core", "flashrnn": "flashrnn"}  # fmt: skip
    for name, distribution in distributions.items():
        records = by_method[name]
        assert len(records) == 2  # one case (scan shape or GRU layer), both directions
        for r in records:
            assert r.status == "skipped" and r.median_ms is None
            assert distribution in r.skipped_reason and "not installed" in r.skipped_reason
            assert "pararnn-examples[bench]" in r.skipped_reason
    peers = {p["method"]: p for p in result.environment["peers"]}
    assert set(peers) == set(distributions)
    assert not any(p["used"] for p in peers.values())
    text = format_peers(result)
    assert text.count("skipped:") == 4 and "peer fla_chunk_hgrn: fla-core " in text
    # The printout begins with the same lines, before any record.
    out = capsys.readouterr().out
    assert out.index("peer flashrnn: flashrnn ") < out.index("scan_diag_eager")


@pytest.mark.usefixtures("fake_peers")
def test_installed_peers_need_cuda() -> None:
    case = scan_case()
    config = scan_config()
    for name in SCAN_PEERS:
        reason = get_method(name).available(case, config)
        assert reason is not None and reason.startswith("needs CUDA"), (name, reason)
    layer = Case("ParaLSTM", Shape(2, 8, 64), "fp32", "layer", CPU)
    reason = get_method("flashrnn").available(layer, config)
    assert reason is not None and "needs CUDA" in reason and "device is cpu" in reason
    statuses = run_bench(scan_config(methods=("scan_diag_eager", "fla_chunk_hgrn")),
                         progress=False).environment["peers"]  # fmt: skip
    assert statuses == [
        {
            "method": "fla_chunk_hgrn",
            "distribution": "fla-core",
            "version": statuses[0]["version"],  # None, unless fla-core is installed here
            "api": "fla.ops.hgrn.chunk_hgrn(x, g) on [B, T, D] with g = log(jac), Triton",
            "used": False,
            "reason": "needs CUDA: fla-core's kernels run on CUDA devices, device is cpu",
        }
    ]


def test_a_peer_whose_import_breaks_is_skipped_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def broken_import(name: str) -> types.ModuleType:
        calls.append(name)
        raise RuntimeError("nvcc failed\n  while building")

    monkeypatch.setattr(peers_base.importlib, "import_module", broken_import)
    monkeypatch.setattr(peers_base, "_BROKEN", {})
    peer = Peer("some-dist", "some_peer_module_that_compiles", "some_peer.scan")
    for _ in range(2):
        reason = peer.unavailable(CPU)
        assert reason == (
            "import of some_peer_module_that_compiles (some-dist) failed: RuntimeError: nvcc "
            "failed while building"
        )
    assert calls == ["some_peer_module_that_compiles"]  # not retried


@pytest.mark.usefixtures("fake_peers")
def test_a_missing_public_function_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "accelerated_scan.scalar", _module("accelerated_scan.scalar"))
    with pytest.raises(PeerUnavailable, match=r"accelerated_scan\.scalar has no attribute 'scan'"):
        ACCELERATED_SCAN.attr("scan")


# ------------------------------------------------------------------------------------------------
# The adapters' conversions, on fake peers
# ------------------------------------------------------------------------------------------------


def _eager_grads(jac: Tensor, rhs: Tensor, cotangent: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    jac = jac.detach().requires_grad_(True)
    rhs = rhs.detach().requires_grad_(True)
    y = scan_diag(jac, rhs, backend="eager")
    torch.autograd.backward(y, cotangent)
    assert jac.grad is not None and rhs.grad is not None
    return y.detach(), jac.grad, rhs.grad


@pytest.mark.usefixtures("fake_peers")
@pytest.mark.parametrize("name", SCAN_PEERS)
def test_scan_adapters_solve_scan_diags_recurrence(name: str) -> None:
    torch.manual_seed(0)
    case = scan_case()
    inputs = make_scan_inputs(case)
    runner = get_method(name).build(case, inputs, scan_config())
    y = runner.to_reference_layout(runner.forward())
    expected, _, _ = _eager_grads(inputs.jac, inputs.rhs, inputs.cotangent)
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-6)
    reference = runner.reference()
    assert not isinstance(reference, NotComparable) and reference.kind == "sequential_fp64"
    assert reference.value.dtype == torch.float64
    torch.testing.assert_close(y.double(), reference.value, rtol=1e-5, atol=1e-6)
    assert runner.tolerance == PEER_TOLERANCES["fp32"] == 1e-4
    runner.forward_backward()  # runs; the gradients are checked on the conversions below
    assert inputs.jac.grad is None and inputs.rhs.grad is None  # the peer's own copies


@pytest.mark.usefixtures("fake_peers")
def test_accelerated_scan_layout_values_and_gradients() -> None:
    torch.manual_seed(1)
    inputs = make_scan_inputs(scan_case())
    forget, tokens = accelerated_scan_layout(inputs.jac, inputs.rhs)
    assert forget.shape == (2, 3, 9) and forget.is_contiguous() and forget.requires_grad
    y = fake_bdt_scan(forget, tokens)
    torch.autograd.backward(y, inputs.cotangent.transpose(1, 2).contiguous())
    expected, grad_jac, grad_rhs = _eager_grads(inputs.jac, inputs.rhs, inputs.cotangent)
    torch.testing.assert_close(y.transpose(1, 2), expected, rtol=1e-5, atol=1e-6)
    assert forget.grad is not None and tokens.grad is not None
    torch.testing.assert_close(forget.grad.transpose(1, 2), grad_jac, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(tokens.grad.transpose(1, 2), grad_rhs, rtol=1e-5, atol=1e-6)


def test_fla_hgrn_inputs_values_and_gradients() -> None:
    torch.manual_seed(2)
    inputs = make_scan_inputs(scan_case())
    x, g = fla_hgrn_inputs(inputs.jac, inputs.rhs)
    torch.testing.assert_close(torch.exp(g), inputs.jac.detach(), rtol=1e-6, atol=0.0)
    y, _ = fake_chunk_hgrn(x, g)
    torch.autograd.backward(y, inputs.cotangent)
    expected, grad_jac, grad_rhs = _eager_grads(inputs.jac, inputs.rhs, inputs.cotangent)
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-6)
    assert x.grad is not None and g.grad is not None
    torch.testing.assert_close(x.grad, grad_rhs, rtol=1e-5, atol=1e-6)
    # d/dg = jac * d/djac: the same work, in fla's parametrisation.
    torch.testing.assert_close(g.grad, grad_jac * inputs.jac.detach(), rtol=1e-5, atol=1e-6)
    bad = inputs.jac.detach().clone()
    bad[0, 3, 1] = 0.0
    with pytest.raises(ValueError, match=r"jac must be > 0 everywhere.*got a minimum of 0\.0"):
        fla_hgrn_inputs(bad, inputs.rhs)
    with pytest.raises(ValueError, match=r"jac and rhs must both be \[B, T, D\]"):
        fla_hgrn_inputs(inputs.jac, inputs.rhs[:, :4])


@pytest.mark.usefixtures("fake_peers")
def test_scan_scope_runs_the_peer_adapters_in_the_harness(on_cpu: list[str]) -> None:
    scan_methods = [m for m in on_cpu if m != "cpu_flashrnn"]
    shapes = (SCAN_SHAPE, Shape(1, 16, 2))
    config = scan_config(methods=("scan_diag_eager", *scan_methods), scan_shapes=shapes,
                         dtypes=("fp32", "bf16"))  # fmt: skip
    result = run_bench(config, progress=False)
    assert len(result.records) == 2 * 2 * 4 * 2  # dtypes x shapes x methods x directions
    for r in result.records:
        assert r.status == "ok", (r.method, r.skipped_reason)
        assert r.cell == SCAN_CELL and r.scope == "scan"
        assert r.reference == "sequential_fp64" and r.err_ok is True, (r.method, r.max_err)
        assert r.err_tol is not None and r.err_tol >= PEER_TOLERANCES[r.dtype]
        element = 4 if r.dtype == "fp32" else 2
        per = {"fwd": 3, "fwd_bwd": 8}[r.direction]
        assert r.floor_bytes == per * r.batch * r.steps * r.width * element
        if r.method != "scan_diag_eager":
            assert set(r.speedups) >= {"scan_diag_eager"}
    table = format_table(result)
    assert "| scan_diag | fp32 | scan | fwd | 2 | 9 | 3 | cpu_fla_chunk_hgrn |" in table


@pytest.mark.usefixtures("fake_peers")
def test_a_peer_failing_at_its_first_call_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken_scan(forget: Tensor, inputs: Tensor) -> Tensor:
        raise RuntimeError("triton.CompilationError: at 12:4")

    monkeypatch.setitem(
        sys.modules, "accelerated_scan.scalar", _module("accelerated_scan.scalar", scan=broken_scan)
    )
    register_method(
        Method("cpu_broken", "x", get_method("accelerated_scan").build, scopes=("scan",))
    )
    try:
        records = run_bench(scan_config(methods=("cpu_broken",)), progress=False).records
    finally:
        unregister_method("cpu_broken")
    assert [r.status for r in records] == ["skipped", "skipped"]
    assert "scan forward failed at its first call" in records[0].skipped_reason
    assert "RuntimeError: triton.CompilationError: at 12:4" in records[0].skipped_reason


class _BackwardBreaks(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, y: Tensor) -> Tensor:
        return y.clone()

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        try:
            raise ValueError("Expected dtype ['fp32', 'fp64'] but got bf16")
        except ValueError as cause:
            raise RuntimeError("at 251:27:\n    tanh(c)\n    ^") from cause


@pytest.mark.usefixtures("fake_peers")
def test_a_peer_whose_backward_fails_is_timed_forward_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def scan_without_backward(forget: Tensor, inputs: Tensor) -> Tensor:
        out: Tensor = _BackwardBreaks.apply(fake_bdt_scan(forget, inputs))
        return out

    module = _module("accelerated_scan.scalar", scan=scan_without_backward)
    monkeypatch.setitem(sys.modules, "accelerated_scan.scalar", module)
    build = get_method("accelerated_scan").build
    register_method(Method("cpu_no_backward", "x", build, scopes=("scan",)))
    try:
        fwd, fwd_bwd = run_bench(scan_config(methods=("cpu_no_backward",)), progress=False).records
    finally:
        unregister_method("cpu_no_backward")
    assert fwd.status == "ok" and fwd.err_ok is True
    assert fwd_bwd.status == "skipped" and fwd_bwd.median_ms is None
    assert "scan forward+backward failed at its first call" in fwd_bwd.skipped_reason
    assert fwd_bwd.skipped_reason.endswith(
        "RuntimeError: at 251:27: (from ValueError: Expected dtype ['fp32', 'fp64'] but got bf16)"
    )


@pytest.mark.usefixtures("fake_peers")
def test_flashrnn_rows_are_not_compared_but_checked(on_cpu: list[str]) -> None:
    config = BenchConfig(
        device="cpu",
        cells=("ParaLSTM", "ParaSLSTM", "ParaGRU"),
        methods=("newton_unfused", "cpu_flashrnn"),
        shapes=(Shape(2, 8, 128),),
        warmup=1,
        repeats=1,
        copy_bytes=2**20,
    )
    result = run_bench(config, progress=False)
    flash = [r for r in result.records if r.method == "cpu_flashrnn"]
    assert len(flash) == 3 * 2 * 2  # cells x scopes x directions
    for r in flash:
        assert r.status == "ok", r.skipped_reason
        assert r.reference == "not comparable: different model"
        assert r.max_err is None and r.err_ok is None
        states = FLASHRNN_CELLS[r.cell].states
        assert f"output finite, shape [{states}, 2, 8, 2, 64]" in r.note
        assert "dense 64x64 recurrent matrix per head" in r.note
        assert "2 heads x 64" in r.note
        assert r.speedups.keys() == {"newton_unfused"}
    gru = next(r for r in flash if r.cell == "ParaGRU")
    assert "cuda (asked for cuda_fused)" in gru.note
    assert "| n/c |" in format_table(result)
    narrow = Case("ParaLSTM", Shape(2, 8, 96), "fp32", "layer", CPU)
    config64 = scan_config()
    with pytest.raises(PeerUnavailable, match="d a multiple of 64"):
        get_method("flashrnn").build(narrow, None, config64)


def test_a_non_finite_or_misshapen_output_of_another_model_is_flagged() -> None:
    ref = NotComparable("not comparable: different model", (2, 3))
    ok = _check_not_comparable(torch.zeros(2, 3), ref)
    assert ok.err_ok is None and ok.note == "output finite, shape [2, 3]"
    nan = _check_not_comparable(torch.tensor([[0.0, math.nan, 0.0], [0.0] * 3]), ref)
    assert nan.err_ok is False and nan.note == "non-finite forward output"
    shape = _check_not_comparable(torch.zeros(3, 2), ref)
    assert shape.err_ok is False and "(3, 2) != (2, 3)" in shape.note


# ------------------------------------------------------------------------------------------------
# Scope "scan": floor bytes, configuration, CLI
# ------------------------------------------------------------------------------------------------


def test_scan_floor_bytes() -> None:
    n = 2 * 5 * 3
    assert scan_floor_bytes(2, 5, 3, torch.float32, "fwd") == 3 * n * 4  # jac, rhs in; y out
    # + backward: jac, y, dy in; djac, drhs out
    assert scan_floor_bytes(2, 5, 3, torch.float32, "fwd_bwd") == 8 * n * 4
    assert scan_floor_bytes(2, 5, 3, torch.bfloat16, "fwd_bwd") == 8 * n * 2
    with pytest.raises(ValueError, match="direction must be 'fwd' or 'fwd_bwd', got 'bwd'"):
        scan_floor_bytes(2, 5, 3, torch.float32, "bwd")


def test_scan_scope_needs_a_method_serving_it() -> None:
    with pytest.raises(ValueError, match="methods must include one serving scope 'scan'"):
        scan_config(methods=("newton_unfused",))
    with pytest.raises(ValueError, match="scan_shapes must hold at least one"):
        scan_config(scan_shapes=())
    default = BenchConfig(device="cpu")
    assert default.scopes == ("recurrence", "layer")
    assert [tuple(s) for s in default.scan_shapes] == [
        (8, 4096, 1536), (8, 16384, 256), (1, 65536, 256), (64, 4096, 1024), (8, 65536, 1536)
    ]  # fmt: skip


def test_cli_help_lists_the_scan_scope_and_the_peers(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    raw = capsys.readouterr().out
    text = " ".join(raw.split())  # argparse wraps the help
    assert "--scan-shape" in text and "scan: the linear recurrence alone" in text
    for name in ("scan_diag_triton", "scan_diag_eager", *PEER_METHODS):
        assert name in text
    peers = [line.split()[0] for line in raw.splitlines() if line.endswith(" [peer]")]
    assert sorted(peers) == sorted(PEER_METHODS)


@pytest.mark.usefixtures("no_peers")
def test_cli_scan_run(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--out", str(tmp_path), "--quick", "--device", "cpu", "--scopes", "scan",
                 "--methods", "scan_diag_eager", "accelerated_scan", "--scan-shape", "2x16x3",
                 "--no-progress", "--no-plot"])  # fmt: skip
    assert code == 0
    text = capsys.readouterr().out
    assert "peer accelerated_scan: accelerated-scan " in text and " skipped: " in text
    assert "| scan_diag | fp32 | scan | fwd | 2 | 16 | 3 | scan_diag_eager |" in text


# ------------------------------------------------------------------------------------------------
# The real peers, on a GPU (skipped without CUDA or without the peer)
# ------------------------------------------------------------------------------------------------

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
REAL_SCAN_MODULES = {
    "accelerated_scan": "accelerated_scan.scalar",
    "accelerated_scan_warp": "accelerated_scan.warp",
    "fla_chunk_hgrn": "fla.ops.hgrn",
}


def gpu_config(**overrides: object) -> BenchConfig:
    return dataclasses.replace(
        scan_config(), **{"device": "cuda", "copy_bytes": 2**26, "repeats": 2, **overrides}
    )


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("name", SCAN_PEERS)
def test_real_scan_peer_matches_the_float64_reference(name: str) -> None:
    pytest.importorskip(REAL_SCAN_MODULES[name])
    shapes = (Shape(2, 1024, 48), Shape(1, 4096, 17), Shape(3, 1000, 64))
    config = gpu_config(methods=("scan_diag_triton", name), scan_shapes=shapes,
                        dtypes=("fp32", "bf16"))  # fmt: skip
    result = run_bench(config, progress=False)
    (status,) = result.environment["peers"]
    assert status["used"] and status["version"], status
    for r in result.records:
        if r.method == "accelerated_scan_warp" and r.steps == 1000:
            assert r.status == "skipped" and "power of two" in r.skipped_reason
            continue
        assert r.status == "ok", (r.method, r.skipped_reason)
        if r.method == "accelerated_scan_warp" and r.dtype == "bf16":
            # Its CUDA scan carries the running products and sums in the storage dtype (bf16
            # tuples), so over thousands of steps it misses a tolerance meant for fp32
            # accumulation; the bench must still measure and record that error.
            assert r.max_err is not None and math.isfinite(r.max_err) and r.err_ok is not None
        else:
            assert r.err_ok is True, (r.method, r.dtype, r.max_err, r.err_tol)
        assert r.pct_of_floor is not None and r.pct_of_floor > 0


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("name", SCAN_PEERS)
def test_real_scan_peer_gradients_match_scan_diag(name: str) -> None:
    module = pytest.importorskip(REAL_SCAN_MODULES[name])
    torch.manual_seed(3)
    case = Case(SCAN_CELL, Shape(2, 1024, 24), "fp32", "scan", torch.device("cuda"))
    inputs = make_scan_inputs(case)
    expected, grad_jac, grad_rhs = _eager_grads(
        inputs.jac.double(), inputs.rhs.double(), inputs.cotangent.double()
    )
    if name == "fla_chunk_hgrn":
        x, g = fla_hgrn_inputs(inputs.jac, inputs.rhs)
        y = module.chunk_hgrn(x, g)[0]
        torch.autograd.backward(y, inputs.cotangent)
        got = (y, g.grad, x.grad)
        want = (expected, grad_jac * inputs.jac.detach().double(), grad_rhs)
    else:
        forget, tokens = accelerated_scan_layout(inputs.jac, inputs.rhs)
        y = module.scan(forget, tokens)
        torch.autograd.backward(y, inputs.cotangent.transpose(1, 2).contiguous())
        assert forget.grad is not None and tokens.grad is not None
        got = (y.transpose(1, 2), forget.grad.transpose(1, 2), tokens.grad.transpose(1, 2))
        want = (expected, grad_jac, grad_rhs)
    for label, a, b in zip(("y", "d jac (or g)", "d rhs"), got, want, strict=True):
        assert a is not None, label
        scale = max(1.0, float(b.abs().max()))
        err = float((a.detach().double() - b).abs().max())
        assert err <= 1e-4 * scale, (label, err, scale)


@pytest.mark.cuda
@needs_cuda
def test_real_flashrnn_runs_its_models() -> None:
    pytest.importorskip("flashrnn")
    config = BenchConfig(
        device="cuda",
        cells=("ParaLSTM", "ParaSLSTM", "ParaGRU"),
        methods=("newton_unfused", "flashrnn"),
        shapes=(Shape(8, 64, 128),),
        dtypes=("bf16",),
        warmup=1,
        repeats=2,
        copy_bytes=2**26,
    )
    result = run_bench(config, progress=False)
    (status,) = result.environment["peers"]
    assert status["used"] and status["version"], status
    flash = {(r.cell, r.scope, r.direction): r for r in result.records if r.method == "flashrnn"}
    assert len(flash) == 3 * 2 * 2
    for (cell, _, direction), r in flash.items():
        # FlashRNN 1.0.8's triton_fused LSTM backward does not compile in bf16 with Triton 3.6,
        # and the GRU's CUDA build needs nvcc: such a first call is a skip, with the reason.
        if r.status == "skipped" and (cell == "ParaGRU" or direction == "fwd_bwd"):
            assert "failed at its first call" in r.skipped_reason, r.skipped_reason
            continue
        assert r.status == "ok", (cell, direction, r.skipped_reason)
        assert r.reference == "not comparable: different model" and r.err_ok is None
        assert "output finite" in r.note
    for scope in ("layer", "recurrence"):
        assert flash[("ParaSLSTM", scope, "fwd_bwd")].status == "ok"
