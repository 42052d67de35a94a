"""RWKV-6 (Finch's time mixing; Peng et al. 2024, arXiv:2404.05892), one of the paper's four recurrent models;
official code: BlinkDL/RWKV-LM, RWKV-v5/rwkv_v6_demo.py (RWKV_Tmix_x060 / RWKV_CMix_x060), layer dimensions
(expand_k = 0.5) as flash-linear-attention's RWKV6Attention. Per head, the paper's recurrence
(arXiv 2507.02782, Sec. 2) with A_t = diag(exp(w_t)) (decay), B_t x_t = k_t^T v_t (write); the output reads
the state before the step plus the current token's bonus u:
    y_t = scale * r_t (h_{t-1} + diag(u) k_t^T v_t)        h_t = diag(exp(w_t)) h_{t-1} + k_t^T v_t
Shapes (b batch, t time, H heads, dk / dv key / value channels per head): receptance r (the query), key k
[b, t, H, dk]; value v [b, t, H, dv]; data-dependent log decay w <= 0 [b, t, H, dk]; u [H, dk];
h [b, H, dk, dv]. initial_state: as in ssm.py; dtypes and zero-length inputs: plumbing/scans.py."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from gla import STATE, chunked_scan, recurrent_forward
from plumbing.scans import (check_chunk_size, check_initial_state, check_state, compute_dtype, no_steps,
                            pick_form, set_head_dims, triton_scan)

def rwkv6_naive(r, k, v, w, u, initial_state=None, scale=1.0):
    """y_t = scale r_t (h_{t-1} + diag(u) k_t^T v_t), h_t = diag(exp(w_t)) h_{t-1} + k_t^T v_t, as a loop."""
    b, t, H, dk = r.shape
    check_initial_state("rwkv6_naive", initial_state, (b, H, dk, v.shape[-1]), STATE)
    dtype = compute_dtype(r, k, v, w, initial_state)
    h = r.new_zeros(b, H, dk, v.shape[-1], dtype=dtype) if initial_state is None else initial_state.to(dtype)
    if t == 0:
        return no_steps(r.new_zeros(b, 0, H, v.shape[-1]), h)
    k, v, u = (x.to(dtype) for x in (k, v, u))
    decay = w.to(dtype).exp()  # [b, t, H, dk]
    ys = []
    for i in range(t):
        write = k[:, i, :, :, None] * v[:, i, :, None, :]  # [b, H, dk, dv]
        ys.append(scale * torch.einsum("bHk,bHkv->bHv", r[:, i].to(dtype), h + u[:, :, None] * write))
        h = decay[:, i, :, :, None] * h + write
    return torch.stack(ys, dim=1).to(r.dtype), h

def rwkv6_chunked(r, k, v, w, u, initial_state=None, scale=1.0, chunk_size=32):
    """y_t = scale r_t (h_{t-1} + diag(u) k_t^T v_t), h_t = diag(exp(w_t)) h_{t-1} + k_t^T v_t, by chunks."""
    # gla.chunked_scan, shift=True: r_t reads h_{t-1}; the bonus pairs a token with itself: (r_t . u k_t) v_t
    check_initial_state("rwkv6_chunked", initial_state, (r.shape[0], *r.shape[2:], v.shape[-1]), STATE)
    check_chunk_size("rwkv6_chunked", chunk_size, power_of_two=True)
    y, final_state = chunked_scan(r, k, v, w, initial_state, chunk_size, shift=True)
    bonus = (r.to(y.dtype) * u.to(y.dtype) * k.to(y.dtype)).sum(-1, keepdim=True) * v.to(y.dtype)
    return (scale * (y + bonus)).to(r.dtype), final_state

# --- Layers: time mix (the recurrent mixer) and channel mix (the MLP) -----------------------------------
# Token shift: both sub-layers mix each token with the previous token's input, which is therefore part of
# the recurrent state ("shift", "ffn_shift"), or splitting a sequence would change each piece's first token.
# Init: BlinkDL's per-layer schedule (rwkv_v6_demo.py; read-out GroupNorm weight: generate_init_weight in
# RWKV-v5/src/model.py): lower layers lean more on the previous token and decay faster. The official
# optimizer (configure_optimizers, ibid.) exempts the mixes, decay, bonus and LoRAs from weight decay and
# gives the decay twice the learning rate: marked _no_weight_decay / _lr_scale.
class RWKV6TimeMix(nn.Module):
    """ddlerp token shift, data-dependent decay, matrix-state scan, per-head GroupNorm, output gate."""
    def __init__(self, d_model, num_heads=4, proj_low_rank_dim=32, gate_low_rank_dim=64, expand_k=0.5,
                 expand_v=1.0, norm_eps=6.4e-4, layer_idx=0, num_layers=1, scan_impl="auto"):
        super().__init__()
        self.d_model = d_model
        self.scan_impl = scan_impl
        set_head_dims(self, "RWKV6", d_model, num_heads, expand_k, expand_v)
        self.norm_eps = norm_eps  # BlinkDL's ln_x: 1e-5 * head_size_divisor**2 = 6.4e-4 (fla: 1e-5)
        ratio_0_to_1 = layer_idx / max(num_layers - 1, 1)
        ratio_1_to_almost0 = 1.0 - layer_idx / num_layers
        ramp = torch.arange(d_model) / d_model
        key_ramp = torch.arange(self.key_dim) / max(self.key_dim - 1, 1)  # over the key channels of all heads
        zigzag = ((torch.arange(self.key_dim) + 1) % 3 - 1) * 0.1  # bonus (time_faaaa) of layer 0: 0, .1, -.1
        shift_share = 1.0 - ramp.pow(ratio_1_to_almost0)  # token-shift mixes (time_maa_*); r, g: half_share
        half_share = 1.0 - ramp.pow(0.5 * ratio_1_to_almost0)
        # ddlerp: x_c = x + (x_prev - x) * (mu_c + lora_c(x + (x_prev - x) * mu_x)), c in (r, w, k, v, g)
        self.mu_x = nn.Parameter(shift_share.clone())
        self.mu = nn.Parameter(torch.stack([half_share, shift_share, shift_share,
                                            shift_share - 0.3 * ratio_0_to_1, half_share]))
        self.mix_lora_down = nn.Parameter(torch.zeros(d_model, 5 * proj_low_rank_dim))
        self.mix_lora_up = nn.Parameter(torch.empty(5, proj_low_rank_dim, d_model).uniform_(-0.01, 0.01))
        # log decay w = -exp(w0 + lora(x_w)) (time_decay), at init from -0.0025 (w0 = -6) to -0.37 (w0 = -1)
        self.w0 = nn.Parameter(-6.0 + 5.0 * key_ramp.pow(0.7 + 1.3 * ratio_0_to_1))
        self.w0._lr_scale = 2.0
        self.decay_lora_down = nn.Parameter(torch.zeros(d_model, gate_low_rank_dim))
        self.decay_lora_up = nn.Parameter(torch.empty(gate_low_rank_dim, self.key_dim).uniform_(-0.01, 0.01))
        self.bonus = nn.Parameter((ratio_0_to_1 * (1.0 - key_ramp) + zigzag).view(num_heads, self.head_k_dim))
        for name in "mu_x mu mix_lora_down mix_lora_up w0 decay_lora_down decay_lora_up bonus".split():
            getattr(self, name)._no_weight_decay = True   # by name: a new parameter is not exempted silently
        self.r_proj = nn.Linear(d_model, self.key_dim, bias=False)
        self.k_proj = nn.Linear(d_model, self.key_dim, bias=False)
        self.v_proj = nn.Linear(d_model, self.value_dim, bias=False)
        self.g_proj = nn.Linear(d_model, self.value_dim, bias=False)
        self.norm_weight = nn.Parameter(torch.full((self.value_dim,), ((layer_idx + 1) / num_layers) ** 0.7))
        self.norm_bias = nn.Parameter(torch.zeros(self.value_dim))
        self.o_proj = nn.Linear(self.value_dim, d_model, bias=False)

    def state_shapes(self, batch_size):
        return {"h": (batch_size, self.num_heads, self.head_k_dim, self.head_v_dim),
                "shift": (batch_size, self.d_model)}

    def zero_state(self, batch_size, device):
        return {k: torch.zeros(shape, device=device) for k, shape in self.state_shapes(batch_size).items()}

    def forward(self, x, state=None):
        check_state("RWKV6TimeMix", state, self.state_shapes(x.shape[0]))
        b, t, _ = x.shape
        delta, shift = _token_shift(x, state and state["shift"])
        lora = torch.tanh((x + delta * self.mu_x) @ self.mix_lora_down).unflatten(-1, (5, -1))
        mix = torch.einsum("btfr,frd->btfd", lora, self.mix_lora_up) + self.mu  # [b, t, 5, d_model]
        x_r, x_w, x_k, x_v, x_g = (x.unsqueeze(2) + delta.unsqueeze(2) * mix).unbind(2)
        heads = lambda proj: proj.unflatten(-1, (self.num_heads, -1))  # [b, t, H, d]; also when t = 0
        r = heads(self.r_proj(x_r))
        k = heads(self.k_proj(x_k))
        v = heads(self.v_proj(x_v))
        w = heads(-torch.exp(self.w0 + torch.tanh(x_w @ self.decay_lora_down) @ self.decay_lora_up))
        y, h = pick_form(RWKV6_SCANS, self.scan_impl, x)(r, k, v, w, self.bonus, state and state["h"])
        y = F.group_norm(y.reshape(b * t, self.value_dim), self.num_heads, self.norm_weight, self.norm_bias,
                         self.norm_eps).view(b, t, self.value_dim)
        return self.o_proj(y * F.silu(self.g_proj(x_g))), {"h": h, "shift": shift}

class RWKV6ChannelMix(nn.Module):
    """Token shift, squared-ReLU key, sigmoid receptance gate; hidden size 3.5 d_model (a multiple of 32)."""
    def __init__(self, d_model, hidden_ratio=3.5, layer_idx=0, num_layers=1):
        super().__init__()
        self.d_model = d_model
        self.hidden_dim = 32 * -(-int(d_model * hidden_ratio) // 32)
        share = 1.0 - (torch.arange(d_model) / d_model).pow(1.0 - layer_idx / num_layers)  # as mu_x
        self.mu_k = nn.Parameter(share.clone())
        self.mu_r = nn.Parameter(share.clone())
        self.mu_k._no_weight_decay = self.mu_r._no_weight_decay = True
        self.key = nn.Linear(d_model, self.hidden_dim, bias=False)
        self.value = nn.Linear(self.hidden_dim, d_model, bias=False)
        self.receptance = nn.Linear(d_model, d_model, bias=False)

    def state_shapes(self, batch_size):
        return {"ffn_shift": (batch_size, self.d_model)}

    def zero_state(self, batch_size, device):
        return {k: torch.zeros(shape, device=device) for k, shape in self.state_shapes(batch_size).items()}

    def forward(self, x, state=None):
        check_state("RWKV6ChannelMix", state, self.state_shapes(x.shape[0]))
        delta, shift = _token_shift(x, state and state["ffn_shift"])
        k = torch.relu(self.key(x + delta * self.mu_k)).square()
        return torch.sigmoid(self.receptance(x + delta * self.mu_r)) * self.value(k), {"ffn_shift": shift}

def _token_shift(x, shift_state):  # x_prev - x (x_prev at position 0: shift_state, None: 0), new shift state
    b, t, d = x.shape
    first = x.new_zeros(b, 1, d) if shift_state is None else shift_state.to(x.dtype).unsqueeze(1)
    x_prev = torch.cat([first, x], dim=1)  # its row t: the last input, or at t = 0 the shift state kept
    return x_prev[:, :t] - x, x_prev[:, t].to(compute_dtype(x))

def rwkv6_triton(r, k, v, w, u, initial_state=None, scale=1.0):
    check_initial_state("rwkv6_triton", initial_state, (r.shape[0], *r.shape[2:], v.shape[-1]), STATE)
    launch = lambda r, k, v, w, u, h0, scale: recurrent_forward(r, k, v, w, h0, scale, u=u)
    return triton_scan(launch, rwkv6_chunked, r, k, v, w, u, initial_state, scale=scale)

RWKV6_SCANS = {"naive": rwkv6_naive, "chunked": rwkv6_chunked, "triton": rwkv6_triton}
