"""Host-side supervisor of one run on one host. Standard library only: it runs with the host's
python before anything else there is known to work.

`run`    starts the command (torchrun) in its own session, records `agent.json` (the pidfile),
         tees output to `train.log` and to the controller, and watches the controller: every
         line on stdin is a heartbeat; EOF or silence past `--heartbeat-timeout` means the
         controller is gone (killed, laptop closed, link cut), so the run is stopped. SIGTERM
         stops it too, and SIGHUP and SIGINT unless it was started ignoring them (`nohup`), with
         every process below the agent, tagged or not (it is the run's subreaper:
         deploy/host/procs.py). A worker group restarted (by torch, or on the controller's
         `restart`) takes the orphans it left along (deploy/host/stopping.py). Exits with the
         command's status, or AGENT_BUSY_EXIT, having started nothing, while another agent of
         the run holds the host's lock.
`stop`   stops a run found through its pidfile and run id: TERM the process group, a grace
         period, KILL; then every process tagged with the run's MESHRUN_RUN_ID and
         MESHRUN_HOST (torchrun starts each worker in a session of its own, out of reach of
         the group). Never by name. Prints JSON (deploy/host/stopping.py).
`status` prints JSON: state, exit status, progress, uptime.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from meshrun.layout import (AGENT_BUSY_EXIT, AGENT_LOCK, AGENT_PEER_GONE_LINE, AGENT_RESTART_LINE, AGENT_PIDFILE, EVENTS,
                           CONTROLLER_SILENT, EXIT_BARRIER_MARK, EXIT_RECORD, PROGRESS, RESULT, RUNS_DIR, STATE_REFUSED_EXIT,
                           TRAIN_LOG, host_dir, run_dir)
from meshrun.deploy.host.agentargs import parse, ranks_run_dir, read_env_block, run_env, runs_trainer
from meshrun.deploy.host.agentstart import (CANNOT_WRITE_EXIT, busy_line, cannot_write_line, quiet_stderr,
                                            read_json, start_detached)
from meshrun.deploy.host.exitbarrier import ExitBarrier
from meshrun.deploy.host.idle import HostIdle, UsageFeed
from meshrun.deploy.host.outpipe import ControllerPipe, RunLog
from meshrun.deploy.host.procs import (POLL_S, become_subreaper, die_with_parent, hold_lock, program_at_home,
                                       start_time, tagged_pids, tagged_runs, terminate_run)
from meshrun.deploy.host.succession import WORKERS_DONE_GRACE_S, Generation, HeadWatcher, PeerWatcher, \
    parse_generations, parse_peers
from meshrun.deploy.host.usage import newest_checkpoint
from meshrun.deploy.host.stopping import GroupWatch, cmd_stop, restart_group, stop_signals, swept_line
from meshrun.fsutil import atomic_write_json
from meshrun.idlerule import parse_policy

CHECKPOINT_LOOK_S = 2.0  # a detached run with receivers: how often the agent reads its checkpoint manifest


def forget_last_attempt(directory: Path, run_id: str, trainer: bool) -> None:
    """A resumed run reuses its directories: the last attempt's exit status, and in a run of the built-in
    trainer rank 0's result of it (written only at a successful end), must not pass for this attempt's.
    A --script run's runs/<id>/result.json is the script's own ($MESHRUN_RUN_DIR on a remote host): kept."""
    (directory / EXIT_RECORD).unlink(missing_ok=True)
    if trainer:
        (Path(run_dir(run_id)) / RESULT).unlink(missing_ok=True)


class Supervisor:
    """Runs one command for `run`; see the module docstring."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.dir = Path(host_dir(args.run_id, args.host))
        self.last_beat = time.monotonic()
        self.stop_reason: str | None = None
        self.torchrun_pid = -1
        self.torchrun_start: int | None = None
        self.head_lost = False
        self.to_controller = not args.quiet
        self.pipe = ControllerPipe(sys.stdout.buffer) if self.to_controller else None
        self.peers: PeerWatcher | None = None
        self.idle: HostIdle | None = None
        self.usage: UsageFeed | None = None
        self.next_checkpoint_look = 0.0
        self.barrier = ExitBarrier(self.dir / EXIT_BARRIER_MARK, self.workers)

    def busy(self) -> bool:
        """Another agent of this run holds the host's lock: said, and nothing of the run touched (its
        end would stop our processes, ours its)."""
        if (holder := hold_lock(self.dir / AGENT_LOCK)) is None:
            return False
        self.send(busy_line(self.args.run_id, self.args.host, holder).encode() + b"\n")
        if self.pipe is not None:  # quiet (a detached copy): its parent says it (agentstart.start_detached)
            self.pipe.drain()
        return True

    def claim(self) -> int | None:
        """The run's directory, this host's lock and train.log: None once held, else the exit status of
        an agent that starts nothing (busy; or its files cannot be written, said in one line, never a traceback)."""
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            if self.busy():
                return AGENT_BUSY_EXIT
            forget_last_attempt(self.dir, self.args.run_id, runs_trainer(self.args.command))
            # A script writes into $MESHRUN_RUN_DIR as given: a folder of its own (--run-dir) must exist first.
            Path(ranks_run_dir(self.args)).mkdir(parents=True, exist_ok=True)
            self.log = RunLog(self.dir / TRAIN_LOG, lambda text: self.send(f"meshrun-agent: {text}\n".encode()))
        except OSError as err:  # a full disk, a read-only workdir
            return self.cannot_write(self.dir, err)
        return None

    def run(self) -> int:
        if (refused := self.claim()) is not None:
            return refused
        env, spec = run_env(self.args, str(self.barrier.mark))
        from meshrun.deploy.host.notify import AgentNotices  # urllib: only a run sends, status and stop never do

        self.notices = AgentNotices(spec if self.args.heartbeat_timeout == 0 else None, self.args.run_id,
                                    self.args.host, lambda line: self.emit(f"meshrun-agent: {line}\n".encode()))
        # Before any child exists: a signal between Popen and here would kill us and orphan it.
        become_subreaper()  # orphans below us (a script's child that dropped the run's tags) come to us
        for sig in stop_signals():
            signal.signal(sig, lambda signum, _f: self.request_stop(f"signal {signal.Signals(signum).name}"))
        if self.args.heartbeat_timeout > 0:
            threading.Thread(target=self.read_heartbeats, daemon=True).start()
        generations = (parse_generations(self.args.succession) if self.args.succession
                       else (Generation("", "", tuple(self.args.command)),))
        index = min(self.args.generation, len(generations) - 1)  # a host rejoining after a succession
        self.peers = PeerWatcher(parse_peers(self.args.peers)) if self.args.peers else None
        self.idle = HostIdle(parse_policy(self.args.idle), self.args.run_id, self.args.host) if self.args.idle else None
        if self.args.usage_every > 0 and self.to_controller:
            self.usage = UsageFeed(self.args.usage_every, self.args.run_id, self.args.host, self.send)
        self.notices.started(generations[index].head)
        again = (self.dir / EVENTS).exists()  # an agent of this run was here before: the host rejoins
        self.journal("rejoined" if again else "started", f"agent started at generation {index}")
        while True:
            rc = self.run_generation(generations[index], index, env)
            if rc == 0 or self.stop_reason is not None or not self.head_lost or index + 1 >= len(generations):
                break
            index += 1
            self.notices.moved(generations[index - 1].head, generations[index].head)
            self.journal("rendezvous_moved", f"{generations[index - 1].head} lost; rendezvous now on "
                                             f"{generations[index].head} (generation {index})")
            self.emit(f"meshrun-agent: rendezvous host '{generations[index - 1].head}' lost; the run goes on "
                      f"under a new rendezvous on '{generations[index].head}' (generation {index})\n".encode())
        for watcher in filter(None, (self.peers, self.idle, self.usage)):
            watcher.stop()
        try:
            atomic_write_json(self.dir / EXIT_RECORD, {"rc": rc, "reason": self.stop_reason or "exited",
                                                       "ended": time.time(), "generation": index})
        except OSError as err:  # a full disk: the end is still said, the exit status still the command's
            self.send(f"meshrun-agent: cannot write {self.dir / EXIT_RECORD} ({err.strerror or err}); "
                      "fab status will not know how the run ended\n".encode())
        self.notices.ended(rc, self.stop_reason, generations[index].head)
        self.journal("ended", f"exit status {rc} ({self.stop_reason or 'exited'})")
        if self.pipe is not None:
            self.pipe.drain()
        return rc

    def run_generation(self, generation: Generation, index: int, env: dict[str, str]) -> int:
        """torchrun for one rendezvous, watched until it ends, we must stop, or its host is lost."""
        self.head_lost = False
        self.head = generation.head
        self.barrier.new_torchrun()
        try:
            child = subprocess.Popen(program_at_home(generation.torchrun), env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, start_new_session=True,
                                     preexec_fn=die_with_parent(os.getpid()))
        except OSError as err:
            self.emit(f"meshrun-agent: cannot start {generation.torchrun[0]}: {err}\n".encode())
            self.stop_reason = "start failed"
            return 127
        self.torchrun_pid = child.pid
        self.torchrun_start = start_time(child.pid)
        self.groups = GroupWatch(os.getpid(), child.pid)
        try:
            atomic_write_json(self.dir / AGENT_PIDFILE, {
                "run_id": self.args.run_id, "host": self.args.host, "agent_pid": os.getpid(), "pgid": child.pid,
                "pgid_start": self.torchrun_start, "started": time.time(), "command": list(generation.torchrun),
                "generation": index, "detached": self.args.heartbeat_timeout == 0})
        except OSError as err:  # without it no stop or status finds the run: not one left running blind
            self.stop_reason = "its pidfile could not be written"
            self.end_all(child, 0.0)
            child.wait()
            return self.cannot_write(self.dir / AGENT_PIDFILE, err)
        if self.args.quiet:
            quiet_stderr()  # started: the detached parent has stopped reading it
        tee = threading.Thread(target=self.tee, args=(child,), daemon=True)
        tee.start()
        watcher = HeadWatcher(generation.endpoint) if generation.endpoint and generation.head != self.args.host else None
        try:
            rc = self.watch(child, watcher)
        finally:
            if watcher is not None:
                watcher.stop()
        tee.join(timeout=5)
        return rc

    def watch(self, child: subprocess.Popen, watcher: HeadWatcher | None) -> int:
        while child.poll() is None:
            silent = time.monotonic() - self.last_beat
            if self.args.heartbeat_timeout > 0 and silent > self.args.heartbeat_timeout:
                self.request_stop(CONTROLLER_SILENT.format(seconds=f"{silent:.0f}"))
            if self.stop_reason is not None:
                self.emit(f"meshrun-agent: stopping run ({self.stop_reason})\n".encode())
                left = self.end_all(child, self.args.grace)
                child.wait()
                self.emit(f"meshrun-agent: stopped; {len(left)} processes left\n".encode())
                return 128 + signal.SIGTERM
            if self.peers is not None:
                self.take_peer_news(self.peers)
            for action, text, idle_s in self.idle.take() if self.idle is not None else []:
                self.emit(f"meshrun-agent: {text}\n".encode())
                self.journal("idle", text)
                self.notices.idle(idle_s, self.idle.policy.threshold, action == "stop")
                if action == "stop":
                    self.request_stop(text)
            if self.notices.sender is not None and time.monotonic() >= self.next_checkpoint_look:
                self.next_checkpoint_look = time.monotonic() + CHECKPOINT_LOOK_S
                self.notices.checkpoint(newest_checkpoint(self.args.run_id), self.head)
            if watcher is not None and watcher.lost:
                if self.ends_by_itself(child):
                    break  # the workers were done: torchrun's own exit status says how the run ended
                self.head_lost = True
                self.end_all(child, 1)
                child.wait()
                return 1
            if self.barrier.release():
                return self.leave_exit_barrier(child)
            if swept := self.groups.look():  # torch restarted the workers: the old group's orphans go
                self.emit(f"meshrun-agent: {swept_line(swept)}\n".encode())
                self.journal("workers_restarted", swept_line(swept))
            time.sleep(POLL_S)
        # The command is done; workers it left behind (own sessions) must not outlive it.
        self.end_all(child, 2)
        # A refused rendezvous state (deploy/host/torchrun.py) fails the run; it is not a lost rendezvous host,
        # even though that host's store goes down with its torchrun.
        if child.returncode not in (0, STATE_REFUSED_EXIT) and watcher is not None:
            self.head_lost = watcher.confirm_lost()
        return child.returncode

    def take_peer_news(self, peers: PeerWatcher) -> None:
        """A detached run's peers, lost or back, said; a lost one restarts the workers here."""
        if lost_peers := peers.take_lost():  # detached: no controller to send `restart` for a cut peer
            self.emit(f"meshrun-agent: peer(s) {', '.join(lost_peers)} stopped answering\n".encode())
            self.notices.lost(lost_peers, self.head)
            self.journal("peers_lost", f"peer(s) {', '.join(lost_peers)} stopped answering")
            self.barrier.peer_gone()
            self.restart_workers()
        if back_peers := peers.take_back():  # its link is back; its agent, if it runs, rejoins at the next rendezvous
            self.emit(f"meshrun-agent: peer(s) {', '.join(back_peers)} answer again\n".encode())
            self.notices.back(back_peers, self.head)
            self.journal("peers_back", f"peer(s) {', '.join(back_peers)} answer again")

    def end_all(self, child: subprocess.Popen, grace_s: float) -> list[int]:
        """Stop torchrun's group, the run's tagged processes and all below this agent; the survivors."""
        args = self.args
        return terminate_run(args.run_id, args.host, child.pid, grace_s, self.torchrun_start, tree=os.getpid())

    def ends_by_itself(self, child: subprocess.Popen) -> bool:
        """The rendezvous host's store is gone and so are this host's workers: at the end of a run
        that host's torchrun exits first while this one is in torch's exit barrier or shutdown (CI
        saw a finished run moved to a new rendezvous that waited 130 s for nobody). Wait for
        torchrun's own exit, at most WORKERS_DONE_GRACE_S; a worker running (the host lost in
        mid-run, this host's workers stuck in a collective) or a stop request ends the wait."""
        deadline = time.monotonic() + WORKERS_DONE_GRACE_S
        said = False
        while child.poll() is None:
            if self.workers() or self.stop_reason is not None or time.monotonic() > deadline:
                return False
            if not said:
                said = True
                self.emit(f"meshrun-agent: rendezvous host '{self.head}' does not answer and no worker runs here "
                          f"(the run may have ended); waiting up to {WORKERS_DONE_GRACE_S:.0f} s for torchrun to end "
                          "by itself\n".encode())
            time.sleep(POLL_S)
        return True

    def leave_exit_barrier(self, child: subprocess.Popen) -> int:
        """This host's workers succeeded and a peer torchrun waits for is gone: end the wait (see
        deploy/host/exitbarrier.py). The status is the workers' success."""
        text = "this host's workers had finished; a peer it waited for is gone: not waiting for it"
        self.emit(f"meshrun-agent: {text} (torch's exit barrier)\n".encode())
        self.journal("exit_barrier_left", text)
        # No grace: a torchrun in its exit barrier sits in the store's wait and does not see a TERM.
        self.end_all(child, 0.0)
        child.wait()
        return 0

    def cannot_write(self, path: Path, err: OSError) -> int:
        """Say, in one line, that the run's files cannot be written: to the controller, or on stderr
        where a detached start's parent reads it (agentstart.start_detached)."""
        line = cannot_write_line(path, self.args.host, err, os.getcwd())
        if self.pipe is None:
            try:
                sys.stderr.write(line + "\n")
                sys.stderr.flush()
            except OSError:
                pass  # a parent that stopped waiting (past its start window) closed the pipe: nobody to tell
        else:
            self.pipe.put(line.encode() + b"\n")
            self.pipe.drain()
        return CANNOT_WRITE_EXIT

    def request_stop(self, reason: str) -> None:
        if self.stop_reason is None:
            self.stop_reason = reason

    def read_heartbeats(self) -> None:
        """Every line from the controller is a heartbeat; `restart` also asks for a new worker
        group (the controller saw a peer cut off: without it, these workers would sit in a
        collective until the process-group timeout)."""
        stdin = sys.stdin.buffer
        while line := stdin.readline():
            self.last_beat = time.monotonic()
            if line in (AGENT_RESTART_LINE, AGENT_PEER_GONE_LINE):
                self.barrier.peer_gone()  # before the restart: the group it names is the current one
            if line == AGENT_RESTART_LINE:
                self.restart_workers()
        self.request_stop("the controller's connection closed")

    def restart_workers(self) -> None:
        """SIGKILL this run's workers but not torchrun: its elastic agent sees failed workers and
        re-rendezvouses the survivors at once."""
        workers = self.workers()
        self.emit(f"meshrun-agent: a peer was lost; restarting {len(workers)} worker(s)\n".encode())
        self.journal("workers_restarted", f"a peer was lost; {len(workers)} worker(s) restarted")
        restart_group(workers, os.getpid(), self.torchrun_pid)

    def workers(self) -> list[int]:
        """This run's processes on this host but the agent and torchrun: its workers."""
        spared = {os.getpid(), self.torchrun_pid}
        return [pid for pid in tagged_pids(self.args.run_id, self.args.host) if pid not in spared]

    def journal(self, event: str, text: str) -> None:
        """One line of this host's events file, for `fab status --watch` (deploy/host/usage.py reads its tail)."""
        try:
            with open(self.dir / EVENTS, "a", encoding="utf-8") as f:
                f.write(json.dumps({"time": round(time.time(), 3), "event": event, "text": text}) + "\n")
        except OSError:
            pass  # the run goes on without its journal

    def tee(self, child: subprocess.Popen) -> None:
        assert child.stdout is not None
        for line in iter(child.stdout.readline, b""):
            self.emit(line)

    def emit(self, data: bytes) -> None:
        self.log.write(data)  # never raises (outpipe.RunLog): a full disk must not end the tee or the watch
        self.send(data)

    def send(self, data: bytes) -> None:
        """To the controller only (the usage lines are not the run's log); never blocks (outpipe.py)."""
        if self.pipe is not None:
            self.pipe.put(data)


def cmd_run(args: argparse.Namespace) -> int:
    args.secret_env = read_env_block(sys.stdin.buffer) if args.env_stdin else {}
    # Detached: re-run ourselves in a new session with no controller, wait for the pidfile.
    return Supervisor(args).run() if not args.detach else start_detached(args)


def cmd_status(args: argparse.Namespace) -> int:
    run_ids = [args.run_id] if args.run_id else sorted(p.name for p in Path(RUNS_DIR).glob("*"))
    tagged = tagged_runs(args.host) if not args.run_id else None  # all runs: one pass over /proc, not one each
    reports = [report for run_id in run_ids if (report := run_status(run_id, args.host, tagged)) is not None]
    print(json.dumps(reports, sort_keys=True))
    return 0


def run_status(run_id: str, host: str, tagged: dict[str, list[int]] | None = None) -> dict | None:
    record = read_json(Path(host_dir(run_id, host)) / AGENT_PIDFILE)
    if record is None:
        return None
    ended = read_json(Path(host_dir(run_id, host)) / EXIT_RECORD)
    running = bool(tagged.get(record["run_id"]) if tagged is not None else tagged_pids(record["run_id"], host))
    state = "running" if running else ("exited" if ended else "lost")
    if ended and ended.get("reason") != "exited":
        state = "stopped" if not running else state
    return {"run_id": record["run_id"], "host": host, "state": state, "started": record.get("started"),
            "ended": (ended or {}).get("ended"), "rc": (ended or {}).get("rc"), "reason": (ended or {}).get("reason"),
            "progress": read_json(Path(run_dir(run_id)) / PROGRESS), "detached": record.get("detached", False),
            "generation": record.get("generation", 0), "now": time.time()}


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    return {"run": cmd_run, "stop": cmd_stop, "status": cmd_status}[args.verb](args)


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    # os._exit: the heartbeat thread may sit in a blocking read of stdin, and interpreter
    # shutdown with such a daemon thread can abort ("could not acquire lock for <stdin>").
    os._exit(code)
