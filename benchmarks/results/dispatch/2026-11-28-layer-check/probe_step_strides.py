"""Probe (issue 54): the operands of mobilenet_v3's small wgrads as its training step passes
them (strides) at the step's first call, and aten timed on those operands against clean ones."""
import torch

from fastconv import backends, plans
from fastconv.precision import Precision
from fastconv.problem import layout_strides
from fastconv.tools.bench import layercheck
from fastconv.tools.bench.models import BUILDERS, model_input, no_dropout, provider_call

seen = {}
_gp = plans._grad_plan


def grad_plan(op, grad_out, input, weight, geometry, out=None):
    plan = _gp(op, grad_out, input, weight, geometry, out)
    if op == "wgrad" and input.shape[-1] == 1 and input.shape[-2] == 1:
        key = (tuple(grad_out.shape), grad_out.stride(), tuple(input.shape), input.stride())
        if key not in seen:
            print("SEEN", key, plan.problem.layout, plan.backend, flush=True)
        seen[key] = plan
    return plan


plans._grad_plan = grad_plan
torch.backends.cudnn.benchmark = True
torch.manual_seed(0)
model = BUILDERS["tv_mobilenet_v3_large"]().cuda().train()
x = model_input("tv_mobilenet_v3_large", 32, 224, "cuda")
fn, net = provider_call("fastconv_cuda_graph", model, x, Precision.BF16, "train")
with no_dropout(net):
    fn()
torch.cuda.synchronize()
aten = backends.REGISTRY["aten"]


def strided(shape, stride):
    return torch.empty_strided(shape, stride, dtype=torch.bfloat16, device="cuda").normal_()


for (gs, gst, xs, xst), plan in seen.items():
    p = plan.problem
    ref = aten.bind(p, None, "wgrad")
    model_ops = (strided(gs, gst), strided(xs, xst), None)
    clean = (strided(gs, layout_strides(gs, p.layout)),
             strided(xs, layout_strides(xs, p.layout)), None)
    graphs = {("aten", "model"): layercheck.graph_of(ref, [model_ops]),
              ("aten", "clean"): layercheck.graph_of(ref, [clean])}
    ms = layercheck.replay_alternately(graphs)
    print(f"wgrad {p.describe()} choice {plan.backend} dy {gs} {gst} x {xs} {xst} "
          f"layout {p.layout}: " + " ".join(f"{a}/{b} {v*1e3:.2f}" for (a, b), v in ms.items()), flush=True)
