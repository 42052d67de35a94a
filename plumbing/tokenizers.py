"""Tokenizers behind --tokenizer: bytes (built in), a tokenizer.json (GPT-NeoX's BPE) and tiktoken's
encodings or .tiktoken files, all offline. Each: name, n_vocab, eot_token, encode_ordinary(text) -> ids (a
special token's text inside a document stays plain text), decode(ids), encode_single_token(bytes)."""
import base64
import functools
import hashlib
import os
import pathlib
import tempfile
import unittest.mock

import numpy as np

from plumbing.files import DataError, require, require_file

EOT = "<|endoftext|>"

def _file_name(kind, raw):   # a tokenizer file's name: its bytes' sha1 (the cache key of the ids it gives)
    return f"{kind}-{hashlib.sha1(raw).hexdigest()[:12]}"

def _not_one_token(piece, name):   # encode_single_token's error: the tasks need single-token separators
    return DataError(f"{piece!r} is not one token of {name}: use a byte-level BPE")

class ByteTokenizer:
    """One token per byte (id = byte value) plus <|endoftext|> = 256: built in, no file, no merges."""
    name = "bytes"
    n_vocab = 257
    eot_token = 256
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
        raw = pathlib.Path(path).read_bytes()
        try:
            self._tok = tokenizers.Tokenizer.from_str(raw.decode())
        except Exception:
            raise DataError(f"{path} is not a readable tokenizer.json: pass the model's own") from None
        self._tok.encode_special_tokens = True   # "<|endoftext|>" inside a document is plain text
        special = {t.content: i for i, t in self._tok.get_added_tokens_decoder().items() if t.special}
        require(EOT in special, f"{path} has no {EOT} special token to mark documents: use GPT-NeoX's")
        self.name = _file_name("json", raw)
        self.eot_token = special[EOT]
        self.n_vocab = max(self._tok.get_vocab(with_added_tokens=True).values()) + 1

    def encode_ordinary(self, text):   # no template (BOS...) added: documents are marked by the eot
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_ordinary_batch(self, texts):   # in parallel on every core (RAYON_NUM_THREADS: fewer)
        return [e.ids for e in self._tok.encode_batch_fast(texts, add_special_tokens=False)]

    def decode(self, ids):
        return self._tok.decode([int(t) for t in ids], skip_special_tokens=False)

    def encode_single_token(self, piece):
        ids = self.encode_ordinary(piece.decode())
        if len(ids) != 1:
            raise _not_one_token(piece, self.name)
        return ids[0]

class TiktokenTokenizer:
    """A tiktoken Encoding: one of tiktoken's (gpt2: nanoGPT's ids) or a .tiktoken file's."""

    def __init__(self, encoding):
        self._encoding = encoding
        self.name = encoding.name
        self.n_vocab = encoding.n_vocab
        self.eot_token = encoding.eot_token

    def encode_ordinary(self, text):
        return self._encoding.encode_ordinary(text)

    def encode_ordinary_batch(self, texts):   # a thread per core
        return self._encoding.encode_ordinary_batch(texts, num_threads=os.cpu_count() or 1)

    def decode(self, ids):   # numpy's, torch's ids as a list (tiktoken takes no tensor); a cut char: U+FFFD
        return self._encoding.decode(list(ids))

    def encode_single_token(self, piece):
        try:
            return self._encoding.encode_single_token(piece)
        except KeyError:
            raise _not_one_token(piece, self.name) from None

TIKTOKEN_NAMES = ("gpt2", "r50k_base", "p50k_base", "cl100k_base", "o200k_base")   # each has <|endoftext|>

def get_tokenizer(name="bytes"):
    """-> the tokenizer "bytes" (built in), a tiktoken encoding of TIKTOKEN_NAMES (that name wins over a
    folder of the same name: ./gpt2 is the folder), or of a .tiktoken file, a tokenizer.json or a folder
    holding one (GPT-NeoX's: the official Mamba checkpoints'); a tokenizer passes through."""
    if hasattr(name, "encode_ordinary"):
        return name
    require(isinstance(name, str) and name, f"unknown tokenizer {name!r}: use bytes or a tokenizer.json")
    if name not in ("bytes", *TIKTOKEN_NAMES):
        name = os.path.join(name, "tokenizer.json") if os.path.isdir(name) else name
        require(os.path.exists(name), f"unknown tokenizer {name!r}: pass bytes or a Hugging Face "
                "tokenizer.json (`hf download ORG/NAME tokenizer.json --local-dir DIR`: DIR/tokenizer.json), "
                f"a tiktoken encoding ({', '.join(TIKTOKEN_NAMES)}) or PATH/x.tiktoken")
        tiktoken_file = name.endswith(".tiktoken")
        require_file(name, "pass a .tiktoken file" if tiktoken_file else "pass a Hugging Face tokenizer.json")
        name = os.path.abspath(name)   # not a FIFO (it would hang): a file, read once a process
    return _load_tokenizer(name)

@functools.lru_cache(maxsize=None)
def _load_tokenizer(name):   # one object a name: a file is read once a process
    try:
        if name == "bytes":
            return ByteTokenizer()
        if name in TIKTOKEN_NAMES:
            return _tiktoken(name)
        return _tiktoken_file(name) if name.endswith(".tiktoken") else JsonTokenizer(name)
    except ImportError as e:   # an optional package (requirements.txt) not installed
        raise DataError(f"tokenizer {name} needs: pip install {e.name}") from None

def _tiktoken_cache_dir():   # -> where tiktoken.load.read_file_cached looks ("": no cache)
    default = os.path.join(tempfile.gettempdir(), "data-gym-cache")
    return os.environ.get("TIKTOKEN_CACHE_DIR", os.environ.get("DATA_GYM_CACHE_DIR", default))

def _tiktoken(name):
    """tiktoken's encoding from its BPE files in tiktoken's cache (_tiktoken_cache_dir(): a file a URL, named
    by the sha1 of the URL, checked against its sha256): never fetched here, a missing one named."""
    import tiktoken
    import tiktoken.load
    from tiktoken_ext.openai_public import ENCODING_CONSTRUCTORS

    def offline(url):   # tiktoken's read_file: called for a file not in the cache, or failing its sha256
        folder = _tiktoken_cache_dir()
        file = os.path.join(folder, hashlib.sha1(url.encode()).hexdigest())
        where = f"as {file}" if folder else "and TIKTOKEN_CACHE_DIR is empty (no cache)"
        fetch = f"python -c \"import tiktoken; tiktoken.get_encoding('{name}')\""
        raise DataError(f"tiktoken's {name} needs {url} in its cache, {where} (missing, or not the file its "
                        f"sha256 names; nothing is fetched at run time): run TIKTOKEN_CACHE_DIR=DIR {fetch} "
                        "on a connected machine, copy DIR here and set TIKTOKEN_CACHE_DIR=DIR")
    with unittest.mock.patch.object(tiktoken.load, "read_file", offline):
        return TiktokenTokenizer(tiktoken.Encoding(**ENCODING_CONSTRUCTORS[name]()))

def _tiktoken_file(path):
    """A .tiktoken file: tiktoken's BPE ranks, a line `base64(token) rank` each (as OpenAI's
    r50k_base.tiktoken), ranks 0..n-1 in merge order. The file holds no split pattern nor special tokens:
    GPT-2's pattern, and <|endoftext|> = n, after the last rank, as in r50k_base itself (a copy of
    r50k_base.tiktoken reads as gpt2's ids). Its name: tiktoken- and the file's sha1."""
    import tiktoken
    from tiktoken_ext.openai_public import r50k_pat_str   # GPT-2's split pattern
    raw = pathlib.Path(path).read_bytes()
    fix = "pass a .tiktoken file of a byte-level BPE (a line `base64(token) rank` each, ranks 0..n-1 once)"
    ranks = {}
    for n, line in enumerate(raw.splitlines(), 1):
        if not line.strip():   # blank lines: skipped, as tiktoken's own loader does
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token, validate=True)] = int(rank)
        except ValueError:   # not two fields, not base64 (binascii.Error), not an integer
            raise DataError(f"{path}: line {n} is not `base64(token) rank`: {fix}") from None
    gap = min(set(range(len(ranks))) - set(ranks.values()), default=len(ranks))   # the first rank missing
    lack = next((bytes([b]) for b in range(256) if bytes([b]) not in ranks), None)   # tiktoken panics on it
    require(ranks, f"{path} holds no tokens: {fix}")
    require(gap == len(ranks), f"{path}: no token has rank {gap}: {fix}")
    require(lack is None, f"{path}: the byte {lack!r} is no token: {fix}")
    name = _file_name("tiktoken", raw)
    return TiktokenTokenizer(tiktoken.Encoding(name, pat_str=r50k_pat_str, mergeable_ranks=ranks,
                                               special_tokens={EOT: len(ranks)}))

