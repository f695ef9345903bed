"""Convolution → BatchNorm → activation as one module, in training and in inference.

``ConvBNAct2d`` is a ``fastconv.nn.Conv2d`` (its ``weight`` and ``bias`` initialised and named
as torch.nn.Conv2d's) holding a ``torch.nn.BatchNorm2d`` as ``bn`` (γ, β, running statistics,
``num_batches_tracked``, initialised and updated as torch's), so the state_dict keys are
``weight``, ``bias``, ``bn.weight``, ``bn.bias``, ``bn.running_mean``, ``bn.running_var`` and
``bn.num_batches_tracked``. ``from_torch``/``to_torch`` convert from and to
``torch.nn.Sequential(Conv2d, BatchNorm2d, activation)``.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import functional as fc
from ..batchnorm import bn_act, finish_bn_act, fused_here, takes_torch_ops
from ..devices import elsewhere
from ..epilogue import Epilogue, activate
from ..errors import ConvError, real_number
from ..spec import Norm
from .conv import Conv1d, Conv2d, same_tensors, tensor_state
from .step import current as current_step

#: torch activation module -> (fastconv activation, negative_slope)
_TORCH_ACTIVATIONS = {
    torch.nn.Identity: "none", torch.nn.ReLU: "relu", torch.nn.ReLU6: "relu6",
    torch.nn.LeakyReLU: "leaky_relu", torch.nn.SiLU: "silu", torch.nn.Sigmoid: "sigmoid",
    torch.nn.Tanh: "tanh", torch.nn.Hardswish: "hardswish",
}


def _activation_of(module: torch.nn.Module | None) -> tuple[str, float]:
    if module is None:
        return "none", 0.01
    if isinstance(module, torch.nn.GELU):
        return ("gelu_tanh" if module.approximate == "tanh" else "gelu"), 0.01
    name = _TORCH_ACTIVATIONS.get(type(module))
    if name is None:
        raise ConvError(f"activation: {type(module).__name__} has no fastconv equivalent; "
                        f"supported: {', '.join(c.__name__ for c in _TORCH_ACTIVATIONS)}, GELU")
    return name, getattr(module, "negative_slope", 0.01)


def _torch_activation(name: str, negative_slope: float) -> torch.nn.Module:
    if name == "leaky_relu":
        return torch.nn.LeakyReLU(negative_slope)
    if name in ("gelu", "gelu_tanh"):
        return torch.nn.GELU(approximate="tanh" if name == "gelu_tanh" else "none")
    return next(cls for cls, n in _TORCH_ACTIVATIONS.items() if n == name)()


def _affine(bn: torch.nn.Module) -> tuple[Tensor | None, Tensor | None]:
    """A BatchNorm's γ and β from its module dicts (nn.Module's __getattr__ costs ~0.4 us a
    lookup): parameters, or buffers where a frozen norm keeps them."""
    params, buffers = bn._parameters, bn._buffers
    return (params["weight"] if "weight" in params else buffers.get("weight"),
            params["bias"] if "bias" in params else buffers.get("bias"))


def _per_channel(k: int, *tensors) -> bool:
    """Whether every one of ``tensors`` that is given holds one value per output channel
    (else the general path names the one that does not)."""
    return all(t is None or (isinstance(t, Tensor) and t.shape == (k,)) for t in tensors)


class _ConvBNActMixin:
    _RANK: int
    _TORCH_CONV: type
    _BN: type

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0,
                 dilation=1, groups=1, bias=False, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, activation="relu", process_group=None,
                 device=None, dtype=None, *, padding_mode="zeros", negative_slope=0.01,
                 sync_stats=False, backend="auto", precision=None):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation,
                         groups, bias, padding_mode, device=device, dtype=dtype,
                         backend=backend, precision=precision)
        negative_slope = real_number("negative_slope", negative_slope)
        Epilogue(activation=activation, negative_slope=negative_slope)  # validates
        real_number("eps", eps, positive=True)  # checked now, not at the first forward
        if momentum is not None:
            real_number("momentum", momentum)
        self.bn = self._BN(out_channels, eps, momentum, affine, track_running_stats,
                           device=device, dtype=dtype)
        self.activation = activation
        self.negative_slope = negative_slope
        self.process_group = process_group
        self.sync_stats = sync_stats

    def forward(self, input: Tensor, residual: Tensor | None = None) -> Tensor:
        """``act(bn(conv(input)) + residual)``; BatchNorm's train/eval semantics exactly.
        A ``residual`` of another shape than the output is broadcast as torch's ``+`` does
        (the add and the activation then run after the fused convolution and BatchNorm)."""
        device = elsewhere(input)
        if device is not None:  # (its kernels run on the current device: fastconv.devices)
            with torch.cuda.device(device):
                return self.forward(input, residual)
        if residual is not None and isinstance(residual, Tensor) and isinstance(input, Tensor) \
                and residual.shape != self._output_shape(input):
            return activate(self._forward(input, None, "none") + residual, self.activation,
                            self.negative_slope)
        return self._forward(input, residual, self.activation)

    def _output_shape(self, input: Tensor) -> torch.Size:
        """The output's shape for this input (remembered for the last input shape, weight
        shape and geometry)."""
        weight = self._parameters["weight"]
        key = (input.shape, weight.shape, self.stride, self.padding, self.dilation)
        site = self._call_site()
        memo = site.shape
        if memo is not None and memo[0] == key:
            return memo[1]
        if self.padding == "same":
            size = tuple(input.shape[2:])
        else:
            pad = (0,) * self._RANK if self.padding == "valid" else self.padding
            size = tuple((i + 2 * p - d * (k - 1) - 1) // s + 1 for i, p, d, k, s in
                         zip(input.shape[2:], pad, self.dilation, weight.shape[2:],
                             self.stride))
        shape = torch.Size((input.shape[0], weight.shape[0], *size))
        site.shape = (key, shape)
        return shape

    def _forward(self, input: Tensor, residual: Tensor | None, activation: str) -> Tensor:
        # (parameters, buffers and the BatchNorm read from their dicts: nn.Module's
        # __getattr__ costs ~0.4 us a lookup, nine per call)
        bn = self._modules["bn"]
        step = current_step()
        if step is not None:
            kept = self._call_site().step_entry
            if kept is not None:
                out = self._step_call(kept, step, bn, input, residual, activation)
                if out is not None:
                    return out
        buffers = bn._buffers
        running_mean, running_var = buffers.get("running_mean"), buffers.get("running_var")
        training = self.training and bn.training  # a BatchNorm that stays in eval: frozen
        factor = 0.0 if bn.momentum is None else bn.momentum
        tracked = buffers.get("num_batches_tracked")
        if training and bn.track_running_stats and tracked is not None:
            if bn.momentum is None:  # cumulative moving average: the count is read now
                tracked.add_(1)
                factor = 1.0 / float(tracked)
            elif step is not None:  # incremented with the step's other counters
                step.count(tracked)
            else:
                tracked.add_(1)
        batch_stats = training or (running_mean is None and running_var is None)
        if not batch_stats and not (torch.is_grad_enabled() and self._needs_grad()):
            return self._folded_forward(input, residual, activation)
        if training and not bn.track_running_stats:  # batch statistics, none updated
            running_mean = running_var = None
        group = self.process_group
        if group is None and self.sync_stats:
            group = torch.distributed.group.WORLD
        given = input
        input, padding = self._padded(input)
        weight, bias = self._parameters["weight"], self._parameters["bias"]
        if batch_stats and group is None:
            # the convolution through the module's plan, then the batch norm: a call's
            # least host work (the general path below checks the arguments and finds the
            # plan again each call)
            y = self._planned(input, weight, bias, padding)
            if y is not None and (residual is None or (residual.dtype == y.dtype
                                                       and residual.device == y.device)):
                gamma, beta = _affine(bn)
                if step is not None and step.dtype is not None and training \
                        and bn.track_running_stats and tracked is not None \
                        and bn.momentum is not None:
                    self._keep_step_call(bn, y, gamma, beta, given, residual, activation)
                return bn_act(y, Norm(gamma, beta, running_mean, running_var, factor, bn.eps),
                              residual, activation, self.negative_slope, None)
        elif not batch_stats and _per_channel(weight.shape[0], running_mean, running_var,
                                              *_affine(bn)):
            # inference with autograd: BatchNorm folded differentiably into the weights, one
            # convolution with its epilogue through the module's plan (the general path
            # below does the same after checking the statistics' shapes)
            from ..batchnorm import fold

            w, b = fold(weight, bias, running_mean, running_var, *_affine(bn), bn.eps)
            y = self._planned(input, w, b, padding, activation, self.negative_slope, residual)
            if y is not None:
                return y
        fn = fc.conv_bn_act1d if self._RANK == 1 else fc.conv_bn_act2d
        return fn(input, weight, bias, running_mean, running_var, *_affine(bn), self.stride,
                  padding, self.dilation, self.groups, training=batch_stats, momentum=factor,
                  eps=bn.eps, activation=activation, negative_slope=self.negative_slope,
                  residual=residual, process_group=group, backend=self.backend,
                  precision=self.precision)

    def _step_key(self, bn: torch.nn.Module, input: Tensor, residual: Tensor | None,
                  activation: str) -> tuple:
        """What picks the path of a training call of :meth:`_forward` inside a step beyond
        the operands: the convolution's (:meth:`_step_key_conv`), the fused passes'
        switches, the module's and its BatchNorm's options and flags, and the residual's
        dtype and device kind."""
        return (*self._step_key_conv(input), fused_here(), activation, self.negative_slope,
                self.training, bn.training, bn.track_running_stats, bn.momentum is None,
                self.process_group, self.sync_stats,
                None if residual is None else (residual.dtype, residual.is_cuda))

    def _keep_step_call(self, bn: torch.nn.Module, y: Tensor, gamma: Tensor | None,
                        beta: Tensor | None, input: Tensor, residual: Tensor | None,
                        activation: str) -> None:
        """After a training call inside a step whose convolution a step may keep
        (:meth:`_step_plan`) and whose batch norm is torch's (:func:`takes_torch_ops`):
        keep the plan under :meth:`_step_key`, so that the next calls make the same ops with
        no other check (:meth:`_step_call`)."""
        key = self._step_key(bn, input, residual, activation)
        plan = self._step_plan(key, input, self._parameters["weight"],
                               self._parameters["bias"])
        buffers = bn._buffers
        if plan is not None and takes_torch_ops(y, gamma, beta, buffers.get("running_mean"),
                                                buffers.get("running_var")):
            self._call_site().step_entry = (key, plan)

    def _step_call(self, kept: tuple, step, bn: torch.nn.Module, input: Tensor,
                   residual: Tensor | None, activation: str) -> Tensor | None:
        """The training call of :meth:`_forward` as the entry kept by
        :meth:`_keep_step_call` says (the convolution by :meth:`_step_run`, torch's batch
        norm, :func:`finish_bn_act`), or None (the general path then runs) where the key
        differs or torch's ops refuse the operands: before anything is written, and before
        a batch of one value per channel, which torch's batch norm takes without a word."""
        key = self._step_key(bn, input, residual, activation)
        if key != kept[0]:
            return None
        params, buffers = self._parameters, bn._buffers
        try:
            y = self._step_run(kept[1], step, key[0], input, params["weight"], params["bias"])
            if y.numel() <= y.shape[1]:
                return None
            z = torch.batch_norm(y, *_affine(bn), buffers.get("running_mean"),
                                 buffers.get("running_var"), True, bn.momentum, bn.eps,
                                 torch._C._get_cudnn_enabled())
        except RuntimeError:
            return None
        step.count(buffers["num_batches_tracked"])
        return finish_bn_act(z, residual, activation, self.negative_slope)

    def _needs_grad(self) -> bool:
        return any(p.requires_grad for p in self.parameters())

    def _folded_forward(self, input: Tensor, residual: Tensor | None,
                        activation: str) -> Tensor:
        """Inference without autograd: one convolution with BatchNorm folded into weights and
        bias that are kept between calls and refolded only when a parameter or statistic
        changed (replaced or modified in place: the tensors themselves, their versions and
        storage are compared; a change made through ``.data`` is not seen)."""
        from ..batchnorm import fold

        bn = self.bn
        sources = (self._parameters["weight"], self._parameters["bias"],
                   bn._buffers["running_mean"], bn._buffers["running_var"], *_affine(bn))
        input, padding = self._padded(input)
        y = self._as_torch(input, sources[0], sources[1], padding)
        if y is not None:  # traced as torch's own model computes it: Inductor fuses the rest
            y = F.batch_norm(y, sources[2], sources[3], sources[4], sources[5], False, 0.0,
                             bn.eps)
            return activate(y if residual is None else y + residual, activation,
                            self.negative_slope)
        if torch.compiler.is_compiling():  # a traced graph folds each call: no host cache
            weight, bias = fold(*sources, bn.eps)
        else:
            site = self._call_site()
            cached = site.fold
            if cached is None or not same_tensors(cached[0], sources) or cached[3] != bn.eps:
                with torch.no_grad():
                    cached = (tensor_state(sources), *fold(*sources, bn.eps), bn.eps)
                site.fold = cached
            weight, bias = cached[1], cached[2]
        out = self._planned(input, weight, bias, padding, activation, self.negative_slope,
                              residual)
        if out is not None:
            return out
        fn = fc.conv1d if self._RANK == 1 else fc.conv2d
        return fn(input, weight, bias, self.stride, padding, self.dilation, self.groups,
                  activation=activation, negative_slope=self.negative_slope,
                  residual=residual, backend=self.backend, precision=self.precision)

    def extra_repr(self) -> str:
        s = super().extra_repr() + f", activation={self.activation!r}"
        if self.activation == "leaky_relu":
            s += f", negative_slope={self.negative_slope}"
        if self.sync_stats or self.process_group is not None:
            s += ", sync_stats=True"
        return s

    @classmethod
    def from_torch(cls, conv: torch.nn.Module, bn: torch.nn.Module | None = None,
                   activation: torch.nn.Module | None = None, **kwargs):
        """The fused module computing ``torch.nn.Sequential(conv, bn, activation)`` (pass the
        Sequential itself or its parts), with copies of its parameters and buffers and its
        training flag."""
        if isinstance(conv, torch.nn.Sequential):
            parts = list(conv)
            if not 2 <= len(parts) <= 3:
                raise ConvError(f"conv: expected Sequential(Conv, BatchNorm[, activation]), "
                                f"got {len(parts)} modules")
            conv, bn, activation = (parts + [None])[:3]
        if not isinstance(conv, cls._TORCH_CONV) or not isinstance(bn, cls._BN):
            raise ConvError(f"conv, bn: expected {cls._TORCH_CONV.__name__} and "
                            f"{cls._BN.__name__}, got {type(conv).__name__} and "
                            f"{type(bn).__name__}")
        if bn.num_features != conv.out_channels:
            raise ConvError(f"bn: {type(bn).__name__}({bn.num_features}) after a convolution "
                            f"of {conv.out_channels} output channels; they must be equal")
        act, slope = _activation_of(activation)
        # copies of the convolution's parameters, and of the BatchNorm with every option of
        # it (e.g. bias=False) as it is
        module = cls._holding(copy.deepcopy(conv), copy.deepcopy(bn), act, slope, **kwargs)
        return module.train(conv.training)

    @classmethod
    def _holding(cls, conv: torch.nn.Module, bn: torch.nn.Module, activation: str,
                 negative_slope: float, **kwargs):
        """The fused module over ``conv``'s own Parameters and ``bn`` itself: no copies, no
        initialisation (built on the meta device, as ``convert`` builds its modules), so
        tied weights stay tied. ``bn`` must be a ``cls._BN``; its training flag is the
        module's."""
        module = cls(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride,
                     conv.padding, conv.dilation, conv.groups, conv.bias is not None, bn.eps,
                     bn.momentum, bn.affine, bn.track_running_stats, activation,
                     padding_mode=conv.padding_mode, negative_slope=negative_slope,
                     device="meta", dtype=conv.weight.dtype, **kwargs)
        module.weight = conv.weight
        module.bias = conv.bias
        module.bn = bn
        return module.train(bn.training)

    def to_torch(self) -> torch.nn.Sequential:
        """An equivalent ``torch.nn.Sequential(Conv, BatchNorm, activation)`` (copies)."""
        ref = self.weight
        conv = self._TORCH_CONV(
            self.in_channels, self.out_channels, self.kernel_size, self.stride, self.padding,
            self.dilation, self.groups, self.bias is not None, self.padding_mode,
            device=ref.device, dtype=ref.dtype)
        conv.load_state_dict({k: v for k, v in self.state_dict().items()
                              if not k.startswith("bn.")})
        seq = torch.nn.Sequential(conv, copy.deepcopy(self.bn),
                                  _torch_activation(self.activation, self.negative_slope))
        return seq.train(self.training)


class ConvBNAct1d(_ConvBNActMixin, Conv1d):
    """Conv1d → BatchNorm1d → activation; see the module docstring."""

    _RANK, _TORCH_CONV, _BN = 1, torch.nn.Conv1d, torch.nn.BatchNorm1d


class ConvBNAct2d(_ConvBNActMixin, Conv2d):
    """Conv2d → BatchNorm2d → activation as one module: ``act(bn(conv(x)) + residual)``.

    Training mode normalises with the batch statistics of the convolution output (all ranks
    of ``process_group``, or of the default group with ``sync_stats=True``, as
    torch.nn.SyncBatchNorm) and updates the running statistics as torch.nn.BatchNorm2d;
    eval mode folds them into the convolution's epilogue (one kernel).

    Args:
        in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias,
            padding_mode, device, dtype: ``torch.nn.Conv2d``'s (``bias`` defaults to False:
            a BatchNorm follows).
        eps, momentum, affine, track_running_stats: ``torch.nn.BatchNorm2d``'s, held by
            ``.bn``.
        activation: ``"relu"`` (default), ``"none"``, ``"relu6"``, ``"leaky_relu"``,
            ``"silu"``, ``"gelu"``, ``"gelu_tanh"``, ``"sigmoid"``, ``"tanh"`` or
            ``"hardswish"``; ``negative_slope`` is leaky_relu's.
        process_group, sync_stats: synchronise the statistics over a process group (or the
            default group).
        backend, precision: fastconv's, as in ``fastconv.nn.Conv2d``.

    ``forward(input, residual=None)``: the residual is added before the activation.
    ``from_torch(Sequential(conv, bn, act))`` and ``to_torch()`` convert both ways; the
    state_dict keys are ``weight``, ``bias`` and ``bn.*``.
    """

    _RANK, _TORCH_CONV, _BN = 2, torch.nn.Conv2d, torch.nn.BatchNorm2d
