"""Run folders and the process around a run: the device a script asks for, and out-of-memory told apart from
other errors."""
import torch

def device(name):
    """--device: "auto" is CUDA when present, else the CPU; anything else as torch reads it."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)

def out_of_memory(error):
    """Is error an allocation that failed? (The CPU allocator's is a plain RuntimeError.)"""
    return isinstance(error, (MemoryError, torch.OutOfMemoryError)) or "can't allocate memory" in str(error)
