"""How user input appears inside an error message: escaped and clipped, so the message stays one short line.

An inventory or a flag can hold anything: a newline, a terminal escape, a megabyte of text, a number of
4000 digits. A message that quoted it raw could span lines, rewrite the terminal or fill the disk.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

CLIP = 40  # characters of one quoted value: enough to recognise it, short enough for one line
LISTED = 8  # names shown of a longer list, e.g. "known hosts: ..."


def shown(value: object, limit: int = CLIP) -> str:
    """`value` as repr writes it (control characters escaped; text in quotes), at most about `limit` characters."""
    if isinstance(value, str):
        return repr(value[:limit]) + ("…" if len(value) > limit else "")
    if isinstance(value, int) and value.bit_length() > 14_000:
        return "a number of thousands of digits"  # str() refuses ints past 4300 digits
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


def clip(text: str, limit: int = CLIP) -> str:
    """Checked, printable text (a host name, an address) cut to `limit` characters."""
    return text if len(text) <= limit else text[:limit] + "…"


def listing(names: Iterable[str], limit: int = LISTED) -> str:
    """`a, b, c` for a short list of checked names; the first `limit` and how many more for a long one."""
    items = list(names)
    head = ", ".join(clip(n) for n in items[:limit])
    return head + (f", … ({len(items) - limit} more)" if len(items) > limit else "")


def shown_path(path: Path | str) -> str:
    """A file path as written, unless it holds a control character: then escaped like `shown`."""
    text = str(path)
    return text if text.isprintable() else repr(text)[1:-1]
