"""The GLA and RWKV-6 layers (their scans: test_scans.py): sizes and init as fla's, RWKV-6's per-layer init
schedule (rwkv_v6_demo.py) and the parameters its optimizer sets apart, what each computes from weights, and
that each runs its chunked scan as its loop."""
import pytest
import torch
import torch.nn.functional as F

from plumbing import checkpoints
from gla import GLA, GLA_SCANS, SwiGLU
from rwkv import RWKV6_SCANS, RWKV6ChannelMix, RWKV6TimeMix
from conftest import checkpoint, tiny_lm

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
    loaded = checkpoints.from_pretrained(checkpoint(tmp_path / "run", lm=gla_lm)[0])
    torch.testing.assert_close(loaded(x)[0], gla_lm(x)[0], rtol=0, atol=0)
    m = tiny_lm("mamba2")
    assert m.lm_head.weight is m.backbone.embedding.weight and m.cfg.norm_eps == 1e-5

def test_rwkv6_init_follows_the_official_per_layer_schedule():
    L, d, K = 12, 64, 32
    first, last = (RWKV6TimeMix(d, num_heads=4, layer_idx=i, num_layers=L) for i in (0, L - 1))
    zigzag = torch.tensor([0.0, 0.1, -0.1] * 11)[:K].view(4, 8)
    torch.testing.assert_close(first.bonus.data, zigzag)                      # ratio_0_to_1 = 0
    torch.testing.assert_close(last.bonus.data, (1 - torch.arange(K) / (K - 1)).view(4, 8) + zigzag)
    for layer, exponent in [(first, 0.7), (last, 2.0)]:                       # 0.7 + 1.3 ratio_0_to_1
        assert layer.w0[0] == -6.0 and layer.w0[-1].item() == pytest.approx(-1.0, rel=1e-6)
        assert layer.w0[16].item() == pytest.approx(-6 + 5 * (16 / 31) ** exponent, rel=1e-5)
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

@pytest.mark.parametrize("arch", ["gla", "rwkv6"])
def test_each_layer_hands_its_scan_the_log_decay_of_its_formula(arch, monkeypatch):
    # GLA (fla): g = logsigmoid(gk_proj(x)) / gate_logit_normalizer (16). RWKV-6: w = -exp(w0 + tanh(x_w A) B)
    # with the decay's own token-shift mix x_w = x + (x_prev - x) * mu_w (mix_lora_down = 0 at init)
    x, forms = torch.randn(2, 5, 64), GLA_SCANS if arch == "gla" else RWKV6_SCANS
    layer = GLA(64, num_heads=4) if arch == "gla" else RWKV6TimeMix(64, 4, layer_idx=1, num_layers=3)
    with torch.no_grad():
        if arch == "gla":
            torch.nn.init.normal_(layer.gk_proj[1].bias, std=3.0)   # logits of either sign, some large
            want = F.logsigmoid(layer.gk_proj(x)) / 16
        else:  # at init mu_w = mu_k and the LoRA is zero
            layer.mu[1].uniform_()
            torch.nn.init.normal_(layer.decay_lora_down, std=0.3)
            x_w = x + (F.pad(x[:, :-1], (0, 0, 1, 0)) - x) * layer.mu[1]
            want = -torch.exp(layer.w0 + torch.tanh(x_w @ layer.decay_lora_down) @ layer.decay_lora_up)
    seen, naive = [], forms["naive"]
    monkeypatch.setitem(forms, "naive", lambda *a: seen.append(a) or naive(*a))
    layer.scan_impl = "naive"
    with torch.no_grad():
        layer(x)
    torch.testing.assert_close(seen[0][3], want.view(2, 5, 4, 8))

@pytest.mark.parametrize("arch", ["gla", "rwkv6"])
def test_each_layer_runs_its_chunked_scan_as_its_loop_in_pieces_with_gradients(arch):
    # Square heads (dk = dv = 16): a decay put on the value side of the state then runs, and differs.
    # 70 steps: two GLA chunks, three RWKV-6 ones; pieces of 9 and 61 carry the state in between.
    torch.manual_seed(0)
    layer = GLA(32, num_heads=2, expand_k=1.0) if arch == "gla" else RWKV6TimeMix(32, 2, expand_k=1.0)
    layer.double()
    x = torch.randn(2, 70, 32, dtype=torch.float64)
    start = {k: torch.randn_like(v, dtype=torch.float64) for k, v in layer.zero_state(2, "cpu").items()}
    def run(impl, cuts):
        layer.scan_impl = impl
        layer.zero_grad()
        state, ys = {k: v.clone().requires_grad_() for k, v in start.items()}, []
        leaves = list(state.values())
        for a, b in zip(cuts, cuts[1:]):
            y, state = layer(x[:, a:b], state)
            ys.append(y)
        y = torch.cat(ys, 1)
        (y.square().sum() + sum(v.sum() for v in state.values())).backward()
        return [y, *state.values(), *(v.grad for v in leaves), *(p.grad for p in layer.parameters())]
    want = run("naive", [0, 70])
    for cuts in ([0, 70], [0, 9, 70]):
        torch.testing.assert_close(run("chunked", cuts), want, rtol=1e-10, atol=1e-10)

def test_rwkv6_channel_mix_is_sigmoid_r_times_squared_relu_k_through_value():
    cm, x = RWKV6ChannelMix(64, layer_idx=1, num_layers=3), torch.randn(2, 5, 64)
    delta = F.pad(x[:, :-1], (0, 0, 1, 0)) - x   # the previous token minus this one (zero state)
    with torch.no_grad():
        k = torch.relu((x + delta * cm.mu_k) @ cm.key.weight.T).square()
        want = torch.sigmoid((x + delta * cm.mu_r) @ cm.receptance.weight.T) * (k @ cm.value.weight.T)
        torch.testing.assert_close(cm(x)[0], want)
    assert RWKV6ChannelMix(40).hidden_dim == 160   # 3.5 x 40 = 140, rounded UP to a multiple of 32 (fla's)
