"""The instructor's judged checks of docs/EXERCISES.md (docs/kit.py runs them; withheld from the copy). Each
runs an exercise's functions on inputs drawn from the class's seed in one process, the worker, where the
student's code runs (KIT_JUDGE=work): its results are saved as plain data, arrays as .npy without pickles
and the rest as JSON, in KIT_JUDGE_DIR. Another process, the judge, in a folder of the teacher's files
alone (KIT_JUDGE=judge), draws the same inputs, computes the reference's results and compares: the verdict
comes from a process that never imported the student's code, so patching torch, pytest or the report in
the worker changes nothing. Run by hand (no KIT_JUDGE), both happen in this process."""
import json
import os
import random
import re
import sys

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "docs"))
PHASE = os.environ.get("KIT_JUDGE", "")   # "work", "judge", or "" (both, here)
SEED = int(os.environ.get("KIT_CLASS_SEED", "0"))
NAME = re.compile(r"^[A-Za-z0-9_.-]+$")

def judged(name, tmp_path, work, judge):
    """work() (in the worker: the student's code) -> {key: int, float, str, None, list, or an array or
    tensor}; judge(results) (in the judge: the reference's code) asserts. The results travel as files:
    arrays as float64/int64 .npy (np.load(allow_pickle=False)), the rest as one JSON."""
    folder = os.environ.get("KIT_JUDGE_DIR") or str(tmp_path)
    if PHASE in ("", "work"):
        save(folder, name, work())
    if PHASE in ("", "judge"):
        judge(load(folder, name))

def save(folder, name, results):
    plain, arrays = {}, {}
    for key, value in results.items():
        assert NAME.match(key), key
        if torch.is_tensor(value) or isinstance(value, np.ndarray):
            arrays[key] = value
        else:
            plain[key] = value
    for key, value in arrays.items():
        if torch.is_tensor(value):   # (bf16 has no numpy dtype)
            value = value.detach().cpu()
            value = (value.double() if value.is_floating_point() else value.long()).numpy()
        np.save(os.path.join(folder, f"{name}.{key}.npy"), value.astype(
            np.int64 if value.dtype.kind in "iub" else np.float64), allow_pickle=False)
    with open(os.path.join(folder, f"{name}.json"), "w") as f:
        json.dump({"plain": plain, "arrays": sorted(arrays)}, f)

def load(folder, name):
    """The worker's results; a missing or broken file is a failure that says so (the worker crashed, or
    wrote something else)."""
    path = os.path.join(folder, f"{name}.json")
    assert os.path.isfile(path), f"the worker saved no results for {name}"
    with open(path) as f:
        saved = json.load(f)
    assert isinstance(saved, dict) and isinstance(saved.get("plain"), dict), f"{name}.json: not the worker's"
    results = dict(saved["plain"])
    for key in saved.get("arrays", []):
        assert isinstance(key, str) and NAME.match(key), key
        results[key] = np.load(os.path.join(folder, f"{name}.{key}.npy"), allow_pickle=False)
    return results

def attempt(f, *args, **kwargs):
    """f(*args) in the worker, or the error it raised as text ("NotImplementedError: exercise 4")."""
    try:
        return f(*args, **kwargs)
    except Exception as e:   # noqa: BLE001 (the student's code: any error is a result to judge)
        return f"{type(e).__name__}: {e}".splitlines()[0][:300]

def same(got, want, what, **tolerance):
    """The judge's comparison: got (from the worker's files) is want (the reference's), an error text
    named as the student's."""
    assert not isinstance(got, str), f"{what}: {got}"
    got = np.asarray(got)
    want = want.detach().cpu().numpy() if torch.is_tensor(want) else np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, the reference's {want.shape}"
    np.testing.assert_allclose(got, want, err_msg=what, **tolerance)

def agree(got, want, tolerance):
    """The judge's verdict on a worker's results got: every key of want (the reference's results on the
    same inputs) there and equal; arrays within tolerance (rtol, atol), anything else exactly."""
    for key, value in want.items():
        assert key in got, f"the worker saved no {key}"
        if isinstance(value, (np.ndarray, torch.Tensor)):
            same(got[key], value, key, **tolerance)
        else:   # (as JSON gives it back: tuples as lists)
            value = json.loads(json.dumps(value))
            assert got[key] == value, f"{key}: {got[key]!r}, the reference's {value!r}"

def plain(value):
    """A result as judged() saves it: a tensor as float64/int64 on the CPU (its dtype recorded by the
    computation when it matters), a None or an error text as itself."""
    return value.detach().cpu() if torch.is_tensor(value) else value

def judged_outputs(name, tmp_path, module, compute, **tolerance):
    """compute(module) -> {key: value}, run in the worker on the student's module and in the judge on the
    reference's (module: its name), which must agree."""
    import importlib
    judged(name, tmp_path, lambda: compute(importlib.import_module(module)),
           lambda got: agree(got, compute(importlib.import_module(module)), tolerance))

class Calls(TorchFunctionMode):
    """Counts the torch functions called inside it: observed in the worker, and so forgeable there."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))

def with_grads(f, inputs, weights):
    """f(*inputs) -> outputs, and the gradients of sum(weights * outputs) with respect to each input (None
    stays None): a dict, or the error text."""
    leaves = [None if v is None else v.detach().clone().requires_grad_() for v in inputs]
    outputs = attempt(f, *leaves)
    if isinstance(outputs, str):
        return {"outputs": outputs}
    try:
        loss = sum((w * o).sum() for w, o in zip(weights, outputs))
        grads = torch.autograd.grad(loss, [v for v in leaves if v is not None], allow_unused=True)
    except Exception as e:   # noqa: BLE001
        return {"outputs": f"{type(e).__name__}: {e}".splitlines()[0][:300]}
    found = {f"out{i}": plain(o) for i, o in enumerate(outputs)}
    found.update({f"grad{i}": plain(g) if g is not None else "no gradient"
                  for i, g in enumerate(v for v in grads)})
    found["dtypes"] = [str(o.dtype) for o in outputs]
    return found

def flat(prefix, results):
    return {f"{prefix}_{k}": v for k, v in results.items()}

# ==== Exercise 4: Definition 3.2 ====
def drawn_curves(seed, count=200):
    """(ppl, t_train) pairs drawn from seed: lengths 1 to 40, values from a few levels (ties, repeats of
    p*, later and lower minima), t_train from 1 to the length."""
    g = random.Random(seed)
    curves = []
    for _ in range(count):
        n = g.randint(1, 40)
        curves.append(([g.choice([2.0, 2.5, 3.0, 3.5, 4.0]) + g.choice([0.0, 0.0, 0.01]) for _ in range(n)],
                       g.randint(1, n)))
    return curves

def pstar_results(evaluate):
    """length_generalization_pstar on the curves drawn from the class's seed, each as a list and a tensor:
    its verdicts (its type observed in the worker)."""
    verdicts = []
    for ppl, t in drawn_curves(SEED):
        for curve in (ppl, torch.tensor(ppl)):
            got = attempt(evaluate.length_generalization_pstar, curve, t)
            verdicts.append(got if type(got) is int or isinstance(got, str) else
                            f"not a Python int: {type(got).__name__}")
    return {"verdicts": verdicts}

def test_exercise4_judged(tmp_path):
    judge_exercise(4, tmp_path)

# ==== Exercise 8: the Markov Bayes floor ====
def markov_cases(seed, count=12):
    """(tokens, k, alpha, prior) drawn from seed: k from 2 to 6, windows from a document's eot or its first
    token, a prior matrix in half of them."""
    g = np.random.default_rng(seed)
    cases = []
    for _ in range(count):
        k = int(g.integers(2, 7))
        n, T = int(g.integers(1, 5)), int(g.integers(2, 40))
        tokens = g.integers(0, k, size=(n, T))
        tokens[g.random(n) < 0.5, 0] = k   # eot: the window starts a document
        prior = g.uniform(0.1, 3.0, size=(k, k)) if g.random() < 0.5 else None
        cases.append((tokens, k, float(g.uniform(0.1, 2.0)), prior))
    return cases

MARKOV_BAD = [[0, 1, 0], [[0]], [[0, 3]], [[0, -1]], [[2, 0, 2, 1]]]   # k = 2: shapes, ids, an eot inside

def markov_results(data):
    results = {}
    for i, (tokens, k, alpha, prior) in enumerate(markov_cases(SEED)):
        for form, x in (("numpy", tokens), ("torch", torch.from_numpy(tokens))):
            got = attempt(data.markov_bayes_nll, x, k, alpha, prior)
            results[f"kind{i}{form}"] = got if isinstance(got, str) else f"{type(got).__name__} {got.dtype}"
            results[f"nll{i}{form}"] = got if isinstance(got, str) else torch.as_tensor(np.asarray(got))
    for j, bad in enumerate(MARKOV_BAD):
        got = attempt(data.markov_bayes_nll, np.array(bad), 2, 0.3)
        results[f"bad{j}"] = got.split(":")[0] if isinstance(got, str) else "no error"
    return results

def test_exercise8_judged(tmp_path):
    judge_exercise(8, tmp_path)

# ==== Exercise 1: chunked SSD ====
def ssd_inputs(seed, b, t, h, p, g, n, strong=False, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    N = lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float64)
    U = lambda *shape: torch.rand(*shape, generator=gen, dtype=torch.float64)
    A = -(U(h) * (10.0 if strong else 2.0) + 0.1)
    dt = U(b, t, h) + (1.0 if strong else 0.01)
    return [v.to(dtype) for v in (N(b, t, h, p), dt, A, N(b, t, g, n), N(b, t, g, n), N(b, h, p, n))]

def ssd_results(ssm):
    """ssd_chunked on inputs drawn from the class's seed: values and gradients (float64, float32 with
    decays of up to 10 nats a step), None against zeros, and its torch calls from t = 512 to 1024."""
    results = {}
    for i, (shape, chunk) in enumerate([((2, 37, 4, 3, 2, 5), 8), ((1, 64, 2, 4, 1, 3), 16),
                                        ((2, 10, 3, 2, 3, 4), 64), ((1, 1, 1, 1, 1, 1), 1)]):
        inputs = ssd_inputs(SEED + i, *shape)
        weights = [torch.randn(shape[0], shape[1], shape[2], shape[3], dtype=torch.float64,
                               generator=torch.Generator().manual_seed(SEED)),
                   torch.randn(shape[0], shape[2], shape[3], shape[5], dtype=torch.float64,
                               generator=torch.Generator().manual_seed(SEED + 1))]
        f = lambda x, dt, A, B, C, s0: ssm.ssd_chunked(x, dt, A, B, C, initial_state=s0, chunk_size=chunk)
        results.update(flat(f"case{i}", with_grads(f, inputs, weights)))
        none = attempt(ssm.ssd_chunked, *inputs[:5], initial_state=None, chunk_size=chunk)
        zeros = attempt(ssm.ssd_chunked, *inputs[:5], initial_state=torch.zeros_like(inputs[5]),
                        chunk_size=chunk)
        results[f"case{i}_none_is_zeros"] = none if isinstance(none, str) else zeros if isinstance(
            zeros, str) else all(torch.equal(a, b) for a, b in zip(none, zeros))
    strong = ssd_inputs(SEED, 1, 128, 2, 4, 1, 8, strong=True, dtype=torch.float32)
    weights = [torch.ones(1, 128, 2, 4), torch.ones(1, 2, 4, 8)]
    results.update(flat("strong", with_grads(lambda *v: ssm.ssd_chunked(*v[:5], initial_state=v[5],
                                                                        chunk_size=64), strong, weights)))
    results["steps"] = steps(lambda t: ssd_inputs(SEED, 1, t, 2, 4, 1, 8),
                             lambda v: ssm.ssd_chunked(*v[:5], initial_state=v[5], chunk_size=64))
    return results

def steps(inputs, f):
    """"few": fewer than 256 more torch calls at t = 1024 than at 512 (chunks of 64); "a loop" else."""
    calls = []
    for t in (512, 1024):
        v = inputs(t)
        with Calls() as counted:
            got = attempt(f, v)
        if isinstance(got, str):
            return got
        calls.append(counted.n)
    return "few" if calls[1] - calls[0] < 256 else "a loop"

def test_exercise1_judged(tmp_path):
    judge_exercise(1, tmp_path)

# ==== Exercise 2: the chunked GLA / RWKV-6 scan ====
def scan_inputs(seed, b, t, h, dk, dv, nats, dtype=torch.float64, state=True):
    """q, k, v, g (log decays of `nats` per step, or up to it) and an initial state (or None)."""
    gen = torch.Generator().manual_seed(seed)
    N = lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float64)
    g = -torch.rand(b, t, h, dk, generator=gen, dtype=torch.float64) * nats - 0.01
    s0 = N(b, h, dk, dv) if state else None
    return [v if v is None else v.to(dtype) for v in (N(b, t, h, dk), N(b, t, h, dk), N(b, t, h, dv), g, s0)]

def scan_results(gla):
    results = {}
    cases = [(8, 4, False, 40.0), (8, 8, True, 1.0), (16, 32, False, 0.5), (4, 4, True, 40.0)]
    for i, (t, chunk, shift, nats) in enumerate(cases):
        for j, state in enumerate((True, False)):
            inputs = scan_inputs(SEED + 7 * i + j, 2, 2 * t + 3, 2, 3, 5, nats, state=state)
            weights = [torch.randn(2, 2 * t + 3, 2, 5, dtype=torch.float64,
                                   generator=torch.Generator().manual_seed(SEED)),
                       torch.randn(2, 2, 3, 5, dtype=torch.float64,
                                   generator=torch.Generator().manual_seed(SEED + 1))]
            f = lambda q, k, v, g, s0: gla.chunked_scan(q, k, v, g, s0, chunk, shift)
            results.update(flat(f"case{i}{j}", with_grads(f, inputs, weights)))
    for shift in (False, True):   # float32, 10 nats a step, chunks of 64: 640 nats a chunk
        inputs = scan_inputs(SEED, 1, 130, 2, 4, 4, 0.0, dtype=torch.float32)
        inputs[3] = torch.full_like(inputs[3], -10.0)
        results.update(flat(f"strong{int(shift)}", with_grads(
            lambda *v: gla.chunked_scan(*v, 64, shift), inputs,
            [torch.ones(1, 130, 2, 4), torch.ones(1, 2, 4, 4)])))
    results["steps"] = steps(lambda t: scan_inputs(SEED, 1, t, 2, 4, 4, 1.0),
                             lambda v: gla.chunked_scan(*v, 64, False))
    return results

def test_exercise2_judged(tmp_path):
    judge_exercise(2, tmp_path)

# ==== Exercises 3 and 5: position-wise perplexity, Effective Remembrance ====
def recorded(lm, calls):
    """lm, its forward recording each call's (rows, positions) in calls: observed in the worker."""
    forward = lm.forward
    lm.forward = lambda idx, *a, **kw: calls.append(list(idx.shape)) or forward(idx, *a, **kw)
    return lm

def perplexity_results(ev):
    from test_evaluate import CountLM, ToyLM, tokens
    results = {}
    for name, lm, x in [("toy", ToyLM(seed=SEED % 1000), tokens(5, 23, seed=SEED % 1000)),
                        ("count", CountLM(), tokens(4, 17, vocab=5, seed=SEED % 1000 + 1)),
                        ("bf16", CountLM(dtype=torch.bfloat16), tokens(3, 9, vocab=5, seed=SEED % 1000 + 2))]:
        results[f"{name}_naive"] = plain(attempt(ev.position_nll_naive, lm, x))
        for chunk_len, batch_size in [(1, 2), (3, 8), (4, 1), (64, 5)]:
            calls = []
            got = attempt(ev.sequence_nll, recorded(lm, calls), x, chunk_len, batch_size)
            del lm.forward
            results[f"{name}_seq_{chunk_len}_{batch_size}"] = plain(got)
            results[f"{name}_streamed_{chunk_len}_{batch_size}"] = isinstance(got, str) or (
                max(b for b, _ in calls) <= batch_size and max(t for _, t in calls) <= chunk_len
                and sum(b * t for b, t in calls) == x.numel() - len(x))
        results[f"{name}_mean"] = plain(attempt(ev.position_nll, lm, x, 3, 2))
    return results

def test_exercise3_judged(tmp_path):
    judge_exercise(3, tmp_path)

def remembrance_results(ev):
    from test_evaluate import CountLM, ToyLM, tokens
    results = {}
    for name, lm, x, T, cuts in [("toy", ToyLM(seed=SEED % 1000), tokens(4, 30, seed=SEED % 1000), 20,
                                  [0, 19, 3, 3, 10, 1]),
                                 ("count", CountLM(), tokens(6, 30, vocab=5, seed=SEED % 1000), 24,
                                  [0, 23, 1, 4, 4, 12, 2])]:
        ev.DISTANCES["wide"] = lambda p, q: 4 * ev.DISTANCES["tv"](p, q) - 0.1   # leaves [0, 1]
        try:
            for distance in ("tv", "js", "cos", "wide"):
                calls = []
                got = attempt(ev.effective_remembrance_naive, recorded(lm, calls), x, T, cuts, distance)
                del lm.forward
                results[f"{name}_{distance}"] = plain(got)
                results[f"{name}_{distance}_calls"] = isinstance(got, str) or sorted(
                    {tuple(c) for c in calls}) == sorted({(len(x), T - t) for t in cuts})
        finally:
            del ev.DISTANCES["wide"]
    return results

def test_exercise5_judged(tmp_path):
    judge_exercise(5, tmp_path)

# ==== Exercises 6 and 7: fitted noise, State Passing and TBTT ====
def drawn_state(lm, batch, seed, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    return [{k: scale * torch.randn(v.shape, generator=gen) + 0.5 * (i + 1) for k, v in layer.items()}
            for i, layer in enumerate(lm.zero_state(batch))]

def states(prefix, state):
    """A list of layers' state dicts (or None) as results: each key's values, and its dtype."""
    if state is None or isinstance(state, str):
        return {prefix: state}
    found = {}
    for i, layer in enumerate(state):
        for k, v in layer.items():
            found[f"{prefix}_{i}_{k}"] = plain(v)
            found[f"{prefix}_{i}_{k}_kind"] = f"{v.dtype} grad={v.requires_grad}"
    return found

def noise_results(interventions):
    from conftest import tiny_lm
    results = {}
    lm = tiny_lm()
    s = interventions.make_strategy("fitted", lm, 3, seed=SEED % 1000)
    results.update(states("first", attempt(s.initial_state, None)))
    for k in range(2):
        state = drawn_state(lm, 3, SEED + k, scale=1.0 + k)
        state[0]["h"].requires_grad_()
        attempt(s.observe, state)
        results.update(states(f"after{k}", attempt(s.initial_state, None)))
    results.update({f"mu{i}": plain(m) for i, m in enumerate(s.mu)})
    results.update({f"var{i}": plain(v) for i, v in enumerate(s.var)})
    for arch in ("mamba2", "rwkv6"):
        r = interventions.make_strategy("random", tiny_lm(arch), 3, sigma=0.37, seed=SEED % 1000)
        attempt(r.observe, drawn_state(tiny_lm(arch), 3, SEED))
        results.update(states(f"random_{arch}", attempt(r.initial_state, None)))
        results.update({f"random_{arch}_var{i}": plain(v) for i, v in enumerate(r.var)})
    return results

def test_exercise6_judged(tmp_path):
    judge_exercise(6, tmp_path)

def passed_results(interventions):
    import data
    from conftest import tiny_lm
    results = {}
    lm = tiny_lm()
    s = interventions.make_strategy("sp", lm, 40, p_reset=0.1, seed=SEED % 1000)
    results.update(states("sp_first", attempt(s.initial_state, None)))
    final = drawn_state(lm, 40, SEED)
    final[0]["h"].requires_grad_()
    attempt(s.observe, final)
    for k in range(3):   # three batches from one passed state, which must stay as it was
        results.update(states(f"sp{k}", attempt(s.initial_state, None)))
    lm = tiny_lm("rwkv6").double()
    t = interventions.make_strategy("tbtt", lm, 3)
    first = data.Batch(None, None, torch.ones(3, dtype=torch.bool))   # every row a new document
    results.update(states("tbtt_first", attempt(t.initial_state, first)))
    attempt(t.observe, [{k: v.double() for k, v in layer.items()} for layer in drawn_state(lm, 3, SEED)])
    for k, new_doc in enumerate(([False, True, False], [True, False, False], [False, False, False])):
        batch = data.Batch(None, None, torch.tensor(new_doc))
        results.update(states(f"tbtt{k}", attempt(t.initial_state, batch)))
    return results

def test_exercise7_judged(tmp_path):
    judge_exercise(7, tmp_path)

# ==== Exercise 9: a mixer with an exact state split ====
def mixer_results(course):
    gen = torch.Generator().manual_seed(SEED)
    m = course.DiagonalRNN(8, d_state=6)
    with torch.no_grad():   # the judge's weights, whatever the student's __init__ drew
        for name, shape in [("in_proj.weight", (6, 16)), ("log_rate", (6,)), ("out_proj.weight", (8, 6))]:
            m.get_parameter(name).copy_(torch.randn(shape, generator=gen) * 0.5)
    x = torch.randn(3, 11, 8, generator=gen)
    start = [torch.randn(3, 6, generator=gen), torch.randn(3, 8, generator=gen)]
    weights = [torch.randn(3, 11, 8, generator=gen), torch.randn(3, 6, generator=gen),
               torch.randn(3, 8, generator=gen)]
    results = {}
    for cuts in ([0, 11], [0, 4, 11], list(range(12))):
        def pieces(x, h, shift):
            ys, state = [], {"h": h, "shift": shift}
            for a, b in zip(cuts, cuts[1:]):
                y, state = m(x[:, a:b], state)
                ys.append(y)
            return torch.cat(ys, 1), state["h"], state["shift"]
        m.zero_grad()
        found = with_grads(pieces, [x, *start], weights)
        found.update({f"param{i}": plain(p.grad) if p.grad is not None else "no gradient"
                      for i, p in enumerate(m.parameters())})
        results.update(flat(f"cuts{len(cuts)}", found))
    zero = attempt(m.zero_state, 3)
    results["zero"] = zero if isinstance(zero, str) else sorted(
        (k, list(v.shape), str(v.dtype), float(v.abs().sum())) for k, v in zero.items())
    results["none"] = plain(attempt(lambda: m(x)[0]))
    return results

def test_exercise9_judged(tmp_path):
    judge_exercise(9, tmp_path)

# ==== Exercise 10: predict, then measure ====
def verdict_results(course):
    """predictions()' shape (any signs pass) and verdict_rows on an eval.json drawn from the class's seed:
    its rows as plain data."""
    g = random.Random(SEED)
    made = attempt(course.predictions)
    shape = made if isinstance(made, str) else isinstance(made, dict) and sorted(made) == sorted(
        course.EXPERIMENTS) and all(isinstance(made[e], dict) and sorted(made[e]) == sorted(labels) and all(
            v in course.SIGNS for v in made[e].values()) for e, (_, labels) in course.EXPERIMENTS.items())
    models = [dict(label="control", verdict=dict(generalizes_to=512, censored=True),
                   ppl=dict(buckets=dict(ppl=[9.0, 5.0])))]
    for label in ("A", "B", "C", "D"):
        diff, sem = g.choice([-0.25, -0.1, 0.0, 0.03, 0.2]), g.choice([0.01, 0.05, 0.125])
        models.append(dict(label=label, verdict=dict(generalizes_to=g.choice([32, 45, 512]),
                                                     censored=g.random() < 0.5),
                           ppl=dict(buckets=dict(ppl=[9.0, g.uniform(4, 6)])),
                           diff=dict(nll=[0.5, diff], nll_sem=[0.5, sem])))
    rows = attempt(course.verdict_rows, dict(models=models), {"A": "-", "B": "+", "D": "0"})
    return {"predictions": shape, "rows": rows if isinstance(rows, str) else [list(r) for r in rows]}

def test_exercise10_judged(tmp_path):
    judge_exercise(10, tmp_path)

def judge_exercise(n, tmp_path):
    module, compute = JUDGED[n]
    judged_outputs(f"exercise{n}", tmp_path, module, compute, **dict(zip(("rtol", "atol"), TOLERANCE[n])))

JUDGED = {1: ("ssm", ssd_results), 2: ("gla", scan_results), 3: ("evaluate", perplexity_results),
          4: ("evaluate", pstar_results), 5: ("evaluate", remembrance_results),
          6: ("interventions", noise_results), 7: ("interventions", passed_results),
          8: ("data", markov_results), 9: ("course", mixer_results), 10: ("course", verdict_results)}
TOLERANCE = {1: (1e-4, 1e-4), 2: (1e-4, 1e-4), 3: (1e-5, 1e-5), 4: (0, 0), 5: (0, 1e-12), 6: (1e-5, 1e-6),
             7: (0, 0), 8: (1e-9, 1e-12), 9: (1e-5, 1e-5), 10: (0, 0)}   # (rtol, atol): the visible checks'
# (the judge's limits sit at or inside those of the copy's tests; tests/test_course_judged.py's pitfall test
# shows each pitfall outside them)

@pytest.mark.parametrize("n", sorted(JUDGED))
def test_every_pitfall_of_instructor_md_fails_the_judge(n, tmp_path):
    """Each pitfall (tests/pitfalls.py) as a module of its own: its results, saved and loaded as the worker's
    are, disagree with the reference's; the reference's agree with themselves."""
    import importlib
    import types
    from pitfalls import PITFALLS
    module, compute = JUDGED[n]
    reference = compute(importlib.import_module(module))
    save(str(tmp_path), "reference", reference)
    agree(load(str(tmp_path), "reference"), reference, dict(zip(("rtol", "atol"), TOLERANCE[n])))
    for k, (_, phrase, path, old, new) in enumerate(p for p in PITFALLS if p[0] == n):
        text = open(os.path.join(ROOT, path)).read()
        mutated = types.ModuleType(f"pitfall{n}_{k}")
        mutated.__file__ = os.path.join(ROOT, path)
        exec(compile(text.replace(old, new), path, "exec"), mutated.__dict__)
        save(str(tmp_path), f"pitfall{k}", compute(mutated))
        with pytest.raises(AssertionError):
            agree(load(str(tmp_path), f"pitfall{k}"), reference, dict(zip(("rtol", "atol"), TOLERANCE[n])))
