"""The one language model around any recurrent mixer (Mamba-1, Mamba-2, GLA, RWKV-6, Gated DeltaNet).

    logits, final_state = lm(idx, state=None)

`state` is a list with one dict per layer holding that layer's WHOLE recurrent state: the matrix
state "h" plus whatever else the layer remembers between tokens (the causal-conv window "conv" of
Mamba, the token shift "shift"/"ffn_shift" of RWKV). So running a sequence in pieces and carrying
the state equals running it at once, lm(idx) == lm(idx[:, a:], state=lm(idx[:, :a])[1]), which the
interventions (State Passing, TBTT) and streaming evaluation rely on. state=None is the zero state.

Module names follow mamba_ssm's MambaLMHeadModel (backbone.embedding, backbone.layers.{i}.norm,
backbone.layers.{i}.mixer, backbone.norm_f, lm_head) so official Mamba checkpoints load as they are
(plumbing/checkpoints.py loads ours and theirs; plumbing/official.py reads and writes their layout)."""
import math
from dataclasses import dataclass, field

import torch
import torch.nn as nn

import deltanet
import gla
import rwkv
import ssm
from plumbing.scans import check_lm_inputs

@dataclass
class ModelConfig:
    arch: str = "mamba2"          # one of ARCHS: mamba1, mamba2, gla, rwkv6, gated_deltanet
    vocab_size: int = 257         # the bytes tokenizer: 256 bytes + end-of-text
    d_model: int = 64
    n_layer: int = 2
    mixer: dict = field(default_factory=dict)  # keyword arguments of the mixer (as mamba_ssm's ssm_cfg)
    pad_vocab_size_multiple: int = 8           # as mamba_ssm: the embedding has a padded number of rows
    norm_eps: float = 1e-5
    tie_embeddings: bool = True  # the head shares the embedding matrix (official Mamba LMs; fla's GLA unties)

# arch -> (mixer, MLP or None) of block i: official Mamba blocks have no MLP; the others a channel mix.
ARCHS = {
    "mamba2": lambda cfg, i: (ssm.Mamba2(cfg.d_model, **cfg.mixer), None),
    "mamba1": lambda cfg, i: (ssm.Mamba1(cfg.d_model, **cfg.mixer), None),
    "gla": lambda cfg, i: (gla.GLA(cfg.d_model, **cfg.mixer), gla.SwiGLU(cfg.d_model)),
    "rwkv6": lambda cfg, i: (rwkv.RWKV6TimeMix(cfg.d_model, layer_idx=i, num_layers=cfg.n_layer, **cfg.mixer),
                             rwkv.RWKV6ChannelMix(cfg.d_model, layer_idx=i, num_layers=cfg.n_layer)),
    "gated_deltanet": lambda cfg, i: (deltanet.GatedDeltaNet(cfg.d_model, **cfg.mixer),
                                      gla.SwiGLU(cfg.d_model))}

def _size(d_model, n_layer, **mixer):  # a preset
    return dict(d_model=d_model, n_layer=n_layer, mixer=mixer)

# Presets: dimensions only; vocab_size comes from the data. "tiny": CPU-sized, for demos and tests.
# "45m/85m/125m" (Mamba-2), "70m" (GLA, RWKV-6): the paper's from-scratch sizes (our dimensions, near
# those counts with the GPT-NeoX vocabulary); Gated DeltaNet's "70m": GLA's shape (not in the paper).
# "130m".."1.3b": the official state-spaces checkpoints.
_M2 = dict(d_state=128, headdim=64)
PRESETS = {
    "mamba2": {"tiny": _size(64, 2, d_state=16, headdim=16, expand=2, chunk_size=64),
               "45m": _size(512, 12, **_M2), "85m": _size(768, 12, **_M2), "125m": _size(768, 24, **_M2),
               "130m": _size(768, 24, **_M2), "370m": _size(1024, 48, **_M2), "780m": _size(1536, 48, **_M2),
               "1.3b": _size(2048, 48, **_M2)},
    # tiny-slow (the demo's): dt log-uniform in [1e-5, 1e-3], not [1e-3, 1e-1]: the state grows past T_train
    "mamba1": {"tiny": _size(64, 2, d_state=16),
               "tiny-slow": _size(64, 2, d_state=16, dt_min=1e-5, dt_max=1e-3),
               "130m": _size(768, 24, d_state=16), "370m": _size(1024, 48, d_state=16)},
    "gla": {"tiny": _size(64, 2, num_heads=2), "70m": _size(512, 12, num_heads=4)},
    "rwkv6": {"tiny": _size(64, 2, num_heads=2), "70m": _size(512, 12, num_heads=8)},
    "gated_deltanet": {"tiny": _size(64, 2, num_heads=2), "70m": _size(512, 12, num_heads=3),
                       "tiny-slow": _size(64, 2, num_heads=2, dt_min=1e-5, dt_max=1e-3)}}

def make_config(arch, size="tiny", vocab_size=257, **overrides):
    """The ModelConfig of a preset, e.g. make_config("mamba2", "tiny", vocab_size=257)."""
    if size not in PRESETS.get(arch, {}):
        known = {a: list(sizes) for a, sizes in PRESETS.items()}
        raise ValueError(f"unknown arch or size {arch}:{size}: choose from {known}")
    p = PRESETS[arch][size]
    # GLA, Gated DeltaNet as fla's configs: untied head, RMSNorm eps 1e-6 (the Mamba LMs, RWKV-6: tied, 1e-5)
    own = dict(tie_embeddings=False, norm_eps=1e-6) if arch in ("gla", "gated_deltanet") else {}
    return ModelConfig(arch, vocab_size, **{**p, "mixer": dict(p["mixer"]), **own, **overrides})

class RMSNorm(nn.RMSNorm):
    def forward(self, x):  # normalise in float32: the residual stream can be large and bf16 loses it
        return super().forward(x.float()).to(x.dtype)

class Block(nn.Module):
    """Pre-norm residual block: x + mixer(norm(x)), then x + mlp(norm2(x)) where there is an MLP."""
    def __init__(self, cfg, layer_idx):
        super().__init__()
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mixer, self.mlp = ARCHS[cfg.arch](cfg, layer_idx)
        if self.mlp is not None:
            self.norm2 = RMSNorm(cfg.d_model, cfg.norm_eps)

    def forward(self, x, state):
        y, new_state = self.mixer(self.norm(x), state)
        x = x + y
        if self.mlp is not None:
            y, mlp_state = self.mlp(self.norm2(x), state)
            x = x + y
            new_state = {**new_state, **mlp_state}   # one dict a layer: the mixer's and the MLP's keys differ
        return x, new_state

class LM(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        padded_vocab = math.ceil(cfg.vocab_size / cfg.pad_vocab_size_multiple) * cfg.pad_vocab_size_multiple
        self.backbone = nn.ModuleDict(dict(embedding=nn.Embedding(padded_vocab, cfg.d_model),
                                           layers=nn.ModuleList([Block(cfg, i) for i in range(cfg.n_layer)]),
                                           norm_f=RMSNorm(cfg.d_model, cfg.norm_eps)))
        self.lm_head = nn.Linear(cfg.d_model, padded_vocab, bias=False)
        # as mamba_ssm (mixers init their dt, A...): embedding ~ N(0, 0.02), residual outputs / sqrt(branches)
        nn.init.normal_(self.backbone.embedding.weight, std=0.02)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.backbone.embedding.weight
        else:
            nn.init.normal_(self.lm_head.weight, std=0.02)
        n_branches = self.cfg.n_layer * (2 if self.backbone.layers[0].mlp is not None else 1)
        for name, p in self.named_parameters():
            if name.endswith(("out_proj.weight", "o_proj.weight", "down_proj.weight", "value.weight")):
                p.data.div_(math.sqrt(n_branches))

    def forward(self, idx, state=None, last_only=False):
        """idx [b, t], state None (zeros) or one dict per layer -> logits [b, t, vocab_size], final state
        (not detached). last_only: logits [b, 1, vocab_size] of the last position only (a cheaper head).
        t = 0 gives empty logits and the state unchanged. Each mixer checks its own state's entries."""
        n = len(self.backbone.layers)
        check_lm_inputs(idx, state, n)
        state = [None] * n if state is None else state
        x = self.backbone.embedding(idx)
        final_state = []
        for block, s in zip(self.backbone.layers, state):
            x, s = block(x, s)
            final_state.append(s)
        x = self.backbone.norm_f(x[:, -1:] if last_only else x)
        return self.lm_head(x)[..., : self.cfg.vocab_size], final_state  # without the padding rows

    def zero_state(self, batch_size, device=None):
        """h_{-1} = 0: every layer's state dict (its mixer's entries and its MLP's) of zeros."""
        device = device or self.backbone.embedding.weight.device
        n = batch_size
        return [{**b.mixer.zero_state(n, device), **(b.mlp.zero_state(n, device) if b.mlp else {})}
                for b in self.backbone.layers]

    def num_params(self):
        return sum(p.numel() for p in self.parameters())

    def extra_repr(self):
        return f"arch={self.cfg.arch}, params={self.num_params():,}"

def set_scan_impl(lm, impl):
    """Use one scan form everywhere: "auto" (Triton on CUDA, chunked on CPU), "naive", "chunked", "triton"."""
    if impl not in ("auto", "naive", "chunked", "triton"):
        raise ValueError(f"unknown scan impl {impl!r}: choose auto, naive, chunked or triton")
    for m in lm.modules():
        if hasattr(m, "scan_impl"):
            m.scan_impl = impl
    return lm

def device_of(lm):
    """Where lm's parameters live (a model without parameters: the CPU)."""
    return next(lm.parameters(), torch.empty(0)).device

def stream(lm, x, chunk_len, stops=(), last_only=False):
    """Reads x [b, T] from the zero state in pieces that end every chunk_len tokens and at each of stops,
    the state carried: yields (start, end, logits, state after the piece). Memory: one piece at a time."""
    T = x.shape[1]
    ends = sorted({*range(chunk_len, T, chunk_len), *(e for e in stops if 0 < e < T), T})
    state = None   # the zero initial state
    for a, b in zip([0] + ends[:-1], ends):
        logits, state = lm(x[:, a:b], state, last_only=last_only)
        yield a, b, logits, state
