"""docs/INSTRUCTOR.md's pitfalls, each as a change of the reference inside its exercise's functions:
(exercise, a phrase of the pitfall's bullet, file, the reference's text, the pitfall's text). Graded, each
one fails its exercise's check (tests/test_course_kit.py)."""
PITFALLS = [
    (1, "Exponentiating cs_i - cs_j before masking j > i", "ssm.py",
     """    L = torch.exp((A_cumsum[..., :, None] - A_cumsum[..., None, :]).masked_fill(~causal, float("-inf")))
""",
     """    L = torch.exp(A_cumsum[..., :, None] - A_cumsum[..., None, :]).masked_fill(~causal, 0.0)  # exp, then mask
"""),
    (1, "Mapping heads to groups with `repeat` instead of `repeat_interleave`", "ssm.py",
     """    # reads its group's B and C), p headdim, n d_state.
    (b, t, H, p), (g, n) = x.shape, B.shape[2:]
""",
     """    # reads its group's B and C), p headdim, n d_state.
    B, C = (v.repeat(1, 1, x.shape[2] // v.shape[2], 1) for v in (B, C))  # head i reads group i % g
    (b, t, H, p), (g, n) = x.shape, B.shape[2:]
"""),
    (1, "Padding with anything but dt = 0", "ssm.py",
     """        dt = F.pad(dt, (0, 0, 0, pad))
""",
     """        dt = F.pad(dt, (0, 0, 0, pad), value=1.0)
"""),
    (1, "Forgetting the initial state's contribution to the first chunk", "ssm.py",
     """        states_in.append(h)
        h = decay * h + state
""",
     """        states_in.append(h if states_in else torch.zeros_like(h))
        h = decay * h + state
"""),
    (1, "Decaying a chunk's incoming state", "ssm.py",
     """    state_decay_out = torch.exp(A_cumsum)
""",
     """    state_decay_out = torch.exp(A_cumsum[..., -1:]).expand_as(A_cumsum)  # the whole chunk's decay
"""),
    (1, "Special-casing `initial_state=None` in a way that changes rounding", "ssm.py",
     """    h = h.reshape(b, g, r, p, n)
    states_in = []
    for decay, state in zip(decay_chunk, states.unbind(1)):
        states_in.append(h)
        h = decay * h + state
    states_in = torch.stack(states_in, dim=1)  # the state entering each chunk [b, c, g, r, p, n]
""",
     """    if initial_state is None:  # nothing to carry: every boundary state at once, a masked matmul over chunks
        D = F.pad(A_cumsum[..., -1].cumsum(-1), (1, 0))  # [b, g, r, c + 1]: log decay to each boundary
        later = torch.ones(nc + 1, nc, dtype=torch.bool).tril(-1)  # boundary k > chunk e
        seg = (D[..., :, None] - D[..., None, 1:]).masked_fill(~later, float("-inf"))  # [b, g, r, k, e]
        every = torch.einsum("bgrke,begrpn->bkgrpn", seg.exp(), states)
        states_in, h = every[:, :nc], every[:, nc]
    else:
        h = h.reshape(b, g, r, p, n)
        states_in = []
        for decay, state in zip(decay_chunk, states.unbind(1)):
            states_in.append(h)
            h = decay * h + state
        states_in = torch.stack(states_in, dim=1)  # the state entering each chunk [b, c, g, r, p, n]
"""),
    (1, "A loop over time", "ssm.py",
     """    # reads its group's B and C), p headdim, n d_state.
    (b, t, H, p), (g, n) = x.shape, B.shape[2:]
""",
     """    # reads its group's B and C), p headdim, n d_state.
    return ssd_naive(x, dt, A, B, C, initial_state)  # one step at a time
    (b, t, H, p), (g, n) = x.shape, B.shape[2:]
"""),
    (2, "The textbook factorisation (q exp(G)) (k exp(-G))^T", "gla.py",
     """    s = Q  # leaf size: halved while some block decays by more than 20 nats
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
""",
     """    scores = q_decayed @ (k * (-G).exp()).transpose(-1, -2)  # (q exp(Gq)) (k exp(-G))^T, one per chunk
    drop = torch.ones(Q, Q, dtype=torch.bool, device=q.device).triu(1 - shift)  # pairs j > i (j >= i)
    y += scores.masked_fill(drop, 0.0) @ v
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
     """    def chunks(x):  # [b, t, H, d] -> [b, H, chunk, Q, d]; padding with k = v = g = 0 keeps the state
        x = F.pad(x.to(dtype), (0, 0, 0, 0, 0, pad)) if pad else x.to(dtype)
        return x.view(b, -1, Q, H, x.shape[-1]).permute(0, 3, 1, 2, 4).contiguous()
    before = lambda x: F.pad(x[..., :-1, :], (0, 0, 1, 0))  # x_{i-1}, 0 at the chunk start
    q, k, v, g = (chunks(x) for x in (q, k, v, g))
""",
     """    def chunks(x, value=0.0):  # [b, t, H, d] -> [b, H, chunk, Q, d], padded with value
        x = F.pad(x.to(dtype), (0, 0, 0, 0, 0, pad), value=value) if pad else x.to(dtype)
        return x.view(b, -1, Q, H, x.shape[-1]).permute(0, 3, 1, 2, 4).contiguous()
    before = lambda x: F.pad(x[..., :-1, :], (0, 0, 1, 0))  # x_{i-1}, 0 at the chunk start
    q, k, v, g = chunks(q), chunks(k), chunks(v), chunks(g, -1.0)
"""),
    (2, "Padding k, v with anything but 0", "gla.py",
     """    def chunks(x):  # [b, t, H, d] -> [b, H, chunk, Q, d]; padding with k = v = g = 0 keeps the state
        x = F.pad(x.to(dtype), (0, 0, 0, 0, 0, pad)) if pad else x.to(dtype)
        return x.view(b, -1, Q, H, x.shape[-1]).permute(0, 3, 1, 2, 4).contiguous()
    before = lambda x: F.pad(x[..., :-1, :], (0, 0, 1, 0))  # x_{i-1}, 0 at the chunk start
    q, k, v, g = (chunks(x) for x in (q, k, v, g))
""",
     """    def chunks(x, value=0.0):  # [b, t, H, d] -> [b, H, chunk, Q, d], padded with value
        x = F.pad(x.to(dtype), (0, 0, 0, 0, 0, pad), value=value) if pad else x.to(dtype)
        return x.view(b, -1, Q, H, x.shape[-1]).permute(0, 3, 1, 2, 4).contiguous()
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
    ys = []
    for i in range(t):
        read = h  # shift: token i reads h_{i-1}
        h = decay[:, i, :, :, None] * h + k[:, i, :, :, None] * v[:, i, :, None, :]
        ys.append(torch.einsum("bHk,bHkv->bHv", q[:, i], read if shift else h))
    return torch.stack(ys, dim=1), h
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
    (3, "The off-by-one between logits and targets", "evaluate.py",
     "logits[:, :-1].float().transpose(1, 2), tokens[:, 1:]",
     "logits[:, :-1].float().transpose(1, 2), tokens[:, :-1]"),
    (3, "The off-by-one between logits and targets", "evaluate.py",
     "x[:, a + 1:b + 1]",
     "x[:, a:b]"),
    (3, "Resetting the state between chunks", "evaluate.py",   # each chunk read from the zero state
     "        for a, b, logits, _ in model.stream(lm, x[:, :-1], chunk_len):",
     """        for a in range(0, out.shape[1], chunk_len):
            b = min(a + chunk_len, out.shape[1])
            logits, _ = lm(x[:, a:b], None)"""),
    (3, "Not resetting the state between row blocks", "evaluate.py",
     """    out = torch.empty(tokens.shape[0], tokens.shape[1] - 1)
    for r in tqdm(range(0, len(tokens), batch_size), desc="ppl", disable=not progress):
        x = tokens[r:r + batch_size].to(model.device_of(lm))
        for a, b, logits, _ in model.stream(lm, x[:, :-1], chunk_len):""",
     """    out = torch.empty(tokens.shape[0], tokens.shape[1] - 1)
    state = None
    for r in tqdm(range(0, len(tokens), batch_size), desc="ppl", disable=not progress):
        x = tokens[r:r + batch_size].to(model.device_of(lm))
        for a in range(0, out.shape[1], chunk_len):
            b = min(a + chunk_len, out.shape[1])
            logits, state = lm(x[:, a:b], state)"""),
    (3, "bf16 logits into the cross-entropy", "evaluate.py",
     "logits[:, :-1].float().transpose(1, 2)",
     "logits[:, :-1].transpose(1, 2)"),
    (3, "bf16 logits into the cross-entropy", "evaluate.py",
     "F.cross_entropy(logits.float().mT,",
     "F.cross_entropy(logits.mT,"),
    (3, "Exp before the mean", "evaluate.py",
     "return sequence_nll(lm, tokens, chunk_len, batch_size).double().mean(0)",
     "return sequence_nll(lm, tokens, chunk_len, batch_size).double().exp().mean(0).log()"),
    (3, "Scoring each block of rows in one call", "evaluate.py",
     "model.stream(lm, x[:, :-1], chunk_len)",
     "model.stream(lm, x[:, :-1], x.shape[1])"),
    (4, "`>=` instead of `>`", "evaluate.py",
     "(ppl[t_star:] > ppl[t_star])",
     "(ppl[t_star:] >= ppl[t_star])"),
    (4, "Searching for the minimum over the whole curve", "evaluate.py",
     "t_star = int(ppl[:t_train].argmin())",
     "t_star = int(ppl.argmin())"),
    (4, "The last index of the minimum on ties", "evaluate.py",
     "t_star = int(ppl[:t_train].argmin())",
     "t_star = len(ppl[:t_train]) - 1 - int(ppl[:t_train].flip(0).argmin())"),
    (4, "Returning t - t*", "evaluate.py",
     "return t_star + int(above[0]) if len(above) else len(ppl)",
     "return int(above[0]) if len(above) else len(ppl)"),
    (4, "a tensor or a numpy integer instead of a Python int", "evaluate.py",
     "t_star = int(ppl[:t_train].argmin())",
     "t_star = ppl[:t_train].argmin()"),
    (5, "Calling the repo's streamed `effective_remembrance`", "evaluate.py",
     """    x = tokens[:, :T].to(model.device_of(lm))
""",
     """    return effective_remembrance(lm, tokens, T, cuts, distance)
"""),
    (5, "Running the suffix from the full context's state", "evaluate.py",
     "lm(x[:, t:])[0]",
     "lm(x[:, t:], lm(x)[1])[0]"),
    (5, "Comparing logits or log-probabilities instead of probabilities", "evaluate.py",
     """    p = lm(x)[0][:, -1].double().softmax(-1)  # float64 next-token distributions
    return torch.stack([d(p, lm(x[:, t:])[0][:, -1].double().softmax(-1)).clamp(0, 1).mean()""",
     """    p = lm(x)[0][:, -1].double()
    return torch.stack([d(p, lm(x[:, t:])[0][:, -1].double()).clamp(0, 1).mean()"""),
    (5, "Comparing logits or log-probabilities instead of probabilities", "evaluate.py",
     """    p = lm(x)[0][:, -1].double().softmax(-1)  # float64 next-token distributions
    return torch.stack([d(p, lm(x[:, t:])[0][:, -1].double().softmax(-1)).clamp(0, 1).mean()""",
     """    p = lm(x)[0][:, -1].double().log_softmax(-1)
    return torch.stack([d(p, lm(x[:, t:])[0][:, -1].double().log_softmax(-1)).clamp(0, 1).mean()"""),
    (5, "Not clamping", "evaluate.py",
     ".clamp(0, 1).mean()",
     ".mean()"),
    (5, "Sorting or de-duplicating the cuts", "evaluate.py",
     "for t in cuts.tolist()]).cpu()",
     "for t in sorted(cuts.tolist())]).cpu()"),
    (5, "Sorting or de-duplicating the cuts", "evaluate.py",
     "for t in cuts.tolist()]).cpu()",
     "for t in dict.fromkeys(cuts.tolist())]).cpu()"),
    (5, "Softmax in float32", "evaluate.py",
     """    p = lm(x)[0][:, -1].double().softmax(-1)  # float64 next-token distributions
    return torch.stack([d(p, lm(x[:, t:])[0][:, -1].double().softmax(-1)).clamp(0, 1).mean()""",
     """    p = lm(x)[0][:, -1].softmax(-1).double()
    return torch.stack([d(p, lm(x[:, t:])[0][:, -1].softmax(-1).double()).clamp(0, 1).mean()"""),
    (6, "The sample variance (N - 1)", "interventions.py",
     "h.var(1, unbiased=False)",
     "h.var(1)"),
    (6, "Pooling per element or per layer", "interventions.py",   # per element: over the batch only
     "self.var[i] = 0.9 * h.var(1, unbiased=False)",
     'self.var[i] = 0.9 * layer["h"].detach().float().cpu().var(0, unbiased=False).flatten(1).mean(1)'),
    (6, "Pooling per element or per layer", "interventions.py",   # per layer: one mean and variance
     "self.mu[i] = 0.9 * h.mean(1) + 0.1 * self.mu[i]\n"
     "            self.var[i] = 0.9 * h.var(1, unbiased=False) + 0.1 * self.var[i]",
     "self.mu[i] = 0.9 * h.mean() + 0.1 * self.mu[i]\n"
     "            self.var[i] = 0.9 * h.var(unbiased=False) + 0.1 * self.var[i]"),
    (6, "Swapping the weights", "interventions.py",
     "self.mu[i] = 0.9 * h.mean(1) + 0.1 * self.mu[i]\n"
     "            self.var[i] = 0.9 * h.var(1, unbiased=False) + 0.1 * self.var[i]",
     "self.mu[i] = 0.1 * h.mean(1) + 0.9 * self.mu[i]\n"
     "            self.var[i] = 0.1 * h.var(1, unbiased=False) + 0.9 * self.var[i]"),
    (6, "Drawing noise only when var > 0", "interventions.py",
     "noise = torch.randn(h.shape, generator=self.gen)",
     "noise = torch.randn(h.shape, generator=self.gen) if (var > 0).any() else torch.zeros(h.shape)"),
    (6, "Putting noise on the conv window or token shift", "interventions.py",   # Mamba's conv window
     'layer["h"] = (mu.view(shape) + var.sqrt().view(shape) * noise).to(h.device)',
     'layer["h"] = (mu.view(shape) + var.sqrt().view(shape) * noise).to(h.device)\n'
     '            if "conv" in layer:\n'
     '                layer["conv"] = var.mean().sqrt() * '
     'torch.randn(layer["conv"].shape, generator=self.gen)'),
    (6, "Putting noise on the conv window or token shift", "interventions.py",   # RWKV-6's token shifts
     'layer["h"] = (mu.view(shape) + var.sqrt().view(shape) * noise).to(h.device)',
     'layer["h"] = (mu.view(shape) + var.sqrt().view(shape) * noise).to(h.device)\n'
     '            for k in [k for k in ("shift", "ffn_shift") if k in layer]:\n'
     '                layer[k] = var.mean().sqrt() * torch.randn(layer[k].shape, generator=self.gen)'),
    (6, "Fitting random noise too", "interventions.py",
     "        if not self.fit:\n            return\n",
     ""),
    (7, "Not detaching", "interventions.py",
     "{k: v.detach().float() for k, v in layer.items()}",
     "{k: v.float() for k, v in layer.items()}"),
    (7, 'Resetting "h" only', "interventions.py",
     "{k: v * keep.to(v).view(-1, *[1] * (v.dim() - 1)) for k, v in layer.items()}",
     '{k: v * keep.to(v).view(-1, *[1] * (v.dim() - 1)) if k == "h" else v for k, v in layer.items()}'),
    (7, "Zeroing rows of `self.passed` in place", "interventions.py",
     "return [{k: v * keep.to(v).view(-1, *[1] * (v.dim() - 1)) for k, v in layer.items()}\n"
     "                for layer in self.passed]",
     "for layer in self.passed:\n"
     "            for v in layer.values():\n"
     "                v[~keep] = 0\n"
     "        return self.passed"),
    (7, "Drawing the reset mask before the first batch", "interventions.py",
     "        if self.passed is None:  # the first batch: the zero state\n"
     "            return None\n"
     "        if self.by_document:\n"
     "            keep = ~batch.new_doc\n"
     "        else:\n"
     "            keep = torch.rand(self.batch_size, generator=self.gen) >= self.p_reset",
     "        drawn = torch.rand(self.batch_size, generator=self.gen) >= self.p_reset\n"
     "        if self.passed is None:  # the first batch: the zero state\n"
     "            return None\n"
     "        if self.by_document:\n"
     "            keep = ~batch.new_doc\n"
     "        else:\n"
     "            keep = drawn"),
    (7, "Keeping the model's dtype", "interventions.py",
     "{k: v.detach().float() for k, v in layer.items()}",
     "{k: v.detach() for k, v in layer.items()}"),
    (8, "Leaving out the input check", "data.py",
     """    require(x.dim() == 2 and x.shape[1] >= 2 and not ((x < 0) | (x > k)).any() and not (x[:, 1:] == k).any(),
""",
     """    require(True,
"""),
    (8, "Counting the (eot, first token) pair as a bigram of the chain", "data.py",
     "counts[rows, prev, nxt] += (~at_start).double()",
     "counts[rows, prev, nxt] += 1"),
    (8, "Updating the counts before scoring the target", "data.py",
     "        row = counts[rows, prev] + prior[prev]   # [n, k] posterior pseudo-counts\n"
     "        nll[:, t] = torch.log(row.sum(-1)) - torch.log(row[rows, nxt])\n"
     "        nll[at_start, t] = math.log(k)\n"
     "        counts[rows, prev, nxt] += (~at_start).double()   # (eot, first token) is not a bigram of P\n",
     "        counts[rows, prev, nxt] += (~at_start).double()\n"
     "        row = counts[rows, prev] + prior[prev]   # [n, k] posterior pseudo-counts\n"
     "        nll[:, t] = torch.log(row.sum(-1)) - torch.log(row[rows, nxt])\n"
     "        nll[at_start, t] = math.log(k)\n"),
    (8, "A scalar alpha where `prior` is a [k, k] matrix", "data.py",
     "row = counts[rows, prev] + prior[prev]",
     "row = counts[rows, prev] + alpha"),
]
