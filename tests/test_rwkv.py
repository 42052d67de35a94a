"""RWKV-6: the three scan forms agree (outputs, final states, gradients), the layers carry their whole
state (split / token-by-token equivalence), and bad inputs raise ValueError naming the tensor."""
import pytest
import torch

from rwkv import (RWKV6ChannelMix, RWKV6TimeMix, rwkv6_chunked, rwkv6_naive, rwkv6_triton)


def make_inputs(b=2, t=37, h=2, dk=8, dv=12, dtype=torch.float32, strong=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = torch.randn(b, t, h, dk, generator=g)
    k = torch.randn(b, t, h, dk, generator=g)
    v = torch.randn(b, t, h, dv, generator=g)
    # log decays: mild ones in (-1, 0), or a mix reaching -10 per step (strong decays)
    w = -torch.rand(b, t, h, dk, generator=g) * (10.0 if strong else 1.0)
    if strong:
        w[..., : dk // 2] = -torch.rand(b, t, h, dk // 2, generator=g) * 0.05  # half the channels barely decay
    u = torch.randn(h, dk, generator=g)
    s0 = torch.randn(b, h, dk, dv, generator=g)
    return [x.to(dtype) for x in (r, k, v, w, u, s0)]


def assert_close(a, b, tol):
    assert a.shape == b.shape, (a.shape, b.shape)
    err = (a.double() - b.double()).abs().max().item()
    assert err <= tol * (1.0 + b.double().abs().max().item()), err


# --------------------------------------------------------------------------------------------- scans

def test_tiny_hand_computed_bonus_only_on_current_token():
    # b = h = dk = dv = 1, T = 2, S_{-1} = s0. Step 0: o_0 = r0 (s0 + u k0 v0); S_0 = e^{w0} s0 + k0 v0.
    # Step 1: o_1 = r1 (S_0 + u k1 v1): the bonus u multiplies only k1 v1, never the stored k0 v0.
    r = torch.tensor([2.0, 3.0]).view(1, 2, 1, 1)
    k = torch.tensor([5.0, 7.0]).view(1, 2, 1, 1)
    v = torch.tensor([11.0, 13.0]).view(1, 2, 1, 1)
    w = torch.log(torch.tensor([0.5, 0.25])).view(1, 2, 1, 1)
    u = torch.tensor([[10.0]])
    s0 = torch.tensor([[[[1.0]]]])
    S0 = 0.5 * 1.0 + 5 * 11                       # 55.5
    o0 = 2 * (1.0 + 10 * 5 * 11)                  # 1102
    o1 = 3 * (S0 + 10 * 7 * 13)                   # 2896.5
    S1 = 0.25 * S0 + 7 * 13                       # 104.875
    for scan in (rwkv6_naive, rwkv6_chunked, rwkv6_triton):
        o, S = scan(r, k, v, w, u, initial_state=s0, scale=1.0)
        assert torch.allclose(o.flatten(), torch.tensor([o0, o1])), (scan.__name__, o.flatten())
        assert torch.allclose(S.flatten(), torch.tensor([S1])), (scan.__name__, S.flatten())
    o, _ = rwkv6_chunked(r, k, v, w, u, initial_state=s0, scale=0.5)
    assert torch.allclose(o.flatten(), 0.5 * torch.tensor([o0, o1]))


@pytest.mark.parametrize("strong", [False, True])
@pytest.mark.parametrize("chunk_size", [1, 4, 16])
def test_chunked_matches_naive_float64(strong, chunk_size):
    r, k, v, w, u, s0 = make_inputs(t=37, strong=strong, dtype=torch.float64)  # 37: not a multiple
    o_ref, s_ref = rwkv6_naive(r, k, v, w, u, initial_state=s0, scale=0.7)
    o, s = rwkv6_chunked(r, k, v, w, u, initial_state=s0, scale=0.7, chunk_size=chunk_size)
    assert o.dtype == torch.float64 and s.dtype == torch.float64
    assert_close(o, o_ref, 1e-10)
    assert_close(s, s_ref, 1e-10)


def test_chunked_long_sequence_float32_and_zero_initial_state():
    r, k, v, w, u, _ = make_inputs(b=1, t=300, h=2, dk=16, dv=16, strong=True)
    o_ref, s_ref = rwkv6_naive(r, k, v, w, u)
    o, s = rwkv6_chunked(r, k, v, w, u)  # default chunk size, 300 = not a multiple
    assert torch.isfinite(o).all() and s.dtype == torch.float32
    assert_close(o, o_ref, 1e-4)
    assert_close(s, s_ref, 1e-4)


@pytest.mark.parametrize("strong", [False, True])
def test_triton_matches_naive(strong):
    r, k, v, w, u, s0 = make_inputs(b=1, t=19, h=2, dk=8, dv=40, strong=strong)  # dv=40: 2 value blocks, masked
    o_ref, s_ref = rwkv6_naive(r, k, v, w, u, initial_state=s0, scale=0.5)
    o, s = rwkv6_triton(r, k, v, w, u, initial_state=s0, scale=0.5)
    assert_close(o, o_ref, 1e-5)
    assert_close(s, s_ref, 1e-5)
    o, s = rwkv6_triton(r, k, v, w, u)  # zero initial state
    o_ref, s_ref = rwkv6_naive(r, k, v, w, u)
    assert_close(o, o_ref, 1e-5)
    assert_close(s, s_ref, 1e-5)


def _grads(scan, inputs, **kw):
    inputs = [x.detach().clone().requires_grad_(True) for x in inputs]
    r, k, v, w, u, s0 = inputs
    o, s = scan(r, k, v, w, u, initial_state=s0, scale=0.8, **kw)
    g = torch.Generator().manual_seed(1)
    # a random projection of both outputs, so the final_state's gradient path is exercised too
    loss = (o * torch.randn(o.shape, generator=g, dtype=o.dtype)).sum() + \
           (s * torch.randn(s.shape, generator=g, dtype=s.dtype)).sum()
    loss.backward()
    return [x.grad for x in inputs]


@pytest.mark.parametrize("strong", [False, True])
def test_chunked_gradients_match_naive_float64(strong):
    inputs = make_inputs(b=1, t=21, h=2, dk=4, dv=6, strong=strong, dtype=torch.float64)
    for g_ref, g, name in zip(_grads(rwkv6_naive, inputs), _grads(rwkv6_chunked, inputs, chunk_size=8),
                              ["r", "k", "v", "w", "u", "initial_state"]):
        assert g is not None and torch.isfinite(g).all(), name
        assert_close(g, g_ref, 1e-9)


def test_triton_gradients_match_naive():
    inputs = make_inputs(b=1, t=13, h=2, dk=4, dv=6, strong=True)
    for g_ref, g, name in zip(_grads(rwkv6_naive, inputs), _grads(rwkv6_triton, inputs),
                              ["r", "k", "v", "w", "u", "initial_state"]):
        assert g is not None, name
        assert_close(g, g_ref, 1e-4)


def test_bf16_inputs_give_bf16_output_and_float32_state():
    r, k, v, w, u, s0 = make_inputs(t=10)
    o_ref, s_ref = rwkv6_naive(r, k, v, w, u, initial_state=s0)
    bf = [x.bfloat16() for x in (r, k, v, w, u)]
    for scan in (rwkv6_naive, rwkv6_chunked, rwkv6_triton):
        o, s = scan(*bf, initial_state=s0)
        assert o.dtype == torch.bfloat16 and s.dtype == torch.float32, scan.__name__
        assert_close(o.float(), o_ref, 0.1)


@pytest.mark.parametrize("scan", [rwkv6_naive, rwkv6_chunked, rwkv6_triton])
def test_bad_shapes_raise_value_error_naming_the_tensor(scan):
    r, k, v, w, u, s0 = make_inputs(b=2, t=5, h=2, dk=8, dv=12)
    with pytest.raises(ValueError, match=r"k must have shape \[b, t, h, dk\] = \[2, 5, 2, 8\], got \[2, 5, 8\]"):
        scan(r, k[:, :, 0], v, w, u)
    with pytest.raises(ValueError, match=r"w must have shape"):
        scan(r, k, v, w[:, :4], u)
    with pytest.raises(ValueError, match=r"v must have shape \[b, t, h, dv\]"):
        scan(r, k, v[:, :, :1], w, u)
    with pytest.raises(ValueError, match=r"u must have shape \[h, dk\] = \[2, 8\], got \[8\]"):
        scan(r, k, v, w, u[0])
    with pytest.raises(ValueError, match=r"initial_state must have shape \[b, h, dk, dv\] = \[2, 2, 8, 12\]"):
        scan(r, k, v, w, u, initial_state=s0[:1])
    with pytest.raises(ValueError, match=r"r must have shape \[b, t, h, dk\]"):
        scan(r[0], k, v, w, u)
    with pytest.raises(ValueError, match=r"k must be a floating-point tensor"):
        scan(r, k.long(), v, w, u)


# --------------------------------------------------------------------------------------------- layers

def _randomize(layer, seed=0):
    # Perturb every parameter: the RWKV-6 init starts LoRAs at zero, which would hide bugs in them.
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=g))
    return layer


def _layers():
    torch.manual_seed(0)
    return [
        _randomize(RWKV6TimeMix(32, num_heads=2, proj_low_rank_dim=4, gate_low_rank_dim=8)).double(),
        _randomize(RWKV6TimeMix(32, num_heads=4, layer_idx=1, num_layers=3)).double(),
        _randomize(RWKV6ChannelMix(32, layer_idx=0, num_layers=2)).double(),
    ]


def _assert_states_close(a, b, tol=1e-10):
    assert a.keys() == b.keys()
    for key in a:
        assert_close(a[key], b[key], tol)


@pytest.mark.parametrize("impl", ["naive", "chunked"])
def test_layer_split_and_step_equivalence(impl):
    x = torch.randn(2, 23, 32, dtype=torch.float64)
    for layer in _layers():
        layer.scan_impl = impl
        y, state = layer(x)
        # split at a = 9: the second half starts from the first half's state
        y1, s1 = layer(x[:, :9])
        y2, s2 = layer(x[:, 9:], s1)
        assert_close(torch.cat([y1, y2], 1), y, 1e-10)
        _assert_states_close(s2, state)
        # token by token
        s, ys = None, []
        for i in range(x.shape[1]):
            yi, s = layer(x[:, i:i + 1], s)
            ys.append(yi)
        assert_close(torch.cat(ys, 1), y, 1e-10)
        _assert_states_close(s, state)


def test_layer_state_contract_and_scan_impls_agree():
    tm = _randomize(RWKV6TimeMix(32, num_heads=2))
    cm = RWKV6ChannelMix(32)
    zs = tm.zero_state(3, torch.device("cpu"))
    assert zs["h"].shape == (3, 2, 8, 16) and zs["shift"].shape == (3, 32)
    assert all(s.dtype == torch.float32 and not s.any() for s in zs.values())
    assert cm.zero_state(3, "cpu")["ffn_shift"].shape == (3, 32)
    assert cm.hidden_dim == 128  # 32 * 3.5 = 112, rounded up to a multiple of 32

    x = torch.randn(3, 11, 32)
    ys = {}
    for impl in ["naive", "chunked", "triton", "auto"]:
        tm.scan_impl = impl
        ys[impl], state = tm(x, zs)
        assert state["h"].dtype == torch.float32 and state["shift"].dtype == torch.float32
    for impl in ["chunked", "triton", "auto"]:
        assert_close(ys[impl], ys["naive"], 1e-5)

    # state=None means zero state; gradients reach an initial state passed in (State Passing needs it)
    tm.scan_impl = "chunked"
    assert_close(tm(x)[0], ys["chunked"], 0)
    h0 = torch.randn(3, 2, 8, 16, requires_grad=True)
    y, _ = tm(x, {"h": h0, "shift": torch.zeros(3, 32)})
    y.sum().backward()
    assert h0.grad is not None and h0.grad.abs().sum() > 0


def test_layer_init_decay_is_a_valid_log_decay():
    tm = RWKV6TimeMix(64, num_heads=4, layer_idx=0, num_layers=4)
    w = -torch.exp(tm.w0)
    assert (w < 0).all() and w.min() > -0.4 and w.max() < -1e-3
    assert tm.bonus.shape == (4, 8)


@pytest.mark.parametrize("decay_scale", [0.01, 0.3, 2.0, 10.0])
def test_chunked_leaf_blocks_are_exact_in_every_decay_regime(decay_scale):
    # weak decays take one masked matmul per chunk (leaf = chunk), strong ones fall back to smaller leaves
    # and finally to the pure dyadic recursion; all must equal the loop
    g = torch.Generator().manual_seed(7)
    b, t, h, dk, dv = 2, 75, 2, 8, 6
    r, k = torch.randn(b, t, h, dk, generator=g, dtype=torch.float64), torch.randn(b, t, h, dk, generator=g, dtype=torch.float64)
    v = torch.randn(b, t, h, dv, generator=g, dtype=torch.float64)
    w = -decay_scale * torch.rand(b, t, h, dk, generator=g, dtype=torch.float64)
    u, h0 = torch.randn(h, dk, generator=g, dtype=torch.float64), torch.randn(b, h, dk, dv, generator=g, dtype=torch.float64)
    o1, s1 = rwkv6_naive(r, k, v, w, u, h0)
    o2, s2 = rwkv6_chunked(r, k, v, w, u, h0, chunk_size=32)
    torch.testing.assert_close(o2, o1, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(s2, s1, atol=1e-10, rtol=1e-10)
