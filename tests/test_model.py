"""The one LM: state plumbing (split and step equivalence) for every architecture, its initialisation.
(Loading official checkpoints: test_reference.py; bad ones: test_bad_inputs.py.)"""
import pytest
import torch

import model
from conftest import tiny_lm

ARCHS = ["mamba1", "mamba2", "gla", "rwkv6"]

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
                                       ("rwkv6", ["o_proj", "value"])])
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
