"""The ``fastconv bench`` and ``fastconv compare`` commands (``fastconv.tools.cli`` parses
their arguments)."""

from __future__ import annotations

import sys
from pathlib import Path


def run(args, has_gpu: bool) -> int:
    """``fastconv bench``: the suites' rows timed, printed, written (and compared)."""
    from fastconv import dispatch
    from fastconv.errors import ConvError
    from fastconv.precision import Precision
    from fastconv.tools.bench import compare, report, runner, suites
    from fastconv.tools.progress import Bar

    if args.tune_budget != "default":  # (default: the library's, or FASTCONV_TUNE_BUDGET's)
        try:
            budget = dispatch.parse_budget(args.tune_budget, "--tune-budget")
        except ConvError as exc:
            print(exc)
            return 2
        dispatch.tuning_budget(budget.per_problem_s, budget.per_process_s, budget.candidates)

    if args.list:
        from fastconv.tools.bench import models, seqconv

        listed = dict(suites.SUITES, models=models.CASES, seqconv=seqconv.CASES)
        for name, cases in listed.items():
            print(f"{name}: {len(cases)} cases: {', '.join(c.name for c in cases)}")
        return 0
    from fastconv.tools.bench.models import PROVIDERS as MODEL_PROVIDERS

    allowed = runner.PROVIDERS + tuple(p for p in MODEL_PROVIDERS if p not in runner.PROVIDERS)
    providers = []
    for p in args.provider.split(","):
        if p not in allowed:
            print(f"--provider: got {p!r}; allowed: {', '.join(allowed)} (the last "
                  f"for suite models)")
            return 2
        why = runner.unavailable(p) if has_gpu or p == "cudnn_fe" else ""
        if why:
            print(f"skipping provider {p}: {why}")
        else:
            providers.append(p)
    only_models = [p for p in providers if p not in runner.PROVIDERS]
    if only_models and any(s != "models" for s in args.suite.split(",")):
        print(f"--provider: {', '.join(only_models)} runs in suite models only")
        return 2
    old = compare.load(args.compare) if args.compare else None
    out_dir = args.out or ("benchmarks/results" if has_gpu else "out/bench-cpu")
    if not has_gpu:
        print("No GPU found: timings need a CUDA GPU. Running a small correctness-only "
              "version of each case (Triton kernels in the interpreter); the JSON marks "
              "every timing as not measured.")
    modes = args.mode.split(",")
    for m in modes:
        if m not in runner.MODES:
            print(f"--mode: got {m!r}; allowed: {', '.join(runner.MODES)}")
            return 2
    if args.fresh is not None and (args.fresh < 1 or modes != ["fwd"]
                                   or {"models", "seqconv"} & set(args.suite.split(","))):
        print(f"--fresh: got {args.fresh:g} s with mode {args.mode!r} and suite {args.suite!r}; "
              f"expected at least 1 s, mode fwd and a convolution suite")
        return 2
    for flag, on in (("--breakdown", args.breakdown), ("--layer-check", args.layer_check),
                     ("--ddp", args.ddp is not None)):
        if on and args.suite != "models":
            print(f"{flag}: got suite {args.suite!r}; it runs on suite models only")
            return 2
    if args.ddp is not None and (args.ddp < 2 or modes != ["train"]):
        print(f"--ddp: got {args.ddp} with mode {args.mode!r}; expected at least 2 GPUs and "
              f"mode train")
        return 2
    if args.fresh is not None and not has_gpu:
        print("--fresh: times a new process's calls on a GPU; there is none here")
        return 2
    runs = []
    for suite in args.suite.split(","):
        if suite in ("models", "seqconv"):  # whole models; sequence convolutions
            from fastconv.tools.bench import models, seqconv
            module = models if suite == "models" else seqconv
            cases = module.CASES if has_gpu else [module.shrink(c)
                                                  for c in module.CASES[:args.cpu_cases]]
        else:
            cases = suites.get(suite)
            if not has_gpu:
                cases = [suites.shrink(c) for c in cases[:args.cpu_cases]]
        if args.cases:
            wanted = set(args.cases.split(","))
            cases = [c for c in cases if c.name in wanted]
            if not cases:
                print(f"--cases: none of {args.cases!r} is a case of suite {suite!r}")
                return 2
        for prec_name in args.precision.split(","):
            for mode in modes:
                runs.append((suite, cases, Precision(prec_name), mode))
    written, all_deltas = [], []
    with Bar(sum(len(r[1]) for r in runs), "bench") as advance:
        for suite, cases, prec, mode in runs:
            layout = args.layout or ("nchw" if prec in (Precision.IEEE, Precision.TF32)
                                     else "nhwc")
            if all(getattr(c, "rank", 2) == 1 for c in cases):
                layout = "nchw"  # torch has no channels-last 3-D tensors: conv1d runs on NCL
            ceilings = runner.measure_ceilings(prec) if has_gpu else {}
            meta = report.environment(ceilings, suite)
            # every case done so far, rewritten before the next: what a run cut short (a
            # timeout, a crash) leaves behind; removed once the run's own files are written
            partial = Path(out_dir) / f"partial-{suite}-{mode}-{prec.value}-{layout}.json"
            rows = []
            for case in cases:
                if rows:
                    report.write_partial(partial, {"meta": meta, "rows": rows})
                advance(f"{suite} {mode} {prec} {layout} {case.name}")
                if args.ddp is not None:
                    from fastconv.tools.bench import ddp
                    rows += ddp.run_case(case, providers, prec, args.ddp,
                                         "cuda" if has_gpu else "cpu", min(args.reps, 20))
                    continue
                if args.layer_check:
                    from fastconv.tools.bench import layercheck
                    rows += layercheck.run_case(case, prec, mode, "cuda" if has_gpu else "cpu",
                                                echo=has_gpu)
                    continue
                if args.breakdown:
                    from fastconv.tools.bench import breakdown
                    rows += breakdown.run_case(case, providers, prec, mode,
                                               "cuda" if has_gpu else "cpu", ceilings,
                                               echo=has_gpu)
                    continue
                if suite == "models":
                    rows += models.run_case(case, providers, prec, mode,
                                            "cuda" if has_gpu else "cpu",
                                            runner.GpuTimer() if has_gpu else None,
                                            reps=min(args.reps, 20))
                    continue
                if suite == "seqconv":
                    rows += seqconv.run_case(case, providers, prec, mode,
                                             "cuda" if has_gpu else "cpu",
                                             runner.GpuTimer() if has_gpu else None,
                                             args.reps, ceilings.get("hbm_gbps"))
                    continue
                if args.fresh is not None:
                    from fastconv.tools.bench import fresh
                    rows += fresh.run_case(suite, case, prec, layout, args.fresh,
                                           args.spent_budget, args.reps)
                    continue
                rows += runner.run_case(case, providers, prec, layout, reps=args.reps,
                                        device="cuda" if has_gpu else "cpu", mode=mode,
                                        host=suite in suites.HOST_SUITES)
            report.add_roofline(rows, ceilings)
            doc = {"meta": meta, "rows": rows}
            partial.unlink(missing_ok=True)
            stem = report.file_stem(suite, prec.value, layout, doc["meta"]["gpu"], mode)
            if args.ddp is not None:
                from fastconv.tools.bench import ddp
                stem = stem.replace("models", f"models-ddp{args.ddp}", 1)
                written += report.write(doc, out_dir, stem)
                print(ddp.table(rows))
                continue
            if args.layer_check:
                from fastconv.tools.bench import layercheck
                stem = stem.replace("models", "models-layer-check", 1)
                written += report.write(doc, out_dir, stem)
                print(layercheck.table(rows))
                continue
            if args.breakdown:
                from fastconv.tools.bench import breakdown
                stem = stem.replace("models", "models-breakdown", 1)
                written += report.write(doc, out_dir, stem)
                print(breakdown.table(rows))
                continue
            if args.fresh is not None:
                from fastconv.tools.bench import fresh
                doc["meta"].update(fresh_s=args.fresh, spent_budget=args.spent_budget)
                stem += "-fresh" + ("-spent" if args.spent_budget else "")
                written += report.write(doc, out_dir, stem)
                print(fresh.table(rows))
                continue
            written += report.write(doc, out_dir, stem)
            if args.plot and suite not in ("models", "seqconv"):  # (no FLOP model)
                from fastconv.tools.bench.plot import plot
                written += plot(doc, out_dir, stem)
            _print_table(rows)
            if old is not None:
                all_deltas += compare.deltas(old["rows"], rows)
    print("wrote " + ", ".join(map(str, written)))
    if old is not None:
        return _report_deltas(all_deltas, args.fail_if_regression)
    return 0


def _print_table(rows) -> None:
    """A rich table on a terminal (when rich is installed), plain text otherwise (logs)."""
    from fastconv.tools.bench import report

    if sys.stdout.isatty():
        try:
            from rich.console import Console
        except ImportError:
            pass
        else:
            Console().print(report.rich_table(rows))
            return
    print(report.table(rows))


def compare_files(args) -> int:
    """``fastconv compare OLD NEW``."""
    from fastconv.tools.bench import compare

    old, new = compare.load(args.old, "OLD"), compare.load(args.new, "NEW")
    return _report_deltas(compare.deltas(old["rows"], new["rows"]), args.fail_if_regression)


def _report_deltas(deltas, threshold) -> int:
    """Print per-case deltas; 3 when ``threshold`` is set and some case is slower by more."""
    from fastconv.tools.bench import compare

    print(compare.format_deltas(deltas, threshold))
    if threshold is None:
        return 0
    bad = compare.regressions(deltas, threshold)
    if bad:
        print(f"{len(bad)} case(s) more than {threshold:g}% slower")
        return 3
    print(f"no case more than {threshold:g}% slower ({len(deltas)} compared)")
    return 0
