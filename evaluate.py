"""Evaluate recurrent LMs far past their training length: the paper's measurements and its tasks.

    python evaluate.py out/base out/sp --labels base sp
    python evaluate.py PATH/mamba2-130m --data long.txt --tokenizer PATH/tokenizer.json --t-train 2048

The metrics (sections 1-4, each next to its naive reference) stream sequences through the model in chunks
carrying the state, so memory depends on chunk_len, not on the length. Any LM with model.LM's interface
works: logits, final_state = lm(idx, state=None, last_only=False); lm.zero_state(b, device).
Entry i of a per-position curve is the prediction after reading i + 1 tokens (context length i + 1)."""
import argparse
import json
import math
import os
import pathlib
import signal
import sys

import matplotlib.figure  # no pyplot: figures written to files, no backend to choose
import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

import data
import model
import tasks
from data import require

MIN_SEQS = 16  # below this many sequences the verdict's bootstrap means nothing: warn

# ==== 1. Position-wise perplexity: PPL(t) = exp( E_x[ -log q(x_{t+1} | x_{0..t}) ] ) ====
def position_nll_naive(lm, tokens):
    """The definition, one full forward: NLL [n, T-1], entry (s, i) = -log q(x[s, i+1] | x[s, :i+1])."""
    with torch.inference_mode():
        logits, _ = lm(tokens)
    return F.cross_entropy(logits[:, :-1].float().transpose(1, 2), tokens[:, 1:], reduction="none")

@torch.inference_mode()
def sequence_nll(lm, tokens, chunk_len=512, batch_size=8, progress=False):
    """position_nll_naive streamed: chunk_len tokens per call, the state carried; logits [b, chunk_len, V]."""
    tokens, _ = _require_eval_inputs(tokens, min_len=2)
    out = torch.empty(tokens.shape[0], tokens.shape[1] - 1)
    for r in tqdm(range(0, len(tokens), batch_size), desc="ppl", disable=not progress):
        x, state = tokens[r:r + batch_size].to(_device(lm)), None  # None: the zero initial state
        for a in range(0, out.shape[1], chunk_len):
            logits, state = lm(x[:, a:-1][:, :chunk_len], state)
            nll = F.cross_entropy(logits.float().mT, x[:, a + 1:][:, :chunk_len], reduction="none")
            out[r:r + len(x), a:a + chunk_len] = nll.cpu()
    return out

def position_nll(lm, tokens, chunk_len=512, batch_size=8):
    """Mean NLL per position [T-1], averaged over sequences FIRST: PPL(t) = exp(this), not mean(exp(nll))."""
    return sequence_nll(lm, tokens, chunk_len, batch_size).double().mean(0)

def log_edges(length, per_octave=2, include=()):
    """Bucket edges 0, 1, 2, 3, 4, 6, 8, 11, 16, ..., length, and `include` (no bucket straddles t_train)."""
    grid = [round(2 ** (k / per_octave)) for k in range(per_octave * int(length).bit_length() + 1)]
    return sorted({0, length} | {int(e) for e in [*grid, *include] if 0 < e < length})

def bucketize(nll, edges):
    """Each sequence's NLL [n, L] averaged per bucket first (per_seq [n, K]), then mean and standard error
    over sequences: a sequence's positions correlate, the sequences do not."""
    nll = torch.as_tensor(nll, dtype=torch.float64)
    require(nll.dim() == 2 and edges[0] == 0 and edges[-1] == nll.shape[1] and np.all(np.diff(edges) > 0),
            f"bucket edges must rise from 0 to L = {nll.shape[-1]} for nll [n, L]: use log_edges(L)")
    per_seq = torch.stack([nll[:, lo:hi].mean(1) for lo, hi in zip(edges[:-1], edges[1:])], 1)
    return dict(lo=list(edges[:-1]), hi=list(edges[1:]), per_seq=per_seq, **_summary(per_seq))

def _summary(per_seq):
    nll, sem = per_seq.mean(0), _sem(per_seq)
    return dict(nll=nll, nll_sem=sem, ppl=nll.exp(), ppl_sem=nll.exp() * sem)  # delta method

def _sem(x):
    return x.std(0) / math.sqrt(len(x)) if len(x) > 1 else x[0] * math.nan

# ==== 2. Length generalization (Definition 3.2) ====
def length_generalization_naive(ppl, t_train):
    """Definition 3.2 read literally on a per-position curve ppl [L]: p* = min over t < t_train, at t*;
    the model generalizes to T if ppl(t) <= p* for all t in [t*, T). Returns that largest T. On a
    measured curve it mostly measures noise (p* is biased low; one noisy position ends the run)."""
    ppl = torch.as_tensor(ppl)
    t_star = int(ppl[:t_train].argmin())
    above = (ppl[t_star:] > ppl[t_star]).nonzero()
    return t_star + int(above[0]) if len(above) else len(ppl)

def short_context_nll(lm, tokens, t_train, chunk_len=512, batch_size=8):
    """Each target of tokens [n, L+1] read after (t_train / 2, t_train] tokens from the zero state -> NLL
    [n, L] (NaN at t < t_train / 2): Definition 3.2's p* on the very tokens it is compared with."""
    n, L = tokens.shape[0], tokens.shape[1] - 1
    out = torch.full((n, L), math.nan)
    for offset in (0, t_train // 2, L - t_train):  # every target past t_train / 2: in a piece's second half
        k = (L - offset) // t_train  # whole pieces
        pieces = tokens[:, offset:offset + k * t_train + 1].unfold(1, t_train + 1, t_train)  # [n, k, T+1]
        nll = sequence_nll(lm, pieces.flatten(0, 1), chunk_len, batch_size * max(1, L // t_train))
        second_half = torch.arange(k * t_train) % t_train >= t_train // 2
        out[:, offset:offset + k * t_train][:, second_half] = nll.view(n, -1)[:, second_half]
    return out

def length_generalization(per_seq, lo, hi, t_train, ref=None, alpha=0.05, n_boot=2000, seed=0):
    """Definition 3.2 on bucketed per-sequence NLLs per_seq [n, K] (bucketize's); ref [n, K]: the same buckets
    read at a training-length context (short_context_nll, bucketed), or None (per_seq's NLL in [t*, t_train)).
    1. p*: the PPL of ref over the buckets past t* = t_train / 2, not a minimum (a minimum is biased low).
    2. A bucket past t_train exceeds p* when the mean over sequences of the paired difference NLL - ref is
       > 0 at the alpha / m quantile of n_boot seeded bootstrap means, m = buckets past t_train (Bonferroni).
    3. generalizes_to: hi of the bucket before the first exceeding p* (the first: t_train; none: censored)."""
    per_seq, lo, hi = torch.as_tensor(per_seq, dtype=torch.float64), list(lo), list(hi)
    n, K = per_seq.shape
    window = [j for j in range(K) if lo[j] >= t_train // 2 and hi[j] <= t_train]
    later = [j for j in range(K) if lo[j] >= t_train]
    require(window, f"no bucket lies within the training positions [{t_train // 2}, {t_train}): use edges "
                    f"that include both (log_edges(L, include=[{t_train // 2}, {t_train}]))")
    width = torch.tensor(hi, dtype=torch.float64) - torch.tensor(lo)  # a bucket's mean weighs its positions
    if ref is None:  # each sequence's NLL over p*'s window, for every bucket
        ref = (per_seq[:, window] @ width[window] / width[window].sum())[:, None].expand(n, K)
    ref, pooled = torch.as_tensor(ref, dtype=torch.float64), window + later
    p_star = float((ref[:, pooled] @ width[pooled] / width[pooled].sum()).mean().exp())
    out = dict(t_train=t_train, n_seqs=n, p_star=p_star, t_star=lo[window[0]])
    if not torch.isfinite(per_seq[:, pooled]).all() or not torch.isfinite(ref[:, pooled]).all():
        return dict(out, generalizes_to=None, ratio=None, censored=None, warning="NLL not finite: no verdict")
    d = per_seq[:, later] - ref[:, later]  # [n, m]
    idx = torch.randint(n, (n_boot, n), generator=torch.Generator().manual_seed(seed))
    counts = torch.zeros(n_boot, n).scatter_add_(1, idx, torch.ones(n_boot, n)).double()
    lower = torch.quantile(counts @ d / n, alpha / len(later), dim=0) if later else torch.zeros(0)
    first = ((lower > 0).tolist() + [True]).index(True)  # into `later`: the first bucket that exceeds p*
    T = hi[later[first - 1]] if first else t_train
    out.update(generalizes_to=T, ratio=T / t_train, censored=first == len(later))
    if n < MIN_SEQS:
        out["warning"] = f"only {n} sequences: the verdict is not meaningful (use --n-seqs >= {MIN_SEQS})"
    return out

# ==== 3. Effective Remembrance: EffRem_T(t) = d( q(.|x[0:T]), q(.|x[t:T]) ) ====
# d between next-token distributions [..., V]: 0 exactly when p == q, at most 1 (clamped where used).
DISTANCES = {
    "tv": lambda p, q: 0.5 * (p - q).abs().sum(-1),
    "js": lambda p, q: (torch.xlogy(p, p) + torch.xlogy(q, q)  # Jensen-Shannon in bits: [0, 1] like TV
                        - torch.xlogy(p + q, (p + q) / 2)).sum(-1) / (2 * math.log(2)),
    "cos": lambda p, q: 0.5 * (F.normalize(p, dim=-1) - F.normalize(q, dim=-1)).pow(2).sum(-1)}  # 1 - cos

@torch.inference_mode()
def effective_remembrance_naive(lm, tokens, T, cuts, distance="tv"):
    """The definition, one forward per cut: mean over rows of d(q(.|x[0:T]), q(.|x[t:T])) for each t."""
    tokens, cuts = _require_eval_inputs(tokens, T=T, cuts=cuts, distance=distance)
    x = tokens[:, :T].to(_device(lm))
    p, d = lm(x)[0][:, -1].double().softmax(-1), DISTANCES[distance]  # float64 next-token distributions
    return torch.stack([d(p, lm(x[:, t:])[0][:, -1].double().softmax(-1)).clamp(0, 1).mean()
                        for t in cuts.tolist()]).cpu()

@torch.inference_mode()
def effective_remembrance(lm, tokens, T, cuts, distance="tv", batch_size=2, chunk_len=256, reduce=True,
                          progress=False):
    """EffRem_T(t) for every cut in one pass, [len(cuts)] (reduce=False: [n, len(cuts)]). Running on x[t:T] is
    the full run with the state zeroed at t: at each cut the rows of that suffix join the batch with a zero
    state (every key), the work of one forward per cut in far fewer calls. EffRem_T(0) = 0 exactly."""
    tokens, cuts = _require_eval_inputs(tokens, T=T, cuts=cuts, distance=distance)
    starts = sorted(set(cuts.tolist()) | {0})  # rows for t = 0 are the reference
    stops = sorted(set(starts[1:]) | set(range(0, T, chunk_len)) | {T})
    out = torch.zeros(len(tokens), len(cuts), dtype=torch.float64)
    for r in tqdm(range(0, len(tokens), batch_size), desc="effrem", disable=not progress):
        x = tokens[r:r + batch_size, :T].to(_device(lm))
        for a, b in zip(stops[:-1], stops[1:]):
            if a in starts:  # the suffix from a joins the batch, from a zero state
                z0 = lm.zero_state(len(x), x.device)
                state = z0 if a == 0 else [{k: torch.cat([s[k], z[k]]) for k in s} for s, z in zip(state, z0)]
            logits, state = lm(x[:, a:b].repeat(sum(t <= a for t in starts), 1), state, last_only=True)
        p = logits[:, -1].double().softmax(-1).view(len(starts), len(x), -1)  # p[k]: from starts[k] on
        for j, t in enumerate(cuts.tolist()):
            out[r:r + len(x), j] = DISTANCES[distance](p[0], p[starts.index(t)]).clamp(0, 1).cpu()
    return out.mean(0) if reduce else out

def default_cuts(T, n_cuts=32):
    """0, log-spaced from the start (a failing model jumps at once) and toward T (a healthy one rises)."""
    n_cuts = min(n_cuts, T)   # there are T cuts in [0, T - 1]: more asked are repeats (and could fill memory)
    half, top = max(1, (n_cuts - 1) // 2), math.log10(max(1, T // 2))
    early = torch.logspace(0, top, half).round().long()
    late = T - torch.logspace(0, top, max(0, n_cuts - 1 - half)).round().long()
    return torch.cat([torch.tensor([0]), early, late]).clamp(0, T - 1).unique()

# ==== 4. State statistics (Fig. 4): the spread of each head's state "h" as a function of position ====
@torch.inference_mode()
def state_statistics(lm, tokens, positions=None, chunk_len=512, batch_size=8, t_train=None, progress=False):
    """Per layer [P, heads] at each of positions: std (N - 1) and RMS of h[:, head], the batch and the other
    dims pooled (as Fitted Noise pools them, with the population variance). coverage (ours): mean std at
    context >= 4 t_train / largest std at context <= t_train; >> 1: late states drift where training never
    went (the unexplored-states hypothesis)."""
    tokens, _ = _require_eval_inputs(tokens)
    default = np.array(log_edges(tokens.shape[1])[1:]) - 1  # log-spaced context lengths 1, 2, 3, 4, 6, ..., T
    positions = torch.as_tensor(default if positions is None else positions).long().flatten().unique()
    assert 0 <= positions.min() and positions.max() < tokens.shape[1], "positions must lie in [0, T - 1]"
    ends = (positions + 1).tolist()
    stops = sorted(set(ends) | set(range(chunk_len, ends[-1], chunk_len)))
    acc = {}  # context length -> [count, sum, sum of squares] per layer and head
    for r in tqdm(range(0, len(tokens), batch_size), desc="state", disable=not progress):
        x, state = tokens[r:r + batch_size].to(_device(lm)), None
        for a, b in zip([0] + stops[:-1], stops):
            _, state = lm(x[:, a:b], state, last_only=True)
            if b in ends:
                h = torch.stack([s["h"] for s in state]).transpose(1, 2).flatten(2).double().cpu()
                acc[b] = acc.get(b, 0) + torch.stack([h[..., 0] * 0 + h.shape[2], h.sum(2), h.pow(2).sum(2)])
    cnt, s, sq = torch.stack([acc[b] for b in ends], 1).transpose(1, 2)  # [layers, P, heads]
    std = ((sq - s * s / cnt) / (cnt - 1).clamp_min(1)).clamp_min(0).sqrt()
    out = dict(positions=positions, std=list(std), rms=list((sq / cnt).sqrt()))
    if t_train is not None:
        early, late = positions + 1 <= t_train, positions + 1 >= 4 * t_train
        both = early.any() and late.any()
        out["coverage"] = list(std[:, late].mean(1) / std[:, early].amax(1) if both else std[:, 0] * math.nan)
    return out

# ==== 5. Report and plots: each curve is printed (a few columns) and drawn (a PNG panel) from one table ====
CTX = "context length (dotted: T_train)"
# curve -> PNG file holding its panel (None: printed only), title, x label, y label, scale (log x, log-log)
PANELS = {
    "ppl": ("ppl.png", "Position-wise perplexity (+-1 s.e.; dashed: p*)", CTX, "perplexity", "log"),
    "gap": ("ppl.png", "Gap to the Bayes floor", CTX, "model NLL - Bayes NLL (nats)", "log"),
    "diff": ("ppl.png", "Paired difference to the reference run", CTX, "NLL - reference NLL (nats)", "log"),
    "effrem": ("effrem.png", "Effective Remembrance", "t (dotted: T - T_train)", "EffRem_T(t)", "log"),
    "state": ("state.png", "State spread, most drifting head per layer", CTX, "std of state h", "loglog"),
    "passkey": (None, "Passkey", "total length", "exact match", "log"),
    "copy": ("copy.png", "Copying", "string length", "char accuracy (+- s.e.)", None),
    "babilong": ("babilong.png", "BABILong", "total length (dotted: T_train)", "accuracy (task mean)", "log")}

def _curves(m):
    """A model's curves: name -> [(x, y, s.e. or None, legend, x of its dotted line or None)]."""
    out, label, t = {}, m["label"], m["t_train"]
    if b := m.get("ppl", {}).get("buckets"):
        x = [math.sqrt((lo + 1) * hi) for lo, hi in zip(b["lo"], b["hi"])]  # a bucket's geometric middle
        out["ppl"] = [(x, b["ppl"], b["ppl_sem"], f"{label} (T={m['verdict']['generalizes_to']})", t)]
        legend = {"gap": label, "diff": f"{label} - {m.get('diff', {}).get('reference')}"}
        out.update({k: [(x, m[k]["nll"], m[k]["nll_sem"], legend[k], t)] for k in legend if k in m})
    if e := m.get("effrem"):
        out["effrem"] = [(e["cuts"], e["mean"], e["sem"], f"{label} (T={e['T']})", t and e["T"] - t)]
    if "state" in m:  # per layer the head that drifts most, its coverage in the legend
        st, x = m["state"], np.array(m["state"]["positions"]) + 1
        cov = np.nan_to_num(np.array(st["coverage"], dtype=float), nan=-1)  # [layers, heads]
        out["state"] = [(x, std[:, h], None, f"{label} L{i} h{h} cov {cov[i, h]:.3g}", t)
                        for i, (std, h) in enumerate(zip(np.array(st["std"], dtype=float), cov.argmax(1)))]
    return out | {key: [(m[key]["lengths"], m[key][y], sem and m[key][sem], label, key != "copy" and t)]
                  for key, y, sem in [("passkey", "exact_mean", None), ("copy", "char_mean", "char_sem"),
                                      ("babilong", "mean", None)] if key in m}

def show(report, out):
    """Per model the verdict; each curve printed (8 columns, models together) and drawn in its PANELS PNG;
    the report written as out/eval.json, all files together (data.write_atomically)."""
    for m in report["models"]:
        print(f"[{m['label']}] {m['arch']}, {m['params']:,} params, t_train {m['t_train']}"
              + f", step {m['step']}" * (m.get("step") is not None))
        if (v := m.get("verdict", {})).get("ratio") is not None:
            print(f"  verdict (Def. 3.2): p* = {v['p_star']:.4g} at t* = {v['t_star']}, generalizes to T = "
                  f"{v['generalizes_to']}{'+' * v['censored']} ({v['ratio']:.1f}x t_train)")
        if "warning" in v:
            print(f"warning: {m['label']}: {v['warning']}", file=sys.stderr)
    colors = matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]
    panels = {name: rows for name in PANELS if (rows := [(colors[i % len(colors)], *c)  # panels with a curve
              for i, m in enumerate(report["models"]) for c in _curves(m).get(name, [])])}
    for name, rows in panels.items():
        _, title, xlabel, ylabel, _ = PANELS[name]
        print(f"\n{title}: {ylabel}", end="")
        for i, (_, x, y, _, legend, _) in enumerate(rows):
            cols = sorted({round(k * (len(x) - 1) / 7) for k in range(8)})  # log-spaced where x is
            if i == 0 or list(x) != list(rows[i - 1][1]):
                print(f"\n  {xlabel.split(' (')[0]:<26}" + "".join(f"{round(x[j]):>11}" for j in cols))
            cells = ["n/a" if y[j] is None else f"{y[j]:.4g}" for j in cols]
            print(f"  {legend:<26}" + "".join(f"{v:>11}" for v in cells))
    figs = {}
    for file in dict.fromkeys(PANELS[name][0] for name in panels if PANELS[name][0]):
        names = [name for name in panels if PANELS[name][0] == file]
        figs[file] = matplotlib.figure.Figure(figsize=(1 + 6 * len(names), 4.5), layout="tight")
        for ax, name in zip(figs[file].subplots(1, len(names), squeeze=False)[0], names):
            _, title, xlabel, ylabel, scale = PANELS[name]
            ax.set(title=title, xlabel=xlabel, ylabel=ylabel, xscale="log" if scale else "linear",
                   yscale="log" if scale == "loglog" else "linear")
            for color, x, y, sem, label, line_at in panels[name]:
                y = np.array(y, dtype=float)  # None (NaN in the JSON) -> nan: a gap in the curve
                if not np.isfinite(y).any():
                    print(f"warning: {label}: no finite value to plot (NaN or inf)", file=sys.stderr)
                    continue
                sem = np.nan_to_num(np.array(y * 0 if sem is None else sem, dtype=float))
                ax.plot(x, y, color=color, label=label)
                ax.fill_between(x, y - sem, y + sem, color=color, alpha=0.25)
                if line_at:
                    ax.axvline(line_at, color=color, ls=":", lw=1)
            for color, m in zip(colors, report["models"] if name == "ppl" else []):  # Definition 3.2's p*
                if m["verdict"]["p_star"] is not None:
                    ax.axhline(m["verdict"]["p_star"], color=color, ls="--", lw=0.8)
            if name == "ppl" and "optimal" in report:  # the models' buckets: x of the first curve
                ax.plot(panels[name][0][1], report["optimal"]["ppl"], "k--", lw=1, label="Bayes-optimal")
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
    os.makedirs(out, exist_ok=True)
    writes = {"eval.json": lambda tmp: pathlib.Path(tmp).write_text(json.dumps(report, indent=1)),
              **{f: lambda tmp, fig=fig: fig.savefig(tmp, format="png", dpi=120) for f, fig in figs.items()}}
    data.write_atomically(out, writes)   # all files at once: the previous ones or all the new
    old = [os.path.join(out, f) for f in sorted({p[0] for p in PANELS.values() if p[0]} | {"passkey.png"})
           if f not in writes and os.path.isfile(os.path.join(out, f))]   # of the eval.json just replaced
    for f in old:
        os.unlink(f)
    print("\nwrote " + ", ".join(os.path.join(out, file) for file in writes)
          + f"; removed the previous evaluation's {', '.join(old)}" * bool(old))

# ==== 6. Over training seeds: each seed's evaluation of the same runs, the spread of their effects ====
def _seed_row(m):  # a run's values in its last bucket; gap: to the Bayes floor (a process that has one)
    b, v = m["ppl"]["buckets"], m["verdict"]
    last = {f"{k}{s}": m[k][f"nll{s}"][-1] for k in ("gap", "diff") if k in m for s in ("", "_sem")}
    return dict(verdict=v["generalizes_to"], censored=bool(v["censored"]), ppl_last=b["ppl"][-1],
                ppl_within=b["ppl"][b["hi"].index(m["t_train"])], t_train=m["t_train"], **last)

def over_seeds(reports, out):
    """Per seed and run: the verdict, the perplexity in the last bucket within T_train and in the last bucket,
    and (paired runs) the last bucket's NLL - the reference's; over the seeds their mean +- s.e. and the worst
    seed -> a table, seeds.{json,png}."""
    runs = {seed: {m["label"]: m for m in r["models"]} for seed, r in reports.items()}
    mean_sem = lambda a: (a.mean(0), a.std(0, ddof=1) / np.sqrt(len(a)))  # over the seeds (axis 0)
    seeds, labels = list(runs), list(runs[next(iter(runs))])
    paired = [k for k in labels if "diff" in runs[seeds[0]][k]]  # minus the reference (fig5: the control)
    rows = {s: {k: _seed_row(m) for k, m in r.items()} for s, r in runs.items()}
    print("\nper seed: verdict (Def. 3.2; +: censored), PPL in the last bucket <= T_train and in the last; "
          "there the gap to the Bayes floor and NLL - the reference's (paired), +- s.e. over sequences")
    print(f"{'seed':>5} {'run':>16} {'verdict':>8} {'PPL<=T':>8} {'PPL last':>9} {'gap':>17} {'- ref':>18}")
    pm = lambda v, k: f"{v[k]:+.3f} +- {v[k + '_sem']:.3f}" if k in v else "-"
    for s, r in rows.items():
        for k, v in r.items():
            print(f"{s:>5} {k:>16} {str(v['verdict']) + '+' * v['censored']:>8} {v['ppl_within']:>8.3f} "
                  f"{v['ppl_last']:>9.3f} {pm(v, 'gap'):>17} {pm(v, 'diff'):>18}")
    summary, colors = {}, matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]
    left, right = matplotlib.figure.Figure(figsize=(13, 4.5), layout="tight").subplots(1, 2)
    for i, (color, label) in enumerate(zip(colors * 2, labels)):
        b = [runs[s][label]["ppl"]["buckets"] for s in seeds]
        x = [np.sqrt((lo + 1) * hi) for lo, hi in zip(b[0]["lo"], b[0]["hi"])]  # a bucket's geometric middle
        nll = np.array([c["nll"] for c in b], dtype=float)  # [seeds, buckets]; null (NaN) -> a gap
        mean, sem = mean_sem(nll)
        left.plot(x, np.exp(nll.T), color=color, lw=0.5, alpha=0.4)
        left.plot(x, np.exp(mean), color=color, lw=2, label=label)
        left.fill_between(x, np.exp(mean - sem), np.exp(mean + sem), color=color, alpha=0.25)
        left.axvline(rows[seeds[0]][label]["t_train"], color=color, ls=":", lw=1)
        v = [rows[s][label] for s in seeds]
        last = np.array([r["ppl_last"] for r in v])
        fails = sum(not r["censored"] and r["verdict"] <= 32 * r["t_train"] for r in v)
        summary[label] = u = dict(zip(("ppl_last", "ppl_last_sem"), mean_sem(last)), fails_within_32x=fails,
                                  verdicts=[r["verdict"] for r in v])
        if "gap" in v[0]:
            u.update(zip(("gap_last", "gap_last_sem"), mean_sem(np.array([r["gap"] for r in v]))))
        print(f"{label}: PPL last {u['ppl_last']:.3f} +- {u['ppl_last_sem']:.3f} over the seeds" + (
              f", gap {u['gap_last']:.3f} +- {u['gap_last_sem']:.3f}" if "gap" in v[0] else "") +
              f", fails within 32 x T_train on {fails} of {len(v)}")
        if label in paired:  # over the seeds: each seed's paired difference d and its s.e.
            d, se = np.array([(r["diff"], r["diff_sem"]) for r in v]).T
            u.update(zip(("diff", "diff_sem"), mean_sem(d)), worst=d.max(), worst_seed=seeds[int(d.argmax())],
                     beyond_3_sem=int((d < -3 * se).sum()))
            u["reference"] = runs[seeds[0]][label]["diff"].get("reference", "reference")
            print(f"  {label} - {u['reference']}: {u['diff']:+.3f} +- {u['diff_sem']:.3f}, worst "
                  f"{u['worst']:+.3f} (seed {u['worst_seed']}), below -3 s.e. on {u['beyond_3_sem']} seeds")
            xs = np.arange(len(d)) + 0.6 * (paired.index(label) / len(paired) - 0.3)  # side by side per seed
            right.errorbar(xs, d, se, fmt="o", ms=4, color=color, label=f"{label} - {u['reference']}")
            right.axhspan(u["diff"] - u["diff_sem"], u["diff"] + u["diff_sem"], color=color, alpha=0.15)
        elif not paired:  # each seed's last-bucket perplexity per run
            right.plot([i] * len(last), last, "o", color=color, alpha=0.5)
            right.errorbar([i], [last.mean()], [mean_sem(last)[1]], fmt="s", ms=8, capsize=4, color=color)
    left.set(xscale="log", yscale="log", title="Position-wise perplexity (thin: a seed; thick: mean +- s.e.)",
             xlabel="context length (dotted: T_train)", ylabel="perplexity")
    if paired:
        right.axhline(0, color="k", lw=0.8)
        right.set(title="Last bucket, paired to the reference (+-1 s.e.; band: over seeds)",
                  xlabel="training seed", ylabel="NLL - reference NLL (nats)", xticks=range(len(seeds)),
                  xticklabels=seeds)
        right.legend(fontsize=8)
    else:
        right.set(title=f"Last bucket ({b[0]['lo'][-1]}, {b[0]['hi'][-1]}]: each seed, mean +- s.e.",
                  ylabel="perplexity", yscale="log", xticks=range(len(labels)), xticklabels=labels)
    left.legend(fontsize=8)
    text = json.dumps(dict(seeds=rows, summary=summary), indent=1)
    os.makedirs(out, exist_ok=True)   # only now: a refused or failed call leaves no folder behind
    data.write_atomically(out, {"seeds.json": lambda tmp: pathlib.Path(tmp).write_text(text),
                                "seeds.png": lambda tmp: left.figure.savefig(tmp, format="png", dpi=120)})
    print(f"wrote {out}/seeds.json, {out}/seeds.png")
    return 0

# ==== 7. Command line ====
LM_METRICS, TASK_METRICS = ("ppl", "effrem", "state"), ("passkey", "copy", "babilong")

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.error = lambda message: ap.exit(2, f"error: {message}\n")  # one line, as every other bad input
    a, positive = ap.add_argument, lambda text: _ints(text, one=True)
    a("ckpts", nargs="+", metavar="CKPT", help="train.py's ckpt.pt (or its dir), official Mamba dir, hub id")
    a("--metrics", default="ppl,effrem,state", help=f"subset of {','.join(LM_METRICS + TASK_METRICS)}")
    a("--eval-len", type=positive, help="tokens per evaluation window (default: 16 x the largest t_train)")
    a("--n-seqs", type=positive, default=64, help=f"evaluation windows (the verdict needs >= {MIN_SEQS})")
    a("--allow-overlap", action="store_true", help="accept windows that overlap (a short validation split)")
    a("--t-train", type=positive, help="training length (default: train_config seq_len; official: 2048)")
    a("--data", help="what data.load_data reads (default: train_config data)")
    a("--tokenizer", help="bytes, gpt2 (tiktoken), PATH/tokenizer.json, a hub id (default: the checkpoints')")
    a("--cache-dir", help="where text --data is tokenized once (default $LENGTHGEN_CACHE_DIR, data_cache/)")
    a("--effrem-len", type=positive, help="T of EffRem_T(t) (default: --eval-len; the paper's: 4 x t_train)")
    a("--effrem-cuts", type=positive, default=32, help="number of cut points t of EffRem_T")
    a("--distance", default="tv", choices=sorted(DISTANCES), help="EffRem's distance (tv: the paper's)")
    a("--chunk-len", type=positive, help="tokens per model call while streaming: bounds memory, not results")
    a("--batch-size", type=positive, help="sequences per model call (EffRem: each brings one row per cut)")
    a("--seed", type=lambda t: _ints(t, True, 0), default=0, help="seed of the windows, samples, bootstrap")
    a("--out", default="out/eval", help="directory for eval.json and the PNGs")
    a("--device", default="auto", choices=["auto", "cpu", "cuda"])
    a("--labels", nargs="+", help="one display name per checkpoint (default: the directory names)")
    a("--reference", nargs="+", metavar="LABEL", help="with ppl: each run's NLL minus this run's, paired per "
      "sequence; RUN=LABEL: RUN's minus LABEL's (e.g. control TBTT=streams: TBTT against its own control)")
    a("--over-seeds", action="store_true", help="CKPTs are eval.json files (or --out folders) of this script "
      "on the same runs trained with other seeds (--labels: the seeds): the spread -> OUT/seeds.{json,png}")
    a("--task-samples", type=positive, default=8, help="examples per passkey cell, copy length, bAbI cell")
    a("--passkey-lengths", type=_ints, default="128,256,512,1024,2048,4096", help="total lengths (tokens)")
    a("--passkey-depths", type=positive, default=10, help="evenly spaced insertion depths in [0, 1]")
    a("--copy-lengths", type=_ints, default="50,100,300", help="string lengths")
    a("--babi-lengths", type=_ints, default="512,1024,2048,4096", help="total lengths (stories: ~470 tokens)")
    a("--babi-tasks", help="comma-separated bAbI tasks (default: train_config babi_tasks, else all)")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM as Ctrl-C: one line, below
    try:
        empty = ["CKPT" if k == "ckpts" else "--" + k.replace("_", "-") for k, v in vars(args).items()
                 if "" in (v if isinstance(v, list) else [v])]
        require(not empty, f"{' '.join(empty)} '': pass a value, or leave the flag out")
        parent = os.path.abspath(args.out)   # --out or the folder it goes in: now, not after the metrics
        while not os.path.lexists(parent):
            parent = os.path.dirname(parent)
        require(os.path.isdir(parent) and os.access(parent, os.W_OK | os.X_OK),
                f"--out {args.out!r} is not a directory that can be written: pass another")
        if args.over_seeds:
            return over_seeds(read_reports(args), args.out)
        show(run(args), args.out)
    except (ValueError, OSError, RuntimeError) as e:  # bad input: one line naming the problem and the fix
        print(f"error: {e}", file=sys.stderr)
        return 2
    except MemoryError as e:   # work sized by the flags
        print(f"error: out of memory ({str(e) or 'MemoryError'}): lower --n-seqs, --eval-len, --batch-size, "
              "--task-samples, --passkey-depths or the task lengths", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"interrupted: {args.out}/{'seeds' if args.over_seeds else 'eval'}.json and its figures not "
              "written (any previous ones are intact)", file=sys.stderr)
        return 1
    return 0

def read_reports(args):
    """--over-seeds: {seed name: report} from the eval.json files (or folders) args.ckpts: the same runs made
    with the same flags, each seed's checkpoints its own; checked before anything is written."""
    files = [p if p.endswith(".json") else os.path.join(p, "eval.json") for p in args.ckpts]
    names = args.labels or [os.path.basename(os.path.dirname(os.path.abspath(f))) for f in files]
    require(len(names) == len(set(names)) == len(set(map(os.path.realpath, files))) == len(files) > 1,
            f"--over-seeds: give 2 or more evaluations, each once and its own name (--labels), got "
            f"{len(files)} named {' '.join(names)}")
    reports, flags, seen = {}, {}, {}   # seen: (path, step, training seed) of a checkpoint -> its file
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
                               "--data (a Bayes gap)": "gap" in m}
                           for k, m in runs.items()}
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
            require(seen.setdefault(i, f) == f, f"--over-seeds: {seen[i]} and {f} both evaluated {i[0]} at "
                    f"step {i[1]}: a checkpoint is one seed: pass each seed's evaluation once")
    return reports

def _ints(text, one=False, lo=1):  # an argparse type: "128,256" -> [128, 256]; one=True: "128" -> 128
    kind = "a positive integer" if one else "comma-separated distinct positive integers"
    kind = kind if lo else "in [0, 2**63)"
    values = [int(v) if v.isdecimal() else -1 for v in text.split(",")]
    if not all(lo <= v < 2**63 for v in values) or len(set(values)) < len(values) or one and "," in text:
        raise argparse.ArgumentTypeError(f"must be {kind}, got {text!r}")
    return values[0] if one else values

def run(args):
    """Checks the flags (defaults: train_config), measures each checkpoint on the same data -> the report
    (eval.json: per model its label, path, checkpoint step, training seed and metrics)."""
    require(not args.labels or len(args.ckpts) == len(args.labels) == len(set(args.labels)), f"--labels "
            f"{' '.join(args.labels or [])}: give each of the {len(args.ckpts)} checkpoints its own name")
    for p in args.ckpts:
        require(os.path.exists(data.hub_path(p)), f"no checkpoint at {p}: check the path (OUT/ckpt.pt)")
    files = [os.path.realpath(model.weights_file(p)[0]) for p in args.ckpts]   # a run's folder is its ckpt.pt
    require(len(set(files)) == len(files), f"{' '.join(args.ckpts)}: one checkpoint twice: pass each once")
    cfgs = [model.train_config(p) for p in args.ckpts]  # a corrupt checkpoint is reported as corrupt
    args.metrics, known = args.metrics.split(","), LM_METRICS + TASK_METRICS
    lm_metrics, task_metrics = (bool(set(args.metrics) & set(m)) for m in (LM_METRICS, TASK_METRICS))
    require(len(set(args.metrics) & set(known)) == len(args.metrics), f"unknown or repeated metric in "
            f"--metrics {','.join(args.metrics)}: use a subset of {','.join(known)}")
    require(args.device != "cuda" or torch.cuda.is_available(), "no CUDA device: use --device cpu")
    args.device = args.device if args.device != "auto" else "cuda" if torch.cuda.is_available() else "cpu"
    t_trains = [args.t_train or c.get("seq_len") for c in cfgs]
    if lm_metrics:
        require(all(t_trains), f"{', '.join(p for p, t in zip(args.ckpts, t_trains) if not t)}: no "
                "train_config seq_len (an official checkpoint?): pass --t-train N (official Mamba-2: 2048)")
        args.eval_len = args.eval_len or 16 * max(t_trains)
        need = max(t + max(1, t // 2) for t in t_trains)   # a piece of short_context_nll from t_train / 2 on
        require(args.eval_len >= need, f"--eval-len {args.eval_len} must be at least {need} (1.5 x t_train "
                                       f"{max(t_trains)}): try --eval-len {16 * max(t_trains)}")
        require(not args.effrem_len or 1 < args.effrem_len <= args.eval_len, f"--effrem-len "
                f"{args.effrem_len} must lie in [2, --eval-len {args.eval_len}]: lower it or raise that")
    ids = {c["tokenizer_id"] for c in cfgs if c.get("tokenizer_id")}   # the runs' tokenizers (train.py)
    require(len(ids) <= 1, f"checkpoints of different tokenizers {sorted(ids)}: evaluate them separately")
    args.tokenizer = _agree(args, cfgs, "tokenizer", required=False) or "bytes"
    enc = data.get_tokenizer(args.tokenizer)
    require(ids <= {enc.name}, f"--tokenizer {args.tokenizer} ({enc.name}) does not match the checkpoints' "
                               f"{''.join(ids)}: pass the tokenizer.json they were trained with")
    _ = task_metrics and tasks.task_tokenizer(args.tokenizer)  # it spells the tasks
    _ = "passkey" in args.metrics and tasks.passkey_sample(args.tokenizer, min(args.passkey_lengths))  # fits
    require("passkey" not in args.metrics or args.passkey_depths <= min(args.passkey_lengths), f"--passkey-"
            f"depths {args.passkey_depths} > {min(args.passkey_lengths)}, the shortest of --passkey-lengths")
    seeds = {c.get("split_seed", c.get("seed")) for c in cfgs if str(c.get("data"))[:6] == "markov"} - {None}
    require(len(seeds) <= 1, f"the checkpoints were trained with --split-seed {sorted(seeds)}, drawing their "
                             "Markov corpora differently: evaluate them separately")
    args.split_seed = seeds.pop() if seeds else 0
    args.babi_tasks = (_agree(args, cfgs, "babi_tasks", False) or ",".join(tasks.BABI_TASKS)).split(",")
    require(len(set(args.babi_tasks) & set(tasks.BABI_TASKS)) == len(args.babi_tasks), f"unknown or repeated "
            f"--babi-tasks {','.join(args.babi_tasks)}: use a subset of {','.join(tasks.BABI_TASKS)}")
    args.labels = args.labels or [os.path.basename(os.path.dirname(p) if p.endswith(".pt") else p.rstrip("/"))
                                  for p in args.ckpts]
    refs = dict(r.split("=", 1) if "=" in r else (None, r) for r in args.reference or [])   # run -> reference
    require(not refs or set(refs.values()) | set(refs) - {None} <= set(args.labels) and "ppl" in args.metrics
            and len(refs) == len(args.reference), f"--reference {' '.join(args.reference or [])} must name "
            f"labels of {args.labels}, a default at most once and each RUN= once, and needs --metrics ppl")
    report = dict(args=dict(vars(args)), tokenizer=args.tokenizer, models=[])
    args.windows = args.optimal = args.filler = None
    if lm_metrics or "babilong" in args.metrics:
        name = _agree(args, cfgs, "data", required=lm_metrics) or "stdlib"
        corpus = data.load_data(name, args.tokenizer, args.split_seed, cache_dir=args.cache_dir)
        for path, c in zip(args.ckpts, cfgs):   # its split re-drawn from changed files: val may hold train
            now = model.data_id(corpus, c.get("split_seed", args.split_seed))
            require(c.get("data") != name or c.get("data_id") in (None, now), f"{path} was trained on "
                    f"{c.get('data_id')}, but {name} now reads {now} (its files changed: the validation "
                    "split may hold training documents): restore them, or pass other --data")
    if lm_metrics:  # windows from document starts where the process has an exact Bayes-optimal NLL
        eot, need = corpus.eot_token if corpus.optimal_nll else None, args.n_seqs * (args.eval_len + 1)
        require(eot is not None or args.allow_overlap or len(corpus.val) >= need, f"the validation split "
                f"holds {len(corpus.val)} tokens, {args.n_seqs} disjoint windows of {args.eval_len + 1} need "
                f"{need}: use fewer --n-seqs, a shorter --eval-len or more data (or --allow-overlap)")
        args.windows = data.eval_windows(corpus.val, args.n_seqs, args.eval_len + 1, args.seed, eot)  # int64
        args.edges = log_edges(args.eval_len, include=[t // d for t in t_trains for d in (1, 2)])  # p* window
        report["data"] = corpus.name
        if corpus.optimal_nll:
            try:
                args.optimal = bucketize(torch.as_tensor(corpus.optimal_nll(args.windows)), args.edges)
            except ValueError as e:
                raise ValueError(f"no exact loss floor at --eval-len {args.eval_len}: {e}") from None
            report["optimal"] = {k: v for k, v in args.optimal.items() if k != "per_seq"}
    if "babilong" in args.metrics:  # stories hidden in the validation split (training hid them in train)
        require(corpus.tokenizer is not None, f"babilong: {corpus.name} is a synthetic process, not text to "
                                              "hide stories in: pass --data stdlib (or a text path)")
        args.filler = corpus.val
        for t in args.babi_tasks:  # a story of each task fits the shortest length: said before any metric
            tasks.babi_mixture(args.tokenizer, min(args.babi_lengths), [args.seed], (t,), args.filler)
        report.update(babi_tasks=args.babi_tasks, babi_filler=f"{corpus.name} (val split)")
    vocab = max(int(args.windows.max()) + 1 if lm_metrics else 0, enc.n_vocab if task_metrics else 0)
    for path, label, t_train, c in zip(args.ckpts, args.labels, t_trains, cfgs):
        lm = model.from_pretrained(path, device=args.device)
        require(vocab <= lm.cfg.vocab_size <= 2 * enc.n_vocab, f"{path}: the data / tokenizer has {vocab} "
                f"token ids (--tokenizer {args.tokenizer}: {enc.n_vocab}), the model {lm.cfg.vocab_size}: "
                "use the ones it was trained with (an official model: --tokenizer PATH/tokenizer.json)")
        step = getattr(lm, "step", None)   # the checkpoint's, read with its weights (a run may go on)
        report["models"].append(measure(lm, t_train, args, label=label, path=path, step=step,
                                        train_seed=c.get("seed")))   # --over-seeds tells runs apart by it
    per_seq = {m["label"]: m.pop("per_seq", None) for m in report["models"]}  # bucketed NLL [n, K]
    for m in report["models"]:   # the same windows: paired per sequence and bucket
        ref = refs.get(m["label"], refs.get(None))
        if ref not in (None, m["label"]):
            m["diff"] = dict(_summary(per_seq[m["label"]] - per_seq[ref]), reference=ref)
    # tensors -> lists, nan / inf -> null: strict JSON
    return json.loads(json.dumps(report, default=lambda t: t.tolist()), parse_constant=lambda _: None)

def measure(lm, t_train, args, **out):
    """One model's report: `out` and a key per metric in args.metrics."""
    out.update(arch=lm.cfg.arch, params=sum(p.numel() for p in lm.parameters()), t_train=t_train)
    kw = dict(progress=True, **{k: getattr(args, k) for k in ("chunk_len", "batch_size") if getattr(args, k)})
    if "ppl" in args.metrics:
        nll = sequence_nll(lm, args.windows, **kw).double()
        buckets = bucketize(nll, args.edges)
        out["per_seq"] = per_seq = buckets.pop("per_seq")
        out["ppl"] = dict(nll=nll.mean(0), nll_sem=_sem(nll), buckets=buckets)
        short = short_context_nll(lm, args.windows, t_train, **{k: kw[k] for k in kw if k != "progress"})
        lo, hi = buckets["lo"], buckets["hi"]
        ref = torch.stack([short[:, a:b].nanmean(1) for a, b in zip(lo, hi)], 1)  # at a T_train context
        out["verdict"] = length_generalization(per_seq, lo, hi, t_train, ref, seed=args.seed)
        if args.optimal is not None:  # paired per sequence; a failing PPL can hide (the floor keeps falling)
            out["gap"] = _summary(per_seq - args.optimal["per_seq"])
    if "effrem" in args.metrics:
        T = args.effrem_len or args.eval_len  # where a failing model fails (the paper's T: 4 T_train)
        cuts = default_cuts(T, args.effrem_cuts)
        rows = effective_remembrance(lm, args.windows, T, cuts, args.distance, reduce=False, **kw)
        out["effrem"] = dict(T=T, distance=args.distance, cuts=cuts, mean=rows.mean(0), sem=_sem(rows))
    if "state" in args.metrics:
        positions = np.array(log_edges(args.eval_len, include=[t_train])[1:]) - 1
        out["state"] = state_statistics(lm, args.windows, positions, t_train=t_train, **kw)
    n, kw, enc = args.task_samples, dict(kw, seed=args.seed), args.tokenizer
    if "passkey" in args.metrics:
        out["passkey"] = tasks.passkey_grid(lm, enc, args.passkey_lengths, args.passkey_depths, n, **kw)
    if "copy" in args.metrics:
        out["copy"] = tasks.copy_accuracy(lm, enc, args.copy_lengths, n, **kw)
    if "babilong" in args.metrics:
        out["babilong"] = tasks.babilong_accuracy(lm, enc, args.babi_tasks, args.babi_lengths, n,
                                                  filler=args.filler, **kw)
    return out

def _agree(args, cfgs, key, required=True):
    """The flag's value, else the one train_config value of all checkpoints (they share data, tokenizer)."""
    values = {getattr(args, key)} - {None} or {c[key] for c in cfgs if c.get(key) is not None}
    require(len(values) == 1 or not (required or values), f"{'checkpoints disagree on' if values else 'no'}"
            f" train_config {key} {sorted(map(str, values))}: pass --{key.replace('_', '-')}")
    return next(iter(values), None)

def _require_eval_inputs(tokens, min_len=1, T=None, cuts=None, distance="tv"):
    """The metrics' input check: integer tokens [n, >= min_len]; for EffRem also T, the cuts and distance."""
    tokens, cuts = torch.as_tensor(tokens), None if cuts is None else torch.as_tensor(cuts).long().flatten()
    require(tokens.dim() == 2 and tokens.shape[1] >= min_len and not tokens.dtype.is_floating_point,
            f"tokens must be integer ids of shape [n, T >= {min_len}], got {list(tokens.shape)}")
    require(distance in DISTANCES, f"unknown distance {distance!r}: choose one of {sorted(DISTANCES)}")
    require(T is None or 1 <= T <= tokens.shape[1] and len(cuts) and 0 <= cuts.min() and cuts.max() < T,
            f"effective_remembrance: need T = {T} in [1, {tokens.shape[1]}], cuts in [0, T-1]")
    return tokens.long(), cuts

def _device(lm):  # a model without parameters: the CPU
    return next(lm.parameters(), torch.empty(0)).device

if __name__ == "__main__":
    sys.exit(main())
