# Without a GPU the Triton kernels run in Triton's interpreter (as in CI): set before triton is first
# imported, hence here (test_triton_compile.py compiles them for real). Below: helpers of several test files.
import json
import os
import sys
from dataclasses import asdict

# No network in tests: a hub id or tiktoken file not in the cache fails at once (huggingface_hub reads this
# at import); the tests of a Hub that answers, or never does, set it to 0 in the processes they start.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or max(1, min(2, os.cpu_count() or 1))))

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

def logged(out, key="loss"):
    """step -> key of the run's metrics.jsonl, which must hold each step once, in order."""
    with open(os.path.join(out, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    assert [r["step"] for r in rows] == list(range(1, len(rows) + 1))
    return {r["step"]: r.get(key) for r in rows}
