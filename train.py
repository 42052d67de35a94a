"""
The one training script: from scratch, or post-training a checkpoint, with a chosen initial state.

    python train.py --init-state sp                      # the CPU default: tiny Mamba-2, stdlib bytes
    python train.py --arch gla --init-state zero --steps 2000 --seq-len 64
    python train.py --init-from out/base --init-state sp --steps 300   # post-training (lr = peak/10)
    torchrun --nproc_per_node 2 train.py --init-state sp               # DistributedDataParallel
    python train.py --task passkey --init-from out/base --init-state fitted --seq-len 256   # Sec. 5 tasks
    python train.py --task copy --init-state sp --steps 2000           # synthetic copying, from scratch

The only thing that differs between the paper's interventions is where each training sequence's
initial state comes from (interventions.py); everything else is the usual recipe of Appendix B:
AdamW (0.9, 0.95), weight decay 0.01 on matrices only, gradient clipping 1.0, 10% linear warm-up,
cosine decay to 1e-5, no dropout. Evaluation (evaluate.py) always starts from the zero state.

Checkpoints (OUT/ckpt.pt) hold everything needed to continue the SAME run after a kill: model,
optimizer, step, RNG states, the sampler's position and the strategy's own state (fitted statistics,
passed states). They are written atomically, so a kill during a save leaves the previous one intact.

Long-context tasks (--task passkey / copy / babilong, the paper's Sec. 5): the batches come from
tasks.TaskSampler instead of windows of the corpus, and the loss is the cross entropy on the ANSWER
tokens only (y = -100 elsewhere), averaged per answer token over the batch. Each example is an
independent document that starts from its own eot, so the initial state is chosen exactly as for LM
training (--init-state), except tbtt, which needs consecutive chunks of one document and is refused.
evaluate.py --metrics passkey,copy,babilong scores the checkpoints (settings read from train_config).
"""
import argparse
import json
import math
import os
import random
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict

import numpy as np
import torch
import torch.nn.functional as F

import interventions
import model
import tasks

# Peak learning rates of the presets (from scratch). Post-training (--init-from) uses 1/10 of these,
# as in the paper. The paper's Table 2 values for its sizes; the tiny CPU presets were tuned here.
PEAK_LR = {"tiny": 3e-3, "45m": 1.5e-3, "70m": 1.5e-3, "85m": 1.5e-3, "125m": 1e-3, "130m": 1e-3,
           "370m": 7.5e-4, "780m": 5e-4, "1.3b": 4e-4}


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("the intervention")
    g.add_argument("--init-state", default="sp", choices=list(interventions.STRATEGIES),
                   help="initial state of each training sequence: zero (baseline), random (N(0, sigma^2)), "
                        "fitted (Gaussian fitted per layer/head to final states), sp (State Passing: the previous "
                        "batch's final states), tbtt (the previous chunk of the same document; not with --task). "
                        "Default: sp. For --task passkey use fitted, as the paper: SP would start each haystack "
                        "from the end state of the previous sample, a 'just answered' state, which is not a "
                        "realistic start for a new haystack")
    g.add_argument("--sigma", type=float, default=0.1, help="std of the random initial state (--init-state random)")
    g.add_argument("--p-reset", type=float, default=0.1, help="SP: probability that a row restarts from zero")
    g = p.add_argument_group("task (the paper's Sec. 5; default lm = next-token prediction on --data)")
    g.add_argument("--task", default="lm", choices=["lm"] + list(tasks.TASKS),
                   help="lm: every token of --data windows; passkey / copy / babilong: tasks.py examples with the "
                        "loss on the answer tokens only. passkey: --seq-len tokens, random depth (paper: "
                        "--init-state fitted). copy: from scratch, string lengths --copy-len (paper: zero vs sp). "
                        "babilong: --babi-tasks hidden in --data filler, --seq-len tokens (>= 512 with bytes)")
    g.add_argument("--copy-len", default="50,100",
                   help="--task copy: inclusive range LO,HI of the string length (example = 2*len+3 tokens); default 50,100")
    g.add_argument("--babi-tasks", default=",".join(tasks.BABI_TASKS),
                   help="--task babilong: comma-separated bAbI tasks drawn uniformly (default: qa1,...,qa10)")
    g = p.add_argument_group("model")
    g.add_argument("--arch", default="mamba2", choices=list(model.ARCHS), help="recurrent architecture")
    g.add_argument("--size", default="tiny", help="preset size, see model.PRESETS (tiny, 45m, 85m, 125m, 130m, 370m, ...)")
    g.add_argument("--init-from", default=None,
                   help="post-train this checkpoint (ours: a dir with ckpt.pt; official: a state-spaces/mamba dir "
                        "with config.json + pytorch_model.bin): fresh optimizer; --lr defaults to the checkpoint's "
                        "peak lr / 10 and --seq-len to its T_train")
    g = p.add_argument_group("data")
    g.add_argument("--data", default=None,
                   help="stdlib (Python's own sources, offline; the default), a text file/dir/glob, a .bin of tokens, "
                        "or a synthetic process like markov:k=8,alpha=0.3 (see tasks.py). With --init-from: the "
                        "checkpoint's own data unless given")
    g.add_argument("--tokenizer", default=None,
                   help="bytes (built in; the default) or a tiktoken encoding name (gpt2, ...). With --init-from: the "
                        "checkpoint's own tokenizer unless given")
    g.add_argument("--seq-len", type=int, default=None,
                   help="T_train: training sequence length in tokens (default 64; with --init-from: the checkpoint's)")
    g.add_argument("--batch-size", type=int, default=16, help="sequences per micro-batch (per process)")
    g.add_argument("--grad-accum", type=int, default=1,
                   help="micro-batches per optimizer step: a step sees grad-accum x batch-size x world sequences "
                        "(the paper's ~0.5M tokens per step on one GPU). Every micro-batch is a 'batch' for the "
                        "intervention: SP passes each micro-batch's final states to the next one")
    g = p.add_argument_group("optimisation")
    g.add_argument("--steps", type=int, default=1500, help="optimizer steps")
    g.add_argument("--tokens", type=float, default=None, help="token budget instead of --steps (e.g. 5e6)")
    g.add_argument("--lr", type=float, default=None,
                   help="peak learning rate (default: the preset's; with --init-from, the checkpoint's peak / 10)")
    g.add_argument("--min-lr", type=float, default=1e-5, help="end of the cosine decay")
    g.add_argument("--warmup", type=float, default=0.1, help="fraction of steps of linear warm-up (paper: 0.1)")
    g.add_argument("--weight-decay", type=float, default=0.01)
    g.add_argument("--grad-clip", type=float, default=1.0)
    g = p.add_argument_group("run")
    g.add_argument("--out", default="out", help="output directory (ckpt.pt, metrics.jsonl)")
    g.add_argument("--resume", action="store_true", help="continue the run saved in --out/ckpt.pt exactly")
    g.add_argument("--ckpt-interval", type=int, default=250, help="save a checkpoint every N steps (and at the end)")
    g.add_argument("--eval-interval", type=int, default=250, help="validation loss every N steps")
    g.add_argument("--eval-batches", type=int, default=8, help="batches of validation windows per evaluation")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda, cuda:1 ...")
    g.add_argument("--compile", action="store_true", help="torch.compile the model")
    g.add_argument("--stop-at", type=int, default=None, help="stop after this step as if killed (to test --resume)")
    g.add_argument("--quiet", action="store_true", help="no progress bar")
    g.add_argument("--demo", action="store_true",
                   help="run the failure-and-fix demo instead (about 2 minutes on a 2-core CPU): a baseline from "
                        "the zero state on in-context Markov chains at T_train=32, then 300 steps each of zero-state "
                        "(control), SP and TBTT post-training, evaluated to 16x T_train against the exact Bayes floor; "
                        "writes OUT/demo/ppl.png and eval.json. Uses only --out, --seed, --device, --quiet")
    args = p.parse_args(argv)
    check_args(p, args)
    return args


def check_args(p, args):
    for name in ("seq_len", "batch_size", "grad_accum", "steps", "ckpt_interval", "eval_interval", "eval_batches"):
        if getattr(args, name) is not None and getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(args, name)}")
    if not 0 <= args.warmup < 1:
        p.error(f"--warmup is a fraction of the steps in [0, 1), got {args.warmup}")
    if args.lr is not None and not args.lr > 0:
        p.error(f"--lr must be > 0, got {args.lr}")
    if args.init_from is None and args.size not in model.PRESETS[args.arch]:
        p.error(f"unknown --size {args.size!r} for --arch {args.arch}: choose one of {list(model.PRESETS[args.arch])}")
    if args.init_from is not None and not os.path.exists(args.init_from):
        p.error(f"--init-from {args.init_from} does not exist")
    # Post-training continues on the data the checkpoint was trained on unless told otherwise: silently
    # switching corpus (or tokenizer) under a model is a mistake that no error would catch later.
    source = args.init_from or (os.path.join(args.out, "ckpt.pt") if args.resume else None)
    try:
        parent = model.train_config(source) if source else {}
    except RuntimeError as e:
        raise SystemExit(f"error: {e}")
    args.data = args.data or parent.get("data") or "stdlib"
    args.tokenizer = args.tokenizer or parent.get("tokenizer") or "bytes"
    args.seq_len = args.seq_len or parent.get("seq_len") or 64
    # the peak lr the model was (pre)trained with: post-training defaults to a tenth of it (paper, App. B)
    args.parent_peak_lr = None
    if args.init_from and parent:  # older checkpoints lack peak_lr: a post-trained one ran at peak / 10
        args.parent_peak_lr = parent.get("peak_lr") or parent["lr"] * (10 if parent.get("init_from") else 1)
    if args.task != "lm":
        if args.init_state == "tbtt":
            p.error(f"--init-state tbtt needs consecutive chunks of one long document, but --task {args.task} "
                    f"examples are independent: use zero, random, fitted or sp")
        try:
            lo, hi = (int(v) for v in args.copy_len.split(","))
        except ValueError:
            lo = hi = 0
        if not 1 <= lo <= hi:
            p.error(f"--copy-len must be LO,HI with 1 <= LO <= HI, got {args.copy_len!r}")
        args.copy_len = f"{lo},{hi}"
        bad = [t for t in args.babi_tasks.split(",") if t not in tasks.BABI_TASKS]
        if bad or not args.babi_tasks:
            p.error(f"unknown --babi-tasks {bad or args.babi_tasks!r}: use a comma-separated subset of "
                    f"{','.join(tasks.BABI_TASKS)}")


def main(argv=None):
    args = get_args(argv)
    if args.demo:
        return demo(os.path.join(args.out, "demo"), seed=args.seed, device=args.device, quiet=args.quiet)
    ddp = "RANK" in os.environ
    rank, world = 0, 1
    if ddp:
        # One process per device; gloo on CPU, nccl on CUDA. The SP/fitted statistics stay PER RANK:
        # each rank passes its own final states to its own next batch, exactly as a single process would.
        import torch.distributed as dist
        backend = "nccl" if torch.cuda.is_available() and args.device != "cpu" else "gloo"
        dist.init_process_group(backend)
        rank, world = dist.get_rank(), dist.get_world_size()
    device = pick_device(args.device, rank)
    torch.manual_seed(args.seed + rank)
    random.seed(args.seed + rank)
    np.random.seed(args.seed + rank)
    master = rank == 0
    os.makedirs(args.out, exist_ok=True)

    # --- data -------------------------------------------------------------------------------------
    if args.task == "lm":
        data = tasks.load_data(args.data, tokenizer=args.tokenizer, seed=args.seed)
        if args.init_state == "tbtt":
            sampler = tasks.DocumentStreams(data.train, data.eot_token, args.batch_size, args.seq_len, seed=args.seed + rank)
        else:
            sampler = tasks.RandomWindows(data.train, args.batch_size, args.seq_len, seed=args.seed + rank)
        val_sampler = tasks.RandomWindows(data.val, args.batch_size, args.seq_len, seed=10_000 + args.seed)
    else:
        data = load_task_data(args)
        # held-out examples: another seed stream (TaskSampler seeds are [seed, step, row, 1]); babilong
        # also hides its stories in the corpus's validation split
        sampler = make_task_sampler(args, args.seed + rank, data.train)
        val_sampler = make_task_sampler(args, 10_000 + args.seed, data.val)
    val_state0 = val_sampler.state_dict()  # the same validation windows at every evaluation
    if args.tokens is not None:
        # (--task copy: examples are 2 * len + 2 tokens after the shift, counted at the longest)
        per_row = args.seq_len if args.task != "copy" else 2 * int(args.copy_len.split(",")[1]) + 2
        args.steps = max(1, int(args.tokens // (args.batch_size * per_row * world * args.grad_accum)))

    # --- model and optimizer --------------------------------------------------------------------------
    ckpt_path = os.path.join(args.out, "ckpt.pt")
    resume = load_checkpoint(ckpt_path, device) if args.resume else None
    if resume is not None:
        lm = model.LM(model.ModelConfig(**resume["model_config"]))
        lm.load_state_dict(resume["model"])
    elif args.init_from is not None:
        lm = model.from_pretrained(args.init_from)
    else:
        lm = model.LM(model.make_config(args.arch, args.size, vocab_size=data.vocab_size))
    if lm.cfg.vocab_size < data.vocab_size:
        raise SystemExit(f"error: the model's vocabulary ({lm.cfg.vocab_size}) is smaller than the data's "
                         f"({data.vocab_size}): use the tokenizer the model was trained with")
    lm.to(device)
    # peak_lr: the lr the weights were (pre)trained with. From scratch it is --lr or the preset's; a
    # post-training run inherits its checkpoint's (an official checkpoint: the paper's for its size) and
    # defaults --lr to a tenth of it (paper, App. B); a resumed run keeps the values it started with.
    if resume is not None:
        args.peak_lr = resume["train_config"].get("peak_lr")
        args.lr = args.lr or resume["train_config"]["lr"]
    elif args.init_from is not None:
        args.peak_lr = args.parent_peak_lr or PEAK_LR[preset_size(lm.cfg) or "tiny"]
    else:
        args.peak_lr = args.lr or PEAK_LR[args.size if args.size in PEAK_LR else "tiny"]
    if args.lr is None:
        args.lr = args.peak_lr / (10 if args.init_from else 1)
    optimizer = make_optimizer(lm, args.lr, args.weight_decay, device)
    strategy = interventions.make_strategy(args.init_state, lm, args.batch_size, sigma=args.sigma,
                                           p_reset=args.p_reset, seed=args.seed + rank)
    step = 0
    if resume is not None:
        optimizer.load_state_dict(resume["optimizer"])
        step = resume["step"]
        sampler.load_state_dict(resume["sampler"][rank])
        strategy.load_state_dict(move_to(resume["strategy"][rank], device))
        set_rng_state(resume["rng"][rank])
        if master:
            print(f"resuming {ckpt_path} at step {step}")
    fwd = torch.compile(lm) if args.compile else lm
    if ddp:
        from torch.nn.parallel import DistributedDataParallel
        fwd = DistributedDataParallel(fwd, device_ids=[device.index] if device.type == "cuda" else None)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()
    if master:
        print(lm)
        n_train = f"{len(data.train):,} train tokens, " if data.train is not None else ""
        seq_desc = args.seq_len if args.task != "copy" else "(2 x copy length + 2)"
        print(f"data {data.name}: {n_train}vocab {data.vocab_size}; "
              f"{args.steps} steps x {args.grad_accum * args.batch_size * world} x {seq_desc} tokens; task {task_summary(args)}; "
              f"init-state {args.init_state}; lr {args.lr:g}; device {device}")
        with open(os.path.join(args.out, "args.json"), "w") as f:
            json.dump(vars(args), f, indent=1)

    # --- the loop -------------------------------------------------------------------------------------
    log = open(os.path.join(args.out, "metrics.jsonl"), "a") if master else None
    bar = make_bar(args.steps, step, disable=args.quiet or not master)
    t0, tokens_since = time.time(), 0
    lm.train()
    while step < args.steps:
        lr = lr_at(step, args)
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.zero_grad(set_to_none=True)
        loss, tokens = accumulate_gradients(fwd, sampler, strategy, args.grad_accum, device, autocast,
                                            no_sync=ddp, step=step, ckpt_path=ckpt_path)
        grad_norm = torch.nn.utils.clip_grad_norm_(lm.parameters(), args.grad_clip)
        optimizer.step()
        step += 1
        tokens_since += tokens * world
        record = {"step": step, "loss": loss, "lr": lr, "grad_norm": grad_norm.item()}
        if step % args.eval_interval == 0 or step == args.steps:
            val_sampler.load_state_dict(val_state0)
            record["val_loss"] = evaluate_loss(lm, val_sampler, args.eval_batches, device, autocast)
            lm.train()
        if master:
            dt = time.time() - t0
            record["tokens_per_s"] = tokens_since / max(dt, 1e-9)
            log.write(json.dumps(record) + "\n")
            log.flush()
            bar.set_postfix(loss=f"{record['loss']:.3f}", tok_s=f"{record['tokens_per_s']:.0f}", lr=f"{lr:.2e}",
                            **({"val": f"{record['val_loss']:.3f}"} if "val_loss" in record else {}))
            bar.update(1)
        if step % args.ckpt_interval == 0 or step == args.steps:
            save_checkpoint(ckpt_path, lm, optimizer, step, args, sampler, strategy, rank, world)
        if args.stop_at is not None and step >= args.stop_at:
            break
    bar.close()
    if master:
        log.close()
        print(f"done: step {step}, {time.time() - t0:.0f}s, checkpoint {ckpt_path}")
    if ddp:
        import torch.distributed as dist
        dist.destroy_process_group()
    return lm


# --- the demo -----------------------------------------------------------------------------------------

# Each document draws its own 8 x 8 transition matrix, so the best predictor learns it from the bigram
# counts of its own context and keeps improving with length: a task that NEEDS state past T_train,
# with an exact optimal loss to compare against (tasks.markov_bayes_nll). See README, Results 1.
DEMO_DATA = "markov:k=8,alpha=0.3,doc_len=512,docs=16384"


def demo(out, seed=0, device="auto", quiet=False, base_steps=700, post_steps=300, n_seqs=128):
    """Failure and fix in one command: train from zero at T_train = 32, post-train three ways, evaluate.
    Expected (README): the baseline falls behind the Bayes floor past T_train; TBTT halves that gap; SP
    makes it worse on this process (the passed state holds another chain's counts)."""
    import evaluate
    common = ["--data", DEMO_DATA, "--seq-len", "32", "--batch-size", "128", "--seed", str(seed),
              "--device", device, "--eval-interval", "100000"] + (["--quiet"] if quiet else [])
    runs = {"base": os.path.join(out, "base")}
    print(f"demo 1/4: baseline, zero initial state, {base_steps} steps at T_train = 32")
    main(common + ["--init-state", "zero", "--steps", str(base_steps), "--out", runs["base"]])
    for i, (label, strategy) in enumerate([("control", "zero"), ("SP", "sp"), ("TBTT", "tbtt")]):
        print(f"demo {i + 2}/4: post-training the baseline {post_steps} steps with --init-state {strategy} ({label})")
        runs[label] = os.path.join(out, label)
        main(common + ["--init-from", runs["base"], "--init-state", strategy, "--steps", str(post_steps),
                       "--out", runs[label]])
    return evaluate.main(list(runs.values()) + ["--labels", *runs, "--metrics", "ppl,state", "--eval-len", "512",
                                                "--n-seqs", str(n_seqs), "--seed", str(seed), "--device", device,
                                                "--out", out])


# --- helpers ------------------------------------------------------------------------------------------

def accumulate_gradients(fwd, sampler, strategy, n_micro, device, autocast=nullcontext(), no_sync=False, step=0,
                         ckpt_path="ckpt.pt"):
    """Forward and backward n_micro micro-batches into the .grad of the parameters (the caller zeroes
    them before and steps the optimizer after). Each micro-batch takes its initial state from the
    strategy and hands its final state back, so SP / TBTT / fitted see a micro-batch as a batch.
    Each loss is divided by n_micro: the gradient is that of the mean loss over the micro-batches,
    which for LM batches (no ignored targets) is the gradient of one batch n_micro times as large.
    no_sync: DDP, all-reduce the gradients once, on the last micro-batch. Returns (mean loss, tokens)."""
    total, tokens = 0.0, 0
    for micro in range(n_micro):
        batch = next_batch(sampler, device)
        init = strategy.initial_state(batch)
        sync = fwd.no_sync() if no_sync and micro < n_micro - 1 else nullcontext()
        with sync:
            with autocast:
                logits, final_state = fwd(batch["x"], state=init)
                # ignore_index: task batches mark every non-answer target -100, so the mean runs over the
                # answer tokens of the micro-batch (per answer token: a long copy weighs more than a short
                # one). LM batches have no -100: the plain mean over all tokens.
                loss = F.cross_entropy(logits.float().flatten(0, 1), batch["y"].flatten(), ignore_index=-100)
            if not torch.isfinite(loss):
                raise SystemExit(f"error: loss is {loss.item()} at step {step + 1}; stopped without saving. The last "
                                 f"good checkpoint ({ckpt_path}) is intact: resume from it with a lower --lr or "
                                 f"larger --warmup")
            (loss / n_micro).backward()
        strategy.observe(final_state)
        total += loss.item()
        tokens += batch["x"].numel()
    return total / n_micro, tokens


def preset_size(cfg):
    """The preset name whose dimensions cfg has (e.g. an official 130m directory), or None."""
    for size, p in model.PRESETS.get(cfg.arch, {}).items():
        if cfg.d_model == p["d_model"] and cfg.n_layer == p["n_layer"] and size in PEAK_LR:
            return size
    return None


def lr_at(step, args):
    """Linear warm-up over the first `warmup` fraction of steps, then cosine decay to min_lr."""
    warm = int(args.warmup * args.steps)
    if step < warm:
        return args.lr * (step + 1) / warm
    progress = (step - warm) / max(1, args.steps - warm)
    return args.min_lr + 0.5 * (args.lr - args.min_lr) * (1 + math.cos(math.pi * min(1.0, progress)))


def make_optimizer(lm, lr, weight_decay, device):
    # Decay matrices only: not norms, biases, nor the SSM's A_log / D / dt_bias (marked _no_weight_decay).
    decay, no_decay = [], []
    for p in lm.parameters():
        (no_decay if p.dim() < 2 or getattr(p, "_no_weight_decay", False) else decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), fused=device.type == "cuda")


def load_task_data(args):
    """What a task needs from --data: the vocabulary of --tokenizer and, for babilong, the corpus whose
    text hides the stories (its train split for training, val split for validation). passkey and copy
    bring their own text, so the corpus is not read for them."""
    if args.task == "babilong":
        data = tasks.load_data(args.data, tokenizer=args.tokenizer, seed=args.seed)
        if data.tokenizer is None:
            raise SystemExit(f"error: --task babilong hides its stories in --data text, but {data.name} is a "
                             f"synthetic process without a tokenizer: use --data stdlib or a text path")
        return data
    enc = tasks.get_tokenizer(args.tokenizer)
    return tasks.Data(name=f"{args.task} ({enc.name})", train=None, val=None, vocab_size=enc.n_vocab,
                      eot_token=enc.eot_token, tokenizer=enc)


def make_task_sampler(args, seed, filler_tokens):
    """The TaskSampler of --task: examples of --seq-len + 1 tokens (x, y of --seq-len), random depth for
    passkey; strings of --copy-len symbols for copy; a story of --babi-tasks in filler_tokens for babilong."""
    kw = dict(tokenizer=args.tokenizer)
    if args.task == "passkey":
        return tasks.TaskSampler(tasks.passkey_sample, args.batch_size, seed, length=args.seq_len + 1, **kw)
    if args.task == "copy":
        lo, hi = (int(v) for v in args.copy_len.split(","))
        return tasks.TaskSampler(tasks.copy_sample, args.batch_size, seed, length=(lo, hi), **kw)
    return tasks.TaskSampler(tasks.babi_mixture, args.batch_size, seed, babi_tasks=tuple(args.babi_tasks.split(",")),
                             length=args.seq_len + 1, filler_tokens=filler_tokens, **kw)


def task_summary(args):
    return {"lm": "lm", "passkey": "passkey (random depth)", "copy": f"copy (lengths {args.copy_len})",
            "babilong": f"babilong ({args.babi_tasks})"}[args.task]


def next_batch(sampler, device):
    out = sampler.next_batch()
    batch = {"x": out[0].to(device), "y": out[1].to(device)}
    if len(out) > 2:
        batch["new_doc"] = out[2]
    return batch


@torch.no_grad()
def evaluate_loss(lm, sampler, n_batches, device, autocast):
    """Mean next-token loss on validation windows of the training length, from the zero state.
    Task samplers: the loss on the answer tokens of held-out examples, per answer token."""
    lm.eval()
    total, count = 0.0, 0
    for _ in range(n_batches):
        x, y = (t.to(device) for t in sampler.next_batch()[:2])
        with autocast:
            logits, _ = lm(x)
        total += F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), ignore_index=-100, reduction="sum").item()
        count += int((y != -100).sum())
    return total / count


def save_checkpoint(path, lm, optimizer, step, args, sampler, strategy, rank, world):
    # every rank's sampler/strategy/RNG state is gathered so that a resume continues every rank exactly
    per_rank = {"sampler": sampler.state_dict(), "strategy": move_to(strategy.state_dict(), "cpu"),
                "rng": get_rng_state()}
    if world > 1:
        import torch.distributed as dist
        gathered = [None] * world
        dist.all_gather_object(gathered, per_rank)
    else:
        gathered = [per_rank]
    if rank != 0:
        return
    ckpt = {"model_config": asdict(lm.cfg), "model": lm.state_dict(), "optimizer": optimizer.state_dict(),
            "train_config": vars(args), "step": step,
            "sampler": [g["sampler"] for g in gathered], "strategy": [g["strategy"] for g in gathered],
            "rng": [g["rng"] for g in gathered]}
    tmp = path + ".tmp"
    torch.save(ckpt, tmp)
    os.replace(tmp, path)  # atomic: a kill leaves either the old or the new checkpoint, never half of one


def load_checkpoint(path, device):
    if not os.path.exists(path):
        raise SystemExit(f"error: --resume but {path} does not exist: start without --resume, or point --out at the run")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise SystemExit(f"error: cannot read {path} (corrupt checkpoint?): {type(e).__name__}: {e}")
    for key in ("model_config", "model", "optimizer", "step", "sampler", "strategy", "rng"):
        if key not in ckpt:
            raise SystemExit(f"error: {path} lacks {key!r}: not a resumable checkpoint of train.py")
    return ckpt


def get_rng_state():
    # plain Python types and tensors only, so checkpoints load with torch.load(weights_only=True)
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    return {"torch": torch.get_rng_state(), "python": random.getstate(),
            "numpy": (name, keys.tolist(), pos, has_gauss, gauss),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def set_rng_state(s):
    torch.set_rng_state(s["torch"])
    random.setstate(s["python"])
    name, keys, pos, has_gauss, gauss = s["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, gauss))
    if s["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(s["cuda"])


def move_to(obj, device):
    if torch.is_tensor(obj):
        return obj if obj.dtype == torch.uint8 else obj.to(device)  # generator states stay on the CPU
    if isinstance(obj, dict):
        return {k: move_to(v, device) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(move_to(v, device) for v in obj)
    return obj


def pick_device(name, rank=0):
    if name == "auto":
        name = f"cuda:{rank % torch.cuda.device_count()}" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"error: --device {name} but CUDA is not available: use --device cpu")
    return torch.device(name)


def make_bar(total, initial, disable):
    from tqdm import tqdm
    return tqdm(total=total, initial=initial, disable=disable, dynamic_ncols=True, file=sys.stdout)


if __name__ == "__main__":
    try:
        main()
    except (tasks.DataError, tasks.TokenizerUnavailableError, FileNotFoundError, RuntimeError) as e:
        # bad input (missing data, unknown tokenizer, corrupt checkpoint...): one line, not a traceback
        raise SystemExit(f"error: {e}")
