"""Probe (issue 54): tiny SE wgrads of mobilenet_v3 b32 where the layer check found a Triton
tile 0.75-0.94x torch: the plan dispatch makes (default budget, graph settings), dispatch's
timing of every candidate (explain), and the check's timing of the plan against torch's."""
import torch

import fastconv
from fastconv import dispatch, plans
from fastconv.problem import ConvProblem
from fastconv.spec import GradArgs
from fastconv.tools.bench import layercheck

torch.backends.cudnn.benchmark = True
CL = torch.channels_last
for cin, cout, hw in [(72, 24, 1), (120, 480, 1), (120, 32, 1), (480, 120, 1), (672, 168, 1)]:
    x = torch.randn(32, cin, hw, hw, device="cuda", dtype=torch.bfloat16).to(memory_format=CL)
    w = torch.randn(cout, cin, 1, 1, device="cuda", dtype=torch.bfloat16).to(memory_format=CL)
    dy = torch.randn(32, cout, hw, hw, device="cuda", dtype=torch.bfloat16).to(memory_format=CL)
    geo = GradArgs([1, 1], [0, 0], [0, 0], [1, 1], 1, "auto", fastconv.Precision.BF16)
    p = ConvProblem.from_tensors(x, w, None, (1, 1), ((0, 0), (0, 0)), (1, 1), 1, rank=2,
                                 precision=fastconv.Precision.BF16)
    sets = plans._Sets((dy, x), plans._like(None), w.numel() * 2)
    bound = plans._binder(lambda cls, config: cls.bind(p, config, "wgrad"))
    run = plans._rotating(lambda cls, config, k=0: bound(cls, config)(*sets[k]), sets)
    for rep in range(2):
        plans.clear_plans()
        dispatch.clear()
        with dispatch.settings(graph=True):
            plan = plans._grad_plan("wgrad", dy, x, w, geo)
        print(f"=== wgrad N32 {cin}->{cout} {hw}x{hw} rep {rep}: plan {plan.backend}", flush=True)
        for k in range(2):
            r = layercheck.measure("wgrad", plan, "cuda")
            print(f"   check {k}: fastconv same {r['fastconv_ms_same'] * 1e3:.2f} "
                  f"torch {r['torch_ms_same'] * 1e3:.2f} us ({r['ratio_same']:.3f}); "
                  f"cold {r['fastconv_ms_cold'] * 1e3:.2f} {r['torch_ms_cold'] * 1e3:.2f} "
                  f"({r['ratio_cold']:.3f})")
    with dispatch.settings(graph=True):
        print(dispatch.explain(p, op="wgrad", mode="benchmark", run=run))
