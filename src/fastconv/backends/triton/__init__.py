"""Triton kernels. The kernel modules are imported on first use, never at package import."""

from .backend import TritonBackend

__all__ = ["TritonBackend"]
