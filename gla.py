"""Gated Linear Attention (GLA; Yang et al. 2024, arXiv:2312.06635, Sec. 4.1), one of the paper's four models;
official code: flash-linear-attention (fla/layers/gla.py, fla/ops/gla). Per head, the paper's recurrence
(arXiv 2507.02782, Sec. 2) with A_t = diag(exp(g_t)) (decay) and B_t x_t = k_t^T v_t (write):
    h_t = diag(exp(g_t)) h_{t-1} + k_t^T v_t        y_t = scale * q_t h_t
Shapes (b batch, t time, H heads, dk / dv key / value channels per head): query q, key k [b, t, H, dk];
value v [b, t, H, dv]; log forget gate g <= 0 [b, t, H, dk]; state h (GLA's paper: S_t) [b, H, dk, dv].
initial_state: as in ssm.py; dtypes and zero-length inputs: plumbing/scans.py."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from plumbing.scans import (check_chunk_size, check_initial_state, check_state, compute_dtype, no_steps,
                            pick_form, set_head_dims, tl, triton, triton_scan)

STATE = "[batch, heads, key dim, value dim]"  # of GLA's and RWKV-6's scans

def gla_naive(q, k, v, g, initial_state=None, scale=None):
    """h_t = diag(exp(g_t)) h_{t-1} + k_t^T v_t, y_t = scale q_t h_t, one step at a time: the definition."""
    b, t, H, dk = q.shape
    check_initial_state("gla_naive", initial_state, (b, H, dk, v.shape[-1]), STATE)
    scale = dk ** -0.5 if scale is None else scale
    dtype = compute_dtype(q, k, v, g, initial_state)
    h = q.new_zeros(b, H, dk, v.shape[-1], dtype=dtype) if initial_state is None else initial_state.to(dtype)
    if t == 0:
        return no_steps(q.new_zeros(b, 0, H, v.shape[-1]), h)
    k, v = (x.to(dtype) for x in (k, v))
    decay = g.to(dtype).exp()  # [b, t, H, dk]
    ys = []
    for i in range(t):
        write = k[:, i, :, :, None] * v[:, i, :, None, :]  # [b, H, dk, dv]
        h = decay[:, i, :, :, None] * h + write
        ys.append(scale * torch.einsum("bHk,bHkv->bHv", q[:, i].to(dtype), h))  # [b, H, dv]
    return torch.stack(ys, dim=1).to(q.dtype), h

# --- Chunked form (Yang et al. 2024, Sec. 4; shared with RWKV-6) ---------------------------------------
# Time is cut into chunks of Q tokens; in a chunk G_i = g_0 + ... + g_i is the log decay from its start,
# and token i reads the state decayed by Gq_i: Gq = G for GLA (y_t reads h_t); RWKV-6 (y_t reads h_{t-1})
# passes shift=True, Gq_i = G_{i-1}, and adds its bonus diagonal itself. Steps 1-2 only exponentiate numbers
# <= 0. In step 3 the textbook (q exp(Gq)) @ (k exp(-G))^T overflows float32 once a chunk decays by ~88 nats
# (g = -10 per step: 9 steps), so step 3 bisects the chunk as far as the decay needs. A level halves blocks:
# for i in the upper and j in the lower half, m the last lower position, exp(Gq_i - G_j) = exp(Gq_i - G_m)
# exp(G_m - G_j), both exponents <= 0: one unmasked matmul. A leaf block takes r = G just before it:
# q exp(Gq - r), k exp(r - G), exponents bounded by the block's decay (at most 20 nats: e^20 is harmless
# in float32): one masked matmul. Usually the leaf is the whole chunk.
def gla_chunked(q, k, v, g, initial_state=None, scale=None, chunk_size=64):
    """h_t = diag(exp(g_t)) h_{t-1} + k_t^T v_t, y_t = scale q_t h_t, by chunks: chunked_scan, then scale."""
    check_initial_state("gla_chunked", initial_state, (q.shape[0], *q.shape[2:], v.shape[-1]), STATE)
    check_chunk_size("gla_chunked", chunk_size, power_of_two=True)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    y, final_state = chunked_scan(q, k, v, g, initial_state, chunk_size, shift=False)
    return (scale * y).to(q.dtype), final_state

def chunked_scan(q, k, v, g, initial_state, chunk_size, shift):
    """h_t = diag(exp(g_t)) h_{t-1} + k_t^T v_t, y_t = q_t h_t (q_t h_{t-1} if shift), by steps 1-3 above."""
    (b, t, H, dk), dv = q.shape, v.shape[-1]  # chunk_size: a power of two (t need not be a multiple of it)
    dtype = compute_dtype(q, k, v, g, initial_state)
    h = q.new_zeros(b, H, dk, dv, dtype=dtype) if initial_state is None else initial_state.to(dtype)
    if t == 0:
        return no_steps(q.new_zeros(b, 0, H, dv, dtype=dtype), h)
    Q = min(chunk_size, 1 << (t - 1).bit_length())  # no point padding a short input to a long chunk
    pad = (-t) % Q
    def chunks(x):  # [b, t, H, d] -> [b, H, chunk, Q, d]; padding with k = v = g = 0 keeps the state
        x = F.pad(x.to(dtype), (0, 0, 0, 0, 0, pad)) if pad else x.to(dtype)
        return x.view(b, -1, Q, H, x.shape[-1]).permute(0, 3, 1, 2, 4).contiguous()
    before = lambda x: F.pad(x[..., :-1, :], (0, 0, 1, 0))  # x_{i-1}, 0 at the chunk start
    q, k, v, g = (chunks(x) for x in (q, k, v, g))
    G = g.cumsum(dim=-2)
    Gq = before(G) if shift else G
    # 1. boundary states (arXiv 2507.02782, App. I): h' = exp(G_last) h + sum_j (k_j exp(G_last - G_j))^T v_j
    G_last = G[..., -1:, :]
    writes = (k * (G_last - G).exp()).transpose(-1, -2) @ v  # [b, H, chunk, dk, dv]
    states_in = []
    for decay, write in zip(G_last.transpose(-1, -2).exp().unbind(2), writes.unbind(2)):
        states_in.append(h)
        h = torch.addcmul(write, decay, h)
    # 2. reads from the state before each chunk: (q_i exp(Gq_i)) h
    q_decayed = q * Gq.exp()
    y = q_decayed @ torch.stack(states_in, dim=2)
    # 3. reads inside each chunk: sum_{j <= i} (sum_d q_id k_jd exp(Gq_id - G_jd)) v_j (j < i if shift).
    s = Q  # leaf size: halved while some block decays by more than 20 nats
    while s > 1 and (before(G[..., s - 1::s, :]) - G[..., s - 1::s, :]).max() > 20.0:
        s //= 2
    half = Q // 2
    while half >= s:  # levels: upper-half queries x lower-half keys, no mask needed
        blocks = lambda x: x.view(b, H, -1, 2, half, x.shape[-1])
        G_m = blocks(G)[:, :, :, 0, -1:]
        q_up = blocks(q)[:, :, :, 1] * (blocks(Gq)[:, :, :, 1] - G_m).exp()
        k_lo = blocks(k)[:, :, :, 0] * (G_m - blocks(G)[:, :, :, 0]).exp()
        blocks(y)[:, :, :, 1] += (q_up @ k_lo.transpose(-1, -2)) @ blocks(v)[:, :, :, 0]
        half //= 2
    if s > 1:  # leaves: all their pairs j <= i (j < i if shift) in one masked matmul
        leaves = lambda x: x.view(b, H, -1, s, x.shape[-1])
        ref = before(G[..., s - 1::s, :]).reshape(b, H, -1, 1, dk)  # G just before each leaf
        q_leaf = q_decayed if s == Q else leaves(q) * (leaves(Gq) - ref).exp()
        scores = leaves(q_leaf) @ (leaves(k) * (ref - leaves(G)).exp()).transpose(-1, -2)
        drop = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1 - shift)  # pairs j > i (j >= i)
        y += (scores.masked_fill(drop, 0.0) @ leaves(v)).view_as(y)
    elif not shift:  # one-token leaves: only the pair j = i, which has no decay
        y += (q * k).sum(-1, keepdim=True) * v
    return y.permute(0, 2, 3, 1, 4).reshape(b, -1, H, dv)[:, :t], h

# --- Layers: the GLA mixer and the SwiGLU MLP of a GLA block (as fla's GatedLinearAttention/GatedMLP) --
class GLA(nn.Module):
    """q, k, v; forget gate g = logsigmoid(W2 W1 x + b2) / 16 (low rank, the only bias); scan; per-head
    RMSNorm (eps: fla's GLAConfig.norm_eps = 1e-6) times swish(g_proj x); o_proj. No short conv."""
    def __init__(self, d_model, num_heads=4, expand_k=0.5, expand_v=1.0, gate_low_rank_dim=16,
                 gate_logit_normalizer=16, norm_eps=1e-6, scan_impl="auto"):
        super().__init__()
        set_head_dims(self, "GLA", d_model, num_heads, expand_k, expand_v)
        self.scan_impl = scan_impl
        self.gate_logit_normalizer = gate_logit_normalizer
        self.norm_eps = norm_eps
        self.q_proj = nn.Linear(d_model, self.key_dim, bias=False)
        self.k_proj = nn.Linear(d_model, self.key_dim, bias=False)
        self.v_proj = nn.Linear(d_model, self.value_dim, bias=False)
        self.gk_proj = nn.Sequential(nn.Linear(d_model, gate_low_rank_dim, bias=False),
                                     nn.Linear(gate_low_rank_dim, self.key_dim, bias=True))
        self.g_proj = nn.Linear(d_model, self.value_dim, bias=False)  # output gate
        self.norm_weight = nn.Parameter(torch.ones(self.head_v_dim))
        self.o_proj = nn.Linear(self.value_dim, d_model, bias=False)
        _init_linears(self)
        nn.init.zeros_(self.gk_proj[1].bias)

    def state_shapes(self, batch_size):
        return {"h": (batch_size, self.num_heads, self.head_k_dim, self.head_v_dim)}

    def zero_state(self, batch_size, device):
        return {k: torch.zeros(shape, device=device) for k, shape in self.state_shapes(batch_size).items()}

    def forward(self, x, state=None):
        check_state("GLA", state, self.state_shapes(x.shape[0]))
        heads = lambda proj: proj.unflatten(-1, (self.num_heads, -1))  # [b, t, H, d]; also when t = 0
        q = heads(self.q_proj(x))
        k = heads(self.k_proj(x))
        v = heads(self.v_proj(x))
        # gate and norm in (at least) float32: bf16 would quantise a decay that compounds over many steps
        f32 = torch.promote_types(x.dtype, torch.float32)
        g = heads(F.logsigmoid(self.gk_proj(x).to(f32))) / self.gate_logit_normalizer
        y, final_state = pick_form(GLA_SCANS, self.scan_impl, x)(q, k, v, g, state and state["h"])
        y = F.rms_norm(y.to(f32), (self.head_v_dim,), self.norm_weight.to(f32), self.norm_eps)
        y = y * F.silu(heads(self.g_proj(x).to(f32)))
        return self.o_proj(y.flatten(2).to(x.dtype)), {"h": final_state}

class SwiGLU(nn.Module):
    """fla's GatedMLP: down(swish(gate(x)) * up(x)), no biases, stateless; hidden size as fla picks it."""
    def __init__(self, d_model, hidden_ratio=4):
        super().__init__()
        self.intermediate_size = intermediate_size = -(-int(d_model * hidden_ratio * 2 / 3) // 256) * 256
        self.gate_proj = nn.Linear(d_model, intermediate_size, bias=False)
        self.up_proj = nn.Linear(d_model, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, d_model, bias=False)
        _init_linears(self)

    def zero_state(self, batch_size, device):
        return {}

    def forward(self, x, state=None):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x)), {}

def _init_linears(module):  # as fla's _init_weights: every linear weight ~ N(0, 0.02)
    for linear in [m for m in module.modules() if isinstance(m, nn.Linear)]:
        nn.init.normal_(linear.weight, std=0.02)

# --- Triton: the naive loop fused (shared with RWKV-6). One program per (batch * head, block of value
# channels) keeps its state columns in registers. BONUS (RWKV-6): y_t = q_t (h_{t-1} + diag(u) k_t^T v_t).
@triton.jit
def _recurrent_kernel(q_ptr, k_ptr, v_ptr, g_ptr, u_ptr, h0_ptr, y_ptr, hT_ptr, T, H, scale,
                      DK: tl.constexpr, DV: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr,
                      BONUS: tl.constexpr):
    bh = tl.program_id(0).to(tl.int64)  # 64-bit offsets: b*t*H*d passes 2^31 on long sequences
    hi = bh % H
    offs_k = tl.arange(0, BLOCK_K)
    offs_v = tl.program_id(1).to(tl.int64) * BLOCK_V + tl.arange(0, BLOCK_V)
    mask_k, mask_v = offs_k < DK, offs_v < DV
    h_mask = mask_k[:, None] & mask_v[None, :]
    h_offs = bh * DK * DV + offs_k[:, None] * DV + offs_v[None, :]
    h = tl.load(h0_ptr + h_offs, mask=h_mask, other=0.0).to(tl.float32)
    if BONUS:
        u = tl.load(u_ptr + hi * DK + offs_k, mask=mask_k, other=0.0).to(tl.float32)
    row = (bh // H) * T * H + hi  # contiguous [b, t, H, d]: token (b, 0, hi) starts at row * d
    k_offs, v_offs = row * DK + offs_k, row * DV + offs_v
    for _ in range(0, T):
        q = tl.load(q_ptr + k_offs, mask=mask_k, other=0.0).to(tl.float32)
        k = tl.load(k_ptr + k_offs, mask=mask_k, other=0.0).to(tl.float32)
        g = tl.load(g_ptr + k_offs, mask=mask_k, other=0.0).to(tl.float32)
        v = tl.load(v_ptr + v_offs, mask=mask_v, other=0.0).to(tl.float32)
        kv = k[:, None] * v[None, :]
        if BONUS:
            y = tl.sum((h + u[:, None] * kv) * q[:, None], axis=0) * scale
        h = h * tl.exp(g)[:, None] + kv
        if not BONUS:
            y = tl.sum(h * q[:, None], axis=0) * scale
        tl.store(y_ptr + v_offs, y.to(y_ptr.dtype.element_ty), mask=mask_v)
        k_offs, v_offs = k_offs + H * DK, v_offs + H * DV
    tl.store(hT_ptr + h_offs, h, mask=h_mask)

def recurrent_forward(q, k, v, g, initial_state, scale, u=None):
    """(y, final state) of _recurrent_kernel, in the chunked form's dtypes; scale None: dk ** -0.5 (GLA's)."""
    (b, t, H, dk), dv = q.shape, v.shape[-1]
    y = q.new_empty(b, t, H, dv)
    final_state = q.new_empty(b, H, dk, dv, dtype=torch.float32)
    initial_state = torch.zeros_like(final_state) if initial_state is None else initial_state
    BLOCK_V = min(triton.next_power_of_2(dv), 32)  # a [dk, 32] float32 tile fits registers for dk <= 128
    tensors = [x.contiguous() for x in (q, k, v, g, q if u is None else u, initial_state)]
    _recurrent_kernel[(b * H, triton.cdiv(dv, BLOCK_V))](
        *tensors, y, final_state, t, H, float(dk ** -0.5 if scale is None else scale), DK=dk, DV=dv,
        BLOCK_K=triton.next_power_of_2(dk), BLOCK_V=BLOCK_V, BONUS=u is not None)
    return y, final_state.to(compute_dtype(q, k, v, g, initial_state))

def gla_triton(q, k, v, g, initial_state=None, scale=None):
    check_initial_state("gla_triton", initial_state, (q.shape[0], *q.shape[2:], v.shape[-1]), STATE)
    return triton_scan(recurrent_forward, gla_chunked, q, k, v, g, initial_state, scale=scale)

GLA_SCANS = {"naive": gla_naive, "chunked": gla_chunked, "triton": gla_triton}
