"""What dispatch knows about a new problem before timing it: the candidate to run first.

Two sources, in this order:

* the tuning database's choice for the nearest problem of the same shape class (everything
  in the key but the batch size and the spatial sizes; nearest by the number of output
  positions, on a log scale), where it is a configuration this problem admits;
* a structural rule: a depthwise or narrow grouped convolution of rank 1 (the causal
  conv1d of Mamba-style blocks, seed002's grouped layers) runs Triton's direct or row tiles
  1.4-9x faster than cuDNN's (benchmarks/NOTES.md, "conv1d"), so Triton's candidate its
  cost model ranks first (the heuristic's pick for direct tiles) is the prior.

``timing`` runs the prior right after aten, and for a *strong* prior (the structural rule:
a win of multiples, measured) waits for its build and times it even past the process's
budget, where other new problems run aten until their builds are done.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

from .. import backends
from ..problem import ConvProblem
from . import store

#: A grouped conv1d whose groups have at most this many input channels is "narrow": Triton's
#: tiles beat cuDNN's 1.4-2.4x there (seed002 g4-g16: 128-32 channels per group).
NARROW_GROUP = 128


@dataclasses.dataclass(frozen=True)
class Prior:
    backend: str
    config: Any
    strong: bool  # a structural win of multiples: waited for and timed past the budget
    source: str  # for explain: where it came from

    def describe(self) -> str:
        return f"prior: {self.source}"


def prior(problem: ConvProblem, names: list[str], op: str, key: str) -> Prior | None:
    """The candidate to time right after aten for ``problem`` (cache key ``key``), or None."""
    if problem.device != "cuda":
        return None
    near = nearest(problem, names, op, key)
    strong = _structural(problem, names, op)
    if near is not None:
        return dataclasses.replace(near, strong=strong and near.backend == "triton")
    if strong:
        cls = backends.REGISTRY["triton"]
        config = cls.prune(problem, op, cls.candidates(problem, op), 1)[0][0]
        return Prior("triton", config, True, "Triton's direct kernels win on rank-1 "
                     "depthwise and narrow grouped convolutions")
    return None


def _structural(problem: ConvProblem, names: list[str], op: str) -> bool:
    return "triton" in names and op == "fprop" and problem.rank == 1 \
        and not problem.transposed and problem.groups > 1 \
        and (problem.depthwise or problem.c_per_group <= NARROW_GROUP)


def nearest(problem: ConvProblem, names: list[str], op: str, key: str) -> Prior | None:
    """The database's choice for the nearest problem of ``key``'s shape class, decoded for
    ``problem`` (None where there is none, or it does not apply here)."""
    shape_class, size = _split(key)
    if shape_class is None:
        return None
    known = _index().get(shape_class)
    if not known:
        return None
    near_size, near_key = min(known, key=lambda e: (abs(math.log(e[0] / size)), e[1]))
    entry = store.CACHE.database_entries()[near_key]
    choice = store.decode(entry, problem, op, names) if entry is not None else None
    if choice is None:
        return None
    return Prior(choice.backend, choice.config, False,
                 f"the tuning database's choice for {near_size} positions (this: {size})")


_BATCH = re.compile(r"_n(\d+)c")
_SIZES = re.compile(r"_in([0-9x]+)_")


def _split(key: str) -> tuple[str | None, int]:
    """(the key without its batch and spatial sizes, batch x spatial positions)."""
    batch, sizes = _BATCH.search(key), _SIZES.search(key)
    if batch is None or sizes is None:
        return None, 0
    size = int(batch.group(1)) * math.prod(int(s) for s in sizes.group(1).split("x"))
    return _SIZES.sub("_in*_", _BATCH.sub("_n*c", key, count=1), count=1), max(size, 1)


def _index() -> dict[str, list[tuple[int, str]]]:
    """The database's keys by shape class (built once per database read)."""
    global _INDEXED
    entries = store.CACHE.database_entries()
    if _INDEXED[0] is not entries:
        index: dict[str, list[tuple[int, str]]] = {}
        for key in entries:
            shape_class, size = _split(key)
            if shape_class is not None:
                index.setdefault(shape_class, []).append((size, key))
        _INDEXED = (entries, index)
    return _INDEXED[1]


_INDEXED: tuple[dict | None, dict] = (None, {})
