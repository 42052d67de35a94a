"""The demos, `python train.py --demo [fig5|fig2|fig3] --seeds 0-7`: one of the paper's figures per training
seed, its runs trained by train.py and evaluated by evaluate.py, a rerun going on where one stopped. A reader
of the paper can skip this file."""
import functools
import os
import shutil

import config
import datafiles
import evaluate
import report
import train

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

def main(args):
    """train.py --demo: the figure in OUT/demo (fig5), OUT/demo-fig2 or OUT/demo-fig3, per --seed(s)."""
    seeds = config.parse_seeds(args.seeds) if args.seeds else [args.seed]
    folder = "demo" if args.demo == "fig5" else f"demo-{args.demo}"
    return demo(os.path.join(args.out, folder), seeds, args.device, args.quiet, args.demo)

def demo(out, seeds=(0,), device="auto", quiet=False, figure="fig5", **overrides):
    """The demo `figure` per training seed in OUT/seed{S} (kept if it has an eval.json), then the seeds'
    summary (report.over_seeds)."""
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
        train_run = functools.partial(train_or_keep, common, f"demo {figure} seed {seed}")
        runs = demo_runs(figure, d, where, train_run)
        metrics = ["ppl,state", "--reference", "control", "TBTT=streams"] if figure == "fig5" else ["ppl"]
        if code := evaluate.main([*runs.values(), "--labels", *runs, "--metrics", *metrics, "--eval-len",
                                  str(d["eval_len"]), "--n-seqs", str(d["n_seqs"]), "--device", device,
                                  "--out", where]):
            return code
    folders = [os.path.join(out, f"seed{seed}") for seed in seeds]
    return report.over_seeds(report.read_reports(folders, list(seeds)), out) if len(seeds) > 1 else 0

def train_or_keep(common, name, label, argv):
    """train.py common + argv; a finished --out is kept, an interrupted one resumed: a rerun goes on."""
    flag = lambda f, default=None: argv[argv.index(f) + 1] if f in argv else default
    step = train.checkpoint_step(flag("--out"))
    if step is not None and step >= int(flag("--stop-at", flag("--steps"))):
        print(f"{name}: {label}: {flag('--out')} is at step {step}, kept")
        return
    if step is not None:
        argv = argv + ["--resume"]
    print(f"{name}: {label}: python train.py {' '.join(argv)}")
    train.train(config.get_args(common + argv))

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
        every = d["base_steps"] // 3
        run = os.path.join(where, "run")
        runs = {k * every: os.path.join(where, f"step{k * every}") for k in (1, 2, 4, 9)}
        for budget, copy in runs.items():
            if train.checkpoint_step(copy) == budget:   # kept from a run of the demo interrupted later
                continue
            train_run(f"to step {budget}", base + ["--steps", str(9 * every), "--ckpt-interval", str(every),
                                               "--stop-at", str(budget), "--out", run])
            step = train.checkpoint_step(run)
            datafiles.require(step == budget, f"{run} is at step {step}, past {budget}, and {copy} is gone: "
                              f"remove {where} and run the demo again")
            os.makedirs(copy, exist_ok=True)
            datafiles.write_atomically(os.path.join(copy, "ckpt.pt"),
                                       lambda tmp: shutil.copy(os.path.join(run, "ckpt.pt"), tmp))
        return {f"step{budget}": copy for budget, copy in runs.items()}
    runs = {"base": os.path.join(where, "base")} | {k: os.path.join(where, k) for k in INTERVENTIONS}
    train_run("base", base + ["--steps", str(d["base_steps"]), "--out", runs["base"]])
    for label, strategy in INTERVENTIONS.items():  # the same budget each, from the base (read_on: windows)
        extra = {"random": ["--sigma", str(d["sigma"])], "streams": ["--streams"]}.get(label, [])
        train_run(label, ["--init-from", runs["base"], "--steps", str(d["post_steps"]), "--init-state",
                          strategy, "--out", runs[label], *extra])
    return runs
