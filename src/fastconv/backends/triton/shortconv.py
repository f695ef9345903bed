"""causal_conv1d for short filters (width ≤ 17): its training route (either layout, with or
without ``seq_idx``), its calls without autograd (x seqlen-contiguous) and its packed
sequences' (``seq_idx``, either layout). Forward and backward one pass each, every load
aligned where x is seqlen-contiguous.

A program holds ``BLOCK_D`` channels × ``8·CHUNKS`` positions of one batch row as eight
*columns*: column ``e`` holds positions ``8q + e`` (q < CHUNKS), split in registers from a
``[BLOCK_D, CHUNKS, 8]`` load (16-byte vectors of 16-bit data). Tap ``k`` of position
``8q + e`` reads position ``8q + e − s`` (``s = width − 1 − k`` ≤ 16): column ``e − s`` of
the same chunk where ``e ≥ s``, else column ``8 + e − s`` of the chunk before, which is the
same window loaded 8 positions earlier (an aligned load that hits the cache), or for widths
from 10 column ``16 + e − s`` of the one loaded 16 positions earlier (``LOOK``: the chunks a
tap reaches back, 1 or 2). No shift
moves data between threads, so taps cost multiply-adds only (packed.py's kernels load each
tap's window at its own, unaligned, offset: 2-byte loads). x dim-contiguous (a (batch,
seqlen, dim) tensor transposed, as Mamba's blocks pass it) takes the same kernels with
windows of many channels, each column loaded on its own (the loads' vectors run along the
channels, so a column is already in the registers that use it); without ``seq_idx`` its
backward (and its forward at widths 10-17) runs shortrows.py's kernels instead, a position
at a time (``shortrows.TILES``). SiLU's sigmoid is four
approximate PTX instructions in compiled kernels (:func:`_sigmoid`): the backward's time
follows the instructions it issues (at width 4, 0.66 of an H200's issue rate against 71 % of
its byte floor).

Forward: the chunk and the LOOK before → bias, SiLU → the output. Backward: x at
−8·LOOK … +8·LOOK and dy at 0 … +8·LOOK → the pre-activation of this chunk and the LOOK
after recomputed → ``g = dy · SiLU'`` → dx (tap ``k`` of g read ``s`` positions later:
columns of this chunk or the LOOK after; at widths 10-17 in windows of 16 chunks or more,
x at −16 … 0 and dy at 0 only → g once per chunk, the two after read from the window's
own g, windows overlapping by two chunks: :func:`owned`) → the weight's and bias's sums
over the window, added in a fixed order after the pass; the initial states' gradient is
dx of the positions before 0 (a first window starting 8·LOOK positions early). At widths
up to 9 without ``seq_idx``, where ``PAIRS`` has a tile, the backward holds chunks of 16
positions as two sets of eight columns (:func:`_backward_pairs_kernel`), so g of the
positions after a chunk is recomputed once per 16 positions. x and dy
are read once from memory, dx written once. With ``seq_idx`` the ids are held as columns
too, and a tap counts only where both positions have the same id (positions before 0 have
position 0's: the initial states belong to the first sequence).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import cdiv, launch
from .shortparts import _sigmoid, _store_part, _taps, backward_buffers, weight_sums
from .shortrows import rows_backward, rows_forward
from .shortrows import tiles as rows_tiles


@triton.jit
def _columns(v, BLOCK_D: tl.constexpr, CHUNKS: tl.constexpr):
    """The eight columns ([BLOCK_D, CHUNKS] each) of a [BLOCK_D, CHUNKS, 8] window."""
    even, odd = tl.split(tl.reshape(v, [BLOCK_D, CHUNKS, 4, 2]))  # positions 2f, 2f + 1
    e04, e26 = tl.split(tl.reshape(even, [BLOCK_D, CHUNKS, 2, 2]))  # 4g, 4g + 2
    e15, e37 = tl.split(tl.reshape(odd, [BLOCK_D, CHUNKS, 2, 2]))  # 4g + 1, 4g + 3
    c0, c4 = tl.split(e04)
    c2, c6 = tl.split(e26)
    c1, c5 = tl.split(e15)
    c3, c7 = tl.split(e37)
    return c0, c1, c2, c3, c4, c5, c6, c7


@triton.jit
def _window(c, BLOCK_D: tl.constexpr, CHUNKS: tl.constexpr):
    """The [BLOCK_D, CHUNKS, 8] window of eight columns (:func:`_columns`' inverse)."""
    even = tl.reshape(tl.join(tl.join(c[0], c[4]), tl.join(c[2], c[6])),
                      [BLOCK_D, CHUNKS, 4])
    odd = tl.reshape(tl.join(tl.join(c[1], c[5]), tl.join(c[3], c[7])),
                     [BLOCK_D, CHUNKS, 4])
    return tl.reshape(tl.join(even, odd), [BLOCK_D, CHUNKS, 8])


@triton.jit
def _at(ptr, init_ptr, rows, b, dd, dm, p, seqlen, s_t, sh_b, sh_d, sh_k, WIDTH: tl.constexpr,
        HAS_INIT: tl.constexpr):
    """A tensor at positions ``p`` of the rows ``rows`` (channels ``dd``, where ``dm``), in
    float32 (``initial_states`` before 0 where given, zero elsewhere outside)."""
    inside = (p >= 0) & (p < seqlen)
    v = tl.load(ptr + rows + p.to(tl.int64) * s_t, mask=dm & inside, other=0.0).to(tl.float32)
    if HAS_INIT:
        before = (p < 0) & (p >= 1 - WIDTH)
        v += tl.load(init_ptr + b * sh_b + dd * sh_d + (WIDTH - 1 + p) * sh_k,
                     mask=dm & before, other=0.0).to(tl.float32)
    return v


@triton.jit
def _load(ptr, init_ptr, rows, b, d, dmask, p, seqlen, s_t, sh_b, sh_d, sh_k,
          WIDTH: tl.constexpr, HAS_INIT: tl.constexpr, BLOCK_D: tl.constexpr,
          CHUNKS: tl.constexpr, SPLIT: tl.constexpr):
    """The eight columns of a tensor at the chunks starting at positions ``p`` ([1, CHUNKS])
    of channels ``d`` (``rows``: [BLOCK_D, 1]), in float32 (see :func:`_at`): one
    [BLOCK_D, CHUNKS, 8] load split in registers where SPLIT (x seqlen-contiguous: 16-byte
    vectors along the positions), else a load per column (the vectors run along the
    channels, and no column moves between threads)."""
    if SPLIT:
        v = _at(ptr, init_ptr, rows[:, :, None], b, d[:, None, None], dmask[:, None, None],
                p[:, :, None] + tl.arange(0, 8)[None, None, :], seqlen, s_t, sh_b, sh_d, sh_k,
                WIDTH, HAS_INIT)
        return _columns(v, BLOCK_D, CHUNKS)
    dd, dm = d[:, None], dmask[:, None]
    return (_at(ptr, init_ptr, rows, b, dd, dm, p, seqlen, s_t, sh_b, sh_d, sh_k, WIDTH,
                HAS_INIT),
            _at(ptr, init_ptr, rows, b, dd, dm, p + 1, seqlen, s_t, sh_b, sh_d, sh_k, WIDTH,
                HAS_INIT),
            _at(ptr, init_ptr, rows, b, dd, dm, p + 2, seqlen, s_t, sh_b, sh_d, sh_k, WIDTH,
                HAS_INIT),
            _at(ptr, init_ptr, rows, b, dd, dm, p + 3, seqlen, s_t, sh_b, sh_d, sh_k, WIDTH,
                HAS_INIT),
            _at(ptr, init_ptr, rows, b, dd, dm, p + 4, seqlen, s_t, sh_b, sh_d, sh_k, WIDTH,
                HAS_INIT),
            _at(ptr, init_ptr, rows, b, dd, dm, p + 5, seqlen, s_t, sh_b, sh_d, sh_k, WIDTH,
                HAS_INIT),
            _at(ptr, init_ptr, rows, b, dd, dm, p + 6, seqlen, s_t, sh_b, sh_d, sh_k, WIDTH,
                HAS_INIT),
            _at(ptr, init_ptr, rows, b, dd, dm, p + 7, seqlen, s_t, sh_b, sh_d, sh_k, WIDTH,
                HAS_INIT))


@triton.jit
def _store(ptr, cols, rows, dmask, p, s_t, lo, hi, keep, BLOCK_D: tl.constexpr,
           CHUNKS: tl.constexpr, SPLIT: tl.constexpr):
    """Stores eight columns at the chunks starting at ``p`` ([1, CHUNKS]) of the rows
    ``rows`` ([BLOCK_D, 1]), at the positions in [lo, hi) of the chunks where ``keep``
    ([1, CHUNKS]); as one [BLOCK_D, CHUNKS, 8] store where SPLIT, else a store per column
    (see :func:`_load`)."""
    if SPLIT:
        q = p[:, :, None] + tl.arange(0, 8)[None, None, :]
        tl.store(ptr + rows[:, :, None] + q.to(tl.int64) * s_t,
                 _window(cols, BLOCK_D, CHUNKS).to(ptr.dtype.element_ty),
                 mask=dmask[:, None, None] & keep[:, :, None] & (q >= lo) & (q < hi))
    else:
        for e in tl.static_range(8):
            tl.store(ptr + rows + (p + e).to(tl.int64) * s_t, cols[e].to(ptr.dtype.element_ty),
                     mask=dmask[:, None] & keep & (p + e >= lo) & (p + e < hi))


@triton.jit
def _back(cur, prev, prev2, C: tl.constexpr):
    """Column C of a chunk (0 ≤ C < 8), of the one before (−8 ≤ C < 0) or of the one
    before that (−16 ≤ C < −8)."""
    if C >= 0:
        return cur[C]
    elif C >= -8:
        return prev[8 + C]
    else:
        return prev2[16 + C]


@triton.jit
def _ids_at(ids_ptr, b, p, seqlen, si_b, si_t, first):
    v = tl.load(ids_ptr + b * si_b + p.to(tl.int64) * si_t, mask=(p >= 0) & (p < seqlen),
                other=0)
    return tl.where(p < 0, first, v)


@triton.jit
def _load_ids(ids_ptr, b, p, seqlen, si_b, si_t, first, CHUNKS: tl.constexpr,
              SPLIT: tl.constexpr):
    """The columns ([1, CHUNKS] each) of the row's ``seq_idx`` at the chunks starting at
    ``p``; positions before 0 have position 0's (``first``), those past the end any (nothing
    there counts: x and dy are zero)."""
    if SPLIT:
        return _columns(_ids_at(ids_ptr, b, p[:, :, None] + tl.arange(0, 8)[None, None, :],
                                seqlen, si_b, si_t, first), 1, CHUNKS)
    return (_ids_at(ids_ptr, b, p, seqlen, si_b, si_t, first),
            _ids_at(ids_ptr, b, p + 1, seqlen, si_b, si_t, first),
            _ids_at(ids_ptr, b, p + 2, seqlen, si_b, si_t, first),
            _ids_at(ids_ptr, b, p + 3, seqlen, si_b, si_t, first),
            _ids_at(ids_ptr, b, p + 4, seqlen, si_b, si_t, first),
            _ids_at(ids_ptr, b, p + 5, seqlen, si_b, si_t, first),
            _ids_at(ids_ptr, b, p + 6, seqlen, si_b, si_t, first),
            _ids_at(ids_ptr, b, p + 7, seqlen, si_b, si_t, first))


@triton.jit
def _masked(v, ids, ids_prev, ids_prev2, C: tl.constexpr, E: tl.constexpr,
            HAS_IDS: tl.constexpr):
    """``v``, the value at column C (:func:`_back`) seen from column E, where both have
    the same ``seq_idx``, else zero (as is: without ids)."""
    if HAS_IDS:
        v = tl.where(_back(ids, ids_prev, ids_prev2, C) == ids[E], v, 0.0)
    return v


@triton.jit
def _pre(cur, prev, prev2, ic, ip, ip2, w, bias, E: tl.constexpr, WIDTH: tl.constexpr,
         HAS_IDS: tl.constexpr):
    """The pre-activation at column E: Σ_k w[k]·x[8q + E − (WIDTH − 1 − k)] + bias (with
    ids ``ic``/``ip``/``ip2``: the taps in E's sequence only)."""
    acc = bias[:, None] + tl.zeros(cur[0].shape, tl.float32)
    for k in tl.static_range(WIDTH):
        # (the column read, E − s: a constant per tap, spelled out: a constexpr assigned in
        # a static loop is a reassignment, which Triton's compiler refuses)
        acc += _masked(_back(cur, prev, prev2, E - (WIDTH - 1 - k)), ic, ip, ip2,
                       E - (WIDTH - 1 - k), E, HAS_IDS) * w[k][:, None]
    return acc


@triton.jit
def _positions(FIRST: tl.constexpr, BLOCK_D: tl.constexpr, CHUNKS: tl.constexpr,
               OWN: tl.constexpr, SPAN: tl.constexpr):
    """(the first positions [1, CHUNKS] of this program's window's chunks of SPAN positions,
    channels, row); windows start ``SPAN·OWN`` positions apart (OWN < CHUNKS: they overlap
    by the last CHUNKS − OWN)."""
    p = tl.program_id(0) * (SPAN * OWN) + FIRST + SPAN * tl.arange(0, CHUNKS)[None, :]
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    return p, d, tl.program_id(2).to(tl.int64)


@triton.jit
def _out(cur, prev, prev2, ic, ip, ip2, w, bias, E: tl.constexpr, WIDTH: tl.constexpr,
         SILU: tl.constexpr, HAS_IDS: tl.constexpr):
    v = _pre(cur, prev, prev2, ic, ip, ip2, w, bias, E, WIDTH, HAS_IDS)
    if SILU:
        v = v * _sigmoid(v)
    return v


@triton.jit
def _forward_kernel(x_ptr, ids_ptr, init_ptr, w_ptr, b_ptr, out_ptr, dim, seqlen, sx_b,
                    sx_d, sx_t, si_b, si_t, sh_b, sh_d, sh_k, sw_d, sw_k, so_b, so_d, so_t,
                    WIDTH: tl.constexpr, LOOK: tl.constexpr, BLOCK_D: tl.constexpr,
                    CHUNKS: tl.constexpr, HAS_INIT: tl.constexpr, HAS_BIAS: tl.constexpr,
                    SILU: tl.constexpr, HAS_IDS: tl.constexpr, SPLIT: tl.constexpr):
    p, d, b = _positions(0, BLOCK_D, CHUNKS, CHUNKS, 8)
    dmask = d < dim
    rows = b * sx_b + d[:, None].to(tl.int64) * sx_d
    cur = _load(x_ptr, init_ptr, rows, b, d, dmask, p, seqlen, sx_t, sh_b, sh_d, sh_k, WIDTH,
                HAS_INIT, BLOCK_D, CHUNKS, SPLIT)
    prev = _load(x_ptr, init_ptr, rows, b, d, dmask, p - 8, seqlen, sx_t, sh_b, sh_d, sh_k,
                 WIDTH, HAS_INIT, BLOCK_D, CHUNKS, SPLIT)
    prev2 = prev  # (read only where LOOK is 2)
    if LOOK == 2:
        prev2 = _load(x_ptr, init_ptr, rows, b, d, dmask, p - 16, seqlen, sx_t, sh_b, sh_d,
                      sh_k, WIDTH, HAS_INIT, BLOCK_D, CHUNKS, SPLIT)
    w, bias = _taps(w_ptr, b_ptr, d, dmask, sw_d, sw_k, WIDTH, HAS_BIAS)
    ic, ip, ip2 = cur, prev, prev2  # (the ids: read only with seq_idx)
    if HAS_IDS:
        first = tl.load(ids_ptr + b * si_b)
        ic = _load_ids(ids_ptr, b, p, seqlen, si_b, si_t, first, CHUNKS, SPLIT)
        ip = _load_ids(ids_ptr, b, p - 8, seqlen, si_b, si_t, first, CHUNKS, SPLIT)
        ip2 = ip
        if LOOK == 2:
            ip2 = _load_ids(ids_ptr, b, p - 16, seqlen, si_b, si_t, first, CHUNKS, SPLIT)
    y = (_out(cur, prev, prev2, ic, ip, ip2, w, bias, 0, WIDTH, SILU, HAS_IDS),
         _out(cur, prev, prev2, ic, ip, ip2, w, bias, 1, WIDTH, SILU, HAS_IDS),
         _out(cur, prev, prev2, ic, ip, ip2, w, bias, 2, WIDTH, SILU, HAS_IDS),
         _out(cur, prev, prev2, ic, ip, ip2, w, bias, 3, WIDTH, SILU, HAS_IDS),
         _out(cur, prev, prev2, ic, ip, ip2, w, bias, 4, WIDTH, SILU, HAS_IDS),
         _out(cur, prev, prev2, ic, ip, ip2, w, bias, 5, WIDTH, SILU, HAS_IDS),
         _out(cur, prev, prev2, ic, ip, ip2, w, bias, 6, WIDTH, SILU, HAS_IDS),
         _out(cur, prev, prev2, ic, ip, ip2, w, bias, 7, WIDTH, SILU, HAS_IDS))
    _store(out_ptr, y, b * so_b + d[:, None].to(tl.int64) * so_d, dmask, p, so_t, 0, seqlen,
           p >= 0, BLOCK_D, CHUNKS, SPLIT)  # (every chunk: a forward window owns all)


@triton.jit
def _grad(dy, cur, prev, prev2, ic, ip, ip2, w, bias, E: tl.constexpr, WIDTH: tl.constexpr,
          SILU: tl.constexpr, HAS_IDS: tl.constexpr):
    """The pre-activation's gradient at column E: dy · SiLU'(pre), or dy."""
    g = dy[E]
    if SILU:
        pre = _pre(cur, prev, prev2, ic, ip, ip2, w, bias, E, WIDTH, HAS_IDS)
        sig = _sigmoid(pre)
        g = g * sig * (1 + pre * (1 - sig))
    return g


@triton.jit
def _grads(dy, cur, prev, prev2, ic, ip, ip2, w, bias, WIDTH: tl.constexpr,
           SILU: tl.constexpr, HAS_IDS: tl.constexpr):
    """:func:`_grad` of the eight columns of a chunk (``cur``) given the two before."""
    return (_grad(dy, cur, prev, prev2, ic, ip, ip2, w, bias, 0, WIDTH, SILU, HAS_IDS),
            _grad(dy, cur, prev, prev2, ic, ip, ip2, w, bias, 1, WIDTH, SILU, HAS_IDS),
            _grad(dy, cur, prev, prev2, ic, ip, ip2, w, bias, 2, WIDTH, SILU, HAS_IDS),
            _grad(dy, cur, prev, prev2, ic, ip, ip2, w, bias, 3, WIDTH, SILU, HAS_IDS),
            _grad(dy, cur, prev, prev2, ic, ip, ip2, w, bias, 4, WIDTH, SILU, HAS_IDS),
            _grad(dy, cur, prev, prev2, ic, ip, ip2, w, bias, 5, WIDTH, SILU, HAS_IDS),
            _grad(dy, cur, prev, prev2, ic, ip, ip2, w, bias, 6, WIDTH, SILU, HAS_IDS),
            _grad(dy, cur, prev, prev2, ic, ip, ip2, w, bias, 7, WIDTH, SILU, HAS_IDS))


@triton.jit
def _dx(g, g_next, g_next2, ic, in1, in2, w, E: tl.constexpr, WIDTH: tl.constexpr,
        HAS_IDS: tl.constexpr):
    """The input gradient at column E: Σ_k w[k]·g[8q + E + WIDTH − 1 − k] (this chunk's
    columns, the next chunk's or the one after; with ids ``ic``/``in1``/``in2``, those in
    E's sequence only)."""
    acc = tl.zeros(g[0].shape, tl.float32)
    for k in tl.static_range(WIDTH):
        # (column E + s of this chunk is column E + s − 16 counted from two chunks on)
        v = _back(g_next2, g_next, g, E + WIDTH - 1 - k - 16)
        if HAS_IDS:
            v = tl.where(_back(in2, in1, ic, E + WIDTH - 1 - k - 16) == ic[E], v, 0.0)
        acc += v * w[k][:, None]
    return acc


@triton.jit
def _dx8(g, g_next, g_next2, ic, in1, in2, w, WIDTH: tl.constexpr, HAS_IDS: tl.constexpr):
    """:func:`_dx` of the eight columns of a chunk."""
    return (_dx(g, g_next, g_next2, ic, in1, in2, w, 0, WIDTH, HAS_IDS),
            _dx(g, g_next, g_next2, ic, in1, in2, w, 1, WIDTH, HAS_IDS),
            _dx(g, g_next, g_next2, ic, in1, in2, w, 2, WIDTH, HAS_IDS),
            _dx(g, g_next, g_next2, ic, in1, in2, w, 3, WIDTH, HAS_IDS),
            _dx(g, g_next, g_next2, ic, in1, in2, w, 4, WIDTH, HAS_IDS),
            _dx(g, g_next, g_next2, ic, in1, in2, w, 5, WIDTH, HAS_IDS),
            _dx(g, g_next, g_next2, ic, in1, in2, w, 6, WIDTH, HAS_IDS),
            _dx(g, g_next, g_next2, ic, in1, in2, w, 7, WIDTH, HAS_IDS))


@triton.jit
def _tap_products(g, cur, prev, prev2, ic, ip, ip2, K: tl.constexpr, WIDTH: tl.constexpr,
                  HAS_IDS: tl.constexpr):
    """Σ_e g[8q + e]·x[8q + e − (WIDTH − 1 − K)] over a chunk's eight columns, per chunk
    ([BLOCK_D, CHUNKS]): tap K's share of the weight's gradient."""
    acc = tl.zeros(cur[0].shape, tl.float32)
    for e in tl.static_range(8):
        acc += g[e] * _masked(_back(cur, prev, prev2, e - (WIDTH - 1 - K)), ic, ip, ip2,
                              e - (WIDTH - 1 - K), e, HAS_IDS)
    return acc


@triton.jit
def _column_sum(g):
    """Σ_e g[8q + e] per chunk: the bias's share."""
    acc = tl.zeros(g[0].shape, tl.float32)
    for e in tl.static_range(8):
        acc += g[e]
    return acc


@triton.jit
def _ahead(g, BLOCK_D: tl.constexpr, CHUNKS: tl.constexpr, BY: tl.constexpr):
    """The eight columns of ``g`` (:func:`_grads`) ``BY`` chunks later, within the window:
    one gather per column (the last BY chunks repeat the window's last: not owned, never
    stored)."""
    q = tl.minimum(tl.arange(0, CHUNKS) + BY, CHUNKS - 1)
    idx = q[None, :] + tl.zeros([BLOCK_D, CHUNKS], tl.int32)
    return (tl.gather(g[0], idx, 1), tl.gather(g[1], idx, 1), tl.gather(g[2], idx, 1),
            tl.gather(g[3], idx, 1), tl.gather(g[4], idx, 1), tl.gather(g[5], idx, 1),
            tl.gather(g[6], idx, 1), tl.gather(g[7], idx, 1))


@triton.jit
def _owned(g, own):
    """The eight columns of ``g`` where ``own`` ([1, CHUNKS]), else zero."""
    return (tl.where(own, g[0], 0.0), tl.where(own, g[1], 0.0), tl.where(own, g[2], 0.0),
            tl.where(own, g[3], 0.0), tl.where(own, g[4], 0.0), tl.where(own, g[5], 0.0),
            tl.where(own, g[6], 0.0), tl.where(own, g[7], 0.0))


@triton.jit
def _backward_kernel(x_ptr, ids_ptr, init_ptr, w_ptr, b_ptr, dy_ptr, dx_ptr, dh_ptr, part_ptr,
                     dim, seqlen, sx_b, sx_d, sx_t, si_b, si_t, sh_b, sh_d, sh_k, sw_d, sw_k,
                     sy_b, sy_d, sy_t, sdx_b, sdx_d, sdx_t, sdh_b, sdh_d, sdh_k,
                     WIDTH: tl.constexpr, LOOK: tl.constexpr, TAPS: tl.constexpr,
                     FIRST: tl.constexpr, BLOCK_D: tl.constexpr, CHUNKS: tl.constexpr,
                     OWN: tl.constexpr, HAS_INIT: tl.constexpr, HAS_BIAS: tl.constexpr,
                     SILU: tl.constexpr, INIT_GRAD: tl.constexpr, HAS_IDS: tl.constexpr,
                     SPLIT: tl.constexpr):
    # FIRST: the first position of the first window (−8·LOOK with the initial states'
    # gradient: dx of the positions before 0, else 0). OWN: the chunks a window writes.
    # OWN == CHUNKS: g of the LOOK chunks after each chunk is recomputed from x and dy
    # loaded there; OWN == CHUNKS − LOOK: windows overlap by LOOK chunks and g is computed
    # once per chunk, the LOOK after read from the window's own g (gathers along the
    # chunks): the last LOOK chunks of a window are computed, not written.
    SHIFT: tl.constexpr = OWN < CHUNKS
    p, d, b = _positions(FIRST, BLOCK_D, CHUNKS, OWN, 8)
    dmask = d < dim
    rows = b * sx_b + d[:, None].to(tl.int64) * sx_d
    prev = _load(x_ptr, init_ptr, rows, b, d, dmask, p - 8, seqlen, sx_t, sh_b, sh_d, sh_k,
                 WIDTH, HAS_INIT, BLOCK_D, CHUNKS, SPLIT)
    cur = _load(x_ptr, init_ptr, rows, b, d, dmask, p, seqlen, sx_t, sh_b, sh_d, sh_k, WIDTH,
                HAS_INIT, BLOCK_D, CHUNKS, SPLIT)
    dy_rows = b * sy_b + d[:, None].to(tl.int64) * sy_d
    dy = _load(dy_ptr, init_ptr, dy_rows, b, d, dmask, p, seqlen, sy_t, sh_b, sh_d, sh_k,
               WIDTH, False, BLOCK_D, CHUNKS, SPLIT)
    nxt, dy_next = cur, dy  # (the chunk at +8: loaded without SHIFT only)
    if not SHIFT:
        nxt = _load(x_ptr, init_ptr, rows, b, d, dmask, p + 8, seqlen, sx_t, sh_b, sh_d,
                    sh_k, WIDTH, HAS_INIT, BLOCK_D, CHUNKS, SPLIT)
        dy_next = _load(dy_ptr, init_ptr, dy_rows, b, d, dmask, p + 8, seqlen, sy_t, sh_b,
                        sh_d, sh_k, WIDTH, False, BLOCK_D, CHUNKS, SPLIT)
    w, bias = _taps(w_ptr, b_ptr, d, dmask, sw_d, sw_k, WIDTH, HAS_BIAS)
    # the ids of the chunks at −8, 0, +8 (and −16, +16 where LOOK is 2): read only with
    # seq_idx (stand-ins otherwise, never read)
    ip, ic, in1 = prev, cur, nxt
    if HAS_IDS:
        first = tl.load(ids_ptr + b * si_b)
        ip = _load_ids(ids_ptr, b, p - 8, seqlen, si_b, si_t, first, CHUNKS, SPLIT)
        ic = _load_ids(ids_ptr, b, p, seqlen, si_b, si_t, first, CHUNKS, SPLIT)
        in1 = _load_ids(ids_ptr, b, p + 8, seqlen, si_b, si_t, first, CHUNKS, SPLIT)
    prev2, ip2, in2 = prev, ip, in1  # (the chunks at −16 and +16: read where LOOK is 2)
    g_next2 = dy
    if LOOK == 2:
        prev2 = _load(x_ptr, init_ptr, rows, b, d, dmask, p - 16, seqlen, sx_t, sh_b, sh_d,
                      sh_k, WIDTH, HAS_INIT, BLOCK_D, CHUNKS, SPLIT)
        if HAS_IDS:
            ip2 = _load_ids(ids_ptr, b, p - 16, seqlen, si_b, si_t, first, CHUNKS, SPLIT)
            in2 = _load_ids(ids_ptr, b, p + 16, seqlen, si_b, si_t, first, CHUNKS, SPLIT)
        if not SHIFT:
            nxt2 = _load(x_ptr, init_ptr, rows, b, d, dmask, p + 16, seqlen, sx_t, sh_b,
                         sh_d, sh_k, WIDTH, HAS_INIT, BLOCK_D, CHUNKS, SPLIT)
            dy_next2 = _load(dy_ptr, init_ptr, dy_rows, b, d, dmask, p + 16, seqlen, sy_t,
                             sh_b, sh_d, sh_k, WIDTH, False, BLOCK_D, CHUNKS, SPLIT)
            g_next2 = _grads(dy_next2, nxt2, nxt, cur, in2, in1, ic, w, bias, WIDTH, SILU,
                             HAS_IDS)
    g = _grads(dy, cur, prev, prev2, ic, ip, ip2, w, bias, WIDTH, SILU, HAS_IDS)
    if SHIFT:
        g_next = _ahead(g, BLOCK_D, CHUNKS, 1)
        if LOOK == 2:
            g_next2 = _ahead(g, BLOCK_D, CHUNKS, 2)
    else:
        g_next = _grads(dy_next, nxt, cur, prev, in1, ic, ip, w, bias, WIDTH, SILU, HAS_IDS)
    dx = _dx8(g, g_next, g_next2, ic, in1, in2, w, WIDTH, HAS_IDS)
    own = tl.arange(0, CHUNKS)[None, :] < OWN  # the chunks this window writes
    _store(dx_ptr, dx, b * sdx_b + d[:, None].to(tl.int64) * sdx_d, dmask, p, sdx_t, 0,
           seqlen, own, BLOCK_D, CHUNKS, SPLIT)
    if INIT_GRAD:
        _store(dh_ptr, dx, b * sdh_b + d[:, None] * sdh_d + (WIDTH - 1) * sdh_k, dmask, p,
               sdh_k, 1 - WIDTH, 0, own, BLOCK_D, CHUNKS, SPLIT)
    if SHIFT:  # each position's share counted by the one window that writes it
        g = _owned(g, own)
    # this window's share of dw[k] = Σ_t g[t]·x[t − (WIDTH − 1 − k)] and db = Σ_t g[t]
    # (g is zero outside [0, seqlen): dy is; one reduction across the window per tap)
    taps = tl.arange(0, TAPS)[None, :]
    part = tl.zeros([BLOCK_D, TAPS], tl.float32)
    for k in tl.static_range(WIDTH):
        acc = _tap_products(g, cur, prev, prev2, ic, ip, ip2, k, WIDTH, HAS_IDS)
        part += tl.where(taps == k, tl.sum(acc, axis=1)[:, None], 0.0)
    if HAS_BIAS:
        part += tl.where(taps == WIDTH, tl.sum(_column_sum(g), axis=1)[:, None], 0.0)
    _store_part(part_ptr, part, b, d, dmask, dim, WIDTH, TAPS)


@triton.jit
def _backward_pairs_kernel(x_ptr, init_ptr, w_ptr, b_ptr, dy_ptr, dx_ptr, dh_ptr, part_ptr,
                           dim, seqlen, sx_b, sx_d, sx_t, sh_b, sh_d, sh_k, sw_d, sw_k,
                           sy_b, sy_d, sy_t, sdx_b, sdx_d, sdx_t, sdh_b, sdh_d, sdh_k,
                           WIDTH: tl.constexpr, TAPS: tl.constexpr, FIRST: tl.constexpr,
                           BLOCK_D: tl.constexpr, CHUNKS: tl.constexpr,
                           HAS_INIT: tl.constexpr, HAS_BIAS: tl.constexpr,
                           SILU: tl.constexpr, INIT_GRAD: tl.constexpr, SPLIT: tl.constexpr):
    # _backward_kernel without seq_idx for widths up to 9 (taps reach one 8-position chunk
    # back), over chunks of 16 positions held as two sets of eight columns, a (positions
    # 16q … 16q + 7) and b (16q + 8 … 16q + 15): g of the WIDTH − 1 positions after a chunk
    # is recomputed once per 16 positions, not per 8. FIRST as there.
    p, d, b = _positions(FIRST, BLOCK_D, CHUNKS, CHUNKS, 16)
    dmask = d < dim
    rows = b * sx_b + d[:, None].to(tl.int64) * sx_d
    prev = _load(x_ptr, init_ptr, rows, b, d, dmask, p - 8, seqlen, sx_t, sh_b, sh_d, sh_k,
                 WIDTH, HAS_INIT, BLOCK_D, CHUNKS, SPLIT)
    xa = _load(x_ptr, init_ptr, rows, b, d, dmask, p, seqlen, sx_t, sh_b, sh_d, sh_k, WIDTH,
               HAS_INIT, BLOCK_D, CHUNKS, SPLIT)
    xb = _load(x_ptr, init_ptr, rows, b, d, dmask, p + 8, seqlen, sx_t, sh_b, sh_d, sh_k,
               WIDTH, HAS_INIT, BLOCK_D, CHUNKS, SPLIT)
    nxt = _load(x_ptr, init_ptr, rows, b, d, dmask, p + 16, seqlen, sx_t, sh_b, sh_d, sh_k,
                WIDTH, HAS_INIT, BLOCK_D, CHUNKS, SPLIT)
    dy_rows = b * sy_b + d[:, None].to(tl.int64) * sy_d
    dya = _load(dy_ptr, init_ptr, dy_rows, b, d, dmask, p, seqlen, sy_t, sh_b, sh_d, sh_k,
                WIDTH, False, BLOCK_D, CHUNKS, SPLIT)
    dyb = _load(dy_ptr, init_ptr, dy_rows, b, d, dmask, p + 8, seqlen, sy_t, sh_b, sh_d, sh_k,
                WIDTH, False, BLOCK_D, CHUNKS, SPLIT)
    dy_next = _load(dy_ptr, init_ptr, dy_rows, b, d, dmask, p + 16, seqlen, sy_t, sh_b,
                    sh_d, sh_k, WIDTH, False, BLOCK_D, CHUNKS, SPLIT)
    w, bias = _taps(w_ptr, b_ptr, d, dmask, sw_d, sw_k, WIDTH, HAS_BIAS)
    # (without ids, the helpers' id and third-chunk arguments are stand-ins, never read)
    ga = _grads(dya, xa, prev, prev, xa, xa, xa, w, bias, WIDTH, SILU, False)
    gb = _grads(dyb, xb, xa, xa, xa, xa, xa, w, bias, WIDTH, SILU, False)
    g_next = _grads(dy_next, nxt, xb, xb, xa, xa, xa, w, bias, WIDTH, SILU, False)
    dxa = _dx8(ga, gb, ga, xa, xa, xa, w, WIDTH, False)
    dxb = _dx8(gb, g_next, gb, xa, xa, xa, w, WIDTH, False)
    every = p >= FIRST
    dx_rows = b * sdx_b + d[:, None].to(tl.int64) * sdx_d
    _store(dx_ptr, dxa, dx_rows, dmask, p, sdx_t, 0, seqlen, every, BLOCK_D, CHUNKS, SPLIT)
    _store(dx_ptr, dxb, dx_rows, dmask, p + 8, sdx_t, 0, seqlen, every, BLOCK_D, CHUNKS,
           SPLIT)
    if INIT_GRAD:  # (positions before 0 are in set a of the first chunk only: FIRST is −8)
        _store(dh_ptr, dxa, b * sdh_b + d[:, None] * sdh_d + (WIDTH - 1) * sdh_k, dmask, p,
               sdh_k, 1 - WIDTH, 0, every, BLOCK_D, CHUNKS, SPLIT)
    taps = tl.arange(0, TAPS)[None, :]
    part = tl.zeros([BLOCK_D, TAPS], tl.float32)
    for k in tl.static_range(WIDTH):
        acc = (_tap_products(ga, xa, prev, prev, xa, xa, xa, k, WIDTH, False)
               + _tap_products(gb, xb, xa, xa, xa, xa, xa, k, WIDTH, False))
        part += tl.where(taps == k, tl.sum(acc, axis=1)[:, None], 0.0)
    if HAS_BIAS:
        part += tl.where(taps == WIDTH,
                         tl.sum(_column_sum(ga) + _column_sum(gb), axis=1)[:, None], 0.0)
    _store_part(part_ptr, part, b, d, dmask, dim, WIDTH, TAPS)


#: (BLOCK_D, CHUNKS, warps, split) of the forward and the backward, for x seqlen-contiguous
#: and otherwise, by how many chunks a tap reaches back (widths 2-9: 1, 10-17: 2): a window
#: of BLOCK_D channels × 8·CHUNKS positions, loaded as one [BLOCK_D, CHUNKS, 8] tensor split
#: in registers (split) or a column at a time (:func:`_load`). The best candidates of device
#: probes (bf16, b8 d4096 L2048 and b1 d8192 L16384; % of the byte floor at the copy
#: bandwidth). Seqlen-contiguous (H100, results/seqconv/2026-11-28/probe-short-H100-*.log,
#: 2026-11-28-look2/; H200 with the PTX sigmoid, 2026-11-29-sigmoid/): forward 100 % at
#: widths 4 and 8 (74 % at 16), backward 71-74 % at 4 (48-50 % at 8, 30 % at 16).
#: Dim-contiguous (H200, 2026-11-29-sigmoid/): the column loads' vectors run along the
#: channels, where the split ones moved every column between threads: forward 93-97 % at
#: width 4 (55 % split), 78 % at 8, 46 % at 16; backward 47-50 % at 4 (31 % split), 31 % at 8;
#: at widths 10-17 the backward computes g once per chunk (:func:`owned`), whose gathers
#: along the chunks are faster on split loads (0.58 ms against 0.66). With seq_idx the id
#: columns come beside the data's: the backward's window is smaller where a tap reaches
#: back two chunks (``IDS_BACKWARD``; w16 seqlen-contiguous: half the window, 1.29 ms
#: against 1.72 (H200, 2026-11-28-look2/probe-ids-H200-84dff78.log); dim-contiguous
#: (8, 4, 1) column loads 1.41 ms against 1.58 for (16, 4, 2) split).
TILES = {("seqlen", 1): ((1, 128, 2, True), (1, 64, 1, True)),
         ("dim", 1): ((128, 4, 4, False), (16, 8, 2, False)),
         ("seqlen", 2): ((1, 128, 2, True), (1, 64, 1, True)),
         ("dim", 2): ((32, 4, 1, False), (16, 32, 4, True))}
#: (BLOCK_D, CHUNKS, warps, split) of the backward over 16-position chunks
#: (:func:`_backward_pairs_kernel`: widths up to 9, no seq_idx), by layout and the widest
#: width a tile serves (:func:`pairs_tile`); None: the 8-position backward runs there. The
#: best of a probe on an H100 (bf16, b8 d4096 L2048 at widths 2, 4 and 8 and b1 d8192
#: L16384 at 4, both kernels timed interleaved; results/seqconv/2026-12-07-pairs/):
#: seqlen-contiguous at width 8 1.19x the 8-position kernel, at width 4 0.94-1.03x by tile
#: (kept on the 8-position one); dim-contiguous 1.17x at width 2, 1.03-1.04x at 4 and 8.
#: Dim-contiguous without seq_idx, shortrows.py's backward runs in place of both kernels
#: where ``shortrows.TILES`` has a tile (every width since 5f1204a): the dim entries here
#: and in ``TILES`` serve where it has none.
PAIRS = {("seqlen", 5): None, ("seqlen", 9): (1, 64, 1, True),
         ("dim", 5): (32, 8, 4, False), ("dim", 9): (16, 8, 2, False)}
#: the backward's tile with seq_idx where a tap reaches two chunks back (see ``TILES``)
IDS_BACKWARD = {"seqlen": (1, 32, 1, True), "dim": (8, 4, 1, False)}


def pairs_tile(layout: str, width: int) -> tuple | None:
    """The tile of the backward over 16-position chunks for a layout and a width up to 9
    without seq_idx (``PAIRS``), or None where the 8-position backward runs."""
    return PAIRS[layout, 5 if width <= 5 else 9]


def _look(width: int) -> int:
    """How many 8-position chunks a tap reaches back: 1 for widths up to 9, else 2."""
    return 1 if width <= 9 else 2


def tiles(layout: str, width: int, ids: bool) -> tuple:
    """(forward tile, backward tile) of a layout ("seqlen": x seqlen-contiguous, "dim"),
    a width, and whether seq_idx is given (see ``TILES``)."""
    look = _look(width)
    forward, backward = TILES[layout, look]
    return forward, IDS_BACKWARD[layout] if ids and look == 2 else backward


#: the fewest chunks of a backward window that computes g once per chunk (:func:`owned`)
SHIFT_MIN_CHUNKS = 16


def owned(look: int, chunks: int) -> int:
    """The chunks a backward window of ``chunks`` writes: all of them where g of the
    ``look`` chunks after each is recomputed (taps reaching one chunk back: little to
    recompute), else (two chunks back, windows of at least SHIFT_MIN_CHUNKS) all but the
    last ``look``, whose g the others read: windows overlap by ``look`` chunks."""
    return chunks - look if look == 2 and chunks >= SHIFT_MIN_CHUNKS else chunks


def _layout(x: torch.Tensor) -> str:
    return "seqlen" if x.stride(2) == 1 else "dim"


def _ids(seq_idx, x: torch.Tensor) -> tuple:
    """The kernels' (ids_ptr, si_b, si_t): seq_idx's, or x's pointer (not read) without."""
    return (seq_idx, *seq_idx.stride()) if seq_idx is not None else (x, 0, 0)


def _rows_tile(x: torch.Tensor, width: int, seq_idx, direction: int) -> tuple | None:
    """The tile of shortrows.py's kernel (0: forward, 1: backward) where it runs in place of
    this module's: x dim-contiguous, no seq_idx, and a tile for the width
    (``shortrows.TILES``); else None."""
    if seq_idx is not None or _layout(x) != "dim":
        return None
    return rows_tiles(width)[direction]


def short_forward(x: torch.Tensor, initial_states, weight: torch.Tensor, bias, silu: bool,
                  seq_idx=None) -> torch.Tensor:
    """causal_conv1d's output (x's shape, layout and dtype; see the module docstring); with
    ``seq_idx`` (int32, (batch, seqlen)) a tap counts only where its position has the
    output position's id (positions before 0 have position 0's)."""
    batch, dim, seqlen = x.shape
    width = weight.shape[1]
    rows = _rows_tile(x, width, seq_idx, 0)
    if rows is not None:
        return rows_forward(x, initial_states, weight, bias, silu, rows)
    block_d, chunks, warps, split = tiles(_layout(x), width, seq_idx is not None)[0]
    out = torch.empty_like(x)
    init = initial_states if initial_states is not None else x
    ids, si_b, si_t = _ids(seq_idx, x)
    launch(_forward_kernel, (cdiv(seqlen, 8 * chunks), cdiv(dim, block_d), batch),
           x, ids, init, weight, x if bias is None else bias, out, dim, seqlen, *x.stride(),
           si_b, si_t, *init.stride(), *weight.stride(), *out.stride(),
           WIDTH=width, LOOK=_look(width), BLOCK_D=block_d, CHUNKS=chunks,
           HAS_INIT=initial_states is not None, HAS_BIAS=bias is not None, SILU=silu,
           HAS_IDS=seq_idx is not None, SPLIT=split, num_warps=warps)
    return out


def short_backward(dy: torch.Tensor, x: torch.Tensor, initial_states, weight: torch.Tensor,
                   bias, silu: bool, init_grad: bool, seq_idx=None) -> tuple:
    """(dx, d initial_states or None, d weight, d bias or None) of :func:`short_forward`
    given the output's gradient: one pass, then the per-window sums of the weight's and
    bias's gradients added in a fixed order (float32)."""
    batch, dim, seqlen = x.shape
    width = weight.shape[1]
    rows = _rows_tile(x, width, seq_idx, 1)
    if rows is not None:
        return rows_backward(dy, x, initial_states, weight, bias, silu, init_grad, rows)
    look = _look(width)
    first = -8 * look if init_grad else 0
    pair = pairs_tile(_layout(x), width) if look == 1 and seq_idx is None else None
    pairs = pair is not None
    block_d, chunks, warps, split = pair if pairs else \
        tiles(_layout(x), width, seq_idx is not None)[1]
    own = owned(look, chunks)
    windows = cdiv(seqlen - first, 16 * chunks) if pairs else cdiv(seqlen - first, 8 * own)
    dx, dh, part = backward_buffers(x, width, windows, init_grad)
    init = initial_states if initial_states is not None else x
    flags = dict(WIDTH=width, TAPS=part.shape[3], FIRST=first, BLOCK_D=block_d, CHUNKS=chunks,
                 HAS_INIT=initial_states is not None, HAS_BIAS=bias is not None, SILU=silu,
                 INIT_GRAD=init_grad, SPLIT=split, num_warps=warps)
    if pairs:
        launch(_backward_pairs_kernel, (windows, cdiv(dim, block_d), batch),
               x, init, weight, x if bias is None else bias, dy, dx, dh, part, dim, seqlen,
               *x.stride(), *init.stride(), *weight.stride(), *dy.stride(), *dx.stride(),
               *dh.stride(), **flags)
    else:
        ids, si_b, si_t = _ids(seq_idx, x)
        launch(_backward_kernel, (windows, cdiv(dim, block_d), batch),
               x, ids, init, weight, x if bias is None else bias, dy, dx, dh, part, dim,
               seqlen, *x.stride(), si_b, si_t, *init.stride(), *weight.stride(),
               *dy.stride(), *dx.stride(), *dh.stride(), LOOK=look, OWN=own,
               HAS_IDS=seq_idx is not None, **flags)
    return (dx, dh if init_grad else None, *weight_sums(part, weight, bias))
