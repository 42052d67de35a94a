# Without a GPU the Triton kernels run in Triton's interpreter (as in CI): set before triton is first
# imported, hence here (test_triton_compile.py compiles them for real). Below: helpers of several test files.
import json
import os
import sys
from dataclasses import asdict

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

import model  # noqa: E402

# a tiny train.py run on a Markov corpus (add --steps, --out and what the test is about)
TRAIN = ["--data", "markov:k=4,alpha=0.5,doc_len=200,docs=40", "--seq-len", "16", "--batch-size", "4",
         "--eval-interval", "1000", "--quiet"]
CORPUS_TEXT = "".join(f"def f{i}(x):\n    return x + {i}  # the river runs down to the sea\n\n"
                      for i in range(60))


@pytest.fixture(scope="session")
def tok_json(tmp_path_factory):
    """A small byte-level BPE tokenizer.json WITH merges and an end-of-text token, trained here (offline)."""
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=300, special_tokens=["<|pad|>", "<|endoftext|>"],
                                             initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([CORPUS_TEXT] * 4, trainer)
    path = str(tmp_path_factory.mktemp("tok") / "tokenizer.json")
    tok.save(path)
    return path


def tiny_lm(arch="mamba2", vocab_size=257, seed=0, **overrides):
    torch.manual_seed(seed)
    return model.LM(model.make_config(arch, "tiny", vocab_size=vocab_size, **overrides))


def checkpoint(path, init_seed=0, lm=None, **train_config):
    """A run directory as train.py writes it (ckpt.pt) holding lm (a tiny Mamba-2); returns (path, lm)."""
    lm = tiny_lm(seed=init_seed) if lm is None else lm
    path.mkdir()
    torch.save({"model_config": asdict(lm.cfg), "model": lm.state_dict(), "train_config": train_config},
               path / "ckpt.pt")
    return str(path), lm


def official_dir(path, state_dict, **config):
    """A directory in the layout of state-spaces/mamba's checkpoints: config.json and pytorch_model.bin."""
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    torch.save(state_dict, path / "pytorch_model.bin")
    return str(path)


# key -> shape, mamba_ssm's layout. Mamba-2: d_model=64, expand=2, headdim=16 (8 heads), d_state=16, d_conv=4
OFFICIAL_MAMBA2_LAYER = {
    "norm.weight": [64], "mixer.in_proj.weight": [2 * 128 + 2 * 16 + 8, 64],  # [z, x, B, C, dt]
    "mixer.conv1d.weight": [128 + 2 * 16, 1, 4], "mixer.conv1d.bias": [128 + 2 * 16], "mixer.dt_bias": [8],
    "mixer.A_log": [8], "mixer.D": [8], "mixer.norm.weight": [128], "mixer.out_proj.weight": [64, 128]}
OFFICIAL_MAMBA1_LAYER = {"norm.weight": [64],  # d_model=64, expand=2, d_state=16, dt_rank=ceil(64/16)=4
    "mixer.in_proj.weight": [256, 64], "mixer.conv1d.weight": [128, 1, 4], "mixer.conv1d.bias": [128],
    "mixer.x_proj.weight": [4 + 32, 128], "mixer.dt_proj.weight": [128, 4], "mixer.dt_proj.bias": [128],
    "mixer.A_log": [128, 16], "mixer.D": [128], "mixer.out_proj.weight": [64, 128]}
OFFICIAL_CONFIG = dict(d_model=64, n_layer=2, vocab_size=50, rms_norm=True, residual_in_fp32=True,
                       fused_add_norm=True, pad_vocab_size_multiple=8, tie_embeddings=True)


def official_state_dict(layer_shapes, n_layer=2, vocab=56, d=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    sd = {"backbone.embedding.weight": torch.randn(vocab, d, generator=g) * 0.02,
          "backbone.norm_f.weight": torch.ones(d)}
    for i in range(n_layer):
        for k, shape in layer_shapes.items():
            sd[f"backbone.layers.{i}.{k}"] = torch.randn(*shape, generator=g) * 0.1
    sd["lm_head.weight"] = sd["backbone.embedding.weight"]
    return sd


def logged(out, key="loss"):
    """step -> key of the run's metrics.jsonl, which must hold each step once, in order."""
    with open(os.path.join(out, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    assert [r["step"] for r in rows] == list(range(1, len(rows) + 1))
    return {r["step"]: r.get(key) for r in rows}
