"""`fastconv bench` with shortrows.TILES set to the tiles probe_rows.py found best (its
"BEST" line, in the file named first; "none": no tiles, shortconv.py's kernels throughout;
"shipped": as shipped): python bench_rows.py probe.log|none|shipped bench ..."""
import json
import sys

from fastconv.backends.triton import shortrows
from fastconv.tools.cli import main

if sys.argv[1] == "none":
    shortrows.TILES.update({cls: (None, None) for cls in shortrows.TILES})
elif sys.argv[1] != "shipped":
    line = next((t for t in open(sys.argv[1]) if t.startswith("BEST ")), None)
    if line is not None:  # (else as shipped: the probe did not finish)
        best = json.loads(line[5:])
        for cls in shortrows.TILES:
            shortrows.TILES[cls] = tuple(
                tuple(best[f"{d} {cls}"]) if best.get(f"{d} {cls}") else None
                for d in ("forward", "backward"))
print("TILES", shortrows.TILES, file=sys.stderr, flush=True)
main(sys.argv[2:])
