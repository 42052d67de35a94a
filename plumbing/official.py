"""mamba_ssm's checkpoint layout and the Hugging Face Hub. resolve: a
hub id ORG/NAME -> its folder in the Hugging Face cache; read: a state-spaces/mamba* folder (config.json +
pytorch_model.bin of a Mamba-1 or -2 LM) -> our ModelConfig's fields; export: a Mamba run in that layout,
as mamba_ssm's MambaLMHeadModel.save_pretrained writes it and its from_pretrained reads it (our module
names are mamba_ssm's, so the weights are one dict either way):

python -m plumbing.export RUN OUT runs export."""
import errno
import json
import os
import re
import shutil

import torch

from plumbing.files import DataError, _remove_stale_tmps, is_int, read_json, require, tmp_name

FILES = ("config.json", "pytorch_model.bin")   # the official layout
# The fields of mamba_ssm's MambaConfig, in its order (config.json of the state-spaces/mamba* checkpoints);
# the SIZES are positive integers.
OFFICIAL_KEYS = ("d_model d_intermediate n_layer vocab_size ssm_cfg attn_layer_idx attn_cfg rms_norm "
                 "residual_in_fp32 fused_add_norm pad_vocab_size_multiple tie_embeddings").split()
SIZES = ("d_model", "n_layer", "vocab_size", "pad_vocab_size_multiple")
# The arguments of our mixers that mamba_ssm's layer of that name takes too: all an exported ssm_cfg may hold
LAYER_ARGS = {
    "mamba1": set("d_state d_conv expand dt_rank dt_min dt_max dt_init_floor conv_bias bias".split()),
    "mamba2": set("d_state d_conv expand headdim ngroups A_init_range dt_min dt_max dt_init_floor "
                  "chunk_size".split())}
HUB_ID = re.compile(r"[\w-][\w.-]*/[\w.-]+")   # ORG/NAME as the Hub spells them

# --- hub ids -----------------------------------------------------------------------------------------------
def resolve(path):
    """-> path itself where it exists (a local path wins) or is no hub id ORG/NAME; else the folder of the hub
    repo's config.json and pytorch_model.bin in the Hugging Face cache (HF_HUB_CACHE, else HF_HOME/hub),
    fetched there first unless HF_HUB_OFFLINE=1: a Hub that does not answer within HF_HUB_ETAG_TIMEOUT s ends
    it, as does a download that stalls HF_HUB_DOWNLOAD_TIMEOUT s 6 times (huggingface_hub resumes it 5 times).
    What is not there is a one-line DataError."""
    if not isinstance(path, str) or os.path.exists(path) or not HUB_ID.fullmatch(path):
        return path
    import huggingface_hub as hf   # here: only a hub id needs it
    from huggingface_hub import constants, errors
    try:
        cached = [hf.try_to_load_from_cache(path, f) for f in FILES]
    except ValueError as e:   # the Hub's rules for an id (no "--", no "..")
        raise DataError(f"{path}: no such path, nor a hub id ({e}): check the path") from None
    if all(isinstance(p, str) for p in cached):   # else None, or the marker of a file the Hub does not have
        return os.path.dirname(cached[0])
    missing = [f for f, p in zip(FILES, cached) if not isinstance(p, str)]
    if constants.HF_HUB_OFFLINE:
        raise _not_cached(path, missing, "HF_HUB_OFFLINE=1")
    timeout = constants.HF_HUB_ETAG_TIMEOUT
    # a HEAD without retries first: with nothing cached, hf_hub_download retries a stalled Hub for minutes
    try:
        for f in missing:
            hf.get_hf_file_metadata(hf.hf_hub_url(path, f), timeout=timeout)
        return os.path.dirname([hf.hf_hub_download(path, f, etag_timeout=timeout) for f in FILES][0])
    except errors.RepositoryNotFoundError:
        why = "no such Hub repo, or a gated or private one: check the id, or `hf auth login`"
    except errors.RemoteEntryNotFoundError:
        why = "the Hub repo holds no such file: not a checkpoint in the official layout"
    except Exception as e:   # a stalled or refused connection, a proxy, a full disk
        if "Timeout" in type(e).__name__:   # httpx's ReadTimeout, ConnectTimeout...
            why = (f"the Hub did not answer in time: HF_HUB_ETAG_TIMEOUT ({timeout:g} s) and "
                   f"HF_HUB_DOWNLOAD_TIMEOUT ({constants.HF_HUB_DOWNLOAD_TIMEOUT:g} s) set it")
        else:
            first = str(e).splitlines()[0][:120] if str(e) else ""
            why = f"{type(e).__name__}: {first}"
    raise _not_cached(path, missing, why)

def _not_cached(repo, missing, why):
    from huggingface_hub import constants
    return DataError(f"{repo}: no such path, and the Hugging Face cache {constants.HF_HUB_CACHE} has no "
                     f"{' nor '.join(missing)} of it ({why}): on a connected machine run `hf download {repo} "
                     f"{' '.join(FILES)} --local-dir DIR` and pass DIR, or leave out --local-dir to fill "
                     "that cache (HF_HUB_CACHE sets it)")

# --- reading ------------------------------------------------------------------------------------------------
def read(path):
    """-> (path's pytorch_model.bin, the model.ModelConfig fields of its config.json) of a state-spaces/mamba
    directory. What this repo cannot load faithfully, or a missing file, is a one-line error."""
    file = os.path.join(path, "config.json")
    weights = os.path.join(path, "pytorch_model.bin")
    if not os.path.isfile(file):
        raise FileNotFoundError(f"{path}: no ckpt.pt (ours), no config.json + pytorch_model.bin (official)")
    c = read_json(file, "re-download it")
    ssm_cfg = c.get("ssm_cfg") or {}
    mixer = dict(ssm_cfg) if isinstance(ssm_cfg, dict) else {}
    layer = mixer.pop("layer", "Mamba1")  # mamba_ssm's default layer
    checks = [*((k not in c, f"no {k}") for k in SIZES[:3]),
              *((k in c and not is_int(c[k]), f"{k} {c.get(k)!r}") for k in SIZES),
              (not isinstance(ssm_cfg, dict), f"ssm_cfg {ssm_cfg!r}"),
              (c.get("d_intermediate") or c.get("attn_layer_idx"), "hybrid MLP/attention layers"),
              (not c.get("rms_norm", True), "LayerNorm"),
              (not c.get("tie_embeddings", True), "untied embeddings"),
              (layer not in ("Mamba1", "Mamba2"), f"ssm_cfg.layer {layer!r}, not Mamba1 or Mamba2")]
    heads = _mamba2_head_problems(c, mixer) if layer == "Mamba2" else []
    bad = sorted(set(c) - set(OFFICIAL_KEYS)) + [problem for failed, problem in checks if failed] + heads
    if bad:
        raise ValueError(f"{file}: not a Mamba LM this repo loads faithfully ({', '.join(bad)})")
    if not os.path.isfile(weights):
        raise FileNotFoundError(f"{path} holds config.json but no pytorch_model.bin (a partial download?): "
                                f"run `hf download ORG/NAME pytorch_model.bin --local-dir {path}`")
    arch = "mamba2" if layer == "Mamba2" else "mamba1"
    return weights, dict(arch=arch, mixer=mixer, **{k: c[k] for k in SIZES if k in c})

def _mamba2_head_problems(c, mixer):
    """What keeps ssm.Mamba2 from building config.json's heads: headdim must divide expand * d_model, ngroups
    the number of heads (mamba_ssm's defaults: headdim 64, expand 2, ngroups 1)."""
    headdim = mixer.get("headdim", 64)
    expand = mixer.get("expand", 2)
    ngroups = mixer.get("ngroups", 1)
    sizes = dict(headdim=headdim, expand=expand, ngroups=ngroups)
    bad = [f"ssm_cfg.{k} {v!r}" for k, v in sizes.items() if not is_int(v)]
    d_model = c.get("d_model")
    if bad or not is_int(d_model):  # a bad d_model has its own message
        return bad
    d_inner = expand * d_model
    if d_inner % headdim:
        return [f"ssm_cfg.headdim {headdim} does not divide expand * d_model = {d_inner}: set headdim to a "
                "divisor of it (official: 64), or re-download config.json"]
    if d_inner // headdim % ngroups:
        return [f"ssm_cfg.ngroups {ngroups} does not divide the {d_inner // headdim} heads: set ngroups to a "
                "divisor of them (official: 1), or re-download config.json"]
    return []

# --- export -------------------------------------------------------------------------------------------------
def mamba_config(lm):
    """-> lm's MambaConfig as config.json holds it, or a one-line DataError: what mamba_ssm's MambaLMHeadModel
    cannot hold, or `read` would not read back as it is."""
    c = lm.cfg
    extra = sorted(set(c.mixer) - LAYER_ARGS.get(c.arch, set()))
    mlp = any(b.mlp is not None for b in lm.backbone.layers)
    for bad, problem in [
            (c.arch not in LAYER_ARGS, f"a {c.arch} LM (mamba_ssm's MambaLMHeadModel holds Mamba-1 and -2)"),
            (mlp, "blocks with an MLP (the official Mamba blocks have none)"),
            (not c.tie_embeddings, "an untied head (the official Mamba LMs tie it to the embedding)"),
            (c.norm_eps != 1e-5, f"RMSNorm eps {c.norm_eps:g} (mamba_ssm's is 1e-5)"),
            (extra, f"mixer arguments {extra} (mamba_ssm's {c.arch.title()} takes none of them)")]:
        require(not bad, f"no official layout holds {problem}: export a Mamba-1 or -2 run of this repo")
    return dict(d_model=c.d_model, d_intermediate=0, n_layer=c.n_layer, vocab_size=c.vocab_size,
                ssm_cfg={"layer": c.arch.title(), **c.mixer}, attn_layer_idx=[], attn_cfg={}, rms_norm=True,
                residual_in_fp32=True, fused_add_norm=True, pad_vocab_size_multiple=c.pad_vocab_size_multiple,
                tie_embeddings=True)

def require_new(out):
    """out must be a new name or an empty folder: an export never replaces a file."""
    require(not os.path.exists(out) or os.path.isdir(out) and not os.listdir(out),
            f"{out} {'holds files' if os.path.isdir(out) else 'is a file'} already: pass a new or empty OUT")

def export(lm, out):
    """Writes lm in mamba_ssm's layout as MambaLMHeadModel.save_pretrained does: config.json (mamba_config)
    and pytorch_model.bin (the state_dict, the tied head included). out is new or an empty folder, and gets
    all the files at once or none: they are written in a folder beside it, which is then renamed to out."""
    config = mamba_config(lm)
    out = os.path.abspath(out)   # without a trailing /: the temporary folder is its sibling
    require_new(out)
    tmp = tmp_name(out)   # files.write_atomically's convention: PATH.<pid>.tmp
    _remove_stale_tmps(out)   # those of exports killed by kill -9 (their process is gone)
    os.makedirs(tmp)   # one of this pid is another's, whose process is gone too: named, not reused
    try:
        torch.save(lm.state_dict(), os.path.join(tmp, "pytorch_model.bin"))
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(config, f, indent=4)
        os.replace(tmp, out)   # rename(2) replaces an empty folder only: one filled meanwhile is kept
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError) and e.errno in (errno.ENOTEMPTY, errno.EEXIST):
            raise DataError(f"{out} was filled by another process meanwhile: pass a new OUT") from None
        raise
