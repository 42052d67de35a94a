"""Fine-tuning on the long-context tasks (train.py --task): the loss is on answer tokens only, and the paper's
pipeline chains: LM -> post-training -> task fine-tune -> longer lengths. (Resume: test_train.py; scoring:
test_evaluate.py.)"""
import json
import types
from contextlib import nullcontext

import pytest
import torch
import torch.nn.functional as F

import evaluate
import data
import train
from plumbing import checkpoints, flags
from conftest import checkpoint, logged, tiny_lm

TASK_FLAGS = {"passkey": "--seq-len 160 --init-state fitted".split(),  # bytes: a passkey takes >= 124 tokens
              "copy": "--copy-len 3,12 --init-state sp".split(),
              "babilong": "--seq-len 512 --babi-tasks qa1,qa6 --init-state zero".split()}  # a story <= ~470

def lm_then_sp(tmp_path):
    """Fig. 6's pipeline before the task: an LM base from the zero state, then State Passing post-training."""
    lm, sp, fast = str(tmp_path / "lm"), str(tmp_path / "sp"), "--steps 1 --batch-size 2 --quiet".split()
    train.main(["--init-state", "zero", "--seq-len", "16", "--eval-batches", "1", "--out", lm] + fast)
    train.main(["--init-from", lm, "--init-state", "sp", "--eval-batches", "1", "--out", sp] + fast)
    return sp

@pytest.mark.parametrize("task", ["passkey", "copy", "babilong"])
def test_task_loss_is_the_mean_cross_entropy_over_answer_tokens(tmp_path, task):
    init = lm_then_sp(tmp_path) if task == "babilong" else checkpoint(tmp_path / "init")[0]
    argv = ["--task", task, "--init-from", init, "--batch-size", "2" if task == "babilong" else "3",
            "--steps", "1", "--eval-batches", "1", "--quiet", "--device", "cpu"] + TASK_FLAGS[task]
    train.main(argv + ["--out", str(tmp_path / "run")])
    # step 1's loss is the initial model's on the sampler's first batch (every strategy starts from zero)
    filler = data.load_data("stdlib", seed=0).train if task == "babilong" else None
    sampler = flags.make_task_sampler(flags.get_args(argv + ["--out", str(tmp_path / "new")]), 0, filler)
    x, y, _ = sampler.next_batch()   # its targets are -100 but on the answer tokens (test_tasks.py)
    with torch.no_grad():
        logp = checkpoints.from_pretrained(init).eval()(x)[0].float().log_softmax(-1)
    mask = y != -100
    want = -logp[mask].gather(-1, y[mask][:, None]).sum() / mask.sum()   # per answer token over the batch
    assert logged(str(tmp_path / "run"))[1] == pytest.approx(want.item(), rel=1e-5)
    if task == "copy":                                        # answers of different lengths: not the row mean
        rows = torch.stack([-logp[r, m].gather(1, y[r, m][:, None]).mean() for r, m in enumerate(mask)])
        assert mask.sum(1).unique().numel() > 1 and rows.mean().item() != pytest.approx(want.item(), rel=1e-4)
    cfg = checkpoints.train_config(str(tmp_path / "run"))
    assert cfg["task"] == task and logged(str(tmp_path / "run"), "val_loss")[1] > 0
    if task == "babilong":   # a plain fine-tune of the SP-post-trained LM on stories in the LM's corpus
        assert (cfg["init_from"], cfg["init_state"], cfg["data"]) == (init, "zero", "stdlib")
        evaluate.main([str(tmp_path / "run"), "--metrics", "babilong", "--babi-lengths", "512,1024",
                       "--task-samples", "1", "--out", str(tmp_path / "eval")])   # and past T_train = 512
        assert json.load(open(tmp_path / "eval/eval.json"))["models"][0]["babilong"]["lengths"] == [512, 1024]

def test_validation_loss_is_the_mean_over_the_answer_tokens_of_all_batches():
    lm, g = tiny_lm(vocab_size=11), torch.Generator().manual_seed(0)
    x, y = torch.randint(0, 11, (2, 6, 20), generator=g).unbind()   # two batches of 3 rows
    y = y.masked_fill(torch.rand(6, 20, generator=g) > 0.1, -100)    # ~10% of the targets are answers
    batches = iter([data.Batch(x[:3], y[:3], None), data.Batch(x[3:], y[3:], None)])
    with torch.no_grad():
        want = F.cross_entropy(lm(x)[0].flatten(0, 1), y.flatten(), ignore_index=-100)
    got = train.evaluate_loss(lm, types.SimpleNamespace(next_batch=batches.__next__), 2, "cpu", nullcontext())
    assert got == pytest.approx(want.item(), rel=1e-5)
