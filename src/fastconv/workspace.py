"""Workspace memory for backends that ask for scratch space (cuDNN plans).

One grow-only buffer per (device, stream): work queued on one stream runs in order, so a
call can reuse the buffer the previous call on that stream used. Not during a CUDA-graph
capture: the graph keeps the address it was given for every replay, so a captured call gets
a buffer of its own from the graph's private memory pool (the pool's buffer could be
released by a later, larger request while the graph still writes into it). A request above the cap
(``FASTCONV_WORKSPACE_MB``, default 1024 MiB, or ``set_limit``) raises
``WorkspaceTooLarge``; dispatch skips that candidate, as it skips one that runs out of
memory while growing the buffer.
"""

from __future__ import annotations

import dataclasses
import math
import os
import threading

import torch

from .errors import ConvError


class WorkspaceTooLarge(ConvError):
    """A candidate needs more workspace than the pool may hold."""


@dataclasses.dataclass
class PoolStats:
    device: str
    stream: int
    bytes: int = 0  # current buffer size
    requests: int = 0
    grows: int = 0
    largest_request: int = 0
    refused: int = 0  # requests over the limit


_POOLS: dict[tuple[str, int], tuple[torch.Tensor | None, PoolStats]] = {}
_LOCK = threading.Lock()
_LIMIT: list[int | None] = [None]


def limit() -> int:
    """The most bytes one buffer may hold: ``set_limit``'s, else ``FASTCONV_WORKSPACE_MB``
    (read once, at the first request, and again after ``set_limit(None)``)."""
    if _LIMIT[0] is None:
        _LIMIT[0] = _limit_from_environment()
    return _LIMIT[0]


def _limit_from_environment() -> int:
    env = os.environ.get("FASTCONV_WORKSPACE_MB", "1024")
    try:
        mb = float(env)
    except ValueError:
        raise ConvError(f"FASTCONV_WORKSPACE_MB: got {env!r}; expected a number of MiB") \
            from None
    if not math.isfinite(mb) or mb < 0:
        raise ConvError(f"FASTCONV_WORKSPACE_MB: got {env!r}; expected a finite number of "
                        f"MiB >= 0")
    return int(mb * 2**20)


def set_limit(nbytes: int | None) -> None:
    """Cap every workspace buffer at ``nbytes`` (None: back to the environment/default,
    read again)."""
    if nbytes is not None and (not isinstance(nbytes, int) or nbytes < 0):
        raise ConvError(f"nbytes: got {nbytes!r}; expected an int >= 0 or None")
    _LIMIT[0] = nbytes


def get(nbytes: int, stream: torch.cuda.Stream | None = None,
        device: torch.device | str | None = None) -> torch.Tensor | None:
    """A uint8 buffer of at least ``nbytes`` for work queued on ``stream`` (None if 0)."""
    dev = torch.device(device) if device is not None else (
        stream.device if stream is not None else torch.device("cuda", torch.cuda.current_device()))
    return _buffer(nbytes, dev, (str(dev), stream.cuda_stream if stream is not None else 0))


_CUDA_DEVICES: dict[int, tuple[torch.device, str]] = {}


def for_stream(nbytes: int, device_index: int, raw_stream: int) -> torch.Tensor | None:
    """:func:`get` for CUDA device ``device_index`` and the stream whose handle is
    ``raw_stream`` (``torch._C._cuda_getCurrentRawStream``): no Stream object per call."""
    dev = _CUDA_DEVICES.get(device_index)
    if dev is None:
        d = torch.device("cuda", device_index)
        dev = _CUDA_DEVICES[device_index] = (d, str(d))
    return _buffer(nbytes, dev[0], (dev[1], raw_stream))


def _buffer(nbytes: int, dev: torch.device, key: tuple[str, int]) -> torch.Tensor | None:
    with _LOCK:
        buf, stats = _POOLS.get(key, (None, None))
        if stats is None:
            stats = PoolStats(device=key[0], stream=key[1])
        stats.requests += 1
        stats.largest_request = max(stats.largest_request, nbytes)
        cap = limit()
        if nbytes > cap:
            stats.refused += 1
            _POOLS[key] = (buf, stats)
            raise WorkspaceTooLarge(f"workspace: {nbytes} bytes requested, over the limit of "
                                    f"{cap} bytes (FASTCONV_WORKSPACE_MB or "
                                    f"fastconv.workspace.set_limit)")
        if nbytes == 0:
            _POOLS[key] = (buf, stats)
            return None
        if dev.type == "cuda" and torch.cuda.is_current_stream_capturing():
            _POOLS[key] = (buf, stats)
            return torch.empty(nbytes, dtype=torch.uint8, device=dev)
        if buf is None or buf.numel() < nbytes:
            _POOLS[key] = (None, stats)  # release the old buffer before the larger one
            buf = torch.empty(nbytes, dtype=torch.uint8, device=dev)
            stats.grows += 1
            stats.bytes = nbytes
        _POOLS[key] = (buf, stats)
        return buf


def stats() -> list[PoolStats]:
    """One entry per (device, stream) pool."""
    with _LOCK:
        return [dataclasses.replace(s) for _, s in _POOLS.values()]


def clear() -> None:
    """Release every buffer and forget the statistics."""
    with _LOCK:
        _POOLS.clear()
