"""bench.py's command line: its flags, their checks (a bad value ends in one line before anything is timed),
an allocation that fails told in one line, and the rows of its tables. A reader of the paper can skip this
file: what is timed, and how, is bench.py's."""
import argparse
import os
import re

import torch

from plumbing import runs

def print_row(*cells):  # the first cell left-aligned, the others right-aligned; floats to 3 digits
    text = ["-" if c is None else f"{c:.3g}" if isinstance(c, float) and abs(c) < 100 else
            f"{c:.0f}" if isinstance(c, float) else str(c) for c in cells]
    print(f"{text[0]:<20}" + "".join(f"{c:>12}" for c in text[1:]), flush=True)

def parse_args(argv, description, presets):
    """bench.py's flags (presets: --presets' default), each number and list checked."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.error = lambda message: p.exit(2, f"error: {message}\n")  # one line, as every other bad input
    a = p.add_argument
    a("--what", default="scans", choices=["scans", "eval", "train", "all"], help="all: scans, eval")
    a("--lengths", type=int, nargs="+", default=[1024, 4096, 16384], help="sequence lengths of the scans")
    a("--repeats", type=int, default=3, help="timed calls (train: steps) after one warm-up; best reported")
    a("--device", default="auto", choices=["auto", "cpu", "cuda"])
    a("--bf16", action="store_true", help="scans: inputs in bfloat16 (the forms still compute in float32)")
    a("--scan-batch", type=int, default=1, help="scans: sequences per call")
    a("--paper-shapes", action="store_true", help="scans: one layer of the paper's 130m/70m models")
    a("--presets", default=presets, help=f"train: comma-separated arch:size (default {presets})")
    a("--seq-len", type=int, default=1024, help="train: tokens per sequence")
    a("--batch-size", type=int, default=1, help="train: sequences per step")
    a("--forms", default="auto", help="train: comma-separated scan forms (auto, naive, chunked, triton)")
    args = p.parse_args(argv)
    lists = dict(lengths=args.lengths, presets=[s.strip() for s in args.presets.split(",")],
                 forms=args.forms.split(","))
    for flag in ("repeats", "lengths", "scan_batch", "seq_len", "batch_size"):   # past 2**31: no
        if not all(0 < n < 2 ** 31 for n in lists.get(flag, [vars(args)[flag]])):   # tensor of them fits
            raise SystemExit(f"error: --{flag.replace('_', '-')} {vars(args)[flag]}: need 1 to 2**31 - 1")
    if twice := [k for k, v in lists.items() if len(set(v)) < len(v)]:
        raise SystemExit(f"error: --{twice[0]} names a value twice ({lists[twice[0]]}): name each once")
    return args

def device_of(args):
    """--device as torch's; --forms checked against it (triton: CUDA, or Triton's interpreter on the CPU)."""
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda but no CUDA device is available: use --device cpu")
    device = runs.device(args.device)
    forms = set(args.forms.split(",")) - {"auto", "naive", "chunked"}
    if forms - {"triton"} or forms and device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit(f"error: --forms {args.forms}: choose from auto, naive, chunked, triton (triton: "
                         "CUDA, or on the CPU TRITON_INTERPRET=1, slow)")
    return device

def exit_if_out_of_memory(what, error):
    """A MemoryError, or an allocator's RuntimeError (CUDA's out of memory, a size past what it can allocate,
    whose size calculation overflows), ends in one line naming the flags that size it; any other returns."""
    if isinstance(error, RuntimeError) and not re.search("allocate|overflow", str(error)):
        return
    why = (str(error) or type(error).__name__).splitlines()[0][:200]
    raise SystemExit(f"error: {what}: out of memory ({why}): use smaller --lengths, --scan-batch, "
                     "--seq-len or --batch-size") from None
