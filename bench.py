"""
Timings as tables: the scans (naive loop vs chunked vs Triton; on the CPU Triton only with
--triton-interpret, a correctness tool far slower than the loop), evaluation, training steps.

    python bench.py                    # scans at T = 1k, 4k, 16k
    python bench.py --what eval        # streaming evaluation: memory vs length, Effective Remembrance cost
    python bench.py --what train --presets mamba2:85m,gla:70m --seq-len 2048 --batch-size 8 --tokens 34e9
"""
import argparse
import contextlib
import os
import resource
import statistics
import sys
import time
import types

if "--triton-interpret" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (by ssm.py)
import torch
import torch.nn.functional as F

import evaluate
import gla
import interventions
import model
import rwkv
import ssm
import train

# The paper's from-scratch sizes (Fig. 2, Fig. 10) and the official Mamba-2 130M's dimensions.
TRAIN_PRESETS = "mamba2:45m,mamba2:85m,mamba2:125m,gla:70m,rwkv6:70m,mamba2:130m"
SCANS = {"ssd (mamba2)": (ssm.ssd_naive, ssm.ssd_chunked, ssm.ssd_triton),
         "selective (mamba1)": (ssm.selective_scan_naive, ssm.selective_scan_chunked,
                                ssm.selective_scan_triton),
         "gla": (gla.gla_naive, gla.gla_chunked, gla.gla_triton),
         "rwkv6": (rwkv.rwkv6_naive, rwkv.rwkv6_chunked, rwkv.rwkv6_triton)}


def print_row(*cells):
    """One table row: the first cell left-aligned, the others right-aligned; floats to 3-4 digits."""
    text = [f"{c:.3g}" if isinstance(c, float) and abs(c) < 100 else f"{c:.0f}" if isinstance(c, float)
            else "-" if c is None else str(c) for c in cells]
    print(f"{text[0]:<20}" + "".join(f"{c:>12}" for c in text[1:]), flush=True)


def times(fn, repeats, device):
    """Seconds of `repeats` calls after a warm-up (allocation, compilation); CUDA synchronized around each."""
    sync, out = torch.cuda.synchronize if device.type == "cuda" else (lambda: None), []
    fn()
    for _ in range(repeats):
        sync()
        t = time.perf_counter()
        fn()
        sync()
        out.append(time.perf_counter() - t)
    return out


def scan_inputs(name, T, b=1, seed=0, paper=False):
    """Random inputs for each scan, and a non-zero initial state. paper=True: one layer's shapes in the
    paper's models (Mamba-2 and Mamba-1 130m, GLA and RWKV-6 70m); else smaller ones that a CPU times."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    if name == "ssd (mamba2)":
        h, p, n = (24, 64, 128) if paper else (4, 64, 64)
        return (r(b, T, h, p), F.softplus(r(b, T, h) - 2), -torch.rand(h, generator=g) - 0.5, r(b, T, 1, n),
                r(b, T, 1, n)), r(b, h, p, n)
    if name == "selective (mamba1)":
        d, n = (1536, 16) if paper else (256, 16)
        return (r(b, T, d), F.softplus(r(b, T, d) - 2), -torch.rand(d, n, generator=g) - 0.5, r(b, T, n),
                r(b, T, n)), r(b, d, n)
    h, dk, dv = ((4, 64, 128) if name == "gla" else (8, 32, 64)) if paper else (4, 64, 64)
    q, k, v = r(b, T, h, dk), r(b, T, h, dk) * dk ** -0.5, r(b, T, h, dv)
    g_log = F.logsigmoid(r(b, T, h, dk) + 3)  # per-channel log decay, mostly near 0
    return ((q, k, v, g_log) if name == "gla" else (q, k, v, g_log, r(h, dk) * 0.1)), r(b, h, dk, dv)


def bench_scans(args, device):
    """Best-of-repeats forward time of each scan form with a non-zero initial state, and how far each
    form is from the naive loop (max |difference| / max |naive output|). --bf16: inputs in bfloat16."""
    rows, with_triton = [], device.type == "cuda" or args.triton_interpret
    dtype = torch.bfloat16 if args.bf16 else torch.float32
    print_row("scan", "T", "naive ms", "chunked ms", "speed-up", "triton ms", "rel diff")
    for name, forms in SCANS.items():
        for T in args.lengths:
            inputs, h0 = scan_inputs(name, T, args.scan_batch, paper=args.paper_shapes)
            inputs, h0 = tuple(x.to(device, dtype) for x in inputs), h0.to(device)
            s, ys = [], []
            with torch.no_grad():
                for i, f in enumerate(forms):
                    if i == 2 and not with_triton:
                        s.append(None)
                        continue
                    s.append(min(times(lambda: ys.append(f(*inputs, initial_state=h0)[0].float()), args.repeats,
                                       device)))
            diff = max(float((y - ys[0]).abs().max() / ys[0].abs().max()) for y in ys[1:])
            rows.append(dict(scan=name, T=T, naive=s[0], chunked=s[1], triton=s[2], max_rel_diff=diff))
            print_row(name, T, 1e3 * s[0], 1e3 * s[1], f"{s[0] / s[1]:.0f}x", s[2] and 1e3 * s[2], f"{diff:.1e}")
    return rows


def bench_eval(args, device):
    """Streaming evaluation of an untrained tiny Mamba-2 (cost does not depend on the weights): time and
    peak memory of position_nll per length, shortest first, so a flat memory column means memory does not
    grow with the length (CPU: the process's peak RSS so far; CUDA: peak allocated); then Effective
    Remembrance in one pass vs one forward per cut vs len(cuts) full forwards, and their agreement."""
    torch.manual_seed(0)
    lm = model.LM(model.make_config("mamba2", "tiny", vocab_size=257)).to(device)
    x = torch.randint(0, 257, (2, max(args.eval_lengths) + 1), device=device)
    print_row("position_nll tokens", "peak MB", "seconds", "tokens/s")
    rows = []
    for L in sorted(args.eval_lengths):
        torch.cuda.reset_peak_memory_stats() if device.type == "cuda" else None
        s = min(times(lambda: evaluate.position_nll(lm, x[:, :L + 1], chunk_len=1024), args.repeats, device))
        peak = (torch.cuda.max_memory_allocated() / 2 ** 20 if device.type == "cuda" else
                resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)  # Linux: kB
        rows.append(dict(tokens=L, peak_mb=peak, seconds=s))
        print_row(L, peak, s, 2 * L / s)
    T, xe = args.effrem_len, x[:, :args.effrem_len].repeat(4, 1)  # 8 sequences
    cuts, out = evaluate.default_cuts(T, 32), []
    forms = {"one pass": lambda: out.append(evaluate.effective_remembrance(lm, xe, T, cuts)),
             "one forward per cut": lambda: out.append(evaluate.effective_remembrance_naive(lm, xe, T, cuts)),
             f"{len(cuts)} full forwards": lambda: torch.inference_mode()(lambda: [lm(xe) for _ in cuts])()}
    print_row(f"EffRem_{T}, 8 seqs", "seconds")
    secs = {name: min(times(f, args.repeats, device)) for name, f in forms.items()}
    for name, s in secs.items():
        print_row(name, s)
    diff = float((out[0] - out[-1].double()).abs().max())
    print(f"one pass vs one forward per cut: max |diff| {diff:.1e}")
    return dict(ppl=rows, effrem_s=list(secs.values()), max_abs_diff=diff)


def bench_train(args, device):
    """Training steps of each preset on random tokens, through train.py's own step function (forward,
    loss, backward), then clipping and AdamW; bf16 autocast on CUDA as train.py. Zero initial state."""
    presets = [p.strip().partition(":") for p in args.presets.split(",")]
    for arch, sep, size in presets:  # all checked before any timing
        if not sep:
            raise ValueError(f"preset {arch!r} is not arch:size (e.g. mamba2:45m)")
        model.make_config(arch, size)  # raises ValueError naming the known archs or sizes
    print(f"training steps, T = {args.seq_len}, batch {args.batch_size}, vocab {args.vocab_size}, "
          f"best of {args.steps} after 1 warm-up")
    print_row("preset", "form", "params", "best s", "median s", "tokens/s", f"h for {args.tokens:.3g}", "peak GB")
    rows, cuda = [], device.type == "cuda"
    for (arch, _, size), form in [(p, f) for p in presets for f in args.forms.split(",")]:
        torch.manual_seed(0)
        torch.cuda.reset_peak_memory_stats() if cuda else None
        lm = model.LM(model.make_config(arch, size, vocab_size=args.vocab_size)).to(device)
        model.set_scan_impl(lm, form)
        optimizer = train.make_optimizer(lm, lr=1e-4, weight_decay=0.01, device=device)  # lr: no cost
        idx = torch.randint(args.vocab_size, (args.batch_size, args.seq_len + 1), device=device)
        # the same batch every step: a step's cost does not depend on the tokens
        sampler = types.SimpleNamespace(next_batch=lambda: (idx[:, :-1], idx[:, 1:]))
        strategy = interventions.make_strategy("zero", lm, args.batch_size)
        autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else contextlib.nullcontext()

        def step():
            optimizer.zero_grad(set_to_none=True)
            train.accumulate_gradients(lm, sampler, strategy, 1, device, autocast)
            torch.nn.utils.clip_grad_norm_(lm.parameters(), 1.0)
            optimizer.step()
        secs = sorted(times(step, args.steps, device))
        tps = args.batch_size * args.seq_len / secs[0]
        rows.append(dict(preset=f"{arch}:{size}", form=form, params=lm.num_params(), best_s=secs[0],
                         median_s=statistics.median(secs), tokens_per_s=tps,
                         budget_h=args.tokens / tps / 3600,
                         peak_gb=torch.cuda.max_memory_allocated(device) / 1e9 if cuda else None))
        print_row(*rows[-1].values())
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    a = p.add_argument
    a("--what", default="scans", choices=["scans", "eval", "train", "all"],
      help="what to time (all: scans and eval; train: the paper-size presets, a GPU's job)")
    a("--lengths", type=int, nargs="+", default=[1024, 4096, 16384], help="sequence lengths of the scans")
    a("--repeats", type=int, default=3, help="timed repeats after one warm-up; the best is reported")
    a("--device", default="auto", choices=["auto", "cpu", "cuda"], help="auto: CUDA when present")
    a("--triton-interpret", action="store_true", help="on the CPU, also time Triton's interpreter (slow)")
    a("--bf16", action="store_true", help="scans: inputs in bfloat16 (the forms still compute in float32)")
    a("--scan-batch", type=int, default=1, help="scans: sequences per call (default 1)")
    a("--paper-shapes", action="store_true", help="scans: one layer of the paper's 130m/70m models (GPU sizes)")
    g = p.add_argument_group("--what eval").add_argument
    g("--eval-lengths", type=int, nargs="+", default=[8192, 131072], help="position_nll lengths")
    g("--effrem-len", type=int, default=1024, help="T of the Effective Remembrance timing (default 1024)")
    g = p.add_argument_group("--what train").add_argument
    g("--presets", default=TRAIN_PRESETS, help=f"comma-separated arch:size (default {TRAIN_PRESETS})")
    g("--seq-len", type=int, default=1024, help="tokens per sequence (default 1024)")
    g("--batch-size", type=int, default=1, help="sequences per step (default 1)")
    g("--vocab-size", type=int, default=50280, help="vocabulary (default 50280: GPT-NeoX, as Mamba's)")
    g("--forms", default="auto", help="comma-separated scan forms to time: auto, naive, chunked, triton")
    g("--steps", type=int, default=3, help="timed steps after one warm-up step (default 3)")
    g("--tokens", type=float, default=2e9, help="token budget whose wall time is estimated")
    args = p.parse_args(argv)
    numbers = [args.repeats, args.scan_batch, args.seq_len, args.batch_size, args.vocab_size, args.steps, args.effrem_len]
    if not min(numbers + args.lengths + args.eval_lengths + [args.tokens]) > 0:
        raise SystemExit("error: every number (--repeats, --lengths, --tokens, ...) must be positive")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda but no CUDA device is available: use --device cpu")
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          args.device.replace("auto", "cpu"))
    print(f"device: {device}" + ("" if device.type == "cuda" else f", {torch.get_num_threads()} threads"))
    try:
        for what, bench in [("scans", bench_scans), ("eval", bench_eval), ("train", bench_train)]:
            if args.what == what or args.what == "all" and what != "train":
                bench(args, device)
                print()
    except ValueError as e:  # an unknown preset: one line, not a traceback
        raise SystemExit(f"error: {e}")


if __name__ == "__main__":
    main()
