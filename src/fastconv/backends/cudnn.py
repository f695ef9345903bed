"""The cuDNN backend: convolution graphs through the cuDNN frontend's Python API.

One graph per (problem, operation, tensor strides): the forward, the data gradient (also the
forward of a transposed convolution) and the weight gradient. Each graph's execution plans,
in cuDNN's heuristic order, are the backend's candidates: the heuristic takes plan 0,
benchmark dispatch times them all, because the heuristic order is not the speed order.

Fused epilogues (scale, shift, residual and activation as pointwise nodes) were built and
measured: cuDNN 9.19 declined them on NCHW tensors and in strict fp32, and some plans of the
graphs it accepted returned wrong results (benchmarks/NOTES.md). A problem with an epilogue
is therefore refused here, with that reason, and dispatch moves on to aten or Triton.

Pitfalls of the frontend that this module works around, each with a GPU test:

* an output's dim and stride are set together (a stride alone silently gives wrong results),
  and the data gradient's dim always (grouped dgrad cannot infer it);
* the handle runs on torch's current stream, set before every execution;
* strict fp32 ("ieee") drops every plan with the tensor-core numerical note (TF32).

Plans are serialized (``PLANS``, file ``cudnn-plans-v1.json`` beside dispatch's choices): the
first process that runs a plan stores cuDNN's serialized plan and its (engine, knobs) recipe;
a later process with the same GPU, driver and library versions deserializes it (or replays the
recipe) instead of querying the heuristics and building every candidate plan again.

Rank-1 problems run as rank-2 ones of height 1. The package is optional: without it (or
without a GPU) the backend reports itself unavailable with the reason.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import inspect
import threading

import torch

from .. import plancache, workspace
from ..context import current, timing
from ..env import cudnn_frontend
from ..errors import NotSupported
from ..precision import Precision
from ..problem import ConvProblem
from .base import Backend

#: Tensor uids by role (input, weight, output): the keys of every execution's variant pack.
_X, _W, _Y = 1, 2, 3
#: the uids of a graph's operands in the order its run function passes them
_FPROP, _DGRAD, _WGRAD = (_X, _W, _Y), (_Y, _W, _X), (_Y, _X, _W)
#: Plans tried per graph (cuDNN's heuristic order; later ones are rarely competitive).
MAX_PLANS = 6
#: Plan indices a stored choice may name (cuDNN lists a few dozen per graph).
_PLAN_INDEX_LIMIT = 4096


class CudnnBackend(Backend):
    NAME = "cudnn"
    SUPPORTED_DTYPES = frozenset({torch.float32, torch.float16, torch.bfloat16})
    SUPPORTED_DEVICES = frozenset({"cuda"})
    SUPPORTS_TRANSPOSED = True
    MIN_CAPABILITY = (7, 0)
    IS_DETERMINISTIC = True  # under deterministic dispatch, plans noted NONDETERMINISTIC
    # (atomic reductions) are deselected

    @classmethod
    def available(cls):
        if not torch.cuda.is_available():
            return False, "no CUDA GPU"
        mod, why = cudnn_frontend()
        if mod is None:
            return False, why
        return True, ""

    @classmethod
    def not_supported_reasons(cls, problem):
        reasons = super().not_supported_reasons(problem)
        if not problem.epilogue.is_identity:
            reasons.append("a fused epilogue: cuDNN 9.19 fused graphs returned wrong results "
                           "on H200 for some layers and plans (tf32 3->64 7x7 with bias, "
                           "residual and relu: relative error 0.72 from plan 2; bf16 32->32 "
                           "3x3: 0.70), so fastconv runs only the bare convolution on cuDNN")
        if problem.dtype != torch.float32 and (problem.c_per_group % 8 or
                                               problem.k_per_group % 8):
            reasons.append(f"half precision with {problem.c_per_group} input / "
                           f"{problem.k_per_group} output channels per group, not multiples "
                           f"of 8 (the 3-channel bf16 stem gave wrong results in a fused "
                           f"graph on H200; not yet re-tested bare)")
        return reasons

    @classmethod
    def config_errors(cls, problem, config, op="fprop"):
        """A plan index (checked without building the graph: an index past the graph's
        plans runs cuDNN's first plan)."""
        if config is None or (type(config) is int and 0 <= config < _PLAN_INDEX_LIMIT):
            return []
        return [f"a cuDNN plan index is an int in [0, {_PLAN_INDEX_LIMIT}); got {config!r}"]

    @classmethod
    def candidates(cls, problem, op="fprop"):
        """Plan indices, in cuDNN's heuristic order (the graph is built here once)."""
        graph = _graph_for(problem, op, _default_strides(problem, op))
        return list(graph.plans) or [0]

    @classmethod
    def bind(cls, problem, config, op="fprop"):
        chosen = int(config or 0)
        graphs: dict[tuple, tuple[_Graph | _Restored, int]] = {}
        stored: set[tuple] = set()

        def graph_of(a, b, c):
            """(graph, plan index) for these tensors' strides: the chosen plan, or cuDNN's
            first one where the chosen index does not exist for this graph."""
            sig = (a.stride(), b.stride(), c.stride())
            hit = graphs.get(sig)
            if hit is None:
                restored = _restore(problem, op, sig, chosen)
                if restored is not None:
                    hit = (restored, 0)
                else:
                    g = _graph_for(problem, op, sig)
                    try:
                        g.require(chosen)
                        hit = (g, chosen)
                    except RuntimeError:
                        hit = (g, g.plans[0])
                graphs[sig] = hit
            if sig not in stored and isinstance(hit[0], _Graph) and not timing():
                stored.add(sig)  # a plan that runs outside autotuning: keep it for next time
                _persist(hit[0], hit[1], _plan_key(problem, op, sig, hit[1]))
            return hit

        if op == "fprop":
            def run(input, weight, bias, scale, shift, residual, out):
                if out is None:
                    out = problem.new_output(input.device)
                g, index = graph_of(input, weight, out)
                g.execute(index, (input, weight, out), _FPROP)
                return out
            return run
        if op == "dgrad":
            def run_dgrad(grad_out, weight, out):
                if out is None:
                    out = _empty_like_input(problem, grad_out.device)
                g, index = graph_of(grad_out, weight, out)
                g.execute(index, (grad_out, weight, out), _DGRAD)
                return out
            return run_dgrad

        def run_wgrad(grad_out, input, out):
            if out is None:
                out = torch.empty(problem.weight_shape(), dtype=problem.dtype,
                                  device=grad_out.device)
            g, index = graph_of(grad_out, input, out)
            g.execute(index, (grad_out, input, out), _WGRAD)
            return out
        return run_wgrad


def _empty_like_input(problem: ConvProblem, device):
    from ..problem import empty_in_layout

    return empty_in_layout(problem.input_shape(), problem.layout, problem.dtype, device)


def _default_strides(problem: ConvProblem, op: str) -> tuple:
    """The strides a call in the problem's layout will bring (for building candidates)."""
    from ..problem import empty_in_layout

    def strides(shape):
        return tuple(empty_in_layout(shape, problem.layout, problem.dtype, "meta").stride())

    x, w, y = problem.input_shape(), problem.weight_shape(), problem.output_shape()
    if op == "fprop":
        return strides(x), strides(w), strides(y)
    if op == "dgrad":
        return strides(y), strides(w), strides(x)
    return strides(y), strides(x), strides(w)


# ------------------------------------------------------------------------------- graphs
_GRAPHS: dict[tuple, _Graph] = {}
_LOCK = threading.Lock()
_HANDLES: dict[int, object] = {}


def _handle(device_index: int):
    cudnn, _ = cudnn_frontend()
    h = _HANDLES.get(device_index)
    if h is None:
        with torch.cuda.device(device_index):
            h = _HANDLES[device_index] = cudnn.create_handle()
    return h


def clear(disk: bool = False) -> None:
    """Forget every built and restored graph (tests; ``fastconv plans --clear``); with
    ``disk`` also the serialized plans."""
    with _LOCK:
        _GRAPHS.clear()
        _RESTORED.clear()
        PLANS.clear(disk=disk)
        SERIALIZATION.update(restored=0, stored=0, last_error="")


def graph_count() -> int:
    return len(_GRAPHS)


# ------------------------------------------------------------------- plan serialization
#: Serialized plans on disk, keyed by problem, operation, strides, determinism and plan.
PLANS = plancache.PlanCache(file_name="cudnn-plans-v1.json")
#: What serialization did in this process (``fastconv plans`` and the tests read it).
SERIALIZATION = {"restored": 0, "stored": 0, "last_error": ""}
_RESTORED: dict[tuple, _Restored] = {}


def _plan_key(problem: ConvProblem, op: str, strides: tuple, plan: int) -> str:
    return f"{problem.key()}|{op}|{strides}|det={int(current()[1])}|plan={plan}"


def _persist(g: _Graph, index: int, key: str) -> None:
    """Store plan ``index`` of ``g``: its (engine, knobs) and cuDNN's serialized plan, built
    once more on a graph that holds only that plan (serialize() writes the selected one)."""
    if plancache.cache_dir() is None or PLANS.get(key) is not None:
        return
    try:
        engine, knobs = g.graph.get_engine_and_knobs_at_index(index)
        knobs = {int(k): int(v) for k, v in knobs.items()}
        single = g.fresh()
        single.create_execution_plan(engine, _knobs(g.cudnn, knobs))
        single.build_plans()
        blob = bytes(single.serialize(as_bytes=True))
        PLANS.put(key, {"engine": int(engine), "knobs": knobs,
                        "name": g.plan_name(index),
                        "blob": base64.b64encode(blob).decode("ascii"),
                        "sha256": hashlib.sha256(blob).hexdigest()}, persist=True)
        SERIALIZATION["stored"] += 1
    except Exception as exc:  # serialization saves time; it must never break a call
        SERIALIZATION["last_error"] = f"serialize: {type(exc).__name__}: {exc}"


def _knobs(cudnn, knobs: dict) -> dict:
    return {cudnn.knob_type(int(k)): int(v) for k, v in knobs.items()}


def _restore(problem: ConvProblem, op: str, strides: tuple, plan: int) -> _Restored | None:
    """The stored plan for this graph, deserialized (or rebuilt from its recipe), or None."""
    key = _plan_key(problem, op, strides, plan)
    mem_key = (key, torch.cuda.current_device())
    r = _RESTORED.get(mem_key)
    if r is not None:
        return r
    entry = PLANS.get(key) if plancache.cache_dir() is not None else None
    if entry is None:
        return None
    problem_with_entry = _entry_error(entry)
    if problem_with_entry:  # a file anyone may have written: never handed to cuDNN
        SERIALIZATION["last_error"] = f"refused stored plan: {problem_with_entry}"
        PLANS.discard(key)
        return None
    with _LOCK:
        r = _RESTORED.get(mem_key)
        if r is None:
            try:
                r = _Restored(problem, op, strides, entry)
            except Exception as exc:
                SERIALIZATION["last_error"] = f"restore: {type(exc).__name__}: {exc}"
                return None
            _RESTORED[mem_key] = r
            SERIALIZATION["restored"] += 1
    return r


def _entry_error(entry) -> str:
    """Why a stored plan must not be restored ('' if it may): the recipe's types, and the
    serialized plan's SHA-256 (a corrupted or edited blob is never deserialized)."""
    try:
        if not (type(entry["engine"]) is int and entry["engine"] >= 0):
            return f"engine {entry['engine']!r} is not a non-negative int"
        knobs = entry["knobs"]
        if not isinstance(knobs, dict) or not all(
                str(k).isdigit() and type(v) is int for k, v in knobs.items()):
            return f"knobs {knobs!r} are not int -> int"
        blob = base64.b64decode(entry["blob"], validate=True)
        if hashlib.sha256(blob).hexdigest() != entry["sha256"]:
            return "the serialized plan does not match its SHA-256"
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return ""


def _graph_for(problem: ConvProblem, op: str, strides: tuple) -> _Graph:
    deterministic = current()[1]
    key = (problem.key(), op, strides, deterministic, torch.cuda.current_device())
    g = _GRAPHS.get(key)
    if g is None:
        with _LOCK:
            g = _GRAPHS.get(key)
            if g is None:
                try:
                    g = _Graph(problem, op, strides, deterministic)
                except Exception as exc:
                    raise NotSupported("cudnn", [f"cuDNN cannot build this {op} graph: "
                                                 f"{type(exc).__name__}: {exc}"]) from exc
                _GRAPHS[key] = g
    return g


class _Graph:
    """One cuDNN graph with its heuristic plans; plans are built on first use."""

    def __init__(self, problem: ConvProblem, op: str, strides: tuple, deterministic: bool):
        cudnn, _ = cudnn_frontend()
        self.cudnn = cudnn
        self.device = torch.cuda.current_device()
        self.ordered = _ordered(cudnn)
        self.lock = threading.Lock()
        self.fresh = functools.partial(_operation_graph, cudnn, problem, op, strides)
        self.graph = g = self.fresh()
        g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        if problem.dtype == torch.float32 and problem.precision == Precision.IEEE:
            # strict fp32: no TF32 tensor-core plan (checked against float64 in the tests)
            notes = [getattr(cudnn.numerical_note, n) for n in
                     ("TENSOR_CORE", "DOWN_CONVERT_INPUTS") if hasattr(cudnn.numerical_note, n)]
            g.deselect_numeric_notes(notes)
        if deterministic:
            g.deselect_numeric_notes([cudnn.numerical_note.NONDETERMINISTIC])
        g.check_support()
        self.count = g.get_execution_plan_count()
        self.built: dict[int, int] = {}  # plan index -> workspace bytes
        self.failed: dict[int, str] = {}
        for i in range(self.count):  # plans filtered out or failing to build are skipped
            try:
                self.require(i)
            except Exception as exc:
                self.failed[i] = f"{type(exc).__name__}: {exc}"
            if len(self.built) == MAX_PLANS:
                break
        self.plans = sorted(self.built)
        if not self.plans:
            raise RuntimeError("cuDNN built no plan for this graph: "
                               + "; ".join(f"[{i}] {w}" for i, w in self.failed.items()))

    def require(self, index: int) -> None:
        if index in self.built:
            return
        if index in self.failed or index >= self.count:
            raise RuntimeError(f"cuDNN plan {index} is not available for this graph"
                               + (f": {self.failed[index]}" if index in self.failed else ""))
        with self.lock:
            if index not in self.built:
                self.graph.build_plan_at_index(index)
                self.built[index] = int(self.graph.get_workspace_size_plan_at_index(index))

    def plan_name(self, index: int) -> str:
        return self.graph.get_plan_name_at_index(index)

    def execute(self, index: int, buffers: tuple, uids: tuple) -> None:
        """Run plan ``index`` on ``buffers`` (torch tensors, in the order of ``uids``)."""
        handle, ws = _launch_state(self.device, self.built[index])
        if self.ordered:
            try:
                self.graph.execute_plan_at_index(buffers, ws, index, handle=handle,
                                                 tensor_uids=uids)
                return
            except (TypeError, ValueError):  # (checked before any launch)
                self.ordered = False
        self.graph.execute_plan_at_index(dict(zip(uids, buffers)), ws, index, handle=handle)


class _Restored:
    """One stored plan: cuDNN's serialized plan deserialized, or, where that fails, the plan
    rebuilt from its (engine, knobs) recipe without a heuristics query."""

    def __init__(self, problem: ConvProblem, op: str, strides: tuple, entry: dict):
        cudnn, _ = cudnn_frontend()
        self.cudnn = cudnn
        self.device = torch.cuda.current_device()
        self.ordered = _ordered(cudnn)
        self.name = entry.get("name", "")
        try:
            g = cudnn.pygraph(handle=_handle(self.device))
            g.deserialize(_handle(self.device), base64.b64decode(entry["blob"]))
            self.how = "deserialized"
        except Exception as exc:
            SERIALIZATION["last_error"] = f"deserialize: {type(exc).__name__}: {exc}"
            g = _operation_graph(cudnn, problem, op, strides)
            g.create_execution_plan(int(entry["engine"]), _knobs(cudnn, entry["knobs"]))
            g.build_plans()
            self.how = "rebuilt from its recipe"
        self.graph = g
        self.workspace = int(g.get_workspace_size())

    def execute(self, index: int, buffers: tuple, uids: tuple) -> None:
        handle, ws = _launch_state(self.device, self.workspace)
        if self.ordered:
            try:
                self.graph.execute(buffers, ws, handle=handle, tensor_uids=uids)
                return
            except (TypeError, ValueError):  # (checked before any launch)
                self.ordered = False
        self.graph.execute(dict(zip(uids, buffers)), ws, handle=handle)


def _ordered(cudnn) -> bool:
    """Whether this frontend executes an ordered tuple of buffers by ``tensor_uids``
    (1.32: its operand binding is cached, ~10 us less host time per call than a
    {uid: tensor} dict on an H100 host, benchmarks/results/host/2026-11-24-s4/)."""
    return "tensor_uids" in inspect.signature(cudnn.pygraph.execute_plan_at_index).parameters


#: device -> the raw stream its handle was last set to
_HANDLE_STREAMS: dict[int, int] = {}


def _launch_state(device: int, nbytes: int):
    """(the device's handle, set to the current stream; the workspace for that stream)."""
    stream = torch._C._cuda_getCurrentRawStream(device)
    handle = _handle(device)
    if _HANDLE_STREAMS.get(device) != stream:
        cudnn, _ = cudnn_frontend()
        cudnn.set_stream(handle, stream)
        _HANDLE_STREAMS[device] = stream
    return handle, workspace.for_stream(nbytes, device, stream)


def _operation_graph(cudnn, problem: ConvProblem, op: str, strides: tuple):
    """A validated graph of ``op`` with its operation graph built (no plans yet)."""
    io = _DTYPES(cudnn)[problem.dtype]
    g = cudnn.pygraph(io_data_type=io, intermediate_data_type=cudnn.data_type.FLOAT,
                      compute_data_type=cudnn.data_type.FLOAT,
                      handle=_handle(torch.cuda.current_device()))
    _build(cudnn, g, problem, op, strides)
    g.validate()
    g.build_operation_graph()
    return g


def _DTYPES(cudnn):
    return {torch.float32: cudnn.data_type.FLOAT, torch.float16: cudnn.data_type.HALF,
            torch.bfloat16: cudnn.data_type.BFLOAT16}


def _as4d(shape, stride, rank):
    """Rank-1 tensors as rank 2 of height 1 (cuDNN convolutions are 2-D or 3-D)."""
    shape, stride = list(shape), list(stride)
    if rank == 1:
        shape.insert(2, 1)
        stride.insert(2, stride[2] * shape[3] if len(stride) > 2 else 1)
    return shape, stride


def _geometry(problem: ConvProblem):
    pre, post = list(problem.pad_pre), list(problem.pad_post)
    stride, dil = list(problem.stride), list(problem.dilation)
    if problem.rank == 1:
        pre, post, stride, dil = [0] + pre, [0] + post, [1] + stride, [1] + dil
    return dict(pre_padding=pre, post_padding=post, stride=stride, dilation=dil)


def _build(cudnn, g, problem: ConvProblem, op: str, strides: tuple) -> None:
    """Add the nodes of ``op`` to ``g``: two operand tensors (strides[0], strides[1]), the
    convolution node, its output (strides[2]). Tensor uids are the roles _X, _W, _Y."""
    conv = problem.conv_equivalent()  # a transposed forward is this convolution's dgrad
    io = _DTYPES(cudnn)[problem.dtype]
    geo = _geometry(conv)
    if op == "fprop" and not problem.transposed:
        a, b, out = (_X, conv.input_shape()), (_W, conv.weight_shape()), (_Y, conv.output_shape())
    elif op == "fprop":  # transposed: the equivalent convolution's dgrad graph
        a, b, out = (_X, conv.output_shape()), (_W, conv.weight_shape()), (_Y, conv.input_shape())
    elif op == "dgrad":
        a, b, out = (_Y, conv.output_shape()), (_W, conv.weight_shape()), (_X, conv.input_shape())
    else:
        a, b, out = (_Y, conv.output_shape()), (_X, conv.input_shape()), (_W, conv.weight_shape())

    def operand(uid, shape, stride):
        dim, st = _as4d(shape, stride, problem.rank)
        return g.tensor(dim=dim, stride=st, data_type=io, uid=uid, name=f"t{uid}")

    ta, tb = operand(*a, strides[0]), operand(*b, strides[1])
    if op == "fprop" and not problem.transposed:
        y = g.conv_fprop(image=ta, weight=tb, **geo)
    elif op in ("fprop", "dgrad"):
        y = g.conv_dgrad(loss=ta, filter=tb, **geo)
    else:
        y = g.conv_wgrad(image=tb, loss=ta, **geo)
    dim, stride = _as4d(out[1], strides[2], problem.rank)
    # dim and stride together (a stride alone is silently ignored: wrong results), and
    # always the dim (a grouped dgrad cannot infer it)
    y.set_output(True).set_dim(dim).set_stride(stride).set_data_type(io).set_uid(out[0])
