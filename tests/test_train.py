"""train.py: exact resume, post-training, gradient accumulation, the optimizer; its flags
(plumbing/flags.py) and the demo (plumbing/demo.py)."""
import json
import os
import signal
import subprocess
import sys
import types

import numpy as np
import pytest
import torch

import data
import evaluate
import interventions
import train
from plumbing import checkpoints, demo, flags, runs, token_cache
from conftest import CORPUS_TEXT, ROOT, TRAIN, logged, official_dir, tiny_lm

@pytest.mark.parametrize("flags", [["--init-state", "sp", "--grad-accum", "2"], ["--init-state", "fitted"],
                                   ["--init-state", "tbtt"], ["--init-state", "zero", "--streams"],
                                   ["--task", "passkey", "--seq-len", "130", "--init-state", "fitted"]])
def test_resume_after_interrupt_reproduces_the_loss_trajectory(tmp_path, flags):
    common = (TRAIN[2:] if "--task" in flags else TRAIN) + flags + ["--steps", "8", "--ckpt-interval", "3"]
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    train.main(common + ["--out", a])
    train.main(common + ["--out", b, "--stop-at", "4"])  # "killed" after step 4; last checkpoint at step 3
    assert torch.load(os.path.join(b, "ckpt.pt"), weights_only=True)["step"] == 3
    train.main(["--out", b, "--resume", "--device", "cpu", "--quiet"])   # the configuration: the checkpoint's
    assert logged(a) == logged(b) and len(logged(a)) == 8  # step 4's row is dropped, then redone

def test_post_training_inherits_data_seq_len_and_a_tenth_of_the_peak_lr(tmp_path):
    # a base trained at --lr 1e-3 (not the tiny preset's 3e-3): post-training defaults to 1e-4, its data and
    # T_train; a second post-training still to 1e-4 (peak_lr is inherited); each checkpoint loads back
    base, post, post2 = (str(tmp_path / n) for n in ("base", "post", "post2"))
    lm = train.main(TRAIN + ["--arch=rwkv6", "--init-state=zero", "--steps=1", "--lr=1e-3", "--out", base])
    x = torch.randint(0, 5, (1, 6))
    with torch.no_grad():
        torch.testing.assert_close(lm.eval()(x)[0], checkpoints.from_pretrained(base).eval()(x)[0])
    for parent, out in ((base, post), (post, post2)):
        train.main(["--quiet", "--steps", "1", "--batch-size", "4", "--init-from", parent, "--out", out])
        a = json.load(open(os.path.join(out, "args.json")))
        assert a["lr"] == pytest.approx(1e-4) and a["peak_lr"] == pytest.approx(1e-3)
        assert a["seq_len"] == 16 and a["data"] == TRAIN[1] and a["arch"] == "rwkv6"

def test_seeds_are_independent_and_post_training_reads_on(tmp_path):
    # --seed: the model's init; --data-seed (default --seed): the batches; --split-seed: the validation split
    runs = [[], ["--seed=5"], ["--seed=5", "--data-seed=0"], ["--split-seed=1"]]
    args = [flags.get_args(TRAIN + ["--out", str(tmp_path / "x"), *f]) for f in runs]
    assert [(a.seed, a.data_seed, a.split_seed) for a in args] == [(0, 0, 0), (5, 5, 0), (5, 0, 0), (0, 0, 1)]
    samplers = [train.setup_data(a)[:2] for a in args]
    batches, val = zip(*[(s.next_batch().x, v.next_batch().x) for s, v in samplers])
    assert torch.equal(batches[0], batches[2]) and not torch.equal(batches[0], batches[1])
    assert torch.equal(val[0], val[1]) and torch.equal(val[0], val[2]) and not torch.equal(val[0], val[3])
    init = [train.setup_model(a, torch.device("cpu"), 5, None, None, "")[0].state_dict() for a in args[:3]]
    assert all(torch.equal(init[1][k], init[2][k]) for k in init[1])
    assert not all(torch.equal(init[0][k], init[1][k]) for k in init[0])
    # post-training (another --seed) reads on where its parent's sampler (--data-seed 2) stopped:
    # RandomWindows' step, the next documents
    ckpt = lambda run: torch.load(os.path.join(tmp_path, run, "ckpt.pt"), weights_only=True)["sampler"][0]
    for strategy in ("zero", "tbtt"):
        train.main(TRAIN + [f"--init-state={strategy}", "--steps=3", "--data-seed=2", "--out",
                            str(tmp_path / strategy)])
        train.main(["--quiet", "--steps=2", "--batch-size=4", f"--init-state={strategy}", "--seed=5",
                    "--init-from", str(tmp_path / strategy), "--out", str(tmp_path / f"{strategy}-post")])
    assert ckpt("zero-post") == {"seed": 2, "step": 5}  # batches 4 and 5 of the stream the base read 1-3 of
    parent, post = ckpt("tbtt"), ckpt("tbtt-post")  # 4 rows, documents of 200 tokens: none ends in 5 chunks
    assert (parent["cursor"], post["cursor"]) == (4, 8) and not set(parent["row_doc"]) & set(post["row_doc"])

# the demo shrunk: post-training of 2 steps, for an interrupt after its first (test_a_demo_interrupted_...)
SMALL_DEMO = dict(base_steps=3, post_steps=2, n_seqs=4, eval_len=64, sigma=0.37, quiet=True)

@pytest.fixture(scope="module")
def demo_out(tmp_path_factory):
    """A finished demo of SMALL_DEMO on seeds 0 and 3, which the tests only read -> (its folder, its exit
    code)."""
    out = str(tmp_path_factory.mktemp("demo") / "demo")
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}   # evaluate.main sets
    code = demo.demo(train.train, out, [0, 3], **SMALL_DEMO)                       # SIGTERM's; this runs
    for s, handler in handlers.items():                                            # before process_state
        signal.signal(s, handler)
    return out, code

def test_demo_fig5_post_trains_the_base_five_ways_on_two_seeds(demo_out, capsys):
    out, code = demo_out
    assert code == 0
    report = json.load(open(os.path.join(out, "seed3", "eval.json")))
    assert [m["label"] for m in report["models"]] == ["base", "control", "random", "fitted", "SP", "TBTT",
                                                      "streams"]   # each minus the control; TBTT its streams
    refs = [m.get("diff", {}).get("reference") for m in report["models"]]
    assert refs == ["control", None, "control", "control", "control", "streams", "control"]
    post = {m["label"]: json.load(open(os.path.join(m["path"], "args.json"))) for m in report["models"]}
    assert [post[k]["init_state"] for k in demo.INTERVENTIONS] == list(demo.INTERVENTIONS.values())
    assert post["random"]["sigma"] == 0.37 and {a["steps"] for a in post.values()} == {2, 3}
    assert [k for k, a in post.items() if a["streams"]] == ["streams"]
    seeds = json.load(open(os.path.join(out, "seeds.json")))
    sp = [seeds["seeds"][s]["SP"]["diff"] for s in ("0", "3")]  # each seed's SP - control, last bucket
    assert sp == [next(m for m in json.load(open(os.path.join(out, f"seed{s}", "eval.json")))["models"]
                       if m["label"] == "SP")["diff"]["nll"][-1] for s in (0, 3)]
    assert seeds["summary"]["SP"]["diff"] == pytest.approx(np.mean(sp))
    assert os.path.exists(os.path.join(out, "seeds.png"))
    assert demo.demo(train.train, out, [3], **SMALL_DEMO) == 0  # kept
    assert "seed3/eval.json exists, kept" in capsys.readouterr().out

def test_the_demo_of_another_mixer_is_its_tiny_preset_in_a_folder_of_its_own(monkeypatch):
    calls = []
    record = lambda train, out, seeds, device, quiet, **kw: calls.append((out, seeds, kw))
    monkeypatch.setattr(demo, "demo", record)
    gdn = ["--arch", "gated_deltanet", "--seeds", "0-2"]
    for argv in ([], ["--arch", "mamba1"], ["--size", "tiny-slow"], gdn, gdn + ["--size", "tiny-slow"],
                 ["--arch", "mamba1", "--size", "tiny"]):
        demo.main(flags.get_args(["--demo", "--out", "o", *argv]), train.train)
    mine = dict(arch="gated_deltanet", size="tiny")
    assert calls == [(os.path.join("o", "demo"), [0], {})] * 3 + [
        (os.path.join("o", "demo-gated_deltanet-tiny"), [0, 1, 2], mine),
        (os.path.join("o", "demo-gated_deltanet-tiny-slow"), [0, 1, 2], {**mine, "size": "tiny-slow"}),
        (os.path.join("o", "demo-mamba1-tiny"), [0], dict(arch="mamba1", size="tiny"))]
    with pytest.raises(ValueError, match="unknown arch or size gla:tiny-slow"):
        demo.main(flags.get_args(["--demo", "--arch", "gla", "--size", "tiny-slow"]), train.train)
    with pytest.raises(SystemExit, match="--demo sets its training flags itself .*: drop --steps"):
        flags.get_args(["--demo", "--arch", "gla", "--steps", "70"])

def numbers(where):
    """What a demo's eval.json says of its models, without where they lie."""
    report = json.load(open(os.path.join(where, "eval.json")))
    return [(m["label"], m["ppl"], m.get("diff")) for m in report["models"]]

def test_a_demo_interrupted_goes_on_from_what_it_kept_to_the_same_numbers(demo_out, tmp_path, monkeypatch,
                                                                         capsys):
    """Stopped inside SP's post-training (a checkpoint at step 1 of 2): the rerun resumes it, keeps every
    finished run, and ends with the numbers of an uninterrupted demo (demo_out's seed 0). Rerun finished
    (eval.json removed), it trains nothing."""
    whole, code = demo_out
    assert code == 0
    real = train.train
    def killed(args):   # as if killed right after a checkpoint, halfway through the run
        if args.init_state == "sp":
            args.stop_at = 1
            args.ckpt_interval = 1
            real(args)
            raise KeyboardInterrupt
        return real(args)
    monkeypatch.setattr(train, "train", killed)
    with pytest.raises(KeyboardInterrupt):
        demo.demo(train.train, str(tmp_path / "cut"), [0], **SMALL_DEMO)
    seed = tmp_path / "cut" / "seed0"
    kept = {p: p.read_bytes() for p in seed.glob("*/ckpt.pt") if p.parent.name != "SP"}
    assert len(kept) == 4   # base, control, random, fitted
    monkeypatch.setattr(train, "train", real)
    assert demo.demo(train.train, str(tmp_path / "cut"), [0], **SMALL_DEMO) == 0
    out = capsys.readouterr().out
    assert all(p.read_bytes() == b for p, b in kept.items()) and out.count(", kept") == len(kept), out
    assert "--resume" in out.split("SP:")[-1].splitlines()[0], out
    assert numbers(seed) == numbers(os.path.join(whole, "seed0"))
    os.remove(seed / "eval.json")
    copies = {p: p.read_bytes() for p in seed.glob("*/ckpt.pt")}
    assert demo.demo(train.train, str(tmp_path / "cut"), [0], **SMALL_DEMO) == 0
    assert "python train.py" not in capsys.readouterr().out
    assert {p: p.read_bytes() for p in seed.glob("*/ckpt.pt")} == copies and numbers(seed) == numbers(
        os.path.join(whole, "seed0"))

def test_post_training_an_official_checkpoint_on_a_tokenizer_json_corpus(tok_json, tmp_path, monkeypatch):
    # an official directory of the tiny preset's dimensions, its vocabulary padded (300 -> 304), post-trained
    # on a corpus read with a Hugging Face tokenizer.json: a tenth of that preset's peak lr; both evaluate
    lm = tiny_lm(vocab_size=300)
    official = official_dir(tmp_path / "official", lm.state_dict(), d_model=64, n_layer=2, vocab_size=300,
                            ssm_cfg=dict(lm.cfg.mixer, layer="Mamba2"))
    post, eval_out = str(tmp_path / "post"), tmp_path / "eval"
    (tmp_path / "long.txt").write_text(CORPUS_TEXT * 3)
    monkeypatch.setattr(token_cache, "DEFAULT_CACHE_DIR", str(tmp_path / "cache"))
    text = ["--data", str(tmp_path / "long.txt"), "--tokenizer", tok_json]
    train.main(TRAIN + text + ["--init-from", official, "--init-state", "sp", "--steps", "2", "--out", post])
    lr = json.load(open(os.path.join(post, "args.json")))["lr"]
    assert lr == pytest.approx(flags.PEAK_LR["tiny"] / 10)
    given = flags.get_args(["--init-from", official, "--lr", "1e-4", "--seq-len", "16"])   # the peak: parent's
    assert (given.lr, given.peak_lr) == (1e-4, flags.PEAK_LR["tiny"])
    assert checkpoints.from_pretrained(post).cfg == checkpoints.from_pretrained(official).cfg
    for path in (official, post):
        argv = [path, "--t-train", "16", "--eval-len", "64", "--n-seqs", "2", "--metrics", "ppl"]
        assert evaluate.main(argv + text + ["--out", str(eval_out)]) == 0
        report = json.load(open(eval_out / "eval.json"))
        assert report["args"]["tokenizer"] == tok_json and all(np.isfinite(report["models"][0]["ppl"]["nll"]))

@pytest.mark.parametrize("arch", ["mamba2", "rwkv6"])
def test_two_micro_batches_give_the_gradient_of_one_batch_twice_as_large(arch):
    lm = tiny_lm(arch, vocab_size=11)
    x, y = torch.randint(0, 11, (8, 13)), torch.randint(0, 11, (8, 13))
    grads = {}
    for n_micro, batches in ((1, [(x, y)]), (2, [(x[:4], y[:4]), (x[4:], y[4:])])):
        lm.zero_grad(set_to_none=True)
        sampler = types.SimpleNamespace(next_batch=(data.Batch(*b, None) for b in batches).__next__)
        strategy = interventions.make_strategy("zero", lm, len(batches[0][0]))
        loss, tokens = train.accumulate_gradients(lm, sampler, strategy, n_micro, torch.device("cpu"))
        assert tokens == x.numel()
        grads[n_micro] = (loss, [p.grad.clone() for p in lm.parameters()])
    assert grads[1][0] == pytest.approx(grads[2][0], rel=1e-5)
    torch.testing.assert_close(grads[1][1], grads[2][1], atol=1e-6, rtol=1e-4)

def test_optimizer_groups_honour_no_weight_decay_and_lr_scale_and_the_schedule():
    lm = tiny_lm("rwkv6", vocab_size=11)
    opt = train.make_optimizer(lm, 1e-3, 0.01, torch.device("cpu"))
    group_of = lambda p: next(g for g in opt.param_groups if any(q is p for q in g["params"]))
    decay = group_of(lm.backbone.layers[0].mixer.w0)  # RWKV-6's decay: twice the lr, no weight decay
    assert decay["lr"] == pytest.approx(2e-3) and decay["lr_scale"] == 2.0 and decay["weight_decay"] == 0.0
    assert group_of(lm.backbone.layers[0].mixer.o_proj.weight)["weight_decay"] == 0.01
    assert group_of(lm.backbone.norm_f.weight)["weight_decay"] == 0.0
    args = flags.get_args(["--steps", "10", "--out", "/nonexistent/out"])  # 1 warm-up step, cosine to min_lr
    assert [train.lr_at(s, args) for s in (0, 10)] == pytest.approx([args.lr, args.min_lr])

def test_the_training_loop_keeps_rwkv6_decay_at_twice_the_lr(tmp_path):
    # AdamW's first step moves a weight by its lr * g / (|g| + eps): w0's largest move is about 2 lr
    w0 = [b.mixer.w0.detach().clone() for b in tiny_lm("rwkv6").backbone.layers]   # deterministic init
    lm = train.main(TRAIN + ["--arch=rwkv6", "--steps=1", "--lr=1e-3", "--eval-batches=1",
                             "--out", str(tmp_path / "run")])
    moved = max((b.mixer.w0 - w).abs().max().item() for b, w in zip(lm.backbone.layers, w0))
    assert moved == pytest.approx(2e-3, rel=1e-3)

@pytest.mark.parametrize("error, word", [
    (RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
                  "you tried to allocate 1099511627776 bytes."), "out of memory"),
    (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), "out of memory"),
    (MemoryError(), "out of memory"), (KeyboardInterrupt(), "interrupted: no checkpoint was saved")])
def test_a_run_that_fails_or_is_stopped_ends_in_one_line(monkeypatch, tmp_path, error, word):
    def fails(args):
        raise error
    monkeypatch.setattr(train, "train", fails)
    with pytest.raises(SystemExit) as stop:
        train.main(TRAIN + ["--out", str(tmp_path / "run")])
    assert word in str(stop.value) and "\n" not in str(stop.value)

def test_the_demo_takes_its_own_flags_and_seeds(tmp_path):
    args = flags.get_args(["--demo", "--seeds", "0-2", "--device", "cpu", "--quiet", "--out", "o"])
    assert (bool(args.demo), args.device, args.quiet) == (True, "cpu", True)
    assert flags.parse_seeds(args.seeds) == [0, 1, 2]
    assert flags.parse_seeds("4,1") == [4, 1] and flags.get_args(["--demo", "--seed", "3"]).seed == 3
    for bad in ("1-x", "-1", "1,x", "3-1", "", "2,2"):
        with pytest.raises(SystemExit, match="^error: --seeds must be A-B or A,B"):
            flags.parse_seeds(bad)
    assert flags.get_args(["--tokens", "6400", "--seq-len", "8", "--batch-size", "8"]).steps == 100
    assert flags.get_args(["--tokens", "6400", "--seq-len", "8", "--batch-size", "8", "--grad-accum", "2"]
                           ).steps == 50   # a step: two micro-batches
    copy = ["--task", "copy", "--copy-len", "5,10", "--tokens", "2200", "--batch-size", "10"]
    assert flags.get_args(copy).steps == 10   # a row: the longest string twice + SEP + EOS = 22 tokens
    assert flags.get_args(copy + ["--batch-size", "1"]).steps == 100
    for bad, word in ((["--task", "copy", "--copy-len", "x", "--tokens", "100"], "--copy-len must be LO,HI"),
                      (["--tokens", "inf"], "--tokens must be a finite number > 0, got inf")):
        with pytest.raises(SystemExit, match=f"^error: {word}"):   # --copy-len: read for --tokens first
            flags.exit_on_bad_flags(flags.get_args(bad + ["--out", str(tmp_path)]))

def test_a_step_counts_all_its_micro_batches_in_the_first_line_and_in_tokens_per_s(tmp_path, capsys,
                                                                                   monkeypatch):
    clock = iter(range(10, 10_000, 10))   # train.py's clock: each reading 10 s after the last
    monkeypatch.setattr(train, "time", types.SimpleNamespace(time=lambda: float(next(clock))))
    train.main(TRAIN + ["--grad-accum", "3", "--steps", "4", "--out", str(tmp_path)])
    assert "steps of 12 x 16 tokens" in capsys.readouterr().out.splitlines()[0]   # 3 x --batch-size 4
    rate = logged(str(tmp_path), "tokens_per_s")
    assert rate == {step: 3 * 4 * 16 / 10 for step in (1, 2, 3, 4)}   # each step 10 s later: a steady rate

def test_stopped_before_any_checkpoint_the_last_line_names_none(tmp_path, capsys):
    for _ in range(2):   # the folder of a run stopped before its first checkpoint takes a new run
        train.main(TRAIN + ["--steps", "10", "--stop-at", "2", "--out", str(tmp_path / "run")])
        assert capsys.readouterr().out.splitlines()[-1].endswith("no checkpoint (--stop-at before the first "
                                                                 "--ckpt-interval)")
        assert not os.path.exists(tmp_path / "run" / "ckpt.pt")
    two = tmp_path / "two"
    train.main(TRAIN + ["--steps", "10", "--stop-at", "3", "--ckpt-interval", "2", "--out", str(two)])
    assert capsys.readouterr().out.splitlines()[-1].endswith(f"checkpoint {two / 'ckpt.pt'} (step 2)")
    assert checkpoints.last_checkpoint(types.SimpleNamespace(out=str(tmp_path / "two"))) == (
        f"the last checkpoint {tmp_path / 'two'}/ckpt.pt (step 2) is intact; continue with --resume")

def test_a_second_ctrl_c_during_the_clean_up_is_ignored_and_one_during_import_torch_is_one_line(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        runs.interrupted(signal.SIGINT, None)
    assert signal.getsignal(signal.SIGINT) is signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    (tmp_path / "torch.py").write_text("import os, signal, time\nos.kill(os.getpid(), signal.SIGINT)\n"
                                       "time.sleep(5)\n")   # torch, as if Ctrl-C came while it loads
    r = subprocess.run([sys.executable, os.path.join(ROOT, "train.py")], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=str(tmp_path)), timeout=60)
    assert (r.returncode, r.stderr) == (1, "interrupted\n")

def test_a_new_run_never_cuts_or_replaces_another_runs_files(tmp_path, capsys):
    # a run of 8 logged steps whose ckpt.pt went: a new run there would cut metrics.jsonl to its own rows
    run = str(tmp_path / "run")
    train.main(TRAIN + ["--init-state", "zero", "--steps", "8", "--ckpt-interval", "4", "--out", run])
    os.remove(os.path.join(run, "ckpt.pt"))
    before = {f: open(os.path.join(run, f), "rb").read() for f in ("metrics.jsonl", "args.json")}
    for extra in (["--init-state", "sp", "--steps", "2"], ["--init-state", "zero", "--steps", "2"]):
        with pytest.raises(SystemExit, match=f"{run} holds another run's metrics.jsonl and args.json but no "
                                             "ckpt.pt: move them away, or use another --out"):
            train.main(TRAIN + extra + ["--ckpt-interval", "4", "--out", run])
    assert {f: open(os.path.join(run, f), "rb").read() for f in before} == before
    assert len(logged(run)) == 8
    os.remove(os.path.join(run, "args.json"))   # metrics.jsonl alone is still another run's
    with pytest.raises(SystemExit, match="holds another run's metrics.jsonl but no ckpt.pt"):
        train.main(TRAIN + ["--init-state", "zero", "--steps", "8", "--ckpt-interval", "4", "--out", run])
    assert open(os.path.join(run, "metrics.jsonl"), "rb").read() == before["metrics.jsonl"]

def test_the_same_run_stopped_before_its_first_checkpoint_starts_again(tmp_path, monkeypatch):
    run = str(tmp_path / "run")
    argv = TRAIN + ["--init-state", "zero", "--steps", "6", "--ckpt-interval", "4", "--out", run]
    train.main(argv + ["--stop-at", "2"])
    assert not os.path.exists(os.path.join(run, "ckpt.pt")) and len(logged(run)) == 2
    checked = []
    same = runs.records_this_run
    monkeypatch.setattr(runs, "records_this_run", lambda args: checked.append(same(args)) or checked[-1])
    train.main(argv + ["--device", "cpu"])   # --device, --stop-at: of one invocation, not of the run
    assert checked == [True, True] and len(logged(run)) == 6   # by exit_on_bad_flags and under the lock
    other = str(tmp_path / "other")
    train.main(argv[:-1] + [other, "--stop-at", "2"])
    # another run's args.json written after exit_on_bad_flags looked: refused under the lock
    monkeypatch.setattr(runs, "records_this_run", lambda args: checked.append(0) or len(checked) == 3)
    with pytest.raises(SystemExit, match=f"{other} holds another run's metrics.jsonl and args.json: use "):
        train.main(argv[:-1] + [other])
    assert len(logged(other)) == 2

def test_a_post_trained_run_resumes_after_its_parent_folder_moved(tmp_path, capsys):
    parent, child = str(tmp_path / "P"), str(tmp_path / "C")
    train.main(TRAIN + ["--init-state", "zero", "--steps", "2", "--out", parent])
    train.main(TRAIN[2:] + ["--init-from", parent, "--init-state", "sp", "--steps", "4", "--ckpt-interval",
                            "2", "--stop-at", "2", "--out", child])
    os.rename(parent, str(tmp_path / "moved"))
    train.main(["--resume", "--out", child, "--steps", "6", "--quiet", "--device", "cpu"])   # C/ckpt.pt alone
    assert len(logged(child)) == 6   # (--steps may change on resume: the run's own files, not another's)

@pytest.mark.parametrize("extra", [[], ["--task", "passkey", "--seq-len", "130"],
                                   ["--task", "copy", "--copy-len", "3,9"]])
def test_validation_batches_are_their_own_draw_whatever_the_training_seed(tmp_path, extra):
    # the validation sampler's seed is fixed (10_000): not the training stream's, or the first validation
    # batch would be the first training batch; and the same for every --seed / --data-seed
    base = TRAIN[2:] if extra else TRAIN
    firsts = []
    for seed in (0, 10_000):
        args = flags.get_args(base + extra + ["--data-seed", str(seed), "--out", str(tmp_path / "r")])
        sampler, val_sampler, *_ = train.setup_data(args)
        firsts.append(val_sampler.next_batch().x)
        if seed == 0:
            assert not torch.equal(sampler.next_batch().x, firsts[0])
    assert torch.equal(*firsts)
