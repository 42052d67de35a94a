"""
Where the initial state of each training sequence comes from (the paper's Section 4).

A model trained only from h = 0 on sequences of length T_train only ever sees the states reachable
in T_train steps from zero; past T_train it meets states it never learned to read (the "unexplored
states hypothesis"). The fix is to start training sequences from states that look like the states
of long sequences. Each strategy below answers one question, "what is this batch's initial state?":

    zero    the usual h = 0                                                     (the baseline)
    random  iid N(0, sigma^2) in every layer's matrix state, one sigma for all   (Random Noise)
    fitted  iid Gaussian per layer and head, mean/variance fitted to final states (Fitted Noise)
    sp      the previous batch's final states, detached; rows reset with prob p  (State Passing)
    tbtt    the final state of the previous chunk of the SAME document          (TBTT)

Interface used by train.py (duck-typed, no base class):
    s = STRATEGIES[name](lm, batch_size, **options)
    state = s.initial_state(batch)     # before the forward; None means zeros
    s.observe(final_state)             # after the forward
    s.state_dict() / s.load_state_dict(d)   # so a resumed run continues exactly

A layer's state is the matrix state "h" plus the short memory of the layer ("conv" window of Mamba,
"shift"/"ffn_shift" token shift of RWKV). random/fitted put noise on "h" only and keep the rest at
zero: the paper models the distribution of the matrix state, and a conv window / token shift is just
the last input tokens, for which noise is not a plausible value. sp/tbtt carry everything, because
the whole final state is a state the model really reaches.

Evaluation never uses these: it always starts from the zero state (evaluate.py).
"""
import torch


class Zero:
    """The baseline: every training sequence starts from h = 0."""

    def __init__(self, lm, batch_size, **_):
        pass

    def initial_state(self, batch):
        return None

    def observe(self, final_state):
        pass

    def state_dict(self):
        return {}

    def load_state_dict(self, d):
        pass


class RandomNoise:
    """h_{-1} ~ N(0, sigma^2) iid on every layer's matrix state; one sigma for all layers and heads.
    The paper (App. F) finds sigma must be tuned: too small does nothing, too large hurts."""

    def __init__(self, lm, batch_size, sigma=0.1, seed=0, **_):
        if not sigma > 0:
            raise ValueError(f"--sigma must be > 0 for random initial states, got {sigma}")
        self.lm, self.batch_size, self.sigma = lm, batch_size, sigma
        self.gen = torch.Generator().manual_seed(seed)

    def initial_state(self, batch):
        state = self.lm.zero_state(self.batch_size)
        for layer in state:
            h = layer["h"]
            layer["h"] = (self.sigma * torch.randn(h.shape, generator=self.gen)).to(h.device)
        return state

    def observe(self, final_state):
        pass

    def state_dict(self):
        return {"gen": self.gen.get_state()}

    def load_state_dict(self, d):
        self.gen.set_state(d["gen"])


class FittedNoise:
    """h_{-1} ~ N(mu, var) iid, with mu and var per layer and per head, fitted to the final states
    of the training batches by an exponential moving average in which the NEW observation weighs 0.9:
        mu  <- 0.9 * Mean(h_T) + 0.1 * mu
        var <- 0.9 * Var(h_T)  + 0.1 * var
    Mean/Var are taken per head over the batch and the head's state dims (dim 1 of "h" is the head).
    Before the first observation mu = var = 0, so the first batch starts from zero."""

    def __init__(self, lm, batch_size, seed=0, momentum=0.1, **_):
        self.lm, self.batch_size, self.momentum = lm, batch_size, momentum
        self.gen = torch.Generator().manual_seed(seed)
        n_heads = [layer["h"].shape[1] for layer in lm.zero_state(1)]
        self.mu = [torch.zeros(h) for h in n_heads]
        self.var = [torch.zeros(h) for h in n_heads]

    def initial_state(self, batch):
        state = self.lm.zero_state(self.batch_size)
        for layer, mu, var in zip(state, self.mu, self.var):
            h = layer["h"]
            shape = [1, h.shape[1]] + [1] * (h.dim() - 2)  # broadcast a per-head value over the state dims
            noise = torch.randn(h.shape, generator=self.gen)
            layer["h"] = (mu.view(shape) + var.sqrt().view(shape) * noise).to(h.device)
        return state

    def observe(self, final_state):
        m = self.momentum
        for i, layer in enumerate(final_state):
            h = layer["h"].detach().float().cpu().transpose(0, 1).flatten(1)  # [heads, batch * state dims]
            self.mu[i] = (1 - m) * h.mean(1) + m * self.mu[i]
            self.var[i] = (1 - m) * h.var(1, unbiased=False) + m * self.var[i]

    def state_dict(self):
        return {"gen": self.gen.get_state(), "mu": self.mu, "var": self.var}

    def load_state_dict(self, d):
        self.gen.set_state(d["gen"])
        self.mu, self.var = list(d["mu"]), list(d["var"])


class StatePassing:
    """The final states of the previous batch (other, unrelated sequences: windows are random and
    shuffled) become this batch's initial states, detached: the history accumulates across batches
    in the forward pass only, gradients stay inside the batch. Each row is reset to zero with
    probability p_reset, so the model keeps seeing the zero state it is evaluated from."""

    def __init__(self, lm, batch_size, p_reset=0.1, seed=0, **_):
        if not 0 <= p_reset <= 1:
            raise ValueError(f"--p-reset must be in [0, 1], got {p_reset}")
        self.lm, self.batch_size, self.p_reset = lm, batch_size, p_reset
        self.gen = torch.Generator().manual_seed(seed)
        self.passed = None  # final state of the previous batch

    def initial_state(self, batch):
        if self.passed is None:
            return None
        keep = (torch.rand(self.batch_size, generator=self.gen) >= self.p_reset).float()
        return reset_rows(self.passed, keep)

    def observe(self, final_state):
        self.passed = [{k: v.detach().float() for k, v in layer.items()} for layer in final_state]

    def state_dict(self):
        return {"gen": self.gen.get_state(), "passed": self.passed}

    def load_state_dict(self, d):
        self.gen.set_state(d["gen"])
        self.passed = d["passed"]


class TBTT:
    """Truncated backpropagation through time: batch row i reads one long document as consecutive
    chunks (tasks.DocumentStreams); chunk k starts from the final state of chunk k-1 of the SAME
    document, detached (gradients stop at chunk boundaries). Rows that start a new document
    (batch["new_doc"]) start from zero."""

    def __init__(self, lm, batch_size, **_):
        self.lm, self.batch_size = lm, batch_size
        self.carried = None

    def initial_state(self, batch):
        if self.carried is None:
            return None
        keep = (~batch["new_doc"]).float()
        return reset_rows(self.carried, keep)

    def observe(self, final_state):
        self.carried = [{k: v.detach().float() for k, v in layer.items()} for layer in final_state]

    def state_dict(self):
        return {"carried": self.carried}

    def load_state_dict(self, d):
        self.carried = d["carried"]


STRATEGIES = {"zero": Zero, "random": RandomNoise, "fitted": FittedNoise, "sp": StatePassing, "tbtt": TBTT}


def make_strategy(name, lm, batch_size, **options):
    if name not in STRATEGIES:
        raise ValueError(f"unknown --init-state {name!r}: choose one of {', '.join(STRATEGIES)}")
    return STRATEGIES[name](lm, batch_size, **options)


def reset_rows(state, keep):
    """Multiply every state tensor by keep [b] (1 = keep the row's state, 0 = reset it to zero)."""
    out = []
    for layer in state:
        out.append({k: v * keep.to(v.device).view(-1, *([1] * (v.dim() - 1))) for k, v in layer.items()})
    return out
