"""Each initial-state strategy against its definition in the paper's table."""
import numpy as np
import pytest
import torch

import data
import interventions
from conftest import tiny_lm
from plumbing.files import DataError
from plumbing.strategy_options import MIN_SIGMA, OPTIONS

def known_states(lm, batch, value_fn):
    """A final state whose "h" of head j in layer i is value_fn(i, j, shape)."""
    state = lm.zero_state(batch)
    for i, layer in enumerate(state):
        for head in range(layer["h"].shape[1]):
            layer["h"][:, head] = value_fn(i, head, layer["h"][:, head].shape)
    return state

@pytest.mark.parametrize("arch", ["mamba2", "rwkv6"])
def test_random_has_the_asked_sigma_and_zero_conv_or_shift(arch):
    state = interventions.make_strategy("random", tiny_lm(arch), 64, sigma=0.37, seed=1).initial_state(None)
    for layer in state:
        assert abs(layer["h"].std().item() - 0.37) < 0.01 and abs(layer["h"].mean().item()) < 0.01
        assert all(v.abs().sum() == 0 for k, v in layer.items() if k != "h"), "conv / token shift stay zero"
    # random noise fits nothing: what the model reaches leaves its mean 0 and variance sigma^2 as they were
    s = interventions.make_strategy("random", tiny_lm(arch), 4, sigma=0.37, seed=1)
    s.observe([{k: torch.randn_like(v) + 5 for k, v in layer.items()} for layer in tiny_lm(arch).zero_state(4)])
    for mu, var in zip(s.mu, s.var):
        assert mu.abs().sum() == 0 and torch.allclose(var, torch.tensor(0.37 ** 2))

def test_fitted_follows_the_ema_rule_and_samples_its_moments():
    lm = tiny_lm()   # Mamba-2: "h" [b, 8 heads, 16, 16]: N = 2 rows x 256 = 512 values per head below
    s = interventions.make_strategy("fitted", lm, 2)
    pair = torch.tensor([-1.0, 1.0]).view(2, 1, 1)   # over the rows
    sign = torch.tensor([1.0, -1.0]).repeat(8)       # over the last state dim
    # head j of layer i: i + j +- 1 (rows) +- 1 (state dim): mean i + j, population variance 1 + 1 = 2 over
    # the batch and the state dims (1 over the batch alone, per element); then 2j +- 2: mean 2j, variance 4
    s.observe(known_states(lm, 2, lambda i, j, shape: (i + j + pair + sign).expand(shape)))
    s.observe(known_states(lm, 2, lambda i, j, shape: (2.0 * j + 2 * pair).expand(shape).requires_grad_()))
    j = torch.arange(len(s.mu[0]), dtype=s.mu[0].dtype)
    for i in range(2):   # from mu = var = 0: first 0.9 (i + j) and 0.9 x 2, then 0.9 x the new + 10% of those
        torch.testing.assert_close(s.mu[i], 0.9 * 2 * j + 0.1 * 0.9 * (i + j))
        torch.testing.assert_close(s.var[i], torch.full_like(j, 0.9 * 4 + 0.1 * 0.9 * 2))   # 3.78
        assert not s.mu[i].requires_grad and not s.var[i].requires_grad   # fitted from detached states
    s = interventions.make_strategy("fitted", lm, 256, seed=3)
    first = s.initial_state(None)   # mu = var = 0: the zero state, its noise drawn all the same
    assert all(v.abs().sum() == 0 for layer in first for v in layer.values())
    s.observe(known_states(lm, 256, lambda i, j, shape: (j - 3.0) + (0.5 + j) * torch.randn(shape)))
    gen = torch.Generator().manual_seed(3)   # one draw per layer per batch, on the CPU, in layer order
    draws = [[torch.randn(layer["h"].shape, generator=gen) for layer in lm.zero_state(256)] for _ in range(2)]
    for i, layer in enumerate(s.initial_state(None)):   # the second batch: its numbers are the second draws
        mu, sd = s.mu[i].view(1, -1, 1, 1), s.var[i].sqrt().view(1, -1, 1, 1)   # per head
        torch.testing.assert_close(layer["h"], mu + sd * draws[1][i])
        h = layer["h"].transpose(0, 1).flatten(1)   # samples have the fitted moments
        torch.testing.assert_close(h.mean(1), s.mu[i], atol=0.05, rtol=0.02)
        torch.testing.assert_close(h.var(1), s.var[i], atol=0.05, rtol=0.05)
        assert layer["conv"].abs().sum() == 0

def test_sp_passes_the_previous_final_state_except_reset_rows():
    lm = tiny_lm()
    s = interventions.make_strategy("sp", lm, 400, p_reset=0.1, seed=0)
    assert s.initial_state(None) is None  # nothing passed before the first batch: zero, as "zero"'s
    assert interventions.make_strategy("zero", lm, 3).initial_state(None) is None  # None: lm.zero_state
    final = [{k: torch.randn_like(v) + 5 for k, v in layer.items()} for layer in lm.zero_state(400)]
    final[0]["h"].requires_grad_(True)
    s.observe(final)
    kept = [{k: v.detach().clone() for k, v in layer.items()} for layer in final]
    gen = torch.Generator().manual_seed(0)  # the reset rows: one draw per batch, none before the first
    for _ in range(2):  # two batches from one passed state, which initial_state must leave as it was
        reset = torch.rand(400, generator=gen) < 0.1
        init = s.initial_state(None)
        for layer, fin in zip(init, kept):
            for k in layer:
                assert not layer[k].requires_grad
                torch.testing.assert_close(layer[k][~reset], fin[k][~reset])  # exactly passed
                assert layer[k][reset].abs().sum() == 0                       # the whole row reset
        assert 0.06 < reset.float().mean().item() < 0.14

def test_tbtt_row_starting_a_new_document_starts_from_zero_the_others_continue():
    lm = tiny_lm("rwkv6")
    s = interventions.make_strategy("tbtt", lm, 3)
    assert s.initial_state(data.Batch(None, None, new_doc=torch.ones(3, dtype=torch.bool))) is None
    final = [{k: (torch.randn_like(v) + 5).double() for k, v in layer.items()} for layer in lm.zero_state(3)]
    s.observe(final)   # kept in float32, whatever the model's dtype
    for new_doc in ([False, True, False], [True, False, False]):   # the passed state left as it was
        new_doc = torch.tensor(new_doc)
        for layer, fin in zip(s.initial_state(data.Batch(None, None, new_doc=new_doc)), final):
            for k, v in layer.items():
                assert v.dtype == torch.float32 and v[new_doc].abs().sum() == 0
                torch.testing.assert_close(v[~new_doc], fin[k][~new_doc].float())
    # two documents read in chunks of 9 (data.DocumentStreams): with TBTT's carried state, the chunks' logits
    # equal those of each row's chunks run at once (Mamba-1: its state holds "h" and the conv window)
    lm = tiny_lm("mamba1").eval()
    rng = np.random.default_rng(0)
    tokens = np.concatenate([np.r_[19, rng.integers(0, 19, 40)] for _ in range(2)]).astype(np.uint16)
    sampler = data.DocumentStreams(tokens, 19, batch_size=2, seq_len=9, seed=0)
    s = interventions.make_strategy("tbtt", lm, 2)
    xs, logits = [], []
    for k in range(4):  # 36 tokens of each 41-token document
        batch = sampler.next_batch()
        assert batch.new_doc.tolist() == [k == 0] * 2  # each row stays in its document
        out, final = lm(batch.x, state=s.initial_state(batch))
        s.observe(final)
        xs.append(batch.x)
        logits.append(out.detach())
    with torch.no_grad():
        torch.testing.assert_close(torch.cat(logits, 1), lm(torch.cat(xs, 1))[0], atol=1e-5, rtol=1e-5)

def test_fitted_noise_fits_the_variance_not_the_std_and_draws_with_its_square_root():
    # every head's final states at j - 2 and j + 2: variance 4, std 2 (the states above have 0 or 1, where
    # the two agree); the draws must have the fitted variance 0.9 * 4, so a spread of sqrt(3.6)
    lm = tiny_lm()
    s = interventions.make_strategy("fitted", lm, 64, seed=0)
    signs = torch.tensor([-2.0, 2.0]).repeat(32).view(64, 1, 1)
    s.observe(known_states(lm, 64, lambda i, j, shape: (j + signs).expand(shape)))
    for i, layer in enumerate(s.initial_state(None)):
        torch.testing.assert_close(s.var[i], torch.full_like(s.var[i], 0.9 * 4))
        torch.testing.assert_close(layer["h"].transpose(0, 1).flatten(1).var(1), s.var[i], rtol=0.05, atol=0)

def test_make_strategy_refuses_a_bad_value_and_an_option_its_strategy_does_not_read():
    lm, nan, inf = tiny_lm(), float("nan"), float("inf")
    sigma = "--sigma must be in (0, 1e3] (its variance in float32), got "
    p_reset = "--p-reset must be a probability in [0, 1], got "
    tiny = (f"--sigma must be at least {MIN_SIGMA:.3g} (sigma^2 underflows in float32 below), "
            "got 1e-23: it is the zero state: use --init-state zero or a larger --sigma")
    known = "choose one of zero, random, fitted, sp, tbtt"
    sigmas = (-0.5, 0, nan, inf, -inf, 1001.0, "1", True)   # (True: a bool is no number here)
    bad = [*[("random", dict(sigma=v), sigma + repr(v)) for v in sigmas],
           *[("sp", dict(p_reset=v), p_reset + repr(v)) for v in (2.0, -0.1, nan, 1.01, "0.5", True)],
           ("random", dict(sigma=1e-23), tiny),
           *[("sp", dict(seed=v), f"--seed must be in [0, 2**63), got {v!r}") for v in (-1, 2 ** 63, 1.0)],
           ("warm", {}, f"unknown --init-state 'warm': {known}"),
           (["sp"], {}, f"unknown --init-state ['sp']: {known}"),
           ("random", dict(sgima=0.5), "--init-state random takes no --sgima (its options: --sigma, --seed): "
                                       "leave --sgima out")]
    flag = lambda k: "--" + k.replace("_", "-")
    for name, options in OPTIONS.items():   # an option a strategy does not read: refused
        bad += [(name, {k: 0.5}, f"--init-state {name} takes no {flag(k)} (its options: "
                 f"{', '.join(map(flag, options))}): leave {flag(k)} out") for k in ("sigma", "p_reset")
                if k not in options]
    assert len(bad) == 29 and {m for *_, m in bad} >= {
        "--init-state sp takes no --sigma (its options: --p-reset, --seed): leave --sigma out",
        "--init-state zero takes no --p-reset (its options: --seed): leave --p-reset out",
        "--init-state fitted takes no --sigma (its options: --seed): leave --sigma out",
        "--init-state random takes no --p-reset (its options: --sigma, --seed): leave --p-reset out",
        "--init-state tbtt takes no --p-reset (its options: --seed): leave --p-reset out"}
    for name, options, message in bad:
        with pytest.raises(DataError) as e:
            interventions.make_strategy(name, lm, 2, **options)
        assert str(e.value) == message
    for size in (0, 2.0, True):
        with pytest.raises(DataError, match=rf"^--batch-size must be a positive integer, got {size!r}$"):
            interventions.make_strategy("zero", lm, size)
    for name, options in [("random", dict(sigma=1e3, seed=0)), ("random", dict(sigma=np.float32(0.5))),
                          ("sp", dict(p_reset=0, seed=2 ** 63 - 1)), ("sp", dict(p_reset=1)),
                          *[(name, dict(seed=np.int64(3))) for name in interventions.STRATEGIES]]:
        interventions.make_strategy(name, lm, np.int64(2), **options)   # each at its bound: a usable value

def test_the_smallest_sigma_is_noise_and_a_reset_probability_of_0_or_1_keeps_or_resets_every_row():
    lm = tiny_lm()
    smallest = MIN_SIGMA   # sigma^2 the smallest normal float32: exact, as is its square root
    assert torch.tensor(smallest ** 2, dtype=torch.float32) > 0 and torch.tensor(1e-23 ** 2).item() == 0
    for layer in interventions.make_strategy("random", lm, 8, sigma=smallest).initial_state(None):
        assert (layer["h"] != 0).all() and abs(layer["h"].std().item() / smallest - 1) < 0.05
    final = [{k: torch.randn_like(v) + 5 for k, v in layer.items()} for layer in lm.zero_state(8)]
    for p, kept in ((0, True), (1, False)):
        s = interventions.make_strategy("sp", lm, 8, p_reset=p)
        s.observe(final)
        for layer in s.initial_state(None):
            assert all(bool((v != 0).all()) == kept for v in layer.values())
