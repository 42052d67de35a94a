"""Long-context task generators of tasks.py: passkey, synthetic copying, BABILong-style bAbI."""
import numpy as np
import pytest
import tiktoken
import torch
import torch.nn.functional as F

import tasks
from tasks import (BABI_TASKS, DataError, TaskSampler, babi_sample, babi_story, collate, copy_sample,
                   copy_scores, cut_answer, exact_match, passkey_digit_accuracy, passkey_sample,
                   split_answer)

ENC = tasks.get_tokenizer("bytes")


def toy_bpe():
    """A small tokenizer WITH merges, so the tests do not rely on one token = one byte
    (real BPE vocabularies are not available offline)."""
    ranks = {bytes([i]): i for i in range(256)}
    for piece in [b"th", b"the", b" the", b"he", b"in", b"er", b" p", b"ss", b"ass", b" pass",
                  b"ke", b" ke", b" key", b"12", b"45", b"\n\n", b"is", b" is", b"  "]:
        ranks[piece] = len(ranks)
    pattern = r"""'s|'t| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
    return tiktoken.Encoding(name="toy_bpe", pat_str=pattern, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": len(ranks)})


def text_of(tokens, enc=ENC):
    return enc.decode(np.asarray(tokens).tolist())


def check_answer_at_end(sample, answer_text, enc=ENC):
    tokens, mask, meta = sample
    assert tokens.dtype == np.int64 and mask.dtype == bool and tokens.shape == mask.shape
    n = int(mask.sum())
    assert n > 0 and mask[-n:].all() and not mask[:-n].any(), "the answer must be the last tokens"
    prompt, answer = split_answer(sample)
    assert text_of(answer, enc) == answer_text
    assert len(prompt) + len(answer) == len(tokens)
    assert tokens[0] == enc.eot_token and enc.eot_token not in tokens[1:].tolist()


# ----------------------------------------------------------------------------------------------
# Passkey
# ----------------------------------------------------------------------------------------------

def max_sentence_tokens(enc):
    return max(len(enc.encode_ordinary(s)) for s in tasks.FILLER_SENTENCES)


@pytest.mark.parametrize("enc", [ENC, toy_bpe()], ids=["bytes", "toy_bpe"])
def test_passkey_structure_and_depth(enc):
    for length in [200, 1000, 4097]:
        for depth in [0.0, 0.1, 0.25, 0.5, 0.9, 1.0]:
            s = passkey_sample(enc, length, depth, seed=length)
            tokens, mask, meta = s
            key = meta["key"]
            assert len(tokens) == length and len(key) == 5 and key.isdigit() and meta["answer"] == key
            check_answer_at_end(s, f" {key}.", enc)
            text = text_of(tokens, enc)
            assert text.endswith(f" What is the pass key? The pass key is {key}.")
            needle = tasks.PASSKEY_SENTENCE.format(key=key)
            assert text.count(needle) == 1
            # key_start points at the needle's tokens, and sits at the requested depth of the filler
            # within one sentence (it snaps to the nearest sentence boundary).
            needle_ids = enc.encode_ordinary(needle)
            k = meta["key_start"]
            assert tokens[k:k + len(needle_ids)].tolist() == needle_ids
            budget = length - 1 - len(needle_ids) - len(enc.encode_ordinary(tasks.PASSKEY_QUESTION)) \
                - len(enc.encode_ordinary(f" {key}."))
            assert abs((k - 1) - depth * budget) <= max_sentence_tokens(enc)
            assert abs(meta["actual_depth"] * budget - (k - 1)) < 1e-6
            # the needle sits between whole filler sentences: what follows it is a filler sentence
            # or the question
            after = text_of(tokens[k + len(needle_ids):], enc)
            assert any(after.startswith(x) for x in tasks.FILLER_SENTENCES + (tasks.PASSKEY_QUESTION,))


def test_passkey_deterministic_and_seeds_differ():
    a, b = passkey_sample("bytes", 500, None, seed=7), passkey_sample("bytes", 500, None, seed=7)
    assert np.array_equal(a.tokens, b.tokens) and a.meta == b.meta
    keys = {passkey_sample("bytes", 300, 0.5, seed=s).meta["key"] for s in range(50)}
    assert len(keys) > 45
    depths = [passkey_sample("bytes", 300, None, seed=s).meta["depth"] for s in range(200)]
    assert min(depths) < 0.1 and max(depths) > 0.9   # random depth covers [0, 1]
    # one seed = one key over a whole length x depth grid
    assert len({passkey_sample("bytes", n, d, seed=3).meta["key"] for n in [200, 2000] for d in [0, 1]}) == 1
    assert not np.array_equal(passkey_sample("bytes", 500, 0.5, seed=1).tokens,
                              passkey_sample("bytes", 500, 0.5, seed=2).tokens)


def test_passkey_bad_inputs():
    with pytest.raises(ValueError, match="too short"):
        passkey_sample("bytes", 50, 0.5, seed=0)
    with pytest.raises(ValueError, match="depth"):
        passkey_sample("bytes", 500, 1.5, seed=0)


# ----------------------------------------------------------------------------------------------
# Copying
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("enc", [ENC, toy_bpe()], ids=["bytes", "toy_bpe"])
def test_copy_structure(enc):
    sep, eos = enc.encode_single_token(tasks.COPY_SEP), enc.encode_single_token(tasks.COPY_EOS)
    alphabet_ids = {enc.encode_single_token(c.encode()) for c in tasks.COPY_ALPHABET}
    for L in [1, 50, 300]:
        s = copy_sample(enc, L, seed=L)
        tokens, mask, meta = s
        assert len(tokens) == 2 * L + 3 and meta["length"] == L
        assert tokens[0] == enc.eot_token and tokens[L + 1] == sep and tokens[-1] == eos
        first, second = tokens[1:L + 1], tokens[L + 2:2 * L + 2]
        assert np.array_equal(first, second) and np.array_equal(first, meta["target"])
        assert set(first.tolist()) <= alphabet_ids
        assert text_of(first, enc) == meta["answer"]
        # loss on the copy and its end marker only
        assert mask.sum() == L + 1 and mask[L + 2:].all() and not mask[:L + 2].any()
        check_answer_at_end(s, meta["answer"] + tasks.COPY_EOS.decode(), enc)
    big = copy_sample(enc, 3000, seed=0).meta["target"]
    assert len(set(big.tolist())) == len(tasks.COPY_ALPHABET)   # every symbol is used


def test_copy_lengths_alphabets_determinism():
    lengths = {copy_sample("bytes", (50, 100), seed=s).meta["length"] for s in range(300)}
    assert min(lengths) == 50 and max(lengths) == 100
    s = copy_sample("bytes", 40, seed=0, alphabet="01")
    assert set(s.meta["answer"]) <= {"0", "1"}
    ids = copy_sample("bytes", 40, seed=0, alphabet=[200, 201, 202]).meta["target"]
    assert set(ids.tolist()) <= {200, 201, 202}
    a, b = copy_sample("bytes", 60, seed=5), copy_sample("bytes", 60, seed=5)
    assert np.array_equal(a.tokens, b.tokens)
    assert not np.array_equal(a.tokens, copy_sample("bytes", 60, seed=6).tokens)
    with pytest.raises(ValueError):
        copy_sample("bytes", 0, seed=0)


# ----------------------------------------------------------------------------------------------
# bAbI: labels re-derived from the event log, by code independent of the simulation
# ----------------------------------------------------------------------------------------------

def replay(events):
    """Walk the story, checking the world's rules, -> (person place, holder, where free objects lie,
    each object's place after every event). Raises AssertionError on an impossible event."""
    loc, holder, lies, trail = {}, {}, {}, {}
    for e in events:
        p, kind = e["person"], e["kind"]
        if kind == "move":
            loc[p] = e["place"]
        elif kind in ("not_in", "either"):
            loc.pop(p, None)
        elif kind == "grab":
            assert p in loc and holder.get(e["obj"]) is None
            assert lies.get(e["obj"], loc[p]) == loc[p], "picked up where the object is not"
            holder[e["obj"]] = p
            lies.pop(e["obj"], None)
        elif kind == "drop":
            assert holder.get(e["obj"]) == p
            holder[e["obj"]] = None
            lies[e["obj"]] = loc[p]
        elif kind == "give":
            assert holder.get(e["obj"]) == p and e["other"] != p and loc[p] == loc[e["other"]]
            holder[e["obj"]] = e["other"]
        for o in set(holder) | set(lies):
            place = loc.get(holder[o]) if holder.get(o) else lies.get(o)
            trail.setdefault(o, []).append(place)
    return loc, holder, lies, trail


def derive_answer(events, asked):
    kind = asked["kind"]
    if kind == "where_person":
        return [e for e in events if e["person"] == asked["person"]][-1]["place"]
    if kind in ("where_object", "where_before", "count_carried", "list_carried"):
        loc, holder, lies, trail = replay(events)
        if kind == "where_object":
            o = asked["obj"]
            return loc[holder[o]] if holder.get(o) else lies[o]
        if kind == "where_before":
            places = [x for i, x in enumerate(trail[asked["obj"]]) if i == 0 or x != trail[asked["obj"]][i - 1]]
            assert places.count(asked["place"]) == 1, "the question must be unambiguous"
            i = places.index(asked["place"])
            assert i > 0
            return places[i - 1]
        held = sorted(o for o, h in holder.items() if h == asked["person"])
        if kind == "count_carried":
            return tasks.BABI_NUMBERS[len(held)]
        return ",".join(held) or "nothing"
    if kind in ("what_is_dir_of", "what_is_x_dir_of"):
        # Lay the places out on a grid from the stated relations, then read the asked neighbour.
        step = {"north": (0, 1), "south": (0, -1), "east": (1, 0), "west": (-1, 0)}
        pos = {events[0]["place2"]: (0, 0)}
        for _ in events:
            for e in events:
                (dx, dy) = step[e["direction"]]
                if e["place2"] in pos:
                    pos.setdefault(e["place"], (pos[e["place2"]][0] + dx, pos[e["place2"]][1] + dy))
                elif e["place"] in pos:
                    pos.setdefault(e["place2"], (pos[e["place"]][0] - dx, pos[e["place"]][1] - dy))
        assert len(set(pos.values())) == len(pos), "two places on one cell"
        dx, dy = step[asked["direction"]]
        x, y = pos[asked["place"]]
        target = (x + dx, y + dy) if kind == "what_is_dir_of" else (x - dx, y - dy)
        return next(p for p, c in pos.items() if c == target)
    if kind in ("who_gave", "what_given", "given_to", "who_received"):
        gives = [e for e in events if e["kind"] == "give"
                 and all(e[k] == v for k, v in asked.items() if k != "kind")]
        field = {"who_gave": "person", "what_given": "obj", "given_to": "other", "who_received": "other"}[kind]
        answers = {e[field] for e in gives}
        assert len(answers) == 1, "the question must have one answer"
        return answers.pop()
    if kind == "is_in":
        last = [e for e in events if e["person"] == asked["person"]
                and e["kind"] in ("move", "not_in", "either")][-1]
        if last["kind"] == "move":
            return "yes" if last["place"] == asked["place"] else "no"
        if last["kind"] == "not_in":
            assert last["place"] == asked["place"], "a 'not in' fact only answers about its place"
            return "no"
        return "maybe" if asked["place"] in (last["place"], last["place2"]) else "no"
    raise AssertionError(f"unknown question kind {kind}")


EVENT_KINDS = {"qa1": {"move"}, "qa4": {"relation"}, "qa9": {"move", "not_in"},
               "qa10": {"move", "either"}}


@pytest.mark.parametrize("task", list(BABI_TASKS))
def test_babi_answers_follow_from_the_event_log(task):
    answers = set()
    for seed in range(200):
        events, question, answer, asked = babi_story(task, seed)
        assert derive_answer(events, asked) == answer, (task, seed, question, events)
        replay([e for e in events if e["kind"] != "relation"])   # every event obeys the rules
        assert set(e["kind"] for e in events) <= EVENT_KINDS.get(task, {"move", "grab", "drop", "give"})
        for e in events:   # the sentence says what the event is
            assert all(str(v) in e["text"] for k, v in e.items() if k not in ("kind", "text"))
        answers.add(answer)
    assert len(answers) >= 2   # not a constant answer
    if task in ("qa6", "qa9"):
        assert answers == {"yes", "no"}
    if task == "qa10":
        assert answers == {"yes", "no", "maybe"}
    if task == "qa5":   # all four question forms occur
        assert {babi_story(task, s)[3]["kind"] for s in range(200)} == {
            "who_gave", "what_given", "given_to", "who_received"}


def check_babi_sample(s, length, enc, corpus):
    tokens, mask, meta = s
    assert len(tokens) == length
    check_answer_at_end(s, f" {meta['answer']}.", enc)
    assert text_of(tokens, enc).endswith(f"\nQuestion: {meta['question']}\nAnswer: {meta['answer']}.")
    assert meta["fact_starts"] == sorted(meta["fact_starts"])
    for e, start in zip(meta["events"], meta["fact_starts"]):
        piece = enc.encode_ordinary(f"{e['text']}\n" if corpus else f" {e['text']}")
        assert tokens[start:start + len(piece)].tolist() == piece
        if corpus:   # facts go at line starts
            assert start == 1 or enc.decode_single_token_bytes(int(tokens[start - 1])).endswith(b"\n")
    assert derive_answer(meta["events"], meta["asked"]) == meta["answer"]


def corpus_stream(enc):
    docs = [f"def f{i}(x):\n    return x + {i}\n\n# comment {i}\nclass C{i}:\n    pass\n" for i in range(300)]
    ids = []
    for d in docs:
        ids += [enc.eot_token] + enc.encode_ordinary(d)
    return np.array(ids, dtype=np.uint16)


@pytest.mark.parametrize("enc", [ENC, toy_bpe()], ids=["bytes", "toy_bpe"])
def test_babi_sample_structure(enc):
    corpus = corpus_stream(enc)
    for i, task in enumerate(BABI_TASKS):
        for length in [400, 3000]:
            check_babi_sample(babi_sample(task, enc, length, seed=i), length, enc, corpus=False)
            check_babi_sample(babi_sample(task, enc, length, seed=i, filler_tokens=corpus), length, enc,
                              corpus=True)


def test_babi_determinism_seeds_and_mixing():
    corpus = corpus_stream(ENC)
    a = babi_sample("qa2", "bytes", 800, seed=11, filler_tokens=corpus)
    b = babi_sample("qa2", "bytes", 800, seed=11, filler_tokens=corpus)
    assert np.array_equal(a.tokens, b.tokens) and a.meta == b.meta
    assert not np.array_equal(a.tokens, babi_sample("qa2", "bytes", 800, seed=12, filler_tokens=corpus).tokens)
    # the story does not depend on the length (one story per seed across an eval grid)
    assert babi_sample("qa2", "bytes", 400, seed=11).meta["events"] == a.meta["events"]
    # facts are spread through the filler, not bunched at one end
    starts = np.concatenate([babi_sample("qa1", "bytes", 4000, seed=s).meta["fact_starts"] for s in range(20)])
    assert starts.min() < 1000 and starts.max() > 3000
    assert {babi_sample(None, "bytes", 500, seed=s).meta["task"] for s in range(100)} == set(BABI_TASKS)


def test_babi_bad_inputs():
    with pytest.raises(ValueError, match="too short"):
        babi_sample("qa3", "bytes", 60, seed=0)
    with pytest.raises(DataError, match="filler"):
        babi_sample("qa1", "bytes", 2000, seed=0, filler_tokens=np.arange(100))
    with pytest.raises(ValueError, match="unknown bAbI task"):
        babi_sample("qa11", "bytes", 500, seed=0)


# ----------------------------------------------------------------------------------------------
# Batching
# ----------------------------------------------------------------------------------------------

def test_collate_left_pads_and_masks_the_answer_only():
    samples = [copy_sample("bytes", L, seed=L) for L in (5, 9, 7)]
    x, y, loss_mask = collate(samples, pad_id=ENC.eot_token)
    T = 2 * 9 + 3
    assert x.shape == y.shape == loss_mask.shape == (3, T - 1) and x.dtype == y.dtype == torch.int64
    for row, s in enumerate(samples):
        n = len(s.tokens)
        full = torch.cat([x[row], y[row, -1:]])   # the row's tokens (y's last target is the last token)
        assert (x[row, :T - n] == ENC.eot_token).all()                       # left padding
        assert torch.equal(x[row, T - n:], torch.from_numpy(s.tokens[:-1]))
        answer = torch.from_numpy(s.answer_mask[1:])
        assert torch.equal(loss_mask[row, T - n:], answer) and not loss_mask[row, :T - n].any()
        assert torch.equal(y[row, T - n:][answer], torch.from_numpy(s.tokens[1:][s.answer_mask[1:]]))
        assert (y[row][~loss_mask[row]] == -100).all()
        assert full[-1] == s.tokens[-1]
    # -100 makes F.cross_entropy average over the answer tokens only
    logits = torch.randn(3, T - 1, 300)
    loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
    manual = -torch.log_softmax(logits, -1).gather(-1, y.clamp(min=0)[..., None])[..., 0][loss_mask].mean()
    assert torch.allclose(loss, manual)


def test_task_sampler_shapes_and_resume():
    corpus = corpus_stream(ENC)
    for fn, kwargs in [(passkey_sample, dict(length=257)),
                       (copy_sample, dict(length=(50, 100))),
                       (babi_sample, dict(task=None, length=513, filler_tokens=corpus))]:
        sampler = TaskSampler(fn, 4, seed=3, tokenizer="bytes", **kwargs)
        x, y = sampler.next_batch()
        if fn is not copy_sample:
            assert x.shape == y.shape == (4, kwargs["length"] - 1)
        assert torch.equal(x[:, 1:], torch.where(y[:, :-1] == -100, x[:, 1:], y[:, :-1]))
        assert ((y == -100) | (y == torch.cat([x[:, 1:], y[:, -1:]], 1))).all()
        assert (y != -100).any(1).all() and (y[:, -1] != -100).all()   # every row ends in its answer
        if fn is passkey_sample:
            assert ((y != -100).sum(1) == 7).all()   # " 12345." in bytes
        state = sampler.state_dict()
        expected = [sampler.next_batch() for _ in range(2)]
        resumed = TaskSampler(fn, 4, seed=999, tokenizer="bytes", **kwargs)
        resumed.load_state_dict(state)
        for (xa, ya), (xb, yb) in zip(expected, [resumed.next_batch() for _ in range(2)]):
            assert torch.equal(xa, xb) and torch.equal(ya, yb)
        assert not torch.equal(expected[0][0], expected[1][0])


def test_task_sampler_rows_are_the_generator_with_a_sampler_seed():
    sampler = TaskSampler(passkey_sample, 2, seed=5, tokenizer="bytes", length=300)
    samples = sampler.next_samples()
    assert np.array_equal(samples[1].tokens, passkey_sample("bytes", 300, seed=[5, 0, 1, 1]).tokens)
    # training rows never coincide with evaluation samples seeded by plain ints
    assert samples[0].meta["key"] != passkey_sample("bytes", 300, seed=5).meta["key"] or \
        samples[0].meta["depth"] != passkey_sample("bytes", 300, seed=5).meta["depth"]


# ----------------------------------------------------------------------------------------------
# Scoring
# ----------------------------------------------------------------------------------------------

def test_exact_match_and_cut_answer():
    assert exact_match(" 12345.", "12345")
    assert exact_match("12345", " 12345.")
    assert exact_match("  Kitchen. ", "kitchen")
    assert exact_match("apple, milk", "apple,milk.")
    assert not exact_match("12346", "12345")
    assert not exact_match("kitchen garden", "kitchen")
    assert not exact_match("milk,apple", "apple,milk")   # lists are written sorted
    assert not exact_match("", "yes")
    assert cut_answer(" 12345. What is the pass key?") == " 12345."
    assert cut_answer(" garden\nQuestion: x") == " garden"
    assert cut_answer(" maybe") == " maybe"
    assert exact_match(cut_answer(" Yes.\nQuestion:"), "yes")


def test_passkey_digit_accuracy():
    assert passkey_digit_accuracy(" 12345.", "12345") == 1.0
    assert passkey_digit_accuracy(" 12395.", 12345) == 0.8
    assert passkey_digit_accuracy(" 123", "12345") == 0.6
    assert passkey_digit_accuracy(" no idea.", "12345") == 0.0
    assert passkey_digit_accuracy(" 54321", "12345") == 0.2


def test_copy_scores():
    target = [1, 2, 3, 4]
    assert copy_scores([1, 2, 3, 4], target) == (1.0, True)
    assert copy_scores(np.array([1, 2, 3, 4, 9, 9]), target) == (1.0, True)   # extra ignored
    assert copy_scores(torch.tensor([1, 0, 3, 0]), torch.tensor(target)) == (0.5, False)
    assert copy_scores([1, 2], target) == (0.5, False)                          # missing = wrong
    assert copy_scores([], target) == (0.0, False)
    s = copy_sample("bytes", 30, seed=0)
    assert copy_scores(split_answer(s)[1][:-1], s.meta["target"]) == (1.0, True)
