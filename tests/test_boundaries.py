"""The edges of plumbing's checks: the figures a later evaluation may remove (report._figures_of), the new
runs that need --seq-len (flags), the args.json a resumed run refuses (runs), integer lists (files), the
presets' heads (model)."""
import json
import types

import pytest

import model
from plumbing import eval_flags, files, flags, report, runs


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


def test_an_integer_list_is_distinct_integers_in_range_and_each_flag_keeps_its_bounds():
    assert files.int_list("8,16") == [8, 16]
    assert files.int_list("0,3", minimum=0) == [0, 3] and files.int_list("0,3") is None
    assert files.int_list(str(2**63 - 1)) == [2**63 - 1] and files.int_list(str(2**63)) is None
    assert [files.int_list(t) for t in ("", "1,,2", "2,2", "-1", "1.5", " 1")] == [None] * 6
    assert flags.parse_seeds("0,5") == [0, 5] and flags.parse_seeds("0-1") == [0, 1]
    parse = lambda *argv: eval_flags.parse_args(["ckpt.pt", *argv], None, ["tv"], 16)
    assert parse("--seed", "0").seed == 0 and parse("--n-seqs", "3").n_seqs == 3
    assert parse("--passkey-lengths", "128,64", "--metrics", "passkey").passkey_lengths == [128, 64]
    for bad in (["--n-seqs", "3,4"], ["--n-seqs", "0"], ["--seed", str(2**63)]):
        with pytest.raises(SystemExit):
            parse(*bad)


def test_gated_deltanet_lm_has_fla_s_untied_head_and_norm_eps_as_gla():
    for arch in ("gla", "gated_deltanet"):
        cfg = model.make_config(arch, "tiny")
        assert (cfg.tie_embeddings, cfg.norm_eps) == (False, 1e-6)
    for arch in ("mamba1", "rwkv6"):
        cfg = model.make_config(arch, "tiny")
        assert (cfg.tie_embeddings, cfg.norm_eps) == (True, 1e-5)
