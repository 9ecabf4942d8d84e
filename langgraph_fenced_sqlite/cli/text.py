"""How `lgfs` draws text on a terminal: width, colour, cutting, tables that fit.

Invariant: text output fits the terminal (`$COLUMNS`, else the terminal's
width, else 80 columns when stdout is not a terminal) unless `--full` asks
for everything; colour is used only when stdout is a terminal, `NO_COLOR` is
unset or empty (https://no-color.org) and `TERM` is not `dumb`. Widths are
counted in terminal cells (wide characters take two), and colour codes are
added only after a line is cut, so they never count against the width.
JSON output never passes through here.
"""

from __future__ import annotations

import os
import shutil
import sys
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, TextIO

__all__ = [
    "Cell",
    "Fit",
    "View",
    "ago",
    "cells",
    "cut",
    "span",
    "stamp",
    "table",
    "terminal_width",
    "use_colour",
    "when",
]

_MIN_WIDTH = 40
_SGR = {
    "bold": "1",
    "dim": "2",
    "red": "31",
    "green": "32",
    "yellow": "33",
    "blue": "34",
    "magenta": "35",
    "cyan": "36",
}


def terminal_width(stream: TextIO | None = None) -> int:
    """Return the width to draw for: `$COLUMNS`, the terminal's, or 80 off a terminal."""
    stream = stream or sys.stdout
    if os.environ.get("COLUMNS", "").strip().isdigit() or _isatty(stream):
        return max(_MIN_WIDTH, shutil.get_terminal_size((80, 24)).columns)
    return 80


def use_colour(stream: TextIO | None = None) -> bool:
    """Whether to colour output on `stream`: a terminal, `NO_COLOR` unset, `TERM` not dumb."""
    stream = stream or sys.stdout
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    return _isatty(stream)


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def _ellipsis() -> str:
    encoding = (getattr(sys.stdout, "encoding", None) or "").lower().replace("-", "")
    return "\u2026" if encoding.startswith("utf") else "..."


def _cell(ch: str) -> int:
    if unicodedata.combining(ch):
        return 0
    return 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1


def cells(text: str) -> int:
    """Return how many terminal cells `text` takes."""
    if text.isascii():
        return len(text)
    return sum(_cell(ch) for ch in text)


def _head(text: str, width: int) -> str:
    used, out = 0, []
    for ch in text:
        w = _cell(ch)
        if used + w > width:
            break
        out.append(ch)
        used += w
    return "".join(out)


def cut(text: str, width: int, *, middle: bool = False) -> str:
    """Return `text` cut to `width` cells, marked with an ellipsis where it was cut.

    Args:
        text: One line.
        width: The most cells it may take.
        middle: Keep both ends (for ids: their start and their end tell them apart).
    """
    if cells(text) <= width:
        return text
    mark = _ellipsis()
    room = width - len(mark)
    if room <= 0:
        return mark[:width]
    if not middle:
        return _head(text, room) + mark
    tail = _head(text[::-1], room // 2)[::-1]
    return _head(text, room - cells(tail)) + mark + tail


class View:
    """How text is drawn: the width, colour, and whether to cut or show everything.

    Attributes:
        width: The terminal's width in cells.
        colour: Whether to use ANSI colours.
        full: Show everything (`--full`): no cutting, no fitting.
        all_channels: Show LangGraph's internal channels too (`--all-channels`).
    """

    def __init__(
        self, width: int = 80, colour: bool = False, full: bool = False, all_channels: bool = False
    ) -> None:
        """Hold the drawing settings (see the class attributes)."""
        self.width, self.colour, self.full, self.all_channels = width, colour, full, all_channels

    @classmethod
    def for_args(cls, args: Any, stream: TextIO | None = None) -> View:
        """Return the view for parsed arguments (`--full`, `--all-channels`) on `stream`."""
        return cls(
            terminal_width(stream),
            use_colour(stream),
            bool(getattr(args, "full", False)),
            bool(getattr(args, "all_channels", False)),
        )

    def paint(self, text: str, *styles: str) -> str:
        """Return `text` in `styles` (`bold`, `dim`, `red`...) when colour is on."""
        if not self.colour or not styles or not text:
            return text
        codes = ";".join(_SGR[s] for s in styles)
        return f"\x1b[{codes}m{text}\x1b[0m"

    def fit(self, text: str, indent: int = 0, *, middle: bool = False) -> str:
        """Cut `text` to the room left after `indent` cells (nothing is cut with `--full`)."""
        if self.full:
            return text
        return cut(text, max(8, self.width - indent), middle=middle)


# --- times -----------------------------------------------------------------------------------


def when(ts: Any) -> str:
    """Format epoch seconds as UTC ISO 8601 (`-` for None, `?` for a damaged value)."""
    if ts is None:
        return "-"
    try:
        return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (TypeError, ValueError, OverflowError, OSError):
        return f"?{ts!r}"


def span(seconds: float) -> str:
    """Format a duration briefly: `45s`, `12m5s`, `3h5m`, `2d4h`."""
    s = int(abs(seconds))
    for unit, size, sub, sub_size in (("d", 86400, "h", 3600), ("h", 3600, "m", 60)):
        if s >= size:
            rest = (s % size) // sub_size
            return f"{s // size}{unit}{f'{rest}{sub}' if rest else ''}"
    return f"{s // 60}m{s % 60}s" if s >= 60 else f"{s}s"


def ago(ts: Any, now: float) -> str:
    """Format a time relative to `now` in one unit: `12m` ago, `in 5m`, `?` if damaged."""
    if ts is None:
        return "-"
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or ts != ts:
        return f"?{ts!r}"
    gap = now - ts
    s = int(abs(gap))
    units = (("d", 86400), ("h", 3600), ("m", 60))
    text = next((f"{s // size}{unit}" for unit, size in units if s >= size), f"{s}s")
    return text if gap >= 0 else f"in {text}"


# --- tables ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cell:
    """A table cell with a shorter form for narrow terminals.

    Attributes:
        full: The text on a wide terminal (and with `--full`).
        short: The text when the table must shrink (None: the same).
        style: Its colour (`View.paint` styles), added after the cell is cut.
    """

    full: str
    short: str | None = None
    style: tuple[str, ...] = ()

    def __str__(self) -> str:
        return self.full


def stamp(ts: Any, now: float) -> Cell:
    """A time cell: ISO 8601 when there is room, else relative to `now` (`12m`, `in 5m`)."""
    return Cell(when(ts), ago(ts, now))


@dataclass(frozen=True)
class Fit:
    """How a table column gives way when the table is wider than the terminal.

    Attributes:
        drop: Dropped when the table does not fit, highest first; 0 never.
        min: Shrunk (cut, ellipsized) down to this many cells before any
            column is dropped; None: only as a last resort (`squeeze`).
        squeeze: Shrunk down to this once nothing is left to drop.
        middle: Cut in the middle, keeping both ends (ids).
        short_header: The header when the column shows its short cells.
    """

    drop: int = 0
    min: int | None = None
    squeeze: int | None = None
    middle: bool = False
    short_header: str | None = None


Columns = Sequence[tuple[str, Callable[[Any], Any]] | tuple[str, Callable[[Any], Any], Fit]]
_GAP = 2


def table(items: Sequence[Any], columns: Columns, view: View) -> str:
    """Lay `items` out under the columns' headers, fitted to `view.width`.

    Each column is `(header, get)` or `(header, get, Fit)`; `get(item)` gives
    a `Cell` or any value (shown with `str`). The table tries, in order: every
    cell in full; short cells (`Cell.short`); early-shrinking columns at their
    `min`; then drops the column with the highest `drop` and tries again; and
    last squeezes what is left. With `view.full` nothing is fitted.
    """
    specs = [(c[0], c[1], c[2] if len(c) > 2 else Fit()) for c in columns]
    grid = [[_as_cell(get(item)) for _, get, _ in specs] for item in items]
    active = list(range(len(specs)))

    def natural(col: int, short: bool) -> int:
        header, _, fit = specs[col]
        head = (fit.short_header or header) if short else header
        return max([cells(head)] + [cells(_text(row[col], short)) for row in grid])

    def widths(short: bool, limit: str | None) -> list[int]:
        out = []
        for col in active:
            fit, size = specs[col][2], natural(col, short)
            bound = fit.min if limit else None
            if limit == "squeeze":
                bound = fit.squeeze if fit.squeeze is not None else fit.min
            out.append(size if bound is None else min(size, bound))
        return out

    def total(ws: list[int]) -> int:
        return sum(ws) + _GAP * (len(ws) - 1)

    chosen: tuple[bool, list[int]] | None = None
    if view.full:
        chosen = (False, widths(False, None))
    while chosen is None:
        for short, limit in ((False, None), (True, None), (True, "min")):
            ws = widths(short, limit)
            if total(ws) <= view.width:
                chosen = (short, _grow(ws, [natural(c, short) for c in active], view.width))
                break
        else:
            droppable = [c for c in active if specs[c][2].drop]
            if droppable:
                active.remove(max(droppable, key=lambda c: specs[c][2].drop))
                continue
            ws = widths(True, "squeeze")
            chosen = (True, _grow(ws, [natural(c, True) for c in active], view.width))
    short, ws = chosen
    lines = []
    header_cells: list[tuple[str, int, tuple[str, ...]]] = []
    for col, w in zip(active, ws, strict=True):
        header, _, fit = specs[col]
        text = (fit.short_header or header) if short else header
        header_cells.append((cut(text, w), w, ("bold",)))
    lines.append(_row(header_cells, view))
    for row in grid:
        line = []
        for col, w in zip(active, ws, strict=True):
            text = _text(row[col], short)
            line.append((cut(text, w, middle=specs[col][2].middle), w, row[col].style))
        lines.append(_row(line, view))
    return "\n".join(lines)


def _grow(ws: list[int], wanted: list[int], width: int) -> list[int]:
    """Share room left over among shrunk columns, in proportion to what each lost."""
    spare = width - (sum(ws) + _GAP * (len(ws) - 1))
    lost = [max(0, want - have) for have, want in zip(ws, wanted, strict=True)]
    if spare <= 0 or not sum(lost):
        return list(ws)
    share = min(spare, sum(lost))
    out = [have + share * loss // sum(lost) for have, loss in zip(ws, lost, strict=True)]
    left = share - (sum(out) - sum(ws))
    for i, (have, want) in enumerate(zip(out, wanted, strict=True)):
        extra = min(left, max(0, want - have))
        out[i] += extra
        left -= extra
    return out


def _row(parts: list[tuple[str, int, tuple[str, ...]]], view: View) -> str:
    out = []
    for i, (text, w, style) in enumerate(parts):
        pad = "" if i == len(parts) - 1 else " " * (w - cells(text))
        out.append(view.paint(text, *style) + pad)
    return (" " * _GAP).join(out).rstrip()


def _as_cell(value: Any) -> Cell:
    return value if isinstance(value, Cell) else Cell(str(value))


def _text(cell: Cell, short: bool) -> str:
    return cell.short if short and cell.short is not None else cell.full
