"""Drop-in replacements for torch.nn's convolution modules.

Each class subclasses its torch.nn counterpart, so constructor arguments and defaults,
parameter initialisation, padding modes, ``extra_repr``, state_dict keys and ``isinstance``
checks are torch's own; only the computation goes through fastconv. Two keyword-only
arguments are added: ``backend`` ("auto", "triton", "aten") and ``precision`` (None follows
torch's TF32 flag; see fastconv.conv2d).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .. import backends, dispatch, plans
from .. import functional as fc
from ..devices import elsewhere
from ..errors import ConvTypeError
from ..precision import parse
from ..spec import ConvCall
from .callsite import CallSite
from .step import current as current_step

_REPR_DEFAULTS = {"backend": "auto", "precision": None}


class _FastconvMixin:
    """The fastconv-specific options shared by every module here."""

    backend: str
    precision: str | None
    #: Under torch.compile, compute as torch's own operators, which Inductor lowers and fuses
    #: with no per-call host cost (a custom op costs ~100 us of host per call inside a
    #: compiled graph run without CUDA graphs: benchmarks/NOTES.md). ``fastconv.compile``
    #: sets it False in CUDA-graph modes, where host time is free and fastconv's kernels
    #: pay. float32 data keeps fastconv's op (its precision follows a flag a trace cannot
    #: read); so does a forced backend.
    compiled_as_torch: bool = True

    def __getstate__(self) -> dict:
        """torch's state without the call site (never pickled or copied: callsite.py)."""
        state = super().__getstate__()
        state.pop("_callsite", None)
        return state

    def _call_site(self) -> CallSite:
        """What this module keeps between calls (made at its first call, and again after a
        copy or an unpickling)."""
        site = self.__dict__.get("_callsite")
        if site is None:
            site = self.__dict__["_callsite"] = CallSite()
        return site

    def _init_fastconv(self, backend: str, precision: str | None) -> None:
        """Checked now, not at the first forward."""
        if not isinstance(backend, str):
            raise ConvTypeError(f"backend: expected a str, got {type(backend).__name__}")
        if backend != "auto":
            backends.get(backend)
        if precision is not None:
            parse(precision)
        self.backend = backend
        self.precision = precision

    def extra_repr(self) -> str:
        s = super().extra_repr()
        for name, default in _REPR_DEFAULTS.items():
            value = getattr(self, name)
            if value != default:
                s += f", {name}={value!r}"
        return s

    def _planned(self, input: Tensor, weight: Tensor, bias: Tensor | None, padding,
                 activation: str = "none", negative_slope: float = 0.01,
                 residual: Tensor | None = None) -> Tensor | None:
        """The call through the plan this module keeps for the input's signature, so that the
        general path's host cost (validation, plan lookup, the signature of every argument)
        is paid once per signature.

        Without autograd the plan runs on the autocast casts of the parameters, kept between
        calls. With autograd, a native plan (torch's own differentiable ops) runs on the
        parameters as they are: torch's autocast casts them and torch's autograd
        differentiates the call, as in ``torch.nn.Conv2d``; a plan whose backward is
        fastconv's runs through ``plans.ConvFunction`` (as the functional path's does), on
        autocast's casts. ``None`` when the call needs the general path: an unbatched input,
        or inside torch.compile (whose graph must see the custom op, not this host cache).

        This runs on every call of every convolution of an optimized model, so a call whose
        signature was seen does only what the kept entry says: the signature (taken on the
        operands as given, before autocast's casts) is compared, then the casts the entry
        names are made and the plan runs."""
        if torch.compiler.is_compiling() or not isinstance(input, Tensor):
            return None
        call = ConvCall(len(self.kernel_size), False, self.stride, padding, self.dilation,
                        self.groups, 0, activation, negative_slope, self.backend,
                        self.precision)
        key, grad, cast = self._plan_key(call, input, weight, bias, residual)
        kept = self._call_site().plan
        if kept is None or kept[0] != key or (
                kept[1] is not None and kept[1].provisional and kept[1].expired()):
            if input.dim() != len(self.kernel_size) + 2:
                return None
            kept = self._keep(key, call, input, weight, bias, residual, grad, cast)
        _, plan, to_input, to_residual, params, op_args = kept
        if plan is None:
            return None
        if to_input is not None:
            input = to_input(input)
        if to_residual is not None:
            residual = to_residual(residual)
        if params is not None:
            weight, bias = self._cast_params(weight, bias, params)
        elif cast is not None and grad:
            step = current_step()
            if step is not None and step.casts:  # the casts a training step made in one batch
                weight = step.cast(weight, cast)
                if bias is not None:
                    bias = step.cast(bias, cast)
            elif op_args is not None:  # (a native plan's torch ops cast them themselves)
                weight, bias = fc._autocast(input.device.type, weight, bias)
        if op_args is not None:  # fastconv's backward: the autograd function, directly
            return plans.ConvFunction.apply(plan, input, weight, bias, None, None, residual,
                                            *op_args)
        return plan.run(input, weight, bias, None, None, residual, None)

    def _plan_key(self, call: ConvCall, input: Tensor, weight: Tensor, bias: Tensor | None,
                  residual: Tensor | None) -> tuple:
        """``(key, grad, cast)``: the signature :meth:`_planned` keeps its plan under (the
        call spec, built from the module's attributes at this call, so that an attribute
        changed after a call, ``conv.stride = 2``, gives another key, as torch reads them
        at every call; every operand's signature, autograd's, autocast's, the TF32
        switch's, dispatch settings'), whether the call differentiates, and autocast's dtype
        (None: autocast off)."""
        grad = torch.is_grad_enabled() and (
            input.requires_grad or weight.requires_grad
            or (bias is not None and bias.requires_grad)
            or (residual is not None and residual.requires_grad))
        cast = None
        if torch._C._is_any_autocast_enabled():
            device = "cuda" if input.is_cuda else input.device.type
            if torch.is_autocast_enabled(device):
                cast = torch.get_autocast_dtype(device)
        key = (call, input.shape, input.stride(), input.dtype, input.device, weight.shape,
               weight.stride(), weight.dtype, weight.device,
               None if bias is None else (bias.shape, bias.dtype, bias.device),
               None if residual is None else (residual.shape, residual.stride(),
                                              residual.dtype, residual.device),
               grad, cast, torch._C._get_cudnn_allow_tf32(), dispatch.current())
        return key, grad, cast

    def _conv_forward(self, input: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        """torch.nn.ConvNd's forward calls this: the convolution through the module's plan
        (inside an optimized model's training step, through the entry its first call of the
        step's settings kept: :meth:`_step_run`)."""
        device = elsewhere(input)
        if device is not None:  # (its plans run on the current device: fastconv.devices)
            with torch.cuda.device(device):
                return self._conv_forward(input, weight, bias)
        step = current_step()
        if step is not None:
            kept = self._call_site().step_conv
            if kept is not None:
                key = self._step_key_conv(input)
                if key == kept[0]:
                    try:
                        return self._step_run(kept[1], step, key[0], input, weight, bias)
                    except RuntimeError:  # the general path raises fastconv's error
                        pass
        given = input
        input, padding = self._padded(input)
        out = self._planned(input, weight, bias, padding)
        if out is None:
            out = self._as_torch(input, weight, bias, padding)
        if out is not None:
            if step is not None and step.dtype is not None:
                key = self._step_key_conv(given)
                plan = self._step_plan(key, given, weight, bias)
                if plan is not None:
                    self._call_site().step_conv = (key, plan)
            return out
        fn = fc.conv1d if len(self.kernel_size) == 1 else fc.conv2d
        return fn(input, weight, bias, self.stride, padding, self.dilation, self.groups,
                  backend=self.backend, precision=self.precision)

    def _step_key_conv(self, input: Tensor) -> tuple:
        """What picks the convolution's plan in a training step beyond the operands:
        autocast's dtype (on a CUDA or CPU input; None elsewhere), the device kind, dispatch
        settings and the module's geometry (stride, padding, dilation, groups, padding
        mode) and options. Few reads, none of them a tensor's
        signature: this runs on every layer of every eager training step, where a tensor
        signature check costs several times what it costs alone (benchmarks/NOTES.md)."""
        cuda = input.is_cuda
        device = "cuda" if cuda else "cpu" if input.is_cpu else None
        return (torch.get_autocast_dtype(device)
                if device is not None and torch.is_autocast_enabled(device) else None,
                cuda, dispatch.current(), self.stride, self.padding, self.dilation,
                self.groups, self.padding_mode, self.backend, self.precision)

    def _step_plan(self, key: tuple, input: Tensor, weight: Tensor, bias: Tensor | None):
        """The plan :meth:`_planned` ran for this call (the operands as given, before the
        module's padding mode) where a step may keep it under ``key``
        (:meth:`_step_key_conv`'s, first): a final plan of torch's own convolution,
        differentiated by torch's autograd, under 16-bit autocast. Else None."""
        entry = self._call_site().plan
        plan = None if entry is None else entry[1]
        if plan is None or plan.provisional or not plan.native_grad \
                or key[0] not in (torch.bfloat16, torch.float16) \
                or not torch.is_grad_enabled():
            return None  # (the cheap reads first: this runs on each call not kept)
        padded, padding = self._padded(input)
        call = ConvCall(len(self.kernel_size), False, self.stride, padding, self.dilation,
                        self.groups, 0, backend=self.backend, precision=self.precision)
        plan_key, grad, cast = self._plan_key(call, padded, weight, bias, None)
        if entry[0] != plan_key or not grad or cast is not key[0]:
            return None
        return plan

    def _step_run(self, plan, step, dtype: torch.dtype, input: Tensor, weight: Tensor,
                  bias: Tensor | None) -> Tensor:
        """``plan`` (see :meth:`_step_plan`) run on the step's casts of the parameters.

        The operands' signatures are not compared: torch's convolution takes any input
        autocast gives it, and the plan (its geometry) does not depend on them. An input it
        refuses raises here before anything is written (callers then take the general path,
        which raises fastconv's error). The step's cast is its own check (the same
        parameter, unchanged, in this dtype); a parameter the step did not cast is cast by
        autocast, as in torch's layer."""
        weight = step.cast(weight, dtype)
        if bias is not None:
            bias = step.cast(bias, dtype)
        input, _ = self._padded(input)
        return plan.run(input, weight, bias, None, None, None, None)

    def _keep(self, key, call, input, weight, bias, residual, grad, cast) -> tuple:
        """The entry :meth:`_planned` keeps for ``key``: ``(key, plan, input cast, residual
        cast, parameter cast dtype, the autograd function's arguments)`` (None where nothing
        is cast, where there is no plan, or where the plan runs directly: without autograd,
        or torch's own differentiable ops), made on the operands as autocast gives them;
        kept unless the plan is a provisional stand-in with no end
        (``dispatch.Choice.provisional``)."""
        to_input = to_residual = params = None
        if cast is not None:
            if fc.autocast_casts(input, cast):
                to_input = _caster(cast)
                input = to_input(input)
            if fc.autocast_casts(residual, cast):
                to_residual = _caster(cast)
                residual = to_residual(residual)
            if not grad:
                params = cast
                weight, bias = self._cast_params(weight, bias, cast)
        plan = self._new_plan(call, input, weight, bias, residual, grad, cast)
        op_args = fc.op_args(call, weight.shape[2:], input.dtype) \
            if grad and plan is not None and not plan.native_grad else None
        kept = (key, plan, to_input, to_residual, params, op_args)
        if plan is None or not plan.provisional or plan.until is not None:
            self._call_site().plan = kept
        return kept

    def _new_plan(self, call, input, weight, bias, residual, grad, cast):
        """The plan of :meth:`_planned` (validated and dispatched)."""
        if grad and cast is not None:  # planned for the dtypes autocast will give them
            weight, bias = fc._autocast(input.device.type, weight, bias)
        return plans.forward_plan(call, input, weight, bias, residual, None, None, None,
                                  grad=grad)

    def _cast_params(self, weight: Tensor, bias: Tensor | None, dtype: torch.dtype):
        """``weight`` and ``bias`` in the autocast dtype, kept between calls while they are
        the same tensors, unchanged (their versions and storage; changes made through
        ``.data`` are not seen, as by every cache keyed on tensor versions). One check for
        both: this runs on every call of an autocast model."""
        site = self._call_site()
        hit = site.casts
        if (hit is not None and hit[0] is weight and hit[1] is bias and hit[2] is dtype
                and hit[3] == weight._version and hit[4] == weight.data_ptr()
                and (bias is None or (hit[5] == bias._version and hit[6] == bias.data_ptr()))):
            return hit[7], hit[8]
        with torch.no_grad():
            cw = weight.detach().to(dtype) if fc.autocast_casts(weight, dtype) else weight
            cb = bias.detach().to(dtype) if fc.autocast_casts(bias, dtype) else bias
        site.casts = (
            weight, bias, dtype, weight._version, weight.data_ptr(),
            None if bias is None else bias._version, None if bias is None else bias.data_ptr(),
            cw, cb)
        return cw, cb

    def _as_torch(self, input: Tensor, weight: Tensor, bias: Tensor | None,
                  padding) -> Tensor | None:
        """The convolution as torch's own operators when traced by torch.compile and
        ``compiled_as_torch`` (None otherwise, or where torch's ops cannot compute it
        alike: ``functional.as_torch_ops``)."""
        if not (self.compiled_as_torch and self.backend == "auto"
                and torch.compiler.is_compiling()):
            return None
        call = ConvCall(len(self.kernel_size), False, self.stride, padding, self.dilation,
                        self.groups, 0, precision=self.precision)
        return fc.as_torch_ops(call, input, weight, bias, None, None, None)

    def _padded(self, input: Tensor) -> tuple[Tensor, object]:
        """The input padded by the module's padding mode, and the padding left to the conv."""
        if self.padding_mode == "zeros":
            return input, self.padding
        return (torch.nn.functional.pad(input, self._reversed_padding_repeated_twice,
                                        mode=self.padding_mode), 0)


def _caster(dtype: torch.dtype):
    """``t -> t`` cast to ``dtype``: the Tensor method with one signature where there is one
    (``t.to(dtype)`` parses its overloads: ~1 us more per call)."""
    method = {torch.bfloat16: Tensor.bfloat16, torch.float16: Tensor.half,
              torch.float32: Tensor.float}.get(dtype)
    return method if method is not None else (lambda t: t.to(dtype))


def tensor_state(tensors) -> tuple:
    """What :func:`same_tensors` compares: each tensor itself (held, so that its id cannot be
    reused), its version counter and its storage."""
    return tuple(None if t is None else (t, t._version, t.data_ptr()) for t in tensors)


def same_tensors(state: tuple, tensors) -> bool:
    """Whether ``tensors`` are the very tensors of ``state``, not modified in place since."""
    if len(state) != len(tensors):
        return False
    for old, t in zip(state, tensors):
        if old is None or t is None:
            if old is not t:
                return False
        elif old[0] is not t or old[1] != t._version or old[2] != t.data_ptr():
            return False
    return True


class Conv1d(_FastconvMixin, torch.nn.Conv1d):
    """torch.nn.Conv1d computed by :func:`fastconv.conv1d`."""

    def __init__(self, *args, backend: str = "auto", precision: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self._init_fastconv(backend, precision)


class Conv2d(_FastconvMixin, torch.nn.Conv2d):
    """torch.nn.Conv2d computed by :func:`fastconv.conv2d`."""

    def __init__(self, *args, backend: str = "auto", precision: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self._init_fastconv(backend, precision)


class _TransposedMixin(_FastconvMixin):
    _RANK: int
    _FN = None

    def forward(self, input: Tensor, output_size: list[int] | None = None) -> Tensor:
        if self.padding_mode != "zeros":  # torch's own rule and message
            raise ValueError(f"Only `zeros` padding mode is supported for "
                             f"{type(self).__name__}")
        output_padding = self._output_padding(input, output_size, self.stride, self.padding,
                                              self.kernel_size, self._RANK, self.dilation)
        fn = fc.conv_transpose1d if self._RANK == 1 else fc.conv_transpose2d
        return fn(input, self.weight, self.bias, self.stride, self.padding, output_padding,
                  self.groups, self.dilation, backend=self.backend, precision=self.precision)


class ConvTranspose1d(_TransposedMixin, torch.nn.ConvTranspose1d):
    """torch.nn.ConvTranspose1d computed by :func:`fastconv.conv_transpose1d`."""

    _RANK = 1

    def __init__(self, *args, backend: str = "auto", precision: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self._init_fastconv(backend, precision)


class ConvTranspose2d(_TransposedMixin, torch.nn.ConvTranspose2d):
    """torch.nn.ConvTranspose2d computed by :func:`fastconv.conv_transpose2d`."""

    _RANK = 2

    def __init__(self, *args, backend: str = "auto", precision: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self._init_fastconv(backend, precision)
