# Triton kernels run through Triton's interpreter when there is no GPU (how CI runs them). The variable
# must be set before triton is first imported, hence here. (test_triton_compile.py compiles them for
# real in a subprocess that runs without it.)
import os
import sys

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
