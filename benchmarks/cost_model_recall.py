"""How well the Triton cost model (backends/triton/cost.py) orders candidates, measured on the
shipped tuning database: for every entry whose exhaustive winner is a Triton tile, the
winner's place among its problem's candidates in the list's own order and in the model's,
as recall@k (the share of winners among the first k), and how many candidates a pruning to
k compiles. CPU only (the database holds H100 measurements; nothing runs on a GPU).

    python benchmarks/cost_model_recall.py [--db FILE] [--fit]

``--fit`` also grid-searches the model's three fitted constants on half the problems (by a
hash of the problem key) and prints recall on both halves: the other half is held out.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import itertools
import json
import os
import re
import sys
import zlib

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
from fastconv.backends.triton import cost  # noqa: E402
from fastconv.backends.triton.backend import TritonBackend  # noqa: E402
from fastconv.problem import ConvProblem  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
KS = (1, 2, 3, 4, 6, 8)


def decode(key: str) -> tuple[ConvProblem, str]:
    """The problem and operation of a plan-cache key (``ConvProblem.key`` then ``|op|...``)."""
    problem_key, op = key.split("|")[:2]
    parts = problem_key.split("_")
    rank, transposed = int(parts[0][1:]), parts[1] == "T"
    n, c, k = map(int, re.fullmatch(r"n(\d+)c(\d+)k(\d+)", parts[2]).groups())

    def sizes(text):
        return tuple(map(int, text.split("x")))
    spatial, kernel, stride = sizes(parts[3][2:]), sizes(parts[4][1:]), sizes(parts[5][1:])
    padding = tuple(tuple(map(int, p.split("-"))) for p in parts[6][1:].split("x"))
    dilation, groups = sizes(parts[7][1:]), int(parts[8][1:])
    at = 10 if transposed else 9
    output_padding = sizes(parts[9][2:]) if transposed else 0
    dtype, layout, precision = parts[at:at + 3]
    meta = {"device": "meta", "dtype": DTYPES[dtype]}
    x = torch.empty(n, c, *spatial, **meta)
    if layout == "nhwc" and rank == 2:
        x = x.contiguous(memory_format=torch.channels_last)
    w = torch.empty(*((c, k // groups) if transposed else (k, c // groups)), *kernel, **meta)
    problem = ConvProblem.from_tensors(x, w, None, stride, padding, dilation, groups,
                                       rank=rank, transposed=transposed,
                                       output_padding=output_padding, precision=precision)
    return dataclasses.replace(problem, device="cuda", layout=layout), op


def winners(path: str) -> list[tuple]:
    """(problem key, problem, op, candidates, winner) of every Triton GEMM-tile winner."""
    with open(path, encoding="utf-8") as f:
        entries = json.load(f)["entries"]
    out = []
    for key, entry in entries.items():
        if entry["backend"] != "triton":
            continue
        problem, op = decode(key)
        config = TritonBackend.decode_config(entry["config"])
        if isinstance(config, cost.TileConfig):
            out.append((key.split("|")[0], problem, op, TritonBackend.candidates(problem, op),
                        config))
    return out


def recall(rows, order) -> list[float]:
    """recall@k for each k of KS: the share of rows whose winner ``order(row)`` puts first k."""
    places = [order(r).index(r[4]) for r in rows]
    return [sum(p < k for p in places) / len(rows) for k in KS]


def model_order(row) -> list:
    return cost.prune(row[1], row[2], row[3], len(row[3]))[0]


def shape_class(problem: ConvProblem) -> str:
    """conv1d or conv2d, dense or grouped (the seed002 and grouped suites are rank-1)."""
    return f"conv{problem.rank}d " + ("grouped" if problem.groups > 1 else "dense")


def show(label: str, values: list[float]) -> str:
    return f"{label:<32}" + " ".join(f"@{k} {v:.3f}" for k, v in zip(KS, values))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", default=os.path.join(os.path.dirname(__file__), "..", "src",
                                                 "fastconv", "data", "tuning",
                                                 "nvidia-h100-80gb-hbm3.json"))
    ap.add_argument("--fit", action="store_true")
    args = ap.parse_args()
    rows = winners(args.db)
    print(f"{len(rows)} Triton GEMM-tile winners in {os.path.basename(args.db)} "
          f"({len({r[0] for r in rows})} problems)")
    print(show("list order, all", recall(rows, lambda r: r[3])))
    print(show("cost model, all", recall(rows, model_order)))
    for op, n in sorted(collections.Counter(r[2] for r in rows).items()):
        sub = [r for r in rows if r[2] == op]
        print(show(f"list order, {op} ({n})", recall(sub, lambda r: r[3])))
        print(show(f"cost model, {op} ({n})", recall(sub, model_order)))
    for shape, n in sorted(collections.Counter(shape_class(r[1]) for r in rows).items()):
        sub = [r for r in rows if shape_class(r[1]) == shape]
        print(show(f"cost model, {shape} ({n})", recall(sub, model_order)))
    problems = {(r[0], r[2]): r for r in rows}
    total = sum(len([c for c in r[3] if isinstance(c, cost.TileConfig)])
                for r in problems.values())
    for keep in (4, 6, 8):
        kept = sum(min(keep, len([c for c in r[3] if isinstance(c, cost.TileConfig)]))
                   for r in problems.values())
        print(f"pruned to {keep}: {kept} of {total} GEMM candidates compiled "
              f"({kept / total:.2f}) over {len(problems)} problems and operations")
    if args.fit:
        fit(rows)


def fit(rows) -> None:
    """The three constants by grid search on half the problems; recall@2, 4, 6 on both."""
    halves = [[r for r in rows if zlib.crc32(r[0].encode()) % 2 == h] for h in (0, 1)]
    at = [KS.index(k) for k in (2, 4, 6)]
    results = []
    for area, l2, step in itertools.product((64 * 64, 128 * 64, 128 * 128, 256 * 128),
                                            (7e12, 10e12, 14e12, 20e12), (0.0, 1e-7, 3e-7)):
        cost.TILE_AREA, cost.L2_BYTES_S, cost.STEP_S = area, l2, step
        fitted, held = (recall(h, model_order) for h in halves)
        results.append((sum(fitted[i] for i in at), (area, l2, step),
                        [fitted[i] for i in at], [held[i] for i in at]))
    results.sort(key=lambda r: r[0], reverse=True)
    print("fit (TILE_AREA, L2_BYTES_S, STEP_S): recall@2,4,6 on the fitted half | held out")
    for _, params, fitted, held in results[:6]:
        print(f"  {params}: {' '.join(f'{v:.3f}' for v in fitted)} | "
              f"{' '.join(f'{v:.3f}' for v in held)}")


if __name__ == "__main__":
    main()
