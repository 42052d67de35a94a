"""Data for the length-generalization experiments, in reading order:
1. tokenizers and corpora: load_data -> Data, a train and a val stream of token ids;
2. the in-context Markov process and its exact Bayes-optimal loss (markov_bayes_nll), the floor that a
   model which keeps using its context past T_train approaches;
3. samplers: RandomWindows (zero state, noise, State Passing), DocumentStreams (TBTT), eval_windows;
4. the paper's Sec. 5 tasks (passkey, copying, BABILong-style bAbI QA), TaskSampler and the scores.
A stream holds every document PRECEDED by the end-of-text token, [eot d1 eot d2 ...], so a window that
starts at an eot starts a document (nanoGPT .bin files put it after each document; samplers take both).
"""
import collections
import dataclasses
import errno
import functools
import glob
import hashlib
import json
import math
import os
import re
import sysconfig
import time

import numpy as np
import torch
from tqdm import tqdm

EOT = "<|endoftext|>"
DEFAULT_CACHE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data_cache")  # gitignored
CACHE_VERSION = 1  # bump when the cache layout or the document format changes


class DataError(ValueError):
    """Bad data, tokenizer or task arguments; the message is one line naming the fix."""


class TokenizerUnavailableError(RuntimeError):
    """A tokenizer that cannot be loaded on this machine (nothing is ever downloaded)."""


def _check(ok, message):
    if not ok:
        raise DataError(message)


def _is_int(x, minimum=1):
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool) and x >= minimum


# --- 1. Tokenizers and corpora ---------------------------------------------------------------------
# A tokenizer has name, n_vocab, eot_token, encode_ordinary(text) -> ids (a special token's text inside
# a document stays plain text), decode(ids), decode_single_token_bytes(id), encode_single_token(bytes).

class ByteTokenizer:
    """One token per byte (id = byte value) plus <|endoftext|> = 256: built in, no file, no merges."""
    name, n_vocab, eot_token = "bytes", 257, 256
    _pieces = [bytes([i]) for i in range(256)] + [EOT.encode()]

    def encode_ordinary(self, text):
        return list(text.encode())

    def decode(self, ids):   # a character cut in two reads U+FFFD
        return b"".join(self._pieces[int(t)] for t in ids).decode(errors="replace")

    def decode_single_token_bytes(self, token):
        return self._pieces[token]

    def encode_single_token(self, piece):
        if len(piece) != 1 and piece != self._pieces[256]:
            raise KeyError(piece)
        return piece[0] if len(piece) == 1 else 256


class JsonTokenizer:
    """A Hugging Face tokenizer.json (GPT-NeoX's, as the paper's official Mamba checkpoints use). The
    `tokenizers` library encodes, so the ids are exactly the checkpoints'."""

    def __init__(self, path):
        try:
            import tokenizers
        except ImportError:
            raise TokenizerUnavailableError(f"{path} needs the tokenizers library: pip install tokenizers") \
                from None
        _check(os.path.isfile(path), f"no such tokenizer file {path!r}: pass a Hugging Face tokenizer.json")
        with open(path, "rb") as f:
            raw = f.read()
        try:
            self._tok = tokenizers.Tokenizer.from_str(raw.decode())
        except Exception as e:
            raise DataError(f"{path} is not a readable tokenizer.json ({str(e)[:60]!r}): pass the model's "
                            f"own") from None
        self._tok.encode_special_tokens = True   # "<|endoftext|>" inside a document is plain text
        special = {t.content: i for i, t in self._tok.get_added_tokens_decoder().items() if t.special}
        _check(EOT in special, f"{path} has no {EOT} special token to mark documents: use GPT-NeoX's")
        self.name, self.eot_token = "json-" + hashlib.sha1(raw).hexdigest()[:12], special[EOT]
        self.n_vocab = max(self._tok.get_vocab(with_added_tokens=True).values()) + 1

    def encode_ordinary(self, text):   # no template (BOS...) added: documents are marked by the eot
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids):
        return self._tok.decode([int(t) for t in ids], skip_special_tokens=False)

    def decode_single_token_bytes(self, token):   # part of a character reads U+FFFD: enough to find "\n", "."
        if self._tok.id_to_token(int(token)) is None:
            raise KeyError(token)
        return self.decode([token]).encode()

    def encode_single_token(self, piece):
        ids = self.encode_ordinary(piece.decode())
        if len(ids) != 1:
            raise KeyError(piece)
        return ids[0]


def get_tokenizer(name="bytes"):
    """-> the tokenizer "bytes" (built in) or of a tokenizer.json path; a tokenizer object passes through."""
    if hasattr(name, "encode_ordinary"):
        return name
    _check(name == "bytes" or isinstance(name, str) and name.endswith(".json"), f"unknown tokenizer {name!r}: "
           f"use bytes or a path to a tokenizer.json (e.g. GPT-NeoX's, as the paper's models)")
    return _load_tokenizer(name if name == "bytes" else os.path.abspath(name))


_encoding = get_tokenizer   # evaluate.py's name for it


@functools.lru_cache(maxsize=None)
def _load_tokenizer(name):
    return ByteTokenizer() if name == "bytes" else JsonTokenizer(name)


@dataclasses.dataclass
class Data:
    name: str
    train: np.ndarray         # 1-D token ids (often a read-only np.memmap)
    val: np.ndarray
    vocab_size: int
    eot_token: int
    tokenizer: object         # None for the synthetic process
    optimal_nll: object = None   # windows [n, T] -> the exact Bayes-optimal loss [n, T-1] (markov)
    info: dict = dataclasses.field(default_factory=dict)


def load_data(data="stdlib", tokenizer="bytes", seed=0, val_fraction=0.05, cache_dir=None):
    """data: "stdlib" (the Python standard library's .py files: real text, no download), "markov:k=8,..."
    (MARKOV_DEFAULTS), or a path: a text file, a directory of them, a glob (quote it), or a nanoGPT .bin
    (flat uint16 ids; name uint32 files *.u32.bin). Text is split train/val BY DOCUMENT (a file) with
    `seed`; one document or a .bin by tokens (val = the tail). Text is tokenized once into cache_dir
    (default data_cache/), uint16 ids while the vocabulary fits, and memory-mapped."""
    _check(isinstance(data, str) and data, f"data must be a name or a path, got {data!r}")
    _check(_is_int(seed, 0), f"seed must be an integer >= 0, got {seed!r}")
    _check(isinstance(val_fraction, (int, float)) and 0 <= val_fraction < 1,
           f"val_fraction must be in [0, 1), got {val_fraction!r}")
    if data.startswith("markov:") or data == "markov":
        return _load_markov(data[7:], int(seed))
    enc = get_tokenizer(tokenizer)
    if data.endswith(".bin"):
        return _load_bin(data, enc, val_fraction)
    if data == "stdlib":   # not site-packages (per machine) nor test folders (some distributions strip them)
        skip = {"site-packages", "dist-packages", "test", "tests", "idle_test"}
        files = _walk(sysconfig.get_paths()["stdlib"], skip, lambda f: f.endswith(".py"))
    elif any(c in data for c in "*?["):
        files = sorted(f for f in glob.glob(data, recursive=True) if os.path.isfile(f))
        _check(files, f"no files match {data!r}: check the pattern (quote it so the shell does not expand it)")
    elif os.path.isdir(data):
        files = _walk(data, (), lambda f: not f.startswith("."))
    else:
        _check(os.path.isfile(data) or ":" in data or not (os.sep in data or "." in data),
               f"no such file or directory {data!r}: pass an existing text file, directory, glob or .bin file")
        _check(os.path.isfile(data), f"unknown data {data!r}: use stdlib, markov:k=8,... or a path")
        files = [data]
    return _load_documents(data, files, enc, int(seed), val_fraction, cache_dir)


def _walk(root, skip_dirs, keep):   # every kept file under root, hidden folders skipped
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in skip_dirs and d != "__pycache__" and not d.startswith(".")]
        files += [os.path.join(dirpath, f) for f in filenames if keep(f)]
    _check(files, f"{root!r} holds no files: point --data at a folder of text files")
    return sorted(files)


def _load_documents(label, files, enc, seed, val_fraction, cache_dir):
    """Text files (one document each) -> the token stream, cached under a key of all it depends on: the
    files (size and mtime stand for their versions), the tokenizer and the split."""
    stats = [(os.path.abspath(f), st.st_size, st.st_mtime_ns) for f in files for st in [os.stat(f)]]
    key = hashlib.sha1(json.dumps([CACHE_VERSION, enc.name, seed, val_fraction, stats]).encode()).hexdigest()
    stem = "".join(c if c.isalnum() or c in "-_" else "_" for c in os.path.basename(label.rstrip("/*")))
    base = os.path.join(cache_dir or DEFAULT_CACHE_DIR, f"{stem or 'data'}-{enc.name}-{key[:16]}")
    if not os.path.exists(base + ".json"):   # written last: it marks a complete cache
        _build_cache(base, label, files, enc, seed, val_fraction)
    with open(base + ".json") as f:
        meta = json.load(f)
    tokens = np.memmap(base + ".bin", dtype=meta["dtype"], mode="r")
    info = {k: meta[k] for k in ("docs_train", "docs_val", "skipped_files")} | {"cache": base + ".bin"}
    return Data(label, tokens[:meta["n_train"]], tokens[meta["n_train"]:], enc.n_vocab, enc.eot_token, enc,
                info=info)


def _read_text(path):   # "" for a binary, not UTF-8 or empty file: it is skipped
    with open(path, "rb") as f:
        raw = f.read()
    try:
        return "" if b"\0" in raw else raw.decode("utf-8")
    except UnicodeDecodeError:
        return ""


def _build_cache(base, label, files, enc, seed, val_fraction):
    """Tokenize each file as eot + text into base.bin (train documents, then val) and base.json, both via
    a temporary name: a crash or a full disk never leaves a half cache that looks complete. val: a seeded
    random val_fraction of the documents (at least one, never all)."""
    t0, tmp, val, n_train, docs_train, skipped = time.time(), f"{base}.{os.getpid()}.tmp", [], 0, 0, 0
    is_val, n_docs = np.zeros(len(files), dtype=bool), len(files)
    if n_docs >= 2 and val_fraction > 0:
        n_val = min(n_docs - 1, max(1, round(val_fraction * n_docs)))
        is_val[np.random.default_rng(seed).permutation(n_docs)[:n_val]] = True
    dtype = np.uint16 if enc.n_vocab <= 1 << 16 else np.uint32
    try:
        os.makedirs(os.path.dirname(base) or ".", exist_ok=True)
        with open(tmp, "wb") as out:
            progress = tqdm(files, f"tokenizing {label}", unit="file", delay=1, leave=False)
            for path, to_val in zip(progress, is_val):
                text = _read_text(path)
                skipped += not text
                # encode_ordinary: "<|endoftext|>" inside a file is plain text, not a fake document boundary
                ids = np.array([enc.eot_token] + enc.encode_ordinary(text), dtype) if text else None
                if text and to_val:   # val documents wait in memory, to go last
                    val.append(ids)
                elif text:
                    out.write(ids.tobytes())
                    n_train, docs_train = n_train + len(ids), docs_train + 1
            _check(n_train and (val or not is_val.any()), f"{label!r}: no UTF-8 text documents for the "
                   f"{'val' if n_train else 'train'} split ({skipped} of {len(files)} files skipped as binary, "
                   f"not UTF-8 or empty): point --data at text files")
            for ids in val:
                out.write(ids.tobytes())
        n_val = sum(map(len, val)) or int(round(n_train * val_fraction))   # one document: split its tokens
        meta = dict(source=label, tokenizer=enc.name, dtype=np.dtype(dtype).name,
                    n_train=n_train - (0 if val else n_val), n_val=n_val,
                    docs_train=docs_train, docs_val=len(val), skipped_files=skipped)
        os.replace(tmp, base + ".bin")
        with open(tmp, "w") as f:
            json.dump(meta, f, indent=1)
        os.replace(tmp, base + ".json")
    except OSError as e:
        if e.errno != errno.ENOSPC:
            raise
        raise DataError(f"no space left on the disk to cache {label} in {os.path.dirname(base)}: free some") \
            from None
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    note = f" ({skipped} files skipped: binary, not UTF-8 or empty)" if skipped else ""
    print(f"tasks: cached {label} with {enc.name}: {docs_train}+{len(val)} docs{note}, {meta['n_train']}+{n_val} "
          f"tokens, {os.path.getsize(base + '.bin') / 1e6:.1f} MB, {time.time() - t0:.1f}s -> {base}.bin")


def _load_bin(path, enc, val_fraction):   # nanoGPT's prepare.py output: memory-mapped as is, val is its tail
    _check(os.path.isfile(path), f"no such file {path!r}: pass an existing pre-tokenized .bin file")
    dtype, size = np.dtype(np.uint32 if path.endswith(".u32.bin") else np.uint16), os.path.getsize(path)
    _check(size and size % dtype.itemsize == 0, f"{path!r} has {size} bytes, not a whole number of "
           f"{dtype.name} tokens: nanoGPT .bin files are uint16 (name uint32 files *.u32.bin)")
    tokens = np.memmap(path, dtype=dtype, mode="r")
    top = int(tokens.max())   # one pass over the file: an id past the vocabulary would fail mid-training
    _check(top < enc.n_vocab, f"{path!r} holds token id {top}, beyond tokenizer {enc.name!r} "
                              f"(vocab {enc.n_vocab}): pass the --tokenizer that made the file")
    n_train = len(tokens) - int(round(len(tokens) * val_fraction))
    return Data(path, tokens[:n_train], tokens[n_train:], enc.n_vocab, enc.eot_token, enc, info={"cache": path})


# --- 2. The in-context Markov process and its exact Bayes floor -----------------------------------
# Each document draws its OWN transition matrix P (K x K, rows ~ Dirichlet(alpha)), a uniform first
# token, then doc_len tokens of the chain: the only way to predict well is to count bigrams in the
# context, the in-context skill whose failure past T_train the paper studies. shared=C > 0 makes the
# documents RELATED: rows ~ Dirichlet(C * G_i) around a base matrix G drawn once per seed.
MARKOV_DEFAULTS = dict(k=8, alpha=0.3, doc_len=4096, docs=2048, val_docs=256, shared=0.0)


def markov_prior(k, alpha, shared=0.0, seed=0):
    """[k, k] Dirichlet pseudo-counts of every document's rows: alpha, or shared * G (related documents)."""
    if not shared:
        return np.full((k, k), float(alpha))
    return shared * np.random.default_rng([seed, 2]).dirichlet(np.full(k, alpha), size=k)


def sample_markov(k, alpha, doc_len, docs, seed=0, split="train", shared=0.0):
    """-> (tokens [docs, doc_len] int64 in 0..k-1, transitions [docs, k, k]); document d is a pure function
    of (seed, split, d), whatever the number of documents drawn."""
    _check(_is_int(k, 2) and alpha > 0 and _is_int(doc_len) and _is_int(docs) and shared >= 0 and split in
           ("train", "val"), f"sample_markov: need k >= 2, alpha > 0, doc_len >= 1, docs >= 1, shared >= 0, "
                             f"split train or val; got {k}, {alpha}, {doc_len}, {docs}, {shared}, {split!r}")
    prior = markov_prior(k, alpha, shared, seed)
    transitions, u = np.empty((docs, k, k)), np.empty((doc_len, docs))   # u: uniforms [time, doc]
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
    """Exact Bayes-optimal NLL (nats) [n, T-1] of windows tokens [n, T] (numpy or torch, returned alike)
    that start at a document start (its eot = k, or its first token): entry t is -log p(x_t+1 | x_<=t).
    With a Dirichlet prior on each row of P, after bigram counts c the posterior predictive is
        p(j | i, c) = (c_ij + alpha) / (sum_j' c_ij' + K alpha),
    and a document's first token (after the eot) has p = 1/K. prior: [k, k] pseudo-counts replacing alpha."""
    x = torch.as_tensor(np.asarray(tokens) if not torch.is_tensor(tokens) else tokens).long().cpu()
    _check(x.dim() == 2 and x.shape[1] >= 2, f"markov_bayes_nll: tokens must be [n, T >= 2], got {list(x.shape)}")
    _check(not ((x < 0) | (x > k)).any(), f"markov_bayes_nll: token ids must be in 0..{k} (k = {k} is eot)")
    _check(not (x[:, 1:] == k).any(), "markov_bayes_nll: a window crosses a document boundary (an eot after its "
                                      "first position): use windows from document starts of <= doc_len + 1 tokens")
    n, T = x.shape
    rows = torch.arange(n)
    prior = torch.as_tensor(np.full((k, k), float(alpha)) if prior is None else prior, dtype=torch.float64)
    counts = torch.zeros(n, k, k, dtype=torch.float64)   # counts[r, i, j]: bigrams i -> j so far
    nll = torch.empty(n, T - 1, dtype=torch.float64)
    for t in range(T - 1):
        prev, nxt = x[:, t], x[:, t + 1]
        at_start = prev == k
        prev = prev.clamp(max=k - 1)
        row = counts[rows, prev] + prior[prev]   # [n, k] posterior pseudo-counts
        nll[:, t] = torch.log(row.sum(-1)) - torch.log(row[rows, nxt])
        nll[at_start, t] = math.log(k)
        counts[rows, prev, nxt] += (~at_start).double()   # (eot, first token) is not a bigram of P
    return nll if torch.is_tensor(tokens) else nll.numpy()


def _load_markov(spec, seed):   # fast to regenerate (~1 s for the defaults): not cached on disk
    cfg = dict(MARKOV_DEFAULTS)
    for item in filter(None, spec.split(",")):
        key, eq, value = (s.strip() for s in item.partition("="))
        _check(key in cfg and eq, f"markov: bad option {item!r}; options are "
                                  f"{', '.join(f'{k}={v}' for k, v in MARKOV_DEFAULTS.items())}")
        try:
            cfg[key] = type(MARKOV_DEFAULTS[key])(value)
        except ValueError:
            raise DataError(f"markov: option {key} needs a {type(cfg[key]).__name__}, got {value!r}") from None
    k, alpha, shared = cfg["k"], cfg["alpha"], cfg["shared"]
    _check(2 <= k < 65535 and alpha > 0 and cfg["doc_len"] >= 2 and min(cfg["docs"], cfg["val_docs"]) >= 1
           and shared >= 0, f"markov: need 2 <= k < 65535, alpha > 0, doc_len >= 2, docs >= 1, val_docs >= 1, "
                            f"shared >= 0; got {spec!r}")

    def stream(docs, split):
        tokens, _ = sample_markov(k, alpha, cfg["doc_len"], docs, seed, split, shared)
        return np.concatenate([np.full((docs, 1), k), tokens], axis=1).reshape(-1).astype(np.uint16)

    name = "markov:" + ",".join(f"{key}={value}" for key, value in cfg.items() if key != "shared" or shared)
    floor = functools.partial(markov_bayes_nll, k=k, alpha=alpha, prior=markov_prior(k, alpha, shared, seed))
    return Data(name, stream(cfg["docs"], "train"), stream(cfg["val_docs"], "val"), k + 1, k, None, floor, cfg)


# --- 3. Samplers --------------------------------------------------------------------------------------
# A resumed run continues EXACTLY where it stopped: each sampler's randomness is a pure function of
# (seed, counters), so its state is a few integers.

def _windows(tokens, starts, length):
    """tokens[s : s+length] for each start -> int64 [len(starts), length]."""
    return torch.from_numpy(np.stack([np.asarray(tokens[s:s + length]) for s in starts]).astype(np.int64))


def _xy(tokens, starts, seq_len):   # -> x, y: int64 [len(starts), seq_len], y = x shifted left by one
    w = _windows(tokens, starts, seq_len + 1)
    return w[:, :-1].contiguous(), w[:, 1:].contiguous()


def _check_sampler(what, tokens, batch_size, seq_len):
    _check(_is_int(batch_size) and _is_int(seq_len), f"{what}: batch_size and seq_len must be integers >= 1, "
                                                     f"got {batch_size!r}, {seq_len!r}")
    _check(len(tokens) > seq_len, f"{what}: {len(tokens)} tokens cannot hold a window of seq_len+1 = "
                                  f"{seq_len + 1}: use a shorter seq_len or more data")


class RandomWindows:
    """Independent windows of seq_len+1 tokens from anywhere in the stream (they may cross documents, as
    in nanoGPT): the zero-state baseline, the noise interventions and State Passing train on these."""

    def __init__(self, tokens, batch_size, seq_len, seed=0):
        _check_sampler("RandomWindows", tokens, batch_size, seq_len)
        self.tokens, self.batch_size, self.seq_len, self.seed, self.step = tokens, batch_size, seq_len, seed, 0

    def next_batch(self):
        """-> x, y: int64 [batch_size, seq_len], y = x shifted left by one token."""
        rng = np.random.default_rng([self.seed, self.step])
        self.step += 1
        return _xy(self.tokens, rng.integers(0, len(self.tokens) - self.seq_len, self.batch_size), self.seq_len)

    def state_dict(self):
        return {"seed": self.seed, "step": self.step}

    def load_state_dict(self, state):
        self.seed, self.step = int(state["seed"]), int(state["step"])


class DocumentStreams:
    """TBTT's ordered chunks: batch row r reads one document as chunks of seq_len+1 tokens, each starting
    at its predecessor's last token, so it can start from that chunk's final state. A document runs from
    an eot (its first token, as at the start of every evaluation window; or from the stream's start) to
    the next eot. When a document cannot fill another chunk its tail is dropped and the row takes the next
    document of a seeded order (reshuffled each pass); new_doc[r] is True exactly then, and TBTT resets
    that row to the zero state. Documents shorter than seq_len+1 tokens are skipped."""

    def __init__(self, tokens, eot_token, batch_size, seq_len, seed=0):
        _check_sampler("DocumentStreams", tokens, batch_size, seq_len)
        self.tokens, self.batch_size, self.seq_len, self.seed = tokens, batch_size, seq_len, seed
        starts = np.union1d([0], np.flatnonzero(np.asarray(tokens) == eot_token))
        lengths = np.diff(np.append(starts, len(tokens)))
        self.doc_start, self.doc_len = starts[lengths > seq_len], lengths[lengths > seq_len]
        _check(len(self.doc_start), f"DocumentStreams: no document has seq_len+1 = {seq_len + 1} tokens: "
                                    f"use a shorter seq_len or longer documents")
        self.load_state_dict(dict(seed=seed, epoch=0, cursor=0, row_doc=[-1] * batch_size,   # -1: needs a doc
                                  row_pos=[0] * batch_size))

    def next_batch(self):
        """-> x, y: int64 [batch_size, seq_len]; new_doc: bool [batch_size]."""
        new_doc, starts = torch.zeros(self.batch_size, dtype=torch.bool), []
        for r in range(self.batch_size):
            if self.row_doc[r] < 0 or self.row_pos[r] + self.seq_len >= self.doc_len[self.row_doc[r]]:
                if self.cursor == len(self._order):
                    self.epoch, self.cursor = self.epoch + 1, 0
                    self._order = self._shuffled()
                self.row_doc[r], self.row_pos[r], new_doc[r] = int(self._order[self.cursor]), 0, True
                self.cursor += 1
            starts.append(self.doc_start[self.row_doc[r]] + self.row_pos[r])
            self.row_pos[r] += self.seq_len
        return *_xy(self.tokens, starts, self.seq_len), new_doc

    def state_dict(self):
        return {"seed": self.seed, "epoch": self.epoch, "cursor": self.cursor, "row_doc": list(self.row_doc),
                "row_pos": list(self.row_pos)}

    def load_state_dict(self, state):
        _check(len(state["row_doc"]) == self.batch_size, f"DocumentStreams: the saved state has "
               f"{len(state['row_doc'])} rows, this sampler {self.batch_size}: resume with the same batch size")
        self.seed, self.epoch, self.cursor = int(state["seed"]), int(state["epoch"]), int(state["cursor"])
        self.row_doc, self.row_pos = [int(d) for d in state["row_doc"]], [int(p) for p in state["row_pos"]]
        self._order = self._shuffled()

    def _shuffled(self):   # the order of the documents in pass `epoch`
        return np.random.default_rng([self.seed, self.epoch]).permutation(len(self.doc_start))


def eval_windows(tokens, n, length, seed=0, eot_token=None):
    """n deterministic windows of `length` tokens -> int64 [n, length] (the model reads w[:, :-1] and is
    scored on w[:, 1:]). With eot_token, every window starts at a distinct document's eot, as
    markov_bayes_nll needs (with markov, length <= doc_len + 1 keeps it inside one document)."""
    _check(_is_int(n) and _is_int(length, 2), f"eval_windows: need n >= 1 and length >= 2, got {n!r}, {length!r}")
    _check(len(tokens) >= length, f"eval_windows: {len(tokens)} tokens cannot hold a window of {length}: "
                                  f"use a shorter length or more validation data")
    rng, last = np.random.default_rng(seed), len(tokens) - length   # the last start at which a window fits
    if eot_token is None:
        return _windows(tokens, rng.integers(0, last + 1, size=n), length)
    candidates = np.flatnonzero(np.asarray(tokens[: last + 1]) == eot_token)
    _check(len(candidates) >= n, f"eval_windows: only {len(candidates)} documents start a window of {length} "
                                 f"tokens, {n} requested: use fewer windows, a shorter length or more documents")
    return _windows(tokens, rng.choice(candidates, size=n, replace=False), length)


# --- 4. Long-context tasks (paper Sec. 5): passkey retrieval, synthetic copying, BABILong-style QA ----
# A generator returns Sample(tokens, answer_mask, meta): the WHOLE example in the LM data's tokenizer,
# starting with the eot like every document; the answer, always the last tokens, the only ones the loss
# is computed on (the paper fine-tunes "with the loss only on the answer") and scoring checks; the ground
# truth. It is a pure function of its seed (int or ints), split into independent streams for content
# (key, story, string) and layout (depth, filler), so one seed asks the same question at every length.
# Training: TaskSampler (row seeds [seed, step, row, 1], never equal to an int evaluation seed).
# Evaluation: prompt, answer = split_answer(s); greedy-decode; exact_match(cut_answer(text), meta["answer"]).
Sample = collections.namedtuple("Sample", "tokens answer_mask meta")   # int64 [n], bool [n], dict


def split_answer(sample):
    """-> (prompt, answer): int64 token arrays; the model reads the prompt and must produce the answer."""
    start = len(sample[0]) - int(np.sum(sample[1]))
    return np.asarray(sample[0])[:start], np.asarray(sample[0])[start:]


class TaskSampler:
    """Batches of task_fn(seed=[seed, step, row, 1], **task_kwargs), used like RandomWindows: the state is
    (seed, step). A sample of `length` tokens gives x and y of length-1: pass length=seq_len + 1."""

    def __init__(self, task_fn, batch_size, seed=0, **task_kwargs):
        _check(_is_int(batch_size), f"TaskSampler: batch_size must be an integer >= 1, got {batch_size!r}")
        self.task_fn, self.batch_size, self.seed, self.task_kwargs = task_fn, batch_size, seed, task_kwargs
        self.pad_id, self.step = get_tokenizer(task_kwargs.get("tokenizer", "bytes")).eot_token, 0

    def next_samples(self):
        samples = [self.task_fn(seed=[self.seed, self.step, row, 1], **self.task_kwargs)
                   for row in range(self.batch_size)]
        self.step += 1
        return samples

    def next_batch(self):
        """-> x, y: int64 [batch_size, T-1], T the longest example; y is -100 (ignored by F.cross_entropy)
        outside the answer. Shorter examples are LEFT-padded with eot: a recurrent model carries what it
        reads, so padding must not come between prompt and answer; before the eot it reads as empty
        documents."""
        samples = self.next_samples()
        T = max(len(s.tokens) for s in samples)
        tokens = torch.full((len(samples), T), self.pad_id, dtype=torch.int64)
        answer = torch.zeros((len(samples), T), dtype=torch.bool)
        for row, s in enumerate(samples):
            tokens[row, T - len(s.tokens):] = torch.as_tensor(s.tokens)
            answer[row, T - len(s.tokens):] = torch.as_tensor(s.answer_mask)
        return tokens[:, :-1].contiguous(), tokens[:, 1:].masked_fill(~answer[:, 1:], -100)

    state_dict, load_state_dict = RandomWindows.state_dict, RandomWindows.load_state_dict


def _encode(enc, text):
    return np.array(enc.encode_ordinary(text), dtype=np.int64)


def _rngs(seed, n):
    return [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(n)]


# Our own repetitive filler, in the spirit of the passkey test: it carries no information, so the only
# thing worth remembering is what is hidden in it. Each sentence is tokenized on its own, so sentence
# boundaries are exact token positions.
FILLER_SENTENCES = (" The river runs down to the sea.", " The hills are quiet at night.",
                    " The wind is soft today.", " On we walk.", " Up the path and down again.")


def _our_filler(enc, n_tokens):
    """-> (tokens int64 [n_tokens], boundaries): the LAST n_tokens of our sentences repeated (only the first
    may be cut short); boundaries: positions between whole sentences (n_tokens, and 0 if the first is whole)."""
    pieces = [enc.encode_ordinary(s) for s in FILLER_SENTENCES]
    cycle, starts = np.concatenate(pieces).astype(np.int64), np.cumsum([0] + [len(p) for p in pieces[:-1]])
    reps = n_tokens // len(cycle) + 1
    cut = reps * len(cycle) - n_tokens   # tokens dropped from the front
    all_starts = (np.arange(reps)[:, None] * len(cycle) + starts[None, :]).ravel() - cut
    return np.tile(cycle, reps)[cut:], np.union1d(all_starts[all_starts >= 0], [n_tokens])


def _corpus_filler(enc, corpus, n_tokens, rng):
    """-> (tokens, boundaries = line starts and 0) of a random window of a token stream, whose eot tokens
    become newlines: the filler must read as one long text, not as several documents."""
    _check(len(corpus) >= n_tokens, f"babi_sample: the filler stream has {len(corpus)} tokens, {n_tokens} "
                                    f"needed: pass a longer filler_tokens or a shorter length")
    start = int(rng.integers(0, len(corpus) - n_tokens + 1))
    tokens = np.asarray(corpus[start:start + n_tokens]).astype(np.int64)
    top = int(tokens.max()) if n_tokens else -1
    _check(top < enc.n_vocab, f"babi_sample: filler token id {top} is beyond tokenizer {enc.name!r} (vocab "
                              f"{enc.n_vocab}): the filler must come from the same tokenizer")
    tokens[tokens == enc.eot_token] = enc.encode_ordinary("\n")[-1]
    ends_line = [enc.decode_single_token_bytes(t).endswith(b"\n") for t in tokens.tolist()]
    return tokens, np.union1d(np.flatnonzero(ends_line) + 1, [0])


def _assemble(enc, filler, inserts, question, answer):
    """eot + filler with each (position, piece) of `inserts` (sorted) spliced in + question + answer
    -> Sample fields (tokens, answer_mask) and the start of each piece in tokens."""
    parts, piece_starts, cur, shift = [[enc.eot_token]], [], 0, 1
    for pos, piece in inserts:
        parts += [filler[cur:pos], piece]
        piece_starts.append(pos + shift)   # shift: the eot and the pieces before this one
        shift, cur = shift + len(piece), pos
    tokens = np.concatenate([np.asarray(p, dtype=np.int64) for p in parts + [filler[cur:], question, answer]])
    return tokens, np.arange(len(tokens)) >= len(tokens) - len(answer), piece_starts


def _budget(what, length, *pieces):   # the filler tokens left in `length` beside the eot and the pieces
    _check(_is_int(length), f"{what}: length must be an integer >= 1, got {length!r}")
    budget = length - 1 - sum(map(len, pieces))
    _check(budget >= 0, f"{what}: length {length} is too short, its sentences and question alone take "
                        f"{length - budget} tokens: use a longer length (--seq-len)")
    return budget


# --- Passkey retrieval (Fig. 7) ---------------------------------------------------------------
PASSKEY_SENTENCE = " Listen well: the pass key is {key}. Keep {key} in mind, it is the pass key."
PASSKEY_QUESTION = " What is the pass key? The pass key is"


def passkey_sample(tokenizer, length, depth=None, seed=0):
    """A 5-digit key hidden in filler, then the question; exactly `length` tokens. depth in [0, 1]: the
    fraction of filler before the key sentence, snapped to a sentence boundary; None draws it uniformly.
    The answer " {key}." has the paper's period, so the model learns to stop. meta: answer, key, depth,
    actual_depth, key_start (token index of the key sentence)."""
    enc, (content_rng, layout_rng) = get_tokenizer(tokenizer), _rngs(seed, 2)
    key = str(int(content_rng.integers(10_000, 100_000)))
    depth = float(layout_rng.random()) if depth is None else depth
    _check(0 <= depth <= 1, f"passkey_sample: depth must be in [0, 1], got {depth}")
    needle, question, answer = (_encode(enc, s) for s in (PASSKEY_SENTENCE.format(key=key), PASSKEY_QUESTION,
                                                          f" {key}."))
    budget = _budget("passkey_sample", length, needle, question, answer)
    filler, boundaries = _our_filler(enc, budget)
    pos = int(boundaries[np.argmin(np.abs(boundaries - depth * budget))])
    tokens, answer_mask, (key_start,) = _assemble(enc, filler, [(pos, needle)], question, answer)
    return Sample(tokens, answer_mask, dict(task="passkey", answer=key, key=key, depth=depth, key_start=key_start,
                                            actual_depth=pos / budget if budget else 0.0, seed=seed))


def passkey_digit_accuracy(pred_text, key):
    """The fraction of the key's digits that the first run of digits in pred_text gets right, in place."""
    digits = re.search(r"\d+", pred_text)
    return sum(a == b for a, b in zip(digits.group() if digits else "", str(key))) / len(str(key))


# --- Synthetic copying (Table 1) --------------------------------------------------------------
# eot s SEP s EOS. SEP and EOS are control bytes that text practically never holds (group separator,
# end-of-text), single tokens in the bytes tokenizer and in byte-level BPEs. The answer is the copy AND
# the EOS: like the passkey's period, it teaches where the copy stops.
COPY_ALPHABET = "abcdefghijklmnopqrstuvwxyz"
COPY_SEP, COPY_EOS = b"\x1d", b"\x03"


def copy_sample(tokenizer, length, seed=0, alphabet=COPY_ALPHABET):
    """A random string of `length` symbols of `alphabet` (each one token), or of a length drawn from the
    inclusive range (lo, hi), to be copied after the separator; 2 * length + 3 tokens.
    meta: answer (the string), target (its token ids), length."""
    enc, (rng,) = get_tokenizer(tokenizer), _rngs(seed, 1)
    if isinstance(length, (tuple, list)):
        _check(len(length) == 2 and _is_int(length[0]) and _is_int(length[1], length[0]),
               f"copy_sample: a length range must be (lo, hi) with 1 <= lo <= hi, got {length!r}")
        length = int(rng.integers(length[0], length[1] + 1))
    _check(_is_int(length), f"copy_sample: length must be an integer >= 1 or a range (lo, hi), got {length!r}")
    _check(isinstance(alphabet, str) and alphabet, "copy_sample: alphabet must be a non-empty string")
    pick = rng.integers(0, len(alphabet), size=length)
    s = np.array([enc.encode_single_token(c.encode()) for c in alphabet], dtype=np.int64)[pick]
    sep, eos = enc.encode_single_token(COPY_SEP), enc.encode_single_token(COPY_EOS)
    tokens = np.concatenate([[enc.eot_token], s, [sep], s, [eos]]).astype(np.int64)
    return Sample(tokens, np.arange(len(tokens)) >= length + 2, dict(
        task="copy", length=length, target=s, answer="".join(alphabet[i] for i in pick), seed=seed))


def copy_scores(pred_tokens, target_tokens):
    """-> (char_accuracy, whole_string_correct), position by position over the target's length; missing
    positions count as wrong, extra tokens are ignored."""
    pred, target = (np.asarray(t).reshape(-1).tolist() for t in (pred_tokens, target_tokens))
    _check(target, "copy_scores: empty target")
    correct = sum(p == t for p, t in zip(pred, target))
    return correct / len(target), correct == len(target)


# --- BABILong-style QA (Fig. 6) ---------------------------------------------------------------
# The ten bAbI task families from a tiny world simulation with our own names and sentences. A story is
# a list of events (dicts with their sentence, "text"); the question is about the final state, and
# meta["asked"] names what is asked, so tests re-derive every answer from the events alone.
BABI_PEOPLE = ("Alice", "Bruno", "Chloe", "Dmitri", "Elena", "Farid")
BABI_PLACES = ("kitchen", "garden", "hallway", "bedroom", "office", "cellar", "attic", "library")
BABI_OBJECTS = ("apple", "ball", "milk", "key", "book", "lamp")
BABI_DIRECTIONS = {"north": (0, 1), "south": (0, -1), "east": (1, 0), "west": (-1, 0)}
BABI_NUMBERS = ("none", "one", "two", "three", "four", "five", "six")
BABI_TEMPLATES = {
    "move": ("{person} went to the {place}.", "{person} walked into the {place}.",
             "{person} headed for the {place}.", "{person} ran to the {place}."),
    "grab": ("{person} picked up the {obj}.", "{person} took the {obj}.", "{person} got the {obj}."),
    "drop": ("{person} put down the {obj}.", "{person} dropped the {obj}.", "{person} left the {obj} behind."),
    "give": ("{person} gave the {obj} to {other}.", "{person} handed the {obj} to {other}.",
             "{person} passed the {obj} to {other}."),
    "not_in": ("{person} is not in the {place}.", "{person} is no longer in the {place}."),
    "either": ("{person} is either in the {place} or the {place2}.",),
    "relation": ("The {place} is {direction} of the {place2}.",),
}
MAX_CARRIED = 3


def _simulate(rng, kinds, n_events, n_people, n_places, n_objects):
    """A random valid story of n_events events of `kinds` (repeats weight a kind). Rules: to pick up or
    give, a person must be somewhere known; a lying object is picked up only where it lies; give needs
    both people in one place; nobody carries more than MAX_CARRIED. "not in" / "either" make a person's
    place unknown (None). -> (events, world, people, places, objects)."""
    people, places, objects = ([str(x) for x in rng.choice(pool, n, replace=False)] if n else [] for pool, n in
                               ((BABI_PEOPLE, n_people), (BABI_PLACES, n_places), (BABI_OBJECTS, n_objects)))
    loc, last_fact = dict.fromkeys(people), dict.fromkeys(people)
    holder, lies_at = dict.fromkeys(objects), dict.fromkeys(objects)   # lies_at: a free object's place
    history, events = {o: [] for o in objects}, []                     # history: each object's places
    while len(events) < n_events:
        kind = kinds[rng.integers(len(kinds))]
        carried = {p: sum(holder[o] == p for o in objects) for p in people}
        elsewhere = [dict(person=p, place=x) for p in people for x in places if x != loc[p]]
        options = {"move": elsewhere, "not_in": elsewhere,
                   "grab": [dict(person=p, obj=o) for p in people for o in objects if loc[p] is not None and
                            holder[o] is None and lies_at[o] in (None, loc[p]) and carried[p] < MAX_CARRIED],
                   "drop": [dict(person=holder[o], obj=o) for o in objects if holder[o] is not None],
                   "give": [dict(person=holder[o], obj=o, other=q) for o in objects for q in people if
                            holder[o] not in (None, q) and loc[q] == loc[holder[o]] and carried[q] < MAX_CARRIED],
                   "either": [dict(person=p, place=a, place2=b) for p in people for a in places for b in places
                              if a != b]}[kind]
        if not options:
            continue
        event = dict(kind=kind, **options[rng.integers(len(options))])
        p, o = event["person"], event.get("obj")
        if kind == "move":
            loc[p] = event["place"]
            for x in objects:
                history[x] += [loc[p]] if holder[x] == p else []
        elif kind == "grab":
            holder[o], lies_at[o], history[o] = p, None, history[o] or [loc[p]]
        elif kind == "drop":
            holder[o], lies_at[o] = None, loc[p]
        elif kind == "give":
            holder[o] = event["other"]
        else:
            loc[p] = None
        last_fact[p] = event
        event["text"] = BABI_TEMPLATES[kind][rng.integers(len(BABI_TEMPLATES[kind]))].format(**event)
        events.append(event)
    return events, dict(loc=loc, holder=holder, lies_at=lies_at, history=history, last_fact=last_fact), \
        people, places, objects


def _pick(rng, items):
    return items[rng.integers(len(items))] if items else None


# Task families: rng -> (events, question, answer, asked) or None (no good question in this story).

def _babi_where_person(rng):          # qa1: single supporting fact
    events, w, people, _, _ = _simulate(rng, ["move"], int(rng.integers(4, 9)), 3, 5, 0)
    p = _pick(rng, [p for p in people if w["loc"][p]])
    return events, f"Where is {p}?", w["loc"][p], dict(kind="where_person", person=p)


def _babi_where_object(rng):          # qa2: two supporting facts
    events, w, _, _, objects = _simulate(rng, ["move", "move", "grab", "drop"], int(rng.integers(6, 11)), 3, 4, 3)
    place = {o: w["loc"][w["holder"][o]] if w["holder"][o] else w["lies_at"][o] for o in objects}
    o = _pick(rng, [o for o in objects if place[o]])
    if o is not None:
        return events, f"Where is the {o}?", place[o], dict(kind="where_object", obj=o)


def _babi_where_before(rng):          # qa3: three supporting facts
    events, w, _, _, objects = _simulate(rng, ["move", "move", "grab", "drop"], int(rng.integers(8, 15)), 2, 4, 2)
    h = w["history"]   # "before the X" is unambiguous only if the object was in X once, and not first
    options = [(o, i) for o in objects for i, x in enumerate(h[o]) if i > 0 and h[o].count(x) == 1]
    if options:
        o, i = _pick(rng, options)
        return events, f"Where was the {o} before the {h[o][i]}?", h[o][i - 1], \
            dict(kind="where_before", obj=o, place=h[o][i])


def _babi_relation(rng):              # qa4: two argument relations
    places = [str(p) for p in rng.choice(BABI_PLACES, int(rng.integers(3, 5)), replace=False)]
    cell, events = {places[0]: (0, 0)}, []
    for new in places[1:]:            # each new place goes next to a placed one, on a free cell
        old, d = _pick(rng, [(old, d) for old in cell for d, (dx, dy) in BABI_DIRECTIONS.items()
                             if (cell[old][0] + dx, cell[old][1] + dy) not in cell.values()])
        cell[new] = (cell[old][0] + BABI_DIRECTIONS[d][0], cell[old][1] + BABI_DIRECTIONS[d][1])
        e = dict(kind="relation", place=new, direction=d, place2=old)
        events.append(dict(e, text=BABI_TEMPLATES["relation"][0].format(**e)))
    events = [events[i] for i in rng.permutation(len(events))]
    e = _pick(rng, events)
    if rng.random() < 0.5:            # "What is north of the B?" -> A
        return (events, f"What is {e['direction']} of the {e['place2']}?", e["place"],
                dict(kind="what_is_dir_of", direction=e["direction"], place=e["place2"]))
    return (events, f"What is the {e['place']} {e['direction']} of?", e["place2"],
            dict(kind="what_is_x_dir_of", place=e["place"], direction=e["direction"]))


BABI_GIVE_FORMS = {   # qa5 question form -> (fields it names, field it asks for, text)
    "who_gave": (("obj", "other"), "person", "Who gave the {obj} to {other}?"),
    "what_given": (("person", "other"), "obj", "What did {person} give to {other}?"),
    "given_to": (("person", "obj"), "other", "Who did {person} give the {obj} to?"),
    "who_received": (("obj",), "other", "Who received the {obj}?"),
}


def _babi_give(rng):                  # qa5: three argument relations; only questions with one answer
    events = _simulate(rng, ["move", "move", "grab", "grab", "give", "give", "drop"], int(rng.integers(8, 14)),
                       3, 3, 3)[0]
    gives = [e for e in events if e["kind"] == "give"]
    options = [(form, g) for g in gives for form, (keys, asked, _) in BABI_GIVE_FORMS.items()
               if len({e[asked] for e in gives if all(e[k] == g[k] for k in keys)}) == 1]
    if options:
        form, g = _pick(rng, options)
        keys, asked, text = BABI_GIVE_FORMS[form]
        return events, text.format(**g), g[asked], dict(kind=form, **{k: g[k] for k in keys})


def _babi_yes_no(rng):                # qa6: yes/no questions
    events, w, people, places, _ = _simulate(rng, ["move", "move", "move", "grab", "drop"],
                                             int(rng.integers(4, 9)), 3, 4, 2)
    p = _pick(rng, [p for p in people if w["loc"][p]])
    place = w["loc"][p] if rng.random() < 0.5 else _pick(rng, [x for x in places if x != w["loc"][p]])
    return events, f"Is {p} in the {place}?", "yes" if place == w["loc"][p] else "no", \
        dict(kind="is_in", person=p, place=place)


def _babi_carrying(rng, count):       # qa7 (count): counting; qa8: lists/sets, sorted by name
    events, w, people, _, objects = _simulate(rng, ["move", "move", "grab", "grab", "drop", "give"],
                                              int(rng.integers(6, 12)), 3, 3, 4)
    known = [p for p in people if w["loc"][p]]
    carrying = [p for p in known if p in w["holder"].values()]
    p = _pick(rng, carrying if carrying and rng.random() < 0.5 else known)   # fewer "none" answers
    held = sorted(o for o in objects if w["holder"][o] == p)
    if count:
        return events, f"How many objects is {p} carrying?", BABI_NUMBERS[len(held)], \
            dict(kind="count_carried", person=p)
    return events, f"What is {p} carrying?", ",".join(held) or "nothing", dict(kind="list_carried", person=p)


def _babi_is_in(rng, fact):           # qa9 (fact "not_in"), qa10 ("either"): "Is p in the X?"
    events, w, people, places, _ = _simulate(rng, ["move", "move", fact], int(rng.integers(4, 9)), 3, 4, 0)
    p = _pick(rng, [p for p in people if w["last_fact"][p]])
    last = w["last_fact"][p]
    named = [last["place"]] + ([last["place2"]] if last["kind"] == "either" else [])
    if fact == "either":
        place = _pick(rng, named) if rng.random() < 0.5 else _pick(rng, [x for x in places if x not in named])
        answer = "no" if place not in named else ("yes" if last["kind"] == "move" else "maybe")
    else:   # a "not in" fact answers only about its place; after a move, 3/4 "yes" balances their "no"
        place = last["place"] if last["kind"] == "not_in" or rng.random() < 0.75 else \
            _pick(rng, [x for x in places if x != last["place"]])
        answer = "yes" if last["kind"] == "move" and place == last["place"] else "no"
    return events, f"Is {p} in the {place}?", answer, dict(kind="is_in", person=p, place=place)


BABI_TASKS = {
    "qa1": _babi_where_person, "qa2": _babi_where_object, "qa3": _babi_where_before, "qa4": _babi_relation,
    "qa5": _babi_give, "qa6": _babi_yes_no, "qa7": functools.partial(_babi_carrying, count=True),
    "qa8": functools.partial(_babi_carrying, count=False),
    "qa9": functools.partial(_babi_is_in, fact="not_in"), "qa10": functools.partial(_babi_is_in, fact="either"),
}


def babi_story(task, seed=0):
    """-> (events, question, answer, asked) of a bAbI task ("qa1".."qa10"), from the seed."""
    _check(task in BABI_TASKS, f"unknown bAbI task {task!r}: use one of {', '.join(BABI_TASKS)}")
    rng, story = np.random.default_rng(seed), None
    while not story:   # a story without a good question: draw another from the same rng
        story = BABI_TASKS[task](rng)
    return story


def babi_sample(task, tokenizer, length, seed=0, filler_tokens=None):
    """A bAbI story (task "qa1".."qa10", or None: drawn uniformly) hidden in filler, then "Question: ...
    Answer:" and " {answer}."; exactly `length` tokens. The sentences keep their order, each at a random
    boundary: between our filler's sentences, or at line starts of a random window of filler_tokens (a
    stream of the same tokenizer, e.g. load_data("stdlib").val). meta: task, answer, question, asked,
    events, fact_starts. With bytes a story takes up to ~470 tokens: train at length >= 512."""
    enc, (task_rng, story_rng, layout_rng) = get_tokenizer(tokenizer), _rngs(seed, 3)
    _check(task in BABI_TASKS or task is None, f"unknown bAbI task {task!r}: use one of {', '.join(BABI_TASKS)}")
    task = task or list(BABI_TASKS)[task_rng.integers(len(BABI_TASKS))]
    events, question, answer, asked = babi_story(task, int(story_rng.integers(2**63)))
    ours = filler_tokens is None
    facts = [_encode(enc, f" {e['text']}" if ours else f"{e['text']}\n") for e in events]
    question_tokens, answer_tokens = _encode(enc, f"\nQuestion: {question}\nAnswer:"), _encode(enc, f" {answer}.")
    budget = _budget(f"babi_sample {task}", length, question_tokens, answer_tokens, *facts)
    filler, boundaries = _our_filler(enc, budget) if ours else \
        _corpus_filler(enc, filler_tokens, budget, layout_rng)
    positions = np.sort(layout_rng.choice(boundaries, size=len(facts))).tolist()
    tokens, mask, starts = _assemble(enc, filler, list(zip(positions, facts)), question_tokens, answer_tokens)
    return Sample(tokens, mask, dict(task=task, answer=answer, question=question, asked=asked, events=events,
                                     fact_starts=starts, seed=seed))


def babi_mixture(tokenizer, length, seed, babi_tasks, filler_tokens=None):
    """A babi_sample of a task drawn uniformly from babi_tasks, a pure function of the seed. A story too
    long for `length` is replaced by the one of seed + [retry]: rare with bytes at length >= 512, and at
    shorter lengths it favours the shorter stories and tasks."""
    seed = list(np.atleast_1d(seed))
    task = babi_tasks[np.random.default_rng(seed + [7]).integers(len(babi_tasks))]
    for retry in range(100):
        try:
            return babi_sample(task, tokenizer, length, seed + [retry] if retry else seed, filler_tokens)
        except DataError as e:
            if "too short" not in str(e):
                raise
    raise DataError(f"no {task} story fits in {length} tokens: use a larger --seq-len (>= 512 with bytes)")


# --- Scoring ----------------------------------------------------------------------------------

def _normalize_answer(text):
    text = re.sub(r" ?, ?", ",", " ".join(text.strip().lower().split()))
    return text[:-1].rstrip() if text.endswith(".") else text


def exact_match(pred_text, answer_text):
    """Equal after normalising case, whitespace runs, spaces around commas and one trailing period."""
    return _normalize_answer(pred_text) == _normalize_answer(answer_text)


def cut_answer(text):
    """A generated continuation up to and including the first period, or up to the first newline."""
    ends = [i + keep for stop, keep in ((".", 1), ("\n", 0)) for i in [text.find(stop)] if i >= 0]
    return text[:min(ends, default=len(text))]


TASKS = {"passkey": passkey_sample, "copy": copy_sample, "babilong": babi_sample}   # train.py --task
