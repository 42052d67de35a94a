"""bench.py stays runnable: its timed forms agree (CPU), a sane training row, one line for a bad preset."""
import argparse

import pytest
import torch

import bench
import model

def test_bench_scans_and_eval_time_agreeing_forms(capsys, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # conftest's (scan tests): no Triton column
    args = argparse.Namespace(lengths=[37], repeats=1, bf16=False, scan_batch=1, paper_shapes=False)
    rows = bench.bench_scans(args, torch.device("cpu"))
    assert [r["scan"] for r in rows] == list(bench.SCANS)
    assert all(r["naive_ms"] > 0 and r["chunked_ms"] > 0 and r["triton_ms"] is None for r in rows)
    assert all(r["diff"] < 1e-4 for r in rows)  # the chunked form agrees with the loop
    assert "speed-up" in capsys.readouterr().out
    r = bench.bench_eval(argparse.Namespace(repeats=1), torch.device("cpu"), lengths=(64, 32), T=24)
    assert r["max_abs_diff"] < 1e-6 and all(s > 0 for s in r["effrem_s"])
    assert [row["tokens"] for row in r["ppl"]] == [32, 64]  # shortest first: a flat peak means no growth
    assert "one forward per cut" in capsys.readouterr().out

def test_bench_train_row(capsys):
    args = argparse.Namespace(presets="mamba2:tiny", forms="auto", seq_len=32, batch_size=2, repeats=1)
    (r,) = bench.bench_train(args, torch.device("cpu"), vocab_size=257)
    lm = model.LM(model.make_config("mamba2", "tiny", vocab_size=257))
    # the embedding and the head are tied: counted once, as parameters() does
    assert r["params"] == lm.num_params() == sum(p.numel() for p in lm.parameters())
    assert r["preset"] == "mamba2:tiny" and 0 < r["best_s"] <= r["median_s"] and r["peak_gb"] is None
    assert r["tokens_per_s"] == pytest.approx(2 * 32 / r["best_s"])
    assert "tokens/s" in capsys.readouterr().out

@pytest.mark.parametrize("preset", ["mamba2:9b", "lstm:45m", "mamba2"])
def test_bench_train_bad_preset_is_one_line(preset, capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["--what", "train", "--device", "cpu", "--presets", f"mamba2:tiny,{preset}"])
    assert str(e.value).startswith("error: unknown arch or size") and "\n" not in str(e.value)
    assert "tokens/s" not in capsys.readouterr().out  # checked before anything was timed

def test_times_drops_the_warm_up_and_sorts_and_a_row_reports_the_best_call(monkeypatch):
    clock, costs = [0.0], iter([5.0, 3.0, 1.0, 2.0])   # seconds of the warm-up call, then of 3 timed calls

    def call():
        clock[0] += next(costs)
    monkeypatch.setattr(bench.time, "perf_counter", lambda: clock[0])
    assert bench.times(call, 3, torch.device("cpu"))[0] == [1.0, 2.0, 3.0]
    monkeypatch.setattr(bench, "times", lambda fn, repeats, device: ([1.0, 2.0, 4.0], 0))   # as times gives
    args = argparse.Namespace(presets="mamba2:tiny", forms="auto", seq_len=32, batch_size=2, repeats=3)
    (r,) = bench.bench_train(args, torch.device("cpu"), vocab_size=257)
    assert (r["best_s"], r["median_s"], r["tokens_per_s"]) == (1.0, 2.0, 2 * 32 / 1.0)

def error_of(argv, capsys):   # bench.main's one line: its SystemExit's text, or argparse's on stderr (exit 2)
    with pytest.raises(SystemExit) as e:
        bench.main(["--device", "cpu", *argv])
    out, err = capsys.readouterr()
    message = err if e.value.code == 2 else f"{e.value}\n"
    assert message.startswith("error: ") and message.count("\n") == 1 and not out   # before anything ran
    return message

@pytest.mark.parametrize("argv,says", [
    (["--lengths", "16", "0"], "--lengths [16, 0]: need 1 to 2**31 - 1"), (["--repeats", "-1"], "--repeats"),
    (["--scan-batch", "99999999999999999999"], "--scan-batch 9"), (["--seq-len", "2147483648"], "--seq-len"),
    (["--batch-size", "0"], "--batch-size 0"),
    (["--lengths", "nan"], "argument --lengths: invalid int"), (["--what", "x"], "argument --what: invalid"),
    (["--lengths", "16", "32", "16"], "--lengths names a value twice ([16, 32, 16]): name each once"),
    (["--presets", "mamba2:tiny, mamba2:tiny"], "--presets names a value twice"),
    (["--forms", "naive,chunked,naive"], "--forms names a value twice")])
def test_bad_flags_are_one_line_before_anything_is_timed(argv, says, capsys, monkeypatch):
    for name in "bench_scans", "bench_eval", "bench_train":   # a check missed fails at once
        monkeypatch.setattr(bench, name, lambda *a: pytest.fail("a bench ran"))
    assert error_of(argv, capsys).startswith(f"error: {says}")

def test_sizes_past_memory_end_in_one_line_and_other_errors_stay_errors(monkeypatch):
    with pytest.raises(SystemExit, match=r"^error: scans: out of memory \(Storage size calculation overflow"):
        bench.main(["--device", "cpu", "--lengths", str(2 ** 31 - 1), "--scan-batch", str(2 ** 31 - 1)])
    for error in torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"), MemoryError(), \
            RuntimeError("a bug"):   # not read as out of memory
        monkeypatch.setattr(bench, "bench_eval", lambda *a: (_ for _ in ()).throw(error))
        with pytest.raises(RuntimeError if "bug" in str(error) else SystemExit) as e:
            bench.main(["--device", "cpu", "--what", "eval"])
        assert "bug" in str(error) or str(e.value).startswith("error: eval: out of memory (")
