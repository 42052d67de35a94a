"""The edges of plumbing's checks: the figures a later evaluation may remove (report._figures_of), the new
runs that need --seq-len (flags), the args.json a resumed run refuses (runs)."""
import json
import types

import pytest

from plumbing import flags, report, runs


def test_figures_of_names_each_figure_an_evaluation_writes_passkey_included_and_nothing_else(tmp_path):
    recorded = ["ppl.png", "passkey.png", "effrem.png", "state.png", "../x.png", "eval.json", 3, None]
    (tmp_path / "eval.json").write_text(json.dumps({"figures": recorded}))
    assert report._figures_of(tmp_path / "eval.json") == ["ppl.png", "passkey.png", "effrem.png", "state.png"]
    (tmp_path / "eval.json").write_text(json.dumps({"figures": "passkey.png"}))   # not a list: none
    assert report._figures_of(tmp_path / "eval.json") == []
    assert report._figures_of(tmp_path / "missing.json") == []


def test_only_a_new_run_from_an_official_checkpoint_needs_seq_len(tmp_path):
    (tmp_path / "config.json").write_text("{}")   # an official checkpoint's folder: no T_train stated
    official = types.SimpleNamespace(init_from=str(tmp_path), resume=False)
    words = "is an official checkpoint, whose config.json does not state the length"
    with pytest.raises(SystemExit, match=words):
        flags.exit_on_official_without_seq_len(official, given={"init_from"})
    flags.exit_on_official_without_seq_len(official, given={"init_from", "seq_len"})
    # --resume: the checkpoint it resumes records T_train
    flags.exit_on_official_without_seq_len(types.SimpleNamespace(init_from=str(tmp_path), resume=True), set())
    # a run's folder (no config.json) states its T_train
    run = types.SimpleNamespace(init_from=str(tmp_path / "run"), resume=False)
    flags.exit_on_official_without_seq_len(run, given={"init_from"})


def test_a_resumed_run_refuses_only_an_args_json_that_names_another_run(tmp_path):
    args = types.SimpleNamespace(out=str(tmp_path), run_id="mine")
    metrics = str(tmp_path / "metrics.jsonl")
    for saved in ({"run_id": "mine"}, {"seed": 0}, {"run_id": None}):   # its own, or one naming no run
        (tmp_path / "args.json").write_text(json.dumps(saved))
        runs.exit_if_another_runs_files(args, metrics, 5)
    (tmp_path / "args.json").write_text(json.dumps({"run_id": "theirs"}))
    with pytest.raises(SystemExit, match="are another run's than"):
        runs.exit_if_another_runs_files(args, metrics, 5)
    runs.exit_if_another_runs_files(args, metrics, 0)   # a new run replaces another's args.json
