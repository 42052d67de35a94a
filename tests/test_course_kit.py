"""The course kit (docs/kit.py, docs/course.py): the checks of exercises 9 and 10, and the kit itself: in a
student copy every exercise's check fails, in the repo every one passes, and docs/EXERCISES.md prints them."""
import ast
import json
import os
import re
import subprocess
import sys

import torch

import model
from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "docs"))
import course  # noqa: E402
import kit  # noqa: E402

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

def verdict_model(label, ppl, generalizes_to, censored, diff=None):
    m = dict(label=label, verdict=dict(generalizes_to=generalizes_to, censored=censored),
             ppl=dict(buckets=dict(ppl=[9.0, ppl])))
    return m if diff is None else dict(m, diff=dict(nll=[0.5, diff[0]], nll_sem=[0.5, diff[1]]))

def test_exercise10_predictions_are_made_and_eval_json_becomes_the_verdict_table(tmp_path, capsys):
    made = course.predictions()
    assert set(made) == set(course.EXPERIMENTS)
    for name, (_, labels) in course.EXPERIMENTS.items():
        assert set(made[name]) == set(labels) and set(made[name].values()) <= set(course.SIGNS), name
    report = dict(models=[verdict_model("control", 5.0, 512, True),  # the reference: no diff
                          verdict_model("A", 4.5, 512, True, (-0.1, 0.01)),
                          verdict_model("B", 5.1, 45, False, (-0.25, 0.125)),  # 2 s.e. exactly: no sign
                          verdict_model("C", 6.0, 32, False, (0.03, 0.01))])
    assert course.verdict_rows(report, {"A": "-", "B": "+"}) == [
        ("A", "512+", 4.5, -0.1, 0.01, "-", "-"), ("B", "45", 5.1, -0.25, 0.125, "0", "+"),
        ("C", "32", 6.0, 0.03, 0.01, "+", None)]
    (tmp_path / "eval.json").write_text(json.dumps(report))
    course.main([f"ttrain={tmp_path}"])
    out = capsys.readouterr().out
    assert "| A | 512+ | 4.500 | -0.100 +- 0.010 | - |" in out and "predictions right: " in out

def test_exercises_md_prints_each_exercises_functions_and_check_commands():
    sections = re.split(r"^## ", open(os.path.join(ROOT, "docs", "EXERCISES.md")).read(), flags=re.M)
    for n, (_, functions, checks) in kit.EXERCISES.items():
        section = next(s for s in sections if s.startswith(f"{n}. "))
        assert all(kit.command(args) in section for args in checks), n
        assert all(name.split(".")[-1] in section for names in functions.values() for name in names), n

def kit_cli(*args):
    """docs/kit.py started in a subprocess: two can run side by side (finished() waits)."""
    return subprocess.Popen([sys.executable, os.path.join(ROOT, "docs", "kit.py"), *args], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=dict(os.environ, OMP_NUM_THREADS="1"))

def finished(p):
    out, err = p.communicate()
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)

def test_a_student_copy_fails_every_check_and_the_repo_passes_every_one(tmp_path):
    out = tmp_path / "student"
    assert finished(kit_cli("student", str(out))).returncode == 0
    assert not (out / ".git").exists() and not (out / "docs" / "INSTRUCTOR.md").exists()
    for n, (_, functions, _) in kit.EXERCISES.items():   # signature and docstring kept, the body replaced
        for path, names in functions.items():
            tree = ast.parse((out / path).read_text())
            for name in names:
                body = kit.find(tree, name).body
                assert ast.unparse(body[-1]) == f"raise NotImplementedError('exercise {n}')"
                assert len(body) == 2 and isinstance(body[0].value.value, str), (n, name)
    refused = finished(kit_cli("student", str(out)))
    assert refused.returncode == 2 and refused.stderr.startswith("error: ") and "empty" in refused.stderr
    student, repo = map(finished, [kit_cli("score", str(out)), kit_cli("score", ROOT)])  # side by side
    for run, code, ok in [(student, 1, lambda p, t: p < t), (repo, 0, lambda p, t: p == t > 0)]:
        scores = re.findall(r"^exercise +(\d+) .* (\d+)/(\d+) ", run.stdout, flags=re.M)
        assert [int(n) for n, _, _ in scores] == list(kit.EXERCISES), run.stdout + run.stderr
        assert run.returncode == code
        assert all(ok(int(p), int(t)) for _, p, t in scores), run.stdout
