"""
Timings of the scans (naive loop vs chunked vs Triton) and of evaluation, printed as tables.

    python bench.py                    # scans at T = 1k, 4k, 16k on this machine
    python bench.py --lengths 1024 4096 --repeats 3
    python bench.py --what eval        # streaming evaluation: peak memory vs length, EffRem cost
    python bench.py --what train       # training steps of the paper-size presets: tokens/s, hours per budget
    python bench.py --what train --presets mamba2:85m,gla:70m --seq-len 2048 --batch-size 8 --tokens 34e9

`--what all` is scans + eval; train is separate (the default presets took 2.5 minutes on a 2-core CPU).
On the CPU the Triton column is skipped unless --triton-interpret is given (Triton's interpreter is a
correctness tool, far slower than the naive loop); on CUDA all three forms run.
"""
import argparse
import contextlib
import os
import statistics
import sys
import time

import torch

# The paper's from-scratch sizes (Fig. 2: Mamba-2 45M/85M/125M, GLA 70M; Fig. 10: RWKV-6 70M) and the
# official Mamba-2 130M's dimensions, for --what train.
TRAIN_PRESETS = "mamba2:45m,mamba2:85m,mamba2:125m,gla:70m,rwkv6:70m,mamba2:130m"


def scan_inputs(name, T, b=1, device="cpu", seed=0):
    """Random inputs of realistic per-layer sizes for each scan, with a non-zero initial state."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)
    if name == "ssd (mamba2)":
        h, p, n = 4, 64, 64
        dt = torch.nn.functional.softplus(r(b, T, h) - 2)
        return (r(b, T, h, p), dt, -torch.rand(h, generator=g) - 0.5, r(b, T, 1, n), r(b, T, 1, n)), r(b, h, p, n)
    if name == "selective (mamba1)":
        d, n = 256, 16
        delta = torch.nn.functional.softplus(r(b, T, d) - 2)
        return (r(b, T, d), delta, -torch.rand(d, n, generator=g) - 0.5, r(b, T, n), r(b, T, n)), r(b, d, n)
    h, dk, dv = 4, 64, 64
    q, k, v = r(b, T, h, dk), r(b, T, h, dk) * dk ** -0.5, r(b, T, h, dv)
    g_log = torch.nn.functional.logsigmoid(r(b, T, h, dk) + 3)
    if name == "gla":
        return (q, k, v, g_log), r(b, h, dk, dv)
    return (q, k, v, g_log, r(h, dk) * 0.1), r(b, h, dk, dv)  # rwkv6


def scan_forms():
    import gla
    import rwkv
    import ssm
    return {
        "ssd (mamba2)": (ssm.ssd_naive, ssm.ssd_chunked, ssm.ssd_triton),
        "selective (mamba1)": (ssm.selective_scan_naive, ssm.selective_scan_chunked, ssm.selective_scan_triton),
        "gla": (gla.gla_naive, gla.gla_chunked, gla.gla_triton),
        "rwkv6": (rwkv.rwkv6_naive, rwkv.rwkv6_chunked, rwkv.rwkv6_triton),
    }


def timeit(fn, repeats, device):
    return min(times(fn, repeats, device))


def times(fn, repeats, device):
    """Seconds of each of `repeats` calls of fn, after one warm-up call (and compilation for Triton).
    CUDA runs asynchronously: without the synchronize we would time the kernel launches only."""
    fn()
    out = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        out.append(time.perf_counter() - t)
    return out


def bench_scans(args, device):
    with_triton = device.type == "cuda" or args.triton_interpret
    rows = []
    for name, (naive, chunked, triton_fn) in scan_forms().items():
        for T in args.lengths:
            inputs, h0 = scan_inputs(name, T)
            inputs = tuple(x.to(device) for x in inputs)
            h0 = h0.to(device)
            row = {"scan": name, "T": T}
            with torch.no_grad():
                row["naive"] = timeit(lambda: naive(*inputs, initial_state=h0), args.repeats, device)
                row["chunked"] = timeit(lambda: chunked(*inputs, initial_state=h0), args.repeats, device)
                row["triton"] = timeit(lambda: triton_fn(*inputs, initial_state=h0), args.repeats, device) if with_triton else None
            rows.append(row)
            print_row(row, header=len(rows) == 1)
    print_state_floor(args, device)
    return rows


def print_state_floor(args, device):
    """A floor for any PyTorch form of Mamba-1's scan. Its decay exp(delta_t * A[d, n]) differs for every
    (t, d, n), so no matmul can take the work: every exact form makes at least these elementwise passes
    over [T, d, n] -- the decays, the inputs delta_t u_t B_t, one update h = decay * h + input, the
    readout sum_n h C_t. Timed here without the sequential dependence (each pass once over the data),
    in cache-sized pieces of 64 steps into reused buffers: the cheapest way we found. A fused kernel
    (mamba_ssm's, our Triton one) is not bound by it: it never writes the [T, d, n] tensors."""
    T = 4096 if 4096 in args.lengths else max(args.lengths)
    (u, delta, A, B, C), h0 = scan_inputs("selective (mamba1)", T)
    u, delta, A, B, C, h0 = (x.to(device) for x in (u, delta, A, B, C, h0))
    du = delta * u
    decay, h = torch.empty(2, 1, 64, *A.shape, device=device).unbind(0)
    y = torch.empty(1, 64, A.shape[0], device=device)

    def minimal_passes():
        for d, x, b, c in zip(delta.split(64, 1), du.split(64, 1), B.split(64, 1), C.split(64, 1)):
            L = d.shape[1]
            dec, hh = decay[:, :L], h[:, :L]
            torch.exp(torch.mul(d[..., None], A, out=dec), out=dec)     # the decays
            torch.mul(x[..., None], b[:, :, None, :], out=hh)            # the inputs
            hh.addcmul_(dec, hh)                                          # one update pass
            torch.linalg.vecdot(hh, c[:, :, None, :], out=y[:, :L])     # the readout
    with torch.no_grad():
        naive_loop = scan_forms()["selective (mamba1)"][0]
        naive = timeit(lambda: naive_loop(u, delta, A, B, C, initial_state=h0), args.repeats, device)
        floor = timeit(minimal_passes, args.repeats, device)
    print(f"selective (mamba1) at T={T}: the minimal elementwise passes over [T, d, n] = [{T}, {A.shape[0]}, "
          f"{A.shape[1]}] take {1e3 * floor:.1f} ms, the naive loop {1e3 * naive:.1f} ms: no PyTorch form of "
          f"this scan can be more than {naive / floor:.0f}x faster than the loop here")


def print_row(row, header=False):
    if header:
        print(f"{'scan':<20}{'T':>7}{'naive ms':>12}{'chunked ms':>12}{'speed-up':>10}{'triton ms':>12}")
    tri = f"{1e3 * row['triton']:12.1f}" if row["triton"] is not None else f"{'-':>12}"
    print(f"{row['scan']:<20}{row['T']:>7}{1e3 * row['naive']:12.1f}{1e3 * row['chunked']:12.1f}"
          f"{row['naive'] / row['chunked']:9.0f}x{tri}")
    sys.stdout.flush()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--what", default="scans", choices=["scans", "eval", "train", "all"],
                   help="what to time (all = scans and eval; train is separate)")
    p.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384], help="sequence lengths for the scans")
    p.add_argument("--repeats", type=int, default=3, help="timed repeats (the best is reported)")
    p.add_argument("--device", default="auto", help="auto (CUDA when present), cpu or cuda")
    p.add_argument("--triton-interpret", action="store_true", help="on the CPU, also time Triton's interpreter (slow)")
    g = p.add_argument_group("--what train")
    g.add_argument("--presets", default=TRAIN_PRESETS, help=f"comma-separated arch:size (default {TRAIN_PRESETS})")
    g.add_argument("--seq-len", type=int, default=1024, help="tokens per sequence, T_train (default 1024)")
    g.add_argument("--batch-size", type=int, default=1, help="sequences per step (default 1)")
    g.add_argument("--vocab-size", type=int, default=50280, help="vocabulary (default 50280, GPT-NeoX as Mamba's)")
    g.add_argument("--steps", type=int, default=3, help="timed steps after one warm-up step (default 3)")
    g.add_argument("--tokens", type=float, default=2e9, help="token budget whose wall time is estimated (default 2e9)")
    args = p.parse_args(argv)
    for name in ("repeats", "seq_len", "batch_size", "vocab_size", "steps"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(args, name)}")
    if not args.tokens > 0:
        p.error(f"--tokens must be > 0, got {args.tokens:g}")
    if args.triton_interpret:
        os.environ["TRITON_INTERPRET"] = "1"  # must be set before triton is imported
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if args.device == "auto" else args.device))
    print(f"device: {device}" + ("" if device.type == "cuda" else f", {torch.get_num_threads()} threads"))
    if args.what in ("scans", "all"):
        bench_scans(args, device)
    if args.what in ("eval", "all"):
        bench_eval(args, device)
    if args.what == "train":
        try:
            bench_train(args, device)
        except ValueError as e:  # an unknown preset: one line, not a traceback
            raise SystemExit(f"error: {e}")


def bench_eval(args, device):
    """Streaming evaluation of a tiny Mamba-2: peak memory of position_nll at 8k vs 131k tokens (each
    in a fresh process), and Effective Remembrance with 32 cuts batched vs one forward per cut."""
    import evaluate
    r = evaluate.benchmark(arch="mamba2", device=str(device), repeats=args.repeats)
    print(f"\nposition_nll, tiny mamba2, {r['n_seqs']} sequences, chunk {r['chunk_len']}:")
    print(f"{'tokens':>8}{'peak RSS MB':>14}{'seconds':>10}{'tokens/s':>10}")
    for m in r["memory"]:
        print(f"{m['length']:>8}{m['peak_rss_mb']:>14.1f}{m['seconds']:>10.1f}{m['tokens_per_s']:>10}")
    first, last = r["memory"][0], r["memory"][-1]
    print(f"peak memory ratio {last['length']} / {first['length']} tokens: {last['peak_rss_mb'] / first['peak_rss_mb']:.3f}")
    e = r["effrem"]
    print(f"\neffective_remembrance, T={e['T']}, {e['n_seqs']} sequences, {e['n_cuts']} cuts (work: "
          f"{e['work_in_full_forwards']} full forwards): batched {e['batched_s']:.2f} s; "
          f"one forward per suffix {e['per_cut_s']:.2f} s ({e['per_cut_s'] / e['batched_s']:.1f}x); "
          f"{e['n_cuts']} full-length forwards {e['full_forwards_s']:.2f} s ({e['full_forwards_s'] / e['batched_s']:.1f}x); "
          f"max |diff| {e['max_abs_diff']:.1e}")
    return r


def parse_presets(text):
    """"mamba2:45m,gla:70m" -> [("mamba2", "45m"), ("gla", "70m")], every one checked against
    model.PRESETS up front, so a typo in the last preset fails now and not after minutes of timing."""
    import model
    out = []
    for preset in text.split(","):
        arch, sep, size = preset.strip().partition(":")
        if not sep:
            raise ValueError(f"preset {preset!r} is not arch:size (e.g. mamba2:45m)")
        model.make_config(arch, size)  # raises ValueError naming the known archs or sizes
        out.append((arch, size))
    return out


def bench_train(args, device):
    """Full training steps of each preset on random tokens, as train.py takes them: forward, cross
    entropy, backward, gradient clipping, AdamW (bf16 autocast on CUDA, as train.py). The state starts
    at zero, as the baseline; the interventions change only where the initial state comes from."""
    presets = parse_presets(args.presets)
    rows = []
    for arch, size in presets:
        rows.append(time_train_step(arch, size, args, device))
        print_train_row(rows[-1], args, header=len(rows) == 1)
    return rows


class _SameBatch:
    """A sampler that hands out the same (x, y) every time: the cost of a step does not depend on the tokens."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def next_batch(self):
        return self.x, self.y


def time_train_step(arch, size, args, device):
    import interventions
    import model
    import train
    torch.manual_seed(0)
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    lm = model.LM(model.make_config(arch, size, vocab_size=args.vocab_size)).to(device)
    optimizer = train.make_optimizer(lm, lr=1e-4, weight_decay=0.01, device=device)  # lr: no effect on cost
    idx = torch.randint(args.vocab_size, (args.batch_size, args.seq_len + 1), device=device)
    x, y = idx[:, :-1], idx[:, 1:]
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()

    sampler, strategy = _SameBatch(x, y), interventions.make_strategy("zero", lm, args.batch_size)

    def step():  # train.py's step: the same forward/backward function, clipping, AdamW
        optimizer.zero_grad(set_to_none=True)
        train.accumulate_gradients(lm, sampler, strategy, 1, device, autocast)
        torch.nn.utils.clip_grad_norm_(lm.parameters(), 1.0)
        optimizer.step()

    # The warm-up step is not timed: it allocates AdamW's moments (and compiles Triton kernels on CUDA).
    secs = sorted(times(step, args.steps, device))
    tokens_per_s = x.numel() / secs[0]
    return {"preset": f"{arch}:{size}", "params": lm.num_params(), "seq_len": args.seq_len,
            "batch_size": args.batch_size, "best_s": secs[0], "median_s": statistics.median(secs),
            "tokens_per_s": tokens_per_s, "budget_h": args.tokens / tokens_per_s / 3600,
            "peak_gb": torch.cuda.max_memory_allocated(device) / 1e9 if device.type == "cuda" else None}


def print_train_row(row, args, header=False):
    if header:
        print(f"\ntraining steps, T = {args.seq_len}, batch {args.batch_size}, vocab {args.vocab_size}, "
              f"best of {args.steps} after 1 warm-up:")
        print(f"{'preset':<14}{'params M':>10}{'best s':>9}{'median s':>10}{'tokens/s':>11}"
              f"{f'h for {args.tokens:.3g}':>14}{'peak GB':>9}")
    peak = f"{row['peak_gb']:9.1f}" if row["peak_gb"] is not None else f"{'-':>9}"
    print(f"{row['preset']:<14}{row['params'] / 1e6:10.1f}{row['best_s']:9.2f}{row['median_s']:10.2f}"
          f"{row['tokens_per_s']:11.0f}{row['budget_h']:14.1f}{peak}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
