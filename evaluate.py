"""
Evaluate recurrent LMs far past their training length: the paper's measurements and its tasks.

    python evaluate.py out/base out/sp --labels base sp
    python evaluate.py PATH/mamba2-130m --data long.txt --tokenizer PATH/tokenizer.json --eval-len 16384

Sections: 1. position-wise perplexity, 2. Definition 3.2, 3. Effective Remembrance, 4. state statistics
(each next to its naive reference), 5. task scores, 6. report and plots, 7. main. The metrics stream the
sequences through the model in chunks carrying the state (for a recurrent model lm(x) == lm(x[:, a:],
state=lm(x[:, :a])[1])), so memory depends on chunk_len, not on the length. Any LM with model.LM's
interface works: logits, final_state = lm(idx, state=None, last_only=False); lm.zero_state(b, device).
Entry i of a per-position curve is the prediction after reading i + 1 tokens (context length i + 1);
a model trained on windows of t_train tokens has seen the entries i < t_train.
"""
import argparse
import functools
import json
import math
import os
import sys
import time
import types

import matplotlib
import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

import model
import tasks

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the file-only backend)

MIN_SEQS = 16  # below this many sequences the verdict's bootstrap means nothing: warn

# ==== 1. Position-wise perplexity: PPL(t) = exp( E_x[ -log q(x_{t+1} | x_{0..t}) ] ) ====


def position_nll_naive(lm, tokens):
    """The definition, one full forward: NLL [n, T-1], entry (s, i) = -log q(x[s, i+1] | x[s, :i+1])."""
    with torch.inference_mode():
        logits, _ = lm(tokens)
    return F.cross_entropy(logits[:, :-1].float().transpose(1, 2), tokens[:, 1:], reduction="none")


@torch.inference_mode()
def sequence_nll(lm, tokens, chunk_len=512, batch_size=8, progress=False):
    """position_nll_naive streamed: the same [n, T-1] matrix, batch_size sequences and chunk_len tokens
    per call, the state carried between calls, so at most [batch_size, chunk_len, vocab] logits exist."""
    tokens = _check_tokens(tokens, min_len=2)
    out = torch.empty(tokens.shape[0], tokens.shape[1] - 1)
    for r in tqdm(range(0, len(tokens), batch_size), desc="ppl", disable=not progress):
        x, state = tokens[r:r + batch_size].to(_device(lm)), None  # None: the zero initial state
        for a in range(0, out.shape[1], chunk_len):
            logits, state = lm(x[:, a:-1][:, :chunk_len], state)
            targets = x[:, a + 1:][:, :chunk_len]
            out[r:r + len(x), a:a + chunk_len] = F.cross_entropy(logits.float().transpose(1, 2), targets,
                                                                 reduction="none").cpu()
    return out


def position_nll(lm, tokens, chunk_len=512, batch_size=8):
    """Mean NLL per position [T-1], averaged over sequences FIRST: PPL(t) = exp(this), not mean(exp(nll))."""
    return sequence_nll(lm, tokens, chunk_len, batch_size).double().mean(0)


def log_edges(length, per_octave=2, include=()):
    """Bucket boundaries over entries 0..length-1, log-spaced (0, 1, 2, 3, 4, 6, 8, 11, 16, ... with
    per_octave=2) and ending at length; `include` adds boundaries (t_train: no bucket straddles it)."""
    edges = {0, length} | {int(e) for e in include if 0 < e < length}
    k = 0
    while round(2 ** (k / per_octave)) < length:
        edges.add(round(2 ** (k / per_octave)))
        k += 1
    return sorted(edges)


def bucketize(nll, edges):
    """Buckets of a per-sequence NLL matrix nll [n, L]: each sequence's NLL averaged over a bucket first
    (per_seq [n, K]), then means and standard errors over sequences (a sequence's positions correlate)."""
    nll = torch.as_tensor(nll, dtype=torch.float64)
    if nll.dim() != 2 or edges[0] != 0 or edges[-1] != nll.shape[1] or np.any(np.diff(edges) <= 0):
        raise ValueError(f"bucket edges must rise from 0 to L = {nll.shape[-1]} for nll [n, L]: "
                         "use log_edges(L)")
    per_seq = torch.stack([nll[:, lo:hi].mean(1) for lo, hi in zip(edges[:-1], edges[1:])], 1)
    return dict(lo=list(edges[:-1]), hi=list(edges[1:]), per_seq=per_seq, **_summary(per_seq))


def _summary(per_seq):
    nll, sem = per_seq.mean(0), _sem(per_seq)
    return dict(nll=nll, nll_sem=sem, ppl=nll.exp(), ppl_sem=nll.exp() * sem)  # delta method


def _sem(x):
    return x.std(0) / math.sqrt(len(x)) if len(x) > 1 else x[0] * math.nan


# ==== 2. Length generalization (Definition 3.2) ====


def length_generalization_naive(ppl, t_train):
    """Definition 3.2 read literally on a per-position curve ppl [L]: p* = min over t < t_train, at t*;
    the model generalizes to T if ppl(t) <= p* for all t in [t*, T). Returns that largest T. On a
    measured curve it mostly measures noise (p* is biased low; one noisy position ends the run)."""
    ppl = torch.as_tensor(ppl)
    t_star = int(ppl[:t_train].argmin())
    above = (ppl[t_star:] > ppl[t_star]).nonzero()
    return t_star + int(above[0]) if len(above) else len(ppl)


def length_generalization(per_seq, lo, hi, t_train, alpha=0.05, n_boot=2000, seed=0):
    """Definition 3.2 on bucketed per-sequence NLLs per_seq [n, K] (bucketize's), exactly as coded:
    1. p* is the PPL over the last half of the training window, the buckets inside [t_train / 2, t_train)
       (t* = their first entry): where a curve falling with context has its minimum, measured on t_train / 2
       positions. (A minimum over single positions is biased low; so is the lowest of several buckets.)
    2. A bucket past t_train exceeds p* when the paired difference d_s = (its NLL - p*'s window NLL) of
       sequence s has a positive mean with confidence: the alpha / m quantile of that mean over n_boot
       bootstrap resamples of the sequences (seeded) is > 0, m = the number of buckets past t_train
       (Bonferroni: a flat curve passes everywhere with probability >= 1 - alpha). Pairing cancels what
       a sequence shares across positions (an easy or a hard text).
    3. generalizes_to = hi of the last bucket before the first one that exceeds p* (t_train if the first
       does; censored: none does). With fewer than MIN_SEQS sequences the result carries a warning."""
    per_seq, lo, hi = torch.as_tensor(per_seq, dtype=torch.float64), list(lo), list(hi)
    n, K = per_seq.shape
    window = [j for j in range(K) if lo[j] >= t_train // 2 and hi[j] <= t_train]
    later = [j for j in range(K) if lo[j] >= t_train]
    if not window:
        raise ValueError(f"no bucket lies within the training positions [{t_train // 2}, {t_train}): "
                         f"use edges that include both (log_edges(L, include=[{t_train // 2}, {t_train}]))")
    width = torch.tensor([hi[j] - lo[j] for j in window], dtype=torch.float64)
    ref = per_seq[:, window] @ width / width.sum()  # [n]: each sequence's NLL over p*'s window
    out = dict(t_train=t_train, n_seqs=n, p_star=float(ref.mean().exp()), t_star=lo[window[0]],
               rule=f"p* over [t_train/2, t_train); a later bucket exceeds p* if the {alpha:g}/m quantile of "
                    f"the bootstrap mean of the paired per-sequence difference is > 0")
    if not torch.isfinite(per_seq[:, window + later]).all():
        return dict(out, generalizes_to=None, ratio=None, censored=None,
                    warning="the model's NLL is not finite (NaN or inf): no verdict")
    first = len(later)  # index into `later` of the first bucket that exceeds p*
    if later:
        d = per_seq[:, later] - ref[:, None]  # [n, m]
        idx = torch.randint(n, (n_boot, n), generator=torch.Generator().manual_seed(seed))
        counts = torch.zeros(n_boot, n).scatter_add_(1, idx, torch.ones(n_boot, n)).double()
        exceeds = (torch.quantile(counts @ d / n, alpha / len(later), dim=0) > 0).tolist() + [True]
        first = exceeds.index(True)
    T = hi[later[first - 1]] if first else t_train
    out.update(generalizes_to=T, ratio=T / t_train, censored=first == len(later))
    if n < MIN_SEQS:
        out["warning"] = (f"only {n} sequences: the Definition 3.2 verdict is not meaningful "
                          f"(use --n-seqs >= {MIN_SEQS})")
    return out


# ==== 3. Effective Remembrance: EffRem_T(t) = d( q(.|x[0:T]), q(.|x[t:T]) ) ====
# d between next-token distributions [..., V], each 0 exactly when p == q and within [0, 1].
DISTANCES = {
    "tv": lambda p, q: (0.5 * (p - q).abs().sum(-1)).clamp(0, 1),
    # Jensen-Shannon in bits (natural-log JS / ln 2), so that it lies in [0, 1] like TV
    "js": lambda p, q: ((torch.xlogy(p, p) + torch.xlogy(q, q) - torch.xlogy(p + q, 0.5 * (p + q))).sum(-1)
                        / (2 * math.log(2))).clamp(0, 1),
    # 1 - cos(p, q) as 0.5 |p/|p| - q/|q||^2: the same number without cancelling against 1
    "cos": lambda p, q: (0.5 * (F.normalize(p, dim=-1) - F.normalize(q, dim=-1)).pow(2).sum(-1)).clamp(0, 1),
}


@torch.inference_mode()
def effective_remembrance_naive(lm, tokens, T, cuts, distance="tv"):
    """The definition, one forward per cut: mean over rows of d(q(.|x[0:T]), q(.|x[t:T])) for each t."""
    tokens, cuts, dist = _check_effrem(tokens, T, cuts, distance)
    x = tokens[:, :T].to(_device(lm))
    p = _last_probs(lm(x)[0])
    return torch.stack([dist(p, _last_probs(lm(x[:, t:])[0])).mean() for t in cuts.tolist()]).cpu()


@torch.inference_mode()
def effective_remembrance(lm, tokens, T, cuts, distance="tv", batch_size=2, chunk_len=256, reduce=True,
                          progress=False):
    """EffRem_T(t) for every cut, [len(cuts)] means over rows (reduce=False: [n, len(cuts)]), in one pass.
    Running on x[t:T] is the full run with the state zeroed at t: we walk through time once and at each cut
    the rows of that suffix join the batch with a zero state (every key: "h", conv windows, shifts). Same
    work as one forward per cut, far fewer calls. The t = 0 rows are the reference, so EffRem_T(0) = 0
    exactly. A pass holds batch_size * (len(cuts) + 1) rows."""
    tokens, cuts, dist = _check_effrem(tokens, T, cuts, distance)
    starts = sorted(set(cuts.tolist()) | {0})  # rows for t = 0 are the reference
    stops = sorted(set(starts[1:]) | set(range(0, T, chunk_len)) | {T})
    out = torch.zeros(len(tokens), len(cuts), dtype=torch.float64)
    for r in tqdm(range(0, len(tokens), batch_size), desc="effrem", disable=not progress):
        x = tokens[r:r + batch_size, :T].to(_device(lm))
        state, active = None, 0  # rows [k * len(x), (k + 1) * len(x)) hold the suffix from starts[k]
        for a, b in zip(stops[:-1], stops[1:]):
            while active < len(starts) and starts[active] == a:  # a suffix starts here, from zero
                zero = lm.zero_state(len(x), x.device)
                state = zero if state is None else [{k: torch.cat([s[k], z[k]]) for k in s}
                                                    for s, z in zip(state, zero)]
                active += 1
            logits, state = lm(x[:, a:b].repeat(active, 1), state, last_only=True)
        p = _last_probs(logits).view(len(starts), len(x), -1)
        for j, t in enumerate(cuts.tolist()):
            out[r:r + len(x), j] = dist(p[0], p[starts.index(t)]).cpu()
    return out.mean(0) if reduce else out


def default_cuts(T, n_cuts=32):
    """0, then log-spaced from the start (a failing model jumps as soon as a tiny prefix is dropped)
    and log-spaced toward T (where a healthy one rises); unique, within [0, T-1]."""
    half, top = max(1, (n_cuts - 1) // 2), math.log10(max(1, T // 2))
    early = torch.logspace(0, top, half).round().long()
    late = T - torch.logspace(0, top, n_cuts - 1 - half).round().long()
    return torch.cat([torch.tensor([0]), early, late]).clamp(0, T - 1).unique()


# ==== 4. State statistics (Fig. 4): the spread of each head's state "h" as a function of position ====


@torch.inference_mode()
def state_statistics(lm, tokens, positions=None, chunk_len=512, batch_size=8, t_train=None, progress=False):
    """Per layer [P, heads] at each time index of positions (default log-spaced): std and RMS of h[:, head]
    over the batch and the non-head dims pooled (as Fitted Noise). coverage (ours, with t_train): mean std
    at context >= 4 t_train / largest std at context <= t_train, per head: ~1, late states stay where
    training went; >> 1, they drift where it never went (the unexplored-states hypothesis)."""
    tokens = _check_tokens(tokens, min_len=1)
    T = tokens.shape[1]
    default = np.array(log_edges(T)[1:]) - 1  # log-spaced context lengths 1, 2, 3, 4, 6, ..., T
    positions = torch.as_tensor(default if positions is None else positions).long().flatten().unique()
    assert 0 <= positions.min() and positions.max() < T, f"positions must lie in [0, {T - 1}]"
    ends = (positions + 1).tolist()
    stops = sorted(set(ends) | set(range(chunk_len, ends[-1], chunk_len)))
    sums = None  # [count, sum, sum of squares] per position, layer and head
    for r in tqdm(range(0, len(tokens), batch_size), desc="state", disable=not progress):
        x, state = tokens[r:r + batch_size].to(_device(lm)), None
        for a, b in zip([0] + stops[:-1], stops):
            _, state = lm(x[:, a:b], state, last_only=True)
            if b in ends:
                h = torch.stack([s["h"] for s in state]).transpose(1, 2).flatten(2).double().cpu()
                sums = torch.zeros(3, len(ends), *h.shape[:2], dtype=torch.float64) if sums is None else sums
                sums[:, ends.index(b)] += torch.stack([h[..., 0] * 0 + h.shape[2], h.sum(2), h.pow(2).sum(2)])
    cnt, s, sq = sums.transpose(1, 2)  # [layers, P, heads]
    std = ((sq - s * s / cnt) / (cnt - 1).clamp_min(1)).clamp_min(0).sqrt()
    out = dict(positions=positions, std=list(std), rms=list((sq / cnt).sqrt()))
    if t_train is not None:
        early, late = positions + 1 <= t_train, positions + 1 >= 4 * t_train
        both = early.any() and late.any()
        out["coverage"] = list(std[:, late].mean(1) / std[:, early].amax(1) if both else std[:, 0] * math.nan)
    return out


# ==== 5. Long-context tasks (Sec. 5): greedy answers from the zero state ====
# The prompt is streamed in chunks carrying the state, then the answer is decoded one token at a time
# from the carried state: exactly argmax decoding of the whole sequence, at constant cost per token.
# Sample i of a cell is seeded by (seed, cell, i) only: every length and checkpoint gets the same questions.


@torch.inference_mode()
def greedy_answer(lm, prompt_tokens, max_new_tokens, stop_tokens=(), chunk_len=512):
    """Greedy continuation of prompt_tokens [T] or [b, T] from the zero state: per row, the argmax
    tokens up to and including the first of stop_tokens, at most max_new_tokens of them."""
    prompts = torch.as_tensor(prompt_tokens)
    prompts = _check_tokens(prompts[None] if prompts.dim() == 1 else prompts, min_len=1).to(_device(lm))
    is_stop = torch.zeros(lm.cfg.vocab_size, dtype=torch.bool)
    is_stop[[t for t in stop_tokens if 0 <= t < lm.cfg.vocab_size]] = True
    state = None
    for a in range(0, prompts.shape[1], chunk_len):
        logits, state = lm(prompts[:, a:a + chunk_len], state, last_only=True)
    new = []
    while True:
        new.append(logits[:, -1].argmax(-1))
        if len(new) == max_new_tokens or is_stop[torch.stack(new, 1).cpu()].any(1).all():
            break
        logits, state = lm(new[-1][:, None], state)  # one step from the carried state
    rows = torch.stack(new, 1).tolist()  # rows that stopped early were decoded on: cut them
    return [row[:next((i for i, t in enumerate(row) if is_stop[t]), len(row) - 1) + 1] for row in rows]


@functools.lru_cache(maxsize=None)
def answer_stop_tokens(tokenizer, texts=(".", "\n")):
    """Ids where an answer ends: any token whose text holds one of `texts`, and end-of-text."""
    enc, ids = tasks.get_tokenizer(tokenizer), set()
    for t in range(enc.n_vocab):
        try:
            if any(s.encode() in enc.decode_single_token_bytes(t) for s in texts):
                ids.add(t)
        except KeyError:  # unused ids between a BPE's ranks and its special tokens
            pass
    return frozenset(ids | {enc.eot_token})


def passkey_samples(tokenizer, length, depths, n_per_cell, seed=0):
    return [[tasks.passkey_sample(tokenizer, length, depth=float(d), seed=[seed, j, i])
             for i in range(n_per_cell)] for j, d in enumerate(depths)]


def copy_samples(tokenizer, length, n, seed=0):
    return [tasks.copy_sample(tokenizer, int(length), seed=[seed, int(length), i]) for i in range(n)]


def babilong_samples(tokenizer, task, length, n, seed=0, filler=None):
    k = list(tasks.BABI_TASKS).index(task)
    return [tasks.babi_mixture(tokenizer, int(length), [seed, k, i], (task,), filler) for i in range(n)]


def _answers(lm, samples, stop, batch_size=None, chunk_len=512, slack=2):
    """Greedy answers (token lists) of samples, slack tokens past the longest answer at most. Prompts of
    equal length are decoded together, never padded (a recurrent model would keep the padding)."""
    prompts, answers = zip(*(tasks.split_answer(s) for s in samples))
    groups, out = {}, [None] * len(samples)
    for i, p in enumerate(prompts):
        groups.setdefault(len(p), []).append(i)
    for rows in groups.values():
        step = batch_size or len(rows)
        for idx in [rows[r:r + step] for r in range(0, len(rows), step)]:
            batch = torch.as_tensor(np.stack([prompts[i] for i in idx]))
            new = max(len(answers[i]) for i in idx) + slack
            for i, pred in zip(idx, greedy_answer(lm, batch, new, stop, chunk_len)):
                out[i] = pred
    return out


def _exact(lm, tokenizer, samples, **kw):
    """Exact match of each sample's decoded answer (cut at its end), and the decoded texts."""
    enc = tasks.get_tokenizer(tokenizer)
    texts = [enc.decode(p) for p in _answers(lm, samples, answer_stop_tokens(tokenizer), **kw)]
    ok = [float(tasks.exact_match(tasks.cut_answer(p), s.meta["answer"])) for p, s in zip(texts, samples)]
    return ok, texts


def passkey_grid(lm, tokenizer, lengths, depths=10, n_per_cell=4, seed=0, progress=False, **kw):
    """Passkey retrieval on total length x insertion depth (Fig. 7); depths: a count in [0, 1] or a list.
    Returns exact and digits [L][D] (exact match, per-digit accuracy) and exact_mean [L]."""
    depths = [float(d) for d in (np.linspace(0, 1, depths) if isinstance(depths, int) else depths)]
    exact, digits = [], []
    for L in tqdm(lengths, desc="passkey", disable=not progress):
        flat = sum(passkey_samples(tokenizer, L, depths, n_per_cell, seed), [])  # depth-major
        ok, texts = _exact(lm, tokenizer, flat, **kw)
        per_digit = [tasks.passkey_digit_accuracy(p, s.meta["key"]) for p, s in zip(texts, flat)]
        exact.append(np.reshape(ok, (len(depths), n_per_cell)).mean(1).tolist())
        digits.append(np.reshape(per_digit, (len(depths), n_per_cell)).mean(1).tolist())
    return dict(lengths=[int(L) for L in lengths], depths=depths, n_per_cell=n_per_cell, exact=exact,
                digits=digits, exact_mean=[sum(r) / len(r) for r in exact])


def copy_accuracy(lm, tokenizer, lengths, n=16, seed=0, progress=False, **kw):
    """Synthetic copying (Table 1): the model reads eot s SEP and writes s. Per string length: the
    character accuracy of each string (char [L][n]), its mean and s.e., and whole-string accuracy."""
    enc = tasks.get_tokenizer(tokenizer)
    stop = {enc.encode_single_token(tasks.COPY_EOS), enc.eot_token}
    scores = []  # [L, n, 2]: char accuracy, whole string right
    for L in tqdm(lengths, desc="copy", disable=not progress):
        samples = copy_samples(tokenizer, L, n, seed)
        preds = _answers(lm, samples, stop, slack=0, **kw)
        scores.append([tasks.copy_scores(p, s.meta["target"]) for p, s in zip(preds, samples)])
    char, whole = torch.tensor(scores, dtype=torch.float64).unbind(-1)
    return dict(lengths=[int(L) for L in lengths], n=n, char=char.tolist(), char_mean=char.mean(1).tolist(),
                char_sem=_sem(char.T).tolist(), whole_mean=whole.mean(1).tolist())


def babilong_accuracy(lm, tokenizer, babi_tasks, lengths, n=8, seed=0, filler=None, progress=False, **kw):
    """BABILong-style QA (Fig. 6): exact match per bAbI task and length, stories hidden in `filler`
    (a token stream, e.g. the corpus's validation split) or in tasks.py's sentences (None)."""
    acc = []  # [L, tasks]
    for L in tqdm(lengths, desc="babilong", disable=not progress):
        samples = [s for t in babi_tasks for s in babilong_samples(tokenizer, t, L, n, seed, filler)]
        acc.append(np.reshape(_exact(lm, tokenizer, samples, **kw)[0], (len(babi_tasks), n)).mean(1).tolist())
    return dict(tasks=list(babi_tasks), lengths=[int(L) for L in lengths], n=n, mean=np.mean(acc, 1).tolist(),
                acc={t: [row[k] for row in acc] for k, t in enumerate(babi_tasks)})


# ==== 6. Report and plots: each curve is printed (a few columns) and drawn (a PNG panel) from one table ====
CTX = "context length (dotted: T_train)"
# curve -> PNG file holding its panel (None: printed only), title, x label, y label, scale (log x, log-log)
PANELS = {
    "ppl": ("ppl.png", "Position-wise perplexity (+-1 s.e.)", CTX, "perplexity", "log"),
    "gap": ("ppl.png", "Gap to the Bayes floor", CTX, "model NLL - Bayes NLL (nats)", "log"),
    "diff": ("ppl.png", "Paired difference to the reference run", CTX, "NLL - reference NLL (nats)", "log"),
    "effrem": ("effrem.png", "Effective Remembrance", "t, first tokens dropped (dotted: T - T_train)",
               "EffRem_T(t)", None),
    "state": ("state.png", "State spread, most drifting head per layer", CTX, "std of state h", "loglog"),
    "passkey": (None, "Passkey", "total length", "exact match", "log"),
    "copy": ("copy.png", "Copying", "string length", "char accuracy (+- s.e.)", None),
    "babilong": ("babilong.png", "BABILong", "total length (dotted: T_train)", "accuracy (task mean)", "log"),
}


def _curves(m):
    """A model's curves: name -> [(x, y, s.e. or None, legend, x of its dotted line or None)]."""
    out, label, t = {}, m["label"], m["t_train"]
    if "ppl" in m:
        b = m["ppl"]["buckets"]
        x = [math.sqrt((lo + 1) * hi) for lo, hi in zip(b["lo"], b["hi"])]  # a bucket's geometric middle
        out["ppl"] = [(x, b["ppl"], b["ppl_sem"], f"{label} (T={m['verdict']['generalizes_to']})", t)]
        for key in ("gap", "diff"):  # gap: a failure perplexity can hide (the Bayes predictor keeps learning)
            if key in m:
                out[key] = [(x, m[key]["nll"], m[key]["nll_sem"], label, t)]
    if "effrem" in m:
        e = m["effrem"]
        out["effrem"] = [(e["cuts"], e["mean"], e["sem"], f"{label} (T={e['T']})", t and e["T"] - t)]
    if "state" in m:  # per layer the head that drifts most (coverage, else last / first std)
        st, out["state"] = m["state"], []
        for layer, std in enumerate(np.array(st["std"], dtype=float)):
            score = np.array(st["coverage"][layer], dtype=float) if "coverage" in st else std[-1] / std[0]
            h = int(np.nan_to_num(score, nan=-1).argmax())
            out["state"].append((np.array(st["positions"]) + 1, std[:, h], None, f"{label} L{layer} h{h}", t))
    for key, y, sem in [("passkey", "exact_mean", None), ("copy", "char_mean", "char_sem"),
                        ("babilong", "mean", None)]:
        if key in m:
            out[key] = [(m[key]["lengths"], m[key][y], sem and m[key][sem], label, key != "copy" and t)]
    return out


def print_report(report):
    """Per model the verdict and the state coverage, then every curve at 8 columns, the models together."""
    for m in report["models"]:
        print(f"[{m['label']}] {m['arch']}, {m['params']:,} params, trained on {m['task']}, "
              f"t_train {m['t_train']}")
        v = m.get("verdict")
        if v and v["ratio"] is not None:
            print(f"  verdict (Def. 3.2): p* = {v['p_star']:.4g} at t* = {v['t_star']}, generalizes to T = "
                  f"{v['generalizes_to']}{'+' * v['censored']} ({v['ratio']:.1f}x t_train)")
        elif v:
            print(f"  verdict (Def. 3.2): none, {v['warning']}")
        if "coverage" in m.get("state", {}):
            cov = [max(layer, key=lambda c: -1 if c is None else c) for layer in m["state"]["coverage"]]
            print("  state coverage, most drifting head per layer: "
                  + ", ".join("n/a" if c is None else f"{c:.3g}" for c in cov))
    curves = [_curves(m) for m in report["models"]]
    for name, (_, title, xlabel, ylabel, _) in PANELS.items():
        rows = [curve for c in curves for curve in c.get(name, [])]
        print(f"\n{title}: {ylabel}" if rows else "", end="")
        for i, (x, y, _, legend, _) in enumerate(rows):
            cols = sorted({round(k * (len(x) - 1) / 7) for k in range(8)})  # log-spaced where x is
            if i == 0 or list(x) != list(rows[i - 1][0]):
                print(f"\n  {xlabel.split(' (')[0]:<26}" + "".join(f"{round(x[j]):>11}" for j in cols))
            cells = ["n/a" if y[j] is None else f"{y[j]:.4g}" for j in cols]
            print(f"  {legend:<26}" + "".join(f"{v:>11}" for v in cells))
    print("\nwrote " + ", ".join(report["files"]))


def plot_report(report, out):
    """Each PNG of PANELS the models have curves for (one curve per model, the Bayes floor) and the
    passkey grid of each model (Fig. 7). Returns the paths written."""
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    runs = [(colors[i % len(colors)], m, _curves(m)) for i, m in enumerate(report["models"])]
    figs = {}
    for file in dict.fromkeys(p[0] for p in PANELS.values() if p[0]):
        names = [n for n, p in PANELS.items() if p[0] == file and any(n in curves for *_, curves in runs)]
        if names:
            figs[file], axes = plt.subplots(1, len(names), figsize=(1 + 6 * len(names), 4.5), squeeze=False)
        for ax, name in zip(axes[0] if names else [], names):
            _, title, xlabel, ylabel, scale = PANELS[name]
            ax.set(title=title, xlabel=xlabel, ylabel=ylabel, xscale="log" if scale else "linear",
                   yscale="log" if scale == "loglog" else "linear")
            for color, _, curves in runs:
                for curve in curves.get(name, []):
                    _curve(ax, color, *curve)
            if name == "ppl" and "optimal" in report:
                b = report["optimal"]
                ax.plot([math.sqrt((lo + 1) * hi) for lo, hi in zip(b["lo"], b["hi"])], b["ppl"], "k--", lw=1,
                        label="Bayes-optimal")
            ax.legend(fontsize=8)
    pk = [m for m in report["models"] if "passkey" in m]
    if pk:  # the paper's Fig. 7: total length x insertion depth, exact match as colour
        figs["passkey.png"], axes = plt.subplots(1, len(pk), figsize=(1 + 4.5 * len(pk), 4.2), squeeze=False)
        for ax, m in zip(axes[0], pk):
            p = m["passkey"]
            ax.imshow(np.array(p["exact"]).T, aspect="auto", cmap="RdYlGn", vmin=0, vmax=1)
            ax.set_xticks(range(len(p["lengths"])), p["lengths"], rotation=45)
            ax.set_yticks(range(len(p["depths"])), [f"{d:.2f}" for d in p["depths"]])
            ax.axvline(sum(L <= (m["t_train"] or 0) for L in p["lengths"]) - 0.5, color="k", ls=":")
            ax.set(title=f"{m['label']}: exact match (dotted: T_train)", xlabel="total length (tokens)",
                   ylabel="insertion depth")
    for file, fig in figs.items():
        fig.tight_layout()
        fig.savefig(os.path.join(out, file), dpi=120)
        plt.close(fig)
    return [os.path.join(out, file) for file in figs]


def _curve(ax, color, x, y, sem, label, line_at):
    y = np.array(y, dtype=float)  # None (NaN in the JSON) -> nan: a gap in the curve
    if not np.isfinite(y).any():
        return _warn(f"{label}: no finite value to plot (the model outputs NaN or inf)")
    ax.plot(x, y, color=color, label=label)
    if sem is not None:
        sem = np.nan_to_num(np.array(sem, dtype=float))
        ax.fill_between(x, y - sem, y + sem, color=color, alpha=0.25)
    if line_at:
        ax.axvline(line_at, color=color, ls=":", lw=1)


# ==== 7. Command line ====
LM_METRICS, TASK_METRICS = ("ppl", "effrem", "state"), ("passkey", "copy", "babilong")


def main(argv=None):
    args = _parse_args(argv)
    try:
        report = run(args)
    except (ValueError, OSError, RuntimeError) as e:  # bad input: one line naming the problem and the fix
        print(f"error: {e}", file=sys.stderr)
        return 2
    print_report(report)
    return 0


def _parse_args(argv):
    ap = argparse.ArgumentParser(description="Position-wise perplexity, the Definition 3.2 verdict, "
                                 "Effective Remembrance, state statistics and task scores of recurrent LMs.")
    ap.error = lambda message: ap.exit(2, f"error: {message}\n")  # one line, as every other bad input
    a = ap.add_argument
    a("ckpts", nargs="+", metavar="CKPT", help="train.py's ckpt.pt (or its dir), official Mamba dirs")
    a("--metrics", help=f"subset of {','.join(LM_METRICS + TASK_METRICS)} (default: the task the checkpoints "
                        "were fine-tuned on, else ppl,effrem,state)")
    a("--eval-len", type=int, help="tokens per evaluation window (default: 16 x the largest t_train)")
    a("--n-seqs", type=int, default=64, help=f"evaluation windows (the verdict needs >= {MIN_SEQS})")
    a("--t-train", type=int, help="training length (default: train_config seq_len; official Mamba-2: 2048)")
    a("--data", help="text path, .bin, stdlib or markov:... for tasks.load_data (default: train_config data)")
    a("--tokenizer", help="bytes, a tiktoken name or a tokenizer.json (default: train_config)")
    a("--effrem-len", type=int, help="T of EffRem_T (default: 4 x t_train as the paper, at most eval-len)")
    a("--effrem-cuts", type=int, default=32, help="number of cut points t of EffRem_T (default: 32)")
    a("--distance", default="tv", choices=sorted(DISTANCES), help="EffRem's distance (tv: the paper's)")
    a("--chunk-len", type=int, help="tokens per model call while streaming: bounds memory, not results")
    a("--batch-size", type=int, help="sequences per model call (EffRem: each brings one row per cut)")
    a("--seed", type=int, default=0, help="seed of the evaluation windows and of the verdict's bootstrap")
    a("--out", default="out/eval", help="directory for eval.json and the PNGs (default: out/eval)")
    a("--device", default="auto", choices=["auto", "cpu", "cuda"], help="auto: cuda when available")
    a("--labels", nargs="+", help="one display name per checkpoint (default: the directory names)")
    a("--reference", metavar="LABEL", help="with ppl: each other run's NLL minus this run's, paired per "
                                           "sequence (e.g. the matched control of a post-training)")
    g = ap.add_argument_group("tasks (--metrics passkey,copy,babilong): greedy answers from the zero state")
    g = g.add_argument
    g("--task-samples", type=int, default=8, help="examples per passkey cell, copy length, bAbI cell")
    g("--passkey-lengths", type=_ints, default="128,256,512,1024,2048,4096", help="total lengths in tokens")
    g("--passkey-depths", type=int, default=10, help="evenly spaced insertion depths in [0, 1] (default: 10)")
    g("--copy-lengths", type=_ints, default="50,100,300", help="string lengths (default: 50,100,300)")
    g("--babi-lengths", type=_ints, default="512,1024,2048,4096", help="total lengths (stories: ~470 tokens)")
    g("--babi-tasks", help="comma-separated bAbI tasks (default: train_config babi_tasks, else qa1..qa10)")
    g("--babi-filler", default="corpus", choices=["corpus", "ours"],
      help="hide stories in the validation split of --data (as training) or in tasks.py's sentences")
    return ap.parse_args(argv)


def _ints(text):
    """An argparse type: "128,256" -> [128, 256], positive integers."""
    if not all(v.isdigit() and int(v) > 0 for v in text.split(",")):
        raise argparse.ArgumentTypeError(f"must be comma-separated positive integers, got {text!r}")
    return [int(v) for v in text.split(",")]


def _check_args(args):
    """What argparse cannot check, and the defaults from the checkpoints' train_config, set on args.
    Returns the train_configs and each checkpoint's t_train."""
    for flag, low in [("n_seqs", 1), ("eval_len", 2), ("t_train", 1), ("effrem_len", 1), ("effrem_cuts", 2),
                      ("chunk_len", 1), ("batch_size", 1), ("task_samples", 1), ("passkey_depths", 1)]:
        if getattr(args, flag) is not None and getattr(args, flag) < low:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= {low}, got {getattr(args, flag)}")
    if args.labels and len(args.labels) != len(args.ckpts):
        raise ValueError(f"--labels has {len(args.labels)} names for {len(args.ckpts)} checkpoints: "
                         "give one each")
    for p in args.ckpts:
        if not os.path.exists(p):
            raise FileNotFoundError(f"checkpoint {p} does not exist: check the path "
                                    "(train.py writes <out>/ckpt.pt)")
    cfgs = [model.train_config(p) for p in args.ckpts]  # first: a corrupt checkpoint is reported as corrupt
    trained = {c.get("task", "lm") for c in cfgs}  # default metrics: what the checkpoints were trained for
    default = trained.pop() if len(trained) == 1 and trained <= set(TASK_METRICS) else ",".join(LM_METRICS)
    args.metrics = (args.metrics or default).split(",")
    if set(args.metrics) - set(LM_METRICS + TASK_METRICS):
        raise ValueError(f"unknown metric in --metrics {','.join(args.metrics)}: use a subset of "
                         f"{','.join(LM_METRICS + TASK_METRICS)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda but no CUDA device is available: use --device cpu")
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    lm = set(args.metrics) & set(LM_METRICS)
    # copy examples have no fixed length: their T_train matters only for the LM metrics
    t_trains = [args.t_train or (c.get("seq_len") if c.get("task") != "copy" or lm else None) for c in cfgs]
    if lm and not all(t_trains):
        raise ValueError(f"{args.ckpts[t_trains.index(None)]}: no train_config seq_len (an official "
                         "checkpoint?): pass --t-train N (the official Mamba-2 checkpoints: 2048)")
    args.eval_len = args.eval_len or (16 * max(t_trains) if lm else None)
    if lm and args.eval_len <= max(t_trains):
        raise ValueError(f"--eval-len {args.eval_len} must be larger than t_train ({max(t_trains)}): "
                         f"try --eval-len {16 * max(t_trains)}")
    args.tokenizer = _agree(args, cfgs, "tokenizer", required=False) or "bytes"
    seeds = {c["seed"] for c in cfgs if c.get("seed") is not None}  # training's seed chose the data split
    if len(seeds) > 1:
        raise ValueError(f"the checkpoints were trained with --seed {sorted(seeds)}, which split the data "
                         "differently: evaluate them separately")
    args.data_seed = seeds.pop() if seeds else 0
    args.labels = args.labels or [os.path.basename(os.path.dirname(p) if p.endswith(".pt") else p.rstrip("/"))
                                  for p in args.ckpts]
    if args.reference and (args.reference not in args.labels or "ppl" not in args.metrics):
        raise ValueError(f"--reference {args.reference} must be one of the labels {args.labels} "
                         "and needs --metrics ppl")
    return cfgs, t_trains


def _task_setup(args, metrics, cfgs, tokenizer, data_seed):
    """The bAbI tasks (the flag, else the checkpoints' train_config) and the filler of --metrics babilong."""
    if "babilong" not in metrics:
        return {}
    spec = _agree(args, cfgs, "babi_tasks", required=False) or ",".join(tasks.BABI_TASKS)
    if set(spec.split(",")) - set(tasks.BABI_TASKS):
        raise ValueError(f"unknown --babi-tasks {spec}: use a subset of {','.join(tasks.BABI_TASKS)}")
    if args.babi_filler == "ours":
        return dict(babi_tasks=spec.split(","), filler=None, babi_filler="ours")
    # the validation split: training hid its stories in the train split
    data = tasks.load_data(_agree(args, cfgs, "data", False) or "stdlib", tokenizer=tokenizer, seed=data_seed)
    if data.tokenizer is None:
        raise ValueError(f"babilong: {data.name} is a synthetic process, not text to hide stories in: "
                         "pass --data stdlib (or a text path) or --babi-filler ours")
    return dict(babi_tasks=spec.split(","), filler=data.val, babi_filler=f"{data.name} (val split)")


def run(args):
    """main's work: checks the flags, measures every checkpoint, writes eval.json and the PNGs."""
    cfgs, t_trains = _check_args(args)
    setup = _task_setup(args, args.metrics, cfgs, args.tokenizer, args.data_seed)
    c = types.SimpleNamespace(**{**vars(args), **setup})  # what measure() reads
    report = dict(args=dict(vars(args)), models=[], warnings=[],
                  **{k: v for k, v in setup.items() if k != "filler"})
    if set(args.metrics) & set(LM_METRICS):
        data = tasks.load_data(_agree(args, cfgs, "data"), tokenizer=args.tokenizer, seed=args.data_seed)
        # windows from document starts where the process has an exact Bayes-optimal NLL (the floor needs it)
        eot = data.eot_token if data.optimal_nll else None
        windows = tasks.eval_windows(data.val, args.n_seqs, args.eval_len + 1, args.seed, eot)
        c.windows = torch.as_tensor(windows)
        c.edges = log_edges(args.eval_len, include=[t // d for t in t_trains for d in (1, 2)])  # p*'s windows
        report.update(data=data.name, n_seqs=len(c.windows))
        if data.optimal_nll:
            try:
                c.optimal = bucketize(torch.as_tensor(data.optimal_nll(c.windows)), c.edges)
            except ValueError as e:
                raise ValueError(f"no exact loss floor at --eval-len {args.eval_len} ({e}): "
                                 "use a shorter --eval-len") from None
            report["optimal"] = {k: v for k, v in c.optimal.items() if k != "per_seq"}
    vocab = max([int(c.windows.max()) + 1 if hasattr(c, "windows") else 0]
                + [tasks.get_tokenizer(args.tokenizer).n_vocab] * bool(set(args.metrics) & set(TASK_METRICS)))
    per_seq = {}  # label -> bucketed NLL per sequence [n, K], for the paired difference to --reference
    for path, label, t_train, cfg in zip(args.ckpts, args.labels, t_trains, cfgs):
        lm = model.from_pretrained(path, device=args.device)
        if vocab > lm.cfg.vocab_size:
            raise ValueError(f"{path}: the data / tokenizer {args.tokenizer} has {vocab} token ids, the "
                             f"model {lm.cfg.vocab_size}: use the data and tokenizer it was trained with")
        res = dict(label=label, path=path, arch=lm.cfg.arch, params=sum(p.numel() for p in lm.parameters()),
                   t_train=t_train, task=cfg.get("task", "lm"))
        print(f"[{label}] {res['arch']}, {res['params']:,} params: {','.join(args.metrics)}", file=sys.stderr)
        t0 = time.time()
        res.update(measure(lm, t_train, c))
        per_seq[label] = res.pop("per_seq", None)
        if "warning" in res.get("verdict", {}):
            report["warnings"].append(_warn(f"{label}: {res['verdict']['warning']}"))
        report["models"].append(dict(res, seconds=round(time.time() - t0, 2)))
    if args.reference:  # the same windows for every run: a paired difference per sequence and bucket
        for m in report["models"]:
            if m["label"] != args.reference and per_seq[m["label"]] is not None:
                m["diff"] = _summary(per_seq[m["label"]] - per_seq[args.reference])
    os.makedirs(args.out, exist_ok=True)
    report = _jsonable(report)
    with open(os.path.join(args.out, "eval.json"), "w") as f:
        json.dump(report, f, indent=1)
    return dict(report, files=[os.path.join(args.out, "eval.json")] + plot_report(report, args.out))


def measure(lm, t_train, c):
    """One model's report sections, a key per metric in c.metrics (c: the flags and run's shared data)."""
    out, kw = {}, {k: getattr(c, k) for k in ("chunk_len", "batch_size") if getattr(c, k)}
    kw["progress"] = True
    if "ppl" in c.metrics:
        nll = sequence_nll(lm, c.windows, **kw).double()
        buckets = bucketize(nll, c.edges)
        out["per_seq"] = per_seq = buckets.pop("per_seq")
        out["ppl"] = dict(nll=nll.mean(0), nll_sem=_sem(nll), buckets=buckets)
        out["verdict"] = length_generalization(per_seq, buckets["lo"], buckets["hi"], t_train, seed=c.seed)
        if hasattr(c, "optimal"):  # the same windows: a paired difference per sequence
            out["gap"] = _summary(per_seq - c.optimal["per_seq"])
    if "effrem" in c.metrics:
        T = min(c.effrem_len or 4 * t_train, c.eval_len)
        cuts = default_cuts(T, c.effrem_cuts)
        rows = effective_remembrance(lm, c.windows, T, cuts, c.distance, reduce=False, **kw)
        out["effrem"] = dict(T=T, distance=c.distance, cuts=cuts, mean=rows.mean(0), sem=_sem(rows))
    if "state" in c.metrics:
        positions = np.array(log_edges(c.eval_len, include=[t_train])[1:]) - 1
        out["state"] = state_statistics(lm, c.windows, positions, t_train=t_train, **kw)
    n, kw = c.task_samples, dict(kw, seed=c.seed)
    if "passkey" in c.metrics:
        out["passkey"] = passkey_grid(lm, c.tokenizer, c.passkey_lengths, c.passkey_depths, n, **kw)
    if "copy" in c.metrics:
        out["copy"] = copy_accuracy(lm, c.tokenizer, c.copy_lengths, n, **kw)
    if "babilong" in c.metrics:
        out["babilong"] = babilong_accuracy(lm, c.tokenizer, c.babi_tasks, c.babi_lengths, n, filler=c.filler,
                                            **kw)
    return out


def _agree(args, cfgs, key, required=True):
    """The flag's value, else the one train_config value of all checkpoints (they share the data)."""
    if getattr(args, key, None) is not None:
        return getattr(args, key)
    values = {c[key] for c in cfgs if c.get(key) is not None}
    if len(values) > 1 or required and not values:
        raise ValueError(f"{'the checkpoints disagree on' if values else 'no'} train_config {key} "
                         f"{sorted(map(str, values))}: pass --{key.replace('_', '-')}")
    return values.pop() if values else None


def _check_tokens(tokens, min_len):
    tokens = torch.as_tensor(tokens)
    if tokens.dim() != 2 or tokens.shape[1] < min_len or tokens.dtype.is_floating_point:
        raise ValueError(f"tokens must be integer ids of shape [n, T >= {min_len}], got {list(tokens.shape)}")
    return tokens.long()


def _check_effrem(tokens, T, cuts, distance):
    tokens, cuts = _check_tokens(tokens, 1), torch.as_tensor(cuts).long().flatten()
    if distance not in DISTANCES:
        raise ValueError(f"unknown distance {distance!r}: choose one of {sorted(DISTANCES)}")
    if not 1 <= T <= tokens.shape[1] or len(cuts) == 0 or cuts.min() < 0 or cuts.max() >= T:
        raise ValueError(f"effective_remembrance: need T = {T} in [1, {tokens.shape[1]}], cuts in [0, T-1]")
    return tokens, cuts, DISTANCES[distance]


def _device(lm):
    return next(lm.parameters(), torch.empty(0)).device  # a model without parameters: the CPU


def _last_probs(logits):
    return logits[:, -1].double().softmax(-1)


def _warn(message):
    print(f"warning: {message}", file=sys.stderr)
    return message


def _jsonable(x):  # tensors -> lists, nan / inf -> null: strict JSON
    if isinstance(x, torch.Tensor):
        return _jsonable(x.tolist())
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return None if isinstance(x, float) and not math.isfinite(x) else x


if __name__ == "__main__":
    sys.exit(main())
