"""
Data for the length-generalization experiments: tokenizers, corpora, batch samplers, and the
exact loss floor of a synthetic in-context process.

The paper's question is what a recurrent model does PAST its training length T_train, so the
data side provides:
  1. a training stream cut into random windows of T_train tokens (RandomWindows): the baseline
     (zero initial state), Random/Fitted Noise and State Passing all train on independent windows;
  2. an ordered stream for TBTT (DocumentStreams): each batch row walks through ONE document chunk
     by chunk, so chunk k+1 can start from chunk k's final state;
  3. evaluation windows much longer than T_train (eval_windows);
  4. an in-context Markov process whose Bayes-optimal loss is known exactly at every position
     (markov_bayes_nll). That floor keeps improving with context, so a model that stops using its
     context past T_train shows up as a growing gap, with no text-content noise in the measurement;
     its switching variant (matrix redrawn at random change points) has an exact floor too
     (switching_bayes_nll), which must forget as well as count;
  5. the long-context tasks of the paper's Sec. 5 (passkey retrieval, synthetic copying,
     BABILong-style bAbI QA): example generators, batching with the loss on the answer only
     (TaskSampler), and their scores.

Stream format, for every source: one flat array of token ids in which every document is PRECEDED
by the end-of-text token, [eot d1 eot d2 ... eot dn]. A window that starts at an eot therefore
starts at a document start, and the model always sees the same "a document begins" marker.
(Pre-tokenized nanoGPT .bin files put eot AFTER each document; the samplers accept both, since a
document is simply whatever lies between two eot tokens.)
"""
import dataclasses
import functools
import glob
import hashlib
import json
import math
import os
import re
import shutil
import sysconfig
import tempfile
import time
from typing import Callable, NamedTuple, Optional

import numpy as np
import tiktoken
import tiktoken.load
import torch
from tqdm import tqdm

EOT = "<|endoftext|>"
REPO_DIR = os.path.dirname(os.path.abspath(__file__))
DEFAULT_CACHE_DIR = os.path.join(REPO_DIR, "data_cache")  # gitignored
CACHE_VERSION = 1  # bump when the cache layout or the document format changes


class DataError(ValueError):
    """Bad --data / --tokenizer input or unusable data. The message is one line naming the fix."""


class TokenizerUnavailableError(RuntimeError):
    """A tiktoken encoding whose vocabulary file is not on this machine (we never download)."""


# ----------------------------------------------------------------------------------------------
# Tokenizers
# ----------------------------------------------------------------------------------------------

def get_tokenizer(name="bytes"):
    """A tiktoken.Encoding. "bytes": every byte is one token (id = byte value), plus <|endoftext|>
    = 256, built in code so it works on any machine. Other names (gpt2, cl100k_base, ...) come from
    tiktoken's cache and are never downloaded: runs must not depend on the network."""
    if name == "bytes":
        return _bytes_encoding()
    known = tiktoken.list_encoding_names()
    if name not in known:
        raise DataError(f"unknown tokenizer {name!r}: use bytes or one of {', '.join(known)}")
    return _cached_tiktoken_encoding(name)


@functools.lru_cache(maxsize=None)
def _bytes_encoding():
    # With no merges, BPE leaves every byte alone, so the pre-split pattern only bounds the piece
    # length (speed). It must never match the empty string: tiktoken 0.14 panics on empty pieces.
    return tiktoken.Encoding(
        name="bytes",
        pat_str=r"[\s\S]{1,256}",
        mergeable_ranks={bytes([i]): i for i in range(256)},
        special_tokens={EOT: 256},
    )


class _DownloadRefused(Exception):
    pass


def _cached_tiktoken_encoding(name):
    # tiktoken looks in its cache first and otherwise downloads through `requests`, which can hang
    # for a long time where DNS or the firewall drops packets. Swapping its file reader for one that
    # refuses URLs makes a missing file fail at once, while a cached file still loads as usual.
    original = tiktoken.load.read_file

    def read_local_only(blobpath):
        if "://" in blobpath:
            raise _DownloadRefused(blobpath)
        return original(blobpath)

    tiktoken.load.read_file = read_local_only
    try:
        return tiktoken.get_encoding(name)
    except _DownloadRefused:
        cache = (os.environ.get("TIKTOKEN_CACHE_DIR") or os.environ.get("DATA_GYM_CACHE_DIR")
                 or os.path.join(tempfile.gettempdir(), "data-gym-cache"))
        raise TokenizerUnavailableError(
            f"tokenizer {name!r} is not available offline (its file is not in the tiktoken cache "
            f"{cache}): set TIKTOKEN_CACHE_DIR to a folder holding the cached file, "
            f"or use --tokenizer bytes") from None
    finally:
        tiktoken.load.read_file = original


# ----------------------------------------------------------------------------------------------
# Data: one entry point, load_data
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Data:
    name: str
    train: np.ndarray          # 1-D token ids (often a read-only np.memmap)
    val: np.ndarray
    vocab_size: int
    eot_token: int
    tokenizer: Optional[tiktoken.Encoding]   # None for synthetic processes
    # optimal_nll(windows [n, T]) -> [n, T-1]: the exact Bayes-optimal loss of predicting
    # windows[:, t+1] from windows[:, :t+1]; only where the process makes it computable (markov).
    optimal_nll: Optional[Callable] = None
    info: dict = dataclasses.field(default_factory=dict)   # doc counts, cache path, process params


def load_data(data="stdlib", tokenizer="bytes", seed=0, val_fraction=0.05, cache_dir=None):
    """Load a token stream split into train/val.

    data: "stdlib" (the Python standard library's .py files), "markov:k=8,alpha=0.3,..." (synthetic,
    see MARKOV_DEFAULTS; the tokenizer argument is ignored), or a path: a text file, a directory
    (all text files under it), a glob (quote it), or a pre-tokenized nanoGPT .bin file (flat uint16;
    name it *.u32.bin for uint32). A name in NAMED_DATA wins over a same-named path: write ./markov.
    Text is split train/val BY DOCUMENT (a file) with `seed`, so no document is in both splits; a
    single document or a .bin is split by tokens instead (val = the last val_fraction).
    Tokenized text is cached once as a memory-mapped file under cache_dir (default data_cache/).
    """
    if not 0 <= val_fraction < 1:
        raise DataError(f"val_fraction must be in [0, 1), got {val_fraction}")
    name, _, spec = data.partition(":")
    if name in NAMED_DATA:
        return NAMED_DATA[name](spec, tokenizer, seed, val_fraction, cache_dir)
    if data.endswith(".bin"):
        return _load_bin(data, tokenizer, val_fraction)
    files = _text_files(data)
    return _load_documents(data, files, tokenizer, seed, val_fraction, cache_dir)


def _load_stdlib(spec, tokenizer, seed, val_fraction, cache_dir):
    # Every Python install has its standard library: real, long-range-structured text with no
    # download. Excluded: site-packages (differs per machine) and the test folders (test/, tests/,
    # idle_test/): several distributions strip them, so keeping them would make the corpus depend
    # on the install; they also hold deliberately odd files. CPython 3.11: 734 files, 12.1 MB.
    if spec:
        raise DataError(f"stdlib takes no options, got 'stdlib:{spec}'")
    root = sysconfig.get_paths()["stdlib"]
    skip_dirs = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in skip_dirs and not d.startswith(".")]
        files += [os.path.join(dirpath, f) for f in filenames if f.endswith(".py")]
    if not files:
        raise DataError(f"no .py files found in the standard library at {root}: pass --data PATH")
    return _load_documents("stdlib", sorted(files), tokenizer, seed, val_fraction, cache_dir)


def _load_documents(label, files, tokenizer, seed, val_fraction, cache_dir):
    """Text files -> cached token stream. Each file is one document."""
    enc = get_tokenizer(tokenizer)
    # The cache key covers everything the tokens depend on: which files (and their versions, via
    # size and mtime), the tokenizer, and the split. Any change builds a new cache file.
    stats = [(os.path.abspath(f), st.st_size, st.st_mtime_ns) for f in files for st in [os.stat(f)]]
    key_src = json.dumps([CACHE_VERSION, enc.name, seed, val_fraction, stats])
    key = hashlib.sha1(key_src.encode()).hexdigest()[:16]
    stem = "".join(c if c.isalnum() or c in "-_" else "_" for c in os.path.basename(label.rstrip("/*")))
    base = os.path.join(cache_dir or DEFAULT_CACHE_DIR, f"{stem or 'data'}-{enc.name}-{key}")
    if not os.path.exists(base + ".json"):   # the json is written last: it marks a complete cache
        _build_cache(base, label, files, enc, seed, val_fraction)
    with open(base + ".json") as f:
        meta = json.load(f)
    tokens = np.memmap(base + ".bin", dtype=meta["dtype"], mode="r")
    n_train = meta["n_train"]
    info = {k: meta[k] for k in ("docs_train", "docs_val", "skipped_files")}
    info["cache"] = base + ".bin"
    return Data(name=label, train=tokens[:n_train], val=tokens[n_train:], vocab_size=enc.n_vocab,
                eot_token=enc.eot_token, tokenizer=enc, info=info)


def _load_bin(path, tokenizer, val_fraction):
    # nanoGPT's prepare.py output: a flat array of token ids, already in our on-disk format, so it
    # is memory-mapped directly. Its documents cannot be recovered as files, so val is its tail.
    if not os.path.isfile(path):
        raise DataError(f"no such file {path!r}: pass an existing pre-tokenized .bin file")
    dtype = np.uint32 if path.endswith(".u32.bin") else np.uint16
    size = os.path.getsize(path)
    if size == 0 or size % np.dtype(dtype).itemsize:
        raise DataError(f"{path!r} has {size} bytes, not a whole number of {np.dtype(dtype).name} "
                        f"tokens: nanoGPT .bin files are flat uint16 (name uint32 files *.u32.bin)")
    enc = get_tokenizer(tokenizer)
    tokens = np.memmap(path, dtype=dtype, mode="r")
    # A full max() over billions of tokens is slow; the head catches the usual mistake (forgetting
    # --tokenizer gpt2 for a GPT-2 .bin).
    head_max = int(tokens[: 1 << 20].max())
    if head_max >= enc.n_vocab:
        raise DataError(f"{path!r} holds token id {head_max}, beyond tokenizer {enc.name!r} "
                        f"(vocab {enc.n_vocab}): pass the --tokenizer that made the file")
    n_val = int(round(len(tokens) * val_fraction))
    n_train = len(tokens) - n_val
    return Data(name=path, train=tokens[:n_train], val=tokens[n_train:], vocab_size=enc.n_vocab,
                eot_token=enc.eot_token, tokenizer=enc, info={"cache": path})


# ----------------------------------------------------------------------------------------------
# The in-context Markov process
# ----------------------------------------------------------------------------------------------
# Each document draws its OWN transition matrix P (K x K, rows ~ Dirichlet(alpha)), a uniform first
# token, then doc_len tokens of the chain. Nothing about P is shared across documents, so the only
# way to predict well is to count bigrams in the context: exactly the long-range in-context skill
# whose failure past T_train the paper studies. Small alpha = peaked rows = more to gain from context.

# shared=C > 0 makes the documents RELATED: a base matrix G (rows ~ Dirichlet(alpha)) is drawn once
# per seed, and each document's row i ~ Dirichlet(C * G_i): larger C, documents closer to G. Another
# document's counts are then partly right for this one (the setting where State Passing's foreign
# states could be realistic starts); the exact floor uses the prior C * G instead of alpha.
MARKOV_DEFAULTS = dict(k=8, alpha=0.3, doc_len=4096, docs=2048, val_docs=256, shared=0.0)


def markov_prior(k, alpha, shared=0.0, seed=0):
    """[k, k] Dirichlet pseudo-counts of each document's rows: alpha everywhere (independent
    documents), or shared * G with the base matrix G of this seed (related documents)."""
    if not shared:
        return np.full((k, k), float(alpha))
    return shared * np.random.default_rng([seed, 2]).dirichlet(np.full(k, alpha), size=k)


def sample_markov(k, alpha, doc_len, docs, seed=0, split="train", shared=0.0):
    """docs documents -> (tokens [docs, doc_len] int64 in 0..k-1, transitions [docs, k, k]).

    Document d of a split is a pure function of (seed, split, d): it does not depend on how many
    documents are drawn, and train and val use different seed streams. shared: see above.
    """
    prior = markov_prior(k, alpha, shared, seed)
    split_id = {"train": 0, "val": 1}[split]
    tokens = np.empty((docs, doc_len), dtype=np.int64)
    transitions = np.empty((docs, k, k))
    for lo in range(0, docs, 256):   # blocks bound the memory of the uniforms below
        hi = min(lo + 256, docs)
        u = np.empty((doc_len, hi - lo))   # time-major: each step reads one contiguous row
        for doc in range(lo, hi):
            rng = np.random.default_rng([seed, split_id, doc])
            transitions[doc] = np.stack([rng.dirichlet(row) for row in prior]) if shared else \
                rng.dirichlet(np.full(k, alpha), size=k)   # independent documents: the original draw
            u[:, doc - lo] = rng.random(doc_len)
        # Inverse-CDF sampling, vectorised over the documents of the block, a loop over time.
        cdf = np.cumsum(transitions[lo:hi], axis=-1)
        cdf[..., -1] = 1.0            # rounding must not leave u above the last bin
        rows = np.arange(hi - lo)
        block = np.empty((doc_len, hi - lo), dtype=np.int64)
        block[0] = np.minimum((u[0] * k).astype(np.int64), k - 1)   # first token: uniform
        for t in range(1, doc_len):
            block[t] = (cdf[rows, block[t - 1]] < u[t, :, None]).sum(-1)
        tokens[lo:hi] = block.T
    return tokens, transitions


def markov_bayes_nll(tokens, k, alpha, prior=None):
    """Exact Bayes-optimal per-position NLL (nats) of the in-context Markov process.

    tokens [n, T] (numpy or torch): windows that start at a document start, either at its eot
    (= k) or at its first token. Returns [n, T-1] (same library as the input, float64): entry t is
    -log p(tokens[:, t+1] | tokens[:, :t+1]). With a Dirichlet(alpha) prior on each row of P, the
    posterior predictive after bigram counts c is
        p(j | i, c) = (c_ij + alpha) / (sum_j' c_ij' + K alpha),
    and the first token of a document (predicted from the eot) has p = 1/K. prior: [k, k]
    pseudo-counts replacing alpha (markov_prior: related documents).
    """
    is_tensor = torch.is_tensor(tokens)
    x = torch.as_tensor(np.asarray(tokens) if not is_tensor else tokens).long().cpu()
    if x.dim() != 2 or x.shape[1] < 2:
        raise DataError(f"markov_bayes_nll: tokens must have shape [n, T >= 2], got {list(x.shape)}")
    if ((x < 0) | (x > k)).any():
        raise DataError(f"markov_bayes_nll: token ids must be in 0..{k} (k = {k} is eot)")
    if (x[:, 1:] == k).any():
        raise DataError("markov_bayes_nll: a window crosses a document boundary (eot after its "
                        "first position): use windows from document starts with length <= doc_len + 1")
    n, T = x.shape
    rows = torch.arange(n)
    prior = torch.full((k, k), float(alpha), dtype=torch.float64) if prior is None else \
        torch.as_tensor(prior, dtype=torch.float64)
    counts = torch.zeros(n, k, k, dtype=torch.float64)   # counts[r, i, j]: bigrams i -> j so far
    nll = torch.empty(n, T - 1, dtype=torch.float64)
    for t in range(T - 1):
        prev, nxt = x[:, t], x[:, t + 1]
        at_start = prev == k              # eot: the first token of a document is uniform, p = 1/K
        prev = prev.clamp(max=k - 1)
        row = counts[rows, prev] + prior[prev]   # [n, k] posterior pseudo-counts
        nll[:, t] = torch.log(row.sum(-1)) - torch.log(row[rows, nxt])
        nll[at_start, t] = math.log(k)
        counts[rows, prev, nxt] += (~at_start).double()   # (eot, first token) is not a bigram of P
    return nll if is_tensor else nll.numpy()


def _load_markov(spec, tokenizer, seed, val_fraction, cache_dir):
    # Synthetic and fast to regenerate (~1 s for the defaults), so it is not cached on disk;
    # the tokenizer, val_fraction and cache_dir do not apply.
    cfg = _parse_options("markov", spec, MARKOV_DEFAULTS)
    k, alpha, shared = cfg["k"], cfg["alpha"], cfg["shared"]
    if not (2 <= k < 65535 and alpha > 0 and cfg["doc_len"] >= 2 and cfg["docs"] >= 1
            and cfg["val_docs"] >= 1 and shared >= 0):
        raise DataError(f"markov: need 2 <= k < 65535, alpha > 0, doc_len >= 2, docs >= 1, "
                        f"val_docs >= 1, shared >= 0; got {spec!r}")

    def stream(docs, split):
        tokens, _ = sample_markov(k, alpha, cfg["doc_len"], docs, seed, split, shared)
        eot = np.full((docs, 1), k)
        return np.concatenate([eot, tokens], axis=1).reshape(-1).astype(np.uint16)

    name = "markov:" + ",".join(f"{key}={value}" for key, value in cfg.items() if key != "shared" or shared)
    return Data(name=name, train=stream(cfg["docs"], "train"), val=stream(cfg["val_docs"], "val"),
                vocab_size=k + 1, eot_token=k, tokenizer=None,
                optimal_nll=functools.partial(markov_bayes_nll, k=k, alpha=alpha,
                                              prior=markov_prior(k, alpha, shared, seed)), info=cfg)


# ----------------------------------------------------------------------------------------------
# The switching (change-point) Markov process
# ----------------------------------------------------------------------------------------------
# The in-context Markov process above never changes its matrix inside a document, so the ideal
# predictor counts forever, and a state that has read ANOTHER document is never a realistic start
# (it holds another chain's counts). Here the transition matrix is redrawn at random change points:
# before each transition s >= 1 of a document, with probability `hazard`, a fresh P (rows ~
# Dirichlet(alpha)) takes over. The ideal predictor must now count AND forget: it weighs the counts
# of the last r transitions by the posterior probability that the current segment is r transitions
# long (Bayesian online change-point detection, Adams & MacKay 2007). Having read an unrelated
# stretch of tokens before the current segment is an ordinary event of this process (a change point
# happened), so a State Passing start is not impossible here, as it is in "markov"; it is typical
# only when hazard * T_train is not small (State Passing puts an unmarked change point at EVERY
# window start). The document start (eot) is a change point that is known: every document starts a
# fresh segment and a uniform first token.

SWITCHING_DEFAULTS = dict(k=8, alpha=0.3, hazard=1 / 512, doc_len=4096, docs=1024, val_docs=256)


def sample_switching(k, alpha, hazard, doc_len, docs, seed=0, split="train"):
    """docs documents -> (tokens [docs, doc_len] int64 in 0..k-1, segment [docs, doc_len] int64).

    segment[d, t] is the index (within document d) of the segment whose matrix drew token t (the
    transition tokens[d, t-1] -> tokens[d, t]); token 0 is uniform and belongs to segment 0.
    Document d of a split is a pure function of (seed, split, d), as in sample_markov; train and
    val use different seed streams, and none of them is one of sample_markov's.
    """
    split_id = {"train": 0, "val": 1}[split]
    tokens = np.empty((docs, doc_len), dtype=np.int64)
    segment = np.empty((docs, doc_len), dtype=np.int64)
    for lo in range(0, docs, 256):   # blocks bound the memory, as in sample_markov
        hi = min(lo + 256, docs)
        seg, P, u = [], [], np.empty((doc_len, hi - lo))
        for doc in range(lo, hi):
            rng = np.random.default_rng([seed, split_id, doc, 1])
            cut = rng.random(doc_len) < hazard
            cut[:2] = False            # token 0 is uniform; transition 0 -> 1 opens segment 0
            seg.append(np.cumsum(cut))
            P.append(rng.dirichlet(np.full(k, alpha), size=(seg[-1][-1] + 1, k)))
            u[:, doc - lo] = rng.random(doc_len)
        seg = np.stack(seg)                                        # [docs, doc_len]
        cdf = np.zeros((hi - lo, max(len(p) for p in P), k, k))    # padded to the most segments
        for i, p in enumerate(P):
            cdf[i, :len(p)] = np.cumsum(p, axis=-1)
        cdf[..., -1] = 1.0
        rows = np.arange(hi - lo)
        block = np.empty((doc_len, hi - lo), dtype=np.int64)
        block[0] = np.minimum((u[0] * k).astype(np.int64), k - 1)
        for t in range(1, doc_len):
            block[t] = (cdf[rows, seg[:, t], block[t - 1]] < u[t, :, None]).sum(-1)
        tokens[lo:hi], segment[lo:hi] = block.T, seg
    return tokens, segment


def switching_bayes_nll(tokens, k, alpha, hazard):
    """Exact Bayes-optimal per-position NLL (nats) of the switching Markov process.

    tokens [n, T] (numpy or torch) start at a document start, at its eot (= k) or its first token;
    returns [n, T-1] float64 (same library as the input): entry t is -log p(tokens[:, t+1] |
    tokens[:, :t+1]). No truncation: every run length 0..t is kept (O(T^2) per window: ~10 s for 64
    windows of 4096 tokens with one torch thread; the per-step tensors are small, so extra threads
    on a busy CPU only slow it down).

    Run length r = how many of the observed transitions belong to the current segment. With q(r)
    its posterior after the last token x, the next transition first lets a change point happen,
        pi(r) = (1 - hazard) q(r) + hazard [r = 0],
    then x -> j has probability sum_r pi(r) (c_r(x, j) + alpha) / (n_r(x) + K alpha), where c_r and
    n_r count the last r transitions (c_r(x, j): x -> j; n_r(x): from x), and q'(r + 1) is
    proportional to pi(r) times that r's term. Counts of the last r transitions are differences of
    prefix counts, so each step is a few vector operations over r.
    """
    is_tensor = torch.is_tensor(tokens)
    x = torch.as_tensor(np.asarray(tokens) if not is_tensor else tokens).long().cpu()
    if x.dim() != 2 or x.shape[1] < 2:
        raise DataError(f"switching_bayes_nll: tokens must have shape [n, T >= 2], got {list(x.shape)}")
    if ((x < 0) | (x > k)).any():
        raise DataError(f"switching_bayes_nll: token ids must be in 0..{k} (k = {k} is eot)")
    if (x[:, 1:] == k).any():
        raise DataError("switching_bayes_nll: a window crosses a document boundary (eot after its "
                        "first position): use windows from document starts with length <= doc_len + 1")
    nll = torch.empty(x.shape[0], x.shape[1] - 1, dtype=torch.float64)
    start = (x[:, 0] == k).long()    # 1 where the window begins with the eot
    # eot -> first token is always -log(1/K); windows with and without the eot are done apart
    for has_eot in (1, 0):
        rows = torch.nonzero(start == has_eot).flatten()
        if len(rows) == 0:
            continue
        chain = x[rows, has_eot:]                   # [m, L]: the document's tokens
        out = _switching_chain_nll(chain, k, alpha, hazard)   # [m, L-1]
        if has_eot:
            nll[rows, 0] = math.log(k)
            nll[rows, 1:] = out
        else:
            nll[rows] = out
    return nll if is_tensor else nll.numpy()


def _switching_chain_nll(chain, k, alpha, hazard):
    # chain [m, L] from a document's first token -> [m, L-1]: -log p(chain[:, t+1] | chain[:, :t+1])
    m, L = chain.shape
    rows = torch.arange(m)
    # pair[:, s] = id of transition s (chain[s] -> chain[s+1]); prefix counts over transitions
    pair = chain[:, :-1] * k + chain[:, 1:]
    pair_prefix = torch.zeros(m, k * k, L, dtype=torch.int32)   # [:, p, s]: count of p among transitions < s
    pair_prefix[:, :, 1:] = torch.cumsum(torch.nn.functional.one_hot(pair, k * k).to(torch.int32), 1).transpose(1, 2)
    from_prefix = pair_prefix.view(m, k, k, L).sum(2)             # [:, i, s]: transitions < s from i
    q = torch.ones(m, 1, dtype=torch.float64)                     # q(r), r = 0..t
    nll = torch.empty(m, L - 1, dtype=torch.float64)
    for t in range(L - 1):
        pi = (1 - hazard) * q
        pi[:, 0] += hazard
        # r = 0..t: the last r transitions are transitions t-r .. t-1, counted as prefix(t) - prefix(t-r)
        a, p = chain[:, t], pair[:, t]
        c = pair_prefix[rows, p, : t + 1].flip(1)                 # [:, r]: prefix at t - r
        n = from_prefix[rows, a, : t + 1].flip(1)
        c = (c[:, :1] - c).double()                               # flip(1)[:, 0] is the prefix at t
        n = (n[:, :1] - n).double()
        joint = pi * (c + alpha) / (n + k * alpha)                # [m, t+1]
        prob = joint.sum(1)
        nll[:, t] = -torch.log(prob)
        q = torch.cat([torch.zeros(m, 1, dtype=torch.float64), joint / prob[:, None]], 1)
    return nll


def _load_switching(spec, tokenizer, seed, val_fraction, cache_dir):
    # Like _load_markov: regenerated on every load (~1 s for the defaults), not cached.
    cfg = _parse_options("switching", spec, SWITCHING_DEFAULTS)
    k, alpha, hazard = cfg["k"], cfg["alpha"], cfg["hazard"]
    if not (2 <= k < 65535 and alpha > 0 and 0 <= hazard <= 1 and cfg["doc_len"] >= 2
            and cfg["docs"] >= 1 and cfg["val_docs"] >= 1):
        raise DataError(f"switching: need 2 <= k < 65535, alpha > 0, 0 <= hazard <= 1, doc_len >= 2, "
                        f"docs >= 1, val_docs >= 1; got {spec!r}")

    def stream(docs, split):
        tokens, _ = sample_switching(k, alpha, hazard, cfg["doc_len"], docs, seed, split)
        eot = np.full((docs, 1), k)
        return np.concatenate([eot, tokens], axis=1).reshape(-1).astype(np.uint16)

    name = "switching:" + ",".join(f"{key}={value}" for key, value in cfg.items())
    return Data(name=name, train=stream(cfg["docs"], "train"), val=stream(cfg["val_docs"], "val"),
                vocab_size=k + 1, eot_token=k, tokenizer=None,
                optimal_nll=functools.partial(switching_bayes_nll, k=k, alpha=alpha, hazard=hazard),
                info=cfg)


# Named data sources: name -> function(spec, tokenizer, seed, val_fraction, cache_dir) -> Data.
# Anything else given as --data is a path.
NAMED_DATA = {"stdlib": _load_stdlib, "markov": _load_markov, "switching": _load_switching}


# ----------------------------------------------------------------------------------------------
# Samplers (used by train.py). A resumed run must continue EXACTLY where it stopped, so each
# sampler's randomness is a pure function of (seed, counter): the state is a few integers.
# ----------------------------------------------------------------------------------------------

class RandomWindows:
    """Independent windows of seq_len+1 tokens from anywhere in the stream (they may cross
    documents, like nanoGPT). Used by the zero-state baseline, noise interventions and SP."""

    def __init__(self, tokens, batch_size, seq_len, seed=0):
        if len(tokens) < seq_len + 1:
            raise DataError(f"RandomWindows: {len(tokens)} tokens cannot hold a window of seq_len+1 "
                            f"= {seq_len + 1}: use a shorter seq_len or more data")
        self.tokens, self.batch_size, self.seq_len, self.seed = tokens, batch_size, seq_len, seed
        self.step = 0   # batches drawn so far

    def next_batch(self):
        """-> x, y: int64 [batch_size, seq_len], y = x shifted left by one token."""
        rng = np.random.default_rng([self.seed, self.step])
        self.step += 1
        starts = rng.integers(0, len(self.tokens) - self.seq_len, size=self.batch_size)
        w = _gather(self.tokens, starts, self.seq_len + 1)
        return w[:, :-1].contiguous(), w[:, 1:].contiguous()

    def state_dict(self):
        return {"seed": self.seed, "step": self.step}

    def load_state_dict(self, state):
        self.seed, self.step = int(state["seed"]), int(state["step"])


class DocumentStreams:
    """Ordered chunks for TBTT. Batch row r reads one document as consecutive chunks: chunk k+1's
    inputs begin exactly where chunk k's inputs ended (each chunk is seq_len+1 tokens, overlapping
    the next by the one token that is chunk k's last target). When the row's document cannot fill
    another chunk, its remaining tail is dropped and the row takes the next document from a seeded
    shuffled order (reshuffled each pass); new_doc[r] is then True so train.py resets that row's
    state to zero. A document is a run of tokens between eot tokens, without the eots: that treats
    our eot-before streams and nanoGPT's eot-after .bin files alike (the reset to the zero state
    already marks the start). Documents shorter than seq_len+1 tokens are skipped: they cannot fill
    even one chunk."""

    def __init__(self, tokens, eot_token, batch_size, seq_len, seed=0):
        self.tokens, self.batch_size, self.seq_len, self.seed = tokens, batch_size, seq_len, seed
        eot_at = np.flatnonzero(np.asarray(tokens) == eot_token)
        starts = np.concatenate([[0], eot_at + 1])
        ends = np.concatenate([eot_at, [len(tokens)]])
        keep = ends - starts >= seq_len + 1
        self.doc_start, self.doc_len = starts[keep], (ends - starts)[keep]
        if len(self.doc_start) == 0:
            raise DataError(f"DocumentStreams: no document has seq_len+1 = {seq_len + 1} tokens: "
                            f"use a shorter seq_len or longer documents")
        self.epoch, self.cursor = 0, 0                 # position in the shuffled document order
        self.row_doc = [-1] * batch_size                # -1: the row needs a document
        self.row_pos = [0] * batch_size                 # offset of the row's next chunk in its doc
        self._order = self._shuffled(0)

    def _shuffled(self, epoch):
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.doc_start))

    def _next_document(self):
        if self.cursor == len(self._order):
            self.epoch, self.cursor = self.epoch + 1, 0
            self._order = self._shuffled(self.epoch)
        self.cursor += 1
        return int(self._order[self.cursor - 1])

    def next_batch(self):
        """-> x, y: int64 [batch_size, seq_len]; new_doc: bool [batch_size]."""
        chunk = self.seq_len + 1
        new_doc = torch.zeros(self.batch_size, dtype=torch.bool)
        starts = np.empty(self.batch_size, dtype=np.int64)
        for r in range(self.batch_size):
            d = self.row_doc[r]
            if d < 0 or self.row_pos[r] + chunk > self.doc_len[d]:
                d = self._next_document()
                self.row_doc[r], self.row_pos[r], new_doc[r] = d, 0, True
            starts[r] = self.doc_start[d] + self.row_pos[r]
            self.row_pos[r] += self.seq_len
        w = _gather(self.tokens, starts, chunk)
        return w[:, :-1].contiguous(), w[:, 1:].contiguous(), new_doc

    def state_dict(self):
        return {"seed": self.seed, "epoch": self.epoch, "cursor": self.cursor,
                "row_doc": list(self.row_doc), "row_pos": list(self.row_pos)}

    def load_state_dict(self, state):
        if len(state["row_doc"]) != self.batch_size:
            raise DataError(f"DocumentStreams: saved state has {len(state['row_doc'])} rows, this "
                            f"sampler {self.batch_size}: resume with the same batch size")
        self.seed, self.epoch, self.cursor = int(state["seed"]), int(state["epoch"]), int(state["cursor"])
        self.row_doc = [int(d) for d in state["row_doc"]]
        self.row_pos = [int(p) for p in state["row_pos"]]
        self._order = self._shuffled(self.epoch)


def eval_windows(tokens, n, length, seed=0, eot_token=None):
    """n deterministic windows of `length` tokens -> int64 [n, length] (the model reads
    w[:, :-1] and is scored on w[:, 1:]). With eot_token given, every window starts at a document
    start (at an eot, distinct documents), as markov_bayes_nll needs for an exact floor; with
    markov data, length <= doc_len + 1 keeps each window inside one document."""
    if len(tokens) < length:
        raise DataError(f"eval_windows: {len(tokens)} tokens cannot hold a window of {length}: "
                        f"use a shorter length or more validation data")
    rng = np.random.default_rng(seed)
    last = len(tokens) - length   # the last start at which a window fits
    if eot_token is None:
        starts = rng.integers(0, last + 1, size=n)
    else:
        candidates = np.flatnonzero(np.asarray(tokens[: last + 1]) == eot_token)
        if len(candidates) < n:
            raise DataError(f"eval_windows: only {len(candidates)} documents start a window of "
                            f"{length} tokens, {n} requested: use fewer windows, a shorter length, "
                            f"or more validation documents")
        starts = rng.choice(candidates, size=n, replace=False)
    return _gather(tokens, starts, length)


# ----------------------------------------------------------------------------------------------
# Long-context tasks of the paper (Sec. 5): passkey retrieval, synthetic copying, BABILong-style QA
# ----------------------------------------------------------------------------------------------
# Every generator returns a Sample(tokens, answer_mask, meta):
#   tokens       int64 [n]: the WHOLE example, prompt and answer, through the same tokenizer as the
#                LM data. It starts with the eot token, like every document of our streams, so a
#                task example looks like "a document begins" to the model.
#   answer_mask  bool [n]: the answer tokens, always the last tokens of the example. They are the
#                only tokens the loss is computed on (the paper fine-tunes passkey "with the loss
#                only on the answer") and the ones scoring checks.
#   meta         dict: the task's ground truth (answer text, key, depth, the simulated world...).
# A generator is a pure function of its seed (an int or a sequence of ints, as np.random accepts).
# The seed is split into independent streams for the content (key, story, string) and the layout
# (depth, filler window), so one seed gives the same key / story at every length of an eval grid.
#
# Batches: collate() LEFT-pads to the longest example with pad_id (default: eot). A recurrent
# model carries everything it reads in its state, so pad tokens must not come between the prompt
# and the answer, and right padding after the answer would be loss-free but wasted compute; on the
# left, eot padding reads as a run of empty documents before the example begins (each example
# starts with its own eot). Passkey and BABILong examples of one length need no padding at all;
# copy examples of lengths 50-100 do.
#
# Wiring (train.py / evaluate.py):
#   sampler = TaskSampler(passkey_sample, batch_size, seed, tokenizer="bytes", length=seq_len + 1)
#   sampler = TaskSampler(copy_sample, batch_size, seed, tokenizer="bytes", length=(50, 100))
#   sampler = TaskSampler(babi_sample, batch_size, seed, task=None, tokenizer="bytes",
#                         length=seq_len + 1, filler_tokens=data.train)
#   x, y = sampler.next_batch()       # y = -100 outside the answer: F.cross_entropy works as is
#   Evaluation: s = passkey_sample("bytes", 16384, depth=0.5, seed=i); prompt, answer =
#   split_answer(s); greedy-decode len(answer) tokens (or until "."); then
#   exact_match(cut_answer(enc.decode(pred)), s.meta["answer"]). Use plain int seeds for
#   evaluation: TaskSampler seeds are [seed, step, row, 1], which never equal an int seed.

class Sample(NamedTuple):
    """One task example; a plain tuple, so `tokens, answer_mask, meta = sample` works."""
    tokens: np.ndarray        # int64 [n]
    answer_mask: np.ndarray   # bool [n]
    meta: dict


def split_answer(sample):
    """-> (prompt, answer): int64 token arrays; the model reads the prompt and must produce the answer."""
    tokens, answer_mask = np.asarray(sample[0]), np.asarray(sample[1])
    start = len(tokens) - int(answer_mask.sum())
    return tokens[:start], tokens[start:]


def collate(samples, pad_id):
    """Samples -> x, y, loss_mask: [batch, T-1] with T the longest example; shorter examples are
    LEFT-padded with pad_id (see above). x = tokens[:, :-1], y = tokens[:, 1:] with -100 wherever
    y is not an answer token (F.cross_entropy's default ignore_index), loss_mask = (y != -100)."""
    lengths = [len(s[0]) for s in samples]
    T = max(lengths)
    if T < 2:
        raise ValueError(f"collate: examples need at least 2 tokens, got lengths {lengths}")
    tokens = torch.full((len(samples), T), pad_id, dtype=torch.int64)
    answer = torch.zeros((len(samples), T), dtype=torch.bool)
    for row, (s, n) in enumerate(zip(samples, lengths)):
        tokens[row, T - n:] = torch.as_tensor(np.asarray(s[0], dtype=np.int64))
        answer[row, T - n:] = torch.as_tensor(np.asarray(s[1], dtype=bool))
    loss_mask = answer[:, 1:].contiguous()
    y = tokens[:, 1:].masked_fill(~loss_mask, -100)
    return tokens[:, :-1].contiguous(), y, loss_mask


class TaskSampler:
    """Batches of task examples for train.py, used like RandomWindows: next_batch() -> x, y.
    Row r of batch number `step` is task_fn(seed=[seed, step, r, 1], **task_kwargs), so the state
    is (seed, step) and a resumed run continues exactly. A sample of `length` tokens gives x and y
    of length-1 tokens: pass length=seq_len + 1."""

    def __init__(self, task_fn, batch_size, seed=0, pad_id=None, **task_kwargs):
        self.task_fn, self.batch_size, self.seed, self.task_kwargs = task_fn, batch_size, seed, task_kwargs
        self.pad_id = _encoding(task_kwargs.get("tokenizer", "bytes")).eot_token if pad_id is None else pad_id
        self.step = 0   # batches drawn so far

    def next_samples(self):
        """The next batch as a list of Samples (for scoring during training, or custom collation)."""
        samples = [self.task_fn(seed=[self.seed, self.step, row, 1], **self.task_kwargs)
                   for row in range(self.batch_size)]
        self.step += 1
        return samples

    def next_batch(self):
        """-> x, y: int64 [batch_size, T-1]; y is -100 outside the answer tokens."""
        x, y, _ = collate(self.next_samples(), self.pad_id)
        return x, y

    def state_dict(self):
        return {"seed": self.seed, "step": self.step}

    def load_state_dict(self, state):
        self.seed, self.step = int(state["seed"]), int(state["step"])


# --- Filler text ------------------------------------------------------------------------------
# Our own repetitive filler, in the spirit of the passkey test: it carries no information, so the
# only thing worth remembering is what was hidden in it. Each sentence starts with a space, and is
# tokenized on its own, so sentence boundaries are exact token positions.
FILLER_SENTENCES = (
    " The river runs down to the sea.", " The hills are quiet at night.",
    " The wind is soft today.", " On we walk.", " Up the path and down again.",
)


def _our_filler(enc, n_tokens):
    """-> (tokens int64 [n_tokens], boundaries): the last n_tokens of our filler repeated, so only
    the FIRST sentence may be cut short (a window into a long text) and what is inserted at the end
    follows a whole sentence; boundaries = sorted token positions between whole sentences, where
    something may be inserted: n_tokens, and 0 only if the first sentence is whole."""
    pieces = [enc.encode_ordinary(s) for s in FILLER_SENTENCES]
    cycle = np.concatenate(pieces).astype(np.int64)
    starts = np.cumsum([0] + [len(p) for p in pieces[:-1]])
    reps = n_tokens // len(cycle) + 1
    cut = reps * len(cycle) - n_tokens          # tokens dropped from the front
    tokens = np.tile(cycle, reps)[cut:]
    all_starts = (np.arange(reps)[:, None] * len(cycle) + starts[None, :]).ravel() - cut
    return tokens, np.union1d(all_starts[all_starts >= 0], [n_tokens])


def _corpus_filler(enc, corpus, n_tokens, rng):
    """-> (tokens, boundaries) from a random window of a token stream (e.g. load_data("stdlib").val).
    Boundaries are line starts (and 0: what goes there follows the eot). The stream's eot tokens become newlines: the filler must read as one
    long text, not as several documents (eot means "start over" to a model trained on our streams)."""
    if len(corpus) < n_tokens:
        raise DataError(f"babi_sample: the filler stream has {len(corpus)} tokens, {n_tokens} needed: "
                        f"pass a longer filler_tokens (e.g. load_data('stdlib').train) or a shorter length")
    start = int(rng.integers(0, len(corpus) - n_tokens + 1))
    tokens = np.asarray(corpus[start:start + n_tokens]).astype(np.int64)
    if n_tokens and tokens.max() >= enc.n_vocab:
        raise DataError(f"babi_sample: filler token id {tokens.max()} is beyond tokenizer {enc.name!r} "
                        f"(vocab {enc.n_vocab}): the filler must come from the same tokenizer")
    tokens[tokens == enc.eot_token] = enc.encode_ordinary("\n")[-1]
    line_end = np.flatnonzero(_ends_line(enc)[tokens]) + 1
    return tokens, np.union1d(line_end, [0])


@functools.lru_cache(maxsize=None)
def _ends_line(enc):
    """bool [n_vocab]: which tokens end with a newline (computed once per tokenizer)."""
    table = np.zeros(enc.n_vocab, dtype=bool)
    for t in range(enc.n_vocab):
        try:
            table[t] = enc.decode_single_token_bytes(t).endswith(b"\n")
        except KeyError:   # unused ids between the BPE ranks and the special tokens
            pass
    return table


def _assemble(enc, filler, inserts, question, answer):
    """eot + filler with each (position, piece) of `inserts` (sorted positions in the filler)
    spliced in + question + answer -> (tokens, answer_mask, start of each piece in tokens)."""
    parts, piece_starts, cur, n = [np.array([enc.eot_token])], [], 0, 1
    for pos, piece in inserts:
        parts.append(filler[cur:pos])
        n += pos - cur
        cur = pos
        piece_starts.append(n)
        parts.append(piece)
        n += len(piece)
    parts += [filler[cur:], question, answer]
    tokens = np.concatenate([np.asarray(p, dtype=np.int64) for p in parts])
    answer_mask = np.zeros(len(tokens), dtype=bool)
    answer_mask[len(tokens) - len(answer):] = True
    return tokens, answer_mask, piece_starts


def _encode(enc, text):
    return np.array(enc.encode_ordinary(text), dtype=np.int64)


def _rngs(seed, n):
    """n independent generators from one seed (int or sequence of ints)."""
    return [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(n)]


def _encoding(tokenizer):
    """A tiktoken.Encoding, or the name of one (loaded once)."""
    return _encoding_by_name(tokenizer) if isinstance(tokenizer, str) else tokenizer


@functools.lru_cache(maxsize=None)
def _encoding_by_name(name):
    return get_tokenizer(name)


# --- Passkey retrieval (Fig. 7) ---------------------------------------------------------------

PASSKEY_SENTENCE = " Listen well: the pass key is {key}. Keep {key} in mind, it is the pass key."
PASSKEY_QUESTION = " What is the pass key? The pass key is"


def passkey_sample(tokenizer, length, depth=None, seed=0):
    """A 5-digit pass key hidden in repetitive filler, then the question; exactly `length` tokens.

    depth in [0, 1]: the fraction of the filler before the key sentence, snapped to the nearest
    sentence boundary (so the key never splits a sentence); None draws it uniformly (training).
    The answer is " {key}." (with the period, as in the paper, so the model learns to stop).
    meta: answer (the key as text), key, depth (requested), actual_depth, key_start (token index
    of the key sentence).
    """
    enc = _encoding(tokenizer)
    content_rng, layout_rng = _rngs(seed, 2)
    key = str(int(content_rng.integers(10_000, 100_000)))
    if depth is None:
        depth = float(layout_rng.random())
    if not 0 <= depth <= 1:
        raise ValueError(f"passkey_sample: depth must be in [0, 1], got {depth}")
    needle = _encode(enc, PASSKEY_SENTENCE.format(key=key))
    question, answer = _encode(enc, PASSKEY_QUESTION), _encode(enc, f" {key}.")
    budget = length - 1 - len(needle) - len(question) - len(answer)
    if budget < 0:
        raise ValueError(f"passkey_sample: length {length} is too short, the key sentence and the "
                         f"question alone take {length - budget} tokens")
    filler, boundaries = _our_filler(enc, budget)
    pos = int(boundaries[np.argmin(np.abs(boundaries - depth * budget))])
    tokens, answer_mask, (key_start,) = _assemble(enc, filler, [(pos, needle)], question, answer)
    meta = {"task": "passkey", "answer": key, "key": key, "depth": depth,
            "actual_depth": pos / budget if budget else 0.0, "key_start": key_start, "seed": seed}
    return Sample(tokens, answer_mask, meta)


def passkey_digit_accuracy(pred_text, key):
    """Softer passkey score: the fraction of the key's digits that the first run of digits in
    pred_text gets right, position by position (missing digits count as wrong)."""
    key = str(key)
    digits = re.search(r"\d+", pred_text)
    pred = digits.group() if digits else ""
    return sum(a == b for a, b in zip(pred, key)) / len(key)


# --- Synthetic copying (Table 1) --------------------------------------------------------------
# Format: eot s SEP s EOS. eot is the begin marker (it starts every document anyway); SEP and EOS
# are two control bytes that text corpora practically never contain (ASCII group separator and
# end-of-text), which are single tokens in the bytes tokenizer and in byte-level BPEs (gpt2,
# cl100k). The answer is the copy AND the EOS: like the passkey's period, the EOS teaches the
# model where the copy stops; copy_scores compares only the copied symbols.

COPY_ALPHABET = "abcdefghijklmnopqrstuvwxyz"
COPY_SEP, COPY_EOS = b"\x1d", b"\x03"


def copy_sample(tokenizer, length, seed=0, alphabet=COPY_ALPHABET):
    """A random string of `length` symbols (or a length drawn uniformly from an inclusive (lo, hi)
    range, e.g. (50, 100) for training) to be copied after the separator.

    alphabet: a string of symbols that are each a single token, or a sequence of token ids.
    Total tokens: 2 * length + 3. meta: answer (the string as text, when alphabet is text),
    target (the symbols' token ids), length.
    """
    enc = _encoding(tokenizer)
    rng, = _rngs(seed, 1)
    if not isinstance(length, (int, np.integer)):
        lo, hi = length
        length = int(rng.integers(lo, hi + 1))
    if length < 1:
        raise ValueError(f"copy_sample: length must be >= 1, got {length}")
    if isinstance(alphabet, str):
        ids = np.array([enc.encode_single_token(c.encode()) for c in alphabet], dtype=np.int64)
    else:
        ids = np.asarray(alphabet, dtype=np.int64)
    sep, eos = enc.encode_single_token(COPY_SEP), enc.encode_single_token(COPY_EOS)
    pick = rng.integers(0, len(ids), size=length)
    s = ids[pick]
    tokens = np.concatenate([[enc.eot_token], s, [sep], s, [eos]]).astype(np.int64)
    answer_mask = np.zeros(len(tokens), dtype=bool)
    answer_mask[length + 2:] = True
    meta = {"task": "copy", "length": length, "target": s,
            "answer": "".join(alphabet[i] for i in pick) if isinstance(alphabet, str) else None,
            "seed": seed}
    return Sample(tokens, answer_mask, meta)


def copy_scores(pred_tokens, target_tokens):
    """-> (char_accuracy, whole_string_correct): position-by-position agreement over the target's
    length; a too-short prediction counts its missing positions as wrong, extra tokens are ignored
    (decode exactly len(target) tokens)."""
    pred = [int(t) for t in np.asarray(pred_tokens).reshape(-1)]
    target = [int(t) for t in np.asarray(target_tokens).reshape(-1)]
    if not target:
        raise ValueError("copy_scores: empty target")
    correct = sum(p == t for p, t in zip(pred, target))
    return correct / len(target), correct == len(target)


# --- BABILong-style QA (Fig. 6) ---------------------------------------------------------------
# The ten bAbI task families, generated from a tiny world simulation with our own names and
# sentence templates. A story is a list of events (dicts, meta["events"]); each event has a
# sentence ("text"). The question is asked about the final state; meta["question"] names what is
# asked, so the answer can be re-derived from the events alone (tests do). The events' sentences
# are then hidden, in order, between sentences (our filler) or lines (a corpus) of filler text.

BABI_PEOPLE = ("Alice", "Bruno", "Chloe", "Dmitri", "Elena", "Farid")
BABI_PLACES = ("kitchen", "garden", "hallway", "bedroom", "office", "cellar", "attic", "library")
BABI_OBJECTS = ("apple", "ball", "milk", "key", "book", "lamp")
BABI_DIRECTIONS = {"north": (0, 1), "south": (0, -1), "east": (1, 0), "west": (-1, 0)}
BABI_NUMBERS = ("none", "one", "two", "three", "four", "five", "six")
BABI_TEMPLATES = {
    "move": ("{person} went to the {place}.", "{person} walked into the {place}.",
             "{person} headed for the {place}.", "{person} ran to the {place}."),
    "grab": ("{person} picked up the {obj}.", "{person} took the {obj}.", "{person} got the {obj}."),
    "drop": ("{person} put down the {obj}.", "{person} dropped the {obj}.",
             "{person} left the {obj} behind."),
    "give": ("{person} gave the {obj} to {other}.", "{person} handed the {obj} to {other}.",
             "{person} passed the {obj} to {other}."),
    "not_in": ("{person} is not in the {place}.", "{person} is no longer in the {place}."),
    "either": ("{person} is either in the {place} or the {place2}.",),
    "relation": ("The {place} is {direction} of the {place2}.",),
}
MAX_CARRIED = 3


def _simulate(rng, kinds, n_events, n_people, n_places, n_objects):
    """A random valid story: n_events events, each of a kind drawn from `kinds` (repeats weight it).
    The world: where each person is (None: unknown, after "not in" / "either"), who holds each
    object, where each free object lies. Rules: a person must be somewhere known to pick up or give;
    an object lying somewhere is picked up only there; give needs both people in the same place.
    -> (events, world, people, places, objects)."""
    people = [str(p) for p in rng.choice(BABI_PEOPLE, n_people, replace=False)]
    places = [str(p) for p in rng.choice(BABI_PLACES, n_places, replace=False)]
    objects = [str(o) for o in rng.choice(BABI_OBJECTS, n_objects, replace=False)] if n_objects else []
    loc = {p: None for p in people}
    holder = {o: None for o in objects}
    lies_at = {o: None for o in objects}         # a free object's place (None: never seen)
    history = {o: [] for o in objects}           # the places each object has been in, in order
    last_fact = {p: None for p in people}        # the latest event about each person
    events = []
    while len(events) < n_events:
        kind = kinds[rng.integers(len(kinds))]
        carried = {p: sum(holder[o] == p for o in objects) for p in people}
        if kind == "move":
            options = [dict(person=p, place=l) for p in people for l in places if l != loc[p]]
        elif kind == "grab":
            options = [dict(person=p, obj=o) for p in people for o in objects
                       if loc[p] is not None and holder[o] is None and lies_at[o] in (None, loc[p])
                       and carried[p] < MAX_CARRIED]
        elif kind == "drop":
            options = [dict(person=holder[o], obj=o) for o in objects if holder[o] is not None]
        elif kind == "give":
            options = [dict(person=holder[o], obj=o, other=q) for o in objects for q in people
                       if holder[o] not in (None, q) and loc[q] == loc[holder[o]]
                       and carried[q] < MAX_CARRIED]
        elif kind == "not_in":
            options = [dict(person=p, place=l) for p in people for l in places if l != loc[p]]
        elif kind == "either":
            options = [dict(person=p, place=a, place2=b) for p in people for a in places
                       for b in places if a != b]
        else:
            raise ValueError(f"unknown event kind {kind!r}")
        if not options:
            continue
        event = dict(kind=kind, **options[rng.integers(len(options))])
        p = event["person"]
        if kind == "move":
            loc[p] = event["place"]
            for o in objects:
                if holder[o] == p:
                    history[o].append(loc[p])
        elif kind == "grab":
            holder[event["obj"]], lies_at[event["obj"]] = p, None
            if not history[event["obj"]]:
                history[event["obj"]].append(loc[p])
        elif kind == "drop":
            holder[event["obj"]], lies_at[event["obj"]] = None, loc[p]
        elif kind == "give":
            holder[event["obj"]] = event["other"]
        else:                                    # not_in, either: the place is no longer known
            loc[p] = None
        last_fact[p] = event
        templates = BABI_TEMPLATES[kind]
        event["text"] = templates[rng.integers(len(templates))].format(**event)
        events.append(event)
    world = dict(loc=loc, holder=holder, lies_at=lies_at, history=history, last_fact=last_fact)
    return events, world, people, places, objects


def _pick(rng, items):
    return items[rng.integers(len(items))] if items else None


def _object_place(world, o):
    h = world["holder"][o]
    return world["loc"][h] if h is not None else world["lies_at"][o]


def _babi_where_person(rng):          # qa1: single supporting fact
    events, w, people, places, _ = _simulate(rng, ["move"], int(rng.integers(4, 9)), 3, 5, 0)
    p = _pick(rng, [p for p in people if w["loc"][p]])
    return events, f"Where is {p}?", w["loc"][p], dict(kind="where_person", person=p)


def _babi_where_object(rng):          # qa2: two supporting facts
    events, w, _, _, objects = _simulate(rng, ["move", "move", "grab", "drop"],
                                         int(rng.integers(6, 11)), 3, 4, 3)
    o = _pick(rng, [o for o in objects if _object_place(w, o)])
    if o is None:
        return None
    return events, f"Where is the {o}?", _object_place(w, o), dict(kind="where_object", obj=o)


def _babi_where_before(rng):          # qa3: three supporting facts
    events, w, _, _, objects = _simulate(rng, ["move", "move", "grab", "drop"],
                                         int(rng.integers(8, 15)), 2, 4, 2)
    # "before the X" is unambiguous only if the object was in X once, and not first.
    options = [(o, i) for o in objects for i, x in enumerate(w["history"][o])
               if i > 0 and w["history"][o].count(x) == 1]
    if not options:
        return None
    o, i = options[rng.integers(len(options))]
    place = w["history"][o][i]
    return (events, f"Where was the {o} before the {place}?", w["history"][o][i - 1],
            dict(kind="where_before", obj=o, place=place))


def _babi_relation(rng):              # qa4: two argument relations
    places = [str(p) for p in rng.choice(BABI_PLACES, int(rng.integers(3, 5)), replace=False)]
    cell = {places[0]: (0, 0)}
    events = []
    for new in places[1:]:            # attach each new place next to a placed one, on a free cell
        options = [(old, d) for old in cell for d, (dx, dy) in BABI_DIRECTIONS.items()
                   if (cell[old][0] + dx, cell[old][1] + dy) not in cell.values()]
        old, d = options[rng.integers(len(options))]
        cell[new] = (cell[old][0] + BABI_DIRECTIONS[d][0], cell[old][1] + BABI_DIRECTIONS[d][1])
        events.append(dict(kind="relation", place=new, direction=d, place2=old,
                           text=BABI_TEMPLATES["relation"][0].format(place=new, direction=d, place2=old)))
    events = [events[i] for i in rng.permutation(len(events))]
    e = _pick(rng, events)
    if rng.random() < 0.5:            # "What is north of the B?" -> A
        return (events, f"What is {e['direction']} of the {e['place2']}?", e["place"],
                dict(kind="what_is_dir_of", direction=e["direction"], place=e["place2"]))
    return (events, f"What is the {e['place']} {e['direction']} of?", e["place2"],
            dict(kind="what_is_x_dir_of", place=e["place"], direction=e["direction"]))


def _babi_give(rng):                  # qa5: three argument relations
    events, _, _, _, _ = _simulate(rng, ["move", "move", "grab", "grab", "give", "give", "drop"],
                                   int(rng.integers(8, 14)), 3, 3, 3)
    gives = [e for e in events if e["kind"] == "give"]
    forms = {   # question form -> (fields it names, field it asks for, text)
        "who_gave": (("obj", "other"), "person", "Who gave the {obj} to {other}?"),
        "what_given": (("person", "other"), "obj", "What did {person} give to {other}?"),
        "given_to": (("person", "obj"), "other", "Who did {person} give the {obj} to?"),
        "who_received": (("obj",), "other", "Who received the {obj}?"),
    }
    options = []
    for g in gives:                   # keep the questions that have a single answer in this story
        for form, (keys, asked, text) in forms.items():
            answers = {e[asked] for e in gives if all(e[k] == g[k] for k in keys)}
            if len(answers) == 1:
                options.append((form, g))
    if not options:
        return None
    form, g = options[rng.integers(len(options))]
    keys, asked, text = forms[form]
    return events, text.format(**g), g[asked], dict(kind=form, **{k: g[k] for k in keys})


def _babi_yes_no(rng):                # qa6: yes/no questions
    events, w, people, places, _ = _simulate(rng, ["move", "move", "move", "grab", "drop"],
                                             int(rng.integers(4, 9)), 3, 4, 2)
    p = _pick(rng, [p for p in people if w["loc"][p]])
    place = w["loc"][p] if rng.random() < 0.5 else _pick(rng, [l for l in places if l != w["loc"][p]])
    answer = "yes" if place == w["loc"][p] else "no"
    return events, f"Is {p} in the {place}?", answer, dict(kind="is_in", person=p, place=place)


def _carrying_story(rng):
    events, w, people, _, objects = _simulate(rng, ["move", "move", "grab", "grab", "drop", "give"],
                                              int(rng.integers(6, 12)), 3, 3, 4)
    known = [p for p in people if w["loc"][p]]
    carrying = [p for p in known if p in w["holder"].values()]
    p = _pick(rng, carrying if carrying and rng.random() < 0.5 else known)   # fewer "none" answers
    return events, p, sorted(o for o in objects if w["holder"][o] == p)


def _babi_counting(rng):              # qa7: counting
    events, p, held = _carrying_story(rng)
    return (events, f"How many objects is {p} carrying?", BABI_NUMBERS[len(held)],
            dict(kind="count_carried", person=p))


def _babi_lists(rng):                 # qa8: lists/sets (objects sorted by name, comma-separated)
    events, p, held = _carrying_story(rng)
    return (events, f"What is {p} carrying?", ",".join(held) or "nothing",
            dict(kind="list_carried", person=p))


def _babi_negation(rng):              # qa9: simple negation
    events, w, people, places, _ = _simulate(rng, ["move", "move", "not_in"],
                                             int(rng.integers(4, 9)), 3, 4, 0)
    p = _pick(rng, [p for p in people if w["last_fact"][p]])
    last = w["last_fact"][p]
    if last["kind"] == "not_in":      # only the place it names has a definite answer
        place = last["place"]
    else:
        # 3/4 "yes" here balances the "no" that every "not in" question gets
        place = last["place"] if rng.random() < 0.75 else _pick(rng, [l for l in places if l != last["place"]])
    answer = "yes" if last["kind"] == "move" and place == last["place"] else "no"
    return events, f"Is {p} in the {place}?", answer, dict(kind="is_in", person=p, place=place)


def _babi_indefinite(rng):            # qa10: indefinite knowledge
    events, w, people, places, _ = _simulate(rng, ["move", "move", "either"],
                                             int(rng.integers(4, 9)), 3, 4, 0)
    p = _pick(rng, [p for p in people if w["last_fact"][p]])
    last = w["last_fact"][p]
    named = [last["place"]] + ([last["place2"]] if last["kind"] == "either" else [])
    place = _pick(rng, named) if rng.random() < 0.5 else _pick(rng, [l for l in places if l not in named])
    answer = "no" if place not in named else ("yes" if last["kind"] == "move" else "maybe")
    return events, f"Is {p} in the {place}?", answer, dict(kind="is_in", person=p, place=place)


# bAbI task name -> story generator: rng -> (events, question, answer, question dict) or None
# (None: this story has no good question; the caller draws another story from the same rng).
BABI_TASKS = {
    "qa1": _babi_where_person, "qa2": _babi_where_object, "qa3": _babi_where_before,
    "qa4": _babi_relation, "qa5": _babi_give, "qa6": _babi_yes_no, "qa7": _babi_counting,
    "qa8": _babi_lists, "qa9": _babi_negation, "qa10": _babi_indefinite,
}


def babi_story(task, seed=0):
    """-> (events, question, answer, question dict) of a bAbI task ("qa1".."qa10"), from the seed."""
    if task not in BABI_TASKS:
        raise ValueError(f"unknown bAbI task {task!r}: use one of {', '.join(BABI_TASKS)}")
    rng = np.random.default_rng(seed)
    for _ in range(1000):
        story = BABI_TASKS[task](rng)
        if story is not None:
            return story
    raise RuntimeError(f"babi_story: no {task} story with a valid question in 1000 draws")


def babi_sample(task, tokenizer, length, seed=0, filler_tokens=None):
    """A bAbI story (task "qa1".."qa10", or None to draw one uniformly, for mixed fine-tuning)
    hidden in filler, then "Question: ... Answer:" and the answer; exactly `length` tokens.

    The story's sentences keep their order, each at a random boundary of the filler: between our
    filler's sentences (filler_tokens=None), or at line starts of a random window of filler_tokens
    (a token stream from the same tokenizer, e.g. load_data("stdlib").val). The answer is
    " {answer}." like the passkey's. meta: task, answer, question (text), asked (what is asked, as
    a dict), events (the story, with each sentence), fact_starts (token index of each sentence).
    Stories are short but not tiny: with the bytes tokenizer the story and question take up to
    ~470 tokens (qa3, qa5; median 150-370 by task), so train at length >= 512.
    """
    enc = _encoding(tokenizer)
    task_rng, story_rng, layout_rng = _rngs(seed, 3)
    if task is None:
        task = list(BABI_TASKS)[task_rng.integers(len(BABI_TASKS))]
    events, question, answer, asked = babi_story(task, int(story_rng.integers(2**63)))
    ours = filler_tokens is None
    facts = [_encode(enc, f" {e['text']}" if ours else f"{e['text']}\n") for e in events]
    question_tokens = _encode(enc, f"\nQuestion: {question}\nAnswer:")
    answer_tokens = _encode(enc, f" {answer}.")
    budget = length - 1 - sum(map(len, facts)) - len(question_tokens) - len(answer_tokens)
    if budget < 0:
        raise ValueError(f"babi_sample: length {length} is too short for this {task} story, its "
                         f"sentences and question alone take {length - budget} tokens")
    if ours:
        filler, boundaries = _our_filler(enc, budget)
    else:
        filler, boundaries = _corpus_filler(enc, filler_tokens, budget, layout_rng)
    positions = np.sort(layout_rng.choice(boundaries, size=len(facts)))
    tokens, answer_mask, starts = _assemble(enc, filler, list(zip(positions.tolist(), facts)),
                                            question_tokens, answer_tokens)
    meta = {"task": task, "answer": answer, "question": question, "asked": asked, "events": events,
            "fact_starts": starts, "seed": seed}
    return Sample(tokens, answer_mask, meta)


# --- Scoring ----------------------------------------------------------------------------------

def babi_mixture(tokenizer, length, seed, babi_tasks, filler_tokens=None):
    """A babi_sample of a task drawn uniformly from babi_tasks; a pure function of the seed (exact resume).
    A story too long for `length` is replaced by another one (seed + [retry]): with the bytes tokenizer
    at length >= 512 that is rare (stories take up to ~470 tokens), at shorter lengths it favours the
    shorter stories and tasks."""
    seed = list(np.atleast_1d(seed))
    task = babi_tasks[np.random.default_rng(seed + [7]).integers(len(babi_tasks))]
    for retry in range(100):
        try:
            return babi_sample(task, tokenizer, length, seed=seed + [retry] if retry else seed,
                                     filler_tokens=filler_tokens)
        except ValueError as e:
            if "too short" not in str(e):
                raise
    raise ValueError(f"no {task} story fits in {length} tokens: use a larger --seq-len (>= 512 with bytes)")


def _normalize_answer(text):
    text = " ".join(text.strip().lower().split())
    text = re.sub(r" ?, ?", ",", text)
    return text[:-1].rstrip() if text.endswith(".") else text


def exact_match(pred_text, answer_text):
    """Passkey / bAbI answer check, after normalising both: surrounding whitespace, case, runs of
    spaces, spaces around commas, and one trailing period do not matter. Order in lists does
    (qa8 answers are written sorted)."""
    return _normalize_answer(pred_text) == _normalize_answer(answer_text)


def cut_answer(text):
    """The answer part of a generated continuation: up to and including the first period, or up to
    the first newline, whichever comes first (our answers end with a period)."""
    end = len(text)
    for stop, keep in ((".", 1), ("\n", 0)):
        i = text.find(stop)
        if i >= 0:
            end = min(end, i + keep)
    return text[:end]


# Task name (train.py --task) -> example generator.
TASKS = {"passkey": passkey_sample, "copy": copy_sample, "babilong": babi_sample}


# ----------------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------------

def _gather(tokens, starts, length):
    """Windows tokens[s : s+length] for each start -> int64 tensor [len(starts), length]."""
    return torch.from_numpy(np.stack([np.asarray(tokens[s:s + length]) for s in starts]).astype(np.int64))


def _text_files(path):
    """A text file, a directory (every file under it, hidden ones skipped) or a glob -> sorted list.
    Whether a file is really text is decided while tokenizing (UTF-8, no NUL bytes)."""
    if any(c in path for c in "*?["):
        files = sorted(f for f in glob.glob(path, recursive=True) if os.path.isfile(f))
        if not files:
            raise DataError(f"no files match {path!r}: check the pattern (quote it so the shell "
                            f"does not expand it)")
        return files
    if os.path.isdir(path):
        files = []
        for dirpath, dirnames, filenames in os.walk(path):
            dirnames[:] = [d for d in dirnames if not d.startswith(".") and d != "__pycache__"]
            files += [os.path.join(dirpath, f) for f in filenames if not f.startswith(".")]
        if not files:
            raise DataError(f"directory {path!r} holds no files: point --data at a folder of text files")
        return sorted(files)
    if os.path.isfile(path):
        return [path]
    if os.sep in path or "." in path:
        raise DataError(f"no such file or directory {path!r}: pass an existing text file, "
                        f"directory, glob or .bin file")
    raise DataError(f"unknown data {path!r}: use {', '.join(NAMED_DATA)} (e.g. markov:k=8,alpha=0.3) "
                    f"or a path to text files or a .bin file")


def _document_split(n_docs, val_fraction, seed):
    """Which documents go to val: a seeded random val_fraction of them (at least one, never all)."""
    is_val = np.zeros(n_docs, dtype=bool)
    if n_docs >= 2 and val_fraction > 0:
        n_val = min(n_docs - 1, max(1, round(val_fraction * n_docs)))
        is_val[np.random.default_rng(seed).permutation(n_docs)[:n_val]] = True
    return is_val


def _build_cache(base, label, files, enc, seed, val_fraction):
    """Tokenize every file into base.bin (train documents, then val documents) and base.json.
    Both are written to temporary names and renamed, so a crash never leaves a half cache that
    looks complete, and concurrent builders just race to write the same bytes."""
    t0 = time.time()
    os.makedirs(os.path.dirname(base) or ".", exist_ok=True)
    dtype = np.uint16 if enc.n_vocab <= 1 << 16 else np.uint32   # ids < n_vocab
    is_val = _document_split(len(files), val_fraction, seed)
    tmp = f"{base}.{os.getpid()}.tmp"
    counts = {"train": [0, 0], "val": [0, 0]}   # split -> [documents, tokens]
    skipped = 0
    try:
        with open(tmp + ".train", "wb") as f_train, open(tmp + ".val", "wb") as f_val:
            for path, val in zip(tqdm(files, desc=f"tokenizing {label}", unit="file", delay=1.0,
                                      leave=False), is_val):
                with open(path, "rb") as f:
                    raw = f.read()
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError:
                    text = None
                if text is None or "\0" in text or not text:   # binary, undecodable or empty
                    skipped += 1
                    continue
                # encode_ordinary: a literal "<|endoftext|>" inside a file stays plain text and
                # cannot fake a document boundary.
                ids = np.array([enc.eot_token] + enc.encode_ordinary(text), dtype=dtype)
                (f_val if val else f_train).write(ids.tobytes())
                split = "val" if val else "train"
                counts[split][0] += 1
                counts[split][1] += len(ids)
        n_train, n_val = counts["train"][1], counts["val"][1]
        if n_train == 0 or (n_val == 0 and is_val.any()):
            raise DataError(f"{label!r}: no UTF-8 text documents for the {'train' if n_train == 0 else 'val'} "
                            f"split ({skipped} of {len(files)} files skipped as binary/undecodable/empty): "
                            f"point --data at text files")
        if not is_val.any() and val_fraction > 0:
            # A single document cannot be split by document: its last val_fraction becomes val.
            n_val = int(round(n_train * val_fraction))
            n_train -= n_val
        with open(tmp + ".train", "ab") as f_train, open(tmp + ".val", "rb") as f_val:
            shutil.copyfileobj(f_val, f_train)
        os.replace(tmp + ".train", base + ".bin")
        meta = {"source": label, "tokenizer": enc.name, "seed": seed, "val_fraction": val_fraction,
                "dtype": np.dtype(dtype).name, "n_train": n_train, "n_val": n_val,
                "docs_train": counts["train"][0], "docs_val": counts["val"][0],
                "skipped_files": skipped, "files": len(files)}
        with open(tmp + ".json", "w") as f:
            json.dump(meta, f, indent=1)
        os.replace(tmp + ".json", base + ".json")
    finally:
        for suffix in (".train", ".val", ".json"):
            if os.path.exists(tmp + suffix):
                os.remove(tmp + suffix)
    size_mb = os.path.getsize(base + ".bin") / 1e6
    print(f"tasks: cached {label} with {enc.name}: {counts['train'][0]}+{counts['val'][0]} docs, "
          f"{n_train}+{n_val} train+val tokens, {size_mb:.1f} MB, {time.time() - t0:.1f}s -> {base}.bin")


def _parse_options(what, spec, defaults):
    """"k=8,alpha=0.3" -> dict, typed like the defaults (every key optional)."""
    cfg = dict(defaults)
    for item in filter(None, spec.split(",")):
        key, eq, value = item.partition("=")
        key = key.strip()
        if key not in defaults or not eq:
            raise DataError(f"{what}: bad option {item!r}; options are "
                            f"{', '.join(f'{k}={v}' for k, v in defaults.items())}")
        try:
            cfg[key] = type(defaults[key])(value)
        except ValueError:
            raise DataError(f"{what}: option {key} needs a {type(defaults[key]).__name__}, "
                            f"got {value!r}") from None
    return cfg
