"""Host text is text (issue 20, item 3): every renderer shows what a host sent as written, escaped,
never as rich markup, an emoji code, a terminal control, a format character or mathtext.

Each payload goes through the real parsers where there is one (an agent's status answer, the
facts probe, `zerotier-cli` output, result.json, metrics files) and through every renderer of
deploy/render: the status table, check-network's tables and lines, the end of `fab train` (its
table, summary, membership lines and failure tail), fetch's table, `fab trust`'s table, transfer
progress bars, log lines, messages, `fab report`'s table and its picture. The output is read as a
terminal gets it (every escape sequence) and as a reader sees it (rich's export_text); both a
NeutralConsole and a stock rich Console (markup on) are used, so a cell is text even there.
Then `meshrun report` end to end on a fetched run whose metrics a host crafted.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from xml.sax.saxutils import escape as xml_escape

import pytest
from rich.console import Console

from meshrun.deploy.inventory.shown import shown as shown_text
from meshrun.deploy.check import zerotier
from meshrun.deploy.check.answers import facts_of
from meshrun.deploy.check.findings import Finding, Level
from meshrun.deploy.check.verdicts import (AllReduceResult, CheckReport, Gpu, HostFacts, LinkResult, PortState,
                                           ProbeStatus, RendezvousFacts)
from meshrun.deploy.check.wireguard import WireGuardState
from meshrun.deploy.edges.fetch import FetchReport
from meshrun.deploy.render.check import print_check, print_host_keys
from meshrun.deploy.render.console import HostProgress, Renderer
from meshrun.deploy.render.neutral import NeutralConsole, neutral
from meshrun.deploy.render.png import write_png
from meshrun.deploy.run.hoststate import parse_status
from meshrun.deploy.run.membership import Change, MembershipEvent
from meshrun.deploy.run.outcome import HostOutcome, JobOutcome, JobStatus
from meshrun.deploy.run.report import load_report
from meshrun.deploy.run.summary import RunSummary, trainer_result

# (payload, what a reader sees): markup, hyperlinks, hidden and blinking text, emoji codes,
# terminal controls (clear, OSC 8 hyperlink), Unicode format characters (bidi override, zero
# width space, BOM, a tag character), a lone surrogate, and mathtext.
PAYLOADS = [
    ("[/x]", "[/x]"),
    ("[link=http://evil]x[/link]", "[link=http://evil]x[/link]"),
    ("[conceal]secret[/conceal]", "[conceal]secret[/conceal]"),
    ("[blink]b[/blink][bold red on white]", "[blink]b[/blink][bold red on white]"),
    (":fire: :warning:", ":fire: :warning:"),
    ("a\x1b[2Jb", "a\\x1b[2Jb"),
    ("\x1b]8;;http://e\x07e\x1b]8;;\x07", "\\x1b]8;;http://e\\x07e\\x1b]8;;\\x07"),
    ("\u202eabc\u2066d", "\\u202eabc\\u2066d"),
    ("a\u200bb\u200dc\u00add", "a\\u200bb\\u200dc\\xadd"),
    ("\ufeffbom\U000e0001", "\\ufeffbom\\U000e0001"),
    ("s\udc80\ue000", "s\\udc80\\ue000"),
    ("$x^2$ $\\frac$", "$x^2$ $\\frac$"),
]
IDS = ["close-tag", "link", "conceal", "blink", "emoji", "clear", "osc8", "bidi", "zero-width", "bom-tag",
       "surrogate-private", "mathtext"]
SGR = re.compile(r"\x1b\[([0-9;]*)m")
BANNED_SGR = {"5", "6", "8"}  # blink, rapid blink, conceal (standard colours have no 5;N forms)


def consoles(kind: str) -> tuple[Console, Console, io.StringIO, io.StringIO]:
    out, err = io.StringIO(), io.StringIO()
    make = NeutralConsole if kind == "neutral" else Console
    options = dict(width=500, force_terminal=True, color_system="standard", record=True, highlight=False)
    return make(file=out, **options), make(file=err, stderr=True, **options), out, err


def cells(text: str) -> list[str]:
    """Every table cell of `text` (rich's box rows split on their bars), stripped."""
    return [c.strip() for line in text.splitlines() for c in re.split("[│┃]", line)[1:-1]]


def assert_terminal_safe(raw: str) -> None:
    """What a terminal receives: rich's own colours and bold, and nothing else it could obey."""
    assert "\x1b]" not in raw  # no OSC: no hyperlink, no title
    for params in SGR.findall(raw):
        assert not BANNED_SGR & set(params.split(";")), params
    rest = SGR.sub("", raw)
    assert [c for c in rest if not (c.isprintable() or c == "\n")] == []


def check_report(payload: str) -> CheckReport:
    fingerprint, _, _ = facts_of("h1", {"python": payload, "torch": payload, "cuda": payload, "nccl": payload})
    listing = json.dumps([{"nwid": payload, "name": payload, "status": payload, "portDeviceName": payload,
                           "mtu": 2800, "assignedAddresses": []}])
    info = json.dumps({"address": payload, "online": True, "version": payload})
    peers = json.dumps([{"address": payload, "role": payload, "paths": []}])
    h1 = HostFacts("h1", "10.0.0.1", "zerotier", True, ssh_ms=1.0, fingerprint=fingerprint,
                   gpus=(Gpu(0, payload, 1, 2),), workdir=payload, disk_free_gib=1.0, interface_error=payload,
                   zerotier=zerotier.parse_state(info, listing, peers))
    h2 = HostFacts("h2", "10.0.0.2", "wireguard", False, error=payload, wireguard=WireGuardState(error=payload))
    h3 = HostFacts("h3", "10.0.0.3", "wireguard", True, ssh_ms=1.0, wireguard=WireGuardState(error=payload),
                   gpu_note=payload, fingerprint=fingerprint)
    link = LinkResult("h1", "h3", "10.0.0.3", 1234, PortState.ERROR, detail=payload)
    return CheckReport(Level.FAIL, (h1, h2, h3), RendezvousFacts("h1", "10.0.0.1", 29500, payload), (link,),
                       AllReduceResult(ProbeStatus.FAILED, payload), (Finding(Level.FAIL, "h1", payload),), 1.0)


def job(payload: str) -> tuple[RunSummary, JobOutcome]:
    result = trainer_result(json.dumps({"metrics": {payload: 0.5}, "epochs_completed": 1}))
    summary = RunSummary("r1", "stopped", ["h1"], 1, 0, 1, result["metrics"], 1.0, 0.0, 1.0)
    host = HostOutcome("h1", None, Path("runs/r1/logs") / payload, (payload,), stop_error=payload,
                       worker_tail=(payload,))
    return summary, JobOutcome("r1", JobStatus.STOPPED, 0.0, 1.0, (host,), failed_host="h1")


def report_of(tmp_path: Path, payload: str):
    step = {"kind": "step", "rank": 0, "host": payload, "samples_per_s": 1000.0, "step_s": 0.02, "data_s": 0.001,
            "fwd_bwd_s": 0.01, "optim_s": 0.001, "peak_mem_bytes": 2**20}
    # A shared run dir (`python -m meshrun.train` beside the controller): the records name their host.
    # Fetched under hosts/<name>/, the folder's name is shown (tests/test_hostile_replies.py).
    (tmp_path / "metrics.rank0.jsonl").write_text(json.dumps(step) + "\n")
    return load_report(tmp_path)


@pytest.mark.parametrize("kind", ["neutral", "stock rich"])
@pytest.mark.parametrize(("payload", "seen"), PAYLOADS, ids=IDS)
def test_every_renderer_shows_host_text_as_written(tmp_path: Path, kind: str, payload: str, seen: str) -> None:
    console, err_console, out, err = consoles(kind)
    renderer = Renderer(console, err_console)
    renderer.run_states([parse_status("r1", "h1", json.dumps([{"run_id": "r1", "state": "stopped",
                                                               "reason": payload}]))])
    print_check(renderer, check_report(payload))
    summary, outcome = job(payload)
    renderer.membership(MembershipEvent(0.0, Change.LOST, "h1", 1, detail=payload))
    renderer.failure_tail(outcome, payload)
    renderer.job_summary(summary, outcome, "runs/r1/summary.json")
    renderer.fetch_reports("r1", "runs/r1", [FetchReport("h1", Path("runs/r1/hosts") / payload,
                                                         conflicts=[payload], corrupt=[payload])])
    print_host_keys(renderer, [("h1", payload, "SHA256:abc", "new")], "known_hosts")
    renderer.log_line("h1", f"[h1:0] {payload}")
    renderer.info(payload)
    renderer.warn(payload)
    renderer.error(payload)
    renderer.run_report("r1", report_of(tmp_path, payload), "runs/r1/report.png")

    shown, shown_err = console.export_text(styles=False), err_console.export_text(styles=False)
    in_path = seen.replace("//", "/")  # as a path component (pathlib folds `//`)
    assert_terminal_safe(out.getvalue())
    assert_terminal_safe(err.getvalue())
    table_cells = cells(shown)
    # status: detail; check: python and torch (h1, h3), gpu note (h3), ssh error (h2), interface (h1);
    # train: left running; fetch: not overwritten, corrupt; trust: address; report: host
    assert table_cells.count(seen) == 13
    assert {
        f"{seen} / {seen}",  # check: cuda / nccl
        f"* 0: {seen}, 1/2 MiB used",  # check: a GPU's name
        f"1.0 GiB in {seen}",  # check: the workdir
        f"zerotier {seen} ONLINE; {seen} {seen} on {seen} (mtu 2800); peers: {seen} (root) RELAY",
        f"runs/r1/logs/{in_path}",  # train: the log's path
        f"runs/r1/hosts/{in_path}",  # fetch: where it landed
    } - set(table_cells) == set()
    lines = shown.splitlines()
    assert f"FAIL h1: {seen}" in lines
    assert f"end to end: gloo all-reduce failed: {seen}" in lines
    assert f"meshrun: h1 lost ({seen}); 1 process(es) remain in the job" in lines
    assert f"[h1:0] {seen}" in lines and seen in lines
    assert any(line.startswith(f"stopped: 1 epoch(s), world size 1, 1.0 s; metrics: {seen} 0.5000;")
               for line in lines)
    assert f"not overwritten: runs/r1/hosts/{in_path}/{seen} differs from h1's copy; kept yours (--force replaces it)" \
        in lines
    err_lines = shown_err.splitlines()
    assert err_lines.count(seen) == 2  # the failed host's last worker line and last line
    assert f"--- full log: runs/r1/logs/{in_path} (on the host: {seen}) ---" in err_lines
    assert f"warning: {seen}" in err_lines and f"error: {seen}" in err_lines


@pytest.mark.parametrize(("payload", "seen"), PAYLOADS, ids=IDS)
def test_progress_bars_show_host_names_as_written(payload: str, seen: str) -> None:
    """A transfer's bar per host (sync, fetch): rich's Live display moves the cursor (its own
    controls, allowed here), and the host's text is plain."""
    console, err_console, out, _ = consoles("neutral")
    with HostProgress(Renderer(console, err_console), "fetch", [payload]) as bars:
        bars.update(payload, 100)
    assert re.search(rf"fetch {re.escape(seen)} ━+ 100%$", console.export_text(styles=False), re.M)
    assert_terminal_safe(re.sub(r"\x1b\[\?25[lh]|\x1b\[2K|\x1b\[1A|\r", "", out.getvalue()))


@pytest.mark.parametrize(("payload", "seen"), PAYLOADS, ids=IDS)
def test_report_picture_labels_are_plain_text(tmp_path: Path, payload: str, seen: str) -> None:
    """The PNG's labels (drawn as SVG text here, the same figure) hold the host's text as written,
    one line: no mathtext (`$x^2$` is not a superscript, `$\\frac$` is no parse error)."""
    import matplotlib

    report = report_of(tmp_path, payload)
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        svg = write_png(report, tmp_path / "report.svg").read_text()
    texts = [t for t in re.findall(r"<text[^>]*>([^<]*)</text>", svg)]
    assert f"{xml_escape(seen)}/r0" in texts, texts
    assert any(t.startswith(xml_escape(tmp_path.name)) for t in texts)


def test_png_is_still_a_png(tmp_path: Path) -> None:
    from PIL import Image

    path = write_png(report_of(tmp_path, "$\\frac$ \u202e"), tmp_path / "out" / "report.png")
    with Image.open(path) as image:
        assert image.format == "PNG" and image.size == (1500, 420)


def test_neutral_escapes_every_non_printing_category_and_keeps_the_rest() -> None:
    import unicodedata

    kept = "épreuve ✓ 漢字 tab\there\nnbsp\u00a0ideographic\u3000é (e + combining acute: e\u0301)"
    assert neutral(kept) == kept
    for code in range(0x110000):
        char = chr(code)
        category = unicodedata.category(char)
        if category in ("Cc", "Cf", "Co", "Cs", "Cn", "Zl", "Zp") and char not in "\n\t":
            assert neutral(char) == (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000
                                     else f"\\U{code:08x}"), hex(code)
        elif category != "Zs":
            assert neutral(char) == char, hex(code)


MESHRUN = str(Path(sys.executable).parent / "meshrun")
HOST_SAID = "[/x][link=http://evil]x[/link]:fire:\u200b\u202e\x1b[2J$\\frac$"
HOST_SEEN = "[/x][link=http://evil]x[/link]:fire:\\u200b\\u202e\\x1b[2J$\\frac$"


def test_meshrun_report_on_a_run_whose_host_crafted_its_metrics(tmp_path: Path) -> None:
    """The real command on a fetched run (`runs/<id>/hosts/<host>/`): one host's step records carry
    markup, controls, format characters and mathtext in their `host`, between lines of the wrong
    shape; the other host's rank file is a FIFO. The report is made from the sound lines, says what
    it skipped, and exits 0; no internal error."""
    project = tmp_path / "proj"
    run = project / "runs" / "r-1"
    (run / "hosts" / "h1").mkdir(parents=True)
    (run / "hosts" / "h2").mkdir()
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    (run / "launch.json").write_text(json.dumps({"run_id": "r-1", "inventory": "/x", "hosts": ["h1", "h2"],
                                                 "started": 1.0, "detached": False, "rdzv_endpoint": "h1:29500"}))
    epoch = {"kind": "epoch", "epoch": 1, "train_loss": 0.5, "test_loss": float("nan"), "test_acc": 0.9,
             "test_acc5": 1.0, "world_size": 2, "global_step": 10, "time": 1.0}
    step = {"kind": "step", "rank": 0, "host": HOST_SAID, "samples_per_s": 1000.0, "step_s": 0.02, "data_s": 0.001,
            "fwd_bwd_s": 0.01, "optim_s": 0.001, "peak_mem_bytes": 2**20}
    (run / "hosts" / "h1" / "metrics.jsonl").write_text(
        "\n".join([json.dumps(epoch), "[1]", "[" * 100_000, json.dumps({**epoch, "epoch": "a"})]) + "\n")
    (run / "hosts" / "h1" / "metrics.rank0.jsonl").write_bytes(
        "\n".join([json.dumps(step), json.dumps({**step, "step_s": True}), json.dumps({**step, "data_s": 10**400}),
                   "3"]).encode() + b"\n\xff\n")
    os.mkfifo(run / "hosts" / "h2" / "metrics.rank1.jsonl")
    env = {**os.environ, "COLUMNS": "200"}
    shown = subprocess.run([MESHRUN, "report", "--run", "r-1"], cwd=project, capture_output=True, text=True,
                           timeout=120, env=env)
    data = subprocess.run([MESHRUN, "report", "--run", "r-1", "--json"], cwd=project, capture_output=True, text=True,
                          timeout=120, env=env)
    hosts = run / "hosts"
    notes = [f"{hosts}/h1/metrics.jsonl: 3 of 4 line(s) skipped, not a metrics record the report can use "
             "(the first, line 2: [1] is not a JSON object)",
             f"{hosts}/h1/metrics.rank0.jsonl: 4 of 5 line(s) skipped, not a metrics record the report can use "
             "(the first, line 2: step_s is True; expected a number >= 0)",
             f"{hosts}/h1/metrics.rank0.jsonl: its records name host {shown_text(HOST_SAID)}; shown under the host it "
             "was fetched from",
             f"{hosts}/h2/metrics.rank1.jsonl: not read: not a regular file"]
    assert (shown.returncode, shown.stderr) == (0, "".join(f"warning: {note}\n" for note in notes))
    # The row is the folder's host: a rank's claimed `host` cannot take another host's row (shown in a note).
    assert "│ h1   │    0 │      1000 │    20.0 │     1.0 │       10.0 │      1.0 │       - │        1 │" \
        in shown.stdout.splitlines(), shown.stdout
    assert (f"total 1000 samples/s; 1 epoch(s); final test acc 0.9000, best 0.9000; resumes 0; "
            f"plot: {run}/report.png") in shown.stdout.splitlines()
    assert (data.returncode, data.stderr) == (0, shown.stderr)
    report = json.loads(data.stdout)
    assert report["skipped"] == notes
    assert [(r["host"], r["rank"], r["steps"]) for r in report["ranks"]] == [("h1", 0, 1)]
    assert [e["epoch"] for e in report["epochs"]] == [1]


def test_numbers_no_float_holds_are_refused_not_raised() -> None:
    """JSON gives 10**400 as an int, and float() or math.isfinite raise OverflowError on it: an agent's
    status, a result.json and any shape-checked answer treat it as a wrong type."""
    from meshrun.deploy.errors import MeshrunError
    from meshrun.deploy.run.answers import Answer
    from meshrun.deploy.run.hoststate import HostState

    answer = json.dumps([{"run_id": "r1", "state": "running", "started": 10**400, "now": 5.0, "rc": 10**400,
                          "progress": {"epoch": 10**300, "global_step": 7}}])
    assert parse_status("r1", "h1", answer) == HostState("r1", "h1", "running", step=7)
    assert trainer_result(json.dumps({"metrics": {"loss": 10**400, "acc": 0.5}, "best_test_acc": 10**400})) == {
        "metrics": {"acc": 0.5}}
    with pytest.raises(MeshrunError) as err:
        Answer("h1", "the facts probe").number(10**400, "disk")
    assert str(err.value) == (f"host 'h1': the facts probe gave an unexpected answer: disk is {str(10**400)[:40]}…; "
                              "expected a number >= 0 or null")


def test_render_builds_tables_only_as_plain_tables() -> None:
    """So a future cell cannot forget: deploy/render makes no rich Table but PlainTable (its cells
    and title are plain Text), no Panel (its title would be markup), no Text.from_markup or
    render_markup, and no TextColumn that parses markup."""
    import ast

    found = []
    for path in sorted((Path(__file__).resolve().parents[1] / "deploy" / "render").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            plain_column = any(k.arg == "markup" and isinstance(k.value, ast.Constant) and k.value.value is False
                               for k in node.keywords)
            if name in ("Table", "Panel", "from_markup", "render_markup") or (name == "TextColumn" and not plain_column):
                found.append(f"{path.name}:{node.lineno} {name}")
    assert found == []
