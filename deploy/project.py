"""The project meshrun works on: whose code ships to the hosts and whose `runs/` records runs.
Today that is this checkout (the directory holding `fabfile.py`)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
