"""Text corpora (data.load_data, token_cache.token_ids): tokenized in line-aligned pieces (exactly the ids of
the whole file), split by a fixed seeded draw of the files, cached by files and tokenizer (one cache for
every seed, verified, rebuilt when damaged), a cache folder as --data (nanoGPT's train.bin,
val.bin plus meta.json), written on its own by `python -m plumbing.token_cache` (tokenize once). tiktoken and nanoGPT's
own folders: test_tiktoken.py."""
import contextlib
import errno
import io
import json
import os
import pathlib
import re
import shutil
import signal
import stat
import subprocess
import sys
import time

import numpy as np
import pytest

import data
from plumbing import files, token_cache, tokenizers
from conftest import ROOT
from data import DataError

EOT = 256   # the bytes tokenizer's end-of-text id; TEXT: trailing spaces, indented and blank lines
TEXT = "".join(f"line {i}: héllo wörld ✓{' ' * (i % 3)}\n{'  ' * (i % 2)}{chr(10) * (i % 5 == 0)}"
               for i in range(300)) + "an <|endoftext|> in a document is text\n"

def split_docs(tokens):   # a stream of bytes ids -> its documents (the texts hold no NUL: eot 256 reads 0)
    return set(bytes(np.asarray(tokens).astype(np.uint8)).split(b"\0")[1:])

def write_docs(folder, n=20):   # n UTF-8 text files: path -> text
    folder.mkdir(parents=True)
    texts = {folder / f"doc{i:02}.txt": f"document {i}: {'héllo wörld ✓ ' * (i + 1)}\n" for i in range(n)}
    for path, text in texts.items():
        path.write_text(text, encoding="utf-8")
    return texts

class Wide:   # a vocabulary past uint16
    name, n_vocab, eot_token = "wide", 70_000, 69_999
    encode_ordinary = staticmethod(lambda text: [66_000 + ord(c) % 100 for c in text])

@pytest.mark.parametrize("name", ["bytes", "bpe"])
def test_a_file_tokenized_in_pieces_gives_the_ids_of_the_whole(name, tok_json, tmp_path, monkeypatch):
    enc = tokenizers.get_tokenizer(tok_json if name == "bpe" else "bytes")
    (tmp_path / "big.txt").write_text(TEXT)
    monkeypatch.setattr(token_cache, "PIECE_CHARS", 50)   # and 3 pieces a batch: many batches
    monkeypatch.setattr(token_cache, "BATCH_PIECES", 3)
    pieces = list(token_cache._pieces(tmp_path / "big.txt"))   # each cut after a newline between non-spaces
    assert len(pieces) > 40 and "".join(pieces) == TEXT
    assert all(a[-1] == "\n" and a[-2].strip() and b[0].strip() for a, b in zip(pieces, pieces[1:]))
    d = data.load_data(str(tmp_path / "big.txt"), enc, val_fraction=0.1, cache_dir=str(tmp_path / "c"))
    assert np.concatenate([d.train, d.val]).tolist() == [enc.eot_token] + enc.encode_ordinary(TEXT)
    lines = [t for line in TEXT.splitlines(True) for t in enc.encode_ordinary(line)]
    assert (lines == enc.encode_ordinary(TEXT)) == (name == "bytes")   # a cut after any newline: not the ids

def corpus(folder):   # write_docs plus files that are skipped or never read
    texts = write_docs(folder)
    (folder / "blob.dat").write_bytes(b"\xff\xfe\x00binary")   # skipped: not UTF-8, as empty
    (folder / "empty.txt").write_text("")
    (folder / ".hidden").write_text("never read")
    return texts

def test_one_cache_for_every_seed_split_by_document_and_rebuilt_when_damaged(tmp_path, monkeypatch, capsys):
    texts = corpus(tmp_path / "corpus")
    load = lambda path="corpus", **kw: data.load_data(f"{tmp_path}/{path}", **kw, cache_dir=f"{tmp_path}/c")
    d = load(val_fraction=0.2)
    assert "2 files skipped" in capsys.readouterr().out and d.info["skipped_files"] == 2
    assert isinstance(d.train, np.memmap) and d.train.dtype == np.uint16 and d.train[0] == d.val[0] == EOT
    train, val = split_docs(d.train), split_docs(d.val)
    drawn = {sorted(tmp_path.glob("corpus/[!.]*"))[i] for i in np.random.default_rng(0).permutation(22)[:4]}
    assert val == {texts[p].encode() for p in drawn if p in texts} and not train & val and val
    assert train | val == {t.encode() for t in texts.values()}   # 4 of the 22 files drawn, skipped ones too
    monkeypatch.setattr(token_cache, "_build", None)   # other seeds read the same cache, build nothing
    val = np.array(d.val)
    assert all(np.array_equal(load(seed=s, val_fraction=0.2).val, val) for s in (1, 2))
    (cache,) = (tmp_path / "c").iterdir()
    monkeypatch.undo()
    corpus(tmp_path / "elsewhere" / "corpus")   # the split: a function of the files in the corpus
    assert np.array_equal(load("elsewhere/corpus", val_fraction=0.2).val, val)
    os.truncate(cache / "val.bin", 10)   # a truncated cache is rebuilt, not read
    assert np.array_equal(load(val_fraction=0.2).val, val) and "truncated" in capsys.readouterr().err
    (path, text), *_ = texts.items()
    path.write_text(text.replace("document", "DOCUMENT"))   # as many bytes: the key must see the new mtime
    os.utime(path, ns=(0, os.stat(path).st_mtime_ns + 10 ** 9))   # a coarse clock may not have ticked
    assert text.replace("document", "DOCUMENT").encode() in split_docs(np.r_[load().train, load().val])
    d = data.load_data("stdlib", cache_dir=str(tmp_path / "stdlib"))   # the Python standard library's sources
    assert len(d.train) > 1_000_000 and len(d.val) > 10_000 and d.info["docs_train"] > 10 * d.info["docs_val"]

def test_a_cache_folder_loads_as_data_itself(tmp_path, tok_json):
    write_docs(tmp_path / "corpus")
    cached = data.load_data(f"{tmp_path}/corpus", tok_json, cache_dir=str(tmp_path / "c"))
    (folder,) = (tmp_path / "c").iterdir()
    prepared, meta = data.load_data(str(folder), tok_json), json.loads((folder / "meta.json").read_text())
    assert np.array_equal(prepared.train, cached.train) and np.array_equal(prepared.val, cached.val)
    assert meta["tokenizer"] == cached.tokenizer.name and (meta["eot_token"], meta["docs_val"]) == (1, 1)
    with pytest.raises(DataError, match="--tokenizer"):
        data.load_data(str(folder), "bytes")

def test_single_file_and_wide_vocabulary(tmp_path):
    ((path, text),) = write_docs(tmp_path / "a", n=1).items()         # one document: split by tokens
    one = data.load_data(str(path), val_fraction=0.25, cache_dir=str(tmp_path / "c"))
    whole = np.concatenate([one.train, one.val])
    assert whole.tolist() == [EOT] + list(text.encode()) and len(one.val) == round(0.25 * len(whole))
    w = data.load_data(str(path), tokenizer=Wide(), cache_dir=str(tmp_path / "c"))   # the cache: uint32 ids
    assert w.train.dtype == np.uint32 and w.train[0] == 69_999 and w.train[1:].min() >= 66_000

def test_failed_cache_builds_leave_nothing_behind(tmp_path, monkeypatch):
    write_docs(tmp_path / "corpus", n=4)
    (tmp_path / "binary").mkdir()
    (tmp_path / "binary" / "x.dat").write_bytes(b"\x80\x81")
    with pytest.raises(DataError, match="UTF-8"):
        data.load_data(str(tmp_path / "binary"), cache_dir=str(tmp_path / "c"))

    class FullDisk(io.FileIO):
        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")
    full_disk = lambda p, m="r", **k: FullDisk(p, "w") if "w" in m else open(p, m, **k)
    monkeypatch.setattr(token_cache, "open", full_disk, raising=False)
    with pytest.raises(OSError, match="space"):
        data.load_data(str(tmp_path / "corpus"), cache_dir=str(tmp_path / "c"))
    assert os.listdir(tmp_path / "c") == []

def test_a_cache_that_cannot_be_written_says_so_and_what_to_pass(tmp_path, monkeypatch):
    write_docs(tmp_path / "corpus", n=3)
    load = lambda: data.load_data(str(tmp_path / "corpus"), cache_dir=str(tmp_path / "c"))

    def denied(*args, **kwargs):   # as a read-only --cache-dir (root writes anywhere)
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(os, "makedirs", denied)
    with pytest.raises(OSError, match=r"\(Permission denied\): nothing was written: pass a writable --cache-"):
        load()
    monkeypatch.undo()
    load()
    (cache,) = (tmp_path / "c").iterdir()
    shutil.rmtree(cache)
    cache.write_text("a file where the cache folder goes")
    with pytest.raises(DataError, match="is a file where the cache folder goes: remove it or pass another"):
        load()
    assert cache.read_text() == "a file where the cache folder goes"

class Small:   # a vocabulary that just fits uint8: Latin-1 (others read 1), eot 0
    name, n_vocab, eot_token = "small", 256, 0
    encode_ordinary = staticmethod(lambda text: [ord(c) if 0 < ord(c) < 256 else 1 for c in text])

def test_a_cache_folder_is_read_as_its_meta_json_says_for_its_tokenizer(tmp_path):
    (tmp_path / "corpus").mkdir()   # a cache folder whose id 255 is in val only, read as of 255 ids
    (tmp_path / "corpus" / "a.txt").write_text("\xff\n" * 20)
    (tmp_path / "corpus" / "b.txt").write_text("plain text\n" * 20)
    token_cache.token_ids(str(tmp_path / "corpus"), Small(), cache_dir=str(tmp_path / "c"))
    (next((tmp_path / "c").iterdir())).rename(tmp_path / "prep")
    meta = json.loads((tmp_path / "prep" / "meta.json").read_text())
    assert 255 in np.fromfile(tmp_path / "prep" / "val.bin", np.uint16) and meta["docs_val"] == 1
    (tmp_path / "prep" / "meta.json").write_text(json.dumps(dict(meta, n_val=meta["n_val"] + 1)))
    with pytest.raises(DataError, match='its "dtype" uint16 and "n_train", "n_val" do not fit'):
        data.load_data(str(tmp_path / "prep"), Small())   # one count wrong: the files are not as it says
    # counts that fit a dtype _build never writes: each id would be read as two halves
    bytewise = dict(meta, dtype="uint8", n_train=2 * meta["n_train"], n_val=2 * meta["n_val"])
    (tmp_path / "prep" / "meta.json").write_text(json.dumps(bytewise))
    with pytest.raises(DataError, match='its "dtype" uint8 and "n_train"'):
        data.load_data(str(tmp_path / "prep"), Small())
    (tmp_path / "prep" / "meta.json").write_text(json.dumps(dict(meta, tokenizer="fewer", vocab_size=255)))
    fewer = type("Fewer", (Small,), dict(name="fewer", n_vocab=255))()
    with pytest.raises(DataError, match="prep holds id 255, past the 255 of 'fewer': pass its --tokenizer"):
        data.load_data(str(tmp_path / "prep"), fewer)
    for claim, word in ((dict(vocab_size=300), '"vocab_size": 300, not the 256 ids of small'),
                        (dict(tokenizer="gpt2"), '"tokenizer": "gpt2", "vocab_size": 256, not')):
        (tmp_path / "prep" / "meta.json").write_text(json.dumps(dict(meta, **claim)))
        with pytest.raises(DataError, match=word):
            data.load_data(str(tmp_path / "prep"), Small())

def test_symlinked_folders_are_followed_once_and_a_link_cycle_ends(tmp_path):
    texts = write_docs(tmp_path / "elsewhere", n=12)
    texts.update(write_docs(tmp_path / "corpus", n=1))   # and a file of its own
    for link, target in (("docs", "elsewhere"), ("again", "elsewhere"), ("cycle", "corpus")):
        (tmp_path / "corpus" / link).symlink_to(tmp_path / target, target_is_directory=True)
    d = data.load_data(str(tmp_path / "corpus"), val_fraction=0.2, cache_dir=str(tmp_path / "c"))
    assert d.info["docs_train"] + d.info["docs_val"] == 13   # each file once, through the first link
    assert split_docs(np.r_[d.train, d.val]) == {t.encode() for t in texts.values()}

def test_a_cache_build_interrupted_by_sigterm_or_ctrl_c_leaves_no_temporary_folder(tmp_path, tok_json):
    (tmp_path / "corpus").mkdir()
    for i in range(6):   # about 5 MB of BPE: seconds to tokenize, on one thread
        (tmp_path / "corpus" / f"{i}.txt").write_text(TEXT * 60)
    for sig in signal.SIGTERM, signal.SIGINT:
        cache = tmp_path / f"cache-{sig.name}"
        cmd = [sys.executable, f"{ROOT}/train.py", "--data", str(tmp_path / "corpus"), "--tokenizer", tok_json,
               "--cache-dir", str(cache), "--steps", "1", "--out", str(tmp_path / f"run-{sig.name}")]
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             env=dict(os.environ, RAYON_NUM_THREADS="1"),   # SIGINT: as from a terminal
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        deadline = time.time() + 60   # until it writes its temporary folder
        while not list(cache.glob("*.tmp/train.bin")) and p.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        p.send_signal(sig)
        err = p.communicate(timeout=60)[1]
        assert p.returncode == 1 and err.endswith("interrupted: no checkpoint was saved: nothing to resume\n"), err
        assert os.listdir(cache) == []

def test_a_corpus_of_few_files_holds_one_whole_document_out(tmp_path):
    texts = write_docs(tmp_path / "corpus", n=4)   # 5% of 4 files rounds to 0: one is held out all the same
    d = data.load_data(str(tmp_path / "corpus"), cache_dir=str(tmp_path / "c"))
    train, val = split_docs(d.train), split_docs(d.val)
    assert len(val) == 1 and not train & val and train | val == {t.encode() for t in texts.values()}

def test_write_atomically_replaces_all_the_files_of_a_folder_or_none(tmp_path, monkeypatch):
    new, handler = (lambda tmp: pathlib.Path(tmp).write_text("new")), signal.default_int_handler
    signal.signal(signal.SIGINT, handler)   # Ctrl-C as in a terminal, not a background job's SIG_IGN
    def fails(tmp):
        pathlib.Path(tmp).write_text("half")
        raise PermissionError(13, "Permission denied")
    for name in "ab":
        (tmp_path / name).write_text("old")
    with pytest.raises(OSError, match="cannot write .*a, .*b .Permission denied.: the previous one is intact"):
        files.write_atomically(str(tmp_path), {"a": new, "b": fails})
    assert [p.read_text() for p in sorted(tmp_path.iterdir())] == ["old", "old"]   # no .tmp left, a unchanged
    with pytest.raises(OSError, match=r"c \(Permission denied\): nothing was written$"):   # said of the file
        files.write_atomically(str(tmp_path), {"c": fails})
    replace = os.replace
    def interrupted(*args):   # a Ctrl-C between the two renames is held: both files are the new ones
        os.kill(os.getpid(), signal.SIGINT)
        replace(*args)
    monkeypatch.setattr(os, "replace", interrupted)
    try:
        files.write_atomically(str(tmp_path), {"a": new, "b": new})
    except KeyboardInterrupt:
        pytest.fail("a Ctrl-C between the renames stopped them: the folder holds a mix")
    assert [p.read_text() for p in sorted(tmp_path.iterdir())] == ["new", "new"]
    assert signal.getsignal(signal.SIGINT) is handler   # Ctrl-C is held only while the files are renamed

def test_long_names_the_cache_fits_and_a_too_long_cache_dir_names_the_flag(tmp_path):
    long = tmp_path / ("a" * 245)   # a name the file system holds; the cache folder's name is cut to fit
    texts = write_docs(long, n=2)
    d = data.load_data(str(long), cache_dir=str(tmp_path / "c"))
    assert split_docs(np.r_[d.train, d.val]) == {t.encode() for t in texts.values()}
    with pytest.raises(OSError, match=r" \(File name too long\): nothing was written: pass a shorter --cache-dir$"):
        data.load_data(str(long), cache_dir=str(tmp_path / ("o" * 256)))
    assert sorted(os.listdir(tmp_path)) == ["a" * 245, "c"]

def test_a_tokenizer_is_a_file_or_a_folder_holding_one_and_a_relative_path_is_the_file_it_names(
        tmp_path, monkeypatch, tok_json):
    for folder, extra in (("a", ""), ("b", "\n")):   # two tokenizer.json files, one name: t/tokenizer.json
        (tmp_path / folder / "t").mkdir(parents=True)
        (tmp_path / folder / "t" / "tokenizer.json").write_text(open(tok_json).read() + extra)
    names = []
    for folder in ("a", "b"):
        monkeypatch.chdir(tmp_path / folder)
        names.append(tokenizers.get_tokenizer("t/tokenizer.json").name)
    assert names[0] != names[1]   # each process-wide cache entry is a file, not a name
    assert names[1] == tokenizers.get_tokenizer(str(tmp_path / "b" / "t" / "tokenizer.json")).name
    assert names[1] == tokenizers.get_tokenizer("t").name   # a folder: its tokenizer.json
    with pytest.raises(DataError, match=r"unknown tokenizer 'org/tok': pass bytes or a Hugging Face "
                                        r"tokenizer.json \(`hf download ORG/NAME tokenizer.json"):
        tokenizers.get_tokenizer("org/tok")   # no such path: nothing is fetched
    (tmp_path / "b" / "empty").mkdir()
    with pytest.raises(DataError, match=r"unknown tokenizer 'empty/tokenizer.json'"):
        tokenizers.get_tokenizer("empty")   # a folder without one

def test_cache_and_run_folders_under_data_are_not_read_and_what_is_read_stays_the_same(
        tmp_path, monkeypatch, capsys):
    corpus = tmp_path / "corpus"
    texts = write_docs(corpus)
    texts.update(write_docs(corpus / "nested", n=2))
    for folder, name in (("json", "args.json"), ("notes", "meta.json")):   # one such name alone: a document
        (corpus / folder).mkdir()
        texts[corpus / folder / name] = f'{{"a document": "{folder}"}}\n'
        (corpus / folder / name).write_text(texts[corpus / folder / name])
    load = lambda cache_dir, root=corpus: data.load_data(str(root), cache_dir=str(cache_dir))
    first = load(corpus / "cache")   # the cache inside --data, as data_cache/ in `--data .`
    assert "folders skipped" not in capsys.readouterr().out
    runs = {"R1": ["ckpt.pt", "args.json", "metrics.jsonl", "train.lock"], "R2": ["train.lock"],
            "R3": ["ckpt.pt"], "old": ["args.json", "metrics.jsonl"]}   # train.py's --out at each stage
    for run, names in runs.items():
        (corpus / run).mkdir()
        for name in names:
            (corpus / run / name).write_text(f"{run}'s {name}\n")
    (corpus / "R1" / "eval").mkdir()   # evaluate.py's --out in a run's folder: skipped with it
    (corpus / "R1" / "eval" / "eval.json").write_text("{}\n")
    shutil.copytree(next((corpus / "cache").iterdir()), corpus / "sub" / "prep")   # a cache folder copied in
    monkeypatch.setattr(token_cache, "_build", None)   # the same files: the same cache, nothing built
    assert load(corpus / "cache").info["key"] == first.info["key"]
    monkeypatch.undo()
    again = load(tmp_path / "elsewhere")   # built anew: its line names the folders skipped
    out = capsys.readouterr().out
    assert (f"(0 files skipped: binary, not UTF-8 or empty; 6 folders skipped, caches or train.py runs: "
            f"{corpus}/R1, {corpus}/R2, {corpus}/R3, ...) -> {tmp_path}/elsewhere/") in out, out
    assert again.info["key"] == first.info["key"] and again.info["docs_train"] + again.info["docs_val"] == 24
    assert split_docs(np.r_[again.train, again.val]) == {t.encode() for t in texts.values()}
    (tmp_path / "alias").symlink_to(corpus / "cache")   # the cache folder under another name
    alias, sub = tmp_path / "alias", corpus / "sub"   # nothing left to read: the error says why
    for root, skipped in ((corpus / "R2", corpus / "R2"), (corpus / "cache", corpus / "cache"),
                          (alias, alias), (sub, sub / "prep")):
        said = f"{root}' holds no files (1 folders skipped, caches or train.py runs: {skipped}): point --data"
        with pytest.raises(DataError, match=re.escape(said)):
            load(corpus / "cache", root)
    assert token_cache._skipped([f"d{i}" for i in range(3)], "<{}>") == \
        "<3 folders skipped, caches or train.py runs: d0, d1, d2>"

class Blocked(Exception):
    pass

@contextlib.contextmanager
def unblocked(seconds=20):   # a FIFO opened blocks: the test fails, it does not hang
    def blocked(*_):
        raise Blocked(f"blocked for {seconds} s: a FIFO opened?")
    handler = signal.signal(signal.SIGALRM, blocked)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, handler)

def test_a_fifo_or_a_device_is_named_not_opened_nor_said_missing(tmp_path, tok_json):
    load = lambda path: data.load_data(str(path), cache_dir=str(tmp_path / "c"))
    os.mkfifo(tmp_path / "fifo")
    with unblocked():
        for path, what in ((tmp_path / "fifo", "a FIFO"), ("/dev/null", "a device")):
            said = f"--data {path} is {what}, not a text file or folder: pass a text file or a folder of them"
            with pytest.raises(DataError, match=f"^{re.escape(said)}$"):
                load(path)
        write_docs(tmp_path / "corpus", n=3)
        os.mkfifo(tmp_path / "corpus" / "pipe")
        with pytest.raises(DataError, match="corpus/pipe is a FIFO, not a regular file: make it a readable "
                                            "file, or leave it out of --data$"):
            load(tmp_path / "corpus")
        os.unlink(tmp_path / "corpus" / "pipe")
        with pytest.raises(DataError, match=f"^no such file or directory '{re.escape(str(tmp_path))}/none'"):
            load(tmp_path / "none")   # missing: said so
        built = load(tmp_path / "corpus")
        (cache,) = (tmp_path / "c").iterdir()
        for name in ("train.bin", "val.bin", "meta.json"):   # a FIFO in place of a file of the cache
            kept = (cache / name).read_bytes()
            (cache / name).unlink()
            os.mkfifo(cache / name)
            fifo = f"^{re.escape(str(cache / name))} is a FIFO, not a regular file: "
            with pytest.raises(DataError, match=fifo + re.escape(f"remove the cache {cache} (it is rebuilt "
                                                                 "from --data)") + "$"):
                load(tmp_path / "corpus")
            with pytest.raises(DataError, match=fifo + "pass --data a cache folder of regular files, or the "
                                                       "text it was built from$"):
                load(cache)   # the cache folder as --data
            assert stat.S_ISFIFO(os.stat(cache / name).st_mode)   # left as it was: nothing removed
            (cache / name).unlink()
            (cache / name).write_bytes(kept)
        assert np.array_equal(load(tmp_path / "corpus").val, built.val)   # the cache, read: nothing rebuilt
        with pytest.raises(DataError, match="fifo is a FIFO, not a regular file: pass a Hugging Face "
                                            "tokenizer.json$"):
            tokenizers.get_tokenizer(str(tmp_path / "fifo"))
        with pytest.raises(DataError, match="fifo is a FIFO, not a regular file: move it away$"):
            files.read_json(tmp_path / "fifo", "move it away")
    assert files.read_json(tmp_path / "c" / cache.name / "meta.json", "-")["docs_val"] == 1
    with pytest.raises(DataError, match=r"is not readable JSON \(FileNotFoundError\): move it away$"):
        files.read_json(tmp_path / "none.json", "move it away")   # a missing file: as before
    with pytest.raises(DataError, match=r"/dev/null is a device, not a regular file: fix$"):
        files.require_file("/dev/null", "fix")
    with pytest.raises(DataError, match=r"corpus is a folder, not a regular file: fix$"):
        files.require_file(tmp_path / "corpus", "fix")

def test_a_folder_of_data_that_cannot_be_listed_is_named_not_left_out(tmp_path, monkeypatch):
    write_docs(tmp_path / "corpus", n=3)
    write_docs(tmp_path / "corpus" / "locked", n=2)
    scandir = os.scandir
    def denied(path="."):   # as a folder without read permission (root reads them all)
        if os.fspath(path).endswith("locked"):
            raise PermissionError(errno.EACCES, "Permission denied", os.fspath(path))
        return scandir(path)
    monkeypatch.setattr(os, "scandir", denied)
    with pytest.raises(DataError, match=f"^{re.escape(str(tmp_path))}/corpus/locked: Permission denied: make "
                                        "it readable, or leave it out of --data$"):
        data.load_data(str(tmp_path / "corpus"), cache_dir=str(tmp_path / "c"))
    assert not (tmp_path / "c").exists()

def test_a_killed_writers_temporary_files_are_removed_by_the_next_write(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()   # its pid names no process now
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        target = tmp_path / "eval.json"
        for pid in (dead.pid, alive.pid):
            (tmp_path / f"eval.json.{pid}.tmp").write_text("half")
        (tmp_path / f"ppl.png.{dead.pid}.tmp").write_text("half")   # another file's: not this write's
        (tmp_path / f"eval.json.{dead.pid}.tmp.keep").write_text("the user's")
        (tmp_path / "eval.json.x.tmp").write_text("the user's")
        (tmp_path / f"cache.{dead.pid}.tmp").mkdir()   # a corpus cache's, a folder
        files.write_atomically(str(target), lambda tmp: pathlib.Path(tmp).write_text("{}"))
        files.write_atomically(str(tmp_path / "cache"), lambda tmp: os.mkdir(tmp))
        assert sorted(os.listdir(tmp_path)) == sorted(["cache", "eval.json", f"eval.json.{alive.pid}.tmp",
                                                       f"ppl.png.{dead.pid}.tmp", "eval.json.x.tmp",
                                                       f"eval.json.{dead.pid}.tmp.keep"])
    finally:
        alive.kill()
        alive.wait()

def test_a_folder_removed_while_writing_is_named_not_a_full_disk(tmp_path):
    import torch
    folder = tmp_path / "run"
    folder.mkdir()

    def removed_then_saved(tmp):
        shutil.rmtree(folder)
        torch.save({"step": 1}, tmp)   # torch reports the missing folder as a RuntimeError
    with pytest.raises(OSError, match=f"the folder {folder} no longer exists\\): nothing was written$"):
        files.write_atomically(str(folder / "ckpt.pt"), removed_then_saved)
    folder.mkdir()

    def full(tmp):   # torch.save's error on a full disk: a RuntimeError, the folder still there
        raise RuntimeError("unexpected pos 64 vs 0")
    with pytest.raises(OSError, match="unexpected pos 64 vs 0; disk full\\?\\): nothing was written$"):
        files.write_atomically(str(folder / "ckpt.pt"), full)

# --- python -m plumbing.token_cache: tokenize once, without training -------------------------------------------------
def tokenize_once(argv, capsys):   # -> (exit status, stdout, stderr) of token_cache.main(argv), in this process
    try:
        token_cache.main(argv)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
        print(e.code, file=sys.stderr) if isinstance(e.code, str) else None   # as the interpreter would
    out, err = capsys.readouterr()
    return code, out, err

def test_tokenize_once_writes_the_cache_train_py_reads_and_that_folder_is_data_anywhere(
        tmp_path, tok_json, monkeypatch, capsys):
    texts = write_docs(tmp_path / "corpus")
    handler = signal.getsignal(signal.SIGTERM)
    argv = ["--data", str(tmp_path / "corpus"), "--tokenizer", tok_json, "--cache-dir", str(tmp_path / "c")]
    code, out, err = tokenize_once(argv, capsys)
    (folder,) = (tmp_path / "c").iterdir()
    assert code == 0 and out.splitlines()[-1] == str(folder) and f"-> {folder}" in out and not err
    assert signal.getsignal(signal.SIGTERM) is handler   # main's own SIGTERM handler is put back
    monkeypatch.setattr(token_cache, "_build", None)   # train.py (load_data) reads that cache: nothing built
    cached = data.load_data(str(tmp_path / "corpus"), tok_json, cache_dir=str(tmp_path / "c"))
    code, out, err = tokenize_once(argv, capsys)   # again: reported, not rebuilt
    said = f"data: {folder} holds the verified ids of {tmp_path}/corpus already: nothing rebuilt\n{folder}\n"
    assert code == 0 and out == said
    shutil.copytree(folder, tmp_path / "elsewhere" / "ids")   # copied where one trains
    monkeypatch.undo()
    train, val, _ = token_cache.token_ids(str(tmp_path / "corpus"), tok_json, cache_dir=str(tmp_path / "other"))
    copied = data.load_data(str(tmp_path / "elsewhere" / "ids"), tok_json)
    assert np.array_equal(copied.train, train) and np.array_equal(copied.val, val)   # the ids of token_ids
    assert np.array_equal(cached.train, train) and len(train) and len(val)
    enc = tokenizers.get_tokenizer(tok_json)
    assert {enc.decode(d) for d in np.split(np.r_[train, val], np.flatnonzero(np.r_[train, val] == 1))[1:]} \
        == {"<|endoftext|>" + t for t in texts.values()}   # each file one document, eot first
    with pytest.raises(DataError, match="--tokenizer"):
        data.load_data(str(tmp_path / "elsewhere" / "ids"), "bytes")
    os.truncate(folder / "val.bin", 2)   # a damaged cache: rebuilt, as train.py would
    code, out, err = tokenize_once(argv, capsys)
    assert code == 0 and "truncated or corrupt: rebuilding it" in err and f"-> {folder}" in out
    assert np.array_equal(np.fromfile(folder / "val.bin", np.uint16), val)

def test_tokenize_once_as_a_command_and_its_help(tmp_path):
    write_docs(tmp_path / "corpus", n=3)
    env = dict(os.environ, LENGTHGEN_CACHE_DIR=str(tmp_path / "c"))   # the default --cache-dir
    run = lambda *argv: subprocess.run([sys.executable, "-m", "plumbing.token_cache", *argv], capture_output=True,
                                       text=True, env=env, cwd=ROOT)
    r = run("--data", str(tmp_path / "corpus"))   # bytes, into $LENGTHGEN_CACHE_DIR
    (folder,) = (tmp_path / "c").iterdir()
    assert r.returncode == 0 and r.stdout.splitlines()[-1] == str(folder) and not r.stderr, r
    assert np.array_equal(data.load_data(str(folder)).val, data.load_data(str(tmp_path / "corpus"),
                                                                          cache_dir=str(tmp_path / "c")).val)
    r = run("--help")
    assert r.returncode == 0 and all(f in r.stdout for f in ("--data", "--tokenizer", "--cache-dir", "gpt2"))
    r = run("--data", str(tmp_path / "none"))
    assert r.returncode == 1 and r.stderr == f"error: no such file or directory '{tmp_path}/none': pass a " \
        "directory or a text file (patterns are not expanded), stdlib or markov:k=8,...\n" and not r.stdout

NOTHING = "not text: nothing to tokenize: pass it to train.py\n"
TOKENIZE_ONCE_ERRORS = [   # (argv, exit status, its one line on stderr; {d}: the test's folder)
    ([], 2, "error: the following arguments are required: --data\n"),
    (["--data", "{d}", "--bogus"], 2, "error: unrecognized arguments: --bogus\n"),
    (["--data", " "], 2, "error: --data is empty: pass a value (python -m plumbing.token_cache --help)\n"),
    (["--data", "{d}", "--cache-dir", ""], 2, "error: --cache-dir is empty: pass a value (python "
                                             "-m plumbing.token_cache --help)\n"),
    (["--data", "markov:k=4"], 1, "error: --data markov:k=4 is a Markov process, " + NOTHING),
    (["--data", "{d}/prep"], 1, "error: --data {d}/prep is a cache folder, " + NOTHING),
    (["--data", "{d}/owt"], 1, "error: --data {d}/owt is nanoGPT's ids, " + NOTHING),
    (["--data", "{d}", "--tokenizer", "org/tok"], 1, "error: unknown tokenizer 'org/tok': pass bytes or a "),
    (["--data", "{d}/binary"], 1, "error: '{d}/binary': no UTF-8 text documents (1 files skipped: binary, "
                                  "not UTF-8 or empty): pass text files\n"),
]

@pytest.mark.parametrize("argv, code, line", TOKENIZE_ONCE_ERRORS, ids=range(len(TOKENIZE_ONCE_ERRORS)))
def test_tokenize_once_bad_input_is_one_line(tmp_path, capsys, argv, code, line):
    write_docs(tmp_path / "prep", n=2)
    token_cache.token_ids(str(tmp_path / "prep"), cache_dir=str(tmp_path / "c"))
    shutil.rmtree(tmp_path / "prep")
    next((tmp_path / "c").iterdir()).rename(tmp_path / "prep")   # a cache folder
    (tmp_path / "owt").mkdir()   # nanoGPT's train.bin and val.bin
    for split in ("train", "val"):
        np.arange(10, dtype=np.uint16).tofile(tmp_path / "owt" / f"{split}.bin")
    (tmp_path / "binary").mkdir()
    (tmp_path / "binary" / "x.dat").write_bytes(b"\x80\x81")
    capsys.readouterr()
    argv = [a.format(d=tmp_path) for a in argv]
    got, out, err = tokenize_once(argv + ["--cache-dir", str(tmp_path / "c2")] * ("--cache-dir" not in argv),
                                  capsys)
    assert got == code and err.startswith(line.format(d=tmp_path)) and err.count("\n") == 1, err
    assert not out and not (tmp_path / "c2").exists()

def test_tokenize_once_interrupted_leaves_no_folder(tmp_path, monkeypatch, capsys):
    write_docs(tmp_path / "corpus", n=3)

    write_atomically = files.write_atomically

    def interrupted(path, write):   # Ctrl-C (or SIGTERM: main makes it one) once the files are written
        def then_interrupted(tmp):
            write(tmp)
            raise KeyboardInterrupt
        write_atomically(path, then_interrupted)
    monkeypatch.setattr(token_cache, "write_atomically", interrupted)   # the name it calls
    code, out, err = tokenize_once(["--data", str(tmp_path / "corpus"), "--cache-dir", str(tmp_path / "c")],
                                   capsys)
    assert code == 1 and err == "interrupted: no cache folder written, no temporary file left\n"
    assert os.listdir(tmp_path / "c") == []
