"""evaluate.py's report: the NLL's mean and s.e. (nll_summary), paired differences to a reference run, per
model the verdict, each curve printed as a table and drawn as a PNG panel (show), and the spread of several
training seeds' evaluations (--over-seeds: read_reports, over_seeds).
A reader of the paper can skip it: the measurements are evaluate.py's sections 1-4."""
import json
import math
import os
import pathlib
import sys

import matplotlib.figure  # no pyplot: figures written to files, no backend to choose
import numpy as np
import torch

from plumbing import files
from plumbing.files import require

def sem(x):
    """The standard error of the mean over dim 0 of x [n, ...] (the std with N - 1); NaN for one sample."""
    x = torch.as_tensor(x, dtype=torch.float64)
    return x.std(0) / math.sqrt(len(x)) if len(x) > 1 else x[0] * math.nan

def nll_summary(per_seq):
    """Per-sequence NLLs per_seq [n, ...]: their mean and s.e. over sequences, and the perplexity's."""
    nll = per_seq.mean(0)
    se = sem(per_seq)
    return dict(nll=nll, nll_sem=se, ppl=nll.exp(), ppl_sem=nll.exp() * se)  # delta method

COLORS = matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]  # run i's: COLORS[i % len(COLORS)]

# ==== One evaluation: each curve is printed (a few columns) and drawn (a PNG panel) from one table ====
CTX = "context length (dotted: T_train)"
# curve -> PNG file holding its panel (None: printed only), title, x label, y label, scale (log x, log-log)
PANELS = {
    "ppl": ("ppl.png", "Position-wise perplexity (+-1 s.e.; dashed: at T_train contexts)", CTX, "perplexity",
            "log"),
    "gap": ("ppl.png", "Gap to the Bayes floor", CTX, "model NLL - Bayes NLL (nats)", "log"),
    "diff": ("ppl.png", "Paired difference to the reference run", CTX, "NLL - reference NLL (nats)", "log"),
    "effrem": ("effrem.png", "Effective Remembrance", "t (dotted: T - T_train)", "EffRem_T(t)", "log"),
    "state": ("state.png", "State spread, most drifting head per layer", CTX, "std of state h", "loglog"),
    "passkey": (None, "Passkey", "total length", "exact match", "log"),
    "copy": ("copy.png", "Copying", "string length", "char accuracy (+- s.e.)", None),
    "babilong": ("babilong.png", "BABILong", "total length (dotted: T_train)", "accuracy (task mean)", "log")}

def _curves(m):
    """A model's curves: name -> [(x, y, s.e. or None, legend, x of its dotted line or None)]."""
    out = {}
    label = m["label"]
    t = m["t_train"]
    if b := m.get("ppl", {}).get("buckets"):
        x = [math.sqrt((lo + 1) * hi) for lo, hi in zip(b["lo"], b["hi"])]  # a bucket's geometric middle
        out["ppl"] = [(x, b["ppl"], b["ppl_sem"], f"{label} (T={m['verdict']['generalizes_to']})", t)]
        legend = {"gap": label, "diff": f"{label} - {m.get('diff', {}).get('reference')}"}
        out.update({k: [(x, m[k]["nll"], m[k]["nll_sem"], legend[k], t)] for k in legend if k in m})
    if e := m.get("effrem"):
        out["effrem"] = [(e["cuts"], e["mean"], e["sem"], f"{label} (T={e['T']})", t and e["T"] - t)]
    if "state" in m:  # per layer the head that drifts most, its coverage in the legend
        st = m["state"]
        x = np.array(st["positions"]) + 1
        cov = np.nan_to_num(np.array(st["coverage"], dtype=float), nan=-1)  # [layers, heads]
        out["state"] = [(x, std[:, h], None, f"{label} L{i} h{h} cov {cov[i, h]:.3g}", t)
                        for i, (std, h) in enumerate(zip(np.array(st["std"], dtype=float), cov.argmax(1)))]
    tasks = [("passkey", "exact_mean", None), ("copy", "char_mean", "char_sem"), ("babilong", "mean", None)]
    for key, y, se in tasks:
        if key in m:  # scores by length (copy's lengths are the strings', no T_train line)
            out[key] = [(m[key]["lengths"], m[key][y], se and m[key][se], label, key != "copy" and t)]
    return out

def _draw(report, panels):
    """-> {file: its write(tmp)}: the panels grouped by PANELS' file, passkey's length x depth (Fig. 7)."""
    figs = {}
    for file in dict.fromkeys(PANELS[name][0] for name in panels if PANELS[name][0]):
        names = [name for name in panels if PANELS[name][0] == file]
        figs[file] = matplotlib.figure.Figure(figsize=(1 + 6 * len(names), 4.5), layout="tight")
        for ax, name in zip(figs[file].subplots(1, len(names), squeeze=False)[0], names):
            _, title, xlabel, ylabel, scale = PANELS[name]
            ax.set(title=title, xlabel=xlabel, ylabel=ylabel, xscale="log" if scale else "linear",
                   yscale="log" if scale == "loglog" else "linear")
            for color, x, y, se, label, line_at in panels[name]:
                y = np.array(y, dtype=float)  # None (NaN in the JSON) -> nan: a gap in the curve
                if not np.isfinite(y).any():
                    print(f"warning: {label}: no finite value to plot (NaN or inf)", file=sys.stderr)
                    continue
                se = np.nan_to_num(np.array(y * 0 if se is None else se, dtype=float))
                ax.plot(x, y, color=color, label=label)
                ax.fill_between(x, y - se, y + se, color=color, alpha=0.25)
                if line_at:
                    ax.axvline(line_at, color=color, ls=":", lw=1)
            for i, m in enumerate(report["models"] if name == "ppl" else []):  # the verdicts' levels
                if m["verdict"]["ppl_short"] is not None:
                    ax.axhline(m["verdict"]["ppl_short"], color=COLORS[i % len(COLORS)], ls="--", lw=0.8)
            if name == "ppl" and "optimal" in report:  # the models' buckets: x of the first curve
                ax.plot(panels[name][0][1], report["optimal"]["ppl"], "k--", lw=1, label="Bayes-optimal")
            if ax.get_legend_handles_labels()[0]:   # every curve NaN: an empty panel, no legend
                ax.legend(fontsize=8)
    if pk := [m for m in report["models"] if "passkey" in m]:  # Fig. 7: length x depth, exact match as colour
        figs["passkey.png"] = matplotlib.figure.Figure(figsize=(1 + 4.5 * len(pk), 4.2), layout="tight")
        for ax, m in zip(figs["passkey.png"].subplots(1, len(pk), squeeze=False)[0], pk):
            p = m["passkey"]
            ax.imshow(np.array(p["exact"]).T, aspect="auto", cmap="RdYlGn", vmin=0, vmax=1)
            ax.axvline(sum(L <= (m["t_train"] or 0) for L in p["lengths"]) - 0.5, color="k", ls=":")
            ax.set(title=f"{m['label']}: exact match (dotted: T_train)", xlabel="total length (tokens)",
                   ylabel="insertion depth", xticks=range(len(p["lengths"])), xticklabels=p["lengths"],
                   yticks=range(len(p["depths"])), yticklabels=[f"{d:.2f}" for d in p["depths"]])
    return {f: lambda tmp, fig=fig: fig.savefig(tmp, format="png", dpi=120) for f, fig in figs.items()}

def paired_differences(models, refs):
    """Each model's "diff": its bucketed NLL per_seq [n, K] minus its reference's (refs: {label or None:
    reference label}), paired per sequence and bucket (the same windows); every per_seq popped."""
    per_seq = {m["label"]: m.pop("per_seq", None) for m in models}
    for m in models:
        ref = refs.get(m["label"], refs.get(None))
        if ref not in (None, m["label"]):
            m["diff"] = dict(nll_summary(per_seq[m["label"]] - per_seq[ref]), reference=ref)

def strict_json(report):
    """report with tensors as lists and nan / inf as null: strict JSON."""
    return json.loads(json.dumps(report, default=lambda t: t.tolist()), parse_constant=lambda _: None)

def show(report, out):
    """Per model the verdict; each curve printed (8 columns, models together) and drawn in its PANELS PNG;
    the report written as out/eval.json, all files together (files.write_atomically)."""
    for m in report["models"]:   # its size and, under ppl, the verdict and the perplexity at T_train contexts
        step = "" if m.get("step") is None else f", step {m['step']}"
        print(f"[{m['label']}] {m['arch']}, {m['params']:,} params, t_train {m['t_train']}{step}")
        if (v := m.get("verdict", {})).get("ratio") is not None:
            print(f"  verdict: generalizes to T = {v['generalizes_to']}{'+' if v['censored'] else ''} "
                  f"({v['ratio']:.1f}x t_train); perplexity at T_train contexts {v['ppl_short']:.4g}")
        if "warning" in v:
            print(f"warning: {m['label']}: {v['warning']}", file=sys.stderr)
    panels = {name: rows for name in PANELS if (rows := [(COLORS[i % len(COLORS)], *c)  # panels with a curve
              for i, m in enumerate(report["models"]) for c in _curves(m).get(name, [])])}
    for name, rows in panels.items():   # x at 8 columns (log-spaced where x is), a header where x changes
        _, title, xlabel, ylabel, _ = PANELS[name]
        print(f"\n{title}: {ylabel}", end="")
        for i, (_, x, y, _, legend, _) in enumerate(rows):
            cols = sorted({round(k * (len(x) - 1) / 7) for k in range(8)})
            if i == 0 or list(x) != list(rows[i - 1][1]):
                print(f"\n  {xlabel.split(' (')[0]:<26}" + "".join(f"{round(x[j]):>11}" for j in cols))
            cells = ["n/a" if y[j] is None else f"{y[j]:.4g}" for j in cols]
            print(f"  {legend:<26}" + "".join(f"{v:>11}" for v in cells))
    figures = _draw(report, panels)
    report["figures"] = sorted(figures)   # what a later evaluation into `out` may remove: these alone
    writes = {"eval.json": lambda tmp: pathlib.Path(tmp).write_text(json.dumps(report, indent=1)), **figures}
    os.makedirs(out, exist_ok=True)
    previous = _figures_of(os.path.join(out, "eval.json"))
    files.write_atomically(out, writes)   # all files at once: the previous ones or all the new
    old = [os.path.join(out, f) for f in previous if f not in writes and os.path.isfile(os.path.join(out, f))]
    for f in old:   # the replaced eval.json's figures that this one has not: they would describe other runs
        os.unlink(f)
    removed = f"; removed the previous evaluation's {', '.join(old)}" if old else ""
    print("\nwrote " + ", ".join(os.path.join(out, file) for file in writes) + removed)

def _figures_of(path):
    """The figures the evaluation at path (eval.json) wrote, as it recorded them; none if it recorded none.
    Only PANELS' file names: no other file, whatever the JSON says."""
    try:
        recorded = json.loads(pathlib.Path(path).read_text()).get("figures", [])
    except (OSError, ValueError, AttributeError):   # none, unreadable, not an object
        return []
    names = {p[0] for p in PANELS.values() if p[0]} | {"passkey.png"}
    return [f for f in recorded if isinstance(f, str) and f in names] if isinstance(recorded, list) else []

# ==== Over training seeds: each seed's evaluation of the same runs, the spread of their effects ====
def _seed_row(m):  # a run's values in its last bucket; gap: to the Bayes floor (a process that has one)
    b = m["ppl"]["buckets"]
    v = m["verdict"]
    last = {f"{k}{s}": m[k][f"nll{s}"][-1] for k in ("gap", "diff") if k in m for s in ("", "_sem")}
    return dict(verdict=v["generalizes_to"], censored=bool(v["censored"]), ppl_last=b["ppl"][-1],
                ppl_within=b["ppl"][b["hi"].index(m["t_train"])], t_train=m["t_train"], **last)

def over_seeds(reports, out):
    """Per seed and run its _seed_row; over the seeds mean +- s.e. (paired: the worst seed) -> seeds.*"""
    runs = {seed: {m["label"]: m for m in r["models"]} for seed, r in reports.items()}
    seeds = list(runs)
    paired = {k: m["diff"].get("reference", "reference") for k, m in runs[seeds[0]].items() if "diff" in m}
    rows = {s: {k: _seed_row(m) for k, m in r.items()} for s, r in runs.items()}
    _print_seed_rows(rows)
    summary = {}
    for label in runs[seeds[0]]:
        summary[label] = _over_the_seeds([rows[s][label] for s in seeds], seeds, paired.get(label))
        _print_summary(label, summary[label])
    left, right = matplotlib.figure.Figure(figsize=(13, 4.5), layout="tight").subplots(1, 2)
    _draw_seed_curves(left, runs)
    last = runs[seeds[0]][list(summary)[-1]]["ppl"]["buckets"]   # the edges (the same for every run)
    _draw_last_bucket(right, rows, summary, paired, (last["lo"][-1], last["hi"][-1]))
    text = json.dumps(dict(seeds=rows, summary=summary), indent=1)
    os.makedirs(out, exist_ok=True)   # only now: a refused or failed call leaves no folder behind
    files.write_atomically(out, {"seeds.json": lambda tmp: pathlib.Path(tmp).write_text(text),
                                "seeds.png": lambda tmp: left.figure.savefig(tmp, format="png", dpi=120)})
    print(f"wrote {out}/seeds.json, {out}/seeds.png")
    return 0

def _mean_sem(key, a):   # over the seeds (axis 0)
    return {key: np.mean(a, 0), f"{key}_sem": sem(a).tolist()}

def _pm(v, key, sign=""):   # "mean +- s.e." of v's key, or "-" without it
    return f"{v[key]:{sign}.3f} +- {v[key + '_sem']:.3f}" if key in v else "-"

def _print_seed_rows(rows):
    """Per seed and run ({seed: {label: _seed_row}}) one line of the table."""
    print("\nper seed: verdict (Def. 3.2; +: censored), PPL in the last bucket <= T_train and in the last; "
          "there the gap to the Bayes floor and NLL - the reference's (paired), +- s.e. over sequences")
    print(f"{'seed':>5} {'run':>16} {'verdict':>8} {'PPL<=T':>8} {'PPL last':>9} {'gap':>17} {'- ref':>18}")
    for s, r in rows.items():
        for k, v in r.items():
            verdict = f"{v['verdict']}{'+' if v['censored'] else ''}"
            print(f"{s:>5} {k:>16} {verdict:>8} {v['ppl_within']:>8.3f} {v['ppl_last']:>9.3f} "
                  f"{_pm(v, 'gap', '+'):>17} {_pm(v, 'diff', '+'):>18}")

def _over_the_seeds(v, seeds, reference):
    """One run's _seed_rows v (one a seed) over the seeds: the last bucket's perplexity (and gap), mean +-
    s.e., the seeds that fail within 32 x T_train; paired to reference (None: not), the difference and its
    worst seed."""
    fails = sum(not r["censored"] and r["verdict"] <= 32 * r["t_train"] for r in v)
    u = {**_mean_sem("ppl_last", [r["ppl_last"] for r in v]), "fails_within_32x": fails,
         "verdicts": [r["verdict"] for r in v]}
    if "gap" in v[0]:
        u.update(_mean_sem("gap_last", [r["gap"] for r in v]))
    if reference is not None:  # over the seeds: each seed's paired difference d and its s.e.
        d, se = np.array([(r["diff"], r["diff_sem"]) for r in v]).T
        u.update(_mean_sem("diff", d), worst=d.max(), worst_seed=seeds[int(d.argmax())],
                 beyond_3_sem=int((d < -3 * se).sum()), reference=reference)
    return u

def _print_summary(label, u):
    """A run's _over_the_seeds u in a line, and its paired difference in another."""
    gap = f", gap {_pm(u, 'gap_last')}" if "gap_last" in u else ""
    print(f"{label}: PPL last {_pm(u, 'ppl_last')} over the seeds{gap}, fails within 32 x T_train on "
          f"{u['fails_within_32x']} of {len(u['verdicts'])}")
    if "diff" in u:
        print(f"  {label} - {u['reference']}: {_pm(u, 'diff', '+')}, worst {u['worst']:+.3f} (seed "
              f"{u['worst_seed']}), below -3 s.e. on {u['beyond_3_sem']} seeds")

def _draw_seed_curves(ax, runs):
    """Each run's position-wise perplexity ({seed: {label: its eval.json entry}}): thin, a seed; thick, the
    mean over the seeds +- s.e."""
    seeds = list(runs)
    for i, label in enumerate(runs[seeds[0]]):
        color = COLORS[i % len(COLORS)]
        b = [runs[s][label]["ppl"]["buckets"] for s in seeds]
        x = [np.sqrt((lo + 1) * hi) for lo, hi in zip(b[0]["lo"], b[0]["hi"])]  # a bucket's geometric middle
        nll = np.array([c["nll"] for c in b], dtype=float)  # [seeds, buckets]; null (NaN) -> a gap
        mean = nll.mean(0)
        band = sem(nll).numpy()
        ax.plot(x, np.exp(nll.T), color=color, lw=0.5, alpha=0.4)
        ax.plot(x, np.exp(mean), color=color, lw=2, label=label)
        ax.fill_between(x, np.exp(mean - band), np.exp(mean + band), color=color, alpha=0.25)
        ax.axvline(runs[seeds[0]][label]["t_train"], color=color, ls=":", lw=1)
    ax.set(xscale="log", yscale="log", title="Position-wise perplexity (thin: a seed; thick: mean +- s.e.)",
           xlabel="context length (dotted: T_train)", ylabel="perplexity")
    ax.legend(fontsize=8)

def _draw_last_bucket(ax, rows, summary, paired, bucket):
    """The last bucket (lo, hi]: with references each run's paired difference per seed (+- s.e.) and its
    band over the seeds; without, each seed's perplexity per run and their mean +- s.e."""
    seeds = list(rows)
    labels = list(summary)
    for i, label in enumerate(labels):
        color = COLORS[i % len(COLORS)]
        v = [rows[s][label] for s in seeds]
        u = summary[label]
        if label in paired:
            d, se = np.array([(r["diff"], r["diff_sem"]) for r in v]).T
            xs = np.arange(len(d)) + 0.6 * (list(paired).index(label) / len(paired) - 0.3)  # side by side
            ax.errorbar(xs, d, se, fmt="o", ms=4, color=color, label=f"{label} - {u['reference']}")
            ax.axhspan(u["diff"] - u["diff_sem"], u["diff"] + u["diff_sem"], color=color, alpha=0.15)
        elif not paired:
            ax.plot([i] * len(v), [r["ppl_last"] for r in v], "o", color=color, alpha=0.5)
            ax.errorbar([i], [u["ppl_last"]], [u["ppl_last_sem"]], fmt="s", ms=8, capsize=4, color=color)
    if paired:
        ax.axhline(0, color="k", lw=0.8)
        ax.set(title="Last bucket, paired to the reference (+-1 s.e.; band: over seeds)",
               xlabel="training seed", ylabel="NLL - reference NLL (nats)", xticks=range(len(seeds)),
               xticklabels=seeds)
        ax.legend(fontsize=8)
    else:
        ax.set(title=f"Last bucket ({bucket[0]}, {bucket[1]}]: each seed, mean +- s.e.",
               ylabel="perplexity", yscale="log", xticks=range(len(labels)), xticklabels=labels)

def read_reports(paths, names=None):
    """--over-seeds: {name: report} of the eval.json files (or folders) `paths`, named `names` (default: the
    folders), checked before anything is written: same runs, same flags, each seed's own checkpoints."""
    files = [p if p.endswith(".json") else os.path.join(p, "eval.json") for p in paths]
    names = names or [os.path.basename(os.path.dirname(os.path.abspath(f))) for f in files]
    require(len(names) == len(set(names)) == len(set(map(os.path.realpath, files))) == len(files) > 1,
            f"--over-seeds: give 2 or more evaluations, each once and its own name (--labels), got "
            f"{len(files)} named {' '.join(map(str, names))}")
    reports = {}
    flags = {}
    seen = {}   # (path, step, training seed) of a checkpoint -> its file
    for name, f in zip(names, files):
        require(os.path.isfile(f), f"--over-seeds: no {f}: pass this script's --out folders (or eval.json)")
        try:   # all that over_seeds reads of it
            r = reports[name] = json.loads(pathlib.Path(f).read_text())
            labels = [m["label"] for m in r["models"]]
            runs = {m["label"]: m for m in r["models"] if "ppl" in m}
            nulls = [f"{k}'s {key}" for k, m in runs.items() for key, v in _seed_row(m).items() if v is None]
            ids = {(m["path"], m.get("step"), m.get("train_seed")): 0 for m in runs.values() if "path" in m}
            flags[name] = {k: {"--t-train": m["t_train"], "edges (--eval-len)": m["ppl"]["buckets"]["hi"],
                               "--reference": (m.get("diff") or {}).get("reference", "diff" in m),
                               "--data (a Bayes gap)": "gap" in m} for k, m in runs.items()}
        except (ValueError, LookupError, TypeError, AttributeError) as e:   # empty, cut short, a list, ...
            raise ValueError(f"--over-seeds: {f} is not an eval.json of this script ({type(e).__name__}: "
                             f"{e}): pass the --out folders of evaluate.py --metrics ppl") from None
        first = list(flags[names[0]])
        require(labels and list(runs) == labels == first, f"--over-seeds: {f} evaluated {labels} ("
                f"{list(runs)} with ppl), {files[0]} {first}: pass ppl evaluations of the same runs")
        require(not nulls, f"--over-seeds: {f} has no {', '.join(nulls)} (null: not finite, or the s.e. of "
                           "one sequence): leave this evaluation out")
        bad = [f"{k}'s {w}: {v} in {f}, {flags[names[0]][k][w]} in {files[0]}"
               for k in runs for w, v in flags[name][k].items() if v != flags[names[0]][k][w]]
        require(not bad, f"--over-seeds: evaluations made with different flags, {''.join(bad[:1])}: pass "
                         "evaluations made with the same flags")
        for i in ids:   # the training seed (where recorded) tells apart runs at one relative path
            require(i not in seen, f"--over-seeds: {seen.get(i)} and {f} both evaluated {i[0]} at step "
                    f"{i[1]}: a checkpoint is one seed: pass each seed's evaluation once")
            seen[i] = f
    return reports
