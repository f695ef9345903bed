"""The README's measured table and the demo's shipped record, from one models-bench JSON.

    fastconv bench --suite models --cases timm_resnet50_b32 --mode eval,train \\
        --precision bf16 --provider torch,torch_compile,fastconv,fastconv_cuda_graph \\
        --tune-budget default --reps 30 --out DIR
    python benchmarks/readme_table.py DIR/models-*.json [--write]

(a CSV the bench wrote beside its JSON stands in for a JSON that did not come back; the
metadata is the first JSON's, of the same run) prints the markdown table (medians, and
each ratio over torch eager of the same run) and,
with ``--write``, replaces the README's table and writes ``src/fastconv/data/measured.json``
(what ``fastconv demo`` prints on a machine without a GPU).
"""

from __future__ import annotations

import argparse
import csv
import json
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
COLUMNS = [("torch", "ms_p50", "torch eager"), ("torch", "graph_ms_p50", "torch CUDA graph"),
           ("torch_compile", "ms_p50", "torch.compile"),
           ("fastconv", "ms_p50", "fastconv.optimize"),
           ("fastconv_cuda_graph", "ms_p50", "optimize(cuda_graph=True)")]


def demo_name(model_key: str) -> str:
    """The bench's model key as ``fastconv demo --model`` spells it."""
    if model_key == "deeplabv3_r50":
        return "deeplabv3"
    for prefix, spelled in (("timm_", "timm:"), ("tv_", "")):
        if model_key.startswith(prefix):
            return spelled + model_key[len(prefix):]
    return model_key


def table(result: dict) -> tuple[str, dict]:
    meta, rows = result["meta"], result["rows"]
    cells = {(r["case"], r["mode"], r["provider"]): r for r in rows}
    lines = ["| model | batch | " + " | ".join(c[2] for c in COLUMNS) + " |",
             "|---|---|" + "---|" * len(COLUMNS)]
    record = {}
    for case, mode in dict.fromkeys((r["case"], r["mode"]) for r in rows):
        base = cells.get((case, mode, "torch"), {}).get("ms_p50")
        out, speedups = [], {}
        for provider, field, label in COLUMNS:
            value = cells.get((case, mode, provider), {}).get(field)
            if value is None or base is None:
                out.append("—")
                continue
            out.append(f"{value:.2f} ms ({base / value:.2f}x)")
            if provider.startswith("fastconv"):
                speedups[f"{label} over torch eager"] = base / value
                compiled = cells.get((case, mode, "torch_compile"), {}).get("ms_p50")
                if compiled:
                    speedups[f"{label} over torch.compile (default mode)"] = compiled / value
        sample = cells[(case, mode, "torch")]
        what = "inference" if mode == "eval" else "training step"
        name = case.rsplit("_b", 1)[0]
        lines.append(f"| {name} {what} | {int(sample['batch'])} | " + " | ".join(out) + " |")
        record[f"{demo_name(name)} {mode}"] = dict(batch=int(sample["batch"]),
                                                        speedups=speedups)
    head = (f"{meta['date'][:10]}, one {meta['gpu']}, torch {meta['torch']}, Triton "
            f"{meta['triton']}, cuDNN {meta['cudnn']}, fastconv {meta['fastconv']}; bf16 "
            f"channels-last (torch under autocast), 224x224, medians with the providers "
            f"interleaved; in brackets the speed-up over torch eager of the same run. A "
            f"training step is forward, backward and SGD; torch.compile is its default mode.")
    shipped = dict(date=meta["date"][:10], gpu=meta["gpu"], torch=meta["torch"],
                   source=f"fastconv {meta['fastconv']} at {meta['git_sha']}, the README's table",
                   rows=record)
    return head + "\n\n" + "\n".join(lines), shipped


def _number(text: str):
    try:
        return float(text) if text else None
    except ValueError:
        return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", help="the bench's JSON (or CSV) files of one run")
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    meta, rows = None, []
    for name in args.files:
        path = pathlib.Path(name)
        if path.suffix == ".json":
            result = json.loads(path.read_text())
            meta = meta or result["meta"]
            rows += result["rows"]
        else:
            with path.open() as f:
                rows += [{k: _number(v) for k, v in r.items()} for r in csv.DictReader(f)]
    if meta is None:
        parser.error("give at least one JSON file (its metadata names the GPU and versions)")
    text, shipped = table({"meta": meta, "rows": rows})
    reproduce = ("Reproduce with `fastconv bench --suite models --cases timm_resnet50_b32 "
                 "--mode eval,train --precision bf16 --provider "
                 "torch,torch_compile,fastconv,fastconv_cuda_graph --tune-budget default "
                 "--reps 30` on a GPU (the files and the code measured: "
                 "`benchmarks/NOTES.md`).")
    text = text + "\n\n" + reproduce
    print(text)
    if args.write:
        readme = ROOT / "README.md"
        body = readme.read_text()
        start = body.index("## Measured\n") + len("## Measured\n")
        end = body.index("\n<!-- the table ends here -->")
        readme.write_text(body[:start] + "\n" + text + "\n" + body[end:])
        (ROOT / "src/fastconv/data/measured.json").write_text(json.dumps(shipped, indent=1)
                                                               + "\n")


if __name__ == "__main__":
    main()
