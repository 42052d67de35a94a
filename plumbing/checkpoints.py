"""Checkpoints: ours (train.py's ckpt.pt, all a resume needs) and the official Mamba LMs (mamba_ssm's layout,
a folder or a hub id), read with every problem one line; a run's last checkpoint, and where post-training
reads on."""
import os

import torch

import model
from plumbing import distributed, files, official

def from_pretrained(path, device="cpu"):
    """Our checkpoint (train.py's ckpt.pt or its directory), a state-spaces/mamba directory (config.json +
    pytorch_model.bin, Mamba-1 or -2) or a hub id of one (official.resolve). What cannot load faithfully is
    an error.
    lm.step: the training step of our checkpoint (None: official)."""
    path, cfg = weights_file(path)
    ours = cfg is None
    ckpt = read_checkpoint(path, device)
    try:
        state_dict = ckpt["model"] if ours else ckpt
        lm = model.LM(model.ModelConfig(**ckpt["model_config"]) if ours else cfg)
    except (TypeError, KeyError, IndexError, ValueError) as e:
        raise ValueError(f"{path}: not a model checkpoint of this repo ({type(e).__name__}: {e})") from None
    lm.load_state_dict(_checked_weights(path, lm, state_dict))
    lm.step = ckpt.get("step") if ours else None
    return lm.to(device)

def _checked_weights(path, lm, state_dict):
    """-> state_dict with the head of a tied LM, if it holds exactly lm's weights, each of lm's shape,
    floating point and finite; else a one-line error naming the first weight that is not."""
    own = lm.state_dict()
    if not isinstance(state_dict, dict) or not all(isinstance(v, torch.Tensor) for v in state_dict.values()):
        raise ValueError(f"{path}: its weights are not a dict of tensors: not a checkpoint of this repo")
    if lm.cfg.tie_embeddings:   # a tied head (every official Mamba LM) may be stored or not, but must equal
        emb = state_dict.get("backbone.embedding.weight")   # the embedding
        if emb is not None and not torch.equal(state_dict.get("lm_head.weight", emb), emb):
            raise ValueError(f"{path}: lm_head.weight differs from the embedding it is tied to: not loadable")
        state_dict = {**state_dict, "lm_head.weight": emb}
    missing = sorted(set(own) - set(state_dict))
    unknown = sorted(set(state_dict) - set(own))
    if missing or unknown:
        raise ValueError(f"{path}: weights not of this model: missing {missing[:5]}, unknown {unknown[:5]}")
    for k, v in state_dict.items():
        for bad, problem in [(v.shape != own[k].shape, f"shape {list(v.shape)}, not {list(own[k].shape)}"),
                             (not v.is_floating_point(), f"{v.dtype} values, not floating point"),
                             (not torch.isfinite(v).all(), "NaN or inf values")]:
            if bad:
                raise ValueError(f"{path}: {k} has {problem}: not a checkpoint this model can load")
    return state_dict

def train_config(path):
    """train.py's arguments stored in one of our checkpoints (a ckpt.pt or the run directory holding it); {}
    for an official Mamba directory (or hub id) or no file at path. An unreadable file is an error."""
    path, cfg = weights_file(path)
    if cfg is not None or not os.path.isfile(path):
        return {}
    tc = read_checkpoint(path, "cpu", mmap=True).get("train_config")
    return tc if isinstance(tc, dict) else {}

def check_vocabulary(lm, n_ids, n_vocab, name):
    """name's model must read every id of its data (n_ids of them), and have at most twice its tokenizer's
    n_vocab ids (None: Markov states, no tokenizer): more is an LM of another tokenizer (an official one)."""
    if n_ids > lm.cfg.vocab_size or n_vocab and lm.cfg.vocab_size > 2 * n_vocab:
        tokenizer = f", the tokenizer {n_vocab}" if n_vocab else ""
        raise ValueError(f"{name} has a vocabulary of {lm.cfg.vocab_size}, the data {n_ids} ids{tokenizer}: "
                         "pass the --tokenizer it was trained with (official: PATH/tokenizer.json)")

def data_id(corpus, split_seed):
    """What a checkpoint records of the data it read (train.py; --resume and evaluate.py compare it): the
    corpus, its content's key (text: the hash of its token ids) and the split seed."""
    return " ".join([corpus.name, str(corpus.info.get("key", "")), f"split-seed {split_seed}"])

read_official = official.read   # by the names the scripts and tests call
resolve = official.resolve

def weights_file(path):
    """-> (the file holding path's weights, None) for ours (a ckpt.pt or its run directory), or
    (its pytorch_model.bin, its ModelConfig) for an official directory or hub id; a missing file is named."""
    path = official.resolve(path)
    if os.path.isdir(path) and not os.path.exists(ckpt_file(path)):
        weights, fields = official.read(path)
        return weights, model.ModelConfig(**fields)
    return ckpt_file(path), None

def ckpt_file(path):
    """A run folder's ckpt.pt, or path itself (a checkpoint file, or a path still to be checked)."""
    return os.path.join(path, "ckpt.pt") if os.path.isdir(path) else path

def read_checkpoint(path, device, **kw):
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} does not exist")
    try:
        ckpt = torch.load(path, map_location=device, weights_only=True, **kw)
    except PermissionError as e:
        raise ValueError(f"cannot read {path} ({e.strerror}): fix its permissions") from None
    except Exception as e:  # a file cut short fails as EINVAL, EOFError or a zip without its directory
        # (torch's own text may give advice, e.g. weights_only=False, that is wrong for an unknown file)
        why = f"truncated, corrupt or not a torch checkpoint: {type(e).__name__}"
        raise ValueError(f"cannot read {path} ({why}): copy it again whole, or pass a ckpt.pt written by "
                         "train.py") from None
    if not isinstance(ckpt, dict):  # every checkpoint (ours, official weights) is a dict
        raise ValueError(f"{path} holds a {type(ckpt).__name__}, not a dict: not a checkpoint of this repo "
                         "(pass a ckpt.pt written by train.py, or an official pytorch_model.bin)")
    return ckpt

def last_checkpoint(args):
    """What a stopped run leaves: its last checkpoint (each file is replaced whole: write_atomically)."""
    step = checkpoint_step(args.out) if args else None
    if not step:
        return "no checkpoint was saved: nothing to resume"
    return f"the last checkpoint {args.out}/ckpt.pt (step {step}) is intact; continue with --resume"

def checkpoint_step(run):
    """The step of the run folder's ckpt.pt, or None without one (run: a --out, which may be anything)."""
    ckpt = os.path.join(run, "ckpt.pt")
    if not os.path.isfile(ckpt):
        return None
    return read_checkpoint(ckpt, "cpu", mmap=True).get("step")

def save_checkpoint(path, lm, optimizer, step, args, sampler, strategy):
    """All a resume needs: it continues exactly. The sampler's and the strategy's states: one a process,
    gathered to rank 0, which writes."""
    states = distributed.gather((sampler.state_dict(), strategy.state_dict()))   # other ranks: None
    if states is None:
        return
    ckpt = {"model_config": vars(lm.cfg), "model": lm.state_dict(), "optimizer": optimizer.state_dict(),
            "train_config": vars(args), "step": step, "sampler": [s for s, _ in states],
            "strategy": [s for _, s in states]}
    files.write_atomically(path, lambda tmp: torch.save(ckpt, tmp))

def read_on(sampler, parent):
    """Post-training reads on where the parent's sampler (same kind, seed) stopped: new data, as the paper."""
    path = ckpt_file(parent)
    states = read_checkpoint(path, "cpu", mmap=True).get("sampler", []) if os.path.isfile(path) else []
    state = dict(states[0]) if states else {}
    if state.keys() == sampler.state_dict().keys() and state["seed"] == sampler.seed:
        if "row_doc" in state:  # every row starts the next unread document
            state.update(row_doc=[-1] * sampler.batch_size, row_pos=[0] * sampler.batch_size)
        sampler.load_state_dict(state)
