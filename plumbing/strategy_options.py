"""The options of each --init-state strategy (interventions.py, the paper's Section 4) and their checks, in
the words of train.py's flags: the Python API (interventions.make_strategy) refuses what the command line
(plumbing/flags.py) refuses. A reader of the paper can skip this file."""
import math
import numbers

import torch

from plumbing.files import is_int, require

# the options each strategy reads; any other is refused, not ignored (seed: a run's, whether it draws or not)
OPTIONS = {"zero": ("seed",), "random": ("sigma", "seed"), "fitted": ("seed",), "sp": ("p_reset", "seed"),
           "tbtt": ("seed",)}
MIN_SIGMA = math.sqrt(torch.finfo(torch.float32).tiny)   # below: sigma^2 no normal float32 (at 1e-23: 0)

def check_options(name, **options):
    """Checks --init-state `name` and the options make_strategy would get: a bad one is a one-line DataError
    naming its flag and the fix (the words of train.py's flags, which plumbing/flags.py checks with it)."""
    require(isinstance(name, str) and name in OPTIONS,
            f"unknown --init-state {name!r}: choose one of {', '.join(OPTIONS)}")
    flag = lambda k: "--" + k.replace("_", "-")
    for k in options:
        require(k in OPTIONS[name], f"--init-state {name} takes no {flag(k)} (its options: "
                f"{', '.join(map(flag, OPTIONS[name]))}): leave {flag(k)} out")
    real = lambda x: isinstance(x, numbers.Real) and not isinstance(x, bool)
    if "sigma" in options:
        sigma = options["sigma"]
        require(real(sigma) and 0 < sigma <= 1e3, f"--sigma must be in (0, 1e3] (its variance in float32), "
                f"got {sigma!r}")
        require(sigma >= MIN_SIGMA, f"--sigma must be at least {MIN_SIGMA:.3g} (sigma^2 underflows in "
                f"float32 below), got {sigma!r}: it is the zero state: use --init-state zero or a larger "
                "--sigma")
    if "p_reset" in options:
        p = options["p_reset"]
        require(real(p) and 0 <= p <= 1, f"--p-reset must be a probability in [0, 1], got {p!r}")
    if "seed" in options:
        seed = options["seed"]
        require(is_int(seed, 0) and seed < 2 ** 63, f"--seed must be in [0, 2**63), got {seed!r}")
