"""The code docs/EXERCISES.md has students write that the rest of the repo does not need: exercise 9's mixer
and exercise 10's predictions and verdict table (`python docs/kit.py student OUT` hands them out as stubs).

    python docs/course.py markov=out/mk/eval sigma=out/sigma ttrain=out/ttrain   # exercise 10's table
"""
import json
import os
import sys

import torch
import torch.nn as nn

# ==== Exercise 9: a mixer with an exact state split ====
class DiagonalRNN(nn.Module):
    """A diagonal linear RNN with a token shift, usable by model.LM (register it in model.ARCHS):
        u_t = in_proj([x_t, x_{t-1}])      x_{-1} = state["shift"]
        h_t = a * h_{t-1} + u_t            a = exp(-exp(log_rate)) in (0, 1), one per state channel
        y_t = out_proj(h_t)
    x [b, t, d_model] -> y [b, t, d_model] and the state {"h": h_{t-1} [b, d_state], "shift": x_{t-1}}."""

    def __init__(self, d_model, d_state=32, layer_idx=0):
        super().__init__()
        self.d_model, self.d_state = d_model, d_state
        self.in_proj = nn.Linear(2 * d_model, d_state, bias=False)
        self.log_rate = nn.Parameter(torch.linspace(-5.0, 0.0, d_state))  # a from 0.993 down to 0.37
        self.out_proj = nn.Linear(d_state, d_model, bias=False)

    def zero_state(self, batch_size, device=None):
        """The state before any token: {"h": zeros [b, d_state], "shift": zeros [b, d_model]}, float32."""
        return {"h": torch.zeros(batch_size, self.d_state, device=device),
                "shift": torch.zeros(batch_size, self.d_model, device=device)}

    def forward(self, x, state=None):
        """(y, the state after x); state None: zero_state. x in pieces, the state carried, equals one pass."""
        state = self.zero_state(len(x), x.device) if state is None else state
        x_prev = torch.cat([state["shift"][:, None], x[:, :-1]], 1)  # [b, t, d_model]
        u = self.in_proj(torch.cat([x, x_prev], -1))  # [b, t, d_state]
        decay = torch.exp(-torch.exp(self.log_rate))
        h, hs = state["h"], []
        for t in range(x.shape[1]):
            h = decay * h + u[:, t]
            hs.append(h)
        return self.out_proj(torch.stack(hs, 1)), {"h": h, "shift": x[:, -1]}

# ==== Exercise 10: predict, then measure ====
# experiment: (the reference label, the labels whose last-bucket NLL minus the reference's you predict)
EXPERIMENTS = {"markov": ("control", ["base", "streams", "SP", "TBTT"]),
               "sigma": ("control", ["s0.01", "s0.1", "s1", "fitted"]),
               "ttrain": ("T32", ["T16", "T64", "T32-long"])}
SIGNS = ("-", "0", "+")  # better than the reference, no difference, worse

def predictions():
    """BEFORE running anything: {experiment: {label: sign}} for every experiment and label of EXPERIMENTS,
    the sign of the run's NLL minus the reference's in the last bucket. (Here: one reading of the paper.)"""
    return {"markov": {"base": "0", "streams": "0", "SP": "-", "TBTT": "-"},
            "sigma": {"s0.01": "0", "s0.1": "-", "s1": "+", "fitted": "-"},
            "ttrain": {"T16": "+", "T64": "-", "T32-long": "+"}}

def verdict_rows(report, predicted):
    """One row per model of an eval.json report that has a paired difference to the reference ("diff"), in
    report order: (label, verdict, PPL, diff, s.e., measured sign, predicted sign), in the last bucket."""
    rows = []
    for m in report["models"]:
        if "diff" not in m:
            continue
        diff, sem = m["diff"]["nll"][-1], m["diff"]["nll_sem"][-1]
        measured = "-" if diff + 2 * sem < 0 else "+" if diff - 2 * sem > 0 else "0"
        verdict = f"{m['verdict']['generalizes_to']}{'+' if m['verdict']['censored'] else ''}"
        rows.append((m["label"], verdict, m["ppl"]["buckets"]["ppl"][-1], diff, sem, measured,
                     predicted.get(m["label"])))
    return rows

def main(argv):
    """Prints each experiment's verdict table from NAME=DIR (DIR/eval.json, or the file) and the score."""
    made, right, total = predictions(), 0, 0
    for item in argv:
        name, _, path = item.partition("=")
        if name not in EXPERIMENTS or not path:
            sys.exit(f"error: {item!r}: pass NAME=DIR, NAME one of {', '.join(EXPERIMENTS)}")
        path = os.path.join(path, "eval.json") if os.path.isdir(path) else path
        if not os.path.isfile(path):
            sys.exit(f"error: no {path}: run the experiment's evaluate.py command first")
        with open(path) as f:
            rows = verdict_rows(json.load(f), made[name])
        print(f"\n{name} (each run minus {EXPERIMENTS[name][0]}, last bucket, nats; sign: 2 s.e.)")
        print("| run | verdict | PPL | - reference | measured | predicted |")
        print("| --- | ---: | ---: | ---: | :-: | :-: |")
        for label, verdict, ppl, diff, sem, measured, guess in rows:
            print(f"| {label} | {verdict} | {ppl:.3f} | {diff:+.3f} +- {sem:.3f} | {measured} | {guess} |")
        right += sum(r[5] == r[6] for r in rows)
        total += len(rows)
    print(f"\npredictions right: {right} of {total}")

if __name__ == "__main__":
    main(sys.argv[1:])
