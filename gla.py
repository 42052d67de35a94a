"""
Gated Linear Attention (GLA; Yang et al. 2023, "Gated Linear Attention Transformers with
Hardware-Efficient Training") as used in the paper's experiments.

Per head, with a matrix state S of shape [dk, dv] and a per-key-channel log forget gate g_t <= 0:

    S_t = diag(exp(g_t)) S_{t-1} + k_t^T v_t        o_t = scale * q_t S_t

Every scan takes an `initial_state` (S_{-1}, zeros by default) and returns `(output, final_state)`:
the paper's interventions (State Passing, TBTT, noise) all start a batch from a non-zero state.

Layout: q, k, g [b, t, h, dk]; v [b, t, h, dv]; states [b, h, dk, dv]; scale defaults to dk**-0.5.
Dtypes: the naive and chunked forms compute in float32 (float64 if q is float64, used by the tests);
the Triton form always computes in float32. All forms return the output in q's dtype and the final
state in the compute dtype (float32 in normal use).
"""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

from ssm import tl, triton  # Triton, or ssm.py's stand-in where it is not installed


# --------------------------------------------------------------------------------------------
# 1. Naive scan: the recurrence, one step at a time.
# --------------------------------------------------------------------------------------------

def gla_naive(q, k, v, g, initial_state=None, scale=None):
    """Reference GLA scan: a loop over time that reads like the recurrence above."""
    b, t, h, dk, dv = _check_inputs("gla_naive", q, k, v, g, initial_state)
    scale = dk ** -0.5 if scale is None else scale
    out_dtype, dtype = q.dtype, _compute_dtype(q)
    q, k, v, g = (x.to(dtype) for x in (q, k, v, g))
    S = q.new_zeros(b, h, dk, dv) if initial_state is None else initial_state.to(dtype)
    outputs = []
    for i in range(t):
        S = g[:, i].exp()[..., None] * S + k[:, i, :, :, None] * v[:, i, :, None, :]
        outputs.append(scale * torch.einsum("bhk,bhkv->bhv", q[:, i], S))
    o = torch.stack(outputs, dim=1) if t > 0 else v.new_zeros(b, 0, h, dv)
    return o.to(out_dtype), S


# --------------------------------------------------------------------------------------------
# 2. Chunked scan: parallel PyTorch, numerically stable for any decay.
# --------------------------------------------------------------------------------------------
# Split time into chunks of C tokens. With G_i = g_1 + ... + g_i the cumulative log decay inside
# a chunk (inclusive) and S0 the state before the chunk:
#
#     o_i = scale * [ (q_i * exp(G_i)) S0  +  sum_{j <= i} (sum_d q_id k_jd exp(G_id - G_jd)) v_j ]
#     S_C = exp(G_C) * S0 + sum_j (k_j * exp(G_C - G_j))^T v_j
#
# The inter-chunk terms only ever exponentiate G_i - 0 <= 0 and G_C - G_j <= 0. The intra-chunk
# pair weights exp(G_i - G_j) are the difficulty: the usual factorisation q*exp(G) @ (k*exp(-G))^T
# exponentiates -G, which overflows float32 once the decay in a chunk exceeds ~88 nats (g = -10
# per step does that in 9 steps). Materialising exp(G_i - G_j) as [C, C, dk] is stable but costs
# C*dk exponentials per token, too slow on a CPU.
#
# Instead we bisect the chunk only as far as the decay requires:
# - Bisection level: for a pair j < i split into the lower / upper half of a block, take the
#   reference r = the last position of the lower half (j <= r < i):
#       exp(G_i - G_j) = exp(G_i - G_r) * exp(G_r - G_j),   both exponents <= 0,
#   so the level is one batched matmul (upper queries x lower keys), no mask, nothing positive.
# - Leaf block of size s: reference r = the position just before the block, then
#   q_i exp(G_i - G_r) (exponent <= 0) and k_j exp(G_r - G_j) (exponent >= 0 but at most the
#   decay accumulated inside the block), one masked matmul for all pairs j <= i in the block.
# s is the largest power of two (<= C) for which every block decays by at most _MAX_LEAF_DECAY
# nats, so no exponent exceeds that bound (e^20 ~ 5e8: harmless in float32). With the layer's
# usual gates s = C (no bisection at all); with g = -10 per step s = 2 (log2(C)-1 levels).
# Every pair j <= i is covered exactly once, by one level or by its leaf block.

_MAX_LEAF_DECAY = 20.0


def gla_chunked(q, k, v, g, initial_state=None, scale=None, chunk_size=64):
    """Chunked (parallel) GLA scan; same signature and results as gla_naive, autograd-trainable.

    chunk_size must be a power of two; T need not be a multiple of it.
    """
    b, t, h, dk, dv = _check_inputs("gla_chunked", q, k, v, g, initial_state)
    if chunk_size < 1 or chunk_size & (chunk_size - 1):
        raise ValueError(f"gla_chunked: chunk_size must be a power of two, got {chunk_size}")
    scale = dk ** -0.5 if scale is None else scale
    out_dtype, dtype = q.dtype, _compute_dtype(q)
    S = q.new_zeros(b, h, dk, dv, dtype=dtype) if initial_state is None else initial_state.to(dtype)
    if t == 0:
        return v.new_zeros(b, 0, h, dv, dtype=out_dtype), S

    C = min(chunk_size, 1 << (t - 1).bit_length())  # no point padding a short input to a big chunk
    pad = (-t) % C
    n = (t + pad) // C

    def to_chunks(x):
        # Padding with zeros is harmless: k = 0 adds nothing and g = 0 means "no decay",
        # so the state after the padded steps is the state at step t.
        x = F.pad(x.to(dtype), (0, 0, 0, 0, 0, pad)) if pad else x.to(dtype)
        return x.view(b, n, C, h, x.shape[-1]).permute(0, 3, 1, 2, 4).contiguous()  # [b, h, n, C, d]

    q, k, v, g = (to_chunks(x) for x in (q, k, v, g))
    G = g.cumsum(dim=-2)  # within-chunk inclusive log decay, <= 0, decreasing
    G_last = G[..., -1:, :]

    # Inter-chunk: carry the state from chunk to chunk (a short sequential loop over n chunks).
    k_to_end = k * (G_last - G).exp()                   # key j decayed to the chunk end
    chunk_updates = k_to_end.transpose(-1, -2) @ v      # [b, h, n, dk, dv]
    chunk_decay = G_last.squeeze(-2).exp().unsqueeze(-1)  # [b, h, n, dk, 1]
    states = []
    for decay, update in zip(chunk_decay.unbind(2), chunk_updates.unbind(2)):
        states.append(S)
        S = torch.addcmul(update, decay, S)             # decay * S + update
    states = torch.stack(states, dim=2)                 # state before each chunk
    q_decayed = q * G.exp()                             # query i decayed from the chunk start
    o = q_decayed @ states                              # [b, h, n, C, dv]

    # Intra-chunk: leaf block size s (see the comment above), a data-dependent choice.
    s = C
    while s > 1:
        G_end = G[..., s - 1::s, :]                    # G at each block's last position
        G_before = F.pad(G_end[..., :-1, :], (0, 0, 1, 0)) if C > s else torch.zeros_like(G_end)
        if (G_before - G_end).max() <= _MAX_LEAF_DECAY:
            break
        s //= 2

    # Bisection levels for blocks larger than s: pairs j < i in different halves.
    half = C // 2
    while half >= s:
        blocks = b, h, n * C // (2 * half), 2, half
        Gb = G.view(*blocks, dk)
        G_ref = Gb[:, :, :, 0, -1:]                     # G at the last lower-half position
        q_up = q.view(*blocks, dk)[:, :, :, 1] * (Gb[:, :, :, 1] - G_ref).exp()
        k_lo = k.view(*blocks, dk)[:, :, :, 0] * (G_ref - Gb[:, :, :, 0]).exp()
        v_lo = v.view(*blocks, dv)[:, :, :, 0]
        if half == 1:  # 1x1 blocks: a dot product, cheaper than millions of tiny matmuls
            contrib = (q_up * k_lo).sum(-1, keepdim=True) * v_lo
        else:          # every (upper i, lower j) pair has j < i: no mask needed
            contrib = (q_up @ k_lo.transpose(-1, -2)) @ v_lo
        o.view(*blocks, dv)[:, :, :, 1] += contrib
        half //= 2

    # Leaf blocks of size s: all pairs j <= i inside a block.
    if s == 1:  # only the diagonal j == i, which has no decay
        o = o + (q * k).sum(-1, keepdim=True) * v
    else:
        blocks = b, h, n * C // s, s
        Gb = G.view(*blocks, dk)
        G_before = Gb[..., :1, :] - g.view(*blocks, dk)[..., :1, :]  # G just before the block
        q_leaf = q_decayed if s == C else q.view(*blocks, dk) * (Gb - G_before).exp()
        k_leaf = k.view(*blocks, dk) * (G_before - Gb).exp()     # exponent in [0, _MAX_LEAF_DECAY]
        scores = q_leaf.view(*blocks, dk) @ k_leaf.transpose(-1, -2)
        scores = scores.masked_fill(causal_mask(s, q), 0.0)  # drop pairs j > i
        o = o + (scores @ v.view(*blocks, dv)).view_as(o)

    o = (o * scale).permute(0, 2, 3, 1, 4).reshape(b, n * C, h, dv)[:, :t]
    return o.to(out_dtype), S


# --------------------------------------------------------------------------------------------
# 3. Triton: a fused recurrent kernel (the naive loop, with the state tile kept in registers).
# --------------------------------------------------------------------------------------------
# One program per (batch*head, block of BLOCK_V value channels): it owns the state columns
# S[:, v0:v0+BLOCK_V], loads q_t, k_t, g_t, v_t for each step, updates the tile and writes o_t.
# Value blocks are independent because the decay acts on the key dimension only.

@triton.jit
def _gla_fwd_kernel(q_ptr, k_ptr, v_ptr, g_ptr, h0_ptr, o_ptr, ht_ptr, T, H, scale,
                    DK: tl.constexpr, DV: tl.constexpr, BLOCK_K: tl.constexpr,
                    BLOCK_V: tl.constexpr, HAS_INITIAL_STATE: tl.constexpr):
    # 64-bit indices: b*t*h*d exceeds 2^31 for long sequences.
    i_bh = tl.program_id(0).to(tl.int64)
    i_v = tl.program_id(1).to(tl.int64)
    i_b = i_bh // H
    i_h = i_bh % H
    offs_k = tl.arange(0, BLOCK_K)
    offs_v = i_v * BLOCK_V + tl.arange(0, BLOCK_V)
    mask_k = offs_k < DK
    mask_v = offs_v < DV
    mask_kv = mask_k[:, None] & mask_v[None, :]

    # Inputs are contiguous [b, t, h, d]: element (b, 0, h, :) starts at (b*T*H + h) * d.
    row = i_b * T * H + i_h
    p_q = q_ptr + row * DK + offs_k
    p_k = k_ptr + row * DK + offs_k
    p_g = g_ptr + row * DK + offs_k
    p_v = v_ptr + row * DV + offs_v
    p_o = o_ptr + row * DV + offs_v
    p_state = i_bh * DK * DV + offs_k[:, None] * DV + offs_v[None, :]

    S = tl.zeros([BLOCK_K, BLOCK_V], dtype=tl.float32)
    if HAS_INITIAL_STATE:
        S += tl.load(h0_ptr + p_state, mask=mask_kv, other=0.0).to(tl.float32)
    for _ in range(0, T):
        q = tl.load(p_q, mask=mask_k, other=0.0).to(tl.float32)
        k = tl.load(p_k, mask=mask_k, other=0.0).to(tl.float32)
        g = tl.load(p_g, mask=mask_k, other=0.0).to(tl.float32)
        v = tl.load(p_v, mask=mask_v, other=0.0).to(tl.float32)
        S = S * tl.exp(g)[:, None] + k[:, None] * v[None, :]
        o = tl.sum(S * q[:, None], axis=0) * scale
        tl.store(p_o, o.to(o_ptr.dtype.element_ty), mask=mask_v)
        p_q += H * DK
        p_k += H * DK
        p_g += H * DK
        p_v += H * DV
        p_o += H * DV
    tl.store(ht_ptr + p_state, S, mask=mask_kv)


def _gla_triton_forward(q, k, v, g, initial_state, scale):
    b, t, h, dk = q.shape
    dv = v.shape[-1]
    if not q.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("gla_triton needs a CUDA tensor, or TRITON_INTERPRET=1 set before triton "
                           "is imported (CPU interpreter)")
    q, k, v, g = (x.contiguous() for x in (q, k, v, g))
    o = torch.empty(b, t, h, dv, device=q.device, dtype=q.dtype)
    final_state = torch.empty(b, h, dk, dv, device=q.device, dtype=torch.float32)
    h0 = initial_state.contiguous() if initial_state is not None else final_state  # dummy pointer
    BLOCK_K = triton.next_power_of_2(dk)
    BLOCK_V = min(triton.next_power_of_2(dv), 32)  # [dk, 32] fp32 tile: fits registers for dk <= 128
    grid = (b * h, triton.cdiv(dv, BLOCK_V))
    _gla_fwd_kernel[grid](q, k, v, g, h0, o, final_state, t, h, scale,
                          DK=dk, DV=dv, BLOCK_K=BLOCK_K, BLOCK_V=BLOCK_V,
                          HAS_INITIAL_STATE=initial_state is not None)
    return o, final_state


class _GLATriton(torch.autograd.Function):
    """Triton forward; backward recomputes through gla_chunked (exact same math, autograd)."""

    @staticmethod
    def forward(ctx, q, k, v, g, initial_state, scale):
        ctx.save_for_backward(q, k, v, g, initial_state)
        ctx.scale = scale
        return _gla_triton_forward(q, k, v, g, initial_state, scale)

    @staticmethod
    def backward(ctx, grad_o, grad_final_state):
        q, k, v, g, initial_state = ctx.saved_tensors
        with torch.enable_grad():
            inputs = [x.detach().requires_grad_() for x in (q, k, v, g)]
            h0 = None if initial_state is None else initial_state.detach().requires_grad_()
            o, final_state = gla_chunked(*inputs, initial_state=h0, scale=ctx.scale)
            wrt = inputs + ([h0] if h0 is not None else [])
            grads = torch.autograd.grad((o, final_state), wrt,
                                        (grad_o.to(o.dtype), grad_final_state.to(final_state.dtype)),
                                        allow_unused=True)
        grads = list(grads) + [None] * (5 - len(grads))
        return (*grads, None)


def gla_triton(q, k, v, g, initial_state=None, scale=None):
    """GLA scan with a fused recurrent Triton forward kernel; same signature as gla_naive.

    Computes in float32; the output has q's dtype, the final state is float32.
    """
    if not hasattr(triton, "cdiv"):
        raise RuntimeError("gla_triton needs Triton, which is not installed (Linux: pip install triton); use gla_chunked")
    b, t, h, dk, dv = _check_inputs("gla_triton", q, k, v, g, initial_state)
    scale = dk ** -0.5 if scale is None else scale
    return _GLATriton.apply(q, k, v, g, initial_state, scale)


GLA_SCANS = {"naive": gla_naive, "chunked": gla_chunked, "triton": gla_triton}


# --------------------------------------------------------------------------------------------
# 4. Layers: the GLA token mixer and the SwiGLU MLP of a GLA block.
# --------------------------------------------------------------------------------------------

class GLA(nn.Module):
    """Gated Linear Attention mixer, following the GLA paper / flash-linear-attention's layer.

    x -> q, k (key_dim = d_model*expand_k), v (value_dim = d_model*expand_v), split into heads;
    per-key-channel log forget gate g = logsigmoid(W2 W1 x + b2) / gate_logit_normalizer
    (a rank-`gate_low_rank_dim` projection; the only bias of the layer); scan;
    per-head RMSNorm (learnable weight of size head_v_dim) times swish(g_proj x); o_proj.
    No short convolution, so the layer's whole recurrent state is {"h": [b, heads, dk, dv]}.
    Init: every linear weight ~ N(0, 0.02), the gate bias 0 (fla's model-level default init;
    fla's optional rescaling of o_proj by the depth is left to the model).
    """

    def __init__(self, d_model, num_heads=4, expand_k=0.5, expand_v=1.0, gate_low_rank_dim=16,
                 gate_logit_normalizer=16, norm_eps=1e-5, layer_idx=None, scan_impl="auto"):
        super().__init__()
        self.d_model, self.num_heads, self.layer_idx, self.scan_impl = d_model, num_heads, layer_idx, scan_impl
        self.key_dim = int(d_model * expand_k)
        self.value_dim = int(d_model * expand_v)
        if self.key_dim % num_heads or self.value_dim % num_heads:
            raise ValueError(f"GLA: key_dim {self.key_dim} and value_dim {self.value_dim} must be "
                             f"divisible by num_heads {num_heads}")
        self.head_k_dim, self.head_v_dim = self.key_dim // num_heads, self.value_dim // num_heads
        self.gate_logit_normalizer = gate_logit_normalizer
        self.norm_eps = norm_eps

        self.q_proj = nn.Linear(d_model, self.key_dim, bias=False)
        self.k_proj = nn.Linear(d_model, self.key_dim, bias=False)
        self.v_proj = nn.Linear(d_model, self.value_dim, bias=False)
        self.gk_proj = nn.Sequential(nn.Linear(d_model, gate_low_rank_dim, bias=False),
                                     nn.Linear(gate_low_rank_dim, self.key_dim, bias=True))
        self.g_proj = nn.Linear(d_model, self.value_dim, bias=False)  # output gate
        self.norm_weight = nn.Parameter(torch.ones(self.head_v_dim))  # per-head RMSNorm weight
        self.o_proj = nn.Linear(self.value_dim, d_model, bias=False)
        _init_linears(self)

    def zero_state(self, batch_size, device):
        return {"h": torch.zeros(batch_size, self.num_heads, self.head_k_dim, self.head_v_dim,
                                 device=device, dtype=torch.float32)}

    def forward(self, x, state=None):
        b, t, _ = x.shape
        H, dk, dv = self.num_heads, self.head_k_dim, self.head_v_dim
        q = self.q_proj(x).view(b, t, H, dk)
        k = self.k_proj(x).view(b, t, H, dk)
        v = self.v_proj(x).view(b, t, H, dv)
        # Gate, norm and output gate in (at least) float32: logsigmoid/16 is small, and bf16 would
        # quantise the decay that compounds over thousands of steps.
        f32 = torch.promote_types(x.dtype, torch.float32)
        gk = F.logsigmoid(self.gk_proj(x).to(f32)).view(b, t, H, dk) / self.gate_logit_normalizer
        initial_state = None if state is None else state["h"]
        o, final_state = GLA_SCANS[_resolve_scan_impl(self.scan_impl, x)](q, k, v, gk, initial_state)

        o = o.to(f32)
        o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + self.norm_eps) * self.norm_weight
        o = o * F.silu(self.g_proj(x).to(f32).view(b, t, H, dv))
        y = self.o_proj(o.reshape(b, t, self.value_dim).to(x.dtype))
        return y, {"h": final_state}


class SwiGLU(nn.Module):
    """The MLP of fla's GLA blocks: down(swish(gate(x)) * up(x)), no biases, stateless.

    Hidden size as fla picks it: int(d_model * hidden_ratio * 2/3) rounded UP to a multiple of
    `multiple_of` (256), unless `intermediate_size` is given. Init: weights ~ N(0, 0.02).
    """

    def __init__(self, d_model, hidden_ratio=4, intermediate_size=None, multiple_of=256,
                 layer_idx=None, scan_impl="auto"):
        super().__init__()
        if intermediate_size is None:
            intermediate_size = int(d_model * hidden_ratio * 2 / 3)
            intermediate_size = multiple_of * ((intermediate_size + multiple_of - 1) // multiple_of)
        self.d_model, self.intermediate_size = d_model, intermediate_size
        self.layer_idx, self.scan_impl = layer_idx, scan_impl  # scan_impl unused: no scan here
        self.gate_proj = nn.Linear(d_model, intermediate_size, bias=False)
        self.up_proj = nn.Linear(d_model, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, d_model, bias=False)
        _init_linears(self)

    def zero_state(self, batch_size, device):
        return {}

    def forward(self, x, state=None):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x)), {}


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------

def _init_linears(module, std=0.02):
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, mean=0.0, std=std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)


def _resolve_scan_impl(scan_impl, x):
    if scan_impl == "auto":
        return "triton" if x.is_cuda else "chunked"
    if scan_impl not in GLA_SCANS:
        raise ValueError(f"scan_impl must be one of 'auto', {', '.join(map(repr, GLA_SCANS))}; "
                         f"got {scan_impl!r}")
    return scan_impl


def causal_mask(s, like):
    """[s, s] boolean mask of the pairs j > i to drop (True above the diagonal)."""
    return torch.ones(s, s, dtype=torch.bool, device=like.device).triu(1)


def _compute_dtype(q):
    # float32 everywhere; float64 is kept only so tests can compare forms at high precision.
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def _check_inputs(fn, q, k, v, g, initial_state):
    """Shape/dtype validation shared by the three scans; returns (b, t, h, dk, dv)."""
    def fail(name, layout, expected, x):
        raise ValueError(f"{fn}: {name} must have shape {layout} = {expected}, got {list(x.shape)}")

    for name, x in (("q", q), ("k", k), ("v", v), ("g", g)):
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            raise ValueError(f"{fn}: {name} must be a floating-point tensor, got "
                             f"{getattr(x, 'dtype', type(x).__name__)}")
    if q.dim() != 4:
        fail("q", "[b, t, h, dk]", "[b, t, h, dk]", q)
    b, t, h, dk = q.shape
    for name, x in (("k", k), ("g", g)):
        if x.shape != q.shape:
            fail(name, "[b, t, h, dk]", list(q.shape), x)
    if v.dim() != 4 or v.shape[:3] != q.shape[:3]:
        fail("v", "[b, t, h, dv]", f"[{b}, {t}, {h}, dv]", v)
    dv = v.shape[-1]
    if initial_state is not None:
        if not isinstance(initial_state, torch.Tensor) or not initial_state.is_floating_point():
            raise ValueError(f"{fn}: initial_state must be a floating-point tensor")
        if initial_state.shape != (b, h, dk, dv):
            fail("initial_state", "[b, h, dk, dv]", [b, h, dk, dv], initial_state)
    return b, t, h, dk, dv


if __name__ == "__main__":
    # Quick timing of the scan forms: python gla.py [T]
    import sys
    import time

    torch.manual_seed(0)
    T = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
    b, h, d = 1, 4, 64
    q, k, v = (torch.randn(b, T, h, d) for _ in range(3))
    g = F.logsigmoid(torch.randn(b, T, h, d)) / 16  # the layer's gate range
    s0 = torch.randn(b, h, d, d)

    def best_of(fn, repeats):
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return min(times)

    with torch.no_grad():
        gla_chunked(q, k, v, g, s0)  # warm-up
        t_naive = best_of(lambda: gla_naive(q, k, v, g, s0), 3)
        t_chunked = best_of(lambda: gla_chunked(q, k, v, g, s0), 10)
    print(f"T={T} b={b} h={h} dk=dv={d} threads={torch.get_num_threads()}: naive {t_naive * 1e3:.1f} ms, "
          f"chunked {t_chunked * 1e3:.1f} ms, speed-up {t_naive / t_chunked:.1f}x")
