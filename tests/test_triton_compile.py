"""Every Triton kernel compiles with the real compiler for NVIDIA sm_80 and sm_90 to a cubin, without a GPU
(the interpreter accepts code the compiler rejects). Run as a script (TRITON_INTERPRET unset), each layer's
Triton form runs with every launch replaced by a compile: the layers' shapes, dtypes and specialisations."""
import json
import multiprocessing
import os
import subprocess
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import model  # noqa: E402
from plumbing.scans import HAS_TRITON, tl, triton  # noqa: E402

TARGETS = (80, 90)
PAPER_SIZE = {"mamba2": "130m", "mamba1": "130m", "gla": "70m", "rwkv6": "70m",  # each is run at "tiny" too
              "gated_deltanet": "70m"}
JOBS, WHERE = {}, ["nowhere"]  # (kernel, target, specialisation) -> (WHERE at launch, compile arguments)

@triton.jit
def _broken_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    # Broken on purpose: the loop-carried `acc` starts as an int and becomes a float tensor. The
    # interpreter runs it; the compiler rejects it, and the test must see that.
    offs = tl.arange(0, BLOCK)
    acc = 0
    for i in range(n):
        acc += tl.load(x_ptr + i * BLOCK + offs)
    tl.store(y_ptr + offs, acc)

def record_instead_of_launch(self, *args, grid, warmup, **kwargs):
    """Replaces JITFunction.run: records, for each target, what the JIT would compile for this launch
    (the same signature, specialisation and options), and runs nothing."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature
    for cap in TARGETS:
        target = GPUTarget("cuda", cap, 32)
        backend = make_backend(target)
        binder = create_function_from_signature(self.signature, self.params, backend)
        bound, spec, options = binder(*args, **kwargs)
        options, signature, constexprs, attrs = self._pack_args(backend, kwargs, bound, spec, options)
        JOBS.setdefault((self.fn.__name__, f"sm_{cap}", f"{signature} {constexprs} {attrs}"),
                        (WHERE[0], ASTSource(self, signature, constexprs, attrs), target, options.__dict__))

def compile_job(i):
    where, source, target, options = list(JOBS.values())[i]
    try:
        cubin = triton.compile(source, target=target, options=options).asm["cubin"]
        return where, f"ok, cubin {len(cubin)} B"
    except Exception as e:  # noqa: BLE001 -- any compiler error is the finding
        return where, f"FAILED {type(e).__name__}: {(str(e).strip().splitlines() or [''])[-1]}"

def main():
    x = torch.zeros(1, 2, 1, 1)
    with pytest.raises(RuntimeError, match="CUDA"):  # without the interpreter, CPU tensors get a clear error
        model.ssm.ssd_triton(x, x[..., 0], x[0, 0, :, 0], x, x)
    triton.runtime.jit.JITFunction.run = record_instead_of_launch
    os.environ["TRITON_INTERPRET"] = "1"  # the kernels exist for the compiler: this only opens the CPU guard
    for arch in PAPER_SIZE:
        for size in ("tiny", PAPER_SIZE[arch]):
            lm = model.set_scan_impl(model.LM(model.make_config(arch, size, 64, n_layer=1)), "triton")
            for bf16 in (False, True):
                WHERE[0] = f"{arch} {size} {'bf16 autocast' if bf16 else 'fp32'}"
                with torch.no_grad(), torch.autocast("cpu", torch.bfloat16, enabled=bf16):
                    _, state = lm(torch.randint(0, 64, (2, 64)))  # from the zero state
                    _, state = lm(torch.randint(0, 64, (2, 64)), state)  # from a carried state
                    lm(torch.randint(0, 64, (2, 1)), state)  # one-token decoding
    WHERE[0] = "broken on purpose"
    _broken_kernel[(1,)](torch.zeros(48), torch.zeros(16), 3, BLOCK=16)
    with multiprocessing.get_context("fork").Pool(os.cpu_count()) as pool:  # the compiles are independent
        results = dict(zip(JOBS, pool.map(compile_job, range(len(JOBS)))))
    for (kernel, target, _), (where, status) in results.items():
        print(f"{kernel:28s} {target}  {where:24s} {status}", file=sys.stderr)
    print(json.dumps([[*k[:2], *v] for k, v in results.items()]))

@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_every_kernel_compiles_for_sm80_and_sm90(tmp_path):
    if os.environ.get("TRITON_INTERPRET") == "1":  # the interpreter (pytest on a CPU) runs the broken kernel
        y = torch.empty(16)
        _broken_kernel[(1,)](torch.arange(48.0), y, 3, BLOCK=16)
        assert torch.equal(y, torch.arange(48.0).view(3, 16).sum(0))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(tmp_path), TRITON_DEFAULT_FP_FUSION="1")  # compile afresh, as CI does
    r = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads(r.stdout.splitlines()[-1])  # [kernel, target, where launched, status] per compile
    broken = [status for kernel, _, _, status in rows if kernel == "_broken_kernel"]
    assert len(broken) == len(TARGETS) and all(s.startswith("FAILED") and "Loop-carried" in s for s in broken)
    for arch in PAPER_SIZE:  # every architecture launched its kernels, compiled for both targets
        assert {t for _, t, where, _ in rows if where.startswith(arch + " ")} == {f"sm_{c}" for c in TARGETS}
    failed = [row for row in rows if row[0] != "_broken_kernel" and not row[3].startswith("ok")]
    assert not failed, r.stderr[-3000:]

if __name__ == "__main__":
    main()
