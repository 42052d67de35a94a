"""The files behind --data and --tokenizer, which a reader of the paper can skip: tokenizers (bytes, a
tokenizer.json, tiktoken's), text tokenized once into a verified cache (also on its own: python datafiles.py
--data PATH --tokenizer T), nanoGPT's train.bin and val.bin, atomic writes, and DataError, the one-line bad
input."""
import argparse
import base64
import codecs
import errno
import functools
import glob
import hashlib
import itertools
import json
import os
import pathlib
import re
import shutil
import signal
import stat
import sys
import sysconfig
import tempfile
import unittest.mock

import numpy as np
from tqdm import tqdm

EOT = "<|endoftext|>"
DEFAULT_CACHE_DIR = os.environ.get("LENGTHGEN_CACHE_DIR") or os.path.join(os.path.dirname(os.path.abspath(
    __file__)), "data_cache")  # gitignored
CACHE_VERSION = 4  # bump when the cache layout or the document format changes
VAL_FRACTION = 0.05   # the files held out, as data.load_data's default (train.py's): the same cache key
PIECE_CHARS, BATCH_PIECES = 1 << 14, 256   # text per encoding, pieces per batch (on all cores): bound memory
LINE_CUT = re.compile(r"\n(?=\S)(?<=\S\n)")   # a newline between non-spaces: byte-level BPEs split there
codecs.register_error("nul", lambda e: ("\0", e.end))   # an invalid UTF-8 byte reads as NUL (binary files)

class DataError(ValueError):
    """Bad input (data, tokenizer, task or metric arguments); the message is one line naming the fix."""

def require(ok, message):   # bad input: a one-line DataError naming the problem and the fix
    if not ok:
        raise DataError(message)

def is_int(x, minimum=1):
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool) and x >= minimum

KINDS = {stat.S_IFREG: "a regular file", stat.S_IFDIR: "a folder", stat.S_IFIFO: "a FIFO",
         stat.S_IFCHR: "a device", stat.S_IFBLK: "a device", stat.S_IFSOCK: "a socket"}   # by os.stat's mode

def _kind(mode):   # -> what a file of this st_mode is, to name it in a message
    return KINDS.get(stat.S_IFMT(mode), "not a file")

def require_file(path, fix):   # -> os.stat of a regular file we may read, else DataError (a FIFO would hang)
    try:
        st = os.stat(path)
    except OSError as e:
        raise DataError(f"{path}: {e.strerror}: {fix}") from None
    require(stat.S_ISREG(st.st_mode), f"{path} is {_kind(st.st_mode)}, not a regular file: {fix}")
    require(os.access(path, os.R_OK), f"{path}: permission denied: {fix}")
    return st

def require_not_special(path, fix):   # a path that exists is a regular file or a folder: opened, a FIFO hangs
    try:
        mode = os.stat(path).st_mode
    except OSError:   # missing: its reader says so
        return
    require(stat.S_ISREG(mode) or stat.S_ISDIR(mode), f"{path} is {_kind(mode)}, not a regular file: {fix}")

def read_json(file, fix):   # -> the JSON object file holds, else a one-line DataError ending in fix
    require_not_special(file, fix)
    try:
        obj = json.loads(pathlib.Path(file).read_text())
    except (OSError, ValueError) as e:
        raise DataError(f"{file} is not readable JSON ({type(e).__name__}): {fix}") from None
    require(isinstance(obj, dict), f"{file} is not a JSON object: {fix}")
    return obj

def write_atomically(path, write):
    """write(tmp) under a name unique to this process, then rename: a kill leaves the old file or the new.
    write a dict {name: write} of files in the folder path: all renamed at once, Ctrl-C and SIGTERM held
    meanwhile: the folder keeps its previous files or gets all the new ones, never a mix."""
    several = isinstance(write, dict)
    paths = {os.path.join(path, name): w for name, w in write.items()} if several else {path: write}
    tmps = {p: f"{p}.{os.getpid()}.tmp" for p in paths}
    for p in paths:
        _remove_stale_tmps(p)
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
        folder = os.path.dirname(next(iter(paths))) or "."
        why = f"{str(e).splitlines()[0]}; disk full?" if isinstance(e, RuntimeError) else e.strerror or e
        if isinstance(e, RuntimeError) and not os.path.isdir(folder):   # removed meanwhile: not a full disk
            why = f"the folder {folder} no longer exists"
        kept = "the previous one is intact" if os.path.exists(next(iter(paths))) else "nothing was written"
        raise OSError(f"cannot write {', '.join(paths)} ({why}): {kept}") from None

def _remove_stale_tmps(path):
    """The temporary files of path that a killed process (kill -9: no clean-up) left, PATH.<pid>.tmp whose
    process is gone; a live writer's are its own."""
    for tmp in glob.glob(f"{glob.escape(path)}.*.tmp"):
        pid = tmp[len(path) + 1:-4]
        if not pid.isdecimal():   # (this process's own: alive, so kept below)
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            if os.path.isdir(tmp):   # a corpus cache's
                shutil.rmtree(tmp, ignore_errors=True)
            else:
                os.unlink(tmp)
        except OSError:   # alive, another user's
            pass

# --- Tokenizers: name, n_vocab, eot_token, encode_ordinary(text) -> ids (a special token's text inside a
# document stays plain text), decode(ids) and encode_single_token(bytes) ------------------------------------
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
        raw = pathlib.Path(path).read_bytes()
        try:
            self._tok = tokenizers.Tokenizer.from_str(raw.decode())
        except Exception:
            raise DataError(f"{path} is not a readable tokenizer.json: pass the model's own") from None
        self._tok.encode_special_tokens = True   # "<|endoftext|>" inside a document is plain text
        special = {t.content: i for i, t in self._tok.get_added_tokens_decoder().items() if t.special}
        require(EOT in special, f"{path} has no {EOT} special token to mark documents: use GPT-NeoX's")
        self.name = "json-" + hashlib.sha1(raw).hexdigest()[:12]
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
        require(len(ids) == 1, f"{piece!r} is not one token of {self.name}: use a byte-level BPE")
        return ids[0]

class TiktokenTokenizer:
    """A tiktoken Encoding: one of tiktoken's (gpt2: nanoGPT's ids) or a .tiktoken file's."""

    def __init__(self, enc):
        self._enc, self.name, self.n_vocab, self.eot_token = enc, enc.name, enc.n_vocab, enc.eot_token

    def encode_ordinary(self, text):
        return self._enc.encode_ordinary(text)

    def encode_ordinary_batch(self, texts):   # a thread per core
        return self._enc.encode_ordinary_batch(texts, num_threads=os.cpu_count() or 1)

    def decode(self, ids):   # numpy's, torch's ids as a list (tiktoken takes no tensor); a cut char: U+FFFD
        return self._enc.decode(list(ids))

    def encode_single_token(self, piece):
        try:
            return self._enc.encode_single_token(piece)
        except KeyError:
            raise DataError(f"{piece!r} is not one token of {self.name}: use a byte-level BPE") from None

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
    name = "tiktoken-" + hashlib.sha1(raw).hexdigest()[:12]
    return TiktokenTokenizer(tiktoken.Encoding(name, pat_str=r50k_pat_str, mergeable_ranks=ranks,
                                               special_tokens={EOT: len(ranks)}))

# --- Token files: text tokenized once into the cache, or a cache folder itself ---------------------------
def token_ids(data, tokenizer="bytes", val_fraction=VAL_FRACTION, cache_dir=None):
    """-> (train, val, info): data's token ids (np.memmaps), each in the tokenizer's vocabulary. data: a cache
    folder (its meta.json), nanoGPT's prepare.py folder (train.bin, val.bin of GPT-2 ids), or text: "stdlib"
    (the standard library's .py files), a text file or a folder of them, tokenized once into a cache keyed by
    the files and the tokenizer, split by document."""
    enc = get_tokenizer(tokenizer)
    meta = os.path.join(data, "meta.json")
    if os.path.exists(meta) and not os.path.isdir(meta):   # (a FIFO there: refused by _whole, not read)
        fix = "pass --data a cache folder of regular files, or the text it was built from"
        train, val, info = _prepared(data, _whole(data, fix), enc)
    elif _is_nanogpt(data):
        train, val, info = _nanogpt(data, enc)
    else:
        train, val, info = _prepared(*_cache(data, enc, val_fraction, cache_dir), enc)
    top = max([int(a.max()) for a in (train, val) if len(a)], default=-1)   # every id, now: not mid-training
    require(top < enc.n_vocab, f"{data} holds id {top}, past the {enc.n_vocab} of {enc.name!r}: pass its "
            "--tokenizer")
    return train, val, info

def _is_nanogpt(data):   # nanoGPT's prepare.py output: train.bin and val.bin (a cache folder: also meta.json)
    return data != "stdlib" and all(os.path.lexists(os.path.join(data, f"{s}.bin")) for s in ("train", "val"))

def _nanogpt(folder, enc):
    """-> (train, val, info) of nanoGPT's prepare.py folder: train.bin and val.bin of uint16 GPT-2 ids, each
    document followed by the eot 50256, memory-mapped as they are (nanoGPT's own split)."""
    pkl = os.path.join(folder, "meta.pkl")
    require(not os.path.lexists(pkl), f"{pkl}: {folder} holds nanoGPT's character-level ids (a vocabulary of "
            "its own): pass --data the text they were made from")
    require(enc.name == "gpt2", f"{folder}: its train.bin and val.bin (no meta.json) look like nanoGPT's "
            f"GPT-2 ids, not {enc.name}'s: pass --tokenizer gpt2")
    splits = {}
    for split in ("train", "val"):
        path = os.path.join(folder, f"{split}.bin")
        size = require_file(path, "pass nanoGPT's prepare.py folder").st_size
        require(size and size % 2 == 0, f"{path} holds {size} bytes, not uint16 ids: pass nanoGPT's "
                "prepare.py folder")
        splits[split] = np.memmap(path, np.uint16, "r")
        top = int(splits[split].max())   # every id, now: not mid-training
        require(top < enc.n_vocab, f"{path} holds id {top}, past the {enc.n_vocab} of gpt2: pass nanoGPT's "
                "GPT-2 ids (uint16)")
    n_train, n_val = len(splits["train"]), len(splits["val"])
    info = dict(source=folder, tokenizer=enc.name, vocab_size=enc.n_vocab, dtype="uint16",
                eot_token=enc.eot_token, n_train=n_train, n_val=n_val, key=f"nanogpt-{n_train}+{n_val}")
    return splits["train"], splits["val"], info

def _cache(data, enc, val_fraction, cache_dir):   # -> (the cache folder of data's text, its meta.json)
    folder, files, skipped = _cache_folder(data, enc, val_fraction, cache_dir)
    rebuilt = f"remove the cache {folder} (it is rebuilt from --data)"
    meta = _whole(folder, rebuilt)
    if not meta and os.path.exists(folder):
        print(f"data: the cache {folder} is truncated or corrupt: rebuilding it", file=sys.stderr)
        shutil.rmtree(folder)
    try:
        return folder, meta or _build(folder, data, files, enc, val_fraction, skipped)
    except OSError as e:   # another process may have written the same cache meanwhile
        meta = _whole(folder, rebuilt)
        fix = "shorter" if os.strerror(errno.ENAMETOOLONG) in str(e) else "writable"
        if not meta:
            raise OSError(f"{e}: pass a {fix} --cache-dir") from None
        return folder, meta

def _cache_folder(data, enc, val_fraction, cache_dir):   # -> (data's cache folder, its files, skipped ones)
    stdlib = data == "stdlib"
    root = sysconfig.get_paths()["stdlib"] if stdlib else data
    try:
        mode = os.stat(root).st_mode
    except OSError as e:
        raise DataError(f"{e.strerror.lower()} {data!r}: pass a directory or a text file (patterns are not "
                        "expanded), stdlib or markov:k=8,...") from None
    require(stat.S_ISDIR(mode) or stat.S_ISREG(mode), f"--data {data} is {_kind(mode)}, not a text file or "
            "folder: pass a text file or a folder of them")
    cache_dir = cache_dir or DEFAULT_CACHE_DIR
    files, skipped = _text_files(root, stdlib, cache_dir)
    stats = []   # the cache's key: each file's size and mtime
    for f in sorted(files):
        st = require_file(f, "make it a readable file, or leave it out of --data")   # no FIFO, all readable
        stats.append((os.path.abspath(f), st.st_size, st.st_mtime_ns))
    require(stats, f"{root!r} holds no files{_skipped(skipped, ' ({})')}: point --data at a folder of text "
            "files")
    key = hashlib.sha1(json.dumps([CACHE_VERSION, enc.name, val_fraction, stats]).encode()).hexdigest()
    stem = "".join(c if c.isalnum() or c in "-_" else "_" for c in os.path.basename(data.rstrip("/")))[:100]
    folder = os.path.join(cache_dir, f"{stem or 'data'}-{enc.name}-{key[:16]}")
    require(not os.path.exists(folder) or os.path.isdir(folder), f"{folder} is a file where the cache "
            "folder goes: remove it or pass another --cache-dir")
    return folder, [f for f, *_ in stats], skipped

RUN_FILES = {"ckpt.pt", "train.lock"}   # train.py's --out holds one (an old one args.json + metrics.jsonl)
CACHE_FILES = ("meta.json", "train.bin", "val.bin")   # a cache folder (_build's, one given as --data)

def _not_data(path, names, cache):   # a cache or a train.py run: its files change from run to run
    names = set(names)
    return (os.path.realpath(path) == cache or names.issuperset(CACHE_FILES) or bool(RUN_FILES & names)
            or {"args.json", "metrics.jsonl"} <= names)

def _skipped(folders, form):   # -> form holding the note on the folders _text_files skipped; none: ""
    shown = ", ".join(folders[:3]) + ", ..." * (len(folders) > 3)
    return form.format(f"{len(folders)} folders skipped, caches or train.py runs: {shown}") if folders else ""

def _unreadable(e):   # os.walk's onerror: a folder it cannot list is named, not left out in silence
    raise DataError(f"{e.filename}: {e.strerror}: make it readable, or leave it out of --data")

def _text_files(root, stdlib, cache_dir):
    """-> (files, skipped folders): root itself, or the files under it: hidden ones skipped, symlinked
    folders followed, each folder once (a link cycle ends); cache_dir, a cache folder and a train.py run's
    skipped: their files change from run to run, what is read must not (the cache key, a run's data_id);
    stdlib: its .py files, not site-packages (per machine) nor tests (often stripped)."""
    skip = {"site-packages", "dist-packages", "test", "tests", "idle_test"} if stdlib else set()
    if not os.path.isdir(root):
        return [root], []
    files, skipped = [], []
    seen, cache = {os.path.realpath(root)}, os.path.realpath(cache_dir)
    for path, dirs, names in os.walk(root, followlinks=True, onerror=None if stdlib else _unreadable):
        if _not_data(path, names, cache):
            skipped.append(path)
            dirs[:] = []
            continue
        kept = []
        for d in sorted(dirs):
            real = os.path.realpath(os.path.join(path, d))
            if d not in skip and d != "__pycache__" and not d.startswith(".") and real not in seen:
                seen.add(real)
                kept.append(d)
        dirs[:] = kept   # os.walk descends into these only
        files += [os.path.join(path, f) for f in names if f.endswith(".py" if stdlib else "") and f[0] != "."]
    return files, skipped

def _build(folder, label, files, enc, val_fraction, skipped=()):
    """Text files (sorted) -> folder/train.bin and val.bin, eot + the ids of each (val: a val_fraction of the
    files drawn with the fixed seed 0, the same split for every run; one file: its last tokens), meta.json."""
    texts = [f for f in files if os.path.getsize(f) and all("\0" not in p for p in _pieces(f))]   # UTF-8 text
    require(texts, f"{label!r}: no UTF-8 text documents ({len(files)} files skipped: binary, not UTF-8 or "
            "empty): pass text files")
    n_val = min(len(files) - 1, max(1, round(val_fraction * len(files)))) if val_fraction else 0  # never all
    val = {files[i] for i in np.random.default_rng(0).permutation(len(files))[:n_val]} & set(texts)
    dtype = np.dtype(np.uint16 if enc.n_vocab <= 1 << 16 else np.uint32)
    sha1 = hashlib.sha1()
    encode = getattr(enc, "encode_ordinary_batch", None) or (lambda texts: [*map(enc.encode_ordinary, texts)])
    cut = [*enc.encode_ordinary("a.\nb")] == [*enc.encode_ordinary("a.\n"), *enc.encode_ordinary("b")]
    eot = np.array([enc.eot_token], dtype).tobytes()
    meta = dict(source=label, tokenizer=enc.name, vocab_size=enc.n_vocab, dtype=dtype.name,
                eot_token=enc.eot_token, docs_train=len(texts) - len(val), docs_val=len(val),
                skipped_files=len(files) - len(texts))

    def write(tmp):   # batches of pieces, each encoded on every core
        os.makedirs(tmp)
        for split, paths in ("train", [f for f in texts if f not in val]), ("val", sorted(val)):
            docs = tqdm(paths, f"tokenizing {label}", delay=1, leave=False)
            pieces = ((eot if i == 0 else b"", p) for path in docs for i, p in enumerate(_pieces(path, cut)))
            with open(os.path.join(tmp, f"{split}.bin"), "wb") as f:
                while batch := list(itertools.islice(pieces, BATCH_PIECES)):   # [(eot or b"", text)]
                    ids = encode([p for _, p in batch])
                    chunk = b"".join(e + np.asarray(t, dtype).tobytes() for (e, _), t in zip(batch, ids))
                    sha1.update(chunk)
                    f.write(chunk)
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
          "files skipped: binary, not UTF-8 or empty{}) -> {}".format(_skipped(skipped, "; {}"), folder,
                                                                     **meta))
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

def _whole(folder, fix):   # -> its meta.json if train.bin + val.bin have the sha1 it records (written last)
    for name in CACHE_FILES:   # a FIFO would hang the read: refused, fix naming what to do
        require_not_special(os.path.join(folder, name), fix)
    sha1 = hashlib.sha1()   # one sha1 over both files
    try:
        meta = json.loads(pathlib.Path(folder, "meta.json").read_text())
        for split in ("train", "val"):
            with open(os.path.join(folder, f"{split}.bin"), "rb") as f:
                hashlib.file_digest(f, lambda: sha1)
        return meta if meta["sha1"] == sha1.hexdigest() else None
    except (OSError, ValueError, KeyError, TypeError):   # a missing or damaged file
        return None

def _prepared(folder, meta, enc):   # -> (train, val, info) of folder's train.bin and val.bin (meta: verified)
    file = os.path.join(folder, "meta.json")
    require(meta, f"{folder}: no train.bin and val.bin that match its meta.json: pass --data the text it was "
            "built from")
    claims = {k: meta[k] for k in ("tokenizer", "vocab_size") if k in meta}
    require(claims.items() <= dict(tokenizer=enc.name, vocab_size=enc.n_vocab).items(), f"{file} declares "
            f"{json.dumps(claims)[1:-1]}, not the {enc.n_vocab} ids of {enc.name}: pass the --tokenizer it "
            "names")
    bins = {s: os.path.join(folder, f"{s}.bin") for s in ("train", "val")}
    dtype = meta.get("dtype")
    itemsize = {"uint16": 2, "uint32": 4}.get(dtype)   # the dtypes _build writes
    require(itemsize and all(meta.get(f"n_{s}") == os.path.getsize(b) / itemsize for s, b in bins.items()),
            f'{file}: its "dtype" {dtype} and "n_train", "n_val" do not fit train.bin, val.bin: pass --data '
            "the text it was built from")
    train, val = [np.memmap(b, dtype, "r") if meta[f"n_{s}"] else np.zeros(0, dtype)   # an empty file cannot
                  for s, b in bins.items()]                                            # be mapped
    return train, val, dict(meta, key=meta["sha1"][:16])

def main(argv=None):
    """python datafiles.py --data PATH --tokenizer T [--cache-dir DIR]: the text tokenized once into the
    verified cache folder train.py would read (the same key and split), its path printed last."""
    ap = argparse.ArgumentParser(description="Tokenize text once into its verified cache folder (train.bin, "
                                 "val.bin, meta.json; 5% of the files held out, drawn with seed 0; one "
                                 "file: its last tokens) and print the folder's path last: that folder is "
                                 "--data DIR for train.py and evaluate.py with the same --tokenizer, here or "
                                 "copied elsewhere. A verified cache already there is reported, not rebuilt.")
    ap.error = lambda message: ap.exit(2, f"error: {message}\n")   # one line, as every other bad input
    ap.add_argument("--data", required=True, help="a text file, a folder of them (a document each) or stdlib")
    ap.add_argument("--tokenizer", default="bytes", help="bytes (default), a tiktoken encoding "
                    f"({', '.join(TIKTOKEN_NAMES)}), PATH/x.tiktoken or PATH/tokenizer.json")
    ap.add_argument("--cache-dir", default=DEFAULT_CACHE_DIR, metavar="DIR", help="where the folder is "
                    "written (default: $LENGTHGEN_CACHE_DIR, else data_cache/ beside this file)")
    args = ap.parse_args(argv)
    if empty := [k for k, v in vars(args).items() if not v.strip()]:   # "" would read as "."
        ap.error(f"--{empty[0].replace('_', '-')} is empty: pass a value (python datafiles.py --help)")
    handler = signal.signal(signal.SIGTERM, signal.default_int_handler)   # as Ctrl-C: write_atomically
    try:                                                                  # removes its temporary folder
        enc = get_tokenizer(args.tokenizer)
        ids = "a Markov process" if args.data.split(":")[0] == "markov" else \
            "a cache folder" if os.path.isfile(os.path.join(args.data, "meta.json")) else \
            "nanoGPT's ids" if _is_nanogpt(args.data) else None
        require(not ids, f"--data {args.data} is {ids}, not text: nothing to tokenize: pass it to train.py")
        folder = _cache_folder(args.data, enc, VAL_FRACTION, args.cache_dir)[0]   # the folder train.py reads
        had = _whole(folder, f"remove the cache {folder} (it is rebuilt from --data)")
        token_ids(args.data, enc, VAL_FRACTION, args.cache_dir)
    except (OSError, DataError) as e:
        sys.exit(f"error: {e}")
    except KeyboardInterrupt:
        sys.exit("interrupted: no cache folder written, no temporary file left")
    finally:
        signal.signal(signal.SIGTERM, handler)
    if had:
        print(f"data: {folder} holds the verified ids of {args.data} already: nothing rebuilt")
    print(folder)

if __name__ == "__main__":
    main()
