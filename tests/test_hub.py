"""Hub ids resolved offline from a cache built here, export to the official layout, tiktoken tokenizers."""
import base64
import os
import shutil
import subprocess
import sys

import pytest
import torch

import data
import model
from conftest import ROOT, checkpoint, tiny_lm

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
    assert data.get_tokenizer("EleutherAI/gpt-neox-20b").name == data.get_tokenizer(tok_json).name
    with pytest.raises(data.DataError, match=r"HF_HUB_OFFLINE=1\): run `hf download no/tok tokenizer.json`"):
        data.get_tokenizer("no/tok")
    checkpoint(tmp_path / "me" / "run", lm=tiny_lm(seed=2))   # a local me/run wins over the hub's
    monkeypatch.chdir(tmp_path)
    assert torch.equal(model.from_pretrained("me/run")(X)[0], tiny_lm(seed=2)(X)[0])
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}   # the export command, in a
    cmd = [sys.executable, f"{ROOT}/model.py", "--export", "state-spaces/m", "o"]   # process of its own
    runs = [subprocess.run(cmd, capture_output=True, text=True, env=env) for _ in range(2)]
    assert not runs[0].returncode and runs[1].stderr == "error: o holds a model already: pass a new OUT_DIR\n"

@pytest.mark.parametrize("source", ["mamba1", "mamba2", "hf_mamba1", "hf_mamba2"])
def test_export_round_trips_to_identical_logits(source, tmp_path):
    lm = model.from_pretrained(f"{FIXTURES}/{source}") if source[:2] == "hf" else \
        tiny_lm(source, vocab_size=61, pad_vocab_size_multiple=16)
    lm.backbone.norm_f.weight.data += 0.5   # post-trained: the export holds the weights as they are now
    model.export(lm, str(tmp_path / "out"))
    back = model.from_pretrained(str(tmp_path / "out"))
    assert back.cfg == lm.cfg and torch.equal(back(X)[0], lm(X)[0])
    with pytest.raises(ValueError, match="official layout"):
        model.export(tiny_lm("gla"), str(tmp_path / "gla"))

def test_tiktoken_file_encodes_with_its_merges_and_offline_gpt2_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "cache"))
    pieces = [bytes([i]) for i in range(256)] + [b"th", b"the", b" the"]   # ranks 256, 257, 258
    (tmp_path / "x.tiktoken").write_bytes(b"".join(base64.b64encode(p) + b" %d\n" % i
                                                   for i, p in enumerate(pieces)))
    enc, text = data.get_tokenizer(str(tmp_path / "x.tiktoken")), "the theme, the <|endoftext|>"
    assert enc.encode_ordinary("the the") == [257, 258] and enc.decode(enc.encode_ordinary(text)) == text
    assert (enc.eot_token, enc.n_vocab, enc.encode_single_token(b"<|endoftext|>")) == (259, 260, 259)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(data.TokenizerUnavailableError, match=r"HF_HUB_OFFLINE=1\): run tiktoken.get_enc"):
        data.get_tokenizer("gpt2")
