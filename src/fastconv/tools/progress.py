"""A progress bar on stderr for the commands that take a while (``fastconv bench``,
``fastconv tune``, ``fastconv plans --export/--import``): rich's bar on a terminal, one plain
line per step elsewhere (a log keeps them), unless ``plain`` is off."""

from __future__ import annotations

import sys


class Bar:
    """``with Bar(total, what) as advance:`` ... ``advance(label)`` starts the next of
    ``total`` steps. ``plain=False``: nothing off a terminal (a command of milliseconds whose
    output scripts read)."""

    def __init__(self, total: int, what: str = "", plain: bool = True):
        self.total, self.what, self.done, self.bar = total, what, 0, None
        self.plain = plain

    def __enter__(self):
        try:
            from rich.progress import Progress
        except ImportError:
            Progress = None
        if Progress is not None and sys.stderr.isatty():
            from rich.console import Console

            self.bar = Progress(console=Console(stderr=True), transient=True)
            self.bar.start()
            self.task = self.bar.add_task(self.what, total=self.total)
        return self.advance

    def advance(self, label: str) -> None:
        if self.bar is not None:
            self.bar.update(self.task, completed=self.done, description=label)
        elif self.plain or sys.stderr.isatty():  # (a terminal without rich)
            print(f"[{self.done + 1}/{self.total}] {label}", file=sys.stderr, flush=True)
        self.done += 1

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.update(self.task, completed=self.total)
            self.bar.stop()
