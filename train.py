r"""The one training script: from scratch, or post-training a checkpoint, with a chosen initial state.

    python train.py --init-state sp                      # the CPU default: tiny Mamba-2, stdlib bytes
    python train.py --init-from out/base --init-state sp --steps 300   # post-training (lr = peak/10)
    python train.py --init-from PATH/mamba2-370m --data corpus/ --tokenizer PATH/tokenizer.json \
        --seq-len 2048 --init-state sp --steps 100 --grad-accum 32   # Fig. 5 on an official checkpoint
    torchrun --standalone --nproc_per_node 8 train.py ...   # DDP: each process reads --batch-size rows

The interventions differ only in each sequence's initial state (interventions.py); the rest is Appendix B's
recipe. --out: ckpt.pt (all a resume needs; atomic; finite weights), metrics.jsonl, args.json, train.lock."""
import fcntl
import json
import math
import os
import pathlib
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
from plumbing import checkpoints, demo, distributed, files, flags

def accumulate_gradients(lm, sampler, strategy, n_micro, device, autocast=nullcontext()):
    """The gradients of one optimizer step, the paper's loop: initial state -> forward -> backward -> observe.
    Each micro-batch is a batch for the strategy. lm under DDP: the ranks' gradients averaged at the end."""
    total = 0.0
    tokens = 0
    for micro in range(n_micro):
        batch = sampler.next_batch()  # data.Batch: x, y and (DocumentStreams) the rows that start a document
        x = batch.x.to(device)
        y = batch.y.to(device)
        initial_state = strategy.initial_state(batch)
        with distributed.no_sync(lm, micro < n_micro - 1):   # DDP: all-reduced once, in the last backward
            with autocast:
                logits, final_state = lm(x, state=initial_state)
                # task batches mark every non-answer target -100: the mean over the answer tokens
                loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), ignore_index=-100)
            (loss / n_micro).backward()  # the gradient of the mean over the micro-batches
        strategy.observe(final_state)
        total += loss.item()
        tokens += x.numel()
    return total / n_micro, tokens

def train(args):
    flags.exit_on_bad_flags(args)
    if args.task != "lm":
        exit_on_bad_task(args)
    auto = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(auto if args.device == "auto" else args.device)
    device = distributed.start(device, args.dist_timeout)   # torchrun: this rank's GPU, in the process group
    lead = distributed.rank() == 0   # the one process that prints and writes --out's files
    os.makedirs(args.out, exist_ok=True)
    sampler, val_sampler, vocab_size, n_vocab, source = setup_data(args)
    val_state0 = val_sampler.state_dict()  # the same validation batches at every evaluation
    ckpt_path = os.path.join(args.out, "ckpt.pt")
    lm, optimizer, strategy, step = setup_model(args, device, vocab_size, n_vocab, sampler, ckpt_path)
    fwd = distributed.wrap(lm, device)   # DDP under torchrun; lm itself is evaluated and saved
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()
    streams = " --streams" if args.streams else ""
    world = distributed.world()
    ranks = f" x {world} processes" if distributed.launched() else ""
    if lead:
        print(f"{lm.extra_repr()}, data {source}, --init-state {args.init_state}{streams}, {args.steps} "
              f"steps of {args.grad_accum * args.batch_size}{ranks} x {args.seq_len} tokens, lr {args.lr:g}, "
              f"{device}" + (f", resuming at step {step}" if step else ""))
    with open_run(args, step) if lead else open(os.devnull, "w") as log, \
            tqdm(total=args.steps, initial=step, disable=args.quiet or not lead, file=sys.stdout) as bar:
        t0 = time.time()
        start = step
        saved_step = step or None  # resumed: the checkpoint's step
        while step < min(args.steps, args.stop_at or args.steps):  # --stop-at: as if killed after that step
            lr = lr_at(step, args)
            for group in optimizer.param_groups:
                group["lr"] = lr * group["lr_scale"]
            optimizer.zero_grad(set_to_none=True)
            loss, tokens = accumulate_gradients(fwd, sampler, strategy, args.grad_accum, device, amp)
            loss = distributed.mean(loss)   # over the ranks: each logs, and stops on, one process's number
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
            print(json.dumps(record), file=log, flush=True)
            bar.set_postfix({k: f"{v:.3g}" for k, v in record.items() if k != "step"})
            bar.update(1)
            if save:
                if not math.isfinite(record["val_loss"]):  # only weights with a finite val loss are saved
                    diverged(args, step, "the validation loss", saved_step)
                checkpoints.save_checkpoint(ckpt_path, lm, optimizer, step, args, sampler, strategy)
                saved_step = step
    if lead:
        print(f"done: step {step}, {time.time() - t0:.0f}s, " + (f"checkpoint {ckpt_path} (step {saved_step})"
              if saved_step else "no checkpoint (--stop-at before the first --ckpt-interval)"))
    del fwd   # DDP's hold on the process group, which finish() ends
    distributed.finish()
    return lm

def setup_data(args):
    """-> (sampler, val_sampler, vocab_size, the tokenizer's n_vocab (Markov states: None), the data's
    name): windows of --data, or --task's examples."""
    corpus = read_corpus(args) if args.task in ("lm", "babilong") else None  # passkey, copy: no --data
    # what the run read, kept in its checkpoint: a resume must read the same, post-training the same tokenizer
    now = dict(tokenizer_id=data.get_tokenizer(args.tokenizer).name,
               data_id=checkpoints.data_id(corpus, args.split_seed) if corpus else None)
    saved = vars(args) if args.resume else {}
    if args.init_from and not args.resume:
        saved = {"tokenizer_id": checkpoints.train_config(args.init_from).get("tokenizer_id")}
    for key, flag, fix in [("tokenizer_id", "--tokenizer", "pass the --tokenizer it was trained with"),
                           ("data_id", "--data", "restore its files, or start a new run")]:
        data.require(saved.get(key) in (None, now[key]), f"{flag} {vars(args)[flag[2:]]} ({now[key]}) does "
                     f"not match {args.out if args.resume else args.init_from}'s {saved.get(key)}: {fix}")
    vars(args).update(now)
    rows = args.batch_size * distributed.world()   # the run's rows a batch; rank r reads B of them (RankRows)
    if args.task == "lm":
        Sampler = data.DocumentStreams if args.init_state == "tbtt" or args.streams else data.RandomWindows
        eot = (corpus.eot_token,) if Sampler is data.DocumentStreams else ()
        sampler = Sampler(corpus.train, *eot, rows, args.seq_len, args.data_seed)
        val_sampler = data.RandomWindows(corpus.val, rows, args.seq_len, 10_000)
        if args.init_from and not args.resume:
            checkpoints.read_on(sampler, args.init_from)
    else:  # babilong hides its stories in --data text (train / val split); passkey and copy bring their own
        sampler = make_task_sampler(args, args.data_seed, corpus and corpus.train, rows)
        val_sampler = make_task_sampler(args, 10_000, corpus and corpus.val, rows)
    sampler, val_sampler = distributed.rows(sampler), distributed.rows(val_sampler)
    tokenizer = corpus.tokenizer if corpus else data.get_tokenizer(args.tokenizer)   # Markov: None
    n_vocab = tokenizer.n_vocab if tokenizer else None
    vocab_size = corpus.vocab_size if corpus else n_vocab
    return sampler, val_sampler, vocab_size, n_vocab, corpus.name if corpus else args.task

def read_corpus(args):
    """--data as data.load_data reads it, more than --seq-len tokens in each split (text for babilong)."""
    with distributed.rank_zero_first():   # one process tokenizes --data into the cache, the others read it
        corpus = data.load_data(args.data, args.tokenizer, args.split_seed, cache_dir=args.cache_dir)
    if args.task == "babilong" and corpus.tokenizer is None:
        raise ValueError(f"--task babilong hides its stories in --data text, but {corpus.name} is not text")
    for split, tokens in (("training", corpus.train), ("validation", corpus.val)):
        data.require(len(tokens) > args.seq_len, f"the {split} split of {corpus.name} has {len(tokens)} "
                     f"tokens, --seq-len {args.seq_len} needs more: use more text or a smaller --seq-len")
    return corpus

def setup_model(args, device, vocab_size, n_vocab, sampler, path):
    """-> (lm, optimizer, strategy, step): new, --init-from's, or resumed from `path` with the sampler."""
    torch.manual_seed(args.seed)
    resume = checkpoints.read_checkpoint(path, device) if args.resume else None
    if resume and not {"model_config", "model", "optimizer", "step", "sampler", "strategy"} <= resume.keys():
        raise ValueError(f"{path} is not a checkpoint of train.py: it cannot be resumed")
    saved, world = len(resume["sampler"]) if resume else 0, distributed.world()
    if resume and saved != world:   # one sampler and strategy state a process that trained it
        raise ValueError(f"{path} was saved by {saved} process{'es' * (saved > 1)}, this run has {world}: "
                         f"resume with torchrun --nproc_per_node {saved}")
    if resume:
        lm = model.LM(model.ModelConfig(**resume["model_config"]))
    elif args.init_from:
        lm = checkpoints.from_pretrained(args.init_from)
    else:
        lm = model.LM(model.make_config(args.arch, args.size, vocab_size=vocab_size))
    args.arch = lm.cfg.arch
    checkpoints.check_vocabulary(lm, vocab_size, n_vocab, args.init_from if args.init_from else path)
    if resume and args.steps < resume["step"]:
        raise ValueError(f"--steps {args.steps} is below the step of {path} ({resume['step']}): pass more")
    optimizer = make_optimizer(lm.to(device), args.lr, args.weight_decay, device)
    options = {k: vars(args)[k] for k in interventions.OPTIONS[args.init_state]}   # sigma, p_reset: theirs
    options["seed"] += distributed.rank()   # each rank draws its own noise, SP resets; rank 0 one process's
    strategy = interventions.make_strategy(args.init_state, lm, args.batch_size, **options)
    if resume:
        lm.load_state_dict(resume["model"])
        optimizer.load_state_dict(resume["optimizer"])
        sampler.load_state_dict(resume["sampler"][distributed.rank()])
        strategy.load_state_dict(resume["strategy"][distributed.rank()])
    return lm, optimizer, strategy, resume["step"] if resume else 0

def main(argv=None):
    for s in (signal.SIGINT, signal.SIGTERM):   # SIGTERM as Ctrl-C: temporary files removed
        signal.signal(s, interrupted)
    args = None
    try:
        args = flags.get_args(argv, description=__doc__)
        if args.demo:
            return demo.main(args, train)
        return train(args)
    except (OSError, ValueError) as e:  # bad input: one line, no trace
        sys.exit(f"error: {e}")
    except (MemoryError, RuntimeError) as e:  # the CPU allocator's out of memory is a plain RuntimeError,
        if isinstance(e, (MemoryError, torch.OutOfMemoryError)) or "can't allocate memory" in str(e):
            sys.exit("error: out of memory: lower --batch-size (and raise --grad-accum) or --seq-len")
        if not (why := distributed.lost(e)):   # as is a collective's that lost a peer (torchrun)
            raise
        sys.exit(f"error: rank {os.environ['RANK']} lost the other processes ({why}): one ended, or froze or "
                 f"was busy past --dist-timeout {args.dist_timeout:g} s (tokenizing a large --data: tokenize "
                 f"it first, python -m plumbing.token_cache); {checkpoints.last_checkpoint(args)}")
    except KeyboardInterrupt:  # Ctrl-C, SIGTERM
        if args and args.demo:
            sys.exit("interrupted: rerun the same command to go on: finished runs are kept, the one "
                     "interrupted resumes")
        sys.exit(f"interrupted: {checkpoints.last_checkpoint(args)}")

def interrupted(signum, frame):
    """The first Ctrl-C or SIGTERM stops the run; more, during its clean-up, are ignored."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt

def lr_at(step, args):
    """Linear warm-up over the first `warmup` fraction of steps, then cosine decay to min_lr."""
    warm = int(args.warmup * args.steps)
    if step < warm:
        return args.lr * (step + 1) / warm
    progress = (step - warm) / max(1, args.steps - warm)
    return args.min_lr + 0.5 * (args.lr - args.min_lr) * (1 + math.cos(math.pi * min(1.0, progress)))

def make_optimizer(lm, lr, weight_decay, device):
    """AdamW; weight decay on matrices only, not on norms, biases nor parameters marked _no_weight_decay.
    A parameter marked _lr_scale (RWKV-6's decay: 2) trains at lr * scale; the loop keeps applying it."""
    groups = {}
    for p in lm.parameters():
        no_decay = p.dim() < 2 or getattr(p, "_no_weight_decay", False)
        groups.setdefault((0.0 if no_decay else weight_decay, getattr(p, "_lr_scale", 1.0)), []).append(p)
    groups = [dict(params=ps, weight_decay=wd, lr_scale=s, lr=lr * s) for (wd, s), ps in groups.items()]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), fused=device.type == "cuda")

def make_task_sampler(args, seed, filler_tokens, rows=None):
    """Batches of `rows` (default --batch-size) --task examples of --seq-len + 1 tokens (bAbI's hidden in
    filler_tokens), or copy's."""
    babi = args.task == "babilong"
    kw = dict(babi_tasks=tuple(args.babi_tasks.split(",")), filler_tokens=filler_tokens) if babi else {}
    length = tuple(map(int, args.copy_len.split(","))) if args.task == "copy" else args.seq_len + 1
    task_fn = tasks.babi_mixture if babi else tasks.TASKS[args.task]
    return data.TaskSampler(task_fn, rows or args.batch_size, seed, tokenizer=args.tokenizer, length=length,
                            **kw)

def exit_on_bad_task(args):
    """One --task example now: a --seq-len too short for the task, or a --tokenizer, is a clear error."""
    try:
        make_task_sampler(args, 0, None).next_samples()
    except ValueError as e:
        sys.exit(f"error: --task {args.task}: {e}")

@torch.no_grad()
def evaluate_loss(lm, sampler, n_batches, device, autocast):
    """Mean next-token loss (tasks: per answer token) on validation batches, from the zero state; under
    torchrun over every rank's rows."""
    lm.eval()  # no layer here depends on the mode; one added (dropout) would
    total, count = 0.0, 0
    for x, y, _ in (sampler.next_batch() for _ in range(n_batches)):
        with autocast:
            logits = lm(x.to(device))[0].float().flatten(0, 1)
        total += F.cross_entropy(logits, y.to(device).flatten(), ignore_index=-100, reduction="sum").item()
        count += int((y != -100).sum())
    lm.train()
    total, count = distributed.sums(total, count)
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
        saved = checkpoints.read_checkpoint(ckpt, "cpu", mmap=True).get("step", "?") if os.path.isfile(ckpt) else 0
        if saved != step and not step:
            sys.exit(f"error: {args.out} holds a run: --resume it, or use another --out")
        if not step and flags.run_files(args.out) and not flags.records_this_run(args):   # since looked
            sys.exit(f"error: {args.out} holds another run's {flags.run_files(args.out)}: use another --out")
        if saved != step:
            sys.exit(f"error: {ckpt} is at step {saved}, not {step} as read: another train.py wrote it "
                     "meanwhile; --resume again")
        path = os.path.join(args.out, "metrics.jsonl")
        written = os.path.join(args.out, "args.json")
        resumed = step and os.path.isfile(written)   # a new run: another's args.json is replaced
        theirs = files.read_json(written, "move it away").get("run_id") if resumed else None
        if theirs and theirs != args.run_id:
            sys.exit(f"error: {path} and args.json are another run's than {ckpt}: move them away, or resume "
                     "the run that wrote the checkpoint")
        try:  # a row cut short by a kill has no "}\n": dropped
            rows = open(path).readlines() if os.path.exists(path) else []
            kept = "".join(r for r in rows if r.endswith("}\n") and json.loads(r)["step"] <= step)
        except (ValueError, KeyError, TypeError):   # (not UTF-8: a ValueError)
            sys.exit(f"error: {path} holds a row that is not train.py's (JSON with a step): move it away")
        for name, text in (("args.json", json.dumps(vars(args), indent=1)), ("metrics.jsonl", kept)):
            write = lambda tmp: pathlib.Path(tmp).write_text(text)
            files.write_atomically(os.path.join(args.out, name), write)
        with open(path, "a") as log:
            yield log

if __name__ == "__main__":
    main()
