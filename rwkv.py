"""
RWKV-6 ("Finch", Peng et al. 2024, arXiv:2404.05892): the scan and the two sub-layers.

The recurrence, per head, with a matrix state S [dk, dv]:

    o_t = scale * r_t (S_{t-1} + diag(u) k_t^T v_t)          (u: the "bonus" for the current token)
    S_t = diag(exp(w_t)) S_{t-1} + k_t^T v_t                  (w_t <= 0: a data-dependent LOG decay)

S_{-1} is the `initial_state`. Everything the paper studies (State Passing, TBTT, noise, evaluation far
past the training length) only needs every scan to take an initial_state and return its final_state.

Layout: r, k, w [b, t, h, dk]; v [b, t, h, dv]; u [h, dk]; states [b, h, dk, dv].
Dtypes: inputs may be bf16/fp16 (autocast); all three forms compute in float32 (float64 when the inputs
are float64, for reference tests), return the output in the dtype of r and the final_state in the
compute dtype (float32 in normal use).
"""
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

from ssm import tl, triton  # Triton, or ssm.py's stand-in where it is not installed


# ---------------------------------------------------------------------------------------------------
# 1. Naive scan: the recurrence, one token at a time.
# ---------------------------------------------------------------------------------------------------

def rwkv6_naive(r, k, v, w, u, initial_state=None, scale=1.0):
    """Reference RWKV-6 scan: a Python loop over time that reads like the recurrence."""
    b, t, h, dk, dv = _check_inputs("rwkv6_naive", r, k, v, w, u, initial_state)
    dt, out_dtype = _compute_dtype(r), r.dtype
    r, k, v, w, u = (x.to(dt) for x in (r, k, v, w, u))
    S = r.new_zeros(b, h, dk, dv) if initial_state is None else initial_state.to(dt)
    outputs = []
    for i in range(t):
        kv = k[:, i, :, :, None] * v[:, i, :, None, :]                      # k_t^T v_t   [b, h, dk, dv]
        o = torch.einsum("bhk,bhkv->bhv", r[:, i], S + u[:, :, None] * kv)  # bonus only on the current token
        outputs.append(scale * o)
        S = w[:, i].exp()[..., None] * S + kv                                # decay, then write
    return torch.stack(outputs, dim=1).to(out_dtype), S


# ---------------------------------------------------------------------------------------------------
# 2. Chunked scan: parallel inside chunks of C tokens, a short sequential loop over chunk states.
# ---------------------------------------------------------------------------------------------------
#
# Within a chunk (local positions 0..C-1) let W_i = w_0 + ... + w_i (cumulative log decay, <= 0) and
# W_{-1} = 0. Unrolling the recurrence from the chunk's start state S_0 gives, for position i:
#
#   o_i / scale = (r_i * exp(W_{i-1})) S_0                                   inter-chunk (state) term
#               + sum_{j<i} [sum_d r_id k_jd exp(W_{i-1,d} - W_{j,d})] v_j    strictly-causal intra term
#               + (r_i . (u * k_i)) v_i                                        bonus (diagonal) term
#   S_C = diag(exp(W_{C-1})) S_0 + sum_j (k_j * exp(W_{C-1} - W_j))^T v_j      next chunk's start state
#
# Stability: every exponent is kept <= 0, so nothing large and positive is ever exponentiated, even for
# decays of w = -10 per step. The usual factorisation (r_i exp(W_{i-1})) . (k_j exp(-W_j)) of the intra
# term would overflow (exp(+10 C)). Materialising the per-channel factor exp(W_{i-1} - W_j) for all
# [C, C, dk] pairs is safe but costs C/2 * dk work per token in elementwise passes, too slow on a CPU.
# Instead, split the chunk into dyadic blocks: a pair j < i lies in the two halves of exactly one
# block (the smallest containing both). With m = the last position of that block's left half,
#     exp(W_{i-1} - W_j) = exp(W_{i-1} - W_m) * exp(W_m - W_j),   j <= m <= i-1,
# and BOTH factors are <= 1. So each block level is one "r-side" and one "k-side" rescaling plus a
# small matmul: log2(C) levels, exact, and never an exponent above zero.
# The recursion stops at the largest "leaf" block size whose total decay is small (<= 20 nats): inside
# a leaf one masked matmul against the state just before the block is safe (the k-side factor is at
# most e^20). With typical RWKV-6 decays the leaf is the whole chunk, so there is no recursion at all.

_MAX_LEAF_DECAY = 20.0  # e^20 ~ 5e8: a harmless factor in float32


def rwkv6_chunked(r, k, v, w, u, initial_state=None, scale=1.0, chunk_size=32):
    """Chunked RWKV-6 scan in plain PyTorch (autograd-trainable). T need not divide chunk_size
    (a power of two)."""
    b, t, h, dk, dv = _check_inputs("rwkv6_chunked", r, k, v, w, u, initial_state)
    C = int(chunk_size)
    if C < 1 or C & (C - 1):
        raise ValueError(f"rwkv6_chunked: chunk_size must be a power of two, got {chunk_size}")
    dt, out_dtype = _compute_dtype(r), r.dtype
    n = -(-t // C)
    pad = n * C - t

    def to_chunks(x):  # [b, t, h, d] -> [n, b, h, C, d]; padding (k = v = 0, w = 0) leaves the state unchanged
        x = x.to(dt)
        if pad:
            x = F.pad(x, (0, 0, 0, 0, 0, pad))
        return x.view(b, n, C, h, x.shape[-1]).permute(1, 0, 3, 2, 4).contiguous()  # blocks below are views

    r, k, v, w = (to_chunks(x) for x in (r, k, v, w))
    W = w.cumsum(dim=-2)                                        # W_i, inclusive
    W_prev = F.pad(W[..., :-1, :], (0, 0, 1, 0))                # W_{i-1}, with W_{-1} = 0 (exact, no W - w)
    # (exp_ below runs in place on fresh temporaries: same result, fewer large allocations on CPU)

    # Leaf size s: the largest power of two whose blocks decay by at most _MAX_LEAF_DECAY nats in total.
    # Inside such a block one masked matmul against the block's start is safe: the k-side factor
    # exp(W_ref - W_j) is >= 1 but at most e^_MAX_LEAF_DECAY. With the layer's usual decays s = C (no
    # recursion at all); strong decays fall back to smaller leaves, down to the pure recursion (s = 1).
    s = C
    while s > 1 and (W_prev[..., ::s, :] - W[..., s - 1::s, :]).max() > _MAX_LEAF_DECAY:
        s //= 2

    # intra-chunk scores [C, C]: the bonus on the diagonal, then one dyadic block level at a time
    scores = [((r * k) @ u.to(dt)[:, :, None]).squeeze(-1)]    # r_i . (u * k_i)
    size = C
    while size > s:
        half = size // 2
        blocks = lambda x: x.view(n, b, h, C // size, size, x.shape[-1])
        rb, kb, Wb, Wpb = blocks(r), blocks(k), blocks(W), blocks(W_prev)
        W_m = Wb[..., half - 1:half, :]                                        # left half's last position
        q = rb[..., half:, :] * (Wpb[..., half:, :] - W_m).exp_()              # exponent <= 0
        kk = kb[..., :half, :] * (W_m - Wb[..., :half, :]).exp_()              # exponent <= 0
        scores.append((q @ kk.transpose(-1, -2)).flatten(-3))                  # rows: right half, cols: left
        size = half
    if s > 1:  # leaf blocks: all pairs j < i inside a block, relative to the state before the block
        blocks = lambda x: x.view(n, b, h, C // s, s, x.shape[-1])
        W_ref = blocks(W_prev)[..., :1, :]                                     # W just before the block
        q = blocks(r) * (blocks(W_prev) - W_ref).exp_()                        # exponent <= 0
        kk = blocks(k) * (W_ref - blocks(W)).exp_()                            # exponent in [0, max leaf decay]
        leaf = (q @ kk.transpose(-1, -2)).flatten(-2)                          # [n, b, h, C/s, s*s]
        scores.append(leaf[..., _strictly_lower(s, r.device)].flatten(-2))
    A = torch.zeros(n, b, h, C * C, dtype=dt, device=r.device)
    A = A.index_copy(-1, _score_index(C, s, r.device), torch.cat(scores, dim=-1)).view(n * b * h, C, C)

    # chunk-level state: what each chunk writes, and how much the incoming state decays across it
    W_last = W[..., -1:, :]
    chunk_write = (k * (W_last - W).exp_()).transpose(-1, -2) @ v         # [n, b, h, dk, dv]
    chunk_decay = W_last.exp().transpose(-1, -2)                          # [n, b, h, dk, 1]
    S = r.new_zeros(b, h, dk, dv) if initial_state is None else initial_state.to(dt)
    start_states = []
    for i in range(n):  # T / C cheap steps: the only sequential part
        start_states.append(S)
        S = torch.addcmul(chunk_write[i], chunk_decay[i], S)

    # o = scale * (inter-chunk + intra-chunk), as one fused batched matmul-add over all chunks and heads
    q = (r * W_prev.exp()).view(n * b * h, C, dk)
    o = torch.baddbmm(A @ v.view(n * b * h, C, dv), q, torch.stack(start_states).view(n * b * h, dk, dv),
                      beta=scale, alpha=scale)
    o = o.view(n, b, h, C, dv).permute(1, 0, 3, 2, 4).reshape(b, n * C, h, dv)[:, :t]
    return o.to(out_dtype), S


# ---------------------------------------------------------------------------------------------------
# 3. Triton: a fused recurrent forward kernel; backward recomputes through the chunked form.
# ---------------------------------------------------------------------------------------------------

@triton.jit
def _rwkv6_recurrent_fwd_kernel(
    r_ptr, k_ptr, v_ptr, w_ptr, u_ptr, s0_ptr, o_ptr, sT_ptr,
    T, H, DK, DV, scale,
    HAS_INITIAL_STATE: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr,
):
    # One program = one (batch, head) and one block of value channels. The [dk, BLOCK_V] state tile
    # lives in registers for the whole sequence; each step reads one token's r, k, w, v.
    # 64-bit indices: b * T * H * D overflows int32 for long sequences.
    i_bh = tl.program_id(0).to(tl.int64)
    i_v = tl.program_id(1).to(tl.int64)
    i_b = i_bh // H
    i_h = i_bh % H
    offs_k = tl.arange(0, BLOCK_K)
    offs_v = i_v * BLOCK_V + tl.arange(0, BLOCK_V)
    mask_k = offs_k < DK
    mask_v = offs_v < DV
    mask_kv = mask_k[:, None] & mask_v[None, :]
    state_offs = i_bh * DK * DV + offs_k[:, None] * DV + offs_v[None, :]

    if HAS_INITIAL_STATE:
        S = tl.load(s0_ptr + state_offs, mask=mask_kv, other=0.0).to(tl.float32)
    else:
        S = tl.zeros([BLOCK_K, BLOCK_V], dtype=tl.float32)
    u = tl.load(u_ptr + i_h * DK + offs_k, mask=mask_k, other=0.0).to(tl.float32)

    # inputs are contiguous [b, t, h, d]: token (b, t, h) starts at ((b * T + t) * H + h) * d
    p_k = (i_b * T * H + i_h) * DK + offs_k
    p_v = (i_b * T * H + i_h) * DV + offs_v
    for _ in range(0, T):
        r_t = tl.load(r_ptr + p_k, mask=mask_k, other=0.0).to(tl.float32)
        k_t = tl.load(k_ptr + p_k, mask=mask_k, other=0.0).to(tl.float32)
        w_t = tl.load(w_ptr + p_k, mask=mask_k, other=0.0).to(tl.float32)
        v_t = tl.load(v_ptr + p_v, mask=mask_v, other=0.0).to(tl.float32)
        kv = k_t[:, None] * v_t[None, :]
        o_t = tl.sum((S + u[:, None] * kv) * r_t[:, None], axis=0) * scale
        tl.store(o_ptr + p_v, o_t.to(o_ptr.dtype.element_ty), mask=mask_v)
        S = S * tl.exp(w_t)[:, None] + kv
        p_k += H * DK
        p_v += H * DV

    tl.store(sT_ptr + state_offs, S, mask=mask_kv)


def _rwkv6_triton_forward(r, k, v, w, u, initial_state, scale):
    b, t, h, dk = r.shape
    dv = v.shape[-1]
    r, k, v, w = (x.float().contiguous() for x in (r, k, v, w))
    u = u.float().contiguous()
    o = torch.empty(b, t, h, dv, dtype=torch.float32, device=r.device)
    final_state = torch.empty(b, h, dk, dv, dtype=torch.float32, device=r.device)
    s0 = final_state if initial_state is None else initial_state.float().contiguous()  # dummy pointer when absent
    BLOCK_K = triton.next_power_of_2(dk)
    BLOCK_V = min(triton.next_power_of_2(dv), 32)  # keeps the register tile at most [dk, 32]
    grid = (b * h, triton.cdiv(dv, BLOCK_V))
    _rwkv6_recurrent_fwd_kernel[grid](
        r, k, v, w, u, s0, o, final_state, t, h, dk, dv, float(scale),
        HAS_INITIAL_STATE=initial_state is not None, BLOCK_K=BLOCK_K, BLOCK_V=BLOCK_V,
    )
    return o, final_state


class _RWKV6Triton(torch.autograd.Function):
    @staticmethod
    def forward(ctx, r, k, v, w, u, initial_state, scale):
        o, final_state = _rwkv6_triton_forward(r, k, v, w, u, initial_state, scale)
        ctx.save_for_backward(r, k, v, w, u, initial_state)
        ctx.scale = scale
        return o, final_state

    @staticmethod
    def backward(ctx, d_o, d_final_state):
        # Recompute the forward with the chunked form and differentiate that: same function, so the
        # same gradients, without a hand-written backward kernel.
        r, k, v, w, u, initial_state = ctx.saved_tensors
        with torch.enable_grad():
            inputs = [x.detach().requires_grad_(True) for x in (r, k, v, w, u)]
            if initial_state is not None:
                inputs.append(initial_state.detach().requires_grad_(True))
            o, final_state = rwkv6_chunked(*inputs[:5], initial_state=inputs[5] if len(inputs) > 5 else None,
                                           scale=ctx.scale)
            grads = torch.autograd.grad((o, final_state), inputs, (d_o, d_final_state), allow_unused=True)
        grads = list(grads) + [None] * (6 - len(grads))
        return (*grads, None)


def rwkv6_triton(r, k, v, w, u, initial_state=None, scale=1.0):
    """RWKV-6 scan with a fused recurrent Triton forward (CUDA, or CPU under TRITON_INTERPRET=1)."""
    if not hasattr(triton, "cdiv"):
        raise RuntimeError("rwkv6_triton needs Triton, which is not installed (Linux: pip install triton); use rwkv6_chunked")
    _check_inputs("rwkv6_triton", r, k, v, w, u, initial_state)
    if not r.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("rwkv6_triton: CPU tensors need TRITON_INTERPRET=1 set before triton is imported")
    o, final_state = _RWKV6Triton.apply(r, k, v, w, u, initial_state, float(scale))
    return o.to(r.dtype), final_state.to(_compute_dtype(r))


RWKV6_SCANS = {"naive": rwkv6_naive, "chunked": rwkv6_chunked, "triton": rwkv6_triton}


# ---------------------------------------------------------------------------------------------------
# 4. Layers: time mix (the recurrent mixer) and channel mix (the MLP), after RWKV-6 / Finch.
# ---------------------------------------------------------------------------------------------------
#
# Token shift: both sub-layers mix each token with the PREVIOUS token's input. That previous input is
# part of the recurrent state ("shift" / "ffn_shift"), otherwise splitting a sequence would change the
# first token of every piece.
#
# Init (RWKV-6 schedule, as in the official RWKV-LM x060 code): with l = layer_idx, L = num_layers,
# ratio_0_to_1 = l / (L - 1) and ratio_1_to_almost0 = 1 - l / L, and a ramp e_c = c / d_model over
# channels, the static mixing coefficients are 1 - e^ratio (so lower layers lean more on the previous
# token), the base decay is w0_n = -6 + 5 (n / (K-1))^(0.7 + 1.3 ratio_0_to_1) across all key channels
# (log decay -exp(w0) from about -0.0025 to -0.37: a spread of memory lengths per head), and the bonus is
# u_n = ratio_0_to_1 (1 - n / (K-1)) + a small zigzag. LoRA down-projections start at zero and the
# up-projections at U(-0.01, 0.01), so the data-dependent parts start as a small perturbation. Without
# layer_idx / num_layers we use the schedule of a middle layer (both ratios 0.5). The r/k/v/g/output
# projections keep PyTorch's default nn.Linear init (model.py may re-initialise linears globally; the
# RWKV-specific tensors are plain Parameters so such a pass leaves them alone). Group-norm: weight 1, bias 0.


class RWKV6TimeMix(nn.Module):
    """RWKV-6 time mix: ddlerp token shift, data-dependent decay, matrix-state scan, group norm, gate."""

    def __init__(self, d_model, num_heads=4, proj_low_rank_dim=32, gate_low_rank_dim=64, expand_k=0.5,
                 expand_v=1.0, norm_eps=1e-5, layer_idx=None, num_layers=None, scan_impl="auto"):
        super().__init__()
        self.d_model = d_model
        self.num_heads = num_heads
        self.key_dim = int(d_model * expand_k)      # expand_k=0.5, expand_v=1 as in flash-linear-attention
        self.value_dim = int(d_model * expand_v)    # (the official RWKV-6 uses key_dim = value_dim = d_model)
        if self.key_dim % num_heads or self.value_dim % num_heads:
            raise ValueError(f"RWKV6TimeMix: key_dim {self.key_dim} and value_dim {self.value_dim} "
                             f"must be divisible by num_heads {num_heads}")
        self.head_k_dim = self.key_dim // num_heads
        self.head_v_dim = self.value_dim // num_heads
        self.proj_low_rank_dim = proj_low_rank_dim
        self.norm_eps = norm_eps
        self.layer_idx = layer_idx
        self.scan_impl = scan_impl

        ratio_0_to_1, ratio_1_to_almost0 = _layer_ratios(layer_idx, num_layers)
        ramp = torch.arange(d_model, dtype=torch.float32) / d_model
        K = self.key_dim
        n = torch.arange(K, dtype=torch.float32) / max(K - 1, 1)
        zigzag = ((torch.arange(K) + 1) % 3 - 1).float() * 0.1

        # ddlerp: x_c = x + (x_prev - x) * (mu_c + lora_c(x + (x_prev - x) * mu_x)), c in (r, w, k, v, g)
        self.mu_x = nn.Parameter(1.0 - ramp.pow(ratio_1_to_almost0))
        self.mu = nn.Parameter(torch.stack([
            1.0 - ramp.pow(0.5 * ratio_1_to_almost0),                    # r
            1.0 - ramp.pow(ratio_1_to_almost0),                          # w
            1.0 - ramp.pow(ratio_1_to_almost0),                          # k
            1.0 - (ramp.pow(ratio_1_to_almost0) + 0.3 * ratio_0_to_1),   # v
            1.0 - ramp.pow(0.5 * ratio_1_to_almost0),                    # g
        ]))
        self.mix_lora_down = nn.Parameter(torch.zeros(d_model, 5 * proj_low_rank_dim))
        self.mix_lora_up = nn.Parameter(torch.empty(5, proj_low_rank_dim, d_model).uniform_(-0.01, 0.01))
        # decay: log decay w = -exp(w0 + lora(x_w)) <= 0
        self.w0 = nn.Parameter(-6.0 + 5.0 * n.pow(0.7 + 1.3 * ratio_0_to_1))
        self.decay_lora_down = nn.Parameter(torch.zeros(d_model, gate_low_rank_dim))
        self.decay_lora_up = nn.Parameter(torch.empty(gate_low_rank_dim, K).uniform_(-0.01, 0.01))
        self.bonus = nn.Parameter((ratio_0_to_1 * (1.0 - n) + zigzag).view(num_heads, self.head_k_dim))

        self.r_proj = nn.Linear(d_model, self.key_dim, bias=False)
        self.k_proj = nn.Linear(d_model, self.key_dim, bias=False)
        self.v_proj = nn.Linear(d_model, self.value_dim, bias=False)
        self.g_proj = nn.Linear(d_model, self.value_dim, bias=False)
        self.norm_weight = nn.Parameter(torch.ones(self.value_dim))
        self.norm_bias = nn.Parameter(torch.zeros(self.value_dim))
        self.o_proj = nn.Linear(self.value_dim, d_model, bias=False)

    def zero_state(self, batch_size, device):
        return {
            "h": torch.zeros(batch_size, self.num_heads, self.head_k_dim, self.head_v_dim, device=device),
            "shift": torch.zeros(batch_size, self.d_model, device=device),
        }

    def forward(self, x, state=None):
        b, t, _ = x.shape
        if state is None:
            state = self.zero_state(b, x.device)
        delta = _token_shift(x, state["shift"]) - x                              # x_prev - x

        # data-dependent interpolation: five mixing coefficients from one low-rank projection
        xx = x + delta * self.mu_x
        lora = torch.tanh(xx @ self.mix_lora_down).view(b, t, 5, self.proj_low_rank_dim)
        mix = torch.einsum("btfr,frd->btfd", lora, self.mix_lora_up) + self.mu  # [b, t, 5, d_model]
        x_r, x_w, x_k, x_v, x_g = (x.unsqueeze(2) + delta.unsqueeze(2) * mix).unbind(2)

        heads = (b, t, self.num_heads, -1)
        r = self.r_proj(x_r).view(heads)
        k = self.k_proj(x_k).view(heads)
        v = self.v_proj(x_v).view(heads)
        g = F.silu(self.g_proj(x_g))
        w = -torch.exp(self.w0 + torch.tanh(x_w @ self.decay_lora_down) @ self.decay_lora_up).view(heads)

        impl = self.scan_impl
        if impl == "auto":
            impl = "triton" if x.is_cuda else "chunked"
        o, h = RWKV6_SCANS[impl](r, k, v, w, self.bonus, initial_state=state["h"], scale=1.0)

        # per-head normalisation of the read-out (GroupNorm with one group per head), then the gate
        o = F.group_norm(o.reshape(b * t, self.value_dim), self.num_heads, self.norm_weight, self.norm_bias,
                         self.norm_eps).view(b, t, self.value_dim)
        y = self.o_proj(o * g)
        return y, {"h": h, "shift": x[:, -1].to(_compute_dtype(x))}


class RWKV6ChannelMix(nn.Module):
    """RWKV-6 channel mix: token shift, squared-ReLU key, sigmoid receptance gate, value."""

    def __init__(self, d_model, hidden_ratio=3.5, layer_idx=None, num_layers=None, scan_impl="auto"):
        super().__init__()
        self.d_model = d_model
        self.hidden_dim = 32 * math.ceil(int(d_model * hidden_ratio) / 32)  # rounded up to a multiple of 32
        self.layer_idx = layer_idx
        self.scan_impl = scan_impl  # unused (no scan); kept so model.py can set it on every layer

        _, ratio_1_to_almost0 = _layer_ratios(layer_idx, num_layers)
        ramp = torch.arange(d_model, dtype=torch.float32) / d_model
        self.mu_k = nn.Parameter(1.0 - ramp.pow(ratio_1_to_almost0))
        self.mu_r = nn.Parameter(1.0 - ramp.pow(ratio_1_to_almost0))
        self.key = nn.Linear(d_model, self.hidden_dim, bias=False)
        self.value = nn.Linear(self.hidden_dim, d_model, bias=False)
        self.receptance = nn.Linear(d_model, d_model, bias=False)

    def zero_state(self, batch_size, device):
        return {"ffn_shift": torch.zeros(batch_size, self.d_model, device=device)}

    def forward(self, x, state=None):
        if state is None:
            state = self.zero_state(x.shape[0], x.device)
        delta = _token_shift(x, state["ffn_shift"]) - x
        k = torch.relu(self.key(x + delta * self.mu_k)).square()
        y = torch.sigmoid(self.receptance(x + delta * self.mu_r)) * self.value(k)
        return y, {"ffn_shift": x[:, -1].to(_compute_dtype(x))}


# ---------------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------------

def _token_shift(x, shift_state):
    """The previous token's input at every position; position 0 takes it from the state [b, d_model]."""
    return torch.cat([shift_state.to(x.dtype).unsqueeze(1), x[:, :-1]], dim=1)


def _layer_ratios(layer_idx, num_layers):
    """(ratio_0_to_1, ratio_1_to_almost0) of the RWKV-6 init; a middle layer when the depth is unknown."""
    if layer_idx is None or num_layers is None:
        return 0.5, 0.5
    return layer_idx / max(num_layers - 1, 1), 1.0 - layer_idx / num_layers


_SCORE_INDEX_CACHE = {}


def _score_index(C, s, device):
    """Flat positions (i * C + j) in a [C, C] block of the scores in the order rwkv6_chunked emits them:
    the diagonal, then for each dyadic block size (C, C/2, ..., 2s) the [right half x left half] blocks,
    then the strictly lower pairs inside each leaf block of size s."""
    key = (C, s, str(device))
    if key not in _SCORE_INDEX_CACHE:
        idx = [i * C + i for i in range(C)]
        size = C
        while size > s:
            half = size // 2
            idx += [(blk * size + half + i) * C + blk * size + j
                    for blk in range(C // size) for i in range(half) for j in range(half)]
            size = half
        idx += [(blk * s + i) * C + blk * s + j for blk in range(C // s) for i in range(s) for j in range(i)]
        with torch.inference_mode(False):  # a cached tensor made under inference_mode could not be reused by autograd
            _SCORE_INDEX_CACHE[key] = torch.tensor(idx, dtype=torch.long, device=device)
    return _SCORE_INDEX_CACHE[key]


def _strictly_lower(s, device):
    """Flat positions i * s + j, j < i, of an [s, s] block, in row-major order (matches _score_index)."""
    key = ("tril", s, str(device))
    if key not in _SCORE_INDEX_CACHE:
        with torch.inference_mode(False):
            _SCORE_INDEX_CACHE[key] = torch.tensor([i * s + j for i in range(s) for j in range(i)],
                                                   dtype=torch.long, device=device)
    return _SCORE_INDEX_CACHE[key]


def _compute_dtype(x):
    """float32 for every input dtype (bf16 under autocast included); float64 stays float64 (reference tests)."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _check_inputs(fn, r, k, v, w, u, initial_state):
    """Shapes and dtypes of a scan's inputs; returns (b, t, h, dk, dv). Raises ValueError naming the tensor."""
    for name, x in (("r", r), ("k", k), ("v", v), ("w", w), ("u", u), ("initial_state", initial_state)):
        if x is not None and not (torch.is_tensor(x) and x.is_floating_point()):
            raise ValueError(f"{fn}: {name} must be a floating-point tensor, got "
                             f"{x.dtype if torch.is_tensor(x) else type(x).__name__}")
    if r.dim() != 4:
        raise ValueError(f"{fn}: r must have shape [b, t, h, dk], got {list(r.shape)}")
    b, t, h, dk = r.shape
    dv = v.shape[-1] if v.dim() == 4 else None
    expected = (
        ("k", k, "[b, t, h, dk]", [b, t, h, dk]),
        ("w", w, "[b, t, h, dk]", [b, t, h, dk]),
        ("v", v, "[b, t, h, dv]", [b, t, h, dv if dv is not None else "dv"]),
        ("u", u, "[h, dk]", [h, dk]),
        ("initial_state", initial_state, "[b, h, dk, dv]", [b, h, dk, dv]),
    )
    for name, x, dims, shape in expected:
        if x is not None and list(x.shape) != shape:
            raise ValueError(f"{fn}: {name} must have shape {dims} = {shape}, got {list(x.shape)}")
    if t < 1:
        raise ValueError(f"{fn}: r must have at least one time step, got shape {list(r.shape)}")
    return b, t, h, dk, dv
