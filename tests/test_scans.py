"""The four scans' three forms (naive loop, chunked, Triton kernel: interpreted on a CPU, see conftest.py)
agree in outputs, final states and gradients, from zero or a given state, in pieces with the state carried
and at any decay; the chunked forms loop over chunks, not steps; then the Mamba layers (GLA's and RWKV-6's:
test_gla_rwkv.py); last, zero-length inputs, the initial states and chunk sizes each form refuses, the
kernels at the official headdim and the "auto" form on a CPU."""
import functools
import math
import re
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

import deltanet
import gla
import model
import rwkv
import ssm
from plumbing.scans import pick_form
from conftest import ROOT

def make_inputs(name, seed, b=2, t=13, strong=False):
    """(inputs, keyword arguments) of scan `name`, float64. inputs end with the initial state; those whose
    first two dims are (b, t) have a time axis. strong: log decays of 5-10 nats a step in some channels."""
    gen = torch.Generator().manual_seed(seed)
    N, U = (functools.partial(f, generator=gen, dtype=torch.float64) for f in (torch.randn, torch.rand))
    if name == "ssd":  # p = 6, n = 12, not powers of two: the kernel's masks at work
        (h, p, g, n), A = (4, 6, 2, 12), -(U(4) * (10.0 if strong else 2.0) + 0.1)
        return [N(b, t, h, p), U(b, t, h) + 0.01, A, N(b, t, g, n), N(b, t, g, n), N(b, h, p, n)], {}
    if name == "selective_scan":
        d, n = 12, 5
        dt, A = U(b, t, d) * (10.0 if strong else 0.5) + 1e-3, -U(d, n) * (20.0 if strong else 2.0) - 0.05
        return [N(b, t, d), dt, A, N(b, t, n), N(b, t, n), 3 * N(b, d, n)], {}
    if name == "gla":
        h, dk, dv = 2, 12, 6
        g = F.logsigmoid(N(b, t, h, dk)) / 16  # the layer's range
        if strong:  # odd channels lose 5-10 nats a step, even ones barely decay
            g[..., 1::2] = -5 - 5 * U(b, t, h, dk // 2)
        return [N(b, t, h, dk), N(b, t, h, dk), N(b, t, h, dv), g, N(b, h, dk, dv)], {"scale": 0.5}
    if name == "gated_delta":  # dk = 12: not a power of two (the kernel's masks); unit keys, beta in (0, 1)
        h, dk, dv = 2, 12, 40
        g = -U(b, t, h)
        if strong:  # the second head loses 5-10 nats a step
            g[..., 1] = -5 - 5 * U(b, t)
        k = F.normalize(N(b, t, h, dk), dim=-1)
        return [N(b, t, h, dk), k, N(b, t, h, dv), g, U(b, t, h), N(b, h, dk, dv)], {"scale": 0.6}
    h, dk, dv = 2, 8, 40  # dv = 40: two kernel value blocks, the second one masked
    w = -U(b, t, h, dk) * (10.0 if strong else 1.0)
    if strong:  # half the channels barely decay
        w[..., : dk // 2] = -0.05 * U(b, t, h, dk // 2)
    return [N(b, t, h, dk), N(b, t, h, dk), N(b, t, h, dv), w, N(h, dk), N(b, h, dk, dv)], {"scale": 0.7}

SCANS = {"ssd": ssm.SSD_SCANS, "selective_scan": ssm.SELECTIVE_SCANS, "gla": gla.GLA_SCANS,
         "rwkv6": rwkv.RWKV6_SCANS, "gated_delta": deltanet.GATED_DELTA_SCANS}   # each {"naive", "chunked", "triton"} -> the form
GPU = torch.cuda.is_available()  # then the Triton form runs compiled (else interpreted: conftest.py)

def on_gpu(scan):  # scan on CUDA copies of the inputs, results back on the CPU (gradients flow through .to)
    cuda = lambda v: None if v is None else v.cuda()
    return lambda *inputs, initial_state=None, **kw: [v.cpu() for v in scan(
        *map(cuda, inputs), initial_state=cuda(initial_state), **kw)]

def forms(name):
    """The three forms; chunks of 4, so that t = 13 ends in a partial chunk."""
    scans = SCANS[name]
    return {**scans, "chunked": functools.partial(scans["chunked"], chunk_size=4),
            "triton": on_gpu(scans["triton"]) if GPU else scans["triton"]}

def call(scan, inputs, kw, with_state=True):
    return scan(*inputs[:-1], initial_state=inputs[-1] if with_state else None, **kw)

def close(actual, expected, tol):
    """Max error within tol of the largest expected value; pairwise for (y, final_state) or gradients."""
    if isinstance(expected, (tuple, list)):
        return [close(a, e, tol) for a, e in zip(actual, expected, strict=True)]
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    err = (actual.double() - expected.double()).abs().max().item()
    assert err <= tol * (1 + expected.double().abs().max().item()), err

def grads(scan, inputs, kw, weights, with_state=True):
    """Gradients of <y, w_y> + <final_state, w_s> w.r.t. every input (the initial state included)."""
    leaves = [v.detach().clone().requires_grad_() for v in inputs]
    y, s = call(scan, leaves, kw, with_state)
    ((y * weights[0].to(y.dtype)).sum() + (s * weights[1].to(s.dtype)).sum()).backward()
    return [v.grad for v in leaves]

@pytest.mark.parametrize("strong", [False, True], ids=["mild", "strong"])
@pytest.mark.parametrize("name", SCANS)
def test_three_forms_agree_in_outputs_states_and_gradients(name, strong):
    naive, form = SCANS[name]["naive"], forms(name)
    inputs, kw = make_inputs(name, 0, strong=strong)
    inputs32 = [v.float() for v in inputs]
    for with_state in (True, False):
        ref = call(naive, inputs, kw, with_state)
        close(call(form["chunked"], inputs, kw, with_state), ref, 1e-10)
        for f in ("chunked", "triton"):  # float32, as they run in a model; no overflow at strong decay
            y, s = call(form[f], inputs32, kw, with_state)
            assert y.dtype == s.dtype == torch.float32
            close((y, s), ref, 1e-4)
    zeros = inputs32[:-1] + [torch.zeros_like(inputs32[-1])]
    for scan in (naive, form["chunked"]):  # initial_state=None means zeros
        torch.testing.assert_close(call(scan, inputs32, kw, False), call(scan, zeros, kw), rtol=0, atol=0)
    weights = [torch.randn(v.shape, dtype=v.dtype) for v in ref]
    ref = grads(naive, inputs, kw, weights)
    close(grads(form["chunked"], inputs, kw, weights), ref, 1e-8)
    got = grads(form["triton"], inputs32, kw, weights)
    assert all(g.dtype == torch.float32 for g in got)
    close(got, ref, 1e-3)
    assert all(torch.isfinite(g).all() for g in grads(form["chunked"], inputs32, kw, weights))
    # a loss on y alone, from the zero state: the Triton form's backward gets a zero final-state gradient
    weights = [weights[0], torch.zeros_like(weights[1])]
    got = grads(form["triton"], inputs32, kw, weights, with_state=False)
    close(got[:-1], grads(naive, inputs, kw, weights, with_state=False)[:-1], 1e-3)

@pytest.mark.parametrize("form", ["naive", "chunked", "triton"])
@pytest.mark.parametrize("name", SCANS)
def test_pieces_with_the_state_carried_equal_one_pass_and_bf16_computes_in_float32(name, form):
    b, t = 2, 10
    inputs, kw = make_inputs(name, 2, b=b, t=t)
    inputs, tol = ([v.float() for v in inputs], 1e-5) if form == "triton" else (inputs, 1e-10)
    scan = forms(name)[form]
    ref = call(scan, inputs, kw)
    for cuts in ([0, 3, t], list(range(t + 1))):  # two pieces; then one token at a time
        state, ys = inputs[-1], []
        for a, z in zip(cuts, cuts[1:]):
            piece = [v[:, a:z] if v.shape[:2] == (b, t) else v for v in inputs[:-1]]
            y, state = scan(*piece, initial_state=state, **kw)
            ys.append(y)
        close((torch.cat(ys, 1), state), ref, tol)
    bf16 = [v.bfloat16() for v in inputs[:-1]] + [inputs[-1].float()]   # bf16 inputs, a float32 state
    (y, s), (y32, s32) = call(scan, bf16, kw), call(scan, [v.float() for v in bf16], kw)
    assert y.dtype == torch.bfloat16 and s.dtype == torch.float32
    close(y, y32, 1e-2)
    close(s, s32, 1e-5)
    y64, s64 = call(scan, [v.double() for v in inputs], kw)   # float64 in: y and the state float64 too
    assert y64.dtype == s64.dtype == torch.float64

# Per-step log decay U(-decay, 0): leaves of a whole chunk (0.01), a few bisection levels (0.3, 2), two-token
# (10: a 32-token chunk decays by ~160 nats) and one-token leaves (40); float32 past ~88 nats per chunk.
@pytest.mark.parametrize("decay", [0.01, 0.3, 2.0, 10.0, 40.0])
@pytest.mark.parametrize("name", ["gla", "rwkv6"])
def test_chunked_bisection_is_exact_and_float32_finite_in_every_decay_regime(name, decay):
    inputs, kw = make_inputs(name, 0, t=75)   # the log decay (g, w): U(-decay, 0)
    inputs[3] = -decay * torch.rand(inputs[3].shape, generator=torch.Generator().manual_seed(1)).double()
    ref = call(SCANS[name]["naive"], inputs, kw)
    for chunk_size in (8, 32):
        close(call(SCANS[name]["chunked"], inputs, {**kw, "chunk_size": chunk_size}), ref, 1e-10)
    inputs = [v.float().requires_grad_() for v in inputs]
    y, s = call(SCANS[name]["chunked"], inputs, {**kw, "chunk_size": 64})
    close((y, s), ref, 1e-4)
    (y.sum() + s.sum()).backward()
    assert all(torch.isfinite(v.grad).all() for v in inputs)

def test_ssd_chunked_stays_finite_in_float32_with_64_token_chunks_at_strong_decay():
    # Up to ~10 nats a step over 64 steps: cs_i - cs_j for j > i reaches hundreds of nats, exp gives inf in
    # float32, and masking after exp makes inf * 0 = NaN (in the gradient, if masked_fill hides it forward)
    inputs, kw = make_inputs("ssd", 0, t=75, strong=True)
    ref = call(SCANS["ssd"]["naive"], inputs, kw)
    inputs = [v.float().requires_grad_() for v in inputs]
    y, s = call(SCANS["ssd"]["chunked"], inputs, {**kw, "chunk_size": 64})
    close((y, s), ref, 1e-4)
    (y.sum() + s.sum()).backward()
    assert all(torch.isfinite(v.grad).all() for v in inputs)

class TorchCalls(TorchFunctionMode):
    """Counts the torch functions and tensor methods called inside it (not those they call in turn)."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))

@pytest.mark.parametrize("name", ["ssd", "gla", "rwkv6"])
def test_chunked_forms_make_a_few_torch_calls_per_chunk_not_one_per_step(name):
    # Counted, not timed: a loop over time makes at least one torch call per step, so 512 more steps cost
    # it >= 512 calls; a chunked form's sequential part makes a few per chunk of 64 steps (the repo's: 1 to 4)
    calls = []
    for t in (512, 1024):
        inputs, kw = make_inputs(name, 0, b=1, t=t)
        with TorchCalls() as counted:
            call(SCANS[name]["chunked"], inputs, {**kw, "chunk_size": 64})
        calls.append(counted.n)
    assert calls[1] - calls[0] < 512 / 2, calls

@pytest.mark.parametrize("form", ["naive", "chunked", "triton"])
def test_known_values_by_hand(form):
    # SSD, h = p = n = 1, two steps from h = 4: h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t, y_t = C_t h_t
    x, dt, B, C = (torch.tensor(v).view(1, 2, 1, 1) for v in ([1.0, 2.0], [0.5, 1.0], [1.0, 3.0], [2.0, 0.5]))
    h1 = math.exp(-0.5) * 4.0 + 0.5 * 1.0 * 1.0
    h2 = math.exp(-1.0) * h1 + 1.0 * 2.0 * 3.0
    y, s = forms("ssd")[form](x, dt[..., 0], -torch.ones(1), B, C, initial_state=torch.full((1,) * 4, 4.0))
    close((y.flatten(), s.flatten()), (torch.tensor([2.0 * h1, 0.5 * h2]), torch.tensor([h2])), 1e-6)
    # selective scan, dt = 1 and A = [-ln 2, -ln 4]: the two state entries halve and quarter each step.
    # h1 = [4/2 + 2*1, 8/4 + 2*2] = [4, 6], y1 = 4*3 + 6*1 = 18; h2 = [4/2 + 4, 6/4 + 0] = [6, 1.5], y2 = 9
    x, dt, A = torch.tensor([[[2.0], [4.0]]]), torch.ones(1, 2, 1), -torch.tensor([[2.0, 4.0]]).log()
    B, C = torch.tensor([[[1.0, 2.0], [1.0, 0.0]]]), torch.tensor([[[3.0, 1.0], [1.0, 2.0]]])
    y, s = forms("selective_scan")[form](x, dt, A, B, C, initial_state=torch.tensor([[[4.0, 8.0]]]))
    close((y.flatten(), s.flatten()), (torch.tensor([18.0, 9.0]), torch.tensor([6.0, 1.5])), 1e-6)

def test_ssd_is_a_selective_scan_with_shared_head_parameters():
    # Two independent implementations: SSD with one group equals the selective scan over d = h * p
    # channels whose step size and decay are their head's.
    (x, dt, A, B, C, s0), _ = make_inputs("ssd", 4, t=19)
    (b, t, h, p), B, C = x.shape, B[:, :, :1], C[:, :, :1]
    y, s = ssm.ssd_chunked(x, dt, A, B, C, initial_state=s0)
    A_sel = A.repeat_interleave(p)[:, None].expand(h * p, B.shape[-1])
    y_sel, s_sel = ssm.selective_scan_chunked(x.reshape(b, t, h * p), dt.repeat_interleave(p, -1), A_sel,
                                              B[:, :, 0], C[:, :, 0], initial_state=s0.reshape(b, h * p, -1))
    close((y.reshape(b, t, h * p), s.reshape(b, h * p, -1)), (y_sel, s_sel), 1e-10)

def mixer(arch):  # Mamba-2: two groups, and a larger dt than at init, so that the state carries information
    torch.manual_seed(0)
    if arch == "mamba1":
        return ssm.Mamba1(d_model=16)
    m = ssm.Mamba2(d_model=32, d_state=16, headdim=16, ngroups=2, chunk_size=8)
    m.dt_bias.data += 2.0
    return m

@pytest.mark.parametrize("arch", ["mamba2", "mamba1"])
def test_mixers_initialise_as_mamba_ssm_and_their_scan_forms_agree(arch):
    m = mixer(arch)
    dt = F.softplus(m.dt_bias if arch == "mamba2" else m.dt_proj.bias)
    assert dt.min() >= 1e-3 * 0.999 and dt.max() <= 0.1 * 1.001  # log-uniform in [dt_min, dt_max]
    A = -torch.exp(m.A_log)
    if arch == "mamba2":
        assert (A <= -1).all() and (A >= -16).all() and m.dt_bias._no_weight_decay
    else:  # S4D-real
        torch.testing.assert_close(A, -torch.arange(1, 17.0).expand(32, 16))
        assert m.dt_proj.weight.abs().max() <= 1.0  # dt_rank ** -0.5 with dt_rank = 1
    assert m.A_log._no_weight_decay and m.D._no_weight_decay and (m.D == 1).all()
    # The layers hand the scans views of the transposed conv output (the Triton form makes them contiguous)
    x = torch.randn(2, 11, 32 if arch == "mamba2" else 16)
    start = {k: torch.randn_like(v) for k, v in mixer(arch).zero_state(2, "cpu").items()}
    outs = {}
    for impl in ("naive", "chunked", "triton"):
        dev = "cuda" if impl == "triton" and GPU else "cpu"
        m = mixer(arch).to(dev)
        m.scan_impl = impl
        h0 = start["h"].clone().to(dev).requires_grad_()
        y, state = m(x.to(dev), {"h": h0, "conv": start["conv"].to(dev)})
        (y.square().sum() + state["h"].sum()).backward()
        outs[impl] = [v.cpu() for v in (y, state["h"], state["conv"], h0.grad, m.A_log.grad, m.D.grad,
                                        m.in_proj.weight.grad)]
        close(outs[impl], outs["naive"], 1e-4)

def test_mamba2_gated_rmsnorm_normalises_y_times_silu_z_per_group():
    # mamba_ssm's RMSNormGated, norm_before_gate=False: rmsnorm(y * silu(z)) * weight, per group of channels
    norm, (y, z) = ssm.RMSNormGated(8, group_size=4), torch.randn(2, 3, 2, 8, dtype=torch.float64).unbind(2)
    torch.nn.init.normal_(norm.weight)
    gated = (y * F.silu(z)).view(2, 3, 2, 4)
    want = (gated / (gated.pow(2).mean(-1, keepdim=True) + 1e-5).sqrt()).flatten(-2) * norm.weight
    close(norm(y, z), want, 1e-6)

def test_mamba1_layer_output_recomputed_from_its_weights():
    # Mamba (arXiv 2312.00752) as mamba_simple.py: y = (scan(x) + D * x) * silu(z), then out_proj
    m, u = mixer("mamba1"), torch.randn(2, 7, 16)
    torch.nn.init.normal_(m.D)
    with torch.no_grad():
        xs, z = m.in_proj(u).chunk(2, dim=-1)
        xs = F.silu(m.conv1d(xs.transpose(1, 2))[..., :7].transpose(1, 2))   # causal: the first 7 outputs
        dt_low, B, C = m.x_proj(xs).split([m.dt_rank, 16, 16], dim=-1)
        scan = ssm.selective_scan_naive(xs, F.softplus(m.dt_proj(dt_low)), -m.A_log.exp(), B, C)[0]
        close(m(u)[0], m.out_proj((scan + m.D * xs) * F.silu(z)), 1e-5)

NO_TRITON = r'''
import sys
sys.modules["triton"] = None  # "import triton" fails, as on a machine without the wheel
sys.path.insert(0, "tests")
import pytest, torch, model, test_scans
for arch in model.ARCHS:
    model.LM(model.make_config(arch, "tiny", vocab_size=20))(torch.randint(0, 20, (2, 9)))[0].sum().backward()
for name, forms in test_scans.SCANS.items():
    inputs, kw = test_scans.make_inputs(name, 0, t=5)
    for form in ("naive", "chunked"):
        test_scans.call(forms[form], inputs, kw)
    with pytest.raises(RuntimeError, match="needs Triton"):
        test_scans.call(forms["triton"], inputs, kw)
print("done")
'''

def test_without_triton_the_other_forms_work_and_triton_forms_say_why():
    r = subprocess.run([sys.executable, "-c", NO_TRITON], cwd=ROOT, capture_output=True, timeout=300)
    assert r.returncode == 0 and r.stdout == b"done\n", r.stderr[-3000:].decode()

# ---- Zero-length inputs, the state checks at the scans' boundary, the kernels' wide rows, the "auto" pick

def timed(inputs, b, t, a, z):  # the inputs' steps [a, z) (those with a time axis), the rest as they are
    return [v[:, a:z] if v.dim() > 1 and v.shape[:2] == (b, t) else v for v in inputs]

@pytest.mark.parametrize("form", ["naive", "chunked", "triton"])
@pytest.mark.parametrize("name", SCANS)
def test_zero_length_input_is_the_identity_in_every_form(name, form):
    # no step: y empty (its dtype and trailing dims as at t = 1), final_state == initial_state as a copy,
    # zeros of the state's shape without one; the gradient reaches initial_state unchanged
    for dtype in (torch.float64, torch.float32):
        inputs, kw = make_inputs(name, 3, t=1)
        inputs = [v.to(dtype) for v in inputs]
        y1, _ = call(forms(name)[form], inputs, kw)
        empty = timed(inputs, 2, 1, 0, 0)
        h0 = empty[-1].clone().requires_grad_()
        y, s = forms(name)[form](*empty[:-1], initial_state=h0, **kw)
        assert y.shape == (y1.shape[0], 0, *y1.shape[2:]) and y.dtype == y1.dtype == dtype
        assert s.dtype == dtype and torch.equal(s, h0)
        weights = torch.randn(h0.shape, dtype=dtype)
        (s * weights).sum().backward()
        torch.testing.assert_close(h0.grad, weights, rtol=0, atol=0)
        with torch.no_grad():
            s.add_(1.0)   # a copy: editing the final state in place leaves the initial state alone
        assert torch.equal(h0, empty[-1])
        y, s = call(forms(name)[form], empty, kw, with_state=False)
        assert y.shape[1] == 0 and s.dtype == dtype and torch.equal(s, torch.zeros_like(h0))
    # mixed dtypes: y and the final state in the dtypes a step gives them (bf16 inputs: a float32 state)
    for dtype, state_dtype in [(torch.bfloat16, None), (torch.bfloat16, torch.float32),
                               (torch.float32, torch.float64), (torch.float64, torch.float32),
                               (torch.float32, torch.bfloat16)]:
        inputs, kw = make_inputs(name, 3, t=1)
        inputs = [v.to(dtype) for v in inputs[:-1]] + [inputs[-1].to(state_dtype or dtype)]
        with_state = state_dtype is not None
        one = call(forms(name)[form], inputs, kw, with_state)
        none = call(forms(name)[form], timed(inputs, 2, 1, 0, 0), kw, with_state)
        assert [v.dtype for v in none] == [v.dtype for v in one], (dtype, state_dtype)
        if with_state:
            assert torch.equal(none[1], inputs[-1].to(one[1].dtype))
    if name in ("gla", "rwkv6"):   # their shared chunked_scan returns o in the compute dtype (RWKV-6's bonus
        inputs, kw = make_inputs(name, 3, t=1)   # is added in it), at t = 0 too
        qkvg = [v.bfloat16() for v in inputs[:4]]
        for t in (1, 0):
            o, s = gla.chunked_scan(*(v[:, :t] for v in qkvg), None, 4, shift=name == "rwkv6")
            assert o.dtype == s.dtype == torch.float32

@pytest.mark.parametrize("name", SCANS)
def test_forms_agree_at_one_step_and_at_lengths_on_and_off_the_chunk_with_empty_pieces(name):
    # chunks of 4: t = 1, 3 (short), 4, 8 (whole chunks), 5, 9 (a partial last chunk); then the same input
    # cut into pieces, empty ones among them, the state carried: one pass
    for t in (1, 3, 4, 5, 8, 9):
        inputs, kw = make_inputs(name, t, t=t)
        ref = call(SCANS[name]["naive"], inputs, kw)
        close(call(forms(name)["chunked"], inputs, kw), ref, 1e-10)
        close(call(forms(name)["triton"], [v.float() for v in inputs], kw), ref, 1e-4)
    for form in ("naive", "chunked", "triton"):   # inputs and ref: the last length's, t = 9
        state, ys = inputs[-1].float(), []
        for a, z in zip([0, 0, 4, 4, 9], [0, 4, 4, 9, 9]):
            y, state = forms(name)[form](*timed([v.float() for v in inputs[:-1]], 2, 9, a, z),
                                         initial_state=state, **kw)
            ys.append(y)
        close((torch.cat(ys, 1), state), ref, 1e-4)

@pytest.mark.parametrize("form", ["naive", "chunked", "triton"])
@pytest.mark.parametrize("name", SCANS)
def test_an_initial_state_of_another_shape_is_refused_in_one_line(name, form):
    # a transposed or flattened state holds the right numbers in the wrong places, one row of a batch would
    # broadcast over it: each is a ValueError naming the expected shape, in every form
    inputs, kw = make_inputs(name, 0, t=3)
    h0 = inputs[-1]
    expected = "initial_state has shape .*" + re.escape(f"expected a tensor of shape {list(h0.shape)}")
    for bad in (h0.transpose(-1, -2).contiguous(), h0.flatten(), h0[:1], h0[0], h0[..., :-1]):
        with pytest.raises(ValueError, match=expected):
            forms(name)[form](*inputs[:-1], initial_state=bad, **kw)
    for other in ({"h": h0}, h0.numpy()):   # not a tensor, of the right shape or none (checked on any device)
        with pytest.raises(ValueError, match=f"initial_state is a {type(other).__name__}, expected a tensor"):
            SCANS[name][form](*inputs[:-1], initial_state=other, **kw)
    strided = h0.transpose(-1, -2).contiguous().transpose(-1, -2)   # the right shape passes, strided too
    tol = 1e-5 if form == "triton" else 1e-10   # the kernels compute in float32
    close(call(forms(name)[form], inputs[:-1] + [strided], kw), call(SCANS[name]["naive"], inputs, kw), tol)

@pytest.mark.parametrize("name", SCANS)
def test_chunk_size_must_be_a_positive_integer_and_for_gla_and_rwkv6_a_power_of_two(name):
    # GLA's and RWKV-6's bisection halves a chunk: 6 would count some pairs twice and others not at all
    inputs, kw = make_inputs(name, 0, t=11, strong=True)
    chunked = SCANS[name]["chunked"]
    for bad in (0, -4, 2.0, None):
        with pytest.raises(ValueError, match="chunk_size .* must be"):
            call(chunked, inputs, {**kw, "chunk_size": bad})
    ref = call(SCANS[name]["naive"], inputs, kw)
    powers = name in ("gla", "rwkv6")
    for chunk_size in (3, 6, 12):
        if powers:
            with pytest.raises(ValueError, match="must be a power of two"):
                call(chunked, inputs, {**kw, "chunk_size": chunk_size})
        else:  # any chunk works: the last one is padded
            close(call(chunked, inputs, {**kw, "chunk_size": chunk_size}), ref, 1e-10)
    for chunk_size in (1, 2, 8):
        close(call(chunked, inputs, {**kw, "chunk_size": chunk_size}), ref, 1e-10)

def test_kernels_write_every_block_of_rows_at_the_official_headdim_64():
    # _ssd_kernel's programs own BLOCK_P = 32 rows of a head: at headdim 64 two programs per head; a launch of
    # one program per head leaves rows 32-63 unwritten. Likewise the selective scan's 32-channel blocks (d =
    # 40) and GLA's 32-column value blocks (dv = 40).
    gen = torch.Generator().manual_seed(5)
    N, U = (functools.partial(f, generator=gen) for f in (torch.randn, torch.rand))
    b, t, H, p, g, n = 2, 3, 2, 64, 1, 8
    cases = {"ssd": [N(b, t, H, p), U(b, t, H) + 0.1, -U(H) - 0.5, N(b, t, g, n), N(b, t, g, n),
                     N(b, H, p, n)],
             "selective_scan": [N(b, t, 40), U(b, t, 40) + 0.1, -U(40, 4) - 0.5, N(b, t, 4), N(b, t, 4),
                                N(b, 40, 4)],
             "gla": [N(b, t, H, 8), N(b, t, H, 8), N(b, t, H, 40), -U(b, t, H, 8), N(b, H, 8, 40)]}
    for name, inputs in cases.items():
        ref = call(SCANS[name]["naive"], [v.double() for v in inputs], {})
        assert ref[0][..., 32:].abs().max() > 0.1   # the rows past 32 hold something to compare
        close(call(forms(name)["triton"], inputs, {}), ref, 1e-5)

def test_auto_on_a_cpu_tensor_is_the_chunked_form_without_the_interpreter(monkeypatch):
    # "auto" picks Triton on CUDA only; with TRITON_INTERPRET unset (as outside the tests) a CPU tensor given
    # to a Triton form is an error, so a layer that picked it would fail here
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    x = torch.zeros(1, 2, 3)
    for scans in SCANS.values():
        picked = pick_form(scans, "auto", x, chunk_size=8)
        assert picked.func is scans["chunked"] and picked.keywords == {"chunk_size": 8}
        assert pick_form(scans, "naive", x) is scans["naive"]
    inputs, kw = make_inputs("ssd", 0, t=3)
    with pytest.raises(RuntimeError, match="needs CUDA tensors"):
        call(SCANS["ssd"]["triton"], inputs, kw)
    for arch in model.ARCHS:
        torch.manual_seed(0)
        lm = model.LM(model.make_config(arch, "tiny", vocab_size=20))
        idx = torch.randint(0, 20, (2, 9))
        with torch.no_grad():
            auto = model.set_scan_impl(lm, "auto")(idx)
            chunked = model.set_scan_impl(lm, "chunked")(idx)
        torch.testing.assert_close(auto, chunked, rtol=0, atol=0)
