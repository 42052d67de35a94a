r"""The one training script: from scratch, or post-training a checkpoint, with a chosen initial state.

    python train.py --init-state sp                      # the CPU default: tiny Mamba-2, stdlib bytes
    python train.py --init-from out/base --init-state sp --steps 300   # post-training (lr = peak/10)
    python train.py --init-from PATH/mamba2-370m --data corpus/ --tokenizer PATH/tokenizer.json \
        --seq-len 2048 --init-state sp --steps 100 --grad-accum 32   # Fig. 5 on an official checkpoint
    torchrun --standalone --nproc_per_node 8 train.py ...   # DDP: each process reads --batch-size rows

The interventions differ only in each sequence's initial state (interventions.py); the rest is Appendix B's
recipe. --out: ckpt.pt (all a resume needs; atomic; finite weights), metrics.jsonl, args.json, train.lock."""
import json
import math
import os
import signal
import sys
import time
from contextlib import nullcontext

if __name__ == "__main__":   # Ctrl-C while torch loads (seconds): a line, not a traceback
    signal.signal(signal.SIGINT, lambda *_: sys.exit("interrupted"))
import torch
import torch.nn.functional as F
from tqdm import tqdm

import data
import interventions
import model
from plumbing import checkpoints, demo, distributed, flags, runs, strategy_options

def main(argv=None):
    """The config (flags.get_args: on --resume the checkpoint's, post-training the parent's), then the run."""
    runs.stop_on_signals()   # Ctrl-C, SIGTERM: a KeyboardInterrupt, temporary files removed
    args = None
    try:
        args = flags.get_args(argv, description=__doc__)
        if args.demo:
            return demo.main(args, train)
        return train(args)
    except (OSError, ValueError, MemoryError, RuntimeError, KeyboardInterrupt) as e:
        runs.exit_in_one_line(e, args)   # bad input, out of memory, a lost torchrun rank, Ctrl-C
        raise   # any other error is a bug: its traceback

def setup_data(args):
    """-> (sampler, val_sampler, vocab_size, the tokenizer's n_vocab (Markov states: None), the data's
    name): windows of --data, or --task's examples."""
    corpus = read_corpus(args) if args.task in ("lm", "babilong") else None  # passkey, copy: no --data
    # what the run read, kept in its checkpoint: a resume must read the same, post-training the same tokenizer
    read = dict(tokenizer_id=data.get_tokenizer(args.tokenizer).name,
                data_id=checkpoints.data_id(corpus, args.split_seed) if corpus else None)
    flags.require_what_was_read(args, read)
    vars(args).update(read)
    rows = args.batch_size * distributed.world()   # the run's rows a batch; rank r reads B of them (RankRows)
    if args.task == "lm":
        Sampler = data.DocumentStreams if args.init_state == "tbtt" or args.streams else data.RandomWindows
        eot = (corpus.eot_token,) if Sampler is data.DocumentStreams else ()
        sampler = Sampler(corpus.train, *eot, rows, args.seq_len, args.data_seed)
        val_sampler = data.RandomWindows(corpus.val, rows, args.seq_len, 10_000)
        if args.init_from and not args.resume:
            checkpoints.read_on(sampler, args.init_from)
    else:  # babilong hides its stories in --data text (train / val split); passkey and copy bring their own
        sampler = flags.make_task_sampler(args, args.data_seed, corpus and corpus.train, rows)
        val_sampler = flags.make_task_sampler(args, 10_000, corpus and corpus.val, rows)
    sampler = distributed.rows(sampler)
    val_sampler = distributed.rows(val_sampler)
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
    saved = len(resume["sampler"]) if resume else 0
    world = distributed.world()
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
    options = {k: vars(args)[k] for k in strategy_options.OPTIONS[args.init_state]}   # sigma, p_reset: theirs
    options["seed"] += distributed.rank()   # each rank draws its own noise, SP resets; rank 0 one process's
    strategy = interventions.make_strategy(args.init_state, lm, args.batch_size, **options)
    if resume:
        lm.load_state_dict(resume["model"])
        optimizer.load_state_dict(resume["optimizer"])
        sampler.load_state_dict(resume["sampler"][distributed.rank()])
        strategy.load_state_dict(resume["strategy"][distributed.rank()])
    return lm, optimizer, strategy, resume["step"] if resume else 0

def make_optimizer(lm, lr, weight_decay, device):
    """AdamW (App. B); weight decay on matrices only, not on norms, biases nor parameters marked
    _no_weight_decay. A parameter marked _lr_scale (RWKV-6's decay: 2) trains at lr * scale; the loop keeps
    applying it."""
    groups = {}
    for p in lm.parameters():
        no_decay = p.dim() < 2 or getattr(p, "_no_weight_decay", False)
        groups.setdefault((0.0 if no_decay else weight_decay, getattr(p, "_lr_scale", 1.0)), []).append(p)
    groups = [dict(params=ps, weight_decay=wd, lr_scale=s, lr=lr * s) for (wd, s), ps in groups.items()]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), fused=device.type == "cuda")

def lr_at(step, args):
    """Linear warm-up over the first `warmup` fraction of steps, then cosine decay to min_lr (App. B)."""
    warm = int(args.warmup * args.steps)
    if step < warm:
        return args.lr * (step + 1) / warm
    progress = (step - warm) / max(1, args.steps - warm)
    return args.min_lr + 0.5 * (args.lr - args.min_lr) * (1 + math.cos(math.pi * min(1.0, progress)))

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

@torch.no_grad()
def evaluate_loss(lm, sampler, n_batches, device, autocast):
    """Mean next-token loss (tasks: per answer token) on validation batches, from the zero state; under
    torchrun over every rank's rows."""
    lm.eval()  # no layer here depends on the mode; one added (dropout) would
    total = 0.0
    count = 0
    for x, y, _ in (sampler.next_batch() for _ in range(n_batches)):
        with autocast:
            logits = lm(x.to(device))[0].float().flatten(0, 1)
        total += F.cross_entropy(logits, y.to(device).flatten(), ignore_index=-100, reduction="sum").item()
        count += int((y != -100).sum())
    lm.train()
    total, count = distributed.sums(total, count)
    return total / count

def train(args):
    """A run: its data, its model (new, --init-from's or resumed), then Appendix B's loop, each step's
    gradients from the strategy's initial states (accumulate_gradients). -> the trained LM."""
    flags.exit_on_bad_flags(args)
    device = distributed.start(runs.device(args.device), args.dist_timeout)   # torchrun: this rank's GPU
    lead = distributed.rank() == 0   # the one process that prints and writes --out's files
    os.makedirs(args.out, exist_ok=True)
    sampler, val_sampler, vocab_size, n_vocab, source = setup_data(args)
    val_state0 = val_sampler.state_dict()  # the same validation batches at every evaluation
    ckpt_path = checkpoints.ckpt_file(args.out)
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
    with runs.open_run(args, step) if lead else open(os.devnull, "w") as log, \
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
                runs.diverged(args, step + 1, f"loss {loss:g}, gradient norm {grad_norm:g}", saved_step)
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
                    runs.diverged(args, step, "the validation loss", saved_step)
                checkpoints.save_checkpoint(ckpt_path, lm, optimizer, step, args, sampler, strategy)
                saved_step = step
    if lead:
        print(f"done: step {step}, {time.time() - t0:.0f}s, " + (f"checkpoint {ckpt_path} (step {saved_step})"
              if saved_step else "no checkpoint (--stop-at before the first --ckpt-interval)"))
    del fwd   # DDP's hold on the process group, which finish() ends
    distributed.finish()
    return lm

if __name__ == "__main__":
    main()
