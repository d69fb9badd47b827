"""How user input appears inside an error message: escaped and clipped, so the message stays one short line.

An inventory or a flag can hold anything: a newline, a terminal escape, a megabyte of text, a number of
4000 digits. A message that quoted it raw could span lines, rewrite the terminal or fill the disk.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

CLIP = 40  # characters of one quoted value: enough to recognise it, short enough for one line
LISTED = 8  # names shown of a longer list, e.g. "known hosts: ..."
LISTED_WIDTH = 80  # characters of those names together: fewer are shown when they are long
MESSAGE_MAX = 300 - len("error: ")  # one error message: with the `error: ` it is printed after, 300 characters
PATH_MAX = 120  # characters of a file path in a message; a longer one loses its middle, never its file name
PATH_MIN = 40  # how short a path may become to leave room for the rest of a long message


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
    """`a, b, c` for a short list of checked names; the first `limit` (fewer if they pass LISTED_WIDTH
    characters) and how many more for a long one."""
    items = list(names)
    head: list[str] = []
    for name in items[:limit]:
        if head and len(", ".join(head + [clip(name)])) > LISTED_WIDTH:
            break  # long names: fewer of them, so the message stays one short line
        head.append(clip(name))
    more = len(items) - len(head)
    return ", ".join(head) + (f", … ({more} more)" if more else "")


def shown_path(path: Path | str, limit: int = PATH_MAX) -> str:
    """A file path as written, unless it holds a control character: then escaped like `shown`. Past `limit`
    characters its middle becomes `…`: the start and the end (the file name, as much of it as fits) stay,
    cut at a `/` where one is near, e.g. `/home/alice/…/lab/inventory/hosts.yaml`."""
    text = str(path)
    text = text if text.isprintable() else repr(text)[1:-1]
    if len(text) <= limit:
        return text
    head = text[:limit // 4]
    tail = text[len(text) - (limit - len(head) - 1):]
    if head.rfind("/") >= len(head) // 2:
        head = head[:head.rfind("/") + 1]
    if 0 <= tail.find("/") <= len(tail) // 2:
        tail = tail[tail.find("/"):]
    return head + "…" + tail


def one_line(message: str, limit: int = MESSAGE_MAX) -> str:
    """`message` on one line of at most `limit` characters: newlines escaped, the end cut to `…` if too long."""
    text = message.replace("\n", "\\n")
    return text if len(text) <= limit else text[:limit - 1] + "…"


def with_path(before: str, path: Path | str, after: str, limit: int = MESSAGE_MAX) -> str:
    """The message `before` + the path + `after`, at most `limit` characters. The path is shortened in its
    middle (`shown_path`), further when the rest of a long message needs the room (down to PATH_MIN);
    only then is the end of the message cut. So the file name and the `:line` after it stay in view."""
    room = limit - len(before) - len(after)
    return one_line(before + shown_path(path, max(PATH_MIN, min(PATH_MAX, room))) + after, limit)
