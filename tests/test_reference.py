"""Our loader of official Mamba checkpoints against an independent implementation: Hugging Face transformers.

tests/fixtures/hf_mamba1/, hf_mamba2/: a tiny random checkpoint in state-spaces/mamba's layout; reference.pt:
the logits transformers' MambaForCausalLM / Mamba2ForCausalLM compute from its weights (float32, CPU, pure
torch) in one call and in two calls carrying the state through its cache. tests/fixtures/make_hf_reference.py
wrote them (its docstring: the command, the version); transformers is not needed here. Measured (transformers
5.24.0, torch 2.13 CPU): max |ours - HF| over logits reaching |27| is 5.7e-6 (Mamba-1), 3.8e-6 (Mamba-2), one
pass or two, either scan: tolerances of 1e-4. Dropping the carried state moves the second pass by > 10.
"""
import os

import pytest
import torch

import model

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")

# impl "auto": the chunked scans (on the CPU); "naive": the step-by-step loops, the definition
@pytest.mark.parametrize("impl", ["auto", "naive"])
@pytest.mark.parametrize("name,arch", [("hf_mamba1", "mamba1"), ("hf_mamba2", "mamba2")])
def test_official_checkpoint_matches_transformers(name, arch, impl):
    path = os.path.join(FIXTURES, name)
    ref = torch.load(os.path.join(path, "reference.pt"), weights_only=True)
    lm = model.set_scan_impl(model.from_pretrained(path), impl)  # the official path: no ckpt.pt there
    assert lm.cfg.arch == arch and lm.cfg.vocab_size == ref["logits_single"].shape[-1]
    x, split = ref["tokens"], ref["split"]
    with torch.no_grad():
        single, _ = lm(x)
        first, state = lm(x[:, :split])
        rest, _ = lm(x[:, split:], state)
        rest_from_zero, _ = lm(x[:, split:])
    tol = dict(atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(single, ref["logits_single"], **tol)
    torch.testing.assert_close(torch.cat([first, rest], dim=1), ref["logits_two_pass"], **tol)
    # the two-pass check has teeth: without the carried state the second pass is far off the reference
    assert (rest_from_zero - ref["logits_two_pass"][:, split:]).abs().max() > 1.0
