"""The commands the documents show still parse against the scripts' command lines: each ```bash block runs
in bash with `python` (and torchrun) recording its arguments instead of running, then every recorded command
goes through its script's own argparse, stopped before the script does any work."""
import argparse
import os
import re
import runpy
import subprocess
import sys

import pytest

from conftest import ROOT

SCRIPTS = ("train.py", "evaluate.py", "bench.py", "model.py", "data.py", "docs/kit.py")
RECORD = r"""set -u
python() { printf '%s\x1f' "$@" >> "$LOG"; echo >> "$LOG"; }
torchrun() { while [[ $1 != *.py ]]; do shift; done; python "$@"; }
"""

class Parsed(Exception):
    """Raised by parse_args once the flags parsed: the script stops before its work."""

def commands(doc, tmp_path):
    """-> (block number, argv) of every python command doc's ```bash blocks run (loops and variables
    expanded by bash itself, an unset variable an error; no other program runs: PATH is empty)."""
    blocks = re.findall(r"```bash\n(.*?)```", open(os.path.join(ROOT, doc)).read(), re.S)
    assert blocks, f"{doc} shows no bash block"
    found = []
    for i, block in enumerate(blocks):
        log = tmp_path / f"block{i}"
        log.touch()
        bash = subprocess.run(["/bin/bash", "-c", RECORD + block], cwd=tmp_path, capture_output=True,
                              text=True, env={"PATH": "/nonexistent", "LOG": str(log), "HOME": str(tmp_path)})
        assert "unbound variable" not in bash.stderr, f"{doc}, bash block {i + 1}: {bash.stderr}"
        found += [(i, line.split("\x1f")[:-1]) for line in log.read_text().splitlines()]
    return found

@pytest.mark.parametrize("doc", ["docs/RESULTS.md", "README.md", "docs/GPU.md"])
def test_every_python_command_a_document_shows_parses_against_its_script(doc, tmp_path, monkeypatch, capsys):
    parse = argparse.ArgumentParser.parse_args
    def parse_only(self, args=None, namespace=None):
        self.allow_abbrev = False  # each flag spelled whole: no prefix that a new flag could make ambiguous
        raise Parsed(parse(self, args, namespace))
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_only)
    monkeypatch.chdir(ROOT)
    checked = 0
    for block, argv in commands(doc, tmp_path):
        if argv[0].startswith("-"):  # python -m pytest, python -c: not a script of the repo
            continue
        assert argv[0] in SCRIPTS, f"{doc}, bash block {block + 1}: python {' '.join(argv)}: no such script"
        monkeypatch.setattr(sys, "argv", argv)
        with pytest.raises(Parsed) as parsed:
            try:
                runpy.run_path(os.path.join(ROOT, argv[0]), run_name="__main__")
            except SystemExit as e:  # argparse's error: an unknown flag, a missing or bad value
                pytest.fail(f"{doc}, block {block + 1}: python {' '.join(argv)}: {e} {capsys.readouterr().err}")
        if argv[0] == "train.py" and parsed.value.args[0].seeds:
            import train
            train.parse_seeds(parsed.value.args[0].seeds)   # exits on a bad --seeds
        checked += 1
    assert checked, f"{doc}: no command checked"
