"""What this process runs on that fastconv's stored choices depend on: fastconv's own
version and the cuDNN frontend module (imported once, on first use, never at fastconv
import). A leaf module: the plan cache and the cuDNN backend both read it."""

from __future__ import annotations

import functools

__version__ = "0.1.0"


@functools.lru_cache(maxsize=1)
def cudnn_frontend():
    """(the ``cudnn`` module, "") or (None, why it cannot be imported)."""
    try:
        import cudnn
    except Exception as exc:  # ImportError, or a broken install that fails while loading
        return None, f"the cuDNN frontend (pip install nvidia-cudnn-frontend) cannot be " \
                     f"imported: {type(exc).__name__}: {exc}"
    return cudnn, ""
