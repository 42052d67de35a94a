"""Hub ids resolved from a cache built here, never fetched at run time."""
import os
import select
import shutil
import socket
import subprocess
import sys

import pytest
import torch

import datafiles
import model
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
        env = dict(os.environ, HF_HOME=str(tmp_path / "hf"), HF_ENDPOINT=url, HF_HUB_OFFLINE="0",
                   HTTPS_PROXY=url, HTTP_PROXY=url, NO_PROXY="", no_proxy="")
        calls = [[f"{ROOT}/train.py", "--init-from", "org/model", "--out", str(tmp_path / "post")],
                 [f"{ROOT}/train.py", *TRAIN, "--tokenizer", "org/tok", "--out", str(tmp_path / "run")]]
        runs = [subprocess.run([sys.executable, *c], env=env, capture_output=True, text=True, timeout=120)
                for c in calls]
        assert select.select([hub], [], [], 0)[0] == [], "a request reached the Hub"
    for r, missing in zip(runs, ("config.json nor pytorch_model.bin", "tokenizer.json")):
        assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
        assert f"the Hugging Face cache has no {missing}: run `hf download " in r.stderr

def test_a_relative_tokenizer_path_is_the_file_it_names_from_the_working_folder(tmp_path, monkeypatch,
                                                                                tok_json):
    for folder, extra in (("a", ""), ("b", "\n")):   # two tokenizer.json files, one name: t/tokenizer.json
        (tmp_path / folder / "t").mkdir(parents=True)
        (tmp_path / folder / "t" / "tokenizer.json").write_text(open(tok_json).read() + extra)
    names = []
    for folder in ("a", "b"):
        monkeypatch.chdir(tmp_path / folder)
        names.append(datafiles.get_tokenizer("t/tokenizer.json").name)
    assert names[0] != names[1]   # each process-wide cache entry is a file, not a name
    assert names[1] == datafiles.get_tokenizer(str(tmp_path / "b" / "t" / "tokenizer.json")).name
