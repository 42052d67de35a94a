"""
Evaluate recurrent LMs far past their training length: the paper's three measurements, and its
long-context tasks.

    python evaluate.py out/base/ckpt.pt out/sp/ckpt.pt --labels base sp
    python evaluate.py out/pk_zero out/pk_fitted --metrics passkey --passkey-lengths 1024,4096,16384,65536,262144

1. Position-wise perplexity, PPL(t) = exp( E_x[ -log q(x_{t+1} | x_{0..t}) ] ), and the verdict of
   Definition 3.2 (up to which length the model "length generalizes").
2. Effective Remembrance, EffRem_T(t) = d( q(.|x_{0:T}), q(.|x_{t:T}) ): how much the prediction
   after T tokens changes when the first t tokens are dropped.
3. State statistics: the spread of each head's matrix state "h" as a function of position.
4. (section 5) Task scores by greedy decoding from the zero state: passkey retrieval on a grid of total
   length x insertion depth (exact match, per-digit accuracy; heat map as the paper's Fig. 7), synthetic
   copying (per-character and whole-string accuracy per string length, Table 1), BABILong-style QA
   (accuracy per bAbI task and length, Fig. 6). --metrics defaults to the task a checkpoint was
   fine-tuned on (train.py --task), else ppl,effrem,state.

Everything works on any LM with the interface of model.LM:

    logits, final_state = lm(idx, state=None)    # idx [b, t]; state: list of per-layer dicts
    lm.zero_state(batch_size, device);  lm.cfg.vocab_size

and streams the sequence through the model in chunks, carrying the state. For a recurrent model that is
exact (lm(x) == lm(x[:, a:], state=lm(x[:, :a])[1])), and it is what makes long evaluations possible:
memory depends on the chunk length, never on the sequence length. Only the CLI needs model.py; only the
CLI and the task scores need tasks.py.

Position convention used throughout: entry i of a per-position curve is the prediction made at time
index i, i.e. after reading i + 1 tokens (its "context length" is i + 1). A model trained on windows of
t_train tokens has seen exactly the positions i < t_train; plots put context length on the x axis.
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

# ================================================================================================
# 1. Position-wise perplexity
# ================================================================================================


@torch.inference_mode()
def position_nll_stats(lm, tokens, chunk_len=None, batch_size=None, edges=None, progress=False):
    """Per-position negative log-likelihood of tokens [n, T], streamed.

    Returns a dict:
      mean [T-1]  entry i = mean over rows of -log q(tokens[:, i+1] | tokens[:, :i+1])  (float64)
      sem  [T-1]  standard error of that mean over the n rows (nan when n == 1)
      and, when `edges` (bucket boundaries over entry indices, see log_edges) are given,
      buckets     bucketize()'s summary of the per-sequence bucket-averaged NLL.

    The model sees chunk_len tokens at a time and carries its state; per chunk we keep only the
    [rows, chunk] NLLs (never [n, T, vocab] logits) and add them into per-position sums and sums of
    squares, so memory is O(chunk_len * vocab) for the logits plus O(T) numbers for the result.
    """
    tokens = _check_tokens(tokens, min_len=2, what="tokens")
    n, T = tokens.shape
    L = T - 1  # number of predictions
    device = _device_of(lm)
    batch_size = batch_size or n
    chunk_len = chunk_len or _auto_chunk_len(lm, min(n, batch_size))
    total = torch.zeros(L, dtype=torch.float64)
    total_sq = torch.zeros(L, dtype=torch.float64)
    if edges is not None:
        edges = _check_edges(edges, L)
        bucket_of = torch.bucketize(torch.arange(L), torch.as_tensor(edges[1:]), right=True)  # entry -> bucket
        bucket_sum = torch.zeros(n, len(edges) - 1, dtype=torch.float64)
    pieces = _pieces(L, chunk_len)
    bar = _tqdm(total=math.ceil(n / batch_size) * len(pieces), desc="ppl", disable=not progress)
    with _eval_mode(lm):
        for r0 in range(0, n, batch_size):
            rows = tokens[r0:r0 + batch_size].to(device)
            state = None  # zero initial state: the usual start of every sequence
            for a, b in pieces:
                logits, state = lm(rows[:, a:b], state)
                nll = F.cross_entropy(logits.float().transpose(1, 2), rows[:, a + 1:b + 1], reduction="none")
                nll = nll.double().cpu()  # [rows, b - a]
                total[a:b] += nll.sum(0)
                total_sq[a:b] += (nll * nll).sum(0)
                if edges is not None:
                    bucket_sum[r0:r0 + len(rows)].index_add_(1, bucket_of[a:b], nll)
                bar.update(1)
    bar.close()
    mean = total / n
    # sample variance from the sums; float64 keeps E[x^2] - E[x]^2 accurate at NLL scales (~1-10 nats)
    var = ((total_sq - n * mean * mean) / (n - 1)).clamp_min(0) if n > 1 else torch.full_like(mean, float("nan"))
    out = dict(mean=mean, sem=(var / n).sqrt())
    if edges is not None:
        sizes = torch.as_tensor(edges[1:]) - torch.as_tensor(edges[:-1])
        out["buckets"] = _summarize_buckets(bucket_sum / sizes, edges)
    return out


def position_nll(lm, tokens, chunk_len=None, batch_size=None):
    """Mean per-position NLL [T-1] of tokens [n, T] (see position_nll_stats). PPL(t) = exp(this)."""
    return position_nll_stats(lm, tokens, chunk_len=chunk_len, batch_size=batch_size)["mean"]


def perplexity(nll):
    """PPL from MEAN NLL. The order matters: exp(mean(nll)) is the paper's PPL(t); mean(exp(nll)) is
    not (by Jensen it is larger and dominated by the worst sequences)."""
    return torch.as_tensor(nll).exp()


def bucketize(nll, edges):
    """Log-spaced position buckets from a per-sequence, per-position NLL matrix nll [n, L].

    Within each bucket [lo, hi) we first average each sequence's NLL over the positions (one number per
    sequence), then average over sequences (mean NLL -> PPL = exp(mean)), and take the standard error
    over sequences. Averaging within a sequence first gives the right error bar: positions of one
    sequence are strongly correlated, so treating them as independent samples would understate it.
    """
    nll = torch.as_tensor(nll, dtype=torch.float64)
    if nll.dim() != 2:
        raise ValueError(f"bucketize: nll must have shape [n, L], got {list(nll.shape)}")
    edges = _check_edges(edges, nll.shape[1])
    per_seq = torch.stack([nll[:, lo:hi].mean(1) for lo, hi in zip(edges[:-1], edges[1:])], 1)
    return _summarize_buckets(per_seq, edges)


def _summarize_buckets(per_seq, edges):
    # per_seq [n, K]: each sequence's mean NLL in each bucket
    n = per_seq.shape[0]
    nll = per_seq.mean(0)
    nll_sem = per_seq.std(0) / math.sqrt(n) if n > 1 else torch.full_like(nll, float("nan"))
    ppl = nll.exp()
    return dict(
        lo=list(edges[:-1]), hi=list(edges[1:]),   # entry indices [lo, hi): context lengths lo+1 .. hi
        nll=nll, nll_sem=nll_sem,
        ppl=ppl, ppl_sem=ppl * nll_sem,             # delta method: d exp(x) = exp(x) dx
    )


def log_edges(length, per_octave=2, include=()):
    """Bucket boundaries over entry indices 0..length-1, log-spaced: 0, 1, 2, 3, 4, 6, 8, 12, 16, ...
    (per_octave=2), ending at `length`. `include` adds boundaries (e.g. t_train, so that no bucket
    straddles the end of the training positions)."""
    if length < 1:
        raise ValueError(f"log_edges: length must be >= 1, got {length}")
    edges = {0, length}
    k = 0
    while True:
        e = round(2 ** (k / per_octave))
        if e >= length:
            break
        edges.add(e)
        k += 1
    edges.update(int(e) for e in include if 0 < e < length)
    return sorted(edges)


# ================================================================================================
# 2. Length generalization (Definition 3.2)
# ================================================================================================


def length_generalization(ppl, t_train, tolerance=None, sem=None, k=2.0, lo=None, hi=None):
    """Definition 3.2 on a PPL curve: p* = min PPL over training positions (at t*); the model generalizes
    to T if PPL(t) <= p* for every t in [t*, T].

    ppl: per-bucket values (pass the bucket ranges lo, hi from bucketize) or raw per-position values
    (lo/hi omitted: entry i covers [i, i+1)). Use buckets: a raw per-position curve is noisy enough
    (one sequence sample per position) that some single late position almost always pokes above p*,
    and p* itself, a minimum over many noisy values, is biased low; both make the raw verdict
    mostly a statement about noise. A bucket counts as "training" when it ends by t_train (hi <= t_train).

    The "<= p*" test is made with a noise allowance, since two estimates of the same PPL differ by
    their sampling error: PPL(t) <= p* + tol(t), where
      tolerance=None (default): tol(t) = k * sqrt(sem(t)^2 + sem(t*)^2) from the measured standard errors
                                (0 when sem is not given: the literal definition);
      tolerance=float:          a fixed allowance in PPL units.
    Returns dict(p_star, t_star (first entry of the minimum bucket), generalizes_to (the largest context
    length T such that every bucket from t* up to T passes), ratio = generalizes_to / t_train,
    censored = True when it passed up to the end of the curve, so the true T may be larger).
    """
    ppl = torch.as_tensor(ppl, dtype=torch.float64).flatten()
    K = len(ppl)
    lo = torch.arange(K) if lo is None else torch.as_tensor(lo)
    hi = lo + 1 if hi is None else torch.as_tensor(hi)
    if not (len(lo) == len(hi) == K):
        raise ValueError(f"length_generalization: ppl, lo, hi must have equal lengths, got {K}, {len(lo)}, {len(hi)}")
    if t_train < 1:
        raise ValueError(f"length_generalization: t_train must be >= 1, got {t_train}")
    train = (hi <= t_train).nonzero().flatten()
    if len(train) == 0:
        raise ValueError(f"length_generalization: no bucket lies within the training positions (< {t_train}); "
                         "use edges that include t_train (log_edges(..., include=[t_train]))")
    j_star = int(train[ppl[train].argmin()])
    p_star = float(ppl[j_star])
    if tolerance is not None:
        tol = torch.full((K,), float(tolerance), dtype=torch.float64)
    elif sem is not None:
        sem = torch.as_tensor(sem, dtype=torch.float64).flatten().nan_to_num(0.0)
        tol = k * (sem ** 2 + sem[j_star] ** 2).sqrt()
    else:
        tol = torch.zeros(K, dtype=torch.float64)
    ok = ppl <= p_star + tol
    last = j_star
    while last + 1 < K and bool(ok[last + 1]):
        last += 1
    T = int(hi[last])
    rule = (f"ppl <= p* + {float(tolerance):g}" if tolerance is not None else
            f"ppl <= p* + {k:g} * sqrt(sem^2 + sem(t*)^2)" if sem is not None else "ppl <= p*")
    return dict(p_star=p_star, t_star=int(lo[j_star]), generalizes_to=T, ratio=T / t_train,
                censored=last == K - 1, t_train=int(t_train), rule=rule)


# ================================================================================================
# 3. Effective Remembrance
# ================================================================================================

# d(p, q) between next-token distributions [..., V]; all are 0 exactly when p == q elementwise.
def _tv(p, q):
    return (0.5 * (p - q).abs().sum(-1)).clamp(0.0, 1.0)


def _js(p, q):
    # Jensen-Shannon divergence with natural log lies in [0, ln 2]; we divide by ln 2 so that, like TV,
    # it lies in [0, 1] (equivalently: JS in bits).
    m = 0.5 * (p + q)
    kl_pm = (torch.xlogy(p, p) - torch.xlogy(p, m)).sum(-1)
    kl_qm = (torch.xlogy(q, q) - torch.xlogy(q, m)).sum(-1)
    return (0.5 * (kl_pm + kl_qm) / math.log(2)).clamp(0.0, 1.0)


def _cos(p, q):
    # 1 - cos(p, q) written as 0.5 * |p/|p| - q/|q||^2: the same number, without the cancellation of
    # 1 - (something close to 1); for probability vectors it lies in [0, 1].
    return (0.5 * (F.normalize(p, dim=-1) - F.normalize(q, dim=-1)).pow(2).sum(-1)).clamp(0.0, 1.0)


DISTANCES = {"tv": _tv, "js": _js, "cos": _cos}  # d(p [..., V], q [..., V]) -> [...]


@torch.inference_mode()
def effective_remembrance_naive(lm, tokens, T, cuts, distance="tv"):
    """The definition, one forward per cut: mean over rows of d(q(.|x[0:T]), q(.|x[t:T])) for each t.
    Slow (len(cuts) separate passes); kept as the readable reference for the batched version below."""
    tokens, cuts, dist = _check_effrem(tokens, T, cuts, distance)
    device = _device_of(lm)
    x = tokens[:, :T].to(device)
    with _eval_mode(lm):
        p = _last_probs(lm(x)[0])
        return torch.stack([dist(p, _last_probs(lm(x[:, t:])[0])).mean() for t in cuts.tolist()]).cpu()


@torch.inference_mode()
def effective_remembrance(lm, tokens, T, cuts, distance="tv", batch_size=None, chunk_len=None, reduce=True,
                          progress=False):
    """EffRem_T(t) for every cut t, in one batched streaming pass. tokens [n, >= T]; cuts in [0, T-1].

    Returns [len(cuts)], the mean over rows (reduce=False: [n, len(cuts)], e.g. for error bars).
    Only the distribution at the LAST position (predicting token T) is compared.

    How: every suffix x[t:T] ends at T, and a recurrent model's run on it is the full run with the state
    reset to zero at time t. So we walk over time once, splitting it at the sorted cut points; when we
    reach cut t, the rows of that cut join the batch with a zero state (the state tensors of all
    layers get n new zero rows, every key: "h", conv windows, token shifts). Rows never compute tokens
    before their own cut, so the total work equals the len(cuts) separate forwards (sum_t n * (T - t)
    tokens), but it is done in ~len(cuts) + T/chunk_len batched calls instead of len(cuts) sequential
    passes. The reference q(.|x[0:T]) is read from the t = 0 rows themselves, so EffRem_T(0) = d(p, p)
    = 0 exactly (the distances are exactly 0 for identical inputs). This is equivalent to running all
    n*len(cuts) rows from time 0 and multiplying their states by a 0/1 mask at each cut, without
    computing the prefixes that the mask would throw away.
    Memory: batch_size bounds the number of sequences per pass; each pass holds n_cuts * batch rows.
    """
    tokens, cuts, dist = _check_effrem(tokens, T, cuts, distance)
    n = tokens.shape[0]
    device = _device_of(lm)
    # The t = 0 rows are the reference q(.|x[0:T]); add them if the caller did not ask for t = 0.
    starts = sorted(set(cuts.tolist()) | {0})
    batch_size = batch_size or _auto_rows(lm, len(starts)) or n
    chunk_len = chunk_len or _auto_chunk_len(lm, min(n, batch_size) * len(starts), logits=False)
    pieces = _pieces(T, chunk_len, stops=starts)
    out = torch.zeros(n, len(cuts), dtype=torch.float64)
    bar = _tqdm(total=math.ceil(n / batch_size) * len(pieces), desc="effrem", disable=not progress)
    with _eval_mode(lm):
        for r0 in range(0, n, batch_size):
            x = tokens[r0:r0 + batch_size, :T].to(device)
            m = len(x)
            state, n_active = None, 0  # rows [k*m, (k+1)*m) hold the suffix starting at starts[k]
            for a, b in pieces:
                while n_active < len(starts) and starts[n_active] == a:  # a suffix starts here: zero state
                    zero = lm.zero_state(m, device)
                    state = zero if state is None else _cat_states(state, zero)
                    n_active += 1
                logits, state = lm(x[:, a:b].repeat(n_active, 1), state, last_only=True)
                bar.update(1)
            p = _last_probs(logits).view(len(starts), m, -1)  # [starts, rows, V]
            ref = p[0]
            for j, t in enumerate(cuts.tolist()):
                out[r0:r0 + m, j] = dist(ref, p[starts.index(t)]).cpu()
    bar.close()
    return out.mean(0) if reduce else out


def default_cuts(T, n_cuts=32):
    """Cut points for EffRem_T: 0, then log-spaced from the start (a failing model already jumps when a
    tiny prefix is removed) and log-spaced toward T (where a healthy model rises), sorted, unique."""
    if T < 2:
        raise ValueError(f"default_cuts: T must be >= 2, got {T}")
    half = max(1, (n_cuts - 1) // 2)
    early = torch.logspace(0, math.log10(max(1, T // 2)), half).round().long()
    late = T - torch.logspace(0, math.log10(max(1, T // 2)), n_cuts - 1 - half).round().long()
    return torch.cat([torch.tensor([0]), early, late]).clamp(0, T - 1).unique()


# ================================================================================================
# 4. State statistics
# ================================================================================================


@torch.inference_mode()
def state_statistics(lm, tokens, positions=None, chunk_len=None, batch_size=None, t_train=None, progress=False):
    """Spread of every layer's matrix state "h" per head as a function of position (paper Fig. 4).

    positions: time indices i at which to read the state after tokens[:, :i+1] (default: log-spaced up
    to T-1). The model hands out its state only at the end of a forward, so the stream is split at
    exactly those positions (plus chunk_len pieces to bound memory).
    For each layer l, head h and position: std and RMS of h[:, head, ...] over the batch and all the
    non-head dims pooled (the same pooling as the Fitted Noise intervention).

    coverage (when t_train is given): per head, mean std over the late positions (context >= 4*t_train)
    divided by the largest std seen within training positions (context <= t_train). The paper does not
    define such a number; ours reads: ~1 or below, late states stay within the spread training produced;
    >> 1, the state keeps drifting into a range training never visited (the unexplored-states
    hypothesis). nan when no position reaches 4*t_train.
    Returns dict(positions [P], std / rms: one [P, heads] tensor per layer, coverage: one [heads] per layer).
    """
    tokens = _check_tokens(tokens, min_len=1, what="tokens")
    n, T = tokens.shape
    if positions is None:  # log-spaced context lengths 1, 2, 3, 4, 6, 8, ..., T -> time indices
        positions = torch.as_tensor(log_edges(T)[1:]) - 1
    positions = torch.as_tensor(positions).long().flatten().unique()
    if len(positions) == 0 or positions.min() < 0 or positions.max() >= T:
        raise ValueError(f"state_statistics: positions must lie in [0, {T - 1}], got {positions.tolist()}")
    device = _device_of(lm)
    batch_size = batch_size or n
    chunk_len = chunk_len or _auto_chunk_len(lm, min(n, batch_size), logits=False)
    ends = (positions + 1).tolist()
    pieces = _pieces(ends[-1], chunk_len, stops=ends)
    sums = None  # per layer: [P, heads, 3] float64 = (count, sum, sum of squares)
    bar = _tqdm(total=math.ceil(n / batch_size) * len(pieces), desc="state", disable=not progress)
    with _eval_mode(lm):
        for r0 in range(0, n, batch_size):
            x = tokens[r0:r0 + batch_size].to(device)
            state = None
            for a, b in pieces:
                _, state = lm(x[:, a:b], state, last_only=True)
                bar.update(1)
                if b not in ends:
                    continue
                hs = [s["h"] for s in state if "h" in s]
                if sums is None:
                    sums = [torch.zeros(len(ends), h.shape[1], 3, dtype=torch.float64) for h in hs]
                p = ends.index(b)
                for acc, h in zip(sums, hs):
                    h = h.double().transpose(0, 1).reshape(h.shape[1], -1)  # [heads, batch * rest]
                    acc[p] += torch.stack([torch.full((h.shape[0],), float(h.shape[1]), dtype=torch.float64,
                                                      device=h.device), h.sum(1), (h * h).sum(1)], 1).cpu()
    bar.close()
    if sums is None:
        raise ValueError("state_statistics: the model's state has no 'h' entry in any layer")
    std, rms = [], []
    for acc in sums:
        cnt, s, sq = acc.unbind(-1)
        mean = s / cnt
        std.append(((sq - cnt * mean * mean) / (cnt - 1).clamp_min(1)).clamp_min(0).sqrt())
        rms.append((sq / cnt).sqrt())
    out = dict(positions=positions, std=std, rms=rms)
    if t_train is not None:
        ctx = positions + 1
        early, late = ctx <= t_train, ctx >= 4 * t_train
        out["coverage"] = [
            (s[late].mean(0) / s[early].amax(0)) if early.any() and late.any()
            else torch.full((s.shape[1],), float("nan"), dtype=torch.float64) for s in std]
    return out


# ================================================================================================
# 5. Long-context tasks (the paper's Sec. 5): passkey retrieval, synthetic copying, BABILong
# ================================================================================================
# A task is scored by greedy decoding of its answer from the zero state, as a user would run the model.
# The prompt is streamed in chunks, carrying the state (memory does not grow with its length, so 256k-token
# haystacks fit); then the answer is decoded one token at a time from the carried state. For a recurrent
# model, reading token t+1 with the state after x[:, :t+1] is the same computation as reading x[:, :t+2]
# at once (lm(x) == lm(x[:, a:], state=lm(x[:, :a])[1])), so this is exactly argmax decoding of the full
# sequence, at a constant cost per new token. The examples and their scores come from tasks.py; every
# example of one length has the same number of tokens, so a whole grid row is decoded as one batch.
# Seeds: sample i of a cell is a pure function of (seed, cell, i), and of neither the length nor the model,
# so the same keys / strings / stories are asked at every length and of every checkpoint.


@torch.inference_mode()
def greedy_answer(lm, prompt_tokens, max_new_tokens, stop_tokens=(), chunk_len=None):
    """Greedy continuation of prompt_tokens [T] or [b, T] (rows of equal length) from the zero state.
    Returns one list of token ids per row: the argmax tokens up to and including the first token of
    stop_tokens, at most max_new_tokens of them."""
    prompts = torch.as_tensor(prompt_tokens)
    prompts = _check_tokens(prompts[None] if prompts.dim() == 1 else prompts, min_len=1, what="prompt_tokens")
    if max_new_tokens < 1:
        raise ValueError(f"greedy_answer: max_new_tokens must be >= 1, got {max_new_tokens}")
    b, T = prompts.shape
    device = _device_of(lm)
    chunk_len = chunk_len or _auto_chunk_len(lm, b, logits=False)
    is_stop = torch.zeros(lm.cfg.vocab_size, dtype=torch.bool)
    is_stop[[t for t in stop_tokens if 0 <= t < lm.cfg.vocab_size]] = True
    new, done = [], torch.zeros(b, dtype=torch.bool)
    with _eval_mode(lm):
        state = None
        for a, e in _pieces(T, chunk_len):
            logits, state = lm(prompts[:, a:e].to(device), state, last_only=True)
        while True:
            token = logits[:, -1].argmax(-1)
            new.append(token.cpu())
            done |= is_stop[new[-1]]
            if done.all() or len(new) == max_new_tokens:
                break
            logits, state = lm(token[:, None], state)   # one step from the carried state
    out = []
    for row in torch.stack(new, 1).tolist():  # rows that stopped early were decoded on: cut them
        stops = [i for i, t in enumerate(row) if is_stop[t]]
        out.append(row[:stops[0] + 1] if stops else row)
    return out


def answer_stop_tokens(tokenizer, texts=(".", "\n")):
    """Token ids at which an answer ends: every token whose text contains one of `texts` (our answers end
    with a period; a newline ends them too, as in tasks.cut_answer), and the end-of-text token."""
    import tasks

    enc = tasks._encoding(tokenizer)
    return _stop_tokens(enc, tuple(t.encode() for t in texts))


def _stop_tokens(enc, texts):
    key = (enc.name, texts)
    if key not in _STOP_CACHE:
        ids = {enc.eot_token}
        for t in range(enc.n_vocab):
            try:
                piece = enc.decode_single_token_bytes(t)
            except KeyError:  # unused ids between a BPE's ranks and its special tokens
                continue
            if any(s in piece for s in texts):
                ids.add(t)
        _STOP_CACHE[key] = frozenset(ids)
    return _STOP_CACHE[key]


_STOP_CACHE = {}


def passkey_samples(tokenizer, length, depths, n_per_cell, seed=0):
    """[len(depths)][n_per_cell] tasks.passkey_sample's of `length` tokens; sample i at depth j has
    seed [seed, j, i], so every length asks the same keys."""
    import tasks

    return [[tasks.passkey_sample(tokenizer, length, depth=float(d), seed=[seed, j, i]) for i in range(n_per_cell)]
            for j, d in enumerate(depths)]


def copy_samples(tokenizer, length, n, seed=0):
    """n tasks.copy_sample's of strings of `length` symbols (2 * length + 3 tokens), seeds [seed, length, i]."""
    import tasks

    return [tasks.copy_sample(tokenizer, int(length), seed=[seed, int(length), i]) for i in range(n)]


def babilong_samples(tokenizer, task, length, n, seed=0, filler=None):
    """n tasks.babi_sample's of one bAbI task and length. Sample i has seed [seed, k, i] (k = the task's
    index in tasks.BABI_TASKS): the same story at every length. A story too long for `length` is replaced
    by the story of seed [seed, k, i, retry] (rare at length >= 512 with the bytes tokenizer)."""
    import tasks

    k = list(tasks.BABI_TASKS).index(task)
    out = []
    for i in range(n):
        for retry in range(100):
            try:
                out.append(tasks.babi_sample(task, tokenizer, int(length), filler_tokens=filler,
                                             seed=[seed, k, i] + ([retry] if retry else [])))
                break
            except ValueError as e:
                if "too short" not in str(e):
                    raise
        else:
            raise ValueError(f"babilong: no {task} story fits in {length} tokens: use longer lengths (>= 512 with bytes)")
    return out


def _decode_samples(lm, samples, stop, batch_size=None, chunk_len=None, slack=2, bar=None):
    """Greedy answers (token lists, in the order of samples), `slack` tokens beyond the longest answer at
    most. Samples whose prompts have equal lengths are decoded together, batch_size rows at a time;
    prompts are never padded (a recurrent model would carry the padding in its state)."""
    import tasks

    prompts, answers = zip(*(tasks.split_answer(s) for s in samples))
    groups = {}
    for i, p in enumerate(prompts):
        groups.setdefault(len(p), []).append(i)
    out = [None] * len(samples)
    for rows in groups.values():
        step = batch_size or len(rows)
        for r0 in range(0, len(rows), step):
            idx = rows[r0:r0 + step]
            max_new = max(len(answers[i]) for i in idx) + slack
            batch = torch.as_tensor(np.stack([prompts[i] for i in idx]))
            for i, pred in zip(idx, greedy_answer(lm, batch, max_new, stop, chunk_len)):
                out[i] = pred
            if bar is not None:
                bar.update(len(idx))
    return out


def passkey_grid(lm, tokenizer, lengths, depths=10, n_per_cell=4, seed=0, batch_size=None, chunk_len=None,
                 progress=False):
    """Passkey retrieval on a grid of total lengths x insertion depths (paper Fig. 7).

    depths: a number of evenly spaced depths in [0, 1] (10 as the paper) or a list of them.
    Returns dict(lengths, depths, actual_depth [L][D] (mean depth after snapping to a sentence boundary; short
    lengths have few boundaries),
    exact [L][D] (exact-match accuracy of the decoded key), digits [L][D] (per-digit accuracy), n_per_cell,
    exact_mean [L] (over depths))."""
    import tasks

    depths = [float(d) for d in (torch.linspace(0, 1, depths).tolist() if isinstance(depths, int) else depths)]
    stop = answer_stop_tokens(tokenizer)
    enc = tasks._encoding(tokenizer)
    exact, digits, actual = [], [], []
    bar = _tqdm(total=len(lengths) * len(depths) * n_per_cell, desc="passkey", disable=not progress)
    for L in lengths:
        grid = passkey_samples(tokenizer, L, depths, n_per_cell, seed)
        flat = [s for row in grid for s in row]
        preds = [enc.decode(p) for p in _decode_samples(lm, flat, stop, batch_size, chunk_len, bar=bar)]
        em = [float(tasks.exact_match(tasks.cut_answer(p), s.meta["answer"])) for p, s in zip(preds, flat)]
        dg = [tasks.passkey_digit_accuracy(p, s.meta["key"]) for p, s in zip(preds, flat)]
        exact.append([sum(em[j * n_per_cell:(j + 1) * n_per_cell]) / n_per_cell for j in range(len(depths))])
        digits.append([sum(dg[j * n_per_cell:(j + 1) * n_per_cell]) / n_per_cell for j in range(len(depths))])
        actual.append([sum(s.meta["actual_depth"] for s in row) / n_per_cell for row in grid])
    bar.close()
    return dict(lengths=[int(L) for L in lengths], depths=depths, actual_depth=actual, exact=exact, digits=digits,
                n_per_cell=n_per_cell, exact_mean=[sum(r) / len(r) for r in exact])


def copy_accuracy(lm, tokenizer, lengths, n=16, seed=0, batch_size=None, chunk_len=None, progress=False):
    """Synthetic copying (paper Table 1): the model reads eot s SEP and must write s (then EOS).

    Per length: char accuracy (fraction of positions right, decoding len(s) + 1 tokens or up to EOS)
    and whole-string accuracy. Returns dict(lengths, char_mean, char_std (spread over the n strings),
    char_sem, whole_mean, char [L][n] per string)."""
    import tasks

    enc = tasks._encoding(tokenizer)
    stop = {enc.encode_single_token(tasks.COPY_EOS), enc.eot_token}
    out = dict(lengths=[int(L) for L in lengths], char_mean=[], char_std=[], char_sem=[], whole_mean=[], char=[], n=n)
    bar = _tqdm(total=len(lengths) * n, desc="copy", disable=not progress)
    for L in lengths:
        samples = copy_samples(tokenizer, L, n, seed)
        preds = _decode_samples(lm, samples, stop, batch_size, chunk_len, slack=0, bar=bar)
        scores = [tasks.copy_scores(p, s.meta["target"]) for p, s in zip(preds, samples)]
        char = torch.tensor([c for c, _ in scores], dtype=torch.float64)
        std = float(char.std()) if n > 1 else float("nan")
        out["char"].append(char.tolist())
        out["char_mean"].append(float(char.mean()))
        out["char_std"].append(std)
        out["char_sem"].append(std / math.sqrt(n))
        out["whole_mean"].append(sum(w for _, w in scores) / n)
    bar.close()
    return out


def babilong_accuracy(lm, tokenizer, babi_tasks, lengths, n=8, seed=0, filler=None, batch_size=None, chunk_len=None,
                      progress=False):
    """BABILong-style QA (paper Fig. 6): exact-match accuracy of the decoded answer per bAbI task and length.
    filler: a token stream to hide the stories in (e.g. the corpus's validation split), or None for
    tasks.py's own filler sentences. Returns dict(tasks, lengths, acc {task: [L]}, mean [L] (over tasks))."""
    import tasks

    enc = tasks._encoding(tokenizer)
    stop = answer_stop_tokens(tokenizer)
    acc = {t: [] for t in babi_tasks}
    bar = _tqdm(total=len(lengths) * len(babi_tasks) * n, desc="babilong", disable=not progress)
    for L in lengths:
        samples = [s for t in babi_tasks for s in babilong_samples(tokenizer, t, L, n, seed, filler)]
        preds = [enc.decode(p) for p in _decode_samples(lm, samples, stop, batch_size, chunk_len, bar=bar)]
        ok = [float(tasks.exact_match(tasks.cut_answer(p), s.meta["answer"])) for p, s in zip(preds, samples)]
        for k, t in enumerate(babi_tasks):
            acc[t].append(sum(ok[k * n:(k + 1) * n]) / n)
    bar.close()
    mean = [sum(acc[t][j] for t in babi_tasks) / len(babi_tasks) for j in range(len(lengths))]
    return dict(tasks=list(babi_tasks), lengths=[int(L) for L in lengths], acc=acc, mean=mean, n=n)


# ================================================================================================
# CLI
# ================================================================================================

LM_METRICS = ("ppl", "effrem", "state")          # on windows of the LM data
TASK_METRICS = ("passkey", "copy", "babilong")   # greedy decoding of task answers (section 5)
METRICS = LM_METRICS + TASK_METRICS


def main(argv=None):
    args = _parse_args(argv)
    try:
        report = run(args)
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        # bad inputs: one line naming the problem and the fix, no traceback
        print(f"evaluate.py: error: {e}", file=sys.stderr)
        return 2
    _print_table(report)
    return 0


def _parse_args(argv):
    ap = argparse.ArgumentParser(
        description="Position-wise perplexity, Definition 3.2 verdict, Effective Remembrance and state "
                    "statistics of recurrent LM checkpoints, evaluated far past their training length.")
    ap.add_argument("ckpts", nargs="+", metavar="CKPT",
                    help="checkpoint files (train.py's ckpt.pt) or directories holding one, or official Mamba dirs")
    ap.add_argument("--metrics", default=None,
                    help="comma-separated subset of %s. Default: the task the checkpoints were fine-tuned on "
                         "(train_config['task']: passkey, copy or babilong), else ppl,effrem,state" % ",".join(METRICS))
    ap.add_argument("--eval-len", type=int, default=None,
                    help="tokens per evaluation window (default: 16 x the largest t_train); must exceed t_train")
    ap.add_argument("--n-seqs", type=int, default=64,
                    help="number of evaluation windows (sequences); error bars shrink as 1/sqrt(n) (default: 64)")
    ap.add_argument("--chunk-len", type=int, default=None,
                    help="tokens per forward while streaming; bounds memory, not the result "
                         "(default: automatic, ~64 MB of logits per chunk)")
    ap.add_argument("--batch-size", type=int, default=None,
                    help="sequences per forward (default: all n-seqs at once)")
    ap.add_argument("--t-train", type=int, default=None,
                    help="training length T_train for every checkpoint (default: train_config['seq_len'] "
                         "stored in each checkpoint)")
    ap.add_argument("--data", default=None,
                    help="data set name for tasks.load_data (default: train_config['data'] of the checkpoints)")
    ap.add_argument("--tokenizer", default=None,
                    help="tokenizer name for tasks.load_data (default: train_config['tokenizer'])")
    ap.add_argument("--data-seed", type=int, default=None,
                    help="seed of tasks.load_data's train/val split (default: train_config['seed'], else 0); "
                         "must match training, or validation windows may come from training documents")
    ap.add_argument("--effrem-len", type=int, default=None,
                    help="T of EffRem_T: the context whose next-token prediction is compared "
                         "(default: 4 x t_train as in the paper, capped at eval-len)")
    ap.add_argument("--effrem-cuts", type=int, default=32, help="number of cut points t for EffRem (default: 32)")
    ap.add_argument("--distance", default="tv", choices=sorted(DISTANCES),
                    help="EffRem distance: tv (paper default), js (Jensen-Shannon / ln 2), cos (1 - cosine)")
    ap.add_argument("--out", default="out/eval", help="directory for eval.json and the PNG plots (default: out/eval)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the evaluation window sampling (default: 0)")
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                    help="auto = cuda when available, else cpu (default: auto)")
    ap.add_argument("--labels", nargs="+", default=None,
                    help="one display name per checkpoint (default: the checkpoint's directory name)")
    g = ap.add_argument_group("long-context tasks (--metrics passkey,copy,babilong): greedy answers from the zero state")
    g.add_argument("--task-samples", type=int, default=8,
                   help="examples per passkey cell (length x depth), per copy length, per bAbI task and length (default: 8)")
    g.add_argument("--passkey-lengths", default="128,256,512,1024,2048,4096",
                   help="comma-separated total lengths in tokens (default: 128..4096 for a CPU; the paper goes to 262144)")
    g.add_argument("--passkey-depths", type=int, default=10, help="number of evenly spaced insertion depths in [0, 1] (default: 10)")
    g.add_argument("--copy-lengths", default=None,
                   help="comma-separated string lengths (default: train_config['copy_len'] ends and 300, else 50,100,300)")
    g.add_argument("--babi-lengths", default="512,1024,2048,4096",
                   help="comma-separated total lengths in tokens (default: 512..4096; stories need ~470 with bytes)")
    g.add_argument("--babi-tasks", default=None,
                   help="comma-separated bAbI tasks (default: train_config['babi_tasks'], else qa1,...,qa10)")
    g.add_argument("--babi-filler", default="corpus", choices=["corpus", "ours"],
                   help="text the stories hide in: corpus = the validation split of --data (as training), ours = "
                        "tasks.py's filler sentences (default: corpus)")
    return ap.parse_args(argv)


def run(args):
    """The CLI's work, callable from Python with an argparse-like namespace; returns the report dict."""
    if args.metrics is None:  # what the checkpoints were trained for
        trained = {_train_config(p).get("task", "lm") for p in args.ckpts if os.path.exists(p)}
        args.metrics = trained.pop() if len(trained) == 1 and trained & set(TASK_METRICS) else ",".join(LM_METRICS)
    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()]
    bad = [m for m in metrics if m not in METRICS]
    if bad or not metrics:
        raise ValueError(f"unknown metric(s) {bad or args.metrics!r}: --metrics takes a comma-separated subset of {','.join(METRICS)}")
    if args.task_samples < 1:
        raise ValueError(f"--task-samples must be >= 1, got {args.task_samples}")
    if args.passkey_depths < 1:
        raise ValueError(f"--passkey-depths must be >= 1, got {args.passkey_depths}")
    if args.labels is not None and len(args.labels) != len(args.ckpts):
        raise ValueError(f"--labels has {len(args.labels)} names for {len(args.ckpts)} checkpoints: give one per checkpoint")
    if args.n_seqs < 1:
        raise ValueError(f"--n-seqs must be >= 1, got {args.n_seqs}")
    for flag in ("chunk_len", "batch_size", "eval_len", "t_train", "effrem_len"):
        v = getattr(args, flag)
        if v is not None and v < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 1, got {v}")
    for p in args.ckpts:
        if not os.path.exists(p):
            raise FileNotFoundError(f"checkpoint {p} does not exist: check the path (train.py writes <out_dir>/ckpt.pt)")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda but no CUDA device is available: use --device cpu or auto")
    device = "cuda" if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available()) else "cpu"

    labels = args.labels or [_default_label(p) for p in args.ckpts]
    train_cfgs = [_train_config(p) for p in args.ckpts]
    lm_metrics = [m for m in metrics if m in LM_METRICS]
    t_trains = []
    for p, tc in zip(args.ckpts, train_cfgs):
        # copy examples have no fixed length (--seq-len does not apply): their training lengths are copy_len
        t = args.t_train or (tc.get("seq_len") if tc.get("task") != "copy" or lm_metrics else None)
        if lm_metrics and (not isinstance(t, int) or t < 1):
            raise ValueError(f"{p}: no train_config['seq_len'] in the checkpoint: pass --t-train N")
        t_trains.append(t if isinstance(t, int) else None)
    tokenizer = _agree(args.ckpts, train_cfgs, "tokenizer", "--tokenizer NAME", required=False, override=args.tokenizer)
    report = dict(args=vars(args), tokenizer=tokenizer, device=device, models=[])
    # the data seed decides the train/val split of a corpus: needed for LM windows and babilong's filler only
    needs_split = lm_metrics or ("babilong" in metrics and args.babi_filler == "corpus")
    data_seed = (_agree(args.ckpts, train_cfgs, "seed", "--data-seed N", required=False, override=args.data_seed)
                 or 0) if needs_split else 0
    if lm_metrics:
        eval_len = args.eval_len or 16 * max(t_trains)
        if eval_len <= max(t_trains):
            raise ValueError(f"--eval-len {eval_len} must be larger than t_train ({max(t_trains)}): "
                             f"try --eval-len {16 * max(t_trains)}")
        data_name = _agree(args.ckpts, train_cfgs, "data", "--data NAME", override=args.data)
        # +1: windows of eval_len + 1 tokens give eval_len predictions, context lengths 1 .. eval_len
        windows, optimal = load_eval_windows(data_name, tokenizer, args.n_seqs, eval_len + 1, args.seed, data_seed)
        edges_all = log_edges(eval_len, per_octave=2, include=t_trains)
        report.update(data=data_name, eval_len=eval_len, n_seqs=len(windows))
        if optimal is not None:
            report["optimal"] = dict(nll=optimal.tolist(), buckets=_jsonable(bucketize(optimal[None], edges_all)))
    task_setup = _task_setup(args, metrics, train_cfgs, tokenizer or "bytes", data_seed)
    report.update({k: v for k, v in task_setup.items() if k != "filler"})

    import model  # imported here: the metric functions above need only an LM object

    for path, label, t_train, tc in zip(args.ckpts, labels, t_trains, train_cfgs):
        lm = model.from_pretrained(path, device=device)
        if lm_metrics and int(windows.max()) >= lm.cfg.vocab_size:
            raise ValueError(f"{path}: data token ids reach {int(windows.max())} but the model's vocab_size is "
                             f"{lm.cfg.vocab_size}: evaluate on the data/tokenizer the model was trained with")
        task = tc.get("task", "lm")
        res = dict(label=label, path=path, arch=lm.cfg.arch, params=lm.num_params(), t_train=t_train, task=task)
        trained_on = f"copy of lengths {tc.get('copy_len')}" if task == "copy" else f"{task}, t_train {t_train}"
        print(f"[{label}] {lm.cfg.arch}, {lm.num_params():,} params, trained on {trained_on}"
              + (f", eval_len {eval_len}" if lm_metrics else ""))
        t0 = time.time()
        if "ppl" in metrics:
            st = position_nll_stats(lm, windows, args.chunk_len, args.batch_size, edges=edges_all, progress=True)
            bk = st["buckets"]
            verdict = length_generalization(bk["ppl"], t_train, sem=bk["ppl_sem"], lo=bk["lo"], hi=bk["hi"])
            res["ppl"] = _jsonable(dict(nll=st["mean"], nll_sem=st["sem"], buckets=bk))
            res["verdict"] = verdict
            if "optimal" in report:  # same windows, so the mean gap is the difference of the means
                floor = report["optimal"]["buckets"]["nll"]
                res["gap"] = dict(nll=[a - b for a, b in zip(res["ppl"]["buckets"]["nll"], floor)],
                                  nll_sem=res["ppl"]["buckets"]["nll_sem"], hi=res["ppl"]["buckets"]["hi"])
        if "effrem" in metrics:
            T = min(args.effrem_len or 4 * t_train, eval_len)
            cuts = default_cuts(T, args.effrem_cuts)
            per_row = effective_remembrance(lm, windows, T, cuts, args.distance, args.batch_size, args.chunk_len,
                                            reduce=False, progress=True)
            sem = per_row.std(0) / math.sqrt(len(per_row)) if len(per_row) > 1 else torch.zeros(len(cuts))
            res["effrem"] = _jsonable(dict(T=T, distance=args.distance, cuts=cuts, mean=per_row.mean(0), sem=sem))
        if "state" in metrics:
            positions = torch.as_tensor(log_edges(eval_len, per_octave=2, include=[t_train])[1:]) - 1
            ss = state_statistics(lm, windows, positions, args.chunk_len, args.batch_size, t_train, progress=True)
            res["state"] = _jsonable(ss)
        if any(m in TASK_METRICS for m in metrics):
            n_vocab = tasks_vocab(tokenizer or "bytes")
            if n_vocab > lm.cfg.vocab_size:
                raise ValueError(f"{path}: tokenizer {tokenizer or 'bytes'!r} has {n_vocab} tokens but the model's "
                                 f"vocab_size is {lm.cfg.vocab_size}: pass the --tokenizer the model was trained with")
        common = dict(seed=args.seed, batch_size=args.batch_size, chunk_len=args.chunk_len, progress=True)
        if "passkey" in metrics:
            res["passkey"] = passkey_grid(lm, tokenizer or "bytes", task_setup["passkey_lengths"], args.passkey_depths,
                                          args.task_samples, **common)
        if "copy" in metrics:
            res["copy"] = copy_accuracy(lm, tokenizer or "bytes", task_setup["copy_lengths"], args.task_samples, **common)
            res["copy"]["trained_on"] = tc.get("copy_len") if task == "copy" else None  # "LO,HI" string lengths
        if "babilong" in metrics:
            res["babilong"] = babilong_accuracy(lm, tokenizer or "bytes", task_setup["babi_tasks"],
                                                task_setup["babi_lengths"], args.task_samples,
                                                filler=task_setup["filler"], **common)
        res["seconds"] = round(time.time() - t0, 2)
        report["models"].append(res)
        del lm

    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "eval.json"), "w") as f:
        json.dump(report, f, indent=1)
    report["files"] = [os.path.join(args.out, "eval.json")] + _plot(report, args.out)
    return report


def _task_setup(args, metrics, train_cfgs, tokenizer, data_seed):
    """The lengths / tasks / filler of the task metrics, from the flags, else the checkpoints' train_config."""
    setup = {}
    if "passkey" in metrics:
        setup["passkey_lengths"] = _int_list(args.passkey_lengths, "--passkey-lengths")
    if "copy" in metrics:
        spec = args.copy_lengths
        if spec is None:
            ranges = {tc.get("copy_len") for tc in train_cfgs if tc.get("task") == "copy" and tc.get("copy_len")}
            spec = ",".join(sorted({*map(str, _int_list(ranges.pop(), "copy_len")), "300"}, key=int)) \
                if len(ranges) == 1 else "50,100,300"
        setup["copy_lengths"] = _int_list(spec, "--copy-lengths")
    if "babilong" in metrics:
        import tasks

        setup["babi_lengths"] = _int_list(args.babi_lengths, "--babi-lengths")
        spec = args.babi_tasks or _agree(args.ckpts, train_cfgs, "babi_tasks", "--babi-tasks", required=False) \
            or ",".join(tasks.BABI_TASKS)
        setup["babi_tasks"] = [t.strip() for t in spec.split(",") if t.strip()]
        bad = [t for t in setup["babi_tasks"] if t not in tasks.BABI_TASKS]
        if bad or not setup["babi_tasks"]:
            raise ValueError(f"unknown --babi-tasks {bad or spec!r}: use a subset of {','.join(tasks.BABI_TASKS)}")
        setup["filler"], setup["babi_filler"] = None, "ours"
        if args.babi_filler == "corpus":
            name = _agree(args.ckpts, train_cfgs, "data", "--data NAME", required=False, override=args.data) or "stdlib"
            data = tasks.load_data(name, tokenizer=tokenizer, seed=data_seed)
            if data.tokenizer is None:
                raise ValueError(f"babilong: {data.name} is a synthetic process, not text to hide stories in: "
                                 f"pass --data stdlib (or a text path) or --babi-filler ours")
            # the validation split: training hid its stories in the train split
            setup["filler"], setup["babi_filler"] = data.val, f"{data.name} (val split)"
    return setup


def _int_list(spec, flag):
    try:
        values = [int(v) for v in str(spec).split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise ValueError(f"{flag} must be a comma-separated list of positive integers, got {spec!r}")
    return values


def tasks_vocab(tokenizer):
    import tasks

    return tasks._encoding(tokenizer).n_vocab


def load_eval_windows(data_name, tokenizer, n, length, seed, data_seed=0):
    """[n, length] int64 evaluation windows of the validation split, and the Bayes-optimal per-position
    NLL [length - 1] (mean over the windows) when the data set knows it (synthetic processes), else None.
    The only place that talks to tasks.py.

    data_seed must be the TRAINING run's seed: for text it decides which documents are validation
    documents, so another seed would evaluate on training documents. `seed` picks the windows.
    Text: windows start anywhere, as train.py's RandomWindows (the model's training distribution at
    t < t_train). Processes with an exact floor: windows start at a document start (its eot), which
    the floor needs.
    """
    import tasks

    data = tasks.load_data(data_name, tokenizer=tokenizer or "bytes", seed=data_seed)
    exact = getattr(data, "optimal_nll", None) is not None
    windows = torch.as_tensor(tasks.eval_windows(data.val, n, length, seed=seed,
                                                 eot_token=data.eot_token if exact else None)).long()
    optimal = None
    if exact:
        try:
            opt = torch.as_tensor(data.optimal_nll(windows), dtype=torch.float64)
        except ValueError as e:
            raise ValueError(f"no exact loss floor for windows of {length} tokens of {data.name} ({e}): "
                             f"use a shorter --eval-len (at most the process's document length)") from None
        optimal = opt.mean(0) if opt.dim() == 2 else opt
    return windows, optimal


# --- CLI helpers ----------------------------------------------------------------------------------


def _train_config(path):
    """train.py's arguments stored in our checkpoints ({} when absent or unreadable: official Mamba dirs)."""
    f = os.path.join(path, "ckpt.pt") if os.path.isdir(path) else path
    if not os.path.isfile(f):
        return {}
    try:
        ck = torch.load(f, map_location="cpu", weights_only=True)
    except Exception:
        return {}  # model.from_pretrained will report what is wrong with the file
    tc = ck.get("train_config") if isinstance(ck, dict) else None
    return tc if isinstance(tc, dict) else {}


def _agree(paths, cfgs, key, flag, required=True, override=None):
    # one value of a train_config key for all checkpoints (they must be evaluated on the same data)
    if override is not None:
        return override
    vals = {c.get(key) for c in cfgs if c.get(key) is not None}
    if len(vals) > 1:
        raise ValueError(f"the checkpoints were trained with different {key} ({sorted(map(str, vals))}): "
                         f"pass {flag} to evaluate all on the same data")
    if not vals:
        if required:
            raise ValueError(f"{paths[0]}: no train_config['{key}'] in the checkpoint: pass {flag}")
        return None
    return vals.pop()


def _default_label(path):
    path = os.path.normpath(path)
    if os.path.basename(path) == "ckpt.pt":
        path = os.path.dirname(path)
    return os.path.basename(path) or path


def _print_table(report):
    models = report["models"]
    if any("ppl" in m for m in models):
        bk = next(m for m in models if "ppl" in m)["ppl"]["buckets"]
        # show the power-of-two buckets only: enough to see the shape in a terminal
        cols = [j for j, h in enumerate(bk["hi"]) if h & (h - 1) == 0 and h >= 2 or j == len(bk["hi"]) - 1]
        print("\nPPL per bucket (context length up to):")
        print(f"{'model':<16}" + "".join(f"{bk['hi'][j]:>9}" for j in cols) + "   verdict (Def. 3.2)")
        for m in models:
            if "ppl" not in m:
                continue
            ppl, v = m["ppl"]["buckets"]["ppl"], m["verdict"]
            more = "+" if v["censored"] else ""
            print(f"{m['label']:<16}" + "".join(f"{ppl[j]:>9.3f}" for j in cols)
                  + f"   p*={v['p_star']:.3f} -> T={v['generalizes_to']}{more} ({v['ratio']:.1f}x t_train={m['t_train']})")
        if "optimal" in report:
            ob = report["optimal"]["buckets"]["ppl"]
            print(f"{'(optimal)':<16}" + "".join(f"{ob[j]:>9.3f}" for j in cols))
            # The gap to the exact floor shows a failure that perplexity alone can hide: a model that stops
            # improving past T_train while the Bayes predictor keeps learning from its growing context.
            print("\nGap to the Bayes floor, mean NLL - optimal NLL (nats/token) per bucket, +- s.e. of the model's NLL:")
            print(f"{'model':<16}" + "".join(f"{bk['hi'][j]:>14}" for j in cols))
            for m in models:
                if "gap" in m:
                    g, e = m["gap"]["nll"], m["gap"]["nll_sem"]
                    print(f"{m['label']:<16}" + "".join(f"{g[j]:>8.3f}+-{e[j]:.3f}" for j in cols))
    if any("effrem" in m for m in models):
        print("\nEffective Remembrance EffRem_T(t) at t/T = 1/T, 1/4, 1/2, 3/4, (T-1)/T:")
        for m in models:
            if "effrem" not in m:
                continue
            e, T = m["effrem"], m["effrem"]["T"]
            pick = [min(range(len(e["cuts"])), key=lambda j: abs(e["cuts"][j] - t)) for t in (1, T // 4, T // 2, 3 * T // 4, T - 1)]
            print(f"{m['label']:<16} T={T:<6} " + "  ".join(f"t={e['cuts'][j]}:{e['mean'][j]:.3f}" for j in pick))
    if any("state" in m for m in models):
        print("\nState coverage (late std / max std within t_train), most drifting head per layer:")
        for m in models:
            if "state" in m:
                cov = m["state"].get("coverage", [])
                best = [max(c, key=_nan_low) for c in cov]
                print(f"{m['label']:<16} " + "  ".join(f"L{l}:{'n/a' if b is None else f'{b:.2f}'}" for l, b in enumerate(best))
                      + ("" if any(b is not None for b in best) else "   (eval-len < 4 x t_train)"))
    if any("passkey" in m for m in models):
        print("\nPasskey exact match (rows: insertion depth, columns: total length; per-digit accuracy in brackets "
              "on the mean row):")
        for m in models:
            if "passkey" not in m:
                continue
            pk = m["passkey"]
            print(f"{m['label']} (trained on {m['task']}, t_train {m['t_train']}, {pk['n_per_cell']} per cell)")
            print(f"{'  depth':<12}" + "".join(f"{L:>10}" for L in pk["lengths"]))
            for j, d in enumerate(pk["depths"]):
                print(f"  {d:<10.2f}" + "".join(f"{pk['exact'][i][j]:>10.2f}" for i in range(len(pk["lengths"]))))
            digit_mean = [sum(r) / len(r) for r in pk["digits"]]
            print(f"{'  mean':<12}" + "".join(f"{e:>5.2f}[{d:.2f}]" for e, d in zip(pk["exact_mean"], digit_mean)))
    if any("copy" in m for m in models):
        first = next(m for m in models if "copy" in m)["copy"]
        print(f"\nCopying: char accuracy mean +- std over {first['n']} strings / whole-string accuracy, per string length:")
        print(f"{'model':<16}" + "".join(f"{L:>22}" for L in first["lengths"]))
        for m in models:
            if "copy" in m:
                c = m["copy"]
                print(f"{m['label']:<16}" + "".join(f"{mu:>9.3f} +- {_fmt(sd):<5} / {w:.2f}" for mu, sd, w
                                                    in zip(c["char_mean"], c["char_std"], c["whole_mean"])))
    if any("babilong" in m for m in models):
        print("\nBABILong exact-match accuracy per task (columns: total length):")
        for m in models:
            if "babilong" not in m:
                continue
            b = m["babilong"]
            print(f"{m['label']} ({b['n']} per task and length)")
            print(f"{'  task':<12}" + "".join(f"{L:>8}" for L in b["lengths"]))
            for t in b["tasks"]:
                print(f"  {t:<10}" + "".join(f"{a:>8.2f}" for a in b["acc"][t]))
            print(f"{'  mean':<12}" + "".join(f"{a:>8.2f}" for a in b["mean"]))
    print("\nwrote " + ", ".join(report.get("files", [])))


def _fmt(v):
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3f}"


def _plot(report, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    models = report["models"]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    if any("ppl" in m for m in models):
        # With a known floor (synthetic data), a second panel shows the gap to it: the failure past
        # T_train and the fix read off directly, instead of as small differences between falling curves.
        with_gap = any("gap" in m for m in models)
        fig, axes = plt.subplots(1, 2 if with_gap else 1, figsize=(13 if with_gap else 7, 4.5), squeeze=False)
        ax = axes[0, 0]
        for i, m in enumerate(m for m in models if "ppl" in m):
            c = colors[i % len(colors)]
            bk = m["ppl"]["buckets"]
            x = [math.sqrt((lo + 1) * hi) for lo, hi in zip(bk["lo"], bk["hi"])]  # geometric middle of the bucket
            y, e = torch.tensor(bk["ppl"]), torch.tensor([v if v is not None else 0.0 for v in bk["ppl_sem"]])
            ax.plot(x, y, color=c, label=f"{m['label']} (T={m['verdict']['generalizes_to']})")
            ax.fill_between(x, y - e, y + e, color=c, alpha=0.25)
            ax.axvline(m["t_train"], color=c, ls=":", lw=1)
        if "optimal" in report:
            ob = report["optimal"]["buckets"]
            ax.plot([math.sqrt((lo + 1) * hi) for lo, hi in zip(ob["lo"], ob["hi"])], ob["ppl"], "k--", lw=1,
                    label="Bayes-optimal")
        lows, highs = zip(*[(min(m["ppl"]["buckets"]["ppl"]), max(m["ppl"]["buckets"]["ppl"])) for m in models if "ppl" in m])
        if "optimal" in report:
            lows += (min(report["optimal"]["buckets"]["ppl"]),)
        # log y only when the curves span a wide range (e.g. an untrained model above the Bayes floor)
        ax.set_yscale("log" if max(highs) > 5 * min(lows) else "linear")
        ax.set(xscale="log", xlabel="context length (tokens read; dotted: T_train)", ylabel="perplexity",
               title="Position-wise perplexity (bands: +-1 s.e.)")
        ax.legend(fontsize=8)
        if with_gap:
            ax = axes[0, 1]
            for i, m in enumerate(m for m in models if "ppl" in m):
                if "gap" not in m:
                    continue
                bk, c = m["ppl"]["buckets"], colors[i % len(colors)]
                x = [math.sqrt((lo + 1) * hi) for lo, hi in zip(bk["lo"], bk["hi"])]
                y = torch.tensor(m["gap"]["nll"])
                e = torch.tensor([v if v is not None else 0.0 for v in m["gap"]["nll_sem"]])
                ax.plot(x, y, color=c, label=m["label"])
                ax.fill_between(x, y - e, y + e, color=c, alpha=0.25)
                ax.axvline(m["t_train"], color=c, ls=":", lw=1)
            ax.axhline(0, color="k", ls="--", lw=1)
            ax.set(xscale="log", xlabel="context length (tokens read; dotted: T_train)",
                   ylabel="model NLL - Bayes NLL (nats/token)", title="Gap to the Bayes floor (0 = optimal)")
            ax.legend(fontsize=8)
        files.append(_save(fig, out, "ppl.png"))
    if any("effrem" in m for m in models):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for i, m in enumerate(m for m in models if "effrem" in m):
            e = m["effrem"]
            y, s = torch.tensor(e["mean"]), torch.tensor([v if v is not None else 0.0 for v in e["sem"]])
            ax.plot(e["cuts"], y, "o-", ms=3, color=colors[i % len(colors)], label=f"{m['label']} (T={e['T']})")
            ax.fill_between(e["cuts"], y - s, y + s, color=colors[i % len(colors)], alpha=0.25)
            ax.axvline(e["T"] - m["t_train"], color=colors[i % len(colors)], ls=":", lw=1)
        ax.set(xlabel="t (first t tokens dropped; dotted: T - T_train)", ylabel=f"EffRem_T(t)  [{e['distance']}]",
               ylim=(-0.02, 1.02), title="Effective Remembrance")
        ax.legend(fontsize=8)
        files.append(_save(fig, out, "effrem.png"))
    if any("state" in m for m in models):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for i, m in enumerate(m for m in models if "state" in m):
            st, c = m["state"], colors[i % len(colors)]
            x = [p + 1 for p in st["positions"]]
            # the 3 heads (over all layers) that drift most, by coverage, else by late/early std ratio
            cands = []
            for l, s in enumerate(st["std"]):
                s = torch.tensor(s)
                score = st["coverage"][l] if "coverage" in st else (s[-1] / s[0].clamp_min(1e-12)).tolist()
                cands += [(_nan_low(score[h]), l, h) for h in range(s.shape[1])]
            for k, (_, l, h) in enumerate(sorted(cands, reverse=True)[:3]):
                ax.plot(x, [row[h] for row in st["std"][l]], color=c, ls=["-", "--", "-."][k],
                        label=f"{m['label']} L{l} h{h}")
            ax.axvline(m["t_train"], color=c, ls=":", lw=1)
        ax.set(xscale="log", yscale="log", xlabel="context length (dotted: T_train)", ylabel="std of state h",
               title="State spread of the most drifting heads")
        ax.legend(fontsize=7)
        files.append(_save(fig, out, "state.png"))
    with_pk = [m for m in models if "passkey" in m]
    if with_pk:
        # the paper's Fig. 7: total length on x, insertion depth on y, exact-match accuracy as colour
        fig, axes = plt.subplots(1, len(with_pk), figsize=(1.2 + 4.2 * len(with_pk), 4.2), squeeze=False,
                                 layout="constrained")
        for ax, m in zip(axes[0], with_pk):
            pk = m["passkey"]
            acc = np.array(pk["exact"]).T  # [depths, lengths]
            im = ax.imshow(acc, origin="upper", aspect="auto", cmap="RdYlGn", vmin=0, vmax=1)
            ax.set_xticks(range(len(pk["lengths"])), [_short(L) for L in pk["lengths"]], rotation=45)
            ax.set_yticks(range(len(pk["depths"])), [f"{d:.2f}" for d in pk["depths"]])
            if m.get("t_train"):  # lengths right of the dotted line are longer than training
                past = sum(L <= m["t_train"] for L in pk["lengths"])
                if 0 < past < len(pk["lengths"]):
                    ax.axvline(past - 0.5, color="k", ls=":", lw=1.5)
            ax.set(xlabel="total length (tokens)", ylabel="insertion depth",
                   title=f"{m['label']} (T_train={m['t_train']})")
        fig.colorbar(im, ax=axes[0].tolist(), label="exact match")
        files.append(_save(fig, out, "passkey.png", tight=False))
    if any("copy" in m for m in models):
        # the paper's Table 1 as a curve: char accuracy against string length, the trained range shaded
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for i, m in enumerate(m for m in models if "copy" in m):
            cp, c = m["copy"], colors[i % len(colors)]
            ax.errorbar(cp["lengths"], cp["char_mean"], yerr=cp["char_sem"], fmt="o-", ms=3, capsize=2, color=c,
                        label=m["label"])
            if cp.get("trained_on"):
                lo, hi = (int(v) for v in cp["trained_on"].split(","))
                ax.axvspan(lo, hi, color=c, alpha=0.1)
        ax.set(ylim=(-0.02, 1.02), xlabel="string length (shaded: lengths seen in training)",
               ylabel="char accuracy (+- s.e.)", title="Synthetic copying")
        ax.legend(fontsize=8)
        files.append(_save(fig, out, "copy.png"))
    if any("babilong" in m for m in models):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for i, m in enumerate(m for m in models if "babilong" in m):
            b, c = m["babilong"], colors[i % len(colors)]
            ax.plot(b["lengths"], b["mean"], "o-", color=c, label=f"{m['label']} ({','.join(b['tasks'])})"[:60])
            if m.get("t_train"):
                ax.axvline(m["t_train"], color=c, ls=":", lw=1)
        ax.set(xscale="log", ylim=(-0.02, 1.02), xlabel="total length (tokens; dotted: T_train)",
               ylabel="accuracy (mean over tasks)", title="BABILong")
        lengths = sorted({L for m in models if "babilong" in m for L in m["babilong"]["lengths"]})
        ax.set_xticks(lengths, [_short(L) for L in lengths])
        ax.minorticks_off()
        ax.legend(fontsize=8)
        files.append(_save(fig, out, "babilong.png"))
    return files


def _short(L):
    return f"{L // 1024}k" if L >= 1024 and L % 1024 == 0 else str(L)


def _save(fig, out, name, tight=True):
    path = os.path.join(out, name)
    if tight:
        fig.tight_layout()
    fig.savefig(path, dpi=120)
    import matplotlib.pyplot as plt
    plt.close(fig)
    return path


def _nan_low(v):
    # sort key that puts missing values (None / nan) last
    return -math.inf if v is None or (isinstance(v, float) and math.isnan(v)) else v


def _jsonable(x):
    # tensors -> lists; nan (e.g. a standard error from one sequence) -> null, so the file is strict JSON
    if isinstance(x, torch.Tensor):
        return _jsonable(x.tolist())
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


# ================================================================================================
# Benchmark (called by bench.py --what eval)
# ================================================================================================


def benchmark(arch="mamba2", lengths=(8192, 131072), n_seqs=2, chunk_len=1024, effrem_len=1024, n_cuts=32, effrem_seqs=8,
              device="cpu", repeats=3):
    """Cost of the streaming evaluation on an untrained `tiny` model (cost does not depend on weights).

    Memory: peak RSS of position_nll at each length, each in a fresh process (a process's peak RSS
    cannot be reset), next to the RSS after a short warm-up call; streaming should keep the peak
    ~flat in the length. Time: effective_remembrance (one batched pass) vs effective_remembrance_naive
    (one forward of each suffix x[t:T]) vs len(cuts) full-length forwards of x[:T], and whether the
    first two agree. work_in_full_forwards = sum over the suffixes of (T - t) / T: the exact method
    cannot do less (each cut's state is its own), batched or not. Returns a dict of the numbers.
    """
    import subprocess
    out = dict(arch=arch, n_seqs=n_seqs, chunk_len=chunk_len, memory=[])
    for L in lengths:
        code = (f"import evaluate, json; print(json.dumps(evaluate._bench_memory({arch!r}, {L}, {n_seqs}, "
                f"{chunk_len}, {device!r})))")
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           cwd=os.path.dirname(os.path.abspath(__file__)))
        if r.returncode != 0:
            raise RuntimeError(f"benchmark at length {L} failed: {r.stderr.strip().splitlines()[-1:]}")
        out["memory"].append(json.loads(r.stdout.strip().splitlines()[-1]))
    lm, x = _bench_model(arch, effrem_seqs, effrem_len, device)
    cuts = default_cuts(effrem_len, n_cuts)
    full = lambda: [lm(x[:, :effrem_len]) for _ in cuts]  # what "len(cuts) separate forwards" costs
    times = {"batched": [], "per_cut": [], "full": []}
    for _ in range(repeats):  # interleaved, best of `repeats`: robust to other load on a shared machine
        t0 = time.perf_counter()
        batched = effective_remembrance(lm, x, effrem_len, cuts)
        t1 = time.perf_counter()
        naive = effective_remembrance_naive(lm, x, effrem_len, cuts)
        t2 = time.perf_counter()
        with torch.inference_mode():
            full()
        times["batched"].append(t1 - t0)
        times["per_cut"].append(t2 - t1)
        times["full"].append(time.perf_counter() - t2)
    work = sum(effrem_len - t for t in set(cuts.tolist()) | {0}) / effrem_len
    out["effrem"] = dict(T=effrem_len, n_seqs=effrem_seqs, n_cuts=len(cuts), batched_s=round(min(times["batched"]), 3),
                         per_cut_s=round(min(times["per_cut"]), 3), full_forwards_s=round(min(times["full"]), 3),
                         work_in_full_forwards=round(work, 1),
                         max_abs_diff=float((batched - naive.double()).abs().max()))
    return out


def _bench_model(arch, n, length, device):
    import model
    torch.manual_seed(0)
    lm = model.LM(model.make_config(arch, "tiny", vocab_size=257)).to(device)
    return lm, torch.randint(0, 257, (n, length), generator=torch.Generator().manual_seed(0))


def _bench_memory(arch, length, n, chunk_len, device):
    import resource
    lm, x = _bench_model(arch, n, length, device)
    position_nll(lm, x[:, :2 * chunk_len], chunk_len=chunk_len)  # warm-up: allocator pools, kernels
    warm_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: kB
    t0 = time.perf_counter()
    position_nll(lm, x, chunk_len=chunk_len)
    seconds = time.perf_counter() - t0
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    cuda_mb = torch.cuda.max_memory_allocated() / 2 ** 20 if torch.device(device).type == "cuda" else None
    return dict(length=length, warm_rss_mb=round(warm_mb, 1), peak_rss_mb=round(peak_mb, 1),
                cuda_peak_mb=cuda_mb, seconds=round(seconds, 2), tokens_per_s=round(n * length / seconds))


# ================================================================================================
# Helpers
# ================================================================================================


def _pieces(T, chunk_len, stops=()):
    """[a, b) intervals covering [0, T), each at most chunk_len long, with a boundary at every stop."""
    cuts = sorted({0, T} | {int(s) for s in stops if 0 < s < T})
    out = []
    for a, b in zip(cuts[:-1], cuts[1:]):
        out += [(s, min(s + chunk_len, b)) for s in range(a, b, chunk_len)]
    return out


def _auto_chunk_len(lm, rows, logits=True):
    """Tokens per row per model call when the caller did not choose. Two limits:
    memory, when the call's logits are kept: [rows, chunk, vocab] float32 stays near 2^24 numbers (64 MB);
    speed on the CPU: a call's activations should fit in cache. On this repo's 2-core CPU the tiny
    Mamba-2 (d_model 64) is fastest with ~2k tokens per call (rows x chunk) and 2-3x slower per token
    with 16k-65k, so the CPU budget is 2^17 / d_model tokens per call. CUDA wants the largest calls it
    can get: no speed limit there.
    Between 16 and 2048 tokens (shorter chunks spend their time on per-call overhead), and a power of
    two: the chunked scans pad a call to a multiple of their own chunk (64 for Mamba-2), so 70 tokens
    would cost as much as 128."""
    chunk = 2048
    if logits:
        chunk = min(chunk, 2 ** 24 // max(1, rows * lm.cfg.vocab_size))
    if _device_of(lm).type == "cpu":
        chunk = min(chunk, 2 ** 17 // max(1, rows * getattr(lm.cfg, "d_model", 1)))
    return 2 ** int(math.log2(max(16, chunk)))


def _auto_rows(lm, per_sequence):
    """Sequences per pass when each one becomes `per_sequence` rows (Effective Remembrance: one row per
    cut): on the CPU about 2^17 / d_model / 16 rows in all, so a 16-token chunk still fits the budget
    above; on CUDA every sequence at once."""
    if _device_of(lm).type != "cpu":
        return None
    return max(1, 2 ** 13 // getattr(lm.cfg, "d_model", 1) // per_sequence)


def _cat_states(a, b):
    # every state tensor has the batch in dim 0 (model.py's contract), so new rows append there
    return [{k: torch.cat([la[k], lb[k]], 0) for k in la} for la, lb in zip(a, b)]


def _last_probs(logits):
    return logits[:, -1].double().softmax(-1)


def _device_of(lm):
    p = next(lm.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


class _eval_mode:
    """Put the model in eval mode for the block and restore its previous mode (callers may be training)."""

    def __init__(self, lm):
        self.lm = lm

    def __enter__(self):
        self.was_training = self.lm.training
        self.lm.eval()

    def __exit__(self, *exc):
        self.lm.train(self.was_training)


def _tqdm(**kw):
    try:
        from tqdm import tqdm
    except ImportError:  # progress bars are a convenience, never a requirement
        class tqdm:
            def __init__(self, **kw): pass
            def update(self, n=1): pass
            def close(self): pass
    return tqdm(**kw)


def _check_tokens(tokens, min_len, what):
    tokens = torch.as_tensor(tokens)
    if tokens.dim() != 2 or tokens.shape[1] < min_len or tokens.shape[0] < 1:
        raise ValueError(f"{what} must have shape [n, T] with n >= 1 and T >= {min_len}, got {list(tokens.shape)}")
    if tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
        raise ValueError(f"{what} must hold integer token ids, got dtype {tokens.dtype}")
    return tokens.long()


def _check_edges(edges, L):
    edges = [int(e) for e in edges]
    if len(edges) < 2 or edges[0] != 0 or edges[-1] != L or any(a >= b for a, b in zip(edges[:-1], edges[1:])):
        raise ValueError(f"bucket edges must increase strictly from 0 to {L} (the number of positions), got {edges[:8]}"
                         + ("..." if len(edges) > 8 else "") + f": use log_edges({L})")
    return edges


def _check_effrem(tokens, T, cuts, distance):
    tokens = _check_tokens(tokens, min_len=1, what="tokens")
    if distance not in DISTANCES:
        raise ValueError(f"unknown distance {distance!r}: choose one of {sorted(DISTANCES)}")
    if not 1 <= T <= tokens.shape[1]:
        raise ValueError(f"effective_remembrance: T = {T} must lie in [1, {tokens.shape[1]}] (the window length)")
    cuts = torch.as_tensor(cuts).long().flatten()
    if len(cuts) == 0 or cuts.min() < 0 or cuts.max() > T - 1:
        raise ValueError(f"effective_remembrance: cuts must lie in [0, T-1 = {T - 1}] (the suffix keeps at least "
                         f"one token), got min {cuts.min().item() if len(cuts) else None}, "
                         f"max {cuts.max().item() if len(cuts) else None}")
    return tokens, cuts, DISTANCES[distance]


if __name__ == "__main__":
    sys.exit(main())
