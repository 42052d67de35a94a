"""The paper's Sec. 5 tasks (passkey retrieval, synthetic copying, BABILong-style bAbI QA) and their scores.
A generator returns Sample(tokens, answer_mask, meta): a document ending with the answer, the only tokens
trained on (the paper's "loss only on the answer") and scored, a pure function of its seed whose content
(key, story, string) and layout (depth, filler) streams differ: one seed asks one question at every length."""
import collections
import re

import numpy as np
import torch
from tqdm import tqdm

import model
from plumbing.babi import BABI_TASKS, babi_story, pick
from plumbing.files import DataError, is_int, require
from plumbing.filler import FLAGS, hide, spelling_tokenizer
from plumbing.tokenizers import get_tokenizer

Sample = collections.namedtuple("Sample", "tokens answer_mask meta")   # int64 [n], bool [n], dict

def split_answer(sample):
    """-> (prompt, answer): int64 token arrays; the model reads the prompt and must produce the answer."""
    return np.split(np.asarray(sample[0]), [len(sample[0]) - int(np.sum(sample[1]))])

def task_tokenizer(tokenizer):   # get_tokenizer's if it spells every task's text: answers compare as text
    return spelling_tokenizer(tokenizer, PASSKEY_QUESTION + " 12345.\nAnswer:\x1d\x03")   # COPY_SEP, COPY_EOS

# --- Passkey retrieval (Fig. 7) ---------------------------------------------------------------
PASSKEY_SENTENCE = " Listen well: the pass key is {key}. Keep {key} in mind, it is the pass key."
PASSKEY_QUESTION = " What is the pass key? The pass key is"

def passkey_sample(tokenizer, length, depth=None, seed=0):
    """A 5-digit key at `depth` (fraction of filler before it, at a sentence boundary; None: uniform) in
    filler, then the question; the answer " {key}." has the paper's period: the model learns to stop."""
    enc = task_tokenizer(tokenizer)
    content_rng, layout_rng = np.random.default_rng(seed).spawn(2)
    key = str(int(content_rng.integers(10_000, 100_000)))
    depth = float(layout_rng.random()) if depth is None else depth
    require(0 <= depth <= 1, f"passkey_sample: depth must be in [0, 1], got {depth}")
    tokens, mask, (start,), n = hide(enc, "passkey_sample", length, [PASSKEY_SENTENCE.format(key=key)],
                                     PASSKEY_QUESTION, f" {key}.", depth)
    return Sample(tokens, mask, dict(task="passkey", answer=key, key=key, depth=depth, key_start=start,
                                     seed=seed, actual_depth=(start - 1) / n if n else 0.0))

# --- Synthetic copying (Table 1): eot s SEP s EOS, the answer the copy AND the EOS (where it stops) ---
# SEP, EOS: control bytes (group separator, end-of-text) text rarely holds, single tokens in byte-level BPEs.
COPY_ALPHABET = "abcdefghijklmnopqrstuvwxyz"
COPY_SEP = b"\x1d"
COPY_EOS = b"\x03"

def copy_sample(tokenizer, length, seed=0):
    """A random string of `length` (or drawn from [lo, hi]) letters to copy: 2 * length + 3 tokens."""
    enc = task_tokenizer(tokenizer)
    (rng,) = np.random.default_rng(seed).spawn(1)
    lo, hi = length if isinstance(length, (tuple, list)) and len(length) == 2 else (length, length)
    require(is_int(lo) and is_int(hi, lo), "copy_sample: need length >= 1 or (lo, hi), 1 <= lo <= hi")
    length = length if is_int(length) else int(rng.integers(lo, hi + 1))   # (lo, hi): drawn
    pick = rng.integers(0, len(COPY_ALPHABET), size=length)
    s = np.array([enc.encode_single_token(c.encode()) for c in COPY_ALPHABET], dtype=np.int64)[pick]
    tokens = np.r_[enc.eot_token, s, enc.encode_single_token(COPY_SEP), s, enc.encode_single_token(COPY_EOS)]
    return Sample(tokens, np.arange(len(tokens)) >= length + 2, dict(
        task="copy", length=length, target=s, answer="".join(COPY_ALPHABET[i] for i in pick), seed=seed))

def copy_scores(pred_tokens, target_tokens):
    """-> (char_accuracy, whole_string_correct), position by position over the target (missing = wrong)."""
    pred = np.asarray(pred_tokens).reshape(-1).tolist()
    target = np.asarray(target_tokens).reshape(-1).tolist()
    correct = sum(p == t for p, t in zip(pred, target))
    return correct / len(target), correct == len(target)

# --- BABILong-style QA (Fig. 6): a bAbI story (plumbing/babi.py) hidden in filler --------------------------
def babi_sample(task, tokenizer, length, seed=0, filler_tokens=None):
    """A bAbI story (task "qa1".."qa10", None: uniform), its facts in order at random boundaries of filler."""
    enc = task_tokenizer(tokenizer)
    task_rng, story_rng, layout_rng = np.random.default_rng(seed).spawn(3)
    task = pick(task_rng, list(BABI_TASKS)) if task is None else task   # babi_story checks it
    events, question, answer, asked = babi_story(task, int(story_rng.integers(2**63)))
    facts = [f" {e['text']}" if filler_tokens is None else f"{e['text']}\n" for e in events]
    tokens, mask, starts, _ = hide(enc, f"babi_sample {task}", length, facts, f"\nQuestion: {question}\n"
                                   f"Answer:", f" {answer}.", corpus=filler_tokens, rng=layout_rng)
    return Sample(tokens, mask, dict(task=task, answer=answer, question=question, asked=asked, events=events,
                                     fact_starts=starts, seed=seed))

def babi_mixture(tokenizer, length, seed, babi_tasks, filler_tokens=None):
    """A babi_sample of a task drawn uniformly from babi_tasks, a pure function of the seed. A story too
    long for `length` is replaced by the one of seed + [retry] (at short lengths, shorter stories win)."""
    seed = list(np.atleast_1d(seed))
    task = babi_tasks[np.random.default_rng(seed + [7]).integers(len(babi_tasks))]
    for retry in range(100):
        try:
            return babi_sample(task, tokenizer, length, seed + [retry] if retry else seed, filler_tokens)
        except DataError as e:
            if "too short" not in str(e):
                raise
    raise DataError(f"no {task} story fits in {length} tokens: use a larger length (bytes: >= 512; {FLAGS})")

# --- Scoring: greedy answers from the zero state; sample i of a cell is seeded by (seed, cell, i) only ---
@torch.inference_mode()
def greedy_answer(lm, prompt_tokens, max_new_tokens, chunk_len=512):
    """Greedy continuation [b, max_new_tokens] (lists) of prompt_tokens [b, T] from the zero state."""
    prompts = torch.as_tensor(prompt_tokens).long().to(model.device_of(lm))
    for _, _, logits, state in model.stream(lm, prompts, chunk_len, last_only=True):
        pass   # the last piece's logits and state: those after the whole prompt
    new = [logits[:, -1].argmax(-1)]
    while len(new) < max_new_tokens:
        logits, state = lm(new[-1][:, None], state)  # one step from the carried state
        new.append(logits[:, -1].argmax(-1))
    return torch.stack(new, 1).tolist()

def _answers(lm, samples, batch_size=None, chunk_len=512, slack=2):
    """Greedy answers (token lists), slack tokens longer than the longest answer (scoring cuts them). Prompts
    of equal length are decoded together, never padded (a recurrent model would keep the padding)."""
    prompts, answers = zip(*(split_answer(s) for s in samples))
    out = {}  # sample index -> its answer
    for length in sorted(set(map(len, prompts))):
        rows = [i for i, p in enumerate(prompts) if len(p) == length]
        for r in range(0, len(rows), batch_size or len(rows)):
            idx = rows[r:r + (batch_size or len(rows))]
            new = max(len(answers[i]) for i in idx) + slack
            out.update(zip(idx, greedy_answer(lm, np.stack([prompts[i] for i in idx]), new, chunk_len)))
    return [out[i] for i in range(len(samples))]

def _exact(lm, tokenizer, samples, **kw):
    """Exact match of each sample's decoded answer, cut at its first period or newline."""
    texts = [cut_answer(t) for t in map(get_tokenizer(tokenizer).decode, _answers(lm, samples, **kw))]
    return [float(exact_match(p, s.meta["answer"])) for p, s in zip(texts, samples)]

def passkey_grid(lm, tokenizer, lengths, depths=10, n_per_cell=4, seed=0, progress=False, **kw):
    """Passkey retrieval (Fig. 7) per length x depth (a count in [0, 1] or a list): exact match [L][D]."""
    depths = [float(d) for d in (np.linspace(0, 1, depths) if isinstance(depths, int) else depths)]
    exact = []
    for L in tqdm(lengths, desc="passkey", disable=not progress):
        flat = [passkey_sample(tokenizer, L, depth=d, seed=[seed, j, i])  # depth-major
                for j, d in enumerate(depths) for i in range(n_per_cell)]
        ok = np.reshape(_exact(lm, tokenizer, flat, **kw), (len(depths), n_per_cell))
        exact.append(ok.mean(1).tolist())
    return dict(lengths=[int(L) for L in lengths], depths=depths, n_per_cell=n_per_cell, exact=exact,
                exact_mean=[sum(r) / len(r) for r in exact])

def copy_accuracy(lm, tokenizer, lengths, n=16, seed=0, progress=False, **kw):
    """Copying (Table 1) per string length: char accuracy of each string and their mean, whole-string."""
    eos = get_tokenizer(tokenizer).encode_single_token(COPY_EOS)
    scores = []  # [L, n, 2]: char accuracy, whole string right
    for L in tqdm(lengths, desc="copy", disable=not progress):
        samples = [copy_sample(tokenizer, int(L), seed=[seed, int(L), i]) for i in range(n)]
        preds = [p[:p.index(eos)] if eos in p else p for p in _answers(lm, samples, slack=0, **kw)]
        scores.append([copy_scores(p, s.meta["target"]) for p, s in zip(preds, samples)])
    char, whole = torch.tensor(scores, dtype=torch.float64).unbind(-1)
    return dict(lengths=[int(L) for L in lengths], n=n, char=char.tolist(), char_mean=char.mean(1).tolist(),
                whole_mean=whole.mean(1).tolist())

def babilong_accuracy(lm, tokenizer, babi_tasks, lengths, n=8, seed=0, filler=None, progress=False, **kw):
    """BABILong-style QA (Fig. 6): exact match per bAbI task and length, stories hidden in `filler` tokens."""
    acc = []   # [L, tasks]
    cell = {t: k for k, t in enumerate(BABI_TASKS)}
    for L in tqdm(lengths, desc="babilong", disable=not progress):
        samples = [babi_mixture(tokenizer, int(L), [seed, cell[t], i], (t,), filler)
                   for t in babi_tasks for i in range(n)]
        acc.append(np.reshape(_exact(lm, tokenizer, samples, **kw), (len(babi_tasks), n)).mean(1).tolist())
    return dict(tasks=list(babi_tasks), lengths=[int(L) for L in lengths], n=n, mean=np.mean(acc, 1).tolist(),
                acc={t: [row[k] for row in acc] for k, t in enumerate(babi_tasks)})

def exact_match(pred_text, answer_text):
    """Equal after normalising case, whitespace runs, spaces around commas and one trailing period."""
    return _normalized(pred_text) == _normalized(answer_text)

def _normalized(text):   # exact_match's form: lower case, single spaces, "a,b", no trailing period
    text = re.sub(r" ?, ?", ",", " ".join(text.strip().lower().split()))
    return text[:-1].rstrip() if text.endswith(".") else text

def cut_answer(text):
    """A generated continuation up to and including the first period, or up to the first newline."""
    return re.match(r"[^.\n]*\.?", text)[0]

TASKS = {"passkey": passkey_sample, "copy": copy_sample, "babilong": babi_sample}   # train.py --task
