"""Where the initial state of each training sequence comes from (the paper's Section 4).

Trained only from h = 0 on length-T_train sequences, a model sees only states reachable in T_train steps from
zero; past T_train it meets states it never learned to read (the "unexplored states hypothesis"). The fix:
train from states like those of long sequences. Each strategy answers "what is this batch's initial state?":

    zero    the usual h = 0                                                     (the baseline)
    random  iid N(0, sigma^2) in every layer's matrix state, one sigma for all   (Random Noise)
    fitted  iid Gaussian per layer and head, mean/variance fitted to final states (Fitted Noise)
    sp      the previous batch's final states, detached; rows reset with prob p  (State Passing)
    tbtt    the final state of the previous chunk of the SAME document          (TBTT)

A layer's state is the matrix state "h" plus its short memory: Mamba's "conv" window, RWKV's token shift
("shift", "ffn_shift"). random/fitted put noise on "h" only, the rest stays zero: the paper models the matrix
state's distribution, and a conv window / token shift is just the last inputs, where noise is no plausible
value. sp/tbtt carry the whole final state, one the model reaches. Evaluation starts from zero."""
from functools import partial

import torch

from plumbing.files import is_int, require
from plumbing.strategy_options import check_options

class Zero:
    """The baseline: every training sequence starts from h = 0."""

    def __init__(self, lm, batch_size, **_):
        """Nothing to hold."""
    def initial_state(self, batch):
        """h_{-1} = 0: None, which the model reads as its zero state."""
    def observe(self, final_state):
        """Nothing: h_T is not used."""
    def state_dict(self):
        """-> {}: nothing to save."""
        return {}
    def load_state_dict(self, d):
        """Nothing to restore."""

class Noise:
    """Random Noise: mu = 0, var = sigma^2 in all layers and heads, never updated (App. F: tune sigma).
    Fitted Noise (fit=True): mu = var = 0 at first (the first batch starts from zero), then after every
    batch an exponential moving average of Mean/Var per head over the batch and the head's state dims."""

    def __init__(self, lm, batch_size, sigma=0.1, fit=False, seed=0, **_):
        self.lm = lm
        self.batch_size = batch_size
        self.fit = fit
        self.gen = torch.Generator().manual_seed(seed)
        self.mu = [torch.zeros(layer["h"].shape[1]) for layer in lm.zero_state(1)]   # [heads] per layer
        self.var = [torch.full_like(mu, 0.0 if fit else sigma ** 2) for mu in self.mu]

    def initial_state(self, batch):
        """h_{-1} ~ N(mu, var) iid, per layer and head (dim 1 of "h"); conv window / token shift stay 0."""
        state = self.lm.zero_state(self.batch_size)
        for layer, mu, var in zip(state, self.mu, self.var):
            h = layer["h"]
            shape = [1, h.shape[1]] + [1] * (h.dim() - 2)  # broadcast a per-head value over the state dims
            noise = torch.randn(h.shape, generator=self.gen)
            layer["h"] = (mu.view(shape) + var.sqrt().view(shape) * noise).to(h.device)
        return state

    def observe(self, final_state):
        """Fitted: mu <- 0.9 * Mean(h_T) + 0.1 * mu and var <- 0.9 * Var(h_T) + 0.1 * var; random: nothing."""
        if not self.fit:
            return
        for i, layer in enumerate(final_state):
            h = layer["h"].detach().float().cpu().transpose(0, 1).flatten(1)  # [heads, batch * state dims]
            self.mu[i] = 0.9 * h.mean(1) + 0.1 * self.mu[i]
            self.var[i] = 0.9 * h.var(1, unbiased=False) + 0.1 * self.var[i]

    def state_dict(self):
        """-> mu, var and the noise generator: a resumed run draws the h_{-1} it would have drawn."""
        return {"gen": self.gen.get_state(), "mu": self.mu, "var": self.var}

    def load_state_dict(self, d):
        """Restores state_dict()'s mu, var and generator, on the CPU where the noise is drawn."""
        self.gen.set_state(d["gen"].cpu())
        self.mu = [t.cpu() for t in d["mu"]]
        self.var = [t.cpu() for t in d["var"]]

class PassedState:
    """State Passing and TBTT: a batch starts from the previous batch's final states, detached (the history
    accumulates in the forward pass only; gradients stay inside the batch). Which rows restart from zero:
      sp    rows are unrelated sequences (shuffled windows); each is reset with probability p_reset,
            so the model keeps seeing the zero state it is evaluated from.
      tbtt  row r reads one document in consecutive chunks (data.DocumentStreams), chunk k after
            chunk k-1; a row that starts a new document (batch.new_doc) starts from zero."""

    def __init__(self, lm, batch_size, p_reset=0.1, seed=0, by_document=False, **_):
        self.batch_size = batch_size
        self.p_reset = p_reset
        self.by_document = by_document
        self.gen = torch.Generator().manual_seed(seed)
        self.passed = None  # final state of the previous batch

    def initial_state(self, batch):
        """h_{-1} = the previous batch's h_T, zero in the rows reset (sp) or starting a document (tbtt)."""
        if self.passed is None:  # the first batch: the zero state
            return None
        if self.by_document:
            keep = ~batch.new_doc
        else:
            keep = torch.rand(self.batch_size, generator=self.gen) >= self.p_reset
        return [{k: v * keep.to(v).view(-1, *[1] * (v.dim() - 1)) for k, v in layer.items()}
                for layer in self.passed]

    def observe(self, final_state):
        """Keeps h_T, every layer's whole state detached in float32, as the next batch's h_{-1}."""
        self.passed = [{k: v.detach().float() for k, v in layer.items()} for layer in final_state]

    def state_dict(self):
        """-> the passed h_T and the reset generator: a resumed run continues from the same states."""
        return {"gen": self.gen.get_state(), "passed": self.passed}

    def load_state_dict(self, d):
        """Restores state_dict()'s passed h_T and reset generator."""
        self.gen.set_state(d["gen"].cpu())
        self.passed = d["passed"]

# the names of strategy_options.OPTIONS, in its order
STRATEGIES = {"zero": Zero, "random": Noise, "fitted": partial(Noise, fit=True), "sp": PassedState,
              "tbtt": partial(PassedState, by_document=True)}

def make_strategy(name, lm, batch_size, **options):
    """-> the strategy of --init-state `name` (STRATEGIES), for batches of batch_size rows of lm's state;
    options: strategy_options.OPTIONS[name]'s (sigma: random's, p_reset: sp's; seed), each checked
    (check_options)."""
    check_options(name, **options)
    require(is_int(batch_size), f"--batch-size must be a positive integer, got {batch_size!r}")
    options = {k: int(v) if k == "seed" else float(v) for k, v in options.items()}   # numpy's: torch's seed
    return STRATEGIES[name](lm, int(batch_size), **options)
