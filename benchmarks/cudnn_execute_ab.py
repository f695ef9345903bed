"""Host µs per call of a cuDNN-frontend convolution by the ways the frontend can execute it:
``execute_plan_at_index`` with a {uid: tensor} dict (what backends/cudnn.py does), the same
with an ordered tuple and ``tensor_uids`` (frontend >= 1.32's cached binding), plain
``execute`` both ways; torch's F.conv2d beside them. A tiny bf16 channels-last 1x16x8x8 3x3
convolution (kernel time negligible: host time = wall time of back-to-back calls).

    python benchmarks/cudnn_execute_ab.py
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F

from fastconv import workspace
from fastconv.backends import cudnn as backend
from fastconv.problem import ConvProblem


def host_us(fn, calls: int = 300, rounds: int = 9) -> float:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(times)


def main() -> None:
    x = torch.randn(1, 16, 8, 8, device="cuda", dtype=torch.bfloat16).to(
        memory_format=torch.channels_last)
    w = torch.randn(16, 16, 3, 3, device="cuda", dtype=torch.bfloat16).to(
        memory_format=torch.channels_last)
    y = torch.empty_like(x)
    problem = ConvProblem.from_tensors(x, w, None, 1, 1, 1, 1, rank=2, precision="bf16")
    strides = (x.stride(), w.stride(), y.stride())
    g = backend._graph_for(problem, "fprop", strides)
    index = g.plans[0]
    g.require(index)
    ws = workspace.get(g.built[index], torch.cuda.current_stream())
    handle = backend._handle(torch.cuda.current_device())
    graph = g.graph
    uids = (backend._X, backend._W, backend._Y)
    ref = F.conv2d(x.double(), w.double(), padding=1)
    graph.execute_plan_at_index({backend._X: x, backend._W: w, backend._Y: y}, ws, index,
                                handle=handle)
    err_dict = float((y.double() - ref).norm() / ref.norm())
    y.fill_(float("nan"))
    rows = {"torch F.conv2d": lambda: F.conv2d(x, w, padding=1),
            "execute_plan_at_index(dict)": lambda: graph.execute_plan_at_index(
                {backend._X: x, backend._W: w, backend._Y: y}, ws, index, handle=handle),
            "fastconv's execute (+ stream, workspace)": lambda: g.execute(
                index, (x, w, y), backend._FPROP)}
    try:
        graph.execute_plan_at_index((x, w, y), ws, index, handle=handle, tensor_uids=uids)
        err_ordered = float((y.double() - ref).norm() / ref.norm())
        rows["execute_plan_at_index(tuple, tensor_uids)"] = \
            lambda: graph.execute_plan_at_index((x, w, y), ws, index, handle=handle,
                                                tensor_uids=uids)
    except TypeError as exc:
        err_ordered = f"not supported: {exc}"
    print(f"frontend {getattr(g.cudnn, '__version__', '?')}; error dict {err_dict:.2e}, "
          f"ordered {err_ordered}")
    for name, fn in rows.items():
        print(f"{name:45s} {host_us(fn):7.2f} us")


if __name__ == "__main__":
    main()
