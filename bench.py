"""
Timings of the scans (naive loop vs chunked vs Triton) and of evaluation, printed as tables.

    python bench.py                    # scans at T = 1k, 4k, 16k on this machine
    python bench.py --lengths 1024 4096 --repeats 3
    python bench.py --what eval        # streaming evaluation: peak memory vs length, EffRem cost

On the CPU the Triton column is skipped unless --triton-interpret is given (Triton's interpreter is a
correctness tool, far slower than the naive loop); on CUDA all three forms run.
"""
import argparse
import os
import sys
import time

import torch


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
    fn()  # warm-up (and compilation for Triton)
    best = float("inf")
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    return best


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
    return rows


def print_row(row, header=False):
    if header:
        print(f"{'scan':<20}{'T':>7}{'naive ms':>12}{'chunked ms':>12}{'speed-up':>10}{'triton ms':>12}")
    tri = f"{1e3 * row['triton']:12.1f}" if row["triton"] is not None else f"{'-':>12}"
    print(f"{row['scan']:<20}{row['T']:>7}{1e3 * row['naive']:12.1f}{1e3 * row['chunked']:12.1f}"
          f"{row['naive'] / row['chunked']:9.0f}x{tri}")
    sys.stdout.flush()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--what", default="scans", choices=["scans", "eval", "all"], help="what to time")
    p.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384], help="sequence lengths for the scans")
    p.add_argument("--repeats", type=int, default=3, help="timed repeats (the best is reported)")
    p.add_argument("--device", default="auto", help="auto (CUDA when present), cpu or cuda")
    p.add_argument("--triton-interpret", action="store_true", help="on the CPU, also time Triton's interpreter (slow)")
    args = p.parse_args()
    if args.triton_interpret:
        os.environ["TRITON_INTERPRET"] = "1"  # must be set before triton is imported
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if args.device == "auto" else args.device))
    print(f"device: {device}" + ("" if device.type == "cuda" else f", {torch.get_num_threads()} threads"))
    if args.what in ("scans", "all"):
        bench_scans(args, device)
    if args.what in ("eval", "all"):
        bench_eval(args, device)


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
    print(f"\neffective_remembrance, T={e['T']}, {e['n_seqs']} sequences, {e['n_cuts']} cuts: batched {e['batched_s']:.2f} s, "
          f"one forward per cut {e['per_cut_s']:.2f} s ({e['per_cut_s'] / e['batched_s']:.1f}x), max |diff| {e['max_abs_diff']:.1e}")
    return r


if __name__ == "__main__":
    main()
