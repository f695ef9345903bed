"""The backend registry. A new backend is one module plus one line here; tests, dispatch and
benchmarks iterate over ``REGISTRY``."""

from __future__ import annotations

from .aten import AtenBackend
from .base import Backend
from .cudnn import CudnnBackend
from .triton import TritonBackend

REGISTRY: dict[str, type[Backend]] = {
    AtenBackend.NAME: AtenBackend,
    TritonBackend.NAME: TritonBackend,
    CudnnBackend.NAME: CudnnBackend,
}


def get(name: str) -> type[Backend]:
    from ..errors import ConvError

    try:
        return REGISTRY[name]
    except KeyError:
        raise ConvError(f"backend: got {name!r}; allowed: 'auto', "
                        f"{', '.join(map(repr, REGISTRY))}") from None


__all__ = ["REGISTRY", "Backend", "get"]
