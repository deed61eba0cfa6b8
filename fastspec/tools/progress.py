"""The one progress display of fastspec's long loops (bench, eval, audit, training).

No dependency: a line on stderr with a bar, the count, figures, throughput, elapsed time and
the time left. ``inline=True`` redraws that line in place (``\\r``, for a terminal);
``inline=False`` prints one line per update (for training logs that go to files).
"""
from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["Progress", "clock"]


def clock(seconds: float) -> str:
    """Return ``seconds`` as a short duration: ``"42s"``, ``"3.5 min"``, ``"1.2 h"``."""
    if seconds != seconds:  # nan: no estimate yet
        return "?"
    if seconds < 100:
        return f"{seconds:.0f}s"
    if seconds < 6000:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


class Progress:
    """Progress of a loop of ``total`` updates (or of a fraction that the caller tracks).

    Parameters
    ----------
    total : int, optional
        Number of updates expected; without it, pass ``fraction=`` to :meth:`update` for the
        bar and the time left (a wall-clock budget, for example).
    label : str, default ""
        Prefix of every line.
    stream : text file, optional
        Defaults to ``sys.stderr`` (looked up at each write, so pytest's capture sees it).
    inline : bool, default True
        Redraw one line in place; False prints a new line per drawn update.
    every : int, default 1
        Draw every ``every``-th update only (the last one is always drawn).
    unit : str, default ""
        Name of the ``units`` counted by :meth:`update` (``"tok"``); shown as a rate.
    """

    width = 28

    def __init__(self, total: int | None = None, label: str = "", *, stream: TextIO | None = None,
                 inline: bool = True, every: int = 1, unit: str = "") -> None:
        if total is not None and total < 0:
            raise ValueError(f"total must be >= 0, got {total}")
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        self.total, self.label, self.inline, self.every, self.unit = total, label, inline, every, unit
        self._stream = stream
        self._open = False  # an inline line is drawn and not yet ended
        self.start()

    @property
    def stream(self) -> TextIO:
        return self._stream if self._stream is not None else sys.stderr

    def start(self) -> None:
        """Restart the clock and the counts."""
        self.t0 = time.perf_counter()
        self.done = 0
        self.units = 0

    @property
    def elapsed(self) -> float:
        """Seconds since :meth:`start`."""
        return time.perf_counter() - self.t0

    def update(self, note: str = "", *, n: int = 1, units: int = 0, fraction: float | None = None,
               **figures: float) -> None:
        """Count ``n`` more updates (and ``units``) and draw the line.

        ``fraction`` overrides ``done / total`` for the bar and the time left; ``figures``
        (name -> number) are printed as ``name 1.2345``.
        """
        self.done += n
        self.units += units
        if fraction is None and self.total:
            fraction = min(self.done / self.total, 1.0)
        finished = fraction is not None and fraction >= 1.0
        if self.done % self.every and not finished:
            return
        line = self._line(note, fraction, figures)
        if self.inline:
            print(f"\r{line}", end="", file=self.stream, flush=True)
            self._open = True
            if finished:
                self.close()
        else:
            print(line, file=self.stream, flush=True)

    def log(self, message: str) -> None:
        """Print ``[label] message`` on its own line."""
        self.close()
        prefix = f"[{self.label}] " if self.label else ""
        print(f"{prefix}{message}", file=self.stream, flush=True)

    def close(self) -> None:
        """End an inline line (nothing to do otherwise)."""
        if self._open:
            print(file=self.stream, flush=True)
            self._open = False

    def _line(self, note: str, fraction: float | None, figures: dict) -> str:
        el = self.elapsed
        parts = [self.label] if self.label else []
        if fraction is not None:
            filled = int(self.width * min(max(fraction, 0.0), 1.0))
            parts.append(f"[{'#' * filled}{'.' * (self.width - filled)}]")
        parts.append(f"{self.done}/{self.total}" if self.total else f"{self.done}")
        if fraction is not None:
            parts.append(f"{100 * fraction:.1f}%")
        parts += [f"{k} {v:.5g}" for k, v in figures.items()]
        if self.unit:
            parts.append(f"{self.units / max(el, 1e-9):,.0f} {self.unit}/s")
        left = el / fraction * (1 - fraction) if fraction else float("nan")
        parts.append(f"{clock(el)} elapsed, eta {clock(left)}")
        if note:
            parts.append(note[:40].ljust(40) if self.inline else note)
        return " ".join(parts)
