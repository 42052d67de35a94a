"""Run folders and the process around a run: --out for one train.py at a time (its lock, its files, the
checks that it holds what the run read), the device a script asks for, and how a run ends: diverged,
interrupted, or an error in one line. A reader of the paper can skip this file."""
import fcntl
import json
import os
import pathlib
import signal
import sys
from contextlib import contextmanager

import torch

from plumbing import checkpoints, distributed, files

# Not resumed: flags of one invocation, not of the run. A run's args.json records the others.
PER_INVOCATION = ("out", "resume", "stop_at", "device", "quiet", "demo", "seeds", "cache_dir", "dist_timeout")

def device(name):
    """--device: "auto" is CUDA when present, else the CPU; anything else as torch reads it."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)

def out_of_memory(error):
    """Is error an allocation that failed? (The CPU allocator's is a plain RuntimeError.)"""
    return isinstance(error, (MemoryError, torch.OutOfMemoryError)) or "can't allocate memory" in str(error)

def run_files(out):
    """The files train.py writes beside ckpt.pt that out holds, e.g. "metrics.jsonl and args.json", or ''."""
    return " and ".join(f for f in ("metrics.jsonl", "args.json") if os.path.lexists(os.path.join(out, f)))

def records_this_run(args):
    """Does args.out/args.json record this very run (every flag alike), stopped before its first checkpoint?
    Then its files may be replaced: the run writes them again as they were. Another run's never are."""
    try:
        saved = json.loads(pathlib.Path(args.out, "args.json").read_text())
    except (OSError, ValueError):
        return False
    skip = PER_INVOCATION + ("run_id",)
    return isinstance(saved, dict) and all(saved.get(k) == v for k, v in vars(args).items() if k not in skip)

def out_problems(args):
    """[(bad, message)] of a new run's --out: it holds no run, and no other run's files."""
    new = not args.resume
    return [(new and os.path.exists(checkpoints.ckpt_file(args.out)),
             f"{args.out} holds a run: --resume it, or use another --out"),
            (new and run_files(args.out) and not records_this_run(args), f"{args.out} holds another run's "
             f"{run_files(args.out)} but no ckpt.pt: move them away, or use another --out")]

@contextmanager
def open_run(args, step):
    """--out for this process alone (lock); it must still hold what this process read, and yields
    metrics.jsonl without its rows past `step` (past the checkpoint: to redo), args.json written again."""
    metrics = os.path.join(args.out, "metrics.jsonl")
    with lock(args.out):
        exit_if_changed(args, step)
        exit_if_another_runs_files(args, metrics, step)
        rewrite(args, rows_up_to(metrics, step))
        with open(metrics, "a") as log:
            yield log

def rewrite(args, rows):
    """--out's args.json (args) and metrics.jsonl (rows), each replaced whole."""
    for name, text in (("args.json", json.dumps(vars(args), indent=1)), ("metrics.jsonl", rows)):
        write = lambda tmp: pathlib.Path(tmp).write_text(text)
        files.write_atomically(os.path.join(args.out, name), write)

@contextmanager
def lock(out):
    """out/train.lock held by this process, its pid in it: a flock, which the OS releases however the
    process ends (even kill -9)."""
    with open(os.path.join(out, "train.lock"), "a+") as held:
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            held.seek(0)
            sys.exit(f"error: another train.py (pid {held.read().strip()}) is writing {out}: wait for "
                     f"it, or use another --out")
        held.truncate(0)
        print(os.getpid(), file=held, flush=True)
        yield

def exit_if_changed(args, step):
    """Under the lock no other train.py writes --out: it must still hold what this process read, no run
    (step 0) or the checkpoint it resumes (another may have saved there since exit_on_bad_flags looked)."""
    ckpt = checkpoints.ckpt_file(args.out)
    saved = 0   # no run
    if os.path.isfile(ckpt):
        saved = checkpoints.read_checkpoint(ckpt, "cpu", mmap=True).get("step", "?")
    if saved != step and not step:
        sys.exit(f"error: {args.out} holds a run: --resume it, or use another --out")
    if not step and run_files(args.out) and not records_this_run(args):   # since looked
        sys.exit(f"error: {args.out} holds another run's {run_files(args.out)}: use another --out")
    if saved != step:
        sys.exit(f"error: {ckpt} is at step {saved}, not {step} as read: another train.py wrote it "
                 "meanwhile; --resume again")

def exit_if_another_runs_files(args, metrics, step):
    """A resumed run's args.json and metrics.jsonl must be its checkpoint's run's (a new run replaces
    another's args.json)."""
    written = os.path.join(args.out, "args.json")
    if not (step and os.path.isfile(written)):
        return
    theirs = files.read_json(written, "move it away").get("run_id")
    if theirs and theirs != args.run_id:
        sys.exit(f"error: {metrics} and args.json are another run's than {checkpoints.ckpt_file(args.out)}: "
                 "move them away, or resume the run that wrote the checkpoint")

def rows_up_to(path, step):
    """The rows of metrics.jsonl at path up to `step`, as text; a row cut short by a kill (no closing brace
    and newline) dropped."""
    try:
        rows = open(path).readlines() if os.path.exists(path) else []
        return "".join(r for r in rows if r.endswith("}\n") and json.loads(r)["step"] <= step)
    except (ValueError, KeyError, TypeError):   # (not UTF-8: a ValueError)
        sys.exit(f"error: {path} holds a row that is not train.py's (JSON with a step): move it away")

def diverged(args, step, what, saved):
    """Stops a run whose loss or gradient is not finite, before it saves: its last checkpoint stays intact."""
    last = (f"the last checkpoint, {args.out}/ckpt.pt (step {saved}), is intact: continue it with --resume "
            "and a lower --lr" if saved else "no checkpoint was saved: start again with a lower --lr")
    sys.exit(f"error: training diverged at step {step} ({what} not finite); stopped without saving: {last}")

def stop_on_signals():
    """Ctrl-C and SIGTERM stop the run as a KeyboardInterrupt: temporary files removed."""
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, interrupted)

def interrupted(signum, frame):
    """The first Ctrl-C or SIGTERM stops the run; more, during its clean-up, are ignored."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt

def exit_in_one_line(error, args):
    """Ends train.py in one line for bad input, out of memory, a lost torchrun rank or Ctrl-C (SIGTERM);
    returns for any other error (a bug: the caller raises it, with its trace). args: None before parsed."""
    if isinstance(error, (OSError, ValueError)):
        sys.exit(f"error: {error}")
    if isinstance(error, KeyboardInterrupt) and args and args.demo:
        sys.exit("interrupted: rerun the same command to go on: finished runs are kept, the one "
                 "interrupted resumes")
    if isinstance(error, KeyboardInterrupt):
        sys.exit(f"interrupted: {checkpoints.last_checkpoint(args)}")
    if out_of_memory(error):
        sys.exit("error: out of memory: lower --batch-size (and raise --grad-accum) or --seq-len")
    if why := distributed.lost(error):   # a collective that lost a peer raises a RuntimeError (torchrun)
        sys.exit(f"error: rank {os.environ['RANK']} lost the other processes ({why}): one ended, or froze or "
                 f"was busy past --dist-timeout {args.dist_timeout:g} s (tokenizing a large --data: tokenize "
                 f"it first, python -m plumbing.token_cache); {checkpoints.last_checkpoint(args)}")
