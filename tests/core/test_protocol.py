"""The cell protocol end to end: user cells with a derived or analytic Jacobian, in each structure."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

import pararnn_core as pc

F64 = torch.float64


class LeakyTanh(pc.ParaCell):
    """Diagonal user cell, step only: ``h' = a h + (1 - a) tanh(u + w h)``, ``a = σ(β)``."""

    def __init__(self, d_in: int, d_h: int, *, dtype: torch.dtype | None = None) -> None:
        super().__init__(d_in=d_in, d_h=d_h, d_u=d_h, structure=pc.Diag())
        self.proj = nn.Linear(d_in, d_h, dtype=dtype)
        self.w = nn.Parameter(0.3 * torch.randn(d_h, dtype=dtype))
        self.beta = nn.Parameter(torch.zeros(d_h, dtype=dtype))

    def project(self, x: Tensor) -> Tensor:
        return self.proj(x)

    def step(self, h_prev: Tensor, u: Tensor) -> Tensor:
        a = torch.sigmoid(self.beta)
        return a * h_prev + (1 - a) * torch.tanh(u + self.w * h_prev)


class LeakyTanhAnalytic(LeakyTanh):
    """The same cell with its Jacobian written by hand (only ``jacobian`` overridden)."""

    def jacobian(self, h_prev: Tensor, u: Tensor) -> Tensor:
        a = torch.sigmoid(self.beta)
        t = torch.tanh(u + self.w * h_prev)
        return a + (1 - a) * (1 - t * t) * self.w


class Rotor(pc.ParaCell):
    """Block(2) user cell: a damped rotation per channel through tanh; state ``(p, q)``, output q."""

    def __init__(self, d_in: int, d_h: int, *, dtype: torch.dtype | None = None) -> None:
        super().__init__(d_in=d_in, d_h=d_h, d_u=2 * d_h, structure=pc.Block(2))
        self.proj = nn.Linear(d_in, 2 * d_h, dtype=dtype)
        self.angle = nn.Parameter(torch.rand(d_h, dtype=dtype))
        self.radius = nn.Parameter(torch.full((d_h,), 0.6, dtype=dtype))

    def project(self, x: Tensor) -> Tensor:
        return self.proj(x)

    def step(self, h_prev: Tensor, u: Tensor) -> Tensor:
        p, q = h_prev[..., 0], h_prev[..., 1]
        u_p, u_q = u.split(self.d_h, dim=-1)
        cos, sin = torch.cos(self.angle), torch.sin(self.angle)
        p_new = torch.tanh(self.radius * (cos * p - sin * q) + u_p)
        q_new = torch.tanh(self.radius * (sin * p + cos * q) + u_q)
        return torch.stack([p_new, q_new], dim=-1)


class SmallDense(pc.ParaCell):
    """Dense user cell: ``h' = tanh(W h + u)``, a full d x d recurrent matrix (small d)."""

    def __init__(self, d_in: int, d_h: int, *, dtype: torch.dtype | None = None) -> None:
        super().__init__(d_in=d_in, d_h=d_h, d_u=d_h, structure=pc.Dense())
        self.proj = nn.Linear(d_in, d_h, dtype=dtype)
        self.recurrent = nn.Parameter(0.5 * torch.randn(d_h, d_h, dtype=dtype) / d_h**0.5)

    def project(self, x: Tensor) -> Tensor:
        return self.proj(x)

    def step(self, h_prev: Tensor, u: Tensor) -> Tensor:
        return torch.tanh(h_prev @ self.recurrent.T + u)


USER_CELLS = [LeakyTanh, LeakyTanhAnalytic, Rotor, SmallDense]


@pytest.mark.parametrize("cls", USER_CELLS)
def test_user_cell_newton_equals_sequential(cls, assert_close, to_dtype):
    cell = cls(3, 4, dtype=F64)
    x = torch.randn(2, 300, 3, dtype=F64)
    h0 = 0.5 * torch.randn(2, *cell.state_shape, dtype=F64)
    with torch.no_grad():
        reference = pc.sequential_apply(cell, x, h0)
        states, stats = pc.newton_apply(
            cell, x, h0, config=pc.NewtonConfig(max_iters=10, tol=1e-12)
        )
        states32, _ = pc.newton_apply(to_dtype(cell, torch.float32), x.float(), h0.float())
    assert stats.converged and stats.backend == "eager"
    assert_close(states, reference, atol=1e-9, what=f"{cls.__name__} float64")
    assert_close(states32, reference, atol=1e-5, what=f"{cls.__name__} float32")


@pytest.mark.parametrize("cls", USER_CELLS)
def test_user_cell_gradients_equal_bptt(cls, assert_rel_close):
    cell = cls(3, 4, dtype=F64)
    x = torch.randn(2, 40, 3, dtype=F64, requires_grad=True)
    h0 = (0.5 * torch.randn(2, *cell.state_shape, dtype=F64)).requires_grad_()
    grads = {}
    config = pc.NewtonConfig(max_iters=10, tol=1e-12)
    for name, solve in (
        ("newton", lambda: pc.newton_apply(cell, x, h0, config=config)[0]),
        ("bptt", lambda: pc.sequential_apply(cell, x, h0)),
    ):
        out = cell.output(solve())
        grads[name] = torch.autograd.grad(out.sin().sum(), [x, h0, *cell.parameters()])
    names = ["x", "h0", *(n for n, _ in cell.named_parameters())]
    for n, g, r in zip(names, grads["newton"], grads["bptt"], strict=True):
        assert_rel_close(g, r, rel=1e-8, what=f"{cls.__name__} grad {n}")


@pytest.mark.parametrize("cls", [LeakyTanh, Rotor, SmallDense])
def test_user_cell_gradcheck(cls):
    cell = cls(2, 2, dtype=F64)
    x = torch.randn(2, 9, 2, dtype=F64, requires_grad=True)
    h0 = (0.5 * torch.randn(2, *cell.state_shape, dtype=F64)).requires_grad_()
    config = pc.NewtonConfig(max_iters=9, tol=1e-14)  # exact after T = 9 updates

    def run(x: Tensor, h0: Tensor, *params: Tensor) -> Tensor:
        return pc.newton_apply(cell, x, h0, config=config)[0]

    assert torch.autograd.gradcheck(run, (x, h0, *cell.parameters()), eps=1e-6, atol=1e-7)


def test_derived_jacobian_shapes_and_values(assert_close):
    for cell in (LeakyTanh(3, 4, dtype=F64), Rotor(3, 4, dtype=F64), SmallDense(3, 4, dtype=F64)):
        h = 0.5 * torch.randn(5, 7, *cell.state_shape, dtype=F64)
        u = torch.randn(5, 7, cell.d_u, dtype=F64)
        jac = cell.jacobian(h, u)
        assert jac.shape == (5, 7, *cell.jacobian_shape)
        full = torch.func.jacrev(lambda s, cell=cell, u=u: cell.step(s, u[2, 3]))(h[2, 3])
        if isinstance(cell.structure, pc.Diag):
            full = torch.diagonal(full)
        elif isinstance(cell.structure, pc.Block):
            full = torch.einsum("dide->die", full)
        assert_close(jac[2, 3], full, atol=1e-14, what=f"{type(cell).__name__} J")


def test_analytic_override_is_used():
    cell = LeakyTanhAnalytic(3, 4, dtype=F64)
    calls = []
    original = cell.jacobian

    def spy(h_prev: Tensor, u: Tensor) -> Tensor:
        calls.append(h_prev.shape)
        return original(h_prev, u)

    cell.jacobian = spy  # type: ignore[method-assign]
    states, _ = pc.newton_apply(cell, torch.randn(2, 11, 3, dtype=F64))
    states.sum().backward()
    assert len(calls) == 4  # three Newton iterations and the backward


def test_user_cell_in_a_stack_with_builtins(assert_close):
    model = pc.ParaRNN(
        [Rotor(3, 4, dtype=F64), pc.ParaGRU(4, 5, dtype=F64), SmallDense(5, 3, dtype=F64)]
    )
    x = torch.randn(2, 30, 3, dtype=F64)
    y_train = model(x)
    assert [s.iters for s in model.last_stats] == [3, 3, 3]
    y_eval = model.eval()(x)
    assert_close(y_train, y_eval, atol=1e-6, what="stack with user cells")


def test_incomplete_cell_says_what_is_missing():
    class NoStep(pc.ParaCell):
        def __init__(self) -> None:
            super().__init__(d_in=2, d_h=2, d_u=2, structure=pc.Diag())

        def project(self, x: Tensor) -> Tensor:
            return x

    with pytest.raises(NotImplementedError, match="NoStep must implement step"):
        pc.sequential_apply(NoStep(), torch.randn(1, 3, 2))
    with pytest.raises(TypeError, match="structure must be Diag"):
        pc.ParaCell(d_in=2, d_h=2, d_u=2, structure="diag")  # type: ignore[arg-type]
