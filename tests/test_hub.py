"""Hub ids resolved from a cache built here, never fetched at run time; export to the official layout."""
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch

import config
import datafiles
import evaluate
import model
import official
import train
from conftest import ROOT, TRAIN, checkpoint, tiny_lm
from datafiles import DataError

X, FIXTURES = torch.randint(0, 61, (2, 24)), f"{ROOT}/tests/fixtures"   # any ids: the same for both models

def test_hub_ids_resolve_offline_from_the_cache_and_a_local_path_wins(tmp_path, monkeypatch, tok_json):
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))   # as HF_HOME
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)   # and HF_HUB_OFFLINE=1 at import
    for repo, folder in [("me/run", checkpoint(tmp_path / "me", lm=tiny_lm(seed=1))[0]), ("state-spaces/m",
                         f"{FIXTURES}/hf_mamba2"), ("EleutherAI/gpt-neox-20b", os.path.dirname(tok_json))]:
        root = tmp_path / "hf" / "hub" / f"models--{repo.replace('/', '--')}"   # huggingface_hub's layout
        shutil.copytree(folder, root / "snapshots" / ("a" * 40))
        (root / "refs").mkdir()
        (root / "refs" / "main").write_text("a" * 40)
    assert torch.equal(model.from_pretrained("me/run")(X)[0], tiny_lm(seed=1)(X)[0])
    assert datafiles.get_tokenizer("EleutherAI/gpt-neox-20b").name == datafiles.get_tokenizer(tok_json).name
    marker = tmp_path / "hf" / "hub" / "models--no--tok" / ".no_exist" / ("a" * 40) / "tokenizer.json"
    marker.parent.mkdir(parents=True)   # the Hub said no/tok holds no tokenizer.json: a marker, not a path
    marker.touch()
    (marker.parents[2] / "refs").mkdir()
    (marker.parents[2] / "refs" / "main").write_text("a" * 40)
    with pytest.raises(DataError, match=r"has no tokenizer.json: run `hf download no/tok tokenizer.json`"):
        datafiles.get_tokenizer("no/tok")
    part = tmp_path / "hf" / "hub" / "models--org--part"   # a partial snapshot: config.json, no weights
    shutil.copytree(tmp_path / "hf" / "hub" / "models--state-spaces--m", part)
    os.remove(part / "snapshots" / ("a" * 40) / "pytorch_model.bin")
    with pytest.raises(DataError, match=r"holds config.json but not pytorch_model.bin: run `hf "
                                   r"download org/part pytorch_model.bin`"):
        model.from_pretrained("org/part")
    checkpoint(tmp_path / "me" / "run", lm=tiny_lm(seed=2))   # a local me/run wins over the hub's
    monkeypatch.chdir(tmp_path)
    assert torch.equal(model.from_pretrained("me/run")(X)[0], tiny_lm(seed=2)(X)[0])
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}   # the export command, in a
    cmd = [sys.executable, f"{ROOT}/official.py", "--export", "state-spaces/m", "o"]   # process of its own
    runs = [subprocess.run(cmd, capture_output=True, text=True, env=env) for _ in range(2)]
    assert not runs[0].returncode and runs[1].stderr == "error: o holds a model already: pass a new OUT_DIR\n"

@pytest.mark.parametrize("source", ["mamba1", "mamba2", "hf_mamba1", "hf_mamba2"])
def test_export_round_trips_to_identical_logits(source, tmp_path):
    lm = model.from_pretrained(f"{FIXTURES}/{source}") if source[:2] == "hf" else \
        tiny_lm(source, vocab_size=61, pad_vocab_size_multiple=16)
    lm.backbone.norm_f.weight.data += 0.5   # post-trained: the export holds the weights as they are now
    official.export(lm, str(tmp_path / "out"))
    back = model.from_pretrained(str(tmp_path / "out"))
    assert back.cfg == lm.cfg and torch.equal(back(X)[0], lm(X)[0])
    for other in (tiny_lm("gla"), tiny_lm("mamba2", norm_eps=1e-6), tiny_lm("mamba1", tie_embeddings=False)):
        with pytest.raises(ValueError, match="official layout"):   # mamba_ssm's: eps 1e-5, a tied head
            official.export(other, str(tmp_path / "other"))
    assert not (tmp_path / "other").exists()

def test_an_export_keeps_the_tokenizer_it_was_trained_with(tmp_path, tok_json, capsys):
    run, exp, ev = (str(tmp_path / d) for d in ("run", "exp", "ev"))
    train.main(TRAIN + ["--steps", "1", "--tokenizer", tok_json, "--out", run])
    official.main(["--export", run, exp])
    with pytest.raises(SystemExit, match="holds a model already"):   # its args.json is the run's
        official.main(["--export", exp, run])
    assert model.train_config(exp) == model.train_config(run) == json.load(open(f"{exp}/args.json"))
    post = config.get_args(["--init-from", exp, "--out", str(tmp_path / "post")])   # post-training inherits
    assert (post.tokenizer, post.data, post.seq_len, post.arch) == (tok_json, TRAIN[1], 16, "mamba2")
    with pytest.raises(SystemExit, match=r"--tokenizer bytes \(bytes\) does not match .*exp's json-"):
        train.main(["--init-from", exp, "--tokenizer", "bytes", "--out", str(tmp_path / "post")])
    assert evaluate.main([exp, "--tokenizer", "bytes", "--out", ev]) == 2
    assert "does not match the checkpoints' json-" in capsys.readouterr().err
    # its own tokenizer and T_train are the defaults
    assert evaluate.main([exp, "--metrics", "ppl", "--n-seqs", "2", "--eval-len", "32", "--out", ev]) == 0
    report = json.load(open(f"{ev}/eval.json"))
    assert report["tokenizer"] == tok_json and report["models"][0]["t_train"] == 16

def test_an_interrupted_export_leaves_none_of_its_files_and_says_so(tmp_path, monkeypatch):
    ck, out = checkpoint(tmp_path / "run", seq_len=16)[0], tmp_path / "exp"
    code = (f"import sys, time, torch; sys.path.insert(0, {ROOT!r}); import official\n"   # a slow disk
            "torch.save = lambda obj, f: (open(f, 'wb').write(b'part'), time.sleep(120))\n"
            f"official.main(['--export', {ck!r}, {str(out)!r}])")
    p = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not list(tmp_path.glob("exp/*.tmp")) and time.time() < deadline:
        time.sleep(0.05)
    p.send_signal(signal.SIGTERM)
    err = p.communicate(timeout=60)[1]
    assert p.returncode == 1 and err == f"interrupted: nothing written to {out} (no temporary file left)\n"
    assert not out.exists()
    out.mkdir()   # an empty folder of the user's: the weights written, then Ctrl-C on args.json
    monkeypatch.setattr("pathlib.Path.write_text", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(SystemExit, match="interrupted: nothing written"):
        official.main(["--export", ck, str(out)])
    assert os.listdir(out) == []   # the folder is kept

def test_export_refuses_an_empty_name_or_a_file_in_one_line_and_writes_nothing(tmp_path, capsys, monkeypatch):
    ck = checkpoint(tmp_path / "run")[0]
    monkeypatch.chdir(tmp_path)   # "" would read as this folder
    (tmp_path / "file").write_text("mine")
    for args in [ck, ""], ["", "o"]:
        with pytest.raises(SystemExit, match="^2$"):
            official.main(["--export", *args])
        assert capsys.readouterr().err.endswith(": CKPT and OUT_DIR must not be empty\n")
    with pytest.raises(SystemExit, match="^error: file is a file already: pass a new OUT_DIR$"):
        official.main(["--export", ck, "file"])
    (tmp_path / "half").mkdir()   # any one file of an export there (its weights, no config.json) is a model
    (tmp_path / "half" / "pytorch_model.bin").write_text("mine")
    with pytest.raises(SystemExit, match="^error: half holds a model already: pass a new OUT_DIR$"):
        official.main(["--export", ck, "half"])
    assert sorted(os.listdir()) == ["file", "half", "run"] and (tmp_path / "file").read_text() == "mine"
    assert [f.read_text() for f in (tmp_path / "half").iterdir()] == ["mine"]

def test_a_partial_snapshot_names_the_missing_weights_and_the_command(tmp_path, monkeypatch):
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    root = tmp_path / "hub" / "models--org--partial"   # config.json fetched, pytorch_model.bin not
    (root / "snapshots" / ("a" * 40)).mkdir(parents=True)
    shutil.copy(f"{FIXTURES}/hf_mamba2/config.json", root / "snapshots" / ("a" * 40))
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text("a" * 40)
    for load in (model.from_pretrained, model.train_config):
        with pytest.raises(DataError, match=r"holds config.json but not pytorch_model.bin: run `hf "
                                       r"download org/partial pytorch_model.bin`"):
            load("org/partial")

def test_a_hub_id_not_in_the_cache_is_never_fetched_even_online_and_names_the_command(tmp_path):
    with socket.socket() as hub:   # a Hub (and proxy) that listens: any request would reach it
        hub.bind(("127.0.0.1", 0))
        hub.listen(16)
        url = "http://127.0.0.1:%d" % hub.getsockname()[1]
        env = dict(os.environ, HF_HOME=str(tmp_path / "hf"), HF_ENDPOINT=url, HF_HUB_OFFLINE="0", HTTPS_PROXY=url,
                   HTTP_PROXY=url, NO_PROXY="", no_proxy="")
        calls = [[f"{ROOT}/official.py", "--export", "org/model", str(tmp_path / "out")],
                 [f"{ROOT}/train.py", *TRAIN, "--tokenizer", "org/tok", "--out", str(tmp_path / "run")]]
        runs = [subprocess.run([sys.executable, *c], env=env, capture_output=True, text=True, timeout=120)
                for c in calls]
        assert select.select([hub], [], [], 0)[0] == [], "a request reached the Hub"
    for r, missing in zip(runs, ("config.json nor pytorch_model.bin", "tokenizer.json")):
        assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
        assert f"the Hugging Face cache has no {missing}: run `hf download " in r.stderr
