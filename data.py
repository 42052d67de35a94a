"""Data for the length-generalization experiments: 1. tokenizers and corpora (load_data -> Data, a train and a
val stream of token ids), 2. the in-context Markov process and its exact Bayes floor, 3. the samplers (each
next_batch() -> Batch). A stream is [eot d1 eot d2 ...]: a window that starts at an eot starts a document."""
import collections
import functools
import hashlib
import json
import math
import os
import pathlib
import re
import stat
import sys
import sysconfig
import unittest.mock

import numpy as np
import torch
from tqdm import tqdm

EOT = "<|endoftext|>"
DEFAULT_CACHE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data_cache")  # gitignored
CACHE_VERSION = 2  # bump when the cache layout or the document format changes

# train, val: 1-D token ids (often np.memmaps); markov: tokenizer None, optimal_nll(windows) its exact floor.
Data = collections.namedtuple("Data", "name train val vocab_size eot_token tokenizer optimal_nll info",
                              defaults=(None, {}))
# x, y int64 [batch, seq_len] (y: x shifted by one); new_doc bool [batch]: rows starting a document, or None
Batch = collections.namedtuple("Batch", "x y new_doc")


class DataError(ValueError):
    """Bad input (data, tokenizer, task or metric arguments); the message is one line naming the fix."""


class TokenizerUnavailableError(RuntimeError):
    """A tokenizer that cannot be loaded on this machine (a package or, offline, its files missing)."""


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
        import tokenizers
        require(os.path.isfile(path), f"no such tokenizer file {path!r}: pass a Hugging Face tokenizer.json")
        raw = pathlib.Path(path).read_bytes()
        try:
            self._tok = tokenizers.Tokenizer.from_str(raw.decode())
        except Exception:
            raise DataError(f"{path} is not a readable tokenizer.json: pass the model's own") from None
        self._tok.encode_special_tokens = True   # "<|endoftext|>" inside a document is plain text
        special = {t.content: i for i, t in self._tok.get_added_tokens_decoder().items() if t.special}
        require(EOT in special, f"{path} has no {EOT} special token to mark documents: use GPT-NeoX's")
        self.name, self.eot_token = "json-" + hashlib.sha1(raw).hexdigest()[:12], special[EOT]
        self.n_vocab = max(self._tok.get_vocab(with_added_tokens=True).values()) + 1

    def encode_ordinary(self, text):   # no template (BOS...) added: documents are marked by the eot
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids):
        return self._tok.decode([int(t) for t in ids], skip_special_tokens=False)

    def encode_single_token(self, piece):
        ids = self.encode_ordinary(piece.decode())
        require(len(ids) == 1, f"{piece!r} is not one token of {self.name}: use a byte-level BPE")
        return ids[0]


def get_tokenizer(name="bytes"):
    """-> the tokenizer "bytes" (built in), of a tokenizer.json or .tiktoken path, a tiktoken encoding (gpt2,
    ...) or a folder's or hub repo's tokenizer.json (EleutherAI/gpt-neox-20b); a tokenizer passes through."""
    if hasattr(name, "encode_ordinary"):
        return name
    require(isinstance(name, str) and name, f"unknown tokenizer {name!r}: use bytes or a tokenizer.json")
    name = name if name.endswith((".json", ".tiktoken")) else hub_path(name, "tokenizer.json")
    return _load_tokenizer(os.path.abspath(name) if name.endswith((".json", ".tiktoken")) else name)


def hub_path(name, file=None):
    """name itself where it exists (a local path wins) or is no hub id ORG/NAME, else the repo's folder in
    huggingface_hub's cache (HF_HOME), fetched there unless HF_HUB_OFFLINE=1; file: that file of a folder."""
    if os.path.exists(name) or not re.fullmatch(r"[\w-][\w.-]*/[\w.-]+", name):
        return os.path.join(name, file) if file and os.path.isdir(name) else name
    from huggingface_hub import constants, snapshot_download   # installed with tokenizers
    files, why = [file] if file else ["config.json", "pytorch_model.bin", "ckpt.pt"], "incomplete"
    for cached in (True, False):   # the cache first: nothing there is fetched again
        try:
            folder = snapshot_download(name, allow_patterns=files, local_files_only=cached)
            if any(os.path.isfile(os.path.join(folder, f)) for f in files):
                return os.path.join(folder, file) if file else folder
        except Exception as e:   # not cached, offline, no network, no such repo
            why = f"{type(e).__name__}, HF_HUB_OFFLINE={int(constants.HF_HUB_OFFLINE)}"
    raise DataError(f"{name}: no such path, nor in the Hugging Face cache ({why}): run `hf download {name} "
                    f"{' '.join(files[:2])}` on a connected machine (the same HF_HOME), or check the path")


def load_data(data="stdlib", tokenizer="bytes", seed=0, val_fraction=0.05, cache_dir=None):
    """data: "stdlib" (the standard library's .py files: offline text), "markov:k=8,..." (MARKOV_DEFAULTS),
    a text file or a directory of them (split train/val by document with `seed`), or a nanoGPT .bin (uint16,
    or meta.json's "dtype"). Text is tokenized once, in a cache keyed by the files, tokenizer and split."""
    require(isinstance(data, str) and data and is_int(seed, 0) and isinstance(val_fraction, (int, float)) and
            0 <= val_fraction < 1, f"load_data: need a data name, seed >= 0 and val_fraction in [0, 1)")
    if data == "markov" or data.startswith("markov:"):
        return _load_markov(data[7:], int(seed))
    enc = get_tokenizer(tokenizer)
    if data.endswith(".bin"):   # nanoGPT's prepare.py output: memory-mapped as is, val is its tail
        meta, dtype = os.path.join(os.path.dirname(data), "meta.json"), "uint16"   # meta: a wider dtype
        try:
            dtype = json.loads(pathlib.Path(meta).read_text())["dtype"] if os.path.exists(meta) else dtype
        except (ValueError, TypeError, KeyError):
            dtype = None
        require(dtype in ("uint16", "uint32"), f'{meta} must hold {{"dtype": "uint16"}} or "uint32": fix it')
        require(dtype == "uint32" or enc.n_vocab <= 1 << 16, f"{enc.name!r} ids are past uint16: write "
                f'uint32 ids and declare "dtype": "uint32" in {meta}')
        size, width = require_file(data, "pass a nanoGPT .bin").st_size, np.dtype(dtype).itemsize
        require(size and not size % width, f"{data!r} holds {size} bytes, not whole {dtype} ids: pass a "
                f"nanoGPT .bin (another dtype: declare it in {meta})")
        tokens = np.memmap(data, dtype=dtype, mode="r")
        require(dtype != "uint16" or len(tokens) < 4 or tokens[1::2].any() or not tokens[::2].any(),
                f'{data!r} looks like uint32 ids (odd uint16s all 0): declare "dtype": "uint32" in {meta}')
        top = int(tokens.max())   # the whole file: an id past the vocabulary would fail mid-training
        require(top < enc.n_vocab, f"{data!r} holds id {top}, past {enc.name!r}: pass its --tokenizer")
        n = len(tokens) - round(len(tokens) * val_fraction)
        return Data(data, tokens[:n], tokens[n:], enc.n_vocab, enc.eot_token, enc, info=dict(key=f"{size}B"))
    stdlib = data == "stdlib"   # its .py files, not site-packages (per machine) nor tests (often stripped)
    root = sysconfig.get_paths()["stdlib"] if stdlib else data
    require(os.path.isdir(root) or os.path.isfile(root), f"no such file or directory {data!r}: pass a "
            f"directory or a text file (patterns are not expanded), a .bin, stdlib or markov:k=8,...")
    skip = {"site-packages", "dist-packages", "test", "tests", "idle_test"} if stdlib else set()
    files = [] if os.path.isdir(root) else [root]
    for path, dirs, names in os.walk(root):   # hidden files and folders skipped
        dirs[:] = [d for d in dirs if d not in skip | {"__pycache__"} and not d.startswith(".")]
        files += [os.path.join(path, f) for f in names if f.endswith(".py" if stdlib else "") and f[0] != "."]
    require(files, f"{root!r} holds no files: point --data at a folder of text files")
    files, seed, cache_dir = sorted(files), int(seed), cache_dir or DEFAULT_CACHE_DIR
    stats = [(os.path.abspath(f), st.st_size, st.st_mtime_ns) for f in files   # no FIFO, nothing unreadable
             for st in [require_file(f, "make it readable, or leave it out of --data")]]
    key = hashlib.sha1(json.dumps([CACHE_VERSION, enc.name, seed, val_fraction, stats]).encode()).hexdigest()
    stem = "".join(c if c.isalnum() or c in "-_" else "_" for c in os.path.basename(data.rstrip("/")))
    base = os.path.join(cache_dir, f"{stem or 'data'}-{enc.name}-{key[:16]}")
    meta = os.path.exists(base + ".json") and _whole_cache(base) or \
        _build_cache(base, data, files, enc, seed, val_fraction)
    tokens, n = np.memmap(base + ".bin", dtype=meta["dtype"], mode="r"), meta["n_train"]
    return Data(data, tokens[:n], tokens[n:], enc.n_vocab, enc.eot_token, enc, info=dict(meta, key=key[:16]))


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
    require(split in ("train", "val") and is_int(k, 2) and is_int(doc_len) and is_int(docs) and alpha > 0
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
    require(x.dim() == 2 and x.shape[1] >= 2 and not ((x < 0) | (x > k)).any(), f"markov_bayes_nll: tokens "
            f"must be [n, T >= 2] of ids in 0..{k} (k is eot), got shape {list(x.shape)}")
    require(not (x[:, 1:] == k).any(), "markov_bayes_nll: a window crosses a document boundary (an eot after "
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


# --- 3. Samplers: each one's randomness is a pure function of (seed, counters), so a resume is exact ---
# next_batch() -> Batch; state_dict() and load_state_dict() hold all that the next batches depend on.
class RandomWindows:
    """Windows from anywhere in the stream (across documents, as nanoGPT's): for zero, noise and SP states."""

    def __init__(self, tokens, batch_size, seq_len, seed=0):
        _require_sampler_fits("RandomWindows", tokens, batch_size, seq_len)
        self.tokens, self.batch_size, self.seq_len = tokens, batch_size, seq_len
        self.seed, self.step = seed, 0

    def next_batch(self):
        rng = np.random.default_rng([self.seed, self.step])
        self.step += 1
        starts = rng.integers(0, len(self.tokens) - self.seq_len, self.batch_size)
        return _batch(self.tokens, starts, self.seq_len)

    def state_dict(self):
        return {"seed": self.seed, "step": self.step}

    def load_state_dict(self, state):
        self.seed, self.step = int(state["seed"]), int(state["step"])


class DocumentStreams:
    """TBTT: row r reads a document in chunks, each from its predecessor's last token (and final state),
    then the next of a seeded order, new_doc[r] True; tails and documents shorter than a chunk are skipped."""

    def __init__(self, tokens, eot_token, batch_size, seq_len, seed=0):
        _require_sampler_fits("DocumentStreams", tokens, batch_size, seq_len)
        self.tokens, self.batch_size, self.seq_len = tokens, batch_size, seq_len
        starts = np.union1d([0], np.flatnonzero(np.asarray(tokens) == eot_token))
        lengths = np.diff(np.append(starts, len(tokens)))
        self.doc_start, self.doc_len = starts[lengths > seq_len], lengths[lengths > seq_len]
        require(len(self.doc_len), f"DocumentStreams: no document has {seq_len + 1} tokens: shorten seq_len")
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
        return _batch(self.tokens, starts, self.seq_len, new_doc)

    def state_dict(self):
        return dict(seed=self.seed, epoch=self.epoch, cursor=self.cursor, row_doc=list(self.row_doc),
                    row_pos=list(self.row_pos))

    def load_state_dict(self, state):
        require(len(state["row_doc"]) == self.batch_size, "DocumentStreams: resume with the same batch size")
        self.seed, self.epoch, self.cursor = int(state["seed"]), int(state["epoch"]), int(state["cursor"])
        self.row_doc, self.row_pos = [int(d) for d in state["row_doc"]], [int(p) for p in state["row_pos"]]
        self._order = self._shuffled()

    def _shuffled(self):   # the order of the documents in pass `epoch`
        return np.random.default_rng([self.seed, self.epoch]).permutation(len(self.doc_start))


def eval_windows(tokens, n, length, seed=0, eot_token=None):
    """n seeded windows -> int64 [n, length]; with eot_token each at a distinct document's start."""
    require(is_int(n) and is_int(length, 2) and len(tokens) >= length, f"eval_windows: need n >= 1 and 2 <= "
            f"length <= {len(tokens)} (the tokens), got {n!r}, {length!r}: use a shorter length or more data")
    rng, last = np.random.default_rng(seed), len(tokens) - length   # the last start that fits
    if eot_token is None:
        return _windows(tokens, rng.integers(0, last + 1, size=n), length)
    candidates = np.flatnonzero(np.asarray(tokens[: last + 1]) == eot_token)
    require(len(candidates) >= n, f"eval_windows: only {len(candidates)} documents start a window of "
            f"{length} tokens, {n} asked: use fewer or shorter windows or more documents")
    return _windows(tokens, rng.choice(candidates, size=n, replace=False), length)


class TaskSampler:
    """x, y of task_fn(seed=[seed, step, row, 1], length=seq_len + 1, ...), y -100 (ignored) but on the
    answer; shorter samples padded with eot on the RIGHT, after the answer: every row starts with its example
    from the initial state, exactly as evaluation reads it."""

    def __init__(self, task_fn, batch_size, seed=0, **task_kwargs):
        require(is_int(batch_size), f"TaskSampler: batch_size must be an integer >= 1, got {batch_size!r}")
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
        return Batch(tokens[:, :-1].contiguous(), tokens[:, 1:].masked_fill(~answer[:, 1:], -100), None)

    state_dict, load_state_dict = RandomWindows.state_dict, RandomWindows.load_state_dict


# --- Plumbing: the tokenizer cache, the corpus cache, the Markov spec, windows, input checks ----------
@functools.lru_cache(maxsize=None)
def _load_tokenizer(name):
    try:
        return ByteTokenizer() if name == "bytes" else JsonTokenizer(name) if name.endswith(".json") else \
            _tiktoken(name)
    except ImportError as e:   # an optional package (requirements.txt) not installed
        raise TokenizerUnavailableError(f"tokenizer {name} needs: pip install {e.name}") from None


def _tiktoken(name):
    """A tiktoken encoding (gpt2: nanoGPT's ids) from tiktoken's cache (TIKTOKEN_CACHE_DIR), fetched unless
    HF_HUB_OFFLINE=1; or a .tiktoken file (base64 token, rank) read as gpt2's: <|endoftext|> after them."""
    import tiktoken.load
    from tiktoken_ext.openai_public import r50k_pat_str   # gpt2's split pattern
    if name.endswith(".tiktoken"):   # read by its hash: a cached copy of an older file is not used
        sha = hashlib.sha256(require_file(name, "pass a .tiktoken file") and pathlib.Path(name).read_bytes())
        ranks = tiktoken.load.load_tiktoken_bpe(name, expected_hash=sha.hexdigest())
        return tiktoken.Encoding(f"tiktoken-{sha.hexdigest()[:12]}", pat_str=r50k_pat_str,
                                 mergeable_ranks=ranks, special_tokens={EOT: max(ranks.values()) + 1})
    known = tiktoken.list_encoding_names()
    require(name in known, f"unknown tokenizer {name!r}: use bytes, a tiktoken encoding ({', '.join(known)})"
            ", PATH/x.tiktoken, PATH/tokenizer.json or a hub id")
    offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0")   # then a file not in the cache fails
    with unittest.mock.patch.object(tiktoken.load, "read_file", None if offline else tiktoken.load.read_file):
        try:   # at once (read_file None): no network call that could hang
            return tiktoken.get_encoding(name)
        except Exception as e:
            why = "HF_HUB_OFFLINE=1" if offline else type(e).__name__
            raise TokenizerUnavailableError(f"tiktoken's {name} files are not in its cache ({why}): run "
                                            f"tiktoken.get_encoding('{name}') when online") from None


def write_atomically(path, write):
    """write(tmp) under a name unique to this process, then rename: a kill leaves the old file or the new."""
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException as e:  # also Ctrl-C, SIGTERM: no temporary file is left
        pathlib.Path(tmp).unlink(missing_ok=True)
        if not isinstance(e, (OSError, RuntimeError)):  # torch.save reports a full disk as a RuntimeError
            raise
        why = f"{str(e).splitlines()[0]}; disk full?" if isinstance(e, RuntimeError) else e.strerror or e
        raise OSError(f"cannot write {path} ({why}): the previous one is intact") from None


def _build_cache(base, label, files, enc, seed, val_fraction):
    """Files -> base.bin (eot + text each, train then a seeded val_fraction of them) and base.json."""
    tmp, is_val = f"{base}.{os.getpid()}.tmp", np.zeros(len(files), dtype=int)   # no half cache is left
    if len(files) >= 2 and val_fraction > 0:   # at least one val document, never all
        n_val = min(len(files) - 1, max(1, round(val_fraction * len(files))))
        is_val[np.random.default_rng(seed).permutation(len(files))[:n_val]] = 1
    dtype, n, docs, skipped = np.uint16 if enc.n_vocab <= 1 << 16 else np.uint32, [0, 0], [0, 0], 0
    sha1 = hashlib.sha1()   # of the .bin: verified before each use (_whole_cache)
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
                    sha1.update(ids.tobytes())
                    n[is_val[i]], docs[is_val[i]] = n[is_val[i]] + len(ids), docs[is_val[i]] + 1
        require(docs[0] and (docs[1] or not is_val.any()), f"{label!r}: no UTF-8 text documents for the "
                f"{'val' if docs[0] else 'train'} split ({skipped} of {len(files)} skipped): pass text files")
        if not docs[1]:   # one document: split its tokens
            n = [n[0] - round(n[0] * val_fraction), round(n[0] * val_fraction)]
        meta = dict(source=label, tokenizer=enc.name, dtype=np.dtype(dtype).name, n_train=n[0], n_val=n[1],
                    docs_train=docs[0], docs_val=docs[1], skipped_files=skipped,
                    bytes=sum(n) * np.dtype(dtype).itemsize, sha1=sha1.hexdigest())
        os.replace(tmp, base + ".bin")
        pathlib.Path(tmp).write_text(json.dumps(meta, indent=1))
        os.replace(tmp, base + ".json")
    finally:   # a full disk: the CLI prints the OSError's one line, and no partial file is left
        pathlib.Path(tmp).unlink(missing_ok=True)
    print(f"data: cached {label}: {docs[0]}+{docs[1]} docs, {n[0]}+{n[1]} tokens ({skipped} files skipped: "
          f"binary, not UTF-8 or empty) -> {base}.bin")
    return meta


def _whole_cache(base):   # its meta if base.bin has the size and sha1 that base.json (written last) records
    try:
        meta, raw = json.loads(pathlib.Path(base + ".json").read_text()), np.memmap(base + ".bin", mode="r")
        if len(raw) == meta["bytes"] and hashlib.sha1(raw).hexdigest() == meta["sha1"]:
            return meta
    except (OSError, ValueError, KeyError, TypeError):   # no or an empty .bin, a damaged .json
        pass
    print(f"data: the cache {base}.bin is truncated or corrupt: rebuilding it", file=sys.stderr)


def _load_markov(spec, seed):   # fast to regenerate (~1 s for the defaults): not cached on disk
    cfg, usage = dict(MARKOV_DEFAULTS), ",".join(f"{k}={v}" for k, v in MARKOV_DEFAULTS.items())
    items = [item.split("=") for item in spec.replace(" ", "").split(",") if item]
    try:   # an unknown or repeated key, a missing "=" or a value of the wrong type
        cfg.update({k: type(cfg[k])(v) for k, v in items})
        require(len(dict(items)) == len(items), "")
    except (KeyError, ValueError):
        raise DataError(f"markov: bad options {spec!r}: use some of {usage}, each once") from None
    k, alpha, shared, docs = cfg["k"], cfg["alpha"], cfg["shared"], (cfg["docs"], cfg["val_docs"])
    require(2 <= k and max(docs) * k * k <= 1 << 27 and 0 < alpha < math.inf and 0 <= shared < math.inf and
            cfg["doc_len"] >= 2 and min(docs) >= 1, f"markov: need 2 <= k, docs x k x k <= 2**27 (1 GiB of "
            f"transitions), finite alpha > 0, shared >= 0, doc_len >= 2, docs, val_docs >= 1; got {spec!r}")

    def draw(docs, split):   # -> the stream [eot d1 eot d2 ...]
        tokens, _ = sample_markov(k, alpha, cfg["doc_len"], docs, seed, split, shared)
        return np.concatenate([np.full((docs, 1), k), tokens], axis=1).reshape(-1).astype(np.uint16)

    name = "markov:" + ",".join(f"{key}={value}" for key, value in cfg.items() if key != "shared" or shared)
    floor = functools.partial(markov_bayes_nll, k=k, alpha=alpha, prior=markov_prior(k, alpha, shared, seed))
    return Data(name, draw(cfg["docs"], "train"), draw(cfg["val_docs"], "val"), k + 1, k, None, floor, cfg)


def _windows(tokens, starts, length):   # tokens[s : s+length] for each start -> int64 [len(starts), length]
    return torch.from_numpy(np.stack([np.asarray(tokens[s:s + length]) for s in starts]).astype(np.int64))


def _batch(tokens, starts, seq_len, new_doc=None):
    w = _windows(tokens, starts, seq_len + 1)
    return Batch(w[:, :-1].contiguous(), w[:, 1:].contiguous(), new_doc)


def _require_sampler_fits(what, tokens, batch_size, seq_len):
    require(is_int(batch_size) and is_int(seq_len) and len(tokens) > seq_len, f"{what}: need batch_size >= 1 "
            f"and 1 <= seq_len < {len(tokens)} (the tokens): use a shorter seq_len or more data")


def require_file(path, fix):   # -> os.stat of a regular file we may read, else DataError (a FIFO would hang)
    try:
        st = os.stat(path)
    except OSError as e:
        raise DataError(f"{path}: {e.strerror}: {fix}") from None
    require(stat.S_ISREG(st.st_mode), f"{path} is not a regular file (a FIFO, device or folder?): {fix}")
    require(os.access(path, os.R_OK), f"{path}: permission denied: {fix}")
    return st


def require(ok, message):   # bad input: a one-line DataError naming the problem and the fix (evaluate's too)
    if not ok:
        raise DataError(message)


def is_int(x, minimum=1):
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool) and x >= minimum

