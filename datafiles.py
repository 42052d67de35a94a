"""The files behind --data and --tokenizer, which a reader of the paper can skip: tokenizers (bytes, a
tokenizer.json), text tokenized once into a verified cache, atomic writes, and DataError, the
one-line bad input."""
import codecs
import errno
import functools
import hashlib
import itertools
import json
import os
import pathlib
import re
import shutil
import signal
import sys
import sysconfig

import numpy as np
from tqdm import tqdm

EOT = "<|endoftext|>"
DEFAULT_CACHE_DIR = os.environ.get("LENGTHGEN_CACHE_DIR") or os.path.join(os.path.dirname(os.path.abspath(
    __file__)), "data_cache")  # gitignored
CACHE_VERSION = 4  # bump when the cache layout or the document format changes
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

def require_file(path, fix):   # -> os.stat of a regular file we may read, else DataError (a FIFO would hang)
    try:
        st = os.stat(path)
    except OSError as e:
        raise DataError(f"{path}: {e.strerror}: {fix}") from None
    require(os.path.isfile(path), f"{path} is not a regular file (a FIFO, device or folder?): {fix}")
    require(os.access(path, os.R_OK), f"{path}: permission denied: {fix}")
    return st

def read_json(file, fix):   # -> the JSON object file holds, else a one-line DataError ending in fix
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

def get_tokenizer(name="bytes"):
    """-> the tokenizer "bytes" (built in), or of a tokenizer.json path or a folder holding one (GPT-NeoX's:
    the official Mamba checkpoints'); a tokenizer passes through."""
    if hasattr(name, "encode_ordinary"):
        return name
    require(isinstance(name, str) and name, f"unknown tokenizer {name!r}: use bytes or a tokenizer.json")
    if name != "bytes":
        name = os.path.join(name, "tokenizer.json") if os.path.isdir(name) else name
        require(os.path.isfile(name), f"unknown tokenizer {name!r}: pass bytes or a Hugging Face "
                "tokenizer.json (`hf download ORG/NAME tokenizer.json --local-dir DIR`: DIR/tokenizer.json)")
        name = os.path.abspath(name)
    return _load_tokenizer(name)

@functools.lru_cache(maxsize=None)
def _load_tokenizer(name):   # one object a name: a file is read once a process
    try:
        return ByteTokenizer() if name == "bytes" else JsonTokenizer(name)
    except ImportError as e:   # an optional package (requirements.txt) not installed
        raise DataError(f"tokenizer {name} needs: pip install {e.name}") from None

# --- Token files: text tokenized once into the cache, or a cache folder itself ---------------------------
def token_ids(data, tokenizer="bytes", val_fraction=0.05, cache_dir=None):
    """-> (train, val, info): data's token ids (np.memmaps), each in the tokenizer's vocabulary. data: a cache
    folder (its meta.json), or text: "stdlib" (the standard library's .py files), a text file or a folder of
    them, tokenized once into a cache keyed by the files and the tokenizer, split by document."""
    enc = get_tokenizer(tokenizer)
    if os.path.isfile(os.path.join(data, "meta.json")):
        train, val, info = _prepared(data, _whole(data), enc)
    else:
        train, val, info = _prepared(*_cache(data, enc, val_fraction, cache_dir), enc)
    top = max([int(a.max()) for a in (train, val) if len(a)], default=-1)   # every id, now: not mid-training
    require(top < enc.n_vocab, f"{data} holds id {top}, past the {enc.n_vocab} of {enc.name!r}: pass its "
            "--tokenizer")
    return train, val, info

def _cache(data, enc, val_fraction, cache_dir):   # -> (the cache folder of data's text, its meta.json)
    stdlib = data == "stdlib"
    root = sysconfig.get_paths()["stdlib"] if stdlib else data
    require(os.path.isdir(root) or os.path.isfile(root), f"no such file or directory {data!r}: pass a "
            f"directory or a text file (patterns are not expanded), stdlib or markov:k=8,...")
    stats = []   # the cache's key: each file's size and mtime
    for f in sorted(_text_files(root, stdlib)):
        st = require_file(f, "make it readable, or leave it out of --data")   # no FIFO, nothing unreadable
        stats.append((os.path.abspath(f), st.st_size, st.st_mtime_ns))
    require(stats, f"{root!r} holds no files: point --data at a folder of text files")
    key = hashlib.sha1(json.dumps([CACHE_VERSION, enc.name, val_fraction, stats]).encode()).hexdigest()
    stem = "".join(c if c.isalnum() or c in "-_" else "_" for c in os.path.basename(data.rstrip("/")))[:100]
    folder = os.path.join(cache_dir or DEFAULT_CACHE_DIR, f"{stem or 'data'}-{enc.name}-{key[:16]}")
    require(not os.path.exists(folder) or os.path.isdir(folder), f"{folder} is a file where the cache "
            "folder goes: remove it or pass another --cache-dir")
    meta = _whole(folder)
    if not meta and os.path.exists(folder):
        print(f"data: the cache {folder} is truncated or corrupt: rebuilding it", file=sys.stderr)
        shutil.rmtree(folder)
    try:
        return folder, meta or _build(folder, data, [f for f, *_ in stats], enc, val_fraction)
    except OSError as e:   # another process may have written the same cache meanwhile
        meta = _whole(folder)
        fix = "shorter" if os.strerror(errno.ENAMETOOLONG) in str(e) else "writable"
        if not meta:
            raise OSError(f"{e}: pass a {fix} --cache-dir") from None
        return folder, meta

def _text_files(root, stdlib):
    """root itself, or the files under it: hidden ones skipped, symlinked folders followed, each folder once
    (a link cycle ends); stdlib: its .py files, not site-packages (per machine) nor tests (often stripped)."""
    skip = {"site-packages", "dist-packages", "test", "tests", "idle_test"} if stdlib else set()
    files = [] if os.path.isdir(root) else [root]
    seen = {os.path.realpath(root)}
    for path, dirs, names in os.walk(root, followlinks=True):
        kept = []
        for d in sorted(dirs):
            real = os.path.realpath(os.path.join(path, d))
            if d not in skip and d != "__pycache__" and not d.startswith(".") and real not in seen:
                seen.add(real)
                kept.append(d)
        dirs[:] = kept   # os.walk descends into these only
        files += [os.path.join(path, f) for f in names if f.endswith(".py" if stdlib else "") and f[0] != "."]
    return files

def _build(folder, label, files, enc, val_fraction):
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
