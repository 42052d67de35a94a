"""The switching (change-point) Markov process of tasks.py: its sampler and its exact loss floor."""
import itertools
import math

import numpy as np
import pytest
import torch

import tasks
from tasks import DataError


def brute_force_nll(chain, k, alpha, hazard):
    """-log p(chain[t+1] | chain[:t+1]) by summing over every change-point pattern explicitly.

    p(chain[:t+2]) = (1/K) * sum over cut patterns c_1..c_t of prod_s P(c_s) * prod over segments of
    the Dirichlet-multinomial likelihood of the segment's transitions (each row of P integrated out).
    """
    def dirmult(trans):                      # marginal likelihood of transitions under one fresh P
        counts = np.zeros((k, k))
        logp = 0.0
        for i, j in trans:
            logp += math.log((counts[i, j] + alpha) / (counts[i].sum() + k * alpha))
            counts[i, j] += 1
        return logp

    def log_prefix(n_tokens):               # log p(chain[:n_tokens])
        trans = list(zip(chain[:n_tokens - 1], chain[1:n_tokens]))
        terms = []
        for cuts in itertools.product([0, 1], repeat=max(0, len(trans) - 1)):   # cut before transition s >= 1
            logp = sum(math.log(hazard if c else 1 - hazard) for c in cuts)
            start = 0
            for s, c in enumerate(cuts, start=1):
                if c:
                    logp += dirmult(trans[start:s])
                    start = s
            terms.append(logp + dirmult(trans[start:]))
        return -math.log(k) + np.logaddexp.reduce(terms)

    return np.array([log_prefix(t + 1) - log_prefix(t + 2) for t in range(len(chain) - 1)])


@pytest.mark.parametrize("k,alpha,hazard", [(2, 0.5, 0.3), (3, 0.2, 0.1), (2, 1.0, 0.9)])
def test_switching_floor_matches_brute_force(k, alpha, hazard):
    rng = np.random.default_rng(0)
    chains = rng.integers(0, k, size=(3, 9))
    fast = tasks.switching_bayes_nll(chains, k, alpha, hazard)
    for chain, row in zip(chains, fast):
        np.testing.assert_allclose(row, brute_force_nll(chain, k, alpha, hazard), rtol=1e-10, atol=1e-12)
    # with the eot in front: one extra first entry, -log(1/K), and the same rest
    with_eot = np.concatenate([np.full((3, 1), k), chains], axis=1)
    out = tasks.switching_bayes_nll(torch.from_numpy(with_eot), k, alpha, hazard)
    assert torch.is_tensor(out) and out.shape == (3, 9)
    np.testing.assert_allclose(out[:, 0].numpy(), math.log(k))
    np.testing.assert_allclose(out[:, 1:].numpy(), fast, rtol=1e-12)


def test_switching_floor_without_change_points_is_the_markov_floor():
    tokens, _ = tasks.sample_markov(4, 0.3, 200, 5, seed=3)
    np.testing.assert_allclose(tasks.switching_bayes_nll(tokens, 4, 0.3, 0.0),
                               tasks.markov_bayes_nll(tokens, 4, 0.3), rtol=1e-10)


def test_switching_sampler_deterministic_and_switches():
    k, alpha, hazard = 4, 0.1, 0.01
    a, seg = tasks.sample_switching(k, alpha, hazard, 3000, 6, seed=1)
    b, _ = tasks.sample_switching(k, alpha, hazard, 3000, 2, seed=1)
    np.testing.assert_array_equal(a[:2], b)                          # doc d does not depend on docs
    assert not np.array_equal(a, tasks.sample_switching(k, alpha, hazard, 3000, 6, seed=1, split="val")[0])
    assert a.min() >= 0 and a.max() < k
    assert (seg[:, :2] == 0).all() and (np.diff(seg, axis=1) >= 0).all()
    n_cuts = seg[:, -1].sum()
    assert 6 * 2998 * hazard / 3 < n_cuts < 6 * 2998 * hazard * 3   # about hazard per transition
    # every segment really has its own matrix: the empirical next-token law of a frequent row differs
    doc = int(np.argmax(seg[:, -1]))
    x, s = a[doc], seg[doc]
    laws = []
    for g in np.unique(s):
        t = np.flatnonzero((s == g)[1:] & (x[:-1] == x[0])) + 1    # transitions from x[0] in segment g
        if len(t) >= 40:
            laws.append(np.bincount(x[t], minlength=k) / len(t))
    assert len(laws) >= 2 and max(np.abs(p - laws[0]).sum() for p in laws[1:]) > 0.3


def test_switching_floor_forgets():
    # Within a segment the floor improves with context; a model that never forgets (the markov
    # floor applied to switching data) falls far behind it once change points have happened.
    k, alpha, hazard = 8, 0.3, 1 / 128
    tokens, _ = tasks.sample_switching(k, alpha, hazard, 1024, 32, seed=0, split="val")
    sw = tasks.switching_bayes_nll(tokens, k, alpha, hazard).mean(0)
    mk = tasks.markov_bayes_nll(tokens, k, alpha).mean(0)
    assert sw[:8].mean() > sw[100:200].mean() + 0.2          # it learns in context
    assert mk[600:].mean() > sw[600:].mean() + 0.2           # and forgetting matters later


def test_switching_data_loads():
    d = tasks.load_data("switching:k=5,alpha=0.2,hazard=0.01,doc_len=300,docs=6,val_docs=4")
    assert d.vocab_size == 6 and d.eot_token == 5 and len(d.train) == 6 * 301 and len(d.val) == 4 * 301
    assert "hazard=0.01" in d.name and d.info["hazard"] == 0.01
    w = tasks.eval_windows(d.val, 4, 301, seed=0, eot_token=5)
    nll = d.optimal_nll(w)
    assert nll.shape == (4, 300) and torch.isfinite(nll).all()
    with pytest.raises(DataError, match="document"):
        d.optimal_nll(tasks.eval_windows(d.val, 2, 400, seed=0, eot_token=5))
    with pytest.raises(DataError, match="hazard"):
        tasks.load_data("switching:hazard=2")
    with pytest.raises(DataError, match="hazard"):
        tasks.load_data("switching:rate=0.1")


# --- related documents: markov shared=C --------------------------------------------------------------

def test_markov_floor_with_a_prior_by_hand():
    # k = 2, eot = 2, prior pseudo-counts [[1, 3], [2, 2]]; tokens eot 0 1 0 0:
    # eot->0: 1/2 (first token uniform); 0->1: 3/4; 1->0: 2/4; 0->0: row 0 is now [1, 3+1] -> 1/5
    nll = tasks.markov_bayes_nll(np.array([[2, 0, 1, 0, 0]]), k=2, alpha=0.3, prior=[[1, 3], [2, 2]])
    np.testing.assert_allclose(nll[0], -np.log([1 / 2, 3 / 4, 2 / 4, 1 / 5]))
    # the constant prior is the original process
    x = np.array([[3, 0, 2, 2, 1, 0, 2]])
    np.testing.assert_allclose(tasks.markov_bayes_nll(x, 3, 0.5, prior=np.full((3, 3), 0.5)),
                               tasks.markov_bayes_nll(x, 3, 0.5))


def test_shared_documents_scatter_around_one_base_matrix():
    g = tasks.markov_prior(8, 0.3, shared=1.0, seed=0)           # the base matrix G itself
    np.testing.assert_allclose(g.sum(1), 1.0)
    assert (tasks.markov_prior(8, 0.3) == 0.3).all()             # shared = 0: independent documents
    spread = {}
    for c in (1.0, 100.0):
        _, P = tasks.sample_markov(8, 0.3, doc_len=4, docs=64, seed=0, shared=c)
        spread[c] = np.abs(P - g).mean()
    assert spread[100.0] < 0.3 * spread[1.0]                      # larger C: documents closer to G


def test_shared_markov_data_uses_the_prior_in_its_floor():
    d = tasks.load_data("markov:k=4,alpha=0.5,doc_len=64,docs=8,val_docs=4,shared=3")
    w = d.val[:65].astype(np.int64)[None]
    np.testing.assert_allclose(d.optimal_nll(w), tasks.markov_bayes_nll(w, 4, 0.5, prior=tasks.markov_prior(4, 0.5, 3.0)))
    with pytest.raises(DataError, match="shared >= 0"):
        tasks.load_data("markov:k=4,shared=-1")
