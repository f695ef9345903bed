"""Writes the BEST line of a probe_rows.py log (the file named) into shortrows.py's TILES,
in the source tree named second: python set_tiles.py probe.log src"""
import json
import re
import sys

line = next((t for t in open(sys.argv[1]) if t.startswith("BEST ")), None)
if line is None:
    sys.exit("no BEST line: the probe did not finish")
best = json.loads(line[5:])
tiles = {cls: tuple(tuple(best[f"{d} {cls}"]) if best.get(f"{d} {cls}") else None
                    for d in ("forward", "backward")) for cls in (5, 9, 17)}
path = f"{sys.argv[2]}/fastconv/backends/triton/shortrows.py"
text = open(path).read()
text, n = re.subn(r"^TILES = \{.*?\}\n", f"TILES = {tiles!r}\n", text, flags=re.M | re.S)
assert n == 1, "TILES not found"
open(path, "w").write(text)
print("TILES", tiles)
