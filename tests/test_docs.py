"""The commands the documents show still parse against the scripts' command lines: each ```bash block runs
in bash with `python` recording its arguments instead of running, then every recorded command
goes through its script's own argparse, stopped before the script does any work."""
import argparse
import os
import re
import runpy
import subprocess
import sys

import pytest

from plumbing import flags
from conftest import ROOT

SCRIPTS = ("train.py", "evaluate.py", "bench.py", "docs/kit.py")
MODULES = ("plumbing.token_cache", "plumbing.export")   # python -m MODULE: the tokenize-only command, export
RECORD = r"""set -u
python() { printf '%s\x1f' "$@" >> "$LOG"; echo >> "$LOG"; }
torchrun() { while [[ $1 != *.py ]]; do shift; done; python "$@"; }   # its script and flags
"""

class Parsed(Exception):
    """Raised by parse_args once the flags parsed: the script stops before its work."""

def commands(doc, tmp_path):
    """-> (block number, argv) of every python command doc's ```bash blocks run (loops and variables
    expanded by bash itself; no other program runs: PATH is empty), and the blocks using an unset variable."""
    blocks = re.findall(r"```bash\n(.*?)```", open(os.path.join(ROOT, doc)).read(), re.S)
    found, unset = [], []
    for i, block in enumerate(blocks):
        log = tmp_path / f"block{i}"
        log.write_text("")
        bash = subprocess.run(["/bin/bash", "-c", RECORD + block], cwd=tmp_path, capture_output=True,
                              text=True, env={"PATH": "/nonexistent", "LOG": str(log), "HOME": str(tmp_path)})
        if "unbound variable" in bash.stderr:
            unset.append(f"block {i + 1}: {bash.stderr.strip()}")
        found += [(i, line.split("\x1f")[:-1]) for line in log.read_text().splitlines()]
    return found, unset

def problems(doc, tmp_path, monkeypatch, capsys):
    """-> what does not hold of doc's commands: an unset variable, a script that is not there, flags that do
    not parse (argparse's own error), a bad --seeds; [] when every command parses."""
    parse = argparse.ArgumentParser.parse_args
    def parse_only(self, args=None, namespace=None):
        self.allow_abbrev = False  # each flag spelled whole: no prefix that a new flag could make ambiguous
        raise Parsed(parse(self, args, namespace))
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_only)
    monkeypatch.chdir(ROOT)
    found, bad = commands(doc, tmp_path)
    for block, argv in [(b, a) for b, a in found if a[0] != "-c"]:  # python -c: not a script's flags
        where = f"block {block + 1}: python {' '.join(argv)}"
        module = argv[1] if argv[0] == "-m" else None
        if module not in (None, "pytest") and module not in MODULES or not module and argv[0] not in SCRIPTS:
            bad.append(f"{where}: no such script")
            continue
        if module == "pytest":
            continue
        monkeypatch.setattr(sys, "argv", argv[1:] if module else argv)
        try:
            if module:
                runpy.run_path(os.path.join(ROOT, *module.split(".")) + ".py", run_name="__main__")
            else:
                runpy.run_path(os.path.join(ROOT, argv[0]), run_name="__main__")
            bad.append(f"{where}: ran past its flags")
        except SystemExit as e:  # argparse's error: an unknown flag, a missing or bad value
            bad.append(f"{where}: {e} {capsys.readouterr().err.strip()}")
        except Parsed as parsed:
            try:
                _ = argv[0] == "train.py" and parsed.args[0].seeds and flags.parse_seeds(parsed.args[0].seeds)
            except SystemExit as e:
                bad.append(f"{where}: {e}")
    return bad if found else [f"{doc}: no command found"]

@pytest.mark.parametrize("doc", ["docs/RESULTS.md", "README.md", "docs/GPU.md"])
def test_every_python_command_a_document_shows_parses_against_its_script(doc, tmp_path, monkeypatch, capsys):
    assert problems(doc, tmp_path, monkeypatch, capsys) == []

def test_a_rotten_command_is_named_with_its_block_and_the_reason(tmp_path, monkeypatch, capsys):
    rotten = tmp_path / "ROTTEN.md"
    rotten.write_text("```bash\nfor S in 0 1; do python train.py --seed $S --steps 3; done\n```\n"
                      "```bash\npython evaluate.py out --eval-length 9\npython train.py --seeds 3-1\n"
                      "python evaluate.py out --n-seqs four\npython nowhere.py\n"
                      "python train.py --out $D\n```\n"
                      "```bash\npython bench.py --rep 3\n```\n")
    bad = problems(str(rotten), tmp_path, monkeypatch, capsys)
    assert [b.split(":")[0] for b in bad] == ["block 2"] + ["block 2"] * 4 + ["block 3"], bad
    for word in ("D: unbound variable", "unrecognized arguments: --eval-length", "--seeds must be A-B",
                 "--n-seqs: must be a positive integer", "nowhere.py: no such script", "--rep"):
        assert any(word in b for b in bad), (word, bad)

def test_ci_runs_the_readmes_install_line_and_test_command_in_a_new_venv():
    readme = re.search(r"## Two commands\n\n```bash\n(.*?)```", open(f"{ROOT}/README.md").read(), re.S)
    venv, install, test = [line.split("  #")[0].strip() for line in readme[1].splitlines()]
    ci = open(f"{ROOT}/.ci/run").read().splitlines()
    assert venv == "python3.11 -m venv .venv && . .venv/bin/activate" and venv in ci   # inside the clone
    demo = " && python train.py --demo"
    assert install.endswith(demo) and install.removesuffix(demo) in ci
    assert test in ci and ci[-1] == test   # the suite's exit status is CI's
    pins = [line.split("#")[0].split(";")[0].strip() for line in open(f"{ROOT}/requirements.txt")]
    assert all(re.fullmatch(r"[A-Za-z0-9_.-]+==[^=<>~!]+", p) for p in pins if p), pins  # each one pinned
    assert "torch==2.13.0" in pins and "pip install torch==2.13.0 &&" in install   # the CPU build, first

LEAKS = """import os, signal, subprocess, threading, time
def test_thread():
    threading.Thread(target=time.sleep, args=(3,), daemon=True).start()
def test_env():
    os.environ["LEFT_BEHIND"] = "1"
def test_child():
    subprocess.Popen(["sleep", "3"])
def test_handler():
    signal.signal(signal.SIGTERM, signal.default_int_handler)
def test_handler_put_back():
    assert signal.getsignal(signal.SIGTERM) is not signal.default_int_handler
"""

def test_a_test_that_leaves_process_state_behind_fails_and_handlers_are_put_back(tmp_path):
    (tmp_path / "test_leaks.py").write_text(LEAKS)   # beside a copy of the suite's conftest.py
    (tmp_path / "conftest.py").write_text(open(os.path.join(ROOT, "tests", "conftest.py")).read())
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
                        str(tmp_path)], capture_output=True, text=True, cwd=tmp_path,
                       env=dict(os.environ, PYTHONPATH=ROOT))
    errors = re.findall(r"^ERROR \S+::(test_\w+)", r.stdout, re.M)
    assert errors == ["test_thread", "test_env", "test_child"], r.stdout[-3000:]
    assert "5 passed, 3 errors" in r.stdout, r.stdout[-3000:]   # (an error at teardown: passed and an error)
