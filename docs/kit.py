"""The course kit of docs/EXERCISES.md: a student copy of the repo, and its score.

    python docs/kit.py student OUT [--exercises 1,3]   # the tracked files, the exercises' functions stubbed
    python docs/kit.py score [DIR]                     # each exercise's check in DIR (default: this repo)

A student copy holds the files git tracks, without the history and without WITHHELD. Each exercise's
functions keep their signature and docstring; the body becomes raise NotImplementedError("exercise N")
(found by name with ast: the code carries no markers). EXERCISES below is the one table of exercises,
their functions and checks; docs/EXERCISES.md prints the same commands (tests/test_course_kit.py checks)."""
import argparse
import ast
import contextlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WITHHELD = {"docs/INSTRUCTOR.md"}  # the answers stay with the instructor
# number: (title, {file: [function or Class.method]}, [pytest arguments of each check command])
EXERCISES = {
    1: ("chunked SSD", {"ssm.py": ["ssd_chunked"]}, [["tests/test_scans.py", "-k", "ssd and not triton"]]),
    2: ("the chunked GLA / RWKV-6 scan", {"gla.py": ["chunked_scan"]},
        [["tests/test_scans.py", "-k", "(gla or rwkv6) and chunked"],
         ["tests/test_gla_rwkv.py", "-k", "chunked"]]),
    3: ("position-wise perplexity", {"evaluate.py": ["position_nll_naive", "sequence_nll", "position_nll"]},
        [["tests/test_evaluate.py", "-k", "position_nll"]]),
    4: ("Definition 3.2", {"evaluate.py": ["length_generalization_naive"]},
        [["tests/test_evaluate.py", "-k", "hand_made"]]),
    5: ("Effective Remembrance", {"evaluate.py": ["effective_remembrance_naive"]},
        [["tests/test_evaluate.py", "-k", "effrem and not bad"]]),
    6: ("fitted noise", {"interventions.py": ["Noise.initial_state", "Noise.observe"]},
        [["tests/test_interventions.py", "-k", "fitted or random"]]),
    7: ("State Passing and TBTT", {"interventions.py": ["PassedState.initial_state", "PassedState.observe"]},
        [["tests/test_interventions.py", "-k", "sp_ or tbtt"]]),
    8: ("the Markov Bayes floor", {"data.py": ["markov_bayes_nll"]},
        [["tests/test_tasks.py", "-k", "markov_floor"]]),
    9: ("a mixer with an exact state split",
        {"docs/course.py": ["DiagonalRNN.zero_state", "DiagonalRNN.forward"]},
        [["tests/test_course_kit.py", "-k", "exercise9"]]),
    10: ("predict, then measure", {"docs/course.py": ["predictions", "verdict_rows"]},
         [["tests/test_course_kit.py", "-k", "exercise10"]]),
}

class KitError(Exception):
    pass

def command(args):
    """The shell command of one check, as docs/EXERCISES.md prints it."""
    return "python -m pytest -q " + shlex.join(args)

def find(tree, name):
    """The function `name` ("f" or "Class.method") at the top of a module's ast, or None."""
    *owner, name = name.split(".")
    body = tree.body
    if owner:
        body = next((n.body for n in body if isinstance(n, ast.ClassDef) and n.name == owner[0]), [])
    return next((n for n in body if isinstance(n, ast.FunctionDef) and n.name == name), None)

def stub(source, names, number, path):
    """source with each function of `names` reduced to its signature, docstring and the exercise's raise."""
    tree, lines, spans = ast.parse(source), source.splitlines(keepends=True), []
    for name in names:
        node = find(tree, name)
        if node is None or node.body[0].lineno == node.lineno:
            raise KitError(f"exercise {number}: no function {name} with a body of its own lines in {path}: "
                           "update EXERCISES in docs/kit.py")
        first = node.body[0]
        docstring = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(
            first.value.value, str)
        start = first.end_lineno if docstring else first.lineno - 1  # the first line to replace (0-based)
        spans.append((start, node.end_lineno, " " * first.col_offset))
    for start, end, indent in sorted(spans, reverse=True):
        lines[start:end] = [f'{indent}raise NotImplementedError("exercise {number}")\n']
    return "".join(lines)

def student(out, numbers):
    """Writes the student copy to out (absent or empty): built beside it, then renamed into place."""
    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        raise KitError(f"{out} exists and is not an empty directory: pass a new path")
    listed = subprocess.run(["git", "-C", ROOT, "ls-files", "-z"], capture_output=True, text=True)
    if listed.returncode:
        raise KitError(f"git ls-files failed in {ROOT} (a student copy is made from the repo's git checkout)")
    parent = os.path.dirname(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".kit-", dir=parent)
    try:
        for path in sorted(set(filter(None, listed.stdout.split("\0"))) - WITHHELD):
            os.makedirs(os.path.join(tmp, os.path.dirname(path)), exist_ok=True)
            shutil.copy2(os.path.join(ROOT, path), os.path.join(tmp, path))
        for n in numbers:
            for path, names in EXERCISES[n][1].items():
                with open(os.path.join(tmp, path)) as f:
                    text = stub(f.read(), names, n, path)
                with open(os.path.join(tmp, path), "w") as f:
                    f.write(text)
        if os.path.isdir(out):
            os.rmdir(out)
        os.rename(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

class Outcomes:
    """A pytest plugin: how many tests were selected, which passed and which failed or were skipped."""

    def __init__(self):
        self.total, self.failed, self.passed = 0, set(), set()

    def pytest_collection_finish(self, session):
        self.total += len(session.items)

    def pytest_runtest_logreport(self, report):
        if report.failed or report.skipped:
            self.failed.add(report.nodeid)
        elif report.when == "call":
            self.passed.add(report.nodeid)

def score(directory):
    """Runs every check in directory, one pytest session after another in this process; prints and returns
    {number: (tests passed, tests selected)}. An exercise passes when all of at least one test pass."""
    import pytest
    directory = os.path.abspath(directory)
    os.chdir(directory)
    results = {}
    for n, (title, _, checks) in EXERCISES.items():
        seen = Outcomes()
        for args in checks:
            with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):
                pytest.main(["-q", "-p", "no:cacheprovider", *args], plugins=[seen])
            for name, module in list(sys.modules.items()):  # the next check imports the code afresh
                if (getattr(module, "__file__", None) or "").startswith(directory + os.sep):
                    del sys.modules[name]
        passed = len(seen.passed - seen.failed)
        results[n] = (passed, seen.total)
        ok = passed == seen.total > 0
        hint = "" if ok else "   " + " && ".join(command(args) for args in checks)
        verdict = "passed" if ok else "FAILED"
        print(f"exercise {n:2d}  {title:<36} {passed:3d}/{seen.total:<3d} {verdict}{hint}")
    done = sum(p == t > 0 for p, t in results.values())
    print(f"total: {done}/{len(EXERCISES)} exercises passed")
    return results

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.error = lambda message: ap.exit(2, f"error: {message}\n")
    sub = ap.add_subparsers(dest="what", required=True)
    s = sub.add_parser("student", help="write a student copy to OUT (absent or empty)")
    s.add_argument("out", metavar="OUT")
    s.add_argument("--exercises", default=",".join(map(str, EXERCISES)), help="which to stub (default: all)")
    score_parser = sub.add_parser("score", help="run each exercise's check in DIR")
    score_parser.add_argument("dir", metavar="DIR", nargs="?", default=ROOT)
    args = ap.parse_args(argv)
    try:
        if args.what == "score":
            if not os.path.isdir(os.path.join(args.dir, "tests")):
                raise KitError(f"{args.dir} holds no tests/: pass the repo or a student copy")
            results = score(args.dir)
            return 0 if all(p == t > 0 for p, t in results.values()) else 1
        numbers = [int(n) for n in args.exercises.split(",") if n.isdigit() and int(n) in EXERCISES]
        if len(numbers) != len(args.exercises.split(",")):
            raise KitError(f"--exercises {args.exercises}: use numbers from 1 to {len(EXERCISES)}")
        student(args.out, numbers)
        print(f"wrote {args.out}: exercises {','.join(map(str, numbers))} stubbed; check: "
              f"python docs/kit.py score {args.out}")
    except (KitError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0

if __name__ == "__main__":
    sys.exit(main())
