"""What a host sends is shown, never obeyed: control characters in text from hosts (log lines,
error details, status fields) are written escaped, so a host cannot retitle, clear or rewrite
the controller's terminal (docs/security.md, "What hosts print").

Escaped: C0 controls except newline and tab (ESC, BEL, CR, backspace, ...), DEL, C1 controls
(U+0080-U+009F: a terminal may take U+009B as CSI), and the Unicode line/paragraph separators and
bidirectional overrides that reorder what is shown.
"""

from __future__ import annotations

import re
from typing import Iterable

from rich.console import Console, ConsoleOptions, RenderableType
from rich.segment import Segment
from rich.text import Text

_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def neutral(text: str) -> str:
    """`text` with every unsafe character written as `\\x1b`, `\\x9b`, `\\u202e`; the rest as is."""
    return _UNSAFE.sub(_escape, text)


class NeutralConsole(Console):
    """A rich Console whose every printed character of text is neutral: whatever the renderable
    (a line, a table cell, a title), its text is escaped after layout. rich's own styles and
    cursor controls are separate control segments and pass unchanged. The Renderer escapes
    host text before it builds a Text too: rich drops BEL, CR and a few others silently, and
    a table lays out columns before this last net."""

    def render_str(self, text: str, **kwargs: object) -> Text:  # type: ignore[override]
        """Plain strings (table cells, titles) are escaped before layout, so columns fit them."""
        return super().render_str(neutral(text), **kwargs)  # type: ignore[arg-type]

    def render(self, renderable: RenderableType, options: ConsoleOptions | None = None) -> Iterable[Segment]:
        for segment in super().render(renderable, options):
            if segment.control is None and _UNSAFE.search(segment.text):
                yield Segment(neutral(segment.text), segment.style)
            else:
                yield segment
