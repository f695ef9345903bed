"""The device a call runs on. fastconv's kernels, cuDNN handles, streams, timings and CUDA
graphs are the *current* device's (Triton launches on the current device's stream, cuDNN
keeps a handle per current device), while torch's own operators follow their tensors. A
call whose tensors live on another GPU than the current one (model parallelism in one
process, without ``torch.cuda.set_device``) therefore runs with its input's device made
current for its duration, as torch's operators do internally: each public entry point asks
:func:`elsewhere` and re-enters under ``torch.cuda.device``. The backward needs nothing:
autograd runs it on a thread whose current device is the tensors'.

A leaf module: it imports nothing else of fastconv.
"""

from __future__ import annotations

import torch


def elsewhere(t) -> int | None:
    """The index of the GPU holding ``t`` where that is not the current device, else None
    (CPU tensors, non-tensors, the common case of one device in use, and inside torch.compile's
    tracing, whose graphs Inductor runs under a guard of its own)."""
    if not isinstance(t, torch.Tensor) or not t.is_cuda or torch.compiler.is_compiling():
        return None  # (a compiled graph runs under its own device guard)
    index = t.get_device()  # (CUDA is initialised: a CUDA tensor exists; 0.1 us a call)
    return index if index != torch._C._cuda_getDevice() else None
