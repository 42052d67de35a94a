"""torchrun's processes (ranks) as one run, nanoGPT's way: the process group, each rank's device and rows, and
the few collectives train.py runs. Without torchrun (no RANK in the environment) every function is one
process's: no collective runs and train.py computes what it computes alone."""
import datetime
import os
import re
from contextlib import contextmanager, nullcontext

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

def launched():
    """Started by torchrun, or by anything that sets its variables (RANK, WORLD_SIZE, MASTER_ADDR, ...)?"""
    return "RANK" in os.environ

def rank():
    return dist.get_rank() if dist.is_initialized() else 0

def world():
    return dist.get_world_size() if dist.is_initialized() else 1

def start(device, timeout):
    """Joins torchrun's process group (nccl on CUDA, gloo on the CPU) -> this rank's device. A collective
    that waits longer than `timeout` seconds for a peer raises (gloo; nccl's watchdog ends the process)."""
    if not launched():
        return device
    if device.type == "cuda" and device.index is None:   # one GPU a process: LOCAL_RANK's
        local = int(os.environ.get("LOCAL_RANK", 0))
        gpus = torch.cuda.device_count()
        if local >= gpus:
            raise ValueError(f"LOCAL_RANK {local} but this node has {gpus} GPUs: pass --nproc_per_node {gpus}"
                             " or fewer")
        device = torch.device("cuda", local)
    elif device.type == "cuda" and int(os.environ.get("LOCAL_WORLD_SIZE", 1)) > 1:
        raise ValueError(f"--device {device} for every process of this node: each needs a GPU of its own "
                         "(LOCAL_RANK's): pass --device cuda or auto")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout),
                            device_id=device if backend == "nccl" else None)
    return device

def finish():
    """The ranks leave together: none closes its connections while another still uses them."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()

def lost(error):
    """-> why a collective failed, one line (a peer frozen past the timeout, or ended), or None for an error
    that is not a collective's."""
    if not (launched() and (isinstance(error, dist.DistError) or "gloo" in str(error))):
        return None
    return re.sub(r"^\[[^]]*\] ", "", str(error)).split(". ")[0]   # without gloo's source file and advice

@contextmanager
def rank_zero_first():
    """Rank 0 runs the body (e.g. tokenizes --data into the cache), then the others (which read the cache)."""
    if rank():
        dist.barrier()
    yield
    if dist.is_initialized() and not rank():
        dist.barrier()

def wrap(lm, device):
    """DDP under torchrun (rank 0's weights broadcast; gradients averaged over the ranks in backward)."""
    if not dist.is_initialized():
        return lm
    return DistributedDataParallel(lm, device_ids=[device.index] if device.type == "cuda" else None)

def no_sync(lm, skip):
    """DDP: no all-reduce in this forward and backward (a micro-batch but the last: the gradients add up)."""
    return lm.no_sync() if skip and isinstance(lm, DistributedDataParallel) else nullcontext()

class RankRows:
    """Rank r's rows r*B .. (r+1)*B - 1 of every batch of `sampler`, which draws the run's N*B rows: N ranks
    read the rows one process with --batch-size N*B reads. State: the whole run's, alike on every rank."""

    def __init__(self, sampler, rank, world):
        self.sampler = sampler
        self.rows = slice(rank * sampler.batch_size // world, (rank + 1) * sampler.batch_size // world)
        self.batch_size = sampler.batch_size // world
        self.seed = sampler.seed

    def next_batch(self):
        batch = self.sampler.next_batch()
        new_doc = None if batch.new_doc is None else batch.new_doc[self.rows]
        return batch._replace(x=batch.x[self.rows], y=batch.y[self.rows], new_doc=new_doc)

    def state_dict(self):
        return self.sampler.state_dict()

    def load_state_dict(self, state):
        self.sampler.load_state_dict(state)

def rows(sampler):
    """This rank's rows of sampler's batches (RankRows); one process: the sampler itself."""
    return RankRows(sampler, rank(), world()) if dist.is_initialized() else sampler

def sums(*values):
    """values (numbers) summed over the ranks, alike on every rank; one process: the values themselves."""
    if not dist.is_initialized():
        return values
    t = torch.tensor(values, dtype=torch.float64, device=_device())
    dist.all_reduce(t)
    return tuple(t.tolist())

def mean(value):
    """value averaged over the ranks, alike on every rank."""
    return sums(value)[0] / world() if dist.is_initialized() else value

def gather(obj):
    """-> [every rank's obj] on rank 0 (tensors on the CPU), None on the others; one process: [obj]."""
    if not dist.is_initialized():
        return [obj]
    objs = [None] * world() if rank() == 0 else None
    # on the CPU: pickled, a CUDA tensor would load on rank 0 as the sender's device
    dist.gather_object(_on_cpu(obj), objs, dst=0)
    return objs

def _on_cpu(obj):
    if torch.is_tensor(obj):
        return obj.cpu()
    if isinstance(obj, dict):
        return {k: _on_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_on_cpu(v) for v in obj)
    return obj

def _device():   # where nccl's tensors must be (it reduces on the GPU only); gloo's on the CPU
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
