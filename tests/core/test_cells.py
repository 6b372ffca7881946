"""The built-in cells: analytic Jacobians against torch.func, VJPs, init, sLSTM faithfulness."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

import pararnn_core as pc

CELLS = [pc.ParaGRU, pc.ParaLSTM, pc.ParaSLSTM]
F64 = torch.float64


def _point(cell: pc.ParaCell, batch: int, make_state) -> tuple[Tensor, Tensor]:
    h = make_state(cell, batch, F64, scale=0.6)
    u = torch.randn(batch, cell.d_u, dtype=F64)
    return h, u


def _dense_from_structured(jac: Tensor, structure: pc.Structure) -> Tensor:
    """One sample's structured Jacobian as the full ``[*S, *S]`` matrix jacrev returns."""
    if isinstance(structure, pc.Diag):
        return torch.diag_embed(jac)
    if isinstance(structure, pc.Block):
        d = jac.shape[0]
        eye = torch.eye(d, dtype=jac.dtype)
        return torch.einsum("de,dij->diej", eye, jac)
    return jac


@pytest.mark.parametrize("cls", CELLS)
def test_analytic_jacobian_matches_jacrev(cls, make_state, assert_close):
    cell = cls(3, 4, dtype=F64)
    h, u = _point(cell, 3, make_state)
    _, jac = cell.step_and_jacobian(h, u)
    assert jac.shape == (3, *cell.jacobian_shape)
    for b in range(3):
        full = torch.func.jacrev(lambda state, b=b: cell.step(state, u[b]))(h[b])
        # The full Jacobian also checks the structure: entries off the diagonal/blocks are zero.
        assert_close(
            _dense_from_structured(jac[b], cell.structure), full, atol=1e-13, what=f"J[{b}]"
        )


@pytest.mark.parametrize("cls", CELLS)
def test_step_and_jacobian_agrees_with_step_and_derived_jacobian(cls, make_state, assert_close):
    cell = cls(3, 5, dtype=F64)
    h, u = _point(cell, 4, make_state)
    out, jac = cell.step_and_jacobian(h, u)
    out_derived, jac_derived = pc.derive_jacobian(cell.step, h, u, cell.structure)
    assert_close(out, cell.step(h, u), atol=0, what="step")
    assert_close(out_derived, out, atol=1e-15, what="derived step")
    assert_close(jac, jac_derived, atol=1e-13, what="analytic vs derived J")
    assert_close(cell.jacobian(h, u), jac, atol=0, what="jacobian()")


@pytest.mark.parametrize("cls", CELLS)
def test_vjp_uses_the_given_parameters(cls, make_state, assert_close):
    """vjp with explicit (here: scaled) parameters equals autograd through a cell that has them."""
    cell = cls(3, 4, dtype=F64)
    h, u = _point(cell, 5, make_state)
    # sLSTM steps starting from the empty state have zero cotangent in ℓ; use random ones.
    grad_h = torch.randn(5, *cell.state_shape, dtype=F64)
    params = {name: 1.5 * p.detach() for name, p in cell.named_parameters()}
    vjp = cell.vjp(h, u, grad_h, params)

    other = cls(3, 4, dtype=F64)
    other.load_state_dict(params)
    h_leaf, u_leaf = h.clone().requires_grad_(), u.clone().requires_grad_()
    out = other.step(h_leaf, u_leaf)
    names = [name for name, _ in other.named_parameters()]
    grads = torch.autograd.grad(
        out, [h_leaf, u_leaf, *other.parameters()], grad_h, allow_unused=True
    )
    assert_close(vjp.grad_h_prev, grads[0], atol=1e-14, what="grad h_prev")
    assert_close(vjp.grad_u, grads[1], atol=1e-14, what="grad u")
    for name, expected in zip(names, grads[2:], strict=True):
        got = vjp.grad_params[name]
        if expected is None:
            assert got is None, name
        else:
            assert got is not None, name
            assert_close(got, expected, atol=1e-13, what=f"grad {name}")
    assert vjp.grad_params["proj.weight"] is None  # the projection is outside the step


@pytest.mark.parametrize("cls", CELLS)
def test_init_contracts(cls):
    """Along a trajectory at init every step's Jacobian has spectral radius < 1, and < 0.6 on
    average (GRU, LSTM: also ∞-norm < 1), as the cells' docstrings state."""
    cell = cls(16, 64, dtype=F64)
    x = torch.randn(4, 512, 16, dtype=F64)
    with torch.no_grad():
        states = pc.sequential_apply(cell, x)
        prev = torch.cat([cell.initial_state(4, dtype=F64)[:, None], states[:, :-1]], dim=1)
        jac = cell.jacobian(prev, cell.project(x))
    if isinstance(cell.structure, pc.Diag):
        radius = norm = jac.abs()
    else:
        radius = torch.linalg.eigvals(jac).abs().amax(-1)
        norm = jac.abs().sum(-1).amax(-1)
    assert radius.max().item() < 1.0, f"max spectral radius {radius.max().item():.4f}"
    assert radius.mean().item() < 0.6, f"mean spectral radius {radius.mean().item():.4f}"
    if not isinstance(cell, pc.ParaSLSTM):
        assert norm.max().item() < 1.0, f"max inf-norm {norm.max().item():.4f}"


def _xlstm_stabilised_h(cell: pc.ParaSLSTM, x: Tensor) -> Tensor:
    """xLSTM's stabilised sLSTM (c, n, m, h), zero initial state, the cell's parameters."""
    d = cell.d_h
    u = cell.project(x)
    r_z, r_i, r_f, r_o = cell.recurrent_weight
    batch, steps = x.shape[:2]
    c = n = m = h = torch.zeros(batch, d, dtype=x.dtype)
    out = []
    for t in range(steps):
        u_z, u_i, u_f, u_o = u[:, t].split(d, dim=-1)
        i_pre, f_pre = u_i + r_i * h, u_f + r_f * h
        log_f = torch.nn.functional.logsigmoid(f_pre)
        m_new = torch.maximum(log_f + m, i_pre)
        i_gate, f_gate = torch.exp(i_pre - m_new), torch.exp(log_f + m - m_new)
        c = f_gate * c + i_gate * torch.tanh(u_z + r_z * h)
        n = f_gate * n + i_gate
        m = m_new
        h = torch.sigmoid(u_o + r_o * h) * c / n
        out.append(h)
    return torch.stack(out, dim=1)


def test_slstm_equals_xlstm_stabilised_recurrence(assert_close):
    cell = pc.ParaSLSTM(3, 6, dtype=F64)
    with torch.no_grad():
        cell.recurrent_weight.uniform_(-1, 1)  # stronger feedback than the init, to be telling
        cell.proj.bias.normal_(0, 2)
    x = 2 * torch.randn(2, 64, 3, dtype=F64)
    with torch.no_grad():
        ours = cell.output(pc.sequential_apply(cell, x))
        reference = _xlstm_stabilised_h(cell, x)
    assert_close(ours, reference, atol=1e-12, what="sLSTM h")


@pytest.mark.parametrize("cls", CELLS)
def test_constructor_takes_device_and_dtype(cls):
    cell = cls(3, 4, device="meta", dtype=F64)
    assert all(p.device.type == "meta" and p.dtype == F64 for p in cell.parameters())
    assert cell.d_in == 3 and cell.d_h == 4
    assert cell.initial_state(2, dtype=F64).shape == (2, *cell.state_shape)


def test_state_layouts():
    assert pc.ParaGRU(3, 4).state_shape == (4,)
    assert pc.ParaLSTM(3, 4).state_shape == (4, 2)
    assert pc.ParaSLSTM(3, 4).state_shape == (4, 3)
    assert pc.ParaLSTM(3, 4).jacobian_shape == (4, 2, 2)
    assert pc.ParaSLSTM(3, 4).structure == pc.Block(3)
    empty = pc.ParaSLSTM(3, 4).initial_state(2)
    assert (empty[..., 1] == pc.cells.EMPTY_LOG_NORMALISER).all()
    assert (empty[..., 0] == 0).all() and (empty[..., 2] == 0).all()


def test_bad_cell_arguments():
    with pytest.raises(ValueError, match="mix must be 'diag'"):
        pc.ParaSLSTM(3, 4, mix="block")
    with pytest.raises(ValueError, match="d_h must be a positive int"):
        pc.ParaGRU(3, 0)
    with pytest.raises(ValueError, match="k must be a positive int"):
        pc.Block(0)
