"""bench.py's inputs: random inputs of each scan in bench.SCANS, and a non-zero initial state, at a small shape
or at one layer of the paper's sizes. A reader can skip this file: what is timed is bench.py's."""
import torch
import torch.nn.functional as F

def scan_inputs(name, T, b=1, seed=0, paper=False):
    """Random inputs and a non-zero initial state; paper=True: one layer of the paper's 130m / 70m models."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)
    A = lambda *s: -torch.rand(*s, generator=g) - 0.5  # A < 0
    if name == "ssd (mamba2)":
        h, p, n = (24, 64, 128) if paper else (4, 64, 64)
        return (r(b, T, h, p), F.softplus(r(b, T, h) - 2), A(h), r(b, T, 1, n), r(b, T, 1, n)), r(b, h, p, n)
    if name == "selective (mamba1)":
        d, n = (1536, 16) if paper else (256, 16)
        return (r(b, T, d), F.softplus(r(b, T, d) - 2), A(d, n), r(b, T, n), r(b, T, n)), r(b, d, n)
    if name == "gated deltanet":   # unit keys and queries as the layer's L2 norm makes them
        h, dk, dv = (3, 128, 256) if paper else (4, 64, 64)
        q = F.normalize(r(b, T, h, dk), dim=-1)
        k = F.normalize(r(b, T, h, dk), dim=-1)
        beta = torch.sigmoid(r(b, T, h))
        return (q, k, r(b, T, h, dv), F.logsigmoid(r(b, T, h) + 3), beta), r(b, h, dk, dv)
    h, dk, dv = ((4, 64, 128) if name == "gla" else (8, 32, 64)) if paper else (4, 64, 64)
    q, k, v = r(b, T, h, dk), r(b, T, h, dk) * dk ** -0.5, r(b, T, h, dv)
    g_log = F.logsigmoid(r(b, T, h, dk) + 3)  # per-channel log decay, mostly near 0
    return ((q, k, v, g_log) if name == "gla" else (q, k, v, g_log, r(h, dk) * 0.1)), r(b, h, dk, dv)
