"""`cli_text`: cutting by terminal cells, tables that give way column by column."""

from __future__ import annotations

import re
from typing import Any

import pytest

from langgraph_fenced_sqlite.cli.text import Cell, Fit, View, cells, cut, table, terminal_width

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def test_cut_counts_terminal_cells_and_marks_the_cut() -> None:
    assert cells("abc") == 3 and cells("日本語") == 6 and cells("e\u0301") == 1
    assert cut("abcdef", 6) == "abcdef"
    assert cut("abcdefgh", 6) == "abcde\u2026"
    assert cut("日本語テキスト", 7) == "日本語\u2026"  # never half a wide character
    assert cells(cut("日本語テキスト", 7)) <= 7
    uid = "1f1ec944-4d29-6295-8003-bdda94120108"
    short = cut(uid, 20, middle=True)
    assert cells(short) == 20 and short.startswith("1f1ec944-") and short.endswith("4120108")


ROWS = [
    {"id": "5b3c2f0e-8a41-4d6e-9f1b-2c7d8e9a0b1c", "n": 7, "note": "a long note " * 3, "x": 1},
    {"id": "chat-1", "n": 12, "note": "short", "x": 2},
]
COLUMNS: Any = [
    ("ID", lambda r: r["id"], Fit(squeeze=12, middle=True)),
    ("N", lambda r: r["n"]),
    ("NOTE", lambda r: r["note"], Fit(min=10)),
    ("EXTRA", lambda r: r["x"], Fit(drop=1)),
    ("WHEN", lambda r: Cell("2026-11-30T08:01:37Z", "3m"), Fit(short_header="AGE")),
]


@pytest.mark.parametrize("width", [40, 60, 80, 120])
def test_a_table_fits_any_width_giving_way_in_order(width: int) -> None:
    lines = table(ROWS, COLUMNS, View(width)).splitlines()
    assert all(cells(line) <= width for line in lines), lines
    headers = lines[0].split()
    assert headers[:2] == ["ID", "N"]  # never dropped
    if width >= 120:
        assert headers == ["ID", "N", "NOTE", "EXTRA", "WHEN"] and ROWS[0]["id"] in lines[1]
    if width == 80:  # short cells first, then the early shrinker cut: all columns stay
        assert headers == ["ID", "N", "NOTE", "EXTRA", "AGE"] and ROWS[0]["id"] in lines[1]
        assert "\u2026" in lines[1]  # the note, cut
    if width == 60:  # then the droppable column goes; the id is still whole
        assert headers == ["ID", "N", "NOTE", "AGE"] and ROWS[0]["id"] in lines[1]
    if width == 40:
        assert "\u2026" in lines[1]  # the id squeezed as a last resort, cut in the middle


def test_full_fits_nothing() -> None:
    lines = table(ROWS, COLUMNS, View(40, full=True)).splitlines()
    assert lines[0].split() == ["ID", "N", "NOTE", "EXTRA", "WHEN"]
    assert ROWS[0]["note"].rstrip() in lines[1]


def test_the_width_comes_from_columns_else_80_off_a_terminal(monkeypatch: Any) -> None:
    monkeypatch.setenv("COLUMNS", "132")
    assert terminal_width() == 132
    monkeypatch.delenv("COLUMNS")
    assert terminal_width() == 80  # pytest's captured stdout is not a terminal


def test_colour_codes_do_not_count_against_the_width() -> None:
    plain = table(ROWS, COLUMNS, View(60)).splitlines()
    coloured = table(ROWS, COLUMNS, View(60, colour=True)).splitlines()
    assert coloured[0].startswith("\x1b[1m") and coloured[1:] == plain[1:]


def test_a_cell_is_coloured_after_it_is_cut() -> None:
    rows = [{"state": "interrupted at a-very-long-node-name"}, {"state": "idle"}]
    columns: Any = [
        ("ID", lambda r: "x"),
        ("STATUS", lambda r: Cell(r["state"], style=("yellow",)), Fit(squeeze=12)),
        ("N", lambda r: 1),
    ]
    plain = table(rows, columns, View(20)).splitlines()
    coloured = table(rows, columns, View(20, colour=True)).splitlines()
    assert [ANSI.sub("", line) for line in coloured] == plain  # the same cells, widths
    assert "\x1b[33minterrupted" in coloured[1] and "\u2026\x1b[0m" in coloured[1]
    assert "\x1b[33midle\x1b[0m " in coloured[2]  # the padding stays uncoloured
    assert "\x1b" not in "\n".join(plain)
