"""evaluate.py's inputs: its flags, parsed (a flag that does not apply to --metrics is refused, not ignored)
and checked against each other and the checkpoints (check_args), the data they name (read_data), checked
against what each checkpoint was trained on, a failure told in one line (exit_code), and the input check of
the metrics' functions (require_eval_inputs). A reader of the paper can skip this file: the measurements
are evaluate.py's sections 1-4."""
import argparse
import os
import signal
import sys

import torch

import data
import tasks
from plumbing import checkpoints, runs, tokenizers
from plumbing.files import int_list, is_int, require

LM_METRICS = ("ppl", "effrem", "state")   # measured on windows of --data
TASK_METRICS = ("passkey", "copy", "babilong")   # measured on samples of tasks.py

# flag -> the metrics it applies to: given without any of them it is refused, not ignored
APPLIES = dict(eval_len=LM_METRICS, n_seqs=LM_METRICS, effrem_len=("effrem",), effrem_cuts=("effrem",),
               distance=("effrem",), reference=("ppl",), data=LM_METRICS + ("babilong",),
               cache_dir=LM_METRICS + ("babilong",), task_samples=TASK_METRICS,
               passkey_lengths=("passkey",), passkey_depths=("passkey",), copy_lengths=("copy",),
               babi_lengths=("babilong",), babi_tasks=("babilong",), chunk_len=LM_METRICS + TASK_METRICS)

# ==== The command line ====
def parse_args(argv, description, distances, min_seqs):
    """evaluate.py's flags; distances and min_seqs: its DISTANCES' names and MIN_SEQS (passed: evaluate.py
    imports this file)."""
    ap = _parser(description, distances, min_seqs)
    args = ap.parse_args(argv)
    _refuse_flags_that_do_not_apply(ap, argv, args)
    return args

def _parser(description, distances, min_seqs):
    """The flags, their defaults and help; a bad value is one line."""
    ap = argparse.ArgumentParser(description=description)
    ap.error = lambda message: ap.exit(2, f"error: {message}\n")  # one line, as every other bad input
    a = ap.add_argument
    positive = lambda text: _ints(text, one=True)
    a("ckpts", nargs="+", metavar="CKPT", help="our ckpt.pt (or its dir), an official Mamba dir, its hub id")
    a("--metrics", default="ppl,effrem,state", help=f"subset of {','.join(LM_METRICS + TASK_METRICS)}")
    a("--eval-len", type=positive, help="tokens per evaluation window (default: 16 x the largest t_train)")
    a("--n-seqs", type=positive, default=64, help=f"evaluation windows (the verdict needs >= {min_seqs})")
    a("--t-train", type=positive, help="training length (default: train_config seq_len; official: 2048)")
    a("--data", help="what data.load_data reads (default: train_config data)")
    a("--tokenizer", help="bytes, gpt2 (tiktoken's), PATH/x.tiktoken or PATH/tokenizer.json (default: the "
      "checkpoints')")
    a("--cache-dir", help="where text --data is tokenized once (default $LENGTHGEN_CACHE_DIR, data_cache/)")
    a("--effrem-len", type=positive, help="T of EffRem_T(t) (default: --eval-len; the paper's: 4 x t_train)")
    a("--effrem-cuts", type=positive, default=32, help="number of cut points t of EffRem_T")
    a("--distance", default="tv", choices=sorted(distances), help="EffRem's distance (tv: the paper's)")
    a("--chunk-len", type=positive, help="tokens per model call while streaming: bounds memory, not results")
    a("--batch-size", type=positive, help="sequences per model call")
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
    return ap

def _refuse_flags_that_do_not_apply(ap, argv, args):
    """A flag given with --over-seeds (it measures nothing), or without a metric it applies to (APPLIES)."""
    for action in ap._actions:   # parsed again without defaults: only the flags given
        action.default = argparse.SUPPRESS
    given = set(vars(ap.parse_args(argv))) - {"ckpts"}
    flag = lambda k: "--" + k.replace("_", "-")
    measuring = sorted(given - {"over_seeds", "labels", "out"})
    if args.over_seeds and measuring:
        ap.error(f"--over-seeds summarises evaluations already made, it measures nothing: drop "
                 f"{' '.join(map(flag, measuring))}")
    metrics = set(args.metrics.split(","))
    for k in sorted(given & set(APPLIES)):
        if not metrics & set(APPLIES[k]):
            ap.error(f"{flag(k)} does not apply to --metrics {args.metrics}: add one of "
                     f"{','.join(APPLIES[k])} to --metrics, or drop {flag(k)}")

def _ints(text, one=False, lo=1):  # an argparse type: "128,256" -> [128, 256]; one=True: "128" -> 128
    kind = "a positive integer" if one else "comma-separated distinct positive integers"
    values = int_list(text, minimum=lo)
    if values is None or one and "," in text:
        raise argparse.ArgumentTypeError(f"must be {kind if lo else 'in [0, 2**63)'}, got {text!r}")
    return values[0] if one else values

def require_values_and_out(args):
    """No flag given '', and --out (or the folder it goes in) writable: said now, not after the metrics."""
    _require_values(args)
    _require_writable(args.out)

def _require_values(args):
    empty = ["CKPT" if k == "ckpts" else "--" + k.replace("_", "-") for k, v in vars(args).items()
             if "" in (v if isinstance(v, list) else [v])]
    require(not empty, f"{' '.join(empty)} '': pass a value, or leave the flag out")

def _require_writable(out):
    parent = os.path.abspath(out)
    while not os.path.lexists(parent):
        parent = os.path.dirname(parent)
    require(os.path.isdir(parent) and os.access(parent, os.W_OK | os.X_OK),
            f"--out {out!r} is not a directory that can be written: pass another")

def exit_code(args, work):
    """work() once the flags' values and --out are checked -> 0; a failure said in one line: 2 (bad input, or
    work sized by the flags), 1 (interrupted: Ctrl-C, or SIGTERM taken as one)."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM as Ctrl-C: one line, below
    try:
        require_values_and_out(args)
        work()
    except (ValueError, OSError, RuntimeError, MemoryError) as e:  # bad input, or work sized by the flags
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"interrupted: {args.out}/{'seeds' if args.over_seeds else 'eval'}.json and its figures not "
              "written (any previous ones are intact)", file=sys.stderr)
        return 1
    return 0

def one_line(error):
    """What evaluate.py says of an error: its text; out of memory, the flags that size the work."""
    if not runs.out_of_memory(error):
        return str(error)
    why = (str(error) or type(error).__name__).splitlines()[0]
    return (f"out of memory ({why}): lower --n-seqs, --eval-len, --batch-size, --task-samples, "
            "--passkey-depths or the task lengths")

def asks(args, metrics):  # does --metrics ask for any of these?
    return bool(set(args.metrics) & set(metrics))

# ==== The flags against each other and the checkpoints ====
def check_args(args):
    """The flags checked against each other and the checkpoints, defaults filled in from their train_config
    -> (train configs, t_train per checkpoint, the tokenizer, {run label or None: reference label})."""
    _require_labels(args.labels, args.ckpts)
    _require_checkpoints(args.ckpts)
    cfgs = [checkpoints.train_config(p) for p in args.ckpts]  # a corrupt checkpoint is reported as corrupt
    args.metrics = _metrics(args.metrics)
    args.device = _device(args.device)
    t_trains = [args.t_train or c.get("seq_len") for c in cfgs]
    if asks(args, LM_METRICS):
        _require_t_trains(args.ckpts, t_trains)
        args.eval_len = args.eval_len or 16 * max(t_trains)
        _require_lengths(args, t_trains)
    ids = _tokenizer_ids(cfgs)
    args.tokenizer = _agree(args, cfgs, "tokenizer", required=False) or "bytes"
    enc = _tokenizer(args.tokenizer, ids)
    _require_tasks(args)
    args.split_seed = _split_seed(cfgs)
    args.babi_tasks = _babi_tasks(args, cfgs)
    args.labels = args.labels or default_labels(args.ckpts)
    return cfgs, t_trains, enc, _references(args)

def _require_labels(labels, ckpts):
    require(not labels or len(ckpts) == len(labels) == len(set(labels)), f"--labels "
            f"{' '.join(labels or [])}: give each of the {len(ckpts)} checkpoints its own name")

def _require_checkpoints(ckpts):
    """Each checkpoint there, and each once (a run's folder is its ckpt.pt)."""
    for p in ckpts:
        require(os.path.exists(checkpoints.resolve(p)), f"no checkpoint at {p}: check the path (OUT/ckpt.pt)")
    files = [os.path.realpath(checkpoints.weights_file(p)[0]) for p in ckpts]
    require(len(set(files)) == len(files), f"{' '.join(ckpts)}: one checkpoint twice: pass each once")

def _metrics(text):
    """--metrics as a list, each known and once."""
    metrics = text.split(",")
    known = LM_METRICS + TASK_METRICS
    require(len(set(metrics) & set(known)) == len(metrics), f"unknown or repeated metric in "
            f"--metrics {','.join(metrics)}: use a subset of {','.join(known)}")
    return metrics

def _device(name):
    """--device as the name of a device there is ("auto": CUDA when present, runs.device)."""
    require(name != "cuda" or torch.cuda.is_available(), "no CUDA device: use --device cpu")
    return str(runs.device(name))

def _require_t_trains(ckpts, t_trains):
    require(all(t_trains), f"{', '.join(p for p, t in zip(ckpts, t_trains) if not t)}: no "
            "train_config seq_len (an official checkpoint?): pass --t-train N (official Mamba-2: 2048)")

def _require_lengths(args, t_trains):
    """--eval-len holds a piece of short_context_nll; --effrem-len lies within it."""
    need = max(t + max(1, t // 2) for t in t_trains)   # a piece of short_context_nll from t_train / 2 on
    require(args.eval_len >= need, f"--eval-len {args.eval_len} must be at least {need} (1.5 x t_train "
                                   f"{max(t_trains)}): try --eval-len {16 * max(t_trains)}")
    require(not args.effrem_len or 1 < args.effrem_len <= args.eval_len, f"--effrem-len "
            f"{args.effrem_len} must lie in [2, --eval-len {args.eval_len}]: lower it or raise that")

def _tokenizer_ids(cfgs):
    """The one tokenizer the runs were trained with (train.py records its id), as a set: empty if none."""
    ids = {c["tokenizer_id"] for c in cfgs if c.get("tokenizer_id")}
    require(len(ids) <= 1, f"checkpoints of different tokenizers {sorted(ids)}: evaluate them separately")
    return ids

def _tokenizer(name, ids):
    """The tokenizer --tokenizer names, the one of the checkpoints' ids."""
    enc = tokenizers.get_tokenizer(name)
    require(ids <= {enc.name}, f"--tokenizer {name} ({enc.name}) does not match the checkpoints' "
                               f"{''.join(ids)}: pass the --tokenizer they were trained with")
    return enc

def _require_tasks(args):
    """The tokenizer spells the tasks; a passkey sample fits the shortest length, each depth a position of
    it."""
    if asks(args, TASK_METRICS):
        tasks.task_tokenizer(args.tokenizer)
    if "passkey" in args.metrics:
        tasks.passkey_sample(args.tokenizer, min(args.passkey_lengths))
        require(args.passkey_depths <= min(args.passkey_lengths), f"--passkey-depths {args.passkey_depths} > "
                f"{min(args.passkey_lengths)}, the shortest of --passkey-lengths")

def _split_seed(cfgs):
    """The one --split-seed the checkpoints' Markov corpora were drawn with (none: 0)."""
    seeds = {c.get("split_seed", c.get("seed")) for c in cfgs if str(c.get("data"))[:6] == "markov"} - {None}
    require(len(seeds) <= 1, f"the checkpoints were trained with --split-seed {sorted(seeds)}, drawing their "
                             "Markov corpora differently: evaluate them separately")
    return seeds.pop() if seeds else 0

def _babi_tasks(args, cfgs):
    """--babi-tasks (default: the checkpoints', else all) as a list, each known and once."""
    names = (_agree(args, cfgs, "babi_tasks", False) or ",".join(tasks.BABI_TASKS)).split(",")
    require(len(set(names) & set(tasks.BABI_TASKS)) == len(names), f"unknown or repeated "
            f"--babi-tasks {','.join(names)}: use a subset of {','.join(tasks.BABI_TASKS)}")
    return names

def _references(args):
    """--reference as {run label or None (every run's default): reference label}, naming labels."""
    refs = dict(r.split("=", 1) if "=" in r else (None, r) for r in args.reference or [])   # run -> reference
    require(not refs or set(refs.values()) | set(refs) - {None} <= set(args.labels) and "ppl" in args.metrics
            and len(refs) == len(args.reference), f"--reference {' '.join(args.reference or [])} must name "
            f"labels of {args.labels}, a default at most once and each RUN= once, and needs --metrics ppl")
    return refs

def default_labels(paths):
    """Each run's folder name (a .pt file's: its folder's); names that runs share grow by their parent
    folders until they differ (runs/A/x, runs/B/x -> A/x, B/x; snap/step8.pt, snap/step10.pt)."""
    full = [os.path.abspath(p).split(os.sep) for p in paths]
    full = [f[:-1] if f[-1] == "ckpt.pt" else f for f in full]   # a run's folder and its ckpt.pt: one name
    labels = [os.path.basename(os.path.dirname(p) if p.endswith(".pt") else p.rstrip("/")) for p in paths]
    for k in range(2, max(map(len, full)) + 1):
        shared = {label for label in labels if labels.count(label) > 1}
        labels = ["/".join(f[-k:]) if label in shared else label for f, label in zip(full, labels)]
    return labels

def _agree(args, cfgs, key, required=True):
    """The flag's value, else the one train_config value of all checkpoints (they share data, tokenizer)."""
    values = {getattr(args, key)} - {None} or {c[key] for c in cfgs if c.get(key) is not None}
    require(len(values) == 1 or not (required or values), f"{'checkpoints disagree on' if values else 'no'}"
            f" train_config {key} {sorted(map(str, values))}: pass --{key.replace('_', '-')}")
    return next(iter(values), None)

def check_vocabulary(lm, args, enc, path):
    """path's model lm reads every id of the windows and the tasks, and is of their tokenizer enc (windows of
    a Markov process: states, no tokenizer)."""
    n_ids = max(int(args.windows.max()) + 1 if asks(args, LM_METRICS) else 0,
                enc.n_vocab if asks(args, TASK_METRICS) else 0)
    markov = args.optimal is not None and not asks(args, TASK_METRICS)
    checkpoints.check_vocabulary(lm, n_ids, None if markov else enc.n_vocab, path)

# ==== The data the flags name ====
def read_data(args, cfgs):
    """The data every checkpoint is measured on: args.windows [n, eval_len + 1] (LM metrics) and args.filler
    (babilong), else None -> (what the report says of it, the windows' exact Bayes-optimal NLL or None)."""
    args.windows = args.filler = None
    out = {}
    floor = None
    if asks(args, LM_METRICS) or "babilong" in args.metrics:
        corpus = read_corpus(args, cfgs)
    if asks(args, LM_METRICS):
        args.windows = read_windows(args, corpus)
        out["data"] = corpus.name
        if corpus.optimal_nll:
            floor = exact_floor(corpus, args.windows, args.eval_len)
    if "babilong" in args.metrics:  # stories hidden in the validation split (training hid them in train)
        args.filler = babi_filler(args, corpus)
        out.update(babi_tasks=args.babi_tasks, babi_filler=f"{corpus.name} (val split)")
    return out, floor

def read_corpus(args, cfgs):
    """The corpus --data names (default: the checkpoints'), of each checkpoint's kind and files."""
    name = _agree(args, cfgs, "data", required=asks(args, LM_METRICS)) or "stdlib"
    corpus = data.load_data(name, args.tokenizer, args.split_seed, cache_dir=args.cache_dir)
    _require_same_kind(corpus, name, args.ckpts, cfgs)
    _require_same_files(corpus, name, args, cfgs)
    return corpus

def _require_same_kind(corpus, name, ckpts, cfgs):
    """Markov states and a tokenizer's ids are different alphabets: a checkpoint reads data of its kind."""
    for path, c in zip(ckpts, cfgs):
        trained_on = c.get("data") or "text (an official checkpoint)"
        require((corpus.tokenizer is None) == trained_on.startswith("markov:"), f"{path} was trained on "
                f"{trained_on}, {name} is {'not ' * (corpus.tokenizer is not None)}a Markov process: its "
                "ids would mean other things: evaluate it on data of its own kind (--data)")

def _require_same_files(corpus, name, args, cfgs):
    """A corpus a checkpoint was trained on reads what it read then: a split re-drawn from changed files
    may put training documents in the validation split."""
    for path, c in zip(args.ckpts, cfgs):
        now = checkpoints.data_id(corpus, c.get("split_seed", args.split_seed))
        require(c.get("data") != name or c.get("data_id") in (None, now), f"{path} was trained on "
                f"{c.get('data_id')}, but {name} now reads {now} (its files changed: the validation "
                "split may hold training documents): restore them, or pass other --data")

def read_windows(args, corpus):
    """--n-seqs windows of --eval-len + 1 tokens [n, eval_len + 1] (int64) of corpus's validation split, from
    document starts where the process has an exact Bayes-optimal NLL."""
    eot = corpus.eot_token if corpus.optimal_nll else None
    need = args.n_seqs * (args.eval_len + 1)
    require(eot is not None or len(corpus.val) >= need, f"the validation split holds {len(corpus.val)} "
            f"tokens, {args.n_seqs} disjoint windows of {args.eval_len + 1} need {need}: use fewer "
            "--n-seqs, a shorter --eval-len or more data")
    return data.eval_windows(corpus.val, args.n_seqs, args.eval_len + 1, args.seed, eot)

def exact_floor(corpus, windows, eval_len):
    """The process's exact Bayes-optimal NLL of windows; a length it has none at is said in one line."""
    try:
        return corpus.optimal_nll(windows)
    except ValueError as e:
        raise ValueError(f"no exact loss floor at --eval-len {eval_len}: {e}") from None

def babi_filler(args, corpus):
    """The text bAbI's stories hide in: corpus's validation split (training hid them in train), a story of
    each task fitting the shortest --babi-lengths (said before any metric)."""
    require(corpus.tokenizer is not None, f"babilong: {corpus.name} is a synthetic process, not text to "
                                          "hide stories in: pass --data stdlib (or a text path)")
    for t in args.babi_tasks:
        tasks.babi_mixture(args.tokenizer, min(args.babi_lengths), [args.seed], (t,), corpus.val)
    return corpus.val

# ==== The metrics' arguments (evaluate.py's sections 1-4, called from Python) ====
def require_eval_inputs(tokens, distances, min_len=1, T=None, cuts=None, distance="tv", chunk_len=1,
                        batch_size=1):
    """The metrics' input check: integer tokens [n, >= min_len], chunk_len and batch_size >= 1; for EffRem
    also T, the cuts and distance, one of distances (evaluate.DISTANCES, passed: evaluate.py imports this)."""
    for name, value in (("chunk_len", chunk_len), ("batch_size", batch_size)):
        require(is_int(value), f"{name} must be an integer >= 1, got {value!r}")
    tokens = torch.as_tensor(tokens)
    cuts = None if cuts is None else torch.as_tensor(cuts).long().flatten()
    ok = tokens.dim() == 2 and len(tokens) and tokens.shape[1] >= min_len and not tokens.is_floating_point()
    require(ok, f"tokens must be integer ids of shape [n >= 1, T >= {min_len}], got {list(tokens.shape)}")
    require(distance in distances, f"unknown distance {distance!r}: choose one of {sorted(distances)}")
    require(T is None or 1 <= T <= tokens.shape[1] and len(cuts) and 0 <= cuts.min() and cuts.max() < T,
            f"effective_remembrance: need T = {T} in [1, {tokens.shape[1]}], cuts in [0, T-1]")
    return tokens.long(), cuts
