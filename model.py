"""
The one language model around any recurrent mixer (Mamba-1, Mamba-2, GLA, RWKV-6).

    logits, final_state = lm(idx, state=None)

`state` is a list with one dict per layer holding that layer's WHOLE recurrent state: the matrix
state "h" plus whatever else the layer remembers between tokens (the causal-conv window "conv" of
Mamba, the token shift "shift"/"ffn_shift" of RWKV). Because of that, running a sequence in pieces
and carrying the state is exactly the same as running it at once:

    lm(idx) == lm(idx[:, a:], state=lm(idx[:, :a])[1])

which is what the paper's interventions (State Passing, TBTT) and our streaming evaluation rely on.
state=None means the zero state, the usual start of every sequence.

Module names follow mamba_ssm's MambaLMHeadModel (backbone.embedding, backbone.layers.{i}.norm,
backbone.layers.{i}.mixer, backbone.norm_f, lm_head) so official Mamba checkpoints load as they are.
"""
import json
import math
import os
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

import gla
import rwkv
import ssm


@dataclass
class ModelConfig:
    arch: str = "mamba2"          # one of ARCHS: mamba1, mamba2, gla, rwkv6
    vocab_size: int = 257         # the bytes tokenizer: 256 bytes + end-of-text
    d_model: int = 64
    n_layer: int = 2
    mixer: dict = field(default_factory=dict)  # keyword arguments of the mixer (as mamba_ssm's ssm_cfg)
    pad_vocab_size_multiple: int = 8           # as mamba_ssm: the embedding has a padded number of rows
    norm_eps: float = 1e-5


# Each architecture: the mixer and, where the architecture has one, the MLP (channel mix) of a block.
# Official Mamba blocks have the mixer only; GLA and RWKV-6 blocks have both.
ARCHS = {
    "mamba2": lambda cfg, i: (ssm.Mamba2(cfg.d_model, layer_idx=i, **cfg.mixer), None),
    "mamba1": lambda cfg, i: (ssm.Mamba(cfg.d_model, layer_idx=i, **cfg.mixer), None),
    "gla": lambda cfg, i: (gla.GLA(cfg.d_model, layer_idx=i, **cfg.mixer), gla.SwiGLU(cfg.d_model)),
    "rwkv6": lambda cfg, i: (rwkv.RWKV6TimeMix(cfg.d_model, layer_idx=i, num_layers=cfg.n_layer, **cfg.mixer),
                             rwkv.RWKV6ChannelMix(cfg.d_model, layer_idx=i, num_layers=cfg.n_layer)),
}

# Presets: dimensions only; vocab_size comes from the data (train.py sets it).
# "tiny": CPU-sized (tens of thousands of parameters) for demos, tests and course work.
# "45m/85m/125m" (Mamba-2), "70m" (GLA, RWKV-6): the paper's from-scratch ablation sizes; the paper
# does not list every dimension, so these are our choices that land near those counts with the GPT-NeoX
# vocabulary (50277) -- print the model for the exact count.
# "130m".."1.3b": the official state-spaces checkpoints' dimensions (Mamba-2 and Mamba-1).
PRESETS = {
    "mamba2": {
        "tiny": dict(d_model=64, n_layer=2, mixer=dict(d_state=16, headdim=16, expand=2, chunk_size=64)),
        "45m": dict(d_model=512, n_layer=12, mixer=dict(d_state=128, headdim=64)),
        "85m": dict(d_model=768, n_layer=12, mixer=dict(d_state=128, headdim=64)),
        "125m": dict(d_model=768, n_layer=24, mixer=dict(d_state=128, headdim=64)),
        "130m": dict(d_model=768, n_layer=24, mixer=dict(d_state=128, headdim=64)),
        "370m": dict(d_model=1024, n_layer=48, mixer=dict(d_state=128, headdim=64)),
        "780m": dict(d_model=1536, n_layer=48, mixer=dict(d_state=128, headdim=64)),
        "1.3b": dict(d_model=2048, n_layer=48, mixer=dict(d_state=128, headdim=64)),
    },
    "mamba1": {
        "tiny": dict(d_model=64, n_layer=2, mixer=dict(d_state=16)),
        "130m": dict(d_model=768, n_layer=24, mixer=dict(d_state=16)),
        "370m": dict(d_model=1024, n_layer=48, mixer=dict(d_state=16)),
    },
    "gla": {
        "tiny": dict(d_model=64, n_layer=2, mixer=dict(num_heads=2)),
        "70m": dict(d_model=512, n_layer=12, mixer=dict(num_heads=4)),
    },
    "rwkv6": {
        "tiny": dict(d_model=64, n_layer=2, mixer=dict(num_heads=2)),
        "70m": dict(d_model=512, n_layer=12, mixer=dict(num_heads=8)),
    },
}


def make_config(arch, size="tiny", vocab_size=257, **overrides):
    """The ModelConfig of a preset, e.g. make_config("mamba2", "tiny", vocab_size=257)."""
    if arch not in PRESETS:
        raise ValueError(f"unknown arch {arch!r}: choose one of {sorted(PRESETS)}")
    if size not in PRESETS[arch]:
        raise ValueError(f"unknown size {size!r} for {arch}: choose one of {list(PRESETS[arch])}")
    p = PRESETS[arch][size]
    cfg = dict(arch=arch, vocab_size=vocab_size, d_model=p["d_model"], n_layer=p["n_layer"], mixer=dict(p["mixer"]))
    cfg.update(overrides)
    return ModelConfig(**cfg)


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        # normalise in float32: the residual stream can be large and bf16 loses it
        return F.rms_norm(x.float(), (x.shape[-1],), self.weight.float(), self.eps).to(x.dtype)


class Block(nn.Module):
    """Pre-norm residual block: x + mixer(norm(x)), then x + mlp(norm2(x)) where there is an MLP."""

    def __init__(self, cfg, layer_idx):
        super().__init__()
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mixer, mlp = ARCHS[cfg.arch](cfg, layer_idx)
        if mlp is not None:
            self.norm2 = RMSNorm(cfg.d_model, cfg.norm_eps)
            self.mlp = mlp
        else:
            self.mlp = None

    def forward(self, x, state):
        y, new_state = self.mixer(self.norm(x), state)
        x = x + y
        if self.mlp is not None:
            y, mlp_state = self.mlp(self.norm2(x), state)
            x = x + y
            new_state = {**new_state, **mlp_state}
        return x, new_state

    def zero_state(self, batch_size, device):
        state = self.mixer.zero_state(batch_size, device)
        if self.mlp is not None:
            state = {**state, **self.mlp.zero_state(batch_size, device)}
        return state


class LM(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if cfg.arch not in ARCHS:
            raise ValueError(f"unknown arch {cfg.arch!r}: choose one of {sorted(ARCHS)}")
        self.cfg = cfg
        m = cfg.pad_vocab_size_multiple
        padded_vocab = (cfg.vocab_size + m - 1) // m * m
        self.backbone = nn.ModuleDict(dict(
            embedding=nn.Embedding(padded_vocab, cfg.d_model),
            layers=nn.ModuleList([Block(cfg, i) for i in range(cfg.n_layer)]),
            norm_f=RMSNorm(cfg.d_model, cfg.norm_eps),
        ))
        self.lm_head = nn.Linear(cfg.d_model, padded_vocab, bias=False)
        self.lm_head.weight = self.backbone.embedding.weight  # tied, as the official Mamba LMs
        self._init_weights()

    def _init_weights(self):
        # The mixers initialise their own parameters (dt, A, decays...). Here, as mamba_ssm does:
        # embeddings ~ N(0, 0.02), and every projection that writes into the residual stream is
        # scaled by 1/sqrt(number of residual branches) so the stream's variance does not grow with depth.
        nn.init.normal_(self.backbone.embedding.weight, std=0.02)
        n_branches = self.cfg.n_layer * (2 if self.backbone.layers[0].mlp is not None else 1)
        for name, p in self.named_parameters():
            if name.endswith(("out_proj.weight", "o_proj.weight", "down_proj.weight", "value.weight")):
                with torch.no_grad():
                    p.div_(math.sqrt(n_branches))

    def forward(self, idx, state=None, last_only=False):
        """idx [b, t] token ids; state: None (zeros) or a list of per-layer dicts.
        Returns logits [b, t, vocab_size] and the final state (not detached).
        last_only=True: logits of the last position only, [b, 1, vocab_size]. Decoding and Effective
        Remembrance need nothing else, and the head is a large share of the work with a real
        vocabulary (50k x d_model per token), so they skip it for the other positions."""
        if idx.dim() != 2:
            raise ValueError(f"idx must have shape [batch, time], got {list(idx.shape)}")
        if state is None:
            state = [None] * len(self.backbone.layers)
        elif len(state) != len(self.backbone.layers):
            raise ValueError(f"state has {len(state)} layers, the model has {len(self.backbone.layers)}")
        x = self.backbone.embedding(idx)
        final_state = []
        for block, s in zip(self.backbone.layers, state):
            x, s = block(x, s)
            final_state.append(s)
        x = self.backbone.norm_f(x[:, -1:] if last_only else x)
        logits = self.lm_head(x)[..., : self.cfg.vocab_size]  # drop the padding rows
        return logits, final_state

    def zero_state(self, batch_size, device=None):
        device = device or self.backbone.embedding.weight.device
        return [block.zero_state(batch_size, device) for block in self.backbone.layers]

    def num_params(self):
        return sum(p.numel() for p in self.parameters())

    def extra_repr(self):
        return f"arch={self.cfg.arch}, params={self.num_params():,}"


# --- state plumbing -----------------------------------------------------------------------------

def detach_state(state):
    """Cut the gradient between chunks/batches (SP, TBTT): the values carry over, the graph does not."""
    return [{k: v.detach() for k, v in layer.items()} for layer in state]


def map_state(fn, *states):
    """Apply fn tensor-wise over one or more states of the same structure."""
    return [{k: fn(*(s[i][k] for s in states)) for k in states[0][i]} for i in range(len(states[0]))]


def set_scan_impl(lm, impl):
    """Use one scan form everywhere: "auto" (Triton on CUDA, chunked on CPU), "naive", "chunked", "triton"."""
    if impl not in ("auto", "naive", "chunked", "triton"):
        raise ValueError(f"unknown scan impl {impl!r}: choose auto, naive, chunked or triton")
    for m in lm.modules():
        if hasattr(m, "scan_impl"):
            m.scan_impl = impl
    return lm


# --- loading --------------------------------------------------------------------------------------

def from_pretrained(path, device="cpu"):
    """Load a model from one of:
    - our checkpoint: a file written by train.py (ckpt.pt) or the directory holding it;
    - a state-spaces/mamba style directory: config.json + pytorch_model.bin (Mamba-1 or Mamba-2).
    Missing or unexpected weights are an error, never skipped silently."""
    if os.path.isdir(path):
        if os.path.exists(os.path.join(path, "ckpt.pt")):
            path = os.path.join(path, "ckpt.pt")
        elif os.path.exists(os.path.join(path, "config.json")):
            return _load_mamba_dir(path, device)
        else:
            raise FileNotFoundError(f"{path}: no ckpt.pt (ours) nor config.json + pytorch_model.bin (official Mamba) inside")
    if not os.path.exists(path):
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    try:
        ckpt = torch.load(path, map_location=device, weights_only=True)
    except Exception as e:
        raise RuntimeError(f"cannot read checkpoint {path} (corrupt or not a torch file): {type(e).__name__}: {e}") from None
    if not isinstance(ckpt, dict) or "model_config" not in ckpt or "model" not in ckpt:
        raise RuntimeError(f"{path} is not a checkpoint of this repo (expected keys 'model_config' and 'model')")
    try:
        cfg = ModelConfig(**ckpt["model_config"])
    except TypeError as e:
        raise RuntimeError(f"{path}: model_config does not match ModelConfig: {e}") from None
    lm = LM(cfg)
    _load_strict(lm, ckpt["model"], path)
    return lm.to(device)


def train_config(path):
    """train.py's arguments stored in one of our checkpoints (a ckpt.pt or the run directory holding
    it); {} where there is none (an official Mamba directory). An unreadable file is an error."""
    ckpt = os.path.join(path, "ckpt.pt") if os.path.isdir(path) else path
    if not os.path.isfile(ckpt):
        return {}
    try:
        tc = torch.load(ckpt, map_location="cpu", weights_only=True, mmap=True).get("train_config")
    except Exception as e:
        raise RuntimeError(f"cannot read checkpoint {ckpt} (corrupt or not a torch file): {type(e).__name__}") from None
    return tc if isinstance(tc, dict) else {}


def _load_mamba_dir(path, device):
    with open(os.path.join(path, "config.json")) as f:
        c = json.load(f)
    weights = os.path.join(path, "pytorch_model.bin")
    if not os.path.exists(weights):
        raise FileNotFoundError(f"{weights} is missing (official Mamba directories hold config.json + pytorch_model.bin)")
    mixer = dict(c.get("ssm_cfg", {}))
    arch = "mamba2" if mixer.pop("layer", "Mamba1") == "Mamba2" else "mamba1"
    if c.get("d_intermediate", 0) or c.get("attn_layer_idx"):
        raise ValueError(f"{path}: hybrid Mamba models (MLP or attention layers) are not supported here")
    cfg = ModelConfig(arch=arch, vocab_size=c["vocab_size"], d_model=c["d_model"], n_layer=c["n_layer"],
                      mixer=mixer, pad_vocab_size_multiple=c.get("pad_vocab_size_multiple", 8))
    try:
        lm = LM(cfg)
    except TypeError as e:
        raise ValueError(f"{path}: config.json ssm_cfg has an option this repo's mixer does not take: {e}") from None
    state_dict = torch.load(weights, map_location=device, weights_only=True)
    _load_strict(lm, state_dict, weights)
    return lm.to(device)


def _load_strict(lm, state_dict, where):
    # the head is tied to the embedding: a checkpoint may or may not store it
    own = lm.state_dict()
    if "lm_head.weight" not in state_dict and "lm_head.weight" in own:
        state_dict = {**state_dict, "lm_head.weight": state_dict.get("backbone.embedding.weight")}
    missing = sorted(set(own) - set(state_dict))
    unknown = sorted(set(state_dict) - set(own))
    if missing or unknown:
        raise RuntimeError(f"{where}: weights do not match the model: missing {missing[:5]}, unknown {unknown[:5]}"
                           + (" ..." if len(missing) > 5 or len(unknown) > 5 else ""))
    for k, v in state_dict.items():
        if own[k].shape != v.shape:
            raise RuntimeError(f"{where}: {k} has shape {list(v.shape)}, the model expects {list(own[k].shape)}")
    lm.load_state_dict(state_dict)

