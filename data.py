"""Data for the length-generalization experiments: 1. tokenizers and corpora (load_data -> Data, a train and a
val stream of token ids), 2. the in-context Markov process and its exact Bayes floor, 3. the samplers (each
next_batch() -> Batch). A stream is [eot d1 eot d2 ...]: a window that starts at an eot starts a document."""
import argparse
import codecs
import collections
import errno
import functools
import hashlib
import itertools
import json
import math
import os
import pathlib
import re
import shutil
import signal
import sys
import sysconfig
import unittest.mock
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence
from tqdm import tqdm

EOT = "<|endoftext|>"
DEFAULT_CACHE_DIR = os.environ.get("LENGTHGEN_CACHE_DIR") or os.path.join(os.path.dirname(os.path.abspath(
    __file__)), "data_cache")  # gitignored
CACHE_VERSION = 4  # bump when the cache layout or the document format changes
PIECE_CHARS, BATCH_PIECES = 1 << 14, 256   # text per encoding, pieces per batch (on all cores): bound memory
LINE_CUT = re.compile(r"\n(?=\S)(?<=\S\n)")   # a newline between non-spaces: byte-level BPEs split there
codecs.register_error("nul", lambda e: ("\0", e.end))   # an invalid UTF-8 byte reads as NUL (binary files)

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

    def encode_ordinary_batch(self, texts):   # -> uint8 arrays: no Python int per byte
        return [np.frombuffer(text.encode(), np.uint8) for text in texts]

    def decode(self, ids):   # a character cut in two reads U+FFFD
        return b"".join(self._pieces[int(t)] for t in ids).decode(errors="replace")

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

    def encode_ordinary_batch(self, texts):   # in parallel on every core (RAYON_NUM_THREADS: fewer)
        return [e.ids for e in self._tok.encode_batch_fast(texts, add_special_tokens=False)]

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
    huggingface_hub's cache (HF_HOME), fetched there unless HF_HUB_OFFLINE=1; file: that file of a folder.
    A Hub that does not answer ends it after HF_HUB_ETAG_TIMEOUT seconds (default 10), in one line."""
    if os.path.exists(name) or not re.fullmatch(r"[\w-][\w.-]*/[\w.-]+", name):
        return os.path.join(name, file) if file and os.path.isdir(name) else name
    import huggingface_hub as hf   # installed with tokenizers
    from huggingface_hub import constants, errors
    layouts = [[file]] if file else [["ckpt.pt"], ["config.json", "pytorch_model.bin"]]   # ours, official
    try:
        cached = {f: hf.try_to_load_from_cache(name, f) for files in layouts for f in files}
    except ValueError as e:   # the Hub's rules for an id (no "--", ...)
        raise DataError(f"{name}: no such path, nor a hub id ({e}): check the path") from None
    cached = {f: path for f, path in cached.items() if isinstance(path, str)}   # else not cached
    for files in layouts:   # the cache first: nothing there is fetched again
        if all(f in cached for f in files) and len({os.path.dirname(cached[f]) for f in files}) == 1:
            return cached[file] if file else os.path.dirname(cached[files[0]])
    missing = [f for f in layouts[-1] if f not in cached]   # what `hf download` is to fetch

    def fail(why):
        has = f"holds {' and '.join(cached)} but not" if cached else "has no"
        return DataError(f"{name}: no such path, and the Hugging Face cache {has} {' nor '.join(missing)} "
                         f"({why}): run `hf download {name} {' '.join(missing)}` on a connected machine "
                         "(the same HF_HOME)")
    if constants.HF_HUB_OFFLINE:
        raise fail("HF_HUB_OFFLINE=1")
    timeout = constants.HF_HUB_ETAG_TIMEOUT   # one HEAD a file, no retry (hf_hub_download retries a stalled
    for files in layouts:                     # Hub for minutes), then the download
        try:
            for f in files:
                hf.get_hf_file_metadata(hf.hf_hub_url(name, f), timeout=timeout)
            paths = [hf.hf_hub_download(name, f, etag_timeout=timeout) for f in files]
            return paths[0] if file else os.path.dirname(paths[0])
        except errors.RemoteEntryNotFoundError:   # not this layout
            continue
        except errors.RepositoryNotFoundError:
            raise fail("no such Hub repo, or a private one") from None
        except Exception as e:   # a stalled or refused connection, a proxy, a full disk
            stalled = "Timeout" in type(e).__name__   # httpx's ReadTimeout, ConnectTimeout...
            raise fail(f"the Hub did not answer within {timeout:g} s: HF_HUB_ETAG_TIMEOUT sets it" if stalled
                       else f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}") from None
    raise fail("nor does the Hub repo")

def load_data(data="stdlib", tokenizer="bytes", seed=0, val_fraction=0.05, cache_dir=None, out=None):
    """data: "stdlib" (the standard library's .py files: offline text), "markov:k=8,..." (MARKOV_DEFAULTS,
    drawn with `seed`), a text file or a directory of them, a directory `python data.py` wrote, or a nanoGPT
    .bin (uint16, or meta.json's "dtype"). Text is tokenized once, into a cache keyed by the files and the
    tokenizer (out: into that new directory), split by document (one file: its tail)."""
    require(isinstance(data, str) and data and is_int(seed, 0) and isinstance(val_fraction, (int, float)) and
            0 <= val_fraction < 1, "load_data: need a data name, seed >= 0 and val_fraction in [0, 1)")
    markov, prepared = data.split(":")[0] == "markov", os.path.isfile(os.path.join(data, "meta.json"))
    require(not out or not (markov or prepared or data.endswith(".bin")), f"--data {data} is read as it is "
            f"(a Markov spec, .bin or prepared folder): nothing to prepare into {out}: pass it to train.py")
    require(not out or not os.path.exists(out), f"{out} exists: prepare into a new directory")
    if markov:
        return _load_markov(data[7:], int(seed))
    enc = get_tokenizer(tokenizer)
    if data.endswith(".bin"):   # nanoGPT's prepare.py output: memory-mapped as is, val is its tail
        meta, pkl = (os.path.join(os.path.dirname(data), f) for f in ("meta.json", "meta.pkl"))
        require(not os.path.exists(pkl), f"{pkl}: {data} holds nanoGPT character-level ids (a vocabulary of "
                "its own, no tokenizer of this repo): tokenize the text instead, python data.py --data TEXT")
        dtype = _id_dtype(_read_json(meta) if os.path.exists(meta) else dict(dtype="uint16"), meta, enc)
        size = require_file(data, "pass a nanoGPT .bin").st_size
        require(size and not size % dtype.itemsize, f"{data!r} holds {size} bytes, not whole {dtype} ids: "
                f"pass a nanoGPT .bin (another dtype: declare it in {meta})")
        tokens = np.memmap(data, dtype=dtype, mode="r")
        wider = {"uint8": "uint16", "uint16": "uint32"}.get(dtype.name)   # small ids of a wider dtype read as
        require(not wider or len(tokens) < 4 or tokens[1::2].any() or not tokens[::2].any(),   # id, 0, id, 0
                f'{data!r} looks like {wider} ids (odd {dtype}s all 0): declare "dtype": "{wider}" in {meta}')
        top = int(tokens.max())   # the whole file: an id past the vocabulary would fail mid-training
        require(top < enc.n_vocab, f"{data!r} holds id {top}, past {enc.name!r}: pass its --tokenizer")
        n = len(tokens) - round(len(tokens) * val_fraction)
        return Data(data, tokens[:n], tokens[n:], enc.n_vocab, enc.eot_token, enc, info=dict(key=f"{size}B"))
    if prepared:   # a directory python data.py wrote
        return _prepared(data, data, enc)
    stdlib = data == "stdlib"   # its .py files, not site-packages (per machine) nor tests (often stripped)
    root = sysconfig.get_paths()["stdlib"] if stdlib else data
    require(os.path.isdir(root) or os.path.isfile(root), f"no such file or directory {data!r}: pass a "
            f"directory or a text file (patterns are not expanded), a .bin, stdlib or markov:k=8,...")
    skip = {"site-packages", "dist-packages", "test", "tests", "idle_test"} if stdlib else set()
    files = [] if os.path.isdir(root) else [root]
    seen = {os.path.realpath(root)}   # symlinked folders followed, each folder once (a link cycle ends)
    for path, dirs, names in os.walk(root, followlinks=True):   # hidden files and folders skipped
        dirs[:] = [d for d in sorted(dirs) if d not in skip | {"__pycache__"} and not d.startswith(".") and
                   (real := os.path.realpath(os.path.join(path, d))) not in seen and not seen.add(real)]
        files += [os.path.join(path, f) for f in names if f.endswith(".py" if stdlib else "") and f[0] != "."]
    require(files, f"{root!r} holds no files: point --data at a folder of text files")
    stats = [(os.path.abspath(f), st.st_size, st.st_mtime_ns) for f in sorted(files)   # no FIFO, nothing
             for st in [require_file(f, "make it readable, or leave it out of --data")]]   # unreadable
    key = hashlib.sha1(json.dumps([CACHE_VERSION, enc.name, val_fraction, stats]).encode()).hexdigest()
    stem = "".join(c if c.isalnum() or c in "-_" else "_" for c in os.path.basename(data.rstrip("/")))[:100]
    folder = out or os.path.join(cache_dir or DEFAULT_CACHE_DIR, f"{stem or 'data'}-{enc.name}-{key[:16]}")
    require(out or not os.path.exists(folder) or os.path.isdir(folder), f"{folder} is a file where the cache "
            "folder goes: remove it or pass another --cache-dir")
    if not (meta := _whole(folder)) and os.path.exists(folder):
        print(f"data: the cache {folder} is truncated or corrupt: rebuilding it", file=sys.stderr)
        shutil.rmtree(folder)
    try:
        meta = meta or _build(folder, data, [f for f, *_ in stats], enc, val_fraction)
    except OSError as e:   # another process may have written the same cache meanwhile (an --out: its own)
        require(not out or not os.path.exists(out), f"{out} was written by another process meanwhile, not "
                f"from {data}: prepare into a new directory")
        if not (meta := _whole(folder)):
            fix = "shorter" if os.strerror(errno.ENAMETOOLONG) in str(e) else "writable"
            raise OSError(f"{e}: pass a {fix} {'--out' if out else '--cache-dir'}") from None
    return _prepared(data, folder, enc, meta)

# --- 2. The in-context Markov process and its exact Bayes floor -----------------------------------
# Each document draws its OWN transition matrix P (K x K, rows ~ Dirichlet(alpha)), a uniform first token,
# then doc_len tokens of the chain: predicting well means counting bigrams in context, the skill whose
# failure past T_train the paper studies. shared=C > 0: RELATED documents, rows ~ Dirichlet(C * G_i).
MARKOV_DEFAULTS = dict(k=8, alpha=0.3, doc_len=4096, docs=2048, val_docs=256, shared=0.0)

def markov_prior(k, alpha, shared=0.0, seed=0):
    """[k, k] Dirichlet pseudo-counts of every document's rows: alpha, or shared * G (related documents)."""
    return np.full((k, k), float(alpha)) if not shared else \
        shared * np.random.default_rng([seed, 2]).dirichlet(np.full(k, alpha), size=k)

def sample_markov(k, alpha, doc_len, docs, seed=0, split="train", shared=0.0):
    """-> (tokens [docs, doc_len] int64 in 0..k-1, transitions [docs, k, k]); doc d: from (seed, split, d)."""
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
    require(x.dim() == 2 and x.shape[1] >= 2 and not ((x < 0) | (x > k)).any() and not (x[:, 1:] == k).any(),
            f"markov_bayes_nll: need [n, T >= 2] ids in 0..{k} (k is eot), no window crossing a document "
            "boundary (an eot after its start): use windows from document starts of <= doc_len + 1 tokens")
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
        self.tokens, self.batch_size, self.seq_len = tokens, batch_size, seq_len
        self.seed, self.step = seed, 0

    def next_batch(self):   # eval_windows' uniform draw, seeded by (seed, step)
        windows = eval_windows(self.tokens, self.batch_size, self.seq_len + 1, [self.seed, self.step])
        self.step += 1
        return _batch(windows)

    def state_dict(self):
        return {"seed": self.seed, "step": self.step}

    def load_state_dict(self, state):
        self.seed, self.step = int(state["seed"]), int(state["step"])

class DocumentStreams:
    """TBTT: row r reads a document in chunks, each from its predecessor's last token (and final state),
    then the next of a seeded order, new_doc[r] True; tails and documents shorter than a chunk are skipped."""

    def __init__(self, tokens, eot_token, batch_size, seq_len, seed=0):
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
        return _batch(_windows(self.tokens, starts, self.seq_len + 1), new_doc)

    def state_dict(self):
        return dict(seed=self.seed, epoch=self.epoch, cursor=self.cursor, row_doc=list(self.row_doc),
                    row_pos=list(self.row_pos))

    def load_state_dict(self, state):
        self.seed, self.epoch, self.cursor = int(state["seed"]), int(state["epoch"]), int(state["cursor"])
        self.row_doc, self.row_pos = [int(d) for d in state["row_doc"]], [int(p) for p in state["row_pos"]]
        self._order = self._shuffled()

    def _shuffled(self):   # the order of the documents in pass `epoch`
        return np.random.default_rng([self.seed, self.epoch]).permutation(len(self.doc_start))

def eval_windows(tokens, n, length, seed=0, eot_token=None):
    """n seeded windows -> int64 [n, length]; with eot_token each at a distinct document's start."""
    rng, last = np.random.default_rng(seed), len(tokens) - length   # the last start that fits
    require(last >= 0, f"eval_windows: windows of {length} > {len(tokens)} tokens: shorten them or add data")
    if eot_token is None:
        return _windows(tokens, rng.integers(0, last + 1, size=n), length)
    candidates = np.flatnonzero(np.asarray(tokens[: last + 1]) == eot_token)
    require(len(candidates) >= n, f"eval_windows: only {len(candidates)} documents start a window of "
            f"{length} tokens, {n} asked: use fewer or shorter windows or more documents")
    return _windows(tokens, rng.choice(candidates, size=n, replace=False), length)

class TaskSampler:
    """x, y of task_fn(seed=[seed, step, row, 1], length=seq_len + 1, ...), y -100 (ignored) but on the
    answer; eot pads on the RIGHT: each row reads its example from the initial state, as evaluation does."""

    def __init__(self, task_fn, batch_size, seed=0, **task_kwargs):
        self.task_fn, self.batch_size, self.seed, self.task_kwargs = task_fn, batch_size, seed, task_kwargs
        self.pad_id, self.step = get_tokenizer(task_kwargs.get("tokenizer", "bytes")).eot_token, 0

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
        try:
            ranks = tiktoken.load.load_tiktoken_bpe(name, expected_hash=sha.hexdigest())
        except ValueError as e:   # a line that is not "base64 rank"
            raise DataError(f"{name}: {str(e).splitlines()[0][:150]}: pass a .tiktoken file") from None
        ids, gaps = set(ranks.values()), sorted(set(range(len(ranks))) - set(ranks.values()))
        lacks = [b for b in range(256) if bytes([b]) not in ranks]   # tiktoken panics on a byte it lacks
        problem = not ranks and "no tokens" or len(ids) < len(ranks) and "two tokens share a rank" or \
            gaps and f"no token has rank {gaps[0]}" or lacks and f"the byte {lacks[0]:#04x} is no token"
        require(not problem, f"{name}: {problem}: pass a .tiktoken file of a byte-level BPE (each rank "
                "0..n-1 once)")
        return tiktoken.Encoding(f"tiktoken-{sha.hexdigest()[:12]}", pat_str=r50k_pat_str,
                                 mergeable_ranks=ranks, special_tokens={EOT: len(ranks)})
    known = tiktoken.list_encoding_names()
    require(name in known, f"unknown tokenizer {name!r}: use bytes, a tiktoken encoding ({', '.join(known)})"
            ", PATH/x.tiktoken, PATH/tokenizer.json or a hub id")
    import requests   # installed with tiktoken
    from huggingface_hub import constants
    offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0")   # then a file not in the cache fails
    read, urls, timeout = tiktoken.load.read_file, [], constants.HF_HUB_DOWNLOAD_TIMEOUT

    def bounded_read(url):   # tiktoken's read_file, whose requests.get has no timeout: given one
        urls.append(url)
        require(not offline, "HF_HUB_OFFLINE=1")   # at once: no network call
        with unittest.mock.patch.object(requests, "get", functools.partial(requests.get, timeout=timeout)):
            return read(url)
    with unittest.mock.patch.object(tiktoken.load, "read_file", bounded_read):
        try:
            return tiktoken.get_encoding(name)
        except Exception as e:
            why = str(e) if offline else f"no answer within {timeout:g} s: HF_HUB_DOWNLOAD_TIMEOUT sets it" \
                if isinstance(e, requests.Timeout) else type(e).__name__
            raise TokenizerUnavailableError(
                f"tiktoken's {name}: {urls[-1] if urls else 'its files'} is not in its cache ({why}): run "
                f"python -c \"import tiktoken; tiktoken.get_encoding('{name}')\" on a connected machine (the "
                "same TIKTOKEN_CACHE_DIR)") from None

def write_atomically(path, write):
    """write(tmp) under a name unique to this process, then rename: a kill leaves the old file or the new.
    write a dict {name: write} of files in the folder path: all renamed at once, Ctrl-C and SIGTERM held
    meanwhile: the folder keeps its previous files or gets all the new ones, never a mix."""
    several = isinstance(write, dict)
    paths = {os.path.join(path, name): w for name, w in write.items()} if several else {path: write}
    tmps = {p: f"{p}.{os.getpid()}.tmp" for p in paths}
    try:
        for p, w in paths.items():
            w(tmps[p])
        held = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM) if several}
        try:
            for p, tmp in tmps.items():
                os.replace(tmp, p)
        finally:
            for s, handler in held.items():
                signal.signal(s, handler)
    except BaseException as e:  # also Ctrl-C, SIGTERM: no temporary file is left
        for tmp in tmps.values():
            shutil.rmtree(tmp, ignore_errors=True)   # a directory's (a corpus's)
            if os.path.lexists(tmp):   # (not when its folder is missing or a file)
                os.unlink(tmp)
        if not isinstance(e, (OSError, RuntimeError)):  # torch.save reports a full disk as a RuntimeError
            raise
        why = f"{str(e).splitlines()[0]}; disk full?" if isinstance(e, RuntimeError) else e.strerror or e
        kept = "the previous one is intact" if os.path.exists(next(iter(paths))) else "nothing was written"
        raise OSError(f"cannot write {', '.join(paths)} ({why}): {kept}") from None

def _build(folder, label, files, enc, val_fraction):
    """Text files (sorted) -> folder/train.bin and val.bin, eot + the ids of each (val: a val_fraction of the
    files drawn with the fixed seed 0, the same split for every run; one file: its last tokens), meta.json."""
    texts = [f for f in files if os.path.getsize(f) and all("\0" not in p for p in _pieces(f))]   # UTF-8 text
    require(texts, f"{label!r}: no UTF-8 text documents ({len(files)} files skipped: binary, not UTF-8 or "
            "empty): pass text files")
    n_val = min(len(files) - 1, max(1, round(val_fraction * len(files)))) if val_fraction else 0  # never all
    val = {files[i] for i in np.random.default_rng(0).permutation(len(files))[:n_val]} & set(texts)
    dtype, sha1 = np.dtype(np.uint16 if enc.n_vocab <= 1 << 16 else np.uint32), hashlib.sha1()
    encode = getattr(enc, "encode_ordinary_batch", None) or (lambda texts: [*map(enc.encode_ordinary, texts)])
    cut = [*enc.encode_ordinary("a.\nb")] == [*enc.encode_ordinary("a.\n"), *enc.encode_ordinary("b")]
    eot = np.array([enc.eot_token], dtype).tobytes()
    meta = dict(source=label, tokenizer=enc.name, vocab_size=enc.n_vocab, dtype=dtype.name,
                eot_token=enc.eot_token, docs_train=len(texts) - len(val), docs_val=len(val),
                skipped_files=len(files) - len(texts))

    def write(tmp):   # batches of pieces, each encoded on every core while the next is read, this one written
        os.makedirs(tmp)
        for split, paths in ("train", [f for f in texts if f not in val]), ("val", sorted(val)):
            pieces = ((eot * (i == 0), p) for path in tqdm(paths, f"tokenizing {label}", delay=1, leave=False)
                      for i, p in enumerate(_pieces(path, cut)))
            with open(os.path.join(tmp, f"{split}.bin"), "wb") as f, ThreadPoolExecutor(1) as pool:
                batch = list(itertools.islice(pieces, BATCH_PIECES))   # [(eot or b"", text)]
                job = pool.submit(encode, [p for _, p in batch])
                while batch:
                    after = list(itertools.islice(pieces, BATCH_PIECES))
                    ids, job = job.result(), pool.submit(encode, [p for _, p in after])
                    chunk = b"".join(e + np.asarray(t, dtype).tobytes() for (e, _), t in zip(batch, ids))
                    sha1.update(chunk)
                    f.write(chunk)
                    batch = after
        if val_fraction and not val:   # one document: its last tokens are the val split (the sha1 holds)
            tokens = np.memmap(os.path.join(tmp, "train.bin"), dtype, "r")
            n = len(tokens) - round(len(tokens) * val_fraction)
            tokens[n:].tofile(os.path.join(tmp, "val.bin"))
            os.truncate(os.path.join(tmp, "train.bin"), n * dtype.itemsize)
        meta.update({f"n_{s}": os.path.getsize(os.path.join(tmp, f"{s}.bin")) // dtype.itemsize
                     for s in ("train", "val")}, sha1=sha1.hexdigest())   # verified before each use (_whole)
        pathlib.Path(tmp, "meta.json").write_text(json.dumps(meta, indent=1))
    write_atomically(folder, write)
    print("data: tokenized {source}: {docs_train}+{docs_val} docs, {n_train}+{n_val} tokens ({skipped_files} "
          "files skipped: binary, not UTF-8 or empty) -> {}".format(folder, **meta))
    return meta

def _pieces(path, cut=True):
    """The file's text in pieces of about PIECE_CHARS, each ending at a LINE_CUT (cut=False: one piece)."""
    rest = ""
    with open(path, encoding="utf-8", errors="nul", newline="") as f:   # "\r\n" stays
        while block := f.read(max(PIECE_CHARS, len(rest))):   # a long stretch without a cut: read more
            rest += block
            while cut and (m := LINE_CUT.search(rest, PIECE_CHARS)):
                yield rest[:m.end()]
                rest = rest[m.end():]
    if rest:
        yield rest

def _whole(folder):   # -> its meta.json if train.bin + val.bin have the sha1 it records (it is written last)
    try:
        meta, sha1 = json.loads(pathlib.Path(folder, "meta.json").read_text()), hashlib.sha1()
        for split in ("train", "val"):
            with open(os.path.join(folder, f"{split}.bin"), "rb") as f:
                hashlib.file_digest(f, lambda: sha1)   # one sha1 over both files
        return meta if meta["sha1"] == sha1.hexdigest() else None
    except (OSError, ValueError, KeyError, TypeError):   # a missing or damaged file
        return None

def _prepared(name, folder, enc, meta=None):   # -> Data of folder's train.bin and val.bin (meta: verified)
    meta, file = meta or _whole(folder), os.path.join(folder, "meta.json")
    require(meta, f"{folder}: no train.bin and val.bin that match its meta.json: run python data.py again")
    dtype, bins = _id_dtype(meta, file, enc), {s: os.path.join(folder, f"{s}.bin") for s in ("train", "val")}
    require(all(meta.get(f"n_{s}") == os.path.getsize(b) / dtype.itemsize for s, b in bins.items()),
            f'{file}: its "dtype" {dtype} and "n_train", "n_val" do not fit train.bin, val.bin: run python '
            "data.py again")
    train, val = [np.memmap(b, dtype, "r") if meta[f"n_{s}"] else np.zeros(0, dtype)   # an empty file cannot
                  for s, b in bins.items()]                                            # be mapped
    top = max([int(a.max()) for a in (train, val) if len(a)], default=-1)   # as a .bin's: before training
    require(top < enc.n_vocab, f"{folder} holds id {top}, past the {enc.n_vocab} of {enc.name!r}: pass its "
            "--tokenizer")
    return Data(name, train, val, enc.n_vocab, enc.eot_token, enc, info=dict(meta, key=meta["sha1"][:16]))

def _read_json(path):   # a meta.json -> its object, else a one-line DataError
    try:
        return json.loads(pathlib.Path(path).read_text())
    except (OSError, ValueError) as e:
        raise DataError(f"{path} is not readable JSON ({type(e).__name__}): fix or remove it") from None

def _id_dtype(meta, file, enc):   # -> the numpy dtype of the ids that a meta.json declares for this tokenizer
    dtype, names = meta.get("dtype") if isinstance(meta, dict) else None, ("uint8", "uint16", "uint32")
    require(dtype in names, f'{file} declares no "dtype" of {", ".join(names)} (got {dtype!r}): write the '
            "one its ids have")
    claims = {k: meta[k] for k in ("tokenizer", "vocab_size") if k in meta}
    require(claims.items() <= dict(tokenizer=enc.name, vocab_size=enc.n_vocab).items(), f"{file} declares "
            f"{json.dumps(claims)[1:-1]}, not the {enc.n_vocab} ids of {enc.name}: pass the --tokenizer it "
            "names")
    require(enc.n_vocab <= 1 << 8 * np.dtype(dtype).itemsize, f"{enc.name!r} ids are past {dtype}: write "
            f'wider ids (uint16, uint32) and declare "dtype" in {file}')
    return np.dtype(dtype)

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
    drawn = [sample_markov(k, alpha, cfg["doc_len"], n, seed, split, shared)[0] for n, split in
             zip(docs, ("train", "val"))]   # [docs, doc_len] each -> the stream [eot d1 eot d2 ...]
    train, val = [np.pad(d, [(0, 0), (1, 0)], constant_values=k).reshape(-1).astype(np.uint16) for d in drawn]
    name = "markov:" + ",".join(f"{key}={value}" for key, value in cfg.items() if key != "shared" or shared)
    floor = functools.partial(markov_bayes_nll, k=k, alpha=alpha, prior=markov_prior(k, alpha, shared, seed))
    return Data(name, train, val, k + 1, k, None, floor, cfg)

def _windows(tokens, starts, length):   # tokens[s : s+length] for each start -> int64 [len(starts), length]
    return torch.from_numpy(np.stack([np.asarray(tokens[s:s + length]) for s in starts]).astype(np.int64))

def _batch(windows, new_doc=None):   # windows of seq_len + 1 tokens -> Batch: y is x shifted by one
    return Batch(windows[:, :-1].contiguous(), windows[:, 1:].contiguous(), new_doc)

def require_file(path, fix):   # -> os.stat of a regular file we may read, else DataError (a FIFO would hang)
    try:
        st = os.stat(path)
    except OSError as e:
        raise DataError(f"{path}: {e.strerror}: {fix}") from None
    require(os.path.isfile(path), f"{path} is not a regular file (a FIFO, device or folder?): {fix}")
    require(os.access(path, os.R_OK), f"{path}: permission denied: {fix}")
    return st

def require(ok, message):   # bad input: a one-line DataError naming the problem and the fix (evaluate's too)
    if not ok:
        raise DataError(message)

def is_int(x, minimum=1):
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool) and x >= minimum

if __name__ == "__main__":   # the prepare command
    ap = argparse.ArgumentParser(description="Tokenize a corpus once into DIR/train.bin, val.bin (5% of the "
                                 "files, drawn with seed 0; one file: its tail) and meta.json: --data DIR")
    ap.error = lambda message: ap.exit(2, f"error: {message}\n")  # one line, as every other bad input
    ap.add_argument("--data", required=True, help="a text file, a folder of them (a document each) or stdlib")
    ap.add_argument("--tokenizer", default="bytes", help="bytes or PATH/tokenizer.json (DIR is read with it)")
    ap.add_argument("--out", required=True, metavar="DIR", help="a new directory (nothing is overwritten)")
    args = ap.parse_args()
    if empty := [k for k, v in vars(args).items() if not v.strip()]:   # "" would read as "." (--out, --data)
        ap.error(f"--{empty[0]} is empty: pass a value (python data.py --help)")
    signal.signal(signal.SIGTERM, signal.default_int_handler)   # as Ctrl-C: write_atomically cleans up
    try:
        load_data(args.data, args.tokenizer, out=os.path.normpath(args.out))
    except (OSError, DataError, TokenizerUnavailableError) as e:
        sys.exit(f"error: {e}")
    except KeyboardInterrupt:
        sys.exit(f"interrupted: {args.out} not written, no temporary file left")
