"""Gated DeltaNet (deltanet.py) beyond what every scan is tested for (tests/test_scans.py runs its three
forms as the others': agreement in outputs, final states and gradients on and off the chunk, in pieces, at
zero length, without Triton; test_model.py its LM's state plumbing): values by hand, the delta rule's
invariants, the states each form refuses, the layer recomputed from its weights and run in every form."""
import math
import re

import pytest
import torch
import torch.nn.functional as F

import deltanet
import model
from deltanet import GATED_DELTA_SCANS, GatedDeltaNet
import test_scans
from test_scans import GPU, TorchCalls, call, close

def make_inputs(seed, b=2, t=13, strong=False):
    """[q, k, v, g, beta, initial_state], float64: test_scans.make_inputs' for this scan."""
    return test_scans.make_inputs("gated_delta", seed, b, t, strong)[0]

def forms():
    """The three forms; chunks of 4, so that t = 13 ends in a partial chunk."""
    return test_scans.forms("gated_delta")

@pytest.mark.parametrize("form", ["naive", "chunked", "triton"])
def test_known_values_by_hand(form):
    # One head, dk = dv = 2, scale 1, from h = [[1, 0], [2, 4]] (rows: key channels).
    # Step 1: k = e_0, alpha = beta = 1/2, v = [3, 1]: row 0 is half erased, all decays by half, then half of
    # v is written into row 0: h1 = [[1/2 (1/2) + 3/2, 1/2], [1, 2]] = [[1.75, 0.5], [1, 2]], y1 = [1, 1] h1.
    # Step 2: alpha = beta = 1, k = [0.6, 0.8], v = [1, -1]: the delta rule stores v exactly, k h2 = v:
    # h2 = h1 + k^T (v - k h1) = h1 + k^T [-0.85, -2.9] = [[1.24, -1.24], [0.32, -0.32]], y2 = [0, 1] h2.
    q = torch.tensor([[1.0, 1.0], [0.0, 1.0]]).view(1, 2, 1, 2)
    k = torch.tensor([[1.0, 0.0], [0.6, 0.8]]).view(1, 2, 1, 2)
    v = torch.tensor([[3.0, 1.0], [1.0, -1.0]]).view(1, 2, 1, 2)
    g = torch.tensor([-math.log(2.0), 0.0]).view(1, 2, 1)
    beta = torch.tensor([0.5, 1.0]).view(1, 2, 1)
    h0 = torch.tensor([[1.0, 0.0], [2.0, 4.0]]).view(1, 1, 2, 2)
    y, s = forms()[form](q, k, v, g, beta, initial_state=h0, scale=1.0)
    h2 = torch.tensor([[1.24, -1.24], [0.32, -0.32]])
    close((y.flatten(), s.view(2, 2)), (torch.tensor([2.75, 2.5, 0.32, -0.32]), h2), 1e-6)
    close(k[0, 1, 0] @ s.view(2, 2), v[0, 1, 0], 1e-6)
    # beta = 0 writes nothing and erases nothing: h_t = exp(G_t) h0, y_t = scale exp(G_t) q_t h0
    q, k, v, g, beta, h0 = make_inputs(5, t=9)
    y, s = forms()[form](q, k, v, g, torch.zeros_like(beta), initial_state=h0)
    decay = g.cumsum(1).exp()   # [b, t, H]
    want = 12 ** -0.5 * decay[..., None] * torch.einsum("btHk,bHkv->btHv", q, h0)
    close((y, s), (want, decay[:, -1, :, None, None] * h0), 1e-5)

@pytest.mark.parametrize("form", ["naive", "chunked", "triton"])
def test_without_decay_or_values_the_delta_rule_never_grows_the_state(form):
    # alpha = 1, v = 0, |k| = 1, beta in [0, 1] (0 and 1 included): h <- (I - beta k^T k) h, whose eigenvalues
    # are 1 and 1 - beta, so the Frobenius norm of h never grows; it shrinks where k meets the state
    q, k, v, g, beta, h0 = make_inputs(6, t=12)
    beta[:, 0] = 0.0
    beta[:, 1] = 1.0
    no_decay = torch.zeros_like(g)
    no_value = torch.zeros_like(v)
    tol = 1e-6 if form == "triton" else 1e-12
    norms = [h0.norm(dim=(-1, -2))]
    state = h0
    for i in range(12):   # one token at a time, the state carried
        step = [z[:, i:i + 1] for z in (q, k, no_value, no_decay, beta)]
        _, state = forms()[form](*step, initial_state=state)
        norms.append(state.double().norm(dim=(-1, -2)))
    norms = torch.stack(norms)   # [t + 1, b, H]
    assert (norms[1:] <= norms[:-1] * (1 + tol)).all()
    assert (norms[-1] < 0.9 * norms[0]).all()
    # the premise matters: keys of norm 2 make the same steps grow it (an eigenvalue 1 - 4 beta)
    _, grown = GATED_DELTA_SCANS["naive"](q, 2 * k, no_value, no_decay, beta, initial_state=h0)
    assert (grown.norm(dim=(-1, -2)) > norms[0]).all()

@pytest.mark.parametrize("decay", [0.01, 2.0, 40.0])
def test_chunked_is_exact_and_float32_finite_at_any_decay(decay):
    # per-step log decay U(-decay, 0): a 64-token chunk decays by up to ~2,500 nats, far past float32's ~88
    inputs = make_inputs(7, t=75)
    inputs[3] = -decay * torch.rand(inputs[3].shape, generator=torch.Generator().manual_seed(1)).double()
    ref = call(GATED_DELTA_SCANS["naive"], inputs, {})
    for chunk_size in (3, 8, 32):
        close(call(GATED_DELTA_SCANS["chunked"], inputs, {"chunk_size": chunk_size}), ref, 1e-10)
    inputs = [v.float().requires_grad_() for v in inputs]
    y, s = call(GATED_DELTA_SCANS["chunked"], inputs, {"chunk_size": 64})
    close((y, s), ref, 1e-4)
    (y.sum() + s.sum()).backward()
    assert all(torch.isfinite(v.grad).all() for v in inputs)

def test_chunked_form_makes_a_few_torch_calls_per_chunk_not_one_per_step():
    # counted, not timed: 512 more steps cost a loop over time >= 512 calls, the chunked form a few per chunk
    calls = []
    for t in (512, 1024):
        inputs = make_inputs(0, b=1, t=t)
        with TorchCalls() as counted:
            call(GATED_DELTA_SCANS["chunked"], inputs, {"chunk_size": 64})
        calls.append(counted.n)
    assert calls[1] - calls[0] < 512 / 2, calls

@pytest.mark.parametrize("form", ["naive", "chunked", "triton"])
def test_an_initial_state_of_another_shape_and_a_bad_chunk_size_are_refused_in_one_line(form):
    inputs = make_inputs(0, t=3)
    h0 = inputs[-1]   # [2, 2, 12, 40]
    layout = f"expected a tensor of shape {list(h0.shape)} [batch, heads, key dim, value dim]"
    expected = f"gated_delta_{form}: initial_state has shape .*" + re.escape(layout)
    for bad in (h0.transpose(-1, -2).contiguous(), h0.flatten(), h0[:1], h0[0]):   # the first: S, not h = S^T
        with pytest.raises(ValueError, match=expected) as e:
            forms()[form](*inputs[:-1], initial_state=bad)
        assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="initial_state is a dict, expected a tensor"):
        GATED_DELTA_SCANS[form](*inputs[:-1], initial_state={"h": h0})
    if form == "chunked":   # any positive integer is a chunk (the last one is padded), nothing else
        for bad in (0, -4, 2.0, None):
            message = f"gated_delta_chunked: chunk_size {bad!r} must be a positive integer"
            with pytest.raises(ValueError, match=re.escape(message)):
                call(GATED_DELTA_SCANS["chunked"], inputs, {"chunk_size": bad})
        close(call(GATED_DELTA_SCANS["chunked"], inputs, {"chunk_size": 2}),
              call(GATED_DELTA_SCANS["naive"], inputs, {}), 1e-10)
    for kw, match in [(dict(num_heads=5), "GatedDeltaNet: num_heads 5 must divide key_dim 48 and value_dim"),
                      (dict(chunk_size=0), "GatedDeltaNet: chunk_size 0 must be a positive integer")]:
        with pytest.raises(ValueError, match=match):
            GatedDeltaNet(64, **kw)

# ---- The layer

def test_layer_is_sized_and_initialised_as_fla():
    torch.manual_seed(0)
    layer = GatedDeltaNet(128, num_heads=2)
    assert (layer.key_dim, layer.value_dim, layer.head_k_dim, layer.head_v_dim) == (96, 192, 48, 96)
    assert sorted(n for n, _ in layer.named_parameters()) == sorted(
        ["q_proj.weight", "k_proj.weight", "v_proj.weight", "conv1d.weight", "a_proj.weight", "b_proj.weight",
         "g_proj.weight", "o_proj.weight", "A_log", "dt_bias", "norm_weight"])   # no biases
    for name in ("q_proj", "v_proj", "o_proj", "conv1d"):
        assert abs(getattr(layer, name).weight.std().item() - 0.02) < 0.002
    A = -layer.A_log.exp()
    dt = F.softplus(layer.dt_bias)
    assert (A < 0).all() and (A > -16).all() and layer.norm_eps == 1e-6 and (layer.norm_weight == 1).all()
    assert (dt >= 1e-3 * 0.999).all() and (dt <= 0.1 * 1.001).all()
    assert layer.A_log._no_weight_decay and layer.dt_bias._no_weight_decay
    assert {k: v.shape for k, v in layer.zero_state(3, "cpu").items()} == {"h": (3, 2, 48, 96),
                                                                         "conv": (3, 3, 384)}

def test_layer_output_recomputed_from_its_weights():
    # fla's GatedDeltaNet: three short convs + SiLU, l2norm(q), l2norm(k), beta = sigmoid(b_proj x),
    # g = -exp(A_log) softplus(a_proj x + dt_bias), scan, RMSNorm(y) * weight * silu(g_proj x) per head,
    # o_proj; the weights made larger than at init
    torch.manual_seed(0)
    layer = GatedDeltaNet(32, num_heads=2).double()
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(0.3 * torch.randn_like(p))
    x = torch.randn(2, 7, 32, dtype=torch.float64)
    with torch.no_grad():
        weights = layer.conv1d.weight.split([24, 24, 48])   # q_conv1d, k_conv1d, v_conv1d
        def conv(z, w):   # causal: pad 3 on the left
            return F.silu(F.conv1d(F.pad(z.transpose(1, 2), (3, 0)), w, groups=z.shape[-1]).transpose(1, 2))
        q, k, v = (conv(proj(x), w).view(2, 7, 2, -1) for proj, w in
                   zip((layer.q_proj, layer.k_proj, layer.v_proj), weights))
        q, k = (z / (z.square().sum(-1, keepdim=True) + 1e-6).sqrt() for z in (q, k))
        g = -layer.A_log.exp() * F.softplus(layer.a_proj(x) + layer.dt_bias)
        y, h = deltanet.gated_delta_naive(q, k, v, g, torch.sigmoid(layer.b_proj(x)))
        y = y / (y.square().mean(-1, keepdim=True) + 1e-6).sqrt() * layer.norm_weight
        y = y * F.silu(layer.g_proj(x).view(2, 7, 2, -1))
        out, state = layer(x)
    close(out, layer.o_proj(y.flatten(2)), 1e-10)
    close(state["h"], h, 1e-10)
    close(state["conv"], torch.cat([layer.q_proj(x), layer.k_proj(x), layer.v_proj(x)], -1)[:, -3:], 1e-6)

def test_layer_runs_chunked_and_triton_forms_as_its_loop_in_pieces_with_gradients():
    # 70 steps, chunks of 16 (a partial last one); pieces of 2 (shorter than the conv window), 7 and 61
    # carry the whole state, h and the conv window; gradients to the start state and every parameter
    torch.manual_seed(0)
    layer = GatedDeltaNet(32, num_heads=2, chunk_size=16)
    with torch.no_grad():
        layer.dt_bias.add_(2.0)   # a larger step than at init: the state decays and matters
        torch.nn.init.normal_(layer.conv1d.weight, std=0.5)
    x = torch.randn(2, 70, 32)
    start = {k: torch.randn_like(v) for k, v in layer.zero_state(2, "cpu").items()}
    def run(impl, cuts, dtype):
        layer.to(dtype)
        layer.scan_impl = impl
        layer.zero_grad()
        state = {k: v.to(dtype).clone().requires_grad_() for k, v in start.items()}
        ys = []
        leaves = list(state.values())
        for a, b in zip(cuts, cuts[1:]):
            y, state = layer(x[:, a:b].to(dtype), state)
            ys.append(y)
        y = torch.cat(ys, 1)
        (y.square().sum() + sum(v.sum() for v in state.values())).backward()
        return [y, *state.values(), *(v.grad for v in leaves), *(p.grad for p in layer.parameters())]
    pieces = run("naive", [0, 2, 9, 70], torch.float64)
    close(run("chunked", [0, 2, 9, 70], torch.float64), pieces, 1e-10)
    want = run("naive", [0, 70], torch.float64)
    close(run("chunked", [0, 70], torch.float64), want, 1e-10)
    close(pieces, want, 1e-7)   # not 1e-10: ssm.causal_conv1d_silu hands its window on in float32
    if GPU:   # the Triton form on CUDA: the layer there, the results back
        layer.cuda()
        x = x.cuda()
        start = {k: v.cuda() for k, v in start.items()}
    close([v.cpu() for v in run("triton", [0, 9, 70], torch.float32)], want, 1e-4)

# ---- The LM (arch gated_deltanet); its state plumbing: test_model.py, over every arch

def test_the_lm_uses_gla_mlp_and_picks_the_chunked_form_on_a_cpu():
    torch.manual_seed(0)
    lm = model.LM(model.make_config("gated_deltanet", "tiny", vocab_size=20))
    assert isinstance(lm.backbone.layers[0].mlp, model.gla.SwiGLU)
    idx = torch.randint(0, 20, (2, 9))
    with torch.no_grad():
        outs = {impl: model.set_scan_impl(lm, impl)(idx)[0] for impl in ("auto", "chunked", "naive")}
    torch.testing.assert_close(outs["auto"], outs["chunked"], rtol=0, atol=0)
    torch.testing.assert_close(outs["naive"], outs["chunked"], rtol=1e-5, atol=1e-5)
