"""Gated DeltaNet (Yang, Kautz & Hatamizadeh 2025, "Gated Delta Networks: Improving Mamba2 with Delta Rule",
ICLR 2025, arXiv:2412.06464), a fifth mixer beside the paper's four; official code: flash-linear-attention
(fla/layers/gated_deltanet.py, fla/ops/gated_delta_rule). Its paper writes the state per head as S_t [dv, dk]:
    S_t = S_{t-1} alpha_t (I - beta_t k_t k_t^T) + beta_t v_t k_t^T        o_t = S_t q_t
Here the state has GLA's layout, h = S^T [dk, dv], and q_t, k_t, v_t are row vectors (k_t^T v_t: [dk, dv]),
so in the paper's recurrence (arXiv 2507.02782, Sec. 2) A_t = alpha_t (I - beta_t k_t^T k_t) (decay: a
matrix, the delta rule erases what the state held under k_t) and B_t x_t = beta_t k_t^T v_t (write):
    h_t = alpha_t (I - beta_t k_t^T k_t) h_{t-1} + beta_t k_t^T v_t        y_t = scale * q_t h_t
scale: dk ** -0.5 unless given, as fla applies it to q (also to the layer's L2-normalised q). Equivalently
h_t = alpha_t h_{t-1} + k_t^T u_t with u_t = beta_t (v_t - alpha_t k_t h_{t-1}): the decayed state's error
on v_t. alpha_t = exp(g_t), g_t <= 0 one log decay per head (the layer: Mamba-2's dt A, g = -exp(A_log)
softplus(a_proj x + dt_bias)); beta_t in (0, 1) (sigmoid(b_proj x)). With |k_t| = 1 the matrix
I - beta_t k_t^T k_t has eigenvalues 1 and 1 - beta_t: the decay never grows the state.
Shapes (b batch, t time, H heads, dk / dv key / value channels per head): q, k [b, t, H, dk]; v [b, t, H, dv];
g, beta [b, t, H]; h [b, H, dk, dv]. initial_state: as in ssm.py; dtypes and zero-length inputs:
plumbing/scans.py. A layer's state: {"h": the scan's state, "conv": its short conv's window}."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from gla import STATE
from plumbing.scans import (check_chunk_size, check_initial_state, check_state, compute_dtype, no_steps,
                            pick_form, set_head_dims, tl, triton, triton_scan)
from ssm import causal_conv1d_silu, inverse_softplus_dt

def gated_delta_naive(q, k, v, g, beta, initial_state=None, scale=None):
    """h_t = exp(g_t) (I - beta_t k_t^T k_t) h_{t-1} + beta_t k_t^T v_t, y_t = scale q_t h_t, as a loop."""
    b, t, H, dk = q.shape
    dv = v.shape[-1]
    check_initial_state("gated_delta_naive", initial_state, (b, H, dk, dv), STATE)
    scale = dk ** -0.5 if scale is None else scale
    dtype = compute_dtype(q, k, v, g, beta, initial_state)
    h = q.new_zeros(b, H, dk, dv, dtype=dtype) if initial_state is None else initial_state.to(dtype)
    if t == 0:
        return no_steps(q.new_zeros(b, 0, H, dv), h)
    k, v = (x.to(dtype) for x in (k, v))
    alpha = g.to(dtype).exp()[..., None, None]  # [b, t, H, 1, 1]
    beta = beta.to(dtype)[..., None, None]
    eye = torch.eye(dk, dtype=dtype, device=q.device)
    ys = []
    for i in range(t):
        erase = k[:, i, :, :, None] * k[:, i, :, None, :]  # k_t^T k_t [b, H, dk, dk]
        decay = alpha[:, i] * (eye - beta[:, i] * erase)
        write = beta[:, i] * k[:, i, :, :, None] * v[:, i, :, None, :]  # [b, H, dk, dv]
        h = decay @ h + write
        ys.append(scale * torch.einsum("bHk,bHkv->bHv", q[:, i].to(dtype), h))  # [b, H, dv]
    return torch.stack(ys, dim=1).to(q.dtype), h

# --- Chunked form: the delta rule's WY / UT form (Yang et al. 2024, "Parallelizing Linear Transformers with
# the Delta Rule over Sequence Length", arXiv:2406.06484), the gate folded in as Gated DeltaNet does. In a
# chunk of Q tokens entered with state h, G_i = g_0 + ... + g_i (the log decay since its start, <= 0) gives
#     h_i = exp(G_i) h + sum_{j <= i} exp(G_i - G_j) k_j^T u_j
#     u_i = beta_i (v_i - exp(G_i) k_i h - sum_{j < i} exp(G_i - G_j) (k_i . k_j) u_j).
# With the u_i as the rows of U: (I + A) U = beta V - (beta exp(G) K) h, where A_ij = beta_i exp(G_i - G_j)
# k_i . k_j for j < i (else 0). I + A is unit lower triangular, so T = (I + A)^-1 exists (the UT transform)
# and U = U0 - W h with U0 = T beta V, W = T beta exp(G) K (the WY form): only W h waits for the chunk
# before. Every exponent is G_i, G_last - G_j or G_i - G_j with j <= i (the mask goes in before exp), all
# <= 0: with one decay per head the [Q, Q] decay matrix is formed directly as in ssm.ssd_chunked, and nothing
# overflows in float32 at any decay (GLA's per-channel decay needs its bisection instead). Padding with
# k = v = beta = g = 0 keeps the state.
def gated_delta_chunked(q, k, v, g, beta, initial_state=None, scale=None, chunk_size=64):
    """h_t = exp(g_t) (I - beta_t k_t^T k_t) h_{t-1} + beta_t k_t^T v_t, y_t = scale q_t h_t, by chunks."""
    b, t, H, dk = q.shape
    dv = v.shape[-1]
    check_initial_state("gated_delta_chunked", initial_state, (b, H, dk, dv), STATE)
    check_chunk_size("gated_delta_chunked", chunk_size)
    scale = dk ** -0.5 if scale is None else scale
    dtype = compute_dtype(q, k, v, g, beta, initial_state)
    h = q.new_zeros(b, H, dk, dv, dtype=dtype) if initial_state is None else initial_state.to(dtype)
    if t == 0:
        return no_steps(q.new_zeros(b, 0, H, dv), h)
    Q = min(chunk_size, t)  # short inputs (e.g. one token at a time) need no padding
    pad = (-t) % Q
    def chunks(x):  # [b, t, H, d] -> [b, H, chunk, Q, d]
        x = F.pad(x.to(dtype), (0, 0, 0, 0, 0, pad))
        return x.reshape(b, -1, Q, H, x.shape[-1]).permute(0, 3, 1, 2, 4)
    y_dtype = q.dtype
    q, k, v = (chunks(x) for x in (q, k, v))
    g, beta = (chunks(x[..., None]) for x in (g, beta))  # [b, H, chunk, Q, 1]
    G = g.cumsum(dim=-2)
    # 1. Each chunk on its own: L_ij = exp(G_i - G_j) (j <= i, else 0), A, and by forward substitution
    # (T applied without forming it) U0 = T beta V and W = T beta exp(G) K
    causal = torch.ones(Q, Q, dtype=torch.bool, device=q.device).tril()
    L = (G - G.transpose(-1, -2)).masked_fill(~causal, float("-inf")).exp()  # [b, H, chunk, Q, Q]
    A = (beta * L * (k @ k.transpose(-1, -2))).tril(-1)
    eye = torch.eye(Q, dtype=dtype, device=q.device)
    rhs = torch.cat([beta * v, beta * G.exp() * k], dim=-1)
    U0, W = torch.linalg.solve_triangular(eye + A, rhs, upper=False, unitriangular=True).split([dv, dk], -1)
    # 2. The states between chunks, from initial_state (arXiv 2507.02782, App. I): U = U0 - W h, then
    # h' = exp(G_last) h + sum_j (k_j exp(G_last - G_j))^T u_j; a few matmuls a chunk
    decay_chunk = G[..., -1:, :].exp()  # a chunk's whole decay [b, H, chunk, 1, 1]
    k_to_end = (k * (G[..., -1:, :] - G).exp()).transpose(-1, -2)  # [b, H, chunk, dk, Q]
    states_in = []
    us = []
    for u0, w, decay, kT in zip(U0.unbind(2), W.unbind(2), decay_chunk.unbind(2), k_to_end.unbind(2)):
        states_in.append(h)
        u = u0 - w @ h
        us.append(u)
        h = torch.addcmul(kT @ u, decay, h)
    # 3. Outputs: the state entering the chunk decayed to token i, read by q_i, plus the chunk's own
    # tokens: sum_{j <= i} L_ij (q_i . k_j) u_j
    y = (q * G.exp()) @ torch.stack(states_in, dim=2)
    y = y + ((q @ k.transpose(-1, -2)) * L) @ torch.stack(us, dim=2)
    y = y.permute(0, 2, 3, 1, 4).reshape(b, -1, H, dv)[:, :t]
    return (scale * y).to(y_dtype), h

# --- Layer: fla's GatedDeltaNet (the block's MLP: gla.SwiGLU, as fla's GatedMLP) --------------------------
class GatedDeltaNet(nn.Module):
    """q, k, v through one causal depthwise conv (fla: q_conv1d, k_conv1d, v_conv1d, the same channels split)
    and SiLU; q, k L2-normalised (fla's l2norm: x / sqrt(|x|^2 + 1e-6)); beta = sigmoid(b_proj x); g from
    a_proj, A_log, dt_bias; scan; per-head RMSNorm times swish(g_proj x) (norm, then gate); o_proj. key_dim =
    expand_k d_model, value_dim = expand_v d_model: fla's 0.75 and 1.5 (about 6 d_model^2 weights). Init as
    fla: linear and conv weights N(0, 0.02), no biases; A ~ U(0, 16); dt_bias as Mamba-2's."""
    def __init__(self, d_model, num_heads=4, expand_k=0.75, expand_v=1.5, conv_size=4, norm_eps=1e-6,
                 A_init_range=(0, 16), dt_min=0.001, dt_max=0.1, dt_init_floor=1e-4, chunk_size=64,
                 scan_impl="auto"):
        super().__init__()
        set_head_dims(self, "GatedDeltaNet", d_model, num_heads, expand_k, expand_v)
        check_chunk_size("GatedDeltaNet", chunk_size)
        self.conv_size = conv_size
        self.conv_dim = 2 * self.key_dim + self.value_dim  # [q, k, v]
        self.norm_eps = norm_eps
        self.chunk_size = chunk_size
        self.scan_impl = scan_impl
        self.q_proj = nn.Linear(d_model, self.key_dim, bias=False)
        self.k_proj = nn.Linear(d_model, self.key_dim, bias=False)
        self.v_proj = nn.Linear(d_model, self.value_dim, bias=False)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, conv_size, padding=conv_size - 1,
                                groups=self.conv_dim, bias=False)
        self.a_proj = nn.Linear(d_model, num_heads, bias=False)  # the step size dt, before softplus
        self.b_proj = nn.Linear(d_model, num_heads, bias=False)  # beta, before sigmoid
        self.g_proj = nn.Linear(d_model, self.value_dim, bias=False)  # output gate
        self.o_proj = nn.Linear(self.value_dim, d_model, bias=False)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Conv1d)):
                nn.init.normal_(m.weight, std=0.02)
        self.A_log = nn.Parameter(torch.log(torch.empty(num_heads).uniform_(*A_init_range)))
        self.dt_bias = nn.Parameter(inverse_softplus_dt(num_heads, dt_min, dt_max, dt_init_floor))
        self.A_log._no_weight_decay = self.dt_bias._no_weight_decay = True
        self.norm_weight = nn.Parameter(torch.ones(self.head_v_dim))

    def state_shapes(self, batch_size):
        return {"h": (batch_size, self.num_heads, self.head_k_dim, self.head_v_dim),
                "conv": (batch_size, self.conv_size - 1, self.conv_dim)}

    def zero_state(self, batch_size, device):
        return {k: torch.zeros(shape, device=device) for k, shape in self.state_shapes(batch_size).items()}

    def forward(self, x, state=None):
        check_state("GatedDeltaNet", state, self.state_shapes(x.shape[0]))
        state = self.zero_state(x.shape[0], x.device) if state is None else state
        qkv = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)
        qkv, conv_state = causal_conv1d_silu(qkv, self.conv1d.weight, None, state["conv"])
        heads = lambda z: z.unflatten(-1, (self.num_heads, -1))  # [b, t, H, d]; also when t = 0
        q, k, v = (heads(z) for z in qkv.split([self.key_dim, self.key_dim, self.value_dim], dim=-1))
        # gates, L2 norm and output norm in (at least) float32: bf16 would quantise a decay that compounds
        f32 = torch.promote_types(x.dtype, torch.float32)
        q, k = (z.to(f32) * torch.rsqrt(z.to(f32).square().sum(-1, keepdim=True) + 1e-6) for z in (q, k))
        beta = torch.sigmoid(self.b_proj(x).to(f32))
        g = -self.A_log.to(f32).exp() * F.softplus(self.a_proj(x).to(f32) + self.dt_bias.to(f32))
        scan = pick_form(GATED_DELTA_SCANS, self.scan_impl, x, chunk_size=self.chunk_size)
        y, h = scan(q, k, v, g, beta, initial_state=state["h"])
        y = F.rms_norm(y.to(f32), (self.head_v_dim,), self.norm_weight.to(f32), self.norm_eps)
        y = y * F.silu(heads(self.g_proj(x).to(f32)))
        return self.o_proj(y.flatten(2).to(x.dtype)), {"h": h, "conv": conv_state}

# --- Triton: the naive loop fused. One program per (batch * head, block of value channels) keeps its state
# columns in registers: the delta rule mixes key channels, never value columns (u_t's column j reads only
# column j of h), so value blocks run apart as in gla.py's _recurrent_kernel. Backward: the chunked form.
@triton.jit
def _gated_delta_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, h0_ptr, y_ptr, hT_ptr, T, H, scale,
                        DK: tl.constexpr, DV: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr):
    bh = tl.program_id(0).to(tl.int64)  # 64-bit offsets: b*t*H*d passes 2^31 on long sequences
    hi = bh % H
    offs_k = tl.arange(0, BLOCK_K)
    offs_v = tl.program_id(1).to(tl.int64) * BLOCK_V + tl.arange(0, BLOCK_V)
    mask_k = offs_k < DK
    mask_v = offs_v < DV
    h_mask = mask_k[:, None] & mask_v[None, :]
    h_offs = bh * DK * DV + offs_k[:, None] * DV + offs_v[None, :]
    h = tl.load(h0_ptr + h_offs, mask=h_mask, other=0.0).to(tl.float32)
    row = (bh // H) * T * H + hi  # contiguous [b, t, H, ...]: token (b, 0, hi) is row `row`
    k_offs = row * DK + offs_k
    v_offs = row * DV + offs_v
    for _ in range(0, T):
        q = tl.load(q_ptr + k_offs, mask=mask_k, other=0.0).to(tl.float32)
        k = tl.load(k_ptr + k_offs, mask=mask_k, other=0.0).to(tl.float32)
        v = tl.load(v_ptr + v_offs, mask=mask_v, other=0.0).to(tl.float32)
        alpha = tl.exp(tl.load(g_ptr + row).to(tl.float32))
        beta = tl.load(beta_ptr + row).to(tl.float32)
        h = h * alpha
        u = beta * (v - tl.sum(h * k[:, None], axis=0))  # the decayed state's error on v_t
        h = h + k[:, None] * u[None, :]
        y = tl.sum(h * q[:, None], axis=0) * scale
        tl.store(y_ptr + v_offs, y.to(y_ptr.dtype.element_ty), mask=mask_v)
        k_offs += H * DK
        v_offs += H * DV
        row += H
    tl.store(hT_ptr + h_offs, h, mask=h_mask)

def _gated_delta_launch(q, k, v, g, beta, initial_state, scale):
    """(y, final state) of _gated_delta_kernel, in the chunked form's dtypes; scale None: dk ** -0.5."""
    b, t, H, dk = q.shape
    dv = v.shape[-1]
    y = q.new_empty(b, t, H, dv)
    final_state = q.new_empty(b, H, dk, dv, dtype=torch.float32)
    h0 = torch.zeros_like(final_state) if initial_state is None else initial_state
    BLOCK_V = min(triton.next_power_of_2(dv), 32)  # a [dk, 32] float32 tile fits registers for dk <= 128
    tensors = [x.contiguous() for x in (q, k, v, g, beta, h0)]
    _gated_delta_kernel[(b * H, triton.cdiv(dv, BLOCK_V))](
        *tensors, y, final_state, t, H, float(dk ** -0.5 if scale is None else scale), DK=dk, DV=dv,
        BLOCK_K=triton.next_power_of_2(dk), BLOCK_V=BLOCK_V)
    return y, final_state.to(compute_dtype(q, k, v, g, beta, initial_state))

def gated_delta_triton(q, k, v, g, beta, initial_state=None, scale=None):
    check_initial_state("gated_delta_triton", initial_state, (q.shape[0], *q.shape[2:], v.shape[-1]), STATE)
    return triton_scan(_gated_delta_launch, gated_delta_chunked, q, k, v, g, beta, initial_state, scale=scale)

GATED_DELTA_SCANS = {"naive": gated_delta_naive, "chunked": gated_delta_chunked, "triton": gated_delta_triton}
