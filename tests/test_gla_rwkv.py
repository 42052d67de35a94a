"""What is specific to gla.py / rwkv.py (test_scans.py checks that the three forms of every scan agree):
the stable bisection of the shared chunked form in every decay regime, the layers' sizes and init, and
RWKV-6's per-layer init schedule (BlinkDL's rwkv_v6_demo.py) with the parameters its optimizer sets apart."""
import math

import pytest
import torch
import torch.nn.functional as F

import gla
import model
import rwkv
from gla import GLA, SwiGLU
from rwkv import RWKV6ChannelMix, RWKV6TimeMix
from conftest import checkpoint, tiny_lm
from test_scans import SCANS, call, close


# Per-step log decay: leaves of a whole chunk (0.01), a few bisection levels (0.3, 2), down to
# two-token leaves (10: a 32-token chunk decays by ~160 nats) and one-token leaves (40).
@pytest.mark.parametrize("decay", [0.01, 0.3, 2.0, 10.0, 40.0])
@pytest.mark.parametrize("name", ["gla", "rwkv6"])
def test_chunked_bisection_is_exact_in_every_decay_regime(name, decay):
    inputs, kw = SCANS[name][3](torch.Generator().manual_seed(0), t=75)   # the log decay (g, w): U(-decay, 0)
    inputs[3] = -decay * torch.rand(inputs[3].shape, generator=torch.Generator().manual_seed(1)).double()
    ref = call(SCANS[name][0], inputs, kw)
    for chunk_size in (8, 32):
        close(call(SCANS[name][1], inputs, {**kw, "chunk_size": chunk_size}), ref, 1e-10)


@pytest.mark.parametrize("name", ["gla", "rwkv6"])
def test_chunked_float32_survives_decays_past_88_nats_per_chunk(name):
    # -10 nats per step: a 64-token chunk decays by 640; exp(-cumsum(g)) would be inf and give nan.
    inputs, kw = SCANS[name][3](torch.Generator().manual_seed(0), t=200)
    inputs[3] = torch.full_like(inputs[3], -10.0)
    ref = call(SCANS[name][0], inputs, kw)
    inputs = [v.float().requires_grad_() for v in inputs]
    y, s = call(SCANS[name][1], inputs, {**kw, "chunk_size": 64})
    close((y, s), ref, 1e-4)
    (y.sum() + s.sum()).backward()
    assert all(torch.isfinite(v.grad).all() for v in inputs)


def test_gla_layer_mlp_and_lm_are_sized_and_initialised_as_fla(tmp_path):
    layer = GLA(64, num_heads=4)
    assert (layer.head_k_dim, layer.head_v_dim, layer.norm_eps) == (8, 16, 1e-6)  # fla's GLAConfig.norm_eps
    assert [n for n, _ in layer.named_parameters() if n.endswith("bias")] == ["gk_proj.1.bias"]
    assert not layer.gk_proj[1].bias.any() and abs(layer.q_proj.weight.std().item() - 0.02) < 0.005
    y, state = layer(torch.randn(3, 10, 64))
    assert y.shape == (3, 10, 64) and state["h"].shape == (3, 4, 8, 16)
    assert SwiGLU(64).intermediate_size == 256 and SwiGLU(384).intermediate_size == 1024  # 8/3 d, 256s
    assert SwiGLU(64).zero_state(2, "cpu") == {}
    # the LM unties its head as fla does (Mamba's ties it) and loads back
    gla_lm = tiny_lm("gla")
    assert gla_lm.lm_head.weight is not gla_lm.backbone.embedding.weight  # fla's GLAConfig: untied
    assert {m.eps for m in gla_lm.modules() if isinstance(m, torch.nn.RMSNorm)} == {1e-6}
    x = torch.randint(0, 257, (2, 9))
    loaded = model.from_pretrained(checkpoint(tmp_path / "run", lm=gla_lm)[0])
    torch.testing.assert_close(loaded(x)[0], gla_lm(x)[0], rtol=0, atol=0)
    m = tiny_lm("mamba2")
    assert m.lm_head.weight is m.backbone.embedding.weight and m.cfg.norm_eps == 1e-5


def test_rwkv6_init_follows_the_official_per_layer_schedule():
    L, d, K = 12, 64, 32
    first, last = RWKV6TimeMix(d, num_heads=4, layer_idx=0, num_layers=L), \
        RWKV6TimeMix(d, num_heads=4, layer_idx=L - 1, num_layers=L)
    zigzag = torch.tensor([0.0, 0.1, -0.1] * 11)[:K].view(4, 8)
    torch.testing.assert_close(first.bonus.data, zigzag)                      # ratio_0_to_1 = 0
    torch.testing.assert_close(last.bonus.data, (1 - torch.arange(K) / (K - 1)).view(4, 8) + zigzag)
    for layer, exponent in [(first, 0.7), (last, 2.0)]:                       # 0.7 + 1.3 ratio_0_to_1
        assert layer.w0[0] == -6.0 and math.isclose(layer.w0[-1].item(), -1.0, rel_tol=1e-6)
        assert math.isclose(layer.w0[16].item(), -6 + 5 * (16 / 31) ** exponent, rel_tol=1e-5)
    assert (first.w0[1:-1] > last.w0[1:-1]).all()  # lower layers decay faster
    ramp = torch.arange(d) / d
    torch.testing.assert_close(first.mu_x.data, 1 - ramp)                      # ratio_1_to_almost0 = 1
    torch.testing.assert_close(last.mu_x.data, 1 - ramp ** (1 / L))
    torch.testing.assert_close(last.mu[3].data, 1 - ramp ** (1 / L) - 0.3)    # v
    torch.testing.assert_close(last.mu[0].data, 1 - ramp ** (0.5 / L))        # r
    torch.testing.assert_close(RWKV6ChannelMix(d, layer_idx=L - 1, num_layers=L).mu_k.data, last.mu_x.data)
    assert first.norm_weight[0].item() == pytest.approx((1 / L) ** 0.7) and last.norm_weight[0] == 1.0
    assert first.norm_eps == 6.4e-4                                           # BlinkDL's ln_x
    lm = tiny_lm("rwkv6", n_layer=3)   # the LM gives each layer its depth
    assert [block.mixer.bonus[0, 0].item() for block in lm.backbone.layers] == pytest.approx([0.0, 0.5, 1.0])
    ffn_mix = [block.mlp.mu_k[1].item() for block in lm.backbone.layers]
    assert ffn_mix[0] > ffn_mix[1] > ffn_mix[2]
    # the official optimizer: no weight decay on mixes, decay, bonus, LoRAs; the decay at 2x lr
    exempt = {n for n, p in first.named_parameters() if getattr(p, "_no_weight_decay", False)}
    assert exempt == {"mu_x", "mu", "mix_lora_down", "mix_lora_up", "w0", "decay_lora_down",
                      "decay_lora_up", "bonus"}
    assert first.w0._lr_scale == 2.0 and not hasattr(first.bonus, "_lr_scale")
    assert RWKV6ChannelMix(d).mu_r._no_weight_decay


def scan_inputs(layer, forms, x, monkeypatch):
    """The inputs the layer hands its scan (the naive form) on x."""
    seen, naive = [], forms["naive"]
    monkeypatch.setitem(forms, "naive", lambda *a: seen.append(a) or naive(*a))
    layer.scan_impl = "naive"
    with torch.no_grad():
        layer(x)
    return seen[0]


def test_gla_forget_gate_is_logsigmoid_of_its_logits_over_16(monkeypatch):
    layer, x = GLA(64, num_heads=4), torch.randn(2, 5, 64)
    torch.nn.init.normal_(layer.gk_proj[1].bias, std=3.0)   # logits of either sign, some large
    g = scan_inputs(layer, gla.GLA_SCANS, x, monkeypatch)[3]
    with torch.no_grad():   # fla's gate_logit_normalizer: 16
        torch.testing.assert_close(g, F.logsigmoid(layer.gk_proj(x)).view(2, 5, 4, 8) / 16)


def test_rwkv6_decay_lora_reads_the_decays_own_token_shift_mix(monkeypatch):
    # w = -exp(w0 + tanh(x_w A) B), x_w = x + (x_prev - x) * mu_w; at init mu_w = mu_k and the LoRA is zero
    layer, x = RWKV6TimeMix(64, num_heads=4, layer_idx=1, num_layers=3), torch.randn(2, 5, 64)
    with torch.no_grad():
        layer.mu[1].uniform_()
        torch.nn.init.normal_(layer.decay_lora_down, std=0.3)
        x_w = x + (F.pad(x[:, :-1], (0, 0, 1, 0)) - x) * layer.mu[1]   # mix_lora_down = 0: mu_w alone
        want = -torch.exp(layer.w0 + torch.tanh(x_w @ layer.decay_lora_down) @ layer.decay_lora_up)
    torch.testing.assert_close(scan_inputs(layer, rwkv.RWKV6_SCANS, x, monkeypatch)[3], want.view(2, 5, 4, 8))


def test_rwkv6_channel_mix_is_sigmoid_r_times_squared_relu_k_through_value():
    cm, x = RWKV6ChannelMix(64, layer_idx=1, num_layers=3), torch.randn(2, 5, 64)
    delta = F.pad(x[:, :-1], (0, 0, 1, 0)) - x   # the previous token minus this one (zero state)
    with torch.no_grad():
        k = torch.relu((x + delta * cm.mu_k) @ cm.key.weight.T).square()
        want = torch.sigmoid((x + delta * cm.mu_r) @ cm.receptance.weight.T) * (k @ cm.value.weight.T)
        torch.testing.assert_close(cm(x)[0], want)
