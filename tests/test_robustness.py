"""What a user meets before any number is wrong: threads, out= and autograd, construction-time
validation, the training path's argument checks, non-finite values."""

from __future__ import annotations

import threading

import pytest
import torch
import torch.nn.functional as F

import fastconv
from fastconv.precision import relative_error


def test_threads_launching_interpreted_kernels_at_once():
    """Triton's interpreter is not thread-safe (10 of 48 calls failed without the lock)."""
    failures, done = [], []

    def work(seed):
        gen = torch.Generator().manual_seed(seed)
        for _ in range(4):
            x, w = torch.randn(1, 3, 6, 5, generator=gen), torch.randn(4, 3, 3, 3, generator=gen)
            try:
                y = fastconv.conv2d(x, w, padding=1, backend="triton", precision="ieee")
                assert relative_error(y, F.conv2d(x.double(), w.double(), padding=1)) < 1e-5
                done.append(1)
            except Exception as exc:  # collected: an exception in a thread is not a failure
                failures.append(repr(exc)[:200])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not failures and len(done) == 32, failures[:3]


@pytest.mark.parametrize("backend", ["aten", "triton"])
def test_out_that_requires_grad_is_refused(backend):
    x, w = torch.randn(1, 3, 5, 5), torch.randn(4, 3, 3, 3)
    out = torch.empty(1, 4, 3, 3, requires_grad=True)
    with pytest.raises(fastconv.ConvError, match="out: requires grad"):
        fastconv.conv2d(x, w, out=out, backend=backend)
    with torch.no_grad():  # as torch: allowed without autograd
        fastconv.conv2d(x, w, out=out, backend=backend, precision="ieee")
    assert relative_error(out.detach(), F.conv2d(x.double(), w.double())) < 1e-5


@pytest.mark.parametrize("make,name", [
    (lambda: fastconv.nn.Conv2d(3, 4, 3, backend="nope"), "backend"),
    (lambda: fastconv.nn.Conv2d(3, 4, 3, precision="fp8"), "precision"),
    (lambda: fastconv.nn.Conv1d(3, 4, 3, backend=1), "backend"),
    (lambda: fastconv.nn.ConvBNAct2d(3, 4, 3, eps=float("nan")), "eps"),
    (lambda: fastconv.nn.ConvBNAct2d(3, 4, 3, activation="Relu"), "activation"),
    (lambda: fastconv.nn.ConvBNAct2d.from_torch(torch.nn.Conv2d(3, 8, 3),
                                                torch.nn.BatchNorm2d(5)), "bn"),
])
def test_modules_validate_at_construction(make, name):
    with pytest.raises(fastconv.ConvError, match=name):
        make()


def _bn_args(k=4):
    return (torch.zeros(k), torch.ones(k), torch.rand(k) + 0.5, torch.randn(k))


@pytest.mark.parametrize("training", [False, True])
def test_training_checks_arguments_as_eval_does(training):
    x, w = torch.randn(2, 3, 6, 6), torch.randn(4, 3, 3, 3)
    mean, var, gamma, beta = _bn_args()
    with pytest.raises(fastconv.ConvError, match="activation"):
        fastconv.conv_bn_act2d(x, w, None, mean, var, gamma, beta, padding=1,
                               training=training, activation="Relu")
    for residual in (torch.randn(2, 4, 5, 6), torch.randn(1, 4, 1, 1)):
        with pytest.raises(fastconv.ConvError, match="residual"):
            fastconv.conv_bn_act2d(x, w, None, mean, var, gamma, beta, padding=1,
                                   training=training, residual=residual)


@pytest.mark.parametrize("activation", ["none", "silu", "relu"])
def test_an_in_place_op_on_the_output_keeps_the_backward(activation):
    """An SE block's SiLU(inplace=True) after a convolution: the backward must not need the
    output it overwrote (it saved it before: 'modified by an inplace operation')."""
    x = torch.randn(2, 3, 5, 5, requires_grad=True)
    w = torch.randn(4, 3, 1, 1, requires_grad=True)
    y = fastconv.conv2d(x, w, activation=activation, backend="triton", precision="ieee")
    if activation == "relu":  # relu's derivative is read from its output, as torch's is:
        with pytest.raises(RuntimeError, match="inplace"):  # torch refuses this too
            F.silu(y, inplace=True).sum().backward()
        return
    F.silu(y, inplace=True).sum().backward()
    xr, wr = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    F.silu(fastconv.epilogue.activate(F.conv2d(xr, wr), activation)).sum().backward()
    assert relative_error(x.grad, xr.grad) < 1e-5 and relative_error(w.grad, wr.grad) < 1e-5
