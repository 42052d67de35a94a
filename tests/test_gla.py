"""Tests for gla.py: the three GLA scans agree (values and gradients), and the layers honour the
layer contract (split / token-by-token equivalence, stateless MLP, input validation)."""
import math

import pytest
import torch
import torch.nn.functional as F

from gla import GLA, SwiGLU, gla_chunked, gla_naive, gla_triton

SCANS = {"naive": gla_naive, "chunked": gla_chunked, "triton": gla_triton}


def make_inputs(b=2, t=37, h=2, dk=12, dv=6, decay="mixed", dtype=torch.float64, seed=0):
    """Random q, k, v, log gates g <= 0 and a non-zero initial state.

    decay: "mild" (the layer's logsigmoid/16 range), "medium" (g in [-3, 0]: the chunked form
    bisects a few levels), "strong" (g in [-10, 0]) or "mixed" (per channel, some channels barely
    decay and some lose 5-10 nats a step).
    """
    gen = torch.Generator().manual_seed(seed)
    q, k, g = (torch.randn(b, t, h, dk, generator=gen, dtype=dtype) for _ in range(3))
    v = torch.randn(b, t, h, dv, generator=gen, dtype=dtype)
    if decay == "mild":
        g = F.logsigmoid(g) / 16
    elif decay == "medium":
        g = -3 * torch.rand(b, t, h, dk, generator=gen, dtype=dtype)
    elif decay == "strong":
        g = -10 * torch.rand(b, t, h, dk, generator=gen, dtype=dtype)
    else:
        strong = -10 * torch.rand(b, t, h, dk, generator=gen, dtype=dtype).clamp_min(0.5)
        g = torch.where(torch.arange(dk) % 2 == 0, F.logsigmoid(g) / 16, strong)
    initial_state = torch.randn(b, h, dk, dv, generator=gen, dtype=dtype)
    return q, k, v, g, initial_state


def assert_close(actual, expected, atol, rtol=0.0):
    torch.testing.assert_close(actual.double(), expected.double(), atol=atol, rtol=rtol)


# ---------------------------------------------------------------------------------- scans

def test_hand_computed_value():
    # dk = 2 channels: channel 0 halves every step, channel 1 halves once then holds. dv = 1.
    q = torch.tensor([[1.0, 1.0], [0.0, 1.0]]).view(1, 2, 1, 2)
    k = torch.tensor([[1.0, 1.0], [1.0, 0.0]]).view(1, 2, 1, 2)
    v = torch.tensor([2.0, 3.0]).view(1, 2, 1, 1)
    g = torch.log(torch.tensor([[0.5, 0.5], [0.5, 1.0]])).view(1, 2, 1, 2)
    s0 = torch.tensor([4.0, 0.0]).view(1, 1, 2, 1)
    # S_0 = [0.5*4 + 1*2, 0.5*0 + 1*2] = [4, 2], o_0 = 4 + 2 = 6
    # S_1 = [0.5*4 + 1*3, 1*2 + 0*3]   = [5, 2], o_1 = 0*5 + 1*2 = 2
    for name, scan in SCANS.items():
        o, final_state = scan(q, k, v, g, initial_state=s0, scale=1.0)
        assert_close(o.flatten(), torch.tensor([6.0, 2.0]), atol=1e-6)
        assert_close(final_state.flatten(), torch.tensor([5.0, 2.0]), atol=1e-6)
    # Default scale is dk**-0.5.
    o, _ = gla_chunked(q, k, v, g, initial_state=s0)
    assert_close(o.flatten(), torch.tensor([6.0, 2.0]) / math.sqrt(2), atol=1e-6)


@pytest.mark.parametrize("decay", ["mild", "medium", "strong", "mixed"])
@pytest.mark.parametrize("chunk_size", [1, 8, 16, 64])
def test_chunked_matches_naive(decay, chunk_size):
    q, k, v, g, s0 = make_inputs(t=37, decay=decay)  # 37: not a multiple of any chunk size
    o_ref, s_ref = gla_naive(q, k, v, g, initial_state=s0)
    o, s = gla_chunked(q, k, v, g, initial_state=s0, chunk_size=chunk_size)
    assert o.shape == o_ref.shape and s.shape == s_ref.shape
    assert_close(o, o_ref, atol=1e-10)
    assert_close(s, s_ref, atol=1e-10)
    o, s = gla_chunked(q, k, v, g, chunk_size=chunk_size)  # initial_state=None means zeros
    o_ref, s_ref = gla_naive(q, k, v, g, initial_state=torch.zeros_like(s0))
    assert_close(o, o_ref, atol=1e-10)
    assert_close(s, s_ref, atol=1e-10)


def test_chunked_float32_strong_decay_is_finite_and_accurate():
    # A whole 64-token chunk at g = -10 per step: a factorisation through exp(-cumsum(g)) would
    # need exp(640) and produce inf/nan. Gradients must stay finite too.
    q, k, v, g, s0 = make_inputs(b=1, t=200, h=2, dk=16, dv=8, decay="strong", dtype=torch.float32)
    g = torch.full_like(g, -10.0).requires_grad_()
    q.requires_grad_()
    o, s = gla_chunked(q, k, v, g, initial_state=s0, chunk_size=64)
    o_ref, s_ref = gla_naive(q.double(), k.double(), v.double(), g.double(), initial_state=s0.double())
    assert torch.isfinite(o).all() and torch.isfinite(s).all()
    assert_close(o, o_ref, atol=1e-4, rtol=1e-4)
    (o.sum() + s.sum()).backward()
    assert torch.isfinite(q.grad).all() and torch.isfinite(g.grad).all()


@pytest.mark.parametrize("decay", ["mild", "mixed"])
def test_triton_matches_naive(decay):
    q, k, v, g, s0 = make_inputs(b=2, t=19, h=2, dk=12, dv=6, decay=decay)  # non-power-of-2 dims
    o_ref, s_ref = gla_naive(q, k, v, g, initial_state=s0)
    o, s = gla_triton(*(x.float() for x in (q, k, v, g)), initial_state=s0.float())
    assert o.dtype == torch.float32 and s.dtype == torch.float32
    assert_close(o, o_ref, atol=1e-4, rtol=1e-4)
    assert_close(s, s_ref, atol=1e-4, rtol=1e-4)
    o, s = gla_triton(*(x.float() for x in (q, k, v, g)))
    o_ref, s_ref = gla_naive(q, k, v, g)
    assert_close(o, o_ref, atol=1e-4, rtol=1e-4)
    assert_close(s, s_ref, atol=1e-4, rtol=1e-4)


def _grads(scan, inputs, grad_o, grad_s, **kw):
    inputs = [x.detach().clone().requires_grad_() for x in inputs]
    q, k, v, g, s0 = inputs
    o, s = scan(q, k, v, g, initial_state=s0, **kw)
    (o * grad_o.to(o.dtype)).sum().add((s * grad_s.to(s.dtype)).sum()).backward()
    return [x.grad for x in inputs]


@pytest.mark.parametrize("decay", ["mild", "medium", "mixed"])
def test_chunked_gradients_match_naive(decay):
    inputs = make_inputs(b=2, t=21, h=2, dk=8, dv=4, decay=decay)
    grad_o = torch.randn(2, 21, 2, 4, dtype=torch.float64)
    grad_s = torch.randn(2, 2, 8, 4, dtype=torch.float64)
    ref = _grads(gla_naive, inputs, grad_o, grad_s)
    got = _grads(gla_chunked, inputs, grad_o, grad_s, chunk_size=8)
    for name, a, e in zip(["q", "k", "v", "g", "initial_state"], got, ref):
        assert a is not None, name
        assert_close(a, e, atol=1e-9)


def test_triton_gradients_match_naive():
    inputs = make_inputs(b=1, t=13, h=2, dk=8, dv=4, decay="mixed")
    grad_o = torch.randn(1, 13, 2, 4, dtype=torch.float64)
    grad_s = torch.randn(1, 2, 8, 4, dtype=torch.float64)
    ref = _grads(gla_naive, inputs, grad_o, grad_s)
    got = _grads(gla_triton, [x.float() for x in inputs], grad_o, grad_s)
    for name, a, e in zip(["q", "k", "v", "g", "initial_state"], got, ref):
        assert a is not None, name
        assert_close(a, e, atol=1e-4, rtol=1e-4)


def test_low_precision_inputs_upcast():
    q, k, v, g, s0 = (x.bfloat16() for x in make_inputs(t=20, decay="mild", dtype=torch.float32))
    o_ref, s_ref = gla_naive(*(x.float() for x in (q, k, v, g)), initial_state=s0.float())
    for scan in (gla_naive, gla_chunked):
        o, s = scan(q, k, v, g, initial_state=s0)
        assert o.dtype == torch.bfloat16 and s.dtype == torch.float32
        assert_close(s, s_ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", list(SCANS))
def test_bad_shapes_raise_value_error_naming_the_tensor(name):
    scan = SCANS[name]
    q, k, v, g, s0 = make_inputs(b=2, t=5, h=2, dk=4, dv=3, dtype=torch.float32)
    with pytest.raises(ValueError, match=r"k must have shape \[b, t, h, dk\] = \[2, 5, 2, 4\]"):
        scan(q, k[..., :3], v, g)
    with pytest.raises(ValueError, match=r"g must have shape \[b, t, h, dk\]"):
        scan(q, k, v, g[:, :4])
    with pytest.raises(ValueError, match=r"v must have shape \[b, t, h, dv\]"):
        scan(q, k, v[:, :, 0], g)
    with pytest.raises(ValueError, match=r"q must have shape \[b, t, h, dk\]"):
        scan(q[0], k, v, g)
    with pytest.raises(ValueError, match=r"initial_state must have shape \[b, h, dk, dv\] = \[2, 2, 4, 3\]"):
        scan(q, k, v, g, initial_state=s0.transpose(-1, -2))
    with pytest.raises(ValueError, match=r"q must be a floating-point tensor"):
        scan(q.long(), k, v, g)


# ---------------------------------------------------------------------------------- layers

def _layer(seed=0, **kw):
    torch.manual_seed(seed)
    layer = GLA(32, num_heads=2, **kw)
    with torch.no_grad():  # a non-zero gate bias so the decay differs per channel
        layer.gk_proj[1].bias.normal_(0, 2)
    return layer


def test_gla_layer_structure():
    layer = GLA(64, num_heads=4)
    assert (layer.key_dim, layer.value_dim, layer.head_k_dim, layer.head_v_dim) == (32, 64, 8, 16)
    biases = [n for n, _ in layer.named_parameters() if n.endswith("bias")]
    assert biases == ["gk_proj.1.bias"]
    assert layer.norm_weight.shape == (16,)
    state = layer.zero_state(3, torch.device("cpu"))
    assert list(state) == ["h"] and state["h"].shape == (3, 4, 8, 16) and state["h"].dtype == torch.float32
    x = torch.randn(3, 10, 64)
    y, new_state = layer(x)
    assert y.shape == x.shape and new_state["h"].shape == (3, 4, 8, 16)
    y0, _ = layer(x, state)  # the zero state and state=None are the same thing
    torch.testing.assert_close(y, y0)


@pytest.mark.parametrize("scan_impl", ["naive", "chunked"])
def test_gla_layer_split_and_step_equivalence(scan_impl):
    layer = _layer(scan_impl=scan_impl).double()
    x = torch.randn(2, 23, 32, dtype=torch.float64)
    h0 = {"h": torch.randn(2, 2, 8, 16, dtype=torch.float64)}
    y, s = layer(x, h0)
    # Split at a point that is not a chunk boundary.
    y1, s1 = layer(x[:, :9], h0)
    y2, s2 = layer(x[:, 9:], s1)
    torch.testing.assert_close(torch.cat([y1, y2], 1), y, atol=1e-10, rtol=0)
    torch.testing.assert_close(s2["h"], s["h"], atol=1e-10, rtol=0)
    # Token by token.
    state, ys = h0, []
    for i in range(x.shape[1]):
        yi, state = layer(x[:, i:i + 1], state)
        ys.append(yi)
    torch.testing.assert_close(torch.cat(ys, 1), y, atol=1e-10, rtol=0)
    torch.testing.assert_close(state["h"], s["h"], atol=1e-10, rtol=0)


def test_gla_layer_scan_impls_agree_and_state_gets_gradients():
    layer = _layer()
    x = torch.randn(1, 11, 32)
    outs = {}
    for impl in ["naive", "chunked", "triton", "auto"]:
        layer.scan_impl = impl
        h0 = torch.randn(1, 2, 8, 16, generator=torch.Generator().manual_seed(1)).requires_grad_()
        y, s = layer(x, {"h": h0})
        (y.square().sum() + s["h"].sum()).backward()
        outs[impl] = (y.detach(), s["h"].detach(), h0.grad)
        layer.zero_grad()
    for impl in ["chunked", "triton", "auto"]:
        for a, e in zip(outs[impl], outs["naive"]):
            torch.testing.assert_close(a, e, atol=1e-4, rtol=1e-4)
    layer.scan_impl = "bogus"
    with pytest.raises(ValueError, match="scan_impl"):
        layer(x)


def test_swiglu_is_stateless_and_sized_like_fla():
    assert SwiGLU(64).intermediate_size == 256     # int(64 * 4 * 2/3) = 170 -> 256
    assert SwiGLU(384).intermediate_size == 1024   # 1024 exactly
    assert SwiGLU(64, intermediate_size=100).intermediate_size == 100
    torch.manual_seed(0)
    mlp = SwiGLU(32, hidden_ratio=2)
    assert mlp.zero_state(2, torch.device("cpu")) == {}
    assert all(not n.endswith("bias") for n, _ in mlp.named_parameters())
    x = torch.randn(2, 7, 32)
    y, state = mlp(x)
    assert state == {} and y.shape == x.shape
    y1, s1 = mlp(x[:, :3], {})
    y2, _ = mlp(x[:, 3:], s1)
    torch.testing.assert_close(torch.cat([y1, y2], 1), y)
    expected = mlp.down_proj(F.silu(mlp.gate_proj(x)) * mlp.up_proj(x))
    torch.testing.assert_close(y, expected)
