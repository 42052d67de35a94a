"""train.py: exact resume, NaN handling, DDP, bad inputs."""
import json
import os
import subprocess
import sys

import pytest
import torch

import train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = "markov:k=4,alpha=0.5,doc_len=200,docs=40"
BASE = ["--data", DATA, "--seq-len", "16", "--batch-size", "4", "--eval-interval", "1000", "--quiet"]


def losses(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return {r["step"]: r["loss"] for r in map(json.loads, f)}


@pytest.mark.parametrize("init_state", ["sp", "fitted", "tbtt"])
def test_resume_after_interrupt_reproduces_the_loss_trajectory(tmp_path, init_state):
    common = BASE + ["--init-state", init_state, "--steps", "8", "--ckpt-interval", "3", "--arch", "mamba2"]
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    train.main(common + ["--out", a])
    train.main(common + ["--out", b, "--stop-at", "4"])  # "killed" after step 4; last checkpoint at step 3
    ckpt = torch.load(os.path.join(b, "ckpt.pt"), weights_only=True)
    assert ckpt["step"] == 3
    train.main(common + ["--out", b, "--resume"])
    la, lb = losses(a), losses(b)
    assert sorted(la) == list(range(1, 9))
    for step in range(1, 9):
        assert la[step] == lb[step], f"step {step}: {la[step]} vs {lb[step]}"


def test_checkpoint_loads_with_from_pretrained(tmp_path):
    import model
    out = str(tmp_path / "r")
    lm = train.main(BASE + ["--arch", "rwkv6", "--init-state", "zero", "--steps", "2", "--out", out])
    lm2 = model.from_pretrained(out)
    x = torch.randint(0, 5, (1, 6))
    lm.eval()
    with torch.no_grad():
        torch.testing.assert_close(lm(x)[0], lm2.eval()(x)[0])


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path):
    out = str(tmp_path / "nan")
    with pytest.raises(SystemExit, match="loss is"):
        train.main(BASE + ["--init-state", "zero", "--steps", "20", "--ckpt-interval", "1", "--warmup", "0",
                           "--lr", "1e30", "--out", out])
    ckpt = torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)
    assert ckpt["step"] >= 1
    assert all(torch.isfinite(v).all() for v in ckpt["model"].values() if v.is_floating_point())


def test_post_training_uses_a_tenth_of_the_peak_lr(tmp_path):
    base = str(tmp_path / "base")
    train.main(BASE + ["--init-state", "zero", "--steps", "2", "--out", base])
    post = str(tmp_path / "post")
    train.main(BASE + ["--init-state", "sp", "--steps", "2", "--init-from", base, "--out", post, "--warmup", "0"])
    with open(os.path.join(post, "args.json")) as f:
        post_args = json.load(f)
    assert post_args["lr"] == pytest.approx(train.PEAK_LR["tiny"] / 10)


def test_post_training_takes_a_tenth_of_the_checkpoints_own_peak_lr_and_its_seq_len(tmp_path):
    # a base trained at --lr 1e-3 and T_train 16 (not the tiny preset's 3e-3 / 64): post-training
    # defaults to 1e-4 and T_train 16, and a second post-training still to 1e-4 (peak_lr is inherited)
    base, post, post2 = (str(tmp_path / n) for n in ("base", "post", "post2"))
    train.main(BASE + ["--init-state", "zero", "--steps", "1", "--lr", "1e-3", "--out", base])
    for parent, out in ((base, post), (post, post2)):
        train.main(["--quiet", "--steps", "1", "--batch-size", "4", "--init-from", parent, "--out", out])
        with open(os.path.join(out, "args.json")) as f:
            a = json.load(f)
        assert a["lr"] == pytest.approx(1e-4) and a["peak_lr"] == pytest.approx(1e-3) and a["seq_len"] == 16


class FixedBatches:
    """A sampler that hands out the given (x, y) pairs in order."""

    def __init__(self, batches):
        self.batches = list(batches)

    def next_batch(self):
        return self.batches.pop(0)


@pytest.mark.parametrize("arch", ["mamba2", "rwkv6"])
def test_two_micro_batches_give_the_gradient_of_one_batch_twice_as_large(arch):
    import interventions
    import model
    torch.manual_seed(0)
    lm = model.LM(model.make_config(arch, "tiny", vocab_size=11))
    x = torch.randint(0, 11, (8, 13))
    y = torch.randint(0, 11, (8, 13))
    grads = {}
    for n_micro, batches in ((1, [(x, y)]), (2, [(x[:4], y[:4]), (x[4:], y[4:])])):
        lm.zero_grad(set_to_none=True)
        strategy = interventions.make_strategy("zero", lm, len(batches[0][0]))
        loss, tokens = train.accumulate_gradients(lm, FixedBatches(batches), strategy, n_micro, torch.device("cpu"))
        assert tokens == x.numel()
        grads[n_micro] = (loss, [p.grad.clone() for p in lm.parameters()])
    assert grads[1][0] == pytest.approx(grads[2][0], rel=1e-5)
    for g1, g2 in zip(grads[1][1], grads[2][1]):
        torch.testing.assert_close(g1, g2, atol=1e-6, rtol=1e-4)


def test_sp_passes_states_from_micro_batch_to_micro_batch(tmp_path):
    # with --grad-accum 2 every micro-batch is a batch for SP: the run works, counts grad-accum x batch
    # tokens per step, and resumes exactly
    common = BASE + ["--init-state", "sp", "--steps", "6", "--grad-accum", "2", "--ckpt-interval", "2"]
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    train.main(common + ["--out", a])
    train.main(common + ["--out", b, "--stop-at", "3"])
    train.main(common + ["--out", b, "--resume"])
    la, lb = losses(a), losses(b)
    assert la == lb and sorted(la) == list(range(1, 7))


def test_post_training_keeps_the_parent_data_unless_told(tmp_path):
    base = str(tmp_path / "base")
    train.main(BASE + ["--init-state", "zero", "--steps", "1", "--out", base])
    post = str(tmp_path / "post")
    train.main(["--seq-len", "16", "--batch-size", "4", "--quiet", "--steps", "1", "--init-from", base, "--out", post])
    with open(os.path.join(post, "args.json")) as f:
        post_args = json.load(f)
    assert post_args["data"] == DATA and post_args["tokenizer"] == "bytes"


@pytest.mark.parametrize("argv,message", [
    (["--init-state", "warm"], "invalid choice"),
    (["--steps", "0"], "--steps must be a positive integer"),
    (["--grad-accum", "0"], "--grad-accum must be a positive integer"),
    (["--size", "huge"], "unknown --size"),
    (["--warmup", "1.5"], "--warmup"),
    (["--init-from", "/nonexistent/ckpt"], "does not exist"),
])
def test_bad_flags_give_one_line_errors(argv, message, capsys):
    with pytest.raises(SystemExit):
        train.get_args(argv)
    assert message in capsys.readouterr().err


def test_resume_errors(tmp_path):
    with pytest.raises(SystemExit, match="does not exist"):
        train.main(BASE + ["--resume", "--out", str(tmp_path / "none")])
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "ckpt.pt").write_bytes(b"garbage")
    with pytest.raises(SystemExit, match="corrupt"):
        train.main(BASE + ["--resume", "--out", str(bad)])


def test_two_process_gloo_ddp_takes_steps(tmp_path):
    out = str(tmp_path / "ddp")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29517",
           os.path.join(ROOT, "train.py")] + BASE + ["--init-state", "sp", "--steps", "2", "--device", "cpu", "--out", out]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    ckpt = torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)
    assert ckpt["step"] == 2 and len(ckpt["sampler"]) == 2 and len(ckpt["strategy"]) == 2
    assert sorted(losses(out)) == [1, 2]


def test_command_line_bad_data_is_one_line(tmp_path):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--data", str(tmp_path / "missing.txt"),
                        "--out", str(tmp_path / "o")], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    lines = [l for l in r.stderr.strip().splitlines() if l]
    assert len(lines) == 1 and "missing.txt" in lines[0] and "Traceback" not in r.stderr


def test_demo_runs_end_to_end_small(tmp_path):
    out = str(tmp_path / "demo")
    assert train.demo(out, base_steps=2, post_steps=1, n_seqs=4, quiet=True) == 0
    with open(os.path.join(out, "eval.json")) as f:
        report = json.load(f)
    assert [m["label"] for m in report["models"]] == ["base", "control", "SP", "TBTT"]
    assert "optimal" in report and all("gap" in m for m in report["models"])
    assert os.path.exists(os.path.join(out, "ppl.png"))
