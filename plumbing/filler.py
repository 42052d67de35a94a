"""A task's document in tokens, behind tasks.py's samplers: a tokenizer that spells the tasks' text back
exactly, and facts hidden at sentence or line boundaries of filler (our sentences, or a token stream)."""
import numpy as np

from plumbing.files import is_int, require
from plumbing.tokenizers import get_tokenizer

FLAGS = "train.py --seq-len; evaluate.py --passkey-lengths, --babi-lengths"   # where a length comes from
# Our filler carries no information: only what is hidden in it is worth remembering.
FILLER_SENTENCES = (" The river runs down to the sea.", " The hills are quiet at night.",
                    " The wind is soft today.", " On we walk.", " Up the path and down again.")

def spelling_tokenizer(tokenizer, text):
    """get_tokenizer's, if it spells `text` (the tasks' own) back exactly: answers are compared as text (a
    WordPiece or WordLevel tokenizer.json reads the separators as [UNK] and cannot)."""
    enc = get_tokenizer(tokenizer)
    require(enc.decode(enc.encode_ordinary(text)) == text, f"tokenizer {tokenizer} "
            "cannot spell the tasks' text: use a byte-level BPE (e.g. GPT-NeoX's tokenizer.json)")
    return enc

def hide(enc, what, length, facts, question, answer, depth=None, corpus=None, rng=None):
    """eot, filler (ours, or from the token stream `corpus`), each fact at a boundary (the nearest to depth *
    n_filler, or rng's draw), question, answer: `length` tokens -> (tokens, answer_mask, starts, n_filler)."""
    require(is_int(length), f"{what}: length must be an integer >= 1, got {length!r}")
    pieces = [enc.encode_ordinary(fact) for fact in facts]
    question = enc.encode_ordinary(question)
    answer = enc.encode_ordinary(answer)
    n = length - 1 - sum(map(len, pieces + [question, answer]))
    require(n >= 0, f"{what}: length {length} is too short, its sentences and question alone take "
            f"{length - n} tokens: use a longer length ({FLAGS})")
    if corpus is None:   # the LAST n tokens of our sentences repeated; boundaries between whole sentences
        sentences = [enc.encode_ordinary(s) for s in FILLER_SENTENCES]
        sentences *= n // sum(map(len, sentences)) + 1
        bounds = np.cumsum([n - sum(map(len, sentences))] + [len(s) for s in sentences])   # < 0: cut off
        filler = np.concatenate(sentences).astype(np.int64)[-bounds[0]:]
        boundaries = bounds[bounds >= 0]
    else:   # eots become newlines (one text); boundaries at line starts (decoded per token: parts are U+FFFD)
        require(len(corpus) >= n, f"{what}: filler_tokens has {len(corpus)} tokens, {n} needed: pass more")
        start = int(rng.integers(0, len(corpus) - n + 1))
        filler = np.asarray(corpus[start:start + n]).astype(np.int64)
        require((filler < enc.n_vocab).all(), f"{what}: filler_tokens must come from the same tokenizer")
        filler[filler == enc.eot_token] = enc.encode_ordinary("\n")[-1]
        boundaries = np.flatnonzero([True] + [enc.decode([t]).endswith("\n") for t in filler.tolist()])
    if depth is not None:   # passkey's one fact
        positions = [int(boundaries[np.abs(boundaries - depth * n).argmin()])]
    else:   # bAbI's, in order
        positions = np.sort(rng.choice(boundaries, size=len(pieces))).tolist()
    starts = [pos + 1 + sum(map(len, pieces[:i])) for i, pos in enumerate(positions)]   # + eot, facts before
    body = np.insert(filler, np.repeat(positions, list(map(len, pieces))), np.concatenate(pieces))
    tokens = np.concatenate([[enc.eot_token], body, question, answer]).astype(np.int64)
    return tokens, np.arange(len(tokens)) >= len(tokens) - len(answer), starts, n
