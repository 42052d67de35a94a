"""Hub ids (official.resolve) read from a Hugging Face cache built here, offline, or fetched from a stand-in
Hub on 127.0.0.1 (one that answers, one that stalls); our Mamba runs exported in mamba_ssm's layout
(python -m plumbing.export), read back bit-exact, with the keys, shapes and config.json that mamba_ssm's
MambaLMHeadModel reads (written out below from its module structure: mamba_ssm is not installed here)."""
import hashlib
import http.server
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading

import pytest
import torch

import gla
import model
from plumbing import checkpoints, export, official
from conftest import ROOT, checkpoint, tiny_lm
from plumbing.files import DataError

FIXTURES = os.path.join(ROOT, "tests", "fixtures")
X = torch.randint(0, 61, (2, 24))   # ids every model here reads (the fixtures have 61)
FILES = ["config.json", "pytorch_model.bin"]

# mamba_ssm 2.x: the fields of models/config_mamba.py's MambaConfig, in its order; the arguments of
# modules/mamba_simple.py's Mamba (ssm_cfg layer "Mamba1") and modules/mamba2.py's Mamba2 besides d_model
MAMBA_CONFIG = ["d_model", "d_intermediate", "n_layer", "vocab_size", "ssm_cfg", "attn_layer_idx",
                "attn_cfg", "rms_norm", "residual_in_fp32", "fused_add_norm", "pad_vocab_size_multiple",
                "tie_embeddings"]
MAMBA_ARGS = {"Mamba1": {"d_state", "d_conv", "expand", "dt_rank", "dt_min", "dt_max", "dt_init", "dt_scale",
                         "dt_init_floor", "conv_bias", "bias", "use_fast_path", "layer_idx"},
              "Mamba2": {"d_state", "d_conv", "conv_init", "expand", "headdim", "d_ssm", "ngroups",
                         "A_init_range", "D_has_hdim", "rmsnorm", "norm_before_gate", "dt_min", "dt_max",
                         "dt_init_floor", "dt_limit", "bias", "conv_bias", "chunk_size", "use_mem_eff_path",
                         "layer_idx"}}

def mamba_ssm_shapes(config):
    """name -> shape of MambaLMHeadModel(MambaConfig(**config)).state_dict() as mamba_ssm builds it:
    MixerModel (embedding, layers.i = Block(norm, mixer), norm_f) and lm_head, its vocabulary padded up to a
    multiple; Mamba's and Mamba2's parameters with their defaults; no MLP (d_intermediate 0), no attention."""
    d, multiple, cfg = config["d_model"], config["pad_vocab_size_multiple"], dict(config["ssm_cfg"])
    vocab = config["vocab_size"] + (-config["vocab_size"]) % multiple
    layer, expand, d_conv = cfg.pop("layer", "Mamba1"), cfg.get("expand", 2), cfg.get("d_conv", 4)
    d_inner, bias, conv_bias = expand * d, cfg.get("bias", False), cfg.get("conv_bias", True)
    if layer == "Mamba2":
        d_state, headdim, ngroups = cfg.get("d_state", 128), cfg.get("headdim", 64), cfg.get("ngroups", 1)
        nheads, conv_dim = d_inner // headdim, d_inner + 2 * ngroups * d_state
        mixer = {"in_proj.weight": (2 * d_inner + 2 * ngroups * d_state + nheads, d),
                 "conv1d.weight": (conv_dim, 1, d_conv), "dt_bias": (nheads,), "A_log": (nheads,),
                 "D": (nheads,), "norm.weight": (d_inner,), "out_proj.weight": (d, d_inner)}
        channels = conv_dim
    else:
        d_state, dt_rank = cfg.get("d_state", 16), cfg.get("dt_rank", "auto")
        dt_rank = math.ceil(d / 16) if dt_rank == "auto" else dt_rank
        mixer = {"in_proj.weight": (2 * d_inner, d), "conv1d.weight": (d_inner, 1, d_conv),
                 "x_proj.weight": (dt_rank + 2 * d_state, d_inner), "dt_proj.weight": (d_inner, dt_rank),
                 "dt_proj.bias": (d_inner,), "A_log": (d_inner, d_state), "D": (d_inner,),
                 "out_proj.weight": (d, d_inner)}
        channels = d_inner
    mixer.update({"conv1d.bias": (channels,)} if conv_bias else {})
    in_proj_rows = mixer["in_proj.weight"][0]
    mixer.update({"in_proj.bias": (in_proj_rows,), "out_proj.bias": (d,)} if bias else {})
    shapes = {"backbone.embedding.weight": (vocab, d), "backbone.norm_f.weight": (d,),
              "lm_head.weight": (vocab, d)}
    for i in range(config["n_layer"]):
        shapes.update({f"backbone.layers.{i}.norm.weight": (d,),
                       **{f"backbone.layers.{i}.mixer.{k}": shape for k, shape in mixer.items()}})
    return shapes

@pytest.mark.parametrize("name", ["hf_mamba1", "hf_mamba2"])
def test_the_expected_shapes_are_those_of_the_official_layout_fixtures(name):
    # the fixtures were written from mamba_ssm's layout by hand (make_hf_reference.py), not by this repo
    config = json.load(open(f"{FIXTURES}/{name}/config.json"))
    weights = torch.load(f"{FIXTURES}/{name}/pytorch_model.bin", weights_only=True)
    assert list(config) == MAMBA_CONFIG
    assert {k: tuple(v.shape) for k, v in weights.items()} == mamba_ssm_shapes(config)

def trained(arch, **overrides):
    """A tiny LM whose weights are not their initial values (61 ids, 64 rows: 3 padding rows)."""
    lm = tiny_lm(arch, vocab_size=61, **overrides)
    with torch.no_grad():
        for p in lm.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return lm

@pytest.mark.parametrize("arch,overrides", [
    ("mamba1", {}), ("mamba2", {}),
    ("mamba1", dict(pad_vocab_size_multiple=16, mixer=dict(d_state=8, dt_rank=5, bias=True,
                                                           conv_bias=False))),
    ("mamba2", dict(pad_vocab_size_multiple=16, mixer=dict(d_state=8, headdim=16, ngroups=2, chunk_size=32,
                                                           d_conv=3)))])
def test_an_export_reads_back_bit_exact_with_the_keys_and_config_mamba_ssm_reads(arch, overrides, tmp_path,
                                                                                 capsys):
    lm = trained(arch, **overrides)
    run, out = checkpoint(tmp_path / "run", lm=lm, seq_len=16)[0], tmp_path / "out"
    export.main([run, str(out)])
    assert capsys.readouterr().out.startswith(f"{out}: config.json, pytorch_model.bin")
    assert sorted(os.listdir(out)) == FILES and sorted(os.listdir(tmp_path)) == ["out", "run"]
    config = json.loads((out / "config.json").read_text())
    weights = torch.load(out / "pytorch_model.bin", weights_only=True)
    # what MambaLMHeadModel.from_pretrained reads: MambaConfig(**config), then load_state_dict (strict)
    assert list(config) == MAMBA_CONFIG and config["ssm_cfg"]["layer"] == arch.title()
    assert set(config["ssm_cfg"]) - {"layer"} <= MAMBA_ARGS[arch.title()]
    assert (config["d_intermediate"], config["attn_layer_idx"], config["attn_cfg"]) == (0, [], {})
    assert config["rms_norm"] is config["tie_embeddings"] is True
    assert (config["d_model"], config["n_layer"], config["vocab_size"]) == (64, 2, 61)
    assert config["pad_vocab_size_multiple"] == lm.cfg.pad_vocab_size_multiple
    assert {k: tuple(v.shape) for k, v in weights.items()} == mamba_ssm_shapes(config)
    own = lm.state_dict()
    assert all(torch.equal(weights[k], own[k]) and weights[k].dtype == own[k].dtype for k in own)
    # what our loader reads: the same model, every weight and logit equal
    _, fields = checkpoints.read_official(str(out))
    assert fields["arch"] == arch and fields["mixer"] == lm.cfg.mixer
    back = checkpoints.from_pretrained(str(out))
    assert back.cfg == lm.cfg and back.step is None and checkpoints.train_config(str(out)) == {}
    back_sd = back.state_dict()
    assert back_sd.keys() == own.keys() and all(torch.equal(back_sd[k], own[k]) for k in own)
    with torch.no_grad():
        assert torch.equal(back(X)[0], lm(X)[0])

def with_mlp():
    lm = tiny_lm("mamba2")
    lm.backbone.layers[1].mlp = gla.SwiGLU(64)
    return lm

@pytest.mark.parametrize("make,says", [
    (lambda: tiny_lm("gla"), "a gla LM (mamba_ssm's MambaLMHeadModel holds Mamba-1 and -2)"),
    (lambda: tiny_lm("rwkv6"), "a rwkv6 LM"), (with_mlp, "blocks with an MLP (the official Mamba blocks"),
    (lambda: tiny_lm("mamba1", tie_embeddings=False), "an untied head (the official Mamba LMs tie it"),
    (lambda: tiny_lm("mamba2", norm_eps=1e-6), "RMSNorm eps 1e-06 (mamba_ssm's is 1e-5)"),
    (lambda: tiny_lm("mamba2", mixer=dict(headdim=16, scan_impl="naive")),
     "mixer arguments ['scan_impl'] (mamba_ssm's Mamba2 takes none of them)")])
def test_what_no_official_layout_holds_is_refused_in_one_line_and_nothing_is_written(make, says, tmp_path):
    with pytest.raises(DataError, match=f"^no official layout holds {re.escape(says)}") as e:
        official.export(make(), str(tmp_path / "out"))
    assert "\n" not in str(e.value) and str(e.value).endswith(": export a Mamba-1 or -2 run of this repo")
    assert os.listdir(tmp_path) == []

def test_the_command_refuses_a_gla_run_an_out_holding_files_a_file_and_empty_names(tmp_path, monkeypatch,
                                                                                   capsys):
    run = checkpoint(tmp_path / "run")[0]
    gla_run = checkpoint(tmp_path / "gla", lm=tiny_lm("gla"))[0]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "file").write_text("mine")
    (tmp_path / "half").mkdir()   # any file there: the export would mix with it
    (tmp_path / "half" / "pytorch_model.bin").write_text("mine")
    for args, says in [([run, "file"], "file is a file already: pass a new or empty OUT"),
                       ([run, "half"], "half holds files already: pass a new or empty OUT"),
                       ([gla_run, "new"], "no official layout holds a gla LM ")]:
        with pytest.raises(SystemExit, match=f"^error: {says}") as e:
            export.main(args)
        assert "\n" not in str(e.value.code)
    for args in [run, ""], ["", "o"], [run, " "]:   # "" would read as the working folder
        with pytest.raises(SystemExit, match="^2$"):
            export.main(args)
        assert capsys.readouterr().err.endswith(": RUN and OUT must not be empty\n")
    assert sorted(os.listdir()) == ["file", "gla", "half", "run"]
    assert (tmp_path / "file").read_text() == "mine"
    assert [f.read_text() for f in (tmp_path / "half").iterdir()] == ["mine"]
    (tmp_path / "empty").mkdir()   # an empty folder is filled; a missing parent is made
    for out in "empty/", "new/deeper":
        export.main([run, out])
        assert sorted(os.listdir(out)) == FILES
    assert sorted(os.listdir()) == ["empty", "file", "gla", "half", "new", "run"]   # no temporary folder
    with pytest.raises(SystemExit, match="^0$"):
        export.main(["--help"])
    assert "RUN OUT" in capsys.readouterr().out

def test_an_interrupted_or_failed_export_leaves_no_file_and_says_so(tmp_path, monkeypatch):
    run, out = checkpoint(tmp_path / "run")[0], str(tmp_path / "out")

    def killed(obj, f):   # SIGTERM reads as Ctrl-C meanwhile, so that the files are removed
        assert signal.getsignal(signal.SIGTERM) is signal.default_int_handler
        open(f, "wb").write(b"part")
        raise KeyboardInterrupt
    monkeypatch.setattr(official.torch, "save", killed)
    with pytest.raises(SystemExit, match=f"^interrupted: nothing written to {out}$"):
        export.main([run, out])
    monkeypatch.setattr(official.torch, "save", lambda obj, f: (_ for _ in ()).throw(OSError(28, "No space")))
    with pytest.raises(SystemExit, match="^error: \\[Errno 28\\] No space$"):
        export.main([run, out])
    assert os.listdir(tmp_path) == ["run"]

def test_an_export_killed_by_kill_9_leaves_a_folder_the_next_one_removes_or_names(tmp_path):
    gone = subprocess.Popen(["true"])
    gone.wait()
    for pid in gone.pid, os.getpid():   # a process that is gone; this one's pid, had it been another's
        (tmp_path / f"out.{pid}.tmp").mkdir()
        (tmp_path / f"out.{pid}.tmp" / "pytorch_model.bin").write_text("stale")
    with pytest.raises(FileExistsError, match=f"out.{os.getpid()}.tmp"):
        official.export(tiny_lm(), str(tmp_path / "out"))
    assert os.listdir(tmp_path) == [f"out.{os.getpid()}.tmp"]   # the dead process's removed
    shutil.rmtree(tmp_path / f"out.{os.getpid()}.tmp")
    official.export(tiny_lm(), str(tmp_path / "out"))
    assert os.listdir(tmp_path) == ["out"] and sorted(os.listdir(tmp_path / "out")) == FILES

def test_an_out_filled_meanwhile_by_another_process_is_kept_as_it_is(tmp_path, monkeypatch):
    out, save = tmp_path / "out", torch.save
    out.mkdir()

    def theirs_first(obj, f):
        (out / "theirs").write_text("theirs")
        save(obj, f)
    monkeypatch.setattr(official.torch, "save", theirs_first)
    with pytest.raises(DataError, match=f"^{out} was filled by another process meanwhile: pass a new OUT$"):
        official.export(tiny_lm(), str(out))
    assert os.listdir(out) == ["theirs"] and os.listdir(tmp_path) == ["out"]

# --- hub ids ---------------------------------------------------------------------------------------------
def hub_cache(root, repo, files, commit="a" * 40):
    """files (paths) as huggingface_hub's cache at root holds repo's: models--ORG--NAME/snapshots/COMMIT/,
    refs/main naming COMMIT. -> the snapshot folder."""
    snapshot = root / f"models--{repo.replace('/', '--')}" / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for f in files:
        shutil.copy(f, snapshot)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text(commit)
    return snapshot

def official_files(name):
    return [f"{FIXTURES}/{name}/{f}" for f in FILES]

@pytest.fixture
def hub(tmp_path, monkeypatch):
    """An empty Hugging Face cache (as HF_HUB_CACHE would set it), offline (as HF_HUB_OFFLINE=1)."""
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    return tmp_path / "hub"

def test_a_hub_id_loads_offline_from_the_cache_and_a_local_path_of_its_name_wins(hub, tmp_path, monkeypatch):
    snapshot = hub_cache(hub, "state-spaces/m", official_files("hf_mamba2"))
    lm, ref = checkpoints.from_pretrained("state-spaces/m"), checkpoints.from_pretrained(f"{FIXTURES}/hf_mamba2")
    with torch.no_grad():
        assert lm.cfg == ref.cfg and torch.equal(lm(X)[0], ref(X)[0])
    assert checkpoints.resolve("state-spaces/m") == str(snapshot) and checkpoints.train_config("state-spaces/m") == {}
    assert checkpoints.weights_file("state-spaces/m") == (str(snapshot / "pytorch_model.bin"), ref.cfg)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "state-spaces").mkdir()
    checkpoint(tmp_path / "state-spaces" / "m", lm=tiny_lm(seed=2), seq_len=16)
    assert checkpoints.train_config("state-spaces/m") == {"seq_len": 16}
    with torch.no_grad():
        assert torch.equal(checkpoints.from_pretrained("state-spaces/m")(X)[0], tiny_lm(seed=2)(X)[0])

def test_a_hub_id_not_in_the_cache_is_one_line_naming_hf_download_and_the_cache(hub):
    hub_cache(hub, "org/part", official_files("hf_mamba2")[:1])   # config.json fetched, the weights not
    marked = hub_cache(hub, "org/marked", official_files("hf_mamba2")[:1])   # the Hub said: no weights
    (marked.parents[1] / ".no_exist" / ("a" * 40)).mkdir(parents=True)
    (marked.parents[1] / ".no_exist" / ("a" * 40) / "pytorch_model.bin").touch()
    for repo, missing in [("org/none", "config.json nor pytorch_model.bin"),
                          ("org/part", "pytorch_model.bin"), ("org/marked", "pytorch_model.bin")]:
        for load in checkpoints.from_pretrained, checkpoints.train_config, checkpoints.weights_file:
            with pytest.raises(DataError) as e:
                load(repo)
            assert str(e.value) == (
                f"{repo}: no such path, and the Hugging Face cache {hub} has no {missing} of it "
                f"(HF_HUB_OFFLINE=1): on a connected machine run `hf download {repo} config.json "
                "pytorch_model.bin --local-dir DIR` and pass DIR, or leave out --local-dir to fill that "
                "cache (HF_HUB_CACHE sets it)")
    with pytest.raises(DataError, match=r"^org/a--b: no such path, nor a hub id \(Cannot have -- .* path$"):
        checkpoints.from_pretrained("org/a--b")
    for path in "a/b/c", "./x", "nothing", "/abs/x", "org/", "org/x/":   # no hub ids: their readers name them
        assert official.resolve(path) == path
    assert not os.path.exists(hub / "models--org--none")   # nothing written to the cache

def test_the_export_command_reads_a_hub_id_from_hf_homes_cache_offline(tmp_path):
    hub_cache(tmp_path / "hf" / "hub", "state-spaces/m", official_files("hf_mamba2"))
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE")}
    env.update(HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="1")
    cmd = [sys.executable, "-m", "plumbing.export", "state-spaces/m", str(tmp_path / "out")]
    runs = [subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120) for _ in range(2)]
    assert runs[0].returncode == 0, runs[0].stderr
    again = f"error: {tmp_path}/out holds files already: pass a new or empty OUT\n"
    assert runs[1].returncode == 1 and runs[1].stderr == again
    # an official checkpoint exported again: its config.json and weights as they were
    config = json.load(open(official_files("hf_mamba2")[0]))
    assert json.load(open(tmp_path / "out" / "config.json")) == config
    before, after = (torch.load(f, weights_only=True) for f in (official_files("hf_mamba2")[1],
                                                                tmp_path / "out" / "pytorch_model.bin"))
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)

class StandInHub(http.server.BaseHTTPRequestHandler):
    """The Hub's file API (HEAD, GET /ORG/NAME/resolve/main/FILE, its error headers) for REPOS; a GET of
    org/stall's weights waits for `release`. Each request is logged."""
    REPOS = {"org/official": {"config.json": b'{"d_model": 8}', "pytorch_model.bin": b"weights"},
             "org/half": {"config.json": b"{}", "pytorch_model.bin": b"weights"},
             "org/stall": {"config.json": b"{}", "pytorch_model.bin": b"weights"},
             "org/partial": {"config.json": b"{}"}}
    log, release = [], threading.Event()

    def do_HEAD(self, body=False):
        self.log.append(f"{self.command} {self.path}")
        repo, _, file = self.path[1:].partition("/resolve/main/")
        files = self.REPOS.get(repo)
        content = (files or {}).get(file)
        if body and repo == "org/stall" and file == "pytorch_model.bin":
            self.release.wait(60)
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

class Server(http.server.ThreadingHTTPServer):
    daemon_threads = False   # server_close() joins every request's thread: the test leaves none running

    def handle_error(self, request, client_address):   # a client that gave up on a stalled request: quiet
        pass

RESOLVE = """import sys, time
sys.path.insert(0, sys.argv[1])
from plumbing import official
for repo in sys.argv[2:]:
    t = time.time()
    try:
        out = official.resolve(repo)
    except Exception as e:
        out = f"{type(e).__name__}: {e}"
    print(repr((out, time.time() - t)))"""

def resolved(endpoint, tmp_path, *repos):
    """(folder or error, seconds) of official.resolve(repo) for each of repos in a process of its own,
    online, with a fresh HF_HOME and the Hub at endpoint (its timeouts 1 s)."""
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower() and k != "HF_HUB_CACHE"}
    env.update(HF_HOME=str(tmp_path / "hf"), HF_ENDPOINT=endpoint, HF_HUB_OFFLINE="0", NO_PROXY="127.0.0.1",
               HF_HUB_ETAG_TIMEOUT="1", HF_HUB_DOWNLOAD_TIMEOUT="1")
    r = subprocess.run([sys.executable, "-c", RESOLVE, ROOT, *repos], env=env, capture_output=True, text=True,
                       timeout=120)   # a hang fails the test
    assert r.returncode == 0, r.stderr
    return [eval(line) for line in r.stdout.splitlines()]

def test_online_a_hub_id_is_fetched_once_and_a_hub_that_stalls_ends_within_its_timeouts(tmp_path):
    (tmp_path / "config.json").write_text("{}")   # org/half: an older snapshot's config.json in the cache
    hub_cache(tmp_path / "hf" / "hub", "org/half", [tmp_path / "config.json"])
    hub = Server(("127.0.0.1", 0), StandInHub)
    serving = threading.Thread(target=hub.serve_forever)
    serving.start()
    try:
        calls = resolved(f"http://127.0.0.1:{hub.server_port}", tmp_path, "org/official", "org/official",
                         "org/half", "org/none", "org/partial", "org/stall")
    finally:
        StandInHub.release.set()
        hub.shutdown()
        hub.server_close()
        serving.join()
    (fetched, _), (cached, _), (half, _), (none, _), (partial, _), (stall, seconds) = calls
    snapshot = tmp_path / "hf" / "hub" / "models--org--official" / "snapshots" / ("c" * 40)
    assert fetched == cached == str(snapshot)
    assert open(f"{fetched}/pytorch_model.bin", "rb").read() == b"weights"
    assert sorted(os.listdir(half)) == FILES   # both files of the Hub's snapshot, not half of each
    gets = [line for line in StandInHub.log if line.startswith("GET /org/official/")]
    assert sorted(gets) == [f"GET /org/official/resolve/main/{f}" for f in FILES]   # once: then the cache
    tail = "`hf download {} config.json pytorch_model.bin --local-dir DIR` and pass DIR, or leave out"
    for message, repo, why in [
            (none, "org/none", "(no such Hub repo, or a gated or private one: check the id, or `hf auth "),
            (partial, "org/partial", "(the Hub repo holds no such file: not a checkpoint in the official "),
            (stall, "org/stall", "(the Hub did not answer in time: HF_HUB_ETAG_TIMEOUT (1 s) and "
                                 "HF_HUB_DOWNLOAD_TIMEOUT (1 s) set it)")]:
        assert message.startswith(f"DataError: {repo}: no such path, and the Hugging Face cache ") and \
            "\n" not in message
        assert why in message and tail.format(repo) in message
    assert seconds < 30   # 6 tries of 1 s, not hf_hub_download's minutes of retries of a stalled HEAD

def test_online_a_hub_that_never_answers_ends_within_the_etag_timeout_in_one_line(tmp_path):
    with socket.socket() as stalled:   # listens, never accepts nor answers: a stalled proxy or mirror
        stalled.bind(("127.0.0.1", 0))
        stalled.listen(16)
        ((message, seconds),) = resolved("http://127.0.0.1:%d" % stalled.getsockname()[1], tmp_path, "org/m")
    assert message.startswith("DataError: org/m: no such path, and the Hugging Face cache ")
    assert "has no config.json nor pytorch_model.bin of it (the Hub did not answer in time: " in message
    assert seconds < 30
