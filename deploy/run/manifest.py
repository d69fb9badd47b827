"""What the controller accepts from a host's `checkpoints/MANIFEST.sha256`: pure rules.

A manifest comes from a host, so it is input, not instructions. A line is accepted only in the
exact form the trainer writes, `<64 lowercase hex>  <name>`, and only for the trainer's own
names (`ckpt-step<9 digits>.pt`, `best.pt`). Those names hold no `/`, so a name joined to the
checkpoints directory stays inside it. Every other line is refused and reported, never acted
on: no file is read, verified or deleted because a refused line named it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from meshrun.layout import is_checkpoint_name

# A trainer's manifest lists keep_last + 1 files at ~90 bytes a line; this allows thousands, and
# keeps a host from making the controller read gigabytes.
MANIFEST_MAX_BYTES = 1 << 20
# How much of a refused line a report shows, and how many refused lines one host may report.
SHOWN_CHARS = 120  # a sha256, two spaces and a 54-character name
REPORTED_LINES = 20
_LINE = re.compile(rb"([0-9a-f]{64})  (.*)", re.DOTALL)


@dataclass(frozen=True)
class ManifestEntry:
    name: str
    sha256: str


@dataclass(frozen=True)
class RefusedLine:
    number: int  # 1-based, as an editor shows it
    text: str  # printable: escapes for anything else, cut to SHOWN_CHARS
    why: str


@dataclass(frozen=True)
class Manifest:
    entries: tuple[ManifestEntry, ...]
    refused: tuple[RefusedLine, ...]
    too_big: bool = False  # over MANIFEST_MAX_BYTES: nothing in it is used

    def digests(self) -> dict[str, str]:
        return {e.name: e.sha256 for e in self.entries}


def shown(text: str, limit: int = SHOWN_CHARS) -> str:
    """`text` safe for a terminal: printable text as is, anything else (escape sequences,
    newlines, NUL, bidi controls) as Python escapes; long text cut, with `...`."""
    cut = text[:limit] + ("..." if len(text) > limit else "")
    return cut if cut.isprintable() else ascii(cut)[1:-1]


def parse_manifest(data: bytes) -> Manifest:
    """The accepted entries and the refused lines of a manifest's bytes. Lines end at `\\n` only;
    a final empty line (the trailing newline) is not a line."""
    if len(data) > MANIFEST_MAX_BYTES:
        return Manifest((), (), too_big=True)
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    entries: list[ManifestEntry] = []
    refused: list[RefusedLine] = []
    seen: set[str] = set()  # one set for the whole parse: rebuilt per line it was quadratic (minutes for 1 MiB)
    for number, line in enumerate(lines, start=1):
        why = _refusal(line, seen)
        if why:
            refused.append(RefusedLine(number, shown(line.decode("utf-8", "backslashreplace")), why))
        else:
            digest, name = line.split(b"  ", 1)
            entries.append(ManifestEntry(name.decode("ascii"), digest.decode("ascii")))
            seen.add(entries[-1].name)
    return Manifest(tuple(entries), tuple(refused))


def _refusal(line: bytes, seen: set[str]) -> str:
    """Why a line is refused, or "" when it is accepted."""
    found = _LINE.fullmatch(line)
    if not found:
        return "not a '<sha256>  <file name>' line"
    name = found.group(2).decode("utf-8", "replace")
    if not is_checkpoint_name(name):
        return "not a checkpoint name the trainer writes (ckpt-step<9 digits>.pt, best.pt)"
    if name in seen:
        return "lists a file a second time"
    return ""


def manifest_text(entries: dict[str, str]) -> str:
    """A manifest in the trainer's format, for the files the controller verified."""
    return "".join(f"{digest}  {name}\n" for name, digest in sorted(entries.items()))


def refusal_lines(host: str, manifest: Manifest, path: str) -> list[str]:
    """One report line per refused manifest line (at most REPORTED_LINES, then a count)."""
    if manifest.too_big:
        return [f"host '{host}': {path} is larger than {MANIFEST_MAX_BYTES} bytes; ignored, "
                "no checkpoint of this host is verified"]
    lines = [f"host '{host}': {path} line {r.number} ignored ({r.why}): {r.text}"
             for r in manifest.refused[:REPORTED_LINES]]
    more = len(manifest.refused) - REPORTED_LINES
    if more > 0:
        lines.append(f"host '{host}': {path}: {more} more lines ignored")
    return lines
