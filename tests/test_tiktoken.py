"""tiktoken's tokenizers (plumbing/tokenizers.py): a .tiktoken ranks file made here, tiktoken's named encodings from its
cache and the one-line error that names the file they need (nothing fetched: no network in tests), and
nanoGPT's prepare.py folders of GPT-2 ids (train.bin, val.bin, uint16) with a stand-in GPT-2."""
import base64
import hashlib
import os
import pathlib
import re
import socket
import sys

import numpy as np
import pytest
import torch

import data
import tasks
from plumbing import token_cache, tokenizers
from data import DataError

tiktoken = pytest.importorskip("tiktoken")
from tiktoken_ext.openai_public import r50k_pat_str  # noqa: E402

MERGES = [b"he", b"ll", b"llo", b"hello", b" w", b"or", b" wor", b"ld", b" world", b"\n\n", b"\n ", b"  ",
          b"in", b"ine", b"line"]   # over the 256 bytes, in merge order
RANKS = {t: i for i, t in enumerate([bytes([b]) for b in range(256)] + MERGES)}
N = len(RANKS)   # the file's eot: after its last rank
TEXT = "".join(f"line {i}: hello world ✓{' ' * (i % 3)}\n{'  ' * (i % 2)}{chr(10) * (i % 5 == 0)}"
               for i in range(300)) + "an <|endoftext|> in a document is text\n"
GPT2_URL = "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/vocab.bpe"
CL100K_URL = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"

def ranks_file(path, ranks=RANKS, lines=None):   # a .tiktoken file: `base64(token) rank` a line
    lines = [f"{base64.b64encode(t).decode()} {r}" for t, r in ranks.items()] if lines is None else lines
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)

def reference(name="ref", special=None):   # tiktoken's own Encoding of RANKS, GPT-2's pattern
    special = {"<|endoftext|>": len(RANKS)} if special is None else special
    return tiktoken.Encoding(name, pat_str=r50k_pat_str, mergeable_ranks=RANKS, special_tokens=special)

@pytest.fixture
def fresh():   # tokenizers loaded in a test are not left in the process-wide cache of later tests
    tokenizers._load_tokenizer.cache_clear()
    yield
    tokenizers._load_tokenizer.cache_clear()

@pytest.fixture
def no_network(monkeypatch):   # a connection attempted fails the test at once
    def refused(*args, **kwargs):
        raise AssertionError("a network connection was attempted")
    monkeypatch.setattr(socket.socket, "connect", refused)
    monkeypatch.setattr(socket, "create_connection", refused)

def test_a_tiktoken_file_is_gpt2s_pattern_with_endoftext_after_its_last_rank(tmp_path, fresh):
    path = ranks_file(tmp_path / "tiny.tiktoken")
    enc, ref = tokenizers.get_tokenizer(path), reference()
    sha1 = hashlib.sha1((tmp_path / "tiny.tiktoken").read_bytes()).hexdigest()
    assert (enc.name, enc.n_vocab, enc.eot_token) == (f"tiktoken-{sha1[:12]}", N + 1, N)
    assert enc.encode_ordinary("hello world") == [RANKS[b"hello"], RANKS[b" world"]]   # merged
    assert enc.encode_ordinary(TEXT) == ref.encode_ordinary(TEXT)   # exactly tiktoken's own
    assert enc.encode_ordinary("<|endoftext|>") == ref.encode_ordinary("<|endoftext|>")   # plain text
    assert enc.eot_token not in enc.encode_ordinary(TEXT)
    assert enc.encode_ordinary_batch(["hello", "line"]) == [[RANKS[b"hello"]], [RANKS[b"line"]]]
    assert enc.decode(np.array(enc.encode_ordinary(TEXT), np.uint16)) == TEXT   # numpy ids decode too
    assert enc.decode(torch.tensor(enc.encode_ordinary("hello line"))) == "hello line"   # and torch's
    assert enc.decode([RANKS[b"hello"], N]) == "hello<|endoftext|>"
    assert enc.encode_single_token(b"hello") == RANKS[b"hello"] and enc.encode_single_token(b"\x03") == 3
    with pytest.raises(DataError, match=r"^b'hello w' is not one token of tiktoken-\w{12}: use a byte"):
        enc.encode_single_token(b"hello w")
    (tmp_path / "copy").mkdir()   # its name is its content's: the same elsewhere, another for other ranks
    copy = ranks_file(tmp_path / "copy" / "x.tiktoken")
    assert tokenizers.get_tokenizer(copy).name == enc.name and tokenizers.get_tokenizer(path) is enc
    fewer = ranks_file(tmp_path / "fewer.tiktoken", dict(list(RANKS.items())[:-1]))
    fewer = tokenizers.get_tokenizer(fewer)
    assert fewer.name != enc.name and fewer.eot_token == N - 1
    assert tasks.task_tokenizer(path) is enc   # it spells the tasks' text
    sample = tasks.passkey_sample(path, 200)
    assert max(sample.tokens) < enc.n_vocab

def test_a_tiktoken_files_blank_lines_are_skipped_as_tiktoken_does(tmp_path, fresh):
    lines = [f"{base64.b64encode(t).decode()} {r}" for t, r in RANKS.items()]
    path = ranks_file(tmp_path / "blank.tiktoken", lines=lines[:100] + ["", "  "] + lines[100:])
    assert tokenizers.get_tokenizer(path).encode_ordinary(TEXT) == reference().encode_ordinary(TEXT)

def test_text_tokenized_with_a_tiktoken_file_in_pieces_gives_the_ids_of_the_whole(tmp_path, monkeypatch,
                                                                                   fresh):
    path = ranks_file(tmp_path / "tiny.tiktoken")
    (tmp_path / "big.txt").write_text(TEXT)
    monkeypatch.setattr(token_cache, "PIECE_CHARS", 50)
    monkeypatch.setattr(token_cache, "BATCH_PIECES", 3)
    d = data.load_data(str(tmp_path / "big.txt"), path, val_fraction=0.1, cache_dir=str(tmp_path / "c"))
    assert np.concatenate([d.train, d.val]).tolist() == [N] + reference().encode_ordinary(TEXT)
    assert d.train.dtype == np.uint16 and (d.eot_token, d.vocab_size) == (N, N + 1)
    lines = [t for line in TEXT.splitlines(True) for t in reference().encode_ordinary(line)]
    assert lines != reference().encode_ordinary(TEXT)   # a cut after any newline: not the ids

BYTES = [f"{base64.b64encode(bytes([b])).decode()} {b}" for b in range(256)]   # ranks 0..255
BAD_FILES = [   # (lines of the file, its one-line error)
    ([], r"holds no tokens"),
    (["YQ=="], r"line 1 is not `base64\(token\) rank`"),
    (["YQ== 0 1"], r"line 1 is not `base64\(token\) rank`"),
    (["YQ== 0", "not-base64! 1"], r"line 2 is not `base64\(token\) rank`"),
    (["YQ== zero"], r"line 1 is not `base64\(token\) rank`"),
    (BYTES + ["YW-I= 256"], r"line 257 is not `base64\(token\) rank`"),   # "ab" with a stray "-" in it
    (BYTES + ["YWI= 257"], "no token has rank 256"), (BYTES + ["YWI= 255"], "no token has rank 256"),
    (BYTES + ["YWI= -1"], "no token has rank 256"), (["YQ== 1"] + BYTES[1:], "no token has rank 0"),
    ([f"{base64.b64encode(bytes([b])).decode()} {b - (b > 97)}" for b in range(256) if b != 97],
     r"the byte b'a' is no token"),   # tiktoken itself would panic on an "a"
    (BYTES[:255], r"the byte b'\\xff' is no token"),
]

@pytest.mark.parametrize("lines, error", BAD_FILES, ids=range(len(BAD_FILES)))
def test_a_bad_tiktoken_file_is_a_one_line_error(tmp_path, fresh, lines, error):
    path = ranks_file(tmp_path / "bad.tiktoken", lines=lines)
    fix = r": pass a .tiktoken file of a byte-level BPE \(a line `base64\(token\) rank` each, ranks 0..n-1 " \
          r"once\)$"
    with pytest.raises(DataError, match=f"^{re.escape(path)}:? {error}{fix}"):
        tokenizers.get_tokenizer(path)

def test_a_missing_or_special_tiktoken_path_is_named(tmp_path, fresh):
    with pytest.raises(DataError, match=r"^unknown tokenizer '.*none.tiktoken': pass bytes or a Hugging "
                                        r"Face tokenizer.json .*, a tiktoken encoding \(gpt2, r50k_base, "
                                        r"p50k_base, cl100k_base, o200k_base\) or PATH/x.tiktoken$"):
        tokenizers.get_tokenizer(str(tmp_path / "none.tiktoken"))
    os.mkfifo(tmp_path / "pipe.tiktoken")
    with pytest.raises(DataError, match=r"pipe.tiktoken is a FIFO, not a regular file: pass a .tiktoken "
                                        r"file$"):
        tokenizers.get_tokenizer(str(tmp_path / "pipe.tiktoken"))

def test_tiktoken_not_installed_names_the_package(tmp_path, monkeypatch, fresh):
    path = ranks_file(tmp_path / "tiny.tiktoken")
    monkeypatch.setitem(sys.modules, "tiktoken", None)
    for name in (path, "gpt2"):
        with pytest.raises(DataError, match=r"^tokenizer \S+ needs: pip install tiktoken$"):
            tokenizers.get_tokenizer(name)

@pytest.mark.parametrize("name", tokenizers.TIKTOKEN_NAMES)
def test_a_named_encoding_not_in_tiktokens_cache_names_the_file_it_needs_and_fetches_nothing(
        name, tmp_path, monkeypatch, fresh, no_network):
    cache = tmp_path / "tiktoken-cache"
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))
    with pytest.raises(DataError) as info:
        tokenizers.get_tokenizer(name)
    url = GPT2_URL if name == "gpt2" else CL100K_URL.replace("cl100k_base", name)
    file = cache / hashlib.sha1(url.encode()).hexdigest()   # where tiktoken.load.read_file_cached looks
    said = (f"tiktoken's {name} needs {url} in its cache, as {file} (missing, or not the file its sha256 "
            f"names; nothing is fetched at run time): run TIKTOKEN_CACHE_DIR=DIR python -c \"import "
            f"tiktoken; tiktoken.get_encoding('{name}')\" on a connected machine, copy DIR here and set "
            "TIKTOKEN_CACHE_DIR=DIR")
    assert str(info.value) == said and "\n" not in said
    assert not cache.exists()   # nothing written either

def test_tiktokens_cache_folder_is_found_as_tiktoken_finds_it(tmp_path, monkeypatch, fresh, no_network):
    for var in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "tmp"))   # tiktoken's: TMPDIR/data-gym-cache
    key = hashlib.sha1(GPT2_URL.encode()).hexdigest()
    for env, folder in ((None, tmp_path / "tmp" / "data-gym-cache"), ("DATA_GYM_CACHE_DIR", tmp_path / "gym"),
                        ("TIKTOKEN_CACHE_DIR", tmp_path / "tk")):   # the last one set wins
        if env:
            monkeypatch.setenv(env, str(folder))
        with pytest.raises(DataError, match=f"in its cache, as {re.escape(str(folder / key))} "):
            tokenizers.get_tokenizer("gpt2")
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "")   # tiktoken: no cache at all
    with pytest.raises(DataError, match=r"vocab.bpe in its cache, and TIKTOKEN_CACHE_DIR is empty \(no "
                                        r"cache\) "):
        tokenizers.get_tokenizer("gpt2")

def test_a_named_encoding_reads_the_file_its_error_names(tmp_path, monkeypatch, fresh, no_network):
    """cl100k_base from a stand-in of its file put where the error says: tiktoken checks a file's sha256,
    which the stand-in fails (it is removed and named again) until that check is patched to accept it."""
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "tk"))
    with pytest.raises(DataError) as info:
        tokenizers.get_tokenizer("cl100k_base")
    file = re.search(r"in its cache, as (\S+) ", str(info.value))[1]
    assert file == str(tmp_path / "tk" / hashlib.sha1(CL100K_URL.encode()).hexdigest())
    os.makedirs(os.path.dirname(file))
    ranks_file(pathlib.Path(file))
    with pytest.raises(DataError, match="not the file its sha256 names"):   # not cl100k_base's own
        tokenizers.get_tokenizer("cl100k_base")
    ranks_file(pathlib.Path(file))
    stand_in = open(file, "rb").read()
    monkeypatch.setattr(tiktoken.load, "check_hash", lambda contents, expected: contents == stand_in)
    enc = tokenizers.get_tokenizer("cl100k_base")
    assert (enc.name, enc.eot_token, enc.n_vocab) == ("cl100k_base", 100257, 100277)   # its special tokens
    assert enc.encode_ordinary("hello world") == [RANKS[b"hello"], RANKS[b" world"]]
    assert enc.decode([RANKS[b"hello"], 100257]) == "hello<|endoftext|>"
    assert tokenizers.get_tokenizer("cl100k_base") is enc   # read once a process

def test_an_encoding_name_is_tiktokens_even_beside_a_folder_of_that_name(tmp_path, monkeypatch, fresh,
                                                                         tok_json):
    (tmp_path / "gpt2").mkdir()
    (tmp_path / "gpt2" / "tokenizer.json").write_text(open(tok_json).read())
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "tk"))
    with pytest.raises(DataError, match="^tiktoken's gpt2 needs"):
        tokenizers.get_tokenizer("gpt2")
    assert tokenizers.get_tokenizer("./gpt2").name.startswith("json-")   # the folder, as a path

# --- nanoGPT's prepare.py folders: train.bin, val.bin of uint16 GPT-2 ids, each document then eot 50256 ----
def stand_in_gpt2(name="gpt2"):   # GPT-2's ids: RANKS's tokens, eot 50256, n_vocab 50257 (offline)
    return tokenizers.TiktokenTokenizer(reference(name, {"<|endoftext|>": 50256}))

@pytest.fixture
def gpt2(monkeypatch, fresh):   # --tokenizer gpt2 without tiktoken's files
    monkeypatch.setattr(tokenizers, "_tiktoken", lambda name: stand_in_gpt2(name))
    return tokenizers.get_tokenizer("gpt2")

def nanogpt(folder, docs=("hello world", "line 1\nline 2", "hello"), val=("line hello",)):
    """A folder as nanoGPT's prepare.py writes it: the ids of each document followed by eot, beside the
    scripts and text it came from. -> (train, val) ids."""
    folder.mkdir(parents=True)
    enc = stand_in_gpt2()
    splits = [np.array([t for d in texts for t in enc.encode_ordinary(d) + [50256]], np.uint16)
              for texts in (docs, val)]
    splits[0][-2] = 50000   # an id of the real GPT-2 past the stand-in's merges: in its vocabulary
    for split, ids in zip(("train", "val"), splits):
        ids.tofile(folder / f"{split}.bin")
    (folder / "prepare.py").write_text("import tiktoken\n")
    (folder / "readme.md").write_text("openwebtext\n")
    return splits

def test_a_nanogpt_folder_is_data_with_tokenizer_gpt2(tmp_path, gpt2):
    train, val = nanogpt(tmp_path / "owt")
    d = data.load_data(str(tmp_path / "owt"), "gpt2", cache_dir=str(tmp_path / "c"))
    assert isinstance(d.train, np.memmap) and d.train.dtype == np.uint16   # as they are, nothing copied
    assert np.array_equal(d.train, train) and np.array_equal(d.val, val) and not (tmp_path / "c").exists()
    assert (d.vocab_size, d.eot_token, d.tokenizer) == (50257, 50256, gpt2)
    assert d.info["key"] == f"nanogpt-{len(train)}+{len(val)}" and d.info["tokenizer"] == "gpt2"
    streams = data.DocumentStreams(d.train, d.eot_token, 1, 1)   # documents end at an eot, as ours start
    assert streams.doc_start[:2].tolist() == [0, 2] and d.tokenizer.decode(d.val[:-1]) == "line hello"

@pytest.mark.parametrize("tokenizer", ["bytes", "tiny", "r50k_base"])
def test_a_nanogpt_folder_without_tokenizer_gpt2_says_it_needs_it(tmp_path, monkeypatch, gpt2, tokenizer):
    nanogpt(tmp_path / "owt")
    name = ranks_file(tmp_path / "tiny.tiktoken") if tokenizer == "tiny" else tokenizer
    enc = tokenizers.get_tokenizer(name)
    said = (f"{tmp_path}/owt: its train.bin and val.bin (no meta.json) look like nanoGPT's GPT-2 ids, not "
            f"{enc.name}'s: pass --tokenizer gpt2")
    with pytest.raises(DataError, match=f"^{re.escape(said)}$"):
        data.load_data(str(tmp_path / "owt"), name)

def test_a_nanogpt_folders_bad_files_are_one_line_errors(tmp_path, gpt2):
    train, val = nanogpt(tmp_path / "owt")
    load = lambda: data.load_data(str(tmp_path / "owt"), "gpt2")
    folder = tmp_path / "owt"
    np.r_[val, 50257].astype(np.uint16).tofile(folder / "val.bin")   # past GPT-2's vocabulary: other ids
    with pytest.raises(DataError, match=f"^{re.escape(str(folder))}/val.bin holds id 50257, past the 50257 "
                                        "of gpt2: pass nanoGPT's GPT-2 ids \\(uint16\\)$"):
        load()
    np.r_[train, 65535].astype(np.uint16).tofile(folder / "train.bin")
    with pytest.raises(DataError, match="/train.bin holds id 65535, past"):
        load()
    train.tofile(folder / "train.bin")
    for content, size in ((val.tobytes() + b"\0", len(val) * 2 + 1), (b"", 0)):
        (folder / "val.bin").write_bytes(content)
        with pytest.raises(DataError, match=f"/val.bin holds {size} bytes, not uint16 ids: pass nanoGPT's "
                                            "prepare.py folder$"):
            load()
    (folder / "val.bin").unlink()
    os.mkfifo(folder / "val.bin")
    with pytest.raises(DataError, match="val.bin is a FIFO, not a regular file: pass nanoGPT's prepare.py "
                                        "folder$"):
        load()
    (folder / "val.bin").unlink()
    val.tofile(folder / "val.bin")
    assert np.array_equal(load().val, val)
    (folder / "meta.pkl").write_bytes(b"\x80\x04}")   # shakespeare_char's: ids of its own characters
    with pytest.raises(DataError, match=f"^{re.escape(str(folder))}/meta.pkl: {re.escape(str(folder))} holds "
                                        "nanoGPT's character-level ids \\(a vocabulary of its own\\): pass "
                                        "--data the text they were made from$"):
        load()

def test_a_folder_with_one_of_the_two_bins_is_text_as_before(tmp_path, gpt2):
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "train.bin").write_text("a text file named train.bin\n")
    (tmp_path / "t" / "notes.txt").write_text("notes\n")
    d = data.load_data(str(tmp_path / "t"), "bytes", cache_dir=str(tmp_path / "c"))
    assert d.info["docs_train"] + d.info["docs_val"] == 2

def test_stdlib_is_the_standard_library_even_beside_a_nanogpt_folder_named_so(tmp_path, monkeypatch, gpt2):
    nanogpt(tmp_path / "stdlib")
    monkeypatch.chdir(tmp_path)

    class Text(Exception):
        pass
    def text(*args):
        raise Text()
    monkeypatch.setattr(token_cache, "_cache", text)   # read as text: the standard library's
    with pytest.raises(Text):
        data.load_data("stdlib", "gpt2")
    assert len(data.load_data("./stdlib", "gpt2").train) == 13

def test_train_py_reads_a_nanogpt_folder_and_a_tiktoken_file_and_records_each_tokenizer(tmp_path, gpt2):
    import train
    ids = nanogpt(tmp_path / "owt", docs=["hello world line " * 20] * 3, val=["line hello world " * 20] * 2)
    (tmp_path / "corpus").mkdir()
    for i in range(3):
        (tmp_path / "corpus" / f"{i}.txt").write_text(TEXT)
    path = ranks_file(tmp_path / "tiny.tiktoken")
    common = ["--seq-len", "16", "--batch-size", "2", "--eval-interval", "1000", "--quiet", "--device", "cpu",
              "--steps", "1", "--size", "tiny", "--cache-dir", str(tmp_path / "c")]
    for run, flags, tokenizer_id, vocab in (("gpt2", ["--data", f"{tmp_path}/owt", "--tokenizer", "gpt2",
                                                      "--streams"], "gpt2", 50257),
                                            ("file", ["--data", f"{tmp_path}/corpus", "--tokenizer", path],
                                             tokenizers.get_tokenizer(path).name, N + 1)):
        train.main(common + flags + ["--out", str(tmp_path / run)])
        ckpt = torch.load(tmp_path / run / "ckpt.pt", weights_only=False)
        assert ckpt["train_config"]["tokenizer_id"] == tokenizer_id
        assert ckpt["model_config"]["vocab_size"] == vocab
    saved = torch.load(tmp_path / "gpt2" / "ckpt.pt", weights_only=False)["train_config"]
    assert saved["data_id"] == f"{tmp_path}/owt nanogpt-{len(ids[0])}+{len(ids[1])} split-seed 0"

def test_tokenize_once_with_a_tiktoken_file(tmp_path, capsys, fresh):
    (tmp_path / "corpus").mkdir()
    for i in range(3):
        (tmp_path / "corpus" / f"{i}.txt").write_text(TEXT[i * 100:])
    path = ranks_file(tmp_path / "tiny.tiktoken")
    token_cache.main(["--data", str(tmp_path / "corpus"), "--tokenizer", path, "--cache-dir",
                    str(tmp_path / "c")])
    folder = capsys.readouterr().out.splitlines()[-1]
    enc = tokenizers.get_tokenizer(path)
    assert os.path.basename(folder).startswith(f"corpus-{enc.name}-")
    d = data.load_data(folder, path)
    ids = np.r_[d.train, d.val]
    docs = {enc.decode(doc) for doc in np.split(ids, np.flatnonzero(ids == N))}
    assert docs == {""} | {"<|endoftext|>" + TEXT[i * 100:] for i in range(3)}
