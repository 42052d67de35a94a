"""Timings as tables: the scans' three forms (on the CPU Triton only under TRITON_INTERPRET=1, a correctness
tool far slower than the loop), streaming evaluation, training steps of the paper's presets.

    python bench.py                    # scans at T = 1k, 4k, 16k
    python bench.py --what eval        # streaming evaluation: memory vs length, Effective Remembrance cost
    python bench.py --what train --presets mamba2:85m,gla:70m --seq-len 2048 --batch-size 8"""
import argparse
import os
import resource
import time

import torch
import torch.nn.functional as F

import data
import deltanet
import evaluate
import gla
import interventions
import model
import rwkv
import ssm
import train
from plumbing import bench_flags
from plumbing.bench_flags import print_row
from plumbing.bench_inputs import scan_inputs

# Fig. 2, 10; the official 130M; Gated DeltaNet (not in the paper) at GLA's shape
TRAIN_PRESETS = "mamba2:45m,mamba2:85m,mamba2:125m,gla:70m,rwkv6:70m,mamba2:130m,gated_deltanet:70m"
# scan -> {"naive", "chunked", "triton"} -> the form; plumbing/bench_inputs.py draws each one's inputs
SCANS = {"ssd (mamba2)": ssm.SSD_SCANS, "selective (mamba1)": ssm.SELECTIVE_SCANS, "gla": gla.GLA_SCANS,
         "rwkv6": rwkv.RWKV6_SCANS, "gated deltanet": deltanet.GATED_DELTA_SCANS}

def times(fn, repeats, device):
    """Sorted seconds of `repeats` calls after a warm-up (allocation, compilation), and the peak memory in
    bytes: on CUDA allocated by torch, on the CPU the process's resident peak (Linux's ru_maxrss: kB)."""
    cuda = device.type == "cuda"
    out = []
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    for _ in range(repeats + 1):  # the warm-up call (not reported) also absorbs any work queued before
        t = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        out.append(time.perf_counter() - t)
    peak = torch.cuda.max_memory_allocated() if cuda else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return sorted(out[1:]), peak * (1 if cuda else 1024)

def bench_scans(args, device):
    """Best forward time of each form (ms), and its distance from the loop: max |difference| / max |loop|."""
    forms_timed = 3 if device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1" else 2
    rows = []
    dtype = torch.bfloat16 if args.bf16 else torch.float32
    print_row("scan", "T", "naive ms", "chunked ms", "speed-up", "triton ms", "rel diff")
    for name, forms, T in [(n, f, T) for n, f in SCANS.items() for T in args.lengths]:
        inputs, h0 = scan_inputs(name, T, args.scan_batch, paper=args.paper_shapes)
        inputs = tuple(x.to(device, dtype) for x in inputs)
        h0 = h0.to(device)
        ms = [None] * 3   # ms per form; a form not timed: None
        ys = []
        for i, f in enumerate(list(forms.values())[:forms_timed]):
            run = torch.no_grad()(lambda: ys.append(f(*inputs, initial_state=h0)[0].float()))
            ms[i] = 1e3 * times(run, args.repeats, device)[0][0]
        diff = max(float((y - ys[0]).abs().max() / ys[0].abs().max()) for y in ys[1:])
        rows.append(dict(scan=name, T=T, naive_ms=ms[0], chunked_ms=ms[1], triton_ms=ms[2], diff=diff))
        print_row(name, T, ms[0], ms[1], f"{ms[0] / ms[1]:.0f}x", ms[2], f"{diff:.1e}")
    return rows

def bench_eval(args, device, lengths=(8192, 131072), T=1024):
    """position_nll per length, shortest first (flat peak memory: no growth); EffRem vs its definition."""
    lm = model.LM(model.make_config("mamba2", "tiny", vocab_size=257)).to(device)
    x = torch.randint(0, 257, (2, max(lengths) + 1), device=device)
    rows = []
    print_row("position_nll tokens", "peak MB", "seconds", "tokens/s")
    for L in sorted(lengths):
        (s, *_), peak = times(lambda: evaluate.position_nll(lm, x[:, :L + 1], 1024), args.repeats, device)
        rows.append(dict(tokens=L, peak_mb=peak / 2 ** 20, seconds=s))
        print_row(L, peak / 2 ** 20, s, 2 * L / s)
    xe = x[:, :T].repeat(4, 1)  # 8 sequences
    cuts = evaluate.default_cuts(T, 32)
    out = []
    forms = {"streamed": lambda: out.append(evaluate.effective_remembrance(lm, xe, T, cuts).mean(0)),
             "one forward per cut": lambda: out.append(evaluate.effective_remembrance_naive(lm, xe, T, cuts))}
    print_row(f"EffRem_{T}, 8 seqs", "seconds")
    secs = [times(f, args.repeats, device)[0][0] for f in forms.values()]
    for name, s in zip(forms, secs):
        print_row(name, s)
    diff = float((out[0] - out[-1].double()).abs().max())
    print(f"streamed vs one forward per cut: max |diff| {diff:.1e}")
    return dict(ppl=rows, effrem_s=secs, max_abs_diff=diff)

def bench_train(args, device, vocab_size=50280):
    """Training steps of each preset (GPT-NeoX's vocabulary, as Mamba's): train.py's step, clipping, AdamW."""
    names = [p.strip() for p in args.presets.split(",")]
    try:  # all checked before any timing: one line naming the known archs and sizes
        cfgs = {p: model.make_config(*p.partition(":")[::2], vocab_size=vocab_size) for p in names}
    except ValueError as e:
        raise SystemExit(f"error: {e}")
    print_row(f"preset (T {args.seq_len})", "form", "params", "best s", "median s", "tokens/s", "peak GB")
    rows = []
    cuda = device.type == "cuda"
    for name, form in [(p, f) for p in names for f in args.forms.split(",")]:
        lm = model.set_scan_impl(model.LM(cfgs[name]).to(device), form)
        optimizer = train.make_optimizer(lm, lr=1e-4, weight_decay=0.01, device=device)  # lr: no cost
        idx = torch.randint(vocab_size, (args.batch_size, args.seq_len + 1), device=device)  # data: not timed
        sampler = argparse.Namespace(next_batch=lambda: data.Batch(idx[:, :-1], idx[:, 1:], None))
        strategy = interventions.make_strategy("zero", lm, args.batch_size)
        autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda)  # as train.py

        def step():
            optimizer.zero_grad(set_to_none=True)
            train.accumulate_gradients(lm, sampler, strategy, 1, device, autocast)
            torch.nn.utils.clip_grad_norm_(lm.parameters(), 1.0)
            optimizer.step()
        secs, peak = times(step, args.repeats, device)
        rows.append(dict(preset=name, form=form, params=lm.num_params(), best_s=secs[0],
                         median_s=secs[len(secs) // 2], tokens_per_s=args.batch_size * args.seq_len / secs[0],
                         peak_gb=peak / 1e9 if cuda else None))
        print_row(*rows[-1].values())
    return rows

def main(argv=None):
    args = bench_flags.parse_args(argv, __doc__, TRAIN_PRESETS)
    device = bench_flags.device_of(args)
    print(f"device: {device}" + ("" if device.type == "cuda" else f", {torch.get_num_threads()} threads"))
    benches = {"scans": bench_scans, "eval": bench_eval, "train": bench_train}
    for what in ("scans", "eval") if args.what == "all" else (args.what,):
        try:
            benches[what](args, device)
        except (MemoryError, RuntimeError) as e:   # an allocator's (CUDA's out of memory: a RuntimeError too)
            bench_flags.exit_if_out_of_memory(what, e)
            raise
        print()

if __name__ == "__main__":
    main()
