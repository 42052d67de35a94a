"""Bad input (issue 13): each row is a command or call and a key word of its one-line message (none: it must
succeed); no file the user had changes. Plus: a divergent run, a failed read or write, a second writer."""
import argparse
import fcntl
import hashlib
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

import data
import evaluate
import interventions
import model
import train
from plumbing import checkpoints, eval_flags, token_cache, tokenizers
from conftest import CORPUS_TEXT, ROOT, TRAIN, checkpoint, logged, official_dir, tiny_lm

@pytest.fixture(scope="module")
def user(tmp_path_factory, tok_json):
    """What a user has: finished runs (one as if saved by 2 processes), official-layout dirs, a file."""
    d = tmp_path_factory.mktemp("user")
    train.main(TRAIN + ["--init-state", "zero", "--steps", "2", "--out", str(d / "run")])
    ck = torch.load(shutil.copytree(d / "run", d / "two-ranks") / "ckpt.pt", weights_only=True)
    torch.save(dict(ck, sampler=ck["sampler"] * 2, strategy=ck["strategy"] * 2), d / "two-ranks/ckpt.pt")
    rows = {"no-step": b'{"loss": 1}\n', "not-json": b"garbage}\n", "not-utf8": b'{"s": "\xff"}\n'}
    for name, row in rows.items():   # metrics.jsonl rows
        with open(shutil.copytree(d / "run", d / name) / "metrics.jsonl", "ab") as f:
            f.write(row)
    shutil.copytree(d / "run", d / "other-run")   # a checkpoint copied over another run's files
    train.main(TRAIN + ["--init-state", "zero", "--steps", "2", "--out", str(d / "other")])
    shutil.copy(d / "other" / "ckpt.pt", d / "other-run" / "ckpt.pt")
    shutil.copy(tok_json, d / "bpe.json")
    (d / "short.txt").write_text("tiny text\n")
    (d / "fifo").mkdir()
    (d / "fifo" / "a.txt").write_text(CORPUS_TEXT)
    os.mkfifo(d / "fifo" / "pipe")
    import tokenizers  # tok_json: installed
    wordlevel = tokenizers.Tokenizer(tokenizers.models.WordLevel({"[UNK]": 0, "the": 1}, unk_token="[UNK]"))
    wordlevel.add_special_tokens(["<|endoftext|>"])
    wordlevel.save(str(d / "wordlevel.json"))
    lm = tiny_lm()
    config = dict(d_model=64, n_layer=2, vocab_size=257, ssm_cfg=dict(lm.cfg.mixer, layer="Mamba2"),
                  rms_norm=True)
    emb = lm.state_dict()["backbone.embedding.weight"]
    head = {"lm_head.weight": emb + 1}
    damaged = {"no-d-model": ({"d_model": None}, {}), "unknown-key": ({"n_head": 4}, {}),
               "untied": ({"tie_embeddings": False}, head), "head": ({}, head),
               "int-weights": ({}, {"backbone.norm_f.weight": torch.ones(64, dtype=torch.int64)}),
               "nan-weights": ({}, {"backbone.norm_f.weight": torch.full((64,), float("nan"))}),
               "missing-weight": ({}, {"backbone.layers.1.mixer.D": None}),
               "good": ({}, {"lm_head.weight": emb.clone()}),   # a tied head stored as a tensor of its own
               "vocab-8": ({"vocab_size": -8}, {}), "pad0": ({"pad_vocab_size_multiple": 0}, {}),
               "ssm-str": ({"ssm_cfg": "Mamba2"}, {}), "no-vocab": ({"vocab_size": None}, {}),
               "attention": ({"attn_layer_idx": [1]}, {}),
               "extra-weight": ({}, {"backbone.extra.weight": torch.zeros(1)}),
               "shape": ({}, {"backbone.norm_f.weight": torch.ones(32)})}
    for name, (cfg_edit, sd_edit) in damaged.items():   # None: the key removed
        official_dir(d / name, {k: v for k, v in {**lm.state_dict(), **sd_edit}.items() if v is not None},
                     **{k: v for k, v in {**config, **cfg_edit}.items() if v is not None})
    (d / "cut-short.pt").write_bytes((d / "run" / "ckpt.pt").read_bytes()[:20000])   # a copy cut short
    (d / "config-only").mkdir()   # an official folder whose weights are missing
    shutil.copy(d / "good" / "config.json", d / "config-only")
    for name, text in (("bad-json", "{d_model: 64,"), ("list-json", "[64, 2]")):
        (d / name).mkdir()
        (d / name / "config.json").write_text(text)
    (d / "a-file").write_text("not a directory")
    (d / "no-train-config").mkdir()   # a torch file with weights but not train.py's configuration
    torch.save({"model": {}, "step": 3}, d / "no-train-config" / "ckpt.pt")
    for name, obj in (("tensor-run", torch.zeros(3)), ("list-run", [1, 2])):   # torch files, not checkpoints
        (d / name).mkdir()
        torch.save(obj, d / name / "ckpt.pt")
    (d / "corrupt-run").mkdir()
    for path in (d / "pickle.pt", d / "corrupt-run" / "ckpt.pt"):  # not plain data: weights_only refuses it
        torch.save({"model_config": argparse.Namespace(), "train_config": argparse.Namespace()}, path)
    data_files(d, tok_json)
    return d

def data_files(d, tok_json):
    """Issue 26: cache folders whose meta.json is not what the ids are."""
    (d / "docs").mkdir()
    for i in range(3):
        (d / "docs" / f"{i}.txt").write_text(CORPUS_TEXT[i * 100:])
    edits = {"prep-u8": ("bytes", dict(dtype="uint8")), "prep-u32": ("bytes", dict(dtype="uint32")),
             "prep-no-dtype": ("bytes", dict(dtype=None)),   # None: the key removed
             "prep-bpe-as-bytes": (tok_json, dict(tokenizer="bytes", vocab_size=None))}
    for name, (tok, edit) in edits.items():
        token_cache.token_ids(str(d / "docs"), tok, cache_dir=str(d / "c" / name))
        (folder,) = (d / "c" / name).iterdir()
        folder.rename(d / name)
        meta = json.loads((d / name / "meta.json").read_text())
        (d / name / "meta.json").write_text(json.dumps({k: v for k, v in {**meta, **edit}.items() if v}))

def snapshot(d):
    return {p: hashlib.sha1(p.read_bytes()).hexdigest() for p in pathlib.Path(d).rglob("*") if p.is_file()}

def outcome(call):
    """(exit code, message) of a call that may exit (train.py) or raise (a loader)."""
    try:
        call()
    except SystemExit as e:
        return (1, e.code) if isinstance(e.code, str) else (e.code, "")
    except (ValueError, OSError) as e:
        return 1, str(e)
    return 0, ""

def train_main(argv):
    return outcome(lambda: train.main(argv))

ROWS = [  # (flags of train.py, or a call on the user dir; key word of an exit with code 1, "": code 0)
    # 1. a run is never overwritten
    ("--out {u}/run", "--resume"), ("--init-from {u}/run --out {u}/run", "same run"),
    ("--resume --out {u}/nothing", "does not exist: start without --resume"),
    # 3. flags that would train backwards or not at all
    ("--min-lr -1", "--min-lr"), ("--min-lr 1", "--min-lr"), ("--grad-clip 0", "--grad-clip"),
    ("--weight-decay -5", "--weight-decay"), ("--tokens 0", "--tokens"), ("--tokens nan", "--tokens"),
    ("--tokens inf", "--tokens"), ("--weight-decay inf", "--weight-decay"),
    ("--lr inf", "--lr"), ("--lr 0", "--lr"), ("--steps 0", "--steps"), ("--grad-accum 0", "--grad-accum"),
    ("--warmup 1.5", "--warmup"), ("--seed -1", "--seed"), ("--init-state warm", "invalid"),
    ("--size huge", "--size"), ("--copy-len 9,3", "--copy-len"), ("--task copy --streams", "independent"),
    ("--task babilong --babi-tasks qa1,qa99", "qa99"), ("--task passkey --init-state tbtt", "independent"),
    # 4. --resume takes the saved configuration; a contradicting flag is refused
    ("--resume --out {u}/run --arch gla", "differ"), ("--resume --out {u}/run --data stdlib", "--data"),
    ("--resume --out {u}/run --seq-len 32 --init-state sp", "--seq-len 16"),
    ("--resume --out {u}/run --grad-accum 2 --batch-size 8", "--batch-size"),
    # 5. tracebacks become one line
    ("--p-reset 2", "--p-reset"), ("--sigma 0", "--sigma"), ("--out {u}/a-file", "file"),
    ("--data /nonexistent/corpus.txt", "corpus.txt"), ("--task passkey --seq-len 64", "too short"),
    ("--init-from {u}/no-d-model", "d_model"), ("--init-from {u}/bad-json", "JSON"),
    ("--init-from {u}/nothing", "does not exist"), ("--resume --out {u}/corrupt-run", "cannot read"),
    ("--resume --out {u}/two-ranks", "2 processes"),  # another world size
    # 7. official checkpoints that cannot be loaded faithfully; 8. never torch's advice weights_only=False
    *[(lambda u, d=d: checkpoints.from_pretrained(f"{u}/{d}"), w) for d, w in (
        ("unknown-key", "n_head"), ("untied", "untied"), ("head", "lm_head"), ("nan-weights", "NaN"),
        ("int-weights", "floating point"), ("missing-weight", "missing"), ("pickle.pt", "cannot read"),
        ("good", ""), ("no-vocab", "no vocab_size"), ("attention", "hybrid MLP/attention"),
        ("extra-weight", "unknown ['backbone.extra.weight']"),
        ("shape", "norm_f.weight has shape [32], not [64]"))],
    # public calls with unknown names
    (lambda u: model.make_config("gla", "45m"), "unknown arch or size"),
    (lambda u: model.set_scan_impl(torch.nn.Module(), "cuda"), "scan impl"),
    (lambda u: interventions.make_strategy("warm", None, 2), "unknown --init-state"),
    # issue 19: a run knows its tokenizer, files are what they claim, no flag is ignored, one line each
    ("--init-from {u}/run --tokenizer {u}/bpe.json", "does not match"),
    ("--init-from {u}/run --arch gla", "come from --init-from"),
    ("--init-from {u}/run --size 45m", "come from --init-from"),
    ("--resume --out {u}/run --steps 1", "below"), ("--resume --out {u}/no-step --steps 5", "metrics.jsonl"),
    ("--resume --out {u}/not-json --steps 5", "metrics.jsonl"),
    ("--resume --out {u}/not-utf8 --steps 5", "not-utf8/metrics.jsonl"),
    ("--resume --out {u}/other-run --steps 5", "another run's than"),
    ("--data {u}/fifo", "not a regular file"),
    *[(f"--device={d}", "--device") for d in ("garbage", "mps", "meta", "")],
    *[(f"--{k} {2**70}", f"--{k}") for k in ("seed", "data-seed", "split-seed")],
    ("--batch-size 1e12", "--batch-size"), (f"--batch-size {10**12}", "--batch-size"),
    ("--init-from {u}/vocab-8", "vocab_size"), ("--init-from {u}/pad0", "pad_vocab"),
    ("--init-from {u}/list-json", "JSON"), ("--init-from {u}/ssm-str", "ssm_cfg"),
    ("--data markov:k=65534", "2**27"), ("--data markov:alpha=inf", "finite"),
    ("--data markov:shared=inf", "finite"), ("--data markov:k=8,k=9", "once"),
    ("--data {u}/short.txt", "split of"),
    ("--task passkey --tokenizer {u}/wordlevel.json --seq-len 256", "byte-level BPE"),
    ("--task copy --tokenizer {u}/wordlevel.json", "byte-level BPE"),
    # a checkpoint cut short, an official folder without its weights
    ("--init-from {u}/cut-short.pt", "truncated"),
    (lambda u: checkpoints.from_pretrained(f"{u}/cut-short.pt"), "copy it again whole"),
    ("--init-from {u}/config-only", "config.json but no pytorch_model.bin"),
    # a value a flag check accepts must be one the run can use; no flag is ignored
    ("--lr 1e300", "--lr"), ("--stop-at 0", "--stop-at"), ("--stop-at -3", "--stop-at"),
    ("--init-state random --sigma 1e300", "--sigma"),
    ("--tokens 12800", "--steps and --tokens both"), ("--seeds 0-3", "--seeds is for --demo"),
    ("--demo --arch gla --lr 0.1", "drop --batch-size --data --eval-interval --lr"),   # --arch: the demo's
    ("--demo --resume", "--resume"),
    (lambda u: train.main(["--demo", "--seed", "1", "--seeds", "0-2", "--out", f"{u}/d"]), "and --seeds"),
    (lambda u: train.main(["--demo", "--seeds", "0,3,0", "--out", f"{u}/d"]), "distinct"),
    (lambda u: train.main(["--demo", "--seeds", "3-1", "--out", f"{u}/d"]), "--seeds must be"),   # no seed
    ("--warmup 1", "--warmup"),   # all warm-up: the peak lr never reached
    # --resume: --init-from and --arch are the checkpoint's to agree with (not the post-training rule)
    ("--resume --out {u}/run --init-from {u}/run --arch mamba2", "these flags differ: --init-from None"),
    ("--resume --out {u}/run --device cpu --steps 1", "below"),   # may differ on resume: not "differ"
    (lambda u: train.main(TRAIN + ["--steps=1", "--out", ""]), "--out must be"),
    *[(lambda u, f=f: train.main(TRAIN + ["--steps=1", "--out", f"{u}/e", f, ""]), f"{f} ''")
      for f in ("--init-from", "--data", "--cache-dir", "--tokenizer")],
    (lambda u: train.main(TRAIN + ["--steps=1", "--out", os.fsdecode(os.fsencode(u) + b"/r\xff")]), "UTF-8"),
    # the data a run reads is the data it says; one line naming the file, the problem and the fix
    ("--data {u}/prep-u8", '"dtype" uint8 and "n_train", "n_val" do not fit'),
    ("--data {u}/prep-u32", "do not fit"),
    ("--data {u}/prep-no-dtype", '"dtype" None and'), ("--data {u}/prep-bpe-as-bytes", "holds id 2"),
    ("--tokenizer gpt5", "unknown tokenizer"),
    ("--data {u}/short.txt --cache-dir {u}/a-file", "Not a directory): nothing was written: pass a writable"),
    ("--init-from org/x", "org/x: no such path, and the Hugging Face cache "),   # a hub id: offline here
    # issue 42: a flag that does not apply is refused; T_train never guessed; a resume's real problem
    ("--init-state sp --sigma 0.5", "--init-state sp takes no --sigma (its options: --p-reset, --seed): "
     "leave --sigma out"), ("--init-state fitted --sigma 0.5", "--init-state fitted takes no --sigma"),
    ("--init-state zero --p-reset 0.5", "--init-state zero takes no --p-reset (its options: --seed)"),
    ("--init-state tbtt --p-reset 0.5", "--init-state tbtt takes no --p-reset"),
    ("--init-state random --sigma 1e-23", "it is the zero state: use --init-state zero or a larger --sigma"),
    ("--init-state random --sigma 1.1e-19", ""),
    ("--init-state random --sigma 0.5", ""), ("--init-state sp --p-reset 0.5", ""),
    ("--task copy --data {u}/MISSING", "--data applies only to --task lm or babilong"),
    ("--task passkey --data stdlib --seq-len 256", "--data applies only to --task lm or babilong"),
    ("--copy-len 5,9", "--copy-len applies only to --task copy"),
    ("--babi-tasks qa1", "--babi-tasks applies only to --task babilong"),
    ("--data stdlib --split-seed 3", "--split-seed applies only to --data markov"),
    ("--split-seed 3", ""),   # TRAIN's data: a Markov corpus
    ("--init-from {u}/run --task passkey --seq-len 130 --split-seed 3", "--split-seed applies only"),
    (lambda u: train.main(["--init-from", f"{u}/good", "--data", "stdlib", "--out", f"{u}/never"]),
     "does not state the length it was trained at: pass --seq-len T_train (the official Mamba checkpoints: "
     "2048)"),
    ("--resume --out {u}/no-train-config", "holds no train_config: it is not a checkpoint of train.py"),
    ("--init-from {u}/tensor-run", "tensor-run/ckpt.pt holds a Tensor, not a dict: not a checkpoint of this"),
    ("--resume --out {u}/tensor-run", "holds a Tensor, not a dict"),
    ("--init-from {u}/list-run", "list-run/ckpt.pt holds a list, not a dict"),
    ("--resume --out {u}/list-run", "holds a list, not a dict"),
    *[(lambda u, r=r: eval_flags.check_args(evaluate.parse_args([f"{u}/{r}", "--metrics", "ppl"])),
       f"{r}/ckpt.pt holds a {kind}, not a dict")
      for r, kind in (("tensor-run", "Tensor"), ("list-run", "list"))],
]

@pytest.mark.parametrize("command,word", ROWS)
def test_bad_input_is_one_line_and_changes_nothing(user, tmp_path, command, word, monkeypatch):
    monkeypatch.setattr(token_cache, "DEFAULT_CACHE_DIR", str(tmp_path / "cache"))
    before = snapshot(user)
    task_makes_its_data = "--task passkey" in str(command) or "--task copy" in str(command)
    flags = TRAIN[2:] if task_makes_its_data else TRAIN   # (TRAIN[:2]: its --data)
    code, message = outcome(lambda: command(user)) if callable(command) else \
        train_main(flags + ["--steps=1", "--out", f"{tmp_path}/new", *command.format(u=user).split()])
    assert (code, word in message) == (1 if word else 0, True), message
    assert "\n" not in message and "weights_only=False" not in message
    assert snapshot(user) == before

def test_a_command_line_error_is_one_line_without_traceback(user, tmp_path):
    cmd = [sys.executable, f"{ROOT}/train.py", "--init-from", f"{user}/bad-json", "--out", str(tmp_path)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1 and "JSON" in r.stderr, r.stderr

def test_a_second_writer_is_refused_and_a_dead_ones_lock_is_not(tmp_path):
    with open(tmp_path / "train.lock", "w") as held:  # another train.py holds the directory
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        print(12345, file=held, flush=True)
        code, message = train_main(TRAIN + ["--steps", "1", "--out", str(tmp_path)])
        assert code == 1 and "12345" in message and not (tmp_path / "ckpt.pt").exists()
    assert train_main(TRAIN + ["--steps", "1", "--out", str(tmp_path)]) == (0, "")  # released: no bar

def whole_run(out):
    """The run in out is one run's files: ckpt.pt loads, metrics.jsonl has each of its steps once, args.json
    is its configuration."""
    ckpt = torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)
    saved = json.load(open(os.path.join(out, "args.json")))
    assert ckpt["train_config"] == saved and sorted(logged(out)) == list(range(1, ckpt["step"] + 1))
    return saved

@pytest.mark.parametrize("meanwhile", ["a run", "a resume", "a ckpt.pt not train.py's"])
def test_a_run_saved_while_another_set_up_is_not_replaced(tmp_path, monkeypatch, meanwhile):
    # B passes the "--out holds a run" check, then, while B sets up, A runs whole in the same --out (a new
    # run; or a resume of it to step 4; or a file appears): B looks again under the lock and refuses; A's
    # files stay whole
    out, resume = str(tmp_path / "run"), meanwhile == "a resume"
    if resume:
        train.main(TRAIN + ["--steps", "2", "--out", out])
    a, b = (["--out", out, "--resume", "--steps", str(n)] if resume else
            TRAIN + ["--seed", str(n), "--steps", str(n), "--out", out] for n in (4, 3))
    setup_model = train.setup_model

    def a_runs_meanwhile(*args):
        made = setup_model(*args)   # B has read --out (its checkpoint, resuming)
        monkeypatch.setattr(train, "setup_model", setup_model)
        if meanwhile.startswith("a ckpt.pt"):
            torch.save({"weights": 1}, os.path.join(out, "ckpt.pt"))
        else:
            assert train_main(a) == (0, "")
        return made
    monkeypatch.setattr(train, "setup_model", a_runs_meanwhile)
    code, message = train_main(b)
    assert code == 1 and ("at step 4, not 2" if resume else "holds a run") in message and "\n" not in message
    if meanwhile.startswith("a ckpt.pt"):
        assert torch.load(os.path.join(out, "ckpt.pt")) == {"weights": 1}
        assert set(os.listdir(out)) == {"ckpt.pt", "train.lock"}   # no args.json, no metrics.jsonl
    else:
        assert whole_run(out)["steps"] == 4

def test_two_runs_started_at_once_on_one_out_one_refuses(tmp_path):
    # two train.py processes on one --out; whichever order they reach the lock in, one trains and the other
    # refuses in one line (the interleaving itself: test_a_run_saved_while_another_set_up_is_not_replaced)
    out = str(tmp_path / "run")
    runs = [subprocess.Popen([sys.executable, f"{ROOT}/train.py", *TRAIN, f"--steps={n}", "--out", out],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for n in (2, 3)]
    ends = sorted(((p.wait(timeout=300), p.stderr.read(), n) for p, n in zip(runs, (2, 3))))
    (code, _, won), (refused, message, _) = ends
    assert (code, refused, message.count("\n")) == (0, 1, 1), message
    assert "holds a run" in message or "is writing" in message, message
    assert whole_run(out)["steps"] == won

@pytest.mark.parametrize("flags", [["--lr", "1e3", "--warmup", "0.9"], ["--lr", "30", "--grad-clip", "1e30"]])
def test_a_divergent_run_stops_and_its_checkpoint_is_finite_and_resumable(tmp_path, flags):
    out = str(tmp_path / "div")
    code, message = train_main(TRAIN + ["--init-state", "zero", "--steps", "30", "--ckpt-interval", "1",
                                        "--out", out] + flags)
    assert code == 1 and "diverged" in message and "ckpt.pt" in message
    ckpt = torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)
    assert ckpt["step"] >= 1 and all(torch.isfinite(v).all() for v in ckpt["model"].values())
    assert train_main(["--out", out, "--resume", "--lr", "1e-4", "--steps", str(ckpt["step"] + 2),
                       "--device", "cpu"]) == (0, "")
    assert not [f for f in os.listdir(out) if f.endswith(".tmp")]

def full_disk(obj, path):
    pathlib.Path(path).write_bytes(b"partial")
    raise RuntimeError("[enforce fail at inline_container.cc] . PytorchStreamWriter failed writing file")

def denied(*args, **kwargs):   # as chmod 000 or a read-only directory would (root reads and writes anything)
    raise PermissionError(13, "Permission denied")

@pytest.mark.parametrize("module,name,fail,word,other", [  # other: a word of another failure's message
    (torch, "save", full_disk, "disk full", "Permission"),
    (torch, "load", denied, "Permission denied", "corrupt"),
    (os, "replace", denied, "Permission denied", "disk full")])
def test_a_failed_read_or_write_is_named_and_keeps_the_checkpoint(user, tmp_path, monkeypatch, module, name,
                                                                  fail, word, other):
    run = shutil.copytree(user / "run", tmp_path / "run")
    before = (run / "ckpt.pt").read_bytes()
    monkeypatch.setattr(module, name, fail)
    code, message = train_main(["--out", str(run), "--resume", "--steps", "3"])
    assert code == 1 and word in message and other not in message and "\n" not in message, message
    assert not list(run.glob("*.tmp")) and (run / "ckpt.pt").read_bytes() == before

def test_a_run_refuses_another_tokenizer_or_changed_data(tmp_path, tok_json, monkeypatch, capsys):
    monkeypatch.setattr(token_cache, "DEFAULT_CACHE_DIR", str(tmp_path / "cache"))
    text, tok = tmp_path / "a.txt", pathlib.Path(shutil.copy(tok_json, tmp_path / "tok.json"))
    text.write_text(CORPUS_TEXT)
    runs = {name: str(tmp_path / name) for name in ("bytes", "bpe")}
    train.main(TRAIN + ["--steps", "1", "--out", runs["bytes"], "--data", str(text)])
    train.main(TRAIN + ["--steps", "1", "--out", runs["bpe"], "--tokenizer", str(tok)])
    assert checkpoints.train_config(runs["bpe"])["tokenizer_id"] == data.get_tokenizer(str(tok)).name
    code, message = train_main(["--init-from", runs["bpe"], "--tokenizer", "bytes", "--out", f"{tmp_path}/x"])
    assert code == 1 and "--tokenizer bytes" in message and "json-" in message
    text.write_text(CORPUS_TEXT + "# edited\n")   # a resume must read the data it was trained on
    assert "--data" in train_main(["--resume", "--out", runs["bytes"], "--steps", "2"])[1]
    tok.write_text(tok.read_text() + "\n")   # another file at the same path (a new process reads it anew)
    tokenizers._load_tokenizer.cache_clear()
    assert "--tokenizer" in train_main(["--resume", "--out", runs["bpe"], "--steps", "2"])[1]
    lm = tiny_lm(vocab_size=50280)   # an official directory of GPT-NeoX's vocabulary, without --tokenizer
    official = official_dir(tmp_path / "neox", lm.state_dict(), d_model=64, n_layer=2, vocab_size=50280,
                            ssm_cfg=dict(lm.cfg.mixer, layer="Mamba2"))
    post = TRAIN + ["--init-from", official, "--data", str(text), "--out", f"{tmp_path}/y"]
    assert "--tokenizer it was trained with" in train_main(post)[1]
    argv = [official, "--t-train", "16", "--eval-len", "64", "--n-seqs", "2", "--data", str(text), "--out",
            f"{tmp_path}/ev"]
    assert evaluate.main(argv) == 2
    assert "tokenizer.json" in capsys.readouterr().err and not list(tmp_path.rglob("*.tmp"))
    # Markov ids are states, no tokenizer's: a vocabulary past twice the bytes' is no tokenizer mismatch
    big = checkpoint(tmp_path / "big", lm=tiny_lm(vocab_size=600), seq_len=16, data=TRAIN[1])[0]
    argv = [big, "--metrics", "ppl", "--eval-len", "64", "--n-seqs", "2", "--out", f"{tmp_path}/ev2"]
    assert evaluate.main(argv) == 0, capsys.readouterr().err
    wide = ["--data", "markov:k=600,alpha=0.5,doc_len=200,docs=20,val_docs=4"]   # 601 ids, past 2 x 257
    assert train_main(TRAIN + wide + ["--steps", "1", "--out", f"{tmp_path}/wide"]) == (0, "")
    small = checkpoint(tmp_path / "small", lm=tiny_lm(vocab_size=5), seq_len=16, data=TRAIN[1])[0]   # k=4
    argv = [small, "--metrics", "ppl", "--eval-len", "64", "--n-seqs", "2", "--data", "markov:k=8,docs=40",
            "--out", f"{tmp_path}/ev3"]
    assert evaluate.main(argv) == 2   # k=8: ids 0-8, past the model's 5
    assert "small has a vocabulary of 5, the data 9 ids: pass the --tokenizer" in capsys.readouterr().err

def test_sigterm_during_training_leaves_the_last_checkpoint_and_no_temporary_file(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, f"{ROOT}/train.py", *TRAIN, "--steps=99999", "--ckpt-interval=5", f"--out={out}"]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not (out / "ckpt.pt").exists() and time.time() < deadline and p.poll() is None:
        time.sleep(0.1)
    time.sleep(0.5)
    p.send_signal(signal.SIGTERM)
    err = p.communicate(timeout=60)[1].strip()
    assert p.returncode == 1 and len(err.splitlines()) == 1 and err.startswith("interrupted"), err
    assert not list(tmp_path.rglob("*.tmp")) and torch.load(out / "ckpt.pt", weights_only=True)["step"] >= 5
