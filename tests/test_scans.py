"""The four scans (Mamba-2 SSD, Mamba-1 selective scan, GLA, RWKV-6), each in three forms: the naive loop
(the definition), the chunked PyTorch form and the Triton kernel (Triton's interpreter on a CPU, see
conftest.py). They agree in outputs, final states and gradients, with and without an initial state,
and running a sequence in pieces while carrying the state equals one pass."""
import functools
import math
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import gla
import rwkv
import ssm
from conftest import ROOT


# Input makers: (inputs, keyword arguments). inputs end with the initial state; those whose first two
# dims are (b, t) have a time axis. strong=True gives log decays of 5-10 nats per step (in some channels).
def draws(gen):   # float64 tensors of the given shape: standard normal, uniform in [0, 1)
    return [functools.partial(f, generator=gen, dtype=torch.float64) for f in (torch.randn, torch.rand)]


def ssd_inputs(gen, b=2, t=13, strong=False):
    (N, U), (h, p, g, n) = draws(gen), (4, 6, 2, 12)  # p, n not powers of two: the kernel's masks at work
    A = -(U(h) * (10.0 if strong else 2.0) + 0.1)
    return [N(b, t, h, p), U(b, t, h) + 0.01, A, N(b, t, g, n), N(b, t, g, n), N(b, h, p, n)], {}


def selective_inputs(gen, b=2, t=13, strong=False):
    (N, U), (d, n) = draws(gen), (12, 5)
    dt, A = U(b, t, d) * (10.0 if strong else 0.5) + 1e-3, -U(d, n) * (20.0 if strong else 2.0) - 0.05
    return [N(b, t, d), dt, A, N(b, t, n), N(b, t, n), 3 * N(b, d, n)], {}


def gla_inputs(gen, b=2, t=13, strong=False):
    (N, U), (h, dk, dv) = draws(gen), (2, 12, 6)
    g = F.logsigmoid(N(b, t, h, dk)) / 16  # the layer's range
    if strong:  # odd channels lose 5-10 nats a step, even ones barely decay
        g[..., 1::2] = -5 - 5 * U(b, t, h, dk // 2)
    return [N(b, t, h, dk), N(b, t, h, dk), N(b, t, h, dv), g, N(b, h, dk, dv)], {"scale": 0.5}


def rwkv_inputs(gen, b=2, t=13, strong=False):
    (N, U), (h, dk, dv) = draws(gen), (2, 8, 40)  # dv = 40: two kernel value blocks, the second one masked
    w = -U(b, t, h, dk) * (10.0 if strong else 1.0)
    if strong:  # half the channels barely decay
        w[..., : dk // 2] = -0.05 * U(b, t, h, dk // 2)
    return [N(b, t, h, dk), N(b, t, h, dk), N(b, t, h, dv), w, N(h, dk), N(b, h, dk, dv)], {"scale": 0.7}


SCANS = {  # name: (naive, chunked, triton, make_inputs)
    "ssd": (ssm.ssd_naive, ssm.ssd_chunked, ssm.ssd_triton, ssd_inputs),
    "selective_scan": (ssm.selective_scan_naive, ssm.selective_scan_chunked, ssm.selective_scan_triton,
                       selective_inputs),
    "gla": (gla.gla_naive, gla.gla_chunked, gla.gla_triton, gla_inputs),
    "rwkv6": (rwkv.rwkv6_naive, rwkv.rwkv6_chunked, rwkv.rwkv6_triton, rwkv_inputs),
}
GPU = torch.cuda.is_available()  # then the Triton form runs compiled (else interpreted: conftest.py)


def on_gpu(scan):
    """scan on CUDA copies of the inputs, its results back on the CPU (gradients flow through .to)."""
    def run(*inputs, initial_state=None, **kw):
        y, s = scan(*(v.cuda() for v in inputs), initial_state=initial_state if initial_state is None
                    else initial_state.cuda(), **kw)
        return y.cpu(), s.cpu()
    return run


def forms(name):
    """The three forms; chunks of 4, so that t = 13 ends in a partial chunk."""
    naive, chunked, triton_form, _ = SCANS[name]
    return {"naive": naive, "chunked": functools.partial(chunked, chunk_size=4),
            "triton": on_gpu(triton_form) if GPU else triton_form}


def call(scan, inputs, kw, with_state=True):
    return scan(*inputs[:-1], initial_state=inputs[-1] if with_state else None, **kw)


def close(actual, expected, tol):
    """Max error within tol of the largest expected value; pairwise for (y, final_state) or gradients."""
    if isinstance(expected, (tuple, list)):
        return [close(a, e, tol) for a, e in zip(actual, expected, strict=True)]
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    err = (actual.double() - expected.double()).abs().max().item()
    assert err <= tol * (1 + expected.double().abs().max().item()), err


@pytest.mark.parametrize("strong", [False, True], ids=["mild", "strong"])
@pytest.mark.parametrize("name", SCANS)
def test_three_forms_agree(name, strong):
    inputs, kw = SCANS[name][3](torch.Generator().manual_seed(0), strong=strong)
    inputs32 = [v.float() for v in inputs]
    for with_state in (True, False):
        ref = call(SCANS[name][0], inputs, kw, with_state)
        close(call(forms(name)["chunked"], inputs, kw, with_state), ref, 1e-10)
        for form in ("chunked", "triton"):  # float32, as they run in a model; no overflow at strong decay
            y, s = call(forms(name)[form], inputs32, kw, with_state)
            assert y.dtype == s.dtype == torch.float32
            close((y, s), ref, 1e-4)
    for scan in (SCANS[name][0], forms(name)["chunked"]):  # initial_state=None means zeros
        zeros = inputs32[:-1] + [torch.zeros_like(inputs32[-1])]
        for a, b in zip(call(scan, inputs32, kw, with_state=False), call(scan, zeros, kw)):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def grads(scan, inputs, kw, weights, with_state=True):
    """Gradients of <y, w_y> + <final_state, w_s> w.r.t. every input (the initial state included)."""
    leaves = [v.detach().clone().requires_grad_() for v in inputs]
    y, s = call(scan, leaves, kw, with_state)
    ((y * weights[0].to(y.dtype)).sum() + (s * weights[1].to(s.dtype)).sum()).backward()
    return [v.grad for v in leaves]


@pytest.mark.parametrize("strong", [False, True], ids=["mild", "strong"])
@pytest.mark.parametrize("name", SCANS)
def test_gradients_agree(name, strong):
    inputs, kw = SCANS[name][3](torch.Generator().manual_seed(1), t=10, strong=strong)
    y, s = call(SCANS[name][0], inputs, kw)
    weights = [torch.randn(y.shape, dtype=y.dtype), torch.randn(s.shape, dtype=s.dtype)]
    ref = grads(SCANS[name][0], inputs, kw, weights)
    close(grads(forms(name)["chunked"], inputs, kw, weights), ref, 1e-8)
    inputs32 = [v.float() for v in inputs]
    got = grads(forms(name)["triton"], inputs32, kw, weights)
    assert all(g.dtype == torch.float32 for g in got)
    close(got, ref, 1e-3)
    assert all(torch.isfinite(g).all() for g in grads(forms(name)["chunked"], inputs32, kw, weights))
    # a loss on y alone, from the zero state: the Triton form's backward gets a zero final-state gradient
    weights = [weights[0], torch.zeros_like(weights[1])]
    got = grads(forms(name)["triton"], inputs32, kw, weights, with_state=False)
    close(got[:-1], grads(SCANS[name][0], inputs, kw, weights, with_state=False)[:-1], 1e-3)


@pytest.mark.parametrize("form", ["naive", "chunked", "triton"])
@pytest.mark.parametrize("name", SCANS)
def test_pieces_with_the_state_carried_equal_one_pass_and_bf16_computes_in_float32(name, form):
    b, t = 2, 10
    inputs, kw = SCANS[name][3](torch.Generator().manual_seed(2), b=b, t=t)
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
    (x, dt, A, B, C, s0), _ = ssd_inputs(torch.Generator().manual_seed(4), t=19)
    (b, t, h, p), B, C = x.shape, B[:, :, :1], C[:, :, :1]
    y, s = ssm.ssd_chunked(x, dt, A, B, C, initial_state=s0)
    A_sel = A.repeat_interleave(p)[:, None].expand(h * p, B.shape[-1])
    y_sel, s_sel = ssm.selective_scan_chunked(x.reshape(b, t, h * p), dt.repeat_interleave(p, -1), A_sel,
                                              B[:, :, 0], C[:, :, 0], initial_state=s0.reshape(b, h * p, -1))
    close((y.reshape(b, t, h * p), s.reshape(b, h * p, -1)), (y_sel, s_sel), 1e-10)


def mixer(arch):
    torch.manual_seed(0)
    if arch == "mamba2":  # two groups; larger dt than the default init, so the state carries real information
        m = ssm.Mamba2(d_model=32, d_state=16, headdim=16, ngroups=2, chunk_size=8)
        with torch.no_grad():
            m.dt_bias.add_(2.0)
        return m
    return ssm.Mamba1(d_model=16)


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
    close(outs["chunked"], outs["naive"], 1e-4)
    close(outs["triton"], outs["naive"], 1e-4)


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
import torch, model, test_scans
for arch in ("mamba2", "mamba1", "gla", "rwkv6"):
    logits, state = model.LM(model.make_config(arch, "tiny", vocab_size=20))(torch.randint(0, 20, (2, 9)))
    logits.sum().backward()
for name, (naive, chunked, triton_form, make) in test_scans.SCANS.items():
    inputs, kw = make(torch.Generator().manual_seed(0), t=5)
    naive(*inputs[:-1], initial_state=inputs[-1], **kw)
    chunked(*inputs[:-1], initial_state=inputs[-1], **kw)
    try:
        triton_form(*inputs[:-1], initial_state=inputs[-1], **kw)
    except RuntimeError as e:
        print(name, "raised:", e)
'''


def test_without_triton_the_other_forms_work_and_triton_forms_say_why():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", NO_TRITON], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    raised = dict(line.split(" raised: ", 1) for line in r.stdout.splitlines() if " raised: " in line)
    assert all("needs Triton" in raised.get(name, "") for name in SCANS), r.stdout
