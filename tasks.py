"""Data for the length-generalization experiments, in reading order:
1. tokenizers and corpora: load_data -> Data, a train and a val stream of token ids;
2. the in-context Markov process and its exact Bayes-optimal NLL (markov_bayes_nll), the floor;
3. samplers: RandomWindows (zero state, noise, State Passing), DocumentStreams (TBTT), eval_windows;
4. the paper's Sec. 5 tasks (passkey, copying, BABILong-style bAbI QA), TaskSampler and the scores.
A stream is [eot d1 eot d2 ...]: a window that starts at an eot starts a document."""
import collections
import functools
import hashlib
import json
import math
import os
import pathlib
import re
import sysconfig

import numpy as np
import torch
from tqdm import tqdm

EOT = "<|endoftext|>"
DEFAULT_CACHE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data_cache")  # gitignored
CACHE_VERSION = 1  # bump when the cache layout or the document format changes


class DataError(ValueError):
    """Bad input (data, tokenizer, task or metric arguments); the message is one line naming the fix."""


class TokenizerUnavailableError(RuntimeError):
    """A tokenizer that cannot be loaded on this machine (nothing is ever downloaded)."""


def check(ok, message):   # bad input: a one-line DataError naming the problem and the fix (evaluate's too)
    if not ok:
        raise DataError(message)


def _is_int(x, minimum=1):
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool) and x >= minimum


# --- 1. Tokenizers and corpora ---------------------------------------------------------------------
# A tokenizer has name, n_vocab, eot_token, encode_ordinary(text) -> ids (a special token's text inside
# a document stays plain text), decode(ids) and encode_single_token(bytes).
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
        return self._pieces.index(piece)


class JsonTokenizer:
    """A Hugging Face tokenizer.json (GPT-NeoX's, as the official Mamba checkpoints) via `tokenizers`."""

    def __init__(self, path):
        try:
            import tokenizers
        except ImportError:
            raise TokenizerUnavailableError(f"reading {path} needs: pip install tokenizers") from None
        check(os.path.isfile(path), f"no such tokenizer file {path!r}: pass a Hugging Face tokenizer.json")
        raw = pathlib.Path(path).read_bytes()
        try:
            self._tok = tokenizers.Tokenizer.from_str(raw.decode())
        except Exception:
            raise DataError(f"{path} is not a readable tokenizer.json: pass the model's own") from None
        self._tok.encode_special_tokens = True   # "<|endoftext|>" inside a document is plain text
        special = {t.content: i for i, t in self._tok.get_added_tokens_decoder().items() if t.special}
        check(EOT in special, f"{path} has no {EOT} special token to mark documents: use GPT-NeoX's")
        self.name, self.eot_token = "json-" + hashlib.sha1(raw).hexdigest()[:12], special[EOT]
        self.n_vocab = max(self._tok.get_vocab(with_added_tokens=True).values()) + 1

    def encode_ordinary(self, text):   # no template (BOS...) added: documents are marked by the eot
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids):
        return self._tok.decode([int(t) for t in ids], skip_special_tokens=False)

    def encode_single_token(self, piece):
        ids = self.encode_ordinary(piece.decode())
        check(len(ids) == 1, f"{piece!r} is not one token of {self.name}: use a byte-level BPE")
        return ids[0]


def get_tokenizer(name="bytes"):
    """-> the tokenizer "bytes" (built in) or of a tokenizer.json path; a tokenizer object passes through."""
    if hasattr(name, "encode_ordinary"):
        return name
    check(name == "bytes" or isinstance(name, str) and name.endswith(".json"), f"unknown tokenizer {name!r}: "
          f"use bytes or a path to a tokenizer.json (e.g. GPT-NeoX's, as the paper's models)")
    return _load_tokenizer(name if name == "bytes" else os.path.abspath(name))


@functools.lru_cache(maxsize=None)
def _load_tokenizer(name):
    return ByteTokenizer() if name == "bytes" else JsonTokenizer(name)


# train, val: 1-D token ids (often np.memmaps); markov: tokenizer None, optimal_nll(windows) its exact floor.
Data = collections.namedtuple("Data", "name train val vocab_size eot_token tokenizer optimal_nll info",
                              defaults=(None, {}))


def load_data(data="stdlib", tokenizer="bytes", seed=0, val_fraction=0.05, cache_dir=None):
    """data: "stdlib" (the standard library's .py files: offline text), "markov:k=8,..." (MARKOV_DEFAULTS),
    a text file or a directory of them (split train/val by document with `seed`), or a nanoGPT uint16 .bin.
    Text is tokenized once, into a cache keyed by the files (size and mtime), the tokenizer and the split."""
    check(isinstance(data, str) and data and _is_int(seed, 0) and isinstance(val_fraction, (int, float)) and
          0 <= val_fraction < 1, f"load_data: need a data name, seed >= 0 and val_fraction in [0, 1)")
    if data == "markov" or data.startswith("markov:"):
        return _load_markov(data[7:], int(seed))
    enc = get_tokenizer(tokenizer)
    if data.endswith(".bin"):   # nanoGPT's prepare.py output: memory-mapped as is, val is its tail
        size = os.path.getsize(data) if os.path.isfile(data) else -1
        check(size > 0 and size % 2 == 0, f"{data!r} is missing or not whole uint16 ids: pass a nanoGPT .bin")
        check(enc.n_vocab <= 1 << 16, f"{enc.name!r} ids are past uint16: pass the text (uint32)")
        tokens = np.memmap(data, dtype=np.uint16, mode="r")
        top = int(tokens.max())   # the whole file: an id past the vocabulary would fail mid-training
        check(top < enc.n_vocab, f"{data!r} holds id {top}, past {enc.name!r}: pass its --tokenizer")
        n = len(tokens) - round(len(tokens) * val_fraction)
        return Data(data, tokens[:n], tokens[n:], enc.n_vocab, enc.eot_token, enc)
    stdlib = data == "stdlib"   # its .py files, not site-packages (per machine) nor tests (often stripped)
    root = sysconfig.get_paths()["stdlib"] if stdlib else data
    check(os.path.isdir(root) or os.path.isfile(root), f"no such file or directory {data!r}: pass a "
          f"directory or a text file (patterns are not expanded), a .bin, stdlib or markov:k=8,...")
    skip = {"site-packages", "dist-packages", "test", "tests", "idle_test"} if stdlib else set()
    files = [] if os.path.isdir(root) else [root]
    for path, dirs, names in os.walk(root):   # hidden files and folders skipped
        dirs[:] = [d for d in dirs if d not in skip | {"__pycache__"} and not d.startswith(".")]
        files += [os.path.join(path, f) for f in names if f.endswith(".py" if stdlib else "") and f[0] != "."]
    check(files, f"{root!r} holds no files: point --data at a folder of text files")
    files, seed, cache_dir = sorted(files), int(seed), cache_dir or DEFAULT_CACHE_DIR
    stats = [(os.path.abspath(f), st.st_size, st.st_mtime_ns) for f in files for st in [os.stat(f)]]
    key = hashlib.sha1(json.dumps([CACHE_VERSION, enc.name, seed, val_fraction, stats]).encode()).hexdigest()
    stem = "".join(c if c.isalnum() or c in "-_" else "_" for c in os.path.basename(data.rstrip("/")))
    base = os.path.join(cache_dir, f"{stem or 'data'}-{enc.name}-{key[:16]}")
    if not os.path.exists(base + ".json"):   # written last: it marks a complete cache
        _build_cache(base, data, files, enc, seed, val_fraction)
    meta = json.loads(pathlib.Path(base + ".json").read_text())
    tokens, n = np.memmap(base + ".bin", dtype=meta["dtype"], mode="r"), meta["n_train"]
    return Data(data, tokens[:n], tokens[n:], enc.n_vocab, enc.eot_token, enc, info=meta)


def _build_cache(base, label, files, enc, seed, val_fraction):
    """Files -> base.bin (eot + text each, train then a seeded val_fraction of them) and base.json."""
    tmp, is_val = f"{base}.{os.getpid()}.tmp", np.zeros(len(files), dtype=int)   # no half cache is left
    if len(files) >= 2 and val_fraction > 0:   # at least one val document, never all
        n_val = min(len(files) - 1, max(1, round(val_fraction * len(files))))
        is_val[np.random.default_rng(seed).permutation(len(files))[:n_val]] = 1
    dtype, n, docs, skipped = np.uint16 if enc.n_vocab <= 1 << 16 else np.uint32, [0, 0], [0, 0], 0
    os.makedirs(os.path.dirname(base), exist_ok=True)
    try:
        with open(tmp, "wb") as out:
            for i in tqdm(np.argsort(is_val, kind="stable"), f"tokenizing {label}", delay=1, leave=False):
                raw = pathlib.Path(files[i]).read_bytes()
                try:   # a binary, not UTF-8 or empty file is skipped
                    text = "" if b"\0" in raw else raw.decode("utf-8")
                except UnicodeDecodeError:
                    text = ""
                skipped += not text
                if text:   # encode_ordinary: "<|endoftext|>" in a file is plain text, not a document boundary
                    ids = np.array([enc.eot_token] + enc.encode_ordinary(text), dtype)
                    out.write(ids.tobytes())
                    n[is_val[i]], docs[is_val[i]] = n[is_val[i]] + len(ids), docs[is_val[i]] + 1
        check(docs[0] and (docs[1] or not is_val.any()), f"{label!r}: no UTF-8 text documents for the "
              f"{'val' if docs[0] else 'train'} split ({skipped} of {len(files)} skipped): pass text files")
        if not docs[1]:   # one document: split its tokens
            n = [n[0] - round(n[0] * val_fraction), round(n[0] * val_fraction)]
        meta = dict(source=label, tokenizer=enc.name, dtype=np.dtype(dtype).name, n_train=n[0], n_val=n[1],
                    docs_train=docs[0], docs_val=docs[1], skipped_files=skipped)
        os.replace(tmp, base + ".bin")
        pathlib.Path(tmp).write_text(json.dumps(meta, indent=1))
        os.replace(tmp, base + ".json")
    finally:   # a full disk: the CLI prints the OSError's one line, and no partial file is left
        pathlib.Path(tmp).unlink(missing_ok=True)
    print(f"tasks: cached {label}: {docs[0]}+{docs[1]} docs, {n[0]}+{n[1]} tokens ({skipped} files skipped: "
          f"binary, not UTF-8 or empty) -> {base}.bin")


# --- 2. The in-context Markov process and its exact Bayes floor -----------------------------------
# Each document draws its OWN transition matrix P (K x K, rows ~ Dirichlet(alpha)), a uniform first token,
# then doc_len tokens of the chain: predicting well means counting bigrams in context, the skill whose
# failure past T_train the paper studies. shared=C > 0: RELATED documents, rows ~ Dirichlet(C * G_i).
MARKOV_DEFAULTS = dict(k=8, alpha=0.3, doc_len=4096, docs=2048, val_docs=256, shared=0.0)


def markov_prior(k, alpha, shared=0.0, seed=0):
    """[k, k] Dirichlet pseudo-counts of every document's rows: alpha, or shared * G (related documents)."""
    if not shared:
        return np.full((k, k), float(alpha))
    return shared * np.random.default_rng([seed, 2]).dirichlet(np.full(k, alpha), size=k)


def sample_markov(k, alpha, doc_len, docs, seed=0, split="train", shared=0.0):
    """-> (tokens [docs, doc_len] int64 in 0..k-1, transitions [docs, k, k]); doc d: from (seed, split, d)."""
    check(split in ("train", "val") and _is_int(k, 2) and _is_int(doc_len) and _is_int(docs) and alpha > 0
          and shared >= 0, f"sample_markov: need k >= 2, doc_len, docs >= 1, alpha > 0, shared >= 0")
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
    """Exact Bayes-optimal NLL (nats) [n, T-1] of windows [n, T] (numpy or torch, returned alike) that start
    at a document start (eot = k, or its first token). With Dirichlet(alpha) rows, after bigram counts c:
        p(j | i, c) = (c_ij + alpha) / (sum_j' c_ij' + K alpha);  a first token: 1/K.  prior: [k, k] alpha."""
    x = torch.as_tensor(np.asarray(tokens) if not torch.is_tensor(tokens) else tokens).long().cpu()
    check(x.dim() == 2 and x.shape[1] >= 2 and not ((x < 0) | (x > k)).any(), f"markov_bayes_nll: tokens "
          f"must be [n, T >= 2] of ids in 0..{k} (k is eot), got shape {list(x.shape)}")
    check(not (x[:, 1:] == k).any(), "markov_bayes_nll: a window crosses a document boundary (an eot after "
          "its start): use windows from document starts of <= doc_len + 1 tokens")
    (n, T), rows = x.shape, torch.arange(len(x))
    prior = torch.as_tensor(markov_prior(k, alpha) if prior is None else prior, dtype=torch.float64)
    counts = torch.zeros(n, k, k, dtype=torch.float64)   # counts[r, i, j]: bigrams i -> j so far
    nll = torch.empty(n, T - 1, dtype=torch.float64)
    for t in range(T - 1):
        prev, nxt, at_start = x[:, t].clamp(max=k - 1), x[:, t + 1], x[:, t] == k
        row = counts[rows, prev] + prior[prev]   # [n, k] posterior pseudo-counts
        nll[:, t] = torch.log(row.sum(-1)) - torch.log(row[rows, nxt])
        nll[at_start, t] = math.log(k)
        counts[rows, prev, nxt] += (~at_start).double()   # (eot, first token) is not a bigram of P
    return nll if torch.is_tensor(tokens) else nll.numpy()


def _load_markov(spec, seed):   # fast to regenerate (~1 s for the defaults): not cached on disk
    cfg, usage = dict(MARKOV_DEFAULTS), ",".join(f"{k}={v}" for k, v in MARKOV_DEFAULTS.items())
    items = [item.split("=") for item in spec.replace(" ", "").split(",") if item]
    try:   # an unknown key, a missing "=" or a value of the wrong type
        cfg.update({k: type(cfg[k])(v) for k, v in items})
    except (KeyError, ValueError):
        raise DataError(f"markov: bad options {spec!r}: use some of {usage}") from None
    k, alpha, shared = cfg["k"], cfg["alpha"], cfg["shared"]
    check(2 <= k < 65535 and alpha > 0 and cfg["doc_len"] >= 2 and min(cfg["docs"], cfg["val_docs"]) >= 1
          and shared >= 0, f"markov: need 2 <= k < 65535, alpha > 0, doc_len >= 2, docs >= 1, val_docs >= 1,"
          f" shared >= 0; got {spec!r}")

    def draw(docs, split):   # -> the stream [eot d1 eot d2 ...]
        tokens, _ = sample_markov(k, alpha, cfg["doc_len"], docs, seed, split, shared)
        return np.concatenate([np.full((docs, 1), k), tokens], axis=1).reshape(-1).astype(np.uint16)

    name = "markov:" + ",".join(f"{key}={value}" for key, value in cfg.items() if key != "shared" or shared)
    floor = functools.partial(markov_bayes_nll, k=k, alpha=alpha, prior=markov_prior(k, alpha, shared, seed))
    return Data(name, draw(cfg["docs"], "train"), draw(cfg["val_docs"], "val"), k + 1, k, None, floor, cfg)


# --- 3. Samplers: each one's randomness is a pure function of (seed, counters), so a resume is exact ---
# next_batch() -> x, y: int64 [batch_size, seq_len], y = x shifted left by one token (and DocumentStreams:
# new_doc, bool [batch_size]); state_dict() and load_state_dict() hold all that the next batches depend on.
def _windows(tokens, starts, length):   # tokens[s : s+length] for each start -> int64 [len(starts), length]
    return torch.from_numpy(np.stack([np.asarray(tokens[s:s + length]) for s in starts]).astype(np.int64))


def _xy(tokens, starts, seq_len):
    w = _windows(tokens, starts, seq_len + 1)
    return w[:, :-1].contiguous(), w[:, 1:].contiguous()


def _check_sampler(what, tokens, batch_size, seq_len):
    check(_is_int(batch_size) and _is_int(seq_len) and len(tokens) > seq_len, f"{what}: need batch_size >= 1 "
          f"and 1 <= seq_len < {len(tokens)} (the tokens): use a shorter seq_len or more data")


class RandomWindows:
    """Windows from anywhere in the stream (across documents, as nanoGPT's): for zero, noise and SP states."""

    def __init__(self, tokens, batch_size, seq_len, seed=0):
        _check_sampler("RandomWindows", tokens, batch_size, seq_len)
        self.tokens, self.batch_size, self.seq_len = tokens, batch_size, seq_len
        self.seed, self.step = seed, 0

    def next_batch(self):
        rng = np.random.default_rng([self.seed, self.step])
        self.step += 1
        return _xy(self.tokens, rng.integers(0, len(self.tokens) - self.seq_len, self.batch_size), self.seq_len)

    def state_dict(self):
        return {"seed": self.seed, "step": self.step}

    def load_state_dict(self, state):
        self.seed, self.step = int(state["seed"]), int(state["step"])


class DocumentStreams:
    """TBTT: row r reads a document in chunks, each from its predecessor's last token (and final state),
    then the next of a seeded order, new_doc[r] True; tails and documents shorter than a chunk are skipped."""

    def __init__(self, tokens, eot_token, batch_size, seq_len, seed=0):
        _check_sampler("DocumentStreams", tokens, batch_size, seq_len)
        self.tokens, self.batch_size, self.seq_len = tokens, batch_size, seq_len
        starts = np.union1d([0], np.flatnonzero(np.asarray(tokens) == eot_token))
        lengths = np.diff(np.append(starts, len(tokens)))
        self.doc_start, self.doc_len = starts[lengths > seq_len], lengths[lengths > seq_len]
        check(len(self.doc_start), f"DocumentStreams: no document has {seq_len + 1} tokens: shorten seq_len")
        self.load_state_dict(dict(seed=seed, epoch=0, cursor=0, row_doc=[-1] * batch_size,   # -1: needs a doc
                                  row_pos=[0] * batch_size))

    def next_batch(self):
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
        return dict(seed=self.seed, epoch=self.epoch, cursor=self.cursor, row_doc=list(self.row_doc),
                    row_pos=list(self.row_pos))

    def load_state_dict(self, state):
        check(len(state["row_doc"]) == self.batch_size, "DocumentStreams: resume with the same batch size")
        self.seed, self.epoch, self.cursor = int(state["seed"]), int(state["epoch"]), int(state["cursor"])
        self.row_doc, self.row_pos = [int(d) for d in state["row_doc"]], [int(p) for p in state["row_pos"]]
        self._order = self._shuffled()

    def _shuffled(self):   # the order of the documents in pass `epoch`
        return np.random.default_rng([self.seed, self.epoch]).permutation(len(self.doc_start))


def eval_windows(tokens, n, length, seed=0, eot_token=None):
    """n seeded windows -> int64 [n, length]; with eot_token each at a distinct document's start."""
    check(_is_int(n) and _is_int(length, 2) and len(tokens) >= length, f"eval_windows: need n >= 1 and 2 <= "
          f"length <= {len(tokens)} (the tokens), got {n!r}, {length!r}: use a shorter length or more data")
    rng, last = np.random.default_rng(seed), len(tokens) - length   # the last start that fits
    if eot_token is None:
        return _windows(tokens, rng.integers(0, last + 1, size=n), length)
    candidates = np.flatnonzero(np.asarray(tokens[: last + 1]) == eot_token)
    check(len(candidates) >= n, f"eval_windows: only {len(candidates)} documents start a window of {length} "
          f"tokens, {n} asked: use fewer or shorter windows or more documents")
    return _windows(tokens, rng.choice(candidates, size=n, replace=False), length)


# --- 4. Long-context tasks (paper Sec. 5): passkey retrieval, synthetic copying, BABILong-style QA ----
# A generator returns Sample(tokens, answer_mask, meta): a document ending with the answer, the only tokens
# trained on (the paper's "loss only on the answer") and scored, a pure function of its seed whose content
# (key, story, string) and layout (depth, filler) streams differ: one seed asks one question at every length.
Sample = collections.namedtuple("Sample", "tokens answer_mask meta")   # int64 [n], bool [n], dict


def split_answer(sample):
    """-> (prompt, answer): int64 token arrays; the model reads the prompt and must produce the answer."""
    start = len(sample[0]) - int(np.sum(sample[1]))
    return np.asarray(sample[0])[:start], np.asarray(sample[0])[start:]


class TaskSampler:
    """x, y of task_fn(seed=[seed, step, row, 1], length=seq_len + 1, ...), y -100 (ignored) but on the
    answer; shorter samples padded with eot on the RIGHT, after the answer: every row starts with its example
    from the initial state, exactly as evaluation reads it."""

    def __init__(self, task_fn, batch_size, seed=0, **task_kwargs):
        check(_is_int(batch_size), f"TaskSampler: batch_size must be an integer >= 1, got {batch_size!r}")
        self.task_fn, self.batch_size, self.seed, self.task_kwargs = task_fn, batch_size, seed, task_kwargs
        self.pad_id, self.step = get_tokenizer(task_kwargs.get("tokenizer", "bytes")).eot_token, 0

    def next_samples(self):
        samples = [self.task_fn(seed=[self.seed, self.step, row, 1], **self.task_kwargs)
                   for row in range(self.batch_size)]
        self.step += 1
        return samples

    def next_batch(self):
        samples = self.next_samples()
        pad = [max(len(s.tokens) for s in samples) - len(s.tokens) for s in samples]
        tokens = torch.tensor(np.stack([np.pad(s.tokens, (0, p), constant_values=self.pad_id)
                                        for p, s in zip(pad, samples)]))
        answer = torch.tensor(np.stack([np.pad(s.answer_mask, (0, p)) for p, s in zip(pad, samples)]))
        return tokens[:, :-1].contiguous(), tokens[:, 1:].masked_fill(~answer[:, 1:], -100)

    state_dict, load_state_dict = RandomWindows.state_dict, RandomWindows.load_state_dict


def _rngs(seed, n):
    return [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(n)]


# Our filler carries no information: only what is hidden in it is worth remembering.
FILLER_SENTENCES = (" The river runs down to the sea.", " The hills are quiet at night.",
                    " The wind is soft today.", " On we walk.", " Up the path and down again.")


def _hide(enc, what, length, facts, question, answer, place, corpus=None, rng=None):
    """eot, filler (ours, or from the token stream `corpus`) with the facts at place(boundaries, n_filler),
    question, answer: `length` tokens -> (tokens, answer_mask, each fact's start, n_filler)."""
    check(_is_int(length), f"{what}: length must be an integer >= 1, got {length!r}")
    *pieces, question, answer = (enc.encode_ordinary(text) for text in facts + [question, answer])
    n = length - 1 - sum(map(len, pieces + [question, answer]))
    check(n >= 0, f"{what}: length {length} is too short, its sentences and question alone take "
          f"{length - n} tokens: use a longer length (--seq-len)")
    if corpus is None:   # the LAST n tokens of our sentences repeated; boundaries between whole sentences
        sentences = [enc.encode_ordinary(s) for s in FILLER_SENTENCES]
        sentences *= n // sum(map(len, sentences)) + 1
        ends = np.cumsum([0] + [len(s) for s in sentences])
        cut = ends[-1] - n   # tokens dropped from the front
        filler, boundaries = np.concatenate(sentences).astype(np.int64)[cut:], ends[ends >= cut] - cut
    else:   # its eots become newlines (it must read as one text); boundaries at line starts
        check(len(corpus) >= n, f"{what}: filler_tokens has {len(corpus)} tokens, {n} needed: pass more")
        start = int(rng.integers(0, len(corpus) - n + 1))
        filler = np.asarray(corpus[start:start + n]).astype(np.int64)
        check(filler.max(initial=0) < enc.n_vocab, f"{what}: filler_tokens must come from the same tokenizer")
        filler[filler == enc.eot_token] = enc.encode_ordinary("\n")[-1]
        ends_line = [enc.decode([t]).endswith("\n") for t in filler.tolist()]   # part of a character: U+FFFD
        boundaries = np.union1d(np.flatnonzero(ends_line) + 1, [0])
    positions = place(boundaries, n)   # each fact's start: after the eot and the facts before it
    starts = [pos + 1 + sum(map(len, pieces[:i])) for i, pos in enumerate(positions)]
    parts = [x for segment, piece in zip(np.split(filler, positions), pieces + [question + answer])
             for x in (segment, piece)]
    tokens = np.concatenate([[enc.eot_token]] + parts).astype(np.int64)
    return tokens, np.arange(len(tokens)) >= len(tokens) - len(answer), starts, n


# --- Passkey retrieval (Fig. 7) ---------------------------------------------------------------
PASSKEY_SENTENCE = " Listen well: the pass key is {key}. Keep {key} in mind, it is the pass key."
PASSKEY_QUESTION = " What is the pass key? The pass key is"


def passkey_sample(tokenizer, length, depth=None, seed=0):
    """A 5-digit key at `depth` (fraction of filler before it, at a sentence boundary; None: uniform) in
    filler, then the question; the answer " {key}." has the paper's period: the model learns to stop."""
    enc, (content_rng, layout_rng) = get_tokenizer(tokenizer), _rngs(seed, 2)
    key = str(int(content_rng.integers(10_000, 100_000)))
    depth = float(layout_rng.random()) if depth is None else depth
    check(0 <= depth <= 1, f"passkey_sample: depth must be in [0, 1], got {depth}")
    at_depth = lambda b, n: [int(b[np.abs(b - depth * n).argmin()])]   # noqa: E731  (the nearest boundary)
    tokens, mask, (start,), n = _hide(enc, "passkey_sample", length, [PASSKEY_SENTENCE.format(key=key)],
                                      PASSKEY_QUESTION, f" {key}.", at_depth)
    return Sample(tokens, mask, dict(task="passkey", answer=key, key=key, depth=depth, key_start=start,
                                     seed=seed, actual_depth=(start - 1) / n if n else 0.0))


def passkey_digit_accuracy(pred_text, key):
    """The fraction of the key's digits that the first run of digits in pred_text gets right, in place."""
    digits = re.search(r"\d+", pred_text)
    return sum(a == b for a, b in zip(digits.group() if digits else "", str(key))) / len(str(key))


# --- Synthetic copying (Table 1): eot s SEP s EOS, the answer the copy AND the EOS (where it stops) ---
# SEP, EOS: control bytes (group separator, end-of-text) text rarely holds, single tokens in byte-level BPEs.
COPY_ALPHABET = "abcdefghijklmnopqrstuvwxyz"
COPY_SEP, COPY_EOS = b"\x1d", b"\x03"


def copy_sample(tokenizer, length, seed=0):
    """A random string of `length` (or drawn from [lo, hi]) letters to copy: 2 * length + 3 tokens."""
    enc, (rng,) = get_tokenizer(tokenizer), _rngs(seed, 1)
    drawn = isinstance(length, (tuple, list))
    lo, hi = tuple(length) if drawn and len(length) == 2 else (length, length)
    check(_is_int(lo) and _is_int(hi, lo), f"copy_sample: need length >= 1 or (lo, hi), 1 <= lo <= hi")
    length = int(rng.integers(lo, hi + 1)) if drawn else length
    pick = rng.integers(0, len(COPY_ALPHABET), size=length)
    s = np.array([enc.encode_single_token(c.encode()) for c in COPY_ALPHABET], dtype=np.int64)[pick]
    sep, eos = enc.encode_single_token(COPY_SEP), enc.encode_single_token(COPY_EOS)
    tokens = np.concatenate([[enc.eot_token], s, [sep], s, [eos]]).astype(np.int64)
    return Sample(tokens, np.arange(len(tokens)) >= length + 2, dict(
        task="copy", length=length, target=s, answer="".join(COPY_ALPHABET[i] for i in pick), seed=seed))


def copy_scores(pred_tokens, target_tokens):
    """-> (char_accuracy, whole_string_correct), position by position over the target (missing = wrong)."""
    pred, target = (np.asarray(t).reshape(-1).tolist() for t in (pred_tokens, target_tokens))
    correct = sum(p == t for p, t in zip(pred, target))
    return correct / len(target), correct == len(target)


# --- BABILong-style QA (Fig. 6): the ten bAbI families from a tiny world simulation, our own words ----
# A story is a list of events (dicts with their sentence, "text"); the question is about the final state,
# and meta["asked"] names what is asked, so tests re-derive every answer from the events alone.
BABI_PEOPLE = ("Alice", "Bruno", "Chloe", "Dmitri", "Elena", "Farid")
BABI_PLACES = ("kitchen", "garden", "hallway", "bedroom", "office", "cellar", "attic", "library")
BABI_OBJECTS = ("apple", "ball", "milk", "key", "book", "lamp")
BABI_DIRECTIONS = {"north": (0, 1), "south": (0, -1), "east": (1, 0), "west": (-1, 0)}
BABI_NUMBERS = ("none", "one", "two", "three", "four", "five", "six")
BABI_TEMPLATES = {   # event kind -> its sentences (one is drawn)
    "move": ("{person} went to the {place}.", "{person} walked into the {place}.",
             "{person} headed for the {place}.", "{person} ran to the {place}."),
    "grab": ("{person} picked up the {obj}.", "{person} took the {obj}.", "{person} got the {obj}."),
    "drop": ("{person} put down the {obj}.", "{person} dropped the {obj}.",
             "{person} left the {obj} behind."),
    "give": ("{person} gave the {obj} to {other}.", "{person} handed the {obj} to {other}.",
             "{person} passed the {obj} to {other}."),
    "not_in": ("{person} is not in the {place}.", "{person} is no longer in the {place}."),
    "either": ("{person} is either in the {place} or the {place2}.",),
    "relation": ("The {place} is {direction} of the {place2}.",)}
BABI_QUESTIONS = {   # asked["kind"] -> the question, filled from `asked`
    "where_person": "Where is {person}?", "where_object": "Where is the {obj}?",
    "where_before": "Where was the {obj} before the {place}?", "is_in": "Is {person} in the {place}?",
    "what_is_dir_of": "What is {direction} of the {place}?",
    "what_is_x_dir_of": "What is the {place} {direction} of?",
    "count_carried": "How many objects is {person} carrying?", "list_carried": "What is {person} carrying?",
    "who_gave": "Who gave the {obj} to {other}?", "what_given": "What did {person} give to {other}?",
    "given_to": "Who did {person} give the {obj} to?", "who_received": "Who received the {obj}?"}
BABI_GIVE_ASKS = {   # qa5's question kinds: (what the question names, what it asks)
    "who_gave": (("obj", "other"), "person"), "what_given": (("person", "other"), "obj"),
    "given_to": (("person", "obj"), "other"), "who_received": (("obj",), "other")}
BABI_TASKS = {   # task -> event kinds (repeats weight them), events in [lo, hi), people, places, objects
    "qa1": ("move", (4, 9), 3, 5, 0), "qa2": ("move move grab drop", (6, 11), 3, 4, 3),
    "qa3": ("move move grab drop", (8, 15), 2, 4, 2), "qa4": ("relation", (2, 4), 0, 0, 0),
    "qa5": ("move move grab grab give give drop", (8, 14), 3, 3, 3),
    "qa6": ("move move move grab drop", (4, 9), 3, 4, 2),
    "qa7": ("move move grab grab drop give", (6, 12), 3, 3, 4),
    "qa8": ("move move grab grab drop give", (6, 12), 3, 3, 4),
    "qa9": ("move move not_in", (4, 9), 3, 4, 0), "qa10": ("move move either", (4, 9), 3, 4, 0)}
MAX_CARRIED = 3


def _pick(rng, items):
    return items[rng.integers(len(items))] if items else None


def _simulate(rng, kinds, n_events, sizes):
    """A random valid story: to pick up or give, a person must be somewhere known; a lying object is picked
    up only where it lies; give needs both people in one place; nobody carries more than MAX_CARRIED."""
    people, places, objects = ([str(x) for x in rng.choice(pool, n, replace=False)] if n else []
                               for pool, n in zip((BABI_PEOPLE, BABI_PLACES, BABI_OBJECTS), sizes))
    loc, holder, lies_at = dict.fromkeys(people), dict.fromkeys(objects), dict.fromkeys(objects)
    history, events = {o: [] for o in objects}, []   # loc None: unknown; history: each object's places
    while len(events) < n_events:
        kind = _pick(rng, kinds)
        free = [p for p in people if list(holder.values()).count(p) < MAX_CARRIED]   # can carry one more
        elsewhere = [dict(person=p, place=x) for p in people for x in places if x != loc[p]]
        event = _pick(rng, {"move": elsewhere, "not_in": elsewhere,
                            "grab": [dict(person=p, obj=o) for p in free for o in objects
                                     if loc[p] and holder[o] is None and lies_at[o] in (None, loc[p])],
                            "drop": [dict(person=holder[o], obj=o) for o in objects if holder[o] is not None],
                            "give": [dict(person=holder[o], obj=o, other=q) for o in objects for q in free
                                     if holder[o] not in (None, q) and loc[q] == loc[holder[o]]],
                            "either": [dict(person=p, place=a, place2=b) for p in people for a in places
                                       for b in places if a != b]}[kind])
        if event is None:
            continue
        event, p, o = dict(kind=kind, **event), event["person"], event.get("obj")
        if kind == "give":
            holder[o] = event["other"]
        elif o:   # grab, drop: a dropped object lies where it was dropped
            holder[o], lies_at[o] = (p, None) if kind == "grab" else (None, loc[p])
            history[o] = history[o] or [loc[p]]   # where it was first picked up
        else:     # move; "not in" and "either" leave the place unknown
            loc[p] = event["place"] if kind == "move" else None
            for x in objects:   # what p carries goes along
                history[x] += [loc[p]] if holder[x] == p and kind == "move" else []
        event["text"] = _pick(rng, BABI_TEMPLATES[kind]).format(**event)
        events.append(event)
    return events, dict(loc=loc, holder=holder, lies_at=lies_at, history=history, people=people,
                        places=places, objects=objects)


def _relations(rng, n_places):   # qa4's story: places on a grid, each new one next to a placed one
    places = [str(p) for p in rng.choice(BABI_PLACES, n_places, replace=False)]
    cell, events = {places[0]: (0, 0)}, []
    for new in places[1:]:
        old, d = _pick(rng, [(old, d) for old in cell for d, (dx, dy) in BABI_DIRECTIONS.items()
                             if (cell[old][0] + dx, cell[old][1] + dy) not in cell.values()])
        cell[new] = (cell[old][0] + BABI_DIRECTIONS[d][0], cell[old][1] + BABI_DIRECTIONS[d][1])
        e = dict(kind="relation", place=new, direction=d, place2=old)
        events.append(dict(e, text=BABI_TEMPLATES["relation"][0].format(**e)))
    return [events[i] for i in rng.permutation(len(events))]


def _ask(task, rng, events, w):
    """-> (answer, asked) about the story's final state, or None: this story has no good question."""
    if task == "qa4":   # two argument relations: "What is north of the B?" -> A
        e = _pick(rng, events)
        if rng.random() < 0.5:
            return e["place"], dict(kind="what_is_dir_of", direction=e["direction"], place=e["place2"])
        return e["place2"], dict(kind="what_is_x_dir_of", place=e["place"], direction=e["direction"])
    loc, holder, objects, h = w["loc"], w["holder"], w["objects"], w["history"]
    known = [p for p in w["people"] if loc[p]]
    if task == "qa1":   # single supporting fact
        return _pick(rng, [(loc[p], dict(kind="where_person", person=p)) for p in known])
    if task == "qa2":   # two supporting facts
        place = {o: loc[holder[o]] if holder[o] else w["lies_at"][o] for o in objects}
        return _pick(rng, [(place[o], dict(kind="where_object", obj=o)) for o in objects if place[o]])
    if task == "qa3":   # three supporting facts; "before the X" is clear if it was in X once, not first
        return _pick(rng, [(h[o][i - 1], dict(kind="where_before", obj=o, place=x)) for o in objects
                           for i, x in enumerate(h[o]) if i and h[o].count(x) == 1])
    if task == "qa5":   # three argument relations; only questions with one answer
        gives = [e for e in events if e["kind"] == "give"]
        return _pick(rng, [(g[asked], dict(kind=kind, **{k: g[k] for k in named})) for g in gives
                           for kind, (named, asked) in BABI_GIVE_ASKS.items()
                           if len({e[asked] for e in gives if all(e[k] == g[k] for k in named)}) == 1])
    if task == "qa6":   # yes/no questions
        p = _pick(rng, known)
        place = loc[p] if rng.random() < 0.5 else _pick(rng, [x for x in w["places"] if x != loc[p]])
        return "yes" if place == loc[p] else "no", dict(kind="is_in", person=p, place=place)
    if task in ("qa7", "qa8"):   # counting; lists/sets, sorted by name
        carrying = [p for p in known if p in holder.values()]
        p = _pick(rng, carrying if carrying and rng.random() < 0.5 else known)   # fewer "none" answers
        held = sorted(o for o in objects if holder[o] == p)
        answer = BABI_NUMBERS[len(held)] if task == "qa7" else ",".join(held) or "nothing"
        return answer, dict(kind="count_carried" if task == "qa7" else "list_carried", person=p)
    last_fact = {e["person"]: e for e in events}   # qa9: "not in" facts; qa10: "either" facts
    p = _pick(rng, [p for p in w["people"] if p in last_fact])
    last = last_fact[p]
    named = [last["place"]] + ([last["place2"]] if last["kind"] == "either" else [])
    if task == "qa10":
        others = [x for x in w["places"] if x not in named]
        place = _pick(rng, named) if rng.random() < 0.5 else _pick(rng, others)
        answer = "no" if place not in named else ("yes" if last["kind"] == "move" else "maybe")
    else:   # a "not in" fact answers only about its place; after a move, 3/4 "yes" balances their "no"
        place = last["place"] if last["kind"] == "not_in" or rng.random() < 0.75 else \
            _pick(rng, [x for x in w["places"] if x != last["place"]])
        answer = "yes" if last["kind"] == "move" and place == last["place"] else "no"
    return answer, dict(kind="is_in", person=p, place=place)


def babi_story(task, seed=0):
    """-> (events, question, answer, asked) of a bAbI task ("qa1".."qa10"), from the seed."""
    check(task in BABI_TASKS, f"unknown bAbI task {task!r}: use one of {', '.join(BABI_TASKS)}")
    (kinds, n_events, *sizes), rng, qa = BABI_TASKS[task], np.random.default_rng(seed), None
    while not qa:   # a story without a good question: draw another from the same rng
        n = int(rng.integers(*n_events))
        events, world = (_relations(rng, n + 1), {}) if task == "qa4" else \
            _simulate(rng, kinds.split(), n, sizes)
        qa = _ask(task, rng, events, world)
    return events, BABI_QUESTIONS[qa[1]["kind"]].format(**qa[1]), *qa


def babi_sample(task, tokenizer, length, seed=0, filler_tokens=None):
    """A bAbI story (task "qa1".."qa10", None: drawn uniformly) in order at random boundaries of our
    filler or of filler_tokens (a stream of the same tokenizer), "Question: ...\nAnswer:", " {answer}."."""
    enc, (task_rng, story_rng, layout_rng) = get_tokenizer(tokenizer), _rngs(seed, 3)
    task = _pick(task_rng, list(BABI_TASKS)) if task is None else task   # babi_story checks it
    events, question, answer, asked = babi_story(task, int(story_rng.integers(2**63)))
    facts = [f" {e['text']}" if filler_tokens is None else f"{e['text']}\n" for e in events]
    place = lambda b, n: np.sort(layout_rng.choice(b, size=len(facts))).tolist()   # noqa: E731
    tokens, mask, starts, _ = _hide(enc, f"babi_sample {task}", length, facts, f"\nQuestion: {question}\n"
                                    f"Answer:", f" {answer}.", place, filler_tokens, layout_rng)
    return Sample(tokens, mask, dict(task=task, answer=answer, question=question, asked=asked, events=events,
                                     fact_starts=starts, seed=seed))


def babi_mixture(tokenizer, length, seed, babi_tasks, filler_tokens=None):
    """A babi_sample of a task drawn uniformly from babi_tasks, a pure function of the seed. A story too
    long for `length` is replaced by the one of seed + [retry] (at short lengths, shorter stories win)."""
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
def exact_match(pred_text, answer_text):
    """Equal after normalising case, whitespace runs, spaces around commas and one trailing period."""
    a, b = (re.sub(r" ?, ?", ",", " ".join(t.strip().lower().split())) for t in (pred_text, answer_text))
    return (a[:-1].rstrip() if a.endswith(".") else a) == (b[:-1].rstrip() if b.endswith(".") else b)


def cut_answer(text):
    """A generated continuation up to and including the first period, or up to the first newline."""
    ends = [i + keep for stop, keep in ((".", 1), ("\n", 0)) for i in [text.find(stop)] if i >= 0]
    return text[:min(ends, default=len(text))]


TASKS = {"passkey": passkey_sample, "copy": copy_sample, "babilong": babi_sample}   # train.py --task
