"""Text tokenized once into a verified cache folder (train.bin, val.bin, meta.json), a cache folder or
nanoGPT's train.bin/val.bin as --data, and the tokenize-only command:

    python -m plumbing.token_cache --data PATH --tokenizer T [--cache-dir DIR]
"""
import argparse
import codecs
import errno
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

import numpy as np
from tqdm import tqdm

from plumbing.files import (DataError, _kind, read_json, require, require_file, require_not_special,
                            write_atomically)
from plumbing.tokenizers import TIKTOKEN_NAMES, get_tokenizer

DEFAULT_CACHE_DIR = os.environ.get("LENGTHGEN_CACHE_DIR") or os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "data_cache")  # gitignored
CACHE_VERSION = 4  # bump when the cache layout or the document format changes
VAL_FRACTION = 0.05   # the files held out, as data.load_data's default (train.py's): the same cache key
PIECE_CHARS = 1 << 14   # text per encoding: bounds memory
BATCH_PIECES = 256   # pieces per batch, encoded on all cores: bounds memory
LINE_CUT = re.compile(r"\n(?=\S)(?<=\S\n)")   # a newline between non-spaces: byte-level BPEs split there
codecs.register_error("nul", lambda e: ("\0", e.end))   # an invalid UTF-8 byte reads as NUL (binary files)

# --- Token files: text tokenized once into the cache, or a cache folder itself ---------------------------
def token_ids(data, tokenizer="bytes", val_fraction=VAL_FRACTION, cache_dir=None):
    """-> (train, val, info): data's token ids (np.memmaps), each in the tokenizer's vocabulary. data: a cache
    folder (its meta.json), nanoGPT's prepare.py folder (train.bin, val.bin of GPT-2 ids), or text: "stdlib"
    (the standard library's .py files), a text file or a folder of them, tokenized once into a cache keyed by
    the files and the tokenizer, split by document."""
    enc = get_tokenizer(tokenizer)
    if _is_cache(data):
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

def _is_cache(data):   # a cache folder: it holds meta.json (a FIFO there: refused by _whole, not read)
    meta = os.path.join(data, "meta.json")
    return os.path.exists(meta) and not os.path.isdir(meta)

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
    n_train = len(splits["train"])
    n_val = len(splits["val"])
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
    files = []
    skipped = []
    seen = {os.path.realpath(root)}
    cache = os.path.realpath(cache_dir)
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
        meta = read_json(os.path.join(folder, "meta.json"), fix)
        for split in ("train", "val"):
            with open(os.path.join(folder, f"{split}.bin"), "rb") as f:
                hashlib.file_digest(f, lambda: sha1)
        return meta if meta["sha1"] == sha1.hexdigest() else None
    except (OSError, ValueError, KeyError, TypeError):   # a missing or damaged file (DataError: a ValueError)
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
    # an empty file cannot be mapped: an empty array stands for it
    splits = {s: np.memmap(b, dtype, "r") if meta[f"n_{s}"] else np.zeros(0, dtype) for s, b in bins.items()}
    return splits["train"], splits["val"], dict(meta, key=meta["sha1"][:16])

def main(argv=None):
    """python -m plumbing.token_cache --data PATH --tokenizer T [--cache-dir DIR]: the text tokenized once
    into the verified cache folder train.py would read (the same key and split), its path printed last."""
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
                    "written (default: $LENGTHGEN_CACHE_DIR, else data_cache/ in the repository)")
    args = ap.parse_args(argv)
    if empty := [k for k, v in vars(args).items() if not v.strip()]:   # "" would read as "."
        flag = "--" + empty[0].replace("_", "-")
        ap.error(f"{flag} is empty: pass a value (python -m plumbing.token_cache --help)")
    handler = signal.signal(signal.SIGTERM, signal.default_int_handler)   # as Ctrl-C: write_atomically
    try:                                                                  # removes its temporary folder
        enc = get_tokenizer(args.tokenizer)
        ids = _not_text(args.data)
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

def _not_text(data):   # -> the ids data names that train.py reads as they are (nothing to tokenize), or None
    if data.split(":")[0] == "markov":
        return "a Markov process"
    if _is_cache(data):
        return "a cache folder"
    if _is_nanogpt(data):
        return "nanoGPT's ids"
    return None

if __name__ == "__main__":
    main()
