import math

import pytest
import torch

from ssm import (
    Mamba,
    selective_scan_chunked,
    selective_scan_naive,
    selective_scan_triton,
)


def _inputs(b=2, t=19, d=12, n=5, dtype=torch.float32, strong=False, seed=0):
    """Random scan inputs; strong=True gives per-step log decays delta * A down to about -200."""
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(b, t, d, generator=g, dtype=dtype)
    delta = torch.rand(b, t, d, generator=g, dtype=dtype) * (10.0 if strong else 0.5) + 1e-3
    A = -torch.rand(d, n, generator=g, dtype=dtype) * (20.0 if strong else 2.0) - 0.05
    B = torch.randn(b, t, n, generator=g, dtype=dtype)
    C = torch.randn(b, t, n, generator=g, dtype=dtype)
    h0 = torch.randn(b, d, n, generator=g, dtype=dtype) * 3.0
    return u, delta, A, B, C, h0


def _chunked8(*args, **kwargs):
    return selective_scan_chunked(*args, chunk_size=8, **kwargs)  # t = 19: 3 chunks, the last padded


SCANS = {"chunked": _chunked8, "triton": selective_scan_triton}


@pytest.mark.parametrize("impl", list(SCANS))
@pytest.mark.parametrize("strong", [False, True])
def test_scans_match_naive(impl, strong):
    u, delta, A, B, C, h0 = _inputs(strong=strong)
    y_ref, h_ref = selective_scan_naive(u, delta, A, B, C, initial_state=h0)
    y, h = SCANS[impl](u, delta, A, B, C, initial_state=h0)
    assert y.shape == (2, 19, 12) and h.shape == (2, 12, 5) and h.dtype == torch.float32
    assert torch.isfinite(y).all() and torch.isfinite(h).all()
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(h, h_ref, atol=1e-5, rtol=1e-5)
    # None means a zero initial state
    y0, h0_out = SCANS[impl](u, delta, A, B, C)
    y0_ref, h0_ref = selective_scan_naive(u, delta, A, B, C, initial_state=torch.zeros_like(h0))
    torch.testing.assert_close(y0, y0_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(h0_out, h0_ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("chunk_size", [1, 4, 7, 19, 64])
def test_chunked_any_chunk_size(chunk_size):
    u, delta, A, B, C, h0 = _inputs(t=19, dtype=torch.float64, strong=True)
    y_ref, h_ref = selective_scan_naive(u, delta, A, B, C, initial_state=h0)
    y, h = selective_scan_chunked(u, delta, A, B, C, initial_state=h0, chunk_size=chunk_size)
    torch.testing.assert_close(y, y_ref, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(h, h_ref, atol=1e-10, rtol=1e-10)


def test_hand_computed_value():
    # delta = 1 and A = [-ln 2, -ln 4]: the state decays by 1/2 and 1/4 per step.
    u = torch.tensor([[[2.0], [4.0]]])  # [b=1, t=2, d=1]
    delta = torch.ones(1, 2, 1)
    A = torch.tensor([[-math.log(2.0), -math.log(4.0)]])  # [d=1, n=2]
    B = torch.tensor([[[1.0, 2.0], [1.0, 0.0]]])
    C = torch.tensor([[[3.0, 1.0], [1.0, 2.0]]])
    h0 = torch.tensor([[[4.0, 8.0]]])
    # h1 = [4/2 + 2*1, 8/4 + 2*2] = [4, 6], y1 = 4*3 + 6*1 = 18
    # h2 = [4/2 + 4*1, 6/4 + 4*0] = [6, 1.5], y2 = 6*1 + 1.5*2 = 9
    for scan in (selective_scan_naive, _chunked8, selective_scan_triton):
        y, h = scan(u, delta, A, B, C, initial_state=h0)
        torch.testing.assert_close(y, torch.tensor([[[18.0], [9.0]]]))
        torch.testing.assert_close(h, torch.tensor([[[6.0, 1.5]]]))


def _loss_grads(scan, inputs, gy, gh):
    """Gradients of <y, gy> + <final_state, gh> w.r.t. (u, delta, A, B, C, initial_state)."""
    leaves = [x.detach().clone().requires_grad_(True) for x in inputs]
    y, h = scan(*leaves[:5], initial_state=leaves[5])
    return torch.autograd.grad((y * gy).sum() + (h * gh).sum(), leaves)


NAMES = ["u", "delta", "A", "B", "C", "initial_state"]


@pytest.mark.parametrize("strong", [False, True])
def test_chunked_gradients_float64(strong):
    inputs = _inputs(dtype=torch.float64, strong=strong)
    gy = torch.randn(2, 19, 12, dtype=torch.float64)
    gh = torch.randn(2, 12, 5, dtype=torch.float64)
    ref = _loss_grads(selective_scan_naive, inputs, gy, gh)
    got = _loss_grads(_chunked8, inputs, gy, gh)
    for name, g, r in zip(NAMES, got, ref):
        torch.testing.assert_close(g, r, atol=1e-9, rtol=1e-9, msg=f"grad of {name}")


def test_triton_gradients():
    inputs = _inputs(t=11, d=6, n=3)
    gy, gh = torch.randn(2, 11, 6), torch.randn(2, 6, 3)
    ref = _loss_grads(selective_scan_naive, inputs, gy, gh)
    got = _loss_grads(selective_scan_triton, inputs, gy, gh)
    for name, g, r in zip(NAMES, got, ref):
        torch.testing.assert_close(g, r, atol=1e-4, rtol=1e-4, msg=f"grad of {name}")
    # only some inputs need grad, and a loss on y alone (final_state unused)
    u, delta, A, B, C, h0 = (x.clone() for x in inputs)
    h0.requires_grad_(True)
    (selective_scan_triton(u, delta, A, B, C, initial_state=h0)[0] * gy).sum().backward()
    h0_ref = inputs[5].clone().requires_grad_(True)
    (selective_scan_naive(u, delta, A, B, C, initial_state=h0_ref)[0] * gy).sum().backward()
    torch.testing.assert_close(h0.grad, h0_ref.grad, atol=1e-4, rtol=1e-4)


def test_bf16_inputs_upcast():
    u, delta, A, B, C, h0 = _inputs()
    y, h = selective_scan_chunked(u.bfloat16(), delta, A, B.bfloat16(), C.bfloat16(), initial_state=h0)
    assert y.dtype == torch.bfloat16 and h.dtype == torch.float32
    y_ref, h_ref = selective_scan_naive(u.bfloat16(), delta, A, B.bfloat16(), C.bfloat16(), initial_state=h0)
    torch.testing.assert_close(h, h_ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("scan", [selective_scan_naive, selective_scan_chunked, selective_scan_triton])
def test_bad_shapes_raise(scan):
    u, delta, A, B, C, h0 = _inputs(t=5)
    with pytest.raises(ValueError, match=r"u must have shape \[b, t, d\]"):
        scan(u[0], delta, A, B, C)
    with pytest.raises(ValueError, match=r"delta must have shape \[b, t, d\] = \[2, 5, 12\], got \[2, 4"):
        scan(u, delta[:, :4], A, B, C)
    with pytest.raises(ValueError, match=r"A must have shape \[d, n\] = \[12, n\]"):
        scan(u, delta, A[:5], B, C)
    with pytest.raises(ValueError, match=r"B must have shape \[b, t, n\] = \[2, 5, 5\], got \[2, 5\]"):
        scan(u, delta, A, B[..., 0], C)
    with pytest.raises(ValueError, match=r"C must have shape \[b, t, n\] = \[2, 5, 5\], got \[2, 5, 4\]"):
        scan(u, delta, A, B, C[..., :4])
    with pytest.raises(ValueError, match=r"initial_state must have shape \[b, d, n\] = \[2, 12, 5\]"):
        scan(u, delta, A, B, C, initial_state=h0[:, :, :3])
    with pytest.raises(ValueError, match=r"u must be a floating-point tensor"):
        scan(u.long(), delta, A, B, C)


# ---- the Mamba-1 mixer ----------------------------------------------------------------------


def _mixer(scan_impl="chunked", d_model=16, seed=0, **kwargs):
    torch.manual_seed(seed)
    m = Mamba(d_model, scan_impl=scan_impl, **kwargs)
    with torch.no_grad():  # non-trivial conv bias and D, so the state handling is really exercised
        m.conv1d.bias.normal_()
        m.D.normal_()
    return m


def test_state_dict_matches_official_mamba():
    m = Mamba(64)  # d_inner = 128, dt_rank = ceil(64 / 16) = 4
    expected = {
        "in_proj.weight": (256, 64),
        "conv1d.weight": (128, 1, 4),
        "conv1d.bias": (128,),
        "x_proj.weight": (4 + 2 * 16, 128),
        "dt_proj.weight": (128, 4),
        "dt_proj.bias": (128,),
        "A_log": (128, 16),
        "D": (128,),
        "out_proj.weight": (64, 128),
    }
    got = {k: tuple(v.shape) for k, v in m.state_dict().items()}
    assert got == expected
    assert m.A_log._no_weight_decay and m.D._no_weight_decay
    torch.testing.assert_close(m.A_log, torch.log(torch.arange(1, 17.0)).expand(128, 16))
    torch.testing.assert_close(m.D, torch.ones(128))
    dt = torch.nn.functional.softplus(m.dt_proj.bias)
    assert dt.min() >= 1e-3 * 0.999 and dt.max() <= 0.1 * 1.001
    assert m.dt_proj.weight.abs().max() <= 4 ** -0.5
    assert m.zero_state(3, "cpu")["h"].shape == (3, 128, 16)
    assert m.zero_state(3, "cpu")["conv"].shape == (3, 3, 128)


@pytest.mark.parametrize("a", [2, 67])  # a < d_conv, and a past the first 64-step chunk
def test_mixer_split_equivalence(a):
    m = _mixer()
    x = torch.randn(2, 150, 16)
    y, state = m(x)
    y1, s1 = m(x[:, :a])
    y2, s2 = m(x[:, a:], s1)
    torch.testing.assert_close(torch.cat([y1, y2], dim=1), y, atol=1e-5, rtol=1e-5)
    for key in ("h", "conv"):
        torch.testing.assert_close(s2[key], state[key], atol=1e-5, rtol=1e-5)


def test_mixer_token_by_token():
    m = _mixer()
    x = torch.randn(2, 9, 16)
    y, state = m(x)
    s, ys = None, []
    for i in range(x.shape[1]):
        yi, s = m(x[:, i:i + 1], s)
        ys.append(yi)
    torch.testing.assert_close(torch.cat(ys, dim=1), y, atol=1e-5, rtol=1e-5)
    for key in ("h", "conv"):
        torch.testing.assert_close(s[key], state[key], atol=1e-5, rtol=1e-5)


def test_mixer_scan_impls_agree_and_train():
    x = torch.randn(2, 7, 16)
    outs = {}
    for impl in ("naive", "chunked", "triton", "auto"):
        m = _mixer(impl)
        h0 = torch.randn(2, m.d_inner, m.d_state, requires_grad=True)
        state = {"h": h0, "conv": torch.randn(2, m.d_conv - 1, m.d_inner)}
        y, new_state = m(x, state)
        assert new_state["h"].dtype == torch.float32 and new_state["conv"].dtype == torch.float32
        (y.square().sum() + new_state["h"].sum()).backward()
        outs[impl] = (y.detach(), m.A_log.grad.clone(), m.dt_proj.bias.grad.clone(), h0.grad.clone())
    for impl in ("chunked", "triton", "auto"):
        for got, ref in zip(outs[impl], outs["naive"]):
            torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)
