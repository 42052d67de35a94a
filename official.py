"""mamba_ssm's checkpoint layout, which a reader of the paper can skip: reading a state-spaces/mamba*
directory (config.json + pytorch_model.bin of a Mamba-1 or -2 LM, for model.from_pretrained) and writing
ours in it (python official.py --export CKPT OUT_DIR); our module names are mamba_ssm's, as the weights'."""
import argparse
import contextlib
import json
import os
import pathlib
import signal
import sys

import torch

from datafiles import read_json, write_atomically

# The keys of mamba_ssm's MambaConfig (config.json of the state-spaces/mamba* checkpoints). SIZES are
# positive integers, which export writes with ssm_cfg (the other keys: MambaConfig's defaults).
OFFICIAL_KEYS = set("d_model n_layer vocab_size ssm_cfg d_intermediate attn_layer_idx attn_cfg rms_norm "
                    "residual_in_fp32 fused_add_norm pad_vocab_size_multiple tie_embeddings".split())
SIZES = ("d_model", "n_layer", "vocab_size", "pad_vocab_size_multiple")

def read(path):
    """-> (path's pytorch_model.bin, the model.ModelConfig fields of its config.json) of a state-spaces/mamba
    directory. What this repo cannot load faithfully, or a missing file, is a one-line error."""
    file = os.path.join(path, "config.json")
    weights = os.path.join(path, "pytorch_model.bin")
    if not os.path.isfile(file):
        raise FileNotFoundError(f"{path}: no ckpt.pt (ours), no config.json + pytorch_model.bin (official)")
    c = read_json(file, "re-download it")
    ssm_cfg = c.get("ssm_cfg") or {}
    checks = [*((k not in c, f"no {k}") for k in SIZES[:3]),
              *((k in c and not (type(c[k]) is int and c[k] > 0), f"{k} {c.get(k)!r}") for k in SIZES),
              (not isinstance(ssm_cfg, dict), f"ssm_cfg {ssm_cfg!r}"),
              (c.get("d_intermediate") or c.get("attn_layer_idx"), "hybrid MLP/attention layers"),
              (not c.get("rms_norm", True), "LayerNorm"),
              (not c.get("tie_embeddings", True), "untied embeddings")]
    bad = sorted(set(c) - OFFICIAL_KEYS) + [problem for failed, problem in checks if failed]
    if bad:
        raise ValueError(f"{file}: not a Mamba LM this repo loads faithfully ({', '.join(bad)})")
    if not os.path.isfile(weights):  # a hub id's partial snapshot is named by datafiles.hub_path
        raise FileNotFoundError(f"{path} holds config.json but no pytorch_model.bin (a partial download?): "
                                f"run `hf download ORG/NAME pytorch_model.bin --local-dir {path}`")
    mixer = dict(ssm_cfg)
    arch = "mamba2" if mixer.pop("layer", "Mamba1") == "Mamba2" else "mamba1"
    return weights, dict(arch=arch, mixer=mixer, **{k: c[k] for k in SIZES if k in c})

def export(lm, out, train_config=None):
    """Write a Mamba LM as mamba_ssm does (config.json: MambaConfig; pytorch_model.bin: our names are its),
    and train_config (train.py's arguments: its tokenizer, data, T_train) as args.json, which
    model.train_config(out) reads back. An error, Ctrl-C or SIGTERM leaves none of these files behind."""
    c = lm.cfg
    if c.arch not in ("mamba1", "mamba2") or not c.tie_embeddings or c.norm_eps != 1e-5:
        raise ValueError(f"{c.arch}: the official layout holds Mamba LMs (tied head, norm eps 1e-5) only")
    config = dict({k: getattr(c, k) for k in SIZES}, ssm_cfg=dict(c.mixer, layer=c.arch.title()))
    texts = {"args.json": train_config and json.dumps(train_config, indent=1),
             "config.json": json.dumps(config)}
    names = ("pytorch_model.bin", *texts)   # renamed in this order: a config.json is a whole export
    made = not os.path.exists(out)
    if not (made or os.path.isdir(out)) or any(os.path.exists(os.path.join(out, f)) for f in names):
        raise FileExistsError(f"{out} {'holds a model' if os.path.isdir(out) else 'is a file'} already: "
                              "pass a new OUT_DIR")
    writes = {names[0]: lambda tmp: torch.save(lm.state_dict(), tmp)}
    writes.update({name: lambda tmp, text=text: pathlib.Path(tmp).write_text(text)
                   for name, text in texts.items() if text})
    os.makedirs(out, exist_ok=True)
    try:
        write_atomically(out, writes)   # all files or none
    except BaseException:
        if made:   # emptied: removed unless another process wrote there meanwhile
            with contextlib.suppress(OSError):
                os.rmdir(out)
        raise

def main(argv=None):
    """python official.py --export CKPT OUT_DIR: CKPT (ours, official or a hub id) in the official layout."""
    import model   # here, not above: model.py imports this file to load official checkpoints
    p = argparse.ArgumentParser(description="Write CKPT (ours, official or a hub id) in the official layout")
    p.error = lambda message: p.exit(2, f"error: {message}\n")  # one line, as every other bad input
    p.add_argument("--export", nargs=2, required=True, metavar=("CKPT", "OUT_DIR"))
    ckpt, out = p.parse_args(argv).export
    if not ckpt.strip() or not out.strip():   # "" would read as the working folder
        p.error(f"--export {ckpt!r} {out!r}: CKPT and OUT_DIR must not be empty")
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM as Ctrl-C: export removes its files
    try:
        export(model.from_pretrained(ckpt), out, model.train_config(ckpt))
    except (OSError, ValueError) as e:
        sys.exit(f"error: {e}")
    except KeyboardInterrupt:
        sys.exit(f"interrupted: nothing written to {out} (no temporary file left)")

if __name__ == "__main__":
    main()
