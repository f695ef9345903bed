"""torch's own first call of a timm model, as ``firstcall_profile.py`` times fastconv's
(cudnn.benchmark on; ``FIRSTCALL_WARM=1``: after one 64x64 call of the model, so that CUDA,
cuDNN and cuBLAS are initialised with no convolution shape shared), for a same-call
comparison on the GPU.

    python benchmarks/firstcall_torch.py [timm model] [batch]
"""

import os
import sys
import time

import timm
import torch

name = sys.argv[1] if len(sys.argv) > 1 else "convnext_tiny"
batch = int(sys.argv[2]) if len(sys.argv) > 2 else 32
torch.backends.cudnn.benchmark = True
model = timm.create_model(name, pretrained=False).cuda().eval().to(
    memory_format=torch.channels_last)
x = torch.randn(batch, 3, 224, 224, device="cuda").contiguous(memory_format=torch.channels_last)
with torch.no_grad(), torch.autocast("cuda", torch.bfloat16):
    if os.environ.get("FIRSTCALL_WARM") == "1":
        model(torch.randn(2, 3, 64, 64, device="cuda"))
        torch.cuda.synchronize()
    start = time.perf_counter()
    model(x)
    torch.cuda.synchronize()
print(f"torch first call {time.perf_counter() - start:.2f} s ({name} b{batch}, bf16 autocast)")
