"""Mamba-2 SSD scans (naive == chunked == triton) and the Mamba2 mixer's state handling."""
import math

import pytest
import torch

from ssm import Mamba2, ssd_chunked, ssd_naive, ssd_triton


def make_inputs(b, t, h, p, g, n, dtype=torch.float64, seed=0, max_log_decay=2.0):
    """Random SSD inputs with a non-zero initial state; per-step log decay dt*A in [-max_log_decay, 0)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(b, t, h, p, generator=gen, dtype=dtype)
    dt = torch.rand(b, t, h, generator=gen, dtype=dtype) + 0.01  # (0.01, 1.01)
    A = -(torch.rand(h, generator=gen, dtype=dtype) * (max_log_decay - 0.1) + 0.1) / 1.01
    B = torch.randn(b, t, g, n, generator=gen, dtype=dtype)
    C = torch.randn(b, t, g, n, generator=gen, dtype=dtype)
    s0 = torch.randn(b, h, p, n, generator=gen, dtype=dtype)
    return x, dt, A, B, C, s0


def assert_close(a, b, tol):
    torch.testing.assert_close(a.double(), b.double(), rtol=tol, atol=tol)


# (b, t, h, p, g, n, chunk_size): g > 1, T not a multiple of the chunk, T shorter than a chunk, T = 1.
SHAPES = [
    (2, 37, 4, 8, 1, 16, 16),
    (1, 64, 4, 16, 2, 8, 16),
    (2, 70, 6, 4, 3, 32, 32),
    (1, 5, 2, 8, 2, 4, 64),
    (3, 1, 2, 4, 1, 8, 8),
]


@pytest.mark.parametrize("shape", SHAPES)
def test_naive_chunked_triton_agree(shape):
    *dims, chunk = shape
    x, dt, A, B, C, s0 = make_inputs(*dims)
    y_ref, s_ref = ssd_naive(x, dt, A, B, C, initial_state=s0)
    y, s = ssd_chunked(x, dt, A, B, C, initial_state=s0, chunk_size=chunk)
    assert_close(y, y_ref, 1e-10)
    assert_close(s, s_ref, 1e-10)
    y_tr, s_tr = ssd_triton(*(v.float() for v in (x, dt, A, B, C, s0)))  # the kernel computes in float32
    assert y_tr.dtype == torch.float32 and s_tr.dtype == torch.float32
    assert_close(y_tr, y_ref, 1e-4)
    assert_close(s_tr, s_ref, 1e-4)


def test_zero_initial_state_is_default_and_dtypes():
    x, dt, A, B, C, _ = make_inputs(2, 20, 2, 4, 1, 8, dtype=torch.float32)
    zeros = torch.zeros(2, 2, 4, 8)
    for scan in (ssd_naive, ssd_chunked, ssd_triton):
        y, s = scan(x, dt, A, B, C)
        y0, s0 = scan(x, dt, A, B, C, initial_state=zeros)
        assert y.dtype == torch.float32 and s.dtype == torch.float32 and y.shape == x.shape
        assert torch.equal(y, y0) and torch.equal(s, s0)
    # bf16 inputs: computed in float32, y back in bf16, state float32.
    y, s = ssd_chunked(x.bfloat16(), dt, A, B.bfloat16(), C.bfloat16())
    assert y.dtype == torch.bfloat16 and s.dtype == torch.float32


def test_strong_decay_is_finite_and_agrees():
    # dt * A down to about -10 per step: cumulative log decays reach ~-600 inside a 64-chunk.
    x, dt, A, B, C, s0 = make_inputs(1, 70, 4, 8, 2, 16, max_log_decay=10.0)
    y_ref, s_ref = ssd_naive(x, dt, A, B, C, initial_state=s0)
    assert (dt * A).min() < -9
    for dtype, tol in ((torch.float64, 1e-10), (torch.float32, 1e-4)):
        args = [v.detach().to(dtype, copy=True) for v in (x, dt, A, B, C, s0)]
        y, s = ssd_chunked(*args[:5], initial_state=args[5].requires_grad_(), chunk_size=64)
        assert torch.isfinite(y).all() and torch.isfinite(s).all()
        assert_close(y, y_ref, tol)
        assert_close(s, s_ref, tol)
        (y.sum() + s.sum()).backward()
        assert torch.isfinite(args[5].grad).all()
    y, s = ssd_triton(*(v.float() for v in (x, dt, A, B, C, s0)))
    assert_close(y, y_ref, 1e-4)
    assert_close(s, s_ref, 1e-4)


def _grads(scan, inputs, w_y, w_s, **kwargs):
    inputs = [v.detach().clone().requires_grad_() for v in inputs]
    y, s = scan(*inputs[:5], initial_state=inputs[5], **kwargs)
    ((y * w_y).sum() + (s * w_s).sum()).backward()
    return [v.grad for v in inputs]


def test_gradients_match_naive():
    names = ["x", "dt", "A", "B", "C", "initial_state"]
    inputs = make_inputs(2, 23, 4, 4, 2, 8)
    w_y = torch.randn(2, 23, 4, 4, dtype=torch.float64)
    w_s = torch.randn(2, 4, 4, 8, dtype=torch.float64)
    ref = _grads(ssd_naive, inputs, w_y, w_s)
    for name, g, r in zip(names, _grads(ssd_chunked, inputs, w_y, w_s, chunk_size=8), ref):
        assert g is not None, name
        assert_close(g, r, 1e-9)
    # Triton forward in float32 (its backward recomputes through the chunked form).
    grads = _grads(ssd_triton, [v.float() for v in inputs], w_y.float(), w_s.float())
    for name, g, r in zip(names, grads, ref):
        assert g is not None and g.dtype == torch.float32, name
        assert_close(g, r, 1e-3)
    # Only the output used (no gradient flowing into final_state) still works.
    x = inputs[0].float().requires_grad_()
    ssd_triton(x, *(v.float() for v in inputs[1:5]))[0].sum().backward()
    assert x.grad is not None


def test_known_value_by_hand():
    # h = p = n = 1, two steps: h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t,  y_t = C_t h_t.
    x = torch.tensor([1.0, 2.0]).view(1, 2, 1, 1)
    dt = torch.tensor([0.5, 1.0]).view(1, 2, 1)
    A = torch.tensor([-1.0])
    B = torch.tensor([1.0, 3.0]).view(1, 2, 1, 1)
    C = torch.tensor([2.0, 0.5]).view(1, 2, 1, 1)
    s0 = torch.tensor([4.0]).view(1, 1, 1, 1)
    h1 = math.exp(-0.5) * 4.0 + 0.5 * 1.0 * 1.0  # 2.926122...
    h2 = math.exp(-1.0) * h1 + 1.0 * 2.0 * 3.0  # 7.076460...
    expected_y = torch.tensor([2.0 * h1, 0.5 * h2]).view(1, 2, 1, 1)
    assert abs(h2 - 7.0764604) < 1e-6
    for scan in (ssd_naive, ssd_chunked, ssd_triton):
        y, s = scan(x, dt, A, B, C, initial_state=s0)
        assert_close(y, expected_y, 1e-6)
        assert_close(s, torch.tensor([h2]).view(1, 1, 1, 1), 1e-6)


@pytest.mark.parametrize("scan", [ssd_naive, ssd_chunked, ssd_triton])
def test_bad_shapes_raise_value_error(scan):
    x, dt, A, B, C, s0 = make_inputs(2, 8, 4, 4, 2, 8, dtype=torch.float32)
    with pytest.raises(ValueError, match=r"B must have shape \[b, t, g, n\]"):
        scan(x, dt, A, B[..., 0], C)
    with pytest.raises(ValueError, match=r"B must have shape .*h % g == 0"):
        scan(x, dt, A, torch.randn(2, 8, 3, 8), C)
    with pytest.raises(ValueError, match=r"C must have shape \[b, t, g, n\] = \[2, 8, 2, 8\], got \[2, 8, 2, 7\]"):
        scan(x, dt, A, B, C[..., :7])
    with pytest.raises(ValueError, match=r"dt must have shape \[b, t, h\] = \[2, 8, 4\]"):
        scan(x, dt[:, :7], A, B, C)
    with pytest.raises(ValueError, match=r"A must have shape \[h\] = \[4\]"):
        scan(x, dt, A[None], B, C)
    with pytest.raises(ValueError, match=r"x must have shape \[b, t, h, p\]"):
        scan(x[0], dt, A, B, C)
    with pytest.raises(ValueError, match=r"initial_state must have shape \[b, h, p, n\] = \[2, 4, 4, 8\]"):
        scan(x, dt, A, B, C, initial_state=s0[:, :, :, :4])
    with pytest.raises(ValueError, match=r"x must be a floating-point tensor"):
        scan(x.long(), dt, A, B, C)


# ---- Mamba2 mixer ------------------------------------------------------------------------------

def small_mixer(scan_impl="chunked", seed=0):
    torch.manual_seed(seed)
    # d_inner 64, 4 heads of 16, 2 groups, chunk 8 so that splits fall inside chunks.
    m = Mamba2(d_model=32, d_state=16, d_conv=4, expand=2, headdim=16, ngroups=2, chunk_size=8, scan_impl=scan_impl)
    with torch.no_grad():  # larger dt than the default init, so states carry real information
        m.dt_bias.add_(2.0)
    return m


def test_mixer_state_dict_matches_official_names_and_shapes():
    m = Mamba2(d_model=64, d_state=16, headdim=16, ngroups=2)  # d_inner 128, 8 heads
    conv_dim = 128 + 2 * 2 * 16
    expected = {
        "in_proj.weight": (2 * 128 + 2 * 2 * 16 + 8, 64),
        "conv1d.weight": (conv_dim, 1, 4),
        "conv1d.bias": (conv_dim,),
        "dt_bias": (8,),
        "A_log": (8,),
        "D": (8,),
        "norm.weight": (128,),
        "out_proj.weight": (64, 128),
    }
    assert {k: tuple(v.shape) for k, v in m.state_dict().items()} == expected
    for p in (m.A_log, m.D, m.dt_bias):
        assert p._no_weight_decay
    dt = torch.nn.functional.softplus(m.dt_bias)
    assert (dt >= 1e-3 * 0.999).all() and (dt <= 0.1 * 1.001).all()
    A = -torch.exp(m.A_log)
    assert (A <= -1).all() and (A >= -16).all()
    m.load_state_dict({k: torch.randn_like(v) for k, v in m.state_dict().items()}, strict=True)
    state = m.zero_state(3, torch.device("cpu"))
    assert state["h"].shape == (3, 8, 16, 16) and state["conv"].shape == (3, 3, conv_dim)
    assert all(v.dtype == torch.float32 and not v.any() for v in state.values())


@pytest.mark.parametrize("a", [2, 11])  # a < d_conv, and a not aligned to the chunk of 8
def test_mixer_split_equivalence(a):
    m = small_mixer()
    x = torch.randn(2, 21, 32)
    y, state = m(x)
    y1, s1 = m(x[:, :a])
    y2, s2 = m(x[:, a:], s1)
    assert_close(torch.cat([y1, y2], 1), y, 1e-5)
    for key in ("h", "conv"):
        assert state[key].dtype == torch.float32
        assert_close(s2[key], state[key], 1e-5)


def test_mixer_step_equivalence_and_impls_agree():
    m = small_mixer()
    x = torch.randn(2, 13, 32)
    start = {"h": torch.randn(2, 4, 16, 16), "conv": torch.randn(2, 3, 64 + 64)}
    y, state = m(x, start)
    ys, s = [], start
    for i in range(x.shape[1]):
        yi, s = m(x[:, i:i + 1], s)
        ys.append(yi)
    assert_close(torch.cat(ys, 1), y, 1e-5)
    assert_close(s["h"], state["h"], 1e-5)
    for impl in ("naive", "triton"):
        m.scan_impl = impl
        y_i, s_i = m(x, start)
        assert_close(y_i, y, 1e-4)
        assert_close(s_i["h"], state["h"], 1e-4)
    # Gradients reach the initial state through the mixer (needed by TBTT / State Passing variants).
    m.scan_impl = "auto"
    h0 = start["h"].clone().requires_grad_()
    m(x, {"h": h0, "conv": start["conv"]})[0].sum().backward()
    assert h0.grad is not None and h0.grad.abs().sum() > 0
