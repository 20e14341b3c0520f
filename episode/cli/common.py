"""What several commands share: the error that ends a command in one line,
the progress bar, the formatting of times, sizes and tables, and datasets
opened with their errors as that error."""
from __future__ import annotations

import sys
import time
from collections.abc import Collection
from typing import TextIO


class UsageError(Exception):
    """A mistake in the command line: reported in one line, exit status 2."""


# -- progress -----------------------------------------------------------------

class Progress:
    """A one-line progress bar on stderr, redrawn at most ten times a second.

    Off by default when the stream is not a terminal (a log file would fill
    with carriage returns); `enabled` forces it on or off.
    """

    WIDTH = 30

    def __init__(self, total: int, unit: str, enabled: bool | None = None,
                 stream: TextIO | None = None):
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.total = total
        self.unit = unit
        self.start = time.perf_counter()
        self._drawn = 0.0
        self._line_len = 0
        self._done = 0
        self._note = ""

    def update(self, done: int, note: str = "") -> None:
        if not self.enabled:
            return
        self._done, self._note = done, note
        now = time.perf_counter()
        if now - self._drawn >= 0.1:
            self._drawn = now
            self._draw(now)

    def close(self) -> None:
        """Draws the last state and ends the line."""
        if self.enabled:
            self._draw(time.perf_counter())
            self.stream.write("\n")
            self.stream.flush()

    def _draw(self, now: float) -> None:
        frac = min(self._done / self.total, 1.0) if self.total else 1.0
        filled = int(frac * self.WIDTH)
        elapsed = now - self.start
        rate = self._done / elapsed if elapsed > 0 else 0.0
        line = (f"[{'#' * filled}{'.' * (self.WIDTH - filled)}] {frac:4.0%} "
                f"{self._done:,}/{self.total:,} {self.unit} {elapsed:5.1f}s "
                f"{rate:,.0f} {self.unit}/s {self._note}").rstrip()
        # Pad over the rest of a longer previous line.
        self.stream.write("\r" + line.ljust(self._line_len))
        self.stream.flush()
        self._line_len = len(line)


# -- formatting ---------------------------------------------------------------

def format_time(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def format_bytes(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


def format_table(header: list[str], rows: list[list[str]], right: Collection[int] = ()) -> str:
    """A plain-text table: columns padded, those in `right` right-aligned."""
    widths = [max(len(x) for x in col) for col in zip(header, *rows)]
    lines = []
    for row in [header, ["-" * w for w in widths], *rows]:
        cells = [x.rjust(w) if i in right else x.ljust(w)
                 for i, (x, w) in enumerate(zip(row, widths))]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def one_line(error: BaseException) -> str:
    return " ".join(str(error).split())


# -- datasets -----------------------------------------------------------------

def open_dataset(path: str, label: str = "", verify: bool = True):
    """read_episodes(path), its errors as UsageError (one line, naming the file)."""
    try:
        from episode.offline import DatasetError, read_episodes
    except ModuleNotFoundError as e:
        raise UsageError(str(e)) from None
    try:
        return read_episodes(path, verify=verify)
    except FileNotFoundError:
        raise UsageError(f"{label}no dataset at {path!r}: no such file or folder") from None
    except DatasetError as e:
        raise UsageError(f"{label}{one_line(e)}") from None
    except ModuleNotFoundError as e:      # pyarrow or msgpack missing
        raise UsageError(str(e)) from None
    except OSError as e:
        raise UsageError(f"{label}cannot read {e.filename or path!r}: {e.strerror or e}") \
            from None


def check_dataset(ds, label: str = "") -> None:
    """ds.check() (every file read and checked), its errors as UsageError."""
    from episode.offline import DatasetError

    try:
        ds.check()
    except DatasetError as e:
        raise UsageError(f"{label}{one_line(e)}") from None
    except OSError as e:
        raise UsageError(f"{label}cannot read {e.filename or ds.path!r}: {e.strerror or e}") \
            from None
