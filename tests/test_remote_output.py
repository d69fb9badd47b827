"""Remote output is data, not code (issue 12, hole 7), the pure parts by exact equality: text
from hosts is printed neutral, an agent's status answer of any shape is a state, and a metrics
file with a cut or crafted line still yields the comm record. The real runs are in
tests/test_hostile_output.py."""

from __future__ import annotations

import io
import json

import pytest

from meshrun.deploy.edges.comm import last_comm_record
from meshrun.deploy.render.console import Renderer
from meshrun.deploy.render.neutral import NeutralConsole, neutral
from meshrun.deploy.run.hoststate import HostState, parse_status
from rich.table import Table
from rich.text import Text

# OSC title, clear screen, CSI colour, DCS, 8-bit CSI, BEL, CR, backspace, DEL, bidi override.
NASTY = "a\x1b]0;pwned\x07b\x1b[2Jc\x1b[31md\x1bP1$r\x1b\\e\x9b31mf\rg\x08h\x7fi\u202ejk"
SHOWN = ("a\\x1b]0;pwned\\x07b\\x1b[2Jc\\x1b[31md\\x1bP1$r\\x1b\\e\\x9b31mf\\x0dg\\x08h\\x7fi\\u202ejk")


def test_neutral_escapes_every_control_and_keeps_text() -> None:
    assert neutral(NASTY) == SHOWN
    assert neutral("épreuve ✓ tab\there") == "épreuve ✓ tab\there"


def _unsafe(text: str) -> list[str]:
    return [c for c in text if (ord(c) < 0x20 and c not in "\n\t") or 0x7f <= ord(c) <= 0x9f]


def test_renderer_prints_host_lines_messages_and_cells_neutral() -> None:
    out, err = io.StringIO(), io.StringIO()
    renderer = Renderer(NeutralConsole(file=out, width=200), NeutralConsole(file=err, width=200))
    renderer.log_line("h1", f"[h1:0] {NASTY}")
    renderer.error(f"host said {NASTY}")
    renderer.run_states([HostState("r", "h1", "unknown", detail=NASTY)])
    table = Table()
    table.add_column("x")
    table.add_row(NASTY)
    renderer.console.print(table)
    assert _unsafe(out.getvalue() + err.getvalue()) == []
    assert out.getvalue().splitlines()[0] == f"[h1:0] {SHOWN}"
    assert err.getvalue() == f"error: host said {SHOWN}\n"


def test_neutral_console_keeps_rich_styles_on_a_terminal() -> None:
    """meshrun's own styles pass; a string's markup is text (tests/test_render_hostile.py)."""
    out = io.StringIO()
    NeutralConsole(file=out, force_terminal=True, color_system="standard", width=80, highlight=False).print(
        Text("x", style="red"), "[red]y[/red]\x1b[2J")
    assert out.getvalue() == "\x1b[31mx\x1b[0m [red]y[/red]\\x1b[2J\n"


REPORT = {"run_id": "r1", "host": "h1", "state": "running", "started": 100.0, "ended": None, "rc": None,
          "reason": None, "progress": {"epoch": 2, "global_step": 40}, "detached": True, "generation": 1,
          "now": 130.0}


@pytest.mark.parametrize("answer,detail", [
    ("garbage\n", "the agent's answer is not JSON: 'garbage'"),
    ('[{"run_id": "r1", "state": "runn', "the agent's answer is not JSON: '[{\"run_id\": \"r1\", \"state\": \"runn'"),
    ('{"run_id": "r1"}', "the agent's answer is not a list of reports"),
    ("[1, null, []]", "no report for this run"),
    ("[]", "the agent does not know this run"),
    ('[{"run_id": "r1", "state": "\\u001b[2J"}]', "the agent reports an unknown state: '\\x1b[2J'"),
    ('[{"run_id": "r1"}]', "the agent reports an unknown state: 'None'"),
    ("[" * 100000, "the agent's answer is not JSON: '" + "[" * 60 + "'"),
])
def test_garbage_status_answers_are_unknown_with_one_line(answer: str, detail: str) -> None:
    assert parse_status("r1", "h1", answer) == HostState("r1", "h1", "unknown", detail=detail)


def test_sound_status_answer_and_wrong_types_in_it() -> None:
    assert parse_status("r1", "h1", json.dumps([{**REPORT, "run_id": "other"}, REPORT])) == HostState(
        "r1", "h1", "running", None, 2, 40, 30.0, None, 1)
    odd = {**REPORT, "rc": "0", "started": "yesterday", "progress": [1], "reason": ["x"], "generation": "1"}
    assert parse_status("r1", "h1", json.dumps([odd])) == HostState("r1", "h1", "running")


def test_comm_record_survives_cut_and_crafted_lines() -> None:
    good = {"kind": "comm", "comm_s": 0.012, "hook": "allreduce"}
    lines = [json.dumps({"kind": "epoch", "epoch": 0}), json.dumps(good), '{"kind": "comm", "comm_s": "x"}',
             '{"kind": "comm"}', "[1]", '{"kind": "comm", "comm_s": NaN}', '{"kind": "comm", "comm_s": -1}',
             '{"kind": "comm", "comm_s": 0.0', '{"kind": "ep']
    assert last_comm_record("\n".join(lines)) == good
    assert last_comm_record('{"kind": "comm", "comm_s": 0.5') is None
