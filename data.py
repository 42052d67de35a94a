"""Data for the length-generalization experiments: 1. load_data -> Data, a train and a val stream of token
ids (the files behind them: plumbing/token_cache.py, plumbing/tokenizers.py), 2. the in-context Markov
process and its exact Bayes floor, 3. the samplers (each next_batch() -> Batch). A stream is
[eot d1 eot d2 ...]: a window that starts at an eot starts a document."""
import collections
import functools
import math

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence

from plumbing import markov_spec, token_cache
from plumbing.files import DataError, is_int, require
from plumbing.tokenizers import get_tokenizer

# train, val: 1-D token ids (often np.memmaps); markov: tokenizer None, optimal_nll(windows) its exact floor.
Data = collections.namedtuple("Data", "name train val vocab_size eot_token tokenizer optimal_nll info",
                              defaults=(None, {}))
# x, y int64 [batch, seq_len] (y: x shifted by one); new_doc bool [batch]: rows starting a document, or None
Batch = collections.namedtuple("Batch", "x y new_doc")

# --- 1. load_data ----------------------------------------------------------------------------------------
def load_data(data="stdlib", tokenizer="bytes", seed=0, val_fraction=0.05, cache_dir=None):
    """data: "markov:k=8,..." (markov_spec, drawn with `seed`), or the token ids token_cache.token_ids
    reads with the tokenizer: "stdlib" (offline text), text (cached in cache_dir) or a cache folder."""
    require(isinstance(data, str) and data and is_int(seed, 0) and isinstance(val_fraction, (int, float)) and
            0 <= val_fraction < 1, "load_data: need a data name, seed >= 0 and val_fraction in [0, 1)")
    if data.split(":")[0] == "markov":
        return _load_markov(data[7:], int(seed))
    enc = get_tokenizer(tokenizer)
    train, val, info = token_cache.token_ids(data, enc, val_fraction, cache_dir)
    return Data(data, train, val, enc.n_vocab, enc.eot_token, enc, info=info)

# --- 2. The in-context Markov process and its exact Bayes floor -----------------------------------
# Each document draws its OWN transition matrix P (K x K, rows ~ Dirichlet(alpha)), a uniform first token,
# then doc_len tokens of the chain: predicting well means counting bigrams in context, the skill whose
# failure past T_train the paper studies. shared=C > 0: RELATED documents, rows ~ Dirichlet(C * G_i).
def markov_prior(k, alpha, shared=0.0, seed=0):
    """[k, k] Dirichlet pseudo-counts of every document's rows: alpha, or shared * G (related documents)."""
    if not shared:
        return np.full((k, k), float(alpha))
    return shared * np.random.default_rng([seed, 2]).dirichlet(np.full(k, alpha), size=k)

def sample_markov(k, alpha, doc_len, docs, seed=0, split="train", shared=0.0):
    """-> (tokens [docs, doc_len] int64 in 0..k-1, transitions [docs, k, k]); doc d: from (seed, split, d)."""
    prior = markov_prior(k, alpha, shared, seed)
    transitions = np.empty((docs, k, k))
    u = np.empty((doc_len, docs))   # uniforms [time, doc]
    for doc in range(docs):
        rng = np.random.default_rng([seed, int(split == "val"), doc])
        transitions[doc] = np.stack([rng.dirichlet(row) for row in prior])
        u[:, doc] = rng.random(doc_len)
    cdf = np.cumsum(transitions, axis=-1)   # inverse-CDF sampling of all documents, a loop over time
    cdf[..., -1] = 1.0                      # rounding must not leave u above the last bin
    tokens = np.empty((doc_len, docs), dtype=np.int64)
    tokens[0] = np.minimum((u[0] * k).astype(np.int64), k - 1)   # first token: uniform
    for t in range(1, doc_len):
        tokens[t] = (cdf[np.arange(docs), tokens[t - 1]] < u[t, :, None]).sum(-1)
    return np.ascontiguousarray(tokens.T), transitions

def markov_bayes_nll(tokens, k, alpha, prior=None):
    """Exact Bayes-optimal NLL (nats) [n, T-1] of windows [n, T] (numpy or torch, returned alike) that start
    at a document start (eot = k, or its first token). With Dirichlet(alpha) rows, after bigram counts c:
        p(j | i, c) = (c_ij + alpha) / (sum_j' c_ij' + K alpha);  a first token: 1/K.  prior: [k, k] alpha."""
    x = torch.as_tensor(np.asarray(tokens) if not torch.is_tensor(tokens) else tokens).long().cpu()
    require(x.dim() == 2 and x.shape[1] >= 2 and not ((x < 0) | (x > k)).any() and not (x[:, 1:] == k).any(),
            f"markov_bayes_nll: need [n, T >= 2] ids in 0..{k} (k is eot), no window crossing a document "
            "boundary (an eot after its start): use windows from document starts of <= doc_len + 1 tokens")
    n, T = x.shape
    rows = torch.arange(n)
    prior = torch.as_tensor(markov_prior(k, alpha) if prior is None else prior, dtype=torch.float64)
    counts = torch.zeros(n, k, k, dtype=torch.float64)   # counts[r, i, j]: bigrams i -> j so far
    nll = torch.empty(n, T - 1, dtype=torch.float64)
    for t in range(T - 1):
        prev = x[:, t].clamp(max=k - 1)
        nxt = x[:, t + 1]
        at_start = x[:, t] == k
        row = counts[rows, prev] + prior[prev]   # [n, k] posterior pseudo-counts
        nll[:, t] = torch.log(row.sum(-1)) - torch.log(row[rows, nxt])
        nll[at_start, t] = math.log(k)
        counts[rows, prev, nxt] += (~at_start).double()   # (eot, first token) is not a bigram of P
    return nll if torch.is_tensor(tokens) else nll.numpy()

def _load_markov(spec, seed):   # fast to regenerate (~1 s for the defaults): not cached on disk
    cfg = markov_spec.parse(spec)
    k = cfg["k"]
    streams = []   # train, val: documents [n_docs, doc_len] -> the stream [eot d1 eot d2 ...]
    for n_docs, split in ((cfg["docs"], "train"), (cfg["val_docs"], "val")):
        drawn = sample_markov(k, cfg["alpha"], cfg["doc_len"], n_docs, seed, split, cfg["shared"])[0]
        streams.append(np.pad(drawn, [(0, 0), (1, 0)], constant_values=k).reshape(-1).astype(np.uint16))
    prior = markov_prior(k, cfg["alpha"], cfg["shared"], seed)
    floor = functools.partial(markov_bayes_nll, k=k, alpha=cfg["alpha"], prior=prior)
    return Data(markov_spec.name(cfg), *streams, k + 1, k, None, floor, cfg)

# --- 3. Samplers: each one's randomness is a pure function of (seed, counters), so a resume is exact ---
# next_batch() -> Batch; state_dict() and load_state_dict() hold all that the next batches depend on.
class RandomWindows:
    """Windows from anywhere in the stream (across documents, as nanoGPT's): for zero, noise and SP states."""

    def __init__(self, tokens, batch_size, seq_len, seed=0):
        self.tokens = tokens
        self.batch_size = batch_size
        self.seq_len = seq_len
        self.seed = seed
        self.step = 0

    def next_batch(self):   # uniform starts seeded by (seed, step): windows may overlap, as nanoGPT's
        last = len(self.tokens) - self.seq_len - 1   # the last start that fits
        require(last >= 0, f"RandomWindows: windows of {self.seq_len + 1} > {len(self.tokens)} tokens: "
                "shorten them or add data")
        starts = np.random.default_rng([self.seed, self.step]).integers(0, last + 1, size=self.batch_size)
        self.step += 1
        return _batch(_windows(self.tokens, starts, self.seq_len + 1))

    def state_dict(self):
        return {"seed": self.seed, "step": self.step}

    def load_state_dict(self, state):
        self.seed = int(state["seed"])
        self.step = int(state["step"])

class DocumentStreams:
    """TBTT: row r reads a document in chunks, each from its predecessor's last token (and final state),
    then the next of a seeded order, new_doc[r] True; tails and documents shorter than a chunk are skipped."""

    def __init__(self, tokens, eot_token, batch_size, seq_len, seed=0):
        self.tokens = tokens
        self.batch_size = batch_size
        self.seq_len = seq_len
        starts = np.union1d([0], np.flatnonzero(np.asarray(tokens) == eot_token))
        lengths = np.diff(np.append(starts, len(tokens)))
        self.doc_start = starts[lengths > seq_len]
        self.doc_len = lengths[lengths > seq_len]
        require(len(self.doc_len), f"DocumentStreams: no document has {seq_len + 1} tokens: shorten seq_len")
        self.load_state_dict(dict(seed=seed, epoch=0, cursor=0, row_doc=[-1] * batch_size,   # -1: needs a doc
                                  row_pos=[0] * batch_size))

    def next_batch(self):
        new_doc = torch.zeros(self.batch_size, dtype=torch.bool)
        starts = []
        for r in range(self.batch_size):
            if self.row_doc[r] < 0 or self.row_pos[r] + self.seq_len >= self.doc_len[self.row_doc[r]]:
                if self.cursor == len(self._order):
                    self.epoch += 1
                    self.cursor = 0
                    self._order = self._shuffled()
                self.row_doc[r] = int(self._order[self.cursor])
                self.row_pos[r] = 0
                new_doc[r] = True
                self.cursor += 1
            starts.append(self.doc_start[self.row_doc[r]] + self.row_pos[r])
            self.row_pos[r] += self.seq_len
        return _batch(_windows(self.tokens, starts, self.seq_len + 1), new_doc)

    def state_dict(self):
        return dict(seed=self.seed, epoch=self.epoch, cursor=self.cursor, row_doc=list(self.row_doc),
                    row_pos=list(self.row_pos))

    def load_state_dict(self, state):
        self.seed = int(state["seed"])
        self.epoch = int(state["epoch"])
        self.cursor = int(state["cursor"])
        self.row_doc = [int(d) for d in state["row_doc"]]
        self.row_pos = [int(p) for p in state["row_pos"]]
        self._order = self._shuffled()

    def _shuffled(self):   # the order of the documents in pass `epoch`
        return np.random.default_rng([self.seed, self.epoch]).permutation(len(self.doc_start))

def eval_windows(tokens, n, length, seed=0, eot_token=None):
    """n seeded windows -> int64 [n, length], no two sharing a token: the metrics' standard errors and paired
    tests treat the windows as independent samples. With eot_token each starts a distinct document that
    holds all of it (to the next eot), so it never reads into another document."""
    rng = np.random.default_rng(seed)
    if eot_token is not None:
        starts = np.flatnonzero(np.asarray(tokens) == eot_token)
        ends = np.append(starts[1:], len(tokens))   # each document's end: the next eot
        candidates = starts[ends - starts >= length]
        require(len(candidates) >= n, f"eval_windows: only {len(candidates)} documents hold a window of "
                f"{length} tokens, {n} asked: use fewer or shorter windows or more documents")
        return _windows(tokens, rng.choice(candidates, size=n, replace=False), length)
    slack = len(tokens) - n * length   # the tokens no window covers
    require(slack >= 0, f"eval_windows: {n} disjoint windows of {length} need {n * length} tokens, the split "
            f"holds {len(tokens)}: use fewer or shorter windows or more data")
    # Uniform over every placement of n disjoint windows: n distinct sorted picks of range(slack + n), each
    # less its rank, are the uncovered tokens before each window (stars and bars).
    before = np.sort(rng.choice(slack + n, size=n, replace=False)) - np.arange(n)
    starts = before + np.arange(n) * length
    return _windows(tokens, rng.permutation(starts), length)

class TaskSampler:
    """x, y of task_fn(seed=[seed, step, row, 1], length=seq_len + 1, ...), y -100 (ignored) but on the
    answer; eot pads on the RIGHT: each row reads its example from the initial state, as evaluation does."""

    def __init__(self, task_fn, batch_size, seed=0, **task_kwargs):
        self.task_fn = task_fn
        self.batch_size = batch_size
        self.seed = seed
        self.task_kwargs = task_kwargs
        self.pad_id = get_tokenizer(task_kwargs.get("tokenizer", "bytes")).eot_token
        self.step = 0

    def next_samples(self):
        samples = [self.task_fn(seed=[self.seed, self.step, row, 1], **self.task_kwargs)
                   for row in range(self.batch_size)]
        self.step += 1
        return samples

    def next_batch(self):
        samples = self.next_samples()   # padded on the right: pad_sequence(rows, batch_first, value)
        tokens = pad_sequence([torch.as_tensor(s.tokens) for s in samples], True, self.pad_id)
        answer = pad_sequence([torch.as_tensor(s.answer_mask) for s in samples], True)
        return Batch(tokens[:, :-1].contiguous(), tokens[:, 1:].masked_fill(~answer[:, 1:], -100), None)

    state_dict = RandomWindows.state_dict   # (seed, step): all that the next batches depend on
    load_state_dict = RandomWindows.load_state_dict

def _windows(tokens, starts, length):   # tokens[s : s+length] for each start -> int64 [len(starts), length]
    return torch.from_numpy(np.stack([np.asarray(tokens[s:s + length]) for s in starts]).astype(np.int64))

def _batch(windows, new_doc=None):   # windows of seq_len + 1 tokens -> Batch: y is x shifted by one
    return Batch(windows[:, :-1].contiguous(), windows[:, 1:].contiguous(), new_doc)
