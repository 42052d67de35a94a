r"""The one training script: from scratch, or post-training a checkpoint, with a chosen initial state.

    python train.py --init-state sp                      # the CPU default: tiny Mamba-2, stdlib bytes
    python train.py --init-from out/base --init-state sp --steps 300   # post-training (lr = peak/10)
    python train.py --init-from PATH/mamba2-370m --data corpus.bin --tokenizer PATH/tokenizer.json \
        --init-state sp --steps 100 --grad-accum 32      # the paper's Fig. 5 on an official checkpoint
    torchrun --nproc_per_node 2 train.py --init-state sp               # DistributedDataParallel

The interventions differ only in each sequence's initial state (interventions.py); the rest is Appendix B's
recipe. --out: ckpt.pt (all a resume needs; atomic; finite weights), metrics.jsonl, args.json, train.lock."""
import argparse
import datetime
import fcntl
import json
import math
import os
import pathlib
import re
import shutil
import signal
import sys
import time
from contextlib import contextmanager, nullcontext

if __name__ == "__main__":   # Ctrl-C while torch loads (seconds): a line, not a traceback
    signal.signal(signal.SIGINT, lambda *_: sys.exit("interrupted"))
import torch
import torch.nn.functional as F
from tqdm import tqdm

import data
import interventions
import model
import tasks

def accumulate_gradients(fwd, sampler, strategy, n_micro, device, autocast=nullcontext(), no_sync=False):
    """The gradients of one optimizer step, the paper's loop: initial state -> forward -> backward -> observe.
    Each micro-batch is a batch for the strategy. no_sync (DDP): all-reduce on the last micro-batch only."""
    total = 0.0
    tokens = 0
    for micro in range(n_micro):
        batch = sampler.next_batch()  # data.Batch: x, y and (DocumentStreams) the rows that start a document
        x = batch.x.to(device)
        y = batch.y.to(device)
        initial_state = strategy.initial_state(batch)
        with fwd.no_sync() if no_sync and micro < n_micro - 1 else nullcontext():
            with autocast:
                logits, final_state = fwd(x, state=initial_state)
                # task batches mark every non-answer target -100: the mean over the answer tokens
                loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), ignore_index=-100)
            (loss / n_micro).backward()  # the gradient of the mean over the micro-batches
        strategy.observe(final_state)
        total += loss.item()
        tokens += x.numel()
    return total / n_micro, tokens

def train(args):
    exit_on_bad_flags(args)
    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    ddp = "RANK" in os.environ
    auto = f"cuda:{rank % torch.cuda.device_count()}" if torch.cuda.is_available() else "cpu"
    device = torch.device(auto if args.device == "auto" else args.device)
    if ddp:  # one process per device; each rank keeps its own sampler and strategy, as one process would
        torch.distributed.init_process_group("gloo" if device.type == "cpu" else "nccl",
                                             timeout=datetime.timedelta(seconds=args.dist_timeout))
    os.makedirs(args.out, exist_ok=True)
    sampler, val_sampler, vocab_size, source = setup_data(args, rank)
    val_state0 = val_sampler.state_dict()  # the same validation batches at every evaluation
    ckpt_path = os.path.join(args.out, "ckpt.pt")
    lm, optimizer, strategy, step = setup_model(args, device, vocab_size, sampler, ckpt_path, rank, world)
    fwd = torch.nn.parallel.DistributedDataParallel(lm) if ddp else lm  # the model is on this rank's device
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()
    master = rank == 0
    if master:
        print(f"{lm.extra_repr()}, data {source}, --init-state {args.init_state}{' --streams' * args.streams}"
              f", {args.steps} steps of {args.grad_accum * world * args.batch_size} x {args.seq_len} tokens, "
              f"lr {args.lr:g}, {device}" + (f", resuming at step {step}" if step else ""))
    with open_run(args, step) if master else open(os.devnull, "w") as log, \
            tqdm(total=args.steps, initial=step, disable=args.quiet or not master, file=sys.stdout) as bar:
        t0 = time.time()
        start = step
        saved_step = step or None  # resumed: the checkpoint's step
        while step < min(args.steps, args.stop_at or args.steps):  # --stop-at: as if killed after that step
            lr = lr_at(step, args)
            for group in optimizer.param_groups:
                group["lr"] = lr * group["lr_scale"]
            optimizer.zero_grad(set_to_none=True)
            loss, tokens = accumulate_gradients(fwd, sampler, strategy, args.grad_accum, device, amp, ddp)
            grad_norm = torch.nn.utils.clip_grad_norm_(lm.parameters(), args.grad_clip).item()
            if not (math.isfinite(loss) and math.isfinite(grad_norm)):  # stop before breaking the weights
                diverged(args, step + 1, f"loss {loss:g}, gradient norm {grad_norm:g}", saved_step)
            optimizer.step()
            step += 1
            record = {"step": step, "loss": loss, "lr": lr, "grad_norm": grad_norm,
                      "tokens_per_s": tokens * world * (step - start) / max(time.time() - t0, 1e-9)}
            save = step % args.ckpt_interval == 0 or step == args.steps
            if save or step % args.eval_interval == 0:
                val_sampler.load_state_dict(val_state0)
                record["val_loss"] = evaluate_loss(lm, val_sampler, args.eval_batches, device, amp)
            print(json.dumps(record), file=log, flush=True)  # other ranks: to os.devnull, no bar
            bar.set_postfix({k: f"{v:.3g}" for k, v in record.items() if k != "step"})
            bar.update(1)
            if save:
                if not math.isfinite(record["val_loss"]):  # only weights with a finite val loss are saved
                    diverged(args, step, "the validation loss", saved_step)
                save_checkpoint(ckpt_path, lm, optimizer, step, args, sampler, strategy, rank, world)
                saved_step = step
    if master:
        print(f"done: step {step}, {time.time() - t0:.0f}s, " + (f"checkpoint {ckpt_path} (step {saved_step})"
              if saved_step else "no checkpoint (--stop-at before the first --ckpt-interval)"))
    if ddp:  # the ranks leave together: none closes its connections while another still uses them
        del fwd
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    return lm

def setup_data(args, rank):
    """-> (sampler, val_sampler, vocab_size, the data's name): windows of --data, or --task's examples."""
    if rank:   # under torchrun rank 0 tokenizes --data into the cache first, then the others read it
        torch.distributed.barrier()
    corpus = data.load_data(args.data, args.tokenizer, args.split_seed, cache_dir=args.cache_dir) \
        if args.task in ("lm", "babilong") else None
    if rank == 0 and torch.distributed.is_initialized():
        torch.distributed.barrier()
    if args.task == "babilong" and corpus.tokenizer is None:
        raise ValueError(f"--task babilong hides its stories in --data text, but {corpus.name} is not text")
    for split, tokens in (("training", corpus.train), ("validation", corpus.val)) if corpus else ():
        data.require(len(tokens) > args.seq_len, f"the {split} split of {corpus.name} has {len(tokens)} "
                     f"tokens, --seq-len {args.seq_len} needs more: use more text or a smaller --seq-len")
    # what the run read, kept in its checkpoint: a resume must read the same, post-training the same tokenizer
    now = dict(tokenizer_id=data.get_tokenizer(args.tokenizer).name,
               data_id=corpus and model.data_id(corpus, args.split_seed))
    saved = vars(args) if args.resume else model.train_config(args.init_from) if args.init_from else {}
    for key, flag, fix in [("tokenizer_id", "--tokenizer", "pass the tokenizer.json it was trained with")] + [
            ("data_id", "--data", "restore its files, or start a new run")] * args.resume:
        data.require(saved.get(key) in (None, now[key]), f"{flag} {vars(args)[flag[2:]]} ({now[key]}) does "
                     f"not match {args.out if args.resume else args.init_from}'s {saved.get(key)}: {fix}")
    vars(args).update(now)
    if args.task == "lm":
        Sampler = data.DocumentStreams if args.init_state == "tbtt" or args.streams else data.RandomWindows
        eot = (corpus.eot_token,) if Sampler is data.DocumentStreams else ()
        sampler = Sampler(corpus.train, *eot, args.batch_size, args.seq_len, args.data_seed + rank)
        val_sampler = data.RandomWindows(corpus.val, args.batch_size, args.seq_len, 10_000)
        if args.init_from and not args.resume:
            read_on(sampler, args.init_from, rank)
    else:  # babilong hides its stories in --data text (train / val split); passkey and copy bring their own
        sampler = make_task_sampler(args, args.data_seed + rank, corpus and corpus.train)
        val_sampler = make_task_sampler(args, 10_000, corpus and corpus.val)
    vocab_size = corpus.vocab_size if corpus else data.get_tokenizer(args.tokenizer).n_vocab
    return sampler, val_sampler, vocab_size, corpus.name if corpus else args.task

def setup_model(args, device, vocab_size, sampler, path, rank, world):
    """-> (lm, optimizer, strategy, step): new, --init-from's, or resumed from `path` with the sampler."""
    torch.manual_seed(args.seed)
    resume = model.read_checkpoint(path, device) if args.resume else None
    if resume and not {"model_config", "model", "optimizer", "step", "sampler", "strategy"} <= resume.keys():
        raise ValueError(f"{path} is not a checkpoint of train.py: it cannot be resumed")
    if resume and len(resume["sampler"]) != world:
        raise ValueError(f"{path} was saved by {len(resume['sampler'])} processes, this run has {world}: "
                         f"resume with as many (torchrun --nproc_per_node {len(resume['sampler'])})")
    lm = model.LM(model.ModelConfig(**resume["model_config"])) if resume else \
        model.from_pretrained(args.init_from) if args.init_from else \
        model.LM(model.make_config(args.arch, args.size, vocab_size=vocab_size))
    args.arch, n_vocab = lm.cfg.arch, data.get_tokenizer(args.tokenizer).n_vocab
    if lm.cfg.vocab_size < vocab_size:
        raise ValueError(f"the data's vocabulary ({vocab_size}) exceeds the model's: use its --tokenizer")
    if lm.cfg.vocab_size > 2 * n_vocab and args.init_from and not args.resume:  # an official LM on bytes
        raise ValueError(f"--init-from {args.init_from} has a vocabulary of {lm.cfg.vocab_size}, --tokenizer "
                         f"{args.tokenizer} {n_vocab}: pass the model's --tokenizer PATH/tokenizer.json")
    if resume and args.steps < resume["step"]:
        raise ValueError(f"--steps {args.steps} is below the step of {path} ({resume['step']}): pass more")
    optimizer = make_optimizer(lm.to(device), args.lr, args.weight_decay, device)
    strategy = interventions.make_strategy(args.init_state, lm, args.batch_size, sigma=args.sigma,
                                           p_reset=args.p_reset, seed=args.seed + rank)
    if resume:
        lm.load_state_dict(resume["model"])
        optimizer.load_state_dict(resume["optimizer"])
        sampler.load_state_dict(resume["sampler"][rank])
        strategy.load_state_dict(resume["strategy"][rank])
    return lm, optimizer, strategy, resume["step"] if resume else 0

# The demos: a tiny Mamba-1 whose state channels barely decay within T_train ("tiny-slow"), trained from the
# zero state on Python bytes at T_train = 16: past it the state drifts to values it never learned to read and
# perplexity rises (the paper's failure). Each demo is one of the paper's figures, per training seed:
#   fig5  the base, then 10% more steps six ways: the zero state (the matched control), Random Noise
#         (sigma: the best of a sweep on seeds 8, 9, RESULTS 0d), Fitted Noise, SP and TBTT (Sec. 4, Fig. 5),
#         and the zero state on TBTT's document streams (TBTT's own control)
#   fig2  bases at T_train 8, 16, 32, 64 on the same tokens (Fig. 2: shorter fails sooner)
#   fig3  one base at T_train 16, evaluated at 1/3x, 2/3x, 4/3x and 3x the fig5 base's steps (Fig. 3)
DEMO = dict(arch="mamba1", size="tiny-slow", data="stdlib", seq_len=16, batch_size=16, base_steps=1500,
            post_steps=150, sigma=0.1, eval_len=1024, n_seqs=64)
# label: --init-state; "streams" reads TBTT's document streams from the zero state: TBTT's own control
INTERVENTIONS = {"control": "zero", "random": "random", "fitted": "fitted", "SP": "sp", "TBTT": "tbtt",
                 "streams": "zero"}

def demo_runs(figure, d, where, train_run):
    """Trains one seed's runs of `figure` under `where` with train_run(label, argv) -> {label: run dir}."""
    base = ["--arch", d["arch"], "--size", d["size"], "--init-state", "zero"]
    if figure == "fig2":  # the same tokens at each T_train: base_steps * seq_len / T steps
        runs = {t: os.path.join(where, f"T{t}") for t in (8, 16, 32, 64)}
        for t, run in runs.items():
            steps = d["base_steps"] * d["seq_len"] // t
            train_run(f"T{t}", base + ["--seq-len", str(t), "--steps", str(steps), "--out", run])
        return {f"T{t}": run for t, run in runs.items()}
    if figure == "fig3":  # checkpoints of one run (its cosine schedule spans all 3x), copied at each budget
        every, run = d["base_steps"] // 3, os.path.join(where, "run")
        runs = {k * every: os.path.join(where, f"step{k * every}") for k in (1, 2, 4, 9)}
        for budget, copy in runs.items():
            if checkpoint_step(copy) == budget:   # kept from a run of the demo that was interrupted later
                continue
            train_run(f"to step {budget}", base + ["--steps", str(9 * every), "--ckpt-interval", str(every),
                                               "--stop-at", str(budget), "--out", run])
            step = checkpoint_step(run)
            data.require(step == budget, f"{run} is at step {step}, past {budget}, and {copy} is gone: "
                         f"remove {where} and run the demo again")
            os.makedirs(copy, exist_ok=True)
            data.write_atomically(os.path.join(copy, "ckpt.pt"),
                                  lambda tmp: shutil.copy(os.path.join(run, "ckpt.pt"), tmp))
        return {f"step{budget}": copy for budget, copy in runs.items()}
    runs = {"base": os.path.join(where, "base")} | {k: os.path.join(where, k) for k in INTERVENTIONS}
    train_run("base", base + ["--steps", str(d["base_steps"]), "--out", runs["base"]])
    for label, strategy in INTERVENTIONS.items():  # the same budget each, from the base (read_on: windows)
        extra = {"random": ["--sigma", str(d["sigma"])], "streams": ["--streams"]}.get(label, [])
        train_run(label, ["--init-from", runs["base"], "--steps", str(d["post_steps"]), "--init-state",
                          strategy, "--out", runs[label], *extra])
    return runs

def demo(out, seeds=(0,), device="auto", quiet=False, figure="fig5", **overrides):
    """The demo `figure` per training seed in OUT/seed{S} (kept if it has an eval.json), then the seeds'
    summary (evaluate.over_seeds)."""
    import evaluate
    d = {**DEMO, **overrides}  # tests shrink it
    for seed in seeds:
        where = os.path.join(out, f"seed{seed}")
        if os.path.exists(os.path.join(where, "eval.json")):
            print(f"demo seed {seed}: {where}/eval.json exists, kept")
            continue
        common = ["--data", d["data"], "--seq-len", str(d["seq_len"]), "--batch-size", str(d["batch_size"]),
                  "--seed", str(seed), "--device", device, "--eval-interval", "100000"] + ["--quiet"] * quiet
        def train_run(label, argv):   # a finished run is kept, an interrupted one resumed: a rerun goes on
            out, steps = argv[argv.index("--out") + 1], int(argv[argv.index("--steps") + 1])
            until = int(argv[argv.index("--stop-at") + 1]) if "--stop-at" in argv else steps
            step = checkpoint_step(out)
            if step is not None and step >= until:
                return print(f"demo {figure} seed {seed}: {label}: {out} is at step {step}, kept")
            if step is not None:
                argv += ["--resume"]
            print(f"demo {figure} seed {seed}: {label}: python train.py {' '.join(argv)}")
            train(get_args(common + argv))
        runs = demo_runs(figure, d, where, train_run)
        metrics = ["ppl,state", "--reference", "control", "TBTT=streams"] if figure == "fig5" else ["ppl"]
        if code := evaluate.main([*runs.values(), "--labels", *runs, "--metrics", *metrics, "--eval-len",
                                  str(d["eval_len"]), "--n-seqs", str(d["n_seqs"]), "--device", device,
                                  "--out", where]):
            return code
    reports = {seed: json.loads(pathlib.Path(out, f"seed{seed}", "eval.json").read_text()) for seed in seeds}
    return evaluate.over_seeds(reports, out) if len(seeds) > 1 else 0

def checkpoint_step(run):
    """The step of run's ckpt.pt, or None without one."""
    ckpt = os.path.join(run, "ckpt.pt")
    return model.read_checkpoint(ckpt, "cpu", mmap=True).get("step") if os.path.isfile(ckpt) else None

# --- flags, run files and helpers --------------------------------------------------------------------------
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
    ("init-from", str, None, "post-train this: a run directory, an official Mamba one, a hub id"),
    ("data", str, "stdlib", "stdlib, a text file or dir, a .bin or markov:k=8 (post-training: the parent's)"),
    ("tokenizer", str, "bytes", "bytes, gpt2 (tiktoken), a tokenizer.json, hub id (post-training: parent's)"),
    ("seq-len", int, 64, "T_train (post-training: the parent's)"),
    ("batch-size", int, 16, "sequences per micro-batch and process"),
    ("grad-accum", int, 1, "micro-batches per optimizer step; each is a batch for the strategy"),
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
    ("device", str, "auto", "auto (CUDA when present), cpu, cuda, cuda:1 ..."),
    ("dist-timeout", float, 300, "torchrun: seconds a rank waits for the others (one frozen, or rank 0 "
     "building the data cache) before every rank ends"),
    ("stop-at", int, None, "stop after this step as if killed (to test --resume)"),
    ("quiet", bool, False, "no progress bar"),
    ("demo", ["fig5", "fig2", "fig3"], None, "a demo in OUT/demo[-fig2|-fig3], minutes a seed (with --out, "
     "--seed(s), --device, --quiet): fig5 (--demo alone) the failure and the four interventions, fig2 "
     "T_train, fig3 the training budget"),
    ("seeds", str, None, "--demo: training seeds, e.g. 0-7 or 0,5: a demo each, then the summary over seeds")]
DEFAULTS = {name.replace("-", "_"): default for name, _, default, _ in FLAGS}
# Not resumed: flags of one invocation, not of the run. May change on resume: the length, divergence remedies.
PER_INVOCATION = ("out", "resume", "stop_at", "device", "quiet", "demo", "seeds", "cache_dir", "dist_timeout")
DEMO_FLAGS = ("demo", "out", "seed", "seeds", "device", "quiet")   # what --demo takes
MAY_CHANGE = ("steps", "ckpt_interval", "eval_interval", "lr", "grad_clip")

def main(argv=None):
    for s in (signal.SIGINT, signal.SIGTERM):   # SIGTERM as Ctrl-C: temporary files removed
        signal.signal(s, interrupted)
    args = None
    try:
        args = get_args(argv)
        seeds = parse_seeds(args.seeds) if args.seeds else [args.seed]
        if args.demo:
            where = f"{args.out}/demo" + f"-{args.demo}" * (args.demo != "fig5")
            return demo(where, seeds, args.device, args.quiet, args.demo)
        return train(args)
    except (OSError, ValueError, data.TokenizerUnavailableError) as e:  # bad input: one line, no traceback
        sys.exit(f"error: {e}")
    except (MemoryError, RuntimeError) as e:  # the CPU allocator's out of memory is a plain RuntimeError, as
        # are gloo's timed-out or broken collectives under torchrun
        if isinstance(e, (MemoryError, torch.OutOfMemoryError)) or "can't allocate memory" in str(e):
            sys.exit("error: out of memory: lower --batch-size (and raise --grad-accum) or --seq-len")
        distributed = "gloo" in str(e) or isinstance(e, torch.distributed.DistError)
        if not (distributed and torch.distributed.is_initialized()):
            raise
        why = re.sub(r"^\[[^]]*\] ", "", str(e)).split(". ")[0]  # without gloo's source file and advice
        sys.exit(f"error: rank {os.environ['RANK']} lost the other ranks ({why}): one is frozen or ended, or "
                 f"was busy longer than --dist-timeout {args.dist_timeout:g} s (building a large data cache: "
                 f"raise it); {last_checkpoint(args)}")
    except KeyboardInterrupt:  # Ctrl-C, SIGTERM; under torchrun once a collective returns (--dist-timeout)
        sys.exit("interrupted: " + ("rerun the same command to go on: finished runs are kept, the one "
                                    "interrupted resumes" if args and args.demo else last_checkpoint(args)))

def interrupted(signum, frame):
    """The first Ctrl-C or SIGTERM stops the run; more, during its clean-up, are ignored."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt

def last_checkpoint(args):
    """What a stopped run leaves: its last checkpoint (each file is replaced whole: write_atomically)."""
    step = args and checkpoint_step(args.out)
    return f"the last checkpoint {args.out}/ckpt.pt (step {step}) is intact; continue with --resume" if step \
        else "no checkpoint was saved: nothing to resume"

def parse_seeds(text):
    """"0-7" -> [0, ..., 7]; "0,5" -> [0, 5]."""
    lo, dash, hi = text.partition("-")
    if not re.fullmatch(r"\d+-\d+|\d+(,\d+)*", text) or dash and int(lo) > int(hi) or \
            len(set(text.split(","))) < len(text.split(",")):
        sys.exit(f"error: --seeds must be A-B or A,B,... (distinct integers >= 0), got {text!r}")
    return list(range(int(lo), int(hi) + 1)) if dash else [int(v) for v in text.split(",")]

def get_args(argv=None):
    """Parse the flags, fill in each one not given: on --resume the checkpoint's (a given flag must agree, but
    MAY_CHANGE); post-training the parent's data, tokenizer, seq_len, peak lr / 10 (App. B); then DEFAULTS."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.error = lambda message: sys.exit(f"error: {message} (see python train.py --help)")
    for name, kind, default, help in FLAGS:
        kw = {"action": "store_true"} if kind is bool else {"choices" if type(kind) is list else "type": kind}
        if name == "demo":  # --demo alone: fig5
            kw.update(nargs="?", const="fig5")
        p.add_argument("--" + name, default=None, help=help + f" (default {default})" * bool(default), **kw)
    args = p.parse_args(argv)
    # '' or a name of bytes not UTF-8 (argv holds them as lone surrogates, which encode() drops)
    if args.out is not None and (not args.out or args.out.encode(errors="ignore").decode() != args.out):
        sys.exit(f"error: --out must be a non-empty UTF-8 path (torch reads no checkpoint back from another "
                 f"name), got {args.out!r}")
    given = {k for k, v in vars(args).items() if v is not None}
    alone = " ".join(f"--{a.replace('_', '-')}" for a in sorted(given - set(DEMO_FLAGS)))
    for bad, message in [
            (args.demo and alone, f"--demo sets its training flags itself (a rerun goes on): drop {alone}"),
            (args.seeds and not args.demo, "--seeds is for --demo: a training run takes one --seed"),
            ({"seed", "seeds"} <= given, "--seed and --seeds both: pass one"),
            ({"steps", "tokens"} <= given, "--steps and --tokens both set the length: pass one")]:
        if bad:
            sys.exit(f"error: {message}")
    out = args.out or DEFAULTS["out"]
    if args.resume and not args.demo:
        saved = model.train_config(os.path.join(out, "ckpt.pt")) or sys.exit(
            f"error: --resume but {out}/ckpt.pt does not exist: start without --resume, or fix --out")
        differ = [f"--{k.replace('_', '-')} {saved[k]} (given {getattr(args, k)})" for k in sorted(given)
                  if k in saved and k not in PER_INVOCATION + MAY_CHANGE and saved[k] != getattr(args, k)]
        if differ:
            sys.exit(f"error: --resume continues {out} as it was configured, but these flags differ: "
                     f"{'; '.join(differ)}. Drop them, or start a new run with another --out")
        vars(args).update({k: v for k, v in saved.items() if k not in given and k not in PER_INVOCATION})
    args.init_from = args.init_from and data.hub_path(args.init_from)   # a hub id: its cached snapshot
    parent = model.train_config(args.init_from) if args.init_from and not args.resume else {}
    if args.init_from and not args.resume and {"arch", "size"} & given:
        sys.exit("error: the architecture and size come from --init-from: drop --arch and --size")
    inherited = ("data", "tokenizer", "seq_len", "split_seed", "arch", "size")  # args.json: what is used
    vars(args).update({k: parent.get(k, v) if k in inherited else v for k, v in DEFAULTS.items()
                       if getattr(args, k) is None})
    if args.data_seed is None:  # post-training reads on in its parent's stream (read_on)
        args.data_seed = parent.get("data_seed", parent.get("seed", args.seed))
    args.run_id = getattr(args, "run_id", None) or os.urandom(6).hex()   # (resumed: the checkpoint's)
    if args.resume:
        return args
    if args.init_from and os.path.isfile(os.path.join(args.init_from, "config.json")):
        c = model.official_config(args.init_from)  # official: the preset of its shape
        args.arch, args.size = c.arch, next((s for s, q in model.PRESETS[c.arch].items()
                                             if (q["d_model"], q["n_layer"]) == (c.d_model, c.n_layer)), None)
    args.peak_lr = parent.get("peak_lr") or not args.init_from and args.lr or PEAK_LR.get(args.size, 3e-3)
    args.lr = args.lr if args.lr is not None else args.peak_lr / (10 if args.init_from else 1)
    args.min_lr = args.min_lr if "min_lr" in given else min(args.min_lr, args.lr)
    if args.tokens is not None and math.isfinite(args.tokens):
        per_row = args.seq_len if args.task != "copy" else 2 * int(args.copy_len.split(",")[-1]) + 2
        per_step = args.batch_size * per_row * int(os.environ.get("WORLD_SIZE", 1)) * args.grad_accum
        args.steps = max(1, int(args.tokens // per_step))
    return args

def exit_on_bad_flags(args):
    """Every flag's value, in one place: the first problem is one line naming the flag and the fix."""
    fin, value = math.isfinite, vars(args)
    must = lambda k, ok, rule: (not ok, f"--{k.replace('_', '-')} must be {rule}, got {value[k]!r}")
    positive = "seq_len batch_size grad_accum steps ckpt_interval eval_interval eval_batches stop_at".split()
    lo, _, hi = (int(v) if v.isdigit() else 0 for v in args.copy_len.partition(","))   # 0: not a number
    bad_babi = [t for t in args.babi_tasks.split(",") if t not in tasks.BABI_TASKS]
    ckpt, real, exists = os.path.join(args.out, "ckpt.pt"), os.path.realpath, os.path.exists
    checks = [must(k, value[k] is None or value[k] > 0, "a positive integer") for k in positive] + [
        must("batch_size", args.batch_size * args.seq_len <= 1 << 32, "at most 2**32 tokens / --seq-len"),
        *[must(k, 0 <= value[k] < 2**63, "in [0, 2**63)") for k in ("seed", "data_seed", "split_seed")],
        must("device", re.fullmatch(r"auto|cpu|cuda(:\d+)?", args.device), "auto, cpu, cuda or cuda:N"),
        must("tokens", args.tokens is None or fin(args.tokens) and args.tokens > 0, "a finite number > 0"),
        must("lr", 0 < args.lr <= 1e3, "in (0, 1e3]"),
        must("min_lr", 0 <= args.min_lr <= args.lr, f"in [0, --lr] = [0, {args.lr:g}]"),
        must("warmup", 0 <= args.warmup < 1, "a fraction of the steps in [0, 1)"),
        must("weight_decay", fin(args.weight_decay) and args.weight_decay >= 0, "finite and >= 0"),
        must("grad_clip", args.grad_clip > 0, "> 0 (inf: no clipping)"),
        must("sigma", 0 < args.sigma <= 1e3, "in (0, 1e3] (its variance in float32)"),
        must("p_reset", 0 <= args.p_reset <= 1, "a probability in [0, 1]"),
        must("dist_timeout", 1 <= args.dist_timeout <= 1e7, "in [1, 1e7] seconds"),
        (not args.init_from and args.size not in model.PRESETS[args.arch], f"unknown --size {args.size!r} "
         f"for --arch {args.arch}: choose one of {list(model.PRESETS[args.arch])}"),
        (args.init_from and not exists(args.init_from), f"--init-from {args.init_from} does not exist"),
        (args.init_from and real(args.init_from) in (real(args.out), real(ckpt)),
         f"--init-from and --out are the same run ({args.out}): post-training needs another --out"),
        (exists(args.out) and not os.path.isdir(args.out), f"--out {args.out} is a file, not a directory"),
        (args.device.startswith("cuda") and not torch.cuda.is_available(), "no CUDA here: use --device cpu"),
        (not args.resume and exists(ckpt), f"{args.out} holds a run: --resume it, or use another --out"),
        (args.task != "lm" and (args.init_state == "tbtt" or args.streams), "--init-state tbtt and --streams "
         f"read documents in chunks; --task {args.task} examples are independent"),
        (not 0 < lo <= hi, "--copy-len must be LO,HI, 0 < LO <= HI"),
        (bad_babi, f"unknown --babi-tasks {bad_babi}: choose from {','.join(tasks.BABI_TASKS)}")]
    if any(bad for bad, _ in checks):
        sys.exit(f"error: {next(message for bad, message in checks if bad)}")
    try:  # one example, so that a --seq-len too short for the task, or a --tokenizer, is a clear error now
        _ = args.task != "lm" and make_task_sampler(args, 0, None).next_samples()
    except ValueError as e:
        sys.exit(f"error: --task {args.task}: {e}")

def lr_at(step, args):
    """Linear warm-up over the first `warmup` fraction of steps, then cosine decay to min_lr."""
    warm = int(args.warmup * args.steps)
    progress = (step - warm) / max(1, args.steps - warm)
    return args.lr * (step + 1) / warm if step < warm else \
        args.min_lr + 0.5 * (args.lr - args.min_lr) * (1 + math.cos(math.pi * min(1.0, progress)))

def make_optimizer(lm, lr, weight_decay, device):
    """AdamW; weight decay on matrices only, not on norms, biases nor parameters marked _no_weight_decay.
    A parameter marked _lr_scale (RWKV-6's decay: 2) trains at lr * scale; the loop keeps applying it."""
    groups = {}
    for p in lm.parameters():
        no_decay = p.dim() < 2 or getattr(p, "_no_weight_decay", False)
        groups.setdefault((0.0 if no_decay else weight_decay, getattr(p, "_lr_scale", 1.0)), []).append(p)
    groups = [dict(params=ps, weight_decay=wd, lr_scale=s, lr=lr * s) for (wd, s), ps in groups.items()]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), fused=device.type == "cuda")

def read_on(sampler, parent, rank):
    """Post-training reads on where the parent's sampler (same kind, seed) stopped: new data, as the paper."""
    path = os.path.join(parent, "ckpt.pt") if os.path.isdir(parent) else parent
    states = model.read_checkpoint(path, "cpu").get("sampler", []) if os.path.isfile(path) else []
    state = dict(states[rank]) if rank < len(states) else {}
    if state.keys() == sampler.state_dict().keys() and state["seed"] == sampler.seed:
        if "row_doc" in state:  # every row starts the next unread document
            state.update(row_doc=[-1] * sampler.batch_size, row_pos=[0] * sampler.batch_size)
        sampler.load_state_dict(state)

def make_task_sampler(args, seed, filler_tokens):
    """Batches of --task examples of --seq-len + 1 tokens (bAbI's hidden in filler_tokens), or copy's."""
    babi = args.task == "babilong"
    kw = dict(babi_tasks=tuple(args.babi_tasks.split(",")), filler_tokens=filler_tokens) if babi else {}
    length = tuple(map(int, args.copy_len.split(","))) if args.task == "copy" else args.seq_len + 1
    return data.TaskSampler(tasks.babi_mixture if babi else tasks.TASKS[args.task], args.batch_size, seed,
                            tokenizer=args.tokenizer, length=length, **kw)

@torch.no_grad()
def evaluate_loss(lm, sampler, n_batches, device, autocast):
    """Mean next-token loss (tasks: per answer token) on validation batches, from the zero state."""
    lm.eval()  # no layer here depends on the mode; one added (dropout) would
    total, count = 0.0, 0
    for x, y, _ in (sampler.next_batch() for _ in range(n_batches)):
        with autocast:
            logits = lm(x.to(device))[0].float().flatten(0, 1)
        total += F.cross_entropy(logits, y.to(device).flatten(), ignore_index=-100, reduction="sum").item()
        count += int((y != -100).sum())
    lm.train()
    return total / count

def diverged(args, step, what, saved):
    last = (f"the last checkpoint, {args.out}/ckpt.pt (step {saved}), is intact: continue it with --resume "
            "and a lower --lr" if saved else "no checkpoint was saved: start again with a lower --lr")
    sys.exit(f"error: training diverged at step {step} ({what} not finite); stopped without saving: {last}")

@contextmanager
def open_run(args, step):
    """--out for this process alone (a flock: the OS releases it however the process ends, even kill -9);
    writes args.json, yields metrics.jsonl without its rows past `step` (past the checkpoint: to redo)."""
    with open(os.path.join(args.out, "train.lock"), "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            sys.exit(f"error: another train.py (pid {lock.read().strip()}) is writing {args.out}: wait for "
                     f"it, or use another --out")
        lock.truncate(0)
        print(os.getpid(), file=lock, flush=True)
        # under the lock no other train.py writes --out: it must still hold what this process read, no run
        # (step 0) or the checkpoint it resumes (another may have saved there since exit_on_bad_flags looked)
        ckpt = os.path.join(args.out, "ckpt.pt")
        saved = model.read_checkpoint(ckpt, "cpu", mmap=True).get("step", "?") if os.path.isfile(ckpt) else 0
        if saved != step:
            sys.exit(f"error: {args.out} holds a run: --resume it, or use another --out" if not step else
                     f"error: {ckpt} is at step {saved}, not {step} as read: another train.py wrote it "
                     "meanwhile; --resume again")
        path, written = os.path.join(args.out, "metrics.jsonl"), os.path.join(args.out, "args.json")
        theirs = step and os.path.isfile(written) and model._read_json(written, "move it away").get("run_id")
        if theirs and theirs != args.run_id:
            sys.exit(f"error: {path} and args.json are another run's than {ckpt}: move them away, or resume "
                     "the run that wrote the checkpoint")
        try:  # a row cut short by a kill has no "}\n": dropped
            rows = open(path).readlines() if os.path.exists(path) else []
            kept = "".join(r for r in rows if r.endswith("}\n") and json.loads(r)["step"] <= step)
        except (ValueError, KeyError, TypeError):   # (not UTF-8: a ValueError)
            sys.exit(f"error: {path} holds a row that is not train.py's (JSON with a step): move it away")
        for name, text in (("args.json", json.dumps(vars(args), indent=1)), ("metrics.jsonl", kept)):
            data.write_atomically(os.path.join(args.out, name), lambda t: pathlib.Path(t).write_text(text))
        with open(path, "a") as log:
            yield log

def save_checkpoint(path, lm, optimizer, step, args, sampler, strategy, rank, world):
    """All a resume needs, with every rank's sampler and strategy state: every rank continues exactly."""
    states = [{"sampler": sampler.state_dict(), "strategy": strategy.state_dict()}] * world
    if world > 1:
        torch.distributed.all_gather_object(states, states[0])
    if rank == 0:
        ckpt = {"model_config": vars(lm.cfg), "model": lm.state_dict(), "optimizer": optimizer.state_dict(),
                "train_config": vars(args), "step": step, **{k: [g[k] for g in states] for k in states[0]}}
        data.write_atomically(path, lambda tmp: torch.save(ckpt, tmp))

if __name__ == "__main__":
    main()
