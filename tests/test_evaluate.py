"""evaluate.py: each metric against its definition on hand-made cases, the verdict's rule, tasks, the CLI."""
import json
import math
import os
import signal
import types

import matplotlib.figure
import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import data
import evaluate as ev
import tasks
import train
from plumbing import checkpoints, eval_flags, report, token_cache
from conftest import CORPUS_TEXT, ROOT, checkpoint, official_dir, tiny_lm

MARKOV = "markov:k=4,alpha=0.3,doc_len=128,docs=4,val_docs=24"

class ToyLM(nn.Module):
    """h_t = a * h_{t-1} + U(x_t) per head, read out linearly, plus a token shift (a second state key, as
    the real mixers' conv windows): a state reset must zero every key of the state dict."""

    def __init__(self, vocab=11, a=(0.8, 0.97), seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.cfg = types.SimpleNamespace(vocab_size=vocab)
        self.emb = nn.Parameter(torch.randn(vocab, 2, 3, 4, generator=g))
        self.shift_emb = nn.Parameter(torch.randn(vocab, 5, generator=g))
        self.readout = nn.Parameter(torch.randn(24, vocab, generator=g) * 0.3)
        self.shift_out = nn.Parameter(torch.randn(5, vocab, generator=g))
        self.register_buffer("a", torch.tensor(a).view(1, 2, 1, 1))

    def zero_state(self, b, device=None):
        return [{"h": torch.zeros(b, 2, 3, 4, device=device), "shift": torch.zeros(b, 5, device=device)}]

    def forward(self, idx, state=None, last_only=False):
        state = state or self.zero_state(len(idx))
        h, prev, logits = state[0]["h"], state[0]["shift"], []
        for t in range(idx.shape[1]):
            h = self.a * h + self.emb[idx[:, t]]
            logits.append(h.flatten(1) @ self.readout + prev @ self.shift_out)
            prev = self.shift_emb[idx[:, t]]
        logits = torch.stack(logits, 1)
        return logits[:, -1:] if last_only else logits, [{"h": h, "shift": prev}]

class CurveLM(nn.Module):
    """Uninformative on uniform random tokens, with a confidence c(t) that is flat up to position 64 and
    grows after it: the expected NLL is flat, then rises. The state is the position."""

    def __init__(self, vocab=11, nan=False):
        super().__init__()
        self.cfg = types.SimpleNamespace(vocab_size=vocab, arch="curve")
        self.w = nn.Parameter(torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(0)))
        self.nan = nan

    def zero_state(self, b, device=None):
        return [{"h": torch.zeros(b, 1, 1, device=device)}]

    def forward(self, idx, state=None, last_only=False):
        t0 = (state or self.zero_state(len(idx)))[0]["h"][:, :1, 0]  # [b, 1]
        t = t0 + torch.arange(idx.shape[1])
        logits = (0.5 + (t - 64).clamp_min(0) / 64)[..., None] * self.w[idx] * (math.nan if self.nan else 1)
        return logits[:, -1:] if last_only else logits, [{"h": (t0 + idx.shape[1])[:, :, None]}]

def tokens(n, T, vocab=11, seed=0):
    return torch.randint(0, vocab, (n, T), generator=torch.Generator().manual_seed(seed))

class CountLM(nn.Module):
    """Predicts token j with probability (c_j + alpha) / (t + V alpha), c_j its count in the t tokens read
    so far (the state): logits log(c + alpha) in `dtype`, the same numbers however the tokens are split
    into calls. Its NLL has a closed form (count_nll): an anchor that is no function under test."""

    def __init__(self, vocab=5, alpha=0.5, dtype=torch.float32):
        super().__init__()
        self.cfg = types.SimpleNamespace(vocab_size=vocab)
        self.alpha = nn.Parameter(torch.tensor(alpha, dtype=torch.float64))  # a parameter: lm has a device
        self.dtype = dtype

    def zero_state(self, b, device=None):
        return [{"h": torch.zeros(b, self.cfg.vocab_size, dtype=torch.float64, device=device)}]

    def forward(self, idx, state=None, last_only=False):
        seen = F.one_hot(idx, self.cfg.vocab_size).cumsum(1)  # [b, t, V]
        counts = (state or self.zero_state(len(idx)))[0]["h"][:, None] + seen
        logits = (counts + self.alpha).log().to(self.dtype)
        return logits[:, -1:] if last_only else logits, [{"h": counts[:, -1]}]

def count_nll(x, vocab=5, alpha=0.5, rounded=lambda v: v):
    """CountLM's NLL [n, T-1] in plain Python: the cross-entropy of its logits, each `rounded` as its dtype
    rounds it (identity: -log((c_y + alpha) / (t + V alpha)))."""
    out = []
    for row in x.tolist():
        counts, nll = [0] * vocab, []
        for i in range(len(row) - 1):
            counts[row[i]] += 1  # the context is row[:i + 1]; the target row[i + 1]
            logits = [rounded(math.log(c + alpha)) for c in counts]
            nll.append(math.log(sum(math.exp(v) for v in logits)) - logits[row[i + 1]])
        out.append(nll)
    return torch.tensor(out, dtype=torch.float64)

def test_position_nll_streamed_averaged_and_bucketed_as_defined():
    lm, x = ToyLM(), tokens(5, 21)
    want = ev.position_nll_naive(lm, x)
    for chunk_len, batch_size in [(1, 2), (3, 8), (7, 1), (64, 5)]:
        torch.testing.assert_close(ev.sequence_nll(lm, x, chunk_len, batch_size), want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ev.position_nll(lm, x, 4), want.double().mean(0), atol=1e-5, rtol=1e-5)
    # perplexity is exp of the mean NLL over sequences. p = (1/2, 1/4, 1/4) at every position: sequence
    # [0, 0] costs ln 2, sequence [0, 1] ln 4: PPL exp(1.5 ln 2) = 2 ** 1.5, not 3
    lm = CurveLM(vocab=3)
    lm.forward = lambda idx, state=None, last_only=False: (torch.tensor([0.5, 0.25, 0.25]).log().expand(
        len(idx), idx.shape[1], 3), lm.zero_state(len(idx)))
    assert ev.position_nll(lm, torch.tensor([[0, 0], [0, 1]])).exp().item() == pytest.approx(2 ** 1.5)
    # buckets of positions between log-spaced edges
    assert ev.log_edges(32, include=[10]) == [0, 1, 2, 3, 4, 6, 8, 10, 11, 16, 23, 32]
    b = ev.bucketize(torch.tensor([[1.0, 2.0, 3.0, 5.0], [3.0, 2.0, 1.0, 1.0]]), [0, 1, 4])
    # per sequence: bucket 0 (1, 3), bucket 1 (10/3, 4/3); means 2 and 7/3, standard errors 1 and 1
    torch.testing.assert_close(b["nll"], torch.tensor([2.0, 7 / 3], dtype=torch.float64))
    torch.testing.assert_close(b["nll_sem"], torch.tensor([1.0, 1.0], dtype=torch.float64))
    torch.testing.assert_close(b["ppl_sem"], torch.tensor([2.0, 7 / 3], dtype=torch.float64).exp())  # ppl * 1

def test_position_nll_of_a_counting_model_equals_its_closed_form():
    # the three functions against CountLM's known NLL, not only against each other. Chunks shorter than the
    # window catch a state reset between chunks; blocks of fewer rows than n, a state carried from one block
    # into the next; the off-by-one scores a target with logits that have read it
    lm, x = CountLM(), tokens(4, 11, vocab=5)
    want = count_nll(x)
    torch.testing.assert_close(ev.position_nll_naive(lm, x), want.float(), atol=1e-5, rtol=1e-5)
    forward, calls = lm.forward, []
    lm.forward = lambda idx, state=None, last_only=False: calls.append(idx.shape) or forward(idx, state)
    for chunk_len, batch_size in [(3, 2), (4, 1), (1, 3), (64, 4)]:
        calls.clear()
        got = ev.sequence_nll(lm, x, chunk_len, batch_size)
        torch.testing.assert_close(got, want.float(), atol=1e-5, rtol=1e-5,
                                   msg=lambda m: f"chunk_len {chunk_len}, batch_size {batch_size}: {m}")
        # streamed: no call reads more rows or positions than asked (memory does not grow with the length)
        assert max(b for b, _ in calls) <= batch_size and max(t for _, t in calls) <= chunk_len, calls
        assert sum(b * t for b, t in calls) == x.numel() - len(x)  # each input token read once
    lm.forward = forward
    assert not ev.position_nll_naive(lm, x).requires_grad   # under inference_mode: no graph kept
    # the mean over the sequences per position, in float64: log of the mean of exp(NLL) is larger (Jensen)
    torch.testing.assert_close(ev.position_nll(lm, x, 3, 2), want.mean(0), atol=1e-5, rtol=1e-5)

def test_position_nll_scores_bf16_logits_in_float32():
    # the cross-entropy of the bf16 logits cast to float32: one in bf16 rounds each NLL to 3 digits (~1e-2)
    lm, x = CountLM(dtype=torch.bfloat16), tokens(3, 9, vocab=5, seed=1)
    want = count_nll(x, rounded=lambda v: torch.tensor(v, dtype=torch.float64).bfloat16().item()).float()
    torch.testing.assert_close(ev.position_nll_naive(lm, x), want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ev.sequence_nll(lm, x, 3, 2), want, atol=1e-5, rtol=1e-5)

def test_verdict_on_hand_made_curves_and_a_matrix_is_paired():
    assert ev.length_generalization_pstar([5.0, 4.0, 3.0, 3.0, 2.9, 2.95, 2.9, 2.8], t_train=4) == 8
    assert ev.length_generalization_pstar([5.0, 4.0, 3.0, 2.9, 2.95, 3.5, 4.0], t_train=4) == 4
    # 40 sequences whose levels differ a lot (offsets 0..2 nats), sharing one profile: falls within
    # t_train = 8, flat to 32, then rises by 0.1 nats. Unpaired error bars (~0.1) would hide the rise.
    lo, hi = [0, 2, 4, 8, 16, 32, 64], [2, 4, 8, 16, 32, 64, 128]
    profile = torch.tensor([3.0, 2.5, 2.0, 2.0, 2.0, 2.1, 2.3], dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    noise = 0.01 * torch.randn(40, 7, generator=g, dtype=torch.float64)
    per_seq = profile + torch.linspace(0, 2, 40)[:, None] + noise - noise.mean(0)  # the means are the profile
    short = per_seq[:, 2:3].expand(-1, 7)   # the reference: each sequence's own level in [4, 8), everywhere
    v = ev.length_generalization(per_seq, lo, hi, 8, short)
    assert (v["generalizes_to"], v["ratio"], v["censored"]) == (32, 4.0, False) and "warning" not in v
    assert v["ppl_short"] == pytest.approx(math.exp(3.0))   # profile 2.0 + the offsets' mean 1.0
    v = ev.length_generalization(per_seq[:, :5], lo[:5], hi[:5], 8, short[:, :5])   # flat to the end
    assert v["generalizes_to"] == 32 and v["censored"]
    assert "not meaningful" in ev.length_generalization(per_seq[:5], lo, hi, 8, short[:5])["warning"]
    assert "warning" not in ev.length_generalization(per_seq[:16], lo, hi, 8, short[:16])   # MIN_SEQS: enough
    nan_within = per_seq.clone()
    nan_within[0, 2] = math.nan   # in [4, 8): inside t_train, where ppl_short is read, before any bucket tested
    v = ev.length_generalization(nan_within, lo, hi, 8, short)
    assert v["generalizes_to"] is None and "not finite" in v["warning"]
    with pytest.raises(ValueError, match="training positions"):
        ev.length_generalization(per_seq, lo, hi, 1, short)

def test_literal_verdict_on_hand_made_ties_a_later_minimum_and_its_type():
    # t* is the FIRST minimum of ppl[:t_train]: from the first 3.0 the 4.0 ends the run at 2, from the tied
    # one at 3 the run would go on to 4; the lower 2.0 at 5 lies past t_train and is not p*
    curve = [5.0, 3.0, 4.0, 3.0, 3.5, 2.0]
    assert ev.length_generalization_pstar(curve, t_train=4) == 2
    # the minimum of the whole curve (2.0 at 3) would end the run at 4, not at 2
    assert ev.length_generalization_pstar([4.0, 3.0, 3.2, 2.0, 2.5], t_train=2) == 2
    # a Python int (not a tensor, not a numpy integer), from a list or a tensor, found or len(ppl)
    for ppl, t_train, want in [(curve, 4, 2), (torch.tensor(curve), 4, 2), (torch.tensor([3.0, 2, 2]), 2, 3)]:
        got = ev.length_generalization_pstar(ppl, t_train)
        assert type(got) is int and got == want, (ppl, got)

def test_short_context_nll_reads_each_target_from_a_training_length_context():
    lm, x, T = ToyLM(), tokens(3, 42, vocab=11), 8
    short = ev.short_context_nll(lm, x, T, batch_size=2)
    assert short[:, :T // 2].isnan().all() and not short[:, T // 2:].isnan().any()
    for j in range(T // 2, 41):  # j's context starts at one of (T/2, T] tokens before it, from zero
        naive = torch.stack([ev.position_nll_naive(lm, x[:, j + 1 - c:j + 2])[:, -1]
                             for c in range(T // 2 + 1, min(T, j + 1) + 1)])
        assert ((naive - short[:, j]).abs() < 1e-5).all(1).any()

def test_verdict_paired_with_the_same_tokens_at_a_training_length_context():
    # the text's difficulty varies along the window (0.3 nats) and hides a 0.05-nat rise from 16 on in the
    # unpaired curve; the reference holds the same tokens read at a training-length context
    lo, hi = [0, 4, 8, 16, 32, 64], [4, 8, 16, 32, 64, 128]
    g = torch.Generator().manual_seed(0)
    ref = 2.0 + 0.3 * torch.randn(40, 6, generator=g, dtype=torch.float64)
    noise = 0.01 * torch.randn(40, 6, generator=g, dtype=torch.float64)
    flat = ref + noise
    v = ev.length_generalization(flat, lo, hi, 8, ref)
    assert v["censored"] and v["generalizes_to"] == 128 and v["ppl_short"] == pytest.approx(
        math.exp((ref[:, 1:] @ torch.tensor([4.0, 8, 16, 32, 64], dtype=torch.float64) / 124).mean()))
    v = ev.length_generalization(flat + torch.tensor([0, 0, 0, 0.05, 0.05, 0.05]), lo, hi, 8, ref)
    assert (v["generalizes_to"], v["censored"]) == (16, False)
    assert ev.length_generalization(ref, lo, hi, 8, ref)["censored"]   # a difference of 0: no rise

def test_verdict_is_stable_across_evaluation_seeds():
    # CurveLM's NLL is flat, then rises from position 64: T_train 16 generalizes to about 64 (4x).
    lm, edges, verdicts = CurveLM(), ev.log_edges(1024, include=[16]), []
    for seed in range(3):
        x = tokens(32, 1025, seed=seed)
        bk = ev.bucketize(ev.sequence_nll(lm, x, 1024, 32), edges)
        short = ev.short_context_nll(lm, x, 16, 1024, 32)   # bucketed as evaluate.measure does
        short = torch.stack([short[:, a:b].nanmean(1) for a, b in zip(bk["lo"], bk["hi"])], 1)
        v = ev.length_generalization(bk["per_seq"], bk["lo"], bk["hi"], 16, short, seed=seed)
        verdicts.append(edges.index(v["generalizes_to"]))
    assert max(verdicts) - min(verdicts) <= 1 and 64 <= edges[min(verdicts)] <= 181, verdicts

def test_verdict_on_real_checkpoints_detects_a_rise_and_not_a_flat_curve(tmp_path, capsys):
    # the demo's seed-0 base (PPL 5.4 at T_train 16 contexts, 12.6 at 1024) and seed-1 TBTT (5.7, 6.1), as
    # `train.py --demo` wrote them (weights only), on the demo's 64 windows of stdlib's validation split
    runs = [os.path.join(ROOT, "tests", "fixtures", f) for f in ("demo_seed0_base.pt", "demo_seed1_TBTT.pt")]
    rc, _, err = cli(capsys, *runs, "--metrics", "ppl", "--eval-len", "1024", "--out", str(tmp_path))
    base, tbtt = (m["verdict"] for m in json.load(open(tmp_path / "eval.json"))["models"])
    assert rc == 0 and not base["censored"] and base["generalizes_to"] <= 4 * 16, err
    assert tbtt["generalizes_to"] >= 512   # 724 on these windows: a rise of 0.4 perplexity by 1024

def test_distances_of_known_distributions_and_the_default_cuts():
    p, q = torch.tensor([0.9, 0.1]), torch.tensor([0.6, 0.4])
    one, other, half = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0]), torch.tensor([0.5, 0.5])
    for name, a, b, want in [("tv", p, q, 0.3), ("js", one, other, 1.0), ("cos", one, other, 1.0),
                             ("js", half, one, 0.75 * math.log2(4 / 3)), ("cos", half, one, 1 - 0.5 ** 0.5)]:
        assert ev.DISTANCES[name](a, b).item() == pytest.approx(want), name
    assert all(d(p, p).item() == 0.0 for d in ev.DISTANCES.values())
    c = ev.default_cuts(256, 32)   # the cuts Effective Remembrance is measured at by default
    assert c[0] == 0 and c.max() == 255 and (c.diff() > 0).all() and 20 <= len(c) <= 32
    assert {1, 2, 254}.issubset(set(c.tolist()))
    assert ev.default_cuts(8, 1000).tolist() == ev.default_cuts(8, 8).tolist() == [0, 1, 2, 4, 5, 6, 7]

@pytest.mark.parametrize("distance", ["tv", "js", "cos"])
def test_effrem_streamed_per_row_equals_one_forward_per_cut(distance):
    lm, x = ToyLM(), tokens(7, 40)
    T, cuts = 32, [0, 31, 1, 5, 5, 16, 30, 2]                 # unsorted, repeated, both ends
    want = ev.effective_remembrance_naive(lm, x, T, cuts, distance).double()
    forward, calls = lm.forward, []
    lm.forward = lambda idx, *a, **kw: calls.append(idx.shape) or forward(idx, *a, **kw)
    rows = ev.effective_remembrance(lm, x, T, cuts, distance, batch_size=3, chunk_len=4)
    assert max(b for b, _ in calls) <= 3 and max(t for _, t in calls) <= 4, calls   # streamed
    lm.forward = forward
    assert rows.shape == (7, 8) and rows.dtype == torch.float64
    torch.testing.assert_close(rows.mean(0), want, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(rows[2], ev.effective_remembrance_naive(lm, x[2:3], T, cuts, distance).double(),
                               atol=1e-6, rtol=1e-5)   # a row: the definition on that sequence alone
    assert (rows[:, 0] == 0).all() and ((rows >= 0) & (rows <= 1)).all() and (rows[:, 1:].mean(0) > 0).all()
    without_zero = ev.effective_remembrance(lm, x, T, [5, 16], distance)  # t = 0 is the reference, not a cut
    torch.testing.assert_close(without_zero.mean(0), want[[3, 5]], atol=1e-6, rtol=1e-5)

def test_effrem_naive_reads_float32_logits_in_float64_and_clamps_each_row(monkeypatch):
    # CountLM's float32 logits are the same numbers in both forms, so one forward per cut and the streamed
    # form agree to float64 rounding; a softmax in float32 is off by ~1e-8
    lm, x, T, cuts = CountLM(), tokens(6, 30, vocab=5), 24, [0, 23, 1, 4, 4, 12, 2]
    for distance in ev.DISTANCES:
        want = ev.effective_remembrance(lm, x, T, cuts, distance, chunk_len=5).mean(0)
        got = ev.effective_remembrance_naive(lm, x, T, cuts, distance)
        torch.testing.assert_close(got, want, atol=1e-12, rtol=0, msg=lambda m: f"{distance}: {m}")
    # real distances leave [0, 1] only by rounding (~1e-16); one that leaves it by more shows that each
    # row is clamped before the mean
    monkeypatch.setitem(ev.DISTANCES, "wide", lambda p, q: 4 * ev.DISTANCES["tv"](p, q) - 0.1)
    want = ev.effective_remembrance(lm, x, T, cuts, "wide").mean(0)
    assert want[0] == 0 and 0 < want[1] < 1
    got = ev.effective_remembrance_naive(lm, x, T, cuts, "wide")
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
    seen, forward = [], lm.forward   # the definition: a forward of x[:, :T] and of each suffix x[:, t:T]
    monkeypatch.setattr(lm, "forward", lambda idx, *a, **kw: seen.append(idx.shape) or forward(idx, *a, **kw))
    ev.effective_remembrance_naive(lm, x, T, cuts, "tv")
    lengths = {n for _, n in seen}
    assert lengths <= {T - t for t in cuts} and {T - t for t in cuts if t} <= lengths, seen
    assert {b for b, _ in seen} == {len(x)}, seen

def test_state_statistics_of_a_linearly_growing_state():
    # a = 1, one token everywhere: h_t = (t + 1) U in every row, so std and RMS grow as t + 1
    lm, x = ToyLM(a=(1.0, 1.0)), torch.full((3, 40), 4)
    U = lm.emb[4].detach().view(2, 12).double()
    positions = [0, 3, 7, 9, 19, 39]
    st = ev.state_statistics(lm, x, positions, chunk_len=6, batch_size=2, t_train=10)
    assert st["positions"].tolist() == positions
    ctx = torch.tensor(positions, dtype=torch.float64)[:, None] + 1
    torch.testing.assert_close(st["std"][0], ctx * U.repeat(1, 3).std(1), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(st["rms"][0], ctx * U.pow(2).mean(1).sqrt(), rtol=1e-5, atol=1e-6)
    # coverage: std at context 40 (>= 4 t_train) / largest std within t_train (context 10)
    torch.testing.assert_close(st["coverage"][0], torch.full((2,), 4.0).double(), rtol=1e-5, atol=0)
    assert ev.state_statistics(lm, x)["positions"][-1] == 39

def cli(capsys, *argv):
    try:
        rc = ev.main(list(argv))
    except SystemExit as e:  # argparse's own errors
        rc = e.code
    out = capsys.readouterr()
    return rc, out.out, out.err

X = tokens(2, 10)
BAD_CALLS = [(lambda: ev.position_nll(ToyLM(), X[0]), "shape"),
             (lambda: ev.effective_remembrance(ToyLM(), X, 8, [0, 8]), "cuts"),
             (lambda: ev.effective_remembrance(ToyLM(), X, 8, [0], distance="kl"), "unknown distance"),
             (lambda: ev.effective_remembrance(ToyLM(), X, 11, [0]), "T = 11"),
             (lambda: ev.bucketize(torch.zeros(2, 9), [0, 4, 8]), "edges"),
             # the API checks what the CLI checks: no uninitialised buffer returned as NLLs
             (lambda: ev.position_nll(ToyLM(), X, chunk_len=-1), "chunk_len must be an integer >= 1"),
             (lambda: ev.position_nll(ToyLM(), X, chunk_len=0), "chunk_len must be"),
             (lambda: ev.sequence_nll(ToyLM(), X, chunk_len=2.5), "chunk_len must be"),
             (lambda: ev.position_nll(ToyLM(), X, batch_size=-1), "batch_size must be an integer >= 1"),
             (lambda: ev.position_nll(ToyLM(), X[:0]), "n >= 1"),
             (lambda: ev.short_context_nll(ToyLM(), X, 4, batch_size=-1), "batch_size must be"),
             (lambda: ev.short_context_nll(ToyLM(), X, 4, chunk_len=0), "chunk_len must be"),
             (lambda: ev.short_context_nll(ToyLM(), X, 1), "t_train must be an integer >= 2"),
             (lambda: ev.short_context_nll(ToyLM(), X.float(), 4), "integer ids"),
             (lambda: ev.effective_remembrance(ToyLM(), X, 8, [0], batch_size=0), "batch_size must be"),
             (lambda: ev.effective_remembrance(ToyLM(), X, 8, [0], chunk_len=-3), "chunk_len must be"),
             (lambda: ev.state_statistics(ToyLM(), X, positions=[]), "one or more in \\[0, T - 1 = 9\\]"),
             (lambda: ev.state_statistics(ToyLM(), X, positions=[10]), "one or more in \\[0, T - 1 = 9\\]"),
             (lambda: ev.state_statistics(ToyLM(), X, batch_size=-2), "batch_size must be"),
             (lambda: ev.default_cuts(0), "default_cuts: need T >= 1"),
             (lambda: ev.default_cuts(8, 0), "n_cuts >= 1"),
             (lambda: ev.log_edges(-5), "log_edges: need length >= 1"),
             (lambda: ev.log_edges(0), "log_edges: need length >= 1"),
             (lambda: ev.log_edges(8, per_octave=0), "per_octave >= 1")]
BAD_ARGV = [("NOPE", "no checkpoint"), ("BAD", "corrupt"), ("CK CK --labels one", "--labels"),
            ("CK --metrics ppl,bogus", "unknown or repeated metric"), ("CK --n-seqs x", "positive"),
            ("CK --eval-len 23", "--eval-len 23 must be at least 24"), ("CK --effrem-cuts 0", "positive"),
            ("SYNTH --metrics babilong", "synthetic"), (f"OFFICIAL --data {MARKOV}", "2048"),
            ("CK --reference nope", "--reference"), ("CK --reference a=nope", "--reference"),
            ("CK --reference a b", "--reference"),
            ("CK --metrics babilong --babi-tasks qa99", "unknown or repeated"),
            ("CK --effrem-len 999", "--effrem-len 999 must lie"), ("CK --effrem-len 1", "must lie in [2, "),
            ("CK --seed -1", "--seed: must be in [0, 2**63), got '-1'"),  # -1: issue 19
            ("CK CK --labels a a", "own name"), ("CK --out CK/ckpt.pt", "--out"),
            ("CK BPE", "different tokenizers"), ("BPE --tokenizer bytes", "does not match"),
            ("CK --metrics passkey --passkey-lengths 50", "--passkey-lengths"),
            ("CK --metrics babilong --babi-lengths 100", "--babi-lengths"),
            ("CK --out CK/ckpt.pt/ev", "--out"), ("CK --out=", "--out ''"),   # refused before any metric
            ("CK --out DANGLING", "--out"), ("CK CK --over-seeds --out DANGLING", "--out"),
            # issue 34: each value once, no empty one, none that a later stage cannot use
            ("CK CK/ckpt.pt", "one checkpoint twice"), ("CK --metrics ppl,ppl", "repeated metric"),
            ("CK --metrics babilong --babi-tasks qa1,qa1", "repeated --babi-tasks"),
            ("CK --copy-lengths 3,3", "distinct"),
            ("CK --eval-len ²", "positive integer"), ("CK --labels=", "--labels ''"),
            ("CK --tokenizer=", "--tokenizer ''"), ("CK --data=", "--data ''"),
            ("CK --cache-dir=", "--cache-dir ''"),
            ("CK --metrics babilong --babi-tasks=", "--babi-tasks ''"),
            ("CK CK --over-seeds --out=", "--out ''"),
            ("CK --metrics passkey --passkey-lengths 128 --passkey-depths 129", "--passkey-depths 129 > 128"),
            ("CK --metrics passkey --passkey-lengths 128 --passkey-depths 128 --babi-tasks x",   # 128: passes
             "--babi-tasks does not apply to --metrics passkey: add one of babilong to --metrics, or drop"),
            # a flag that does not apply is refused, not ignored
            ("CK CK --over-seeds --metrics effrem --eval-len 4096", "it measures nothing: drop --eval-len "
             "--metrics"), ("CK CK --over-seeds --seed 2 --labels a b", "drop --seed"),
            ("CK CK --over-seeds --metrics ppl", "it measures nothing: drop --metrics"),
            ("CK --metrics passkey --eval-len 64", "--eval-len does not apply to --metrics passkey"),
            ("CK --metrics ppl --passkey-lengths 128", "--passkey-lengths does not apply to --metrics ppl"),
            ("CK --metrics passkey --data stdlib", "--data does not apply"),
            ("CK --metrics copy --n-seqs 4", "--n-seqs does not apply"),
            ("CK --metrics ppl,state --distance js", "add one of effrem"),
            ("CK --metrics effrem --reference x", "--reference does not apply"),
            ("CK --metrics ppl --copy-lengths 5", "--copy-lengths does not apply"),
            ("CK --metrics ppl --babi-lengths 512", "--babi-lengths does not apply"),
            ("CK --metrics ppl --task-samples 3", "--task-samples does not apply"),
            ("CK --t-train 1 --eval-len 1", "--eval-len 1 must be at least 2"),   # 1.5 x 1, a piece of 2
            ("EMPTY", "CKPT ''"), ("CK --out BAD", "--out")]

@pytest.mark.parametrize("call, word", BAD_CALLS + BAD_ARGV)
def test_bad_inputs_get_one_line_naming_the_problem(call, word, tmp_path, capsys):
    if callable(call):
        with pytest.raises(ValueError, match=word):
            call()
        return
    ck, lm = checkpoint(tmp_path / "run", seq_len=16, data="stdlib", tokenizer="bytes", seed=0,
                        tokenizer_id="bytes")
    (tmp_path / "bad.pt").write_bytes(b"not a checkpoint")
    paths = dict(CK=ck, NOPE=str(tmp_path / "nope.pt"), BAD=str(tmp_path / "bad.pt"),
                 BPE=checkpoint(tmp_path / "bpe", seq_len=16, data="stdlib", tokenizer_id="json-0")[0],
                 OFFICIAL=official_dir(tmp_path / "official", lm.state_dict(), d_model=64, n_layer=2,
                                       vocab_size=257, ssm_cfg=dict(lm.cfg.mixer, layer="Mamba2")),
                 SYNTH=checkpoint(tmp_path / "synth", seq_len=16, data=MARKOV, tokenizer="bytes")[0])
    os.symlink(tmp_path / "gone", tmp_path / "dangling")
    paths.update(DANGLING=str(tmp_path / "dangling"), EMPTY="")
    os.chmod(tmp_path / "bad.pt", 0o755)   # (a file, not a folder, that one may write and "enter")
    argv = [paths.get(a, a).replace("CK/", ck + "/") for a in call.split()]
    if "--out" not in call:
        argv += ["--out", str(tmp_path / "eval")]
    rc, _, err = cli(capsys, *argv)
    assert rc == 2 and word in err and len(err.strip().splitlines()) == 1, (call, err)

@pytest.fixture(scope="module")
def paired(tmp_path_factory):
    """The CLI on two runs with t_train 12, off the log grid, on the same windows, b paired to a."""
    tmp, tc = tmp_path_factory.mktemp("paired"), dict(seq_len=12, data=MARKOV, tokenizer="bytes", seed=0)
    paths = [checkpoint(tmp / f"run{i}", i, **tc)[0] for i in range(2)]
    assert ev.main([*paths, "--labels", "a", "b", "--reference", "a", "--n-seqs", "4", "--eval-len", "48",
                    "--effrem-cuts", "8", "--device", "cpu", "--out", str(tmp / "eval")]) == 0
    return paths, json.load(open(tmp / "eval" / "eval.json")), tmp / "eval"

def test_cli_end_to_end(paired, tmp_path, capsys):
    rep = paired[1]
    assert all((paired[2] / f).stat().st_size > 1000 for f in ("ppl.png", "effrem.png", "state.png"))
    report.show(rep, str(tmp_path))   # what the CLI printed
    stdout, err = capsys.readouterr()
    assert "verdict" in stdout and "[b]" in stdout and "Gap to the Bayes floor" in stdout
    assert "only 4 sequences" in err                         # the verdict's warning, also in eval.json
    m = rep["models"][0]
    assert len(m["ppl"]["nll"]) == 48 and m["verdict"]["t_train"] == 12 and "warning" in m["verdict"]
    assert m["effrem"]["T"] == 48 and m["effrem"]["mean"][0] == 0.0 and len(m["state"]["coverage"]) == 2
    assert len(m["gap"]["nll"]) == len(rep["optimal"]["nll"]) == len(m["ppl"]["buckets"]["hi"])

def test_cli_measures_on_windows_of_the_validation_split(paired):
    corpus = data.load_data(MARKOV, seed=0)
    windows = data.eval_windows(corpus.val, 4, 49, seed=0, eot_token=corpus.eot_token)
    want = ev.position_nll(checkpoints.from_pretrained(paired[0][0]), windows)
    np.testing.assert_allclose(paired[1]["models"][0]["ppl"]["nll"], want, rtol=1e-5)

def test_cli_paired_difference_is_the_run_minus_the_reference(paired, tmp_path):
    a, b = paired[1]["models"]
    want = np.subtract(b["ppl"]["buckets"]["nll"], a["ppl"]["buckets"]["nll"])   # positive: b is worse
    np.testing.assert_allclose(b["diff"]["nll"], want, rtol=1e-9, atol=1e-12)
    assert "diff" not in a and b["diff"]["reference"] == "a"
    # a default reference and a run's own: a - b (the default), c - a; b, the default, has none
    c = checkpoint(tmp_path / "run2", 2, seq_len=12, data=MARKOV, tokenizer="bytes", seed=0)[0]
    assert ev.main([*paired[0], c, "--labels", "a", "b", "c", "--reference", "b", "c=a", "--metrics", "ppl",
                    "--n-seqs", "4", "--eval-len", "48", "--device", "cpu", "--out", f"{tmp_path}"]) == 0
    a, b, c = json.load(open(tmp_path / "eval.json"))["models"]
    assert "diff" not in b and (a["diff"]["reference"], c["diff"]["reference"]) == ("b", "a")
    np.testing.assert_allclose(a["diff"]["nll"], -np.array(want), rtol=1e-9, atol=1e-12)
    c_minus_a = np.subtract(c["ppl"]["buckets"]["nll"], a["ppl"]["buckets"]["nll"])
    np.testing.assert_allclose(c["diff"]["nll"], c_minus_a, rtol=1e-9, atol=1e-12)

def test_cli_buckets_and_state_positions_have_an_edge_at_t_train_off_the_log_grid(paired):
    m = paired[1]["models"][0]
    assert 12 not in ev.log_edges(48) and 12 in m["ppl"]["buckets"]["lo"] and 11 in m["state"]["positions"]

@pytest.mark.filterwarnings("error::UserWarning")   # no matplotlib warning about an empty legend
def test_a_model_that_outputs_nan_is_reported_not_a_crash(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(checkpoints, "from_pretrained", lambda path, device: CurveLM(vocab=257, nan=True))
    ck, _ = checkpoint(tmp_path / "run", seq_len=8, data=MARKOV, tokenizer="bytes", seed=0)
    rc, _, err = cli(capsys, ck, "--n-seqs", "4", "--eval-len", "32", "--metrics", "ppl,effrem",
                     "--out", str(tmp_path / "eval"))
    assert rc == 0 and "not finite" in err and "no finite value" in err
    assert (tmp_path / "eval" / "ppl.png").exists()

def test_streamed_greedy_answer_equals_argmax_of_full_forwards():
    lm = tiny_lm().eval()
    prompts, seq = tokens(3, 41, vocab=257, seed=1), tokens(3, 41, vocab=257, seed=1)
    with torch.no_grad():
        for _ in range(9):   # the definition: re-read everything, take the argmax of the last position
            seq = torch.cat([seq, lm(seq)[0][:, -1].argmax(-1, keepdim=True)], 1)
    assert tasks.greedy_answer(lm, prompts, 9, chunk_len=8) == seq[:, 41:].tolist()
    assert tasks.greedy_answer(lm, prompts[1:2], 9) == [seq[1, 41:].tolist()]
    # prompts of different lengths are decoded in equal-length groups and handed back in order
    samples = [tasks.copy_sample("bytes", L, seed=i) for i, L in enumerate([3, 5, 3, 4, 5])]
    want = [tasks.greedy_answer(lm, tasks.split_answer(s)[0][None], s.meta["length"] + 3)[0] for s in samples]
    assert tasks._answers(lm, samples, batch_size=1) == tasks._answers(lm, samples) == want
    # prompts of one length decoded together: as many tokens as the longest answer of the group + slack
    a, b = (tasks.Sample(np.r_[[0] * 5, [1] * n], np.arange(5 + n) >= 5, {}) for n in (1, 4))
    assert [len(t) for t in tasks._answers(lm, [a, b])] == [6, 6]

@pytest.mark.parametrize("right", [True, False])
def test_always_right_answers_score_one_and_wrong_ones_zero(right, monkeypatch):
    def answers(lm, samples, **kw):   # the answer tokens themselves, or "###"
        return [tasks.split_answer(s)[1].tolist() if right else [35] * 3 for s in samples]
    monkeypatch.setattr(tasks, "_answers", answers)
    pk = tasks.passkey_grid(None, "bytes", [128, 200], [0.0, 0.5, 1.0], 2, seed=3)
    cp = tasks.copy_accuracy(None, "bytes", [4, 9], 3, seed=3)
    bb = tasks.babilong_accuracy(None, "bytes", ["qa1", "qa8"], [512], 2, seed=3)
    assert np.array(pk["exact"]).shape == (2, 3) and np.all(np.array(pk["exact"]) == right)
    assert cp["whole_mean"] == cp["char_mean"] == [float(right)] * 2
    assert bb["acc"] == {"qa1": [float(right)], "qa8": [float(right)]} and bb["mean"] == [float(right)]

def test_cli_task_scores_from_the_corpus_validation_split(tmp_path, capsys):
    cfg = dict(task="passkey", seq_len=160, data="stdlib", tokenizer="bytes", seed=0, babi_tasks="qa1")
    paths = [checkpoint(tmp_path / f"run{i}", i, **cfg)[0] for i in range(2)]
    rc, stdout, err = cli(capsys, *paths, "--metrics", "passkey,copy,babilong", "--task-samples", "1",
                          "--passkey-lengths", "128,160", "--passkey-depths", "2", "--copy-lengths", "3,5",
                          "--babi-lengths", "512", "--out", str(tmp_path / "eval"), "--device", "cpu")
    assert rc == 0 and "Passkey" in stdout and "Copying" in stdout and "BABILong" in stdout, err
    rep = json.load(open(tmp_path / "eval" / "eval.json"))
    assert rep["babi_tasks"] == ["qa1"] and "val split" in rep["babi_filler"]
    for m in rep["models"]:
        assert np.array(m["passkey"]["exact"]).shape == (2, 2) and "ppl" not in m
        assert m["copy"]["lengths"] == [3, 5] and m["babilong"]["lengths"] == [512]
    for f in ("passkey.png", "copy.png", "babilong.png"):
        assert (tmp_path / "eval" / f).stat().st_size > 1000

def test_windows_that_would_overlap_are_refused(tmp_path, capsys):
    (tmp_path / "a.txt").write_text("the river runs down to the sea\n" * 64)   # one document: val, its tail
    ck, _ = checkpoint(tmp_path / "run", seq_len=8, data=str(tmp_path / "a.txt"), tokenizer="bytes", seed=0)
    argv = [ck, "--n-seqs", "4", "--eval-len", "32", "--metrics", "ppl", "--out", str(tmp_path / "eval")]
    assert "holds 99 tokens, 4 disjoint windows of 33 need 132: use fewer --n-seqs" in cli(capsys, *argv)[2]
    assert cli(capsys, *argv[:2], "3", *argv[3:])[0] == 0   # 3 x 33 = 99: exactly enough
    assert "unrecognized arguments: --allow-overlap" in cli(capsys, *argv, "--allow-overlap")[2]

def test_the_verdict_bootstrap_follows_the_seed():
    # one bucket past t_train, two sequences at +1 and -3 nats: a single bootstrap mean exceeds 0 only when it
    # draws the first sequence twice (1 in 4): which it draws is the seed's
    lo, hi, ref = [0, 4, 8], [4, 8, 16], torch.zeros(2, 3, dtype=torch.float64)
    per_seq = torch.tensor([[0, 0, 1.0], [0, 0, -3.0]], dtype=torch.float64)
    verdicts = [ev.length_generalization(per_seq, lo, hi, 8, ref, n_boot=1, seed=seed)["generalizes_to"]
                for seed in list(range(12)) * 2]
    assert set(verdicts) == {8, 16} and verdicts[:12] == verdicts[12:]

def test_a_run_whose_corpus_changed_is_refused_and_eval_json_records_the_step(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(token_cache, "DEFAULT_CACHE_DIR", str(tmp_path / "cache"))
    corpus, run, out = tmp_path / "corpus", str(tmp_path / "run"), tmp_path / "eval"
    corpus.mkdir()
    for i in range(3):   # one document held out
        (corpus / f"f{i}.py").write_text(CORPUS_TEXT.replace("river", f"river{i}"))
    train.main(["--data", str(corpus), "--seq-len", "16", "--batch-size", "4", "--steps", "2", "--quiet",
                "--out", run])
    argv = [run, "--metrics", "ppl", "--n-seqs", "2", "--eval-len", "32", "--out", str(out)]
    rc, stdout, err = cli(capsys, *argv)
    assert rc == 0 and "t_train 16, step 2" in stdout and json.load(open(out / "eval.json"))["models"][0][
        "step"] == 2, err
    before = (out / "eval.json").read_bytes()
    (corpus / "f0.py").unlink()   # the held-out document re-drawn from the two left
    rc, _, err = cli(capsys, *argv)
    assert rc == 2 and "its files changed" in err and len(err.strip().splitlines()) == 1, err
    assert (out / "eval.json").read_bytes() == before

def test_an_interrupt_leaves_the_previous_eval_json_with_its_own_figures(tmp_path, capsys, monkeypatch):
    ck, out = checkpoint(tmp_path / "run", seq_len=8, data=MARKOV, tokenizer="bytes")[0], tmp_path / "ev"
    argv = [ck, "--metrics", "ppl,state", "--n-seqs", "2", "--eval-len", "24", "--out", str(out), "--seed"]
    assert cli(capsys, *argv, "0")[0] == 0
    before = {f.name: f.read_bytes() for f in out.iterdir()}
    assert set(before) == {"eval.json", "ppl.png", "state.png"}
    savefig, drawn = matplotlib.figure.Figure.savefig, []

    def interrupted_savefig(fig, *args, **kw):   # SIGTERM (Ctrl-C) while the second figure is written
        drawn.append(fig)
        if len(drawn) == 2:
            raise KeyboardInterrupt
        savefig(fig, *args, **kw)
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", interrupted_savefig)
    rc, _, err = cli(capsys, *argv, "1")
    assert rc == 1 and err.endswith(f"interrupted: {out}/eval.json and its figures not written (any previous "
                                    "ones are intact)\n"), err
    assert {f.name: f.read_bytes() for f in out.iterdir()} == before   # no temporary file either
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    replace = os.replace

    def replace_after_a_sigterm(*args):   # one that comes while the files are renamed waits for none
        os.kill(os.getpid(), signal.SIGTERM)
        replace(*args)
    monkeypatch.setattr(os, "replace", replace_after_a_sigterm)
    signal.signal(signal.SIGINT, signal.default_int_handler)   # as in a terminal (a background job: SIG_IGN)
    assert cli(capsys, *argv, "1")[0] == 0 and json.load(open(out / "eval.json"))["args"]["seed"] == 1
    assert sorted(f.name for f in out.iterdir()) == sorted(before)
    assert (out / "ppl.png").read_bytes() != before["ppl.png"]
    assert signal.getsignal(signal.SIGINT) is signal.getsignal(signal.SIGTERM) is signal.default_int_handler

def test_the_defaults_are_the_checkpoints_and_the_buckets_have_edges_at_each_t_train_and_its_half(tmp_path):
    # t_train 8 and 10: --eval-len 16 x the larger; edges at 4, 8, and 5, 10 (off the log grid)
    spec = "markov:k=4,alpha=0.3,doc_len=256,docs=4,val_docs=4"   # documents that hold a window of 161
    cks = [checkpoint(tmp_path / f"run{t}", seq_len=t, data=spec, tokenizer="bytes")[0] for t in (8, 10)]
    args = ev.parse_args([*cks, "--n-seqs", "2", "--metrics", "ppl", "--out", str(tmp_path / "ev")])
    cfgs, t_trains, enc, refs = eval_flags.check_args(args)
    assert (t_trains, args.eval_len, args.tokenizer, refs) == ([8, 10], 160, "bytes", {})
    assert ev.read_eval_data(args, cfgs, t_trains)["data"] == data.load_data(spec).name
    assert args.windows.shape == (2, 161) and {4, 5, 8, 10, 160} <= set(args.edges)
    assert not {5, 10} & set(ev.log_edges(160))

def test_an_unwritable_out_is_refused_before_any_checkpoint_is_read(tmp_path, capsys, monkeypatch):
    ck, _ = checkpoint(tmp_path / "run", seq_len=8, data=MARKOV, tokenizer="bytes")
    monkeypatch.setattr(checkpoints, "from_pretrained", lambda *a, **kw: pytest.fail("measured first"))
    access = os.access   # a read-only folder, as a user (not root) would have it
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: not mode & os.W_OK and access(path, mode))
    rc, _, err = cli(capsys, ck, "--metrics", "ppl", "--out", str(tmp_path / "ro" / "ev"))
    assert rc == 2 and f"--out '{tmp_path}/ro/ev' is not a directory that can be written" in err, err

def test_over_seeds_reports_each_fix_by_its_mean_sem_and_worst_seed(tmp_path, capsys):
    # each seed's last-bucket NLL - control: -0.5, -0.1, -0.3 (+- 0.1, 0.1, 0.12) on seeds 0, 4, 7
    buckets = dict(lo=[0, 16], hi=[16, 64], nll=[1.0, 2.0], ppl=[np.e, np.e ** 2])
    gap = dict(nll=[0, 0.25], nll_sem=[0, 0.01])  # to the Bayes floor
    run = lambda label, censored=False, to=32, **diff: dict(label=label, t_train=16, gap=gap,
        ppl=dict(buckets=buckets), verdict=dict(generalizes_to=to, censored=censored), **diff)
    fixes = lambda d, se, to: [run(k, to=to, diff=dict(nll=[0, d], nll_sem=[0, se], reference=ref))
                               for k, ref in (("SP", "control"), ("TBTT", "streams"))]
    for seed, d, se, to in ((0, -0.5, 0.1, 32), (4, -0.1, 0.1, 32), (7, -0.3, 0.12, 512)):  # 512: 32 x 16
        (tmp_path / f"s{seed}").mkdir()
        (tmp_path / f"s{seed}" / "eval.json").write_text(json.dumps(
            {"models": [run("base"), run("control", censored=seed == 4), *fixes(d, se, to)]}))
    evals = [str(tmp_path / f"s{seed}") for seed in (0, 4, 7)]
    assert ev.main([*evals, "--over-seeds", "--labels", "0", "4", "7", "--out", str(tmp_path)]) == 0
    seeds = json.load(open(tmp_path / "seeds.json"))
    sp = seeds["summary"]["SP"]
    assert sp.pop("verdicts") == [32, 32, 512] and sp.pop("reference") == "control"   # (approx: numbers only)
    assert sp == pytest.approx(dict(diff=-0.3, diff_sem=0.2 / np.sqrt(3), worst=-0.1, worst_seed="4",
        beyond_3_sem=1, ppl_last=np.e ** 2, ppl_last_sem=0, fails_within_32x=3, gap_last=0.25,
        gap_last_sem=0))  # s.e.: ddof 1
    assert seeds["summary"]["control"]["fails_within_32x"] == 2 and "diff" not in seeds["summary"]["control"]
    assert seeds["seeds"]["4"]["SP"] == pytest.approx(dict(verdict=32, censored=False, ppl_last=np.e ** 2,
        ppl_within=np.e, t_train=16, diff=-0.1, diff_sem=0.1, gap=0.25, gap_sem=0.01))
    out = capsys.readouterr().out   # each fix against its own reference
    assert "SP - control: -0.300 +- 0.115" in out and "TBTT - streams: -0.300 +- 0.115" in out
    assert f"{'4':>5} {'SP':>16} {'32':>8} {np.e:>8.3f} {np.e ** 2:>9.3f} {'+0.250 +- 0.010':>17} " in out
    assert "SP: PPL last 7.389 +- 0.000 over the seeds, gap 0.250 +- 0.000, fails within 32 x T_train" in out
    assert os.path.exists(tmp_path / "seeds.png")
    (tmp_path / "s7" / "eval.json").write_text(json.dumps({"models": [run("base")]}))
    other = f"s7/eval.json evaluated ['base'] (['base'] with ppl), {evals[0]}/eval.json ['base', 'control'"
    for argv, word in [(evals[:1], "2 or more"), (evals, other),
                       (evals[:2] + [str(tmp_path / "none")], "no " + str(tmp_path / "none" / "eval.json"))]:
        assert ev.main([*argv, "--over-seeds", "--out", str(tmp_path / "x")]) == 2
        assert word in capsys.readouterr().err

def seed_eval(folder, *models):
    """folder/eval.json holding {"models": models}, or the text models[0] (a str); -> its path."""
    folder.mkdir(exist_ok=True)
    text = models[0] if models and isinstance(models[0], str) else json.dumps({"models": list(models)})
    (folder / "eval.json").write_text(text)
    return str(folder / "eval.json")

def seed_run(label, seed=0, d=None, **kw):
    """A run's entry in eval.json as run() writes it, what over_seeds reads: t_train 16, buckets up to 64,
    the training seed; d: its NLL - the reference's in the last bucket (+- 0.1)."""
    diff = {} if d is None else dict(diff=dict(nll=[0, 0, d], nll_sem=[0, 0, 0.1]))
    buckets = dict(lo=[0, 8, 16], hi=[8, 16, 64], nll=[3, 1, 2], ppl=np.exp([3, 1, 2]).tolist())
    return dict(label=label, path=f"runs/{label}", step=100, train_seed=seed, t_train=16,
                ppl=dict(buckets=buckets), verdict=dict(generalizes_to=64, censored=True), **diff, **kw)

def test_over_seeds_a_fix_that_hurts_is_no_gain_and_a_gap_in_a_curve_is_drawn(tmp_path, capsys, monkeypatch):
    # the same paths and steps as the other seed's, trained with another seed: each seed's own checkpoints
    a1 = seed_run("a", 1)
    a1["ppl"]["buckets"]["nll"][0] = None   # NaN in a bucket before the verdict's (eval.json's null)
    evals = [seed_eval(tmp_path / "s0", seed_run("a"), seed_run("b", d=0.5)),
             seed_eval(tmp_path / "s1", a1, seed_run("b", 1, d=0.7))]
    out = tmp_path / "new" / "out"
    rc, stdout, err = cli(capsys, *evals, "--over-seeds", "--out", str(out))
    assert rc == 0 and stdout.strip().endswith(f"wrote {out}/seeds.json, {out}/seeds.png"), err
    assert sorted(os.listdir(out)) == ["seeds.json", "seeds.png"]
    b = json.load(open(out / "seeds.json"))["summary"]["b"]
    assert (b["beyond_3_sem"], b["worst"], b["worst_seed"]) == (0, 0.7, "s1")   # + 5 s.e.: not "below -3"
    assert b["diff"] == pytest.approx(0.6)
    assert f"{'+0.500 +- 0.100':>18}\n" in stdout
    assert "b - reference: +0.600 +- 0.100, worst +0.700 (seed s1)" in stdout

    for error, code, word in [(KeyboardInterrupt, 1, f"interrupted: {out}/seeds.json and its figures not"),
                              (MemoryError, 2, "error: out of memory (MemoryError): lower --n-seqs")]:
        def fail(*args):
            raise error
        monkeypatch.setattr(report, "over_seeds", fail)
        rc, _, err = cli(capsys, *evals, "--over-seeds", "--out", str(out))
        assert rc == code and err.startswith(word) and len(err.splitlines()) == 1, err

def test_over_seeds_refuses_what_it_cannot_combine_in_one_line_naming_the_file_and_creates_nothing(tmp_path,
                                                                                                   capsys):
    s0 = seed_eval(tmp_path / "s0", seed_run("a"), seed_run("b", d=0.5))
    s1, out = str(tmp_path / "s1" / "eval.json"), tmp_path / "out"
    a, b = seed_run("a", 1), seed_run("b", 1, d=0.5)   # s0's runs trained with seed 1: accepted
    at8 = lambda m: dict(m, t_train=8)   # its edges: also at 8 (run() puts one at each t_train, t_train / 2)
    to = lambda m, hi: dict(m, ppl=dict(buckets=dict(lo=[0, *hi[:-1]], hi=hi, nll=[3, 1, 2, 2][:len(hi)],
                                                     ppl=[3, 1, 2, 2][:len(hi)])))
    text, no_ppl = json.dumps({"models": [a, b]}), {k: v for k, v in b.items() if k != "ppl"}
    cases = [([seed_run("a"), seed_run("b", d=0.5)], f"{s0} and {s1} both evaluated runs/a at step 100"),
             ([a, seed_run("b", 1)], f"b's --reference: False in {s1}, True in {s0}"),
             ([at8(a), at8(b)], f"a's --t-train: 8 in {s1}, 16 in {s0}"),
             ([to(a, [8, 16, 128]), to(b, [8, 16, 128])],   # as many buckets or more (numpy: inhomogeneous)
              f"a's edges (--eval-len): [8, 16, 128] in {s1}, [8, 16, 64] in {s0}"),
             ([to(a, [8, 16, 64, 128]), to(b, [8, 16, 64, 128])], "a's edges (--eval-len): [8, 16, 64, 128]"),
             ([dict(a, verdict=dict(generalizes_to=None, censored=None)), b], f"{s1} has no a's verdict"),
             ([a, dict(b, diff=dict(nll=[0, 0, 0.5], nll_sem=[None] * 3))], "has no b's diff_sem (null"),
             ([a, b, seed_run("c", 1)], f"{s1} evaluated ['a', 'b', 'c'] (['a', 'b', 'c'] with ppl), {s0}"),
             ([a, no_ppl], "evaluated ['a', 'b'] (['a'] with ppl)"),
             ([dict(a, t_train=12), b], f"{s1} is not an eval.json of this script (ValueError: 12 is not in"),
             (json.dumps({"runs": []}), "(KeyError: 'models')"), ("[]", "(TypeError: list indices"),
             ("", "(JSONDecodeError: Expecting value"), (text[:len(text) // 2], "(JSONDecodeError"),
             ([], f"{s1} evaluated [] ([] with ppl)")]
    for models, word in cases:
        seed_eval(tmp_path / "s1", *models if isinstance(models, list) else [models])
        rc, _, err = cli(capsys, s0, s1, "--over-seeds", "--out", str(out))
        assert rc == 2 and word in err and len(err.splitlines()) == 1 and not out.exists(), (word, err)
    for models, word in [([], "evaluated [] ([] with ppl)"), ([a, no_ppl], "['a', 'b'] (['a'] with")]:
        both = [seed_eval(tmp_path / f"like{i}", *models) for i in range(2)]   # each the first's like
        assert word in cli(capsys, *both, "--over-seeds", "--out", str(out))[2], word
    seed_eval(tmp_path / "s1", a, b)
    assert cli(capsys, s0, s1, "--over-seeds", "--out", str(out))[0] == 0
    twice = [s0, str(tmp_path / "s0"), "--labels", "x", "y"]
    rc, _, err = cli(capsys, *twice, "--over-seeds", "--out", str(out))
    assert rc == 2 and "each once and its own name" in err, err   # one file twice

def test_a_figure_the_new_evaluation_did_not_make_is_removed_and_named(tmp_path, capsys):
    ck = checkpoint(tmp_path / "run", seq_len=8, data=MARKOV, tokenizer="bytes", seed=3)[0]
    out = tmp_path / "ev"
    out.mkdir()
    (out / "copy.png").write_bytes(b"the user's")   # no evaluation here yet: the user's own files, kept
    (out / "state.png").write_bytes(b"the user's")
    argv = [ck, "--n-seqs", "2", "--eval-len", "12", "--out", str(out), "--metrics"]   # 12: 1.5 x t_train
    assert cli(capsys, *argv, "ppl")[0] == 0
    assert (out / "copy.png").read_bytes() == b"the user's" and json.load(open(out / "eval.json"))[
        "figures"] == ["ppl.png"]
    (out / "copy.png").unlink()
    assert cli(capsys, *argv, "ppl,state")[0] == 0   # replaces state.png (it writes one)
    (out / "notes.txt").write_text("mine")
    (out / "copy.png").mkdir()   # a folder of the user's, not a figure
    (out / "passkey.png").write_bytes(b"the user's, after the evaluation")   # not in its eval.json: kept
    rc, stdout, err = cli(capsys, *argv, "ppl")
    assert rc == 0 and sorted(os.listdir(out)) == ["copy.png", "eval.json", "notes.txt", "passkey.png",
                                                   "ppl.png"], err
    assert stdout.strip().endswith(f"wrote {out}/eval.json, {out}/ppl.png; removed the previous evaluation's "
                                   f"{out}/state.png")
    assert json.load(open(out / "eval.json"))["models"][0]["train_seed"] == 3   # (--over-seeds)
    (out / "eval.json").write_text(json.dumps({"figures": ["../run/ckpt.pt", "notes.txt", 3]}))
    assert cli(capsys, *argv, "ppl")[0] == 0   # what an eval.json names but PANELS' figures: never removed
    assert (tmp_path / "run" / "ckpt.pt").is_file() and (out / "notes.txt").exists()
    assert (out / "passkey.png").exists()

def test_over_seeds_summarises_every_run_past_the_colour_cycle(tmp_path, capsys):
    labels = [f"r{i}" for i in range(23)]   # more runs than colours (10) twice over
    evals = [seed_eval(tmp_path / f"s{s}", *[seed_run(k, s) for k in labels]) for s in (0, 1)]
    rc, _, err = cli(capsys, *evals, "--over-seeds", "--out", str(tmp_path / "out"))
    assert rc == 0, err
    assert list(json.load(open(tmp_path / "out" / "seeds.json"))["summary"]) == labels

def test_show_prints_each_verdict_and_each_curve_under_its_own_x(tmp_path, capsys):
    buckets = dict(lo=[0, 8, 16], hi=[8, 16, 64], ppl=[20.0, 2.5, 3.0], ppl_sem=[1.0, 0.1, 0.2])
    def run(label, censored, lengths):
        verdict = dict(generalizes_to=64, ratio=4.0, censored=censored, ppl_short=2.5)
        return dict(label=label, arch="mamba2", params=1000, t_train=16, ppl=dict(buckets=buckets),
                    verdict=verdict, copy=dict(lengths=lengths, char_mean=[1.0, 0.5], char_sem=[0.0, 0.1]))
    report.show(dict(models=[run("a", True, [5, 10]), run("b", False, [5, 20])]), str(tmp_path))
    out = capsys.readouterr().out
    assert "[a] mamba2, 1,000 params, t_train 16\n  verdict: generalizes to T = 64+ (4.0x t_train)" in out
    assert "[b] mamba2, 1,000 params, t_train 16\n  verdict: generalizes to T = 64 (4.0x t_train)" in out
    assert out.count("\n  string length") == 2 and out.count("\n  context length") == 1   # b's x: its own

def test_default_labels_are_unique_however_the_checkpoints_are_laid_out(tmp_path, capsys):
    assert eval_flags.default_labels(["runs/snap/step10.pt", "runs/snap/step8.pt"]) == ["snap/step10.pt",
                                                                                 "snap/step8.pt"]
    assert eval_flags.default_labels(["runs/A/x", "runs/B/x/", "runs/c"]) == ["A/x", "B/x", "c"]
    assert eval_flags.default_labels(["runs/A/x/ckpt.pt", "runs/B/x"]) == ["A/x", "B/x"]
    assert eval_flags.default_labels(["a/q/x", "b/q/x", "a/x"]) == ["a/q/x", "b/q/x", "a/x"]
    assert eval_flags.default_labels(["demo/seed0/base", "demo/seed0/SP/ckpt.pt"]) == ["base", "SP"]
    a = checkpoint(tmp_path / "A", 1, seq_len=8, data=MARKOV, tokenizer="bytes")[0]
    (tmp_path / "B").mkdir()
    b = checkpoint(tmp_path / "B" / "A", 2, seq_len=8, data=MARKOV, tokenizer="bytes")[0]
    argv = [a, b, "--metrics", "ppl", "--n-seqs", "2", "--eval-len", "12", "--out", str(tmp_path / "ev")]
    rc, _, err = cli(capsys, *argv, "--reference", "A")
    assert rc == 2 and "--reference A must name labels of" in err, err   # two runs named A: neither is "A"
    assert cli(capsys, *argv, "--reference", "B/A")[0] == 0
    models = json.load(open(tmp_path / "ev" / "eval.json"))["models"]
    assert [m["label"] for m in models] == [f"{tmp_path.name}/A", "B/A"]
    assert "diff" in models[0] and "diff" not in models[1]

def test_a_text_lm_is_not_evaluated_on_markov_states_nor_the_reverse(tmp_path, capsys):
    text = checkpoint(tmp_path / "text", seq_len=8, data="stdlib", tokenizer="bytes")[0]
    states = checkpoint(tmp_path / "states", seq_len=8, data=MARKOV, tokenizer="bytes")[0]
    argv = ["--metrics", "ppl", "--n-seqs", "2", "--eval-len", "12", "--out", str(tmp_path / "ev")]
    rc, _, err = cli(capsys, text, "--data", MARKOV, *argv)
    assert rc == 2 and f"trained on stdlib, {MARKOV} is a Markov process" in err, err
    rc, _, err = cli(capsys, states, "--data", "stdlib", *argv)
    assert rc == 2 and f"trained on {MARKOV}, stdlib is not a Markov process" in err, err
    assert cli(capsys, states, *argv)[0] == 0
