"""Fine-tuning on the long-context tasks (train.py --task) and their scoring (evaluate.py section 5)."""
import json
import os
import types
from dataclasses import asdict

import numpy as np
import pytest
import torch
import torch.nn as nn

import evaluate as ev
import model
import tasks
import train

ENC = tasks.get_tokenizer("bytes")

# --task -> flags of a tiny run; passkey needs >= 124 tokens, a bAbI story up to ~470 (bytes tokenizer)
TASK_FLAGS = {
    "passkey": ["--seq-len", "160", "--init-state", "fitted"],
    "copy": ["--copy-len", "3,12", "--init-state", "sp"],
    "babilong": ["--seq-len", "512", "--babi-tasks", "qa1,qa6", "--init-state", "zero"],
}


def tiny_checkpoint(path, init_seed=0, **train_config):
    torch.manual_seed(init_seed)
    lm = model.LM(model.make_config("mamba2", "tiny", vocab_size=257))
    os.makedirs(path, exist_ok=True)
    torch.save({"model_config": asdict(lm.cfg), "model": lm.state_dict(), "train_config": train_config},
               os.path.join(path, "ckpt.pt"))
    return str(path)


def logged(out, key="loss"):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return {r["step"]: r.get(key) for r in map(json.loads, f)}


# --- train.py --task ----------------------------------------------------------------------------------

@pytest.mark.parametrize("task", ["passkey", "copy", "babilong"])
def test_task_loss_is_the_mean_cross_entropy_over_answer_tokens(tmp_path, task):
    init = tiny_checkpoint(tmp_path / "init")
    argv = ["--task", task, "--init-from", init, "--steps", "1", "--batch-size", "2" if task == "babilong" else "3",
            "--eval-batches", "1", "--quiet"] + TASK_FLAGS[task]
    train.main(argv + ["--out", str(tmp_path / "run")])
    # step 1's loss is the initial model's on the sampler's first batch (every strategy starts from zero)
    filler = tasks.load_data("stdlib", seed=0).train if task == "babilong" else None
    sampler = train.make_task_sampler(train.get_args(argv + ["--out", str(tmp_path / "new")]), 0, filler)
    samples = sampler.next_samples()
    sampler.load_state_dict({"seed": 0, "step": 0})
    x, y = sampler.next_batch()
    n_answer = [int(s.answer_mask.sum()) for s in samples]
    assert int((y != -100).sum()) == sum(n_answer)            # the answer tokens, nothing else
    for row, s in zip(y, samples):                            # ... and they are the last tokens
        assert (row[-len(s.tokens) + 1:][-int(s.answer_mask.sum()):] != -100).all()
    with torch.no_grad():
        logp = model.from_pretrained(init).eval()(x)[0].float().log_softmax(-1)
    mask = y != -100
    want = -logp[mask].gather(-1, y[mask][:, None]).sum() / mask.sum()   # per answer token over the batch
    assert logged(str(tmp_path / "run"))[1] == pytest.approx(want.item(), rel=1e-5)
    if task == "copy":                                        # answers of different lengths: not the row mean
        per_row = torch.stack([-logp[r][mask[r]].gather(-1, y[r][mask[r]][:, None]).mean() for r in range(len(y))])
        assert len(set(n_answer)) > 1 and per_row.mean().item() != pytest.approx(want.item(), rel=1e-4)
    ckpt = torch.load(tmp_path / "run" / "ckpt.pt", weights_only=True)
    assert ckpt["train_config"]["task"] == task and logged(str(tmp_path / "run"), "val_loss")[1] > 0


def test_task_resume_is_exact(tmp_path):
    common = ["--task", "passkey", "--seq-len", "130", "--batch-size", "2", "--init-state", "fitted", "--steps", "4",
              "--ckpt-interval", "2", "--eval-interval", "2", "--eval-batches", "1", "--quiet"]
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    train.main(common + ["--out", a])
    train.main(common + ["--out", b, "--stop-at", "3"])      # killed after step 3; checkpoint at step 2
    train.main(["--out", b, "--resume", "--quiet"])
    for key in ("loss", "val_loss"):
        assert logged(a, key) == logged(b, key) and sorted(logged(a, key)) == [1, 2, 3, 4]


# --- greedy decoding ----------------------------------------------------------------------------------

def test_streamed_greedy_answer_equals_argmax_of_full_forwards():
    torch.manual_seed(0)
    lm = model.LM(model.make_config("mamba2", "tiny", vocab_size=257)).eval()
    prompts = torch.randint(0, 257, (3, 41), generator=torch.Generator().manual_seed(1))
    seq = prompts.clone()
    with torch.no_grad():
        for _ in range(9):   # the definition: re-read everything, take the argmax of the last position
            seq = torch.cat([seq, lm(seq)[0][:, -1].argmax(-1, keepdim=True)], 1)
    want = seq[:, 41:].tolist()
    assert ev.greedy_answer(lm, prompts, 9, chunk_len=8) == want
    assert ev.greedy_answer(lm, prompts[1], 9) == [want[1]]
    stop = want[0][3]        # rows stop at their first stop token, inclusive
    got = ev.greedy_answer(lm, prompts, 9, stop_tokens={stop}, chunk_len=16)
    for g, w in zip(got, want):
        assert g == (w[:w.index(stop) + 1] if stop in w else w)


# --- scoring ------------------------------------------------------------------------------------------

class OracleLM(nn.Module):
    """lm(idx, state) -> (logits, state) whose last-position logits point at the next answer token of any
    registered prompt it has read (then eot), or, with wrong=True, always at "#". Its state is the whole
    token history (a tensor, carried like a recurrent state), so streaming and stepping work as for a real
    model. Only the last position's logits are meaningful, which is all greedy decoding reads."""

    def __init__(self, samples, wrong=False):
        super().__init__()
        self.cfg = types.SimpleNamespace(vocab_size=ENC.n_vocab)
        self.wrong = wrong
        self.answers = {}
        for s in samples:
            prompt, answer = tasks.split_answer(s)
            self.answers.setdefault(len(prompt), {})[tuple(prompt.tolist())] = answer.tolist()

    def zero_state(self, batch_size, device=None):
        return [{"hist": torch.zeros(batch_size, 0, dtype=torch.long)}]

    def forward(self, idx, state=None, last_only=False):
        hist = torch.cat([(state or self.zero_state(len(idx)))[0]["hist"], idx], 1)
        logits = torch.zeros(*idx.shape, self.cfg.vocab_size)
        for r, h in enumerate(hist.tolist()):
            logits[r, -1, self._next(h)] = 10.0
        return logits[:, -1:] if last_only else logits, [{"hist": hist}]

    def _next(self, h):
        if self.wrong:
            return ord("#")
        for n, table in self.answers.items():
            if tuple(h[:n]) in table:
                answer, done = table[tuple(h[:n])], len(h) - n
                return answer[done] if done < len(answer) else ENC.eot_token
        raise AssertionError("the oracle was asked about a prompt it does not know")


PK = dict(lengths=[128, 200], depths=[0.0, 0.5, 1.0], n_per_cell=2, seed=3)
CP = dict(lengths=[4, 9], n=3, seed=3)
BB = dict(babi_tasks=["qa1", "qa8"], lengths=[512], n=2, seed=3)


def oracle_samples():
    out = [s for L in PK["lengths"] for row in ev.passkey_samples("bytes", L, PK["depths"], PK["n_per_cell"], PK["seed"])
           for s in row]
    out += [s for L in CP["lengths"] for s in ev.copy_samples("bytes", L, CP["n"], CP["seed"])]
    out += [s for t in BB["babi_tasks"] for L in BB["lengths"] for s in ev.babilong_samples("bytes", t, L, BB["n"], BB["seed"])]
    return out


def score_all(lm, batch_size=None):
    pk = ev.passkey_grid(lm, "bytes", PK["lengths"], PK["depths"], PK["n_per_cell"], PK["seed"], batch_size=batch_size)
    cp = ev.copy_accuracy(lm, "bytes", CP["lengths"], CP["n"], CP["seed"], batch_size=batch_size)
    bb = ev.babilong_accuracy(lm, "bytes", BB["babi_tasks"], BB["lengths"], BB["n"], BB["seed"], batch_size=batch_size)
    return pk, cp, bb


def test_a_model_that_is_always_right_scores_one_and_a_wrong_one_zero():
    samples = oracle_samples()
    pk, cp, bb = score_all(OracleLM(samples), batch_size=2)
    assert np.all(np.array(pk["exact"]) == 1) and np.all(np.array(pk["digits"]) == 1)
    assert cp["char_mean"] == [1.0, 1.0] and cp["whole_mean"] == [1.0, 1.0]
    assert bb["acc"] == {"qa1": [1.0], "qa8": [1.0]} and bb["mean"] == [1.0]
    pk, cp, bb = score_all(OracleLM(samples, wrong=True))
    assert np.all(np.array(pk["exact"]) == 0) and np.all(np.array(pk["digits"]) == 0)
    assert cp["char_mean"] == [0.0, 0.0] and cp["whole_mean"] == [0.0, 0.0]
    assert bb["mean"] == [0.0]


# --- CLI ----------------------------------------------------------------------------------------------

def test_cli_writes_the_json_and_plots(tmp_path, capsys):
    cfg = dict(task="passkey", seq_len=160, data="stdlib", tokenizer="bytes", seed=0, babi_tasks="qa1",
               copy_len="3,5")
    a = tiny_checkpoint(tmp_path / "a", init_seed=0, **cfg)
    b = tiny_checkpoint(tmp_path / "b", init_seed=1, **cfg)
    out = tmp_path / "eval"
    rc = ev.main([a, b, "--metrics", "passkey,copy,babilong", "--task-samples", "1", "--passkey-lengths", "128,160",
                  "--passkey-depths", "2", "--copy-lengths", "3,5", "--babi-lengths", "512", "--out", str(out),
                  "--device", "cpu"])
    stdout = capsys.readouterr().out
    assert rc == 0 and "Passkey" in stdout and "Copying" in stdout and "BABILong" in stdout
    rep = json.load(open(out / "eval.json"))
    assert rep["babi_tasks"] == ["qa1"] and "val split" in rep["babi_filler"]
    for m in rep["models"]:
        assert np.array(m["passkey"]["exact"]).shape == (2, 2) and m["t_train"] == 160
        assert m["copy"]["lengths"] == [3, 5] and m["babilong"]["lengths"] == [512]
    for f in ("passkey.png", "copy.png", "babilong.png"):
        assert (out / f).stat().st_size > 1000
    # with no --metrics, a task checkpoint is scored on its task
    rc = ev.main([a, "--task-samples", "1", "--passkey-lengths", "128", "--passkey-depths", "2",
                  "--out", str(tmp_path / "eval2"), "--device", "cpu"])
    rep = json.load(open(tmp_path / "eval2" / "eval.json"))
    assert rc == 0 and set(rep["models"][0]) & {"passkey", "copy", "babilong", "ppl"} == {"passkey"}


def test_cli_task_defaults_come_from_the_checkpoints():
    args = ev._parse_args(["ckpt"])
    copy_cfg = dict(task="copy", copy_len="50,100", babi_tasks="qa2,qa3", data="stdlib")
    setup = ev._task_setup(args, ["copy", "babilong"], [copy_cfg], "bytes", 0)
    assert setup["babi_tasks"] == ["qa2", "qa3"] and len(setup["filler"]) > 100_000
    with pytest.raises(ValueError, match="--babi-filler ours"):  # a synthetic process is no filler text
        ev._task_setup(ev._parse_args(["ckpt"]), ["babilong"], [dict(copy_cfg, data="markov:k=4")], "bytes", 0)
    args = ev._parse_args(["ckpt", "--babi-filler", "ours"])
    assert ev._task_setup(args, ["babilong"], [copy_cfg], "bytes", 0)["filler"] is None
