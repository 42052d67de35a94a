"""The spec of data.load_data's in-context Markov process, "markov:k=8,alpha=0.3,...": its options, their
defaults and checks, and the canonical name a run records."""
import math

from plumbing.files import DataError, require

MARKOV_DEFAULTS = dict(k=8, alpha=0.3, doc_len=4096, docs=2048, val_docs=256, shared=0.0)

def parse(spec):
    """"k=8,alpha=0.3,..." (after "markov:"; some of MARKOV_DEFAULTS, each once) -> all the process's
    parameters (MARKOV_DEFAULTS' keys and types), checked."""
    cfg = dict(MARKOV_DEFAULTS)
    usage = ",".join(f"{k}={v}" for k, v in MARKOV_DEFAULTS.items())
    items = [item.split("=") for item in spec.replace(" ", "").split(",") if item]
    try:   # an unknown or repeated key, a missing "=" or a value of the wrong type
        cfg.update({k: type(cfg[k])(v) for k, v in items})
        require(len(dict(items)) == len(items), "")
    except (KeyError, ValueError):
        raise DataError(f"markov: bad options {spec!r}: use some of {usage}, each once") from None
    k = cfg["k"]
    docs = (cfg["docs"], cfg["val_docs"])
    require(2 <= k and max(docs) * k * k <= 1 << 27 and 0 < cfg["alpha"] < math.inf and
            0 <= cfg["shared"] < math.inf and cfg["doc_len"] >= 2 and min(docs) >= 1,
            f"markov: need 2 <= k, docs x k x k <= 2**27 (1 GiB of transitions), finite alpha > 0, "
            f"shared >= 0, doc_len >= 2, docs, val_docs >= 1; got {spec!r}")
    return cfg

def name(cfg):
    """parse's parameters -> "markov:k=8,...", every key (shared only if > 0): the data name a run records."""
    shown = [f"{key}={value}" for key, value in cfg.items() if key != "shared" or cfg["shared"]]
    return "markov:" + ",".join(shown)
