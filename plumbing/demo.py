"""The demo, `python train.py --demo --seeds 0-7`: the paper's Fig. 5 per training seed, its runs trained by
train.py and evaluated by evaluate.py, a rerun going on where one stopped. A reader of the paper can skip
this file."""
import functools
import os

import evaluate
import model
from plumbing import checkpoints, flags, report

# The demo: a tiny Mamba-1 whose state channels barely decay within T_train ("tiny-slow"), trained from the
# zero state on Python bytes at T_train = 16: past it the state drifts to values it never learned to read and
# perplexity rises (the paper's failure). Then 10% more steps six ways: the zero state (the matched control),
# Random Noise (sigma: the best of a sweep on seeds 8, 9, RESULTS 0d), Fitted Noise, SP and TBTT (Sec. 4,
# Fig. 5), and the zero state on TBTT's document streams (TBTT's own control).
DEMO = dict(arch="mamba1", size="tiny-slow", data="stdlib", seq_len=16, batch_size=16, base_steps=1500,
            post_steps=150, sigma=0.1, eval_len=1024, n_seqs=64)
# label: --init-state; "streams" reads TBTT's document streams from the zero state: TBTT's own control
INTERVENTIONS = {"control": "zero", "random": "random", "fitted": "fitted", "SP": "sp", "TBTT": "tbtt",
                 "streams": "zero"}

def main(args, train):
    """train.py --demo: the demo in OUT/demo, per --seed(s); train: train.train (passed: no import circle).
    --arch X [--size S] (not the demo's own): the same protocol on X's preset S (default tiny), in
    OUT/demo-X-S."""
    seeds = flags.parse_seeds(args.seeds) if args.seeds else [args.seed]
    arch = args.arch or DEMO["arch"]
    size = args.size or (DEMO["size"] if arch == DEMO["arch"] else "tiny")
    model.make_config(arch, size)   # an unknown size: one line (a ValueError) before any training
    if (arch, size) == (DEMO["arch"], DEMO["size"]):
        return demo(train, os.path.join(args.out, "demo"), seeds, args.device, args.quiet)
    out = os.path.join(args.out, f"demo-{arch}-{size}")
    return demo(train, out, seeds, args.device, args.quiet, arch=arch, size=size)

def demo(train, out, seeds=(0,), device="auto", quiet=False, **overrides):
    """The demo per training seed in OUT/seed{S} (one with an eval.json is kept), each run trained by
    train(args) (train.train); then the seeds' summary (report.over_seeds)."""
    d = {**DEMO, **overrides}  # tests shrink it
    for seed in seeds:
        where = os.path.join(out, f"seed{seed}")
        if os.path.exists(os.path.join(where, "eval.json")):
            print(f"demo seed {seed}: {where}/eval.json exists, kept")
            continue
        common = ["--data", d["data"], "--seq-len", str(d["seq_len"]), "--batch-size", str(d["batch_size"]),
                  "--seed", str(seed), "--device", device, "--eval-interval", "100000"]
        if quiet:
            common.append("--quiet")
        runs = demo_runs(d, where, functools.partial(train_or_keep, train, common, f"demo seed {seed}"))
        if code := evaluate.main([*runs.values(), "--labels", *runs, "--metrics", "ppl,state", "--reference",
                                  "control", "TBTT=streams", "--eval-len", str(d["eval_len"]), "--n-seqs",
                                  str(d["n_seqs"]), "--device", device, "--out", where]):
            return code
    folders = [os.path.join(out, f"seed{seed}") for seed in seeds]
    return report.over_seeds(report.read_reports(folders, list(seeds)), out) if len(seeds) > 1 else 0

def train_or_keep(train, common, name, label, argv):
    """train.py common + argv; a finished --out is kept, an interrupted one resumed: a rerun goes on."""
    out = argv[argv.index("--out") + 1]
    step = checkpoints.checkpoint_step(out)
    if step is not None and step >= int(argv[argv.index("--steps") + 1]):
        print(f"{name}: {label}: {out} is at step {step}, kept")
        return
    if step is not None:
        argv = argv + ["--resume"]
    print(f"{name}: {label}: python train.py {' '.join(argv)}")
    train(flags.get_args(common + argv))

def demo_runs(d, where, train_run):
    """Trains one seed's runs under `where` with train_run(label, argv) -> {label: run dir}."""
    base = ["--arch", d["arch"], "--size", d["size"], "--init-state", "zero"]
    runs = {"base": os.path.join(where, "base")} | {k: os.path.join(where, k) for k in INTERVENTIONS}
    train_run("base", base + ["--steps", str(d["base_steps"]), "--out", runs["base"]])
    for label, strategy in INTERVENTIONS.items():  # the same budget each, from the base (read_on: windows)
        extra = {"random": ["--sigma", str(d["sigma"])], "streams": ["--streams"]}.get(label, [])
        train_run(label, ["--init-from", runs["base"], "--steps", str(d["post_steps"]), "--init-state",
                          strategy, "--out", runs[label], *extra])
    return runs
