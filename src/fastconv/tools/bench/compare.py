"""Comparing two benchmark result files: per-case deltas and a regression gate."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from ...errors import ConvError


@dataclasses.dataclass(frozen=True)
class Delta:
    key: tuple[str, str, str, str, str]  # case, provider, precision, mode, layout
    old_ms: float
    new_ms: float

    @property
    def pct(self) -> float:
        """How much slower the new run is, in percent (negative: faster)."""
        return 100.0 * (self.new_ms / self.old_ms - 1.0)


def load(path: str | Path, what: str = "--compare") -> dict:
    """A result document written by ``fastconv bench`` (``meta`` and ``rows``); ``what``
    names the argument the path came from in errors."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ConvError(f"{what}: cannot read {path}: {exc}") from None
    if not isinstance(doc, dict) or "rows" not in doc or "meta" not in doc:
        raise ConvError(f"{what}: {path} is not a fastconv bench result (no meta/rows)")
    return doc


def _key(row: dict) -> tuple[str, str, str, str, str]:
    return (row["case"], row["provider"], row["precision"], row.get("mode", "fwd"),
            row.get("layout", ""))


def deltas(old_rows: list[dict], new_rows: list[dict], field: str = "ms_p50") -> list[Delta]:
    """One delta per row measured (``field`` set) in both runs, in the new run's order."""
    old = {_key(r): r[field] for r in old_rows if r.get(field)}
    return [Delta(_key(r), old[_key(r)], r[field]) for r in new_rows
            if r.get(field) and _key(r) in old]


def regressions(ds: list[Delta], threshold_pct: float) -> list[Delta]:
    """The deltas more than ``threshold_pct`` percent slower."""
    return [d for d in ds if d.pct > threshold_pct]


def format_deltas(ds: list[Delta], threshold_pct: float | None = None) -> str:
    head = f"{'case':<26} {'provider':<16} {'prec':<5} {'old ms':>9} {'new ms':>9} {'delta':>8}"
    lines = [head, "-" * len(head)]
    for d in ds:
        flag = "  REGRESSION" if threshold_pct is not None and d.pct > threshold_pct else ""
        lines.append(f"{d.key[0]:<26} {d.key[1]:<16} {d.key[2]:<5} {d.old_ms:9.4f} "
                     f"{d.new_ms:9.4f} {d.pct:+7.1f}%{flag}")
    if not ds:
        lines.append("(no case was measured in both runs)")
    return "\n".join(lines)
