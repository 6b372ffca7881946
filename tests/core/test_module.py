"""ParaRNN: train (Newton) vs eval (sequential), stacks, chunked training, decode, bad input."""

from __future__ import annotations

import pytest
import torch

import pararnn_core as pc

F64 = torch.float64


def _stack() -> pc.ParaRNN:
    return pc.ParaRNN(
        [pc.ParaGRU(3, 5, dtype=F64), pc.ParaLSTM(5, 4, dtype=F64), pc.ParaSLSTM(4, 6, dtype=F64)],
        pc.NewtonConfig(max_iters=10, tol=1e-12),
    )


def test_train_equals_eval_and_stats_are_refreshed(assert_close):
    model = _stack()
    x = torch.randn(2, 60, 3, dtype=F64)
    model.train()
    y_train = model(x)
    first = model.last_stats
    assert len(first) == 3 and all(isinstance(s, pc.NewtonStats) and s.converged for s in first)
    assert y_train.shape == (2, 60, 6)
    model(torch.randn(2, 7, 3, dtype=F64))
    assert model.last_stats is not first and len(model.last_stats) == 3
    model.eval()
    stats_before = model.last_stats
    y_eval = model(x)
    assert model.last_stats is stats_before  # eval leaves them
    assert_close(y_train, y_eval, atol=1e-9, what="train vs eval output")


def test_train_gradients_equal_eval_gradients(assert_rel_close):
    model = _stack()
    x = torch.randn(2, 40, 3, dtype=F64, requires_grad=True)
    grads = {}
    for mode in ("train", "eval"):
        model.train(mode == "train")
        y = model(x)
        grads[mode] = torch.autograd.grad(y.square().sum(), [x, *model.parameters()])
    names = ["x", *(n for n, _ in model.named_parameters())]
    for name, g_train, g_eval in zip(names, grads["train"], grads["eval"], strict=True):
        assert_rel_close(g_train, g_eval, rel=1e-8, what=f"grad {name}")


@pytest.mark.parametrize("train", [True, False])
def test_chunked_run_equals_full_run(train, assert_close, assert_rel_close):
    model = pc.ParaRNN(pc.ParaLSTM(3, 4, dtype=F64), pc.NewtonConfig(max_iters=10, tol=1e-12))
    model.train(train)
    x = torch.randn(2, 50, 3, dtype=F64, requires_grad=True)
    y_full, state_full = model(x, return_state=True)
    assert isinstance(state_full, torch.Tensor) and state_full.shape == (2, 4, 2)
    y1, state = model(x[:, :20], return_state=True)
    y2, state2 = model(x[:, 20:], state, return_state=True)
    assert_close(torch.cat([y1, y2], 1), y_full, atol=1e-9, what="chunked output")
    assert_close(state2, state_full, atol=1e-9, what="final state")
    # Gradients flow through the carried state.
    (g_full,) = torch.autograd.grad(y_full.sum(), x)
    (g_chunk,) = torch.autograd.grad(torch.cat([y1, y2], 1).sum(), x)
    assert_rel_close(g_chunk, g_full, rel=1e-8, what="chunked grad x")


def test_stack_state_is_a_list_and_step_decodes(assert_close):
    model = _stack()
    x = torch.randn(2, 12, 3, dtype=F64)
    model.train()
    y, states = model(x, return_state=True)
    assert isinstance(states, list) and [tuple(s.shape) for s in states] == [
        (2, 5),
        (2, 4, 2),
        (2, 6, 3),
    ]
    state = None
    outputs = []
    for t in range(12):
        y_t, state = model.step(x[:, t], state)
        outputs.append(y_t)
    assert_close(torch.stack(outputs, 1), y, atol=1e-9, what="decode vs forward")
    assert isinstance(state, list)
    for i, (got, expected) in enumerate(zip(state, states, strict=True)):
        assert_close(got, expected, atol=1e-9, what=f"decode state[{i}]")


def test_h0_per_layer_with_none_entries(assert_close):
    model = _stack()
    x = torch.randn(2, 9, 3, dtype=F64)
    h_gru = 0.5 * torch.randn(2, 5, dtype=F64)
    y = model(x, [h_gru, None, None])
    model.eval()
    layer1 = model.cells[0]
    ref = pc.sequential_apply(layer1, x, h_gru)
    ref = pc.sequential_apply(model.cells[1], layer1.output(ref))
    ref = model.cells[2].output(pc.sequential_apply(model.cells[2], model.cells[1].output(ref)))
    assert_close(y, ref, atol=1e-9, what="with h0 for layer 0")


# ------------------------------------------------------------------------------------------------
# Bad input: every error names its argument.
# ------------------------------------------------------------------------------------------------


@pytest.fixture
def gru_model() -> pc.ParaRNN:
    return pc.ParaRNN(pc.ParaGRU(3, 4))


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize(
    ("make_x", "error", "match"),
    [
        (lambda: [[1.0, 2.0, 3.0]], TypeError, "x must be a torch.Tensor"),
        (lambda: torch.randn(4, 3), ValueError, r"x must have 3 dimensions \[B, T, d_in\], got 2"),
        (lambda: torch.randn(2, 5, 3, 1), ValueError, "x must have 3 dimensions"),
        (lambda: torch.randn(2, 5, 7), ValueError, "x must have d_in = 3 features.*got 7"),
        (lambda: torch.randn(2, 0, 3), ValueError, "x must have at least one time step"),
        (lambda: torch.randn(0, 5, 3), ValueError, "x must have at least one sequence"),
        (
            lambda: torch.randn(2, 5, 3, dtype=F64),
            TypeError,
            "x must have the cell's parameter dtype",
        ),
        (lambda: torch.ones(2, 5, 3, dtype=torch.int64), TypeError, "x must have a floating dtype"),
        (
            lambda: torch.randn(2, 5, 3, device="meta"),
            ValueError,
            "x must be on the cell's parameter device cpu, got meta",
        ),
    ],
)
def test_bad_x(gru_model, train, make_x, error, match):
    gru_model.train(train)
    with pytest.raises(error, match=match):
        gru_model(make_x())


@pytest.mark.parametrize(
    ("h0", "error", "match"),
    [
        (torch.zeros(2, 5), ValueError, r"h0 must have shape \[B, d_h\] = \(2, 4\).*got \(2, 5\)"),
        (torch.zeros(3, 4), ValueError, r"h0 must have shape .*got \(3, 4\)"),
        (torch.zeros(2, 4, dtype=F64), TypeError, "h0 must have the input's dtype"),
        (torch.zeros(2, 4, device="meta"), ValueError, "h0 must be on the input's device"),
        ("zeros", TypeError, "h0 must be a Tensor"),
    ],
)
def test_bad_h0(gru_model, h0, error, match):
    x = torch.randn(2, 5, 3)
    with pytest.raises(error, match=match):
        gru_model(x, h0)
    with pytest.raises(error, match=match):
        gru_model.eval()(x, h0)
    if isinstance(h0, torch.Tensor):
        with pytest.raises(error, match=match):
            pc.newton_apply(gru_model.cells[0], x, h0)
        with pytest.raises(error, match=match):
            pc.sequential_apply(gru_model.cells[0], x, h0)


def test_bad_block_h0_names_layer_and_layout():
    model = _stack()
    x = torch.randn(2, 5, 3, dtype=F64)
    with pytest.raises(ValueError, match=r"h0\[1\] must have shape \[B, d_h, k\] = \(2, 4, 2\)"):
        model(x, [None, torch.zeros(2, 4, dtype=F64), None])
    with pytest.raises(ValueError, match="h0 must hold one state per layer"):
        model(x, [None, None])
    with pytest.raises(TypeError, match="h0 must be a list of 3 per-layer states"):
        model(x, torch.zeros(2, 5, dtype=F64))


def test_bad_step_input(gru_model):
    with pytest.raises(ValueError, match=r"x_t must have 2 dimensions \[B, d_in\]"):
        gru_model.step(torch.randn(2, 1, 3))
    with pytest.raises(ValueError, match="x_t must have d_in = 3"):
        gru_model.step(torch.randn(2, 5))
    with pytest.raises(ValueError, match=r"state must have shape"):
        gru_model.step(torch.randn(2, 3), torch.zeros(2, 3))
    with pytest.raises(TypeError, match="x_t must have the cell's parameter dtype"):
        gru_model.step(torch.randn(2, 3, dtype=F64))


def test_bad_construction():
    with pytest.raises(ValueError, match=r"cells\[1\].d_in must equal cells\[0\].d_h = 4, got 5"):
        pc.ParaRNN([pc.ParaGRU(3, 4), pc.ParaGRU(5, 4)])
    with pytest.raises(ValueError, match="at least one cell"):
        pc.ParaRNN([])
    with pytest.raises(TypeError, match=r"cells\[0\] must be a ParaCell"):
        pc.ParaRNN([torch.nn.Linear(3, 4)])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="config must be a NewtonConfig"):
        pc.ParaRNN(pc.ParaGRU(3, 4), {"max_iters": 3})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"cell must be a pararnn_core\.ParaCell"):
        pc.newton_apply(torch.nn.Linear(3, 4), torch.randn(2, 5, 3))  # type: ignore[arg-type]


def test_module_is_a_plain_module():
    model = pc.ParaRNN([pc.ParaGRU(3, 4), pc.ParaLSTM(4, 2)])
    names = {name for name, _ in model.named_parameters()}
    assert "cells.0.recurrent_weight" in names and "cells.1.peephole_weight" in names
    assert model.d_in == 3 and model.d_h == 2
    model.to(F64)
    assert all(p.dtype == F64 for p in model.parameters())
    assert model(torch.randn(1, 3, 3, dtype=F64)).dtype == F64
