"""GPU tests of ConvBNAct2d: real sizes in tf32 and bf16 channels-last against float64, and
(on a host with two GPUs) statistics synchronised over NCCL against torch.nn.SyncBatchNorm
and a short DDP training run against torch's modules."""

import copy
import os

import pytest
import torch

from fastconv.nn import ConvBNAct2d
from fastconv.precision import TOLERANCE, Precision, relative_error

pytestmark = pytest.mark.gpu

LAYERS = [(64, 64, 56, 3, 1), (256, 128, 28, 1, 1), (128, 128, 28, 3, 2), (3, 64, 112, 7, 2),
          (512, 512, 7, 3, 1)]


def _err(t, ref, scale):
    return float((t.double() - ref).norm() / (ref.norm() + 1e-2 * scale))


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "native"])
@pytest.mark.parametrize("precision", [Precision.TF32, Precision.BF16], ids=str)
def test_training_and_eval_real_sizes(precision, fused, monkeypatch):
    """Outputs and gradients against float64. The outputs are held to the precision
    contract. Every gradient passes through the activation's mask (set by rounded outputs)
    and BatchNorm's backward, which cancels (dy − mean(dy) − x̂·mean(dy·x̂)): their error is
    judged against the error torch's own Conv -> BatchNorm -> ReLU makes in the same
    precision (at most twice it, or the contract where torch does better)."""
    from fastconv import batchnorm

    monkeypatch.setattr(batchnorm, "FUSED_IN_EAGER", fused)  # eager: native unless fused
    dtype = torch.float32 if precision == Precision.TF32 else torch.bfloat16
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", precision == Precision.TF32)
    report = []
    for c, k, hw, ks, s in LAYERS:
        m = ConvBNAct2d(c, k, ks, s, ks // 2, activation="relu", device="cuda",
                        precision=precision.value).to(memory_format=torch.channels_last)
        with torch.no_grad():
            m.bn.weight.uniform_(0.5, 1.5)
            m.bn.bias.uniform_(-0.5, 0.5)
        ref = m.to_torch().double()
        same = m.to_torch().to(dtype)  # torch's modules in the same precision
        same[1].float()
        m = m.to(dtype)
        m.bn.float()  # BatchNorm's parameters and statistics stay float32, as under autocast
        x = torch.randn(16, c, hw, hw, device="cuda").to(dtype)
        x = x.contiguous(memory_format=torch.channels_last).requires_grad_()
        xr = x.detach().double().requires_grad_()
        xs = x.detach().clone().requires_grad_()
        y, yr, ys = m(x), ref(xr), same(xs)
        assert relative_error(y, yr) <= TOLERANCE[precision], (c, k, hw, ks, s)
        g = torch.randn_like(yr)
        got = torch.autograd.grad(y, (x, m.weight, m.bn.weight, m.bn.bias), g.to(dtype))
        want = torch.autograd.grad(yr, (xr, ref[0].weight, ref[1].weight, ref[1].bias), g)
        theirs = torch.autograd.grad(ys, (xs, same[0].weight, same[1].weight, same[1].bias),
                                     g.to(dtype))
        scale = want[1].norm()
        for name, a, b, t in zip(("dx", "dw", "dgamma", "dbeta"), got, want, theirs):
            ref_scale = scale if name == "dw" else b.norm()
            ours, torchs = _err(a, b, ref_scale), _err(t, b, ref_scale)
            report.append((name, c, k, hw, ks, s, f"{ours:.2e}", f"torch {torchs:.2e}"))
            bound = max(TOLERANCE[precision], 2 * torchs)
            assert ours <= bound, report[-1]
        for stat in ("running_mean", "running_var"):  # means near 0: judged as above
            ours = relative_error(getattr(m.bn, stat), getattr(ref[1], stat))
            torchs = relative_error(getattr(same[1], stat), getattr(ref[1], stat))
            assert ours <= max(1e-3, 2 * torchs), (stat, ours, torchs)
        m.eval()
        ref.eval()
        x1 = x[:1].detach()
        assert relative_error(m(x1), ref(x1.double())) <= TOLERANCE[precision]
    print(*report, sep="\n")


def _ddp_worker(rank, world, port, out):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("nccl", rank=rank, world_size=world)
    torch.cuda.set_device(rank)
    torch.backends.cudnn.allow_tf32 = False  # torch's reference in strict fp32, as ours
    try:
        torch.manual_seed(0)
        ours = ConvBNAct2d(8, 16, 3, padding=1, sync_stats=True, precision="ieee").cuda()
        ref = torch.nn.Sequential(*ours.to_torch())
        ref[1] = torch.nn.SyncBatchNorm.convert_sync_batchnorm(
            torch.nn.Sequential(ref[1]))[0]
        ref = ref.cuda()
        # synced statistics: one step on rank-dependent data, compared with SyncBatchNorm
        torch.manual_seed(1 + rank)
        x = torch.randn(4 + rank, 8, 12, 12, device="cuda")  # unequal batches
        y, yr = ours(x), ref(x)
        stats = [relative_error(y, yr), relative_error(ours.bn.running_mean,
                                                       ref[1].running_mean),
                 relative_error(ours.bn.running_var, ref[1].running_var)]
        # a short DDP run of a small net: fastconv's fused layers against torch's modules
        # holding the same initial weights (with SyncBatchNorm)
        torch.manual_seed(0)
        fast = torch.nn.Sequential(
            ConvBNAct2d(3, 16, 3, padding=1, sync_stats=True, precision="ieee"),
            ConvBNAct2d(16, 16, 3, 2, 1, sync_stats=True, precision="ieee"),
            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(16, 10))
        slow = torch.nn.SyncBatchNorm.convert_sync_batchnorm(torch.nn.Sequential(
            *fast[0].to_torch(), *fast[1].to_torch(), *copy.deepcopy(fast[2:])))
        losses = {}
        for name, net in (("fastconv", fast), ("torch", slow)):
            net = DDP(net.cuda(), device_ids=[rank])
            opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
            gen = torch.Generator(device="cuda").manual_seed(100 + rank)
            losses[name] = []
            for _ in range(5):
                xb = torch.randn(8, 3, 16, 16, device="cuda", generator=gen)
                yb = torch.randint(0, 10, (8,), device="cuda", generator=gen)
                loss = torch.nn.functional.cross_entropy(net(xb), yb)
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses[name].append(loss.item())
        torch.save({"stats": stats, "losses": losses}, out.format(rank))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("layout", ["channels_last", "contiguous"])
@pytest.mark.parametrize("c,hw,ks,s", [(128, 56, 3, 2), (128, 28, 3, 1), (37, 13, 3, 2)])
def test_strict_fp32_gradients_any_upstream_layout(c, hw, ks, s, layout):
    """Strict fp32 (ResNet-50's layer2.0.conv2 among others), the upstream gradient in the
    other memory format than the output: every output and gradient within 3x torch's own
    fp32 error against float64, and the Triton batch-norm passes equal to the torch-ops
    path's accuracy."""
    from fastconv import batchnorm

    fmt, other = torch.channels_last, torch.contiguous_format
    if layout == "contiguous":
        fmt, other = other, fmt
    torch.manual_seed(c + hw)
    m = ConvBNAct2d(c, c, ks, s, ks // 2, activation="relu", device="cuda",
                    precision="ieee").to(memory_format=fmt)
    x = torch.relu(torch.randn(8, c, hw, hw, device="cuda")).contiguous(memory_format=fmt)
    results = {}
    flags = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    try:
        for label, dtype in (("f64", torch.float64), ("torch", torch.float32),
                             ("triton", torch.float32), ("ops", torch.float32)):
            xi = x.to(dtype).requires_grad_()
            if label in ("f64", "torch"):
                conv, bn, act = m.to_torch().to(dtype)
                z = act(bn(conv(xi)))
                params = (conv.weight, bn.weight, bn.bias)
            else:
                mod = copy.deepcopy(m)
                batchnorm.USE_TRITON = label == "triton"
                batchnorm.FUSED_IN_EAGER = True
                try:
                    z = mod(xi)
                finally:
                    batchnorm.USE_TRITON = True
                    batchnorm.FUSED_IN_EAGER = False
                params = (mod.weight, mod.bn.weight, mod.bn.bias)
            torch.manual_seed(1)
            dz = torch.randn(z.shape, device="cuda", dtype=torch.float64).to(dtype)
            dz = dz.contiguous(memory_format=other)
            results[label] = (z, *torch.autograd.grad(z, (xi, *params), dz))
    finally:
        torch.backends.cudnn.allow_tf32 = flags
    for k, name in enumerate(("z", "dx", "dw", "dgamma", "dbeta")):
        want = results["f64"][k]
        errs = {label: relative_error(results[label][k].double(), want)
                for label in ("torch", "triton", "ops")}
        assert max(errs["triton"], errs["ops"]) <= max(3 * errs["torch"], 1e-6), (name, errs)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_two_gpus_sync_stats_and_ddp(tmp_path):
    import torch.multiprocessing as mp

    out = str(tmp_path / "rank{}.pt")
    mp.spawn(_ddp_worker, args=(2, 29517, out), nprocs=2, join=True)
    for r in range(2):
        res = torch.load(out.format(r))
        assert max(res["stats"]) < 1e-5, res["stats"]
        assert res["losses"]["fastconv"] == pytest.approx(res["losses"]["torch"], rel=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_bn_plans_follow_the_call_on_the_gpu(dtype, monkeypatch):
    """test_fused's check with the launches prepared (the interpreter has none): a plan
    reused where its key changed would launch stale arguments or kernels."""
    from fastconv import batchnorm
    from test_fused import check_bn_plans_follow_the_call

    monkeypatch.setattr(batchnorm, "FUSED_IN_EAGER", True)
    check_bn_plans_follow_the_call("cuda", dtype)
