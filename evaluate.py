"""Evaluate recurrent LMs far past their training length: the paper's measurements and its tasks.

    python evaluate.py out/base out/sp --labels base sp
    python evaluate.py PATH/mamba2-130m --data long.txt --tokenizer PATH/tokenizer.json --t-train 2048

Sections 1-4, the metrics: sequence_nll and effective_remembrance stream the naive definitions beside them
(chunks carrying the state: memory depends on chunk_len, not on the length); length_generalization is
another rule than Definition 3.2 read literally (length_generalization_pstar; its docstring says why);
short_context_nll is itself a definition and state_statistics a pooled moment: neither has another form.
Any LM with model.LM's interface works: logits, final_state = lm(idx, state=None, last_only=False);
lm.zero_state(b, device). Entry i of a per-position curve is the prediction after i + 1 tokens. Section 5:
the command line (flags and checks: plumbing/eval_flags.py; tables and figures: plumbing/report.py)."""
import math
import sys

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

import model
import tasks
from plumbing import checkpoints, eval_flags, report
from plumbing.files import is_int, require
from plumbing.report import nll_summary, sem

MIN_SEQS = 16  # below this many sequences the verdict's bootstrap means nothing: warn

# ==== 1. Position-wise perplexity: PPL(t) = exp( E_x[ -log q(x_{t+1} | x_{0..t}) ] ) ====
def position_nll_naive(lm, tokens):
    """The definition, one full forward: NLL [n, T-1], entry (s, i) = -log q(x[s, i+1] | x[s, :i+1])."""
    with torch.inference_mode():
        logits, _ = lm(tokens)
    return F.cross_entropy(logits[:, :-1].float().transpose(1, 2), tokens[:, 1:], reduction="none")

@torch.inference_mode()
def sequence_nll(lm, tokens, chunk_len=512, batch_size=8, progress=False):
    """position_nll_naive streamed: each block of rows read by model.stream, chunk_len tokens a call from
    the zero state, the state carried; logits [b, <= chunk_len, V]."""
    tokens, _ = _require_eval_inputs(tokens, min_len=2, chunk_len=chunk_len, batch_size=batch_size)
    out = torch.empty(tokens.shape[0], tokens.shape[1] - 1)
    for r in tqdm(range(0, len(tokens), batch_size), desc="ppl", disable=not progress):
        x = tokens[r:r + batch_size].to(model.device_of(lm))
        for a, b, logits, _ in model.stream(lm, x[:, :-1], chunk_len):   # the last token is no input
            nll = F.cross_entropy(logits.float().mT, x[:, a + 1:b + 1], reduction="none")
            out[r:r + len(x), a:b] = nll.cpu()
    return out

def position_nll(lm, tokens, chunk_len=512, batch_size=8):
    """Mean NLL per position [T-1], averaged over sequences FIRST: PPL(t) = exp(this), not mean(exp(nll))."""
    return sequence_nll(lm, tokens, chunk_len, batch_size).double().mean(0)

def log_edges(length, per_octave=2, include=()):
    """Bucket edges 0, 1, 2, 3, 4, 6, 8, 11, 16, ..., length, and `include` (no bucket straddles t_train)."""
    require(is_int(length) and is_int(per_octave), f"log_edges: need length >= 1 and per_octave >= 1, got "
            f"{length!r}, {per_octave!r}")
    grid = [round(2 ** (k / per_octave)) for k in range(per_octave * int(length).bit_length() + 1)]
    return sorted({0, length} | {int(e) for e in [*grid, *include] if 0 < e < length})

def bucketize(nll, edges):
    """Each sequence's NLL [n, L] averaged per bucket first (per_seq [n, K]), then mean and standard error
    over sequences: a sequence's positions correlate, the sequences do not."""
    nll = torch.as_tensor(nll, dtype=torch.float64)
    require(nll.dim() == 2 and edges[0] == 0 and edges[-1] == nll.shape[1] and np.all(np.diff(edges) > 0),
            f"bucket edges must rise from 0 to L = {nll.shape[-1]} for nll [n, L]: use log_edges(L)")
    per_seq = torch.stack([nll[:, lo:hi].mean(1) for lo, hi in zip(edges[:-1], edges[1:])], 1)
    return dict(lo=list(edges[:-1]), hi=list(edges[1:]), per_seq=per_seq, **nll_summary(per_seq))

# ==== 2. Length generalization (Definition 3.2) ====
def length_generalization_pstar(ppl, t_train):
    """Definition 3.2 read literally on a per-position curve ppl [L]: p* = min over t < t_train, at t*;
    the model generalizes to T if ppl(t) <= p* for all t in [t*, T). Returns that largest T. On a
    measured curve it mostly measures noise (p* is biased low; one noisy position ends the run)."""
    ppl = torch.as_tensor(ppl)
    t_star = int(ppl[:t_train].argmin())
    above = (ppl[t_star:] > ppl[t_star]).nonzero()
    return t_star + int(above[0]) if len(above) else len(ppl)

def short_context_nll(lm, tokens, t_train, chunk_len=512, batch_size=8):
    """Each target of tokens [n, L+1] read after (t_train / 2, t_train] tokens from the zero state -> NLL
    [n, L] (NaN at t < t_train / 2): the same tokens at a training-length context, the verdict's yardstick."""
    tokens, _ = _require_eval_inputs(tokens, min_len=2, chunk_len=chunk_len, batch_size=batch_size)
    require(is_int(t_train, 2), f"short_context_nll: t_train must be an integer >= 2, got {t_train!r}")
    n = tokens.shape[0]
    L = tokens.shape[1] - 1
    out = torch.full((n, L), math.nan)
    for offset in (0, t_train // 2, L - t_train):  # every target past t_train / 2: in a piece's second half
        k = (L - offset) // t_train  # whole pieces
        pieces = tokens[:, offset:offset + k * t_train + 1].unfold(1, t_train + 1, t_train)  # [n, k, T+1]
        nll = sequence_nll(lm, pieces.flatten(0, 1), chunk_len, batch_size * max(1, L // t_train))
        second_half = torch.arange(k * t_train) % t_train >= t_train // 2
        out[:, offset:offset + k * t_train][:, second_half] = nll.view(n, -1)[:, second_half]
    return out

def length_generalization(per_seq, lo, hi, t_train, short, alpha=0.05, n_boot=2000, seed=0):
    """The verdict on bucketed per-sequence NLLs per_seq [n, K] (bucketize's). No p*: a minimum over noisy
    positions is biased low, and other positions hold other text. Each bucket past t_train is compared with
    `short` [n, K], the same buckets' tokens read at a training-length context (short_context_nll,
    bucketed): it fails when the mean over sequences of per_seq - short is > 0 at the alpha / m quantile of
    n_boot seeded bootstrap means, m = buckets past t_train (Bonferroni). generalizes_to: hi of the bucket
    before the first that fails (the first: t_train; none: censored). ppl_short: the perplexity at
    training-length contexts, exp of short's mean from t_train / 2 on (printed, drawn dashed)."""
    per_seq = torch.as_tensor(per_seq, dtype=torch.float64)
    short = torch.as_tensor(short, dtype=torch.float64)
    lo = list(lo)
    hi = list(hi)
    n = len(per_seq)
    require(any(a >= t_train // 2 and b <= t_train for a, b in zip(lo, hi)), f"no bucket lies within the "
            f"training positions [{t_train // 2}, {t_train}): use edges that include both "
            f"(log_edges(L, include=[{t_train // 2}, {t_train}]))")
    pooled = [j for j in range(len(lo)) if lo[j] >= t_train // 2]  # where short has a value
    later = [j for j in pooled if lo[j] >= t_train]
    width = torch.tensor(hi, dtype=torch.float64) - torch.tensor(lo)  # a bucket's mean weighs its positions
    ppl_short = float((short[:, pooled] @ width[pooled] / width[pooled].sum()).mean().exp())
    out = dict(t_train=t_train, n_seqs=n, ppl_short=ppl_short)
    if not torch.isfinite(per_seq[:, pooled]).all() or not torch.isfinite(short[:, pooled]).all():
        return dict(out, generalizes_to=None, ratio=None, censored=None, warning="NLL not finite: no verdict")
    d = per_seq[:, later] - short[:, later]  # [n, m]
    idx = torch.randint(n, (n_boot, n), generator=torch.Generator().manual_seed(seed))
    counts = torch.zeros(n_boot, n).scatter_add_(1, idx, torch.ones(n_boot, n)).double()
    lower = torch.quantile(counts @ d / n, alpha / len(later), dim=0) if later else torch.zeros(0)
    first = ((lower > 0).tolist() + [True]).index(True)  # into `later`: the first bucket that fails
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
    x = tokens[:, :T].to(model.device_of(lm))
    d = DISTANCES[distance]
    p = lm(x)[0][:, -1].double().softmax(-1)  # float64 next-token distributions
    return torch.stack([d(p, lm(x[:, t:])[0][:, -1].double().softmax(-1)).clamp(0, 1).mean()
                        for t in cuts.tolist()]).cpu()

@torch.inference_mode()
def effective_remembrance(lm, tokens, T, cuts, distance="tv", batch_size=8, chunk_len=512, progress=False):
    """effective_remembrance_naive per row, [n, len(cuts)]: batch_size rows at a time, x[:, :T] and each
    suffix x[:, t:T] streamed from the zero state (memory: chunk_len, not T). EffRem_T(0) = 0 exactly."""
    tokens, cuts = _require_eval_inputs(tokens, T=T, cuts=cuts, distance=distance, chunk_len=chunk_len,
                                        batch_size=batch_size)
    out = torch.empty(len(tokens), len(cuts), dtype=torch.float64)
    for r in tqdm(range(0, len(tokens), batch_size), desc="effrem", disable=not progress):
        x = tokens[r:r + batch_size, :T].to(model.device_of(lm))
        p = _next_token(lm, x, chunk_len)
        for j, t in enumerate(cuts.tolist()):
            q = p if t == 0 else _next_token(lm, x[:, t:], chunk_len)
            out[r:r + len(x), j] = DISTANCES[distance](p, q).clamp(0, 1).cpu()
    return out

def _next_token(lm, x, chunk_len):
    """The float64 next-token distribution [b, V] after all of x [b, T], read from the zero state."""
    for _, _, logits, _ in model.stream(lm, x, chunk_len, last_only=True):   # the last piece's: at T
        pass
    return logits[:, -1].double().softmax(-1)

def default_cuts(T, n_cuts=32):
    """0, log-spaced from the start (a failing model jumps at once) and toward T (a healthy one rises)."""
    require(is_int(T) and is_int(n_cuts), f"default_cuts: need T >= 1 and n_cuts >= 1, got {T!r}, {n_cuts!r}")
    n_cuts = min(n_cuts, T)   # there are T cuts in [0, T - 1]: more asked are repeats (and could fill memory)
    half = max(1, (n_cuts - 1) // 2)
    top = math.log10(max(1, T // 2))
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
    tokens, _ = _require_eval_inputs(tokens, chunk_len=chunk_len, batch_size=batch_size)
    default = np.array(log_edges(tokens.shape[1])[1:]) - 1  # log-spaced context lengths 1, 2, 3, 4, 6, ..., T
    positions = torch.as_tensor(default if positions is None else positions).long().flatten().unique()
    require(len(positions) and 0 <= positions.min() and positions.max() < tokens.shape[1],
            f"state_statistics: positions must be one or more in [0, T - 1 = {tokens.shape[1] - 1}]")
    ends = (positions + 1).tolist()
    acc = {}  # context length -> [count, sum, sum of squares] per layer and head
    for r in tqdm(range(0, len(tokens), batch_size), desc="state", disable=not progress):
        x = tokens[r:r + batch_size, :ends[-1]].to(model.device_of(lm))
        for _, b, _, state in model.stream(lm, x, chunk_len, stops=ends, last_only=True):
            if b in ends:
                h = torch.stack([s["h"] for s in state]).transpose(1, 2)  # [layers, heads, batch, ...]
                h = h.flatten(2).double().cpu()  # each head's values pooled
                moments = torch.stack([torch.full_like(h[..., 0], h.shape[2]), h.sum(2), h.pow(2).sum(2)])
                acc[b] = acc.get(b, 0) + moments
    cnt, s, sq = torch.stack([acc[b] for b in ends], 1).transpose(1, 2)  # [layers, P, heads]
    std = ((sq - s * s / cnt) / (cnt - 1).clamp_min(1)).clamp_min(0).sqrt()
    out = dict(positions=positions, std=list(std), rms=list((sq / cnt).sqrt()))
    if t_train is not None:
        early = positions + 1 <= t_train
        late = positions + 1 >= 4 * t_train
        both = early.any() and late.any()
        out["coverage"] = list(std[:, late].mean(1) / std[:, early].amax(1) if both else std[:, 0] * math.nan)
    return out

def _require_eval_inputs(tokens, **kw):   # the metrics' input check (plumbing/eval_flags.py), told DISTANCES
    return eval_flags.require_eval_inputs(tokens, DISTANCES, **kw)

# ==== 5. Command line: the flags checked, every checkpoint measured on the same data, the report ====
def main(argv=None):   # -> the exit code; a failure is said in one line (eval_flags.exit_code)
    args = parse_args(argv)
    measured = lambda: report.show(run(args), args.out)
    over_seeds = lambda: report.over_seeds(report.read_reports(args.ckpts, args.labels), args.out)
    return eval_flags.exit_code(args, over_seeds if args.over_seeds else measured)

def parse_args(argv):   # the flags (plumbing/eval_flags.py), told the names of sections 2 and 3
    return eval_flags.parse_args(argv, __doc__.split("\n")[0], DISTANCES, MIN_SEQS)

def read_eval_data(args, cfgs, t_trains):
    """The data every checkpoint reads (eval_flags.read_data), args.edges, args.optimal -> its report."""
    out, floor = eval_flags.read_data(args, cfgs)
    if args.windows is not None:
        args.edges = log_edges(args.eval_len, include=[t // d for t in t_trains for d in (1, 2)])  # verdict's
    args.optimal = None if floor is None else bucketize(floor, args.edges)   # the exact Bayes floor, bucketed
    if floor is not None:
        out["optimal"] = {k: v for k, v in args.optimal.items() if k != "per_seq"}
    return out

def run(args):
    """Checks the flags, measures each checkpoint on the same data -> the report (eval.json: per model its
    label, path, checkpoint step, training seed and metrics; with --reference, paired differences)."""
    cfgs, t_trains, enc, refs = eval_flags.check_args(args)
    result = dict(args=dict(vars(args)), tokenizer=args.tokenizer, models=[])
    result.update(read_eval_data(args, cfgs, t_trains))
    for path, label, t_train, c in zip(args.ckpts, args.labels, t_trains, cfgs):
        lm = checkpoints.from_pretrained(path, device=args.device)
        eval_flags.check_vocabulary(lm, args, enc, path)
        step = getattr(lm, "step", None)   # the checkpoint's, read with its weights (a run may go on)
        result["models"].append(measure(lm, t_train, args, label=label, path=path, step=step,
                                        train_seed=c.get("seed")))   # --over-seeds tells runs apart by it
    report.paired_differences(result["models"], refs)   # the same windows: paired per sequence and bucket
    return report.strict_json(result)

def measure(lm, t_train, args, **out):
    """One model's report: `out` and a key per metric in args.metrics."""
    out.update(arch=lm.cfg.arch, params=sum(p.numel() for p in lm.parameters()), t_train=t_train)
    kw = dict(progress=True, **{k: getattr(args, k) for k in ("chunk_len", "batch_size") if getattr(args, k)})
    if "ppl" in args.metrics:
        nll = sequence_nll(lm, args.windows, **kw).double()
        buckets = bucketize(nll, args.edges)
        out["per_seq"] = per_seq = buckets.pop("per_seq")
        out["ppl"] = dict(nll=nll.mean(0), nll_sem=sem(nll), buckets=buckets)
        short = short_context_nll(lm, args.windows, t_train, **{k: kw[k] for k in kw if k != "progress"})
        short = torch.stack([short[:, a:b].nanmean(1) for a, b in zip(buckets["lo"], buckets["hi"])], 1)
        out["verdict"] = length_generalization(per_seq, buckets["lo"], buckets["hi"], t_train, short,
                                               seed=args.seed)   # short: bucketed as per_seq
        if args.optimal is not None:  # paired per sequence; a failing PPL can hide (the floor keeps falling)
            out["gap"] = nll_summary(per_seq - args.optimal["per_seq"])
    if "effrem" in args.metrics:
        T = args.effrem_len or args.eval_len  # where a failing model fails (the paper's T: 4 T_train)
        cuts = default_cuts(T, args.effrem_cuts)
        rows = effective_remembrance(lm, args.windows, T, cuts, args.distance, **kw)
        out["effrem"] = dict(T=T, distance=args.distance, cuts=cuts, mean=rows.mean(0), sem=sem(rows))
    if "state" in args.metrics:
        positions = np.array(log_edges(args.eval_len, include=[t_train])[1:]) - 1
        out["state"] = state_statistics(lm, args.windows, positions, t_train=t_train, **kw)
    n = args.task_samples
    kw = dict(kw, seed=args.seed)
    tokenizer = args.tokenizer   # a name or path, as tasks.py takes it
    if "passkey" in args.metrics:
        out["passkey"] = tasks.passkey_grid(lm, tokenizer, args.passkey_lengths, args.passkey_depths, n, **kw)
    if "copy" in args.metrics:
        out["copy"] = copy = tasks.copy_accuracy(lm, tokenizer, args.copy_lengths, n, **kw)
        copy["char_sem"] = sem(torch.tensor(copy["char"]).T)  # over the strings
    if "babilong" in args.metrics:
        out["babilong"] = tasks.babilong_accuracy(lm, tokenizer, args.babi_tasks, args.babi_lengths, n,
                                                  filler=args.filler, **kw)
    return out

if __name__ == "__main__":
    sys.exit(main())
