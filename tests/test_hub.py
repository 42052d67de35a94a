"""Hub ids resolved offline from a cache built here or fetched from a stand-in Hub on 127.0.0.1 (one that
answers, one that never does), export to the official layout, tiktoken tokenizers."""
import base64
import hashlib
import http.server
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
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
from datafiles import DataError, TokenizerUnavailableError

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
    with pytest.raises(DataError, match=r"HF_HUB_OFFLINE=1\): run `hf download no/tok tokenizer.json`"):
        datafiles.get_tokenizer("no/tok")
    part = tmp_path / "hf" / "hub" / "models--org--part"   # a partial snapshot: config.json, no weights
    shutil.copytree(tmp_path / "hf" / "hub" / "models--state-spaces--m", part)
    os.remove(part / "snapshots" / ("a" * 40) / "pytorch_model.bin")
    with pytest.raises(DataError, match=r"holds config.json but not pytorch_model.bin \(HF_HUB_OFFLINE="
                                   r"1\): run `hf download org/part pytorch_model.bin`"):
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

def test_tiktoken_file_encodes_with_its_merges_and_offline_gpt2_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "cache"))
    pieces = [bytes([i]) for i in range(256)] + [b"th", b"the", b" the"]   # ranks 256, 257, 258
    (tmp_path / "x.tiktoken").write_bytes(b"".join(base64.b64encode(p) + b" %d\n" % i
                                                   for i, p in enumerate(pieces)))
    enc, text = datafiles.get_tokenizer(str(tmp_path / "x.tiktoken")), "the theme, the <|endoftext|>"
    assert enc.encode_ordinary("the the") == [257, 258] and enc.decode(enc.encode_ordinary(text)) == text
    assert (enc.eot_token, enc.n_vocab, enc.encode_single_token(b"<|endoftext|>")) == (259, 260, 259)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(TokenizerUnavailableError, match=r"main/vocab.bpe is not in its cache \(HF_HUB_"
                                                        r"OFFLINE=1\): run python -c \"import tiktoken"):
        datafiles.get_tokenizer("gpt2")

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
        with pytest.raises(DataError, match=r"holds config.json but not pytorch_model.bin .*`hf "
                                       r"download org/partial pytorch_model.bin`"):
            load("org/partial")

class StandInHub(http.server.BaseHTTPRequestHandler):
    """The Hub's file API for REPOS (HEAD and GET /ORG/NAME/resolve/main/FILE, its error headers); it logs."""
    REPOS, log = {"org/official": {"config.json": b"{}", "pytorch_model.bin": b"weights"}}, []

    def do_HEAD(self, body=False):
        self.log.append(f"{self.command} {self.path}")
        repo, _, file = self.path[1:].partition("/resolve/main/")
        files = self.REPOS.get(repo)
        content = (files or {}).get(file)
        self.send_response(404 if content is None else 200)
        headers = {"X-Error-Code": "RepoNotFound" if files is None else "EntryNotFound"} if content is None \
            else {"X-Repo-Commit": "c" * 40, "ETag": f'"{hashlib.sha1(content).hexdigest()}"'}
        for key, value in dict(headers, **{"Content-Length": len(content or b"")}).items():
            self.send_header(key, str(value))
        self.end_headers()
        self.wfile.write(content if body and content else b"")

    def do_GET(self):
        self.do_HEAD(body=True)

    def log_message(self, *args):   # not on stderr
        pass

def hub_env(endpoint, tmp_path, **env):   # a fresh HF_HOME, online, the Hub at endpoint
    return dict(os.environ, HF_HOME=str(tmp_path / "hf"), HF_ENDPOINT=endpoint, HF_HUB_OFFLINE="0", **env)

def hub_calls(env, calls):
    """(message or path, seconds) of each datafiles.* call (Python text), in a process of its own with env."""
    code = ("import sys, time\nsys.path.insert(0, sys.argv[1])\nimport datafiles\nfor call in sys.argv[2:]:\n"
            "    t = time.time()\n    try:\n        out = eval(call)\n    except Exception as e:\n"
            "        out = f'{type(e).__name__}: {e}'\n    print(repr((out, time.time() - t)))")
    r = subprocess.run([sys.executable, "-c", code, ROOT, *calls], env=env, capture_output=True, text=True,
                       timeout=60)   # a hang fails the test
    assert r.returncode == 0, r.stderr
    return [eval(line) for line in r.stdout.splitlines()]

def test_hub_ids_are_fetched_from_a_hub_that_answers_once_then_read_from_the_cache(tmp_path):
    hub = http.server.ThreadingHTTPServer(("127.0.0.1", 0), StandInHub)
    threading.Thread(target=hub.serve_forever, daemon=True).start()
    try:
        calls = ["datafiles.hub_path('org/official')"] * 2 + [
            "datafiles.hub_path('org/none')", "datafiles.hub_path('org/official', 'tokenizer.json')"]
        env = hub_env(f"http://127.0.0.1:{hub.server_port}", tmp_path)
        (fetched, _), (cached, _), (none, _), (no_tok, _) = hub_calls(env, calls)
    finally:
        hub.shutdown()
    assert fetched == cached and open(f"{fetched}/pytorch_model.bin", "rb").read() == b"weights"
    resolves = [line for line in StandInHub.log if "/resolve/" in line]   # ours (ckpt.pt) tried first
    assert resolves[:3] == ["HEAD /org/official/resolve/main/" + f for f in ("ckpt.pt", "config.json",
                                                                              "pytorch_model.bin")]
    assert sum(line.startswith("GET") for line in resolves) == 2   # once: the second call reads the cache
    assert none.startswith("DataError: org/none: no such path") and "no such Hub repo" in none
    assert "no tokenizer.json (nor does the Hub repo): run `hf download org/official tokenizer" in no_tok

def test_a_hub_or_tiktoken_download_that_never_answers_ends_within_its_timeout_in_one_line(tmp_path):
    with socket.socket() as stalled:   # listens, never accepts nor answers: a stalled proxy or mirror
        stalled.bind(("127.0.0.1", 0))
        stalled.listen(16)
        url = "http://127.0.0.1:%d" % stalled.getsockname()[1]
        calls = ["datafiles.hub_path('org/model')", "datafiles.get_tokenizer('org/tok')",
                 "datafiles.get_tokenizer('gpt2')"]
        env = hub_env(url, tmp_path, HF_HUB_ETAG_TIMEOUT="1", HF_HUB_DOWNLOAD_TIMEOUT="2", HTTPS_PROXY=url,
                      NO_PROXY="", no_proxy="", TIKTOKEN_CACHE_DIR=str(tmp_path / "tiktoken"))   # tiktoken's:
        (model_id, s1), (tok, s2), (gpt2, s3) = hub_calls(env, calls)                         # https
        cmd = [sys.executable, f"{ROOT}/official.py", "--export", "org/model", str(tmp_path / "out")]
        export = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert max(s1, s2, s3) < 30   # the timeout of 1 s, not minutes
    for message, repo, files in (model_id, "org/model", "config.json pytorch_model.bin"), (tok, "org/tok",
                                                                                          "tokenizer.json"):
        assert message.startswith(f"DataError: {repo}: no such path") and "\n" not in message
        assert message.endswith(f"(the Hub did not answer within 1 s: HF_HUB_ETAG_TIMEOUT sets it): run `hf "
                                f"download {repo} {files}` on a connected machine (the same HF_HOME)")
    assert gpt2.startswith("TokenizerUnavailableError: tiktoken's gpt2: https://") and "\n" not in gpt2
    assert "(no answer within 2 s: HF_HUB_DOWNLOAD_TIMEOUT sets it): run python -c \"import tiktoken" in gpt2
    assert export.returncode == 1 and export.stderr == f"error: {model_id.split(': ', 1)[1]}\n"
