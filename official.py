"""mamba_ssm's checkpoint layout, which a reader of the paper can skip: reading a state-spaces/mamba*
directory (config.json + pytorch_model.bin of a Mamba-1 or -2 LM) for model.from_pretrained. Our module
names are mamba_ssm's, so its weights load as they are."""
import os

from datafiles import read_json

# The keys of mamba_ssm's MambaConfig (config.json of the state-spaces/mamba* checkpoints); SIZES are
# positive integers.
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
