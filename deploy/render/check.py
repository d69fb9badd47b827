"""Console output of `fab check-network` and `fab trust`: rich tables from their records.

Kept apart from deploy/render/console.py (the task output of training runs); together they are the only
modules that import rich. Everything here prints from the main thread.
"""

from __future__ import annotations

from rich.text import Text

from meshrun.deploy.check import wireguard
from meshrun.deploy.check.findings import Finding, Level, worst
from meshrun.deploy.check.verdicts import CheckReport, HostFacts, LinkResult, PortState, ProbeStatus, launch_gpus
from meshrun.deploy.render.console import Renderer, as_run
from meshrun.deploy.render.neutral import PlainTable, one_line, plain

LEVEL_STYLES = {Level.PASS: "green", Level.WARN: "yellow", Level.FAIL: "red bold"}


def print_check(renderer: Renderer, report: CheckReport) -> None:
    """A table per host, the link matrix, every finding, the end-to-end line, one summary line."""
    console = renderer.console
    for host in report.hosts:
        console.print(host_table(host, worst(f.level for f in report.findings if f.where == host.name)))
    if report.links:
        console.print(link_matrix(report))
    if report.places:
        console.print(place_table(report))
    for finding in report.findings:
        console.print(finding_text(finding))
    console.print(plain(allreduce_line(report)))
    console.print(Text(summary_line(report), style=LEVEL_STYLES[report.level]))


def host_table(h: HostFacts, level: Level) -> PlainTable:
    title = plain(f"{h.name} ({h.address}, {h.network}): ") + Text(level.value, style=LEVEL_STYLES[level])
    table = PlainTable(title=title, show_header=False)
    table.add_column("check", style="bold")
    table.add_column("found", overflow="fold")
    if not h.reachable:
        table.add_row("ssh", plain(as_run(h.error or "unreachable"), style="red"))
        return table
    fp = h.fingerprint
    ssh = "local host (no SSH)" if h.address == "local" else "reachable, host key verified"
    table.add_row("ssh", f"{ssh}, {h.ssh_ms:.0f} ms per command")
    table.add_row("python", (fp.python if fp else None) or plain(fp.error if fp else "-", style="red"))
    table.add_row("torch", (fp.torch if fp else None) or plain(f"missing ({fp.error if fp else '-'})", style="red"))
    table.add_row("cuda / nccl", f"{(fp.cuda if fp else None) or '-'} / {(fp.nccl if fp else None) or '-'}")
    table.add_row("gpus", gpu_cell(h))
    table.add_row("disk free", f"{h.disk_free_gib:.1f} GiB in {h.workdir}" if h.disk_free_gib is not None else "-")
    table.add_row("overlay", overlay_cell(h))
    interface = f"{h.interface}, mtu {h.mtu}" if h.interface else (h.interface_error or "- (single host)")
    table.add_row("interface", interface)
    return table


def gpu_cell(h: HostFacts) -> str:
    """Every GPU, a star on those the run will train on: none under a torch without CUDA."""
    if not h.gpus:
        return h.gpu_note or "CPU only"
    used = launch_gpus(h)
    cpu_torch = h.fingerprint is not None and h.fingerprint.torch is not None and h.fingerprint.cuda is None
    chosen = set() if used is None or cpu_torch else set(used)
    lines = [f"{'*' if g.index in chosen else ' '} {g.index}: {g.name}, {g.memory_used_mib}/"
             f"{g.memory_total_mib} MiB used" for g in h.gpus]
    if used is None and not cpu_torch:
        lines.append(f"  (no `gpus:`: the run takes the {h.processes} fastest, by CUDA's count)")
    return "\n".join(lines)


def overlay_cell(h: HostFacts) -> str:
    if h.zerotier is not None:
        zt = h.zerotier
        if zt.error is not None:
            return f"zerotier: {zt.error}"
        nets = "; ".join(f"{n.nwid} {n.status} on {n.device} (mtu {n.mtu})" for n in zt.networks) or "no network"
        # Every peer, the root included: on a private network one cluster host is the others' root
        # (role PLANET), and hiding it would hide that host.
        links = ", ".join(f"{p.node}{' (root)' if p.role != 'LEAF' else ''} {p.link.value}" for p in zt.peers) or "no peers"
        return f"zerotier {zt.node} {zt.state.value if zt.state else '?'}; {nets}; peers: {links}"
    if h.wireguard is not None:
        return "wireguard " + wireguard.summary(h.wireguard)
    return "none"


def link_cell(link: LinkResult | None) -> Text:
    if link is None:
        return Text("-", style="dim")
    if link.state is not PortState.OPEN:
        return Text(link.state.value, style="red bold")
    parts = [f"{link.connect_ms:.2f} ms" if link.connect_ms is not None else "open"]
    if link.df_ok is not None:
        parts.append(f"DF {link.df_size} " + ("ok" if link.df_ok else "LOST"))
    if link.mbit_s is not None:
        parts.append(f"{link.mbit_s:.0f} Mbit/s")
    return plain(", ".join(parts), style="yellow" if link.df_ok is False else "green")


def link_matrix(report: CheckReport) -> PlainTable:
    """Rows: from; columns: to (an ephemeral port on each host, all-to-all) and the rendezvous port."""
    names = [h.name for h in report.hosts]
    rdzv = report.rendezvous
    table = PlainTable(title="links: TCP connect time; DF = don't-fragment ping at the sender's MTU")
    table.add_column("from \\ to")
    for name in names:
        table.add_column(name, overflow="fold")
    if rdzv is not None:
        table.add_column(f"rdzv {rdzv.host}:{rdzv.port}", overflow="fold")
    cells = {(link.source, link.target, link.rendezvous): link for link in report.links}
    for source in names:
        row = [Text("") if source == target else link_cell(cells.get((source, target, False))) for target in names]
        if rdzv is not None:
            row.append(link_cell(cells.get((source, rdzv.host, True))))
        table.add_row(source, *row)
    return table


def place_table(report: CheckReport) -> PlainTable:
    """The matrix by the inventory's sites: inside each, between each two (deploy/check/sites.py)."""
    table = PlainTable(title="by site: the slowest pair's bandwidth, the farthest pair's RTT")
    for column in ("sites", "pairs", "bandwidth", "RTT"):
        table.add_column(column)
    for p in report.places:
        where = f"inside {p.a}" if p.a == p.b else f"{p.a} <-> {p.b}"
        mbit = "-" if p.mbit_s is None else f"{p.mbit_s:.0f} Mbit/s"
        rtt = "-" if p.rtt_ms is None else f"{p.rtt_ms:.2f} ms"
        table.add_row(plain(where), str(p.pairs), mbit, rtt)
    return table


def finding_text(finding: Finding) -> Text:
    """Its `fab TASK` hints as this command's user can run them, as every other line says them
    (deploy/render/hints.py): `meshrun setup --inventory lab.yaml --hosts gpu2`, not `fab setup --hosts gpu2`.
    One line whatever the message holds: a host's text in it (an interface error, a tool's stderr)
    cannot start a line that reads as a verdict of ours."""
    text = f"{finding.where}: {as_run(finding.message)}"
    return Text(f"{finding.level.value} ", style=LEVEL_STYLES[finding.level]) + plain(one_line(text))


def allreduce_line(report: CheckReport) -> str:
    result = report.allreduce
    if result.status is ProbeStatus.OK:
        return f"end to end: gloo all-reduce under torchrun, {result.detail}: ok in {result.seconds:.1f} s"
    return f"end to end: gloo all-reduce {result.status.value}: {result.detail}"


def summary_line(report: CheckReport) -> str:
    fails = sum(1 for f in report.findings if f.level is Level.FAIL)
    warns = sum(1 for f in report.findings if f.level is Level.WARN)
    pairs = sum(1 for link in report.links if not link.rendezvous)
    return (f"check-network {report.level.value}: {len(report.hosts)} host(s), {pairs} link(s) probed "
            f"({report.links_rule}), "
            f"{fails} failure(s), {warns} warning(s), {report.duration_s:.1f} s")


def print_host_keys(renderer: Renderer, rows: list[tuple[str, str, str, str]], path: str) -> None:
    """`fab trust`: host, known_hosts name, fingerprint, status (new / already trusted / CHANGED ...)."""
    table = PlainTable("host", "address", "fingerprint", "status", title=f"SSH host keys (known_hosts: {path})")
    for host, name, fingerprint, status in rows:
        style = "red bold" if status.startswith("CHANGED") else ("green" if status == "already trusted" else "yellow")
        table.add_row(host, name, fingerprint, plain(status, style=style))
    renderer.console.print(table)
