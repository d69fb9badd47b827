"""What a host sends is shown, never obeyed: text from hosts (log lines, error details, status
fields, table cells, labels) is written as plain, visible text, so a host can neither retitle,
clear or rewrite the controller's terminal nor style it (docs/security.md, "What hosts print").

- Escaped: every character Python does not call printable, except newline, tab and the Unicode
  spaces (category Zs): the C0 controls (ESC, BEL, CR, backspace, ...), DEL, the C1 controls
  (U+0080-U+009F: a terminal may take U+009B as CSI), format characters (category Cf: zero-width
  spaces and joiners, bidirectional overrides and isolates, U+FEFF, soft hyphens, tag
  characters), the line and paragraph separators, private-use, surrogate and unassigned code
  points. Each is written as Python writes it: `\\x1b`, `\\u202e`, `\\U000e0001`.
- Never parsed: rich markup (`[/x]`, `[link=…]`, `[conceal]`) and emoji codes (`:fire:`). A
  NeutralConsole has both off, whatever a caller asks, and `plain`/`PlainTable` turn every value
  into a rich Text before it reaches a table, so a cell is text even on another Console.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from typing import Any, Iterable

from rich.console import Console, ConsoleOptions, RenderableType
from rich.segment import Segment
from rich.style import Style
from rich.table import Table
from rich.text import Text

_SUSPECT = re.compile("[^\t\n -~]+")  # runs of anything but printable ASCII, tab and newline


@functools.lru_cache(maxsize=4096)
def _shown(char: str) -> str:
    if char.isprintable() or unicodedata.category(char) == "Zs":
        return char
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _run(match: re.Match[str]) -> str:
    run = match.group()
    return run if run.isprintable() else "".join(map(_shown, run))


def neutral(text: str) -> str:
    """`text` with every non-printing character written as `\\x1b`, `\\x9b`, `\\u200b`; the rest as is."""
    return text if text.isprintable() else _SUSPECT.sub(_run, text)


def one_line(text: str) -> str:
    """`neutral(text)` with newline and tab escaped too: a label, a title."""
    return neutral(text).replace("\n", "\\n").replace("\t", "\\t")


def plain(value: object, style: str | Style = "") -> Text:
    """Any value as a rich Text of its neutral characters: never markup, never an emoji code.
    A Text passes as it is (it was built from plain text already)."""
    if isinstance(value, Text):
        return value
    return Text(neutral(str(value)), style=style)


class PlainTable(Table):
    """A rich Table whose title, headers and cells are plain text (`plain`): what a host sent,
    in any cell, is shown as written. deploy/render builds every table with it."""

    def __init__(self, *headers: str, title: object = None, **kwargs: Any) -> None:
        kwargs.setdefault("title_justify", "left")
        super().__init__(title=None if title is None else plain(title), **kwargs)
        for header in headers:
            self.add_column(header, overflow="fold")

    def add_column(self, header: object = "", *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        super().add_column(plain(header), *args, **kwargs)

    def add_row(self, *cells: object, **kwargs: Any) -> None:  # type: ignore[override]
        super().add_row(*(None if cell is None else plain(cell) for cell in cells), **kwargs)


class NeutralConsole(Console):
    """A rich Console whose every printed character of text is neutral: whatever the renderable
    (a line, a table cell, a title), its text is escaped after layout. rich's own styles and
    cursor controls are separate control segments and pass unchanged. Markup and emoji codes
    are never parsed. The Renderer escapes host text before it builds a Text too: rich drops
    BEL, CR and a few others silently, and a table lays out columns before this last net."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **{**kwargs, "markup": False, "emoji": False})

    def render_str(self, text: str, **kwargs: Any) -> Text:  # type: ignore[override]
        """Plain strings (table cells, titles) are escaped before layout, so columns fit them."""
        return super().render_str(neutral(text), **{**kwargs, "markup": False, "emoji": False})

    def render(self, renderable: RenderableType, options: ConsoleOptions | None = None) -> Iterable[Segment]:
        for segment in super().render(renderable, options):
            if segment.control is None and _SUSPECT.search(segment.text):
                yield Segment(neutral(segment.text), segment.style)
            else:
                yield segment
