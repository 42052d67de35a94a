"""The course kit (docs/kit.py, docs/course.py): the checks of exercises 9 and 10, and the kit itself: a
class graded with the teacher's tests, each check isolated and time-limited, INSTRUCTOR's pitfalls caught."""
import ast
import contextlib
import csv
import errno
import glob
import json
import os
import pathlib
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
import zipfile

import pytest
import torch

import model
from conftest import ROOT
from pitfalls import PITFALLS
from test_course_judged import drawn_curves

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

def literal_verdict(ppl, t_train):
    """Definition 3.2 read literally, as EXERCISES.md states it: the first index t >= t* whose perplexity
    is strictly above p*, t* the first minimum of ppl[:t_train]."""
    t_star = min(range(min(t_train, len(ppl))), key=lambda t: (ppl[t], t))
    return next((t for t in range(t_star, len(ppl)) if ppl[t] > ppl[t_star]), len(ppl))

def test_drawn_curves_differ_by_seed_and_hold_the_cases_the_pitfalls_need():
    a, b = drawn_curves(1), drawn_curves(2)
    assert a == drawn_curves(1) and a != b
    verdicts = [literal_verdict(ppl, t) for ppl, t in a]
    assert any(v == len(ppl) for v, (ppl, _) in zip(verdicts, a)) and any(
        v < len(ppl) for v, (ppl, _) in zip(verdicts, a))
    assert any(ppl[:t].count(min(ppl[:t])) > 1 for ppl, t in a)   # ties for the minimum
    assert any(min(ppl) < min(ppl[:t]) for ppl, t in a)   # a lower minimum past t_train
    assert literal_verdict([5.0, 4.0, 3.0, 3.0, 2.9, 2.95, 2.9, 2.8], 4) == 8   # EXERCISES.md's examples
    assert literal_verdict([5.0, 4.0, 3.0, 2.9, 2.95, 3.5, 4.0], 4) == 4

def test_a_table_of_exercise_4s_visible_examples_passes_its_self_check_and_scores_nothing(copy, tmp_path):
    """Exercise 4 as a lookup table of every example the copy shows (tests/test_evaluate.py's and
    EXERCISES.md's): its self-check passes the visible check (and says a check is the instructor's); graded,
    the curves drawn from the class's seed fail it, while the reference passes them."""
    examples = {((5.0, 4.0, 3.0, 3.0, 2.9, 2.95, 2.9, 2.8), 4): 8,
                ((5.0, 4.0, 3.0, 2.9, 2.95, 3.5, 4.0), 4): 4,
                ((5.0, 3.0, 4.0, 3.0, 3.5, 2.0), 4): 2, ((4.0, 3.0, 3.2, 2.0, 2.5), 2): 2,
                ((3.0, 2.0, 2.0), 2): 3}   # (tests/test_evaluate.py's and EXERCISES.md's)
    table = f"    return {examples!r}.get((tuple(float(x) for x in ppl), t_train), 0)\n"
    stub = '    raise NotImplementedError("exercise 4")\n'
    sub = submission(copy, tmp_path / "table", (), [("evaluate.py", stub, table)])
    mine = kit_cli("score", "--exercises", "4", "--report", str(tmp_path / "s.csv"), cwd=sub,
                   kit_py=os.path.join(sub, "docs", "kit.py"))
    hint = "(and a check on inputs drawn at grading, the instructor's)"
    assert mine.returncode == 0 and hint in mine.stdout, mine.stdout
    assert graded(tmp_path / "s.csv")["table", 4][:3] == ("passed", "", "1")
    run = kit_cli("score", sub, ROOT, "--exercises", "4", "--class-seed", "20250702", "--report",
                  str(tmp_path / "r.json"))
    assert run.returncode == 0 and "hidden inputs drawn with --class-seed 20250702" in run.stdout, run.stdout
    rows = {os.path.basename(r["student"]): r for r in json.load(open(tmp_path / "r.json"))["rows"]}
    assert (rows["table"]["status"], rows["table"]["reason"], rows["table"]["tests"]) == ("FAILED", "failed",
                                                                                         "2/3")
    reference = rows[os.path.basename(ROOT)]
    assert (reference["status"], reference["tests"]) == ("passed", "3/3")

# at a module's import: every report of the process's pytest says its tests passed, and it exits 0
FORGE = """import atexit as _atexit, os as _os, sys as _sys
def _passing():
    for arg in [a for a in _sys.argv if a.startswith("--junitxml=")]:
        open(arg.split("=", 1)[1], "w").write('<testsuites><testsuite><testcase name="t"/>'
                                              '</testsuite></testsuites>')
    _os._exit(0)
_atexit.register(_passing)
"""

def test_a_report_forged_in_the_students_process_does_not_reach_the_judged_verdict(copy, tmp_path):
    """Exercise 4 wrong (always 0), its evaluate.py forging every pytest report of the process it is
    imported in: the check in the student's process reads as passed, the judge (another process, which
    never imported the student's code) fails it; an honest submission passes both."""
    stub = '    raise NotImplementedError("exercise 4")\n'
    forged = submission(copy, tmp_path / "forged", (), [("evaluate.py", stub, "    return 0\n"),
                                                        ("evaluate.py", "\nimport math\n", "\n" + FORGE +
                                                         "import math\n")])
    done = submission(copy, tmp_path / "done", (4,))
    run = kit_cli("score", forged, done, "--exercises", "4", "--report", str(tmp_path / "r.json"))
    assert run.returncode == 0, run.stdout + run.stderr
    rows = {os.path.basename(r["student"]): r for r in json.load(open(tmp_path / "r.json"))["rows"]}
    assert (rows["forged"]["status"], rows["forged"]["reason"], rows["forged"]["tests"]) == (
        "FAILED", "failed", "1/2"), rows["forged"]["output"][-3000:]   # 1/1 forged, then the judge's 0/1
    assert "t_train=" in rows["forged"]["output"]   # the judge's message: a curve and the wrong verdict
    assert (rows["done"]["status"], rows["done"]["tests"]) == ("passed", "3/3")

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


def test_exercises_md_prints_the_table_each_exercises_functions_question_and_check_commands():
    text = open(os.path.join(ROOT, "docs", "EXERCISES.md")).read()
    sections = re.split(r"^## ", text, flags=re.M)
    for n, (title, points, written, functions, checks) in kit.EXERCISES.items():
        assert re.search(rf"^\| {n} \| {re.escape(title)} \| {points} \| {'yes' if written else 'no'} \|",
                         text, flags=re.M), n  # the table of exercises at the top
        section = next(s for s in sections if s.startswith(f"{n}. "))
        assert all(kit.command(args) in section for args in checks), n
        assert all(name.split(".")[-1] in section for names in functions.values() for name in names), n
        assert ("**In writing:**" in section) == written, n
    assert kit.answers_template().count("\n## ") == sum(e[2] for e in kit.EXERCISES.values())

def kit_cli(*args, python=sys.executable, kit_py=os.path.join(ROOT, "docs", "kit.py"), cwd=None):
    return subprocess.run([python, kit_py, *args], capture_output=True, text=True, cwd=cwd,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))

@pytest.fixture(scope="module")
def copy(tmp_path_factory):
    """A student copy, every exercise stubbed."""
    out = tmp_path_factory.mktemp("kit") / "student"
    assert kit_cli("student", str(out)).returncode == 0
    return out

def submission(copy, where, done=(), edits=()):
    """A student's folder: the copy, with the reference's files of exercises `done`, then (path, old, new)
    edits of those files."""
    shutil.copytree(copy, where)
    for n in done:
        for path in kit.EXERCISES[n][3]:
            shutil.copy(os.path.join(ROOT, path), where / path)
    for path, old, new in edits:
        text = (where / path).read_text()
        assert text.count(old) == 1, old
        (where / path).write_text(text.replace(old, new))
    return str(where)

def graded(report):
    with open(report) as f:
        return {(os.path.basename(r["student"]), int(r["exercise"])):
                (r["status"], r["reason"], r["points"], r["answer"]) for r in csv.DictReader(f)}

def test_a_student_copy_fails_every_check_and_the_repo_passes_every_one(copy, tmp_path):
    assert not (copy / ".git").exists() and not (copy / "docs" / "INSTRUCTOR.md").exists()
    assert (copy / "ANSWERS.md").read_text() == kit.answers_template()
    assert os.stat(copy).st_mode & 0o777 == 0o777 & ~kit_umask()  # the user's normal permissions
    for n, (_, _, _, functions, _) in kit.EXERCISES.items():  # signature and docstring kept, body replaced
        for path, names in functions.items():
            tree = ast.parse((copy / path).read_text())
            for name in names:
                body = kit.find(tree, name).body
                assert ast.unparse(body[-1]) == f"raise NotImplementedError('exercise {n}')"
                assert len(body) == 2 and isinstance(body[0].value.value, str), (n, name)
    for out, word in [(copy, "empty"), (os.path.join(ROOT, "tests", "x"), "inside the repo")]:
        refused = kit_cli("student", str(out))
        assert refused.returncode == 2 and refused.stderr.startswith("error: ") and word in refused.stderr
    assert not os.path.exists(os.path.join(ROOT, "tests", "x"))
    report = tmp_path / "r.json"   # with each check's output: a row that differs shows it
    run = kit_cli("score", str(copy), ROOT, "--jobs", "2", "--fail-fast", "--no-sandbox", "--report",
                  str(report))   # the teacher's own code and its stubs: trusted, unsandboxed
    assert run.returncode == 0, run.stdout + run.stderr
    assert "leaked" not in run.stderr, run.stderr  # the checks' progress bars leave no semaphore behind
    rows = {(os.path.basename(r["student"]), r["exercise"]): r for r in json.load(open(report))["rows"]}
    for n, (_, points, written, _, _) in kit.EXERCISES.items():
        for who, want in [("student", ("FAILED", "stubbed", 0, "empty" if written else "")),
                          (os.path.basename(ROOT), ("passed", "", points, "none" if written else ""))]:
            r = rows[who, n]
            assert (r["status"], r["reason"], r["points"], r["answer"]) == want, (who, n, r["output"][-3000:])
    assert re.search(r"^total: 0/(\d+) points, 0/10 exercises passed", run.stdout, flags=re.M)

def reference_lines():
    """{line: exercise} of every line of 30+ characters in the reference's exercise bodies (below their
    docstrings), less shared plumbing: lines that also stand in the repo's code outside every exercise
    function, or that docs/EXERCISES.md gives."""
    bodies, outside = {}, [open(os.path.join(ROOT, "docs", "EXERCISES.md")).read()]
    for path in sorted({p for *_, functions, _ in kit.EXERCISES.values() for p in functions} |
                       {p for p in kit.files_of(ROOT) if p.endswith(".py") and "/" not in p}):
        lines = open(os.path.join(ROOT, path)).read().splitlines()
        tree, spans = ast.parse("\n".join(lines)), []
        for n, (*_, functions, _) in kit.EXERCISES.items():
            for name in functions.get(path, []):
                node = kit.find(tree, name)
                spans.append((node.lineno - 1, node.end_lineno))
                for line in lines[node.body[1 if ast.get_docstring(node) else 0].lineno - 1:node.end_lineno]:
                    if len(line.strip()) >= 30 and not line.strip().startswith("#"):
                        bodies[line.strip()] = n
        outside += ["\n".join(line for i, line in enumerate(lines) if not any(a <= i < b for a, b in spans))]
    return {line: n for line, n in bodies.items() if not any(line in text for text in outside)}

def test_a_student_copy_holds_no_reference_code_and_its_self_check_names_the_withheld_checks(copy, tmp_path):
    lines = reference_lines()
    assert len(lines) > 100 and set(lines.values()) == set(kit.EXERCISES)
    for root, _, files in os.walk(copy):
        for name in files:
            text = open(os.path.join(root, name), errors="replace").read()
            assert not [line for line in lines if line in text], (name, [l for l in lines if l in text][:3])
    assert not any((copy / path).exists() for path in kit.WITHHELD)
    mine = kit_cli("score", "--exercises", "9,10", "--report", str(tmp_path / "s.csv"), cwd=str(copy),
                   kit_py=str(copy / "docs" / "kit.py"))
    assert mine.returncode == 0 and "(its tests are the instructor's: graded on submission)" in mine.stdout
    assert [graded(tmp_path / "s.csv")["student", n][:2] for n in (9, 10)] == [("FAILED", "withheld")] * 2

def command_lines():
    """The command line of every process, less those that end while /proc is read."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):   # (ended after the listing)
            found.append(pathlib.Path(f"/proc/{pid}/cmdline").read_bytes())
    return found

def test_processes_that_end_while_proc_is_read_are_left_out(monkeypatch):
    ended = subprocess.Popen(["true"])
    ended.wait()   # reaped: /proc/<pid> is gone, though the listing below still names it
    listdir = os.listdir
    monkeypatch.setattr(os, "listdir", lambda path: [str(ended.pid)] + listdir(path))
    assert pathlib.Path("/proc/self/cmdline").read_bytes() in command_lines()   # the others are still read
    kit.kill_all_of(12345678)   # (the kit's own look through /proc: a uid no process has)

def kit_umask():
    umask = os.umask(0)
    os.umask(umask)
    return umask

def no_tests(folder):
    """Every test function of folder/tests/*.py reduced to `return`: a submission that edits its tests."""
    for path in (folder / "tests").glob("test_*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test"):
                node.body = [ast.Return()]
        path.write_text(ast.unparse(tree))

# a line of exercise 4's function, one of exercise 7's, and what the students put there
T_STAR = "    t_star = int(ppl[:t_train].argmin())\n"
OBSERVE = ("        self.passed = [{k: v.detach().float() for k, v in layer.items()}"
           " for layer in final_state]\n")
HANG = "    import time\n    time.sleep(3600)\n"   # never ends; asleep, it leaves the cores to other checks
SKIP = "    import pytest\n    pytest.skip('no')\n"
CRASH = "        import os\n        os.kill(os.getpid(), 11)\n"
EXIT = "        import os\n        os._exit(0)\n"

def test_a_class_is_graded_with_the_teachers_tests_each_check_isolated_and_time_limited(copy, tmp_path):
    """Exercises 4 and 7 of six students, unsandboxed: done, stubbed, tests edited, a hang and a crash, a
    skip and an os._exit, a pitfall. Every other exercise is stubbed in all of them."""
    heading = "## 4. Definition 3.2\n\n"
    answer = ("ANSWERS.md", heading + "(your answer)", heading + "p* is biased low.")
    # the hang first: its time-out runs out while the other checks run beside it
    students = {"hang-crash": [("evaluate.py", T_STAR, HANG), ("interventions.py", OBSERVE, CRASH)],
                "done": [answer], "stubbed": None, "edited-tests": None,
                "skip-exit": [("evaluate.py", T_STAR, SKIP), ("interventions.py", OBSERVE, EXIT)],
                "pitfall": [("evaluate.py", "> ppl[t_star]", ">= ppl[t_star]")]}
    subs = [submission(copy, tmp_path / name, (4, 7) if edits else (), edits or ())
            for name, edits in students.items()]
    no_tests(tmp_path / "edited-tests")
    run = kit_cli("score", *subs, "--exercises", "4,7", "--timeout", "10", "--jobs", "2", "--no-sandbox",
                  "--report", str(tmp_path / "grades.csv"))   # (sandboxed: the next test)
    assert run.returncode == 0, run.stdout + run.stderr  # grades are data, not errors
    want = {"done": ("passed", "passed"), "stubbed": ("stubbed", "stubbed"),
            "edited-tests": ("stubbed", "stubbed"), "hang-crash": ("timeout", "crashed"),
            "skip-exit": ("skipped", "exited"), "pitfall": ("failed", "passed")}  # exercise 4's, 7's
    rows = graded(tmp_path / "grades.csv")
    for name, reasons in want.items():
        for n, points, reason in zip((4, 7), (1, 2), reasons):
            answer = "written" if (name, n) == ("done", 4) else "empty"
            ok = reason == "passed"
            assert rows[name, n] == ("passed" if ok else "FAILED", "" if ok else reason, str(points * ok),
                                     answer), name
    assert "ANSWERS.md: 1 of 9 answered" in run.stdout and "total: 3/3 points, 2/2 exercises" in run.stdout

def test_an_unsandboxed_checks_temporary_files_go_with_its_folder(copy, tmp_path):
    """A check that leaves a temporary folder behind (as a conftest may): without the sandbox too, it is
    made in the check's own folder, which grading removes, not in the kit's TMPDIR."""
    litter = "    import tempfile\n    tempfile.mkdtemp(prefix='litter-')\n" + T_STAR
    sub = submission(copy, tmp_path / "litter", (4,), [("evaluate.py", T_STAR, litter)])
    (tmp_path / "t").mkdir()
    kit_py = os.path.join(ROOT, "docs", "kit.py")
    run = subprocess.run([sys.executable, kit_py, "score", sub, "--exercises", "4", "--no-sandbox",
                          "--report", str(tmp_path / "r.csv")], capture_output=True, text=True,
                         env=dict(os.environ, TMPDIR=str(tmp_path / "t"), OMP_NUM_THREADS="1"))
    assert run.returncode == 0 and graded(tmp_path / "r.csv")["litter", 4][:2] == ("passed", ""), run.stdout
    assert os.listdir(tmp_path / "t") == []

def test_a_failed_exercise_gets_no_points_however_many_tests_pass_and_fail_fast_stops_at_the_first(copy,
                                                                                                 tmp_path):
    """Exercise 6 with its weights swapped: the random-noise tests pass, the fitted ones fail (in file order).
    A self-check prints how to rerun the check; a class's table does not."""
    swapped = next(p for p in PITFALLS if p[1] == "Swapping the weights")
    sub = submission(copy, tmp_path / "swapped", (6,), [swapped[2:]])
    rerun = kit.command(kit.EXERCISES[6][4][0])
    report = str(tmp_path / "r.csv")
    run = kit_cli("score", sub, "--exercises", "6", "--no-sandbox", "--report", report)
    (row,) = csv.DictReader(open(report))
    assert (row["status"], row["reason"], row["points"], row["tests"]) == ("FAILED", "failed", "0", "2/4")
    assert rerun in run.stdout, run.stdout
    run = kit_cli("score", sub, ROOT, "--exercises", "6", "--no-sandbox", "--fail-fast", "--report", report)
    row = next(csv.DictReader(open(report)))   # the submission's, then the repo's
    assert (row["status"], row["reason"], row["points"], row["tests"]) == ("FAILED", "failed", "0", "2/3")
    assert run.returncode == 0 and "FAILED (failed)" in run.stdout and rerun not in run.stdout, run.stdout

def test_a_submission_that_cheats_or_breaks_costs_only_its_own_points(copy, tmp_path):
    """Exercise 7 of a class in bubblewrap's sandbox: code that reads the reference from the teacher's
    checkout, or writes into it and into another submission and leaves a process behind (an error of the
    teacher's tests); links to the teacher's files; a report written over at exit; folders that are no
    copy; a name that is not UTF-8; a hang and a crash. Each is that submission's row; nothing outside
    its folder changes."""
    if kit.find_sandbox()[0] is None:
        pytest.skip(kit.find_sandbox()[1])   # .ci/run installs bubblewrap
    steal = (f"        import importlib.util\n        spec = importlib.util.spec_from_file_location('ref', "
             f"'{ROOT}/interventions.py')\n        ref = importlib.util.module_from_spec(spec)\n"
             f"        spec.loader.exec_module(ref)\n        ref.PassedState.observe(self, final_state)\n")
    vandal = (OBSERVE + f"        import os, subprocess\n        for f in ('{ROOT}/tests/conftest.py', "
              f"'{tmp_path}/done/interventions.py', '{tmp_path}/victim'):\n            try:\n"
              f"                open(f, 'a').write('raise SystemExit(0)\\n')\n            except OSError:\n"
              f"                pass\n        subprocess.Popen(['sleep', '37.25'], start_new_session=True)\n")
    peek = (OBSERVE + "        import os\n        if len(os.listdir('../..')) > 1:\n"   # others' folders
            "            raise RuntimeError('other checks are in sight')\n")
    forge = (OBSERVE + "        import atexit\n        atexit.register(lambda: open('.kit/report.xml', 'w')"
             ".write('<testsuites><testcase'))\n")
    hang = "        import time\n        time.sleep(3600)\n"   # (as HANG)
    # the hang first: its time-out runs out while the other checks run beside it
    subs = [submission(copy, tmp_path / "hang", (7,), [("interventions.py", OBSERVE, hang)]),
            submission(copy, tmp_path / "done", (7,)), submission(copy, tmp_path / "steal", (7,),
            [("interventions.py", OBSERVE, steal)]), submission(copy, tmp_path / "vandal", (7,),
            [("interventions.py", OBSERVE, vandal)]), submission(copy, tmp_path / "forge", (7,),
            [("interventions.py", OBSERVE, forge)]), submission(copy, tmp_path / "linked-file"),
            submission(copy, tmp_path / "crash", (7,), [("interventions.py", OBSERVE, CRASH)]),
            submission(copy, tmp_path / "peek", (7,), [("interventions.py", OBSERVE, peek)])]
    os.remove(tmp_path / "linked-file" / "interventions.py")
    os.symlink(os.path.join(ROOT, "interventions.py"), tmp_path / "linked-file" / "interventions.py")
    os.symlink(ROOT, tmp_path / "linked-folder")
    (tmp_path / "empty").mkdir()
    odd = os.fsdecode(bytes(tmp_path / "caf") + b"\xe9")
    shutil.copytree(tmp_path / "done", odd)
    subs += [str(tmp_path / f) for f in ("linked-folder", "empty", "nowhere")] + [odd]
    (tmp_path / "victim").write_text("mine\n")
    os.symlink(tmp_path / "victim", tmp_path / "grades.csv.tmp")   # a planted temporary report
    teacher = {f: open(os.path.join(ROOT, f), "rb").read() for f in ("tests/conftest.py", "docs/kit.py")}
    run = kit_cli("score", *subs, "--exercises", "7", "--timeout", "30", "--jobs", "2", "--report",
                  str(tmp_path / "grades.csv"))   # 30 s: a loaded 2-core machine is no timeout
    assert run.returncode == 0 and "warning" not in run.stderr, run.stdout + run.stderr
    rows = {k[0]: v[:3] for k, v in graded(tmp_path / "grades.csv").items()}
    assert rows == {"done": ("passed", "", "2"), "steal": ("FAILED", "failed", "0"),
                    "vandal": ("FAILED", "error", "0"), "forge": ("FAILED", "bad report", "0"),
                    "linked-file": ("FAILED", "symlink: interventions.py", "0"),
                    "linked-folder": ("FAILED", "symlink", "0"), "empty": ("FAILED", "not a copy", "0"),
                    "nowhere": ("FAILED", "no such folder", "0"), "caf\\xe9": ("passed", "", "2"),
                    "hang": ("FAILED", "timeout", "0"), "crash": ("FAILED", "crashed", "0"),
                    "peek": ("passed", "", "2")}, rows
    assert teacher == {f: open(os.path.join(ROOT, f), "rb").read() for f in teacher}
    assert (tmp_path / "victim").read_text() == "mine\n" and "SystemExit" not in (
        tmp_path / "done" / "interventions.py").read_text()
    cmdlines = command_lines()
    assert not [c for c in cmdlines if b"37.25" in c], "a process the check started outlived it"

# What a sandboxed check tries (exercise 4's function, before its own code): each success is named in the
# error it raises, so that the row passes only if every one failed
ESCAPES = """    import ctypes, os, resource, socket, subprocess, sys
    libc, escaped = ctypes.CDLL(None, use_errno=True), []
    if libc.mount(None, b"/", None, 32 | 4096, None) == 0:   # MS_REMOUNT | MS_BIND: read-write
        escaped.append("remounted /")
    mount = "import ctypes; print(ctypes.CDLL(None).mount(None, b'/', None, 4128, None))"
    if subprocess.run([sys.executable, "-c", mount], capture_output=True, text=True).stdout != "-1\\n":
        escaped.append("remounted / from a program it started")
    for point in (b"/tmp", b"/proc/sys", b"/usr", os.getcwd().encode()):
        if libc.umount2(point, 2) == 0:   # MNT_DETACH
            escaped.append(f"unmounted {{point}}")
    try:
        core = open("/proc/sys/kernel/core_pattern").read()
        with open("/proc/sys/kernel/core_pattern", "w") as f:   # (its own value: nothing changes)
            f.write(core)
        escaped.append("wrote kernel.core_pattern")
    except OSError:
        pass
    seen = [f for f in {teachers!r} if os.path.exists(f)]
    if seen:
        escaped.append(f"sees {{seen}}")
    extra = set(os.environ) - {allowed!r}
    if extra or "s3cret" in repr(os.environ):
        escaped.append(f"the environment {{sorted(extra)}}")
    for address in ({sock!r}, "\\0" + {abstract!r}):
        client = socket.socket(socket.AF_UNIX)
        try:
            client.connect(address)
            escaped.append(f"connected to {{address!r}}")
        except OSError:
            pass
        client.close()
    if [name for _, name in socket.if_nameindex()] != ["lo"]:
        escaped.append("a network")
    if {root} and (os.getuid() == 0 or resource.getrlimit(resource.RLIMIT_NPROC)[0] != {processes}):
        escaped.append("root, or processes uncounted")
    if resource.getrlimit(resource.RLIMIT_FSIZE)[0] != {fsize} or resource.getrlimit(resource.RLIMIT_CORE)[0]:
        escaped.append("files or core dumps uncapped")
    if escaped:
        raise RuntimeError("escaped: " + ", ".join(escaped))
"""

def test_a_sandboxed_check_cannot_remount_write_sysctls_unmount_see_the_grader_or_reach_host_sockets(
        copy, tmp_path):
    """Run by root (as on Gradescope) or by a user: a check that remounts / read-write (itself and from a
    program it starts), unmounts its mounts, writes kernel.core_pattern, looks for the teacher's files,
    reads the grader's environment, connects to a Unix socket of the host (a path and an abstract name) and
    looks for a network: every one fails, so it passes; the host is unchanged."""
    if kit.find_sandbox()[0] is None:
        pytest.skip(kit.find_sandbox()[1])   # .ci/run installs bubblewrap
    import socket
    import tempfile
    sock = os.path.join(tempfile.mkdtemp(prefix="kit-", dir="/tmp"), "host.sock")   # (short: 108 bytes)
    abstract = f"kit-test-{os.getpid()}"
    listeners = [socket.socket(socket.AF_UNIX), socket.socket(socket.AF_UNIX)]
    for listener, address in zip(listeners, [sock, "\0" + abstract]):
        listener.bind(address)
        listener.listen(1)
        listener.setblocking(False)
    teachers = [os.path.join(ROOT, f) for f in ("docs/kit.py", "docs/INSTRUCTOR.md", "evaluate.py")]
    allowed = {"PATH", "HOME", "TMPDIR", "MPLCONFIGDIR", "PYTHONPATH", "PYTHONDONTWRITEBYTECODE",
               "OMP_NUM_THREADS", "LANG", "USER", "LOGNAME", "PWD", "PYTEST_CURRENT_TEST", "PYTEST_VERSION",
               "HF_HUB_OFFLINE", "TIKTOKEN_CACHE_DIR", "TRITON_INTERPRET",   # (pytest's, tests/conftest.py's)
               "KIT_CLASS_SEED", "KIT_JUDGE", "KIT_JUDGE_DIR"}   # (the kit's, to each check)
    escapes = ESCAPES.format(teachers=teachers, allowed=allowed, sock=sock, abstract=abstract,
                             root=os.geteuid() == 0, processes=kit.CHECK_PROCESSES, fsize=kit.CHECK_FILE_SIZE)
    sub = submission(copy, tmp_path / "escape", (4,), [("evaluate.py", T_STAR, escapes + T_STAR)])
    core = open("/proc/sys/kernel/core_pattern").read()
    teacher = {f: open(f, "rb").read() for f in teachers}
    try:
        run = subprocess.run([sys.executable, os.path.join(ROOT, "docs", "kit.py"), "score", sub,
                              "--exercises", "4", "--report", str(tmp_path / "r.json")], capture_output=True,
                             text=True,
                             env=dict(os.environ, OMP_NUM_THREADS="1", KIT_GRADER_SECRET="s3cret",
                                      SSH_AUTH_SOCK=sock))
        for listener in listeners:
            with pytest.raises(BlockingIOError):   # no one connected
                listener.accept()
    finally:
        for listener in listeners:
            listener.close()
        shutil.rmtree(os.path.dirname(sock))
    assert run.returncode == 0 and "warning" not in run.stderr, run.stdout + run.stderr
    (row,) = json.load(open(tmp_path / "r.json"))["rows"]
    assert (row["status"], row["reason"]) == ("passed", ""), row["output"][-3000:]
    assert open("/proc/sys/kernel/core_pattern").read() == core
    assert teacher == {f: open(f, "rb").read() for f in teachers}

def test_an_exercise_file_is_read_only_as_a_regular_file_of_the_submission_and_a_copy_holds_one(tmp_path):
    sub, other = tmp_path / "sub", tmp_path / "teacher"
    (other / "docs").mkdir(parents=True)
    (other / "docs" / "course.py").write_text("the reference\n")
    sub.mkdir()
    (sub / "docs").symlink_to(other / "docs")   # a folder on the way is a link
    with pytest.raises(kit.KitError, match="symlink"):
        kit.read_exercise_file(str(sub), "docs/course.py")
    (sub / "docs").unlink()
    (sub / "docs").mkdir()
    (sub / "docs" / "course.py").mkdir()   # a folder where the file should be; a FIFO would block
    os.mkfifo(sub / "ssm.py")
    assert kit.read_exercise_file(str(sub), "docs/course.py") is None
    assert kit.read_exercise_file(str(sub), "ssm.py") is None
    assert kit.not_a_copy(str(sub)) == "not a copy"   # files, but none of the exercises'
    (sub / "gla.py").write_text("mine\n")
    assert kit.not_a_copy(str(sub)) is None and kit.read_exercise_file(str(sub), "gla.py") == "mine\n"
    (tmp_path / "link").symlink_to(sub)
    assert kit.not_a_copy(str(tmp_path / "link") + "/") == "symlink"

def test_a_kit_error_in_one_exercise_is_that_rows_reason(monkeypatch, tmp_path):
    def broken(*args):
        raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")
    monkeypatch.setattr(kit, "grade_in", broken)
    (tmp_path / "tree").mkdir()
    status, reason, *_ = kit.grade(None, str(tmp_path), 7, str(tmp_path), 1, 1, False)
    assert status == "FAILED" and reason.startswith("kit error: UnicodeDecodeError: ") and "\n" not in reason
    assert not (tmp_path / "tree").exists()   # its grading folder is removed all the same

def test_without_bubblewrap_the_kit_says_in_one_line_what_grading_leaves_open(monkeypatch, tmp_path):
    monkeypatch.setattr(kit.shutil, "which", lambda name: None)
    bwrap, warning = kit.find_sandbox()
    assert bwrap is None and warning.count("\n") == 0 and "apt install bubblewrap" in warning
    assert "read your checkout and the other submissions" in warning and "outlive it" in warning
    monkeypatch.setattr(kit.shutil, "which", lambda name: str(tmp_path / "bwrap"))   # one that cannot run
    (tmp_path / "bwrap").write_text("#!/bin/sh\nexit 1\n")
    os.chmod(tmp_path / "bwrap", 0o755)
    assert kit.find_sandbox()[0] is None and "cannot make namespaces here" in kit.find_sandbox()[1]

def test_a_check_reads_no_pytest_config_or_conftest_above_its_folder(copy, tmp_path):
    """A pytest.ini and a conftest.py planted in the kit's temporary folder (as /tmp/pytest.ini would be):
    pytest's search for its configuration stops at the check's folder, so an honest exercise passes."""
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "pytest.ini").write_text("[pytest]\naddopts = -p no:randomly\n")
    (tmp_path / "t" / "conftest.py").write_text("def pytest_runtest_call(item):\n"
                                                 "    raise RuntimeError('planted')\n")
    sub = submission(copy, tmp_path / "done", (4,))
    run = subprocess.run([sys.executable, os.path.join(ROOT, "docs", "kit.py"), "score", sub, "--exercises",
                          "4", "--no-sandbox", "--report", str(tmp_path / "r.csv")], capture_output=True,
                         text=True,
                         env=dict(os.environ, TMPDIR=str(tmp_path / "t"), OMP_NUM_THREADS="1"))
    assert run.returncode == 0 and graded(tmp_path / "r.csv")["done", 4][:2] == ("passed", ""), run.stdout
    assert sorted(os.listdir(tmp_path / "t")) == ["conftest.py", "pytest.ini"]

def test_an_unsandboxed_check_sees_none_of_the_graders_environment(copy, tmp_path):
    """Without bubblewrap (--no-sandbox, and --as-user's checks, forked alike): the check's environment is
    its own, in os.environ and in what the process started with (/proc/self/environ)."""
    look = ("    import os\n    if 's3cret' in repr(os.environ) + open('/proc/self/environ').read():\n"
            "        raise RuntimeError('the grader environment')\n")
    sub = submission(copy, tmp_path / "look", (4,), [("evaluate.py", T_STAR, look + T_STAR)])
    run = subprocess.run([sys.executable, os.path.join(ROOT, "docs", "kit.py"), "score", sub, "--exercises",
                          "4", "--no-sandbox", "--report", str(tmp_path / "r.csv")], capture_output=True,
                         text=True,
                         env=dict(os.environ, OMP_NUM_THREADS="1", KIT_GRADER_SECRET="s3cret"))
    assert run.returncode == 0 and graded(tmp_path / "r.csv")["look", 4][:2] == ("passed", ""), run.stdout

def test_what_an_as_user_check_leaves_in_shared_temporary_folders_is_removed(tmp_path):
    """sweep: the user's files, folders and links at the top of each folder go (a link, not its target);
    another user's stay."""
    if os.geteuid() != 0:
        pytest.skip("chown needs root")
    uid = kit.SANDBOX_UID + 99
    shm, target = tmp_path / "shm", tmp_path / "target"
    for folder in (shm / "dir" / "deep", target):
        folder.mkdir(parents=True)
    for name in ("file", "dir/deep/x", "root-owned"):
        (shm / name).write_text("x")
    (shm / "link").symlink_to(target)
    for path in (shm / "file", shm / "dir", shm / "dir" / "deep", shm / "dir" / "deep" / "x", shm / "link"):
        os.chown(path, uid, uid, follow_symlinks=False)
    kit.sweep(uid, [str(shm), str(tmp_path / "nowhere")])
    assert os.listdir(shm) == ["root-owned"] and target.is_dir()

def test_a_bubblewrap_that_lacks_an_option_of_the_sandbox_is_no_sandbox_and_the_line_says_why(monkeypatch,
                                                                                                  tmp_path):
    """An older bubblewrap (one without --size): the kit's probe runs the whole sandbox a check gets, so
    grading falls back (--as-user as root) instead of failing every check."""
    (tmp_path / "bwrap").write_text("#!/bin/sh\nfor a; do [ \"$a\" = --size ] && "
                                    "echo 'bwrap: Unknown option --size' >&2 && exit 1; done\nexit 0\n")
    os.chmod(tmp_path / "bwrap", 0o755)
    which = shutil.which
    monkeypatch.setattr(kit.shutil, "which",
                        lambda name: str(tmp_path / name) if name == "bwrap" else which(name))
    bwrap, warning = kit.find_sandbox()
    assert bwrap is None and "(bwrap: Unknown option --size)" in warning and warning.count("\n") == 0

def nobody_can_run_this_python():
    return os.geteuid() == 0 and kit.can_run_checks(kit.pwd.getpwnam("nobody"))

@pytest.mark.parametrize("namespaces", [True, False], ids=["bubblewrap", "denied"])
def test_the_gradescope_autograder_grades_a_submission_as_score_does(copy, tmp_path, namespaces):
    """The zip laid out as Gradescope lays it out (source/, submission/, results/), run_autograder run there
    on a submission that passes exercise 7 and fails exercise 4: the points and reasons score gives. Where
    the container denies namespaces (a bwrap that fails), each check runs as nobody: exercise 4's code
    cannot read the reference in source/ nor write the results, and the process it leaves is killed."""
    if namespaces and kit.find_sandbox()[0] is None:
        pytest.skip(kit.find_sandbox()[1])   # .ci/run installs bubblewrap
    if not namespaces and not nobody_can_run_this_python():
        pytest.skip("run as root, with a Python that the user nobody can run (not one under /root)")
    leave = ("    import subprocess\n    subprocess.Popen(['sleep', '41.25'], start_new_session=True)\n"
             f"    open('{tmp_path}/autograder/results/results.json', 'w').write('{{}}')\n")
    steal = (leave + "    import importlib.util\n    spec = importlib.util.spec_from_file_location('ref', "
             f"'{tmp_path}/autograder/source/repo/evaluate.py')\n"
             "    ref = importlib.util.module_from_spec(spec)\n    spec.loader.exec_module(ref)\n"
             "    return ref.length_generalization_pstar(ppl, t_train)\n")
    stub = '    raise NotImplementedError("exercise 4")\n'
    sub = submission(copy, tmp_path / "mine", (7,), [] if namespaces else [("evaluate.py", stub, steal)])
    assert kit_cli("gradescope", str(tmp_path / "ag.zip"), "--exercises", "4,7", "--visibility",
                   "after_due_date").returncode == 0
    assert kit_cli("gradescope", str(tmp_path / "ag.zip")).stderr.startswith("error: ")   # never replaced
    root = tmp_path / "autograder"
    zipfile.ZipFile(tmp_path / "ag.zip").extractall(root / "source")
    shutil.copytree(sub, root / "submission")
    assert zipfile.ZipFile(tmp_path / "ag.zip").getinfo("run_autograder").external_attr >> 16 == 0o755
    os.chmod(root / "source" / "run_autograder", 0o755)   # (extractall drops the mode the zip keeps)
    setup = (root / "source" / "setup.sh").read_text()
    assert "bubblewrap" in setup and "/autograder/source/repo/requirements.txt" in setup
    assert all((root / "source" / "repo" / f).is_file() for f in kit.files_of(ROOT))   # withheld ones too
    env = dict(os.environ, AUTOGRADER=str(root), KIT_PYTHON=sys.executable, OMP_NUM_THREADS="1")
    if not namespaces:   # a bubblewrap that cannot make namespaces, as in an unprivileged container
        (tmp_path / "bin").mkdir()
        (tmp_path / "bin" / "bwrap").write_text("#!/bin/sh\nexit 1\n")
        os.chmod(tmp_path / "bin" / "bwrap", 0o755)
        env["PATH"] = f"{tmp_path / 'bin'}:{env['PATH']}"
    run = subprocess.run([str(root / "source" / "run_autograder")], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    assert ("each check runs as nobody" in run.stderr) != namespaces, run.stderr
    results = json.loads((root / "results" / "results.json").read_text())
    assert results["visibility"] == "after_due_date"
    assert results["score"] == 2 and [(t["name"], t["score"], t["max_score"], t["status"]) for t in
        results["tests"]] == [("exercise 4: Definition 3.2", 0, 1, "failed"),
                              ("exercise 7: State Passing and TBTT", 2, 2, "passed")], results
    output = results["tests"][0]["output"]
    assert output.startswith("FAILED (stubbed), 0/" if namespaces else "FAILED (error)")
    assert ("NotImplementedError: exercise 4" if namespaces else "PermissionError") in output
    cmdlines = command_lines()
    assert not [c for c in cmdlines if b"41.25" in c], "a process the check started outlived it"

def test_the_kit_grades_with_a_python_whose_packages_live_in_the_graded_folder(copy, tmp_path):
    """The venv inside the clone: every package of this Python linked into graded/.venv. A Python without
    torch is a set-up problem, named, not a grade."""
    graded_dir = submission(copy, tmp_path / "graded", (7,))
    venv = tmp_path / "graded" / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    inside = subprocess.run([python, "-c", purelib], capture_output=True, text=True).stdout.strip()
    outside = os.path.dirname(os.path.dirname(torch.__file__))
    bare = kit_cli("score", graded_dir, "--exercises", "7", python=python)
    assert bare.returncode == 2 and bare.stderr.count("\n") == 1 and "lacks torch" in bare.stderr, bare.stderr
    for name in os.listdir(outside):
        if not os.path.exists(os.path.join(inside, name)):
            os.symlink(os.path.join(outside, name), os.path.join(inside, name))
    find = "import importlib.util; print(importlib.util.find_spec('torch').origin)"   # (the checks import it)
    probe = subprocess.run([python, "-c", find], capture_output=True, text=True)
    assert probe.stdout.startswith(str(venv)), probe.stdout + probe.stderr
    teacher = kit_cli("score", graded_dir, "--exercises", "7", "--report", str(tmp_path / "t.csv"),
                      python=python)
    mine = kit_cli("score", "--exercises", "7", "--report", str(tmp_path / "s.csv"), python=python,
                   cwd=graded_dir, kit_py=os.path.join(graded_dir, "docs", "kit.py"))  # a self-check
    for run, report in [(teacher, "t.csv"), (mine, "s.csv")]:
        assert run.returncode == 0, run.stdout + run.stderr
        assert graded(tmp_path / report)["graded", 7][:2] == ("passed", "")

def test_a_sandboxed_check_reads_the_pythons_packages_through_hidden_links_but_no_teachers_file(copy,
                                                                                               tmp_path):
    """The grading Python's packages linked into its venv through a folder the sandbox hides (the submission's
    pkgs/), and its sys.path naming the teacher's checkout (a .pth): the check imports the packages, cannot
    write them, and sees none of the teacher's files."""
    if kit.find_sandbox()[0] is None:
        pytest.skip(kit.find_sandbox()[1])   # .ci/run installs bubblewrap
    teachers = [os.path.join(ROOT, f) for f in ("docs/kit.py", "docs/INSTRUCTOR.md", "tests/pitfalls.py",
                                                "interventions.py")]
    peek = (OBSERVE + f"        import os, torch\n        assert not [f for f in {teachers!r} if "
            "os.path.exists(f)]\n        try:\n            open(torch.__file__, 'a')\n"
            "        except OSError:\n            pass\n        else:\n"
            "            raise RuntimeError('the packages can be written')\n")
    graded_dir = submission(copy, tmp_path / "graded", (7,), [("interventions.py", OBSERVE, peek)])
    venv, pkgs = tmp_path / "graded" / ".venv", tmp_path / "graded" / "pkgs"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    inside = subprocess.run([python, "-c", purelib], capture_output=True, text=True).stdout.strip()
    outside = os.path.dirname(os.path.dirname(torch.__file__))
    pkgs.mkdir()
    for name in os.listdir(outside):
        if not os.path.exists(os.path.join(inside, name)):
            os.symlink(os.path.join(outside, name), pkgs / name)
            os.symlink(pkgs / name, os.path.join(inside, name))
    with open(os.path.join(inside, "teacher.pth"), "w") as f:
        f.write("".join(os.path.join(ROOT, d) + "\n" for d in ("", "docs", "tests")))
    run = kit_cli("score", graded_dir, "--exercises", "7", "--report", str(tmp_path / "r.csv"), python=python)
    assert run.returncode == 0 and "warning" not in run.stderr, run.stdout + run.stderr
    assert graded(tmp_path / "r.csv")["graded", 7][:2] == ("passed", ""), run.stdout

def test_the_sandbox_keeps_readable_only_the_pythons_paths_in_hidden_folders_that_hold_no_teachers_file(
        tmp_path, monkeypatch):
    teacher, sub, elsewhere = tmp_path / "teacher", tmp_path / "sub", tmp_path / "elsewhere"
    alice = teacher / "subs" / "alice"   # a submission collected inside the teacher's checkout
    for folder in (teacher / "docs", teacher / ".venv" / "lib" / "site", sub / "pkgs" / "torch", elsewhere,
                   alice):
        folder.mkdir(parents=True)
    (teacher / "docs" / "kit.py").write_text("")
    (teacher / "stray.py").write_text("")
    (sub / "docs").symlink_to(teacher / "docs")   # a link to the teacher's files
    (sub / "numpy").symlink_to(elsewhere)
    paths = [teacher / ".venv", teacher / ".venv" / "lib" / "site", teacher, teacher / "docs", tmp_path,
             sub / "docs", sub / "pkgs" / "torch", sub / "pkgs" / "missing", sub / "numpy", elsewhere,
             teacher / "docs" / ".." / ".venv" / "lib", teacher / "stray.py", sub, teacher / "subs"]
    monkeypatch.setattr(kit, "python_paths", lambda: {str(p) for p in paths})
    hidden, teachers = [str(teacher), str(sub), str(alice)], {str(teacher / "docs" / "kit.py"),
                                                             str(teacher / "stray.py")}
    readable = kit.readable_in_sandbox(hidden, teachers)
    assert readable == [str(sub / "numpy"), str(sub / "pkgs" / "torch"), str(teacher / ".venv")]
    command = kit.sandboxed("bwrap", "/check", [str(teacher), str(sub)], readable)
    binds = [command[i + 1:i + 3] for i, a in enumerate(command) if a == "--ro-bind"]
    # an allow-list, "/" never bound: SYSTEM's paths, /proc/sys over its own /proc, then the Python's
    assert ["/", "/"] not in binds and binds[-len(readable):] == [[p, p] for p in readable]
    assert binds[:-len(readable)] == [[p, p] for p in kit.SYSTEM if os.path.exists(p) and not os.path.islink(
        p)] + [["/proc/sys", "/proc/sys"]]
    everywhere = kit.readable_in_sandbox(hidden, teachers, everywhere=True)   # (outside hidden folders too)
    assert everywhere == [str(elsewhere)] + readable
    assert command.index("--tmpfs") < command.index(readable[0]) < command.index("/check")

def test_python_paths_name_each_link_on_the_way_to_a_package_and_not_the_kits_or_pythonpaths_folders(
        tmp_path, monkeypatch):
    site, a, b = tmp_path / "site", tmp_path / "a", tmp_path / "b"
    for folder in (site, a, b / "pkg"):
        folder.mkdir(parents=True)
    (site / "pkg").symlink_to("../a/pkg")   # relative, to another link
    (a / "pkg").symlink_to(b / "pkg")
    monkeypatch.setattr(kit.site, "getsitepackages", lambda: [str(site)])
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "pythonpath"))
    monkeypatch.setattr(sys, "path", sys.path + [str(tmp_path / "pythonpath"), str(tmp_path / "pth")])
    paths = {os.path.normpath(p) for p in kit.python_paths()}
    assert {str(site), str(a / "pkg"), str(b / "pkg"), str(tmp_path / "pth"), sys.prefix} <= paths
    assert str(tmp_path / "pythonpath") not in paths and os.path.join(ROOT, "docs") not in paths

def test_graded_source_puts_back_every_other_exercises_functions():
    reference = open(os.path.join(ROOT, "evaluate.py")).read()
    student = kit.stub(kit.stub(reference, ["length_generalization_pstar"], 4, "evaluate.py"),
                       ["position_nll_naive", "sequence_nll", "position_nll"], 3, "evaluate.py")
    student = student.replace("def log_edges(", "def my_helper():\n    return 1\n\ndef log_edges(")
    graded4 = kit.graded_source(student, reference, "evaluate.py", 4)
    tree, ref = ast.parse(graded4), ast.parse(reference)
    for name in ["position_nll_naive", "sequence_nll", "position_nll"]:  # exercise 3's, as in the reference
        assert ast.dump(kit.find(tree, name)) == ast.dump(kit.find(ref, name))
    assert 'NotImplementedError("exercise 4")' in graded4 and "exercise 3" not in graded4
    assert "def my_helper():" in graded4  # the student's own code around the exercise stays
    assert kit.graded_source(student, reference, "evaluate.py", 3).count("NotImplementedError") == 3

def test_graded_source_keeps_a_bom_and_ends_a_spliced_last_function_with_a_line_break():
    reference = open(os.path.join(ROOT, "evaluate.py")).read()
    student = kit.stub(reference, ["position_nll_naive", "sequence_nll", "position_nll"], 3, "evaluate.py")
    graded = kit.graded_source("\ufeff" + student, reference, "evaluate.py", 4)   # exercise 3's put back
    assert graded.startswith("\ufeff") and "exercise 3" not in graded
    ast.parse(graded[1:])
    # the reference's function last in its file, without a line break: the student's next line stays apart
    last = "def position_nll(lm, x):\n    return 1"
    spliced = kit.graded_source("def position_nll(lm, x):\n    return 2\nafter = 3\n", last, "evaluate.py", 4)
    assert spliced == "def position_nll(lm, x):\n    return 1\nafter = 3\n"

def test_a_class_seed_is_any_integer_in_0_to_2_63_or_a_new_one_each_class():
    assert kit.class_seed(0) == 0 and kit.class_seed(2**63 - 1) == 2**63 - 1
    drawn = {kit.class_seed(None) for _ in range(8)}
    assert len(drawn) > 1 and all(0 <= s < 2**63 for s in drawn)
    for bad in (-1, 2**63):
        with pytest.raises(kit.KitError, match=f"--class-seed {bad}: pass a number from 0 to 2\\*\\*63 - 1"):
            kit.class_seed(bad)

def body_of(tree, name):
    """The statements of function `name` below its docstring, as ast.dump strings (no positions)."""
    node = kit.find(tree, name)
    return [ast.dump(b) for b in node.body[1 if ast.get_docstring(node, clean=False) else 0:]]

def paged(text):
    """text with Python-legal characters that str.splitlines() breaks at: form feeds between the functions
    (an Emacs page break) and U+2028 / U+0085 in a comment."""
    text = re.sub(r"\n\n(?=def |@|class )", "\n\x0c\n", text)   # the blank line before each one
    return text.replace('"""\nimport', '"""\n# a\u2028b\x85c\x1c\nimport', 1)

@pytest.mark.parametrize("form", ["pages", "crlf", "cr", "bom-crlf", "latin-1"])
def test_the_splice_keeps_pythons_lines_and_the_spliced_file_compiles(form):
    """Exercise 3's functions put back into a file whose lines Python counts otherwise than
    str.splitlines(): the result compiles, holds the reference's exercise 3 and the student's own lines."""
    reference = open(os.path.join(ROOT, "evaluate.py")).read()
    student = kit.stub(kit.stub(reference, ["length_generalization_pstar"], 4, "evaluate.py"),
                       ["position_nll_naive", "sequence_nll", "position_nll"], 3, "evaluate.py")
    student = paged(student) if form == "pages" else student
    ending = {"crlf": "\r\n", "bom-crlf": "\r\n", "cr": "\r"}.get(form, "\n")
    data = student.replace("\n", ending).encode()
    if form == "bom-crlf":
        data = b"\xef\xbb\xbf" + data
    if form == "latin-1":   # a coding line: the file decodes, and is written back, as latin-1
        data = b"# -*- coding: latin-1 -*-\n# caf\xe9\n" + data
    out, why = kit.graded_file(data, reference, "evaluate.py", 4)
    assert why is None and compile(out, "evaluate.py", "exec") and out.startswith(data[:30])
    tree, ref = ast.parse(out.decode("latin-1" if form == "latin-1" else "utf-8-sig")), ast.parse(reference)
    for name in ["position_nll_naive", "sequence_nll", "position_nll"]:
        assert body_of(tree, name) == body_of(ref, name), (form, name)
    assert b'NotImplementedError("exercise 4")' in out and b'NotImplementedError("exercise 3")' not in out
    assert out.count(b"\x0c") == data.count(b"\x0c") and (b"\xe9" in out) == (form == "latin-1")
    three = kit.graded_file(data, reference, "evaluate.py", 3)[0]   # exercise 4's put back, 3's kept
    assert three.count(b"NotImplementedError") == 3 and body_of(ast.parse(three.decode(
        "latin-1" if form == "latin-1" else "utf-8-sig")), "length_generalization_pstar") == body_of(
        ref, "length_generalization_pstar")
    if form == "pages":   # the same text as a str (decoded as utf-8): the same splice
        assert kit.graded_source(student, reference, "evaluate.py", 4).encode() == out

def test_the_splice_indents_the_references_methods_as_the_students_class_and_says_why_it_cannot():
    reference = open(os.path.join(ROOT, "interventions.py")).read()
    tabs = re.sub(r"^(?:    )+", lambda m: "\t" * (len(m.group(0)) // 4), reference, flags=re.M)
    student = kit.stub(tabs, ["Noise.initial_state", "Noise.observe"], 6, "interventions.py")
    out, why = kit.graded_file(student.encode(), reference, "interventions.py", 7)
    assert why is None and "\n\tdef observe(self, final_state):\n\t\t" in out.decode()
    for name in ["Noise.initial_state", "Noise.observe"]:
        assert body_of(ast.parse(out), name) == body_of(ast.parse(reference), name), name
    # a reference the student's encoding cannot hold: that row says why, the splice writes nothing
    wide = reference.replace('"""', '"""\u2028', 1)   # (inside the module docstring: not put back)
    at = wide.index("class Noise")   # exercise 6's method, put back into exercise 7's file
    wide = wide[:at] + wide[at:].replace("(self, final_state):\n", "(self, final_state):  # \u03c3\n", 1)
    latin = b"# -*- coding: latin-1 -*-\n" + student.encode()
    assert kit.graded_file(latin, wide, "interventions.py", 7) == (
        None, "splice: interventions.py: UnicodeEncodeError once the other exercises are put back")
    assert kit.graded_file(b"def broken(:\n", reference, "interventions.py", 7) == (b"def broken(:\n", None)

def test_a_self_check_and_the_teachers_grading_agree_on_a_file_of_pages_crlf_and_a_bom(copy, tmp_path):
    """Exercise 4 done in an evaluate.py with form feeds, U+2028, CRLF line ends and a BOM (an editor's
    choices): the student's self-check and the teacher's grading both pass it."""
    sub = submission(copy, tmp_path / "pages", (4,))
    text = paged((tmp_path / "pages" / "evaluate.py").read_text())
    (tmp_path / "pages" / "evaluate.py").write_bytes(b"\xef\xbb\xbf" + text.replace("\n", "\r\n").encode())
    teacher = kit_cli("score", sub, "--exercises", "4", "--report", str(tmp_path / "t.csv"))
    mine = kit_cli("score", "--exercises", "4", "--report", str(tmp_path / "s.csv"), cwd=sub,
                   kit_py=os.path.join(sub, "docs", "kit.py"))
    for run in (teacher, mine):
        assert run.returncode == 0, run.stdout + run.stderr
    assert graded(tmp_path / "t.csv")["pages", 4][:3] == graded(tmp_path / "s.csv")["pages", 4][:3] == (
        "passed", "", "1")

@pytest.mark.parametrize("args, word", [
    (["student", "{tmp}/s", "--exercises", "0,3"], "--exercises 0,3"),
    (["student", "{tmp}/s", "--exercises", "3,3"], "--exercises 3,3"),
    (["score", ROOT, ROOT + "/"], "given twice"),
    (["score", ROOT, "--report", "{tmp}/link"], "is a link"),
    (["score", ROOT, "--timeout", "0"], "--timeout 0"),
    (["score", ROOT, "--report", "{tmp}/mine.csv"], "not a kit report"),
    (["score", ROOT, "--report", "{tmp}/no/r.csv"], "existing folder"),
    (["score", ROOT, "--report", "{tmp}"], "not a file"),
    (["score", ROOT, "--report", ""], "not a file"),
    (["score", ROOT, "--report", "{tmp}/fifo"], "not a regular file"),   # opened, it would block
    (["score", ROOT, "--report", "/proc/r.csv"], "cannot write in /proc"),   # before any grading
    (["score", ROOT, "--timeout", "nan"], "--timeout nan"),
    (["score", ROOT, "--timeout", "inf"], "--timeout inf"),
    (["score", ROOT, "--as-user", "no-such-user", "--report", "{tmp}/r.csv"], "no such user"),
    (["score", ROOT, "--as-user", "nobody", "--jobs", "2", "--report", "{tmp}/r.csv"], "--jobs 1"),
    (["score", ROOT, "--class-seed", "-1"], "--class-seed -1"),
    (["gradescope", "{tmp}/ag.zip", "--class-seed", str(1 << 63)], f"--class-seed {1 << 63}"),
    (["score", ROOT, "--memory", "0"], "--memory 0"),
    (["score", ROOT, "--memory", "nan"], "--memory nan"),
])
def test_bad_kit_input_gets_one_line_and_touches_nothing(args, word, tmp_path, capsys):
    (tmp_path / "mine.csv").write_text("my own grades\n")
    (tmp_path / "link").symlink_to(tmp_path / "mine.csv")
    os.mkfifo(tmp_path / "fifo")
    assert kit.main([a.format(tmp=tmp_path) for a in args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and word in err, err
    assert (tmp_path / "mine.csv").read_text() == "my own grades\n" and not (tmp_path / "s").exists()

def test_a_bad_value_of_a_subcommands_flag_is_one_line():
    for args in (["score", "--timeout", "abc"], ["student"], ["gradescope", "a.zip", "--visibility", "now"]):
        run = kit_cli(*args)
        assert run.returncode == 2 and run.stderr.startswith("error: ") and run.stderr.count("\n") == 1, run.stderr

def test_gradescope_in_a_student_copy_or_a_checkout_without_the_withheld_tests_writes_nothing(
        copy, tmp_path, monkeypatch, capsys):
    """The autograder grades with the teacher's tests and the reference: a student copy has neither."""
    run = kit_cli("gradescope", str(tmp_path / "ag.zip"), kit_py=str(copy / "docs" / "kit.py"), cwd=str(copy))
    assert run.returncode == 2 and run.stderr.count("\n") == 1, run.stderr
    assert "student copy" in run.stderr and "teacher's checkout" in run.stderr and os.listdir(tmp_path) == []
    files_of = kit.files_of
    monkeypatch.setattr(kit, "files_of", lambda root: [f for f in files_of(root) if f != "tests/pitfalls.py"])
    assert kit.main(["gradescope", str(tmp_path / "ag.zip")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "lacks tests/pitfalls.py" in err and os.listdir(tmp_path) == [], err

def test_score_in_a_checkout_without_a_withheld_test_grades_nothing(tmp_path, monkeypatch, capsys):
    """A teacher's checkout where git does not track tests/test_course_judged.py (not yet added): grading
    would skip the judged checks; score says so in one line instead."""
    files_of = kit.files_of
    monkeypatch.setattr(kit, "files_of", lambda root: [f for f in files_of(root) if f != kit.JUDGED])
    assert kit.main(["score", ROOT, "--exercises", "4", "--report", str(tmp_path / "r.csv")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"lacks {kit.JUDGED}" in err and os.listdir(tmp_path) == [], err

@pytest.mark.parametrize("zip_path, word", [
    ("{tmp}/kit/ag.zip", "the folder {tmp}/kit does not exist"),   # not the kit's temporary file
    ("/proc/ag.zip", "cannot write in /proc"),
    ("{tmp}/ag.tar", "ending in .zip"),
    ("{tmp}/mine.zip", "{tmp}/mine.zip exists: pass a new path"),   # the user's own file: seen at once
    ("{tmp}/link.zip", "{tmp}/link.zip exists: pass a new path"),   # a link, even to nothing
])
def test_a_bad_gradescope_zip_path_gets_one_line_naming_it_and_writes_nothing(zip_path, word, tmp_path,
                                                                              capsys):
    (tmp_path / "mine.zip").write_text("my own zip\n")
    (tmp_path / "link.zip").symlink_to(tmp_path / "nowhere.zip")
    assert kit.main(["gradescope", zip_path.format(tmp=tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and word.format(tmp=tmp_path) in err, err
    assert ".kit-" not in err and sorted(os.listdir(tmp_path)) == ["link.zip", "mine.zip"]
    assert (tmp_path / "mine.zip").read_text() == "my own zip\n" and not (tmp_path / "nowhere.zip").exists()

@pytest.mark.parametrize("links", [True, False], ids=["hard-link", "no-hard-links"])
def test_a_zip_that_appears_while_the_autograder_is_written_is_kept_and_the_run_says_so(links, tmp_path,
                                                                                      monkeypatch, capsys):
    """Another run (or the user) puts a file at the zip's path after the kit looked: it stays, and this run
    fails in one line. Where the filesystem has no hard links, the zip is copied into a new file instead."""
    if not links:
        def no_links(src, dst):
            raise OSError(errno.EPERM, "Operation not permitted")
        monkeypatch.setattr(kit.os, "link", no_links)
    path = tmp_path / "ag.zip"
    assert kit.main(["gradescope", str(path), "--exercises", "4,7"]) == 0
    names = zipfile.ZipFile(path).namelist()
    assert {"setup.sh", "run_autograder", "repo/tests/pitfalls.py"} <= set(names)
    assert os.listdir(tmp_path) == ["ag.zip"]
    assert "--exercises 4,7 " in zipfile.ZipFile(path).read("run_autograder").decode()
    files_of = kit.files_of
    def meanwhile(root):   # (after the kit's first look at the path)
        (tmp_path / "z.zip").write_text("written meanwhile\n")
        return files_of(root)
    monkeypatch.setattr(kit, "files_of", meanwhile)
    capsys.readouterr()
    assert kit.main(["gradescope", str(tmp_path / "z.zip")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{tmp_path / 'z.zip'} exists" in err, err
    assert (tmp_path / "z.zip").read_text() == "written meanwhile\n" and sorted(os.listdir(tmp_path)) == [
        "ag.zip", "z.zip"]

def test_an_autograder_interrupted_while_it_is_copied_into_place_leaves_nothing(tmp_path, monkeypatch,
                                                                                 capsys):
    def no_links(src, dst):
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")
    copyfileobj = shutil.copyfileobj   # (zipfile's too)
    def interrupted(src, dst, *args):
        if getattr(dst, "name", None) != str(tmp_path / "ag.zip"):
            return copyfileobj(src, dst, *args)
        dst.write(b"PK")
        raise KeyboardInterrupt
    monkeypatch.setattr(kit.os, "link", no_links)
    monkeypatch.setattr(kit.shutil, "copyfileobj", interrupted)
    assert kit.main(["gradescope", str(tmp_path / "ag.zip")]) == 130
    assert os.listdir(tmp_path) == [] and capsys.readouterr().err.startswith("interrupted: nothing written")

def test_two_gradescope_runs_into_one_zip_one_writes_it_the_other_says_it_exists(tmp_path):
    kit_py = os.path.join(ROOT, "docs", "kit.py")
    runs = [subprocess.Popen([sys.executable, kit_py, "gradescope", str(tmp_path / "z.zip"), "--exercises",
                              e], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for e in ("1", "2,3")]
    (first, second) = [(p.wait(60), *p.communicate()) for p in runs]
    (won, _, _), (lost, _, err) = sorted([first, second])
    assert (won, lost) == (0, 2) and err.count("\n") == 1 and "z.zip exists" in err, (first, second)
    exercises = "1" if first[0] == 0 else "2,3"
    assert f"--exercises {exercises} " in zipfile.ZipFile(tmp_path / "z.zip").read("run_autograder").decode()
    assert os.listdir(tmp_path) == ["z.zip"]

def test_a_report_that_cannot_be_written_after_the_grading_is_kept_elsewhere(tmp_path):
    full_disk = ("import sys; sys.path.insert(0, sys.argv.pop(1)); import kit\n"
                 "write, calls = kit.write_report, []\ndef once_full(rows, path, gradescope=None):\n"
                 "    calls.append(path)\n    if len(calls) == 1:\n"
                 "        raise OSError(28, 'No space left on device')\n    write(rows, path, gradescope)\n"
                 "kit.write_report = once_full\nsys.exit(kit.main())\n")
    run = subprocess.run([sys.executable, "-c", full_disk, os.path.join(ROOT, "docs"), "score", ROOT,
                          "--exercises", "4", "--no-sandbox", "--report", str(tmp_path / "g.csv")],
                         capture_output=True, text=True, env=dict(os.environ, TMPDIR=str(tmp_path)))
    last = run.stderr.splitlines()[-1]
    assert run.returncode == 2 and "No space left" in last and "the report is in " in last, run.stderr
    kept = last.split("the report is in ")[1]
    assert kept.startswith(str(tmp_path / "kit-report-")) and kept.endswith(".csv")
    assert [r["status"] for r in csv.DictReader(open(kept))] == ["passed"]
    assert not (tmp_path / "g.csv").exists()

def test_a_stopped_check_is_killed_whether_or_not_it_made_its_process_group_yet():
    """score's interrupt may reach a check's process before its setsid (no group of its pid yet) or after."""
    before = subprocess.Popen(["sleep", "30"])   # in this test's group
    after = subprocess.Popen(["sh", "-c", "sleep 30 & echo $!; wait"], start_new_session=True,
                             stdout=subprocess.PIPE, text=True)
    leaf = int(after.stdout.readline())   # what the check started
    kit.end(before.pid)
    kit.end(after.pid)
    assert before.wait(5) == after.wait(5) == -signal.SIGKILL
    time.sleep(0.2)
    assert not os.path.exists(f"/proc/{leaf}") or open(f"/proc/{leaf}/stat").read().split()[2] == "Z"

def test_checks_run_side_by_side_get_their_own_exit_codes():
    """--jobs 2 without a sandbox: a start() in one thread polls the other thread's forkserver process; read
    at once by both, its exit code reached one as 255 (a passing check graded "crashed"). In a child Python:
    the forkserver outlives the checks."""
    script = """import multiprocessing, os, sys, threading
sys.path.insert(0, sys.argv[1])
import kit
context, codes = multiprocessing.get_context("forkserver"), []
def checks():
    codes.extend(kit.run_forked(context.Process(target=os._exit, args=(3,)), 60) for _ in range(150))
threads = [threading.Thread(target=checks) for _ in range(2)]
[t.start() for t in threads]
[t.join() for t in threads]
print(sorted(set(codes)), len(codes))"""
    out = subprocess.run([sys.executable, "-c", script, os.path.join(ROOT, "docs")], capture_output=True,
                         text=True, timeout=120)
    assert out.stdout.split("\n")[0] == "[3] 300", out.stdout + out.stderr
    ready, held = os.pipe(), []   # and deterministically: both happen under the kit's lock
    os.write(ready[1], b"x")

    class Ended:   # a check's process that has ended: its sentinel is readable
        pid, sentinel = -1, ready[0]

        def start(self):
            held.append(kit.PROCESSES.locked())

        def join(self, timeout):
            held.append(kit.PROCESSES.locked())

        @property
        def exitcode(self):
            held.append(kit.PROCESSES.locked())
            return 0
    assert kit.run_forked(Ended(), 5) == 0 and held == [True, True, True]
    os.close(ready[0])
    os.close(ready[1])

@pytest.mark.parametrize("signum, how", [(signal.SIGINT, ["--exercises", "4"]),
                                         (signal.SIGTERM, ["--exercises", "4", "--no-sandbox"]),
                                         (signal.SIGINT, ["--exercises", "2,4", "--jobs", "1"]),
                                         (signal.SIGHUP, ["--exercises", "4"])])   # (its terminal closed)
def test_an_interrupted_score_ends_its_checks_at_once_and_leaves_nothing(copy, tmp_path, signum, how):
    """A check that would run for its whole time-out (120 s): Ctrl-C or SIGHUP (in the sandbox) or SIGTERM
    (without) once it runs ends the kit with one line, the check's processes and the grading folders gone."""
    stub2 = '    raise NotImplementedError("exercise 2")\n'
    sub = submission(copy, tmp_path / "hang", (4,), [("evaluate.py", T_STAR, HANG), ("gla.py", stub2, HANG)])
    (tmp_path / "t").mkdir()
    kit_py = os.path.join(ROOT, "docs", "kit.py")
    p = subprocess.Popen([sys.executable, kit_py, "score", sub, *how, "--report",
                          str(tmp_path / "g.csv")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=dict(os.environ, TMPDIR=str(tmp_path / "t"), OMP_NUM_THREADS="1"))
    log = None
    while log is None and p.poll() is None:   # the check has started once its log exists
        log = next(iter(glob.glob(str(tmp_path / "t" / "kit-score-*" / "0-*" / "check0.log"))), None)
        time.sleep(0.2)
    time.sleep(1)
    p.send_signal(signum)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130 and err.splitlines()[-1].startswith("interrupted: nothing written"), err
    assert "Traceback" not in err and not (tmp_path / "g.csv").exists()
    assert os.listdir(tmp_path / "t") == []
    cmdlines = command_lines()
    assert not [c for c in cmdlines if os.fsencode(tmp_path / "t") in c], "a check outlived the kit"

def test_an_interrupted_student_copy_leaves_no_partial_copy(monkeypatch, tmp_path, capsys):
    copy2, copied = kit.shutil.copy2, []
    def until_ctrl_c(src, dst):
        copied.append(dst)
        if len(copied) == 5:
            raise KeyboardInterrupt
        copy2(src, dst)
    monkeypatch.setattr(kit.shutil, "copy2", until_ctrl_c)
    assert kit.main(["student", str(tmp_path / "course")]) == 130
    assert os.listdir(tmp_path) == [] and capsys.readouterr().err.startswith("interrupted: nothing written")

def test_a_report_replaces_only_a_kit_report_and_json_holds_the_same_rows(tmp_path):
    rows = [dict(student="a", exercise=4, points=1, of=1, status="passed", reason="", tests="1/1", answer="")]
    for name in ["r.csv", "r.json"]:
        path = str(tmp_path / name)
        kit.write_report(rows, path)
        kit.check_report_path(path)  # its own report: may be replaced
    assert json.load(open(tmp_path / "r.json"))["rows"] == rows
    assert list(csv.DictReader(open(tmp_path / "r.csv"))) == [{k: str(v) for k, v in rows[0].items()}]

def test_a_csv_report_shows_a_cell_that_a_spreadsheet_would_run_as_text_and_json_keeps_it(tmp_path):
    names = ['=HYPERLINK("http://x", "a")', "+1", "-2+3", "@SUM(A1:A9)", "\t=1", "\r=1", "ok=1", "caf\\xe9"]
    rows = [dict(student=name, exercise=4, points=0, of=1, status="FAILED", reason="-x", tests="0/1",
                 answer="") for name in names]
    kit.write_report(rows, str(tmp_path / "r.csv"))
    kit.write_report(rows, str(tmp_path / "r.json"))
    back = list(csv.DictReader(open(tmp_path / "r.csv", newline="")))
    assert [r["student"] for r in back] == ["'" + n.replace("\r", "\\r") for n in names[:6]] + names[6:]
    assert {r["reason"] for r in back} == {"'-x"} and {r["points"] for r in back} == {"0"}
    assert json.load(open(tmp_path / "r.json"))["rows"] == rows
    kit.check_report_path(str(tmp_path / "r.csv"))   # still the kit's own report: may be replaced

def test_a_copy_zipped_as_one_folder_is_graded_as_that_copy_and_a_formula_name_reaches_the_csv_as_text(
        copy, tmp_path):
    """A Gradescope upload of the copy's folder (course/ with macOS's __MACOSX beside it) and a folder named
    like a formula, graded from their parent (the report names them as given)."""
    heading = "## 4. Definition 3.2\n\n"
    answer = [("ANSWERS.md", heading + "(your answer)", heading + "p* is biased low.")]
    submission(copy, tmp_path / "zipped" / "course", (4,), answer)
    (tmp_path / "zipped" / "__MACOSX" / "course").mkdir(parents=True)
    (tmp_path / "zipped" / ".DS_Store").write_text("")
    submission(copy, tmp_path / "=1+2", (4,))
    for where in ("two", "two/a", "two/b"):   # two copies in one upload: which one? neither
        (tmp_path / where).mkdir()
    for where in ("two/a", "two/b"):
        (tmp_path / where / "evaluate.py").write_text("")
    run = kit_cli("score", "zipped", "=1+2", "two", "--exercises", "4", "--no-sandbox", "--report", "r.csv",
                  cwd=str(tmp_path))
    assert run.returncode == 0, run.stdout + run.stderr
    assert graded(tmp_path / "r.csv") == {("zipped", 4): ("passed", "", "1", "written"),
                                          ("'=1+2", 4): ("passed", "", "1", "empty"),
                                          ("two", 4): ("FAILED", "not a copy", "0", "none")}

def test_answers_counts_a_heading_with_text_as_written_and_the_placeholder_or_no_heading_as_empty(tmp_path):
    written = [n for n, e in kit.EXERCISES.items() if e[2]]
    text = kit.answers_template().replace(kit.ANSWER_PLACEHOLDER, "p* is biased low.", 1)
    (tmp_path / "ANSWERS.md").write_text(text[:text.index(f"## {written[-1]}.")])  # the last heading cut
    assert kit.answers(tmp_path) == {n: "written" if n == written[0] else "empty" for n in written}
    assert kit.answers(tmp_path / "nowhere") == {}

def test_nul_padding_and_a_bare_heading_are_no_answer(tmp_path):
    written = [n for n, e in kit.EXERCISES.items() if e[2]]
    template = kit.answers_template()
    last = template.rindex(kit.ANSWER_PLACEHOLDER)
    for text, answered in [(template + "\0" * 1000, []),   # `truncate -s` pads with NULs
                           (template.replace(kit.ANSWER_PLACEHOLDER, "\0\x07 \0"), []),
                           (template[:template.rindex("\n## ") + 1] + f"## {written[-1]}. its title", []),
                           (template[:last] + "\0\0p* is biased low.\0", [written[-1]]),
                           (template.replace(kit.ANSWER_PLACEHOLDER, "\u200b\ufeff\u00a0\t\x0b"), [])]:
        (tmp_path / "ANSWERS.md").write_text(text)
        assert kit.answers(tmp_path) == {n: "written" if n in answered else "empty" for n in written}

def test_a_file_of_max_read_bytes_is_read_and_one_byte_more_is_too_large(tmp_path):
    (tmp_path / "gla.py").write_bytes(b"#" * kit.MAX_READ)
    assert kit.read_exercise_file(str(tmp_path), "gla.py") == "#" * kit.MAX_READ
    (tmp_path / "ANSWERS.md").write_text(kit.answers_template().replace(kit.ANSWER_PLACEHOLDER, "yes", 1))
    with open(tmp_path / "ANSWERS.md", "a") as f:
        f.write(" " * (kit.MAX_READ - f.tell()))
    assert list(kit.answers(tmp_path).values()).count("written") == 1
    for name in ("gla.py", "ANSWERS.md"):
        with open(tmp_path / name, "a") as f:
            f.write("#")
    with pytest.raises(kit.KitError, match=re.escape(kit.TOO_LARGE)):
        kit.read_exercise_file(str(tmp_path), "gla.py")
    assert set(kit.answers(tmp_path).values()) == {f"ANSWERS.md: {kit.TOO_LARGE}"}
    (tmp_path / "ANSWERS.md").unlink()
    (tmp_path / "ANSWERS.md").symlink_to(tmp_path / "gla.py")
    assert set(kit.answers(tmp_path).values()) == {"ANSWERS.md: symlink"}

def test_an_answers_md_the_kit_cannot_read_is_that_students_note(tmp_path, monkeypatch):
    (tmp_path / "ANSWERS.md").write_text(kit.answers_template())
    def denied(path):
        raise PermissionError(errno.EACCES, "Permission denied", path)
    monkeypatch.setattr(kit, "read_capped", denied)
    assert set(kit.answers(tmp_path).values()) == {"ANSWERS.md: unreadable (Permission denied)"}

BOUNDED = """import concurrent.futures, os, resource, sys
sys.path.insert(0, sys.argv[1])
import kit
resource.setrlimit(resource.RLIMIT_AS, (1 << 30,) * 2)   # 1 GiB of address space: no 2 GiB read fits
sub, done = sys.argv[2], concurrent.futures.Future()
done.set_result(("passed", "", 2, 2))
def show(what):
    try:
        print(repr(what()))
    except BaseException as e:
        print(type(e).__name__, e)
show(lambda: set(kit.answers(sub).values()))
show(lambda: kit.read_exercise_file(sub, "evaluate.py"))
show(lambda: kit.outcome(0, os.path.join(sub, "report.xml"), "", 4))   # a report, then 2 GiB of NULs
show(lambda: kit.outcome(0, os.path.join(sub, "fifo.xml"), "", 4))    # no one writes it: no wait
show(lambda: kit.outcome(0, os.path.join(sub, "link.xml"), "", 4))    # to a good report: not followed
check = [sys.executable, "-c", (   # a check whose output ends, past 2 GiB, with exercise 4's stub
    "import os, sys\\nopen(sys.argv[1] + '/.kit/report.xml', 'w').write('<testsuites><testcase><failure/>'\\n"
    "'</testcase></testsuites>')\\nos.ftruncate(1, 2 << 30)\\nos.lseek(1, 0, os.SEEK_END)\\n"
    "os.write(1, b'NotImplementedError: exercise 4\\\\n')\\nsys.exit(1)\\n")]
tree = os.path.join(sub, "tree")
os.mkdir(tree)
show(lambda: kit.run_check(lambda folder: check + [folder], tree, os.path.join(sub, "c.log"), [], 4, 60, 1))
row = kit.submission_rows(sub, [4], {(sub, 4): done}, os.path.join(sub, "work-"), False)[0]
print(len(row["output"]), row["output"].endswith("the end\\n"), row["answer"])
"""

def test_every_file_of_a_submission_or_a_check_is_read_bounded(tmp_path):
    """2 GiB sparse files (ANSWERS.md, an exercise's file, a check's report and log) read with 1 GiB of
    address space, and reports that cannot be read without waiting or following a link."""
    for name in ("ANSWERS.md", "evaluate.py", "work-4/check0.log"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text("x")
        os.truncate(tmp_path / name, 2 << 30)
    with open(tmp_path / "work-4" / "check0.log", "a") as f:
        f.write("the end\n")
    good = '<testsuites><testsuite><testcase name="t"/></testsuite></testsuites>'
    (tmp_path / "good.xml").write_text(good)
    assert kit.outcome(0, str(tmp_path / "good.xml"), "", 4) == ("passed", "", 1, 1)
    (tmp_path / "report.xml").write_text(good)
    os.truncate(tmp_path / "report.xml", 2 << 30)
    os.mkfifo(tmp_path / "fifo.xml")
    (tmp_path / "link.xml").symlink_to(tmp_path / "good.xml")
    (tmp_path / "dangling.xml").symlink_to(tmp_path / "nowhere.xml")   # a report, replaced by a link
    assert kit.outcome(0, str(tmp_path / "dangling.xml"), "", 4) == ("FAILED", "bad report", 0, 0)
    (tmp_path / "big.xml").write_text(good + " " * kit.MAX_READ)   # valid XML, but more than pytest writes
    assert kit.outcome(0, str(tmp_path / "big.xml"), "", 4) == ("FAILED", "bad report", 0, 0)
    run = subprocess.run([sys.executable, "-c", BOUNDED, os.path.join(ROOT, "docs"), str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    bad = repr(("FAILED", "bad report", 0, 0))
    too_large = repr({f"ANSWERS.md: {kit.TOO_LARGE}"})
    assert run.stdout.splitlines()[:6] == [too_large, f"KitError {kit.TOO_LARGE}", bad, bad, bad,
                                           repr(("FAILED", "stubbed", 0, 1))], run.stdout + run.stderr
    assert run.stdout.splitlines()[-1] == f"{kit.OUTPUT} True ANSWERS.md: {kit.TOO_LARGE}", run.stderr
    assert "the end" in kit.tail_of(str(tmp_path / "work-4" / "check0.log"), 100)

def test_a_students_huge_files_cost_only_their_rows_and_the_class_is_graded(copy, tmp_path):
    """A 2 GiB (sparse) ANSWERS.md and a 2 GiB exercise file, graded by a kit with 1.5 GiB of address space:
    that student's rows say what was too large, the class is graded and the report written."""
    heading = "## 4. Definition 3.2\n\n"
    answer = [("ANSWERS.md", heading + "(your answer)", heading + "ok")]
    subs = [submission(copy, tmp_path / name, (4,), edits)
            for name, edits in [("huge", ()), ("huge-code", ()), ("fine", answer)]]
    for path in ("huge/ANSWERS.md", "huge-code/evaluate.py"):
        os.truncate(tmp_path / path, 2 << 30)
    limit = lambda: resource.setrlimit(resource.RLIMIT_AS, (3 << 29,) * 2)
    run = subprocess.run([sys.executable, os.path.join(ROOT, "docs", "kit.py"), "score", *subs, "--exercises",
                          "4", "--jobs", "2", "--report", str(tmp_path / "r.csv")], capture_output=True,
                         text=True, env=dict(os.environ, OMP_NUM_THREADS="1"), preexec_fn=limit)
    assert run.returncode == 0, run.stdout + run.stderr
    too_large = f"ANSWERS.md: {kit.TOO_LARGE}"
    assert graded(tmp_path / "r.csv") == {("huge", 4): ("passed", "", "1", too_large),
                                          ("huge-code", 4): ("FAILED", f"{kit.TOO_LARGE}: evaluate.py", "0",
                                                             "empty"),
                                          ("fine", 4): ("passed", "", "1", "written")}
    assert f"huge   {too_large}\n" in run.stdout, run.stdout

# the kit run by a Python that prints, once the kit returns, its own peak memory (resident, in kB)
KIT_PEAK = """import sys
sys.path.insert(0, sys.argv.pop(1))
import kit
code = kit.main()
print(next(line for line in open("/proc/self/status") if line.startswith("VmHWM")).split()[1])
sys.exit(code)
"""

def test_a_submission_that_parses_allocates_or_writes_too_much_costs_its_row_and_the_kit_stays_small(
        copy, tmp_path):
    """4 MB of statements before exercise 4's code (parsing them takes about 1 GiB), a check that maps 3 GiB
    (with --memory 2), one that makes its output 1 GiB: each is that student's row, the class is graded,
    the kit's own peak stays small and its temporary folder goes."""
    greedy = "    __import__('torch').empty(3 << 30, dtype=torch.uint8)   # mapped, never touched\n"
    writer = "    import os\n    os.ftruncate(1, 1 << 30)   # (sparse)\n"
    subs = [submission(copy, tmp_path / name, (4,), edits) for name, edits in [
        ("statements", ()), ("greedy", [("evaluate.py", T_STAR, greedy + T_STAR)]),
        ("writer", [("evaluate.py", T_STAR, writer + T_STAR)]), ("fine", ())]]
    code = (tmp_path / "statements" / "evaluate.py").read_bytes()
    (tmp_path / "statements" / "evaluate.py").write_bytes(b"x = 1\n" * 680000 + code)
    assert os.path.getsize(tmp_path / "statements" / "evaluate.py") <= kit.MAX_READ
    (tmp_path / "t").mkdir()
    run = subprocess.run([sys.executable, "-c", KIT_PEAK, os.path.join(ROOT, "docs"), "score", *subs,
                          "--exercises", "4", "--memory", "2", "--jobs", "2", "--report",
                          str(tmp_path / "r.csv")],
                         capture_output=True, text=True,
                         env=dict(os.environ, OMP_NUM_THREADS="1", TMPDIR=str(tmp_path / "t")))
    assert run.returncode == 0, run.stdout + run.stderr
    assert graded(tmp_path / "r.csv") == {
        ("statements", 4): ("FAILED", f"{kit.TOO_LARGE_TO_PARSE}: evaluate.py", "0", "empty"),
        ("greedy", 4): ("FAILED", "out of memory", "0", "empty"),
        ("writer", 4): ("FAILED", kit.TOO_MUCH_WRITTEN, "0", "empty"),
        ("fine", 4): ("passed", "", "1", "empty")}
    assert int(run.stdout.split()[-1]) < 200 << 10, run.stdout   # kB: the kit's own peak, under 200 MiB
    assert os.listdir(tmp_path / "t") == []

def pitfall_bullets(n):
    """The "Pitfalls:" bullets of exercise n in docs/INSTRUCTOR.md, each as one line."""
    section = re.split(r"^## ", open(os.path.join(ROOT, "docs", "INSTRUCTOR.md")).read(), flags=re.M)
    section = next(s for s in section if s.startswith(f"{n}. "))
    block = re.search(r"^Pitfalls:\n((?:- .*\n(?:  .*\n)*)+)", section, flags=re.M)
    return [" ".join(b.split()) for b in re.split(r"^- ", block.group(1), flags=re.M)[1:]] if block else []

# The pitfalls graded in three kit runs, each of exercises whose files differ: a pitfall's folder holds only
# the file it mutates, so the other exercises of its run are "missing" at once, without a check
PITFALL_RUNS = [(1, 4, 6), (2, 5, 7), (3, 8, 9)]

def test_pitfall_runs_hold_every_exercise_once_and_no_two_of_a_run_share_a_file():
    assert sorted(n for numbers in PITFALL_RUNS for n in numbers) == [n for n in kit.EXERCISES if n != 10]
    for numbers in PITFALL_RUNS:
        paths = [path for n in numbers for path in kit.EXERCISES[n][3]]
        assert len(paths) == len(set(paths)), numbers

@pytest.mark.parametrize("numbers", PITFALL_RUNS, ids=lambda numbers: ",".join(map(str, numbers)))
def test_every_pitfall_instructor_md_lists_fails_its_exercises_check(numbers, tmp_path):
    """Each bullet has its mutation of the reference (inside the exercise's functions); graded, each one is
    FAILED with failing tests (not an import error, not a time-out)."""
    subs = []
    for n in numbers:
        mine, bullets = [p for p in PITFALLS if p[0] == n], pitfall_bullets(n)
        assert bullets and all(any(" ".join(p[1].split()) in b for p in mine) for b in bullets), bullets
        for k, (_, phrase, path, old, new) in enumerate(mine):
            assert sum(" ".join(phrase.split()) in b for b in bullets) == 1, phrase
            text = open(os.path.join(ROOT, path)).read()
            assert text.count(old) == 1, old
            at, tree = text[:text.index(old)].count("\n") + 1, ast.parse(text)
            spans = [kit.find(tree, name) for name in kit.EXERCISES[n][3][path]]
            last = at + old.rstrip("\n").count("\n")
            assert any(f.lineno <= at and last <= f.end_lineno for f in spans), phrase
            folder = tmp_path / f"pitfall{n}-{k}" / os.path.dirname(path)
            folder.mkdir(parents=True)
            (folder / os.path.basename(path)).write_text(text.replace(old, new))
            subs.append(str(tmp_path / f"pitfall{n}-{k}"))
    run = kit_cli("score", *subs, "--exercises", ",".join(map(str, numbers)), "--jobs", "2", "--fail-fast",
                  "--no-sandbox", "--report", str(tmp_path / "r.csv"))
    assert run.returncode == 0, run.stdout + run.stderr
    rows = graded(tmp_path / "r.csv")
    for n in numbers:
        mine = [p for p in PITFALLS if p[0] == n]
        assert [rows[f"pitfall{n}-{k}", n][:2] for k in range(len(mine))] == [("FAILED", "failed")] * len(
            mine), [(p[1], rows[f"pitfall{n}-{k}", n]) for k, p in enumerate(mine)]

@pytest.mark.parametrize("code, cases, out, want", [
    (0, ["", ""], "", ("passed", "", 2, 2)),
    (-11, [], "", ("FAILED", "crashed", 0, 0)), (-1, [], "", ("FAILED", "crashed", 0, 0)),
    (0, [], "", ("FAILED", "no tests", 0, 0)),  # a report with no test in it
    (2, ["<failure/>"], "Interrupted: 1 error during collection", ("FAILED", "error", 0, 1)),
    (0, None, "", ("FAILED", "exited", 0, 0)),  # no XML: pytest never finished
    (5, [], "", ("FAILED", "no tests", 0, 0)),
    (0, ["", "<skipped/>"], "", ("FAILED", "skipped", 1, 2)),
    (1, ["", "<failure/>"], "E AssertionError", ("FAILED", "failed", 1, 2)),
    (2, ["<error/>"], "E SyntaxError", ("FAILED", "error", 0, 1)),
    (1, ["<failure/>"], "NotImplementedError: exercise 7", ("FAILED", "stubbed", 0, 1)),
    (1, ["<failure/>", "<failure/>"], "NotImplementedError: exercise 7\nNotImplementedError: exercise 10\n"
     "NotImplementedError: exercise 2", ("FAILED", "needs 2,10", 0, 2)),  # another exercise's stub
])
def test_a_checks_outcome_and_its_one_word_reason(code, cases, out, want, tmp_path):
    xml = tmp_path / "check.xml"
    if cases is not None:
        tests = "".join(f'<testcase name="t{i}">{c}</testcase>' for i, c in enumerate(cases))
        xml.write_text(f"<testsuites><testsuite>{tests}</testsuite></testsuites>")
    assert kit.outcome(code, str(xml), out, 7) == want
