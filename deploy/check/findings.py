"""Verdict vocabulary shared by the pre-flight checks: a level and a one-line finding."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Iterable


class Level(str, Enum):
    """Worst wins: FAIL > WARN > PASS."""

    PASS = "PASS"
    WARN = "WARN"
    FAIL = "FAIL"

    @property
    def rank(self) -> int:
        return (Level.PASS, Level.WARN, Level.FAIL).index(self)


@dataclass(frozen=True)
class Finding:
    """What is wrong (or doubtful), where, and what to do: one line."""

    level: Level
    where: str  # a host name, "h1 -> h2", or "cluster"
    message: str


def worst(levels: Iterable[Level]) -> Level:
    return max(levels, key=lambda level: level.rank, default=Level.PASS)


def fail(where: str, message: str) -> Finding:
    return Finding(Level.FAIL, where, message)


def warn(where: str, message: str) -> Finding:
    return Finding(Level.WARN, where, message)
