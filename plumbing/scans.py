"""The scans' shared checks and kernel launch (ssm.py, gla.py, rwkv.py): the initial state's and chunk size's
checks, a layer's state check, the zero-length answer, the compute dtype, the pick of a form, and the launch
of a Triton kernel with its backward through the chunked form.
Scans compute in float32 (a long product of decays loses too much in bf16; the naive and chunked forms in
float64 when an input is, for tests; the Triton kernels always in float32) and return y in x's dtype, the
final state in the compute dtype. A zero-length input (t = 0) is the identity: an empty y, and a copy of the
initial state as the final state. A given initial_state must have exactly the final state's shape (one that
merely broadcasts or holds as many numbers is refused: check_initial_state)."""
import os
import types
from functools import partial

import torch

try:  # no Triton wheel (e.g. macOS): the naive and chunked forms still work, and the kernels still parse
    import triton
    import triton.language as tl
except ImportError:
    triton = tl = types.SimpleNamespace(jit=lambda fn: fn, constexpr=None)
HAS_TRITON = not isinstance(triton, types.SimpleNamespace)

def check_initial_state(scan, initial_state, shape, layout):
    """None, or a tensor of exactly the final state's shape: a transposed or flattened state, or one state
    for a whole batch, would otherwise compute silently (or the kernels would read past its end)."""
    if initial_state is None:
        return
    if not isinstance(initial_state, torch.Tensor) or initial_state.shape != shape:
        got = f"is a {type(initial_state).__name__}"
        got = f"has shape {list(initial_state.shape)}" if isinstance(initial_state, torch.Tensor) else got
        raise ValueError(f"{scan}: initial_state {got}, expected a tensor of shape {list(shape)} {layout}")

def check_chunk_size(scan, chunk_size, power_of_two=False):
    """A chunk of at least one step (a power of two for gla.chunked_scan: its bisection halves chunks)."""
    ok = isinstance(chunk_size, int) and chunk_size >= 1
    if not ok or power_of_two and chunk_size & (chunk_size - 1):
        kind = "a power of two" if power_of_two else "a positive integer"
        raise ValueError(f"{scan}: chunk_size {chunk_size!r} must be {kind}")

def set_head_dims(layer, name, d_model, num_heads, expand_k, expand_v):
    """Sets num_heads, key_dim, value_dim and their per-head sizes on a matrix-state layer (GLA, RWKV-6)."""
    key_dim = int(d_model * expand_k)
    value_dim = int(d_model * expand_v)
    if key_dim % num_heads or value_dim % num_heads:
        raise ValueError(f"{name}: num_heads {num_heads} must divide key_dim {key_dim} and value_dim")
    layer.num_heads = num_heads
    layer.key_dim = key_dim
    layer.value_dim = value_dim
    layer.head_k_dim = key_dim // num_heads
    layer.head_v_dim = value_dim // num_heads

def check_lm_inputs(idx, state, n_layers):
    """model.LM's inputs: idx a 2-D tensor of token ids; state None or one dict per layer."""
    if not (isinstance(idx, torch.Tensor) and idx.dim() == 2 and idx.dtype in (torch.long, torch.int)):
        got = f"{idx.dim()}-D {idx.dtype}" if isinstance(idx, torch.Tensor) else type(idx).__name__
        raise ValueError(f"LM: idx must be a 2-D [batch, time] tensor of token ids (int64), not {got}")
    if state is not None and not (isinstance(state, (list, tuple)) and len(state) == n_layers):
        got = f"{len(state)} entries" if isinstance(state, (list, tuple)) else f"a {type(state).__name__}"
        raise ValueError(f"LM: state is {got}, expected one dict per layer ({n_layers}), as lm returns it")

def check_state(layer, state, shapes):
    """A layer's state: None (zeros) or a dict holding at least shapes' entries (a block's dict holds its
    MLP's too), each a tensor of exactly its shape: another batch's state would broadcast silently."""
    if state is None:
        return
    if not isinstance(state, dict):
        raise ValueError(f"{layer}: the state is a {type(state).__name__}, not a dict of {sorted(shapes)}")
    for key, shape in shapes.items():
        v = state.get(key)
        if not isinstance(v, torch.Tensor) or v.shape != shape:
            got = "is missing" if key not in state else f"is a {type(v).__name__}"
            got = f"has shape {list(v.shape)}" if isinstance(v, torch.Tensor) else got
            raise ValueError(f"{layer}: state[{key!r}] {got}, expected a tensor of shape {list(shape)}: pass "
                             "the state this layer returned for a batch of the same size, or None")

def no_steps(y, initial_state):
    """(y, final_state) of a zero-length input: no output; a copy of the initial state (no alias)."""
    return y, initial_state.clone()

def compute_dtype(*tensors):  # the module docstring says why
    return torch.float64 if torch.float64 in [v.dtype for v in tensors if v is not None] else torch.float32

def pick_form(forms, impl, x, **chunked_kw):
    """forms["naive" | "chunked" | "triton"]; "auto": Triton on CUDA, else chunked, given chunked_kw."""
    if impl == "auto":
        impl = "triton" if x.is_cuda and HAS_TRITON else "chunked"
    return partial(forms[impl], **chunked_kw) if impl == "chunked" else forms[impl]

def triton_scan(launch, chunked, *inputs, **kw):
    """(y, final_state) = launch(*inputs, **kw), a Triton kernel, on CUDA (or under TRITON_INTERPRET=1);
    backward by recomputing chunked(*inputs, **kw), the PyTorch form, under autograd."""
    if not HAS_TRITON:
        raise RuntimeError("a Triton scan needs Triton (on Linux: pip install triton); use the chunked form")
    if not (inputs[0].is_cuda or os.environ.get("TRITON_INTERPRET") == "1"):
        raise RuntimeError("a Triton scan needs CUDA tensors, or TRITON_INTERPRET=1 before importing triton")
    if inputs[0].shape[1] == 0:  # no step, nothing to launch: the chunked form returns the initial state
        return chunked(*inputs, **kw)
    return _TritonForward.apply(partial(launch, **kw), partial(chunked, **kw), *inputs)

class _TritonForward(torch.autograd.Function):  # no backward kernel: the same function, the same gradients
    @staticmethod
    def forward(ctx, launch, chunked, *inputs):
        ctx.chunked = chunked
        ctx.save_for_backward(*inputs)
        return launch(*inputs)

    @staticmethod
    def backward(ctx, dy, dfinal):
        needs = ctx.needs_input_grad[2:]
        with torch.enable_grad():
            inputs = [v if v is None else v.detach().requires_grad_(need)
                      for v, need in zip(ctx.saved_tensors, needs)]
            wanted = [v for v, need in zip(inputs, needs) if need]
            grads = iter(torch.autograd.grad(ctx.chunked(*inputs), wanted, (dy, dfinal), allow_unused=True))
        return (None, None) + tuple(next(grads) if need else None for need in needs)
