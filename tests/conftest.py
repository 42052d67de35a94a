# Without a GPU the Triton kernels run in Triton's interpreter (as in CI): set before triton is first
# imported, hence here (test_triton_compile.py compiles them for real). Below: helpers of several test files.
import atexit
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
from dataclasses import asdict

# No network in tests (huggingface_hub, which tokenizers imports, reads this at import).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# tiktoken's BPE files: an empty cache of the tests' own, never a developer's (test_tiktoken.py makes its files)
if "TIKTOKEN_CACHE_DIR" not in os.environ:   # (the processes tests start inherit it: one folder a run)
    os.environ["TIKTOKEN_CACHE_DIR"] = tempfile.mkdtemp(prefix="tiktoken-cache-")
    atexit.register(shutil.rmtree, os.environ["TIKTOKEN_CACHE_DIR"], ignore_errors=True)

import pytest
import torch
import tqdm

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
# Under pytest-xdist the cores are shared out among the workers, and the processes a test starts inherit that
_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
os.environ.setdefault("OMP_NUM_THREADS", str(max(1, min(2, (os.cpu_count() or 1) // _workers))))
torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

import model  # noqa: E402

tqdm.tqdm.monitor_interval = 0   # no monitor thread: a test leaves no thread behind (process_state, below)

# a tiny train.py run on a Markov corpus (add --steps, --out and what the test is about), on the CPU also
# where there is a GPU: the tests compare its numbers with float32 ones (CUDA trains under bf16 autocast)
TRAIN = ["--data", "markov:k=4,alpha=0.5,doc_len=200,docs=40", "--seq-len", "16", "--batch-size", "4",
         "--eval-interval", "1000", "--quiet", "--device", "cpu"]
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

def _children():
    """The pids of this process's live children (Linux: /proc), zombies aside."""
    me, pids, live = f"/proc/{os.getpid()}/task", set(), set()
    for task in os.listdir(me):
        with contextlib.suppress(FileNotFoundError):   # a thread (torch's) ended meanwhile
            pids |= {int(p) for p in open(f"{me}/{task}/children").read().split()}
    for pid in pids:
        with contextlib.suppress(FileNotFoundError):   # reaped meanwhile
            if open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
                live.add(pid)
    return live

@pytest.fixture(autouse=True)
def process_state():
    """What a test leaves in the pytest process a later test would inherit. The Ctrl-C and SIGTERM handlers
    (the scripts' main() set SIGTERM's) are put back; a thread, a child process, a working folder or an
    environment variable left changed fails the test that left it."""
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    own = ("PYTEST_CURRENT_TEST", "TORCHINDUCTOR_CACHE_DIR")   # pytest's, torch's (set once, on first use)
    environ = lambda: {k: v for k, v in os.environ.items() if k not in own}
    threads, children, cwd, env = set(threading.enumerate()), _children(), os.getcwd(), environ()
    yield
    for s, h in handlers.items():
        signal.signal(s, h)
    assert not set(threading.enumerate()) - threads, "a thread left running"
    assert not _children() - children, f"child processes left running: {_children() - children}"
    assert os.getcwd() == cwd, "the working folder left changed"
    changed = {k for k in env.keys() | environ().keys() if env.get(k) != environ().get(k)}
    assert not changed, f"environment variables left changed: {sorted(changed)}"

def pytest_terminal_summary(terminalreporter, config):
    """pytest-randomly shuffles the tests (and seeds random, numpy) anew each run: its seed replays it."""
    if config.pluginmanager.hasplugin("randomly"):
        seed = config.option.randomly_seed
        terminalreporter.write_line(f"shuffled: this order again with --randomly-seed={seed}")
