"""``fastconv bench --suite models --mode train --ddp N``: training steps under
``DistributedDataParallel`` on 1 and on N GPUs of one host, per provider.

For each world size (1, then N) the bench spawns that many processes (NCCL on GPUs, gloo on
the CPU), each holding one GPU and the case's batch (the per-GPU batch stays the same: weak
scaling). Every process builds the case's model with the same seed, wraps each provider's
module in DDP (``torch`` and ``torch_compile``: ``torch.compile`` of the DDP module, as
PyTorch recommends; ``fastconv`` and ``fastconv_cuda_graph``: DDP of ``optimize``'s model,
its CUDA graphs inside; for ``fastconv_cuda_graph`` DDP is built on a side stream, as
PyTorch's CUDA-graph notes ask), and times training steps (forward, backward with DDP's gradient
all-reduce, the SGD step), providers interleaved over rounds (``GpuTimer.eager_rounds``),
every process the same calls. Rank 0's times are the rows: ``ms_p50`` per step,
``images_per_s`` of all GPUs together, and for world N ``scaling_efficiency``: the
provider's step time on one GPU over its step time on N (1.0: no cost for the
all-reduce). Without a GPU the steps run once each on the CPU (gloo), untimed.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile

import torch

from ...precision import Precision

#: what runs distributed: the models suite's providers that DDP can wrap
PROVIDERS = ("torch", "torch_compile", "torch_compile_ro", "fastconv", "fastconv_cuda_graph")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, case, providers: list[str],
            precision: Precision, device: str, reps: int, out: str) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from .models import BUILDERS, model_input, no_dropout, provider_call
    from .timers import GpuTimer, percentiles, torch_cudnn_flags

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if device == "cuda":  # (before NCCL's communicator: each rank its own GPU)
        torch.cuda.set_device(rank)
        torch_cudnn_flags(precision)  # (a process of its own: not restored)
    dist.init_process_group("nccl" if device == "cuda" else "gloo", rank=rank,
                            world_size=world)
    rows = []
    try:
        torch.manual_seed(0)  # the same model on every rank
        model = BUILDERS[case.model]().to(device).train()
        torch.manual_seed(1 + rank)  # each rank its own data
        x = model_input(case.model, case.batch, case.size, device)

        def wrap(net, side_stream=False):
            if not side_stream:
                return DDP(net, device_ids=[rank] if device == "cuda" else None)
            # A module whose backward a CUDA graph captures gets DDP built on a side stream
            # (PyTorch's CUDA-graph notes): DDP keeps each parameter's gradient
            # accumulator, which keeps the stream it was made on, and the capture's
            # backward syncs with it. Made on the default stream, it invalidated every
            # capture ("operation failed due to a previous error during capture"; H200,
            # 84dff78): the step ran eagerly.
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                net = DDP(net, device_ids=[rank])
            torch.cuda.current_stream().wait_stream(side)
            return net
        ready = {}
        for provider in providers:
            side_stream = device == "cuda" and provider == "fastconv_cuda_graph"
            row = dict(case=case.name, provider=provider, precision=precision.value,
                       mode="train", batch=case.batch, size=case.size, world=world,
                       ddp=True, ddp_side_stream=side_stream)
            rows.append(row)
            try:
                fn, net = provider_call(provider, model, x, precision, "train",
                                        wrap=lambda n, s=side_stream: wrap(n, s))
                with no_dropout(net):
                    fn()  # compiles, dispatches, captures
                    if device == "cuda":
                        torch.cuda.synchronize()
                ready[provider] = (row, fn, net)
            except Exception as exc:  # reported, not fatal (every rank fails alike)
                row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        if device != "cuda":
            for row, fn, _ in ready.values():
                fn()  # a second step: the gradients' all-reduce ran twice
                row.update(ms_p50=None, timing="not measured (no GPU)")
        elif ready:
            times = GpuTimer().eager_rounds({p: [v[1]] for p, v in ready.items()}, reps)
            for provider, (row, _, _) in ready.items():
                p50, p20, p80 = percentiles(times[provider])
                row.update(ms_p50=p50, ms_p20=p20, ms_p80=p80,
                           images_per_s=world * case.batch * 1000 / p50)
        for row, _, net in ready.values():  # e.g. a capture that failed, in any step
            report = getattr(getattr(net, "module", net), "report", None)
            if report is not None and report.notes:
                row["notes"] = list(report.notes)
    finally:
        dist.destroy_process_group()
    if rank == 0:
        with open(out, "w") as f:
            json.dump(rows, f)


def run_case(case, providers: list[str], precision: Precision, world: int, device: str,
             reps: int = 20) -> list[dict]:
    """The rows of world sizes 1 and ``world`` (see the module's docstring)."""
    import torch.multiprocessing as mp

    bad = [p for p in providers if p not in PROVIDERS]
    if bad:
        raise ValueError(f"--ddp: provider {bad[0]!r} is not run under DDP (allowed: "
                         f"{', '.join(PROVIDERS)})")
    if device == "cuda" and torch.cuda.device_count() < world:
        raise ValueError(f"--ddp {world}: this machine has {torch.cuda.device_count()} GPUs")
    rows = []
    for size in dict.fromkeys((1, world)):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "rows.json")
            mp.spawn(_worker, args=(size, _free_port(), case, providers, precision, device,
                                    reps, out), nprocs=size, join=True)
            with open(out) as f:
                rows += json.load(f)
    one = {r["provider"]: r for r in rows if r["world"] == 1}
    for r in rows:
        base = one.get(r["provider"], {})
        if r["world"] > 1 and r.get("ms_p50") and base.get("ms_p50"):
            r["scaling_efficiency"] = base["ms_p50"] / r["ms_p50"]
    return rows


def table(rows: list[dict]) -> str:
    """The rows as text: per provider and world size, ms per step, images/s, efficiency."""
    lines = [f"{'case':22}{'provider':22}{'world':>6}{'ms p50':>9}{'img/s':>9}{'eff':>7}"]
    for r in rows:
        if "error" in r or r.get("ms_p50") is None:
            lines.append(f"{r['case'][:21]:22}{r['provider']:22}{r['world']:6d}  "
                         f"{r.get('error', r.get('timing', ''))}")
            continue
        eff = f"{r['scaling_efficiency']:7.3f}" if "scaling_efficiency" in r else f"{'-':>7}"
        lines.append(f"{r['case'][:21]:22}{r['provider']:22}{r['world']:6d}"
                     f"{r['ms_p50']:9.2f}{r['images_per_s']:9.0f}{eff}")
    for r in rows:
        for note in r.get("notes", ()):
            lines.append(f"  {r['provider']} world {r['world']}: {note}")
    return "\n".join(lines)
