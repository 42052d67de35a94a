"""Exercise 9's check, tightened (to paste into tests/test_course_kit.py in place of its exercise-9 test: the
imports are test_course_kit.py's). Run alone: python -m pytest -q tests/exercise9_check.py -k exercise9"""
import os
import sys

import torch

import model
from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "docs"))
import course  # noqa: E402

def test_exercise9_the_mixer_runs_its_recurrence_splits_exactly_and_serves_the_lm(monkeypatch):
    torch.manual_seed(0)
    m, x = course.DiagonalRNN(8, d_state=6), torch.randn(3, 11, 8)
    start = {"h": torch.randn(3, 6), "shift": torch.randn(3, 8)}
    h, prev, want = start["h"], start["shift"], []  # the docstring's recurrence, one step at a time
    for t in range(11):
        h = torch.exp(-torch.exp(m.log_rate)) * h + m.in_proj(torch.cat([x[:, t], prev], -1))
        want.append(m.out_proj(h))
        prev = x[:, t]
    y, state = m(x, start)
    torch.testing.assert_close((y, state["h"], state["shift"]), (torch.stack(want, 1), h, prev))
    zero = m.zero_state(3)
    assert zero["h"].shape == (3, 6) and zero["shift"].shape == (3, 8) and zero["h"].dtype == torch.float32
    torch.testing.assert_close(m(x), m(x, zero))  # None is the zero state
    for cuts in ([0, 4, 11], list(range(12))):  # in pieces, the state carried: one pass
        ys, state = [], start
        for a, b in zip(cuts, cuts[1:]):
            piece, state = m(x[:, a:b], state)
            ys.append(piece)
        torch.testing.assert_close((torch.cat(ys, 1), state), m(x, start))
    # ... gradients too: the returned state stays in the graph (the strategies detach it, not the mixer),
    # so a loss on the pieces reaches the input, the initial state and every weight as one pass's does
    weights = torch.randn(3, 11, 8)
    def grads(cuts):
        m.zero_grad()
        leaves = [x.clone().requires_grad_(), *(v.clone().requires_grad_() for v in start.values())]
        ys, state = [], dict(zip(start, leaves[1:]))
        for a, b in zip(cuts, cuts[1:]):
            piece, state = m(leaves[0][:, a:b], state)
            ys.append(piece)
        ((torch.cat(ys, 1) * weights).sum()).backward()
        return [v.grad for v in leaves] + [p.grad for p in m.parameters()]
    torch.testing.assert_close(grads([0, 4, 11]), grads([0, 11]))
    monkeypatch.setitem(model.ARCHS, "diagonal_rnn", lambda cfg, i: (course.DiagonalRNN(cfg.d_model), None))
    lm = model.LM(model.ModelConfig(arch="diagonal_rnn", vocab_size=13, d_model=16, n_layer=2))
    idx = torch.randint(0, 13, (2, 20))
    logits, final = lm(idx)
    head, state = lm(idx[:, :7])
    tail, rest = lm(idx[:, 7:], state)
    torch.testing.assert_close((torch.cat([head, tail], 1), rest), (logits, final))
    torch.testing.assert_close(lm(idx, lm.zero_state(2))[0], logits)
    logits.square().mean().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in lm.parameters())
