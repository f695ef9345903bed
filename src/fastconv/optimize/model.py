"""The optimized copy of a model: its forward (channels-last inputs, autocast, the batched
training step), CUDA-graph replays, and the original model's names."""

from __future__ import annotations

import itertools
import warnings

import torch
from torch import nn

from .. import costs, dispatch, original
from ..devices import elsewhere
from ..nn import step
from ..nn.conv import _FastconvMixin
from .report import Report


class OptimizedModel(nn.Module):
    """The optimized copy of a model (``.model``), with ``.report``; its forward converts
    4-D tensor inputs to channels-last when asked, runs under autocast for bf16/fp16, and
    with ``cuda_graph`` on a GPU replays CUDA graphs per input signature: of the forward in
    inference; of the forward and its backward in training
    (``torch.cuda.make_graphed_callables``; the optimizer step stays the caller's).

    An eager training forward batches host work the layers would do one by one
    (:mod:`fastconv.nn.step`): one cast of every convolution parameter to the autocast
    dtype, one increment of every fused BatchNorm's ``num_batches_tracked`` when the forward
    ends. The values are the per-layer work's; the weight gradients reach their parameters
    at the end of the backward (not under ``torch.distributed``, where the casts stay per
    layer).

    An inference graph is captured again when a parameter or buffer was changed in place
    since its capture (the layers' cached folded weights are read by the graph). A graph
    of either kind captured while kernels the layers chose were still compiling (their
    layers ran stand-ins: aten) is captured again at the first call after they are built.
    Training graphs compute what eager calls compute, with these rules: the warm-up runs
    before capture leave the running statistics as they were (they are restored); a call
    while any parameter already holds a gradient runs eagerly (a replayed backward writes
    its gradients into the graph's own buffers, which would alias an accumulated gradient:
    use ``zero_grad(set_to_none=True)`` between steps, as torch's optimizers do by default);
    parameters must keep their tensors (an optimizer updates them in place; replacing one
    needs a new ``optimize``); a model that cannot be captured (e.g. a host
    synchronisation in its forward) runs eagerly, with the reason in ``report.notes``.

    ``state_dict()`` has the original model's keys and metadata (a fused layer's parameters
    and buffers under its convolution's and BatchNorm's names, no ``model.`` prefix) and
    ``load_state_dict`` takes them: checkpoints move both ways between the original model
    and the optimized one. ``named_parameters()`` and ``parameters()`` give the original
    names in the original order, so optimizer checkpoints move both ways too
    (:mod:`fastconv.original`); ``.model.named_parameters()`` shows the copy's own names.
    """

    def named_parameters(self, prefix: str = "", recurse: bool = True,
                         remove_duplicate: bool = True):
        if not recurse:
            return super().named_parameters(prefix, recurse, remove_duplicate)
        return original.named_parameters(self, prefix, remove_duplicate)

    def __init__(self, model: nn.Module, report: Report, channels_last: bool,
                 autocast: torch.dtype | None, cuda_graph: bool, names: original.Names):
        super().__init__()
        self.model = model
        self._names = names
        self._load_prefix = ""
        self.register_state_dict_post_hook(original.save_hook)
        self.register_load_state_dict_pre_hook(original.load_hook)
        self.register_load_state_dict_post_hook(original.report_hook)
        self.report = report
        self.channels_last = channels_last
        self.autocast = autocast
        self.cuda_graph = cuda_graph
        self._graphs: dict = {}
        self._train_graphs: dict = {}
        self._noted_held_grads = False

    def __getstate__(self) -> dict:
        """Pickled and deep-copied without its CUDA graphs and the modules it found (made
        again at the next call)."""
        state = super().__getstate__()
        state["_graphs"], state["_train_graphs"] = {}, {}
        state.pop("_convs", None)
        return state

    def _prepare(self, args):
        if not self.channels_last:
            return args
        return tuple(a.contiguous(memory_format=torch.channels_last)
                     if isinstance(a, torch.Tensor) and a.dim() == 4 else a for a in args)

    def _run(self, *args, cache: bool = True):
        """The model's forward under the optimization's autocast; an eager training forward
        (``cache``: not one a CUDA graph captures, ours or the caller's) inside a
        :func:`step.training_step`."""
        batched = cache and self.training and torch.is_grad_enabled() \
            and not torch.compiler.is_compiling() and not (
                any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)
                and torch.cuda.is_current_stream_capturing())
        if self.autocast is None:
            if not batched:
                return self.model(*args)
            with step.training_step((), None):
                return self.model(*args)
        device = next((a.device.type for a in args if isinstance(a, torch.Tensor)), "cpu")
        # (graph capture needs autocast's cast cache off: make_graphed_callables' rule)
        with torch.autocast(device, dtype=self.autocast, cache_enabled=cache):
            if not batched:
                return self.model(*args)
            with step.training_step(self._conv_params(), self.autocast):
                return self.model(*args)

    def _conv_params(self) -> list[torch.Tensor]:
        """The weights and biases of the model's fastconv convolutions (the modules found
        once per model: a module added later casts its own; a replica made by
        ``nn.DataParallel``, holding another model, finds its own)."""
        found = self.__dict__.get("_convs")
        if found is None or found[0] is not self.model:
            found = self.__dict__["_convs"] = (
                self.model, [m for m in self.model.modules() if isinstance(m, _FastconvMixin)])
        convs = found[1]
        return [p for m in convs for p in (m._parameters.get("weight"),
                                           m._parameters.get("bias")) if p is not None]

    def forward(self, *args):
        device = elsewhere(next((a for a in args if isinstance(a, torch.Tensor)), None))
        if device is not None:  # (its graphs and layers run on the current device)
            with torch.cuda.device(device):
                return self.forward(*args)
        args = self._prepare(args)
        if self.cuda_graph and all(isinstance(a, torch.Tensor) and a.is_cuda for a in args):
            if not self.training:
                return self._replay(args)
            if torch.is_grad_enabled():
                graphed = self._train_graph(args)
                if graphed is not None:
                    return graphed(*args)
        return self._run(*args)

    def _flags(self) -> tuple[bool, ...]:
        """Every submodule's train/eval flag: a graph replays the flags it was captured with
        (dropout on or off, batch or running statistics), so they are part of its key."""
        return tuple(m.training for m in self.model.modules())

    def _versions(self) -> tuple[int, ...]:
        """The version counters of every parameter and buffer (in-place changes move them)."""
        return tuple(t._version for t in itertools.chain(self.model.parameters(),
                                                         self.model.buffers()))

    def _train_graph(self, args):
        """The graphed forward + backward for this input signature (captured on first sight),
        or None where the call must run eagerly (see the class docstring)."""
        if any(p.grad is not None for p in self.model.parameters()):
            if not self._noted_held_grads:
                self._noted_held_grads = True
                self.report.notes.append(
                    "cuda_graph: a training call with gradients already held ran eagerly "
                    "(zero_grad(set_to_none=True) between steps keeps the graphs)")
            return None
        key = (tuple((a.shape, a.dtype, a.stride(), a.device, a.requires_grad) for a in args),
               self._flags())
        hit = self._train_graphs.get(key)
        if hit is not None:
            # A graph captured while kernels were still building ran those layers'
            # provisional choices (aten; the backward's builds start in the last warm-up
            # step): captured again once they are built, as an inference graph is.
            if not (hit[1] and not dispatch.building()):
                return hit[0]
            del self._train_graphs[key]
        buffers = list(self.model.buffers())
        saved = [b.clone() for b in buffers]
        graphed = None
        try:
            with dispatch.settings(graph=True), costs.generator_released_on_failure():
                graphed = torch.cuda.make_graphed_callables(  # (plans ranked by GPU time)
                    _Step(self), tuple(a.detach().clone().requires_grad_(a.requires_grad)
                                       for a in args))
        except Exception as exc:  # reported; the model runs eagerly for this signature
            note = (f"cuda_graph: training capture failed for input shapes "
                    f"{[tuple(a.shape) for a in args]} ({type(exc).__name__}: "
                    f"{(str(exc).splitlines() or [''])[0][:160]}); running eagerly")
            if torch.distributed.is_available() and torch.distributed.is_initialized():
                note += (" (under DistributedDataParallel: build DDP inside "
                         "`with torch.cuda.stream(torch.cuda.Stream())`, as PyTorch's "
                         "CUDA-graph notes require for a captured backward)")
            self.report.notes.append(note)
            # (said as it happens too: a step that silently runs eagerly is several times
            # slower at small batch, and the report is read after the fact if at all)
            warnings.warn(f"fastconv: {note}", RuntimeWarning, stacklevel=4)
        finally:
            with torch.no_grad():  # the warm-up steps must not count as training steps
                for b, v in zip(buffers, saved):
                    b.copy_(v)
            for p in self.model.parameters():
                p.grad = None
        self._train_graphs[key] = (graphed, graphed is not None and dispatch.building())
        return graphed

    def _replay(self, args):
        """One CUDA graph per input signature and module flags: captured on first sight
        (after warm-up on a side stream), replayed with the inputs copied into its static
        buffers."""
        key = (tuple((a.shape, a.dtype, a.stride(), a.device) for a in args), self._flags())
        # The graph reads what the layers cached at capture (BatchNorm folded into weights,
        # packed weights): a parameter or statistic changed in place since then (its version
        # moved) needs a new capture. So does one captured while candidates a tuning budget
        # cut short were still building (their layers ran provisional choices, aten): once
        # they are built, the warm-up before the new capture times them and takes the best.
        hit = self._graphs.get(key)
        if hit is not None and (hit[3] != self._versions()
                                or (hit[4] and not dispatch.building())):
            del self._graphs[key]
            hit = None
        if hit is None:
            static = tuple(a.clone() for a in args)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side), torch.no_grad(), dispatch.settings(graph=True):
                for _ in range(3):  # dispatch, compilation and allocations happen here
                    # (choices whose kernels compile in the background run aten meanwhile:
                    # wait for them, so that the capture takes what was chosen)
                    dispatch.finish_builds()
                    self._run(*static)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with costs.generator_released_on_failure(), torch.cuda.graph(graph), \
                    torch.no_grad(), dispatch.settings(graph=True):
                out = self._run(*static)
            hit = self._graphs[key] = (graph, static, out, self._versions(),
                                       dispatch.building())
        graph, static, out = hit[:3]
        for s, a in zip(static, args):
            s.copy_(a)
        graph.replay()
        return torch.utils._pytree.tree_map(
            lambda t: t.clone() if isinstance(t, torch.Tensor) else t, out)


class _Step(nn.Module):
    """What a training graph captures: the optimized model's forward (the model's
    parameters are this module's, so their gradients come out of the graph)."""

    def __init__(self, owner: OptimizedModel):
        super().__init__()
        self.model = owner.model
        self.__dict__["owner"] = owner  # not a submodule: no second copy of the parameters

    def forward(self, *args):
        from ..batchnorm import fused_passes

        if not torch.cuda.is_current_stream_capturing():
            dispatch.finish_builds()  # the kernels a warm-up step set compiling (_replay)
        with fused_passes():  # warm-up and capture alike (eager calls take torch's BN)
            return self.owner._run(*args, cache=False)
