"""
State space mixers of the paper: Mamba-2 (SSD) and Mamba-1 (selective scan).

Every scan here takes an `initial_state` and returns `(output, final_state)`. That is the one
capability the paper needs: training from a non-zero initial state (State Passing, TBTT, noise)
and evaluating far past the training length by carrying the state forward in chunks.
"""
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
# --- Scan plumbing, shared by ssm.py, gla.py and rwkv.py (not part of the paper) ------------------
try:
    import triton
    import triton.language as tl
    HAS_TRITON = True
except ImportError:  # no Triton wheel (e.g. macOS): the naive and chunked forms still work
    HAS_TRITON = False

    class _NoTriton:  # stand-in so that the @triton.jit kernels below still parse
        constexpr = None

        @staticmethod
        def jit(fn):
            return fn
    triton = tl = _NoTriton()


def compute_dtype(*tensors):
    """Every scan computes in float32 (float64 when an input is float64, as in the tests): a
    long product of decays loses too much in bf16."""
    return torch.float64 if any(v is not None and v.dtype == torch.float64 for v in tensors) else torch.float32


def pick_form(forms, impl, x):
    """forms: {"naive", "chunked", "triton"} -> function. "auto": the Triton kernel on CUDA, else chunked."""
    if impl == "auto":
        impl = "triton" if x.is_cuda and HAS_TRITON else "chunked"
    return forms[impl]


def check_triton(name, x):
    if not HAS_TRITON:
        raise RuntimeError(f"{name} needs Triton, which is not installed (Linux: pip install triton); use the chunked form")
    if not (x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"):
        raise RuntimeError(f"{name} needs CUDA tensors, or TRITON_INTERPRET=1 set before triton is imported")


class _TritonForward(torch.autograd.Function):
    """Forward through a Triton kernel; backward by recomputing the chunked PyTorch form under
    autograd. Same function, so the same gradients, without a second kernel to keep in sync."""

    @staticmethod
    def forward(ctx, kernel_forward, chunked, *inputs):
        ctx.chunked = chunked
        ctx.save_for_backward(*inputs)
        return kernel_forward(*inputs)

    @staticmethod
    def backward(ctx, dy, dfinal_state):
        needs = ctx.needs_input_grad[2:]
        with torch.enable_grad():
            inputs = [v.detach().requires_grad_(need) for v, need in zip(ctx.saved_tensors, needs)]
            y, final_state = ctx.chunked(*inputs)
            wanted = [v for v in inputs if v.requires_grad]
            grads = iter(torch.autograd.grad((y, final_state), wanted, (dy, dfinal_state), allow_unused=True))
        return (None, None) + tuple(next(grads) if need else None for need in needs)


def triton_scan(kernel_forward, chunked, *inputs):
    """(y, final_state) = kernel_forward(*inputs), differentiable through chunked(*inputs).
    Non-tensor arguments (scale, chunk size) go in with functools.partial."""
    return _TritonForward.apply(kernel_forward, chunked, *inputs)


def causal_conv1d(x, weight, bias=None, conv_state=None):
    """Depthwise causal convolution over time, carrying its window as state.

    x [b, t, c]; weight [c, 1, k] (nn.Conv1d layout, as in mamba_ssm); bias [c] or None;
    conv_state [b, k-1, c] holds the k-1 inputs that came before x (zeros at a sequence start).
    Returns y [b, t, c] (before the activation) and the new conv_state: the last k-1 inputs,
    so that conv(x[:, :a]) followed by conv(x[:, a:], state) equals conv(x).
    """
    b, t, c = x.shape
    k = weight.shape[-1]
    if conv_state is None:
        conv_state = x.new_zeros(b, k - 1, c)
    xx = torch.cat([conv_state.to(x.dtype), x], dim=1)  # [b, k-1+t, c]
    y = F.conv1d(xx.transpose(1, 2), weight.to(x.dtype), None if bias is None else bias.to(x.dtype), groups=c)
    new_conv_state = xx[:, xx.shape[1] - (k - 1):].float()
    return y.transpose(1, 2), new_conv_state


# ----------------------------------------------------------------------------------------------
# Mamba-2 (SSD): scalar decay per head, the input/output projections B, C shared within a group.
#
#   h_t = exp(dt_t * A) h_{t-1} + dt_t x_t B_t^T        h: [headdim p, d_state n] per head
#   y_t = h_t C_t
#
# Shapes: x [b, t, h, p], dt [b, t, h] (already positive), A [h] (negative), B, C [b, t, g, n],
# initial_state / final_state [b, h, p, n]. Head i reads group i // (h // g).
# All three forms compute in float32 (float64 when the inputs are float64, for tests), return y in
# x's dtype and the final state in the compute dtype (float32 in normal use).
# ----------------------------------------------------------------------------------------------


def ssd_naive(x, dt, A, B, C, initial_state=None):
    """The SSD recurrence, one step at a time. The reference the other two forms are tested against."""
    b, t, h, p, g, n = _check_ssd_inputs("ssd_naive", x, dt, A, B, C, initial_state)
    out_dtype = x.dtype
    x, dt, A, B, C, state = _upcast(x, dt, A, B, C, initial_state, b, h, p, n)
    B, C = B.repeat_interleave(h // g, dim=2), C.repeat_interleave(h // g, dim=2)  # [b, t, h, n]
    ys = []
    for i in range(t):
        decay = torch.exp(dt[:, i] * A)[:, :, None, None]  # [b, h, 1, 1]
        state = decay * state + (dt[:, i, :, None] * x[:, i])[..., None] * B[:, i, :, None, :]
        ys.append(torch.einsum("bhpn,bhn->bhp", state, C[:, i]))
    return torch.stack(ys, dim=1).to(out_dtype), state


def ssd_chunked(x, dt, A, B, C, initial_state=None, chunk_size=64):
    """SSD: the same recurrence computed chunk by chunk, parallel inside each chunk.

    With log decays a = dt * A <= 0 and their running sum within a chunk cs_i = a_0 + ... + a_i,
    the step-j input reaches step i (j <= i) scaled by exp(a_{j+1} + ... + a_i) = exp(cs_i - cs_j).
    Inside a chunk, x -> y is then a masked "attention" y_i = sum_{j<=i} (C_i . B_j) exp(cs_i - cs_j) dt_j x_j.
    The chunks are linked by passing one state across each boundary; that chain starts from
    initial_state, which is the only place a non-zero initial state enters (it reaches step i of
    the first chunk as C_i . exp(cs_i) initial_state). Every exponent is a sum of non-positive log
    decays (the causal mask is applied before exp), so nothing overflows however strong the decay.
    """
    b, t, h, p, g, n = _check_ssd_inputs("ssd_chunked", x, dt, A, B, C, initial_state)
    out_dtype = x.dtype
    x, dt, A, B, C, state = _upcast(x, dt, A, B, C, initial_state, b, h, p, n)
    L = max(1, min(chunk_size, t))  # short inputs (e.g. one token at a time) need no padding
    pad = (-t) % L
    if pad:  # padded steps have dt = 0: decay exp(0) = 1 and no input, so the state passes unchanged
        x, B, C = (F.pad(v, (0, 0, 0, 0, 0, pad)) for v in (x, B, C))
        dt = F.pad(dt, (0, 0, 0, pad))
    nc, r = (t + pad) // L, h // g
    # Layout [b, chunk c, group g, head-in-group r, position l, ...]: time chunks split out, heads
    # split into (group, head within group) so each group's B, C broadcast over its heads.
    x = x.reshape(b, nc, L, g, r, p).permute(0, 1, 3, 4, 2, 5)  # [b, c, g, r, L, p]
    dt = dt.reshape(b, nc, L, g, r).permute(0, 1, 3, 4, 2)  # [b, c, g, r, L]
    B = B.reshape(b, nc, L, g, n).transpose(2, 3)[:, :, :, None]  # [b, c, g, 1, L, n]
    C = C.reshape(b, nc, L, g, n).transpose(2, 3)[:, :, :, None]
    cs = torch.cumsum(dt * A.reshape(g, r, 1), dim=-1)  # running log decay within the chunk
    xdt = x * dt[..., None]  # what each step writes, dt_j x_j

    # 1. Within each chunk, from a zero state.
    scores = (C @ B.transpose(-1, -2)) * _segsum(cs).exp()  # [b, c, g, r, L, L], zero above the diagonal
    y = scores @ xdt

    # 2. The state each chunk leaves at its end when started from zero.
    decay_to_end = torch.exp(cs[..., -1:] - cs)  # [b, c, g, r, L]
    chunk_states = (xdt * decay_to_end[..., None]).transpose(-1, -2) @ B  # [b, c, g, r, p, n]

    # 3. Pass the state across chunk boundaries, starting from initial_state. A plain loop over
    # chunks: it is T / chunk_size small steps, and keeps memory linear in T for long evaluations.
    decay_from_start = torch.exp(cs)  # [b, c, g, r, L]
    chunk_decay = decay_from_start[..., -1, None, None]  # whole-chunk decay [b, c, g, r, 1, 1]
    state = state.reshape(b, g, r, p, n)
    states_in = []
    for c in range(nc):
        states_in.append(state)
        state = chunk_decay[:, c] * state + chunk_states[:, c]
    states_in = torch.stack(states_in, dim=1)  # state entering each chunk [b, c, g, r, p, n]

    # 4. What the incoming state adds to every step of its chunk.
    y = y + (C @ states_in.transpose(-1, -2)) * decay_from_start[..., None]
    y = y.permute(0, 1, 4, 2, 3, 5).reshape(b, nc * L, h, p)[:, :t]
    return y.to(out_dtype), state.reshape(b, h, p, n)


def ssd_triton(x, dt, A, B, C, initial_state=None):
    """Fused recurrent Triton kernel for the forward; backward recomputes through ssd_chunked.

    Runs on CUDA tensors, or on CPU tensors under TRITON_INTERPRET=1 (how the tests run it).
    """
    if not hasattr(triton, "cdiv"):
        raise RuntimeError("ssd_triton needs Triton, which is not installed (Linux: pip install triton); use ssd_chunked")
    b, t, h, p, g, n = _check_ssd_inputs("ssd_triton", x, dt, A, B, C, initial_state)
    if not (x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"):
        raise RuntimeError("ssd_triton needs CUDA tensors, or TRITON_INTERPRET=1 set before triton is imported")
    if initial_state is None:  # zeros that need no gradient; the Function still returns one, dropped here
        initial_state = x.new_zeros(b, h, p, n, dtype=torch.float32)
    return _SSDTriton.apply(x, dt, A, B, C, initial_state)


class _SSDTriton(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dt, A, B, C, initial_state):
        ctx.save_for_backward(x, dt, A, B, C, initial_state)
        return _ssd_triton_forward(x, dt, A, B, C, initial_state)

    @staticmethod
    def backward(ctx, dy, dfinal_state):
        # Recompute through the chunked form (same math, so the same gradients) rather than keeping
        # a second hand-written kernel in sync with the first.
        needs = ctx.needs_input_grad
        with torch.enable_grad():
            inputs = [v.detach().requires_grad_(need) for v, need in zip(ctx.saved_tensors, needs)]
            y, final_state = ssd_chunked(*inputs)
            grads = iter(torch.autograd.grad((y, final_state), [v for v in inputs if v.requires_grad], (dy, dfinal_state)))
        return tuple(next(grads) if need else None for need in needs)


def _ssd_triton_forward(x, dt, A, B, C, initial_state):
    b, t, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    state_dtype = _compute_dtype(x, dt, A, B, C)
    y = torch.empty(b, t, h, p, device=x.device, dtype=torch.float32)
    initial_state = initial_state.detach().to(torch.float32).contiguous()
    final_state = torch.empty_like(initial_state)
    BLOCK_P = min(32, triton.next_power_of_2(p))
    BLOCK_N = triton.next_power_of_2(n)
    grid = (b * h, triton.cdiv(p, BLOCK_P))
    _ssd_fwd_kernel[grid](
        x, dt, A, B, C, initial_state, y, final_state,
        t, h, p, n, h // g,
        *x.stride(), *dt.stride(), A.stride(0), *B.stride(), *C.stride(), *initial_state.stride(), *y.stride(),
        BLOCK_P=BLOCK_P, BLOCK_N=BLOCK_N,
    )
    return y.to(x.dtype), final_state.to(state_dtype)


@triton.jit
def _ssd_fwd_kernel(
    x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, s0_ptr, y_ptr, sT_ptr,
    T, H, P, N, HEADS_PER_GROUP,
    sx_b, sx_t, sx_h, sx_p,
    sdt_b, sdt_t, sdt_h,
    sA_h,
    sB_b, sB_t, sB_g, sB_n,
    sC_b, sC_t, sC_g, sC_n,
    ss_b, ss_h, ss_p, ss_n,
    sy_b, sy_t, sy_h, sy_p,
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
):
    # One program owns rows [BLOCK_P] of one (batch, head) state and walks through time, keeping its
    # [BLOCK_P, n] state tile in registers: each input element is read once, the state never hits memory.
    bh = tl.program_id(0).to(tl.int64)  # 64-bit so batch * stride cannot overflow on long inputs
    bi = bh // H
    hi = bh % H
    gi = hi // HEADS_PER_GROUP
    offs_p = tl.program_id(1) * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_n = tl.arange(0, BLOCK_N)
    mask_p = offs_p < P
    mask_n = offs_n < N
    s_offs = bi * ss_b + hi * ss_h + offs_p[:, None] * ss_p + offs_n[None, :] * ss_n
    s_mask = mask_p[:, None] & mask_n[None, :]

    A_h = tl.load(A_ptr + hi * sA_h).to(tl.float32)
    state = tl.load(s0_ptr + s_offs, mask=s_mask, other=0.0)
    # Pointers to step 0, advanced by one time stride per step (pointer arithmetic is 64-bit).
    x_ptrs = x_ptr + bi * sx_b + hi * sx_h + offs_p * sx_p
    dt_ptrs = dt_ptr + bi * sdt_b + hi * sdt_h
    B_ptrs = B_ptr + bi * sB_b + gi * sB_g + offs_n * sB_n
    C_ptrs = C_ptr + bi * sC_b + gi * sC_g + offs_n * sC_n
    y_ptrs = y_ptr + bi * sy_b + hi * sy_h + offs_p * sy_p
    for _ in range(T):
        dt_t = tl.load(dt_ptrs).to(tl.float32)
        x_t = tl.load(x_ptrs, mask=mask_p, other=0.0).to(tl.float32)
        B_t = tl.load(B_ptrs, mask=mask_n, other=0.0).to(tl.float32)
        C_t = tl.load(C_ptrs, mask=mask_n, other=0.0).to(tl.float32)
        state = tl.exp(dt_t * A_h) * state + (dt_t * x_t)[:, None] * B_t[None, :]
        tl.store(y_ptrs, tl.sum(state * C_t[None, :], axis=1), mask=mask_p)
        x_ptrs += sx_t
        dt_ptrs += sdt_t
        B_ptrs += sB_t
        C_ptrs += sC_t
        y_ptrs += sy_t
    tl.store(sT_ptr + s_offs, state, mask=s_mask)


SSD_SCANS = {"naive": ssd_naive, "chunked": ssd_chunked, "triton": ssd_triton}


class Mamba2(nn.Module):
    """Mamba-2 mixer with the official mamba_ssm parameter names, shapes and initialisation.

    in_proj -> [z, xBC, dt]; causal depthwise conv + SiLU over xBC -> [x, B, C]; SSD scan with
    dt = softplus(dt + dt_bias), A = -exp(A_log); y + D x; gated RMSNorm(y * silu(z)); out_proj.
    state = {"h": [b, nheads, headdim, d_state], "conv": [b, d_conv - 1, conv_dim]}.
    """

    def __init__(self, d_model, d_state=128, d_conv=4, expand=2, headdim=64, ngroups=1, A_init_range=(1, 16),
                 dt_min=0.001, dt_max=0.1, dt_init_floor=1e-4, chunk_size=64, layer_idx=None, scan_impl="auto"):
        super().__init__()
        self.d_model, self.d_state, self.d_conv, self.expand = d_model, d_state, d_conv, expand
        self.d_inner = expand * d_model
        self.headdim, self.ngroups = headdim, ngroups
        if self.d_inner % headdim != 0:
            raise ValueError(f"Mamba2: d_inner = expand * d_model = {self.d_inner} must be divisible by headdim = {headdim}")
        self.nheads = self.d_inner // headdim
        if self.nheads % ngroups != 0:
            raise ValueError(f"Mamba2: nheads = {self.nheads} must be divisible by ngroups = {ngroups}")
        self.chunk_size, self.layer_idx, self.scan_impl = chunk_size, layer_idx, scan_impl
        self.conv_dim = self.d_inner + 2 * ngroups * d_state

        # One projection for everything, in the official order [z, x, B, C, dt].
        self.in_proj = nn.Linear(d_model, 2 * self.d_inner + 2 * ngroups * d_state + self.nheads, bias=False)
        # nn.Conv1d only as the official container of weight [conv_dim, 1, d_conv] and bias; it is
        # applied through causal_conv1d so its window can be carried as state.
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, d_conv, groups=self.conv_dim, bias=True, padding=d_conv - 1)

        # dt_bias = softplus^-1(dt), dt log-uniform in [dt_min, dt_max]: the initial time steps span
        # fast and slow heads. softplus^-1(y) = y + log(1 - exp(-y)).
        dt = torch.exp(torch.rand(self.nheads) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
        dt = dt.clamp(min=dt_init_floor)
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))
        self.A_log = nn.Parameter(torch.log(torch.empty(self.nheads).uniform_(*A_init_range)))
        self.D = nn.Parameter(torch.ones(self.nheads))
        for param in (self.dt_bias, self.A_log, self.D):
            param._no_weight_decay = True  # as in mamba_ssm; train.py leaves these out of weight decay

        self.norm = RMSNormGated(self.d_inner, group_size=self.d_inner // ngroups, eps=1e-5)
        self.out_proj = nn.Linear(self.d_inner, d_model, bias=False)

    def forward(self, x, state=None):
        b, t, _ = x.shape
        if state is None:
            state = self.zero_state(b, x.device)
        z, xBC, dt = torch.split(self.in_proj(x), [self.d_inner, self.conv_dim, self.nheads], dim=-1)
        xBC, conv_state = causal_conv1d(xBC, self.conv1d.weight, self.conv1d.bias, state["conv"])
        xs, B, C = torch.split(F.silu(xBC), [self.d_inner, self.ngroups * self.d_state, self.ngroups * self.d_state], dim=-1)
        xs = xs.reshape(b, t, self.nheads, self.headdim)
        dt = F.softplus(dt.float() + self.dt_bias.float())
        A = -torch.exp(self.A_log.float())

        impl = self.scan_impl
        if impl == "auto":
            impl = "triton" if x.is_cuda else "chunked"
        kwargs = {"chunk_size": self.chunk_size} if impl == "chunked" else {}
        y, h = SSD_SCANS[impl](xs, dt, A, B.reshape(b, t, self.ngroups, self.d_state),
                               C.reshape(b, t, self.ngroups, self.d_state), initial_state=state["h"], **kwargs)
        y = y.float() + self.D.float()[:, None] * xs.float()  # skip connection, outside the scan
        y = self.norm(y.reshape(b, t, self.d_inner), z)  # float32 in, float32 out
        return self.out_proj(y.to(x.dtype)), {"h": h, "conv": conv_state}

    def zero_state(self, batch_size, device):
        return {
            "h": torch.zeros(batch_size, self.nheads, self.headdim, self.d_state, device=device),
            "conv": torch.zeros(batch_size, self.d_conv - 1, self.conv_dim, device=device),
        }


class RMSNormGated(nn.Module):
    """RMSNorm of y * silu(z) over groups of `group_size` channels (mamba_ssm's norm_before_gate=False).

    Normalising per group keeps the groups (which have separate B, C) independent, as in mamba_ssm.
    """

    def __init__(self, d, group_size=None, eps=1e-5):
        super().__init__()
        self.group_size, self.eps = group_size or d, eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, y, z):
        dtype = y.dtype
        y = y.float() * F.silu(z.float())
        yg = y.unflatten(-1, (-1, self.group_size))
        y = (yg * torch.rsqrt(yg.pow(2).mean(-1, keepdim=True) + self.eps)).flatten(-2)
        return (y * self.weight.float()).to(dtype)


# -- helpers ------------------------------------------------------------------------------------

def _segsum(cs):
    """cs [..., L] running sums -> [..., L, L] segment sums cs_i - cs_j for j <= i, -inf above the diagonal.

    The -inf mask goes in before exp, so exp only ever sees non-positive numbers (or -inf -> 0) and
    the masked entries contribute zero gradient.
    """
    L = cs.shape[-1]
    causal = torch.ones(L, L, dtype=torch.bool, device=cs.device).tril()
    return (cs[..., :, None] - cs[..., None, :]).masked_fill(~causal, float("-inf"))


def _compute_dtype(*tensors):
    return torch.float64 if any(v.dtype == torch.float64 for v in tensors) else torch.float32


def _upcast(x, dt, A, B, C, initial_state, b, h, p, n):
    dtype = _compute_dtype(x, dt, A, B, C)
    if initial_state is None:
        initial_state = x.new_zeros(b, h, p, n, dtype=dtype)
    return x.to(dtype), dt.to(dtype), A.to(dtype), B.to(dtype), C.to(dtype), initial_state.to(dtype)


def _check_ssd_inputs(name, x, dt, A, B, C, initial_state):
    """Raise ValueError naming the first tensor whose shape or dtype is wrong; return (b, t, h, p, g, n)."""
    def check(tensor_name, v, dims, expected=None):
        # expected=None: only the rank is known yet (x, B define the sizes the others must match)
        if not isinstance(v, torch.Tensor):
            raise ValueError(f"{name}: {tensor_name} must be a tensor of shape [{dims}], got {type(v).__name__}")
        if not v.is_floating_point():
            raise ValueError(f"{name}: {tensor_name} must be a floating-point tensor, got {v.dtype}")
        ok = v.dim() == len(dims.split(",")) if expected is None else list(v.shape) == expected
        if not ok:
            shown = "" if expected is None else f" = {expected}"
            raise ValueError(f"{name}: {tensor_name} must have shape [{dims}]{shown}, got {list(v.shape)}")

    check("x", x, "b, t, h, p")
    b, t, h, p = x.shape
    if t == 0:
        raise ValueError(f"{name}: x must have at least one time step, got shape {list(x.shape)}")
    check("dt", dt, "b, t, h", [b, t, h])
    check("A", A, "h", [h])
    check("B", B, "b, t, g, n")
    g, n = B.shape[2], B.shape[3]
    if list(B.shape[:2]) != [b, t] or g == 0 or h % g != 0:
        raise ValueError(f"{name}: B must have shape [b, t, g, n] = [{b}, {t}, g, n] with h % g == 0 (h = {h}), "
                         f"got {list(B.shape)}")
    check("C", C, "b, t, g, n", [b, t, g, n])
    if initial_state is not None:
        check("initial_state", initial_state, "b, h, p, n", [b, h, p, n])
    return b, t, h, p, g, n


# ----------------------------------------------------------------------------------------------
# Mamba-1: selective scan
#
# Every channel d of the inner width has its own diagonal state of size n, with an input-dependent
# step size delta[b, t, d] (already positive) and a fixed negative A[d, n]:
#     h_t = exp(delta_t * A) * h_{t-1} + delta_t * u_t * B_t        h: [b, d, n]
#     y_t = sum_n h_t * C_t                                          y: [b, t, d]
# B_t, C_t [b, t, n] are shared by all channels. h_{-1} = initial_state (zeros when None).
# All three forms return (y in u's dtype, final_state). They compute in float32, or float64 when
# an input is float64 (the tests use that); the Triton kernel always runs in float32.
# ----------------------------------------------------------------------------------------------


def selective_scan_naive(u, delta, A, B, C, initial_state=None):
    """The recurrence, one time step at a time: the reference the other two forms must match."""
    b, t, d, n = _check_selective_scan_args("selective_scan_naive", u, delta, A, B, C, initial_state)
    out_dtype, dtype = u.dtype, _selective_scan_dtype(u, delta, A, B, C, initial_state)
    u, delta, A, B, C = (x.to(dtype) for x in (u, delta, A, B, C))
    h = u.new_zeros(b, d, n) if initial_state is None else initial_state.to(dtype)
    ys = []
    for i in range(t):
        h = torch.exp(delta[:, i, :, None] * A) * h + (delta[:, i] * u[:, i])[:, :, None] * B[:, i, None, :]
        ys.append((h * C[:, i, None, :]).sum(-1))
    return torch.stack(ys, dim=1).to(out_dtype), h


def selective_scan_chunked(u, delta, A, B, C, initial_state=None, chunk_size=64):
    """Two-level (chunked) scan in plain PyTorch: autograd-trainable, ~sqrt(T) sequential steps.

    The decay exp(delta_t * A[d, n]) differs per channel AND per state index, so the SSD trick (one
    scalar decay per step, a [chunk, chunk] decay matrix and matmuls) does not apply: an exact
    intra-chunk "attention" form would need a [chunk, chunk, d, n] tensor of decays, chunk times
    the work of the recurrence itself. Instead the time axis is cut into n_chunks chunks of length
    chunk_size and the recurrence runs over all chunks side by side:
      1. every chunk runs its chunk_size steps from a zero state ([b, n_chunks, d, n] per step);
      2. the carried state walks along the chunk boundaries (n_chunks small steps): carry into
         chunk c+1 = (decay over chunk c) * (carry into c) + (chunk c's end state from step 1);
         the initial_state is the carry into the first chunk;
      3. every chunk reruns its steps from its true carried-in state and reads out y.
    Only exp of non-positive numbers (delta * A <= 0) is taken, so any decay strength is stable.
    The gain over the naive loop is fewer, larger PyTorch ops (2 * chunk_size + n_chunks steps
    instead of T); the elementwise work is about twice the loop's, so the speed-up is largest when
    b * d * n is small (the naive loop is then all per-op overhead).
    T need not be a multiple of chunk_size: the tail is padded with delta = 0 steps, whose decay
    is exp(0) = 1 and whose input is 0, so they leave the state unchanged.
    Memory: per step [b, ceil(T / chunk_size), d, n]; under autograd O(b * T * d * n) is saved, as
    for any PyTorch form of this scan.
    """
    b, t, d, n = _check_selective_scan_args("selective_scan_chunked", u, delta, A, B, C, initial_state)
    out_dtype, dtype = u.dtype, _selective_scan_dtype(u, delta, A, B, C, initial_state)
    u, delta, A, B, C = (x.to(dtype) for x in (u, delta, A, B, C))
    L = max(1, min(chunk_size, t))
    n_chunks = math.ceil(t / L)
    du = delta * u
    pad = n_chunks * L - t
    if pad:
        delta, du, B, C = (F.pad(x, (0, 0, 0, pad)) for x in (delta, du, B, C))
    # [b, n_chunks, L, ...] split into L per-position tensors once: indexing inside the loops would
    # make autograd scatter each step's gradient into a full-size zero tensor
    delta_j, du_j = delta.view(b, n_chunks, L, d).unbind(2), du.view(b, n_chunks, L, d).unbind(2)
    B_j, C_j = B.view(b, n_chunks, L, n).unbind(2), C.view(b, n_chunks, L, n).unbind(2)

    # 1. all chunks from a zero state; keep only their end states. (torch.addcmul(x, a, b) = x + a * b,
    # one pass instead of two: the elementwise passes over [b, n_chunks, d, n] are the whole cost.)
    # Under autograd every decay exp(delta * A) is saved anyway, so step 3 reuses them; without
    # autograd it recomputes them, so memory stays at a few [b, n_chunks, d, n] tensors.
    keep_decays = torch.is_grad_enabled() and any(
        x is not None and x.requires_grad for x in (u, delta, A, B, C, initial_state))
    decays = []
    h = u.new_zeros(b, n_chunks, d, n)
    for j in range(L):
        decay = torch.exp(delta_j[j][..., None] * A)
        decays.append(decay if keep_decays else None)
        h = torch.addcmul(du_j[j][..., None] * B_j[j][:, :, None, :], decay, h)
    # 2. carry the state across chunk boundaries; a chunk's total decay is exp(A * sum of its deltas)
    chunk_decay = torch.exp(delta.view(b, n_chunks, L, d).sum(2)[..., None] * A).unbind(1)  # [b, d, n] each
    carry = u.new_zeros(b, d, n) if initial_state is None else initial_state.to(dtype)
    carried_in = []
    for c, end_state in enumerate(h.unbind(1)):
        carried_in.append(carry)
        carry = torch.addcmul(end_state, chunk_decay[c], carry)
    # 3. all chunks again, now from their true starting states, reading out y
    h = torch.stack(carried_in, dim=1)
    ys = []
    for j in range(L):
        decay = decays[j] if keep_decays else torch.exp(delta_j[j][..., None] * A)
        h = torch.addcmul(du_j[j][..., None] * B_j[j][:, :, None, :], decay, h)
        ys.append(torch.einsum("bcdn,bcn->bcd", h, C_j[j]))
    y = torch.stack(ys, dim=2).reshape(b, n_chunks * L, d)[:, :t]
    return y.to(out_dtype), carry


# Triton: a fused recurrent kernel. One program owns batch element pid_b and BLOCK_D channels; it
# keeps their [BLOCK_D, BLOCK_N] state tile in registers and walks through time, so the states
# never touch memory (the reason mamba_ssm has a fused kernel at all). The backward pass recomputes
# through selective_scan_chunked.
@triton.jit
def _selective_scan_fwd_kernel(
    u_ptr, delta_ptr, A_ptr, B_ptr, C_ptr, h0_ptr, y_ptr, hT_ptr,  # contiguous float32
    T, D, N,
    BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
):
    # int64 batch index: pid_b * T * D overflows int32 once a batch holds 2^31 elements
    pid_b = tl.program_id(0).to(tl.int64)
    pid_d = tl.program_id(1)
    offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    mask_d = offs_d < D
    mask_n = offs_n < N
    mask_dn = mask_d[:, None] & mask_n[None, :]
    # padded lanes: A = 0 gives decay 1, and h0 = B = 0 keeps them at 0
    A = tl.load(A_ptr + offs_d[:, None] * N + offs_n[None, :], mask=mask_dn, other=0.0)
    state_offs = pid_b * D * N + offs_d[:, None] * N + offs_n[None, :]
    h = tl.load(h0_ptr + state_offs, mask=mask_dn, other=0.0)
    # pointers to time step 0; each step advances them by one row (64-bit pointer arithmetic)
    u_ptrs = u_ptr + pid_b * T * D + offs_d
    delta_ptrs = delta_ptr + pid_b * T * D + offs_d
    y_ptrs = y_ptr + pid_b * T * D + offs_d
    B_ptrs = B_ptr + pid_b * T * N + offs_n
    C_ptrs = C_ptr + pid_b * T * N + offs_n
    for _ in range(0, T):
        u_t = tl.load(u_ptrs, mask=mask_d, other=0.0)
        delta_t = tl.load(delta_ptrs, mask=mask_d, other=0.0)
        B_t = tl.load(B_ptrs, mask=mask_n, other=0.0)
        C_t = tl.load(C_ptrs, mask=mask_n, other=0.0)
        h = tl.exp(delta_t[:, None] * A) * h + (delta_t * u_t)[:, None] * B_t[None, :]
        tl.store(y_ptrs, tl.sum(h * C_t[None, :], axis=1), mask=mask_d)
        u_ptrs += D
        delta_ptrs += D
        y_ptrs += D
        B_ptrs += N
        C_ptrs += N
    tl.store(hT_ptr + state_offs, h, mask=mask_dn)


_SELECTIVE_SCAN_BLOCK_D = 32  # fixed: the interpreter has no autotune


def _selective_scan_triton_forward(u, delta, A, B, C, initial_state):
    b, t, d = u.shape
    n = A.shape[1]
    u, delta, A, B, C, h0 = (x.float().contiguous() for x in (u, delta, A, B, C, initial_state))
    y = torch.empty_like(u)
    final_state = torch.empty_like(h0)
    grid = (b, triton.cdiv(d, _SELECTIVE_SCAN_BLOCK_D))
    _selective_scan_fwd_kernel[grid](
        u, delta, A, B, C, h0, y, final_state, t, d, n,
        BLOCK_D=_SELECTIVE_SCAN_BLOCK_D, BLOCK_N=triton.next_power_of_2(n),
    )
    return y, final_state


class _SelectiveScanTriton(torch.autograd.Function):
    @staticmethod
    def forward(ctx, u, delta, A, B, C, initial_state):
        y, final_state = _selective_scan_triton_forward(u, delta, A, B, C, initial_state)
        ctx.save_for_backward(u, delta, A, B, C, initial_state)
        return y.to(u.dtype), final_state

    @staticmethod
    def backward(ctx, dy, dfinal_state):
        # Recompute through the chunked PyTorch form and let autograd differentiate it: slower than
        # a backward kernel, but it is exactly the function the forward kernel computes.
        with torch.enable_grad():
            needs = ctx.needs_input_grad
            inputs = [x.detach().requires_grad_(need) for x, need in zip(ctx.saved_tensors, needs)]
            y, final_state = selective_scan_chunked(*inputs)
            outputs, grad_outputs = [], []
            for out, grad in ((y, dy), (final_state, dfinal_state)):
                if grad is not None:
                    outputs.append(out)
                    grad_outputs.append(grad)
            wanted = [x for x in inputs if x.requires_grad]
            grads = iter(torch.autograd.grad(outputs, wanted, grad_outputs, allow_unused=True))
        return tuple(next(grads) if x.requires_grad else None for x in inputs)


def selective_scan_triton(u, delta, A, B, C, initial_state=None):
    """Fused recurrent Triton kernel (forward); backward recomputes through selective_scan_chunked."""
    if not hasattr(triton, "cdiv"):
        raise RuntimeError("selective_scan_triton needs Triton, which is not installed (Linux: pip install triton); use selective_scan_chunked")
    b, t, d, n = _check_selective_scan_args("selective_scan_triton", u, delta, A, B, C, initial_state)
    if triton is None:
        raise RuntimeError("selective_scan_triton needs triton; use selective_scan_chunked")
    if initial_state is None:
        initial_state = u.new_zeros(b, d, n, dtype=torch.float32)
    return _SelectiveScanTriton.apply(u, delta, A, B, C, initial_state)


SELECTIVE_SCANS = {
    "naive": selective_scan_naive,
    "chunked": selective_scan_chunked,
    "triton": selective_scan_triton,
}


# ----------------------------------------------------------------------------------------------
# Mamba-1 mixer
# ----------------------------------------------------------------------------------------------


class Mamba(nn.Module):
    """Mamba-1 mixer with the parameter names, layouts and initialisation of mamba_ssm's `Mamba`
    (so its checkpoints load with load_state_dict). The block's norm and residual are model.py's.

    x -> in_proj -> (x, z); x -> causal depthwise conv -> SiLU -> x_proj -> (dt, B, C);
    delta = softplus(dt_proj(dt)); y = selective_scan(x, delta, A, B, C) + D * x;
    out = out_proj(y * SiLU(z)).
    State: {"h": [b, d_inner, d_state] scan state, "conv": [b, d_conv - 1, d_inner] conv window}.
    """

    def __init__(self, d_model, d_state=16, d_conv=4, expand=2, dt_rank="auto", dt_min=0.001,
                 dt_max=0.1, dt_init="random", dt_scale=1.0, dt_init_floor=1e-4, conv_bias=True,
                 bias=False, layer_idx=None, scan_impl="auto"):
        super().__init__()
        self.d_model = d_model
        self.d_state = d_state
        self.d_conv = d_conv
        self.expand = expand
        self.d_inner = int(expand * d_model)
        self.dt_rank = math.ceil(d_model / 16) if dt_rank == "auto" else dt_rank
        self.layer_idx = layer_idx
        self.scan_impl = scan_impl

        self.in_proj = nn.Linear(d_model, 2 * self.d_inner, bias=bias)
        # nn.Conv1d only as the parameter container (layout [d_inner, 1, d_conv], like mamba_ssm);
        # forward applies it with causal_conv1d so the window can be carried as state.
        self.conv1d = nn.Conv1d(self.d_inner, self.d_inner, d_conv, groups=self.d_inner,
                                padding=d_conv - 1, bias=conv_bias)
        self.x_proj = nn.Linear(self.d_inner, self.dt_rank + 2 * d_state, bias=False)
        self.dt_proj = nn.Linear(self.dt_rank, self.d_inner, bias=True)

        # dt_proj weight: keeps the variance of dt_proj(dt) independent of dt_rank at init
        dt_init_std = self.dt_rank ** -0.5 * dt_scale
        if dt_init == "constant":
            nn.init.constant_(self.dt_proj.weight, dt_init_std)
        elif dt_init == "random":
            nn.init.uniform_(self.dt_proj.weight, -dt_init_std, dt_init_std)
        else:
            raise ValueError(f"Mamba: dt_init must be 'random' or 'constant', got {dt_init!r}")
        # dt_proj bias: softplus(bias) is a step size drawn log-uniformly in [dt_min, dt_max], so the
        # channels start with a spread of memory lengths; the bias is its inverse softplus.
        dt = torch.exp(torch.rand(self.d_inner) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
        dt = dt.clamp(min=dt_init_floor)
        with torch.no_grad():
            self.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # softplus^-1(dt), stable for small dt
        self.dt_proj.bias._no_reinit = True  # a model-level init that zeroes biases must skip this one

        # S4D-real init: A[d, k] = -(k + 1), stored as its log so that A = -exp(A_log) stays negative
        A = torch.arange(1, d_state + 1, dtype=torch.float32).repeat(self.d_inner, 1)
        self.A_log = nn.Parameter(torch.log(A))
        self.A_log._no_weight_decay = True
        self.D = nn.Parameter(torch.ones(self.d_inner))  # skip connection u -> y
        self.D._no_weight_decay = True
        self.out_proj = nn.Linear(self.d_inner, d_model, bias=bias)

    def forward(self, x, state=None):
        if state is None:
            state = self.zero_state(x.shape[0], x.device)
        xs, z = self.in_proj(x).chunk(2, dim=-1)  # [b, t, d_inner] each
        xs, conv_state = causal_conv1d(xs, self.conv1d.weight, self.conv1d.bias, state["conv"])
        xs = F.silu(xs)
        dt, B, C = self.x_proj(xs).split([self.dt_rank, self.d_state, self.d_state], dim=-1)
        delta = F.softplus(self.dt_proj(dt).float())  # softplus in float32: it sets the decay
        A = -torch.exp(self.A_log.float())
        impl = self.scan_impl
        if impl == "auto":
            impl = "triton" if x.is_cuda else "chunked"
        y, h = SELECTIVE_SCANS[impl](xs, delta, A, B, C, initial_state=state["h"])
        y = y + xs * self.D.to(y.dtype)
        y = y * F.silu(z)
        return self.out_proj(y), {"h": h, "conv": conv_state}

    def zero_state(self, batch_size, device):
        return {
            "h": torch.zeros(batch_size, self.d_inner, self.d_state, device=device),
            "conv": torch.zeros(batch_size, self.d_conv - 1, self.d_inner, device=device),
        }


# ----------------------------------------------------------------------------------------------
# Mamba-1 helpers
# ----------------------------------------------------------------------------------------------


def _check_selective_scan_args(name, u, delta, A, B, C, initial_state):
    """Raise ValueError naming the bad tensor and its expected shape; return (b, t, d, n)."""
    if u.dim() != 3:
        raise ValueError(f"{name}: u must have shape [b, t, d], got {list(u.shape)}")
    b, t, d = u.shape
    if A.dim() != 2 or A.shape[0] != d:
        raise ValueError(f"{name}: A must have shape [d, n] = [{d}, n], got {list(A.shape)}")
    n = A.shape[1]
    expected = {
        "delta": (delta, "[b, t, d]", [b, t, d]),
        "B": (B, "[b, t, n]", [b, t, n]),
        "C": (C, "[b, t, n]", [b, t, n]),
        "initial_state": (initial_state, "[b, d, n]", [b, d, n]),
    }
    for key, (x, symbols, shape) in expected.items():
        if x is not None and list(x.shape) != shape:
            raise ValueError(f"{name}: {key} must have shape {symbols} = {shape}, got {list(x.shape)}")
    named = {"u": u, "delta": delta, "A": A, "B": B, "C": C, "initial_state": initial_state}
    for key, x in named.items():
        if x is not None and not x.is_floating_point():
            raise ValueError(f"{name}: {key} must be a floating-point tensor, got {x.dtype}")
    return b, t, d, n


def _selective_scan_dtype(*tensors):
    # at least float32: bf16 inputs (autocast) are upcast so the state does not drift in low precision
    dtype = torch.float32
    for x in tensors:
        if x is not None:
            dtype = torch.promote_types(dtype, x.dtype)
    return dtype
