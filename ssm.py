"""State space mixers of the paper: Mamba-2 (SSD) and Mamba-1 (selective scan). Each scan comes in three
forms, a naive loop (the definition), a chunked PyTorch form and a Triton kernel; then the two layers; at
the bottom the kernels. The checks and the kernel launch that every scan shares: plumbing/scans.py.
The paper (Buitrago Ruiz & Gu 2025, arXiv 2507.02782), Sec. 2: a recurrent layer carries a state h in time,
    h_t = A_t h_{t-1} + B_t x_t,    y_t = h_t C_t,    from the initial state h_{-1}.
Both Mamba layers take A_t = exp(dt_t A) and the input term dt_t B_t x_t, dt_t an input-dependent step size.
Every scan (GLA's and RWKV-6's too) takes `initial_state` (h_{-1}; None: zeros) and returns `(y, final_state)`
(h_{T-1}): training from a non-zero state (Sec. 4: State Passing, TBTT, noise) and evaluating past the
training length need just that. Dtypes, zero-length inputs, the initial state's shape: plumbing/scans.py.
Shapes, Mamba-2 | Mamba-1 (b batch, t time, H heads, p headdim, g groups, n d_state, d d_inner, Q chunk):
  x [b, t, H, p] | [b, t, d]; dt > 0 [b, t, H] | [b, t, d]; A < 0 [H] | [d, n]; B, C [b, t, g, n] | [b, t, n];
  h [b, H, p, n] | [b, d, n]; decay, write: a step's A_t, dt_t x_t B_t (mamba-minimal's deltaA, deltaB_u).
A layer's state is the dict {"h": scan state, "conv": causal-conv window}."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from plumbing.scans import (check_chunk_size, check_initial_state, check_state, compute_dtype, no_steps,
                            pick_form, tl, triton, triton_scan)

# ==== Mamba-2 (SSD): Dao & Gu 2024, "Transformers are SSMs" (arXiv 2405.21060); official code: mamba_ssm
# (github.com/state-spaces/mamba, modules/mamba2.py). A scalar decay per head, a state [p, n] per head.
def ssd_naive(x, dt, A, B, C, initial_state=None):
    """h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T, y_t = h_t C_t, one step at a time: the definition."""
    b, t, H, p = x.shape
    check_initial_state("ssd_naive", initial_state, (b, H, p, B.shape[-1]), SSD_STATE)
    dtype = compute_dtype(x, dt, A, B, C, initial_state)
    h = x.new_zeros(b, H, p, B.shape[-1], dtype=dtype) if initial_state is None else initial_state.to(dtype)
    if t == 0:
        return no_steps(x.new_zeros(b, 0, H, p), h)
    B, C = (v.to(dtype).repeat_interleave(H // v.shape[2], dim=2) for v in (B, C))  # [b, t, H, n]
    decay = torch.exp(dt.to(dtype) * A.to(dtype))  # [b, t, H]
    dt_x = dt.to(dtype)[..., None] * x.to(dtype)  # [b, t, H, p]
    ys = []
    for i in range(t):
        write = dt_x[:, i, :, :, None] * B[:, i, :, None, :]  # [b, H, p, n]
        h = decay[:, i, :, None, None] * h + write
        ys.append(torch.einsum("bHpn,bHn->bHp", h, C[:, i]))  # [b, H, p]
    return torch.stack(ys, dim=1).to(x.dtype), h

def ssd_chunked(x, dt, A, B, C, initial_state=None, chunk_size=64):
    """h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T, y_t = h_t C_t, by chunks: SSD's block decomposition (Dao &
    Gu 2024, Sec. 6) of the lower-triangular y = M (dt x) into chunks of Q steps, from initial_state."""
    # In log space, A_cumsum_l = a_0 + ... + a_l (a = dt A <= 0) within a chunk: step s reaches step l >= s
    # scaled by exp(A_cumsum_l - A_cumsum_s) <= 1 (the causal mask goes in before exp): no decay overflows.
    # Einsum letters: b batch, c chunk, l and s steps in it, g group, r head in the group (H = g r: each head
    # reads its group's B and C), p headdim, n d_state.
    (b, t, H, p), (g, n) = x.shape, B.shape[2:]
    check_initial_state("ssd_chunked", initial_state, (b, H, p, n), SSD_STATE)
    check_chunk_size("ssd_chunked", chunk_size)
    y_dtype = x.dtype
    dtype = compute_dtype(x, dt, A, B, C, initial_state)
    h = x.new_zeros(b, H, p, n, dtype=dtype) if initial_state is None else initial_state.to(dtype)
    if t == 0:
        return no_steps(x.new_zeros(b, 0, H, p), h)
    x, dt, A, B, C = (v.to(dtype) for v in (x, dt, A, B, C))
    Q = max(1, min(chunk_size, t))  # short inputs (e.g. one token at a time) need no padding
    pad = (-t) % Q
    if pad:  # padded steps have dt = 0: decay exp(0) = 1 and no input, so the state passes unchanged
        x, B, C = (F.pad(v, (0, 0, 0, 0, 0, pad)) for v in (x, B, C))
        dt = F.pad(dt, (0, 0, 0, pad))
    nc = (t + pad) // Q
    r = H // g
    x = x.reshape(b, nc, Q, g, r, p)
    dt = dt.reshape(b, nc, Q, g, r)
    B, C = (v.reshape(b, nc, Q, g, n) for v in (B, C))
    dt_x = dt[..., None] * x
    A_cumsum = torch.einsum("bclgr->bgrcl", dt * A.view(g, r)).cumsum(-1)  # time last: the matmuls' layout
    # 1. Diagonal blocks, each chunk from a zero state: y_l = sum_{s <= l} (C_l . B_s) L_ls dt_s x_s, with L
    # the decay from step s to step l; its masked entries get zero gradient too
    causal = torch.ones(Q, Q, dtype=torch.bool, device=x.device).tril()
    L = torch.exp((A_cumsum[..., :, None] - A_cumsum[..., None, :]).masked_fill(~causal, float("-inf")))
    Y_diag = torch.einsum("bclgn,bcsgn,bgrcls,bcsgrp->bclgrp", C, B, L, dt_x)
    # 2. Each chunk's final state from a zero state: sum_l exp(A_cumsum_last - A_cumsum_l) dt_l x_l B_l^T
    decay_states = torch.exp(A_cumsum[..., -1:] - A_cumsum)
    states = torch.einsum("bgrcl,bclgrp,bclgn->bcgrpn", decay_states, dt_x, B)
    # 3. The states passed between chunks, from initial_state (arXiv 2507.02782, Appendix I): t / Q steps
    decay_chunk = torch.exp(A_cumsum[..., -1, None, None]).unbind(3)  # a chunk's whole decay [b, g, r, 1, 1]
    h = h.reshape(b, g, r, p, n)
    states_in = []
    for decay, state in zip(decay_chunk, states.unbind(1)):
        states_in.append(h)
        h = decay * h + state
    states_in = torch.stack(states_in, dim=1)  # the state entering each chunk [b, c, g, r, p, n]
    # 4. Off-diagonal blocks, state to output: the state entering a chunk, decayed to its step l, read by C_l
    state_decay_out = torch.exp(A_cumsum)
    Y_off = torch.einsum("bclgn,bcgrpn,bgrcl->bclgrp", C, states_in, state_decay_out)
    y = (Y_diag + Y_off).reshape(b, nc * Q, H, p)[:, :t]
    return y.to(y_dtype), h.reshape(b, H, p, n)

# ==== Mamba-1 (selective scan): Gu & Dao 2023, "Mamba" (arXiv 2312.00752), Sec. 3.2 and Algorithm 2; official
# code: mamba_ssm (modules/mamba_simple.py). Per channel: a step size, a diagonal state [n]; B_t, C_t shared.
def selective_scan_naive(x, dt, A, B, C, initial_state=None):
    """h_t = exp(dt_t A) * h_{t-1} + dt_t x_t B_t, y_t = h_t C_t, one step at a time: the definition."""
    b, t, d = x.shape
    check_initial_state("selective_scan_naive", initial_state, (b, d, A.shape[1]), SELECTIVE_STATE)
    dtype = compute_dtype(x, dt, A, B, C, initial_state)
    h = x.new_zeros(b, d, A.shape[1], dtype=dtype) if initial_state is None else initial_state.to(dtype)
    if t == 0:
        return no_steps(x.new_zeros(b, 0, d), h)
    dt, A, B, C = (v.to(dtype) for v in (dt, A, B, C))
    dt_x = dt * x.to(dtype)  # [b, t, d]
    ys = []
    for i in range(t):
        decay = torch.exp(dt[:, i, :, None] * A)  # [b, d, n]
        write = dt_x[:, i, :, None] * B[:, i, None, :]  # [b, d, n]
        h = decay * h + write
        ys.append((h * C[:, i, None, :]).sum(-1))  # [b, d]
    return torch.stack(ys, dim=1).to(x.dtype), h

def selective_scan_chunked(x, dt, A, B, C, initial_state=None, chunk_size=64):
    """h_t = exp(dt_t A) * h_{t-1} + dt_t x_t B_t, y_t = h_t C_t, as a two-level scan: 2 Q + t / Q steps."""
    # The decay differs per channel AND state index, so SSD's matmul form would need [Q, Q, d, n] decays;
    # instead the chunks of Q steps run side by side. Only exp of dt * A <= 0 is taken: any decay is stable.
    (b, t, d), n = x.shape, A.shape[1]
    check_initial_state("selective_scan_chunked", initial_state, (b, d, n), SELECTIVE_STATE)
    check_chunk_size("selective_scan_chunked", chunk_size)
    y_dtype = x.dtype
    dtype = compute_dtype(x, dt, A, B, C, initial_state)
    h = x.new_zeros(b, d, n, dtype=dtype) if initial_state is None else initial_state.to(dtype)
    if t == 0:
        return no_steps(x.new_zeros(b, 0, d), h)
    x, dt, A, B, C = (v.to(dtype) for v in (x, dt, A, B, C))
    dt_x = dt * x
    Q = max(1, min(chunk_size, t))
    nc = math.ceil(t / Q)
    pad = (-t) % Q
    if pad:  # padded steps have dt = 0: decay 1 and no input
        dt, dt_x, B, C = (F.pad(v, (0, 0, 0, pad)) for v in (dt, dt_x, B, C))
    # [b, nc, Q, ...] split into Q per-position tensors once: indexing inside the loops would make
    # autograd scatter each step's gradient into a full-size zero tensor
    dt_j, dt_x_j, B_j, C_j = (v.view(b, nc, Q, v.shape[-1]).unbind(2) for v in (dt, dt_x, B, C))
    keep_decays = torch.is_grad_enabled()  # autograd saves step 1's decays anyway: step 3 reuses them
    # 1. Every chunk runs its Q steps from a zero state, keeping its end state (addcmul(w, a, h) = w + a h)
    decays = []
    states = x.new_zeros(b, nc, d, n)
    for j in range(Q):
        decay = torch.exp(dt_j[j][..., None] * A)
        decays.append(decay if keep_decays else None)
        states = torch.addcmul(dt_x_j[j][..., None] * B_j[j][:, :, None, :], decay, states)
    # 2. The state walks along the chunk boundaries from initial_state (arXiv 2507.02782, Appendix I).
    decay_chunk = torch.exp(dt.view(b, nc, Q, d).sum(2)[..., None] * A).unbind(1)  # [b, d, n] each
    states_in = []
    for decay, state in zip(decay_chunk, states.unbind(1)):
        states_in.append(h)
        h = torch.addcmul(state, decay, h)
    # 3. Every chunk reruns its steps from its true incoming state and reads out y.
    h_chunks = torch.stack(states_in, dim=1)  # every chunk's state, side by side [b, c, d, n]
    ys = []
    for j in range(Q):
        decay = decays[j] if keep_decays else torch.exp(dt_j[j][..., None] * A)
        h_chunks = torch.addcmul(dt_x_j[j][..., None] * B_j[j][:, :, None, :], decay, h_chunks)
        ys.append(torch.einsum("bcdn,bcn->bcd", h_chunks, C_j[j]))
    return torch.stack(ys, dim=2).reshape(b, nc * Q, d)[:, :t].to(y_dtype), h

# ==== Layers
class Mamba2(nn.Module):
    """Mamba-2 mixer with mamba_ssm's parameter names, shapes and initialisation (official checkpoints
    load as they are). in_proj -> [z, xBC, dt]; causal conv + SiLU over xBC -> [x, B, C]; SSD scan with
    dt = softplus(dt + dt_bias), A = -exp(A_log); y + D x; gated RMSNorm(y * silu(z)); out_proj."""
    def __init__(self, d_model, d_state=128, d_conv=4, expand=2, headdim=64, ngroups=1, A_init_range=(1, 16),
                 dt_min=0.001, dt_max=0.1, dt_init_floor=1e-4, chunk_size=64, scan_impl="auto"):
        super().__init__()
        check_chunk_size("Mamba2", chunk_size)
        d_inner = expand * d_model
        if min(headdim, ngroups) < 1 or d_inner % headdim or d_inner // headdim % ngroups:
            raise ValueError(f"Mamba2: headdim {headdim} must divide expand * d_model = {d_inner}, and "
                             f"ngroups {ngroups} the number of heads")
        self.d_inner = d_inner
        self.nheads = d_inner // headdim
        self.d_state = d_state
        self.d_conv = d_conv
        self.headdim = headdim
        self.ngroups = ngroups
        self.chunk_size = chunk_size
        self.conv_dim = d_inner + 2 * ngroups * d_state
        self.scan_impl = scan_impl
        # in_proj: the official order [z, x, B, C, dt]; conv1d: only the official weight and bias holder
        self.in_proj = nn.Linear(d_model, self.d_inner + self.conv_dim + self.nheads, bias=False)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, d_conv, padding=d_conv - 1,
                                groups=self.conv_dim)
        self.dt_bias = nn.Parameter(inverse_softplus_dt(self.nheads, dt_min, dt_max, dt_init_floor))
        self.A_log = nn.Parameter(torch.log(torch.empty(self.nheads).uniform_(*A_init_range)))
        self.D = nn.Parameter(torch.ones(self.nheads))
        self.dt_bias._no_weight_decay = self.A_log._no_weight_decay = self.D._no_weight_decay = True
        self.norm = RMSNormGated(self.d_inner, group_size=self.d_inner // ngroups, eps=1e-5)
        self.out_proj = nn.Linear(self.d_inner, d_model, bias=False)

    def forward(self, x, state=None):
        check_state("Mamba2", state, self.state_shapes(x.shape[0]))
        state = self.zero_state(x.shape[0], x.device) if state is None else state
        z, xBC, dt = torch.split(self.in_proj(x), [self.d_inner, self.conv_dim, self.nheads], dim=-1)
        xBC, conv_state = causal_conv1d_silu(xBC, self.conv1d.weight, self.conv1d.bias, state["conv"])
        xs, BC = xBC.tensor_split([self.d_inner], dim=-1)
        B, C = BC.unflatten(-1, (2, self.ngroups, self.d_state)).unbind(-3)  # [b, t, g, n] each
        xs = xs.unflatten(-1, (self.nheads, self.headdim))
        dt = F.softplus(dt.float() + self.dt_bias.float())
        A = -torch.exp(self.A_log.float())
        scan = pick_form(SSD_SCANS, self.scan_impl, x, chunk_size=self.chunk_size)
        y, h = scan(xs, dt, A, B, C, initial_state=state["h"])
        y = y.float() + self.D.float()[:, None] * xs.float()  # skip connection, outside the scan
        y = self.norm(y.flatten(-2), z)
        return self.out_proj(y.to(x.dtype)), {"h": h, "conv": conv_state}

    def state_shapes(self, batch_size):
        return {"h": (batch_size, self.nheads, self.headdim, self.d_state),
                "conv": (batch_size, self.d_conv - 1, self.conv_dim)}

    def zero_state(self, batch_size, device):
        return {k: torch.zeros(shape, device=device) for k, shape in self.state_shapes(batch_size).items()}

class RMSNormGated(nn.Module):
    """RMSNorm of y * silu(z) per group of channels, as mamba_ssm (norm_before_gate=False)."""
    def __init__(self, d, group_size, eps=1e-5):
        super().__init__()
        self.group_size = group_size
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, y, z):  # float32 out
        y = (y.float() * F.silu(z.float())).unflatten(-1, (-1, self.group_size))
        return (y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)).flatten(-2) * self.weight.float()

class Mamba1(nn.Module):
    """Mamba-1 mixer with mamba_ssm's parameter names, shapes and initialisation (official checkpoints
    load as they are). in_proj -> (x, z); causal conv + SiLU over x; x_proj(x) -> (dt_low, B, C); selective
    scan with dt = softplus(dt_proj(dt_low)), A = -exp(A_log); y + D x; out_proj(y * silu(z))."""
    def __init__(self, d_model, d_state=16, d_conv=4, expand=2, dt_rank="auto", dt_min=0.001, dt_max=0.1,
                 dt_init_floor=1e-4, conv_bias=True, bias=False, scan_impl="auto"):
        super().__init__()
        self.d_state = d_state
        self.d_conv = d_conv
        self.d_inner = int(expand * d_model)
        self.dt_rank = math.ceil(d_model / 16) if dt_rank == "auto" else dt_rank
        self.scan_impl = scan_impl
        self.in_proj = nn.Linear(d_model, 2 * self.d_inner, bias=bias)
        self.conv1d = nn.Conv1d(self.d_inner, self.d_inner, d_conv, groups=self.d_inner,
                                padding=d_conv - 1, bias=conv_bias)
        self.x_proj = nn.Linear(self.d_inner, self.dt_rank + 2 * d_state, bias=False)
        self.dt_proj = nn.Linear(self.dt_rank, self.d_inner, bias=True)
        std = self.dt_rank ** -0.5  # the variance of dt_proj(dt_low) does not depend on dt_rank
        with torch.no_grad():
            self.dt_proj.weight.uniform_(-std, std)
            self.dt_proj.bias.copy_(inverse_softplus_dt(self.d_inner, dt_min, dt_max, dt_init_floor))
        # S4D-real init: A[d, k] = -(k + 1), stored as its log so that A = -exp(A_log) stays negative
        self.A_log = nn.Parameter(torch.log(torch.arange(1, d_state + 1.0).repeat(self.d_inner, 1)))
        self.D = nn.Parameter(torch.ones(self.d_inner))  # skip connection x -> y
        self.A_log._no_weight_decay = self.D._no_weight_decay = True
        self.out_proj = nn.Linear(self.d_inner, d_model, bias=bias)

    def forward(self, x, state=None):
        check_state("Mamba1", state, self.state_shapes(x.shape[0]))
        state = self.zero_state(x.shape[0], x.device) if state is None else state
        xs, z = self.in_proj(x).chunk(2, dim=-1)  # [b, t, d_inner] each
        xs, conv_state = causal_conv1d_silu(xs, self.conv1d.weight, self.conv1d.bias, state["conv"])
        dt_low, B, C = self.x_proj(xs).split([self.dt_rank, self.d_state, self.d_state], dim=-1)
        dt = F.softplus(self.dt_proj(dt_low).float())  # softplus in float32: it sets the decay
        A = -torch.exp(self.A_log.float())
        y, h = pick_form(SELECTIVE_SCANS, self.scan_impl, x)(xs, dt, A, B, C, initial_state=state["h"])
        y = (y + xs * self.D.to(y.dtype)) * F.silu(z)
        return self.out_proj(y), {"h": h, "conv": conv_state}

    def state_shapes(self, batch_size):
        return {"h": (batch_size, self.d_inner, self.d_state),
                "conv": (batch_size, self.d_conv - 1, self.d_inner)}

    def zero_state(self, batch_size, device):
        return {k: torch.zeros(shape, device=device) for k, shape in self.state_shapes(batch_size).items()}

# ==== Triton kernels: the naive loops fused, forward only (plumbing/scans.py's triton_scan: the backward)
@triton.jit
def _ssd_kernel(x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, h0_ptr, y_ptr, hT_ptr, T, H, P, G, N,
                BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr):
    # One program owns rows [BLOCK_P] of one (batch, head) state and walks through time with its
    # [BLOCK_P, n] state tile in registers: each input is read once, the state never hits memory.
    bh = tl.program_id(0).to(tl.int64)  # 64-bit: b * t * H * p overflows int32 on long inputs
    bi, hi = bh // H, bh % H
    gi = hi // (H // G)
    offs_p = tl.program_id(1) * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_n = tl.arange(0, BLOCK_N)
    mask_p, mask_n = offs_p < P, offs_n < N
    h_offs = bh * P * N + offs_p[:, None] * N + offs_n[None, :]
    h_mask = mask_p[:, None] & mask_n[None, :]
    A = tl.load(A_ptr + hi)
    h = tl.load(h0_ptr + h_offs, mask=h_mask, other=0.0)
    # offsets of step 0 in x and y, dt, B and C (contiguous [b, t, ...]), moved one time row on per step
    dt_off = bi * T * H + hi
    x_offs, bc_offs = dt_off * P + offs_p, (bi * T * G + gi) * N + offs_n
    for _ in range(T):
        dt = tl.load(dt_ptr + dt_off).to(tl.float32)
        x = tl.load(x_ptr + x_offs, mask=mask_p, other=0.0).to(tl.float32)
        B = tl.load(B_ptr + bc_offs, mask=mask_n, other=0.0).to(tl.float32)
        C = tl.load(C_ptr + bc_offs, mask=mask_n, other=0.0).to(tl.float32)
        h = tl.exp(dt * A) * h + (dt * x)[:, None] * B[None, :]
        tl.store(y_ptr + x_offs, tl.sum(h * C[None, :], axis=1), mask=mask_p)
        x_offs, dt_off, bc_offs = x_offs + H * P, dt_off + H, bc_offs + G * N
    tl.store(hT_ptr + h_offs, h, mask=h_mask)

def _ssd_launch(x, dt, A, B, C, initial_state):
    (b, t, H, p), (g, n) = x.shape, B.shape[2:]
    state_dtype = compute_dtype(x, dt, A, B, C, initial_state)
    # the layer's x, B, C are views of the transposed conv output: contiguous copies coalesce every load
    x, dt, A, B, C = (v.contiguous() for v in (x, dt, A.float(), B, C))
    h0 = (x.new_zeros(b, H, p, n) if initial_state is None else initial_state).float().contiguous()
    y = x.new_empty(b, t, H, p, dtype=torch.float32)
    final_state = torch.empty_like(h0)
    BLOCK_P = min(32, triton.next_power_of_2(p))
    _ssd_kernel[(b * H, triton.cdiv(p, BLOCK_P))](x, dt, A, B, C, h0, y, final_state, t, H, p, g, n,
                                                  BLOCK_P=BLOCK_P, BLOCK_N=triton.next_power_of_2(n))
    return y.to(x.dtype), final_state.to(state_dtype)

def ssd_triton(x, dt, A, B, C, initial_state=None):
    check_initial_state("ssd_triton", initial_state, (x.shape[0], *x.shape[2:], B.shape[-1]), SSD_STATE)
    return triton_scan(_ssd_launch, ssd_chunked, x, dt, A, B, C, initial_state)

@triton.jit
def _selective_scan_kernel(x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, h0_ptr, y_ptr, hT_ptr, T, D, N,
                           BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr):
    # As _ssd_kernel: one program owns batch element bi and BLOCK_D channels (contiguous float32 inputs)
    bi = tl.program_id(0).to(tl.int64)  # 64-bit: bi * T * D overflows int32 on long inputs
    offs_d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    mask_d, mask_n = offs_d < D, offs_n < N
    h_mask = mask_d[:, None] & mask_n[None, :]
    # padded lanes: A = 0 gives decay 1, and h0 = B = 0 keeps them at 0
    A = tl.load(A_ptr + offs_d[:, None] * N + offs_n[None, :], mask=h_mask, other=0.0)
    h_offs = bi * D * N + offs_d[:, None] * N + offs_n[None, :]
    h = tl.load(h0_ptr + h_offs, mask=h_mask, other=0.0)
    d_offs, n_offs = bi * T * D + offs_d, bi * T * N + offs_n  # step 0 in x, dt, y and in B, C
    for _ in range(T):
        x = tl.load(x_ptr + d_offs, mask=mask_d, other=0.0)
        dt = tl.load(dt_ptr + d_offs, mask=mask_d, other=0.0)
        B = tl.load(B_ptr + n_offs, mask=mask_n, other=0.0)
        C = tl.load(C_ptr + n_offs, mask=mask_n, other=0.0)
        h = tl.exp(dt[:, None] * A) * h + (dt * x)[:, None] * B[None, :]
        tl.store(y_ptr + d_offs, tl.sum(h * C[None, :], axis=1), mask=mask_d)
        d_offs, n_offs = d_offs + D, n_offs + N
    tl.store(hT_ptr + h_offs, h, mask=h_mask)

def _selective_scan_launch(x, dt, A, B, C, initial_state):
    (b, t, d), n = x.shape, A.shape[1]
    y_dtype = x.dtype
    state_dtype = compute_dtype(x, dt, A, B, C, initial_state)
    x, dt, A, B, C = (v.float().contiguous() for v in (x, dt, A, B, C))
    h0 = x.new_zeros(b, d, n) if initial_state is None else initial_state.float().contiguous()
    y = torch.empty_like(x)
    final_state = torch.empty_like(h0)
    BLOCK_D = 32  # fixed: the interpreter has no autotune
    _selective_scan_kernel[(b, triton.cdiv(d, BLOCK_D))](x, dt, A, B, C, h0, y, final_state, t, d, n,
                                                         BLOCK_D=BLOCK_D, BLOCK_N=triton.next_power_of_2(n))
    return y.to(y_dtype), final_state.to(state_dtype)

def selective_scan_triton(x, dt, A, B, C, initial_state=None):
    check_initial_state("selective_scan_triton", initial_state, (x.shape[0], x.shape[2], A.shape[1]),
                        SELECTIVE_STATE)
    return triton_scan(_selective_scan_launch, selective_scan_chunked, x, dt, A, B, C, initial_state)

SSD_SCANS = {"naive": ssd_naive, "chunked": ssd_chunked, "triton": ssd_triton}
SELECTIVE_SCANS = {"naive": selective_scan_naive, "chunked": selective_scan_chunked,
                   "triton": selective_scan_triton}
SSD_STATE = "[batch, nheads, headdim, d_state]"
SELECTIVE_STATE = "[batch, d_inner, d_state]"

def causal_conv1d_silu(x, weight, bias, conv_state):
    """SiLU(depthwise causal conv of x [b, t, c] after conv_state [b, k-1, c], the inputs before x, zeros at a
    start; weight, bias: nn.Conv1d's): y [b, t, c], new state; conv(x[:, :a]), conv(x[:, a:]) = conv(x)."""
    if x.shape[1] == 0:  # F.conv1d refuses an input shorter than its kernel; the window passes unchanged
        return x, conv_state.to(torch.float32, copy=True)
    xx = torch.cat([conv_state.to(x.dtype), x], dim=1)  # [b, k-1+t, c]
    bias = None if bias is None else bias.to(x.dtype)
    y = F.conv1d(xx.transpose(1, 2), weight.to(x.dtype), bias, groups=x.shape[-1])
    return F.silu(y.transpose(1, 2)), xx[:, x.shape[1]:].float()

def inverse_softplus_dt(size, dt_min, dt_max, dt_init_floor):
    """dt bias init of both layers (as mamba_ssm): softplus(bias) is log-uniform in [dt_min, dt_max]."""
    log_dt = torch.rand(size) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min)
    dt = torch.exp(log_dt).clamp(min=dt_init_floor)
    return dt + torch.log(-torch.expm1(-dt))  # softplus^-1(dt), stable for small dt
