"""data.py, tasks.py and plumbing/babi.py: the two tokenizers (built-in bytes, a Hugging Face tokenizer.json), the
Markov process's exact Bayes floor, the samplers, the Sec. 5 task generators, bad inputs (corpora:
test_data.py)."""
import collections
import io
import json
import re
import sys

import numpy as np
import pytest
import torch

import data
import tasks
from plumbing import babi, files, tokenizers
from plumbing.babi import BABI_TASKS
from plumbing.filler import FILLER_SENTENCES
from conftest import CORPUS_TEXT
from data import DataError, DocumentStreams, RandomWindows, TaskSampler
from tasks import babi_mixture, babi_sample, passkey_sample

EOT = 256   # the bytes tokenizer's end-of-text id
BYTES = data.get_tokenizer("bytes")

def make_stream(lengths, eot=EOT, seed=0):   # [eot d1 eot d2 ...], documents of the given lengths
    docs = [np.random.default_rng([seed, i]).integers(0, 256, n) for i, n in enumerate(lengths)]
    return np.concatenate([np.concatenate([[eot], d]) for d in docs]).astype(np.uint16), docs

def corpus_stream(enc):
    text = [f"def f{i}(x):\n    return x + {i}\n\n# comment {i}\nclass C{i}:\n    pass\n" for i in range(300)]
    return np.array([t for d in text for t in [enc.eot_token] + enc.encode_ordinary(d)], dtype=np.uint16)

@pytest.fixture(params=["bytes", "bpe"])
def enc(request, tok_json):   # the generators must not rely on one token per byte
    return BYTES if request.param == "bytes" else data.get_tokenizer(tok_json)

def test_bytes_tokenizer():
    raw = bytes(np.random.default_rng(0).integers(0, 256, 4000, dtype=np.uint8))
    assert BYTES.encode_ordinary("héllo\n") == [104, 195, 169, 108, 108, 111, 10] and BYTES.n_vocab == 257
    assert BYTES.decode(list(raw)) == raw.decode(errors="replace")   # a byte cut from its character: U+FFFD
    text = "ascii, ünïcödé, 中文, 🐍𝄞, tabs\t\nNUL\x00 <|endoftext|> " * 20
    assert BYTES.encode_ordinary(text) == list(text.encode()) and BYTES.decode(list(text.encode())) == text
    assert BYTES.decode([EOT, 65]) == "<|endoftext|>A" and BYTES.encode_single_token(b"<|endoftext|>") == EOT

def test_tokenizer_json_encodes_exactly_as_the_tokenizers_library(tok_json, tmp_path, monkeypatch):
    import tokenizers   # the Hugging Face library (ours: plumbing.tokenizers)
    enc, ref = data.get_tokenizer(tok_json), tokenizers.Tokenizer.from_file(tok_json)
    assert enc.eot_token == ref.token_to_id("<|endoftext|>") == 1 and enc.n_vocab == ref.get_vocab_size() == 300
    for text in ["plain words", "  two  spaces\t\ttabs \n\n\nnewlines   \n",
                 "ünïcödé 中文 🐍 𝄞 é", "", " ", CORPUS_TEXT[:500], "x<|endoftext|>y <|pad|>"]:
        ids = enc.encode_ordinary(text)
        assert "<|" in text or ids == ref.encode(text).ids   # no special token: tokenizers' default encoding
        ref.encode_special_tokens = True   # a special token's text inside a document is plain text
        assert ids == ref.encode(text).ids and enc.decode(ids) == text
        ref.encode_special_tokens = False
    assert ref.encode("a<|endoftext|>b").ids[1] == enc.eot_token   # the file's special token is our eot
    assert enc.encode_single_token(tasks.COPY_SEP) != enc.encode_single_token(tasks.COPY_EOS)
    ref.add_special_tokens(["<|extra|>"])   # a token added after training (as GPT-NeoX's): an id of the vocabulary
    ref.save(str(tmp_path / "added.json"))
    assert data.get_tokenizer(str(tmp_path / "added.json")).n_vocab == 301
    monkeypatch.setitem(sys.modules, "tokenizers", None)   # the library is not installed
    (tmp_path / "other.json").write_text(open(tok_json).read())
    with pytest.raises(files.DataError, match="pip install tokenizers"):
        data.get_tokenizer(str(tmp_path / "other.json"))

def resumes_exactly(make, sampler, n=3):
    buf = io.BytesIO()   # the state goes through torch.save, as in a checkpoint
    torch.save(sampler.state_dict(), buf)
    buf.seek(0)
    expected, resumed = [sampler.next_batch() for _ in range(n)], make(seed=999)
    resumed.load_state_dict(torch.load(buf, weights_only=True))
    return all(a is b is None or torch.equal(a, b) for e in expected for a, b in zip(e, resumed.next_batch()))

def test_random_windows_and_eval_windows():
    tokens = np.arange(5000, dtype=np.uint16)
    s = RandomWindows(tokens, batch_size=4, seq_len=16, seed=3)
    x, y, new_doc = s.next_batch()
    assert x.shape == y.shape == (4, 16) and x.dtype == torch.int64 and torch.equal(x[:, 1:], y[:, :-1])
    assert (torch.diff(torch.cat([x, y[:, -1:]], 1)) == 1).all()   # each row is a window of the stream
    assert new_doc is None and resumes_exactly(lambda seed: RandomWindows(tokens, 4, 16, seed), s)
    assert torch.equal(RandomWindows(tokens, 4, 16, seed=3).next_batch().x, x)
    short = RandomWindows(tokens[:18], batch_size=4, seq_len=16)   # starts 0 and 1 fit, the last one too
    assert {int(short.next_batch().x[r, 0]) for _ in range(10) for r in range(4)} == {0, 1}
    assert RandomWindows(tokens[:17], 2, 16).next_batch().x[:, 0].tolist() == [0, 0]   # exactly one fits
    stream, _ = make_stream([50] * 20)
    w = data.eval_windows(stream, n=8, length=30, seed=0)
    assert w.shape == (8, 30) and torch.equal(w, data.eval_windows(stream, 8, 30, seed=0))
    assert not torch.equal(w, data.eval_windows(stream, 8, 30, seed=1))
    ws = data.eval_windows(stream, n=10, length=51, seed=0, eot_token=EOT)
    assert (ws[:, 0] == EOT).all() and (ws[:, 1:] != EOT).all() and len({tuple(r.tolist()) for r in ws}) == 10

@pytest.mark.parametrize("n, length, size", [(64, 1025, 70_000), (7, 3, 21), (5, 10, 52), (1, 20, 20)])
def test_eval_windows_never_share_a_token(n, length, size):
    # the standard errors and paired tests treat the windows as independent samples: no token in two
    tokens = np.arange(size, dtype=np.int64)   # a token is its own position
    for seed in range(20):
        w = data.eval_windows(tokens, n, length, seed)
        assert w.shape == (n, length) and (torch.diff(w, dim=1) == 1).all()   # each a run of the stream
        assert len(set(w.flatten().tolist())) == n * length and int(w.max()) < size
    if size == n * length:   # exactly enough: the windows tile the split
        assert sorted(w[:, 0].tolist()) == list(range(0, size, length))

def test_eval_windows_cover_the_split_uniformly():
    # every placement of 2 disjoint windows of 3 in 8 tokens (6 of them) is equally likely, the ends too
    tokens = np.arange(8)
    seen = collections.Counter(tuple(sorted(data.eval_windows(tokens, 2, 3, seed)[:, 0].tolist()))
                               for seed in range(4000))
    assert len(seen) == 6 and min(seen.values()) > 580 and max(seen.values()) < 760   # 667 each
    assert seen[(0, 5)] > 580 and seen[(0, 3)] > 580   # the first and last starts, and windows that touch
    orders = {tuple(data.eval_windows(tokens, 2, 3, seed)[:, 0].tolist()) for seed in range(50)}
    assert (0, 5) in orders and (5, 0) in orders   # rows in a random order, not sorted by place

def test_eval_windows_of_documents_stay_inside_them():
    tokens, _ = make_stream([10, 40, 5, 60, 50])   # documents of 11, 41, 6, 61, 51 tokens with their eot
    holding = {tuple(tokens[s:s + 41].tolist()) for s in (11, 58, 119)}   # the 41-, 61- and 51-token ones
    for seed in range(30):
        w = data.eval_windows(tokens, 3, 41, seed, eot_token=EOT)
        assert {tuple(r.tolist()) for r in w} == holding   # each a distinct document that holds all of it
    with pytest.raises(data.DataError, match="only 3 documents hold a window of 41 tokens, 4 asked"):
        data.eval_windows(tokens, 4, 41, eot_token=EOT)

@pytest.mark.parametrize("eot_after", [False, True], ids=["eot_before", "eot_after"])
def test_document_streams_keep_the_eot_and_flag_exactly_the_new_documents(eot_after):
    seq_len, b = 8, 3
    tokens, docs = make_stream([30, 40, 7, 100, 17, 8, 55, 25, 3, 64])
    if eot_after:   # [d1 eot d2 eot ...]: the first document has no eot, the last eot starts nothing
        tokens = np.append(tokens[1:], EOT).astype(np.uint16)
    docs = [np.append([] if eot_after and i == 0 else [EOT], d).astype(np.int64) for i, d in enumerate(docs)]
    s = DocumentStreams(tokens, EOT, batch_size=b, seq_len=seq_len, seed=1)
    reads, seen = [[] for _ in range(b)], []
    for step in range(60):
        x, y, new_doc = s.next_batch()
        assert torch.equal(x[:, 1:], y[:, :-1]) and (step or new_doc.all())
        for r in range(b):
            assert new_doc[r] == (x[r, 0] == EOT) or (eot_after and x[r].tolist() == docs[0][:8].tolist())
            if new_doc[r]:
                reads[r].append([])
            reads[r][-1].append(torch.cat([x[r], y[r, -1:]]).numpy())
    for r in range(b):
        for chunks in reads[r][:-1]:                     # every complete read of a document
            assert all(a[-1] == c[0] for a, c in zip(chunks, chunks[1:]))  # chunk k+1 starts where k ends
            read = np.concatenate([chunks[0]] + [c[1:] for c in chunks[1:]])
            doc = next(i for i, d in enumerate(docs) if np.array_equal(read, d[:len(read)]))
            assert len(read) == ((len(docs[doc]) - 1) // seq_len) * seq_len + 1   # every full chunk, then on
            seen.append(doc)
    assert set(seen) == {i for i, d in enumerate(docs) if len(d) > seq_len}   # short documents are skipped
    assert resumes_exactly(lambda seed: DocumentStreams(tokens, EOT, b, seq_len, seed), s, n=40) and s.epoch

def test_markov_data_and_sampler():
    spec = "markov:k=5,alpha=0.2,doc_len=300,docs=40,val_docs=10"
    d = data.load_data(spec, seed=1)
    assert d.vocab_size == 6 and d.eot_token == 5 and d.tokenizer is None and len(d.val) == 10 * 301
    docs = d.train.reshape(40, 301)
    assert (docs[:, 0] == 5).all() and docs[:, 1:].max() < 5 and not np.array_equal(d.val, d.train[:3010])
    assert np.array_equal(data.load_data(spec, seed=1).val, d.val)
    assert not np.array_equal(data.load_data(spec, seed=2).train, d.train)
    tokens, P = data.sample_markov(5, 0.2, 300, 40, seed=1)
    assert np.allclose(P.sum(-1), 1.0) and np.array_equal(tokens, docs[:, 1:])
    assert np.array_equal(data.sample_markov(5, 0.2, 300, 10, seed=1)[0], tokens[:10])  # whatever the count

def test_markov_floor_by_hand_by_brute_force_in_context_and_shared():
    # k = 2, eot = 2, prior pseudo-counts [[1, 3], [2, 2]] (not alpha = 0.3), each row counting its own
    # bigrams. eot 0 1 0 0: eot->0: 1/2 (first token uniform, no bigram); 0->1: 3/4; 1->0: 2/4; 0->0: row 0
    # is now [1, 3+1]: 1/5. 1 1 0 1 1 (from a document's first token): 1->1: 2/4; 1->0: [2, 2+1]: 2/5; 0->1:
    # 3/4; 1->1: [2+1, 3]: 3/6
    nll = data.markov_bayes_nll(np.array([[2, 0, 1, 0, 0], [1, 1, 0, 1, 1]]), k=2, alpha=0.3,
                                prior=[[1, 3], [2, 2]])
    np.testing.assert_allclose(nll, -np.log([[1 / 2, 3 / 4, 2 / 4, 1 / 5], [2 / 4, 2 / 5, 3 / 4, 3 / 6]]))
    for bad in [0, 1, 0], [[0]], [[0, 3]], [[0, -1]], [[2, 0, 2, 1]]:   # shapes, ids (k = 2: 0-2), eot inside
        with pytest.raises(data.DataError):
            data.markov_bayes_nll(np.array(bad), k=2, alpha=0.3)
    k, alpha = 4, 0.5
    d = data.load_data(f"markov:k={k},alpha={alpha},doc_len=60,docs=4,val_docs=6")
    w = data.eval_windows(d.val, n=6, length=61, seed=0, eot_token=d.eot_token)
    got = d.optimal_nll(w)
    assert torch.is_tensor(got) and got.shape == (6, 60)
    for row, nll in zip(w.tolist(), got.numpy()):   # counting bigrams by hand, with the uniform first token
        counts, want = np.zeros((k, k)), [np.log(k)]
        for a, b in zip(row[1:], row[2:]):
            want.append(np.log(counts[a].sum() + k * alpha) - np.log(counts[a, b] + alpha))
            counts[a, b] += 1
        np.testing.assert_allclose(nll, want)
    np.testing.assert_allclose(data.markov_bayes_nll(w.numpy()[:, 1:], k, alpha), got.numpy()[:, 1:])
    # long documents: the floor learns each one's matrix P in context; documents drawn around a shared G
    k, alpha, doc_len = 8, 0.3, 1024
    tokens, P = data.sample_markov(k, alpha, doc_len, 64, seed=0, split="val")
    nll = data.markov_bayes_nll(torch.from_numpy(tokens), k, alpha).numpy()
    late = nll[:, doc_len // 2:].mean()
    true = -np.log(P[np.arange(64)[:, None], tokens[:, :-1], tokens[:, 1:]])[:, doc_len // 2:].mean()
    assert nll[:, :8].mean() > late and true < late < true + 0.05   # close to knowing P, from above
    g = data.markov_prior(8, 0.3, shared=1.0, seed=0)               # the base matrix G itself
    assert np.allclose(g.sum(1), 1.0) and (data.markov_prior(8, 0.3) == 0.3).all()
    spread = [np.abs(data.sample_markov(8, 0.3, 4, 64, seed=0, shared=c)[1] - g).mean() for c in (1.0, 100.0)]
    assert spread[1] < 0.3 * spread[0]                                # larger C: documents closer to G
    d = data.load_data("markov:k=4,alpha=0.5,doc_len=64,docs=8,val_docs=4,shared=3")
    w = d.val[:65].astype(np.int64)[None]
    assert np.array_equal(d.optimal_nll(w), data.markov_bayes_nll(w, 4, 0.5, data.markov_prior(4, 0.5, 3.0)))

def check_sample(s, length, answer_text, enc):
    tokens, mask, meta = s
    n = int(mask.sum())
    assert len(tokens) == length and tokens.dtype == np.int64 and n and mask[-n:].all()
    assert enc.decode(tasks.split_answer(s)[1].tolist()) == answer_text
    assert tokens[0] == enc.eot_token and enc.eot_token not in tokens[1:].tolist()
    return enc.decode(tokens.tolist())

def test_passkey_copy_and_babi_sample_structure(enc):
    n = lambda text: len(enc.encode_ordinary(text))   # noqa: E731
    for length, depth in [(200, 0.0), (1000, 0.25), (4097, 0.5), (4097, 1.0)]:
        s = passkey_sample(enc, length, depth, seed=length)
        key, k, sentence = s.meta["key"], s.meta["key_start"], tasks.PASSKEY_SENTENCE.format(**s.meta)
        text = check_sample(s, length, f" {key}.", enc)
        assert text.endswith(f"{tasks.PASSKEY_QUESTION} {key}.") and text.count(sentence) == 1
        assert s.tokens[k:k + n(sentence)].tolist() == enc.encode_ordinary(sentence) and len(key) == 5
        budget = length - 1 - n(sentence) - n(tasks.PASSKEY_QUESTION) - n(f" {key}.")
        assert abs((k - 1) - depth * budget) <= max(map(n, FILLER_SENTENCES))
        after = enc.decode(s.tokens[k + n(sentence):].tolist())   # the key sits between whole sentences
        assert after.startswith(FILLER_SENTENCES + (tasks.PASSKEY_QUESTION,))
    sep, eos = enc.encode_single_token(tasks.COPY_SEP), enc.encode_single_token(tasks.COPY_EOS)
    for L in [1, 50, 300]:
        s = tasks.copy_sample(enc, L, seed=L)
        check_sample(s, 2 * L + 3, s.meta["answer"] + tasks.COPY_EOS.decode(), enc)
        assert s.tokens[L + 1] == sep and s.tokens[-1] == eos and s.answer_mask.sum() == L + 1
        assert np.array_equal(s.tokens[1:L + 1], s.meta["target"])
        assert enc.decode(s.meta["target"]) == s.meta["answer"]
    assert set(tasks.copy_sample(enc, 3000, seed=0).meta["answer"]) == set(tasks.COPY_ALPHABET)
    corpus = corpus_stream(enc)
    for i, task in enumerate(BABI_TASKS):
        for length, filler in [(400, None), (3000, corpus)]:
            s = babi_sample(task, enc, length, seed=i, filler_tokens=filler)
            text = check_sample(s, length, f" {s.meta['answer']}.", enc)
            assert text.endswith(f"\nQuestion: {s.meta['question']}\nAnswer: {s.meta['answer']}.")
            assert s.meta["fact_starts"] == sorted(s.meta["fact_starts"])
            for e, start in zip(s.meta["events"], s.meta["fact_starts"]):
                piece = enc.encode_ordinary(f" {e['text']}" if filler is None else f"{e['text']}\n")
                assert s.tokens[start:start + len(piece)].tolist() == piece
                assert filler is None or start == 1 or enc.decode([int(s.tokens[start - 1])]).endswith("\n")

def test_generators_are_pure_functions_of_their_seed():
    # (equal seeds give equal samples: the TaskSampler test below, for all three generators)
    assert len({passkey_sample("bytes", 300, 0.5, seed=s).meta["key"] for s in range(50)}) > 45
    depths = [passkey_sample("bytes", 300, None, seed=s).meta["depth"] for s in range(200)]
    assert min(depths) < 0.1 and max(depths) > 0.9
    assert len({passkey_sample("bytes", n, d, seed=3).meta["key"] for n in [200, 2000] for d in [0, 1]}) == 1
    lengths = {tasks.copy_sample("bytes", (50, 100), seed=s).meta["length"] for s in range(300)}
    assert min(lengths) == 50 and max(lengths) == 100
    corpus = corpus_stream(BYTES)
    a = babi_sample("qa2", "bytes", 800, seed=11, filler_tokens=corpus)
    assert np.array_equal(a.tokens, babi_sample("qa2", "bytes", 800, seed=11, filler_tokens=corpus).tokens)
    with pytest.raises(DataError, match="needed") as e:   # filler of exactly the tokens needed: all of it
        babi_sample("qa2", "bytes", 800, seed=11, filler_tokens=corpus[:1])
    n = int(re.search(r"(\d+) needed", str(e.value))[1])
    assert len(babi_sample("qa2", "bytes", 800, seed=11, filler_tokens=corpus[:n]).tokens) == 800
    assert babi_sample("qa2", "bytes", 400, seed=11).meta["events"] == a.meta["events"]   # one story per seed
    starts = np.concatenate([babi_sample("qa1", BYTES, 4000, seed=s).meta["fact_starts"] for s in range(20)])
    assert starts.min() < 1000 and starts.max() > 3000                 # facts spread through the filler
    assert {babi_sample(None, "bytes", 500, seed=s).meta["task"] for s in range(100)} == set(BABI_TASKS)

def derive_answer(events, asked):
    """The answer re-derived from the event log by code independent of the simulation, checking its rules."""
    loc, holder, lies, trail = {}, {}, {}, {}   # trail: the distinct places each object has been in
    for e in (e for e in events if e["kind"] != "relation"):
        p, kind, o = e["person"], e["kind"], e.get("obj")
        if kind == "move":
            loc[p] = e["place"]
        elif kind in ("not_in", "either"):
            loc.pop(p, None)
        elif kind == "grab":
            assert p in loc and holder.get(o) is None and lies.get(o, loc[p]) == loc[p]
            holder[o], _ = p, lies.pop(o, None)
        elif kind == "drop":
            assert holder.get(o) == p
            holder[o], lies[o] = None, loc[p]
        elif kind == "give":
            assert holder.get(o) == p and e["other"] != p and loc[p] == loc[e["other"]]
            holder[o] = e["other"]
        assert all(list(holder.values()).count(h) <= babi.MAX_CARRIED for h in holder.values() if h)
        for x in set(holder) | set(lies):
            place = loc.get(holder[x]) if holder.get(x) else lies.get(x)
            if not trail.get(x) or trail[x][-1] != place:
                trail.setdefault(x, []).append(place)
    kind, who, obj = asked["kind"], asked.get("person"), asked.get("obj")
    held = sorted(o for o, h in holder.items() if h == who)
    if kind in ("where_person", "where_object"):   # an object: where its holder is, or where it lies
        return loc[who] if kind == "where_person" else loc.get(holder.get(obj)) or lies[obj]
    if kind == "where_before":
        places = trail[obj]
        assert places.count(asked["place"]) == 1 and places.index(asked["place"]) > 0, "ambiguous question"
        return places[places.index(asked["place"]) - 1]
    if kind in ("count_carried", "list_carried"):
        return babi.BABI_NUMBERS[len(held)] if kind == "count_carried" else ",".join(held) or "nothing"
    if kind in ("what_is_dir_of", "what_is_x_dir_of"):   # lay the places on a grid from the stated relations
        pos = {events[0]["place2"]: (0, 0)}
        for _ in events:
            for e in events:
                dx, dy = babi.BABI_DIRECTIONS[e["direction"]]
                if e["place2"] in pos:
                    pos.setdefault(e["place"], (pos[e["place2"]][0] + dx, pos[e["place2"]][1] + dy))
                elif e["place"] in pos:
                    pos.setdefault(e["place2"], (pos[e["place"]][0] - dx, pos[e["place"]][1] - dy))
        assert len(set(pos.values())) == len(pos), "two places on one cell"
        (x, y), (dx, dy) = pos[asked["place"]], babi.BABI_DIRECTIONS[asked["direction"]]
        sign = 1 if kind == "what_is_dir_of" else -1
        return next(p for p, c in pos.items() if c == (x + sign * dx, y + sign * dy))
    if kind in ("who_gave", "what_given", "given_to", "who_received"):
        field = dict(who_gave="person", what_given="obj", given_to="other", who_received="other")[kind]
        found = {e[field] for e in events if all(e.get(k) == v for k, v in dict(asked, kind="give").items())}
        assert len(found) == 1, "the question must have one answer"
        return found.pop()
    assert kind == "is_in"
    last = [e for e in events if e["person"] == who and e["kind"] in ("move", "not_in", "either")][-1]
    if last["kind"] == "not_in":
        assert last["place"] == asked["place"], "a 'not in' fact only answers about its place"
    if last["kind"] == "either" and asked["place"] in (last["place"], last["place2"]):
        return "maybe"
    return "yes" if last["kind"] == "move" and last["place"] == asked["place"] else "no"

@pytest.mark.parametrize("task", list(BABI_TASKS))
def test_babi_answers_follow_from_the_event_log(task):
    stories = [babi.babi_story(task, seed) for seed in range(200)]
    for events, question, answer, asked in stories:
        assert derive_answer(events, asked) == answer, (task, question, events)
        for e in events:   # the sentence says what the event is
            assert all(str(v) in e["text"] for k, v in e.items() if k not in ("kind", "text"))
    answers, kinds = {s[2] for s in stories}, {s[3]["kind"] for s in stories}
    assert len(answers) >= 2 and (task not in ("qa6", "qa9") or answers == {"yes", "no"})
    assert task != "qa10" or answers == {"yes", "no", "maybe"}
    assert task != "qa5" or kinds == {"who_gave", "what_given", "given_to", "who_received"}

def test_task_sampler_batches_right_padded_with_the_loss_on_the_answer():
    corpus = corpus_stream(BYTES)
    for fn, kwargs in [(passkey_sample, dict(length=257)), (tasks.copy_sample, dict(length=(5, 9))),
                       (babi_mixture, dict(babi_tasks=("qa1", "qa2"), length=513, filler_tokens=corpus))]:
        sampler = TaskSampler(fn, 4, seed=3, tokenizer="bytes", **kwargs)
        samples = TaskSampler(fn, 4, seed=3, tokenizer="bytes", **kwargs).next_samples()
        assert np.array_equal(samples[1].tokens, fn(seed=[3, 0, 1, 1], tokenizer="bytes", **kwargs).tokens)
        x, y, new_doc = sampler.next_batch()
        assert new_doc is None
        for row, s in enumerate(samples):   # each row: the example from its first token, then eot padding
            n = len(s.tokens)
            full = torch.cat([x[row], torch.where(y[row, -1:] == -100, EOT, y[row, -1:])])  # -100: a pad
            assert torch.equal(full[:n], torch.as_tensor(s.tokens)) and (full[n:] == EOT).all()
            # the loss (test_task_finetune.py) is on the answer tokens only: the other targets are -100
            assert np.array_equal(y[row] != -100, np.r_[s.answer_mask, [False] * (len(full) - n)][1:])
        assert resumes_exactly(lambda seed: TaskSampler(fn, 4, seed, tokenizer=BYTES, **kwargs), sampler, n=2)

def test_scores():
    assert tasks.exact_match(" 12345.", "12345") and not tasks.exact_match("kitchen garden", "kitchen")
    assert tasks.exact_match("  Kitchen. ", "kitchen") and tasks.exact_match("apple, milk", "apple,milk.")
    assert not tasks.exact_match("milk,apple", "apple,milk") and not tasks.exact_match("", "yes")
    assert tasks.cut_answer(" 12345. What is") == " 12345."
    assert tasks.cut_answer(" garden\nQuestion: x") == " garden" and tasks.cut_answer(" maybe") == " maybe"
    assert tasks.copy_scores([1, 2, 3, 4, 9], [1, 2, 3, 4]) == (1.0, True)          # extra tokens ignored
    assert tasks.copy_scores(torch.tensor([1, 0, 3, 0]), [1, 2, 3, 4]) == (0.5, False)
    assert tasks.copy_scores([1, 2], [1, 2, 3, 4]) == (0.5, False)

@pytest.fixture(scope="module")
def bad(tmp_path_factory, tok_json):   # a folder of bad files
    d = tmp_path_factory.mktemp("bad")
    (d / "empty").mkdir()
    (d / "bad.json").write_text("{not json")
    spec = json.load(open(tok_json))
    spec["added_tokens"] = [t for t in spec["added_tokens"] if t["content"] != "<|endoftext|>"]
    (d / "no_eot.json").write_text(json.dumps(spec))
    return d

STREAM = make_stream([50] * 20)[0]
BAD_INPUTS = [   # (call on the folder of bad files, key words of its one-line error)
    (lambda d: data.load_data("wikitext"), "no such file or directory", "markov"),
    (lambda d: data.load_data(str(d / "*.txt")), "pass a directory"),
    (lambda d: data.load_data(str(d / "empty")), "holds no files"),
    (lambda d: data.load_data(None), "data"), (lambda d: data.load_data("stdlib", seed=-1), "seed"),
    (lambda d: data.load_data("stdlib", val_fraction=1.5), "val_fraction"),
    (lambda d: data.load_data("markov:k=8,beta=2"), "beta", "alpha="),
    (lambda d: data.load_data("markov:k=eight"), "k=eight"),
    (lambda d: data.load_data("markov:k=1"), "2 <= k"),
    (lambda d: data.load_data("markov:shared=-1"), "shared >= 0"),
    (lambda d: data.get_tokenizer("gpt5"), "unknown tokenizer", "tokenizer.json"),
    (lambda d: data.get_tokenizer(None), "unknown tokenizer"),
    (lambda d: data.get_tokenizer(str(d / "missing.json")), "unknown tokenizer"),
    (lambda d: data.get_tokenizer(str(d / "bad.json")), "not a readable tokenizer.json"),
    (lambda d: data.get_tokenizer(str(d / "no_eot.json")), "<|endoftext|>"),
    (lambda d: data.markov_bayes_nll(np.array([[0, 9]]), 4, 0.5), "0..4"),
    (lambda d: data.markov_bayes_nll(np.array([[4, 0, 4, 1]]), 4, 0.5), "document boundary"),
    (lambda d: data.eval_windows(STREAM, 25, 51, eot_token=EOT), "documents"),
    (lambda d: data.eval_windows(STREAM, 4, 5000), "4 disjoint windows of 5000 need 20000", "fewer"),
    (lambda d: data.eval_windows(np.arange(21), 2, 11), "2 disjoint windows of 11 need 22 tokens, the split "
     "holds 21"),   # one token short
    (lambda d: RandomWindows(STREAM, 4, 5000).next_batch(), "5001 >", "shorten"),
    (lambda d: DocumentStreams(STREAM, EOT, 2, 60), "no document"),
    (lambda d: passkey_sample("bytes", 50, 0.5), "too short"),
    (lambda d: passkey_sample("bytes", 500, 1.5), "depth"),
    (lambda d: passkey_sample("bytes", 50.5), "length"), (lambda d: tasks.copy_sample("bytes", 0), "length"),
    (lambda d: tasks.copy_sample("bytes", (9, 3)), "lo <= hi"),
    (lambda d: babi_sample("qa3", "bytes", 60), "too short"),
    (lambda d: babi_sample("qa11", "bytes", 500), "unknown bAbI task"),
    (lambda d: babi_sample("qa1", "bytes", 2000, filler_tokens=np.arange(100)), "filler"),
    (lambda d: babi_sample("qa1", "bytes", 2000, filler_tokens=np.full(3000, 300)), "same tokenizer"),
    (lambda d: babi_mixture("bytes", 100, 0, ("qa3",)), "--seq-len"),
]

@pytest.mark.parametrize("case", BAD_INPUTS, ids=range(len(BAD_INPUTS)))
def test_bad_inputs_are_one_line_errors(case, bad):
    with pytest.raises(DataError) as info:
        case[0](bad)
    assert "\n" not in str(info.value) and all(w in str(info.value) for w in case[1:]), str(info.value)
