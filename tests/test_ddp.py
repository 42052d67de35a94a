"""train.py under torchrun (plumbing/distributed.py): N ranks of --batch-size B train as one process of N x B on the
same rows, resume exactly at the same N and refuse another in one line, and end in one line, their last
checkpoint intact, when a rank freezes or dies. Ranks: CPU processes on gloo, on 127.0.0.1 at a free port."""
import itertools
import os
import signal
import socket
import subprocess
import sys
import time
import types

import pytest
import torch

import data
import train
from plumbing import distributed, flags
from conftest import ROOT, TRAIN, logged

RUN = TRAIN + ["--ckpt-interval", "2", "--eval-interval", "2"]   # a validation loss at every checkpoint

def free_port():
    with socket.socket() as s:   # bound then closed: runs side by side never share a port
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

def ranks_env(n):
    return dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(n),
                LOCAL_WORLD_SIZE=str(n), OMP_NUM_THREADS="1", PYTHONPATH=ROOT)

def ranks(flags, n=2, script=f"{ROOT}/train.py", waited=None):
    """n processes of script (train.py) with the environment torchrun gives its ranks -> [(code, stdout,
    stderr)] of the first `waited` ranks (all): the others are killed, none outlives the call."""
    env = ranks_env(n)
    procs = [subprocess.Popen([sys.executable, script, *flags], env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(n)]
    try:
        outs = [p.communicate(timeout=120) for p in procs[:waited]]
        return [(p.returncode, *out) for p, out in zip(procs, outs)]
    finally:
        for p in procs:
            p.kill()
            p.communicate()

def torchrun(flags, n=2):
    """torchrun --standalone --nproc_per_node n train.py flags, as a user runs it."""
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}"]
    r = subprocess.run([*launcher, f"{ROOT}/train.py", *flags], env=ranks_env(n), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout

def ckpt(run):
    return torch.load(os.path.join(run, "ckpt.pt"), weights_only=True)

def assert_same_run(two, one):
    """Two ranks of B rows and one process of 2B: the same weights and metrics, to float32 rounding."""
    for key in ("loss", "val_loss", "grad_norm"):
        a, b = logged(two, key), logged(one, key)
        assert a.keys() == b.keys() and all((a[s] is None) == (b[s] is None) for s in a), key
        assert [a[s] for s in a if a[s] is not None] == pytest.approx([b[s] for s in b if b[s] is not None],
                                                                      rel=1e-5), key
    weights = ckpt(two)["model"], ckpt(one)["model"]
    for k in weights[1]:
        torch.testing.assert_close(weights[0][k], weights[1][k], rtol=1e-4, atol=1e-6)

@pytest.fixture(scope="module")
def sp_runs(tmp_path_factory):
    """SP (no resets: they are each rank's own draws) with --grad-accum 2, 4 steps: 2 ranks of 2 rows under
    torchrun, and one process of 4 rows; -> (2 ranks' run, one process's run, torchrun's stdout)."""
    tmp = tmp_path_factory.mktemp("sp")
    flags = RUN + ["--init-state", "sp", "--p-reset", "0", "--grad-accum", "2", "--steps", "4"]
    out = torchrun(flags + ["--batch-size", "2", "--out", str(tmp / "two")])
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}   # main() sets them; this
    train.main(flags + ["--batch-size", "4", "--out", str(tmp / "one")])         # runs before process_state
    for s, handler in handlers.items():
        signal.signal(s, handler)
    return str(tmp / "two"), str(tmp / "one"), out

def test_two_ranks_of_sp_train_as_one_process_of_twice_the_rows(sp_runs):
    two, one, out = sp_runs
    assert_same_run(two, one)
    assert out.count("\n") == 2 and "4 steps of 4 x 2 processes x 16 tokens" in out   # rank 0 alone prints
    saved, alone = ckpt(two), ckpt(one)
    assert len(saved["sampler"]) == len(saved["strategy"]) == 2 and saved["sampler"][0] == alone["sampler"][0]
    for rank, state in enumerate(saved["strategy"]):   # rank r passes the states of its rows 2r, 2r + 1
        for mine, whole in zip(state["passed"], alone["strategy"][0]["passed"]):
            for k in whole:
                torch.testing.assert_close(mine[k], whole[k][2 * rank:2 * rank + 2], rtol=1e-4, atol=1e-6)
        gen = torch.Generator().manual_seed(rank)   # its own resets: --seed + rank, 2 rows a draw, 7 draws
        for _ in range(7):   # (the first micro-batch starts from zero, draws none)
            torch.rand(2, generator=gen)
        assert torch.equal(state["gen"], gen.get_state())

CLOCK = """import itertools, sys, types
import train
train.time = types.SimpleNamespace(time=itertools.count().__next__)
train.main(sys.argv[1:])
"""

def test_two_ranks_of_the_zero_state_train_as_one_process_of_twice_the_rows(tmp_path, monkeypatch):
    # train.py's clock reads 0, 1, 2 ... s: tokens_per_s is the tokens of a step, every rank's
    (tmp_path / "clock.py").write_text(CLOCK)
    flags = RUN + ["--init-state", "zero", "--steps", "2"]
    bar = [f for f in flags if f != "--quiet"]   # rank 0's progress bar, not rank 1's
    two = ranks(bar + ["--batch-size", "2", "--out", str(tmp_path / "two")], script=f"{tmp_path}/clock.py")
    assert [r[0] for r in two] == [0, 0] and "2/2" in two[0][1] and two[1][1:] == ("", ""), two
    monkeypatch.setattr(train, "time", types.SimpleNamespace(time=itertools.count().__next__))
    train.main(flags + ["--batch-size", "4", "--out", str(tmp_path / "one")])
    assert_same_run(str(tmp_path / "two"), str(tmp_path / "one"))
    assert logged(str(tmp_path / "two"), "tokens_per_s") == {1: 64, 2: 64} == logged(str(tmp_path / "one"),
                                                                                     "tokens_per_s")

def test_an_interrupted_two_rank_run_resumes_exactly_and_one_process_is_refused(sp_runs, tmp_path, capsys):
    two = sp_runs[0]
    run = str(tmp_path / "run")
    flags = RUN + ["--init-state", "sp", "--p-reset", "0", "--grad-accum", "2", "--steps", "4",
                   "--batch-size", "2", "--out", run]
    assert [r[0] for r in ranks(flags + ["--stop-at", "3"])] == [0, 0]   # "killed" after step 3, saved at 2
    assert ckpt(run)["step"] == 2 and len(logged(run)) == 3
    assert [r[0] for r in ranks(["--resume", "--out", run, "--quiet", "--dist-timeout", "30"])] == [0, 0]
    for key in ("loss", "val_loss", "grad_norm"):
        assert logged(run, key) == logged(two, key), key   # exactly: the same ranks, the same sums
    before = open(os.path.join(run, "ckpt.pt"), "rb").read()
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        train.main(["--resume", "--out", run, "--steps", "6", "--quiet"])
    assert e.value.code == (f"error: {run}/ckpt.pt was saved by 2 processes, this run has 1: resume with "
                            "torchrun --nproc_per_node 2")
    assert open(os.path.join(run, "ckpt.pt"), "rb").read() == before and capsys.readouterr().out == ""

STOP = """import os, sys, time
import train
lr_at = train.lr_at
def stop_after_step_1(step, args):   # rank 1 once its step 1 is done and saved: frozen, or ended
    if step == 1:
        time.sleep(3600) if sys.argv[1] == "frozen" else os._exit(1)
    return lr_at(step, args)
if os.environ["RANK"] == "1":
    train.lr_at = stop_after_step_1
train.main(sys.argv[2:])
"""

@pytest.mark.parametrize("how", ["frozen", "dead"])
def test_a_frozen_or_dead_rank_ends_the_run_in_one_line_its_checkpoint_intact(tmp_path, how):
    (tmp_path / "stop.py").write_text(STOP)
    run = str(tmp_path / "run")
    flags = TRAIN + ["--steps", "100", "--ckpt-interval", "1", "--dist-timeout", "2", "--out", run]
    t0 = time.time()
    [(code, _, message)] = ranks([how, *flags], script=str(tmp_path / "stop.py"), waited=1)
    assert code == 1 and message.count("\n") == 1, message
    why = "Timed out waiting 2000ms" if how == "frozen" else ""   # --dist-timeout's; dead: the socket's error
    assert message.startswith(f"error: rank 0 lost the other processes ({why}"), message
    assert message.endswith(f"{run}/ckpt.pt (step 1) is intact; continue with --resume\n"), message
    assert "gloo/" not in message and "GLHF" not in message, message   # gloo's source file and advice
    saved = ckpt(run)
    assert saved["step"] == 1 and len(saved["sampler"]) == 2 and len(logged(run)) == 1
    assert time.time() - t0 < 60

def test_rank_rows_are_one_process_rows_documents_too():
    tokens = (torch.arange(3000) % 7).numpy()   # documents of 7 tokens (eot 0) and of 6
    tokens[::50] = 0
    whole = data.DocumentStreams(tokens, 0, 6, 4, seed=1)
    parts = [distributed.RankRows(data.DocumentStreams(tokens, 0, 6, 4, seed=1), r, 3) for r in range(3)]
    for _ in range(5):
        batch, mine = whole.next_batch(), [p.next_batch() for p in parts]
        for field in ("x", "y", "new_doc"):
            assert torch.equal(torch.cat([getattr(b, field) for b in mine]), getattr(batch, field))
    assert parts[2].state_dict() == whole.state_dict() and parts[2].batch_size == 2
    assert distributed.rows(whole) is whole   # one process: its sampler as it is

def test_torchrun_flags_checked_in_one_line(tmp_path, monkeypatch):
    out = ["--out", str(tmp_path / "r")]
    with pytest.raises(SystemExit, match="--dist-timeout applies only to torchrun's processes"):
        flags.get_args(TRAIN + ["--dist-timeout", "5"] + out)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")
    for bad in ("0.5", "1e8", "nan"):
        with pytest.raises(SystemExit, match=r"^error: --dist-timeout must be in \[1, 1e7\] seconds"):
            train.main(TRAIN + ["--dist-timeout", bad] + out)
    with pytest.raises(SystemExit, match="--demo runs in one process: start it with python, not torchrun"):
        flags.get_args(["--demo"])
    # --tokens counts every process's rows: 4 x 4 rows x 16 tokens a step
    assert flags.get_args(TRAIN + ["--tokens", "2560"] + out).steps == 10

def test_a_lost_rank_is_one_line_and_another_error_a_traceback(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")

    def main_raising(error):
        def fail(args):
            raise error
        monkeypatch.setattr(train, "train", fail)
        train.main(TRAIN + ["--out", str(tmp_path / "run")])
    gloo = "[/x/gloo/transport/tcp/pair.cc:9] Connection closed by peer [::1]:4. Check its logs. GLHF!"
    store = torch.distributed.DistStoreError("Timed out after 601 seconds waiting for clients. 1/2 joined")
    for error, why in [(RuntimeError(gloo), "Connection closed by peer [::1]:4"),   # in a collective
                       (store, "Timed out after 601 seconds waiting for clients")]:   # joining
        with pytest.raises(SystemExit) as e:
            main_raising(error)
        assert e.value.code == (f"error: rank 1 lost the other processes ({why}): one ended, or froze or was "
                                "busy past --dist-timeout 600 s (tokenizing a large --data: tokenize it "
                                "first, python -m plumbing.token_cache); no checkpoint was saved: nothing to resume")
    with pytest.raises(RuntimeError, match="^a bug$"):
        main_raising(RuntimeError("a bug"))
    monkeypatch.delenv("RANK")   # outside torchrun gloo's words are no lost rank either
    with pytest.raises(RuntimeError, match="gloo"):
        main_raising(RuntimeError(gloo))
