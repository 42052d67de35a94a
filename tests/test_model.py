"""The one LM: state plumbing (split and step equivalence, zero-length pieces included) for every
architecture, the states and ids it refuses, its initialisation, files that hold no checkpoint of ours.
(Loading official checkpoints: test_reference.py; bad ones: test_bad_inputs.py.)"""
import re
from dataclasses import asdict

import pytest
import torch

import model
from plumbing import checkpoints
from conftest import tiny_lm

ARCHS = list(model.ARCHS)   # every mixer, a new one too

@pytest.mark.parametrize("arch", ARCHS)
def test_split_and_step_equivalence(arch):
    # lm(idx) == lm(idx[:, :a]) then lm(idx[:, a:], state), cut in two (a = 2 is shorter than Mamba's conv
    # window) or token by token: the whole recurrent state is carried, conv windows and token shifts too.
    lm = tiny_lm(arch, vocab_size=50)
    idx = torch.randint(0, 50, (2, 75))
    with torch.no_grad():
        full, s_full = lm(idx)
        torch.testing.assert_close(lm(idx, state=lm.zero_state(2))[0], full)   # state=None is the zero state
        for cuts in ([0, 2, 75], [0, 33, 75], [*range(20), 75]):
            state, outs = None, []
            for a, b in zip(cuts, cuts[1:]):
                logits, state = lm(idx[:, a:b], state=state)
                outs.append(logits)
            torch.testing.assert_close(torch.cat(outs, 1), full, atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(state, s_full, atol=1e-4, rtol=1e-4)  # list of per-layer dicts
        # last_only=True (decoding, Effective Remembrance): the last position's logits, the same state
        last, s_last = lm(idx, last_only=True)
    torch.testing.assert_close(last, full[:, -1:], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(s_last, s_full, atol=1e-6, rtol=1e-4)

@pytest.mark.parametrize("arch", ARCHS)
def test_gradient_reaches_the_initial_state_even_after_an_inference_mode_call(arch):
    # evaluation runs under torch.inference_mode: nothing it caches may break a later backward
    lm = tiny_lm(arch, vocab_size=50, seed=3)
    idx = torch.randint(0, 50, (2, 10))
    with torch.inference_mode():
        lm(idx)
    state = [{k: torch.randn_like(v).requires_grad_() for k, v in s.items()} for s in lm.zero_state(2)]
    logits, final = lm(idx, state=state)
    logits.logsumexp(-1).sum().backward()
    assert all(layer["h"].grad.abs().sum() > 0 for layer in state)
    assert all(p.grad is not None for p in lm.backbone.layers[0].mixer.parameters())

@pytest.mark.parametrize("arch,outs", [("mamba2", ["out_proj"]), ("gla", ["o_proj", "down_proj"]),
                                       ("rwkv6", ["o_proj", "value"]),
                                       ("gated_deltanet", ["o_proj", "down_proj"])])
def test_each_residual_branch_output_is_scaled_by_one_over_sqrt_of_all_branches(arch, outs):
    # as mamba_ssm's _init_weights: every projection into the residual stream, the mixers' and the MLPs'
    # alike, divided by sqrt(n_layer * branches per block); nothing else changes
    lm, cfg = tiny_lm(arch, n_layer=3), model.make_config(arch, "tiny", n_layer=3)
    torch.manual_seed(0)   # the same draws as tiny_lm: the embedding first, then the blocks
    torch.nn.Embedding(lm.backbone.embedding.num_embeddings, cfg.d_model)
    raw = torch.nn.ModuleList([model.Block(cfg, i) for i in range(3)])
    branches = 3 * (1 if arch == "mamba2" else 2)
    for name, p in raw.named_parameters():
        scale = branches ** -0.5 if name.split(".")[-2] in outs else 1.0
        torch.testing.assert_close(lm.backbone.layers.get_parameter(name), p * scale)

@pytest.mark.parametrize("vocab,multiple,rows", [(257, 8, 264), (50280, 8, 50280), (61, 16, 64), (16, 8, 16),
                                                 (1, 8, 8)])
def test_the_vocabulary_is_padded_up_to_the_next_multiple_only(vocab, multiple, rows):
    # as mamba_ssm: GPT-NeoX's 50,280 is a multiple of 8 already; the official checkpoints hold 50,280 rows
    lm = model.LM(model.make_config("mamba2", "tiny", vocab_size=vocab, pad_vocab_size_multiple=multiple))
    assert lm.backbone.embedding.num_embeddings == lm.lm_head.out_features == rows
    assert lm(torch.zeros(1, 3, dtype=torch.long))[0].shape == (1, 3, vocab)   # without the padding rows

def test_stream_ends_pieces_at_each_chunk_and_stop_and_carries_the_state():
    # pieces end every chunk_len tokens and at each stop inside (0, T) (T - 1 too; 0, T and past T: no piece
    # of their own), the state carried: the pieces' logits and last state are one forward's
    lm, x = tiny_lm(vocab_size=50), torch.randint(0, 50, (2, 10))
    with torch.no_grad():
        full, s_full = lm(x)
        pieces = list(model.stream(lm, x, 4, stops=[9, 2, 0, 10, 99, 2]))
    assert [(a, b) for a, b, *_ in pieces] == [(0, 2), (2, 4), (4, 8), (8, 9), (9, 10)]
    torch.testing.assert_close(torch.cat([p[2] for p in pieces], 1), full, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(pieces[-1][3], s_full, atol=1e-4, rtol=1e-4)
    assert model.device_of(lm) == model.device_of(torch.nn.ReLU()) == torch.device("cpu")  # no parameters

@pytest.mark.parametrize("arch", ARCHS)
def test_a_zero_length_input_is_the_identity_for_every_layer_and_the_lm(arch):
    # t = 0: empty logits, the state unchanged (a copy); from None, the zero state; so the split identity
    # holds at a = 0 and a = T, gradients to the initial state included
    lm, idx = tiny_lm(arch, vocab_size=50), torch.randint(0, 50, (2, 7))
    with torch.no_grad():
        full, s_full = lm(idx)
        logits, state = lm(idx[:, 7:], state=s_full)
        assert logits.shape == (2, 0, 50) and lm(idx[:, :0], last_only=True)[0].shape == (2, 0, 50)
        torch.testing.assert_close(state, s_full, rtol=0, atol=0)
        assert all(a[k] is not b[k] for a, b in zip(state, s_full) for k in a)
        _, zero = lm(idx[:, :0])
        torch.testing.assert_close(zero, lm.zero_state(2), rtol=0, atol=0)   # shapes and dtypes too
        for a in (0, 7):
            head, s = lm(idx[:, :a])
            tail, s = lm(idx[:, a:], state=s)
            torch.testing.assert_close(torch.cat([head, tail], 1), full, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(s, s_full, atol=1e-5, rtol=1e-5)
    start = [{k: torch.randn_like(v).requires_grad_() for k, v in s.items()} for s in lm.zero_state(2)]
    def grads(cuts):   # of a loss on the logits and the final state w.r.t. the initial state
        state, logits = start, []
        for a, b in zip(cuts, cuts[1:]):
            piece, state = lm(idx[:, a:b], state=state)
            logits.append(piece)
        loss = torch.cat(logits, 1).logsumexp(-1).sum() + sum(v.sum() for s in state for v in s.values())
        return torch.autograd.grad(loss, [v for s in start for v in s.values()])
    want = grads([0, 7])
    assert all(g.abs().sum() > 0 for g in want[::len(start[0])])   # every layer's "h"
    for cuts in ([0, 0, 7], [0, 7, 7], [0, 0, 3, 3, 7, 7]):
        torch.testing.assert_close(grads(cuts), want, atol=1e-5, rtol=1e-5)
    for block in lm.backbone.layers:   # each layer on its own, its state dict given or not
        for layer in filter(None, (block.mixer, block.mlp)):
            given = {k: torch.randn_like(v) for k, v in layer.zero_state(2, "cpu").items()}
            for initial, expected in ((given, given), (None, layer.zero_state(2, "cpu"))):
                y, final = layer(torch.randn(2, 0, 64), initial)
                assert y.shape == (2, 0, 64)
                torch.testing.assert_close(final, expected, rtol=0, atol=0)

@pytest.mark.parametrize("arch", ARCHS)
def test_a_state_of_another_batch_or_layout_and_bad_ids_are_refused_in_one_line(arch):
    lm, idx = tiny_lm(arch, vocab_size=50), torch.randint(0, 50, (2, 5))
    with torch.no_grad():
        one = lm(idx[:1])[1]
        state = lm(idx)[1]
    def refused(match, x=idx, state=state):
        with pytest.raises(ValueError, match=match) as e, torch.no_grad():
            lm(x, state=state)
        assert "\n" not in str(e.value)
    refused(r"state\['h'\] has shape \[1, .*expected a tensor of shape \[2, ", state=one)   # GLA broadcast it
    refused(r"state\['h'\] is missing", state=[{k: v for k, v in s.items() if k != "h"} for s in state])
    refused(r"state\['h'\] is a NoneType", state=[{**s, "h": None} for s in state])
    refused(r"state\['h'\] has shape \[.*\]", state=[{**s, "h": s["h"].flatten(1)} for s in state])
    refused("the state is a Tensor", state=[s["h"] for s in state])
    refused("expected one dict per layer", state=state[0])
    refused("is 1 entries, expected one dict per layer", state=state[:1])
    refused("2-D .* not 1-D", x=idx[0])
    refused("token ids .* not 2-D torch.float32", x=idx.float())
    for key in state[0]:   # every entry of a layer's state: the conv window, the token shifts too
        bad = [{**s, key: s[key][..., :-1]} for s in state]
        refused(rf"state\['{key}'\] has shape", state=bad)
    with torch.no_grad():   # the right shapes pass; None per layer is that layer's zero state
        torch.testing.assert_close(lm(idx, state=[None] * len(state))[0], lm(idx)[0], rtol=0, atol=0)

def test_mamba2_refuses_heads_that_do_not_divide_and_a_chunk_below_one():
    for kw, match in [(dict(headdim=24), "headdim 24 must divide expand \\* d_model = 128"),
                      (dict(headdim=16, ngroups=3), "ngroups 3"), (dict(headdim=0), "headdim 0"),
                      (dict(headdim=16, chunk_size=0), "chunk_size 0 must be a positive integer")]:
        with pytest.raises(ValueError, match=match):
            model.ssm.Mamba2(64, d_state=16, **kw)
    assert model.ssm.Mamba2(64, d_state=16, headdim=16, ngroups=2).nheads == 8

def test_a_file_that_holds_no_checkpoint_dict_is_refused_in_one_line(tmp_path):
    for name, obj in [("tensor", torch.zeros(3)), ("list", [torch.zeros(2), 1])]:
        path = str(tmp_path / f"{name}.pt")
        torch.save(obj, path)
        for read in (checkpoints.from_pretrained, checkpoints.train_config, lambda p: checkpoints.read_checkpoint(p, "cpu")):
            match = f"holds a {type(obj).__name__}, not a dict: not a checkpoint of this repo"
            with pytest.raises(ValueError, match=match):
                read(path)
    lm = tiny_lm()
    for name, weights in [("list", [lm.state_dict()]), ("numbers", {k: 1.0 for k in lm.state_dict()}),
                          ("one-list", {**lm.state_dict(), "backbone.norm_f.weight": [1.0] * 64})]:
        path = str(tmp_path / f"{name}-weights.pt")
        torch.save({"model_config": asdict(lm.cfg), "model": weights}, path)
        with pytest.raises(ValueError, match="weights are not a dict of tensors: not a checkpoint of this"):
            checkpoints.from_pretrained(path)
    path = str(tmp_path / "bad-heads.pt")   # a config our Mamba2 cannot build: named with the file
    config = dict(asdict(lm.cfg), mixer=dict(lm.cfg.mixer, headdim=24))
    torch.save({"model_config": config, "model": {}}, path)
    match = re.escape(f"{path}: not a model checkpoint of this repo (ValueError: Mamba2: headdim 24 must")
    with pytest.raises(ValueError, match=match):
        checkpoints.from_pretrained(path)

@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_one_non_finite_value_among_finite_weights_is_refused(tmp_path, bad):
    lm = tiny_lm()
    weights = lm.state_dict()
    weights["backbone.layers.1.mixer.in_proj.weight"][3, 5] = bad
    path = str(tmp_path / "ckpt.pt")
    torch.save({"model_config": asdict(lm.cfg), "model": weights}, path)
    with pytest.raises(ValueError, match="backbone.layers.1.mixer.in_proj.weight has NaN or inf values"):
        checkpoints.from_pretrained(path)
