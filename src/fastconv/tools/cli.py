"""fastconv's command line: fast, correct convolutions for PyTorch on NVIDIA GPUs.
Each command's --help describes it."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import warnings


def _prepare_cpu() -> bool:
    """True when a CUDA GPU is present; otherwise switch Triton to its interpreter (before
    any kernel module is imported) so the kernels still run, slowly, on the CPU."""
    import torch

    if torch.cuda.is_available():
        return True
    os.environ.setdefault("TRITON_INTERPRET", "1")
    return False


def cmd_info(args) -> int:
    has_gpu = _prepare_cpu()
    import platform

    import torch

    import fastconv
    from fastconv import backends

    print(f"fastconv {fastconv.__version__}  python {platform.python_version()}  "
          f"torch {torch.__version__}")
    try:
        import triton
        print(f"triton {triton.__version__}")
    except ImportError:
        print("triton: not installed")
    if has_gpu:
        cap = torch.cuda.get_device_capability()
        print(f"GPU: {torch.cuda.get_device_name()} (compute capability {cap[0]}.{cap[1]}), "
              f"CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}")
    else:
        print("GPU: no GPU found (CPU only; Triton kernels run in the interpreter)")
    for name, cls in backends.REGISTRY.items():
        ok, why = cls.available()
        print(f"backend {name:<8} {'available' if ok else 'unavailable: ' + why}")
    return 0


def cmd_check(args) -> int:
    has_gpu = _prepare_cpu()
    from fastconv.tools.check import HEADER, format_row, run_check

    if not has_gpu:
        print("No GPU found: checking on the CPU, Triton kernels in the interpreter on small "
              "sizes (tf32/fp16/bf16 tensor-core numerics need a GPU).")
    t0 = time.time()
    done = [0]

    def tick():
        done[0] += 1
        if sys.stderr.isatty() and done[0] % 10 == 0:
            print(f"\r{done[0]} problems checked", end="", file=sys.stderr, flush=True)

    print(HEADER)
    print("-" * len(HEADER))
    rows = run_check(count=args.count, seed=args.seed, verbose=args.verbose, progress=tick,
                     emit=lambda r: print(format_row(r), flush=True))
    bad = [r for r in rows if not r.ok]
    total = sum(r.count for r in rows if r.count > 1) + sum(
        1 for r in rows if r.count == 1 and r.case.startswith(("seed", "causal")))
    print(f"{total} problems in {time.time() - t0:.0f} s: "
          + ("all within the contract" if not bad else f"{len(bad)} VIOLATIONS"))
    return 1 if bad else 0


def _ints(text: str) -> int | tuple[int, ...]:
    """"3" -> 3, "2,1" or "2x1" -> (2, 1) (argparse type: a bad value is a usage error)."""
    try:
        vals = tuple(int(v) for v in text.replace("x", ",").split(",") if v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an int or comma-separated ints, got "
                                         f"{text!r}") from None
    if not vals:
        raise argparse.ArgumentTypeError(f"expected an int or comma-separated ints, got {text!r}")
    return vals[0] if len(vals) == 1 else vals


def _shape(text: str) -> tuple[int, ...]:
    """"8,3,32,32" -> (8, 3, 32, 32): positive ints (argparse type)."""
    vals = _ints(text)
    vals = vals if isinstance(vals, tuple) else (vals,)
    if any(v <= 0 for v in vals):
        raise argparse.ArgumentTypeError(f"expected positive sizes, got {text!r}")
    return vals


def _padding(text: str):
    return text if text in ("same", "valid") else _ints(text)


def cmd_explain(args) -> int:
    has_gpu = _prepare_cpu()
    import torch

    import fastconv
    from fastconv import ConvError, plans
    from fastconv.spec import ConvCall

    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    device = "cuda" if has_gpu else "cpu"
    shape, wshape = args.input, args.weight
    if len(shape) not in (3, 4) or len(wshape) != len(shape):
        print(f"--input {args.input} / --weight {args.weight}: expected N,C,L and K,C/g,R "
              f"(1-D) or N,C,H,W and K,C/g,R,S (2-D)", file=sys.stderr)
        return 2
    k = wshape[1] * args.groups if args.transposed else wshape[0]
    layout = torch.channels_last if args.layout == "nhwc" and len(shape) == 4 \
        else torch.contiguous_format

    def tensors(on):  # the operands on ``on``: meta first, to validate without memory
        x = torch.randn(shape, device=on, dtype=dtype).contiguous(memory_format=layout)
        return (x, torch.randn(wshape, device=on, dtype=dtype),
                torch.randn(k, device=on, dtype=dtype) if args.bias else None)

    try:
        call = ConvCall(len(shape) - 2, args.transposed, args.stride, args.padding,
                        args.dilation, args.groups, 0, args.activation, 0.01, args.backend,
                        args.precision)
        problem = plans.forward_problem(call, *tensors("meta"), None, None, None, None)
    except ConvError as exc:
        print(f"explain: {exc}", file=sys.stderr)
        return 2
    need = dtype.itemsize * (math.prod(shape) + math.prod(wshape)
                             + math.prod(problem.output_shape()))
    free = _free_bytes(device)
    if need > free // 2:
        print(f"explain: --input {','.join(map(str, shape))} --weight "
              f"{','.join(map(str, wshape))} needs {need / 2**30:.1f} "
              f"GiB of {device} memory for its tensors and output, and "
              f"{free / 2**30:.1f} GiB are free; explain runs the candidates on real tensors",
              file=sys.stderr)
        return 2
    x, w, b = tensors(device)
    ex = fastconv.explain(x, w, b, args.stride, args.padding, args.dilation, args.groups,
                          transposed=args.transposed,
                          activation=args.activation, backend=args.backend,
                          precision=args.precision, dispatch=args.dispatch)
    if not has_gpu:
        print("no CUDA GPU found: CPU backends only, nothing timed")
    print(ex)
    return 0


def _free_bytes(device: str) -> int:
    """Memory free on ``device`` ("cuda": the current GPU's; "cpu": the machine's)."""
    import torch

    if device == "cuda":
        return torch.cuda.mem_get_info()[0]
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def cmd_bench(args) -> int:
    from fastconv.tools.bench import command

    return command.run(args, _prepare_cpu())


def cmd_compare(args) -> int:
    from fastconv.tools.bench import command

    return command.compare_files(args)


def cmd_demo(args) -> int:
    from fastconv.tools import demo

    return demo.run(model=args.model, batch=args.batch, size=args.size,
                    precision=args.precision, train=args.train, image=args.image,
                    weights=args.weights, out=args.out, reps=args.reps,
                    num_classes=args.num_classes)


def cmd_tune(args) -> int:
    from fastconv.tools import tune

    given = [args.model is not None, args.suite is not None, bool(args.shape or args.shapes)]
    if sum(given) != 1:
        print("tune: give one of --model NAME, --suite NAME, or --shape SPEC / --shapes FILE")
        return 2
    specs = list(args.shape or []) + (tune.read_shapes(args.shapes) if args.shapes else [])
    cases = [tune.parse_shape(spec) for spec in specs]  # bad shapes refused before the GPU test
    if not torch_cuda_available():
        print("No CUDA GPU found: tuning times the candidates on a GPU; nothing to do here "
              "(the CPU runs every convolution through aten).")
        return 1
    modes = tuple(args.mode.split(","))
    if args.model is not None:
        done = tune.tune_model(args.model, args.batch, args.size, args.precision, args.train,
                               progress=True)
    elif args.suite is not None:
        done = tune.tune_suite(args.suite, args.precision, modes, progress=True)
    else:
        done = tune.tune_cases(cases, args.precision, modes, f"{len(cases)} shapes",
                               progress=True)
    print(f"tuned {done['what']}: {done['choices']} choices in {done['seconds']:.1f} s, "
          f"stored in {done['cache'] or 'memory only (FASTCONV_CACHE_DIR is off)'}")
    return 0


def torch_cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def cmd_plans(args) -> int:
    from fastconv import dispatch, plancache, workspace
    from fastconv.backends import cudnn
    from fastconv.tools.progress import Bar

    cache = dispatch.CACHE
    path = cache.path()
    stores = (("dispatch choices", cache), ("serialized cuDNN plans", cudnn.PLANS))
    if args.export:
        with Bar(len(stores) + 1, f"exporting to {args.export}", plain=False) as step:
            parts = []
            for name, store in stores:
                step(f"reading the {name}")
                parts.append(store.export())
            step(f"writing {args.export}")
            document = {"fastconv_plans": 1, "stores": parts}
            with open(args.export, "w", encoding="utf-8") as f:
                json.dump(document, f)
        print(", ".join(f"{len(d['entries'])} {name}" for (name, _), d in
                        zip(stores, document["stores"])) + f" written to {args.export}")
        return 0
    if args.import_:
        with Bar(2 * len(stores) + 1, f"importing {args.import_}", plain=False) as step:
            step(f"reading {args.import_}")
            with open(args.import_, encoding="utf-8") as f:
                try:
                    document = json.load(f)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{args.import_} is not JSON ({exc})") from None
            if not isinstance(document, dict) or document.get("fastconv_plans") != 1 \
                    or not isinstance(document.get("stores"), list) \
                    or len(document["stores"]) != len(stores):
                raise ValueError(f"{args.import_} is not a `fastconv plans --export` file")
            # every store's part checked before any is merged: all or nothing
            parts = []
            for (name, store), d in zip(stores, document["stores"]):
                step(f"checking the {name}")
                parts.append(store.importable(d))
            counts, snapshots = [], []
            try:  # a store that fails to merge puts back those merged before it
                for (name, store), entries in zip(stores, parts):
                    step(f"merging {len(entries)} {name}")
                    snapshots.append(store.snapshot())
                    counts.append(store.merge(entries))
            except Exception:
                for (_, store), snapshot in zip(stores, snapshots):
                    store.restore(snapshot)
                raise
        print(", ".join(f"{n} {name}" for (name, _), n in zip(stores, counts))
              + f" merged into {os.path.dirname(path)}")
        return 0
    if args.clear:
        cache.clear(disk=True)
        cudnn.clear(disk=True)
        workspace.clear()
        print(f"cleared the in-memory choices, the cuDNN graphs and serialized plans, and "
              f"{path or 'no disk cache'}")
        return 0
    print(f"disk cache: {path or 'disabled (FASTCONV_CACHE_DIR)'}"
          + (f" ({cache.disk_entries()} entries)" if path else ""))
    print(f"environment: {plancache.environment()}")
    db = plancache.database_file()
    if db and os.path.exists(db):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            n = len(plancache.PlanCache(database=True)._database())
        print(f"tuning database: {db} ({n} entries"
              + (f"; {caught[0].message}" if caught else "") + ")")
    else:
        print(f"tuning database: none for this GPU ({db or 'no GPU, or FASTCONV_TUNING_DB=off'})")
    entries = cache._load() if path else {}
    for key, entry in list(entries.items())[:args.limit]:
        ms = entry.get("ms")
        print(f"  {key}: {entry['backend']} {entry.get('config')}"
              + (f" {ms * 1000:.1f} us" if ms else ""))
    if len(entries) > args.limit:
        print(f"  ... {len(entries) - args.limit} more (--limit)")
    print(f"in memory: {len(cache)} choices (hits {cache.hits}, misses {cache.misses}, "
          f"evictions {cache.evictions}); cuDNN graphs built: {cudnn.graph_count()}")
    if cudnn.PLANS.path():
        ser = cudnn.SERIALIZATION
        print(f"serialized cuDNN plans: {cudnn.PLANS.disk_entries()} in {cudnn.PLANS.path()} "
              f"(this process: {ser['restored']} restored, {ser['stored']} stored"
              + (f"; last error: {ser['last_error']}" if ser["last_error"] else "") + ")")
    for s in workspace.stats():
        print(f"workspace {s.device} stream {s.stream:#x}: {s.bytes} bytes, {s.requests} "
              f"requests, {s.grows} grows, largest {s.largest_request}, refused {s.refused}")
    print(f"workspace limit: {workspace.limit()} bytes")
    return 0


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        """One line and exit status 2 (argparse's default also prints the usage)."""
        print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


def main(argv: list[str] | None = None) -> int:
    """Bad arguments (a usage error, or a ConvError or ValueError from the library) print one
    line and exit 2; any other failure one line and exit 1; ``--debug`` shows tracebacks."""
    from fastconv.env import __version__

    parser = _Parser(prog="fastconv", description=__doc__,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"fastconv {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks of errors")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("info", help="versions, the GPU and which backends run here"
                   ).set_defaults(fn=cmd_info)
    p = sub.add_parser("check", help="the precision contract of every backend on random "
                                     "problems, on this machine")
    p.add_argument("--count", type=int, default=50, help="random problems per backend/precision")
    p.add_argument("--seed", type=int, default=0, help="seed of the random problems")
    p.add_argument("--verbose", action="store_true", help="one row per random problem")
    p.set_defaults(fn=cmd_check)
    p = sub.add_parser("bench", help="time benchmark suites: fastconv against torch and "
                                     "torch.compile (GPU; correctness only on the CPU)")
    p.add_argument("--suite", default="seed000",
                   help="comma-separated suites (--list names them); default seed000")
    p.add_argument("--provider", default="fastconv,fastconv_triton,torch",
                   help="comma-separated: fastconv (auto dispatch), fastconv_triton, "
                        "fastconv_aten, cudnn_fe, torch, torch_compile; the models suite "
                        "adds fastconv_cuda_graph, fastconv_compile, torch_compile_ro")
    p.add_argument("--precision", default="tf32",
                   help="comma-separated: ieee, tf32, fp16, bf16 (default tf32)")
    p.add_argument("--mode", default="fwd",
                   help="fwd, bwd (data + weight gradient), train (forward + backward), "
                        "dgrad, wgrad, or eval (BatchNorm suites: inference mode); "
                        "models: eval, train; seqconv: fwd, train; comma-separated for "
                        "several")
    p.add_argument("--layout", choices=("nchw", "nhwc"), default=None,
                   help="default: nchw for fp32 data, nhwc (channels_last) for fp16/bf16")
    p.add_argument("--reps", type=int, default=50, help="timed calls per measurement")
    p.add_argument("--out", default=None,
                   help="default: benchmarks/results on a GPU, out/bench-cpu without one")
    p.add_argument("--list", action="store_true", help="list the suites")
    p.add_argument("--compare", metavar="OLD.json", help="print per-case deltas against it")
    p.add_argument("--fail-if-regression", type=float, metavar="PCT", default=None,
                   help="with --compare: exit 3 if any case is more than PCT%% slower")
    p.add_argument("--plot", action="store_true", help="also write PNG plots (matplotlib)")
    p.add_argument("--cases", default=None,
                   help="comma-separated case names: run only these cases of the suites")
    p.add_argument("--cpu-cases", type=int, default=3,
                   help="without a GPU: how many cases of each suite to check (shrunk)")
    p.add_argument("--fresh", type=float, metavar="SECONDS", default=None,
                   help="run each forward case as a new user's process would: a new process, "
                        "an empty plan cache, the default tuning budget; fastconv's time per "
                        "call over its first SECONDS against torch's (FASTCONV_TUNING_DB=off: "
                        "without the shipped database)")
    p.add_argument("--breakdown", action="store_true",
                   help="suite models: where one step's GPU time goes, by kind of kernel and "
                        "per fused conv layer against its floor (torch.profiler), instead of "
                        "the timing table")
    p.add_argument("--ddp", type=int, metavar="N", default=None,
                   help="suite models, mode train: training steps under "
                        "DistributedDataParallel on 1 and on N GPUs of this host (per-GPU "
                        "batch fixed), with the scaling efficiency, instead of the timing "
                        "table")
    p.add_argument("--layer-check", action="store_true",
                   help="suite models: every convolution of a CUDA-graph step against torch's "
                        "own choice for the same call, in graph time (same and rotated "
                        "operands), instead of the timing table")
    p.add_argument("--spent-budget", action="store_true",
                   help="with --fresh: start each process with its tuning budget spent")
    p.add_argument("--tune-budget", default="exhaustive",
                   help="dispatch's tuning budget: exhaustive (default: steady state after "
                        "full tuning, what `FASTCONV_TUNE_BUDGET=exhaustive` gives), default "
                        "(the library's default budget, what a first run gets) or "
                        "'<seconds per problem>[,<seconds per process>[,<candidates per "
                        "backend>]]'")
    p.set_defaults(fn=cmd_bench)
    p = sub.add_parser("compare", help="per-case deltas between two bench result files")
    p.add_argument("old", help="a bench result file (JSON)")
    p.add_argument("new", help="another, compared with OLD")
    p.add_argument("--fail-if-regression", type=float, metavar="PCT", default=None,
                   help="exit 3 if any case is more than PCT%% slower")
    p.set_defaults(fn=cmd_compare)
    p = sub.add_parser("explain", help="every backend and candidate for one convolution, "
                                       "with reasons or times, and the choice")
    p.add_argument("--input", required=True, type=_shape, help="N,C,H,W (or N,C,L)")
    p.add_argument("--weight", required=True, type=_shape,
                   help="K,C/groups,R,S (or K,C/groups,R)")
    p.add_argument("--stride", default=1, type=_ints, help="an int or h,w (default 1)")
    p.add_argument("--padding", default=0, type=_padding,
                   help="an int, h,w, same or valid (default 0)")
    p.add_argument("--dilation", default=1, type=_ints, help="an int or h,w (default 1)")
    p.add_argument("--groups", type=int, default=1, help="default 1")
    p.add_argument("--transposed", action="store_true",
                   help="a transposed convolution (WEIGHT is C,K/groups,R,S)")
    p.add_argument("--bias", action="store_true", help="with a bias")
    p.add_argument("--activation", default="none",
                   help="none, relu, relu6, leaky_relu, silu, gelu, gelu_tanh, sigmoid, "
                        "tanh or hardswish")
    p.add_argument("--dtype", choices=("fp32", "fp16", "bf16"), default="fp32",
                   help="the tensors' dtype (default fp32)")
    p.add_argument("--layout", choices=("nchw", "nhwc"), default="nchw",
                   help="the input's memory layout (nhwc: channels_last)")
    p.add_argument("--precision", default=None,
                   help="ieee, tf32, fp16 or bf16 (default: torch's TF32 flag for fp32)")
    p.add_argument("--backend", default="auto", help="auto, aten, triton or cudnn")
    p.add_argument("--dispatch", choices=("heuristic", "benchmark", "pinned"), default=None,
                   help="how auto chooses (default: benchmark on a GPU, heuristic on the "
                        "CPU)")
    p.set_defaults(fn=cmd_explain)
    p = sub.add_parser("demo", help="a model through torch and fastconv: timed against torch "
                                    "in the same precision, checked against float64")
    p.add_argument("--model", default="deeplabv3",
                   help="deeplabv3 (torchvision's DeepLabV3-ResNet50, the default), a "
                        "torchvision classifier (resnet50, mobilenet_v3_large, ...) or "
                        "timm:<name> (timm:resnet50)")
    p.add_argument("--batch", type=int, default=None,
                   help="default on a GPU 8 (deeplabv3) or 32; 2 on the CPU")
    p.add_argument("--size", type=int, default=None,
                   help="image side; default on a GPU 512 (deeplabv3) or 224; 64 on the CPU")
    p.add_argument("--precision", choices=("ieee", "tf32", "bf16", "fp16"), default=None,
                   help="fastconv's precision and the baseline's (default bf16 on a GPU, "
                        "ieee on the CPU)")
    p.add_argument("--train", action="store_true",
                   help="time a training step (forward, backward, SGD) instead of inference")
    p.add_argument("--image", default=None, help="an image file (PNG/JPEG) to run on")
    p.add_argument("--weights", default=None, help="a local state_dict for --model")
    p.add_argument("--num-classes", type=int, default=None,
                   help="classes of the model's head (default: the model's own)")
    p.add_argument("--reps", type=int, default=None, help="timed repetitions per row")
    p.add_argument("--out", default="fastconv-demo.png", help="the PNG to write")
    p.set_defaults(fn=cmd_demo)
    p = sub.add_parser("plans", help="show, clear, export or import the plan caches")
    p.add_argument("--clear", action="store_true",
                   help="forget every choice, cuDNN plan and workspace (memory and disk)")
    p.add_argument("--limit", type=int, default=50, help="disk entries to list")
    p.add_argument("--export", metavar="FILE", default=None,
                   help="write the disk caches (choices and cuDNN plans) to FILE")
    p.add_argument("--import", dest="import_", metavar="FILE", default=None,
                   help="merge a file written by --export on a machine of the same "
                        "environment into the disk caches")
    p.set_defaults(fn=cmd_plans)
    p = sub.add_parser("tune", help="fill the plan cache ahead of time: every convolution of "
                                    "a model, a bench suite or a list of shapes, tuned "
                                    "exhaustively")
    p.add_argument("--model", default=None,
                   help="a models-suite name (timm_resnet50, tv_convnext_tiny, resnet50, "
                        "deeplabv3_r50), timm:<name> / torchvision:<name>, or an entry point "
                        "package.module:function / file.py:function returning the model")
    p.add_argument("--suite", default=None, help="a bench suite (fastconv bench --list)")
    p.add_argument("--shape", action="append", default=None, metavar="SPEC",
                   help="a convolution INPUT:WEIGHT[:key=value...], e.g. "
                        "32x64x56x56:128x64x3x3:stride=2:padding=1 (repeatable; keys: "
                        "stride, padding, dilation, groups, bias, activation, transposed, "
                        "output_padding, bn, causal)")
    p.add_argument("--shapes", default=None, metavar="FILE",
                   help="a file of --shape specs, one a line (# comments)")
    p.add_argument("--batch", type=int, default=32, help="the model's batch (default 32)")
    p.add_argument("--size", type=int, default=224, help="input height and width (model)")
    p.add_argument("--precision", default="bf16", help="ieee, tf32, bf16 or fp16")
    p.add_argument("--train", action="store_true",
                   help="a training step (model): the choices CUDA-graph training takes "
                        "(eager training runs torch's convolution untimed)")
    p.add_argument("--mode", default="fwd",
                   help="suite and shape modes, comma-separated (bench's: fwd, train, eval, "
                        "dgrad, wgrad, bwd)")
    p.set_defaults(fn=cmd_tune)
    args = parser.parse_args(argv)
    if args.debug:
        return args.fn(args)
    try:
        return args.fn(args)
    except ValueError as exc:  # ConvError included: what the user asked for is not allowed
        print(f"fastconv {args.command}: error: {_one_line(exc)} (--debug for the traceback)",
              file=sys.stderr)
        return 2
    except Exception as exc:
        print(f"fastconv {args.command}: failed: {type(exc).__name__}: {_one_line(exc)} "
              "(--debug for the traceback)", file=sys.stderr)
        return 1


def _one_line(exc: BaseException) -> str:
    return "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())


if __name__ == "__main__":
    sys.exit(main())
