"""The tuning budget: how long benchmark dispatch may time the candidates of one problem
and of the whole process, and how many of a backend's candidates it builds at all.

``TUNING`` is the process's budget (``tuning_budget`` sets it; ``FASTCONV_TUNE_BUDGET``
gives the default, read at import, its errors raised at the budget's first use). The modules
of this package read it as ``budget.TUNING`` at each use, so that a new budget takes effect
everywhere."""

from __future__ import annotations

import dataclasses
import os

from ..errors import ConvError


@dataclasses.dataclass
class TuningBudget:
    """Seconds benchmark dispatch may spend timing the candidates of one problem, and of
    every problem in this process (``spent_s`` counts the latter), and how many of a
    backend's candidates it compiles and times at all (``candidates``: the ones its cost
    model expects fastest; None: every one). Each problem times at least its most promising
    candidate. No arguments: no limit (exhaustive)."""
    per_problem_s: float = float("inf")
    per_process_s: float = float("inf")
    candidates: int | None = None
    spent_s: float = 0.0

    def describe(self) -> str:
        return (f"{self.per_problem_s:g} s per problem, {self.per_process_s:g} s per process"
                + (f", {self.candidates} candidates per backend" if self.candidates else ""))

    @property
    def exhaustive(self) -> bool:
        return self.per_problem_s == self.per_process_s == float("inf") \
            and self.candidates is None


#: The tuning budget when neither ``tuning_budget`` nor ``FASTCONV_TUNE_BUDGET`` sets one:
#: (seconds per problem, seconds per process, candidates per backend). Timing aten costs
#: milliseconds; a Triton or cuDNN candidate seconds of compilation the first time, so a new
#: problem times aten and about one more candidate, and a process spends at most ~4 s (plus
#: the last candidate started) before every further new problem runs aten, timed beside its
#: Triton candidates once they are built. Measured on the H200 without a database: 4 s gave
#: timm mobilenetv3 / efficientnet_b0 first calls of 9.1 / 9.4 s against 10.3-11.2 s with 6
#: or 8 s, at a CUDA-graph time 2-3 % longer in that first process. The 6 Triton tiles the
#: cost model expects fastest held 98 % of the exhaustive winners of the shipped H100
#: database's problems (benchmarks/cost_model_recall.py).
DEFAULT_BUDGET = (1.0, 4.0, 6)


def parse_budget(text: str, what: str = "FASTCONV_TUNE_BUDGET") -> TuningBudget:
    """A budget from text: ``"exhaustive"``,
    ``"<s per problem>[,<s per process>[,<candidates per backend>]]"``, or empty for
    ``DEFAULT_BUDGET``; ``what`` names the setting in the error."""
    text = text.strip().lower()
    if text == "":
        return TuningBudget(*DEFAULT_BUDGET)
    if text in ("exhaustive", "inf", "none"):
        return TuningBudget()
    values = text.split(",")
    try:
        seconds = [float(v) for v in values[:2]]
        candidates = [int(v) for v in values[2:]]
        if not 1 <= len(values) <= 3 or any(not v > 0 for v in seconds + candidates):
            raise ValueError
    except ValueError:
        raise ConvError(f"{what}: got {text!r}; expected 'exhaustive' or '<seconds per "
                        f"problem>[,<seconds per process>[,<candidates per backend>]]', "
                        f"positive") from None
    return TuningBudget(*seconds, *candidates) if len(seconds) == 2 \
        else TuningBudget(seconds[0])


class _Unreadable:
    """The budget while ``FASTCONV_TUNE_BUDGET`` cannot be read: importing fastconv works,
    and the first use of the budget raises the error that names the variable."""

    def __init__(self, error: ConvError):
        self.error = error

    def __getattr__(self, name):
        raise self.error


def _budget_from_environment() -> TuningBudget | _Unreadable:
    try:
        return parse_budget(os.environ.get("FASTCONV_TUNE_BUDGET", ""))
    except ConvError as exc:
        return _Unreadable(exc)


TUNING = _budget_from_environment()


def tuning_budget(per_problem_s: float = float("inf"),
                  per_process_s: float = float("inf"),
                  candidates: int | None = None) -> TuningBudget:
    """Bound benchmark dispatch's timing: at most ``per_problem_s`` seconds per problem
    (after its most promising candidate) and ``per_process_s`` in all (counted from this
    call), and at most ``candidates`` of a backend's candidates compiled and timed, those
    its cost model expects fastest; see the module docstring for what is stored. No
    arguments: exhaustive. The default is ``DEFAULT_BUDGET`` (or ``FASTCONV_TUNE_BUDGET``)."""
    global TUNING
    for name, value in (("per_problem_s", per_problem_s), ("per_process_s", per_process_s)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ConvError(f"{name}: got {value!r}; expected a positive number of seconds")
    if candidates is not None and (type(candidates) is not int or candidates < 1):
        raise ConvError(f"candidates: got {candidates!r}; expected None (every candidate) "
                        f"or an int >= 1")
    TUNING = TuningBudget(float(per_problem_s), float(per_process_s), candidates)
    return TUNING
