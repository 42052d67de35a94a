"""
The one training script: from scratch, or post-training a checkpoint, with a chosen initial state.

    python train.py --init-state sp                      # the CPU default: tiny Mamba-2, stdlib bytes
    python train.py --init-from out/base --init-state sp --steps 300   # post-training (lr = peak/10)
    python train.py --init-from PATH/mamba2-370m --data corpus.bin --tokenizer PATH/tokenizer.json \
        --init-state sp --steps 100 --grad-accum 32      # the paper's Fig. 5 on an official checkpoint
    torchrun --nproc_per_node 2 train.py --init-state sp               # DistributedDataParallel

The interventions differ only in where each training sequence's initial state comes from
(interventions.py); the rest is Appendix B's recipe. Batches are random windows of --data, except for
tbtt and --streams (each row reads one document in chunks) and --task (independent examples).
A run directory (--out) holds ckpt.pt (all a resume needs to continue exactly, replaced atomically and
only with finite weights), metrics.jsonl and args.json; one train.py at a time writes it (train.lock).
"""
import argparse
import fcntl
import json
import math
import os
import pathlib
import sys
import time
from contextlib import contextmanager, nullcontext
from dataclasses import asdict

import torch
import torch.nn.functional as F
from tqdm import tqdm

import interventions
import model
import tasks

# Peak learning rates of the presets (from scratch): the paper's Table 2 for its sizes, the tiny CPU
# presets tuned here. Post-training (--init-from) uses a tenth of the checkpoint's peak, as the paper.
PEAK_LR = {"tiny": 3e-3, "45m": 1.5e-3, "70m": 1.5e-3, "85m": 1.5e-3, "125m": 1e-3, "130m": 1e-3,
           "370m": 7.5e-4, "780m": 5e-4, "1.3b": 4e-4}
# Every flag: name, type (a list: the choices; bool: a switch), default, help. The parser's defaults are
# None, so that a flag given explicitly is known; resolve() fills in the rest, in one place.
FLAGS = [
    ("init-state", list(interventions.STRATEGIES), "sp", "initial state of each training sequence (interventions.py)"),
    ("sigma", float, 0.1, "std of the random initial state (--init-state random)"),
    ("p-reset", float, 0.1, "SP: probability that a row restarts from zero"),
    ("streams", bool, False, "read --data as TBTT does, each row one document in order, with any --init-state: "
     "--init-state zero --streams is TBTT's control (the same data from the zero state)"),
    ("task", ["lm"] + list(tasks.TASKS), "lm", "lm: next-token prediction on --data; the paper's Sec. 5 tasks "
     "(passkey: the paper uses --init-state fitted): loss on the answer tokens only"),
    ("copy-len", str, "50,100", "--task copy: inclusive range LO,HI of the string length"),
    ("babi-tasks", str, ",".join(tasks.BABI_TASKS), "--task babilong: bAbI tasks hidden in --data text"),
    ("arch", list(model.ARCHS), "mamba2", "recurrent architecture"),
    ("size", str, "tiny", "preset size, see model.PRESETS (tiny, 45m, 85m, 125m, 130m, 370m, ...)"),
    ("init-from", str, None, "post-train this checkpoint: a run directory, or an official state-spaces/mamba dir"),
    ("data", str, "stdlib", "stdlib, a text file/dir/glob, a .bin of tokens or a process like markov:k=8 (tasks.py); "
     "with --init-from, the checkpoint's"),
    ("tokenizer", str, "bytes", "bytes, a tiktoken name (gpt2, ...) or a tokenizer.json (GPT-NeoX, for official "
     "Mamba checkpoints); with --init-from, the checkpoint's"),
    ("seq-len", int, 64, "T_train, the training sequence length; with --init-from, the checkpoint's"),
    ("batch-size", int, 16, "sequences per micro-batch (per process)"),
    ("grad-accum", int, 1, "micro-batches per optimizer step (paper: ~0.5M tokens a step); each is a batch for SP"),
    ("steps", int, 1500, "optimizer steps"),
    ("tokens", float, None, "token budget instead of --steps (e.g. 5e6)"),
    ("lr", float, None, "peak learning rate (default: the preset's; with --init-from, a tenth of the checkpoint's, "
     "for an official one of the paper's for its size: Mamba-2 370m 7.5e-4, 780m 5e-4, 1.3b 4e-4)"),
    ("min-lr", float, 1e-5, "end of the cosine decay (at most --lr)"),
    ("warmup", float, 0.1, "fraction of steps of linear warm-up"),
    ("weight-decay", float, 0.01, "AdamW weight decay of the matrices"),
    ("grad-clip", float, 1.0, "clip the gradient norm to this (inf: no clipping)"),
    ("out", str, "out", "run directory (ckpt.pt, metrics.jsonl, args.json); a new run needs one without ckpt.pt"),
    ("resume", bool, False, "continue the run in --out exactly, as configured (may change: --steps, "
     "--ckpt-interval, --eval-interval, --lr, --grad-clip)"),
    ("ckpt-interval", int, 250, "save a checkpoint every N steps (and at the end)"),
    ("eval-interval", int, 250, "validation loss every N steps"),
    ("eval-batches", int, 8, "batches of validation windows per evaluation"),
    ("seed", int, 0, "seed of the model, the data order and the strategy"),
    ("device", str, "auto", "auto (CUDA when present), cpu, cuda, cuda:1 ..."),
    ("compile", bool, False, "torch.compile the model"),
    ("stop-at", int, None, "stop after this step as if killed (to test --resume)"),
    ("quiet", bool, False, "no progress bar"),
    ("demo", bool, False, "the failure-and-fix demo (a few CPU minutes): a zero-state tiny Mamba-1 at T_train=16 on "
     "stdlib bytes, then control, SP and TBTT post-training, evaluated to 64x T_train. Uses only --out, --seed, "
     "--device, --quiet"),
]
DEFAULTS = {name.replace("-", "_"): default for name, _, default, _ in FLAGS}
# A resumed run takes its configuration from the checkpoint. These flags describe one invocation, not
# the run; these may change on resume (the schedule's length, and the remedies for a divergence).
PER_INVOCATION = ("out", "resume", "stop_at", "device", "compile", "quiet", "demo")
MAY_CHANGE = ("steps", "ckpt_interval", "eval_interval", "lr", "grad_clip")


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.error = lambda message: sys.exit(f"error: {message} (see python train.py --help)")
    for name, kind, default, help in FLAGS:
        kw = dict(action="store_true") if kind is bool else \
            dict(choices=kind) if isinstance(kind, list) else dict(type=kind)
        p.add_argument("--" + name, default=None, help=help + (f" (default {default})" if default else ""), **kw)
    args = p.parse_args(argv)
    resolve(args)
    if not args.demo:
        check(args)
    return args


def resolve(args):
    """Every flag not given gets its value here. A resumed run: the checkpoint's (an explicit flag must agree,
    except MAY_CHANGE). Post-training: data, tokenizer and seq_len of the parent, and a tenth of the peak lr
    the parent was trained with (paper, App. B). Then DEFAULTS."""
    given = {k for k, v in vars(args).items() if v is not None}
    out = args.out or DEFAULTS["out"]
    if args.resume and not args.demo:
        saved = model.train_config(os.path.join(out, "ckpt.pt"))
        if not saved:
            sys.exit(f"error: --resume but {out}/ckpt.pt does not exist: start without --resume, or fix --out")
        differ = [f"--{k.replace('_', '-')} {saved[k]} (given {getattr(args, k)})" for k in sorted(given)
                  if k in saved and k not in PER_INVOCATION + MAY_CHANGE and saved[k] != getattr(args, k)]
        if differ:
            sys.exit(f"error: --resume continues {out} as it was configured, but these flags differ: "
                     f"{'; '.join(differ)}. Drop them, or start a new run with another --out")
        vars(args).update({k: v for k, v in saved.items() if k not in given and k not in PER_INVOCATION})
    parent = model.train_config(args.init_from) if args.init_from and not args.resume else {}
    for k, v in DEFAULTS.items():
        if getattr(args, k) is None:
            setattr(args, k, parent.get(k, v) if k in ("data", "tokenizer", "seq_len") else v)
    if not args.resume:
        official = args.init_from and os.path.isfile(os.path.join(args.init_from, "config.json"))
        cfg = model.official_config(args.init_from) if official else None
        size = next((s for s, p in model.PRESETS["mamba2" if cfg is None else cfg.arch].items()
                     if cfg and (cfg.d_model, cfg.n_layer) == (p["d_model"], p["n_layer"])), args.size)
        own_lr = args.lr if not args.init_from else None  # from scratch, an explicit --lr is the peak
        args.peak_lr = parent.get("peak_lr") or (own_lr if own_lr is not None else PEAK_LR.get(size, 3e-3))
        args.lr = args.lr if args.lr is not None else args.peak_lr / (10 if args.init_from else 1)
        args.min_lr = args.min_lr if "min_lr" in given else min(args.min_lr, args.lr)
        if args.tokens is not None and math.isfinite(args.tokens):
            per_row = args.seq_len if args.task != "copy" else 2 * int(args.copy_len.split(",")[-1]) + 2
            per_step = args.batch_size * per_row * int(os.environ.get("WORLD_SIZE", 1)) * args.grad_accum
            args.steps = max(1, int(args.tokens // per_step))


def check(args):
    """Every flag's value, in one place: the first problem is one line naming the flag and the fix."""
    fin = lambda v: v is not None and math.isfinite(v)
    positive = ("seq_len", "batch_size", "grad_accum", "steps", "ckpt_interval", "eval_interval", "eval_batches")
    rules = [(k, getattr(args, k) > 0, "a positive integer") for k in positive] + [
        ("stop_at", args.stop_at is None or args.stop_at > 0, "a positive integer"),
        ("seed", args.seed >= 0, "an integer >= 0"),
        ("tokens", args.tokens is None or fin(args.tokens) and args.tokens > 0, "a finite number > 0"),
        ("lr", fin(args.lr) and args.lr > 0, "finite and > 0"),
        ("min_lr", 0 <= args.min_lr <= args.lr, f"in [0, --lr] = [0, {args.lr:g}]"),
        ("warmup", 0 <= args.warmup < 1, "a fraction of the steps in [0, 1)"),
        ("weight_decay", fin(args.weight_decay) and args.weight_decay >= 0, "finite and >= 0"),
        ("grad_clip", args.grad_clip > 0, "> 0 (inf: no clipping)"),
        ("sigma", fin(args.sigma) and args.sigma > 0, "finite and > 0"),
        ("p_reset", 0 <= args.p_reset <= 1, "a probability in [0, 1]")]
    problems = [f"--{k.replace('_', '-')} must be {what}, got {getattr(args, k)}" for k, ok, what in rules if not ok]
    lo, _, hi = args.copy_len.partition(",")
    bad_babi = [t for t in args.babi_tasks.split(",") if t not in tasks.BABI_TASKS]
    ckpt, real = os.path.join(args.out, "ckpt.pt"), os.path.realpath
    problems += [message for bad, message in [
        (not args.init_from and args.size not in model.PRESETS[args.arch],
         f"unknown --size {args.size!r} for --arch {args.arch}: choose one of {list(model.PRESETS[args.arch])}"),
        (args.init_from and not os.path.exists(args.init_from), f"--init-from {args.init_from} does not exist"),
        (args.init_from and real(args.init_from) in (real(args.out), real(ckpt)),
         f"--init-from and --out are the same run ({args.out}): post-training writes a new run, pass another --out"),
        (os.path.exists(args.out) and not os.path.isdir(args.out), f"--out {args.out} is a file, not a directory"),
        (not args.resume and os.path.exists(ckpt), f"{args.out} holds a run: --resume to continue it, or another --out"),
        (args.task != "lm" and (args.init_state == "tbtt" or args.streams), f"--init-state tbtt and --streams need "
         f"consecutive chunks of long documents, but --task {args.task} examples are independent"),
        (not (lo.isdigit() and hi.isdigit() and 1 <= int(lo) <= int(hi)), "--copy-len must be LO,HI, 1 <= LO <= HI"),
        (bad_babi, f"unknown --babi-tasks {bad_babi}: use a comma-separated subset of {','.join(tasks.BABI_TASKS)}"),
    ] if bad]
    if problems:
        sys.exit(f"error: {problems[0]}")
    try:  # one example, so that a --seq-len too short for the task is a clear error now
        _ = args.task in ("passkey", "babilong") and make_task_sampler(args, 0, None).next_samples()
    except ValueError as e:
        sys.exit(f"error: --seq-len {args.seq_len} is too short for --task {args.task}: {e}")


def main(argv=None):
    try:
        args = get_args(argv)
        if args.demo:
            return demo(os.path.join(args.out, "demo"), seed=args.seed, device=args.device, quiet=args.quiet)
        return train(args)
    except (OSError, ValueError, tasks.TokenizerUnavailableError) as e:  # bad input: one line, no traceback
        sys.exit(f"error: {e}")


def accumulate_gradients(fwd, sampler, strategy, n_micro, device, autocast=nullcontext(), no_sync=False):
    """The gradients of one optimizer step: the paper's loop. Each micro-batch is a batch for the strategy;
    its loss is divided by n_micro (the gradient of the mean). no_sync (DDP): all-reduce on the last one."""
    total, tokens = 0.0, 0
    for micro in range(n_micro):
        x, y, *new_doc = sampler.next_batch()  # DocumentStreams also says which rows start a new document
        batch = {"x": x.to(device), "y": y.to(device), "new_doc": new_doc[0] if new_doc else None}
        initial_state = strategy.initial_state(batch)
        with fwd.no_sync() if no_sync and micro < n_micro - 1 else nullcontext():
            with autocast:
                logits, final_state = fwd(batch["x"], state=initial_state)
                # task batches mark every non-answer target -100: the mean over the answer tokens
                loss = F.cross_entropy(logits.float().flatten(0, 1), batch["y"].flatten(), ignore_index=-100)
            (loss / n_micro).backward()
        strategy.observe(final_state)
        total, tokens = total + loss.item(), tokens + x.numel()
    return total / n_micro, tokens


def train(args):
    ddp, rank, world = "RANK" in os.environ, 0, 1
    if ddp:  # one process per device; every rank keeps its own sampler and strategy state, as one process would
        torch.distributed.init_process_group("nccl" if torch.cuda.is_available() and args.device != "cpu" else "gloo")
        rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    device, master = pick_device(args.device, rank), rank == 0
    os.makedirs(args.out, exist_ok=True)

    # --- data ---------------------------------------------------------------------------------------------
    data = tasks.load_data(args.data, args.tokenizer, args.seed) if args.task in ("lm", "babilong") else None
    if args.task == "lm":
        Sampler = tasks.DocumentStreams if args.init_state == "tbtt" or args.streams else tasks.RandomWindows
        eot = (data.eot_token,) if Sampler is tasks.DocumentStreams else ()
        sampler = Sampler(data.train, *eot, args.batch_size, args.seq_len, args.seed + rank)
        val_sampler = tasks.RandomWindows(data.val, args.batch_size, args.seq_len, 10_000 + args.seed)
    else:  # babilong hides its stories in --data text (train / val split); passkey and copy bring their own
        if data is not None and data.tokenizer is None:
            raise ValueError(f"--task babilong hides its stories in --data text, but {data.name} is not text")
        sampler = make_task_sampler(args, args.seed + rank, data and data.train)
        val_sampler = make_task_sampler(args, 10_000 + args.seed, data and data.val)
    vocab_size = data.vocab_size if data else tasks.get_tokenizer(args.tokenizer).n_vocab
    val_state0 = val_sampler.state_dict()  # the same validation batches at every evaluation

    # --- model, optimizer, strategy -------------------------------------------------------------------------
    ckpt_path, step = os.path.join(args.out, "ckpt.pt"), 0
    torch.manual_seed(args.seed)
    resume = load_checkpoint(ckpt_path, world, device) if args.resume else None
    if resume:
        lm = model.LM(model.ModelConfig(**resume["model_config"]))
        lm.load_state_dict(resume["model"])
    else:
        lm = model.from_pretrained(args.init_from) if args.init_from else \
            model.LM(model.make_config(args.arch, args.size, vocab_size=vocab_size))
    args.arch = lm.cfg.arch
    if lm.cfg.vocab_size < vocab_size:
        raise ValueError(f"the model's vocabulary ({lm.cfg.vocab_size}) is smaller than the data's ({vocab_size}): "
                         f"use the tokenizer the model was trained with")
    optimizer = make_optimizer(lm.to(device), args.lr, args.weight_decay, device)
    strategy = interventions.make_strategy(args.init_state, lm, args.batch_size, sigma=args.sigma,
                                           p_reset=args.p_reset, seed=args.seed + rank)
    if resume:
        step = resume["step"]
        optimizer.load_state_dict(resume["optimizer"])
        sampler.load_state_dict(resume["sampler"][rank])
        strategy.load_state_dict(resume["strategy"][rank])
    fwd = torch.compile(lm) if args.compile else lm
    if ddp:
        fwd = torch.nn.parallel.DistributedDataParallel(fwd, device_ids=[device.index] if device.type == "cuda" else None)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()
    if master:
        print(f"{lm.extra_repr()}; data {data.name if data else args.task} (vocab {vocab_size}); {args.steps} steps x "
              f"{args.grad_accum * args.batch_size * world} x {args.seq_len} tokens; init-state {args.init_state}"
              f"{' on document streams' if args.streams else ''}; lr {args.lr:g}; device {device}"
              + (f"; resuming {ckpt_path} at step {step}" if resume else ""))

    # --- the loop -------------------------------------------------------------------------------------------
    with run_lock(args.out) if master else nullcontext():
        if master:
            with open(os.path.join(args.out, "args.json"), "w") as f:
                json.dump(vars(args), f, indent=1)
            log = keep_metrics_until(os.path.join(args.out, "metrics.jsonl"), step)
        bar = tqdm(total=args.steps, initial=step, disable=args.quiet or not master, file=sys.stdout)
        t0, start, saved_step = time.time(), step, step if resume else None
        lm.train()
        while step < args.steps:
            lr = lr_at(step, args)
            for group in optimizer.param_groups:
                group["lr"] = lr * group["lr_scale"]
            optimizer.zero_grad(set_to_none=True)
            loss, tokens = accumulate_gradients(fwd, sampler, strategy, args.grad_accum, device, autocast, no_sync=ddp)
            grad_norm = torch.nn.utils.clip_grad_norm_(lm.parameters(), args.grad_clip).item()
            if not (math.isfinite(loss) and math.isfinite(grad_norm)):
                diverged(args, step + 1, f"loss {loss:g}, gradient norm {grad_norm:g}", saved_step)
            optimizer.step()
            step += 1
            record = {"step": step, "loss": loss, "lr": lr, "grad_norm": grad_norm,
                      "tokens_per_s": tokens * world * (step - start) / max(time.time() - t0, 1e-9)}
            if step % args.eval_interval == 0 or step == args.steps:
                val_sampler.load_state_dict(val_state0)
                record["val_loss"] = evaluate_loss(lm, val_sampler, args.eval_batches, device, autocast)
            if master:
                log.write(json.dumps(record) + "\n")
                log.flush()
                bar.set_postfix({k: f"{record[k]:.3g}" for k in ("loss", "val_loss", "tokens_per_s") if k in record})
                bar.update(1)
            if step % args.ckpt_interval == 0 or step == args.steps:
                val_sampler.load_state_dict(val_state0)  # only weights with a finite validation loss are saved
                if not math.isfinite(record.get("val_loss") or evaluate_loss(lm, val_sampler, args.eval_batches,
                                                                             device, autocast)):
                    diverged(args, step, "the validation loss", saved_step)
                save_checkpoint(ckpt_path, lm, optimizer, step, args, sampler, strategy, rank, world)
                saved_step = step
            if args.stop_at is not None and step >= args.stop_at:
                break
        bar.close()
        if master:
            log.close()
            print(f"done: step {step}, {time.time() - t0:.0f}s, checkpoint {ckpt_path}")
    if ddp:
        torch.distributed.destroy_process_group()
    return lm


# --- the demo -------------------------------------------------------------------------------------------

# A tiny Mamba-1 whose state channels barely decay within T_train (model.PRESETS "tiny-slow") trained from
# the zero state on Python source bytes at T_train = 16: past T_train its state drifts into values it never
# learned to read and perplexity rises (the paper's failure). Then 10% more steps three ways: the zero state
# again (the matched control), State Passing and TBTT. docs/RESULTS.md has the measured numbers.
DEMO = dict(arch="mamba1", size="tiny-slow", data="stdlib", seq_len=16, batch_size=16, base_steps=1500,
            post_steps=150, eval_len=1024, n_seqs=64)


def demo(out, seed=0, device="auto", quiet=False, **overrides):
    """Failure and fix in one command: a zero-state base, post-trained three ways, evaluated to 64 x T_train."""
    import evaluate
    if os.path.exists(os.path.join(out, "base")):
        sys.exit(f"error: {out} holds an earlier demo: remove it, or pass another --out")
    d = {**DEMO, **overrides}  # tests shrink it
    common = ["--data", d["data"], "--seq-len", str(d["seq_len"]), "--batch-size", str(d["batch_size"]),
              "--seed", str(seed), "--device", device, "--eval-interval", "100000"] + (["--quiet"] if quiet else [])
    runs = {label: os.path.join(out, label) for label in ("base", "control", "SP", "TBTT")}
    print(f"demo 1/4: base, zero initial state, {d['base_steps']} steps at T_train = {d['seq_len']}")
    main(common + ["--arch", d["arch"], "--size", d["size"], "--init-state", "zero", "--steps", str(d["base_steps"]),
                   "--out", runs["base"]])
    for i, (label, strategy) in enumerate([("control", "zero"), ("SP", "sp"), ("TBTT", "tbtt")]):
        print(f"demo {i + 2}/4: post-training the base {d['post_steps']} steps with --init-state {strategy} ({label})")
        main(common + ["--init-from", runs["base"], "--init-state", strategy, "--steps", str(d["post_steps"]),
                       "--out", runs[label]])
    return evaluate.main(list(runs.values()) + ["--labels", *runs, "--metrics", "ppl,state", "--reference", "control",
                                                "--eval-len", str(d["eval_len"]), "--n-seqs", str(d["n_seqs"]),
                                                "--seed", str(seed), "--device", device, "--out", out])


# --- helpers --------------------------------------------------------------------------------------------

def lr_at(step, args):
    """Linear warm-up over the first `warmup` fraction of steps, then cosine decay to min_lr."""
    warm = int(args.warmup * args.steps)
    if step < warm:
        return args.lr * (step + 1) / warm
    progress = (step - warm) / max(1, args.steps - warm)
    return args.min_lr + 0.5 * (args.lr - args.min_lr) * (1 + math.cos(math.pi * min(1.0, progress)))


def make_optimizer(lm, lr, weight_decay, device):
    """AdamW. Weight decay on matrices only: not norms, biases, nor parameters marked _no_weight_decay (the
    SSM's A_log / D / dt_bias, RWKV's decays and mixes). A parameter marked _lr_scale (RWKV-6's time_decay:
    2.0, as the official code) trains at lr * scale: its group keeps the scale, the loop applies it."""
    groups = {}
    for p in lm.parameters():
        no_decay = p.dim() < 2 or getattr(p, "_no_weight_decay", False)
        groups.setdefault((0.0 if no_decay else weight_decay, getattr(p, "_lr_scale", 1.0)), []).append(p)
    return torch.optim.AdamW([{"params": ps, "weight_decay": wd, "lr_scale": s, "lr": lr * s}
                              for (wd, s), ps in groups.items()], lr=lr, betas=(0.9, 0.95), fused=device.type == "cuda")


def make_task_sampler(args, seed, filler_tokens):
    """Task examples of --seq-len + 1 tokens (passkey at a random depth; a story of --babi-tasks hidden in
    filler_tokens), or of strings of --copy-len symbols (copy)."""
    fn, kw = {"passkey": (tasks.passkey_sample, {}), "copy": (tasks.copy_sample, {}),
              "babilong": (tasks.babi_mixture, dict(babi_tasks=tuple(args.babi_tasks.split(",")),
                                                    filler_tokens=filler_tokens))}[args.task]
    length = tuple(map(int, args.copy_len.split(","))) if args.task == "copy" else args.seq_len + 1
    return tasks.TaskSampler(fn, args.batch_size, seed, tokenizer=args.tokenizer, length=length, **kw)


@torch.no_grad()
def evaluate_loss(lm, sampler, n_batches, device, autocast):
    """Mean next-token loss (tasks: per answer token) on validation batches, from the zero state."""
    lm.eval()
    total, count = 0.0, 0
    for _ in range(n_batches):
        x, y = (t.to(device) for t in sampler.next_batch()[:2])
        with autocast:
            logits, _ = lm(x)
        total += F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), ignore_index=-100, reduction="sum").item()
        count += int((y != -100).sum())
    lm.train()
    return total / count


def diverged(args, step, what, saved_step):
    last = (f"the last checkpoint, {args.out}/ckpt.pt (step {saved_step}), is intact: continue it with --resume "
            f"and a lower --lr" if saved_step else "no checkpoint was saved: start again with a lower --lr")
    sys.exit(f"error: training diverged at step {step} ({what} not finite); stopped without saving: {last}")


@contextmanager
def run_lock(out):
    """One writer per run directory. flock is released by the OS however the process ends (even kill -9),
    so a dead run never blocks the next one; the file names the holder's pid for the message."""
    with open(os.path.join(out, "train.lock"), "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            sys.exit(f"error: {out} is being written by another train.py (pid {f.read().strip()}): wait for it, "
                     f"or use another --out")
        f.truncate(0)
        f.write(f"{os.getpid()}\n")
        f.flush()
        yield


def keep_metrics_until(path, step):
    """metrics.jsonl opened to append, without the rows past `step`: a run killed after its last
    checkpoint logged steps that its resume redoes."""
    rows = [line for line in open(path) if line.endswith("}\n") and json.loads(line)["step"] <= step] \
        if os.path.exists(path) else []
    write_atomically(path, lambda tmp: pathlib.Path(tmp).write_text("".join(rows)))
    return open(path, "a")


def save_checkpoint(path, lm, optimizer, step, args, sampler, strategy, rank, world):
    # every rank's sampler and strategy state is gathered, so that a resume continues every rank exactly
    gathered = [{"sampler": sampler.state_dict(), "strategy": strategy.state_dict()}] * world
    if world > 1:
        torch.distributed.all_gather_object(gathered, gathered[0])
    if rank == 0:
        ckpt = {"model_config": asdict(lm.cfg), "model": lm.state_dict(), "optimizer": optimizer.state_dict(),
                "train_config": vars(args), "step": step, "sampler": [g["sampler"] for g in gathered],
                "strategy": [g["strategy"] for g in gathered]}
        write_atomically(path, lambda tmp: torch.save(ckpt, tmp))


def write_atomically(path, write):
    """write(tmp), then rename: a kill leaves the old file or the new one, never half of one. The temporary
    name is unique per process; a failed write (a full disk) removes it and is one line."""
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        write(tmp)
        os.replace(tmp, path)
    except (OSError, RuntimeError) as e:  # torch.save reports a full disk as a RuntimeError
        sys.exit(f"error: cannot write {path} ({str(e).splitlines()[0]}; disk full?): the previous one is intact")
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def load_checkpoint(path, world, device):
    ckpt = model.read_checkpoint(path, device)
    if not all(k in ckpt for k in ("model_config", "model", "optimizer", "step", "sampler", "strategy")):
        raise ValueError(f"{path} is not a resumable checkpoint of train.py")
    if len(ckpt["sampler"]) != world:
        raise ValueError(f"{path} was saved by {len(ckpt['sampler'])} processes, this run has {world}: resume "
                         f"with the same number (torchrun --nproc_per_node {len(ckpt['sampler'])})")
    return ckpt


def pick_device(name, rank=0):
    if name == "auto":
        name = f"cuda:{rank % torch.cuda.device_count()}" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {name} but CUDA is not available: use --device cpu")
    return torch.device(name)


if __name__ == "__main__":
    main()
