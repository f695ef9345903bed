"""`fastconv bench` with shortconv.PAIRS set to the tiles probe_pairs.py found best (its
"BEST" line, in the file named first): python bench_pairs.py probe.log bench ..."""
import json
import sys

from fastconv.backends.triton import shortconv
from fastconv.tools.cli import main

line = next((t for t in open(sys.argv[1]) if t.startswith("BEST ")), None)
if line is not None:  # (else the shipped tiles: the probe did not finish)
    shortconv.PAIRS.update({k: tuple(v) for k, v in json.loads(line[5:]).items()})
print("PAIRS", shortconv.PAIRS, file=sys.stderr, flush=True)
main(sys.argv[2:])
