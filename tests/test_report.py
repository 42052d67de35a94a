"""plumbing/report.py: where each curve's points lie on the x axis, in _curves, the printed table and the figures."""
import math

import matplotlib.figure
import numpy as np
import pytest

from plumbing import report

# buckets (lo, hi] of positions: a bucket holds contexts lo + 1 .. hi, drawn at their geometric middle
LO, HI = [0, 8, 16], [8, 16, 64]
MIDDLE = [math.sqrt(1 * 8), math.sqrt(9 * 16), math.sqrt(17 * 64)]   # 2.83, 12, 32.98
assert [round(x) for x in MIDDLE] == [3, 12, 33]   # (the table's cells: none is an edge or lo * hi's root)

def run(label="a", **extra):
    """A model's entry in eval.json with the ppl buckets above, the Bayes gap and a paired difference."""
    buckets = dict(lo=LO, hi=HI, ppl=[20.0, 2.5, 3.0], ppl_sem=[1.0, 0.1, 0.2], nll=[3.0, 0.9, 1.1])
    verdict = dict(generalizes_to=64, ratio=4.0, censored=True, ppl_short=2.5)
    diff = dict(nll=[0.0, 0.1, 0.2], nll_sem=[0.0, 0.01, 0.02], reference="b")
    gap = dict(nll=[0.5, 0.1, 0.3], nll_sem=[0.1, 0.01, 0.02])
    return dict(label=label, arch="mamba2", params=1000, t_train=16, ppl=dict(buckets=buckets),
                verdict=verdict, gap=gap, diff=diff, **extra)

@pytest.fixture
def figures(monkeypatch):
    """{file name: the Figure written there} of the figures report writes meanwhile."""
    saved, savefig = {}, matplotlib.figure.Figure.savefig
    def record(fig, path, **kw):
        saved[str(path).split("/")[-1].split(".")[0] + ".png"] = fig   # (written as NAME.png.PID.tmp)
        return savefig(fig, path, **kw)
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", record)
    return saved

def test_each_bucket_is_drawn_at_its_geometric_middle_and_the_other_curves_at_their_own_x():
    state = dict(positions=[0, 3, 15], std=[[[1.0, 2.0]] * 3], coverage=[[0.5, 0.9]])   # one layer, 2 heads
    effrem = dict(cuts=[1, 4, 16], mean=[0.0, 0.1, 0.5], sem=[0.0, 0.01, 0.05], T=64)
    curves = report._curves(run(state=state, effrem=effrem, copy=dict(lengths=[5, 10], char_mean=[1.0, 0.5],
                                                                      char_sem=[0.0, 0.1])))
    for name in ("ppl", "gap", "diff"):
        ((x, *_, line_at),) = curves[name]
        assert x == pytest.approx(MIDDLE, rel=1e-12) and line_at == 16
    ((x, y, _, legend, line_at),) = curves["state"]   # a position's context: position + 1 tokens
    assert list(x) == [1, 4, 16] and list(y) == [2.0] * 3 and legend == "a L0 h1 cov 0.9" and line_at == 16
    assert curves["effrem"][0][0] == [1, 4, 16] and curves["effrem"][0][4] == 64 - 16   # t, at T - T_train
    assert curves["copy"][0][0] == [5, 10] and curves["copy"][0][4] is False   # no T_train line

def test_the_table_and_the_figures_show_the_buckets_at_their_middle(tmp_path, capsys, figures):
    report.show(dict(models=[run("a"), run("b")], optimal=dict(ppl=[10.0, 2.0, 2.2])), str(tmp_path))
    out = capsys.readouterr().out
    header = f"\n  {'context length':<26}{3:>11}{12:>11}{33:>11}\n"
    assert out.count(header) == 3, out   # ppl, gap, diff: one header each, b under a's
    assert f"\n  {'a (T=64)':<26}{20:>11}{2.5:>11}{3:>11}\n" in out
    panels = figures["ppl.png"].axes
    assert [ax.get_title().split(" (")[0] for ax in panels] == ["Position-wise perplexity",
                                                                "Gap to the Bayes floor",
                                                                "Paired difference to the reference run"]
    legends = [["a (T=64)", "b (T=64)", "Bayes-optimal"], ["a", "b"], ["a - b", "b - b"]]
    for ax, legend in zip(panels, legends):   # every curve, the Bayes-optimal one too, at the middles
        curves = [line for line in ax.get_lines() if not line.get_label().startswith("_")]   # in the legend
        assert [line.get_label() for line in curves] == legend
        for line in curves:
            np.testing.assert_allclose(line.get_xdata(), MIDDLE, rtol=1e-12)
        dotted = [list(line.get_xdata()) for line in ax.get_lines() if line.get_linestyle() == ":"]
        assert dotted == [[16, 16]] * 2   # T_train, each run's

def test_over_seeds_draws_each_bucket_at_its_geometric_middle(tmp_path, figures):
    def seed(nll):
        buckets = dict(lo=LO, hi=HI, nll=nll, ppl=np.exp(nll).tolist())
        return dict(models=[dict(label="a", t_train=16, ppl=dict(buckets=buckets),
                                 verdict=dict(generalizes_to=64, censored=True))])
    assert report.over_seeds({"0": seed([3.0, 1.0, 2.0]), "1": seed([3.2, 1.1, 2.1])}, str(tmp_path)) == 0
    left = figures["seeds.png"].axes[0]
    lines = [line for line in left.get_lines() if line.get_linestyle() != ":"]   # each seed's, their mean
    assert len(lines) == 3
    for line in lines:
        np.testing.assert_allclose(line.get_xdata(), MIDDLE, rtol=1e-12)
    np.testing.assert_allclose(lines[2].get_ydata(), np.exp([3.1, 1.05, 2.05]), rtol=1e-12)
