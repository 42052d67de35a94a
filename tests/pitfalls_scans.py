PITFALLS = [
    (1, "Exponentiating cs_i - cs_j before masking j > i", "ssm.py",
     """    segsum = (cs[..., :, None] - cs[..., None, :]).masked_fill(~causal, float("-inf"))  # cs_i - cs_j
    y = ((C @ B.transpose(-1, -2)) * segsum.exp()) @ dt_x  # scores [b, c, g, r, L, L]
""",
     """    decays = (cs[..., :, None] - cs[..., None, :]).exp().masked_fill(~causal, 0.0)  # exp, then mask
    y = ((C @ B.transpose(-1, -2)) * decays) @ dt_x  # scores [b, c, g, r, L, L]
"""),
    (1, "Mapping heads to groups with `repeat` instead of `repeat_interleave`", "ssm.py",
     """    (b, t, H, p), (g, n) = x.shape, B.shape[2:]
    out_dtype, dtype = x.dtype, compute_dtype(x, dt, A, B, C, initial_state)
""",
     """    B, C = (v.repeat(1, 1, x.shape[2] // v.shape[2], 1) for v in (B, C))  # head i reads group i % g
    (b, t, H, p), (g, n) = x.shape, B.shape[2:]
    out_dtype, dtype = x.dtype, compute_dtype(x, dt, A, B, C, initial_state)
"""),
    (1, "Padding with anything but dt = 0", "ssm.py",
     """        dt = F.pad(dt, (0, 0, 0, pad))
""",
     """        dt = F.pad(dt, (0, 0, 0, pad), value=1.0)
"""),
    (1, "Forgetting the initial state's contribution to the first chunk", "ssm.py",
     """        states_in.append(h)
""",
     """        states_in.append(h if c else torch.zeros_like(h))
"""),
    (1, "Decaying a chunk's incoming state", "ssm.py",
     """    y = y + (C @ states_in.transpose(-1, -2)) * decay_from_start[..., None]
""",
     """    y = y + (C @ states_in.transpose(-1, -2)) * chunk_decay
"""),
    (1, "Special-casing `initial_state=None` in a way that changes rounding", "ssm.py",
     """    h, states_in = h.reshape(b, g, r, p, n), []
    for c in range(nc):
        states_in.append(h)
        h = chunk_decay[:, c] * h + chunk_states[:, c]
    states_in = torch.stack(states_in, dim=1)  # the state entering each chunk [b, c, g, r, p, n]
""",
     """    if initial_state is None:  # nothing to carry: every boundary state at once, a masked matmul over chunks
        D = F.pad(cs[..., -1].cumsum(1), (0, 0, 0, 0, 1, 0))  # [b, c + 1, g, r]: log decay to each boundary
        later = torch.ones(nc + 1, nc, dtype=torch.bool).tril(-1)[:, :, None, None]  # boundary k > chunk e
        seg = (D[:, :, None] - D[:, None, 1:]).masked_fill(~later, float("-inf"))  # [b, k, e, g, r]
        every = torch.einsum("bkegr,begrpn->bkgrpn", seg.exp(), chunk_states)
        states_in, h = every[:, :nc], every[:, nc]
    else:
        h, states_in = h.reshape(b, g, r, p, n), []
        for c in range(nc):
            states_in.append(h)
            h = chunk_decay[:, c] * h + chunk_states[:, c]
        states_in = torch.stack(states_in, dim=1)  # the state entering each chunk [b, c, g, r, p, n]
"""),
    (1, "A loop over time", "ssm.py",
     """    (b, t, H, p), (g, n) = x.shape, B.shape[2:]
    out_dtype, dtype = x.dtype, compute_dtype(x, dt, A, B, C, initial_state)
""",
     """    return ssd_naive(x, dt, A, B, C, initial_state)  # one step at a time
    (b, t, H, p), (g, n) = x.shape, B.shape[2:]
    out_dtype, dtype = x.dtype, compute_dtype(x, dt, A, B, C, initial_state)
"""),
    (2, "The textbook factorisation (q exp(G)) (k exp(-G))^T", "gla.py",
     """    s = L  # leaf size: halved while some block decays by more than 20 nats
    while s > 1 and (before(G[..., s - 1::s, :]) - G[..., s - 1::s, :]).max() > 20.0:
        s //= 2
    half = L // 2
    while half >= s:  # levels: upper-half queries x lower-half keys, no mask needed
        blocks = lambda x: x.view(b, H, -1, 2, half, x.shape[-1])
        G_m = blocks(G)[:, :, :, 0, -1:]
        q_up = blocks(q)[:, :, :, 1] * (blocks(Gq)[:, :, :, 1] - G_m).exp()
        k_lo = blocks(k)[:, :, :, 0] * (G_m - blocks(G)[:, :, :, 0]).exp()
        blocks(o)[:, :, :, 1] += (q_up @ k_lo.transpose(-1, -2)) @ blocks(v)[:, :, :, 0]
        half //= 2
    if s > 1:  # leaves: all their pairs j <= i (j < i if shift) in one masked matmul
        leaves = lambda x: x.view(b, H, -1, s, x.shape[-1])
        ref = before(G[..., s - 1::s, :]).reshape(b, H, -1, 1, dk)  # G just before each leaf
        q_leaf = q_decayed if s == L else leaves(q) * (leaves(Gq) - ref).exp()
        scores = leaves(q_leaf) @ (leaves(k) * (ref - leaves(G)).exp()).transpose(-1, -2)
        drop = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1 - shift)  # pairs j > i (j >= i)
        o += (scores.masked_fill(drop, 0.0) @ leaves(v)).view_as(o)
    elif not shift:  # one-token leaves: only the pair j = i, which has no decay
        o += (q * k).sum(-1, keepdim=True) * v
""",
     """    scores = q_decayed @ (k * (-G).exp()).transpose(-1, -2)  # (q exp(Gq)) (k exp(-G))^T, one per chunk
    drop = torch.ones(L, L, dtype=torch.bool, device=q.device).triu(1 - shift)  # pairs j > i (j >= i)
    o += scores.masked_fill(drop, 0.0) @ v
"""),
    (2, "so the decay on the query side is G_{i-1}", "gla.py",
     """    Gq = before(G) if shift else G
""",
     """    Gq = G
"""),
    (2, "the in-chunk mask is strictly lower-triangular", "gla.py",
     """.triu(1 - shift)  # pairs j > i (j >= i)
""",
     """.triu(1)  # pairs j > i
"""),
    (2, "Decaying v instead of q and k", "gla.py",
     """    writes = (k * (G_last - G).exp()).transpose(-1, -2) @ v  # [b, H, chunk, dk, dv]
""",
     """    writes = k.transpose(-1, -2) @ (v * (G_last - G).exp())  # the decay on v's channels
"""),
    (2, "Padding g with anything but 0", "gla.py",
     """    def chunks(x):  # [b, t, H, d] -> [b, H, chunk, L, d]; padding with k = v = g = 0 keeps the state
        x = F.pad(x.to(dtype), (0, 0, 0, 0, 0, pad)) if pad else x.to(dtype)
        return x.view(b, -1, L, H, x.shape[-1]).permute(0, 3, 1, 2, 4).contiguous()
    before = lambda x: F.pad(x[..., :-1, :], (0, 0, 1, 0))  # x_{i-1}, 0 at the chunk start
    q, k, v, g = (chunks(x) for x in (q, k, v, g))
""",
     """    def chunks(x, value=0.0):  # [b, t, H, d] -> [b, H, chunk, L, d], padded with value
        x = F.pad(x.to(dtype), (0, 0, 0, 0, 0, pad), value=value) if pad else x.to(dtype)
        return x.view(b, -1, L, H, x.shape[-1]).permute(0, 3, 1, 2, 4).contiguous()
    before = lambda x: F.pad(x[..., :-1, :], (0, 0, 1, 0))  # x_{i-1}, 0 at the chunk start
    q, k, v, g = chunks(q), chunks(k), chunks(v), chunks(g, -1.0)
"""),
    (2, "Padding k, v with anything but 0", "gla.py",
     """    def chunks(x):  # [b, t, H, d] -> [b, H, chunk, L, d]; padding with k = v = g = 0 keeps the state
        x = F.pad(x.to(dtype), (0, 0, 0, 0, 0, pad)) if pad else x.to(dtype)
        return x.view(b, -1, L, H, x.shape[-1]).permute(0, 3, 1, 2, 4).contiguous()
    before = lambda x: F.pad(x[..., :-1, :], (0, 0, 1, 0))  # x_{i-1}, 0 at the chunk start
    q, k, v, g = (chunks(x) for x in (q, k, v, g))
""",
     """    def chunks(x, value=0.0):  # [b, t, H, d] -> [b, H, chunk, L, d], padded with value
        x = F.pad(x.to(dtype), (0, 0, 0, 0, 0, pad), value=value) if pad else x.to(dtype)
        return x.view(b, -1, L, H, x.shape[-1]).permute(0, 3, 1, 2, 4).contiguous()
    before = lambda x: F.pad(x[..., :-1, :], (0, 0, 1, 0))  # x_{i-1}, 0 at the chunk start
    q, k, v, g = chunks(q), chunks(k, 1.0), chunks(v, 1.0), chunks(g)
"""),
    (2, "A loop over time", "gla.py",
     """    (b, t, H, dk), dv = q.shape, v.shape[-1]  # chunk_size: a power of two (t need not be a multiple of it)
""",
     """    dtype = compute_dtype(q, k, v, g, initial_state)  # one step at a time: gla_naive, rwkv6_naive's loops
    q, k, v, decay = q.to(dtype), k.to(dtype), v.to(dtype), g.to(dtype).exp()
    b, t, H, dk = q.shape
    h = q.new_zeros(b, H, dk, v.shape[3]) if initial_state is None else initial_state.to(dtype)
    o = []
    for i in range(t):
        read = h  # shift: token i reads h_{i-1}
        h = decay[:, i, :, :, None] * h + k[:, i, :, :, None] * v[:, i, :, None, :]
        o.append(torch.einsum("bHk,bHkv->bHv", q[:, i], read if shift else h))
    return torch.stack(o, dim=1), h
    (b, t, H, dk), dv = q.shape, v.shape[-1]  # chunk_size: a power of two (t need not be a multiple of it)
"""),
    (9, "Leaving the previous input out of the state", "docs/course.py",
     """        x_prev = torch.cat([state["shift"][:, None], x[:, :-1]], 1)  # [b, t, d_model]
""",
     """        x_prev = torch.cat([torch.zeros_like(x[:, :1]), x[:, :-1]], 1)  # [b, t, d_model]
"""),
    (9, "Concatenating [x_{t-1}, x_t] in the other order", "docs/course.py",
     """        u = self.in_proj(torch.cat([x, x_prev], -1))  # [b, t, d_state]
""",
     """        u = self.in_proj(torch.cat([x_prev, x], -1))  # [b, t, d_state]
"""),
    (9, "Detaching the returned state", "docs/course.py",
     """{"h": h, "shift": x[:, -1]}
""",
     """{"h": h.detach(), "shift": x[:, -1].detach()}
"""),
]
