import os
import time

import numpy as np
import pytest
import tiktoken.load
import torch

import tasks
from tasks import DataError, DocumentStreams, RandomWindows, TokenizerUnavailableError

BYTES_EOT = 256


def split_docs(tokens, eot):
    """Stream -> list of documents (token tuples between eot tokens, eot dropped)."""
    docs, cur = [], None
    for t in np.asarray(tokens).tolist():
        if t == eot:
            if cur is not None:
                docs.append(tuple(cur))
            cur = []
        else:
            cur.append(t)
    if cur is not None:
        docs.append(tuple(cur))
    return docs


def write_docs(folder, n=20, ext=".txt"):
    os.makedirs(folder, exist_ok=True)
    texts = {}
    for i in range(n):
        text = f"document {i}: " + "héllo wörld ✓ " * (i + 1) + "\n"
        path = os.path.join(folder, f"doc{i:02d}{ext}")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        texts[path] = text
    return texts


def assert_one_line_error(exc_type, fn, *words):
    with pytest.raises(exc_type) as info:
        fn()
    msg = str(info.value)
    assert "\n" not in msg, msg
    for w in words:
        assert w in msg, (w, msg)
    return msg


# ---------------------------------------------------------------------------------- tokenizers

def test_bytes_tokenizer_round_trip():
    enc = tasks.get_tokenizer("bytes")
    assert enc.n_vocab == 257 and enc.eot_token == BYTES_EOT
    raw = bytes(np.random.default_rng(0).integers(0, 256, 4000, dtype=np.uint8))
    assert enc.decode_bytes(list(raw)) == raw           # every byte is a token, id = byte value
    text = "plain ascii, ünïcödé, 中文, emoji 🐍𝄞, tabs\t\nand NUL\x00 <|endoftext|> " * 20
    ids = enc.encode_ordinary(text)
    assert ids == list(text.encode("utf-8"))
    assert enc.decode(ids) == text
    assert enc.encode("a<|endoftext|>b", allowed_special="all") == [97, BYTES_EOT, 98]


def test_unavailable_tiktoken_encoding_fails_fast(tmp_path, monkeypatch):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))   # an empty cache: nothing to load
    original = tiktoken.load.read_file
    t0 = time.time()
    msg = assert_one_line_error(TokenizerUnavailableError, lambda: tasks.get_tokenizer("cl100k_base"),
                                "cl100k_base", "TIKTOKEN_CACHE_DIR", "--tokenizer bytes")
    assert time.time() - t0 < 2.0, msg
    assert tiktoken.load.read_file is original                # the download guard is undone
    assert_one_line_error(DataError, lambda: tasks.get_tokenizer("nonsense"), "nonsense", "bytes")


# ---------------------------------------------------------------------------------- text sources

def test_directory_document_split(tmp_path):
    texts = write_docs(tmp_path / "corpus")
    (tmp_path / "corpus" / "blob.dat").write_bytes(b"\xff\xfe\x00binary")   # skipped: not UTF-8
    (tmp_path / "corpus" / ".hidden").write_text("never read")
    d = tasks.load_data(str(tmp_path / "corpus"), cache_dir=str(tmp_path / "cache"))
    assert d.vocab_size == 257 and d.eot_token == BYTES_EOT
    assert d.train[0] == BYTES_EOT and d.val[0] == BYTES_EOT         # every document starts at eot
    train = set(split_docs(d.train, BYTES_EOT))
    val = set(split_docs(d.val, BYTES_EOT))
    expected = {tuple(t.encode()) for t in texts.values()}
    assert train | val == expected and not train & val
    assert len(val) == 1 and d.info["skipped_files"] == 1          # round(0.05 * 20) = 1
    # deterministic, and the split really depends on the seed
    again = tasks.load_data(str(tmp_path / "corpus"), cache_dir=str(tmp_path / "cache2"))
    assert np.array_equal(again.train, d.train) and np.array_equal(again.val, d.val)
    vals = {tuple(np.asarray(tasks.load_data(str(tmp_path / "corpus"), seed=s, val_fraction=0.2,
                                             cache_dir=str(tmp_path / "cache")).val)) for s in range(4)}
    assert len(vals) > 1


def test_glob_and_single_file(tmp_path):
    texts = write_docs(tmp_path / "a", n=6, ext=".txt")
    write_docs(tmp_path / "a", n=3, ext=".md")
    d = tasks.load_data(str(tmp_path / "a" / "*.txt"), val_fraction=0.34, cache_dir=str(tmp_path / "c"))
    docs = split_docs(d.train, BYTES_EOT) + split_docs(d.val, BYTES_EOT)
    assert sorted(docs) == sorted(tuple(t.encode()) for t in texts.values())
    assert len(split_docs(d.val, BYTES_EOT)) == 2
    # one file = one document: split by tokens, val is the tail
    path = next(iter(texts))
    one = tasks.load_data(path, val_fraction=0.25, cache_dir=str(tmp_path / "c"))
    whole = np.concatenate([one.train, one.val])
    assert whole.tolist() == [BYTES_EOT] + list(texts[path].encode())
    assert len(one.val) == round(0.25 * len(whole))


def test_bin_files(tmp_path):
    ids = np.random.default_rng(0).integers(0, 257, 1000).astype(np.uint16)
    ids.tofile(tmp_path / "train.bin")
    d = tasks.load_data(str(tmp_path / "train.bin"), val_fraction=0.1)
    assert isinstance(d.train, np.memmap) and d.train.dtype == np.uint16
    assert np.array_equal(d.train, ids[:900]) and np.array_equal(d.val, ids[900:])
    ids.astype(np.uint32).tofile(tmp_path / "big.u32.bin")
    d32 = tasks.load_data(str(tmp_path / "big.u32.bin"), val_fraction=0.1)
    assert d32.train.dtype == np.uint32 and np.array_equal(d32.val, ids[900:])
    np.array([5, 300], dtype=np.uint16).tofile(tmp_path / "gpt2ish.bin")     # 300 >= 257
    assert_one_line_error(DataError, lambda: tasks.load_data(str(tmp_path / "gpt2ish.bin")), "--tokenizer")
    (tmp_path / "odd.bin").write_bytes(b"\x01\x02\x03")
    assert_one_line_error(DataError, lambda: tasks.load_data(str(tmp_path / "odd.bin")), "uint16")


def test_cache_is_reused_memmap_and_rebuilt_on_change(tmp_path, monkeypatch, capsys):
    texts = write_docs(tmp_path / "corpus", n=5)
    cache = str(tmp_path / "cache")
    first = tasks.load_data(str(tmp_path / "corpus"), cache_dir=cache)
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "cached" in out
    assert isinstance(first.train, np.memmap) and first.train.dtype == np.uint16
    assert len(os.listdir(cache)) == 2                               # .bin + .json, no temp files left

    def no_rebuild(*args, **kwargs):
        raise AssertionError("the cache was rebuilt")
    monkeypatch.setattr(tasks, "_build_cache", no_rebuild)
    second = tasks.load_data(str(tmp_path / "corpus"), cache_dir=cache)
    assert np.array_equal(second.train, first.train) and np.array_equal(second.val, first.val)
    assert capsys.readouterr().out == ""
    monkeypatch.undo()
    path = next(iter(texts))                                        # a changed file: a new cache
    with open(path, "a") as f:
        f.write("more text\n")
    tasks.load_data(str(tmp_path / "corpus"), cache_dir=cache)
    assert len(os.listdir(cache)) == 4


def test_stdlib_corpus(tmp_path):
    d = tasks.load_data("stdlib", cache_dir=str(tmp_path))
    assert isinstance(d.train, np.memmap) and len(d.train) > 1_000_000 and len(d.val) > 10_000
    assert d.info["docs_val"] >= 1 and d.info["docs_train"] > 10 * d.info["docs_val"]
    assert d.train[0] == BYTES_EOT and d.val[0] == BYTES_EOT
    text = d.tokenizer.decode(np.asarray(d.val[:2000]).tolist())
    assert text.startswith("<|endoftext|>") and "site-packages" not in d.info["cache"]


def test_bad_data_inputs(tmp_path):
    (tmp_path / "empty").mkdir()
    load = tasks.load_data
    assert_one_line_error(DataError, lambda: load("wikitext"), "unknown data", "markov")
    assert_one_line_error(DataError, lambda: load(str(tmp_path / "missing.txt")), "no such file")
    assert_one_line_error(DataError, lambda: load(str(tmp_path / "empty")), "holds no files")
    assert_one_line_error(DataError, lambda: load(str(tmp_path / "*.nothing")), "no files match")
    assert_one_line_error(DataError, lambda: load("markov:k=8,beta=2"), "beta", "alpha")
    assert_one_line_error(DataError, lambda: load("markov:k=eight"), "int")
    assert_one_line_error(DataError, lambda: load("markov:k=1"), "k")
    assert_one_line_error(DataError, lambda: load("stdlib", val_fraction=1.5), "val_fraction")
    (tmp_path / "bin_only").mkdir()
    (tmp_path / "bin_only" / "x.dat").write_bytes(b"\x80\x81")
    assert_one_line_error(DataError, lambda: load(str(tmp_path / "bin_only"), cache_dir=str(tmp_path / "c")),
                          "UTF-8")
    assert not any(n.endswith(".tmp") for n in os.listdir(tmp_path / "c"))   # failed build cleaned up


# ---------------------------------------------------------------------------------- samplers

def test_random_windows_shift_and_resume():
    tokens = np.arange(5000, dtype=np.uint16) % 257
    s = RandomWindows(tokens, batch_size=4, seq_len=16, seed=3)
    x, y = s.next_batch()
    assert x.shape == y.shape == (4, 16) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    for row_x, row_y in zip(x, y):                         # each row is a real window of the stream
        start = int(np.flatnonzero(tokens == row_x[0].item())[0])
        assert np.array_equal(tokens[start:start + 17], torch.cat([row_x, row_y[-1:]]).numpy())
    s.next_batch()
    state = torch.load(_saved(s.state_dict()), weights_only=True)
    expected = [s.next_batch() for _ in range(3)]
    resumed = RandomWindows(tokens, batch_size=4, seq_len=16, seed=999)
    resumed.load_state_dict(state)
    for (ex, ey), (rx, ry) in zip(expected, [resumed.next_batch() for _ in range(3)]):
        assert torch.equal(ex, rx) and torch.equal(ey, ry)
    fresh = RandomWindows(tokens, batch_size=4, seq_len=16, seed=3)
    assert torch.equal(fresh.next_batch()[0], x)           # deterministic given seed


def _saved(state):
    import io
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return buf


def make_stream(lengths, eot=BYTES_EOT, seed=0):
    rng = np.random.default_rng(seed)
    docs = [rng.integers(0, 256, n).astype(np.uint16) for n in lengths]
    return np.concatenate([np.concatenate([[eot], d]) for d in docs]).astype(np.uint16), docs


def test_document_streams_chunks_follow_documents():
    seq_len, b = 8, 3
    lengths = [3, 40, 7, 100, 17, 8, 55, 25, 9, 64]
    tokens, docs = make_stream(lengths)
    s = DocumentStreams(tokens, BYTES_EOT, batch_size=b, seq_len=seq_len, seed=1)
    eligible = {i for i, n in enumerate(lengths) if n >= seq_len + 1}   # 8 and 7, 3 are skipped
    reads = [[] for _ in range(b)]                     # per row: list of (x chunks, y chunks)
    for step in range(60):
        x, y, new_doc = s.next_batch()
        assert x.shape == (b, seq_len) and new_doc.dtype == torch.bool
        assert torch.equal(x[:, 1:], y[:, :-1])
        if step == 0:
            assert new_doc.all()
        for r in range(b):
            if new_doc[r]:
                reads[r].append(([], []))
            reads[r][-1][0].append(x[r])
            reads[r][-1][1].append(y[r])
    seen = []
    for r in range(b):
        for xs, ys in reads[r][:-1]:                   # complete reads (the last may be unfinished)
            xs, ys = torch.cat(xs).numpy(), torch.cat(ys).numpy()
            assert np.array_equal(xs[1:], ys[:-1])                 # chunk k+1 continues chunk k
            doc = next(i for i, d in enumerate(docs) if np.array_equal(xs, d[:len(xs)]))
            assert doc in eligible and BYTES_EOT not in xs
            assert len(xs) == ((lengths[doc] - 1) // seq_len) * seq_len   # every full chunk, then move on
            seen.append(doc)
    assert set(seen) == eligible                      # short documents never appear, others all do


def test_document_streams_text_and_resume(tmp_path):
    texts = write_docs(tmp_path / "corpus", n=12)
    d = tasks.load_data(str(tmp_path / "corpus"), val_fraction=0.0, cache_dir=str(tmp_path / "c"))
    enc = d.tokenizer
    s = DocumentStreams(d.train, d.eot_token, batch_size=2, seq_len=10, seed=0)
    rows = {0: b"", 1: b""}
    for _ in range(3):                                 # every document here is >= 30 bytes
        x, _, new_doc = s.next_batch()
        for r in range(2):
            rows[r] += enc.decode_bytes(x[r].tolist())
    for r in range(2):                                 # the bytes of one document's text, no eot
        assert len(rows[r]) == 30 and b"<|endoftext|>" not in rows[r]
        assert any(t.encode().startswith(rows[r]) for t in texts.values())
    state = torch.load(_saved(s.state_dict()), weights_only=True)
    expected = [s.next_batch() for _ in range(100)]    # long enough to wrap into a second pass
    resumed = DocumentStreams(d.train, d.eot_token, batch_size=2, seq_len=10, seed=5)
    resumed.load_state_dict(state)
    for e, r in zip(expected, [resumed.next_batch() for _ in range(100)]):
        assert all(torch.equal(a, b) for a, b in zip(e, r))
    assert s.epoch >= 1
    with pytest.raises(DataError):
        DocumentStreams(d.train, d.eot_token, batch_size=2, seq_len=10_000, seed=0)


def test_eval_windows():
    tokens, _ = make_stream([50] * 20)
    w = tasks.eval_windows(tokens, n=8, length=30, seed=0)
    assert w.shape == (8, 30) and w.dtype == torch.int64
    assert torch.equal(w, tasks.eval_windows(tokens, n=8, length=30, seed=0))
    assert not torch.equal(w, tasks.eval_windows(tokens, n=8, length=30, seed=1))
    ws = tasks.eval_windows(tokens, n=10, length=51, seed=0, eot_token=BYTES_EOT)
    assert (ws[:, 0] == BYTES_EOT).all() and (ws[:, 1:] != BYTES_EOT).all()   # one whole document each
    assert len({tuple(r.tolist()) for r in ws}) == 10                          # distinct documents
    assert_one_line_error(DataError, lambda: tasks.eval_windows(tokens, 25, 51, eot_token=BYTES_EOT),
                          "documents")


# ---------------------------------------------------------------------------------- markov

def brute_force_bayes(window, k, alpha):
    nll, counts = [], {}
    for t in range(len(window) - 1):
        a, b = int(window[t]), int(window[t + 1])
        if a == k:
            nll.append(np.log(k))
            continue
        row = sum(counts.get((a, j), 0) for j in range(k))
        nll.append(-np.log((counts.get((a, b), 0) + alpha) / (row + k * alpha)))
        counts[(a, b)] = counts.get((a, b), 0) + 1
    return np.array(nll)


def test_markov_data():
    spec = "markov:k=5,alpha=0.2,doc_len=300,docs=40,val_docs=10"
    d = tasks.load_data(spec, seed=1)
    assert d.vocab_size == 6 and d.eot_token == 5 and d.tokenizer is None
    assert len(d.train) == 40 * 301 and len(d.val) == 10 * 301
    docs = d.train.reshape(40, 301)
    assert (docs[:, 0] == 5).all() and docs[:, 1:].max() < 5
    again = tasks.load_data(spec, seed=1)
    assert np.array_equal(again.train, d.train) and np.array_equal(again.val, d.val)
    assert not np.array_equal(tasks.load_data(spec, seed=2).train, d.train)
    assert not np.array_equal(d.val, d.train[:len(d.val)])
    tokens, P = tasks.sample_markov(5, 0.2, 300, 40, seed=1)
    assert np.allclose(P.sum(-1), 1.0) and (P >= 0).all()
    assert np.array_equal(tokens, docs[:, 1:])
    tokens10, _ = tasks.sample_markov(5, 0.2, 300, 10, seed=1)
    assert np.array_equal(tokens10, tokens[:10])      # document d does not depend on the count


def test_markov_bayes_nll_matches_brute_force():
    k, alpha = 4, 0.5
    d = tasks.load_data(f"markov:k={k},alpha={alpha},doc_len=60,docs=4,val_docs=6")
    w = tasks.eval_windows(d.val, n=6, length=61, seed=0, eot_token=d.eot_token)
    nll = d.optimal_nll(w)
    assert torch.is_tensor(nll) and nll.shape == (6, 60)
    for row, got in zip(w.numpy(), nll.numpy()):
        assert np.allclose(got, brute_force_bayes(row, k, alpha))
    assert np.allclose(nll[:, 0].numpy(), np.log(k))   # first token of a document: 1/K
    from_first = tasks.markov_bayes_nll(w.numpy()[:, 1:], k, alpha)   # numpy, starting at token 0
    assert isinstance(from_first, np.ndarray) and np.allclose(from_first, nll.numpy()[:, 1:])
    crossing = tasks.eval_windows(d.val, n=2, length=80, seed=0)
    crossing[:, 5] = k
    assert_one_line_error(DataError, lambda: tasks.markov_bayes_nll(crossing, k, alpha), "document")


def test_markov_bayes_nll_learns_in_context():
    k, alpha, doc_len = 8, 0.3, 1024
    tokens, P = tasks.sample_markov(k, alpha, doc_len, 64, seed=0, split="val")
    nll = tasks.markov_bayes_nll(torch.from_numpy(tokens), k, alpha).numpy()
    late = nll[:, doc_len // 2:].mean()
    assert nll[:, :8].mean() > late and late < np.log(k) - 0.3   # far below the uniform predictor
    # and, late in a document, close to (but above) the loss of knowing the true P
    true = -np.log(P[np.arange(64)[:, None], tokens[:, :-1], tokens[:, 1:]])[:, doc_len // 2:].mean()
    assert true < late < true + 0.05
