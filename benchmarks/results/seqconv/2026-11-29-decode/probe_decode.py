"""Probe (2026-11-29): the one-token decode kernel at 21 % of the HBM floor at b256 d4096 w4
(graph time). Times, in CUDA graphs of 16 steps over 16 states (past the L2, as the seqconv
bench does), the shipped kernel over BLOCK_D x num_warps, a flat variant (the state block
read and written as one contiguous range, the window's taps as strided vectors), and
torch's four-launch step. Prints one line per variant: us per step and % of the floor
(bytes: token and output, the state read and written, at the measured copy bandwidth).
Run 3 added *rows* (the flat variant over 1-8 batch rows per program), run 4 *cols*
(one vector of channels per state position) with and without cache hints, run 5
(COPY_ONLY=1) torch's copy and in-place multiply of the same bytes, beside the flat kernel.
Run on the device: PYTHONPATH=src python3 probe_decode.py"""

import json
import os
import sys

import torch
import triton
import triton.language as tl

from fastconv.backends.triton import decode as shipped


@triton.jit
def _flat_kernel(x_ptr, state_ptr, w_ptr, b_ptr, out_ptr, dim, sx_b, ss_b, so_b,
                 STATE_LEN: tl.constexpr, WIDTH: tl.constexpr, BLOCK_D: tl.constexpr,
                 BLOCK_F: tl.constexpr, SILU: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    d0 = tl.program_id(1) * BLOCK_D
    ch = d0 + tl.arange(0, BLOCK_D)
    cmask = ch < dim
    base = state_ptr + b * ss_b + d0 * STATE_LEN
    token = tl.load(x_ptr + b * sx_b + ch, mask=cmask, other=0.0)
    acc = token.to(tl.float32) * tl.load(w_ptr + ch * WIDTH + (WIDTH - 1), mask=cmask,
                                         other=0.0).to(tl.float32)
    for j in tl.static_range(WIDTH - 1):
        s = tl.load(base + tl.arange(0, BLOCK_D) * STATE_LEN + (STATE_LEN - (WIDTH - 1) + j),
                    mask=cmask, other=0.0)
        acc += s.to(tl.float32) * tl.load(w_ptr + ch * WIDTH + j, mask=cmask,
                                          other=0.0).to(tl.float32)
    acc += tl.load(b_ptr + ch, mask=cmask, other=0.0).to(tl.float32)
    if SILU:
        acc = acc * tl.sigmoid(acc)
    tl.store(out_ptr + b * so_b + ch, acc.to(out_ptr.dtype.element_ty), mask=cmask)
    i = tl.arange(0, BLOCK_F)
    valid = (i < BLOCK_D * STATE_LEN) & (d0 * STATE_LEN + i < dim * STATE_LEN)
    last = (i % STATE_LEN) == STATE_LEN - 1
    later = tl.load(base + i + 1, mask=valid & ~last, other=0.0)
    tok = tl.load(x_ptr + b * sx_b + d0 + i // STATE_LEN, mask=valid & last, other=0.0)
    tl.debug_barrier()
    tl.store(base + i, tl.where(last, tok.to(later.dtype), later), mask=valid)


def flat_step(x, state, w, bias, block_d, warps):
    batch, dim = x.shape
    out = torch.empty_like(x)
    L = state.shape[-1]
    grid = (batch, triton.cdiv(dim, block_d))
    _flat_kernel[grid](x, state, w, bias, out, dim, x.stride(0), state.stride(0), out.stride(0),
                       STATE_LEN=L, WIDTH=w.shape[1], BLOCK_D=block_d,
                       BLOCK_F=triton.next_power_of_2(block_d * L), SILU=True,
                       num_warps=warps)
    return out


@triton.jit
def _gather_kernel(x_ptr, state_ptr, w_ptr, b_ptr, out_ptr, dim, sx_b, ss_b, so_b,
                   STATE_LEN: tl.constexpr, WIDTH: tl.constexpr, BLOCK_D: tl.constexpr,
                   BLOCK_F: tl.constexpr, SILU: tl.constexpr):
    """The flat variant with one aligned load of the state block: the shift and the
    window's taps are gathers of the loaded registers."""
    b = tl.program_id(0).to(tl.int64)
    d0 = tl.program_id(1) * BLOCK_D
    c = tl.arange(0, BLOCK_D)
    ch = d0 + c
    cmask = ch < dim
    base = state_ptr + b * ss_b + d0 * STATE_LEN
    i = tl.arange(0, BLOCK_F)
    valid = (i < BLOCK_D * STATE_LEN) & (d0 * STATE_LEN + i < dim * STATE_LEN)
    old = tl.load(base + i, mask=valid, other=0.0)
    token = tl.load(x_ptr + b * sx_b + ch, mask=cmask, other=0.0)
    acc = token.to(tl.float32) * tl.load(w_ptr + ch * WIDTH + (WIDTH - 1), mask=cmask,
                                         other=0.0).to(tl.float32)
    for j in tl.static_range(WIDTH - 1):
        s = tl.gather(old, c * STATE_LEN + (STATE_LEN - (WIDTH - 1) + j), 0)
        acc += s.to(tl.float32) * tl.load(w_ptr + ch * WIDTH + j, mask=cmask,
                                          other=0.0).to(tl.float32)
    acc += tl.load(b_ptr + ch, mask=cmask, other=0.0).to(tl.float32)
    if SILU:
        acc = acc * tl.sigmoid(acc)
    tl.store(out_ptr + b * so_b + ch, acc.to(out_ptr.dtype.element_ty), mask=cmask)
    later = tl.gather(old, tl.minimum(i + 1, BLOCK_F - 1), 0)
    tok = tl.gather(token, tl.minimum(i // STATE_LEN, BLOCK_D - 1), 0)
    last = (i % STATE_LEN) == STATE_LEN - 1
    tl.store(base + i, tl.where(last, tok.to(old.dtype), later), mask=valid)


def gather_step(x, state, w, bias, block_d, warps):
    batch, dim = x.shape
    out = torch.empty_like(x)
    L = state.shape[-1]
    _gather_kernel[(batch, triton.cdiv(dim, block_d))](
        x, state, w, bias, out, dim, x.stride(0), state.stride(0), out.stride(0),
        STATE_LEN=L, WIDTH=w.shape[1], BLOCK_D=block_d,
        BLOCK_F=triton.next_power_of_2(block_d * L), SILU=True, num_warps=warps)
    return out


@triton.jit
def _rows_kernel(x_ptr, state_ptr, w_ptr, b_ptr, out_ptr, dim, batch, sx_b, ss_b, so_b,
                 STATE_LEN: tl.constexpr, WIDTH: tl.constexpr, BLOCK_D: tl.constexpr,
                 BLOCK_F: tl.constexpr, ROWS: tl.constexpr, SILU: tl.constexpr):
    """The flat variant over ROWS batch rows per program (more bytes in flight)."""
    r = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)[:, None]
    rmask = r < batch
    d0 = tl.program_id(1) * BLOCK_D
    c = tl.arange(0, BLOCK_D)[None, :]
    ch = d0 + c
    cmask = (ch < dim) & rmask
    base = state_ptr + r * ss_b + d0 * STATE_LEN
    token = tl.load(x_ptr + r * sx_b + ch, mask=cmask, other=0.0)
    acc = token.to(tl.float32) * tl.load(w_ptr + ch * WIDTH + (WIDTH - 1), mask=ch < dim,
                                         other=0.0).to(tl.float32)
    for j in tl.static_range(WIDTH - 1):
        s = tl.load(base + c * STATE_LEN + (STATE_LEN - (WIDTH - 1) + j), mask=cmask, other=0.0)
        acc += s.to(tl.float32) * tl.load(w_ptr + ch * WIDTH + j, mask=ch < dim,
                                          other=0.0).to(tl.float32)
    acc += tl.load(b_ptr + ch, mask=ch < dim, other=0.0).to(tl.float32)
    if SILU:
        acc = acc * tl.sigmoid(acc)
    tl.store(out_ptr + r * so_b + ch, acc.to(out_ptr.dtype.element_ty), mask=cmask)
    i = tl.arange(0, BLOCK_F)[None, :]
    valid = (i < BLOCK_D * STATE_LEN) & (d0 * STATE_LEN + i < dim * STATE_LEN) & rmask
    last = (i % STATE_LEN) == STATE_LEN - 1
    later = tl.load(base + i + 1, mask=valid & ~last, other=0.0)
    tok = tl.load(x_ptr + r * sx_b + d0 + i // STATE_LEN, mask=valid & last, other=0.0)
    tl.debug_barrier()
    tl.store(base + i, tl.where(last, tok.to(later.dtype), later), mask=valid)


def rows_step(x, state, w, bias, block_d, warps, rows):
    batch, dim = x.shape
    out = torch.empty_like(x)
    L = state.shape[-1]
    _rows_kernel[(triton.cdiv(batch, rows), triton.cdiv(dim, block_d))](
        x, state, w, bias, out, dim, batch, x.stride(0), state.stride(0), out.stride(0),
        STATE_LEN=L, WIDTH=w.shape[1], BLOCK_D=block_d,
        BLOCK_F=triton.next_power_of_2(block_d * L), ROWS=rows, SILU=True, num_warps=warps)
    return out


@triton.jit
def _cols_kernel(x_ptr, state_ptr, w_ptr, b_ptr, out_ptr, dim, sx_b, ss_b, so_b,
                 STATE_LEN: tl.constexpr, WIDTH: tl.constexpr, BLOCK_D: tl.constexpr,
                 SILU: tl.constexpr, HINTS: tl.constexpr):
    """Run 4: one vector of the channels per state position (STATE_LEN strided loads, the
    taps the last WIDTH - 1 of them, STATE_LEN strided stores); HINTS: evict-first
    loads and streaming stores of the state."""
    b = tl.program_id(0).to(tl.int64)
    ch = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    cmask = ch < dim
    rows = state_ptr + b * ss_b + ch * STATE_LEN
    token = tl.load(x_ptr + b * sx_b + ch, mask=cmask, other=0.0)
    acc = token.to(tl.float32) * tl.load(w_ptr + ch * WIDTH + (WIDTH - 1), mask=cmask,
                                         other=0.0).to(tl.float32)
    acc += tl.load(b_ptr + ch, mask=cmask, other=0.0).to(tl.float32)
    if HINTS:
        prev = tl.load(rows, mask=cmask, other=0.0, eviction_policy="evict_first")
    else:
        prev = tl.load(rows, mask=cmask, other=0.0)
    if STATE_LEN - (WIDTH - 1) == 0:
        acc += prev.to(tl.float32) * tl.load(w_ptr + ch * WIDTH, mask=cmask,
                                             other=0.0).to(tl.float32)
    for p in tl.static_range(1, STATE_LEN):
        if HINTS:
            v = tl.load(rows + p, mask=cmask, other=0.0, eviction_policy="evict_first")
            tl.store(rows + (p - 1), v, mask=cmask, cache_modifier=".cs")
        else:
            v = tl.load(rows + p, mask=cmask, other=0.0)
            tl.store(rows + (p - 1), v, mask=cmask)
        if p >= STATE_LEN - (WIDTH - 1):
            j = p - (STATE_LEN - (WIDTH - 1))
            acc += v.to(tl.float32) * tl.load(w_ptr + ch * WIDTH + j, mask=cmask,
                                              other=0.0).to(tl.float32)
    if HINTS:
        tl.store(rows + (STATE_LEN - 1), token, mask=cmask, cache_modifier=".cs")
    else:
        tl.store(rows + (STATE_LEN - 1), token, mask=cmask)
    if SILU:
        acc = acc * tl.sigmoid(acc)
    tl.store(out_ptr + b * so_b + ch, acc.to(out_ptr.dtype.element_ty), mask=cmask)


def cols_step(x, state, w, bias, block_d, warps, hints=False):
    batch, dim = x.shape
    out = torch.empty_like(x)
    _cols_kernel[(batch, triton.cdiv(dim, block_d))](
        x, state, w, bias, out, dim, x.stride(0), state.stride(0), out.stride(0),
        STATE_LEN=state.shape[-1], WIDTH=w.shape[1], BLOCK_D=block_d, SILU=True,
        HINTS=hints, num_warps=warps)
    return out


def shipped_step(x, state, w, bias, *_):
    """The kernel as committed (run 3: the flat kernel of a8a57f6, its own tile)."""
    return shipped.decode_step(x, state, w, bias, True, None)


def torch_step(x, state, w, bias, *_):
    window = torch.cat([state, x.unsqueeze(-1)], -1)
    state.copy_(window[..., 1:])
    return torch.nn.functional.silu(torch.nn.functional.conv1d(
        window, w.unsqueeze(1), bias, groups=x.shape[1]))[..., -1]


def graph_us(step, sets, args, reps=20):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for x, st in sets[:3]:
            step(x, st, *args)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for x, st in sets:
            step(x, st, *args)
    g.replay()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
          for _ in range(reps)]
    for a, e in ev:
        a.record()
        g.replay()
        e.record()
    torch.cuda.synchronize()
    t = sorted(a.elapsed_time(e) for a, e in ev)
    return t[len(t) // 2] * 1e3 / len(sets)


def copy_gbps():
    a = torch.empty(1 << 29, device="cuda", dtype=torch.uint8).random_()
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(10):
        b.copy_(a)
    e1.record()
    torch.cuda.synchronize()
    return 2 * a.numel() * 10 / (e0.elapsed_time(e1) * 1e-3) / 1e9


def main():
    gbps = copy_gbps()
    print(f"# {torch.cuda.get_device_name()} copy {gbps:.0f} GB/s", flush=True)
    dim, width, dt = 4096, 4, torch.bfloat16
    for batch in (1, 16, 256):
        g = torch.Generator(device="cpu").manual_seed(batch)
        w = (torch.randn(dim, width, generator=g) / 2).to("cuda", dt)
        bias = torch.randn(dim, generator=g).to("cuda", dt)
        sets = [(torch.randn(batch, dim, generator=g).to("cuda", dt),
                 torch.randn(batch, dim, width - 1, generator=g).to("cuda", dt))
                for _ in range(16)]
        floor_us = 2 * batch * dim * (2 + 2 * (width - 1)) / (gbps * 1e3)
        # correctness of the flat variant against torch's step, on copies
        x0, s0 = sets[0]
        sa, sb = s0.clone(), s0.clone()
        ref = torch_step(x0, sa, w, bias)
        for name, fn in (("flat", flat_step), ("gather", gather_step),
                         ("cols", cols_step),
                         ("rows2", lambda *a: rows_step(*a, 2)),
                         ("rows4", lambda *a: rows_step(*a, 4))):
            sb = s0.clone()
            got = fn(x0, sb, w, bias, 128, 4)
            torch.cuda.synchronize()
            err = ((got.float() - ref.float()).norm() / ref.float().norm()).item()
            print(f"b{batch} {name} check: out rel err {err:.2e}, state equal "
                  f"{bool(torch.equal(sa, sb))}", flush=True)
        variants = [("torch", torch_step, ()), ("shipped", shipped_step, ()),
                    ("flat d128 w4", flat_step, (128, 4)),
                    ("gather d128 w4", gather_step, (128, 4))]
        for bd in (64, 128, 256, 512, 1024):
            for nw in (1, 2, 4, 8):
                variants.append((f"cols d{bd} w{nw}", cols_step, (bd, nw)))
                variants.append((f"cols+hints d{bd} w{nw}", cols_step, (bd, nw, True)))
        if os.environ.get("COPY_ONLY"):  # run 5: the same bytes moved by torch's own kernels
            variants = [("flat d128 w4", flat_step, (128, 4)), ("shipped", shipped_step, ())]
            flat = [torch.randn(batch * dim * width, device="cuda").to(dt) for _ in sets]
            dsts = [torch.empty_like(f) for f in flat]
            for name, fns in (("copy (one kernel, 2 buffers)",
                               [lambda f=f, o=o: o.copy_(f) for f, o in zip(flat, dsts)]),
                              ("in-place mul_ (one kernel)",
                               [lambda f=f: f.mul_(1.0) for f in flat])):
                us = graph_us(lambda fn, _: fn(), [(fn, None) for fn in fns], ())
                print(json.dumps(dict(batch=batch, variant=name, us=round(us, 3),
                                      floor_pct=round(100 * floor_us / us, 1))), flush=True)
        for name, step, extra in variants:
            own = [(x, st.clone()) for x, st in sets]
            try:
                us = graph_us(step, own, (w, bias) + extra)
            except Exception as exc:
                print(f"b{batch} {name}: {type(exc).__name__} {str(exc)[:100]}")
                continue
            print(json.dumps(dict(batch=batch, variant=name, us=round(us, 3),
                                  floor_pct=round(100 * floor_us / us, 1))), flush=True)


if __name__ == "__main__":
    sys.exit(main())
