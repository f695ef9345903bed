"""Suite ``seqconv``: the sequence convolutions of Mamba- and Hyena-style models, fastconv
against torch in the same process, each row with its percentage of the HBM floor.

Cases: causal conv1d (``fastconv.causal_conv1d`` against ``F.conv1d`` with ``width − 1``
padding, a slice and SiLU) at Mamba-like shapes, modes ``fwd`` and ``train`` (forward +
backward); decode steps (``causal_conv1d_update`` against the same step written in torch:
concatenate, convolve, shift the state) at batch 1 to 256, mode ``fwd``; long convolutions
(``long_conv1d`` against a torch.fft implementation padded to a power of two) at 1K-64K;
packed sequences (``causal_conv1d`` with ``seq_idx``, sequences of 37-300 positions, against
the same masked sum written in torch, one pass per tap). Causal cases named ``…_cl`` hold x
(and the output's gradient) channel-last, dim-contiguous: a (batch, seqlen, dim) tensor seen
as (batch, dim, seqlen), as a Mamba block's in-projection leaves it; both providers take that
view as it is.
Providers: ``fastconv`` and ``torch``. ``min_bytes`` is what a pass must read and write
(inputs, outputs, weights; in ``train`` also the output's gradient, x read again and its
gradient: five passes of x's size), so ``hbm_pct`` is the floor's
time (``min_bytes`` at the measured copy bandwidth) over the median. Every row is also
timed as CUDA-graph replays (``graph_ms_p50``, ``graph_hbm_pct``): a model's layers run in a
graph where the host's cost is gone (eager decode steps and many training steps here are
the host's). The replays cycle through operand sets that together exceed the L2 cache twice
over (decode: ``DECODE_SETS`` states), so each call reads from HBM as a model's layers do.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from ...precision import Precision, relative_error

MODES = ("fwd", "train")


@dataclasses.dataclass(frozen=True)
class SeqCase:
    name: str
    kind: str  # "causal", "decode", "long" or "packed"
    batch: int
    dim: int
    seqlen: int  # decode: tokens per step
    width: int  # the filter's length (long: K)
    channel_last: bool = False  # x dim-contiguous (causal cases only)


CASES = [SeqCase(f"causal_b{b}_d{d}_l{n}_w{w}", "causal", b, d, n, w)
         for b, d, n in ((1, 8192, 16384), (8, 4096, 2048), (16, 1024, 256))
         for w in (2, 3, 4, 8, 16, 64, 256)]
CASES += [SeqCase(f"causal_b{b}_d{d}_l{n}_w{w}_cl", "causal", b, d, n, w, True)
          for b, d, n, widths in ((1, 8192, 16384, (4,)),
                                  (8, 4096, 2048, (2, 4, 8, 16, 24, 64, 256)))
          for w in widths]
CASES += [SeqCase(f"decode_b{b}_d4096_w4", "decode", b, 4096, 1, 4) for b in (1, 16, 256)]
CASES += [SeqCase(f"long_b4_d768_l{n}", "long", 4, 768, n, n) for n in (1024, 2048, 4096, 8192,
                                                                      16384, 65536)]
CASES += [SeqCase(f"packed_b8_d4096_l2048_w{w}", "packed", 8, 4096, 2048, w) for w in (4, 16)]


def shrink(case: SeqCase) -> SeqCase:
    """The CPU version: small enough for the correctness check."""
    return dataclasses.replace(case, batch=min(case.batch, 2), dim=min(case.dim, 8),
                               seqlen=min(case.seqlen, 64) if case.kind != "decode" else 1,
                               width=min(case.width, 64 if case.kind == "long" else 16))


def _torch_causal(x, w, b):
    return F.silu(F.conv1d(x, w.unsqueeze(1), b, padding=w.shape[1] - 1,
                           groups=x.shape[1])[..., :x.shape[-1]])


def _torch_update(x, state, w, b):
    window = torch.cat([state, x.unsqueeze(-1)], -1)
    state.copy_(window[..., 1:])
    return F.silu(F.conv1d(window, w.unsqueeze(1), b, groups=x.shape[1])[..., -1])


def _torch_packed(x, w, b, seq_idx):
    """The packed causal conv1d in torch: tap k of position t counted where position
    t − (width − 1) + k has t's ``seq_idx`` (one masked pass per tap), then SiLU."""
    width = w.shape[1]
    full = F.pad(x, (width - 1, 0))
    ids = torch.cat([seq_idx[:, :1].expand(-1, width - 1), seq_idx], -1)
    acc = b.float()[None, :, None].expand(x.shape).clone()
    for k in range(width):
        same = (ids[:, k:k + x.shape[-1]] == seq_idx).unsqueeze(1)
        acc += torch.where(same, full[..., k:k + x.shape[-1]], 0).float() * w[:, k:k + 1].float()
    return F.silu(acc).to(x.dtype)


def packed_ids(batch: int, seqlen: int, generator) -> torch.Tensor:
    """(batch, seqlen) int32 ids of packed sequences of 37-300 positions."""
    rows = []
    for _ in range(batch):
        ids, n = [], 0
        while len(ids) < seqlen:
            ids += [n] * int(torch.randint(37, 301, (1,), generator=generator))
            n += 1
        rows.append(ids[:seqlen])
    return torch.tensor(rows, dtype=torch.int32)


def _torch_fft(x, w, b):
    n = 1 << (x.shape[-1] + w.shape[-1] - 2).bit_length()
    out = torch.fft.irfft(torch.fft.rfft(x.float(), n=n) * torch.fft.rfft(w.float(), n=n),
                          n=n)[..., :x.shape[-1]]
    return (out + b.float().unsqueeze(-1)).to(x.dtype)


def _drawn(shape: tuple, generator, device, dtype, channel_last: bool) -> torch.Tensor:
    """A standard normal (batch, dim, seqlen) tensor, dim-contiguous where ``channel_last``
    (a (batch, seqlen, dim) tensor transposed)."""
    if not channel_last:
        return torch.randn(shape, generator=generator).to(device, dtype)
    batch, dim, seqlen = shape
    return torch.randn(batch, seqlen, dim, generator=generator).to(device, dtype).transpose(1, 2)


def _calls(case: SeqCase, dtype, device, train: bool, seed: int = 0, reference: bool = True):
    """({provider: call}, float64 reference output (None without ``reference``), bytes a
    pass must move), on operands drawn from ``seed``."""
    import fastconv

    g = torch.Generator(device="cpu").manual_seed(seed)
    shape = (case.batch, case.dim, case.seqlen if case.kind != "decode" else 1)
    x = _drawn(shape, g, device, dtype, case.channel_last)
    scale = case.width ** -0.5
    w = (torch.randn(case.dim, case.width, generator=g) * scale).to(device, dtype)
    b = torch.randn(case.dim, generator=g).to(device, dtype)
    size = dtype.itemsize
    if case.kind == "decode":
        token = x[..., 0].contiguous()
        start = torch.randn(case.batch, case.dim, case.width - 1, generator=g).to(device, dtype)
        states = {"fastconv": start.clone(), "torch": start.clone()}
        ref_state = states["torch"].double()
        ref = F.silu(F.conv1d(torch.cat([ref_state, token.double().unsqueeze(-1)], -1),
                              w.double().unsqueeze(1), b.double(), groups=case.dim)[..., -1])
        calls = {"fastconv": lambda: fastconv.causal_conv1d_update(
                     token, states["fastconv"], w, b, "silu"),
                 "torch": lambda: _torch_update(token, states["torch"], w, b)}
        moved = size * case.batch * case.dim * (2 + 2 * (case.width - 1))
        return calls, ref, moved
    if case.kind == "packed":
        ids = packed_ids(case.batch, case.seqlen, g).to(device)
        fns = {"fastconv": lambda x, w, b: fastconv.causal_conv1d(x, w, b, ids,
                                                                  activation="silu"),
               "torch": lambda x, w, b: _torch_packed(x, w, b, ids)}
        ref = _torch_packed(x.double(), w.double(), b.double(), ids) if reference else None
    elif case.kind == "long":
        fns = {"fastconv": lambda x, w, b: fastconv.long_conv1d(x, w, b), "torch": _torch_fft}
        ref = None if not reference else F.conv1d(  # the definition, directly
            F.pad(x.double(), (case.width - 1, 0)), w.double().flip(-1).unsqueeze(1),
            b.double(), groups=case.dim)
    else:
        fns = {"fastconv": lambda x, w, b: fastconv.causal_conv1d(x, w, b, activation="silu"),
               "torch": _torch_causal}
        ref = _torch_causal(x.double(), w.double(), b.double()) if reference else None
    moved = size * (2 * x.numel() + w.numel())
    if case.kind == "packed":
        moved += 4 * case.batch * case.seqlen  # the ids
    if not train:
        return {p: (lambda f=f: f(x, w, b)) for p, f in fns.items()}, ref, moved
    xg, wg, bg = (t.detach().requires_grad_() for t in (x, w, b))
    grad = _drawn(shape, g, device, dtype, case.channel_last)

    def step(f):
        def call():
            out = f(xg, wg, bg)
            out.backward(grad)
            xg.grad = wg.grad = bg.grad = None
            return out.detach()
        return call
    # forward + backward: x and the output (the forward), the output's gradient, x again and
    # its gradient (the backward: x cannot stay on chip between them), the weights twice
    return {p: step(f) for p, f in fns.items()}, ref, 2 * moved + size * x.numel()


#: Decode steps timed in a CUDA graph cycle through this many (token, state) sets: 16 sets
#: of the b256 d4096 w4 case move 134 MB, more than the L2 cache of an H100 or H200 (50-60
#: MB), so the graph's steps read their states from HBM as a model's layers do.
DECODE_SETS = 16


def _decode_sets(case: SeqCase, dtype, device) -> dict[str, list]:
    """{provider: DECODE_SETS decode calls}, each on its own random token and state (each
    provider a copy of the states: a step shifts its state in place)."""
    import fastconv

    g = torch.Generator(device="cpu").manual_seed(1)
    w = (torch.randn(case.dim, case.width, generator=g) * case.width ** -0.5).to(device, dtype)
    b = torch.randn(case.dim, generator=g).to(device, dtype)
    steps = {"fastconv": lambda t, s: fastconv.causal_conv1d_update(t, s, w, b, "silu"),
             "torch": lambda t, s: _torch_update(t, s, w, b)}
    sets = [(torch.randn(case.batch, case.dim, generator=g).to(device, dtype),
             torch.randn(case.batch, case.dim, case.width - 1, generator=g).to(device, dtype))
            for _ in range(DECODE_SETS)]
    return {provider: [lambda t=t, s=s.clone(), step=step: step(t, s) for t, s in sets]
            for provider, step in steps.items()}


def _graph_sets(case: SeqCase, dtype, device, train: bool, moved: int) -> dict[str, list]:
    """{provider: calls} to replay in a CUDA graph: decode steps over ``DECODE_SETS``
    states; other cases over operand sets of their own (``rotation_count`` of a pass's
    bytes: together more than the L2 cache twice over)."""
    from ...costs import rotation_count

    if case.kind == "decode":
        return _decode_sets(case, dtype, device)
    sets = [_calls(case, dtype, device, train, seed=1 + i, reference=False)[0]
            for i in range(rotation_count(moved))]
    return {provider: [s[provider] for s in sets] for provider in sets[0]}


def run_case(case: SeqCase, providers: list[str], precision: Precision, mode: str,
             device: str = "cuda", timer=None, reps: int = 50,
             hbm_gbps: float | None = None) -> list[dict]:
    """One row per provider: median ms, relative error against float64, ``min_bytes``,
    and ``hbm_pct`` where the copy bandwidth ``hbm_gbps`` was measured."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: the seqconv suite runs {', '.join(MODES)}")
    if case.kind == "decode" and mode != "fwd":
        return []  # a decode step has no backward
    dtype = {Precision.BF16: torch.bfloat16, Precision.FP16: torch.float16}.get(
        precision, torch.float32)
    calls, ref, moved = _calls(case, dtype, device, mode == "train")
    rows, ready = [], {}
    for provider in providers:
        row = dict(case=case.name, provider=provider, precision=precision.value, mode=mode,
                   batch=case.batch, dim=case.dim, seqlen=case.seqlen, width=case.width,
                   min_bytes=moved)
        rows.append(row)
        if provider not in calls:
            row["error"] = f"not a seqconv provider (use {', '.join(calls)})"
            continue
        try:
            row["rel_err"] = relative_error(calls[provider](), ref)
        except Exception as exc:  # reported, not fatal
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            continue
        ready[provider] = row
    if timer is None:
        for row in ready.values():
            row.update(ms_p50=None, timing="not measured (no GPU)")
        return rows
    from .timers import percentiles

    times = timer.eager_rounds({p: [calls[p]] for p in ready}, reps)
    # eager decode steps and small training steps are the host's; a model's layers run in
    # a graph, without it
    graphed = _graph_sets(case, dtype, device, mode == "train", moved)
    for provider, row in ready.items():
        p50, p20, p80 = percentiles(times[provider])
        row.update(ms_p50=p50, ms_p20=p20, ms_p80=p80)
        if hbm_gbps:
            row["hbm_pct"] = 100.0 * moved / (hbm_gbps * 1e6) / p50
        graph = timer.graph(graphed[provider]) if provider in graphed else None
        if graph:
            row["graph_ms_p50"] = sorted(graph)[len(graph) // 2]
            if hbm_gbps:
                row["graph_hbm_pct"] = 100.0 * moved / (hbm_gbps * 1e6) / row["graph_ms_p50"]
    return rows
