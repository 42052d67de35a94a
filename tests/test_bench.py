"""bench.py stays runnable: every scan form it times agrees on its inputs (small T, CPU)."""
import argparse

import torch

import bench


def test_bench_inputs_run_through_every_form_and_agree():
    for name, (naive, chunked, triton_fn) in bench.scan_forms().items():
        inputs, h0 = bench.scan_inputs(name, 37)
        y1, s1 = naive(*inputs, initial_state=h0)
        y2, s2 = chunked(*inputs, initial_state=h0)
        torch.testing.assert_close(y1, y2, atol=2e-3, rtol=2e-3, msg=name)
        torch.testing.assert_close(s1, s2, atol=2e-3, rtol=2e-3, msg=name)


def test_bench_scans_table(capsys):
    args = argparse.Namespace(lengths=[16], repeats=1, triton_interpret=False)
    rows = bench.bench_scans(args, torch.device("cpu"))
    assert [r["scan"] for r in rows] == list(bench.scan_forms())
    assert all(r["naive"] > 0 and r["chunked"] > 0 and r["triton"] is None for r in rows)
    assert "speed-up" in capsys.readouterr().out
