"""Our loader of official Mamba checkpoints against an independent implementation: Hugging Face transformers.

tests/fixtures/hf_mamba1/, hf_mamba2/: a tiny random checkpoint in state-spaces/mamba's layout; reference.pt:
the logits transformers' MambaForCausalLM / Mamba2ForCausalLM compute from its weights (float32, CPU, pure
torch) in one call and in two calls carrying the state through its cache. tests/fixtures/make_hf_reference.py
wrote them (its docstring: the command, the version); transformers is not needed here. Measured (transformers
5.24.0, torch 2.13 CPU): max |ours - HF| over logits reaching |27| is 5.7e-6 (Mamba-1), 3.8e-6 (Mamba-2), one
pass or two, either scan: tolerances of 1e-4. Dropping the carried state moves the second pass by > 10.
Then the fixtures' config.json edited into what ssm.Mamba2 cannot build or another layer: a one-line error;
and each fixture exported again (official.export) is its own files, transformers' logits still.
"""
import json
import os
import shutil

import pytest
import torch

import model
from plumbing import checkpoints, official

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")

# impl "auto": the chunked scans (on the CPU); "naive": the step-by-step loops, the definition
@pytest.mark.parametrize("impl", ["auto", "naive"])
@pytest.mark.parametrize("name,arch", [("hf_mamba1", "mamba1"), ("hf_mamba2", "mamba2")])
def test_official_checkpoint_matches_transformers(name, arch, impl):
    path = os.path.join(FIXTURES, name)
    ref = torch.load(os.path.join(path, "reference.pt"), weights_only=True)
    lm = model.set_scan_impl(checkpoints.from_pretrained(path), impl)  # the official path: no ckpt.pt there
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

def edited_fixture(tmp_path, name, **ssm_cfg):
    """A copy of fixture `name` whose config.json's ssm_cfg has ssm_cfg's entries (None: removed)."""
    path = tmp_path / name
    shutil.copytree(os.path.join(FIXTURES, name), path)
    config = json.loads((path / "config.json").read_text())
    config["ssm_cfg"] = {k: v for k, v in {**config["ssm_cfg"], **ssm_cfg}.items() if v is not None}
    (path / "config.json").write_text(json.dumps(config))
    return str(path)

@pytest.mark.parametrize("name,ssm_cfg,match", [
    # d_model 48: the inner size expand * d_model is 96; mamba_ssm's default headdim 64 does not divide it
    ("hf_mamba2", dict(headdim=36), "ssm_cfg.headdim 36 does not divide expand \\* d_model = 96: set head"),
    ("hf_mamba2", dict(headdim=None), "ssm_cfg.headdim 64 does not divide expand \\* d_model = 96"),
    ("hf_mamba2", dict(ngroups=4), "ssm_cfg.ngroups 4 does not divide the 6 heads: set ngroups"),
    ("hf_mamba2", dict(headdim=0), "ssm_cfg.headdim 0"), ("hf_mamba2", dict(headdim="16"), "headdim '16'"),
    ("hf_mamba2", dict(expand=2.5), "ssm_cfg.expand 2.5"),
    ("hf_mamba2", dict(layer="Mamba3"), "ssm_cfg.layer 'Mamba3', not Mamba1 or Mamba2"),
    ("hf_mamba1", dict(layer="mamba2"), "ssm_cfg.layer 'mamba2', not Mamba1 or Mamba2"),
    ("hf_mamba1", dict(layer=None, headdim=36), "unexpected keyword argument 'headdim'")])
def test_an_official_config_this_repo_cannot_build_is_refused_in_one_line(tmp_path, name, ssm_cfg, match):
    # neither an assertion deep in ssm.Mamba2 nor another layer read silently as Mamba-1
    path = edited_fixture(tmp_path, name, **ssm_cfg)
    with pytest.raises(ValueError, match=match) as e:
        checkpoints.from_pretrained(path)
    assert "\n" not in str(e.value)

def test_an_official_config_with_its_defaults_spelled_out_loads_as_it_is(tmp_path):
    # mamba_ssm's defaults: Mamba-2's expand 2 and ngroups 1 (headdim 16 here); the layer Mamba1
    ref = checkpoints.from_pretrained(os.path.join(FIXTURES, "hf_mamba2"))
    lm = checkpoints.from_pretrained(edited_fixture(tmp_path, "hf_mamba2", expand=2, ngroups=1))
    assert lm.cfg.arch == "mamba2" and lm.cfg.mixer == dict(ref.cfg.mixer, expand=2, ngroups=1)
    _, fields = checkpoints.read_official(edited_fixture(tmp_path, "hf_mamba1", layer="Mamba1"))
    assert fields["arch"] == "mamba1" and fields["mixer"] == {}

@pytest.mark.parametrize("name,layer", [("hf_mamba1", "Mamba1"), ("hf_mamba2", "Mamba2")])
def test_an_official_checkpoint_exported_again_is_its_files_and_transformers_logits(name, layer, tmp_path):
    path, out = os.path.join(FIXTURES, name), tmp_path / "out"
    lm = checkpoints.from_pretrained(path)
    official.export(lm, str(out))
    config = json.loads(open(os.path.join(path, "config.json")).read())   # the layer spelled out (Mamba1)
    assert json.loads((out / "config.json").read_text()) == dict(config, ssm_cfg={"layer": layer,
                                                                                     **config["ssm_cfg"]})
    before, after = (torch.load(os.path.join(p, "pytorch_model.bin"), weights_only=True) for p in (path, out))
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    ref = torch.load(os.path.join(path, "reference.pt"), weights_only=True)
    with torch.no_grad():
        logits = checkpoints.from_pretrained(str(out))(ref["tokens"])[0]
        assert torch.equal(logits, lm(ref["tokens"])[0])
    torch.testing.assert_close(logits, ref["logits_single"], atol=1e-4, rtol=1e-4)
