"""train.py's flags (FLAGS), parsing them into a run's arguments (get_args: what a resumed or post-trained
run inherits), the checks of their values, one line a problem, and --task's sampler (make_task_sampler). A
reader of the paper can skip this file."""
import argparse
import math
import os
import re
import sys

import torch

import data
import interventions
import model
import tasks
from plumbing import checkpoints, files, runs, strategy_options

# Peak learning rates from scratch: the paper's Table 2 for its sizes; tiny tuned for the CPU demos.
PEAK_LR = {"tiny": 3e-3, "45m": 1.5e-3, "70m": 1.5e-3, "85m": 1.5e-3, "125m": 1e-3, "130m": 1e-3,
           "370m": 7.5e-4, "780m": 5e-4, "1.3b": 4e-4}
# Each flag: name, type (list: choices; bool: a switch), default, help. Not given: None until get_args().
FLAGS = [
    ("init-state", list(interventions.STRATEGIES), "sp", "initial state of each training sequence"),
    ("sigma", float, 0.1, "std of the random initial state"),
    ("p-reset", float, 0.1, "SP: probability that a row restarts from zero"),
    ("streams", bool, False, "rows read one document in order, as TBTT (zero + --streams: TBTT's control)"),
    ("task", ["lm"] + list(tasks.TASKS), "lm", "next tokens of --data, or a Sec. 5 task (loss: the answer)"),
    ("copy-len", str, "50,100", "--task copy: string lengths LO,HI"),
    ("babi-tasks", str, ",".join(tasks.BABI_TASKS), "--task babilong: the bAbI tasks hidden in --data text"),
    ("arch", list(model.ARCHS), "mamba2", "recurrent architecture"),
    ("size", str, "tiny", "a preset of model.PRESETS"),
    ("init-from", str, None, "post-train this: a run directory, an official Mamba one, its hub id (GPU.md)"),
    ("data", str, "stdlib", "stdlib, text (a file, a dir, its cache), markov:k=8 (post-training: parent's)"),
    ("tokenizer", str, "bytes", "bytes, gpt2 (tiktoken's, or another of its encodings), PATH/x.tiktoken or "
     "PATH/tokenizer.json (post-training: the parent's)"),
    ("seq-len", int, 64, "T_train (post-training: the parent's)"),
    ("batch-size", int, 16, "sequences per micro-batch and process"),
    ("grad-accum", int, 1, "micro-batches per optimizer step and process; each is a batch for the strategy"),
    ("steps", int, 1500, "optimizer steps"),
    ("tokens", float, None, "a token budget instead of --steps (e.g. 5e6)"),
    ("lr", float, None, "peak lr (default: PEAK_LR of the size; post-training: a tenth of the parent's)"),
    ("min-lr", float, 1e-5, "end of the cosine decay"),
    ("warmup", float, 0.1, "fraction of the steps of linear warm-up"),
    ("weight-decay", float, 0.01, "AdamW weight decay of the matrices"),
    ("grad-clip", float, 1.0, "gradient norm clip (inf: none)"),
    ("out", str, "out", "run directory (a UTF-8 path); a new run needs one without ckpt.pt"),
    ("resume", bool, False, "resume --out as configured (--steps, intervals, --lr, --grad-clip may change)"),
    ("ckpt-interval", int, 250, "checkpoint every N steps and at the end"),
    ("eval-interval", int, 250, "validation loss every N steps"),
    ("eval-batches", int, 8, "validation batches per evaluation"),
    ("seed", int, 0, "seed of the model's init and the strategy's draws (noise, SP's resets)"),
    ("data-seed", int, None, "seed of the training batches (default: --seed; post-training: the parent's)"),
    ("split-seed", int, 0, "seed of a Markov corpus (post-training: parent's); text has one fixed split"),
    ("cache-dir", str, None, "text --data tokenized once, here (default: $LENGTHGEN_CACHE_DIR, data_cache)"),
    ("device", str, "auto", "auto (CUDA when present), cpu, cuda, cuda:1 ... (torchrun: LOCAL_RANK's GPU)"),
    ("dist-timeout", float, 600, "torchrun: seconds a process waits for the others (one frozen or ended, or "
     "rank 0 tokenizing --data) before the run ends"),
    ("stop-at", int, None, "stop after this step as if killed (to test --resume)"),
    ("quiet", bool, False, "no progress bar"),
    ("demo", bool, False, "the demo in OUT/demo, minutes a seed (with --out, --seed(s), --device, --quiet): "
     "Fig. 5, the failure and the four interventions; --arch X [--size S]: on X's S (tiny), in OUT/demo-X-S"),
    ("seeds", str, None, "--demo: training seeds, e.g. 0-7 or 0,5: a demo each, then the summary over seeds")]
DEFAULTS = {name.replace("-", "_"): default for name, _, default, _ in FLAGS}
DEMO_FLAGS = ("demo", "out", "seed", "seeds", "device", "quiet", "arch", "size")   # what --demo takes
# May change on resume: the length, divergence remedies (not resumed at all: runs.PER_INVOCATION).
MAY_CHANGE = ("steps", "ckpt_interval", "eval_interval", "lr", "grad_clip")
INHERITED = ("data", "tokenizer", "seq_len", "split_seed", "arch", "size")   # post-training: the parent's

def get_args(argv=None, description=None):
    """Parse the flags, fill in each one not given: on --resume the checkpoint's (a given flag must agree, but
    MAY_CHANGE); post-training the parent's data, tokenizer, seq_len, peak lr / 10 (App. B); then DEFAULTS."""
    args = make_parser(description).parse_args(argv)
    given = {k for k, v in vars(args).items() if v is not None}
    exit_on_bad_command_line(args, given)
    if args.demo:   # its own flags only: --arch, --size not given (None): the demo's own (plumbing/demo.py)
        unset = [k for k in DEMO_FLAGS if k not in ("arch", "size") and getattr(args, k) is None]
        vars(args).update({k: DEFAULTS[k] for k in unset})
        return args
    if args.resume:
        take_checkpoint_flags(args, given)
    parent = parent_flags(args.init_from) if args.init_from and not args.resume else {}
    exit_on_official_without_seq_len(args, given)
    vars(args).update({k: parent.get(k, default) if k in INHERITED else default   # args.json: what is used
                       for k, default in DEFAULTS.items() if getattr(args, k) is None})
    if args.data_seed is None:  # post-training reads on in its parent's stream (read_on)
        args.data_seed = parent.get("data_seed", parent.get("seed", args.seed))
    args.run_id = getattr(args, "run_id", None) or os.urandom(6).hex()   # (resumed: the checkpoint's)
    if not args.resume:
        set_lr(args, given, parent)
        set_steps_of_tokens(args)
    exit_on_flags_that_do_not_apply(args, given)
    return args

def exit_on_official_without_seq_len(args, given):
    """Post-training an official checkpoint needs --seq-len: its config.json does not state T_train."""
    folder = checkpoints.resolve(args.init_from) if args.init_from else None   # a hub id: its cached folder
    official = folder and os.path.isfile(os.path.join(folder, "config.json"))
    if official and not args.resume and "seq_len" not in given:
        sys.exit(f"error: {args.init_from} is an official checkpoint, whose config.json does not state the "
                 "length it was trained at: pass --seq-len T_train (the official Mamba checkpoints: 2048)")

def make_parser(description):
    """FLAGS as argparse flags; each defaults to None, so that get_args knows which were given."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.error = lambda message: sys.exit(f"error: {message} (see python train.py --help)")
    for name, kind, default, help in FLAGS:
        kw = ({"action": "store_true"} if kind is bool else
              {"choices": kind} if isinstance(kind, list) else {"type": kind})
        if default:
            help += f" (default {default})"
        p.add_argument("--" + name, default=None, help=help, **kw)
    return p

def exit_on_bad_command_line(args, given):
    """Flags that do not go together, and an --out no checkpoint could be read back from."""
    # '' or a name of bytes not UTF-8 (argv holds them as lone surrogates, which encode() drops)
    utf8 = args.out is None or args.out.encode(errors="ignore").decode() == args.out
    alone = " ".join(f"--{a.replace('_', '-')}" for a in sorted(given - set(DEMO_FLAGS)))
    empty = " ".join(f"--{a.replace('_', '-')}" for a in sorted(given) if getattr(args, a) == "")
    for bad, message in [
            (args.out == "" or not utf8, "--out must be a non-empty UTF-8 path (torch reads no checkpoint "
             f"back from another name), got {args.out!r}"),
            (empty, f"{empty} '': pass a value, or leave the flag out"),
            (args.demo and alone, f"--demo sets its training flags itself (a rerun goes on): drop {alone}"),
            (args.demo and "RANK" in os.environ, "--demo runs in one process: start it with python, not "
             "torchrun"),
            (args.seeds and not args.demo, "--seeds is for --demo: a training run takes one --seed"),
            ({"seed", "seeds"} <= given, "--seed and --seeds both: pass one"),
            ({"steps", "tokens"} <= given, "--steps and --tokens both set the length: pass one"),
            (args.init_from and not args.resume and {"arch", "size"} & given,
             "the architecture and size come from --init-from: drop --arch and --size")]:
        if bad:
            sys.exit(f"error: {message}")

def exit_on_flags_that_do_not_apply(args, given):
    """A flag given where it changes nothing is refused: ignoring it would run something else than asked."""
    strategy = strategy_options.OPTIONS[args.init_state]   # its options: checked as make_strategy checks them
    strategy_options.check_options(args.init_state, **{k: vars(args)[k] for k in ("sigma", "p_reset")
                                                        if k in given or k in strategy})
    markov = args.data.startswith("markov:")
    for flag, applies, where in [
            ("data", args.task in ("lm", "babilong"), "--task lm or babilong (passkey and copy make theirs)"),
            ("copy_len", args.task == "copy", "--task copy"),
            ("babi_tasks", args.task == "babilong", "--task babilong"),
            ("split_seed", markov and args.task == "lm", "--data markov:... (text has one fixed split)"),
            ("dist_timeout", "RANK" in os.environ, "torchrun's processes (RANK set)")]:
        if flag in given and not applies:
            sys.exit(f"error: --{flag.replace('_', '-')} applies only to {where}: drop it")

def take_checkpoint_flags(args, given):
    """--resume: each flag not given (but runs.PER_INVOCATION) is the checkpoint's; a given one must agree."""
    out = args.out or DEFAULTS["out"]
    ckpt = checkpoints.ckpt_file(out)
    if not os.path.isdir(out) or not os.path.lexists(ckpt):
        sys.exit(f"error: --resume but {out}/ckpt.pt does not exist: start without --resume, or fix --out")
    saved = checkpoints.train_config(ckpt)
    if not saved:
        sys.exit(f"error: --resume but {out}/ckpt.pt holds no train_config: it is not a checkpoint of "
                 "train.py, and cannot be resumed: start a new run with another --out")
    differ = [f"--{k.replace('_', '-')} {saved[k]} (given {getattr(args, k)})" for k in sorted(given)
              if k in saved and k not in runs.PER_INVOCATION + MAY_CHANGE and saved[k] != getattr(args, k)]
    if differ:
        sys.exit(f"error: --resume continues {out} as it was configured, but these flags differ: "
                 f"{'; '.join(differ)}. Drop them, or start a new run with another --out")
    vars(args).update({k: v for k, v in saved.items() if k not in given and k not in runs.PER_INVOCATION})

def parent_flags(init_from):
    """What post-training inherits: the parent run's flags; an official one's arch and its shape's preset."""
    parent = checkpoints.train_config(init_from)
    folder = checkpoints.resolve(init_from)   # a hub id: its cached folder
    if os.path.isfile(os.path.join(folder, "config.json")):
        _, c = checkpoints.read_official(folder)
        shape = (c["d_model"], c["n_layer"])
        sizes = [s for s, q in model.PRESETS[c["arch"]].items() if (q["d_model"], q["n_layer"]) == shape]
        parent = {**parent, "arch": c["arch"], "size": sizes[0] if sizes else None}
    return parent

def set_lr(args, given, parent):
    """A new run's peak lr (--lr, post-training the parent's, else PEAK_LR), lr and min_lr."""
    args.peak_lr = (parent.get("peak_lr") if args.init_from else args.lr) or PEAK_LR.get(args.size, 3e-3)
    if args.lr is None:
        args.lr = args.peak_lr / 10 if args.init_from else args.peak_lr
    if "min_lr" not in given:
        args.min_lr = min(args.min_lr, args.lr)

def set_steps_of_tokens(args):
    """A new run's --tokens as --steps: the token budget over the tokens of a step."""
    if args.tokens is not None and math.isfinite(args.tokens):
        hi = args.copy_len.split(",")[-1]   # copy: the longest string twice + SEP + EOS (a bad one: refused)
        per_row = 2 * int(hi) + 2 if args.task == "copy" and hi.isdecimal() else args.seq_len
        processes = int(os.environ.get("WORLD_SIZE", 1)) if "RANK" in os.environ else 1   # torchrun's
        args.steps = max(1, int(args.tokens // (args.batch_size * processes * per_row * args.grad_accum)))

def exit_on_bad_flags(args):
    """Every flag's value, in one place: the first problem is one line naming the flag and the fix. Then one
    --task example."""
    problems = range_problems(args) + source_problems(args) + runs.out_problems(args) + task_problems(args)
    if any(bad for bad, _ in problems):
        sys.exit(f"error: {next(message for bad, message in problems if bad)}")
    if args.task != "lm":
        exit_on_bad_task(args)

def range_problems(args):
    """[(bad, message)] of the numbers (each in its range) and --device (a name torch reads)."""
    must = lambda k, ok, rule: (not ok, f"--{k.replace('_', '-')} must be {rule}, got {vars(args)[k]!r}")
    positive = "seq_len batch_size grad_accum steps ckpt_interval eval_interval eval_batches stop_at".split()
    return [must(k, vars(args)[k] is None or vars(args)[k] > 0, "a positive integer") for k in positive] + [
        must("batch_size", args.batch_size * args.seq_len <= 1 << 32, "at most 2**32 tokens / --seq-len"),
        *[must(k, 0 <= vars(args)[k] < 2**63, "in [0, 2**63)") for k in ("seed", "data_seed", "split_seed")],
        must("device", re.fullmatch(r"auto|cpu|cuda(:\d+)?", args.device), "auto, cpu, cuda or cuda:N"),
        must("tokens", args.tokens is None or 0 < args.tokens < math.inf, "a finite number > 0"),
        must("lr", 0 < args.lr <= 1e3, "in (0, 1e3]"),
        must("min_lr", 0 <= args.min_lr <= args.lr, f"in [0, --lr] = [0, {args.lr:g}]"),
        must("warmup", 0 <= args.warmup < 1, "a fraction of the steps in [0, 1)"),
        must("weight_decay", 0 <= args.weight_decay < math.inf, "finite and >= 0"),
        must("grad_clip", args.grad_clip > 0, "> 0 (inf: no clipping)"),
        must("dist_timeout", 1 <= args.dist_timeout <= 1e7, "in [1, 1e7] seconds")]

def source_problems(args):
    """[(bad, message)] of the model trained (--size, --init-from), --out (a folder) and --device (here)."""
    same = (args.out, checkpoints.ckpt_file(args.out))
    same_run = args.init_from and os.path.realpath(args.init_from) in map(os.path.realpath, same)
    return [
        (not args.init_from and args.size not in model.PRESETS[args.arch], f"unknown --size {args.size!r} "
         f"for --arch {args.arch}: choose one of {list(model.PRESETS[args.arch])}"),
        # a resume: its ckpt.pt alone; a hub id: its folder in the Hugging Face cache
        (args.init_from and not args.resume and not os.path.exists(checkpoints.resolve(args.init_from)),
         f"--init-from {args.init_from} does not exist"),
        (same_run, f"--init-from and --out are the same run ({args.out}): post-training needs another --out"),
        (os.path.exists(args.out) and not os.path.isdir(args.out),
         f"--out {args.out} is a file, not a directory"),
        (args.device.startswith("cuda") and not torch.cuda.is_available(), "no CUDA here: use --device cpu")]

def task_problems(args):
    """[(bad, message)] of --task and its flags."""
    lo, _, hi = (int(v) if v.isdigit() else 0 for v in args.copy_len.partition(","))   # 0: not a number
    bad_babi = [t for t in args.babi_tasks.split(",") if t not in tasks.BABI_TASKS]
    return [
        (args.task != "lm" and (args.init_state == "tbtt" or args.streams), "--init-state tbtt and --streams "
         f"read documents in chunks; --task {args.task} examples are independent"),
        (not 0 < lo <= hi, "--copy-len must be LO,HI, 0 < LO <= HI"),
        (bad_babi, f"unknown --babi-tasks {bad_babi}: choose from {','.join(tasks.BABI_TASKS)}")]

def exit_on_bad_task(args):
    """One --task example now: a --seq-len too short for the task, or a --tokenizer, is a clear error."""
    try:
        make_task_sampler(args, 0, None).next_samples()
    except ValueError as e:
        sys.exit(f"error: --task {args.task}: {e}")

def make_task_sampler(args, seed, filler_tokens, rows=None):
    """Batches of `rows` (default --batch-size) --task examples of --seq-len + 1 tokens (bAbI's hidden in
    filler_tokens), or copy's."""
    babi = args.task == "babilong"
    kw = dict(babi_tasks=tuple(args.babi_tasks.split(",")), filler_tokens=filler_tokens) if babi else {}
    length = tuple(map(int, args.copy_len.split(","))) if args.task == "copy" else args.seq_len + 1
    task_fn = tasks.babi_mixture if babi else tasks.TASKS[args.task]
    return data.TaskSampler(task_fn, rows or args.batch_size, seed, tokenizer=args.tokenizer, length=length,
                            **kw)

def require_what_was_read(args, read):
    """A resume reads the data and tokenizer its run read, post-training its parent's tokenizer: `read`
    ({tokenizer_id, data_id}) must match what the run's or the parent's checkpoint recorded."""
    saved = vars(args) if args.resume else {}
    if args.init_from and not args.resume:
        saved = {"tokenizer_id": checkpoints.train_config(args.init_from).get("tokenizer_id")}
    for key, flag, fix in [("tokenizer_id", "--tokenizer", "pass the --tokenizer it was trained with"),
                           ("data_id", "--data", "restore its files, or start a new run")]:
        given = f"{flag} {vars(args)[flag[2:]]} ({read[key]})"
        files.require(saved.get(key) in (None, read[key]), f"{given} does not match "
                      f"{args.out if args.resume else args.init_from}'s {saved.get(key)}: {fix}")

def parse_seeds(text):
    """--seeds "0-7" -> [0, ..., 7]; "0,5" -> [0, 5]; else one line naming the flag."""
    lo, dash, hi = text.partition("-")
    if dash and lo.isdecimal() and hi.isdecimal():
        seeds = list(range(int(lo), int(hi) + 1))
    else:
        seeds = files.int_list(text, minimum=0)
    if not seeds:
        sys.exit(f"error: --seeds must be A-B or A,B,... (distinct integers >= 0), got {text!r}")
    return seeds
