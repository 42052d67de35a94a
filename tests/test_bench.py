"""bench.py stays runnable: every scan form it times agrees on its inputs (small T, CPU), and the
training-step timing reports a sane row for a tiny preset and a one-line error for an unknown one."""
import argparse

import pytest
import torch

import bench
import model


def test_bench_inputs_run_through_every_form_and_agree():
    for name, (naive, chunked, triton_fn) in bench.SCANS.items():
        inputs, h0 = bench.scan_inputs(name, 37)
        y1, s1 = naive(*inputs, initial_state=h0)
        y2, s2 = chunked(*inputs, initial_state=h0)
        torch.testing.assert_close(y1, y2, atol=2e-3, rtol=2e-3, msg=name)
        torch.testing.assert_close(s1, s2, atol=2e-3, rtol=2e-3, msg=name)


def test_bench_scans_table(capsys):
    args = argparse.Namespace(lengths=[16], repeats=1, triton_interpret=False, bf16=False, scan_batch=1,
                              paper_shapes=False)
    rows = bench.bench_scans(args, torch.device("cpu"))
    assert [r["scan"] for r in rows] == list(bench.SCANS)
    assert all(r["naive"] > 0 and r["chunked"] > 0 and r["triton"] is None for r in rows)
    assert all(r["max_rel_diff"] < 1e-4 for r in rows)  # the chunked form agrees with the loop
    assert "speed-up" in capsys.readouterr().out


def train_args(presets, **kw):
    return argparse.Namespace(**{**dict(presets=presets, forms="auto", seq_len=32, batch_size=2, vocab_size=257,
                                        steps=1, tokens=1e6), **kw})


def test_bench_train_row(capsys):
    rows = bench.bench_train(train_args("mamba2:tiny"), torch.device("cpu"))
    assert len(rows) == 1
    r = rows[0]
    lm = model.LM(model.make_config("mamba2", "tiny", vocab_size=257))
    # the embedding and the head are tied: counted once, as parameters() does
    assert r["params"] == lm.num_params() == sum(p.numel() for p in lm.parameters())
    assert r["preset"] == "mamba2:tiny" and 0 < r["best_s"] <= r["median_s"]
    assert r["tokens_per_s"] == pytest.approx(2 * 32 / r["best_s"])
    assert r["budget_h"] == pytest.approx(1e6 / r["tokens_per_s"] / 3600)
    assert r["peak_gb"] is None  # CUDA only
    assert "tokens/s" in capsys.readouterr().out


@pytest.mark.parametrize("preset, message", [("mamba2:9b", "unknown arch or size mamba2:9b"),
                                             ("lstm:45m", "unknown arch or size lstm:45m"),
                                             ("mamba2", "not arch:size")])
def test_bench_train_bad_preset_is_one_line(preset, message, capsys):
    with pytest.raises(ValueError, match=message):
        bench.bench_train(train_args(f"mamba2:tiny,{preset}"), torch.device("cpu"))
    assert "tokens/s" not in capsys.readouterr().out  # checked before anything was timed
    with pytest.raises(SystemExit) as e:
        bench.main(["--what", "train", "--device", "cpu", "--presets", preset])
    assert str(e.value).startswith("error: ") and message in str(e.value) and "\n" not in str(e.value)


def test_bench_eval_times_agreeing_forms(capsys):
    args = argparse.Namespace(eval_lengths=[64, 32], effrem_len=24, repeats=1)
    r = bench.bench_eval(args, torch.device("cpu"))
    assert r["max_abs_diff"] < 1e-6 and all(s > 0 for s in r["effrem_s"])
    assert [row["tokens"] for row in r["ppl"]] == [32, 64]  # shortest first: a flat peak means no growth
    assert "one forward per cut" in capsys.readouterr().out
